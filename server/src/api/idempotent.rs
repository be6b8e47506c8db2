//! `Idempotency-Key` over HTTP: the header's validation and running a handler's
//! work under a key, answering a repeat from the engine's store
//! ([`holdfast_engine::idempotency`]).

use std::future::Future;

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use holdfast_domain::ErrorCode;
use holdfast_engine::idempotency::{self, Begin};

use super::ApiState;
use crate::http::error::{ApiError, respond};

/// The `Idempotency-Key` header, validated (1 to 255 visible ASCII characters).
pub fn key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = value.to_str().unwrap_or_default();
    if key.is_empty() || key.len() > 255 || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ApiError::new(
            ErrorCode::InvalidIdempotencyKey,
            "Idempotency-Key must be 1 to 255 visible ASCII characters",
        )
        .field("Idempotency-Key"));
    }
    Ok(Some(key.to_owned()))
}

/// Runs `work` under `key` (if any) of token `token_id`, within the API's
/// deadline (less the time to record the outcome): a repeat with the same
/// request (fingerprint `fp`) is answered from the store, a different request
/// with the key is 422, and one still running is 409. `work` is told whether an
/// earlier attempt with the key failed (5xx, 429): its effect is then uncertain
/// and only Redis may answer, never a shortcut from memory.
pub async fn run<W, F>(
    api: &ApiState,
    token_id: i64,
    key: Option<String>,
    fp: String,
    work: W,
) -> Response
where
    W: FnOnce(bool) -> F,
    F: Future<Output = Result<(StatusCode, serde_json::Value), ApiError>>,
{
    let engine = &api.backends.engine;
    let deadline = api.deadline;
    let Some(key) = key else {
        return match work(false).await {
            Ok((s, b)) => respond(s, b, None),
            Err(e) => e.into_response(),
        };
    };
    let after_failure = match idempotency::begin(engine, token_id, &key, &fp).await {
        Err(e) => return ApiError::from(e).into_response(),
        Ok(Begin::Replay(status, body)) => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
            return respond(status, body, None);
        }
        Ok(Begin::Reused) => {
            return ApiError::new(
                ErrorCode::IdempotencyKeyReused,
                "this Idempotency-Key was used with a different request; use a new key for a new request",
            )
            .field("Idempotency-Key")
            .into_response();
        }
        Ok(Begin::InProgress) => {
            return ApiError::new(
                ErrorCode::RequestInProgress,
                "a request with this Idempotency-Key is still being processed; retry shortly",
            )
            .into_response();
        }
        Ok(Begin::Fresh { after_failure }) => after_failure,
    };
    // The work gets a little less than the request's deadline, so that a slow
    // attempt is marked failed (its retry then asks Redis) rather than cut off
    // with its key still claimed.
    let bounded = tokio::time::timeout(deadline.work(), work(after_failure)).await;
    let (status, body, retry) = match bounded {
        Ok(Ok((s, b))) => (s, b, None),
        Ok(Err(e)) => (e.status(), e.body_json(), e.retry_after),
        Err(_) => {
            let e = ApiError::new(
                ErrorCode::Unavailable,
                "the request could not be completed in time; retry shortly with the same Idempotency-Key",
            );
            (e.status(), e.body_json(), e.retry_after)
        }
    };
    idempotency::finish(engine, token_id, &key, &fp, status.as_u16(), &body).await;
    respond(status, body, retry)
}
