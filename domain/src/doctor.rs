//! What a pre-drop health check of a deployment found (`holdfast doctor`): one
//! line per check with a level, the finding and what to do. The engine's
//! `doctor` module runs the checks; the CLI prints them, and the dashboard's
//! operations page can show the same lines, which is why they live here.

use serde::{Deserialize, Serialize};

/// How a check came out. Ordered from best to worst, so the worst line of a
/// report is its maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckLevel {
    /// Nothing to do.
    Pass,
    /// Works, with a risk the operator should accept knowingly or fix.
    Warn,
    /// Fix it before the drop: sales would be wrong, lost or refused.
    Fail,
}

impl CheckLevel {
    /// The lower-case word shown in tables and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::Warn => "warn",
            Self::Fail => "fail",
        }
    }
}

impl std::fmt::Display for CheckLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One check's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DoctorCheck {
    /// What was checked, short and stable (e.g. `redis eviction policy`).
    pub name: String,
    /// How it came out.
    pub level: CheckLevel,
    /// What was found, with the figures behind the verdict.
    pub finding: String,
    /// What to do about it; empty when there is nothing to do.
    pub action: String,
}

/// Every check of one run, in the order they ran.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DoctorReport {
    /// The checks.
    pub checks: Vec<DoctorCheck>,
}

impl DoctorReport {
    /// The worst level of any line; [`CheckLevel::Pass`] for an empty report.
    pub fn worst(&self) -> CheckLevel {
        self.checks
            .iter()
            .map(|c| c.level)
            .max()
            .unwrap_or(CheckLevel::Pass)
    }

    /// The check called `name`, if it ran.
    pub fn get(&self, name: &str) -> Option<&DoctorCheck> {
        self.checks.iter().find(|c| c.name == name)
    }

    /// Adds a line.
    pub fn push(
        &mut self,
        name: &str,
        level: CheckLevel,
        finding: impl Into<String>,
        action: impl Into<String>,
    ) {
        self.checks.push(DoctorCheck {
            name: name.to_owned(),
            level,
            finding: finding.into(),
            action: action.into(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_line_decides() {
        let mut r = DoctorReport::default();
        assert_eq!(r.worst(), CheckLevel::Pass);
        r.push("a", CheckLevel::Pass, "fine", "");
        r.push("b", CheckLevel::Warn, "hm", "look");
        assert_eq!(r.worst(), CheckLevel::Warn);
        r.push("c", CheckLevel::Fail, "bad", "fix");
        assert_eq!(r.worst(), CheckLevel::Fail);
        assert_eq!(r.get("b").map(|c| c.level), Some(CheckLevel::Warn));
        assert_eq!(
            serde_json::to_string(&CheckLevel::Warn).unwrap(),
            "\"warn\""
        );
    }
}
