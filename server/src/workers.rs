//! Background workers that run beside the HTTP server.

use std::sync::Arc;

use holdfast_engine::Backends;
use holdfast_engine::reaper::{ReaperConfig, ReaperStats, run_reaper};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The running workers and the means to stop them.
pub struct Workers {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    /// The reaper's counters.
    pub reaper: Arc<ReaperStats>,
}

impl Workers {
    /// Starts the reaper over `backends`' engine.
    pub fn start(backends: &Backends, reaper: ReaperConfig) -> Self {
        let (stop, rx) = watch::channel(false);
        let stats = Arc::new(ReaperStats::default());
        let tasks = vec![tokio::spawn(run_reaper(
            backends.engine.clone(),
            reaper,
            stats.clone(),
            stopped(rx),
        ))];
        Self {
            stop,
            tasks,
            reaper: stats,
        }
    }

    /// Signals every worker to stop and waits for them to finish their current pass.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// Completes once `true` is sent (or the sender is dropped).
async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}
