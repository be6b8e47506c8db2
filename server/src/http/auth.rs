//! Bearer-token authentication for the API: the [`Caller`] extractor verifies the
//! token (through the engine's short-lived cache, so the hot path does not query
//! PostgreSQL per request) and applies the per-token rate limit.

use std::sync::Arc;

use axum::extract::{FromRef, FromRequestParts};
use axum::http::request::Parts;
use holdfast_app::server::guard::ClientIp;
use holdfast_domain::Scope;
use holdfast_engine::tokens::{self, TokenCache, TokenInfo};
use sqlx::PgPool;

use super::error::ApiError;
use holdfast_engine::ratelimit::{Limit, RateLimiter};

/// What checking a token needs: the cache, PostgreSQL behind it, and the
/// per-token limiter. Any router state that can hand one out (`FromRef`) can
/// authenticate [`Caller`]s.
#[derive(Clone)]
pub struct TokenCheck {
    /// Verified tokens.
    pub cache: Arc<TokenCache>,
    /// Where tokens are kept.
    pub pg: PgPool,
    /// Requests per API token.
    pub per_token: Arc<RateLimiter<i64>>,
    /// Checks of tokens not yet known, per client address: a flood of invented
    /// tokens costs PostgreSQL nothing past this (429 instead).
    pub unknown_per_address: Arc<RateLimiter<std::net::IpAddr>>,
}

impl TokenCheck {
    /// Checks against `pg` within `limits`.
    pub fn new(pg: PgPool, limits: TokenLimits) -> Self {
        Self {
            cache: Arc::new(TokenCache::with_refused_cap(limits.refused_remembered)),
            pg,
            per_token: Arc::new(RateLimiter::new(Limit::per_second(limits.per_token))),
            unknown_per_address: Arc::new(RateLimiter::new(Limit::per_second(
                limits.unknown_per_address,
            ))),
        }
    }
}

/// The limits on API tokens.
#[derive(Debug, Clone, Copy)]
pub struct TokenLimits {
    /// Requests per second per token (bursts of twice that; 0: no limit).
    pub per_token: u32,
    /// Checks of not-yet-known tokens per client address per second (bursts
    /// of twice that): a real client needs one per token, then its answer is
    /// remembered.
    pub unknown_per_address: u32,
    /// Refused secrets remembered (the oldest forgotten first).
    pub refused_remembered: usize,
}

/// Default for [`TokenLimits::unknown_per_address`].
pub const UNKNOWN_TOKENS_PER_ADDRESS: u32 = 10;

/// The authenticated caller of an API route.
#[derive(Debug, Clone)]
pub struct Caller(pub TokenInfo);

impl Caller {
    /// `info`'s caller, once its token's rate limit lets the request through.
    fn limited(check: &TokenCheck, info: TokenInfo) -> Result<Self, ApiError> {
        check
            .per_token
            .check(&info.id)
            .map_err(ApiError::too_many)?;
        Ok(Self(info))
    }

    /// Refuses the call (403) unless the token carries `scope`.
    pub fn require(&self, scope: Scope) -> Result<(), ApiError> {
        if self.0.allows(scope) {
            Ok(())
        } else {
            Err(ApiError::forbidden(scope.as_str()))
        }
    }
}

impl<S> FromRequestParts<S> for Caller
where
    S: Send + Sync,
    TokenCheck: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let check = TokenCheck::from_ref(state);
        let secret = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|s| tokens::well_formed(s))
            .ok_or_else(ApiError::unauthorized)?;
        if let Some(info) = check.cache.fresh_live(secret) {
            return Self::limited(&check, info);
        }
        if !check.cache.knows(secret)
            && let Some(ClientIp(client)) = parts.extensions.get::<ClientIp>()
        {
            check
                .unknown_per_address
                .check(client)
                .map_err(ApiError::too_many)?;
        }
        let Some(info) = check.cache.verify(&check.pg, secret).await? else {
            return Err(ApiError::unauthorized());
        };
        Self::limited(&check, info)
    }
}
