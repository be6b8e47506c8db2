//! Setting and adjusting counters: warm-up from the system of record, feed deltas
//! and versioned snapshots. Each is one script that appends its event.

use redis::Value;
use serde::{Deserialize, Serialize};

use crate::engine::Engine;
use crate::error::EngineError;
use crate::reply::Reply;

/// What warm-up writes for one SKU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarmSpec {
    /// The SKU code.
    pub sku: String,
    /// Units on hand, as the system of record has them.
    pub on_hand: i64,
    /// Units in holds that outlived a lost counter (a new counter only): they are
    /// on hand but not available.
    pub reserved: i64,
    /// PostgreSQL's `sold_recorded`.
    pub settled: i64,
    /// Per-buyer limit (0: none).
    pub per_buyer_limit: i64,
    /// The newest feed snapshot version applied (-1: none).
    pub snapshot_version: i64,
    /// When the SKU's drop opens, Unix ms (0: no start); see [`crate::schedule`].
    #[serde(default)]
    pub opens_ms: i64,
    /// When the SKU's drop closes, Unix ms (0: no end).
    #[serde(default)]
    pub closes_ms: i64,
}

impl WarmSpec {
    /// A fresh counter of `on_hand` units, all available, and no limit.
    pub fn new(sku: impl Into<String>, on_hand: i64) -> Self {
        Self {
            sku: sku.into(),
            on_hand,
            reserved: 0,
            settled: 0,
            per_buyer_limit: 0,
            snapshot_version: -1,
            opens_ms: 0,
            closes_ms: 0,
        }
    }
}

/// The result of warming one SKU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum WarmOutcome {
    /// The counter was written.
    Warmed {
        /// Units now available.
        available: i64,
    },
    /// The counter existed and was left alone (not forced).
    Exists {
        /// Units available in the existing counter.
        available: i64,
    },
}

/// The result of a feed delta.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum DeltaOutcome {
    /// Applied in full. A decrease larger than `available` leaves `owed` units:
    /// held units that no longer exist, paid back first by units that return.
    Applied {
        /// Units available afterwards.
        available: i64,
        /// Units owed afterwards (0 unless the feed lowered stock under holds).
        owed: i64,
    },
    /// This event id from this source was applied before.
    Duplicate,
    /// The SKU's counter is missing.
    NotWarmed,
}

/// The result of a feed snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum SnapshotOutcome {
    /// Applied: `available` is now the snapshot's on-hand less holds and unrecorded sales.
    Applied {
        /// Units available afterwards.
        available: i64,
        /// Units available before.
        previous: i64,
        /// Units owed afterwards (held units beyond the new count).
        owed: i64,
    },
    /// The snapshot's version is not newer than the last applied one.
    Stale {
        /// The last applied version.
        current_version: i64,
    },
    /// This event id from this source was applied before.
    Duplicate,
    /// The SKU's counter is missing.
    NotWarmed,
}

impl Engine {
    /// Writes `spec`'s counter if it is missing (or, when `force`, rewrites its
    /// `available` and limit, keeping the live reserved, sold-pending and settled figures).
    pub async fn warm(&self, spec: &WarmSpec, force: bool) -> Result<WarmOutcome, EngineError> {
        let shard = self.keys.shard_of(&spec.sku);
        let mut inv = self.scripts.warm.prepare_invoke();
        inv.key(self.keys.events(shard))
            .key(self.keys.sku(&spec.sku))
            .arg(&spec.sku)
            .arg(spec.on_hand)
            .arg(spec.reserved)
            .arg(spec.settled)
            .arg(spec.per_buyer_limit)
            .arg(if force { "1" } else { "0" })
            .arg(spec.snapshot_version)
            // fed_recorded: none known here (a new counter starts at 0, a forced
            // warm keeps its live figure), then the schedule.
            .arg(0)
            .arg(spec.opens_ms)
            .arg(spec.closes_ms);
        // One SKU: the first (and only) answer.
        let answers: Vec<Vec<Value>> = inv.invoke_async(&mut self.conn.clone()).await?;
        let reply = Reply::new(answers.into_iter().next().unwrap_or_default());
        Ok(match reply.tag()?.as_str() {
            "warmed" => WarmOutcome::Warmed {
                available: reply.int(1)?,
            },
            "exists" => WarmOutcome::Exists {
                available: reply.int(1)?,
            },
            other => return Err(EngineError::UnexpectedReply(format!("warm: {other}"))),
        })
    }

