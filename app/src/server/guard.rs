//! Who is calling a server function, and whether they may.
//!
//! Every server function starts with [`authorize`]: it refuses a cross-site
//! request (a state-changing call must carry an `Origin` header naming this very
//! host; browsers always send one on `POST`), finds the session from the HttpOnly
//! cookie and checks the user's role on the server. Refusals set the HTTP status
//! (401, 403) and carry a message the page shows as it is.

use holdfast_domain::{ErrorCode, Permission};
use holdfast_engine::users::{self, User};
use holdfast_engine::{Backends, EngineError};
use http::{HeaderMap, Method, StatusCode, header};
use leptos::prelude::*;
use leptos_axum::ResponseOptions;

/// The session cookie's name over plain HTTP (local runs, tests).
pub const SESSION_COOKIE: &str = "holdfast_session";
/// The session cookie's name when cookies are secure: browsers accept a
/// `__Host-` cookie only with `Secure`, `Path=/` and no `Domain`, so a sibling
/// subdomain cannot plant or overwrite it.
pub const SECURE_SESSION_COOKIE: &str = "__Host-holdfast_session";

/// The client's address as the server's edge resolved it (the TCP peer, or
/// what a trusted proxy forwarded); the server puts it in every request's
/// extensions, and every per-client limit uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientIp(pub std::net::IpAddr);

/// How the session cookie is named and flagged. The server provides it in
/// context; without it (plain HTTP) the cookie is not `Secure`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CookiePolicy {
    /// Served over HTTPS (directly or behind a TLS-terminating proxy): the
    /// cookie is `Secure` and carries the `__Host-` prefix.
    pub secure: bool,
}

impl CookiePolicy {
    /// The cookie's name under this policy.
    pub fn name(self) -> &'static str {
        if self.secure {
            SECURE_SESSION_COOKIE
        } else {
            SESSION_COOKIE
        }
    }

    /// The device cookie's name under this policy.
    pub fn device_name(self) -> &'static str {
        if self.secure {
            "__Host-holdfast_device"
        } else {
            "holdfast_device"
        }
    }

    /// The `Set-Cookie` value for a device token (kept across sign-outs: it
    /// only exempts this browser from the per-user sign-in limit).
    pub fn set_device(self, token: &str) -> String {
        let secure = if self.secure { "; Secure" } else { "" };
        format!(
            "{}={token}; Path=/; HttpOnly; SameSite=Lax; Max-Age={}{secure}",
            self.device_name(),
            users::DEVICE_TTL.as_secs()
        )
    }

    /// The session secret a request carries, under this policy's name only.
    pub fn read(self, headers: &HeaderMap) -> Option<String> {
        cookie(headers, self.name())
    }

    /// The `Set-Cookie` value for a new session (or, with `None`, one that clears it).
    pub fn set(self, secret: Option<&str>) -> String {
        let secure = if self.secure { "; Secure" } else { "" };
        let (value, age) = match secret {
            Some(s) => (s, users::SESSION_TTL.as_secs()),
            None => ("", 0),
        };
        format!(
            "{}={value}; Path=/; HttpOnly; SameSite=Lax; Max-Age={age}{secure}",
            self.name()
        )
    }
}

/// The cookie policy in context.
fn cookie_policy() -> CookiePolicy {
    use_context::<CookiePolicy>().unwrap_or_default()
}

/// The calling client's address, when the server resolved one.
pub fn client_ip() -> Option<std::net::IpAddr> {
    use_context::<http::request::Parts>()
        .and_then(|p| p.extensions.get::<ClientIp>().copied())
        .map(|c| c.0)
}

/// The session secret the calling browser sent, if any.
pub fn incoming_session() -> Option<String> {
    request().and_then(|(_, headers)| cookie_policy().read(&headers))
}

/// The device token the calling browser sent, if any.
pub fn incoming_device() -> Option<String> {
    let policy = cookie_policy();
    request()
        .and_then(|(_, headers)| cookie(&headers, policy.device_name()))
        .filter(|t| users::well_formed_secret(t))
}

/// Adds a `Set-Cookie` for a device token.
pub fn set_device_cookie(token: &str) {
    set_cookie(cookie_policy().set_device(token));
}

/// A signed-in caller allowed to proceed.
#[derive(Clone)]
pub struct SignedIn {
    /// The user.
    pub user: User,
    /// The session secret from the cookie (to keep it across a password change).
    pub session: String,
    /// PostgreSQL and Redis.
    pub backends: Backends,
}

