//! Data shapes that travel between the server and the browser.

use serde::{Deserialize, Serialize};

/// One SKU row of a drop, as the dashboard lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkuSummary {
    /// The SKU code, e.g. `DROP-001`.
    pub sku: String,
    /// Human title.
    pub title: String,
    /// Product this SKU is a variant of.
    pub product: String,
    /// Units on hand according to PostgreSQL.
    pub on_hand: i64,
}

/// A drop and its SKUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DropOverview {
    /// Drop code, e.g. `winter-launch`.
    pub code: String,
    /// Display name.
    pub name: String,
    /// The drop's SKUs in display order.
    pub skus: Vec<SkuSummary>,
}

pub mod api;