    /// Applies a signed stock movement from `source`, once per `event_id`.
    ///
    /// A decrease of a split SKU first brings its other parts' available
    /// units to part 0, where feeds apply, so no unit the feed removed stays
    /// on sale in another part; a debt left on part 0 (units in holds that no
    /// longer exist) goes to the parts whose holds will pay it back.
    pub async fn apply_delta(
        &self,
        sku: &str,
        delta: i64,
        source: &str,
        event_id: &str,
    ) -> Result<DeltaOutcome, EngineError> {
        let mut reply = self.delta_call(sku, delta, source, event_id, "").await?;
        for _ in 0..CHANGING_TRIES {
            if reply.tag()? != "split" || reply.int(1)? != 0 {
                break;
            }
            // The SKU's parts are being changed: a moment.
            tokio::time::sleep(CHANGING_PAUSE).await;
            reply = self.delta_call(sku, delta, source, event_id, "").await?;
        }
        if reply.tag()? == "split" {
            let parts = reply.int(1)?.clamp(0, i64::from(crate::keys::MAX_PARTS)) as u16;
            if parts == 0 {
                return Err(changing(sku));
            }
            // Units coming back anywhere are parked from here until the
            // debt this may leave is settled (split.rs, debts).
            let token = self.hold_back(sku, parts).await?;
            self.gather_all(sku, parts).await?;
            reply = self
                .delta_call(sku, delta, source, event_id, "gathered")
                .await?;
            if reply.tag()? == "applied" {
                self.after_feed(sku, parts, Some(token)).await?;
            } else {
                // Nothing applied: the marks go once nothing is owed.
                self.settle_debts(sku, parts, Some(token)).await?;
            }
        } else if reply.tag()? == "applied" && reply.int(3).unwrap_or(1) > 1 {
            // A receipt on part 0 pays the other parts' debts first.
            let parts = reply.int(3)?.clamp(1, i64::from(crate::keys::MAX_PARTS)) as u16;
            self.settle_debts(sku, parts, None).await?;
        }
        Ok(match reply.tag()?.as_str() {
            "applied" => DeltaOutcome::Applied {
                available: reply.int(1)?,
                owed: reply.int(2)?,
            },
            "duplicate" => DeltaOutcome::Duplicate,
            "not_warmed" => DeltaOutcome::NotWarmed,
            other => return Err(EngineError::UnexpectedReply(format!("delta: {other}"))),
        })
    }

    /// Runs `delta.lua` (`gathered`: its ARGV[6]).
    async fn delta_call(
        &self,
        sku: &str,
        delta: i64,
        source: &str,
        event_id: &str,
        gathered: &str,
    ) -> Result<Reply, EngineError> {
        let shard = self.keys.shard_of(sku);
        let mut inv = self.scripts.delta.prepare_invoke();
        inv.key(self.keys.sku(sku))
            .key(self.keys.events(shard))
            .key(self.keys.seen(sku, source, event_id))
            .arg(sku)
            .arg(delta)
            .arg(source)
            .arg(event_id)
            .arg(self.config.guard_ttl.as_millis() as u64)
            .arg(gathered);
        Ok(Reply::new(
            inv.invoke_async::<Vec<Value>>(&mut self.conn.clone())
                .await?,
        ))
    }

