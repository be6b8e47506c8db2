//! Operations data: locks, ingestion lanes, dead letters, jobs and runs.

use holdfast_domain::Lane;
use holdfast_domain::lane::LaneStatus;
use serde::{Deserialize, Serialize};

/// A held lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockView {
    /// Lock name, e.g. `reconcile`.
    pub name: String,
    /// Who holds it (the lease token's owner).
    pub holder: String,
    /// Milliseconds left on the lease when sampled.
    pub remaining_ms: i64,
    /// The fencing token of the current lease.
    pub fence: i64,
}

/// An ingestion lane.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LaneView {
    /// The lane.
    pub lane: Lane,
    /// Entries not yet delivered to a consumer.
    pub backlog: u64,
    /// Delivered but not yet acknowledged.
    pub pending: u64,
    /// Whether consumers are paused.
    pub paused: bool,
    /// Payloads applied per second (about the last second).
    pub rate: f64,
}

impl LaneView {
    /// `status` with its measured `rate`.
    pub fn new(status: &LaneStatus, rate: f64) -> Self {
        Self {
            lane: status.lane,
            backlog: status.backlog,
            pending: status.pending,
            paused: status.paused(),
            rate,
        }
    }
}

/// Write-behind progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteBehindView {
    /// Events not yet recorded in PostgreSQL.
    pub pending: u64,
    /// Age in milliseconds of the oldest unrecorded event (0 when caught up).
    pub lag_ms: u64,
}

/// Locks, lanes and write-behind, sampled together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct OpsView {
    /// Held locks.
    pub locks: Vec<LockView>,
    /// Ingestion lanes.
    pub lanes: Vec<LaneView>,
    /// Dead letters waiting.
    pub dead_letters: u64,
    /// Write-behind; `None` when it could not be read.
    pub write_behind: Option<WriteBehindView>,
    /// Unix milliseconds when sampled.
    pub at_ms: i64,
}

/// A dead-lettered webhook payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetterView {
    /// Dead-letter id.
    pub id: String,
    /// Lane it came from.
    pub lane: String,
    /// Webhook source.
    pub source: String,
    /// Why it was set aside.
    pub reason: String,
    /// The payload as received.
    pub body: String,
}

/// What a job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobKind {
    /// Rebuild Redis counters from PostgreSQL.
    Warmup,
    /// Measure and repair drift.
    Reconcile,
}

/// Where a job is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum JobState {
    /// Still going.
    Running,
    /// Finished; `summary` says what it did.
    Finished {
        /// One line for people.
        summary: String,
    },
    /// Stopped by an error.
    Failed {
        /// What went wrong, readable.
        error: String,
    },
}

/// A long-running job started from the dashboard, with its progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobView {
    /// Job id (unique in this server process).
    pub id: u64,
    /// What it does.
    pub kind: JobKind,
    /// Who started it.
    pub started_by: String,
    /// Items done.
    pub done: u64,
    /// Items in all (0 while unknown).
    pub total: u64,
    /// Running, finished or failed.
    pub state: JobState,
}

impl JobView {
    /// Progress from 0 to 100, rounded down; 100 once finished.
    pub fn percent(&self) -> u8 {
        match (&self.state, self.total) {
            (JobState::Finished { .. }, _) => 100,
            (_, 0) => 0,
            _ => (self.done.min(self.total) * 100 / self.total) as u8,
        }
    }
}

/// A past reconciliation run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunView {
    /// Run id.
    pub id: i64,
    /// What started it.
    pub trigger: String,
    /// RFC 3339 start time.
    pub started_at: String,
    /// Whether it finished.
    pub finished: bool,
    /// SKUs checked.
    pub checked: i32,
    /// SKUs drifted.
    pub drifted: i32,
    /// SKUs corrected.
    pub corrected: i32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_is_a_whole_percentage_and_100_only_when_finished() {
        let mut job = JobView {
            id: 1,
            kind: JobKind::Warmup,
            started_by: "a".into(),
            done: 0,
            total: 0,
            state: JobState::Running,
        };
        assert_eq!(job.percent(), 0);
        job.total = 3;
        job.done = 2;
        assert_eq!(job.percent(), 66);
        job.done = 3;
        assert_eq!(job.percent(), 100);
        job.state = JobState::Finished {
            summary: String::new(),
        };
        job.total = 0;
        assert_eq!(job.percent(), 100);
    }
}
