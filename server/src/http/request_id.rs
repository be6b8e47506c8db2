//! A request id for every request: taken from the caller's `X-Request-Id` when
//! it is a sane token (1–64 of `A-Z a-z 0-9 - _ .`, so it cannot forge log
//! lines), otherwise made fresh. It is returned in the answer's
//! `X-Request-Id`, and every log line written while the request runs carries
//! it (the request's tracing span has it as a field).

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

/// The header carrying the id, both ways.
pub static HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// A request's id, in its extensions.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

/// Whether a caller's id can be used as is.
fn acceptable(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Outermost layer: gives the request its id and span, and the answer its header.
pub async fn request_id(mut request: Request, next: Next) -> Response {
    let id = request
        .headers()
        .get(&HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| acceptable(v))
        .map_or_else(|| uuid::Uuid::new_v4().simple().to_string(), str::to_owned);
    let value = HeaderValue::from_str(&id).unwrap_or_else(|_| HeaderValue::from_static("-"));
    request.headers_mut().insert(HEADER.clone(), value.clone());
    request.extensions_mut().insert(RequestId(id.clone()));
    let span = tracing::info_span!(
        "request",
        request_id = %id,
        method = %request.method(),
        path = %request.uri().path(),
    );
    let mut response = next.run(request).instrument(span).await;
    response.headers_mut().insert(HEADER.clone(), value);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_ids_are_kept() {
        assert!(acceptable("3f2a-9c_1.x"));
        assert!(!acceptable(""));
        assert!(!acceptable(&"a".repeat(65)));
        assert!(!acceptable("a b"));
        assert!(!acceptable("a\nINFO forged line"));
        assert!(!acceptable("a\"b"));
    }
}
