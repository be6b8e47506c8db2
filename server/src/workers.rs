//! Background workers that run beside the HTTP server: the reaper, the
//! write-behind to PostgreSQL, scheduled reconciliation and verification, the
//! counters' keeper (warming again after Redis lost its data, applying waiting
//! stock changes) and the ingestion lanes' consumers. Each is the engine's; this module starts,
//! supervises (a worker that panics or stops is started again, with backoff),
//! counts and stops them.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::background::Background;
use holdfast_domain::Lane;
use holdfast_engine::failover::{FailoverStats, run_failover_watch};
use holdfast_engine::ingest::{LaneConfig, LaneConsumer, LaneStats, run_consumer};
use holdfast_engine::reaper::{ReaperConfig, ReaperStats, run_reaper};
use holdfast_engine::reconcile::{self, ReconcileOptions};
use holdfast_engine::record::{WriteBehind, WriteBehindConfig, WriteBehindStats, run_write_behind};
use holdfast_engine::verify::{self, LastVerify, VerifyOptions};
use holdfast_engine::{Backends, EngineError, redis_conn};
use tokio::runtime::Handle;
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
    /// Times a worker panicked or stopped and was started again.
    pub restarts: Arc<AtomicU64>,
    /// The cluster failover watch's.
    pub failover: Arc<FailoverStats>,
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
    /// The threads they run on, when they have their own; ended after them.
    background: Option<Background>,
}

