//! Reservations and their outcomes: every case in the hold lifecycle is its own
//! variant, so callers (the API, the dashboard) map each to a distinct answer.

use serde::{Deserialize, Serialize};

/// The state of a hold. Ended holds are remembered for a day (a tombstone), which
/// is how retries, late confirms and repeated releases are recognised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldState {
    /// Open: units are reserved until the deadline.
    Held,
    /// A cart's part whose confirmation is being decided (prepared, not yet
    /// committed): neither released nor expired meanwhile.
    Confirming,
    /// Paid: units moved to sold (pending write-behind).
    Confirmed,
    /// Ended by the shopper, checkout or support: units returned.
    Released,
    /// Ended by its deadline: units returned.
    Expired,
}

impl HoldState {
    /// Parses the `state` field the scripts write.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "held" => Some(Self::Held),
            "confirming" => Some(Self::Confirming),
            "confirmed" => Some(Self::Confirmed),
            "released" => Some(Self::Released),
            "expired" => Some(Self::Expired),
            _ => None,
        }
    }

    /// The name the scripts and the API use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Held => "held",
            Self::Confirming => "confirming",
            Self::Confirmed => "confirmed",
            Self::Released => "released",
            Self::Expired => "expired",
        }
    }
}

/// One line of a reservation: `qty` units of `sku`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Line {
    /// The SKU code.
    pub sku: String,
    /// Units, at least 1.
    pub qty: i64,
}

/// A request to hold stock: one SKU (one line) or a cart (several lines).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReserveRequest {
    /// The caller's id for this reservation, derived from its idempotency key:
    /// sending the same id again is a retry, never a second reservation.
    pub reservation_id: String,
    /// What to hold. A SKU may appear once.
    pub lines: Vec<Line>,
    /// Who is buying, for the per-buyer limit. Required when a line's SKU
    /// has a limit ([`ReserveOutcome::BuyerRequired`] otherwise).
    pub buyer: Option<String>,
    /// How long the hold lasts, in milliseconds; `None` takes the configured default.
    pub ttl_ms: Option<u64>,
}

impl ReserveRequest {
    /// A one-SKU request with the default TTL and no buyer.
    pub fn single(reservation_id: impl Into<String>, sku: impl Into<String>, qty: i64) -> Self {
        Self {
            reservation_id: reservation_id.into(),
            lines: vec![Line {
                sku: sku.into(),
                qty,
            }],
            buyer: None,
            ttl_ms: None,
        }
    }

    /// The same request for `buyer`.
    pub fn for_buyer(mut self, buyer: impl Into<String>) -> Self {
        self.buyer = Some(buyer.into());
        self
    }

    /// The same request with a hold of `ttl_ms` milliseconds.
    pub fn with_ttl_ms(mut self, ttl_ms: u64) -> Self {
        self.ttl_ms = Some(ttl_ms);
        self
    }
}

/// Why a request was refused before it reached Redis.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Invalid {
    /// The offending field, as the API names it (`qty`, `sku`, `reservation_id`, …).
    pub field: String,
    /// What is wrong, for a person.
    pub message: String,
}

/// The outcome of a reservation attempt. Every case is distinct; in particular a
/// missing counter ([`ReserveOutcome::NotWarmed`]) never reads as sold out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ReserveOutcome {
    /// Units are held until `expires_at_ms`.
    Reserved {
        /// The reservation id.
        reservation_id: String,
        /// Deadline, Unix time in milliseconds (Redis' clock).
        expires_at_ms: i64,
        /// Each line's SKU with its `available` count right after this hold.
        available_after: Vec<(String, i64)>,
    },
    /// A retry of a reservation already made with this id and request: nothing moved.
    AlreadyReserved {
        /// The reservation id.
        reservation_id: String,
        /// Where that reservation is now (it may have been confirmed or ended since).
        state: HoldState,
        /// Its deadline, Unix time in milliseconds.
        expires_at_ms: i64,
        /// What the first answer said: each line's SKU with its `available` count
        /// right after the hold was made (empty where it is not known: a cart over
        /// several shards, or a hold made before these were kept).
        available_after: Vec<(String, i64)>,
    },
    /// Not enough units of `sku` are available.
    SoldOut {
        /// The SKU that ran out.
        sku: String,
        /// Units still available (fewer than asked, possibly 0), when the
        /// request was first refused.
        available: i64,
        /// A retry of a request refused before: `available` is that earlier
        /// figure, not news about stock now.
        #[serde(default)]
        replayed: bool,
    },
    /// The counter of `sku` is missing in Redis (not warmed, or Redis lost it).
    NotWarmed {
        /// The SKU without a counter.
        sku: String,
    },
    /// The id was already used for a different request.
    Conflict {
        /// The reservation id.
        reservation_id: String,
    },
    /// The buyer would exceed the SKU's per-buyer limit.
    LimitExceeded {
        /// The limited SKU.
        sku: String,
        /// Most units one buyer may hold or buy.
        limit: i64,
        /// Units this buyer already holds or bought.
        already: i64,
    },
    /// `sku` has a per-buyer limit, so the request must name its buyer: without
    /// one the limit could not be counted. Nothing moved.
    BuyerRequired {
        /// The limited SKU.
        sku: String,
        /// Its per-buyer limit.
        limit: i64,
    },
    /// `sku`'s drop has not started: Redis' clock is before its `starts_at`.
    /// Nothing moved.
    NotStarted {
        /// The SKU whose drop has not started.
        sku: String,
        /// When it starts, Unix time in milliseconds.
        starts_at_ms: i64,
    },
    /// `sku`'s drop has ended: Redis' clock is at or after its `ends_at`. Nothing
    /// moved (holds taken before the end can still be confirmed).
    Ended {
        /// The SKU whose drop has ended.
        sku: String,
        /// When it ended, Unix time in milliseconds.
        ended_at_ms: i64,
    },
    /// The request is malformed; nothing was sent to Redis.
    Invalid(Invalid),
}

