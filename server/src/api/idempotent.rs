//! `Idempotency-Key` over HTTP: the header's validation and running a handler's
//! work under a key. Work whose script keeps its own record (a one-shard
//! reservation in its hold, see `lua/reserve.lua`; a confirm or release, whose
//! key the hold keeps, see [`holdfast_engine::idempotency::KeyUse`]) runs with
//! [`run_atomic`]: one Redis round trip. A cart over several shards answers a
//! repeat from the engine's store ([`holdfast_engine::idempotency`]): [`run`],
//! a claim before and a record after.

use std::future::Future;

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use holdfast_domain::ErrorCode;
use holdfast_engine::idempotency::{self, Begin};

use super::ApiState;
use crate::http::deadline::Deadline;
use crate::http::error::{ApiError, JsonText, respond};

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
    F: Future<Output = Result<(StatusCode, JsonText), ApiError>>,
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
            return respond(status, JsonText::stored(body), None);
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
    let (status, body, retry, kept) = bounded(deadline, work(after_failure)).await;
    // The cart path only: a one-shard hold is its own record.
    idempotency::finish(
        engine,
        token_id,
        &key,
        &fp,
        status.as_u16(),
        body.as_str(),
        kept,
    )
    .await;
    respond(status, body, retry)
}

/// Runs `work`, whose script is its own idempotency record: a retry is answered
/// by the script itself, in the same round trip. Nothing is claimed or stored
/// here; only the deadline applies.
pub async fn run_atomic<F>(api: &ApiState, work: F) -> Response
where
    F: Future<Output = Result<(StatusCode, JsonText), ApiError>>,
{
    let (status, body, retry, _) = bounded(api.deadline, work).await;
    respond(status, body, retry)
}

/// `work`'s answer within the request's deadline (status, body, `Retry-After`,
/// and whether it is kept for the key). The work gets a little less than the
/// deadline, so that a slow attempt is answered (and its key marked failed: the
/// retry then asks Redis) rather than cut off.
async fn bounded<F>(deadline: Deadline, work: F) -> (StatusCode, JsonText, Option<u64>, bool)
where
    F: Future<Output = Result<(StatusCode, JsonText), ApiError>>,
{
    let e = match tokio::time::timeout(deadline.work(), work).await {
        Ok(Ok((s, b))) => return (s, b, None, true),
        Ok(Err(e)) => e,
        Err(_) => ApiError::new(
            ErrorCode::Unavailable,
            "the request could not be completed in time; retry shortly with the same Idempotency-Key",
        ),
    };
    (
        e.status(),
        e.body_json(),
        e.retry_after,
        e.code.kept_for_replay(),
    )
}
