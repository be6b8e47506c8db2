//! What the dashboard's server functions may be sent, and how their refusals
//! read.
//!
//! Bodies: a server function's body is read whole before the function can
//! check who is calling, so callers that start bodies and never finish them
//! would hold memory until the request's deadline. Every server function
//! but the one that takes a drop file takes a small form
//! ([`FORM_BODY_LIMIT`]); the drop file's ([`FILE_BODY_LIMIT`]) is read
//! only for a caller from this site's pages, signed in and allowed to edit
//! drops, at most [`FILES_PER_ACCOUNT`] at once per account.
//!
//! Refusals: Leptos reports a missing or mistyped argument, or a body over
//! the limit, as a 500 (`Args|…`, `Deserialization|…`), which would read as
//! our fault in logs and monitors. [`caller_errors`] turns those into 400 and
//! 413, with the same text.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use holdfast_app::server::guard::{
    CROSS_SITE, ClientIp, CookiePolicy, NOT_SIGNED_IN, explain, refusal_for, same_origin,
    session_in,
};
use holdfast_domain::Permission;
use holdfast_engine::Backends;
use leptos::prelude::ServerFnError;
use leptos::server_fn::error::{FromServerFnError, SERVER_FN_ERROR_HEADER};
use tower::{Layer, ServiceExt};

use crate::http::per_address::{PerKey, Place};

/// Largest body of a server function that takes no file: sign-in forms,
/// reasons, searches and names, each well under a kilobyte. A caller
/// dripping bodies into many connections holds at most this much in each.
pub const FORM_BODY_LIMIT: usize = 16 * 1024;

/// The server function that takes a drop file.
const FILE_ENDPOINT: &str = "/api/import_drop";

/// The most [`FILE_ENDPOINT`]'s body takes: the largest drop file
/// ([`holdfast_engine::drop_file::MAX_FILE_BYTES`]) percent-encoded as a form
/// (each byte at most three), with room for the call's other fields.
pub const FILE_BODY_LIMIT: usize = 3 * holdfast_engine::drop_file::MAX_FILE_BYTES + FORM_BODY_LIMIT;

/// Drop files one account may have being sent at once (past it, 429). The
/// imports themselves are bounded by the engine
/// ([`holdfast_engine::drop_file::IMPORTS_AT_ONCE`]), also once their
/// callers have gone.
pub const FILES_PER_ACCOUNT: usize = 2;

/// What [`bounded_bodies`] needs: the session check and the files being
/// received, per account.
#[derive(Clone)]
pub struct ServerFnBodies {
    backends: Backends,
    cookies: CookiePolicy,
    files: Arc<PerKey<i64>>,
}

impl ServerFnBodies {
    /// Bodies checked against `backends`' sessions, cookies named by `cookies`.
    pub fn new(backends: Backends, cookies: CookiePolicy) -> Self {
        Self {
            backends,
            cookies,
            files: Arc::default(),
        }
    }

    /// A place for a drop file's body, for a caller who may send one: from
    /// this site's pages, signed in, allowed to edit drops, with a place
    /// free among the account's. Otherwise the status and words the function
    /// itself would refuse with, answered before the body is read.
    async fn admit_file(
        &self,
        headers: &HeaderMap,
        from: Option<std::net::IpAddr>,
    ) -> Result<Place<i64>, Refused> {
        if !same_origin(headers, self.cookies.secure) {
            return Err((StatusCode::FORBIDDEN, CROSS_SITE.to_owned(), None));
        }
        let user = match session_in(&self.backends, self.cookies, headers, from).await {
            Ok(Some((user, _))) => user,
            Ok(None) => return Err((StatusCode::UNAUTHORIZED, NOT_SIGNED_IN.to_owned(), None)),
            Err(e) => return Err(explain("Checking your session", &e)),
        };
        if let Some(why) = refusal_for(&user, Permission::EditDrops) {
            return Err((StatusCode::FORBIDDEN, why, None));
        }
        self.files.take(user.id, FILES_PER_ACCOUNT).ok_or_else(|| {
            (
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "{FILES_PER_ACCOUNT} drop files of yours are being sent already; \
                     send this one when they are in."
                ),
                Some(5),
            )
        })
    }
}

/// A refusal before the body is read: its status, the words the page shows,
/// and the `Retry-After` seconds.
type Refused = (StatusCode, String, Option<u64>);

/// Whether `request` calls a server function (they are all `POST /api/…`,
/// outside the HTTP API's `/api/v1/`).
fn calls_server_fn(request: &Request) -> bool {
    request.method() == Method::POST
        && request.uri().path().starts_with("/api/")
        && !request.uri().path().starts_with("/api/v1/")
}

/// A server function's refusal as Leptos itself writes one, so the page
/// shows `message` as it shows the function's own errors.
fn refusal(path: &str, (status, message, retry_after): Refused) -> Response {
    let mut response = (status, ServerFnError::new(message).ser()).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    if let Ok(path) = HeaderValue::from_str(path) {
        headers.insert(SERVER_FN_ERROR_HEADER, path);
    }
    if let Some(secs) = retry_after {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

/// Middleware: bounds what a server function's body may be, before any of it
/// is read (see the module's notes). A body declared over its bound is 413 at
/// once; one that runs past it is cut off there (413 by [`caller_errors`]).
pub async fn bounded_bodies(
    State(bodies): State<ServerFnBodies>,
    request: Request,
    next: Next,
) -> Response {
    if !calls_server_fn(&request) {
        return next.run(request).await;
    }
    let path = request.uri().path().to_owned();
    let mut place = None;
    let limit = if path == FILE_ENDPOINT {
        let from = request.extensions().get::<ClientIp>().map(|c| c.0);
        match bodies.admit_file(request.headers(), from).await {
            Ok(taken) => place = Some(taken),
            Err(refused) => return refusal(&path, refused),
        }
        FILE_BODY_LIMIT
    } else {
        FORM_BODY_LIMIT
    };
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        let why = format!("This call's body is over {limit} bytes.");
        return refusal(&path, (StatusCode::PAYLOAD_TOO_LARGE, why, None));
    }
    // The server-function reader applies the limit axum carries with the
    // request (2 MiB unless set): this call's own, set here.
    let response = axum::extract::DefaultBodyLimit::max(limit)
        .layer(next)
        .oneshot(request)
        .await;
    drop(place);
    match response {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

/// Largest error body looked at (Leptos' are a line or two).
const MAX_ERROR_BODY: usize = 64 * 1024;

/// Middleware: maps argument errors of server-function calls to 400/413.
pub async fn caller_errors(request: Request, next: Next) -> Response {
    let server_fn = calls_server_fn(&request);
    let response = next.run(request).await;
    if !server_fn || response.status() != StatusCode::INTERNAL_SERVER_ERROR {
        return response;
    }
    let (parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_ERROR_BODY).await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let status = if bytes.starts_with(b"Args|") {
        StatusCode::BAD_REQUEST
    } else if bytes.starts_with(b"Deserialization|") {
        if bytes
            .windows(b"length limit".len())
            .any(|w| w == b"length limit")
        {
            StatusCode::PAYLOAD_TOO_LARGE
        } else {
            StatusCode::BAD_REQUEST
        }
    } else {
        parts.status
    };
    let mut response = Response::from_parts(parts, Body::from(bytes));
    *response.status_mut() = status;
    response
}
