//! Holds, SKU detail and late-payment remediations, as the dashboard shows them.

use serde::{Deserialize, Serialize};

use super::live::{EventView, SkuLive};

/// One line of a hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HoldLineView {
    /// SKU.
    pub sku: String,
    /// Units.
    pub qty: i64,
}

/// A hold (reservation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HoldView {
    /// Reservation id.
    pub reservation_id: String,
    /// `held`, `confirmed`, `released` or `expired`.
    pub state: String,
    /// Lines.
    pub lines: Vec<HoldLineView>,
    /// Buyer, if given.
    pub buyer: Option<String>,
    /// Unix milliseconds of the deadline.
    pub expires_at_ms: i64,
    /// Unix milliseconds of creation.
    pub created_at_ms: i64,
}

/// Everything the SKU page shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkuDetail {
    /// Title from the catalogue.
    pub title: String,
    /// Product the SKU is a variant of.
    pub product: String,
    /// Current figures.
    pub figures: SkuLive,
    /// PostgreSQL's on-hand count.
    pub on_hand: i64,
    /// Per-buyer limit (0 = none).
    pub per_buyer_limit: i64,
    /// Open holds, soonest deadline first (at most 200).
    pub holds: Vec<HoldView>,
    /// Recent events, newest first.
    pub events: Vec<EventView>,
    /// Unix milliseconds on the server, to correct countdowns for clock skew.
    pub server_now_ms: i64,
    /// Available units of each part of the SKU's stock in Redis (one entry
    /// when it is not split).
    #[serde(default)]
    pub part_available: Vec<i64>,
}

/// A late payment awaiting a refund or re-reservation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemediationView {
    /// Reservation id.
    pub reservation_id: String,
    /// How the hold had ended.
    pub hold_state: String,
    /// Why.
    pub reason: String,
    /// `late_payment`, `oversold` or `unknown_confirm`.
    pub kind: String,
    /// `open`, `refunded`, `fulfilled` or `closed`.
    pub status: String,
    /// RFC 3339.
    pub created_at: String,
}

/// What the reservations search found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HoldSearch {
    /// Matching holds (open and recently ended).
    pub holds: Vec<HoldView>,
    /// Remediations matching the search (all recent ones when it is empty).
    pub remediations: Vec<RemediationView>,
    /// Unix milliseconds on the server.
    pub server_now_ms: i64,
}
