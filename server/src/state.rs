//! The state every handler shares.

use std::sync::Arc;

use axum::extract::FromRef;
use holdfast_app::server::jobs::JobBoard;
use holdfast_engine::Backends;
use leptos::config::LeptosOptions;

use crate::api::ApiState;
use crate::badge::{BadgeConfig, BadgeHub};
use crate::feed::Feed;
use crate::live::LiveHub;
use crate::routes::ingest::IngestConfig;
use crate::workers::WorkerStats;

/// Shared, cheaply clonable state behind the router.
#[derive(Clone)]
pub struct AppState {
    /// Where the site (WASM, JS, CSS) lives and how Leptos renders.
    pub leptos: LeptosOptions,
    /// PostgreSQL and Redis.
    pub backends: Backends,
    /// The background workers' counters and health.
    pub workers: Arc<WorkerStats>,
    /// The API's per-process state (token cache, sold-out cache).
    pub api: Arc<ApiState>,
    /// Live events from Redis, for every listener in this process.
    pub feed: Feed,
    /// Webhook sources and lane caps.
    pub ingest: Arc<IngestConfig>,
    /// Shopper badges (public, read-only).
    pub badges: Arc<BadgeHub>,
    /// Dashboard jobs (warm-up, reconciliation) and their progress.
    pub jobs: Arc<JobBoard>,
    /// The dashboards' live hub.
    pub live: Arc<LiveHub>,
}

impl AppState {
    /// State over `backends` serving the site in `leptos`, with fresh counters and caches.
    pub fn new(leptos: LeptosOptions, backends: Backends) -> Self {
        let workers = Arc::new(WorkerStats::new());
        let jobs = Arc::new(JobBoard::default());
        Self {
            leptos,
            live: Arc::new(LiveHub::new(
                backends.clone(),
                jobs.clone(),
                workers.clone(),
            )),
            jobs,
            workers,
            api: Arc::default(),
            feed: Feed::new(4_096),
            ingest: Arc::new(IngestConfig::parse(&[]).unwrap_or_default()),
            badges: Arc::new(BadgeHub::new(
                backends.engine.clone(),
                backends.pg.clone(),
                BadgeConfig::default(),
            )),
            backends,
        }
    }
}

impl FromRef<AppState> for LeptosOptions {
    fn from_ref(state: &AppState) -> Self {
        state.leptos.clone()
    }
}

/// Leptos options for serving the site built into `site_root`.
///
/// Built here rather than read from cargo-leptos' environment so the binary runs
/// the same whether cargo-leptos, the run script or a test started it.
pub fn leptos_options(site_root: &str, site_addr: std::net::SocketAddr) -> LeptosOptions {
    LeptosOptions::builder()
        .output_name("holdfast")
        .site_root(site_root)
        .site_pkg_dir("pkg")
        .site_addr(site_addr)
        .build()
}
