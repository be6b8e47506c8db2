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
    /// The variant's name within its product (size, colour), if any.
    pub variant: Option<String>,
    /// At or below this many available units the SKU shows as low stock.
    pub low_stock_threshold: i64,
    /// Units on hand according to PostgreSQL.
    pub on_hand: i64,
}

/// A drop and its SKUs with their live figures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DropOverview {
    /// Drop code, e.g. `winter-launch`.
    pub code: String,
    /// Display name.
    pub name: String,
    /// The drop's SKUs in display order.
    pub skus: Vec<SkuSummary>,
    /// Figures of the same SKUs, same order, when the page was rendered.
    pub figures: Vec<live::SkuLive>,
    /// Every drop, newest first, as `(code, name)`, for switching.
    pub drops: Vec<(String, String)>,
    /// When the drop opens, Unix ms (`None`: no start set).
    #[serde(default)]
    pub starts_at_ms: Option<i64>,
    /// When it closes, Unix ms (`None`: never).
    #[serde(default)]
    pub ends_at_ms: Option<i64>,
}

pub mod api;
pub mod holds;
pub mod live;
pub mod ops;
pub mod people;