/// Sets the response status and returns a readable error.
pub fn refuse(status: StatusCode, message: impl Into<String>) -> ServerFnError {
    if let Some(res) = use_context::<ResponseOptions>() {
        res.set_status(status);
    }
    ServerFnError::new(message.into())
}

/// Maps an engine error the way the HTTP API does ([`EngineError::code`] fixes
/// the status): a backing service that is down or busy work is said plainly; an
/// internal fault is logged once, with context, and shown opaquely.
pub fn internal(what: &'static str) -> impl Fn(EngineError) -> ServerFnError {
    move |e| {
        let (status, message, retry_after) = explain(what, &e);
        if let (Some(secs), Some(res)) = (retry_after, use_context::<ResponseOptions>()) {
            res.insert_header(header::RETRY_AFTER, http::HeaderValue::from(secs));
        }
        refuse(status, message)
    }
}

/// [`internal`]'s reading of an engine error, without a server function's
/// context (the server's own checks before a server function answer with
/// it too): the status, what the page shows, and the `Retry-After` seconds.
/// A fault is logged here, once.
pub fn explain(what: &str, e: &EngineError) -> (StatusCode, String, Option<u64>) {
    let code = e.code();
    let message = match code {
        ErrorCode::Unavailable => {
            tracing::warn!(error = %e, "{what} failed");
            format!("{what} failed: a backing service is unavailable. Try again once it is back.")
        }
        ErrorCode::Busy | ErrorCode::RateLimited => format!("{what}: {e}."),
        _ => {
            tracing::error!(error = %e, "{what} failed");
            format!("{what} failed because of an internal error; it was logged.")
        }
    };
    (
        StatusCode::from_u16(code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        message,
        e.retry_after(),
    )
}

/// Maps a refused user change (bad name, weak password, last admin, …) to a 400
/// that says why, and a failure of PostgreSQL the way [`internal`] does.
pub fn user_error(what: &'static str) -> impl Fn(users::UserError) -> ServerFnError {
    move |e| match e {
        users::UserError::Engine(e) => internal(what)(e),
        refused => refuse(StatusCode::BAD_REQUEST, refused.to_string()),
    }
}

/// The backends from the request's context.
pub fn backends() -> Result<Backends, ServerFnError> {
    use_context::<Backends>()
        .ok_or_else(|| ServerFnError::new("server misconfigured: no backends in context"))
}

/// The request's headers and method (present for every server-function call and
/// every server-rendered page).
fn request() -> Option<(Method, HeaderMap)> {
    use_context::<http::request::Parts>().map(|p| (p.method, p.headers))
}

/// The value of cookie `name` in `headers`.
pub fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_owned())
}

/// Whether a request's `Origin` is this site: the host it was sent to, under
/// the scheme the site is served with (`https` when cookies are secure, so a
/// page injected into plain `http://` on the same host does not pass).
/// Cross-site forms and scripts cannot forge either header.
pub fn same_origin(headers: &HeaderMap, secure: bool) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return false;
    };
    let scheme = if secure { "https" } else { "http" };
    headers
        .get(header::ORIGIN)
        .and_then(|o| o.to_str().ok())
        .and_then(|o| o.split_once("://"))
        .is_some_and(|(s, rest)| s.eq_ignore_ascii_case(scheme) && rest.eq_ignore_ascii_case(host))
}

/// The signed-in user, if any, without any role check (the page shell uses it).
pub async fn current() -> Result<Option<SignedIn>, ServerFnError> {
    let backends = backends()?;
    let Some((_, headers)) = request() else {
        return Ok(None);
    };
    let found = session_in(&backends, cookie_policy(), &headers, client_ip())
        .await
        .map_err(internal("Checking your session"))?;
    Ok(found.map(|(user, session)| SignedIn {
        user,
        session,
        backends,
    }))
}

/// The user and session secret `headers`' session cookie (named by `policy`)
/// stands for, if it is live, for a request from `from`; a missing cookie, or
/// one this server could not have issued, costs no lookup, and one from an
/// address whose cookies keep missing is refused without one
/// ([`users::session_user_from`]). Without a request's context: the server's
/// checks before a server function use it too.
pub async fn session_in(
    backends: &Backends,
    policy: CookiePolicy,
    headers: &HeaderMap,
    from: Option<std::net::IpAddr>,
) -> Result<Option<(User, String)>, EngineError> {
    let Some(secret) = policy
        .read(headers)
        .filter(|s| users::well_formed_secret(s))
    else {
        return Ok(None);
    };
    let user = users::session_user_from(backends, &secret, from).await?;
    Ok(user.map(|user| (user, secret)))
}

/// What a state-changing call from another site is told (403).
pub const CROSS_SITE: &str = "Refused: this request did not come from a Holdfast page (cross-site requests are not allowed).";

