//! HTTP routes, one file per area.

pub mod demo;
pub mod health;
pub mod ingest;
pub mod metrics;
pub mod receiving;
