//! An overall deadline per request: whatever a request waits on (Redis across
//! many shards, a PostgreSQL lookup), it is answered within its [`Deadline`],
//! with 503 `unavailable` and `Retry-After` when the time runs out on our side,
//! or 408 `request_timeout` when the caller had not even sent its whole body
//! (a slow client is the client's fault, and must not read as a server error). Work the
//! engine already started finishes or is undone by its own rules (a hold the
//! client never heard of expires; a retry with the same `Idempotency-Key` gets
//! the real outcome, because a 503 is never stored as the answer).

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

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

    /// The deadline of bulk routes (a whole drop file, thousands of SKUs):
    /// as long as the connection's request timeout allows, less the same
    /// margin as [`Deadline::work`], so its 503 is answered before the edge
    /// would cut the request off. A checkout call's deadline is for calls of
    /// a millisecond; a drop of 10,000 SKUs takes seconds of real work.
    pub fn bulk(request_timeout: Duration) -> Self {
        Self(Self(request_timeout).work())
    }
}

/// Where a request's body is: not asked for yet, awaited, or arrived whole.
#[derive(Debug, Clone, Copy)]
enum BodyState {
    /// The handler has not read it yet (any wait so far is ours).
    Unread,
    /// The handler is reading it (a wait now is the caller's).
    Awaited,
    /// It arrived whole at this instant.
    Arrived(Instant),
}

type Arrival = Arc<Mutex<BodyState>>;

/// A request body that notes when it has arrived whole.
struct Tracked {
    inner: Body,
    arrived: Arrival,
}

impl axum::body::HttpBody for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Ok(mut state) = self.arrived.lock() {
            *state = match (*state, &polled) {
                (BodyState::Arrived(at), _) => BodyState::Arrived(at),
                (_, Poll::Ready(None)) => BodyState::Arrived(Instant::now()),
                _ => BodyState::Awaited,
            };
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
    run_within(deadline, request, next).await
}

/// Runs the rest of the stack under `deadline` (for a layer that picks the
/// deadline by route, as the API's does for its bulk routes).
pub async fn run_within(deadline: Deadline, request: Request, next: Next) -> Response {
    use axum::body::HttpBody;
    let started = Instant::now();
    // An empty body has arrived before anything is read.
    let arrived: Arrival = Arc::new(Mutex::new(if request.body().is_end_stream() {
        BodyState::Arrived(started)
    } else {
        BodyState::Unread
    }));
    let request = request.map(|inner| {
        Body::new(Tracked {
            inner,
            arrived: arrived.clone(),
        })
    });
    let work = next.run(request);
    tokio::pin!(work);
    // The work gets the whole deadline from the moment the body arrived: a
    // body that comes late is the caller's time, never turned into a 503.
    let mut until = started + deadline.0;
    let timed_out = loop {
        match tokio::time::timeout_at(until.into(), &mut work).await {
            Ok(response) => return response,
            Err(_) => match arrived.lock().map_or(BodyState::Unread, |s| *s) {
                BodyState::Awaited => break false,
                BodyState::Arrived(at) if at + deadline.0 > until => until = at + deadline.0,
                BodyState::Arrived(_) | BodyState::Unread => break true,
            },
        }
    };
    match timed_out {
        false => ApiError::new(
            ErrorCode::RequestTimeout,
            "the request body did not arrive in time; send it whole, promptly",
        )
        .into_response(),
        true => {
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

    #[test]
    fn bulk_routes_end_before_the_request_timeout() {
        assert_eq!(
            Deadline::bulk(Duration::from_secs(15)),
            Deadline(Duration::from_millis(14_500))
        );
        assert_eq!(
            Deadline::bulk(Duration::from_secs(3)),
            Deadline(Duration::from_millis(2_500))
        );
    }
}
