//! The dashboard's server functions answer a malformed call as the caller's
//! fault: Leptos reports a missing or mistyped argument, or a body over the
//! limit, as a 500 (`Args|…`, `Deserialization|…`), which would read as our
//! fault in logs and monitors. This layer turns those into 400 and 413, with
//! the same text.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// Largest error body looked at (Leptos' are a line or two).
const MAX_ERROR_BODY: usize = 64 * 1024;

/// Middleware: maps argument errors of server-function calls to 400/413.
pub async fn caller_errors(request: Request, next: Next) -> Response {
    let server_fn = request.method() == Method::POST
        && request.uri().path().starts_with("/api/")
        && !request.uri().path().starts_with("/api/v1/");
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
