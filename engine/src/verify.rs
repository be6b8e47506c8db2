//! The truth check operators can run at any time, on live data and without
//! stopping sales (`holdfast verify`, the dashboard's "Verify now", a periodic run
//! whose last result is in `/metrics`, and the simulator after a rehearsal).
//!
//! Checks, each reporting what it found:
//!
//! 1. no counter is negative;
//! 2. per SKU, `available + moving + reserved + sold_pending - owed = on_hand`
//!    (`moving`: a split SKU's units between parts), allowing for
//!    events in flight (`holdfast_domain::Counters::drift`); a SKU that moves while
//!    it is read is read again, so only lasting drift is reported;
//! 3. every open hold is in its shard's due set, and every due entry has a hold;
//! 4. every cart's parts exist and agree;
//! 5. PostgreSQL's ledger agrees with `sold_recorded` and `fed_recorded`;
//! 6. no event waits for PostgreSQL longer than the threshold;
//! 7. no stream was trimmed past what a consumer group still needs;
//! 8. every oversell has been seen by support (no open `oversold` remediation);
//! 9. every counter has the drop schedule and per-buyer limit PostgreSQL has
//!    for its SKU (a half-finished import or reschedule, or another Redis);
//! 10. no stock change from a drop import has waited long for the ledger;
//! 11. every SKU has its counter (one without answers "not warmed": nothing is
//!     sold wrong, but nothing sells).

use std::collections::HashMap;
use std::time::Duration;

use holdfast_domain::{Counters, HoldState};
use sqlx::PgPool;

use crate::redis_conn::RedisConn;

use crate::engine::Engine;
use crate::error::EngineError;
use crate::warmup::{read_counters, stock_page, stock_row};

/// How the run is judged.
#[derive(Debug, Clone)]
pub struct VerifyOptions {
    /// An event older than this not yet in PostgreSQL is a violation.
    pub max_lag: Duration,
    /// How often a drifting SKU is read again before its drift counts (sales go
    /// on meanwhile).
    pub rereads: u32,
}

impl Default for VerifyOptions {
    fn default() -> Self {
        Self {
            max_lag: Duration::from_secs(60),
            rereads: 3,
        }
    }
}

pub use holdfast_domain::verify::{CheckResult, SkuViolation, VerifyReport};

/// The last verification's report, shared by the periodic run (which writes it),
/// `/metrics` and the dashboard (which read it).
#[derive(Debug, Default)]
pub struct LastVerify(std::sync::Mutex<Option<VerifyReport>>);

impl LastVerify {
    /// The last report, if a run has finished.
    pub fn get(&self) -> Option<VerifyReport> {
        self.0.lock().ok().and_then(|r| r.clone())
    }

    /// Keeps `report` as the last one.
    pub fn set(&self, report: VerifyReport) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(report);
        }
    }
}

/// How long an imported stock change may wait for the ledger before the truth
/// check reports it (the servers apply pending ones every few seconds).
const STOCK_CHANGE_GRACE: Duration = Duration::from_secs(30);

/// Runs every check over every SKU in PostgreSQL.
pub async fn verify(
    engine: &Engine,
    pg: &PgPool,
    options: &VerifyOptions,
) -> Result<VerifyReport, EngineError> {
    let mut report = VerifyReport::default();
    counters_and_equation(engine, pg, options, &mut report).await?;
    holds_and_due_sets(engine, &mut report).await?;
    ledger_agrees(pg, &mut report).await?;
    streams(engine, options, &mut report).await?;
    let (waiting, oldest_ms) =
        crate::drop_file::pending_stock(pg, None, STOCK_CHANGE_GRACE).await?;
    report.check(
        "every imported stock change is applied",
        waiting == 0,
        format!(
            "{waiting} stock change(s) from drop imports not yet in the ledger, the oldest {} s \
             (Redis unreachable or refusing writes? the servers retry every few seconds)",
            oldest_ms / 1000
        ),
    );
    let open: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM remediations WHERE kind = 'oversold' AND status = 'open'",
    )
    .fetch_one(pg)
    .await?;
    report.check(
        "every oversell is with support",
        open == 0,
        format!("{open} open oversell remediation(s) (support: refund or source the units)"),
    );
    report.at_ms = chrono::Utc::now().timestamp_millis();
    Ok(report)
}