    /// Applies an absolute on-hand count from `source` if `version` is newer than
    /// the last one applied to `sku`.
    ///
    /// For a split SKU, the other parts' available units come to part 0
    /// first, and what those parts keep (holds, sales pending, units moving)
    /// counts against the count as part 0's own do; a debt goes to the parts
    /// whose holds will pay it back.
    pub async fn apply_snapshot(
        &self,
        sku: &str,
        on_hand: i64,
        version: i64,
        source: &str,
        event_id: &str,
    ) -> Result<SnapshotOutcome, EngineError> {
        let call = SnapshotCall {
            sku,
            on_hand,
            version,
            source,
            event_id,
        };
        let mut reply = self.snapshot_call(&call, None).await?;
        for _ in 0..CHANGING_TRIES {
            if reply.tag()? != "split" || reply.int(1)? != 0 {
                break;
            }
            tokio::time::sleep(CHANGING_PAUSE).await;
            reply = self.snapshot_call(&call, None).await?;
        }
        if reply.tag()? == "split" {
            let parts = reply.int(1)?.clamp(0, i64::from(crate::keys::MAX_PARTS)) as u16;
            if parts == 0 {
                return Err(changing(sku));
            }
            let token = self.hold_back(sku, parts).await?;
            // The other parts' holds and units, read at one moment at rest,
            // and part 0 unchanged since (compare-and-set): else read again.
            for _ in 0..AT_REST_COUNTS {
                self.gather_all(sku, parts).await?;
                let Some((kept, home)) = self.kept_by_other_parts(sku, parts).await? else {
                    continue;
                };
                reply = self
                    .snapshot_call(&call, Some((kept, home.fingerprint())))
                    .await?;
                if reply.tag()? != "moved" {
                    break;
                }
            }
            match reply.tag()?.as_str() {
                "applied" => self.after_feed(sku, parts, Some(token)).await?,
                "split" | "moved" => {
                    self.settle_debts(sku, parts, Some(token)).await?;
                    return Err(EngineError::Busy(format!(
                        "units of {sku} kept moving between its parts; the count is tried again"
                    )));
                }
                _ => {
                    self.settle_debts(sku, parts, Some(token)).await?;
                }
            }
        }
        Ok(match reply.tag()?.as_str() {
            "applied" => SnapshotOutcome::Applied {
                available: reply.int(1)?,
                previous: reply.int(2)?,
                owed: reply.int(3)?,
            },
            "stale" => SnapshotOutcome::Stale {
                current_version: reply.int(1)?,
            },
            "duplicate" => SnapshotOutcome::Duplicate,
            "not_warmed" => SnapshotOutcome::NotWarmed,
            other => return Err(EngineError::UnexpectedReply(format!("snapshot: {other}"))),
        })
    }

    /// Runs `snapshot.lua` (`others`: its ARGV[7] and ARGV[8], for a split SKU).
    async fn snapshot_call(
        &self,
        call: &SnapshotCall<'_>,
        others: Option<(i64, String)>,
    ) -> Result<Reply, EngineError> {
        let sku = call.sku;
        let shard = self.keys.shard_of(sku);
        let mut inv = self.scripts.snapshot.prepare_invoke();
        inv.key(self.keys.sku(sku))
            .key(self.keys.events(shard))
            .key(self.keys.seen(sku, call.source, call.event_id))
            .arg(sku)
            .arg(call.on_hand)
            .arg(call.version)
            .arg(call.source)
            .arg(call.event_id)
            .arg(self.config.guard_ttl.as_millis() as u64);
        if let Some((kept, home)) = others {
            inv.arg(kept).arg(home);
        }
        Ok(Reply::new(
            inv.invoke_async::<Vec<Value>>(&mut self.conn.clone())
                .await?,
        ))
    }
}

/// How many times a count of a split SKU reads its parts for a moment at
/// rest before the feed event is left to be tried again.
const AT_REST_COUNTS: usize = 5;

/// How many times a feed waits for a change of its SKU's parts to finish.
const CHANGING_TRIES: usize = 100;

/// How long each wait is.
const CHANGING_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

/// A feed that met its SKU's parts being changed for longer than it waits.
fn changing(sku: &str) -> EngineError {
    EngineError::Busy(format!(
        "the parts of {sku} are being changed; the feed event is tried again"
    ))
}

/// One snapshot as `snapshot.lua` is called for it.
struct SnapshotCall<'a> {
    sku: &'a str,
    on_hand: i64,
    version: i64,
    source: &'a str,
    event_id: &'a str,
}
