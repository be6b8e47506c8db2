//! Warm-up: rebuilding Redis counters from PostgreSQL, pipelined, in pages.
//!
//! A missing counter is rebuilt as `on_hand` less the units of any holds that
//! outlived it; an existing one is left alone unless forced, because a live
//! counter is the truth for open holds. Safe to run again and again.
//!
//! Every server watches for Redis losing its data ([`rewarm_after_loss`]) and
//! the first to see it warms everything again, so checkout comes back by itself.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use redis::Value;
use serde::Serialize;
use sqlx::PgPool;

use crate::engine::Engine;
use crate::error::EngineError;
use crate::keys::part_name;
use crate::reply::Reply;
use holdfast_domain::{Counters, Recorded};

/// How warm-up runs.
#[derive(Debug, Clone, Copy)]
pub struct WarmOptions {
    /// Rewrite `available` of existing counters too (from PostgreSQL and their live
    /// reserved, pending and settled figures).
    pub force: bool,
    /// SKUs per PostgreSQL page and Redis pipeline.
    pub page: usize,
}

impl Default for WarmOptions {
    fn default() -> Self {
        Self {
            force: false,
            page: 2_000,
        }
    }
}

/// Progress after each page.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WarmProgress {
    /// SKUs looked at so far.
    pub done: u64,
    /// SKUs in PostgreSQL when the run started.
    pub total: u64,
    /// Counters written so far.
    pub warmed: u64,
}

/// What a warm-up did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WarmReport {
    /// SKUs looked at.
    pub skus: u64,
    /// Counters written.
    pub warmed: u64,
    /// Counters that existed and were left alone.
    pub existing: u64,
    /// Feed event guards restored from the ledger (after a Redis loss).
    pub guards: u64,
    /// Wall time, milliseconds.
    pub elapsed_ms: u64,
}

/// One SKU row as warm-up and reconciliation read it.
#[derive(sqlx::FromRow)]
pub(crate) struct StockRow {
    pub(crate) sku: String,
    pub(crate) on_hand: i64,
    pub(crate) sold_recorded: i64,
    pub(crate) per_buyer_limit: Option<i32>,
    pub(crate) snapshot_version: i64,
    pub(crate) fed_recorded: i64,
    /// The drop schedule's start and end, Unix ms (0: none).
    pub(crate) opens_ms: i64,
    pub(crate) closes_ms: i64,
    /// How many parts its stock is split into in Redis ([`crate::split`]).
    pub(crate) parts: i16,
}

impl StockRow {
    /// The counter's `opens`, `closes` and `limit` as PostgreSQL has them
    /// (0 where unset), as `verify::read_settings` reads them from Redis.
    pub(crate) fn settings(&self) -> [i64; 3] {
        [
            self.opens_ms,
            self.closes_ms,
            i64::from(self.per_buyer_limit.unwrap_or(0)),
        ]
    }

    /// The parts PostgreSQL recorded (what a counter it rebuilds is split into).
    pub(crate) fn parts_recorded(&self) -> u16 {
        self.parts.clamp(1, crate::keys::MAX_PARTS as i16) as u16
    }

    /// What PostgreSQL has recorded for this SKU.
    pub(crate) fn recorded(&self) -> Recorded {
        Recorded {
            on_hand: self.on_hand,
            sold_recorded: self.sold_recorded,
            fed_recorded: self.fed_recorded,
        }
    }
}

/// The [`StockRow`]s of `skus s` that `filter` (a WHERE clause, and its order) picks.
fn stock_query(filter: &str) -> String {
    format!(
        "SELECT s.sku, s.on_hand, s.sold_recorded, s.per_buyer_limit, s.snapshot_version,
                s.fed_recorded, s.parts, {}
           FROM skus s {filter}",
        crate::schedule::WINDOW_COLUMNS
    )
}

