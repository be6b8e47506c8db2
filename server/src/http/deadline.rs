//! An overall deadline per request: whatever a request waits on (Redis across
//! many shards, a PostgreSQL lookup), it is answered within its [`Deadline`],
//! with 503 `unavailable` and `Retry-After` when the time runs out on our side,
//! or 408 `request_timeout` when the caller had not even sent its whole body
//! (a slow client is the client's fault, and must not read as a server error). Work the
//! engine already started finishes or is undone by its own rules (a hold the
//! client never heard of expires; a retry with the same `Idempotency-Key` gets
//! the real outcome, because a 503 is never stored as the answer).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use holdfast_domain::ErrorCode;

use super::error::ApiError;

/// Longest time any API or webhook request takes before it is answered 503
/// (`HOLDFAST_API_DEADLINE_MS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline(pub Duration);

/// Default [`Deadline`]: far above a healthy call (about a millisecond), well
/// below a client's patience.
pub const DEFAULT_DEADLINE: Deadline = Deadline(Duration::from_secs(3));

impl Default for Deadline {
    fn default() -> Self {
        DEFAULT_DEADLINE
    }
}

impl Deadline {
    /// How long a request's own work may take: a little less than the
    /// deadline (a sixth, at most 500 ms, is kept), so that a slow attempt is
    /// recorded as failed under its `Idempotency-Key` before the answer is due.
    pub fn work(self) -> Duration {
        self.0 - (self.0 / 6).min(Duration::from_millis(500))
    }
}

/// A request body that notes when it has arrived whole.
struct Tracked {
    inner: Body,
    arrived: Arc<AtomicBool>,
}

impl axum::body::HttpBody for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) {
            self.arrived.store(true, Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// Middleware: runs the rest of the stack under the route's [`Deadline`].
pub async fn within_deadline(
    State(deadline): State<Deadline>,
    request: Request,
    next: Next,
) -> Response {
    use axum::body::HttpBody;
    // An empty body has arrived before anything is read.
    let arrived = Arc::new(AtomicBool::new(request.body().is_end_stream()));
    let request = request.map(|inner| {
        Body::new(Tracked {
            inner,
            arrived: arrived.clone(),
        })
    });
    match tokio::time::timeout(deadline.0, next.run(request)).await {
        Ok(response) => response,
        Err(_) if !arrived.load(Ordering::Relaxed) => ApiError::new(
            ErrorCode::RequestTimeout,
            "the request body did not arrive in time; send it whole, promptly",
        )
        .into_response(),
        Err(_) => {
            tracing::warn!(
                deadline_ms = u64::try_from(deadline.0.as_millis()).unwrap_or(u64::MAX),
                "a request ran out of time"
            );
            ApiError::new(
                ErrorCode::Unavailable,
                "the request could not be completed in time; retry shortly (with the same Idempotency-Key, if it had one)",
            )
            .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_leaves_time_to_record_the_outcome() {
        assert_eq!(DEFAULT_DEADLINE.work(), Duration::from_millis(2_500));
        assert_eq!(
            Deadline(Duration::from_millis(600)).work(),
            Duration::from_millis(500)
        );
        assert_eq!(
            Deadline(Duration::from_secs(30)).work(),
            Duration::from_millis(29_500)
        );
    }
}