impl Workers {
    /// Starts every worker: on `background`'s threads when given (a server's,
    /// see [`crate::background`]), on the caller's runtime otherwise. The
    /// write-behind gets a Redis connection of its own (its reads block),
    /// opened to `redis_url`.
    pub async fn start(
        backends: &Backends,
        redis_url: &str,
        config: WorkerConfig,
        stats: &WorkerStats,
        background: Option<Background>,
    ) -> Result<Self, EngineError> {
        let on = background
            .as_ref()
            .map_or_else(Handle::current, Background::handle);
        // Fail at start-up, in one readable line, if Redis cannot be reached;
        // the supervised workers connect (and reconnect) on their own. On
        // threads of their own, this connection (opened there) becomes the
        // one the workers share: one the request threads share would be
        // reopened by whichever worker first saw it fail, and a connection's
        // I/O runs on the runtime that opened it, so checkout would then wait
        // on the background threads (of lower priority when so set).
        let url = redis_url.to_owned();
        let probe = on
            .spawn(async move { redis_conn::connect(&url).await })
            .await
            .expect("a connect task neither panics nor is cancelled")?;
        let request_side = backends;
        let backends = &if background.is_some() {
            backends.over(probe)
        } else {
            backends.clone()
        };
        let (stop, rx) = watch::channel(false);
        let restarts = stats.restarts.clone();
        let mut tasks = Vec::new();
        {
            let (engine, reaper, reaper_stats) =
                (backends.engine.clone(), config.reaper, stats.reaper.clone());
            tasks.push(supervise(
                &on,
                "reaper",
                rx.clone(),
                restarts.clone(),
                move |rx| {
                    let (engine, stats) = (engine.clone(), reaper_stats.clone());
                    async move {
                        run_reaper(engine, reaper, stats, stopped(rx)).await;
                        Ok(())
                    }
                },
            ));
        }
        {
            let (backends, url, wb, wb_stats) = (
                backends.clone(),
                redis_url.to_owned(),
                config.write_behind.clone(),
                stats.write_behind.clone(),
            );
            tasks.push(supervise(
                &on,
                "write-behind",
                rx.clone(),
                restarts.clone(),
                move |rx| {
                    let (backends, url, wb, stats) =
                        (backends.clone(), url.clone(), wb.clone(), wb_stats.clone());
                    async move {
                        // Parts side by side, each over its own shards; their
                        // reads block: a Redis connection each.
                        let parts = wb.workers.max(1);
                        // Aborted with this task too: a restart never leaves a part behind.
                        let mut writers = tokio::task::JoinSet::new();
                        for part in 0..parts {
                            let conn = redis_conn::connect(&url).await?;
                            let writer = WriteBehind::new(
                                backends.engine.clone(),
                                backends.pg.clone(),
                                conn,
                                wb.clone(),
                                stats.clone(),
                            );
                            writers.spawn(run_write_behind(
                                writer.part(part, parts),
                                stopped(rx.clone()),
                            ));
                        }
                        // The first part to end (a panic; or shutdown, when
                        // all end) ends them all: the others are stopped and
                        // awaited, and the supervisor starts every part again
                        // under the same names, each re-reading its pending
                        // entries. A part left dead would strand its shards.
                        let first = writers.join_next().await;
                        writers.shutdown().await;
                        if let Some(Err(e)) = first
                            && e.is_panic()
                        {
                            std::panic::resume_unwind(e.into_panic());
                        }
                        Ok(())
                    }
                },
            ));
        }
        for lane in &config.lanes {
            let lane_stats = stats.lanes.get(&lane.name).cloned().unwrap_or_default();
            for n in 0..lane.concurrency.max(1) {
                let (backends, url, lane, lane_stats) = (
                    backends.clone(),
                    redis_url.to_owned(),
                    lane.clone(),
                    lane_stats.clone(),
                );
                let name = redis_conn::consumer_name(&format!("{}-{n}", lane.name));
                tasks.push(supervise(
                    &on,
                    "lane consumer",
                    rx.clone(),
                    restarts.clone(),
                    move |rx| {
                        let (backends, url, lane, stats, name) = (
                            backends.clone(),
                            url.clone(),
                            lane.clone(),
                            lane_stats.clone(),
                            name.clone(),
                        );
                        async move {
                            let consumer = LaneConsumer::new(
                                backends.engine.clone(),
                                redis_conn::connect(&url).await?,
                                lane,
                                name,
                                stats,
                            )
                            .with_ledger(backends.pg.clone());
                            run_consumer(consumer, stopped(rx)).await;
                            Ok(())
                        }
                    },
                ));
            }
        }
        if let Some(every) = config.verify_every {
            let (backends, last) = (backends.clone(), stats.verify.clone());
            tasks.push(supervise(
                &on,
                "verify",
                rx.clone(),
                restarts.clone(),
                move |rx| {
                    let fut = verify_loop(backends.clone(), every, last.clone(), stopped(rx));
                    async move {
                        fut.await;
                        Ok(())
                    }
                },
            ));
        }
        {
            let (backends, every, up, wb) = (
                backends.clone(),
                config.reconcile_every,
                config.reconcile_correct_up,
                stats.write_behind.clone(),
            );
            tasks.push(supervise(
                &on,
                "reconcile",
                rx.clone(),
                restarts.clone(),
                move |rx| {
                    let fut = reconcile_loop(backends.clone(), every, up, wb.clone(), stopped(rx));
                    async move {
                        fut.await;
                        Ok(())
                    }
                },
            ));
        }
        {
            let (backends, failover) = (request_side.clone(), stats.failover.clone());
            let url = redis_url.to_owned();
            // Not on the background threads: it fences a shard whose master
            // changed, and a fence that waits behind checkout on busy CPUs
            // is time in which units lost with the old master could sell.
            tasks.push(supervise(
                &Handle::current(),
                "failover watch",
                rx.clone(),
                restarts.clone(),
                move |rx| {
                    let fut = run_failover_watch(
                        backends.engine.clone(),
                        backends.pg.clone(),
                        url.clone(),
                        failover.clone(),
                        stopped(rx),
                    );
                    async move {
                        fut.await;
                        Ok(())
                    }
                },
            ));
        }
        {
            let backends = backends.clone();
            tasks.push(supervise(
                &on,
                "counters",
                rx.clone(),
                restarts.clone(),
                move |rx| {
                    let fut = counters_loop(backends.clone(), stopped(rx));
                    async move {
                        fut.await;
                        Ok(())
                    }
                },
            ));
        }
        {
            let backends = backends.clone();
            tasks.push(supervise(
                &on,
                "attempts",
                rx.clone(),
                restarts.clone(),
                move |rx| {
                    let fut = attempts_loop(backends.clone(), stopped(rx));
                    async move {
                        fut.await;
                        Ok(())
                    }
                },
            ));
        }
        {
            let backends = backends.clone();
            tasks.push(supervise(
                &on,
                "housekeeping",
                rx.clone(),
                restarts.clone(),
                move |rx| {
                    let fut = housekeeping_loop(backends.clone(), stopped(rx));
                    async move {
                        fut.await;
                        Ok(())
                    }
                },
            ));
        }
        {
            let backends = backends.clone();
            tasks.push(supervise(&on, "rebalance", rx, restarts, move |rx| {
                let fut = rebalance_loop(backends.clone(), stopped(rx));
                async move {
                    fut.await;
                    Ok(())
                }
            }));
        }
        Ok(Self {
            stop,
            tasks,
            background,
        })
    }

