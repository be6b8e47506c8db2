//! Holdfast's core: the Redis hot path and the PostgreSQL system of record.
//!
//! Redis is the authority for "can this shopper have this unit now", decided by
//! atomic Lua scripts (the `lua/` folder of the workspace); PostgreSQL keeps the
//! durable record. This crate owns both connections and every query and script,
//! and has no UI code: the axum server, the Leptos server functions and the CLI
//! all call the same [`Engine`].
//!
//! # The quantities
//!
//! Per SKU, Redis keeps `available` (never negative), `reserved` (units in open
//! holds) and `sold_pending` (sold in Redis, not yet written to PostgreSQL). With
//! no event in flight, `available + reserved + sold_pending = on_hand`.
//!
//! # The life of a hold
//!
//! 1. [`Engine::reserve`] checks every line's floor, takes the units from
//!    `available` into `reserved`, records the hold with its deadline and appends
//!    an event, in one script. The outcome ([`ReserveOutcome`]) tells apart a new
//!    hold, a retry of the same reservation id, sold out, a counter that was never
//!    warmed, a conflicting reuse of the id, the per-buyer limit and bad input.
//! 2. [`Engine::confirm`] moves a live hold's units to `sold_pending`. After the
//!    deadline it answers [`ConfirmOutcome::Expired`] and moves nothing: a late
//!    payment to refund.
//! 3. [`Engine::release`] returns the units, exactly once however often called.
//! 4. The reaper ([`reaper::run_reaper`], [`Engine::reap_once`]) ends holds past
//!    their deadline through the same idempotent release: Redis runs no code when
//!    a key expires, so TTLs alone would leak reserved units.
//!
//! Ended holds are remembered for a day, which is how retries, late confirms and
//! repeated releases are recognised.
//!
//! # Modules
//!
//! - [`engine`], [`model`]: the reservation API and its outcomes.
//! - [`stock`]: warm-up, feed deltas and versioned snapshots.
//! - [`locks`]: leases with fencing tokens.
//! - [`events`]: the event streams and a reader that tails them.
//! - [`reaper`]: the expiry worker.
//! - [`record`]: the write-behind of events into PostgreSQL.
//! - [`warmup`], [`reconcile`]: rebuilding counters, and measuring and repairing drift.
//! - [`keys`]: the Redis key layout and its hash tags.
//! - [`scripts`]: the embedded Lua scripts, called by SHA.
//! - [`store`], [`kv`]: connecting to PostgreSQL and Redis, with start-up checks.
//! - [`catalog`]: SKUs and drops as PostgreSQL records them.
//! - [`tokens`]: API tokens (hashed) and their scopes.
//! - [`users`], [`audit`]: dashboard users, roles, sessions and the audit log.
//! - [`remediation`]: late payments awaiting a refund or re-reservation.
//! - [`ingest`], [`payload`]: webhook lanes, their consumers and dead letters.
//! - `testkit` (feature `testkit`): private `redis-server` processes for tests.

pub mod audit;
pub mod catalog;
pub mod engine;
pub mod error;
pub mod events;
pub mod ingest;
pub mod keys;
pub mod kv;
pub mod locks;
pub mod model;
pub mod payload;
pub mod reaper;
pub mod reconcile;
pub mod record;
pub mod remediation;
mod reply;
pub mod scripts;
pub mod stock;
pub mod store;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod tokens;
pub mod users;
pub mod warmup;

pub use engine::{Engine, EngineConfig};
pub use error::{EngineError, redact_url};
pub use model::*;

/// The connections every part of Holdfast works through: one PostgreSQL pool and
/// one multiplexed, self-reconnecting Redis connection with the engine over it.
/// Cheap to clone.
#[derive(Clone)]
pub struct Backends {
    /// The system of record.
    pub pg: sqlx::PgPool,
    /// The hot path (raw connection, for probes and reads outside the scripts).
    pub redis: redis::aio::ConnectionManager,
    /// The reservation engine over `redis`.
    pub engine: Engine,
}

impl Backends {
    /// Bundles `pg` and `redis` with an engine configured by `config`.
    pub fn new(
        pg: sqlx::PgPool,
        redis: redis::aio::ConnectionManager,
        config: EngineConfig,
    ) -> Self {
        let engine = Engine::new(redis.clone(), config);
        Self { pg, redis, engine }
    }
}
