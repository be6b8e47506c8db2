//! Holdfast's core: the Redis hot path and the PostgreSQL system of record.
//!
//! Redis decides every reservation in an atomic Lua script; PostgreSQL keeps the
//! durable record. This crate owns both connections and every query, and has no
//! UI code, so the axum server, the Leptos server functions and the CLI all call
//! the same functions.
//!
//! - [`store`]: connecting to PostgreSQL, creating the database, migrations.
//! - [`kv`]: connecting to Redis and checking it cannot evict stock counters.
//! - [`catalog`]: SKUs and drops as PostgreSQL records them, and the demo drop.
//! - `testkit` (feature `testkit`): private `redis-server` processes for tests.

pub mod catalog;
pub mod error;
pub mod kv;
pub mod store;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use error::{EngineError, redact_url};

/// The connections every part of Holdfast works through: one PostgreSQL pool and
/// one multiplexed, self-reconnecting Redis connection. Cheap to clone.
#[derive(Clone)]
pub struct Backends {
    /// The system of record.
    pub pg: sqlx::PgPool,
    /// The hot path.
    pub redis: redis::aio::ConnectionManager,
}
