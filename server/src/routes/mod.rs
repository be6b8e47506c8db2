//! HTTP routes, one file per area.

pub mod health;
pub mod ingest;
pub mod metrics;
