//! `GET /metrics`: Prometheus text exposition of the workers' counters, the
//! write-behind's lag, the ingestion lanes and the backends' health. It holds no
//! secrets but does show business figures: expose it to the monitoring network
//! only, and set a scrape token ([`MetricsAccess`]) so nobody else can read it.

use std::fmt::Write;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use holdfast_engine::{ingest, postgres, redis_conn};

use std::sync::Arc;

use axum::extract::FromRef;
use holdfast_engine::Backends;

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

/// The metrics route.
pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Backends: FromRef<S>,
    Arc<WorkerStats>: FromRef<S>,
    MetricsAccess: FromRef<S>,
{
    Router::new().route("/metrics", get(metrics))
}

struct Out(String);

impl Out {
    fn metric(&mut self, name: &str, kind: &str, help: &str, samples: &[(String, f64)]) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(self.0, "{name}{labels} {value}");
        }
    }

    fn one(&mut self, name: &str, kind: &str, help: &str, value: f64) {
        self.metric(name, kind, help, &[(String::new(), value)]);
    }
}

async fn metrics(
    State(backends): State<Backends>,
    State(workers): State<Arc<WorkerStats>>,
    State(access): State<MetricsAccess>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    if !access.allows(&headers) {
        return (
            axum::http::StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "send the scrape token: Authorization: Bearer <HOLDFAST_METRICS_TOKEN>",
        )
            .into_response();
    }
    let mut out = Out(String::new());
    let timeout = Duration::from_millis(1_000);
    let redis_up = redis_conn::ping(&backends.redis, timeout).await.is_ok();
    let pg_up = postgres::ping(&backends.pg, timeout).await.is_ok();
    out.one(
        "holdfast_redis_up",
        "gauge",
        "Whether Redis answers PING.",
        f64::from(u8::from(redis_up)),
    );
    out.one(
        "holdfast_postgres_up",
        "gauge",
        "Whether PostgreSQL answers.",
        f64::from(u8::from(pg_up)),
    );

    let w = &workers;
    out.one(
        "holdfast_reaper_released_total",
        "counter",
        "Holds this process's reaper expired.",
        w.reaper.released.load(Ordering::Relaxed) as f64,
    );
    out.one(
        "holdfast_reaper_failures_total",
        "counter",
        "Reaper passes that failed.",
        w.reaper.failures.load(Ordering::Relaxed) as f64,
    );
    let wb = &w.write_behind;
    out.one(
        "holdfast_write_behind_events_total",
        "counter",
        "Stream entries committed to PostgreSQL.",
        wb.events.load(Ordering::Relaxed) as f64,
    );
    out.one(
        "holdfast_write_behind_batches_total",
        "counter",
        "Write-behind transactions committed.",
        wb.batches.load(Ordering::Relaxed) as f64,
    );
    out.one(
        "holdfast_write_behind_sales_total",
        "counter",
        "Sales recorded in the ledger.",
        wb.sales.load(Ordering::Relaxed) as f64,
    );
    out.one(
        "holdfast_write_behind_failures_total",
        "counter",
        "Write-behind batches that failed and were retried.",
        wb.failures.load(Ordering::Relaxed) as f64,
    );
    if let Some(report) = w.verify.get() {
        out.one(
            "holdfast_verify_passed",
            "gauge",
            "Whether the last verification found every check holding (1) or not (0).",
            f64::from(u8::from(report.passed())),
        );
        out.one(
            "holdfast_verify_violations",
            "gauge",
            "Checks the last verification found failing.",
            report.violations() as f64,
        );
        out.one(
            "holdfast_verify_last_run_timestamp_seconds",
            "gauge",
            "When the last verification finished (Unix seconds).",
            report.at_ms as f64 / 1000.0,
        );
    }
    out.one(
        "holdfast_write_behind_lost_entries_total",
        "counter",
        "Events that came back empty before PostgreSQL had them (each asks for a reconciliation).",
        wb.lost_entries.load(Ordering::Relaxed) as f64,
    );
    out.one(
        "holdfast_worker_restarts_total",
        "counter",
        "Times a background worker panicked or stopped and was started again.",
        workers.restarts.load(Ordering::Relaxed) as f64,
    );
    out.one(
        "holdfast_write_behind_parked_total",
        "counter",
        "Events PostgreSQL refused as data, set aside so recording goes on (each asks for a reconciliation).",
        wb.parked.load(Ordering::Relaxed) as f64,
    );
    out.one(
        "holdfast_event_stream_trimmed_total",
        "counter",
        "Stream entries trimmed after every consumer group acknowledged them.",
        wb.trimmed.load(Ordering::Relaxed) as f64,
    );
    if redis_up
        && let Ok(Ok(entries)) =
            tokio::time::timeout(timeout, backends.engine.stream_entries()).await
    {
        out.one(
            "holdfast_event_stream_entries",
            "gauge",
            "Entries held in the event streams (about 150 bytes each; see docs/stock-rules.md).",
            entries as f64,
        );
    }
    if redis_up
        && let Ok(Ok(lag)) = tokio::time::timeout(timeout, backends.engine.write_behind_lag()).await
    {
        out.one(
            "holdfast_write_behind_lag_entries",
            "gauge",
            "Events not yet in PostgreSQL.",
            lag.entries as f64,
        );
        out.one(
            "holdfast_write_behind_lag_seconds",
            "gauge",
            "Age of the oldest event not yet in PostgreSQL.",
            lag.oldest_ms as f64 / 1000.0,
        );
    }

    let lane_metric = |pick: fn(&ingest::LaneStats) -> u64| -> Vec<(String, f64)> {
        w.lanes
            .iter()
            .map(|(lane, s)| (format!("{{lane=\"{lane}\"}}"), pick(s) as f64))
            .collect()
    };
    out.metric(
        "holdfast_ingest_applied_total",
        "counter",
        "Feed events applied.",
        &lane_metric(|s| s.applied.load(Ordering::Relaxed)),
    );
    out.metric(
        "holdfast_ingest_duplicates_total",
        "counter",
        "Feed events skipped as already applied.",
        &lane_metric(|s| s.duplicates.load(Ordering::Relaxed)),
    );
    out.metric(
        "holdfast_ingest_stale_total",
        "counter",
        "Snapshots refused as stale.",
        &lane_metric(|s| s.stale.load(Ordering::Relaxed)),
    );
    out.metric(
        "holdfast_ingest_dead_letters_total",
        "counter",
        "Payloads or events dead-lettered.",
        &lane_metric(|s| s.dead.load(Ordering::Relaxed)),
    );
    out.metric(
        "holdfast_ingest_shortfalls_total",
        "counter",
        "Feed events that lowered stock under open holds, leaving units owed.",
        &lane_metric(|s| s.shortfalls.load(Ordering::Relaxed)),
    );
    if redis_up && pg_up {
        let owed = tokio::time::timeout(timeout, backends.owed_units()).await;
        let samples: Vec<(String, f64)> = match owed {
            Ok(Ok(owed)) => owed
                .into_iter()
                .map(|(sku, n)| (format!("{{sku=\"{sku}\"}}"), n as f64))
                .collect(),
            _ => Vec::new(),
        };
        out.metric(
            "holdfast_stock_owed_units",
            "gauge",
            "Held units a feed removed (per SKU of the drops, only where any are owed).",
            &samples,
        );
    }
    if redis_up {
        let mut conn = backends.redis.clone();
        let (mut backlog, mut paused) = (Vec::new(), Vec::new());
        for s in ingest::statuses(&mut conn).await.unwrap_or_default() {
            let label = format!("{{lane=\"{}\"}}", s.lane);
            backlog.push((label.clone(), s.backlog as f64));
            paused.push((label, f64::from(u8::from(s.paused()))));
        }
        out.metric(
            "holdfast_ingest_backlog",
            "gauge",
            "Payloads waiting in the lane.",
            &backlog,
        );
        out.metric(
            "holdfast_ingest_paused",
            "gauge",
            "Whether the lane's consumers are paused.",
            &paused,
        );
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out.0).into_response()
}