impl ReserveOutcome {
    /// Every [`ReserveOutcome::kind`].
    pub const KINDS: [&'static str; 10] = [
        "reserved",
        "already_reserved",
        "sold_out",
        "not_warmed",
        "conflict",
        "limit_exceeded",
        "buyer_required",
        "not_started",
        "ended",
        "invalid",
    ];

    /// The outcome's name, as its JSON `outcome` tag spells it (`reserved`,
    /// `sold_out`, …): one of a fixed set, for counting.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Reserved { .. } => "reserved",
            Self::AlreadyReserved { .. } => "already_reserved",
            Self::SoldOut { .. } => "sold_out",
            Self::NotWarmed { .. } => "not_warmed",
            Self::Conflict { .. } => "conflict",
            Self::LimitExceeded { .. } => "limit_exceeded",
            Self::BuyerRequired { .. } => "buyer_required",
            Self::NotStarted { .. } => "not_started",
            Self::Ended { .. } => "ended",
            Self::Invalid(_) => "invalid",
        }
    }
}

/// The outcome of confirming (paying for) a reservation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ConfirmOutcome {
    /// Units moved from reserved to sold.
    Confirmed,
    /// Confirmed before: nothing moved.
    AlreadyConfirmed,
    /// The hold had ended (released, or expired — possibly just now, being overdue):
    /// a late payment. No stock moved; the caller must refund or remediate.
    Expired {
        /// How the hold ended.
        state: HoldState,
    },
    /// No such reservation (never made, or ended more than a day ago).
    Unknown,
    /// Redis no longer knows the reservation (it lost its data) but the system of
    /// record saw it made: no stock was taken, and a remediation with its buyer
    /// and lines is recorded for support.
    Lost,
}

/// The outcome of releasing a reservation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ReleaseOutcome {
    /// Units returned by this call.
    Released,
    /// It had already ended: nothing moved.
    AlreadyGone {
        /// How it ended.
        state: HoldState,
    },
    /// No such reservation.
    Unknown,
}

/// A SKU's live figures in Redis.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Figures {
    /// Units a shopper can reserve now.
    pub available: i64,
    /// Units in open holds.
    pub reserved: i64,
    /// Units sold in Redis whose sale is not yet written to PostgreSQL.
    pub sold_pending: i64,
    /// Units confirmed in Redis since the counter was warmed.
    pub sold: i64,
    /// Open holds on the SKU.
    pub open_holds: u64,
    /// Per-buyer limit (0: none).
    pub per_buyer_limit: i64,
    /// Held units that no longer exist: a feed lowered stock below what open holds
    /// keep. Units that come back pay this first; a held unit confirmed while it is
    /// owed is an oversell (recorded as a remediation).
    #[serde(default)]
    pub owed: i64,
    /// When the SKU's drop opens, Unix ms by Redis' clock (0: no start).
    #[serde(default)]
    pub opens_at_ms: i64,
    /// When the SKU's drop closes, Unix ms (0: no end).
    #[serde(default)]
    pub closes_at_ms: i64,
    /// Units on their way from one part of a split SKU to another: neither
    /// available nor held for that moment, and counted in the equation
    /// (`available + moving + reserved + sold_pending = on_hand`).
    #[serde(default)]
    pub moving: i64,
    /// How many parts the SKU's stock is split into (0 or 1: not split).
    #[serde(default)]
    pub parts: u16,
}

/// One reservation as Redis holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    /// The reservation id.
    pub reservation_id: String,
    /// Where it is in its lifecycle.
    pub state: HoldState,
    /// What it holds.
    pub lines: Vec<Line>,
    /// The buyer, when one was given.
    pub buyer: Option<String>,
    /// Deadline, Unix time in milliseconds.
    pub expires_at_ms: i64,
    /// When it was made, Unix time in milliseconds.
    pub created_at_ms: i64,
}

/// What one reaper pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReapReport {
    /// Due holds found.
    pub due: u64,
    /// Holds this pass released (the rest were ended by someone else meanwhile).
    pub released: u64,
    /// Due holds that could not be read or ended (malformed, or a failure on
    /// that one hold): skipped and reported, never stopping the pass.
    #[serde(default)]
    pub skipped: u64,
}
