//! Long-running jobs started from the dashboard (warm-up, reconciliation): each
//! gets an id, reports progress that every open dashboard tab receives live, and
//! stays listed for a while after it ends.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::broadcast;

use crate::dto::ops::{JobKind, JobState, JobView};

/// How many ended jobs stay listed.
const KEEP: usize = 20;
/// Progress is published at most this often (the end always is).
const EVERY: Duration = Duration::from_millis(100);

/// The jobs of this server process.
#[derive(Debug)]
pub struct JobBoard {
    next: AtomicU64,
    jobs: Mutex<VecDeque<JobView>>,
    tx: broadcast::Sender<JobView>,
}

impl Default for JobBoard {
    fn default() -> Self {
        Self {
            next: AtomicU64::new(1),
            jobs: Mutex::new(VecDeque::new()),
            tx: broadcast::channel(256).0,
        }
    }
}

impl JobBoard {
    /// Every update from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<JobView> {
        self.tx.subscribe()
    }

    /// Running and recently ended jobs, newest first.
    pub fn recent(&self) -> Vec<JobView> {
        self.lock().iter().rev().cloned().collect()
    }

    /// Whether a job of `kind` is running.
    pub fn running(&self, kind: JobKind) -> bool {
        self.lock()
            .iter()
            .any(|j| j.kind == kind && j.state == JobState::Running)
    }

    /// Registers a new running job of `kind` and returns its handle, or `None`
    /// when one of that kind is already running. The check and the
    /// registration happen under one lock, so two clicks at once start one job.
    pub fn try_start(
        self: &std::sync::Arc<Self>,
        kind: JobKind,
        started_by: &str,
    ) -> Option<JobHandle> {
        let view = JobView {
            id: self.next.fetch_add(1, Ordering::Relaxed),
            kind,
            started_by: started_by.to_owned(),
            done: 0,
            total: 0,
            state: JobState::Running,
        };
        {
            let mut jobs = self.lock();
            if jobs
                .iter()
                .any(|j| j.kind == kind && j.state == JobState::Running)
            {
                return None;
            }
            jobs.push_back(view.clone());
        }
        self.publish(view.clone());
        Some(JobHandle {
            board: self.clone(),
            view,
            last: Instant::now(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<JobView>> {
        self.jobs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn publish(&self, view: JobView) {
        {
            let mut jobs = self.lock();
            match jobs.iter_mut().find(|j| j.id == view.id) {
                Some(slot) => *slot = view.clone(),
                None => jobs.push_back(view.clone()),
            }
            while jobs.len() > KEEP {
                // Drop the oldest ended job; running ones always stay.
                match jobs.iter().position(|j| j.state != JobState::Running) {
                    Some(i) => {
                        jobs.remove(i);
                    }
                    None => break,
                }
            }
        }
        // Nobody listening is fine.
        let _ = self.tx.send(view);
    }
}

/// The running side of a job.
#[derive(Debug)]
pub struct JobHandle {
    board: std::sync::Arc<JobBoard>,
    view: JobView,
    last: Instant,
}

impl JobHandle {
    /// The job's id.
    pub fn id(&self) -> u64 {
        self.view.id
    }

    /// Reports progress (published at most every 100 ms, and always at the end).
    pub fn progress(&mut self, done: u64, total: u64) {
        self.view.done = done;
        self.view.total = total;
        if done >= total || self.last.elapsed() >= EVERY {
            self.last = Instant::now();
            self.board.publish(self.view.clone());
        }
    }

    /// Marks the job finished.
    pub fn finish(mut self, summary: String) {
        self.view.done = self.view.total.max(self.view.done);
        self.view.state = JobState::Finished { summary };
        self.board.publish(self.view.clone());
    }

    /// Marks the job failed.
    pub fn fail(mut self, error: String) {
        self.view.state = JobState::Failed { error };
        self.board.publish(self.view.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_job_of_a_kind_runs_at_once() {
        let board = std::sync::Arc::new(JobBoard::default());
        let first = board.try_start(JobKind::Warmup, "ann");
        assert!(first.is_some());
        assert!(board.try_start(JobKind::Warmup, "bo").is_none());
        assert!(
            board.try_start(JobKind::Reconcile, "bo").is_some(),
            "another kind may run"
        );
        first.unwrap().finish("done".into());
        assert!(
            board.try_start(JobKind::Warmup, "bo").is_some(),
            "after it ended"
        );
    }
}