    /// Signals every worker to stop and waits for them to finish their current
    /// step, then ends their threads.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
        drop(self.background);
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
            .swap(false, Ordering::Relaxed);
        let due = every.is_some_and(|e| last.elapsed() >= e);
        if !requested && !due {
            continue;
        }
        last = tokio::time::Instant::now();
        let options = ReconcileOptions {
            correct_up,
            trigger: if requested { "requested" } else { "schedule" }.into(),
            // A scheduled run is skipped when any server ran one this
            // interval; a requested one (an event came back empty) is not.
            // 90%: this server's own last run started a little after its
            // timer fired, and must not make it skip its next turn.
            unless_run_within: every.filter(|_| !requested).map(|e| e.mul_f64(0.9)),
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
            // Another process is running one, or ran one this interval:
            // nothing to do this time.
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

/// Longest pause before a failed worker is started again.
const MAX_RESTART_BACKOFF: Duration = Duration::from_secs(30);

/// Runs the worker `make` builds until `stop` turns `true`; if it panics,
/// fails or returns earlier, it is logged, counted in `restarts` and started
/// again after a pause that doubles from one second up to
/// [`MAX_RESTART_BACKOFF`] (back to one second after a minute of good running).
/// It runs on `on`, and so does every task it spawns.
pub fn supervise<F, Fut>(
    on: &Handle,
    name: &'static str,
    stop: watch::Receiver<bool>,
    restarts: Arc<AtomicU64>,
    make: F,
) -> JoinHandle<()>
where
    F: Fn(watch::Receiver<bool>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), EngineError>> + Send + 'static,
{
    on.spawn(async move {
        let mut backoff = Duration::from_secs(1);
        loop {
            let started = tokio::time::Instant::now();
            let outcome = tokio::spawn(make(stop.clone())).await;
            if *stop.borrow() {
                return;
            }
            match outcome {
                Ok(Ok(())) => tracing::error!(
                    worker = name,
                    "a worker stopped on its own; starting it again"
                ),
                Ok(Err(e)) => {
                    tracing::error!(worker = name, error = %e, "a worker failed; starting it again")
                }
                Err(e) => {
                    tracing::error!(worker = name, error = %e, "a worker panicked; starting it again")
                }
            }
            restarts.fetch_add(1, Ordering::Relaxed);
            if started.elapsed() > Duration::from_secs(60) {
                backoff = Duration::from_secs(1);
            }
            let mut stop_rx = stop.clone();
            tokio::select! {
                _ = stop_rx.wait_for(|s| *s) => return,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(MAX_RESTART_BACKOFF);
        }
    })
}

/// How often the counters are looked after: Redis' data checked for a loss,
/// and stock changes from drop imports that wait applied again.
const COUNTERS_EVERY: Duration = Duration::from_secs(5);

/// Every how many of those ticks the counters' schedules and limits are
/// compared with PostgreSQL's (a minute: it reads every SKU).
const FOLLOW_EVERY_TICKS: u64 = 12;

/// Every [`COUNTERS_EVERY`]: warms every counter again when Redis lost its data
/// (see `warmup::rewarm_after_loss`), then applies the stock changes drop
/// imports left waiting (Redis down or refusing writes, a process killed,
/// Redis' data lost before the write-behind recorded them) and marks those the
/// ledger has. Every server runs it; doing either twice is harmless (warming
/// writes only missing counters, each change has its event guard).
async fn counters_loop(backends: Backends, shutdown: impl Future<Output = ()>) {
    let seen = Arc::new(tokio::sync::Mutex::new(None));
    let ticks = Arc::new(AtomicU64::new(0));
    periodically(COUNTERS_EVERY, shutdown, || {
        let (b, seen, ticks) = (backends.clone(), seen.clone(), ticks.clone());
        async move {
            // At start and then every [`FOLLOW_EVERY_TICKS`] ticks: counters
            // a dead process left with an old schedule or limit follow
            // PostgreSQL again.
            if ticks.fetch_add(1, Ordering::Relaxed) % FOLLOW_EVERY_TICKS == 0 {
                match holdfast_engine::schedule::follow_catalogue(&b.engine, &b.pg).await {
                    Ok(0) => {}
                    Ok(n) => tracing::warn!(
                        counters = n,
                        "counters given the schedule and per-buyer limit PostgreSQL has"
                    ),
                    Err(e) => tracing::warn!(error = %e, "checking counters' schedules failed"),
                }
            }
            let mut seen = seen.lock().await;
            // The layout record is written again when its master lost it,
            // so a process set to another shard count stays refused.
            if let Err(e) = b.engine.check_layout().await {
                tracing::error!(error = %e, "Redis' layout record disagrees with this server");
            }
            match holdfast_engine::warmup::rewarm_after_loss(&b.engine, &b.pg, &mut seen).await {
                Ok(None) => {}
                Ok(Some(report)) => tracing::warn!(
                    warmed = report.warmed,
                    guards = report.guards,
                    "counters warmed again after Redis lost its data"
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "checking Redis for a data loss failed; retrying")
                }
            }
            match holdfast_engine::drop_file::apply_pending_stock(&b.engine, &b.pg).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(applied = n, "waiting stock changes applied"),
                Err(e) => {
                    tracing::warn!(error = %e, "applying waiting stock changes failed; retrying")
                }
            }
        }
    })
    .await;
}

/// How often split SKUs' parts are evened out.
const REBALANCE_EVERY: Duration = Duration::from_secs(1);

/// Every [`REBALANCE_EVERY`]: evens out the parts of every split SKU (one
/// server at a time, under a short lease; each move is safe anyway), so a
/// part runs short only near the end of its stock.
async fn rebalance_loop(backends: Backends, shutdown: impl Future<Output = ()>) {
    periodically(REBALANCE_EVERY, shutdown, || {
        let b = backends.clone();
        async move {
            // Nothing split (the usual case): no Redis call at all.
            let skus = match holdfast_engine::Engine::split_skus(&b.pg).await {
                Ok(skus) if !skus.is_empty() => skus,
                Ok(_) => return,
                Err(e) => {
                    tracing::debug!(error = %e, "listing split SKUs failed");
                    return;
                }
            };
            let lease = match b.engine.acquire_lock("rebalance", REBALANCE_EVERY).await {
                Ok(Some(lease)) => lease,
                Ok(None) => return,
                Err(e) => {
                    tracing::debug!(error = %e, "taking the rebalance lease failed");
                    return;
                }
            };
            for sku in skus {
                // A change of its parts cut short (a Redis error) is finished.
                if let Err(e) = b.engine.finish_change(&b.pg, &sku).await {
                    tracing::warn!(%sku, error = %e, "finishing a change of a SKU's parts failed");
                }
                match b.engine.rebalance(&sku).await {
                    Ok(0) => {}
                    Ok(units) => tracing::debug!(%sku, units, "evened out a split SKU's parts"),
                    Err(e) => tracing::warn!(%sku, error = %e, "evening out a split SKU failed"),
                }
            }
            let _ = b.engine.release_lock(&lease).await;
        }
    })
    .await;
}

/// How often this process's reservation attempts are added to PostgreSQL.
const ATTEMPTS_EVERY: Duration = Duration::from_secs(1);

/// Every [`ATTEMPTS_EVERY`], and once more at shutdown: adds the reservation
/// attempts counted since to PostgreSQL (a drop report's peak per second).
async fn attempts_loop(backends: Backends, shutdown: impl Future<Output = ()>) {
    let flush = || async {
        if let Err(e) = backends.engine.attempts().flush(&backends.pg).await {
            tracing::debug!(error = %e, "recording reservation attempts failed; they wait");
        }
    };
    periodically(ATTEMPTS_EVERY, shutdown, &flush).await;
    flush().await;
}

/// How long reservation attempts per second are kept for reports.
const ATTEMPTS_KEPT_DAYS: i32 = 90;

/// How often expired sessions are deleted.
const HOUSEKEEPING_EVERY: Duration = Duration::from_secs(600);

/// Deletes expired sessions every [`HOUSEKEEPING_EVERY`], so the table holds
/// only live ones even when nobody signs in or out.
async fn housekeeping_loop(backends: Backends, shutdown: impl Future<Output = ()>) {
    periodically(HOUSEKEEPING_EVERY, shutdown, || {
        let pg = backends.pg.clone();
        async move {
            match holdfast_engine::users::purge_expired_sessions(&pg).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(sessions = n, "expired sessions deleted"),
                Err(e) => tracing::warn!(error = %e, "deleting expired sessions failed"),
            }
            if let Err(e) =
                holdfast_engine::attempts::Attempts::forget_older_than(&pg, ATTEMPTS_KEPT_DAYS)
                    .await
            {
                tracing::warn!(error = %e, "deleting old reservation attempts failed");
            }
        }
    })
    .await;
}

