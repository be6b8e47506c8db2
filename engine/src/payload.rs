//! Supplier and ERP webhook payloads: parsing and validation, with a clear error
//! for every way a payload can be wrong. Pure and panic-free (fuzzed in tests).
//!
//! ```json
//! {"event_id": "erp-1001", "type": "delta", "sku": "DROP-001", "delta": 50, "reason": "received"}
//! {"event_id": "erp-1002", "type": "snapshot", "sku": "DROP-001", "on_hand": 1200, "version": 17}
//! {"events": [ …up to 10,000 of the above… ]}
//! ```

use serde::{Deserialize, Serialize};

use crate::engine::valid_sku;

/// Default most events in one payload (`EngineConfig::max_payload_events`).
pub const DEFAULT_MAX_EVENTS: usize = 10_000;
/// Largest snapshot version (2^53 - 1): the scripts compare versions as Lua
/// numbers, exact up to there (an epoch in microseconds fits).
pub const MAX_VERSION: i64 = (1 << 53) - 1;

/// Largest absolute delta or on-hand a feed may send.
pub const MAX_UNITS: i64 = 1_000_000_000;

/// One stock event from a feed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeedEvent {
    /// The feed's own id for this event; applied once per source.
    pub event_id: String,
    /// The SKU.
    pub sku: String,
    /// What to do.
    pub change: Change,
}

/// A feed event's effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Change {
    /// Units received (+) or lost (-).
    Delta(i64),
    /// An absolute count with a version that only grows.
    Snapshot {
        /// Units the feed counts on hand.
        on_hand: i64,
        /// Monotonic version per SKU.
        version: i64,
    },
}

/// Why a payload was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    /// Not JSON, or not of the documented shape.
    #[error("not a valid payload: {0}")]
    Malformed(String),
    /// A field is missing or out of range.
    #[error("event {index}: {message}")]
    Invalid {
        /// The event's position in the payload (0 for a single event).
        index: usize,
        /// What is wrong.
        message: String,
    },
    /// More events than allowed (`EngineConfig::max_payload_events`).
    #[error("too many events: {0} (at most {1} per payload)")]
    TooMany(usize, usize),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEvent {
    event_id: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    sku: Option<String>,
    delta: Option<i64>,
    on_hand: Option<i64>,
    version: Option<i64>,
    reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Raw {
    Batch { events: Vec<RawEvent> },
    One(RawEvent),
}

fn event(index: usize, raw: RawEvent) -> Result<FeedEvent, PayloadError> {
    let invalid = |message: String| PayloadError::Invalid { index, message };
    let event_id = raw
        .event_id
        .ok_or_else(|| invalid("event_id is missing".into()))?;
    if event_id.is_empty()
        || event_id.len() > 128
        || !event_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':'))
    {
        return Err(invalid(
            "event_id must be 1 to 128 characters: letters, digits and . _ - :".into(),
        ));
    }
    let sku = raw.sku.ok_or_else(|| invalid("sku is missing".into()))?;
    if !valid_sku(&sku) {
        return Err(invalid(format!("'{sku}' is not a valid SKU code")));
    }
    if raw.reason.as_ref().is_some_and(|r| r.len() > 200) {
        return Err(invalid("reason is longer than 200 characters".into()));
    }
    let change = match raw.kind.as_deref() {
        Some("delta") => {
            let delta = raw
                .delta
                .ok_or_else(|| invalid("a delta needs `delta`".into()))?;
            if delta == 0
                // unsigned_abs: `abs` of i64::MIN overflows (a panic in debug).
                || delta.unsigned_abs() > MAX_UNITS.unsigned_abs()
                || raw.on_hand.is_some()
                || raw.version.is_some()
            {
                return Err(invalid(
                    "delta must be a non-zero count of units, alone".into(),
                ));
            }
            Change::Delta(delta)
        }
        Some("snapshot") => {
            let on_hand = raw
                .on_hand
                .ok_or_else(|| invalid("a snapshot needs `on_hand`".into()))?;
            let version = raw
                .version
                .ok_or_else(|| invalid("a snapshot needs `version`".into()))?;
            if !(0..=MAX_UNITS).contains(&on_hand)
                || !(0..=MAX_VERSION).contains(&version)
                || raw.delta.is_some()
            {
                return Err(invalid(
                    "snapshot needs on_hand >= 0 and a version from 0 to 2^53 - 1, and no delta"
                        .into(),
                ));
            }
            Change::Snapshot { on_hand, version }
        }
        Some(other) => {
            return Err(invalid(format!(
                "unknown type '{other}' (delta or snapshot)"
            )));
        }
        None => return Err(invalid("type is missing (delta or snapshot)".into())),
    };
    Ok(FeedEvent {
        event_id,
        sku,
        change,
    })
}

