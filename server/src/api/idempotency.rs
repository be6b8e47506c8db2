//! `Idempotency-Key`: the same key with the same request returns the stored
//! response, status included; the same key with a different request is refused
//! (422); keys are scoped to the API token and kept 24 hours, in Redis.
//!
//! Answers that invite a retry (5xx, 429) are not stored: a client that follows
//! `Retry-After` with the same key gets the real outcome (for example a 201 once a
//! not-warmed SKU has been warmed), never a replay of the temporary failure.

use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::error::ApiError;
use crate::state::AppState;

/// How long a key and its response are kept.
pub const KEY_TTL_SECS: u64 = 24 * 3_600;
/// How long a key stays claimed by a request that is still running.
const PENDING_TTL_SECS: u64 = 60;

/// What the store holds per key.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Stored {
    fp: String,
    status: Option<u16>,
    body: Option<serde_json::Value>,
}

/// What to do with a request carrying a key.
pub enum Begin {
    /// First use: run it, then [`finish`].
    Fresh,
    /// Seen before with the same request: answer with this.
    Replay(StatusCode, serde_json::Value),
}

/// The `Idempotency-Key` header, validated (1 to 255 visible ASCII characters).
pub fn key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = value.to_str().unwrap_or_default();
    if key.is_empty() || key.len() > 255 || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_idempotency_key",
            "Idempotency-Key must be 1 to 255 visible ASCII characters",
        )
        .field("Idempotency-Key"));
    }
    Ok(Some(key.to_owned()))
}

/// The fingerprint of a request: method, path and exact body.
pub fn fingerprint(method: &str, path: &str, body: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(method.as_bytes());
    h.update(b" ");
    h.update(path.as_bytes());
    h.update(b"\n");
    h.update(body);
    hex::encode(h.finalize())
}

fn redis_key(token_id: i64, key: &str) -> String {
    format!(
        "hf:idem:{{t{token_id}}}:{}",
        hex::encode(Sha256::digest(key.as_bytes()))
    )
}

/// Claims `key` for this request, or says how to answer a repeat.
pub async fn begin(
    state: &AppState,
    token_id: i64,
    key: &str,
    fp: &str,
) -> Result<Begin, ApiError> {
    let mut conn = state.backends.redis.clone();
    let k = redis_key(token_id, key);
    let pending = serde_json::to_string(&Stored {
        fp: fp.to_owned(),
        status: None,
        body: None,
    })
    .unwrap_or_default();
    let claimed: Option<String> = redis::cmd("SET")
        .arg(&k)
        .arg(&pending)
        .arg("NX")
        .arg("EX")
        .arg(PENDING_TTL_SECS)
        .query_async(&mut conn)
        .await
        .map_err(holdfast_engine::EngineError::from)?;
    if claimed.is_some() {
        return Ok(Begin::Fresh);
    }
    let raw: Option<String> = redis::cmd("GET")
        .arg(&k)
        .query_async(&mut conn)
        .await
        .map_err(holdfast_engine::EngineError::from)?;
    let Some(stored) = raw.and_then(|r| serde_json::from_str::<Stored>(&r).ok()) else {
        // Lapsed between SET and GET: treat as new.
        return Ok(Begin::Fresh);
    };
    if stored.fp != fp {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency_key_reused",
            "this Idempotency-Key was used with a different request; use a new key for a new request",
        )
        .field("Idempotency-Key"));
    }
    match (
        stored.status.and_then(|s| StatusCode::from_u16(s).ok()),
        stored.body,
    ) {
        (Some(status), Some(body)) => Ok(Begin::Replay(status, body)),
        _ => Err(ApiError::new(
            StatusCode::CONFLICT,
            "request_in_progress",
            "a request with this Idempotency-Key is still being processed; retry shortly",
        )
        .retry_after(1)),
    }
}

/// Stores the response to `key` (or frees the key, for answers that invite a retry).
pub async fn finish(
    state: &AppState,
    token_id: i64,
    key: &str,
    fp: &str,
    status: StatusCode,
    body: &serde_json::Value,
) {
    let mut conn = state.backends.redis.clone();
    let k = redis_key(token_id, key);
    let result = if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
        redis::cmd("DEL").arg(&k).query_async::<()>(&mut conn).await
    } else {
        let stored = Stored {
            fp: fp.to_owned(),
            status: Some(status.as_u16()),
            body: Some(body.clone()),
        };
        redis::cmd("SET")
            .arg(&k)
            .arg(serde_json::to_string(&stored).unwrap_or_default())
            .arg("EX")
            .arg(KEY_TTL_SECS)
            .query_async::<()>(&mut conn)
            .await
    };
    if let Err(e) = result {
        tracing::warn!(error = %e, "could not store an idempotent response; a retry will run again");
    }
}