/// One SKU's row; `None` when PostgreSQL does not know it.
pub(crate) async fn stock_row(pg: &PgPool, sku: &str) -> Result<Option<StockRow>, EngineError> {
    Ok(
        sqlx::query_as::<_, StockRow>(&stock_query("WHERE s.sku = $1"))
            .bind(sku)
            .fetch_optional(pg)
            .await?,
    )
}

/// The rows of `skus` PostgreSQL knows, in code order.
pub(crate) async fn stock_rows(pg: &PgPool, skus: &[String]) -> Result<Vec<StockRow>, EngineError> {
    Ok(
        sqlx::query_as::<_, StockRow>(&stock_query("WHERE s.sku = ANY($1) ORDER BY s.sku"))
            .bind(skus)
            .fetch_all(pg)
            .await?,
    )
}

/// The next page of SKUs after `after`, in code order (keyset paging).
pub(crate) async fn stock_page(
    pg: &PgPool,
    after: &str,
    page: usize,
) -> Result<Vec<StockRow>, EngineError> {
    Ok(
        sqlx::query_as::<_, StockRow>(&stock_query("WHERE s.sku > $1 ORDER BY s.sku LIMIT $2"))
            .bind(after)
            .bind(page as i64)
            .fetch_all(pg)
            .await?,
    )
}

/// The live counters of `skus`, in one pipelined round trip.
pub(crate) async fn read_counters(
    engine: &Engine,
    skus: &[&str],
) -> Result<Vec<Counters>, EngineError> {
    // Redis refuses an empty pipeline.
    if skus.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    for sku in skus {
        pipe.cmd("HMGET")
            .arg(engine.keys.sku(sku))
            .arg(&COUNTER_FIELDS);
    }
    let rows: Vec<Vec<Option<i64>>> = pipe.query_async(&mut engine.conn.clone()).await?;
    let mut counters: Vec<Counters> = rows.iter().map(|c| counters_of(c)).collect();
    // A split SKU's counters are its parts' together (part 0, read above,
    // says how many; feeds apply to part 0 alone, so `fed` is its own).
    // Every part read at one moment with no unit on its way (see
    // `Engine::read_at_rest`): a plain read of the parts one after another
    // counted a unit moving between two of them twice, or not at all, and
    // reconciliation corrected that "drift" away. A split SKU whose units
    // keep moving is not measured this time (as while its parts change).
    for (sku, c) in skus.iter().zip(counters.iter_mut()) {
        if c.available.is_none() || c.parts < 2 || c.changing {
            continue;
        }
        let read = engine.read_at_rest(sku, c.parts).await?;
        if read.rows.iter().any(Option::is_none) {
            // A part lost with its shard's data: the SKU is not warmed until
            // warm-up makes the part again with its share.
            c.available = None;
            continue;
        }
        if !read.exact {
            c.changing = true;
            continue;
        }
        let rows: Vec<_> = read.rows.into_iter().flatten().collect();
        *c = Counters {
            parts: c.parts,
            ..crate::split::whole_of(&rows)
        };
    }
    Ok(counters)
}

/// The fields [`read_counters`] reads of each counter, in [`counters_of`]'s order.
const COUNTER_FIELDS: [&str; 8] = [
    "available",
    "reserved",
    "sold_pending",
    "settled",
    "owed",
    "fed",
    "moving",
    "parts",
];

/// One counter's fields, in [`read_counters`]' order.
fn counters_of(c: &[Option<i64>]) -> Counters {
    let field = |i: usize| c.get(i).copied().flatten();
    Counters {
        available: field(0),
        reserved: field(1).unwrap_or(0),
        sold_pending: field(2).unwrap_or(0),
        settled: field(3).unwrap_or(0),
        owed: field(4).unwrap_or(0),
        fed: field(5).unwrap_or(0),
        moving: field(6).unwrap_or(0),
        parts: field(7)
            .unwrap_or(1)
            .clamp(1, i64::from(crate::keys::MAX_PARTS)) as u16,
        changing: field(7) == Some(0),
    }
}

