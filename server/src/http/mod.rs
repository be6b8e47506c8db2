//! What every HTTP area shares, below the areas that use it: the error type
//! ([`error::ApiError`]), bearer-token authentication ([`auth::Caller`]) and
//! per-key rate limits ([`ratelimit::RateLimiter`]), and the [`edge`] every
//! request crosses first (host check, client address, security headers).

pub mod auth;
pub mod deadline;
pub mod edge;
pub mod error;
pub mod observe;
pub mod ratelimit;
pub mod request_id;
pub mod server_fns;
pub mod site;
pub mod socket;
pub mod write_deadline;