/// Checks 1 and 2, page by page.
async fn counters_and_equation(
    engine: &Engine,
    pg: &PgPool,
    options: &VerifyOptions,
    report: &mut VerifyReport,
) -> Result<(), EngineError> {
    let (mut negative, mut drifted, mut not_warmed, mut unfollowed) = (0u64, 0u64, 0u64, 0u64);
    let mut after = String::new();
    loop {
        let rows = stock_page(pg, &after, 500).await?;
        let Some(last) = rows.last() else { break };
        after = last.sku.clone();
        let skus: Vec<&str> = rows.iter().map(|r| r.sku.as_str()).collect();
        let counters = read_counters(engine, &skus).await?;
        let settings = read_settings(engine, &skus).await?;
        for ((row, c), set) in rows.iter().zip(counters).zip(settings) {
            report.checked += 1;
            let Some(available) = c.available else {
                not_warmed += 1;
                continue;
            };
            let wanted = row.settings();
            if set != wanted {
                unfollowed += 1;
                report.skus.push(SkuViolation {
                    sku: row.sku.clone(),
                    check: "counters follow the catalogue".to_owned(),
                    figures: format!(
                        "opens {} closes {} limit {} in Redis | {} {} {} in PostgreSQL",
                        set[0], set[1], set[2], wanted[0], wanted[1], wanted[2]
                    ),
                });
            }
            if available < 0 || c.reserved < 0 || c.sold_pending < 0 || c.owed < 0 {
                negative += 1;
                report
                    .skus
                    .push(violation(&row.sku, "counters never negative", &c, row));
            }
            if c.drift(&row.recorded()).unwrap_or(0) != 0
                && lasting_drift(engine, pg, &row.sku, options.rereads).await?
            {
                drifted += 1;
                report
                    .skus
                    .push(violation(&row.sku, "stock conserved", &c, row));
            }
        }
    }
    report.check(
        "counters never negative",
        negative == 0,
        format!("{negative} SKU(s) with a negative counter"),
    );
    report.check(
        "counters follow the catalogue (drop schedule, per-buyer limit)",
        unfollowed == 0,
        format!(
            "{unfollowed} SKU(s) whose counter has another schedule or limit than PostgreSQL \
             (re-run the import or `holdfast drop schedule`, which write them)"
        ),
    );
    report.check(
        "stock conserved (available + moving + reserved + sold_pending - owed = on_hand)",
        drifted == 0,
        format!("{drifted} SKU(s) drifting, {} checked", report.checked),
    );
    report.check(
        "every SKU warmed (has its counter in Redis)",
        not_warmed == 0,
        format!(
            "{not_warmed} SKU(s) without a counter answer \"not warmed\" and sell nothing \
             (a server warms every counter again by itself after Redis lost its data; \
             else run `holdfast warm`)"
        ),
    );
    Ok(())
}

/// Each counter's `opens`, `closes` and `limit` (0 where unset), in one round
/// trip. For a split SKU, a part whose settings differ from part 0's is what
/// is answered (so a comparison with PostgreSQL's sees it), with one more
/// round trip for the split SKUs' parts.
pub(crate) async fn read_settings(
    engine: &Engine,
    skus: &[&str],
) -> Result<Vec<[i64; 3]>, EngineError> {
    // Redis refuses an empty pipeline (a drop with no SKUs asks for none).
    if skus.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    for sku in skus {
        pipe.cmd("HMGET")
            .arg(engine.keys.sku(sku))
            .arg(&["opens", "closes", "limit", "parts"]);
    }
    let rows: Vec<Vec<Option<i64>>> = pipe.query_async(&mut engine.conn.clone()).await?;
    let at = |r: &[Option<i64>], i: usize| r.get(i).copied().flatten().unwrap_or(0);
    let mut settings: Vec<[i64; 3]> = rows
        .iter()
        .map(|r| [at(r, 0), at(r, 1), at(r, 2)])
        .collect();
    let mut parts_pipe = redis::pipe();
    let mut asked = Vec::new();
    for (i, (sku, r)) in skus.iter().zip(&rows).enumerate() {
        let parts = at(r, 3).clamp(1, i64::from(crate::keys::MAX_PARTS)) as u16;
        for j in 1..parts {
            parts_pipe
                .cmd("HMGET")
                .arg(engine.keys.sku(&crate::keys::part_name(sku, j, parts)))
                .arg(&["opens", "closes", "limit"]);
            asked.push(i);
        }
    }
    if !asked.is_empty() {
        let parts: Vec<Vec<Option<i64>>> = parts_pipe.query_async(&mut engine.conn.clone()).await?;
        for (i, r) in asked.into_iter().zip(parts) {
            let part = [at(&r, 0), at(&r, 1), at(&r, 2)];
            if part != settings[i] {
                settings[i] = part;
            }
        }
    }
    Ok(settings)
}

