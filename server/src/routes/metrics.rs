//! `GET /metrics`: Prometheus exposition (OpenMetrics text) of request and
//! Redis latencies, reservation outcomes, the drops' per-SKU figures, live
//! connections, the workers' counters, the write-behind's lag, the ingestion
//! lanes, Redis' own health (`INFO`, sampled at each scrape, never per
//! request) and the PostgreSQL pool. Built on the `prometheus-client`
//! library: the long-lived histograms and counters are registered into a
//! registry made for each scrape, beside the values read at that moment.
//!
//! It holds no secrets but does show business figures: expose it to the
//! monitoring network only, and set a scrape token ([`MetricsAccess`]) so
//! nobody else can read it. The metric names are listed in
//! `docs/operations.md`; the alert rules and Grafana dashboard in `docs/`
//! use them (a test checks every name they use is exported).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{FromRef, State};
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use holdfast_engine::redis_conn::ServerStats;
use holdfast_engine::{Backends, ingest, postgres, redis_conn};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;

use crate::api::soldout::SoldOutCache;
use crate::badge::BadgeHub;
use crate::http::observe::HttpMetrics;
use crate::live::LiveHub;
use crate::routes::ingest::IngestState;
use crate::workers::WorkerStats;

/// Who may read `/metrics`: anyone, or (with a token) only a scraper sending
/// `Authorization: Bearer <token>`.
#[derive(Debug, Clone, Default)]
pub struct MetricsAccess(pub Option<Arc<str>>);

impl MetricsAccess {
    /// Whether `headers` carry what this access needs (compared in constant time).
    fn allows(&self, headers: &axum::http::HeaderMap) -> bool {
        let Some(token) = &self.0 else {
            return true;
        };
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        let (a, b) = (given.as_bytes(), token.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

/// Most SKUs with per-SKU series (the drops' SKUs in code order; totals such
/// as open holds count every SKU): a catalogue of any size cannot flood the
/// monitoring system.
pub const MAX_SKU_SERIES: usize = 1_000;

/// The Redis server this process saw at the last scrape, to notice a restart
/// or a fail-over (its `run_id` changes).
#[derive(Debug, Default)]
pub struct RedisIdentity {
    last: Mutex<Option<String>>,
    changes: Counter,
}

impl RedisIdentity {
    /// Notes `run_id`; counts a change from the one seen before.
    fn note(&self, run_id: &str) {
        if run_id.is_empty() {
            return;
        }
        if let Ok(mut last) = self.last.lock() {
            if last.as_deref().is_some_and(|l| l != run_id) {
                self.changes.inc();
            }
            *last = Some(run_id.to_owned());
        }
    }
}

/// Everything `/metrics` reads.
#[derive(Clone)]
pub struct MetricsSources {
    /// PostgreSQL and Redis (and the engine's own measures).
    pub backends: Backends,
    /// The background workers' counters.
    pub workers: Arc<WorkerStats>,
    /// Who may read it.
    pub access: MetricsAccess,
    /// Request durations.
    pub http: HttpMetrics,
    /// Sell-outs answered from memory.
    pub sold_out: Arc<SoldOutCache>,
    /// The event feed's reads.
    pub feed: crate::feed::Feed,
    /// Webhooks received.
    pub ingest: IngestState,
    /// Dashboard tabs and the drops' live figures.
    pub live: Arc<LiveHub>,
    /// Badge sockets.
    pub badges: Arc<BadgeHub>,
    /// The Redis server seen at the last scrape.
    pub redis_identity: Arc<RedisIdentity>,
}

/// The metrics route.
pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    MetricsSources: FromRef<S>,
{
    Router::new().route("/metrics", get(metrics))
}

/// The label of a per-SKU series.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SkuLabel {
    sku: String,
}

/// The label of a per-lane series.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LaneLabel {
    lane: String,
}

/// The label of the pool's connections by state.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabel {
    state: &'static str,
}

/// A registry for one scrape, with helpers for values read now.
struct Scrape(Registry);

impl Scrape {
    fn gauge(&mut self, name: &str, help: &str, value: i64) {
        self.0.register(name, help, ConstGauge::new(value));
    }

    fn fraction(&mut self, name: &str, help: &str, value: f64) {
        self.0.register(name, help, ConstGauge::new(value));
    }

    /// A counter read from elsewhere; `name` without `_total` (added on output).
    fn counter(&mut self, name: &str, help: &str, value: u64) {
        self.0.register(name, help, ConstCounter::new(value));
    }

