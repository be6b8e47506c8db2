//! The codes every refusal is answered with, shared by the HTTP API and the
//! dashboard's server functions so that one failure reads the same through every
//! door: each code has one HTTP status and, where waiting helps, a `Retry-After`.

use serde::{Deserialize, Serialize};

/// A stable, machine-readable reason a request was not done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The body is not a valid request.
    BadRequest,
    /// No valid API token or session.
    Unauthorized,
    /// The caller may not do this.
    Forbidden,
    /// No such thing (for this caller).
    NotFound,
    /// A field is invalid; the answer names it.
    Invalid,
    /// Not enough stock; the answer says how much is left.
    SoldOut,
    /// The buyer reached the SKU's per-buyer limit.
    BuyerLimitReached,
    /// A line's SKU has a per-buyer limit, so the request must name its buyer.
    BuyerRequired,
    /// The body is larger than this endpoint accepts.
    PayloadTooLarge,
    /// The request's body did not arrive within the deadline.
    RequestTimeout,
    /// The hold had ended before payment was confirmed.
    HoldExpired,
    /// Redis lost the reservation; a remediation was recorded.
    ReservationLost,
    /// A create needs an `Idempotency-Key`.
    IdempotencyKeyRequired,
    /// The `Idempotency-Key` header is malformed.
    InvalidIdempotencyKey,
    /// The `Idempotency-Key` was used for a different request.
    IdempotencyKeyReused,
    /// The first request with this `Idempotency-Key` is still running.
    RequestInProgress,
    /// The work is already running elsewhere (its lock is held).
    Busy,
    /// A webhook came without its timestamp or signature headers.
    MissingSignature,
    /// A webhook's timestamp is too far from now (a replay, or a skewed clock).
    StaleTimestamp,
    /// A webhook's signature does not match its body.
    BadSignature,
    /// A webhook lane is at its cap.
    LaneFull,
    /// Too many requests.
    RateLimited,
    /// The SKU's counter is not in Redis yet (never `sold_out`).
    NotWarmed,
    /// The SKU's drop has not started yet (by Redis' clock).
    NotStarted,
    /// The SKU's drop has ended (by Redis' clock).
    Ended,
    /// A backing service (Redis, PostgreSQL) is unavailable.
    Unavailable,
    /// A fault on our side, logged; shown opaquely.
    Internal,
}

impl ErrorCode {
    /// The code as the API's JSON body carries it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BadRequest => "bad_request",
            Self::Unauthorized => "unauthorized",
            Self::Forbidden => "forbidden",
            Self::NotFound => "not_found",
            Self::Invalid => "invalid",
            Self::SoldOut => "sold_out",
            Self::BuyerLimitReached => "buyer_limit_reached",
            Self::BuyerRequired => "buyer_required",
            Self::PayloadTooLarge => "payload_too_large",
            Self::RequestTimeout => "request_timeout",
            Self::HoldExpired => "hold_expired",
            Self::ReservationLost => "reservation_lost",
            Self::IdempotencyKeyRequired => "idempotency_key_required",
            Self::InvalidIdempotencyKey => "invalid_idempotency_key",
            Self::IdempotencyKeyReused => "idempotency_key_reused",
            Self::RequestInProgress => "request_in_progress",
            Self::Busy => "busy",
            Self::MissingSignature => "missing_signature",
            Self::StaleTimestamp => "stale_timestamp",
            Self::BadSignature => "bad_signature",
            Self::LaneFull => "lane_full",
            Self::RateLimited => "rate_limited",
            Self::NotWarmed => "not_warmed",
            Self::NotStarted => "not_started",
            Self::Ended => "ended",
            Self::Unavailable => "unavailable",
            Self::Internal => "internal",
        }
    }

    /// The HTTP status this code is answered with.
    pub fn status(self) -> u16 {
        match self {
            Self::BadRequest | Self::IdempotencyKeyRequired | Self::InvalidIdempotencyKey => 400,
            Self::Unauthorized
            | Self::MissingSignature
            | Self::StaleTimestamp
            | Self::BadSignature => 401,
            Self::Forbidden => 403,
            Self::NotFound => 404,
            Self::SoldOut
            | Self::BuyerLimitReached
            | Self::RequestInProgress
            | Self::Busy
            | Self::NotStarted
            | Self::Ended => 409,
            Self::HoldExpired | Self::ReservationLost => 410,
            Self::RequestTimeout => 408,
            Self::PayloadTooLarge => 413,
            Self::Invalid | Self::IdempotencyKeyReused | Self::BuyerRequired => 422,
            Self::RateLimited | Self::LaneFull => 429,
            Self::Internal => 500,
            Self::NotWarmed | Self::Unavailable => 503,
        }
    }

    /// Whether an answer with this code is kept for its `Idempotency-Key`, so a
    /// retry with the key gets it again. Not kept: what passes (a moment's
    /// contention or rate limit, a backend outage, our fault, a counter not yet
    /// warmed, a drop not open yet or ended), and a malformed or invalid request
    /// (corrected, it may be the same request: `ttl_ms` is not part of what
    /// makes a request the same). `lua/reserve.lua` keeps its refusals by the
    /// same rule.
    pub fn kept_for_replay(self) -> bool {
        !matches!(
            self,
            Self::BadRequest
                | Self::Invalid
                | Self::RequestInProgress
                | Self::Busy
                | Self::RequestTimeout
                | Self::RateLimited
                | Self::LaneFull
                | Self::NotWarmed
                | Self::NotStarted
                | Self::Ended
                | Self::Unavailable
                | Self::Internal
        )
    }

    /// Seconds after which a retry may succeed, sent as `Retry-After`; `None`
    /// when retrying the same request will not help. (A rate limit names its own
    /// wait, which overrides this.)
    pub fn retry_after(self) -> Option<u64> {
        match self {
            Self::NotWarmed | Self::LaneFull => Some(5),
            Self::Unavailable => Some(2),
            // A moment's contention: a key being processed, a rate, a split
            // SKU's parts being changed or its units being gathered.
            Self::RequestInProgress | Self::RateLimited | Self::Busy => Some(1),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorCode;

    #[test]
    fn names_match_serde() {
        for code in [
            ErrorCode::SoldOut,
            ErrorCode::NotWarmed,
            ErrorCode::IdempotencyKeyReused,
        ] {
            let json = serde_json::to_string(&code).unwrap_or_default();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
        }
        assert_eq!(ErrorCode::NotWarmed.status(), 503);
        assert_eq!(ErrorCode::NotWarmed.retry_after(), Some(5));
        assert_eq!(
            (ErrorCode::Busy.status(), ErrorCode::Busy.retry_after()),
            (409, Some(1)),
            "busy passes: retry after a second"
        );
    }
}
