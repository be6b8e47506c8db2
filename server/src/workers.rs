//! Background workers that run beside the HTTP server: the reaper, the
//! write-behind to PostgreSQL, scheduled reconciliation and the ingestion lanes'
//! consumers. Each is the engine's; this module starts, counts and stops them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use holdfast_domain::Lane;
use holdfast_engine::ingest::{LaneConfig, LaneConsumer, LaneStats, run_consumer};
use holdfast_engine::reaper::{ReaperConfig, ReaperStats, run_reaper};
use holdfast_engine::reconcile::{self, ReconcileOptions};
use holdfast_engine::record::{WriteBehind, WriteBehindConfig, WriteBehindStats, run_write_behind};
use holdfast_engine::verify::{self, LastVerify, VerifyOptions};
use holdfast_engine::{Backends, EngineError, redis_conn};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the workers do and how often.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The reaper's pace.
    pub reaper: ReaperConfig,
    /// The write-behind's batching.
    pub write_behind: WriteBehindConfig,
    /// Pause between reconciliation runs; `None` disables them.
    pub reconcile_every: Option<Duration>,
    /// Whether scheduled runs correct stranded units up.
    pub reconcile_correct_up: bool,
    /// Pause between verification runs; `None` disables them.
    pub verify_every: Option<Duration>,
    /// The ingestion lanes to consume.
    pub lanes: Vec<LaneConfig>,
}

/// Counters every worker keeps, shared with `/readyz` and the dashboard.
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// The reaper's.
    pub reaper: Arc<ReaperStats>,
    /// The write-behind's.
    pub write_behind: Arc<WriteBehindStats>,
    /// Each ingestion lane's.
    pub lanes: HashMap<Lane, Arc<LaneStats>>,
    /// The last verification's report.
    pub verify: Arc<LastVerify>,
}

impl WorkerStats {
    /// Counters with an entry for every lane.
    pub fn new() -> Self {
        Self {
            lanes: Lane::ALL.iter().map(|l| (*l, Arc::default())).collect(),
            ..Self::default()
        }
    }
}

/// The running workers and the means to stop them.
pub struct Workers {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Workers {
    /// Starts every worker. The write-behind gets a Redis connection of its own
    /// (its reads block), opened to `redis_url`.
    pub async fn start(
        backends: &Backends,
        redis_url: &str,
        config: WorkerConfig,
        stats: &WorkerStats,
    ) -> Result<Self, EngineError> {
        let (stop, rx) = watch::channel(false);
        let mut tasks = vec![tokio::spawn(run_reaper(
            backends.engine.clone(),
            config.reaper,
            stats.reaper.clone(),
            stopped(rx.clone()),
        ))];
        let writer = WriteBehind::new(
            backends.engine.clone(),
            backends.pg.clone(),
            redis_conn::connect(redis_url).await?,
            config.write_behind,
            stats.write_behind.clone(),
        );
        tasks.push(tokio::spawn(run_write_behind(writer, stopped(rx.clone()))));
        for lane in &config.lanes {
            let stats = stats.lanes.get(&lane.name).cloned().unwrap_or_default();
            for n in 0..lane.concurrency.max(1) {
                let consumer = LaneConsumer::new(
                    backends.engine.clone(),
                    redis_conn::connect(redis_url).await?,
                    lane.clone(),
                    format!("{}-{}-{n}", lane.name, std::process::id()),
                    stats.clone(),
                )
                .with_ledger(backends.pg.clone());
                tasks.push(tokio::spawn(run_consumer(consumer, stopped(rx.clone()))));
            }
        }
        if let Some(every) = config.verify_every {
            tasks.push(tokio::spawn(verify_loop(
                backends.clone(),
                every,
                stats.verify.clone(),
                stopped(rx.clone()),
            )));
        }
        tasks.push(tokio::spawn(reconcile_loop(
            backends.clone(),
            config.reconcile_every,
            config.reconcile_correct_up,
            stats.write_behind.clone(),
            stopped(rx),
        )));
        Ok(Self { stop, tasks })
    }

    /// Signals every worker to stop and waits for them to finish their current step.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// Runs reconciliation every `every` (when set), and at once whenever the
/// write-behind asks for one (an event came back empty).
async fn reconcile_loop(
    backends: Backends,
    every: Option<Duration>,
    correct_up: bool,
    write_behind: Arc<WriteBehindStats>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut last = tokio::time::Instant::now();
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        let requested = write_behind
            .reconcile_requested
            .swap(false, std::sync::atomic::Ordering::Relaxed);
        let due = every.is_some_and(|e| last.elapsed() >= e);
        if !requested && !due {
            continue;
        }
        last = tokio::time::Instant::now();
        let options = ReconcileOptions {
            correct_up,
            trigger: if requested { "requested" } else { "schedule" }.into(),
            ..ReconcileOptions::default()
        };
        match reconcile::reconcile_all(&backends.engine, &backends.pg, &options, |_| {}).await {
            Ok(r) if r.drifted > 0 => tracing::warn!(
                run = r.run_id,
                drifted = r.drifted,
                corrected_down = r.corrected_down,
                corrected_up = r.corrected_up,
                reported = r.reported,
                "reconciliation found drift"
            ),
            Ok(r) => tracing::debug!(
                run = r.run_id,
                checked = r.checked,
                "reconciliation found no drift"
            ),
            // Another process is running one: nothing to do this time.
            Err(EngineError::Busy(_)) => {}
            Err(e) => tracing::warn!(error = %e, "scheduled reconciliation failed"),
        }
    }
}

/// Runs the truth check every `every`, keeping the last report for `/metrics`
/// and the dashboard; a violation is logged as an error.
async fn verify_loop(
    backends: Backends,
    every: Duration,
    last: Arc<LastVerify>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            () = tokio::time::sleep(every) => {}
        }
        match verify::verify(&backends.engine, &backends.pg, &VerifyOptions::default()).await {
            Ok(report) => {
                if !report.passed() {
                    tracing::error!(
                        violations = report.violations(),
                        skus = report.skus.len(),
                        "verification found violations; run `holdfast verify` for the details"
                    );
                }
                last.set(report);
            }
            Err(e) => tracing::warn!(error = %e, "scheduled verification failed"),
        }
    }
}

/// Completes once `true` is sent (or the sender is dropped).
async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}
