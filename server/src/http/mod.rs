//! What every HTTP area shares, below the areas that use it: the error type
//! ([`error::ApiError`]), bearer-token authentication ([`auth::Caller`], with
//! the engine's per-key rate limits), and the [`edge`] every request crosses
//! first (host check, client address, security headers).

pub mod auth;
pub mod deadline;
pub mod edge;
pub mod error;
pub mod observe;
pub mod per_address;
pub mod request_id;
pub mod server_fns;
pub mod site;
pub mod socket;
pub mod write_deadline;

/// Unix milliseconds as the API writes times: RFC 3339, UTC, to the millisecond.
pub fn rfc3339(ms: i64) -> Option<String> {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}
