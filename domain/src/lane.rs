//! The ingestion lanes: webhooks queue on one of them, so a burst of bulk feed
//! updates never delays urgent order events.

use std::fmt;

use serde::{Deserialize, Serialize};

/// An ingestion lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Lane {
    /// Order events from the ERP: small and urgent.
    Orders,
    /// Supplier stock feeds: big and patient, rate-limited so checkout keeps its share of Redis.
    Feeds,
}

impl Lane {
    /// Every lane, in the order they are shown.
    pub const ALL: [Lane; 2] = [Lane::Orders, Lane::Feeds];

    /// The lane's name, as configured, typed and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Orders => "orders",
            Self::Feeds => "feeds",
        }
    }

    /// Parses a lane name, saying which names exist when it is unknown.
    pub fn parse(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|l| l.as_str() == s)
            .ok_or_else(|| format!("no lane '{s}': use orders or feeds"))
    }
}

impl fmt::Display for Lane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether a lane's consumers run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LaneState {
    /// Consumers apply payloads.
    Running,
    /// Consumers wait; payloads queue up to the lane's cap.
    Paused,
}

impl LaneState {
    /// `running` or `paused`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Paused => "paused",
        }
    }
}

/// One lane as operators see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LaneStatus {
    /// The lane.
    pub lane: Lane,
    /// Payloads waiting or being processed.
    pub backlog: u64,
    /// Payloads delivered to a consumer and not yet finished.
    pub pending: u64,
    /// Whether its consumers run.
    pub state: LaneState,
}

impl LaneStatus {
    /// Whether its consumers are paused.
    pub fn paused(&self) -> bool {
        self.state == LaneState::Paused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for lane in Lane::ALL {
            assert_eq!(Lane::parse(lane.as_str()), Ok(lane));
        }
        assert_eq!(
            Lane::parse("bulk"),
            Err("no lane 'bulk': use orders or feeds".to_owned())
        );
    }
}