fn violation(sku: &str, check: &str, c: &Counters, row: &crate::warmup::StockRow) -> SkuViolation {
    SkuViolation {
        sku: sku.to_owned(),
        check: check.to_owned(),
        figures: format!(
            "available {} reserved {} sold_pending {} owed {} settled {} fed {} | on_hand {} sold_recorded {} fed_recorded {} | drift {}",
            c.available.unwrap_or(0),
            c.reserved,
            c.sold_pending,
            c.owed,
            c.settled,
            c.fed,
            row.on_hand,
            row.sold_recorded,
            row.fed_recorded,
            c.drift(&row.recorded()).unwrap_or(0)
        ),
    }
}

/// Whether `sku`'s drift is still there after `rereads` fresh reads a moment
/// apart (a sale between reading Redis and PostgreSQL is not drift).
pub(crate) async fn lasting_drift(
    engine: &Engine,
    pg: &PgPool,
    sku: &str,
    rereads: u32,
) -> Result<bool, EngineError> {
    for _ in 0..rereads {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let Some(row) = stock_row(pg, sku).await? else {
            return Ok(false);
        };
        let c = read_counters(engine, &[sku]).await?;
        if c.first()
            .and_then(|c| c.drift(&row.recorded()))
            .unwrap_or(0)
            == 0
        {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The `state` of the hold at `hold`, if it exists.
async fn hold_state(conn: &mut RedisConn, hold: String) -> Result<Option<String>, EngineError> {
    Ok(redis::cmd("HGET")
        .arg(hold)
        .arg("state")
        .query_async(conn)
        .await?)
}

/// Whether the hold at `hold` is open and whether `rid` is in the due set
/// `due`, read in one transaction (both keys share the shard's slot).
async fn hold_and_due(
    conn: &mut RedisConn,
    hold: String,
    due: String,
    rid: &str,
) -> Result<(bool, bool), EngineError> {
    let (state, score): (Option<String>, Option<f64>) = redis::pipe()
        .atomic()
        .hget(hold, "state")
        .zscore(due, rid)
        .query_async(conn)
        .await?;
    let open = matches!(
        state.as_deref().and_then(HoldState::parse),
        Some(HoldState::Held | HoldState::Confirming)
    );
    Ok((open, score.is_some()))
}

/// Checks 3 and 4: holds against due sets, and carts.
async fn holds_and_due_sets(engine: &Engine, report: &mut VerifyReport) -> Result<(), EngineError> {
    let keys = engine.keyspace();
    let mut conn = engine.connection();
    let (mut unindexed, mut orphans, mut broken_carts, mut open) = (0u64, 0u64, 0u64, 0u64);
    let mut suspects = Vec::new();
    for shard in 0..keys.shards() {
        // Every hold of the shard (SCAN: an operator's check, never on the hot path).
        let pattern = keys.hold(shard, "*");
        let mut cursor = 0u64;
        let mut held: HashMap<String, (String, String)> = HashMap::new();
        loop {
            // On the master serving this shard's slot (on a cluster, SCAN
            // sees one node's keys).
            let (next, batch): (u64, Vec<String>) = conn
                .query_at(
                    &pattern,
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(&pattern)
                        .arg("COUNT")
                        .arg(1_000),
                )
                .await?;
            if !batch.is_empty() {
                let mut pipe = redis::pipe();
                for key in &batch {
                    pipe.cmd("HMGET").arg(key).arg(&["state", "parts"]);
                }
                let rows: Vec<(Option<String>, Option<String>)> =
                    pipe.query_async(&mut conn).await?;
                let prefix = keys.hold(shard, "");
                for (key, (state, parts)) in batch.iter().zip(rows) {
                    let rid = key.strip_prefix(&prefix).unwrap_or(key).to_owned();
                    held.insert(rid, (state.unwrap_or_default(), parts.unwrap_or_default()));
                }
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        let due: Vec<String> = redis::cmd("ZRANGE")
            .arg(keys.due(shard))
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await?;
        let due_set: std::collections::HashSet<&String> = due.iter().collect();
        for (rid, (state, parts)) in &held {
            let live = matches!(
                HoldState::parse(state),
                Some(HoldState::Held | HoldState::Confirming)
            );
            if live {
                open += 1;
                if !due_set.contains(rid) {
                    suspects.push(rid.clone());
                }
            }
            if live && !parts.is_empty() {
                // Every listed part exists, in the same or a deciding state.
                for other in parts.split(',').filter_map(|p| p.parse::<u16>().ok()) {
                    if other == shard {
                        continue;
                    }
                    let agrees = |mine: Option<HoldState>, theirs: Option<String>| {
                        // Held or deciding parts agree; a part sold next to one
                        // still merely held (not being confirmed) is half a sale.
                        match theirs.as_deref().and_then(HoldState::parse) {
                            Some(HoldState::Held | HoldState::Confirming) => true,
                            Some(HoldState::Confirmed) => mine == Some(HoldState::Confirming),
                            _ => false,
                        }
                    };
                    let theirs = hold_state(&mut conn, keys.hold(other, rid)).await?;
                    if agrees(HoldState::parse(state), theirs) {
                        continue;
                    }
                    // Read again, this part first: a cart paid or ended between
                    // the scan and now has moved on, which is no fault.
                    let mine = hold_state(&mut conn, keys.hold(shard, rid)).await?;
                    let mine = mine.as_deref().and_then(HoldState::parse);
                    let theirs = hold_state(&mut conn, keys.hold(other, rid)).await?;
                    let still_open = matches!(mine, Some(HoldState::Held | HoldState::Confirming));
                    if still_open && !agrees(mine, theirs) {
                        broken_carts += 1;
                    }
                }
            }
        }
        for rid in &due {
            let live = held.get(rid).is_some_and(|(s, _)| {
                matches!(
                    HoldState::parse(s),
                    Some(HoldState::Held | HoldState::Confirming)
                )
            });
            if !live {
                suspects.push(rid.clone());
            }
        }
        // The holds and the due set were read at different moments, during a
        // sale: a hold paid or made between the two reads looks unindexed or
        // orphaned. Each suspect is read again, hold and due entry at once (one
        // slot, one transaction), and only a disagreement that stands counts.
        for rid in suspects.drain(..) {
            match hold_and_due(&mut conn, keys.hold(shard, &rid), keys.due(shard), &rid).await? {
                (true, false) => unindexed += 1,
                (false, true) => orphans += 1,
                _ => {}
            }
        }
    }
    report.check(
        "every open hold is due, every due entry is a hold",
        unindexed == 0 && orphans == 0,
        format!("{open} open hold(s); {unindexed} missing from a due set, {orphans} due entr(ies) without an open hold"),
    );
    report.check(
        "carts consistent across shards",
        broken_carts == 0,
        format!("{broken_carts} cart part(s) missing or disagreeing"),
    );
    Ok(())
}

/// A SKU's recorded totals (none for a SKU only the ledger names) and the
/// ledger's: sold, fed, and its row count.
type LedgerTotals = (String, Option<i64>, Option<i64>, i64, i64, i64);

/// Check 5: the ledger explains `sold_recorded` and `fed_recorded`, and
/// every row of it and every order line belongs to a SKU (and an order).
async fn ledger_agrees(pg: &PgPool, report: &mut VerifyReport) -> Result<(), EngineError> {
    // One pass over the ledger, the largest table: its totals per SKU, joined
    // both ways with `skus`, so a SKU whose totals differ and a ledger row of
    // no known SKU (the tables' writers keep that, not foreign keys, which cost
    // a query per row on the write-behind's path; see migrations/0016) come
    // from the same scan.
    let rows: Vec<LedgerTotals> = sqlx::query_as(
        "WITH l AS (
              SELECT sku, count(*) AS n,
                     coalesce(sum(-qty) FILTER (WHERE kind = 'sale'), 0)::bigint AS sold,
                     coalesce(sum(qty) FILTER (WHERE kind IN ('receipt', 'adjustment')), 0)::bigint AS fed
                FROM ledger GROUP BY sku)
         SELECT coalesce(s.sku, l.sku), s.sold_recorded, s.fed_recorded,
                coalesce(l.sold, 0), coalesce(l.fed, 0), coalesce(l.n, 0)
           FROM skus s FULL JOIN l ON l.sku = s.sku
          WHERE s.sku IS NULL
             OR s.sold_recorded <> coalesce(l.sold, 0)
             OR s.fed_recorded <> coalesce(l.fed, 0)",
    )
    .fetch_all(pg)
    .await?;
    let mut differ = 0usize;
    let mut ledger = 0i64;
    for (sku, sold, fed, ledger_sold, ledger_fed, n) in &rows {
        let (Some(sold), Some(fed)) = (sold, fed) else {
            ledger += n;
            continue;
        };
        differ += 1;
        report.skus.push(SkuViolation {
            sku: sku.clone(),
            check: "ledger and on_hand agree".into(),
            figures: format!(
                "sold_recorded {sold} vs ledger sales {ledger_sold}; fed_recorded {fed} vs ledger feeds {ledger_fed}"
            ),
        });
    }
    report.check(
        "ledger and on_hand agree",
        differ == 0,
        format!("{differ} SKU(s) whose recorded totals differ from the ledger"),
    );
    let lines: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM order_lines o
          WHERE NOT EXISTS (SELECT 1 FROM skus s WHERE s.sku = o.sku)
             OR NOT EXISTS (SELECT 1 FROM orders r WHERE r.reservation_id = o.reservation_id)",
    )
    .fetch_one(pg)
    .await?;
    report.check(
        "every ledger row and order line has its SKU and order",
        ledger == 0 && lines == 0,
        format!(
            "{ledger} ledger row(s) of no known SKU, {lines} order line(s) of no known SKU or order"
        ),
    );
    Ok(())
}

/// Checks 6 and 7: the write-behind's lag, and nothing trimmed that a group needs.
async fn streams(
    engine: &Engine,
    options: &VerifyOptions,
    report: &mut VerifyReport,
) -> Result<(), EngineError> {
    let lag = engine.write_behind_lag().await?;
    report.check(
        "no event waits for PostgreSQL too long",
        lag.oldest_ms <= options.max_lag.as_millis() as u64,
        format!(
            "{} event(s) not yet in PostgreSQL, the oldest {} ms (limit {} ms)",
            lag.entries,
            lag.oldest_ms,
            options.max_lag.as_millis()
        ),
    );
    let keys = engine.keyspace();
    let mut conn = engine.connection();
    let mut missing = 0u64;
    for key in keys.all_events() {
        let groups: redis::RedisResult<Vec<HashMap<String, redis::Value>>> = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(&key)
            .query_async(&mut conn)
            .await;
        for g in groups.unwrap_or_default() {
            let Some(name) = g
                .get("name")
                .and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
            else {
                continue;
            };
            let pending: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
                .arg(&key)
                .arg(&name)
                .arg("-")
                .arg("+")
                .arg(100)
                .query_async(&mut conn)
                .await?;
            for (id, ..) in pending {
                let entry: Vec<(String, redis::Value)> = redis::cmd("XRANGE")
                    .arg(&key)
                    .arg(&id)
                    .arg(&id)
                    .query_async(&mut conn)
                    .await?;
                if entry.is_empty() {
                    missing += 1;
                }
            }
        }
    }
    report.check(
        "streams not trimmed past any group",
        missing == 0,
        format!("{missing} pending entr(ies) gone from their stream"),
    );
    Ok(())
}