/// Parses a webhook body into its events, at most `max_events` of them.
pub fn parse(body: &[u8], max_events: usize) -> Result<Vec<FeedEvent>, PayloadError> {
    let raw: Raw =
        serde_json::from_slice(body).map_err(|e| PayloadError::Malformed(e.to_string()))?;
    match raw {
        Raw::One(e) => Ok(vec![event(0, e)?]),
        Raw::Batch { events } => {
            if events.len() > max_events {
                return Err(PayloadError::TooMany(events.len(), max_events));
            }
            if events.is_empty() {
                return Err(PayloadError::Malformed("events is empty".into()));
            }
            events
                .into_iter()
                .enumerate()
                .map(|(i, e)| event(i, e))
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_the_documented_shapes() {
        let one = parse(
            br#"{"event_id":"e1","type":"delta","sku":"DROP-001","delta":50,"reason":"received"}"#,
            DEFAULT_MAX_EVENTS,
        )
        .unwrap();
        assert_eq!(
            one,
            vec![FeedEvent {
                event_id: "e1".into(),
                sku: "DROP-001".into(),
                change: Change::Delta(50)
            }]
        );
        let batch = parse(
            br#"{"events":[{"event_id":"e2","type":"snapshot","sku":"A","on_hand":5,"version":3},
                           {"event_id":"e3","type":"delta","sku":"B","delta":-3}]}"#,
            DEFAULT_MAX_EVENTS,
        )
        .unwrap();
        assert_eq!(
            batch[0].change,
            Change::Snapshot {
                on_hand: 5,
                version: 3
            }
        );
        assert_eq!(batch[1].change, Change::Delta(-3));
    }

    #[test]
    fn every_failure_says_what_is_wrong() {
        let err = |b: &[u8]| parse(b, DEFAULT_MAX_EVENTS).unwrap_err().to_string();
        assert!(err(b"not json").starts_with("not a valid payload"));
        assert!(err(br#"{"type":"delta","sku":"A","delta":1}"#).contains("event_id is missing"));
        assert!(
            err(br#"{"event_id":"e","type":"delta","sku":"A b","delta":1}"#)
                .contains("not a valid SKU")
        );
        assert!(
            err(br#"{"event_id":"e","type":"delta","sku":"A","delta":0}"#).contains("non-zero")
        );
        assert!(
            err(br#"{"event_id":"e","type":"snapshot","sku":"A","on_hand":1}"#)
                .contains("needs `version`")
        );
        assert!(err(br#"{"event_id":"e","type":"refund","sku":"A"}"#).contains("unknown type"));
        assert!(err(br#"{"events":[]}"#).contains("empty"));
        assert!(err(br#"{"events":[{"event_id":"ok","type":"delta","sku":"A","delta":1},{"event_id":"x"}]}"#)
            .starts_with("event 1:"));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

        #[test]
        fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Err(e) = parse(&body, DEFAULT_MAX_EVENTS) {
                prop_assert!(!e.to_string().is_empty());
            }
        }

        #[test]
        fn arbitrary_json_shapes_never_panic(
            id in "[ -~]{0,20}", kind in "(delta|snapshot|x)?", sku in "[ -~]{0,12}",
            delta in any::<i64>(), on_hand in any::<i64>(), version in any::<i64>(),
        ) {
            let body = serde_json::json!({"event_id": id, "type": kind, "sku": sku, "delta": delta,
                                          "on_hand": on_hand, "version": version});
            let _ = parse(body.to_string().as_bytes(), DEFAULT_MAX_EVENTS);
        }
    }
}