/// Pages whose counters are being written while the next page is read,
/// during [`warm_all`].
///
/// Measured on two cores (a million SKUs): with one page written while the
/// next is read, Redis used about 70% of a core and PostgreSQL about half of
/// the other; each side waited on the other's round trips. More pages in
/// flight keep both busy; each holds a PostgreSQL connection (and its rows'
/// share lock) until its counters are written.
const WRITES_IN_FLIGHT: usize = 2;

/// Warms every SKU in PostgreSQL, calling `progress` after each page.
///
/// Pages are read one after the other (keyset paging), and up to
/// [`WRITES_IN_FLIGHT`] are written to Redis while the next is read (each
/// under its own transaction's share lock), so neither side waits for the
/// other. Pages hold disjoint SKUs, so their writes never meet. After a
/// failure no page is read, but every page being written finishes first: a
/// write is never cut off between sending its counters and releasing its
/// rows' lock.
pub async fn warm_all(
    engine: &Engine,
    pg: &PgPool,
    options: WarmOptions,
    mut progress: impl FnMut(WarmProgress),
) -> Result<WarmReport, EngineError> {
    use futures_util::StreamExt;
    let started = Instant::now();
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM skus")
        .fetch_one(pg)
        .await?;
    let mut report = WarmReport::default();
    let mut after = String::new();
    load_warm_script(engine).await?;
    let mut writing = futures_util::stream::FuturesUnordered::<Writing<'_>>::new();
    let mut failed: Option<EngineError> = None;
    let mut done = |report: &mut WarmReport,
                    failed: &mut Option<EngineError>,
                    written: Result<WarmReport, EngineError>| {
        match written {
            Ok(page) => {
                report.add(&page);
                progress(WarmProgress {
                    done: report.skus,
                    total: total as u64,
                    warmed: report.warmed,
                });
            }
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    };
    loop {
        // Writes finish while the page is read (and free their connections,
        // which the read may be waiting for).
        let next = {
            let read = read_page(pg, Pick::After(&after, options.page.max(1)));
            tokio::pin!(read);
            loop {
                tokio::select! {
                    page = &mut read => break page,
                    Some(written) = writing.next(), if !writing.is_empty() => {
                        done(&mut report, &mut failed, written);
                    }
                }
            }
        };
        let next = match next {
            Ok(page) => page,
            Err(e) => {
                done(&mut report, &mut failed, Err(e));
                break;
            }
        };
        // A page read while another's write failed is let go unwritten
        // (its transaction rolls back, releasing its rows).
        if failed.is_some() {
            break;
        }
        let Some(last) = next.rows.last() else { break };
        after = last.sku.clone();
        writing.push(Box::pin(next.write(engine, options)));
        while writing.len() > WRITES_IN_FLIGHT {
            if let Some(written) = writing.next().await {
                done(&mut report, &mut failed, written);
            }
        }
        if failed.is_some() {
            break;
        }
    }
    while let Some(written) = writing.next().await {
        done(&mut report, &mut failed, written);
    }
    if let Some(e) = failed {
        return Err(e);
    }
    report.elapsed_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

/// A page's counters being written (what it did, when done).
type Writing<'a> = Pin<Box<dyn Future<Output = Result<WarmReport, EngineError>> + Send + 'a>>;

/// Loads warm.lua, so a pipeline of EVALSHA finds it.
async fn load_warm_script(engine: &Engine) -> Result<(), EngineError> {
    engine
        .scripts
        .warm
        .prepare_invoke()
        .load_async(&mut engine.conn.clone())
        .await?;
    Ok(())
}

/// Warms the SKUs `skus` names (unknown ones are skipped), not forced: a
/// counter that exists is left alone.
pub async fn warm_list(
    engine: &Engine,
    pg: &PgPool,
    skus: &[String],
) -> Result<WarmReport, EngineError> {
    let started = Instant::now();
    let mut report = WarmReport::default();
    load_warm_script(engine).await?;
    for chunk in skus.chunks(2_000) {
        let page = read_page(pg, Pick::These(chunk)).await?;
        report.add(&page.write(engine, WarmOptions::default()).await?);
    }
    report.elapsed_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

/// Which SKUs a page of warm-up reads.
enum Pick<'a> {
    /// The next SKUs after this code, at most this many.
    After(&'a str, usize),
    /// These SKUs (unknown ones are skipped).
    These(&'a [String]),
}

impl WarmReport {
    /// Adds what one page did.
    fn add(&mut self, page: &WarmReport) {
        self.skus += page.skus;
        self.warmed += page.warmed;
        self.existing += page.existing;
        self.guards += page.guards;
    }
}

/// A page of rows read for warm-up, under a share lock held by its
/// transaction until [`Page::write`] has written their counters.
///
/// The write-behind records a movement only while it holds the row (checking
/// the counter's epoch, see `lua/late.lua`): a counter is built either from a
/// row that has the movement or before the movement is recorded (which then
/// applies it), never from a row it is changing.
struct Page {
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    rows: Vec<StockRow>,
}

/// Reads the page `pick` names, locking its rows.
async fn read_page(pg: &PgPool, pick: Pick<'_>) -> Result<Page, EngineError> {
    let mut tx = pg.begin().await?;
    let rows: Vec<StockRow> = match pick {
        Pick::After(after, page) => {
            sqlx::query_as(&stock_query(
                "WHERE s.sku > $1 ORDER BY s.sku LIMIT $2 FOR SHARE OF s",
            ))
            .bind(after)
            .bind(page as i64)
            .fetch_all(&mut *tx)
            .await?
        }
        Pick::These(skus) => {
            sqlx::query_as(&stock_query(
                "WHERE s.sku = ANY($1) ORDER BY s.sku FOR SHARE OF s",
            ))
            .bind(skus)
            .fetch_all(&mut *tx)
            .await?
        }
    };
    Ok(Page { tx, rows })
}

impl Page {
    /// Writes the counters of the page's rows (missing ones, or all when
    /// forced), then lets the rows go; what it did.
    async fn write(self, engine: &Engine, options: WarmOptions) -> Result<WarmReport, EngineError> {
        let Page { mut tx, rows } = self;
        let mut report = WarmReport::default();
        let script = &engine.scripts.warm;
        let skus: Vec<&str> = rows.iter().map(|r| r.sku.as_str()).collect();
        let current = read_counters(engine, &skus).await?;
        // Each missing SKU with the parts PostgreSQL recorded for it (what
        // it is rebuilt with), for its buyers' counts.
        let missing_parts: Vec<(&str, u16)> = rows
            .iter()
            .zip(&current)
            .filter(|(_, c)| c.available.is_none())
            .map(|(row, _)| (row.sku.as_str(), row.parts_recorded()))
            .collect();
        let missing: Vec<&str> = missing_parts.iter().map(|(sku, _)| *sku).collect();
        if !missing.is_empty() {
            // Counters are missing: Redis lost its data (or never had them), and
            // with it the guards that stop a redelivered feed event applying
            // twice. The ledger knows which events were applied to these SKUs;
            // each gets its guard back (for the rest of its day) before the
            // counter is written, so no redelivery slips in. The rows are locked,
            // so the ledger cannot gain one of theirs meanwhile.
            report.guards += restore_guards(engine, &mut tx, &missing).await?;
            // The per-buyer counters went with them: what each buyer bought
            // (PostgreSQL's confirmed holds) counts against the limit again.
            restore_buyers(engine, &mut tx, &missing_parts, None).await?;
        }
        let orphans = open_holds(engine, &rows, &current).await?;
        // One warm.lua call per shard for the page's SKUs in it: fewer script
        // calls for Redis to enter (measured no faster on two cores, where
        // PostgreSQL's share was what mattered; see BENCHMARKS.md).
        let mut calls: BTreeMap<u16, redis::ScriptInvocation<'_>> = BTreeMap::new();
        let mut split = Vec::new();
        for ((row, cur), open) in rows.iter().zip(&current).zip(&orphans) {
            // A split SKU (as its live counter says, else as PostgreSQL
            // recorded): part 0 is written here, the others stand.
            if cur.changing {
                // Its parts are being changed: its stock is on its way between
                // parts, and the change warms nothing; left as it is.
                report.existing += 1;
                continue;
            }
            let parts = if cur.available.is_some() {
                cur.parts
            } else {
                row.parts_recorded()
            };
            if parts > 1 {
                split.push((row.sku.as_str(), parts, row.recorded()));
            }
            // A forced warm-up computes `available` inside warm.lua from the live
            // figures it reads there, so a reservation in between cannot be lost.
            let orphaned = match cur.available {
                Some(_) if !options.force => {
                    report.existing += 1;
                    continue;
                }
                Some(_) => 0,
                None if *open > 0 => orphaned_units(engine, &row.sku).await?,
                None => 0,
            };
            // Part 0 gets what the other parts do not hold, and the sales
            // they did not settle.
            let (held, settled) = if parts > 1 {
                engine.warm_share(&row.sku, parts).await?
            } else {
                (0, 0)
            };
            let shard = engine.keys.shard_of(&row.sku);
            calls
                .entry(shard)
                .or_insert_with(|| {
                    let mut call = script.prepare_invoke();
                    call.key(engine.keys.events(shard));
                    call
                })
                .key(engine.keys.sku(&row.sku))
                .arg(&row.sku)
                .arg(row.on_hand - held)
                .arg(orphaned)
                .arg(row.sold_recorded - settled)
                .arg(row.per_buyer_limit.unwrap_or(0))
                .arg(if options.force { "1" } else { "0" })
                .arg(row.snapshot_version)
                .arg(row.fed_recorded)
                .arg(row.opens_ms)
                .arg(row.closes_ms);
        }
        if !calls.is_empty() {
            let mut pipe = redis::pipe();
            for call in calls.values() {
                pipe.invoke_script(call);
            }
            let replies: Vec<Vec<Vec<Value>>> = pipe.query_async(&mut engine.conn.clone()).await?;
            for reply in replies.into_iter().flatten() {
                match Reply::new(reply).tag()?.as_str() {
                    "warmed" => report.warmed += 1,
                    _ => report.existing += 1,
                }
            }
        }
        for (sku, parts, recorded) in split {
            engine.keep_parts(&mut tx, sku, parts, &recorded).await?;
        }
        tx.commit().await?;
        report.skus += rows.len() as u64;
        Ok(report)
    }
}

/// Sets the per-buyer counter of every buyer who bought units of `skus`
/// within the counter's lifetime, limit or not (Redis counts every named
/// buyer, so a limit set later counts what they bought before it; PostgreSQL's
/// confirmed holds; open holds
/// went with Redis' data and their units are on sale again), for the rest of
/// that lifetime; a counter that still exists is left as it is.
///
/// Each count goes to the buyer's part of its SKU (split into the parts given
/// with it), as reservations route the buyer; with `only_part`, only the
/// counts of that part (one part lost with its shard's data).
pub(crate) async fn restore_buyers(
    engine: &Engine,
    pg: &mut sqlx::PgConnection,
    skus: &[(&str, u16)],
    only_part: Option<u16>,
) -> Result<(), EngineError> {
    let parts_of: std::collections::HashMap<&str, u16> = skus.iter().copied().collect();
    let skus: Vec<&str> = skus.iter().map(|(sku, _)| *sku).collect();
    let ttl_ms = engine.config.buyer_ttl.as_millis() as i64;
    let rows: Vec<(String, String, i64, i64)> = sqlx::query_as(
        "SELECT h.sku, h.buyer, sum(h.qty)::bigint,
                $2 - (extract(epoch FROM now() - max(h.created_at)) * 1000)::bigint AS left_ms
           FROM holds h
          WHERE h.sku = ANY($1) AND h.buyer IS NOT NULL
            AND h.buyer <> '' AND h.end_state = 'confirmed'
            AND h.created_at > now() - make_interval(secs => $2 / 1000.0)
          GROUP BY h.sku, h.buyer",
    )
    .bind(&skus)
    .bind(ttl_ms)
    .fetch_all(&mut *pg)
    .await?;
    // Only the buyers of the part being made, when one is: there may be none
    // (and Redis refuses an empty pipeline).
    let counts: Vec<(String, i64, i64)> = rows
        .into_iter()
        .filter_map(|(sku, buyer, units, left_ms)| {
            let parts = parts_of.get(sku.as_str()).copied().unwrap_or(1);
            let part = crate::split::part_for(&buyer, parts);
            (only_part.is_none_or(|only| only == part)).then(|| {
                let key = engine.keys.buyer(&part_name(&sku, part, parts), &buyer);
                (key, units, left_ms.max(1))
            })
        })
        .collect();
    for chunk in counts.chunks(1_000) {
        let mut pipe = redis::pipe();
        for (key, units, left_ms) in chunk {
            pipe.cmd("SET")
                .arg(key)
                .arg(units)
                .arg("NX")
                .arg("PX")
                .arg(left_ms)
                .ignore();
        }
        pipe.query_async::<()>(&mut engine.conn.clone()).await?;
    }
    Ok(())
}

/// Sets the event guard of every feed event the ledger recorded for `skus`
/// within the guard's lifetime (those already guarded are left as they are);
/// returns how many were restored.
async fn restore_guards(
    engine: &Engine,
    pg: &mut sqlx::PgConnection,
    skus: &[&str],
) -> Result<u64, EngineError> {
    let ttl_ms = engine.config.guard_ttl.as_millis() as i64;
    let mut after = 0i64;
    let mut restored = 0;
    loop {
        let rows: Vec<(i64, String, String, String, i64)> = sqlx::query_as(
            "SELECT id, sku, source, event_id,
                    $2 - (extract(epoch FROM now() - created_at) * 1000)::bigint AS left_ms
               FROM ledger
              WHERE kind IN ('receipt', 'adjustment') AND id > $1 AND sku = ANY($3)
                AND created_at > now() - make_interval(secs => $2 / 1000.0)
              ORDER BY id LIMIT 1000",
        )
        .bind(after)
        .bind(ttl_ms)
        .bind(skus)
        .fetch_all(&mut *pg)
        .await?;
        let Some(last) = rows.last() else { break };
        after = last.0;
        let mut pipe = redis::pipe();
        for (_, sku, source, event_id, left_ms) in &rows {
            pipe.cmd("SET")
                .arg(engine.keys.seen(sku, source, event_id))
                .arg("1")
                .arg("NX")
                .arg("PX")
                .arg((*left_ms).max(1))
                .ignore();
        }
        pipe.query_async::<()>(&mut engine.conn.clone()).await?;
        restored += rows.len() as u64;
    }
    Ok(restored)
}

/// Open holds per row whose counter is missing (0 for rows with a counter), in
/// one pipelined round trip: normally all 0, as a Redis that lost its counters
/// lost its holds too.
async fn open_holds(
    engine: &Engine,
    rows: &[StockRow],
    current: &[Counters],
) -> Result<Vec<u64>, EngineError> {
    let mut pipe = redis::pipe();
    let mut asked = Vec::new();
    for (i, (row, cur)) in rows.iter().zip(current).enumerate() {
        if cur.available.is_none() {
            pipe.cmd("ZCARD").arg(engine.keys.sku_holds(&row.sku));
            asked.push(i);
        }
    }
    let mut open = vec![0; rows.len()];
    if asked.is_empty() {
        return Ok(open);
    }
    let counts: Vec<u64> = pipe.query_async(&mut engine.conn.clone()).await?;
    for (i, n) in asked.into_iter().zip(counts) {
        open[i] = n;
    }
    Ok(open)
}

/// Units held by the open holds on `sku` (whose counter is missing).
async fn orphaned_units(engine: &Engine, sku: &str) -> Result<i64, EngineError> {
    let holds = engine.holds_of(sku, 100_000).await?;
    Ok(holds
        .iter()
        .flat_map(|h| &h.lines)
        .filter(|l| l.sku == sku)
        .map(|l| l.qty)
        .sum())
}

/// Watches for Redis losing its data, by a mark in every shard
/// ([`crate::keys::Keyspace::mark`]) that lives as long as that shard's data:
/// `seen` is the marks this caller saw last (`None` before its first look).
/// One mark per shard, because on a cluster each master can lose its data
/// alone (restarted empty, with no replica to take over).
///
/// The first look only notes the marks (setting any that are missing: a
/// Redis that was empty before this process, or lost its data before it
/// started, is warmed by `serve --demo` or `holdfast warm`). After that, a mark
/// that is gone, or is not the one seen (another process set a new one after a
/// loss, perhaps on its own first look, without warming), means that shard
/// lost its data: new marks are set first, then every SKU is warmed (each
/// server that sees it does: warming is idempotent, and the shards that kept
/// their data are left as they are), and only then are the marks taken as
/// seen. A loss during the warm-up removes a new mark, and a warm-up cut short
/// by an error leaves `seen` as it was: either way the next look warms again.
pub async fn rewarm_after_loss(
    engine: &Engine,
    pg: &PgPool,
    seen: &mut Option<String>,
) -> Result<Option<WarmReport>, EngineError> {
    let mut conn = engine.connection();
    let keys = engine.keyspace();
    let marks: Vec<String> = (0..keys.shards()).map(|s| keys.mark(s)).collect();
    let read = |conn: &mut crate::redis_conn::RedisConn| {
        let mut pipe = redis::pipe();
        for mark in &marks {
            pipe.cmd("GET").arg(mark);
        }
        let mut conn = conn.clone();
        async move { pipe.query_async::<Vec<Option<String>>>(&mut conn).await }
    };
    let mut found = read(&mut conn).await?;
    let joined = |found: &[Option<String>]| -> Option<String> {
        found
            .iter()
            .cloned()
            .collect::<Option<Vec<String>>>()
            .map(|all| all.join(","))
    };
    let mut current = joined(&found);
    if current.is_some() && (seen.is_none() || current == *seen) {
        *seen = current;
        return Ok(None);
    }
    if current.is_none() {
        let t: (String, String) = redis::cmd("TIME").query_async(&mut conn).await?;
        let generation = format!("{}.{}", t.0, t.1);
        let mut pipe = redis::pipe();
        for (mark, had) in marks.iter().zip(&found) {
            if had.is_none() {
                pipe.cmd("SET")
                    .arg(mark)
                    .arg(&generation)
                    .arg("NX")
                    .ignore();
            }
        }
        pipe.query_async::<()>(&mut conn).await?;
        found = read(&mut conn).await?;
        current = joined(&found);
        if current.is_none() {
            // Lost again at once: the next look starts over.
            return Ok(None);
        }
        if seen.is_none() {
            *seen = current;
            return Ok(None);
        }
    }
    tracing::error!("Redis lost data (a shard's mark is gone or new): warming every counter again");
    // Holds remembered from before the loss may since have been made again
    // under their ids by other requests: look them up from now on.
    engine.forget_known_holds();
    let report = warm_all(engine, pg, WarmOptions::default(), |_| {}).await?;
    *seen = current;
    Ok(Some(report))
}
