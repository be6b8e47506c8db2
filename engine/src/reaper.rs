//! The reaper: Redis runs no code when a key expires, so a worker ends holds whose
//! deadline has passed and returns their units.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tracing::Instrument;

use crate::engine::Engine;

/// How often and how much the reaper works.
#[derive(Debug, Clone, Copy)]
pub struct ReaperConfig {
    /// Pause between passes.
    pub interval: Duration,
    /// Most due holds taken per shard per pass (scripts stay short).
    pub batch: usize,
}

impl Default for ReaperConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(500),
            batch: 200,
        }
    }
}

/// Counters the reaper keeps for metrics and the dashboard.
#[derive(Debug, Default)]
pub struct ReaperStats {
    /// Holds this process's reaper expired.
    pub released: AtomicU64,
    /// Passes that failed (Redis unavailable); the reaper keeps going.
    pub failures: AtomicU64,
    /// Holds set aside because they could not be read or ended.
    pub skipped: AtomicU64,
}

/// Runs reaper passes every `config.interval` until `shutdown` completes. A pass
/// that finds a full batch runs again at once, so a backlog drains quickly.
pub async fn run_reaper(
    engine: Engine,
    config: ReaperConfig,
    stats: Arc<ReaperStats>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut pause = Duration::ZERO;
    let mut passes: u64 = 0;
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            () = tokio::time::sleep(pause) => {}
        }
        pause = config.interval;
        passes += 1;
        // Each pass in its own span, so its log lines (and traces) group.
        let span = tracing::info_span!("reaper_pass", pass = passes);
        let result = engine
            .reap_once(config.batch)
            .instrument(span.clone())
            .await;
        let _in = span.enter();
        match result {
            Ok(report) => {
                stats.skipped.fetch_add(report.skipped, Ordering::Relaxed);
                if report.released > 0 {
                    stats.released.fetch_add(report.released, Ordering::Relaxed);
                    tracing::info!(
                        released = report.released,
                        due = report.due,
                        "reaper expired holds"
                    );
                }
                if report.due >= config.batch as u64 {
                    pause = Duration::ZERO;
                }
            }
            Err(e) => {
                stats.failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "reaper pass failed; retrying");
            }
        }
    }
}