/// Runs `step` now and then every `every`, until `shutdown`.
async fn periodically<F, Fut>(every: Duration, shutdown: impl Future<Output = ()>, mut step: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    tokio::pin!(shutdown);
    loop {
        step().await;
        tokio::select! {
            () = &mut shutdown => break,
            () = tokio::time::sleep(every) => {}
        }
    }
}

/// Completes once `true` is sent (or the sender is dropped).
async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_worker_that_panics_is_started_again_until_stopped() {
        let (stop, rx) = watch::channel(false);
        let restarts = Arc::new(AtomicU64::new(0));
        let runs = Arc::new(AtomicU64::new(0));
        let counted = runs.clone();
        let task = supervise(
            &Handle::current(),
            "test",
            rx,
            restarts.clone(),
            move |rx| {
                let run = counted.fetch_add(1, Ordering::Relaxed);
                async move {
                    match run {
                        0 => panic!("first run panics"),
                        1 => Err(EngineError::Busy("second run fails".into())),
                        _ => {
                            stopped(rx).await;
                            Ok(())
                        }
                    }
                }
            },
        );
        // Backoff 1 s, then 2 s: the third run is up after about 3 s (allow
        // a slow machine ten).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while runs.load(Ordering::Relaxed) < 3 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(runs.load(Ordering::Relaxed), 3);
        assert_eq!(restarts.load(Ordering::Relaxed), 2);
        stop.send(true).unwrap();
        task.await.unwrap();
        assert_eq!(
            restarts.load(Ordering::Relaxed),
            2,
            "a requested stop is not a failure"
        );
    }
}