    fn family<L>(&mut self, name: &str, help: &str, samples: impl IntoIterator<Item = (L, i64)>)
    where
        L: Clone + std::hash::Hash + Eq + EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static,
    {
        let family = Family::<L, Gauge>::default();
        for (label, value) in samples {
            family.get_or_create(&label).set(value);
        }
        self.0.register(name, help, family);
    }

    fn lane_counter(
        &mut self,
        name: &str,
        help: &str,
        workers: &WorkerStats,
        pick: fn(&ingest::LaneStats) -> u64,
    ) {
        let family = Family::<LaneLabel, Counter>::default();
        for (lane, s) in &workers.lanes {
            family
                .get_or_create(&LaneLabel {
                    lane: lane.to_string(),
                })
                .inc_by(pick(s));
        }
        self.0.register(name, help, family);
    }
}

/// Longest a scrape waits for a PostgreSQL connection to measure the wait.
const POOL_WAIT_LIMIT: Duration = Duration::from_millis(250);

async fn metrics(
    State(src): State<MetricsSources>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    if !src.access.allows(&headers) {
        return (
            axum::http::StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "send the scrape token: Authorization: Bearer <HOLDFAST_METRICS_TOKEN>",
        )
            .into_response();
    }
    let backends = &src.backends;
    let mut out = Scrape(Registry::default());
    let timeout = Duration::from_millis(1_000);
    let redis_up = redis_conn::ping(&backends.redis, timeout).await.is_ok();
    let pg_up = postgres::ping(&backends.pg, timeout).await.is_ok();
    out.gauge(
        "holdfast_redis_up",
        "Whether Redis answers PING",
        i64::from(u8::from(redis_up)),
    );
    out.gauge(
        "holdfast_postgres_up",
        "Whether PostgreSQL answers",
        i64::from(u8::from(pg_up)),
    );

    out.0.register(
        "holdfast_http_request_duration_seconds",
        "HTTP requests by matched route (`unmatched`: static files and unknown paths) and status class, from headers in to headers out",
        src.http.duration.clone(),
    );
    backends.engine.telemetry().register(&mut out.0);
    let split = backends.engine.split_stats();
    out.counter(
        "holdfast_split_gathers",
        "Reservations on a split SKU whose part was short, so units were gathered from its other parts first",
        split.gathers,
    );
    out.counter(
        "holdfast_split_moves",
        "Transfers of units between the parts of split SKUs (gathering, rebalancing, feeds)",
        split.moves,
    );
    out.counter(
        "holdfast_split_moved_units",
        "Units those transfers moved",
        split.units_moved,
    );
    out.0.register(
        "holdfast_sold_out_cache_hits",
        "Reservation attempts answered sold out from memory, without the reserve script",
        src.sold_out.hits.clone(),
    );
    out.0.register(
        "holdfast_feed_reads",
        "Reads of the event streams by this process' live feed that brought events",
        src.feed.reads.clone(),
    );
    out.0.register(
        "holdfast_ingest_received_payloads",
        "Webhook payloads accepted into a lane",
        src.ingest.payloads.clone(),
    );
    out.0.register(
        "holdfast_ingest_received_bytes",
        "Bytes of the webhook payloads accepted into a lane",
        src.ingest.bytes.clone(),
    );
    out.gauge(
        "holdfast_live_connections",
        "Dashboard tabs connected to this server",
        src.live.clients() as i64,
    );
    out.gauge(
        "holdfast_badge_connections",
        "Shopper badge sockets open on this server",
        src.badges.connections() as i64,
    );
    let pool = postgres::pool_use(&backends.pg);
    out.family(
        "holdfast_postgres_pool_connections",
        "This server's PostgreSQL connections by state",
        [
            (
                PoolLabel { state: "in_use" },
                i64::from(pool.open.saturating_sub(pool.idle)),
            ),
            (PoolLabel { state: "idle" }, i64::from(pool.idle)),
        ],
    );
    out.gauge(
        "holdfast_postgres_pool_max_connections",
        "Most PostgreSQL connections this server opens",
        i64::from(pool.max),
    );
    // The pool does not count its waiting callers; the scrape waits once itself.
    let wait = postgres::acquire_wait(&backends.pg, POOL_WAIT_LIMIT).await;
    out.fraction(
        "holdfast_postgres_pool_acquire_wait_seconds",
        "How long this scrape waited for a PostgreSQL connection from this server's pool (the stand-in for callers waiting; 0.25 when none came in time)",
        wait.as_secs_f64(),
    );

    let figures = src.live.drop_figures(MAX_SKU_SERIES);
    let per_sku = |pick: fn(&holdfast_app::dto::live::SkuLive) -> i64| {
        figures
            .iter()
            .map(move |f| (SkuLabel { sku: f.sku.clone() }, pick(f)))
            .collect::<Vec<_>>()
    };
    out.family(
        "holdfast_sku_available",
        "Units shoppers can reserve now, per SKU of the drops",
        per_sku(|f| f.available),
    );
    out.family(
        "holdfast_sku_reserved",
        "Units in open holds, per SKU of the drops",
        per_sku(|f| f.reserved),
    );
    out.family(
        "holdfast_sku_sold_pending",
        "Units sold in Redis not yet in PostgreSQL, per SKU of the drops",
        per_sku(|f| f.sold_pending),
    );
    out.family(
        "holdfast_sku_drift",
        "Redis minus what PostgreSQL implies, per SKU of the drops (0: in step)",
        per_sku(|f| f.drift),
    );
    out.gauge(
        "holdfast_open_holds",
        "Open holds on the drops' SKUs",
        i64::try_from(src.live.drop_open_holds()).unwrap_or(i64::MAX),
    );

    if redis_up && let Ok(info) = redis_conn::info(&backends.redis, timeout).await {
        redis_health(
            &mut out,
            &ServerStats::from_info(&info),
            &src.redis_identity,
        );
    }
    out.counter(
        "holdfast_redis_server_changes",
        "Times the Redis server behind REDIS_URL changed between scrapes (a restart or a fail-over: its run_id changed)",
        src.redis_identity.changes.get(),
    );

    worker_metrics(&mut out, &src.workers);
    out.gauge(
        "holdfast_shards_fenced",
        "Shards not selling now because their Redis Cluster master just changed",
        backends.engine.shard_fence().fenced().len() as i64,
    );
    if redis_up
        && let Ok(Ok(entries)) =
            tokio::time::timeout(timeout, backends.engine.stream_entries()).await
    {
        out.gauge(
            "holdfast_event_stream_entries",
            "Entries held in the event streams (about 150 bytes each; see docs/stock-rules.md)",
            entries as i64,
        );
    }
    if redis_up
        && let Ok(Ok(lag)) = tokio::time::timeout(timeout, backends.engine.write_behind_lag()).await
    {
        out.gauge(
            "holdfast_write_behind_lag_entries",
            "Events not yet in PostgreSQL",
            lag.entries as i64,
        );
        out.fraction(
            "holdfast_write_behind_lag_seconds",
            "Age of the oldest event not yet in PostgreSQL",
            lag.oldest_ms as f64 / 1000.0,
        );
    }
    if redis_up && pg_up {
        let owed = tokio::time::timeout(timeout, backends.owed_units()).await;
        let samples: Vec<(SkuLabel, i64)> = match owed {
            Ok(Ok(owed)) => owed
                .into_iter()
                .take(MAX_SKU_SERIES)
                .map(|(sku, n)| (SkuLabel { sku }, n))
                .collect(),
            _ => Vec::new(),
        };
        out.family(
            "holdfast_stock_owed_units",
            "Held units a feed removed (per SKU of the drops, only where any are owed)",
            samples,
        );
    }
    if redis_up {
        let mut conn = backends.redis.clone();
        let (mut backlog, mut paused) = (Vec::new(), Vec::new());
        for s in ingest::statuses(&mut conn).await.unwrap_or_default() {
            let label = LaneLabel {
                lane: s.lane.to_string(),
            };
            backlog.push((label.clone(), s.backlog as i64));
            paused.push((label, i64::from(u8::from(s.paused()))));
        }
        out.family(
            "holdfast_ingest_backlog",
            "Payloads waiting in the lane",
            backlog,
        );
        out.family(
            "holdfast_ingest_paused",
            "Whether the lane's consumers are paused",
            paused,
        );
    }
    let mut text = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &out.0) {
        tracing::error!(error = %e, "metrics: encoding failed");
        return axum::http::StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// Redis' own health, from one `INFO`.
fn redis_health(out: &mut Scrape, s: &ServerStats, identity: &RedisIdentity) {
    identity.note(&s.run_id);
    out.gauge(
        "holdfast_redis_used_memory_bytes",
        "Bytes Redis allocated",
        s.used_memory as i64,
    );
    out.gauge(
        "holdfast_redis_maxmemory_bytes",
        "Redis' maxmemory (0: no limit)",
        s.maxmemory as i64,
    );
    out.fraction(
        "holdfast_redis_memory_fragmentation_ratio",
        "Resident over allocated memory (above 1.5: fragmented)",
        s.fragmentation_ratio,
    );
    out.gauge(
        "holdfast_redis_connected_clients",
        "Clients connected to Redis",
        s.connected_clients as i64,
    );
    out.gauge(
        "holdfast_redis_maxclients",
        "Most clients Redis accepts",
        s.maxclients as i64,
    );
    out.counter(
        "holdfast_redis_evicted_keys",
        "Keys Redis evicted since it started (anything above 0 loses counters or holds)",
        s.evicted_keys,
    );
    out.counter(
        "holdfast_redis_keyspace_misses",
        "Key lookups that found nothing, since Redis started",
        s.keyspace_misses,
    );
    out.gauge(
        "holdfast_redis_master",
        "Whether the Redis behind REDIS_URL is a master (0: a replica)",
        i64::from(u8::from(s.master)),
    );
    out.gauge(
        "holdfast_redis_replicas",
        "Replicas connected to the Redis master",
        s.replicas as i64,
    );
    out.gauge(
        "holdfast_redis_replica_lag_bytes",
        "Bytes the slowest replica is behind its master (writes a fail-over would lose)",
        s.replica_lag_bytes as i64,
    );
    out.gauge(
        "holdfast_redis_aof_enabled",
        "Whether Redis writes its append-only file",
        i64::from(u8::from(s.aof_enabled)),
    );
}

/// The background workers' counters.
fn worker_metrics(out: &mut Scrape, w: &WorkerStats) {
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    out.counter(
        "holdfast_reaper_released",
        "Holds this process's reaper expired",
        load(&w.reaper.released),
    );
    out.counter(
        "holdfast_reaper_failures",
        "Reaper passes that failed",
        load(&w.reaper.failures),
    );
    out.counter(
        "holdfast_failover_shards_moved",
        "Shards whose Redis Cluster master changed (each stops selling until checked against PostgreSQL)",
        load(&w.failover.shards_moved),
    );
    out.counter(
        "holdfast_failover_resumed",
        "Checks after a failover that let the moved shards sell again",
        load(&w.failover.resumed),
    );
    out.fraction(
        "holdfast_failover_last_fenced_seconds",
        "How long the last failed-over shards stayed out of sale",
        load(&w.failover.last_fenced_ms) as f64 / 1_000.0,
    );
    let wb = &w.write_behind;
    out.counter(
        "holdfast_write_behind_events",
        "Stream entries committed to PostgreSQL",
        load(&wb.events),
    );
    out.counter(
        "holdfast_write_behind_batches",
        "Write-behind transactions committed",
        load(&wb.batches),
    );
    out.counter(
        "holdfast_write_behind_sales",
        "Sales recorded in the ledger",
        load(&wb.sales),
    );
    out.counter(
        "holdfast_write_behind_failures",
        "Write-behind batches that failed and were retried",
        load(&wb.failures),
    );
    out.counter(
        "holdfast_write_behind_lost_entries",
        "Events that came back empty before PostgreSQL had them (each asks for a reconciliation)",
        load(&wb.lost_entries),
    );
    out.counter(
        "holdfast_write_behind_parked",
        "Events PostgreSQL refused as data, set aside so recording goes on (each asks for a reconciliation)",
        load(&wb.parked),
    );
    out.counter(
        "holdfast_event_stream_trimmed",
        "Stream entries trimmed after every consumer group acknowledged them",
        load(&wb.trimmed),
    );
    out.counter(
        "holdfast_worker_restarts",
        "Times a background worker panicked or stopped and was started again",
        load(&w.restarts),
    );
    if let Some(report) = w.verify.get() {
        out.gauge(
            "holdfast_verify_passed",
            "Whether the last verification found every check holding (1) or not (0)",
            i64::from(u8::from(report.passed())),
        );
        out.gauge(
            "holdfast_verify_violations",
            "Checks the last verification found failing",
            report.violations() as i64,
        );
        out.fraction(
            "holdfast_verify_last_run_timestamp_seconds",
            "When the last verification finished (Unix seconds)",
            report.at_ms as f64 / 1000.0,
        );
    }
    out.lane_counter("holdfast_ingest_applied", "Feed events applied", w, |s| {
        s.applied.load(Ordering::Relaxed)
    });
    out.lane_counter(
        "holdfast_ingest_duplicates",
        "Feed events skipped as already applied",
        w,
        |s| s.duplicates.load(Ordering::Relaxed),
    );
    out.lane_counter(
        "holdfast_ingest_stale",
        "Snapshots refused as stale",
        w,
        |s| s.stale.load(Ordering::Relaxed),
    );
    out.lane_counter(
        "holdfast_ingest_dead_letters",
        "Payloads or events dead-lettered",
        w,
        |s| s.dead.load(Ordering::Relaxed),
    );
    out.lane_counter(
        "holdfast_ingest_shortfalls",
        "Feed events that lowered stock under open holds, leaving units owed",
        w,
        |s| s.shortfalls.load(Ordering::Relaxed),
    );
}
