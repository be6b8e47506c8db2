//! An overall deadline per request: whatever a request waits on (Redis across
//! many shards, a PostgreSQL lookup), it is answered within [`REQUEST_DEADLINE`],
//! with 503 `unavailable` and `Retry-After` when the time runs out. Work the
//! engine already started finishes or is undone by its own rules (a hold the
//! client never heard of expires; a retry with the same `Idempotency-Key` gets
//! the real outcome, because a 503 is never stored as the answer).

use std::time::Duration;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use holdfast_domain::ErrorCode;

use super::error::ApiError;

/// Longest time any API or webhook request takes before it is answered 503.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(3);

/// Middleware: runs the rest of the stack under [`REQUEST_DEADLINE`].
pub async fn within_deadline(request: Request, next: Next) -> Response {
    match tokio::time::timeout(REQUEST_DEADLINE, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            tracing::warn!(
                deadline_ms = REQUEST_DEADLINE.as_millis() as u64,
                "a request ran out of time"
            );
            ApiError::new(
                ErrorCode::Unavailable,
                "the request could not be completed in time; retry shortly with the same Idempotency-Key",
            )
            .into_response()
        }
    }
}
