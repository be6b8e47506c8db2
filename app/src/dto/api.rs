//! The JSON shapes of the checkout API (`/api/v1`), shared with its clients.

use serde::{Deserialize, Serialize};

/// One line of a reservation request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct LineRequest {
    /// The SKU code.
    pub sku: String,
    /// Units, 1 or more.
    pub qty: i64,
}

/// `POST /api/v1/reservations`. Either `sku` and `qty` (one SKU) or `lines` (a cart,
/// all or nothing). The reservation id comes from the `Idempotency-Key` header.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateReservation {
    /// The SKU, for a one-SKU reservation.
    pub sku: Option<String>,
    /// Units of `sku`.
    pub qty: Option<i64>,
    /// The lines of a cart.
    pub lines: Option<Vec<LineRequest>>,
    /// The shopper, for per-buyer limits.
    pub buyer: Option<String>,
    /// How long to hold, in milliseconds (default: the server's).
    pub ttl_ms: Option<u64>,
}

/// A line of a reservation as the API reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct LineView {
    /// The SKU code.
    pub sku: String,
    /// Units held or sold.
    pub qty: i64,
    /// Units of the SKU available right after this reservation, when just made
    /// (for a split SKU, those of the part that served it: a lower bound, read
    /// in the same script; `GET /api/v1/stock/{sku}` has the whole).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_after: Option<i64>,
}

/// A reservation as the API reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct ReservationView {
    /// The reservation id (derived from the idempotency key).
    pub id: String,
    /// `held`, `confirmed`, `released` or `expired`.
    pub state: String,
    /// When the hold lapses (RFC 3339), while it is held.
    pub expires_at: Option<String>,
    /// What it holds.
    pub lines: Vec<LineView>,
    /// The buyer, if one was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub buyer: Option<String>,
}

/// A SKU's live stock as the API reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct StockView {
    /// The SKU code.
    pub sku: String,
    /// Units a shopper can reserve now.
    pub available: i64,
    /// Units in open holds.
    pub reserved: i64,
    /// Units sold, not yet in the system of record.
    pub sold_pending: i64,
}

/// The error body of every API failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    /// A stable machine-readable code (`sold_out`, `not_warmed`, `invalid`, …).
    pub code: String,
    /// What happened and what to do, for a person.
    pub message: String,
    /// The request field at fault, for validation errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The SKU concerned, for stock errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sku: Option<String>,
    /// Units left, for `sold_out`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available: Option<i64>,
    /// When the drop starts (RFC 3339, UTC), for `not_started`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starts_at: Option<String>,
    /// When the drop ended (RFC 3339, UTC), for `ended`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    /// Every problem of a refused drop file, by line and column.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<holdfast_domain::sheet::Problem>,
}
