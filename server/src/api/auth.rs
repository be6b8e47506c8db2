//! Bearer-token authentication for the API, with a short in-process cache so the
//! hot path does not query PostgreSQL per request.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use holdfast_engine::tokens::{self, Scope, TokenInfo};

use super::error::ApiError;
use crate::state::AppState;

/// How long a verified (or refused) token is remembered: a revocation takes
/// effect within this long.
pub const TOKEN_CACHE_TTL: Duration = Duration::from_secs(5);

/// A verification result (`None`: no such live token) and when it was made.
type Verified = (Option<TokenInfo>, Instant);

/// Verified tokens by the SHA-256 of their secret.
#[derive(Debug, Default)]
pub struct TokenCache {
    entries: Mutex<HashMap<Vec<u8>, Verified>>,
}

impl TokenCache {
    async fn verify(&self, state: &AppState, secret: &str) -> Result<Option<TokenInfo>, ApiError> {
        let key = tokens::digest(secret);
        if let Ok(entries) = self.entries.lock()
            && let Some((info, at)) = entries.get(&key)
            && at.elapsed() < TOKEN_CACHE_TTL
        {
            return Ok(info.clone());
        }
        let info = tokens::verify(&state.backends.pg, secret).await?;
        if let Ok(mut entries) = self.entries.lock() {
            if entries.len() > 10_000 {
                entries.retain(|_, (_, at)| at.elapsed() < TOKEN_CACHE_TTL);
            }
            entries.insert(key, (info.clone(), Instant::now()));
        }
        Ok(info)
    }
}

/// The authenticated caller of an API route.
#[derive(Debug, Clone)]
pub struct Caller(pub TokenInfo);

impl Caller {
    /// Refuses the call (403) unless the token carries `scope`.
    pub fn require(&self, scope: Scope) -> Result<(), ApiError> {
        if self.0.allows(scope) {
            Ok(())
        } else {
            Err(ApiError::forbidden(scope.as_str()))
        }
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let secret = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|s| s.starts_with("hf_"))
            .ok_or_else(ApiError::unauthorized)?;
        let Some(info) = state.api.tokens.verify(state, secret).await? else {
            return Err(ApiError::unauthorized());
        };
        state
            .api
            .per_token
            .check(&format!("t{}", info.id))
            .map_err(super::too_many)?;
        Ok(Self(info))
    }
}
