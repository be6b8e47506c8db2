//! Holdfast's core: the Redis hot path and the PostgreSQL system of record.
//!
//! Redis is the authority for "can this shopper have this unit now", decided by
//! atomic Lua scripts (the `lua/` folder of the workspace); PostgreSQL keeps the
//! durable record. This crate owns both connections, every Redis key, Lua call
//! and SQL statement, and every rule that needs them; it has no UI or HTTP code.
//! The axum server (`holdfast-server`), the Leptos server functions
//! (`holdfast-app`) and the CLI (`holdfast-cli`) all call it; the plain types
//! they share with the browser live in `holdfast-domain`.
//!
//! # The flow
//!
//! ```text
//! HTTP request (server::api)  or  server function (app::api)  or  CLI (cli)
//!   │
//!   ▼
//! Engine::reserve / confirm / release          (engine.rs, checkout.rs)
//!   │  one EVALSHA per shard, keys from keys.rs, scripts from lua/ (scripts.rs)
//!   ▼
//! Redis: counters, holds, due set  ──XADD──▶  shard event stream (events.rs)
//!                                               │
//!             ┌─────────────────────────────────┼──────────────────────┐
//!             ▼                                 ▼                      ▼
//!   write-behind (record.rs)          live feed (server::feed)   reaper (reaper.rs)
//!   one transaction per batch:        badges, dashboards         ends overdue holds
//!   orders, ledger, on_hand           over WebSockets            through release
//!             │
//!             ▼
//!   PostgreSQL: the system of record (catalog.rs, postgres.rs); drift between
//!   the two is measured and repaired by reconcile.rs, rebuilt by warmup.rs.
//! ```
//!
//! Feeds arrive as signed webhooks, queue on Redis Streams lanes and are applied
//! by [`ingest`] consumers through `delta.lua` and `snapshot.lua`, into the same
//! event streams.
//!
//! # The quantities
//!
//! Per SKU, Redis keeps `available` (never negative), `reserved` (units in open
//! holds) and `sold_pending` (sold in Redis, not yet written to PostgreSQL). With
//! no event in flight, `available + reserved + sold_pending = on_hand` (a split
//! SKU's parts together, with units `moving` between them: see [`split`]).
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
//! - [`postgres`], [`redis_conn`]: connecting to PostgreSQL and Redis, with start-up checks.
//! - [`catalog`]: SKUs and drops as PostgreSQL records them.
//! - [`arm`]: arming a drop before its start, and its readiness.
//! - [`report`]: a drop's report, from PostgreSQL alone.
//! - [`drop_file`]: a drop as a file (CSV, JSON): import, checked and all or nothing, and export.
//! - [`checkout`], [`idempotency`]: the API's rules: reservation ids from
//!   idempotency keys, late payments, stored answers to retried requests.
//! - [`tokens`]: API tokens (hashed), their scopes and a verification cache.
//! - [`users`], [`audit`]: dashboard users, roles, sessions and the audit log.
//! - [`ratelimit`]: per-key token buckets (per API token, webhook source, client address).
//! - [`replicas`]: payments acknowledged by replicas before they are answered.
//! - [`failover`]: noticing a cluster failover and checking the shards it moved.
//! - [`remediation`]: late payments, oversells and lost holds awaiting support.
//! - [`cart`]: carts across shards, reserved, confirmed and expired as one unit.
//! - [`split`]: one hot SKU's stock in parts on several shards, never sold out while a part has units.
//! - [`verify`]: the truth check operators run any time on live data.
//! - [`ingest`], [`payload`]: webhook lanes, their consumers and dead letters.
//! - `testkit` (feature `testkit`): private `redis-server` processes for tests.

pub mod arm;
pub mod attempts;
pub mod audit;
pub mod cart;
pub mod catalog;
pub mod checkout;
pub mod doctor;
pub mod drop_file;
pub mod engine;
pub mod error;
pub mod events;
pub mod failover;
mod hold_cache;
pub mod idempotency;
pub mod ingest;
pub mod keys;
pub mod locks;
pub mod redis_conn;
/// The reservation types and outcomes, from the domain crate (shared with the dashboard).
pub use holdfast_domain::model;
pub mod pace;
pub mod payload;
pub mod postgres;
pub mod ratelimit;
pub mod reaper;
pub mod reconcile;
pub mod record;
pub mod remediation;
pub mod replicas;
mod reply;
pub mod report;
pub mod schedule;
pub mod scripts;
pub mod split;
pub mod stock;
pub mod telemetry;
#[cfg(feature = "testkit")]
pub mod testkit;
mod tls;
pub mod tokens;
pub mod users;
pub mod verify;
pub mod warmup;

pub use engine::{Engine, EngineConfig, fingerprint as request_fingerprint};
pub use error::{EngineError, redact_url};
pub use model::*;
pub use redis_conn::RedisConn;
pub use split::{SplitOutcome, SplitStats};

/// The connections every part of Holdfast works through: one PostgreSQL pool and
/// one multiplexed, self-reconnecting Redis connection with the engine over it.
/// Cheap to clone.
#[derive(Clone)]
pub struct Backends {
    /// The system of record.
    pub pg: sqlx::PgPool,
    /// The hot path (raw connection, for probes and reads outside the scripts).
    pub redis: RedisConn,
    /// The reservation engine over `redis`.
    pub engine: Engine,
    /// Places for the drop imports this process runs at once
    /// ([`drop_file::IMPORTS_AT_ONCE`]; [`drop_file::import_to_the_end`]).
    pub imports: std::sync::Arc<tokio::sync::Semaphore>,
    /// Session lookups that found no live session, per client address
    /// ([`users::UNKNOWN_SESSIONS_PER_ADDRESS`]; [`users::session_user_from`]).
    pub session_misses: std::sync::Arc<ratelimit::RateLimiter<std::net::IpAddr>>,
}

impl Backends {
    /// Bundles `pg` and `redis` (one node or a cluster) with an engine
    /// configured by `config`.
    pub fn new(pg: sqlx::PgPool, redis: impl Into<RedisConn>, config: EngineConfig) -> Self {
        let redis = redis.into();
        let engine = Engine::new(redis.clone(), config);
        let imports = std::sync::Arc::new(tokio::sync::Semaphore::new(drop_file::IMPORTS_AT_ONCE));
        let session_misses = std::sync::Arc::new(ratelimit::RateLimiter::new(
            ratelimit::Limit::per_second(users::UNKNOWN_SESSIONS_PER_ADDRESS),
        ));
        Self {
            pg,
            redis,
            engine,
            imports,
            session_misses,
        }
    }

    /// The same backends with Redis reached over `redis` instead (the engine
    /// shares everything else: see [`Engine::over`]).
    pub fn over(&self, redis: RedisConn) -> Self {
        Self {
            pg: self.pg.clone(),
            engine: self.engine.over(redis.clone()),
            redis,
            imports: self.imports.clone(),
            session_misses: self.session_misses.clone(),
        }
    }
}
