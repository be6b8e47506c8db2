//! Whether a drop is ready to open: what `holdfast drop arm` and the dashboard's
//! readiness panel show before the start.

use serde::{Deserialize, Serialize};

/// One line of a drop's readiness.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadinessLine {
    /// What was checked, e.g. `counters warmed`.
    pub name: String,
    /// Whether it is fine for the drop to open.
    pub ok: bool,
    /// What was found, and what to do when it is not fine.
    pub finding: String,
}

/// A drop's readiness: every line, and whether all of them are fine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Readiness {
    /// The drop's code.
    pub code: String,
    /// Each check, in a fixed order.
    pub lines: Vec<ReadinessLine>,
    /// What arming did first (paused the feeds lane, warmed counters), if it ran.
    pub armed: Vec<String>,
}

impl Readiness {
    /// Whether every line is fine.
    pub fn ready(&self) -> bool {
        self.lines.iter().all(|l| l.ok)
    }

    /// Adds a line.
    pub fn line(&mut self, name: &str, ok: bool, finding: impl Into<String>) {
        self.lines.push(ReadinessLine {
            name: name.to_owned(),
            ok,
            finding: finding.into(),
        });
    }
}