/// Refuses a state-changing call that did not come from this site's own pages.
pub fn check_origin() -> Result<(), ServerFnError> {
    match request() {
        Some((method, headers))
            if method != Method::GET && !same_origin(&headers, cookie_policy().secure) =>
        {
            Err(refuse(StatusCode::FORBIDDEN, CROSS_SITE))
        }
        _ => Ok(()),
    }
}

/// What a call without a live session is told (401).
pub const NOT_SIGNED_IN: &str = "You are not signed in (or your session ended). Sign in again.";

/// The caller, if signed in with a role that may do `need`; otherwise a 401 or
/// 403 with a message saying why.
pub async fn authorize(need: Permission) -> Result<SignedIn, ServerFnError> {
    check_origin()?;
    let Some(caller) = current().await? else {
        return Err(refuse(StatusCode::UNAUTHORIZED, NOT_SIGNED_IN));
    };
    if let Some(why) = refusal_for(&caller.user, need) {
        return Err(refuse(StatusCode::FORBIDDEN, why));
    }
    Ok(caller)
}

/// Why signed-in `user` may not do `need` (a 403's message), if they may not:
/// a one-time password to replace first, or a role without it.
pub fn refusal_for(user: &User, need: Permission) -> Option<String> {
    if user.must_change_password {
        return Some(
            "Choose a new password first: you signed in with a one-time password.".to_owned(),
        );
    }
    (!user.role.may(need)).then(|| {
        format!(
            "Your role ({}) cannot do this: {} is not part of it. Ask an admin.",
            user.role.as_str(),
            need.describe()
        )
    })
}

/// Appends to the audit log; a failure is logged, never hidden from the log, but
/// does not undo an action that already happened.
pub async fn audit(caller: &SignedIn, action: &str, subject: &str, detail: serde_json::Value) {
    holdfast_engine::audit::note(
        &caller.backends.pg,
        &caller.user.username,
        action,
        subject,
        detail,
    )
    .await;
}

/// The `Set-Cookie` value for a new session (or, with `None`, one that clears
/// it), under the policy in context.
pub fn session_cookie(secret: Option<&str>) -> String {
    cookie_policy().set(secret)
}

/// Adds a `Set-Cookie` header to the response.
pub fn set_cookie(value: String) {
    if let (Some(res), Ok(v)) = (
        use_context::<ResponseOptions>(),
        http::HeaderValue::from_str(&value),
    ) {
        res.append_header(header::SET_COOKIE, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn only_this_host_is_the_same_origin() {
        let host = ("host", "shop.example:3000");
        assert!(same_origin(
            &headers(&[host, ("origin", "https://shop.example:3000")]),
            true
        ));
        assert!(same_origin(
            &headers(&[host, ("origin", "http://SHOP.example:3000")]),
            false
        ));
        assert!(
            !same_origin(
                &headers(&[host, ("origin", "http://shop.example:3000")]),
                true
            ),
            "plain http is another origin when the site is served over https"
        );
        assert!(
            !same_origin(&headers(&[host]), false),
            "no Origin is not trusted"
        );
        assert!(!same_origin(
            &headers(&[host, ("origin", "https://shop.example")]),
            false
        ));
        assert!(!same_origin(
            &headers(&[host, ("origin", "https://shop.example:3000.evil.test")]),
            false
        ));
        assert!(!same_origin(&headers(&[host, ("origin", "null")]), false));
        assert!(!same_origin(
            &headers(&[("origin", "https://shop.example:3000")]),
            false
        ));
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let h = headers(&[
            ("cookie", "a=1; holdfast_session=abc; b=2"),
            ("cookie", "c=3"),
        ]);
        assert_eq!(cookie(&h, SESSION_COOKIE).as_deref(), Some("abc"));
        assert_eq!(cookie(&h, "c").as_deref(), Some("3"));
        assert_eq!(cookie(&h, "missing"), None);
        let plain = CookiePolicy::default();
        let set = plain.set(Some("s3cret"));
        assert!(set.starts_with("holdfast_session=s3cret;"));
        assert!(set.contains("HttpOnly") && set.contains("SameSite=Lax") && set.contains("Path=/"));
        assert!(!set.contains("Secure"));
        assert!(plain.set(None).contains("Max-Age=0"));
        let secure = CookiePolicy { secure: true };
        let set = secure.set(Some("s3cret"));
        assert!(set.starts_with("__Host-holdfast_session=s3cret;") && set.ends_with("; Secure"));
        assert_eq!(
            secure.read(&h),
            None,
            "a plain cookie is not read under the secure name"
        );
    }
}
