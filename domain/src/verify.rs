//! What a verification found: the truth check operators run any time (the
//! engine's `verify` module runs it; the CLI, the dashboard and `/metrics` show it).

use serde::{Deserialize, Serialize};

/// One check's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckResult {
    /// What was checked.
    pub name: String,
    /// Whether it held.
    pub passed: bool,
    /// The figures behind the verdict.
    pub detail: String,
}

/// A SKU that failed a check, with its figures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkuViolation {
    /// The SKU.
    pub sku: String,
    /// Which check.
    pub check: String,
    /// Redis' counters and PostgreSQL's figures, as read.
    pub figures: String,
}

/// What a verification found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReport {
    /// Every check, in order.
    pub checks: Vec<CheckResult>,
    /// Every SKU that failed a per-SKU check.
    pub skus: Vec<SkuViolation>,
    /// SKUs checked.
    pub checked: u64,
    /// When it finished, Unix milliseconds.
    pub at_ms: i64,
}

impl VerifyReport {
    /// Whether every check held.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }

    /// How many checks failed.
    pub fn violations(&self) -> u64 {
        self.checks.iter().filter(|c| !c.passed).count() as u64
    }

    /// Adds a check's verdict.
    pub fn check(&mut self, name: &str, passed: bool, detail: String) {
        self.checks.push(CheckResult {
            name: name.to_owned(),
            passed,
            detail,
        });
    }
}
