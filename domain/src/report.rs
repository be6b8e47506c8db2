//! A drop's report: what sold, how fast, and how every hold ended, per SKU.

use serde::{Deserialize, Serialize};

/// One SKU's part of a [`DropReport`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SkuReport {
    /// The SKU code.
    pub sku: String,
    /// Its title.
    pub title: String,
    /// Units the drop gave it.
    pub stock: i64,
    /// Units sold (confirmed holds taken in the drop's window).
    pub units_sold: i64,
    /// Holds taken.
    pub holds: i64,
    /// Holds confirmed (paid).
    pub confirmed: i64,
    /// Holds released by the shopper or the shop.
    pub released_by_shoppers: i64,
    /// Holds released by support on the dashboard.
    pub released_by_support: i64,
    /// Holds that expired.
    pub expired: i64,
    /// Holds not ended yet (or not yet written behind).
    pub open: i64,
    /// Payments that came after their hold had ended.
    pub late_payments: i64,
    /// Units sold that a feed had removed (shortfalls to source or refund).
    pub shortfalls: i64,
    /// Most holds taken in one second.
    pub peak_holds_per_second: i64,
    /// Most reservation attempts in one second, refusals included (counted
    /// by every server, see `holdfast_engine::attempts`).
    #[serde(default)]
    pub peak_attempts_per_second: i64,
    /// Seconds from the start (or the first hold) to the hold that took the
    /// last unit sold; `null` while units remain unsold.
    pub sold_out_after_secs: Option<f64>,
}

/// A drop's report, built from PostgreSQL (holds, orders, remediations and the
/// audit log, all written behind), so it is the same on any server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DropReport {
    /// The drop's code.
    pub code: String,
    /// Its name.
    pub name: String,
    /// Its start (RFC 3339), if scheduled.
    pub starts_at: Option<String>,
    /// Its end (RFC 3339), if scheduled.
    pub ends_at: Option<String>,
    /// Per SKU, in the drop's order.
    pub skus: Vec<SkuReport>,
    /// Holds taken and units sold over the drop, in buckets of
    /// `timeline_bucket_secs` (by when each hold was taken), oldest first;
    /// buckets without holds are left out.
    pub timeline: Vec<TimelinePoint>,
    /// The width of a timeline bucket: 1 s for a drop whose holds span ten
    /// minutes or less, else 60 s.
    pub timeline_bucket_secs: i64,
}

/// One bucket of a [`DropReport`]'s timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TimelinePoint {
    /// The bucket's start, Unix ms.
    pub at_ms: i64,
    /// Holds taken in it.
    pub holds: i64,
    /// Units of those holds that were confirmed.
    pub units_sold: i64,
}

/// The report's CSV columns.
pub const REPORT_COLUMNS: [&str; 15] = [
    "sku",
    "title",
    "stock",
    "units_sold",
    "holds",
    "confirmed",
    "released_by_shoppers",
    "released_by_support",
    "expired",
    "open",
    "late_payments",
    "shortfalls",
    "peak_holds_per_second",
    "peak_attempts_per_second",
    "sold_out_after_secs",
];

impl DropReport {
    /// The report as CSV: a header of [`REPORT_COLUMNS`], a row per SKU.
    pub fn to_csv(&self) -> String {
        let mut out = REPORT_COLUMNS.join(",");
        out.push('\n');
        for s in &self.skus {
            let row = [
                crate::sheet::csv_cell(&s.sku),
                crate::sheet::csv_cell(&s.title),
                s.stock.to_string(),
                s.units_sold.to_string(),
                s.holds.to_string(),
                s.confirmed.to_string(),
                s.released_by_shoppers.to_string(),
                s.released_by_support.to_string(),
                s.expired.to_string(),
                s.open.to_string(),
                s.late_payments.to_string(),
                s.shortfalls.to_string(),
                s.peak_holds_per_second.to_string(),
                s.peak_attempts_per_second.to_string(),
                s.sold_out_after_secs
                    .map(|v| format!("{v:.3}"))
                    .unwrap_or_default(),
            ];
            out.push_str(&row.join(","));
            out.push('\n');
        }
        out
    }
}
