//! The application's state: built once by [`crate::startup`], then handed to each
//! HTTP area as the part it needs (`FromRef`). The areas never import this module,
//! so handlers and state do not depend on each other.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::FromRef;
use holdfast_app::server::guard::CookiePolicy;
use holdfast_app::server::jobs::JobBoard;
use holdfast_engine::Backends;
use holdfast_engine::doctor::DoctorConfig;
use leptos::config::LeptosOptions;

use crate::api::ApiState;
use crate::api::soldout::SoldOutCache;
use crate::badge::{BadgeConfig, BadgeHub};
use crate::feed::Feed;
use crate::http::auth::{TokenCheck, TokenLimits};
use crate::http::edge::EdgeConfig;
use crate::http::observe::HttpMetrics;
use crate::live::LiveHub;
use crate::live::hub::LiveConfig;
use crate::routes::demo::DemoShop;
use crate::routes::ingest::{IngestConfig, IngestState};
use crate::routes::metrics::{MetricsAccess, MetricsSources, RedisIdentity};
use crate::workers::WorkerStats;
use holdfast_engine::ratelimit::{DEFAULT_SOURCE_RATE, DEFAULT_TOKEN_RATE};

/// The knobs of the state that differ between deployments (and tests).
#[derive(Debug, Clone)]
pub struct StateOptions {
    /// API requests per second per token (0: no limit).
    pub api_rate: u32,
    /// Webhooks per second per source (0: no limit).
    pub ingest_rate: u32,
    /// How long a sell-out is answered from memory (zero: off).
    pub sold_out_ttl: Duration,
    /// The shortest time between two reads of the event feed while events
    /// keep coming ([`crate::feed::Feed::new`]).
    pub feed_gather: Duration,
    /// Webhook sources and lane caps.
    pub ingest: IngestConfig,
    /// Badge limits and origins.
    pub badge: BadgeConfig,
    /// Public hosts, trusted proxies, cookies and connection limits.
    pub edge: EdgeConfig,
    /// Who may read `/metrics`.
    pub metrics: MetricsAccess,
    /// Checks of not-yet-known API tokens per client address per second.
    pub unknown_tokens_per_second: u32,
    /// Refused API token secrets remembered.
    pub refused_tokens_remembered: usize,
    /// What the operations page's deployment checks run against (`None`:
    /// the page says they are not available here).
    pub doctor: Option<Arc<DoctorConfig>>,
    /// Whether the demo shop sells (the server runs the demo).
    pub demo_shop_sells: bool,
    /// The dashboard sockets' limits.
    pub live: LiveConfig,
    /// A Redis connection of its own for webhook intake, so a payload of
    /// megabytes is never written ahead of checkout calls on theirs (`None`:
    /// intake shares the engine's connection, as tests may).
    pub intake_redis: Option<holdfast_engine::RedisConn>,
}

impl Default for StateOptions {
    fn default() -> Self {
        Self {
            api_rate: DEFAULT_TOKEN_RATE,
            ingest_rate: DEFAULT_SOURCE_RATE,
            sold_out_ttl: Duration::from_secs(2),
            feed_gather: crate::feed::DEFAULT_GATHER,
            ingest: IngestConfig::parse(&[]).unwrap_or_default(),
            badge: BadgeConfig::default(),
            edge: EdgeConfig::default(),
            metrics: MetricsAccess::default(),
            live: LiveConfig::default(),
            unknown_tokens_per_second: crate::http::auth::UNKNOWN_TOKENS_PER_ADDRESS,
            refused_tokens_remembered: holdfast_engine::tokens::REFUSED_REMEMBERED,
            doctor: None,
            demo_shop_sells: false,
            intake_redis: None,
        }
    }
}

/// Shared state behind the router: one allocation, so the clone axum makes
/// for every request is a reference count (a profile of the reserve path
/// under load found cloning and dropping the fields one by one at 6% of the
/// server's CPU).
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// What [`AppState`] shares.
pub struct Shared {
    /// What the API's handlers work with (the sold-out cache among it).
    pub api: ApiState,
    /// Where the site (WASM, JS, CSS) lives and how Leptos renders.
    pub leptos: LeptosOptions,
    /// PostgreSQL and Redis.
    pub backends: Backends,
    /// The background workers' counters and health.
    pub workers: Arc<WorkerStats>,
    /// API token verification and limits.
    pub tokens: TokenCheck,
    /// Webhook sources, lanes and limits.
    pub ingest: IngestState,
    /// Live events from Redis, for every listener in this process.
    pub feed: Feed,
    /// Shopper badges (public, read-only).
    pub badges: Arc<BadgeHub>,
    /// Dashboard jobs (warm-up, reconciliation) and their progress.
    pub jobs: Arc<JobBoard>,
    /// The dashboards' live hub.
    pub live: Arc<LiveHub>,
    /// The edge's settings (hosts, proxies, cookies, connection limits).
    pub edge: Arc<EdgeConfig>,
    /// Who may read `/metrics`.
    pub metrics: MetricsAccess,
    /// Request durations.
    pub http_metrics: HttpMetrics,
    /// The Redis server `/metrics` saw last.
    pub redis_identity: Arc<RedisIdentity>,
    /// What the deployment checks run against, when known.
    pub doctor: Option<Arc<DoctorConfig>>,
    /// The demo shop.
    pub demo_shop: DemoShop,
}

