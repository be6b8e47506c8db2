//! Messages on the dashboard's WebSocket (`/live`), one JSON object per frame.
//!
//! On connect the server sends a [`ServerMsg::Snapshot`] that is the truth as of
//! its `cursor`, then coalesced [`ServerMsg::Figures`] deltas with the cursor they
//! bring the tab to. A tab that reconnects passes its last cursor back; events it
//! missed in between are replayed into its event list, and the snapshot replaces
//! its figures, so nothing is lost across a drop in the connection.

use serde::{Deserialize, Serialize};

use super::ops::{JobView, OpsView};

/// A SKU's live figures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkuLive {
    /// The SKU code.
    pub sku: String,
    /// Units that can be reserved now.
    pub available: i64,
    /// Units in open holds.
    pub reserved: i64,
    /// Units sold in Redis and not yet written to PostgreSQL.
    pub sold_pending: i64,
    /// Held units a feed removed: paid back first by units that return.
    #[serde(default)]
    pub owed: i64,
    /// Units sold since the counter was warmed.
    pub sold: i64,
    /// Open holds.
    pub open_holds: u64,
    /// Redis minus what PostgreSQL implies (0 = in step).
    pub drift: i64,
    /// False when Redis has no counter for the SKU (warm-up needed).
    pub warmed: bool,
}

/// `available` at a moment, for the charts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    /// Unix milliseconds.
    pub at_ms: i64,
    /// Units available then.
    pub available: i64,
}

/// The recent `available` samples of one SKU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkuHistory {
    /// The SKU code.
    pub sku: String,
    /// Oldest first, at most one per second, ten minutes at most.
    pub samples: Vec<Sample>,
}

/// One event from the Redis streams, as a tab shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventView {
    /// Stream entry id (unique per shard).
    pub id: String,
    /// `reserved`, `confirmed`, `released`, `expired`, `warmed`, `delta`, …
    pub kind: String,
    /// The SKU.
    pub sku: String,
    /// Units moved.
    pub qty: i64,
    /// The hold, for hold events.
    pub reservation_id: Option<String>,
    /// `available` after the event, when the event carries it.
    pub available: Option<i64>,
    /// Unix milliseconds.
    pub at_ms: i64,
}

/// Server to tab.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerMsg {
    /// Everything a tab shows, as of `cursor`.
    Snapshot {
        /// The stream position this snapshot reflects.
        cursor: String,
        /// Figures of the catalogue's SKUs.
        skus: Vec<SkuLive>,
        /// Recent samples for the charts.
        history: Vec<SkuHistory>,
        /// Recent and running jobs (warm-up, reconciliation).
        jobs: Vec<JobView>,
        /// Events replayed since the cursor the tab reconnected with (for the
        /// SKU it watches); `None` when it had no cursor or the gap was too old.
        replayed: Option<Vec<EventView>>,
    },
    /// SKUs whose figures changed since the last message.
    Figures {
        /// The stream position these figures reflect.
        cursor: String,
        /// Only the SKUs that changed.
        skus: Vec<SkuLive>,
        /// Unix milliseconds on the server when sent.
        at_ms: i64,
    },
    /// New events about the SKU this tab watches.
    Events {
        /// Oldest first.
        events: Vec<EventView>,
    },
    /// Locks, ingestion lanes and write-behind, sampled about once a second.
    Ops(OpsView),
    /// A job started, progressed or ended.
    Job(JobView),
}

/// Tab to server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ClientMsg {
    /// Send raw events about this SKU (or none).
    Watch {
        /// The SKU whose page is open.
        sku: Option<String>,
    },
}