impl AppState {
    /// The state over `backends`, serving the site in `leptos`, with the workers'
    /// counters `workers` and `options`.
    pub fn build(
        leptos: LeptosOptions,
        backends: Backends,
        workers: Arc<WorkerStats>,
        options: StateOptions,
    ) -> Self {
        let jobs = Arc::new(JobBoard::default());
        let secure = options.edge.cookies.secure;
        Self(Arc::new(Shared {
            api: ApiState::new(
                backends.clone(),
                Arc::new(SoldOutCache::new(options.sold_out_ttl)),
                options.edge.api_deadline,
            ),
            leptos,
            live: Arc::new(LiveHub::new(
                backends.clone(),
                jobs.clone(),
                workers.clone(),
                options.live,
            )),
            jobs,
            workers,
            tokens: TokenCheck::new(
                backends.pg.clone(),
                TokenLimits {
                    per_token: options.api_rate,
                    unknown_per_address: options.unknown_tokens_per_second,
                    refused_remembered: options.refused_tokens_remembered,
                },
            ),
            ingest: IngestState::new(
                options
                    .intake_redis
                    .clone()
                    .unwrap_or_else(|| backends.redis.clone()),
                options.ingest,
                options.ingest_rate,
            ),
            feed: Feed::new(4_096, options.feed_gather),
            edge: Arc::new(options.edge),
            metrics: options.metrics,
            http_metrics: HttpMetrics::default(),
            redis_identity: Arc::default(),
            doctor: options.doctor,
            demo_shop: DemoShop::new(backends.clone(), options.demo_shop_sells, secure),
            badges: Arc::new(BadgeHub::new(
                backends.engine.clone(),
                backends.pg.clone(),
                options.badge,
            )),
            backends,
        }))
    }

    /// State with default options and fresh worker counters (tests).
    pub fn new(leptos: LeptosOptions, backends: Backends) -> Self {
        Self::build(
            leptos,
            backends,
            Arc::new(WorkerStats::new()),
            StateOptions::default(),
        )
    }
}

impl FromRef<AppState> for LeptosOptions {
    fn from_ref(state: &AppState) -> Self {
        state.leptos.clone()
    }
}

impl FromRef<AppState> for Backends {
    fn from_ref(state: &AppState) -> Self {
        state.backends.clone()
    }
}

impl FromRef<AppState> for Arc<WorkerStats> {
    fn from_ref(state: &AppState) -> Self {
        state.workers.clone()
    }
}

impl FromRef<AppState> for TokenCheck {
    fn from_ref(state: &AppState) -> Self {
        state.tokens.clone()
    }
}

impl FromRef<AppState> for ApiState {
    fn from_ref(state: &AppState) -> Self {
        state.api.clone()
    }
}

impl FromRef<AppState> for IngestState {
    fn from_ref(state: &AppState) -> Self {
        state.ingest.clone()
    }
}

impl FromRef<AppState> for Arc<BadgeHub> {
    fn from_ref(state: &AppState) -> Self {
        state.badges.clone()
    }
}

impl FromRef<AppState> for MetricsSources {
    fn from_ref(state: &AppState) -> Self {
        MetricsSources {
            backends: state.backends.clone(),
            workers: state.workers.clone(),
            access: state.metrics.clone(),
            http: state.http_metrics.clone(),
            sold_out: state.api.sold_out.clone(),
            feed: state.feed.clone(),
            ingest: state.ingest.clone(),
            live: state.live.clone(),
            badges: state.badges.clone(),
            redis_identity: state.redis_identity.clone(),
        }
    }
}

impl FromRef<AppState> for CookiePolicy {
    fn from_ref(state: &AppState) -> Self {
        state.edge.cookies
    }
}

impl FromRef<AppState> for DemoShop {
    fn from_ref(state: &AppState) -> Self {
        state.demo_shop.clone()
    }
}

impl FromRef<AppState> for Arc<LiveHub> {
    fn from_ref(state: &AppState) -> Self {
        state.live.clone()
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
