//! Write-behind: the event streams into PostgreSQL, exactly once in effect.
//!
//! A consumer group reads every shard's stream. Each batch (bounded by size and
//! time) is applied in one transaction of set-based statements whose inserts are
//! idempotent (`ON CONFLICT DO NOTHING`, the ledger unique per source and event
//! id); only after the commit are the sales settled in Redis (`settle.lua`, once
//! per line) and the entries acknowledged. A consumer that dies between commit and
//! acknowledgement leaves its entries pending: they are read again (by itself, or
//! reclaimed by another with `XAUTOCLAIM`) and change nothing the second time.
//! While PostgreSQL is down, entries wait in the stream and the worker backs off.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tracing::Instrument;

use crate::redis_conn::{AutoClaimed, Entry, RedisConn};
use redis::Value;
use serde::Serialize;
use sqlx::PgPool;

use crate::engine::Engine;
use crate::error::EngineError;
use crate::events::{Event, EventKind};
use crate::redis_conn;

/// The consumer group every write-behind process joins.
pub const GROUP: &str = "holdfast-record";

/// Write-behind parts per process unless configured ([`WriteBehindConfig::workers`]):
/// on two cores two parts drained sales fastest, and more took CPU from checkout
/// (BENCHMARKS.md, the run of 23:56 UTC).
pub const DEFAULT_WORKERS: usize = 2;

/// How the write-behind batches and recovers.
#[derive(Debug, Clone)]
pub struct WriteBehindConfig {
    /// This consumer's name, unique per process ([`crate::redis_conn::consumer_name`]).
    pub consumer: String,
    /// Most entries per shard per read.
    pub batch_max: usize,
    /// Workers recording side by side in one process, each owning the shards
    /// whose number modulo `workers` is its own (see [`WriteBehind::part`]).
    /// One worker waits in turn on Redis and PostgreSQL; several keep both
    /// busy. Shards hold disjoint SKUs, so no two workers lock the same SKU's
    /// row (a cart over shards has its order row written by each; inserts of it
    /// are idempotent and made in reservation-id order). Each holds a PostgreSQL
    /// connection while it records a batch.
    pub workers: usize,
    /// How long a read waits for new entries.
    pub block: Duration,
    /// Shortest time from one batch's read to the next while there is no
    /// backlog: a batch that did not fill (`batch_max` on no shard) is followed
    /// by a wait until this much has passed since its read began, so what
    /// arrives meanwhile is recorded together. Without it, a steady trickle of
    /// checkouts made a transaction (and a commit's flush) and two stream reads
    /// per handful of events, CPU taken from checkout on the same machine. A
    /// full batch goes on at once; the first event after a quiet spell is
    /// recorded at once (the read blocks for it). Zero: never wait.
    pub gather: Duration,
    /// Entries pending this long on any consumer are taken over: longer than a
    /// healthy batch ever takes, so a live consumer is never robbed.
    pub claim_idle: Duration,
    /// How long acknowledged entries stay in the streams (for dashboards that
    /// reconnect with a cursor) before they are trimmed; never trimmed sooner
    /// than every consumer group has acknowledged them.
    pub retain: Duration,
    /// Longest pause between retries while PostgreSQL or Redis fails.
    pub max_backoff: Duration,
    /// Fault injection for tests: fail at this point of every batch, as a crash
    /// there would. Only compiled with the `testkit` feature.
    #[cfg(feature = "testkit")]
    pub fault: Option<Fault>,
}

/// Where a batch can be made to fail, to prove recovery is exactly-once (the
/// injection itself exists only with the `testkit` feature).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// After the PostgreSQL commit, before settling in Redis.
    AfterCommit,
    /// After settling, before acknowledging the entries.
    BeforeAck,
}

/// The default [`WriteBehindConfig::gather`]: a fiftieth of the lag budget
/// (under a second at 10,000 sales a second), and at 5,000 events a second
/// about fifty events a transaction per part instead of a handful.
pub const DEFAULT_GATHER: Duration = Duration::from_millis(20);

impl Default for WriteBehindConfig {
    fn default() -> Self {
        Self {
            consumer: redis_conn::consumer_name("record"),
            batch_max: 2_000,
            workers: DEFAULT_WORKERS,
            block: Duration::from_millis(200),
            gather: DEFAULT_GATHER,
            claim_idle: Duration::from_secs(30),
            retain: Duration::from_secs(60),
            max_backoff: Duration::from_secs(5),
            #[cfg(feature = "testkit")]
            fault: None,
        }
    }
}

/// Counters and health of this process's write-behind.
#[derive(Debug, Default)]
pub struct WriteBehindStats {
    /// Entries committed to PostgreSQL and acknowledged.
    pub events: AtomicU64,
    /// Transactions committed.
    pub batches: AtomicU64,
    /// Sales recorded (ledger rows of kind `sale` inserted by this process).
    pub sales: AtomicU64,
    /// Failed attempts (the batch was retried).
    pub failures: AtomicU64,
    /// Each part's last failure, cleared by that part's next successful batch
    /// (one slot per part: a healthy part must not hide a failing one).
    pub last_error: Mutex<BTreeMap<usize, String>>,
    /// Entries that came back without their fields (trimmed or corrupted before
    /// PostgreSQL had them): each is an alarm and asks for a reconciliation.
    pub lost_entries: AtomicU64,
    /// Entries trimmed from the streams after every group acknowledged them.
    pub trimmed: AtomicU64,
    /// Entries PostgreSQL refused as data (not as an outage): set aside in
    /// [`PARKED_KEY`] with the reason so they never stop the others; each is an
    /// alarm and asks for a reconciliation.
    pub parked: AtomicU64,
    /// Set when something only a reconciliation can repair was seen; the
    /// scheduler runs one at once and clears it.
    pub reconcile_requested: std::sync::atomic::AtomicBool,
}

impl WriteBehindStats {
    /// A failure, if any part's most recent attempt failed.
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .next()
            .cloned()
    }

    /// Records part `part`'s outcome: its failure, or `None` after a success.
    fn set_error(&self, part: usize, e: Option<String>) {
        let mut slots = self
            .last_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match e {
            Some(e) => slots.insert(part, e),
            None => slots.remove(&part),
        };
    }
}

/// How far PostgreSQL is behind Redis.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Lag {
    /// Entries not yet delivered to the group plus those delivered but unacknowledged.
    pub entries: u64,
    /// Age of the oldest such entry, in milliseconds (0 when none).
    pub oldest_ms: u64,
}

/// What one batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchReport {
    /// Stream entries in the batch.
    pub entries: usize,
    /// Sales newly recorded.
    pub sales: u64,
    /// Other movements newly recorded.
    pub movements: u64,
    /// A shard gave as many entries as a read takes (`batch_max`): more may
    /// be waiting.
    pub full: bool,
}

/// One shard's entries of a batch.
struct ShardBatch {
    shard: u16,
    ids: Vec<String>,
    events: Vec<Event>,
}

/// The write-behind worker for one process.
pub struct WriteBehind {
    engine: Engine,
    pg: PgPool,
    conn: RedisConn,
    config: WriteBehindConfig,
    stats: Arc<WriteBehindStats>,
    groups_ready: bool,
    /// The shards this worker reads (every shard unless it is one [`part`](Self::part)).
    shards: Vec<u16>,
    /// Which part this worker is (0 unless made by [`part`](Self::part)).
    part: usize,
}

impl WriteBehind {
    /// A worker reading every shard with `conn` (give it its own: reads block)
    /// into `pg`.
    pub fn new(
        engine: Engine,
        pg: PgPool,
        conn: RedisConn,
        config: WriteBehindConfig,
        stats: Arc<WriteBehindStats>,
    ) -> Self {
        let shards = (0..engine.keyspace().shards()).collect();
        Self {
            engine,
            pg,
            conn,
            config,
            stats,
            groups_ready: false,
            shards,
            part: 0,
        }
    }

    /// This worker as part `part` of `of` running side by side: it reads only
    /// the shards whose number modulo `of` is `part`, under a consumer name of
    /// its own (`<consumer>.<part>`), and only part 0 trims the streams. Its
    /// pending entries are re-read by the same part after a failure; entries a
    /// part left pending when the process died (or the count changed) are
    /// taken over like any dead consumer's (see [`WriteBehindConfig::claim_idle`]).
    pub fn part(mut self, part: usize, of: usize) -> Self {
        let of = of.max(1);
        if of > 1 {
            self.shards.retain(|s| usize::from(*s) % of == part);
            self.config.consumer = format!("{}.{part}", self.config.consumer);
        }
        self.part = part;
        self
    }

    /// Event streams of this worker's shards, in `shards` order.
    fn stream_keys(&self) -> Vec<String> {
        let ks = self.engine.keyspace();
        self.shards.iter().map(|&s| ks.events(s)).collect()
    }

    /// Creates the consumer group on the streams of this worker's shards
    /// (idempotent; a worker made by [`WriteBehind::new`] has every shard).
    pub async fn ensure_groups(&mut self) -> Result<(), EngineError> {
        for key in self.stream_keys() {
            redis_conn::ensure_group(&mut self.conn, &key, GROUP).await?;
        }
        self.groups_ready = true;
        Ok(())
    }

    /// Creates the groups unless they were made since the last failure: a Redis
    /// that restarted empty needs them again, a healthy one does not.
    async fn ready(&mut self) -> Result<(), EngineError> {
        if self.groups_ready {
            Ok(())
        } else {
            self.ensure_groups().await
        }
    }

    /// Reads and applies one batch: this consumer's own pending entries first (a
    /// batch that failed before), then new ones. Returns what it applied.
    pub async fn run_once(&mut self) -> Result<BatchReport, EngineError> {
        if self.shards.is_empty() {
            // A part beyond the shard count: nothing is ever its own.
            tokio::time::sleep(self.config.block).await;
            return Ok(BatchReport::default());
        }
        self.ready().await?;
        let mut batches = self.read(false).await?;
        if batches.iter().all(|b| b.ids.is_empty()) {
            batches = self.read(true).await?;
        }
        self.apply(batches).await
    }

    /// Takes over entries left pending by dead consumers and applies them.
    pub async fn reclaim_once(&mut self) -> Result<BatchReport, EngineError> {
        self.ready().await?;
        let mut batches = Vec::new();
        for (shard, key) in self.shards.clone().into_iter().zip(self.stream_keys()) {
            self.engine
                .forget_idle_consumers(
                    &key,
                    GROUP,
                    redis_conn::FORGET_CONSUMERS_AFTER,
                    &self.config.consumer,
                )
                .await?;
            let reply: AutoClaimed = redis::cmd("XAUTOCLAIM")
                .arg(&key)
                .arg(GROUP)
                .arg(&self.config.consumer)
                .arg(self.config.claim_idle.as_millis() as u64)
                .arg("0-0")
                .arg("COUNT")
                .arg(self.config.batch_max)
                .query_async(&mut self.conn)
                .await?;
            let mut batch = ShardBatch {
                shard,
                ids: Vec::new(),
                events: Vec::new(),
            };
            for entry in reply.claimed {
                self.take(&mut batch, entry);
            }
            // Ids XAUTOCLAIM found pending but gone from the stream (trimmed).
            for id in reply.deleted {
                self.lost(shard, &id);
            }
            batches.push(batch);
        }
        self.apply(batches).await
    }

    async fn read(&mut self, new: bool) -> Result<Vec<ShardBatch>, EngineError> {
        let keys = self.stream_keys();
        let ids = vec![if new { ">" } else { "0" }.to_owned(); keys.len()];
        let mut head = redis::cmd("XREADGROUP");
        head.arg("GROUP")
            .arg(GROUP)
            .arg(&self.config.consumer)
            .arg("COUNT")
            .arg(self.config.batch_max);
        let block = new.then_some(self.config.block);
        let streams = self.conn.read_streams(&head, &keys, &ids, block).await?;
        let mut batches = Vec::new();
        for stream in streams {
            let Some(at) = keys.iter().position(|k| *k == stream.key) else {
                continue;
            };
            let shard = self.shards[at];
            let mut batch = ShardBatch {
                shard,
                ids: Vec::new(),
                events: Vec::new(),
            };
            for entry in stream.entries {
                self.take(&mut batch, entry);
            }
            batches.push(batch);
        }
        Ok(batches)
    }

    /// Adds `entry` to `batch`: its id (acknowledged with the batch) and its
    /// event, or, when it holds none, counts it lost.
    fn take(&self, batch: &mut ShardBatch, entry: Entry) {
        match Event::from_entry(entry.id.clone(), batch.shard, entry.fields) {
            Some(event) => batch.events.push(event),
            None => self.lost(batch.shard, &entry.id),
        }
        batch.ids.push(entry.id);
    }

    /// An entry that came back empty: it was trimmed (or corrupted) before
    /// PostgreSQL had it, so whatever it recorded is missing there. Never silent:
    /// counted, logged as an error, and a reconciliation is asked for (it measures
    /// the difference and repairs what it safely can). The entry is still
    /// acknowledged with its batch: there is nothing left in it to apply.
    fn lost(&self, shard: u16, id: &str) {
        self.stats.lost_entries.fetch_add(1, Ordering::Relaxed);
        self.stats
            .reconcile_requested
            .store(true, Ordering::Relaxed);
        tracing::error!(
            shard, entry = %id,
            "an event came back empty: it was trimmed or corrupted before PostgreSQL recorded it; \
             reconciliation requested"
        );
    }

    /// Fails as a crash at `at` would, when the test configuration asks for it.
    #[cfg(feature = "testkit")]
    fn inject(&self, at: Fault) -> Result<(), EngineError> {
        if self.config.fault == Some(at) {
            return Err(EngineError::UnexpectedReply(format!(
                "injected fault ({at:?})"
            )));
        }
        Ok(())
    }

    /// Without the `testkit` feature nothing is ever injected.
    #[cfg(not(feature = "testkit"))]
    fn inject(&self, _at: Fault) -> Result<(), EngineError> {
        Ok(())
    }

    async fn apply(&mut self, batches: Vec<ShardBatch>) -> Result<BatchReport, EngineError> {
        let entries: usize = batches.iter().map(|b| b.ids.len()).sum();
        if entries == 0 {
            return Ok(BatchReport::default());
        }
        let all: Vec<&Event> = batches.iter().flat_map(|b| &b.events).collect();
        let (report, events) = match record_events(&self.engine, &self.pg, &all, &batches).await {
            Ok(report) => (report, all),
            // One entry PostgreSQL refuses as data would fail every retry of
            // the batch and stop all recording: find it, set it aside, and
            // record the rest.
            Err(e) if e.refused_input() => self.record_around(&all, &batches).await?,
            Err(e) => return Err(e),
        };
        let full = batches.iter().any(|b| b.ids.len() >= self.config.batch_max);
        let report = BatchReport {
            entries,
            full,
            ..report
        };
        self.inject(Fault::AfterCommit)?;
        self.settle(&events).await?;
        self.inject(Fault::BeforeAck)?;
        // Every shard's acknowledgement in one pipeline (one round trip on a
        // single node, one per master on a cluster).
        let mut acks = redis::pipe();
        for batch in batches.iter().filter(|b| !b.ids.is_empty()) {
            acks.cmd("XACK")
                .arg(self.engine.keyspace().events(batch.shard))
                .arg(GROUP)
                .arg(&batch.ids)
                .ignore();
        }
        acks.query_async::<()>(&mut self.conn).await?;
        self.stats
            .events
            .fetch_add(entries as u64, Ordering::Relaxed);
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        self.stats.sales.fetch_add(report.sales, Ordering::Relaxed);
        Ok(report)
    }

    /// Records `events` one by one after their batch was refused as data:
    /// those PostgreSQL refuses again are parked (see [`PARKED_KEY`]); returns
    /// the report of the rest and the events recorded (only those are settled:
    /// a parked sale stays `sold_pending`, visible to `holdfast verify`).
    async fn record_around<'e>(
        &mut self,
        events: &[&'e Event],
        batches: &[ShardBatch],
    ) -> Result<(BatchReport, Vec<&'e Event>), EngineError> {
        let mut total = BatchReport::default();
        let mut recorded = Vec::with_capacity(events.len());
        for event in events {
            match record_events(&self.engine, &self.pg, &[*event], &[]).await {
                Ok(r) => {
                    total.sales += r.sales;
                    total.movements += r.movements;
                    recorded.push(*event);
                }
                Err(e) if e.refused_input() => self.park(event, &e).await?,
                Err(e) => return Err(e),
            }
        }
        record_events(&self.engine, &self.pg, &[], batches).await?;
        Ok((total, recorded))
    }

    /// Sets `event` aside with why PostgreSQL refused it: counted, logged as
    /// an error, kept in [`PARKED_KEY`] for an operator, and a reconciliation
    /// is asked for (PostgreSQL misses what the event recorded).
    async fn park(&mut self, event: &Event, why: &EngineError) -> Result<(), EngineError> {
        self.stats.parked.fetch_add(1, Ordering::Relaxed);
        self.stats
            .reconcile_requested
            .store(true, Ordering::Relaxed);
        tracing::error!(
            shard = event.shard, entry = %event.id, sku = %event.sku, error = %why,
            "PostgreSQL refused an event as data; it was set aside so recording goes on"
        );
        redis::cmd("XADD")
            .arg(PARKED_KEY)
            .arg("*")
            .arg("shard")
            .arg(event.shard)
            .arg("entry")
            .arg(&event.id)
            .arg("event")
            .arg(serde_json::to_string(event).unwrap_or_default())
            .arg("reason")
            .arg(why.to_string())
            .query_async::<()>(&mut self.conn)
            .await?;
        Ok(())
    }

    /// Takes committed sales out of `sold_pending`, once per reservation line:
    /// each shard's lines in calls of at most [`SETTLE_LINES`], all in one
    /// pipeline.
    async fn settle(&mut self, events: &[&Event]) -> Result<(), EngineError> {
        let mut by_shard: BTreeMap<u16, Vec<&Event>> = BTreeMap::new();
        for e in events.iter().filter(|e| e.kind == EventKind::Confirmed) {
            by_shard.entry(e.shard).or_default().push(e);
        }
        if by_shard.is_empty() {
            return Ok(());
        }
        let script = &self.engine.scripts.settle;
        script.prepare_invoke().load_async(&mut self.conn).await?;
        let ks = self.engine.keyspace();
        let mut pipe = redis::pipe();
        for (shard, sales) in &by_shard {
            for chunk in sales.chunks(SETTLE_LINES) {
                let mut call = script.key(ks.events(*shard));
                for e in chunk {
                    let rid = e.reservation_id.as_deref().unwrap_or_default();
                    call.key(ks.hold(e.shard, rid))
                        .key(ks.sku(&e.sku))
                        .arg(rid)
                        .arg(&e.sku)
                        .arg(e.qty)
                        .arg(e.epoch.as_deref().unwrap_or_default());
                }
                pipe.invoke_script(&call);
            }
        }
        pipe.query_async::<Vec<Value>>(&mut self.conn).await?;
        Ok(())
    }
}

/// Most sale lines one `settle.lua` call takes: each line is a handful of
/// hash commands, so a call of this many blocks Redis for a fraction of a
/// millisecond, never long enough to hold a checkout call back noticeably.
const SETTLE_LINES: usize = 64;

/// What a batch records besides orders and the ledger: new holds (who and what,
/// for support should Redis lose them), snapshot versions (restored by warm-up),
/// how holds ended (for reports), and sales of units a feed had removed
/// (oversells to remediate).
#[derive(Default)]
struct SideRows {
    hold_rid: Vec<String>,
    hold_sku: Vec<String>,
    hold_qty: Vec<i64>,
    hold_buyer: Vec<Option<String>>,
    hold_at: Vec<chrono::DateTime<chrono::Utc>>,
    version_sku: Vec<String>,
    version: Vec<i64>,
    oversold_rid: Vec<String>,
    oversold_reason: Vec<String>,
    late_rid: Vec<String>,
    late_state: Vec<String>,
    end_rid: Vec<String>,
    end_sku: Vec<String>,
    end_state: Vec<&'static str>,
    end_at: Vec<chrono::DateTime<chrono::Utc>>,
    end_oversold: Vec<i64>,
    end_qty: Vec<i64>,
    end_buyer: Vec<Option<String>>,
    /// The holds and ends above, one row per hold line ([`SideRows::fold_lines`]).
    lines: HoldLines,
}

/// One `holds` row per hold line (an upsert may touch a row once) from a
/// batch's holds and ends: what the batch knows of the line's latest hold and
/// latest end, which is all the row is made of (see `record_side`).
#[derive(Default)]
struct HoldLines {
    rid: Vec<String>,
    sku: Vec<String>,
    qty: Vec<i64>,
    buyer: Vec<Option<String>>,
    /// Whether the batch has a hold of the line: `at` is then its creation;
    /// otherwise the line's end alone is known, and `at` is the end's time.
    held: Vec<bool>,
    at: Vec<chrono::DateTime<chrono::Utc>>,
    end_at: Vec<Option<chrono::DateTime<chrono::Utc>>>,
    end_state: Vec<Option<&'static str>>,
    oversold: Vec<i64>,
}

impl HoldLines {
    /// Adds a line's row.
    fn push(
        &mut self,
        (rid, sku): (&str, &str),
        qty: i64,
        buyer: Option<String>,
        held: bool,
        at: chrono::DateTime<chrono::Utc>,
        end: Option<(chrono::DateTime<chrono::Utc>, &'static str, i64)>,
    ) {
        self.rid.push(rid.to_owned());
        self.sku.push(sku.to_owned());
        self.qty.push(qty);
        self.buyer.push(buyer);
        self.held.push(held);
        self.at.push(at);
        self.end_at.push(end.map(|e| e.0));
        self.end_state.push(end.map(|e| e.1));
        self.oversold.push(end.map_or(0, |e| e.2));
    }
}

impl SideRows {
    /// Folds the batch's holds and ends into [`SideRows::lines`]: per hold
    /// line, its latest hold and its latest end (the later in stream order on
    /// a tie of time). An end at or after that hold is the hold's end, so the
    /// row is written once, already ended; an end before it belongs to an
    /// earlier hold of the id (the hold was made again after it ended) and
    /// can change nothing the later hold does not decide, so it is dropped.
    /// A line with an end and no hold in the batch is its end alone.
    fn fold_lines(&mut self) {
        let holds = latest_per_line(&self.hold_rid, &self.hold_sku, &self.hold_at);
        let ends = latest_per_line(&self.end_rid, &self.end_sku, &self.end_at);
        let mut lines = HoldLines::default();
        for (&key, &h) in &holds {
            let end = ends
                .get(&key)
                .filter(|&&e| self.end_at[e] >= self.hold_at[h])
                .map(|&e| (self.end_at[e], self.end_state[e], self.end_oversold[e]));
            let buyer = self.hold_buyer[h].clone();
            lines.push(key, self.hold_qty[h], buyer, true, self.hold_at[h], end);
        }
        for (&key, &e) in &ends {
            if !holds.contains_key(&key) {
                let end = (self.end_at[e], self.end_state[e], self.end_oversold[e]);
                let buyer = self.end_buyer[e].clone();
                lines.push(key, self.end_qty[e], buyer, false, end.0, Some(end));
            }
        }
        self.lines = lines;
    }
}

/// The index of each hold line's (reservation, SKU) latest row by time, the
/// later in stream order on a tie.
fn latest_per_line<'r>(
    rid: &'r [String],
    sku: &'r [String],
    at: &[chrono::DateTime<chrono::Utc>],
) -> BTreeMap<(&'r str, &'r str), usize> {
    let mut latest: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for i in 0..rid.len() {
        let row = latest.entry((&rid[i], &sku[i])).or_insert(i);
        if at[i] >= at[*row] {
            *row = i;
        }
    }
    latest
}

/// A batch's orders as columns, for one `UNNEST` insert each.
#[derive(Default)]
struct OrderRows {
    rid: Vec<String>,
    at: Vec<chrono::DateTime<chrono::Utc>>,
    line_rid: Vec<String>,
    line_sku: Vec<String>,
    line_qty: Vec<i64>,
}

/// A batch's ledger movements as columns: one row per sale line, receipt or
/// adjustment, unique per `(source, event_id)`.
#[derive(Default)]
struct LedgerRows {
    /// The SKU (PostgreSQL's; a split SKU's part is not a SKU there).
    sku: Vec<String>,
    /// The counter the movement moved: the SKU, or its part's name.
    counter: Vec<String>,
    kind: Vec<&'static str>,
    qty: Vec<i64>,
    source: Vec<String>,
    event_id: Vec<String>,
    rid: Vec<Option<String>>,
    /// The epoch of the counter each movement moved ('' for none).
    epoch: Vec<String>,
    /// A snapshot's version (-1 for other movements).
    version: Vec<i64>,
}

impl LedgerRows {
    /// Adds event `e`'s movement (its SKU and epoch are the row's).
    fn push(
        &mut self,
        e: &Event,
        kind: &'static str,
        qty: i64,
        source: String,
        event_id: String,
        rid: Option<String>,
    ) {
        self.epoch.push(e.epoch.clone().unwrap_or_default());
        self.version.push(e.version.unwrap_or(-1));
        self.sku.push(e.whole_sku().to_owned());
        self.counter.push(e.sku.clone());
        self.kind.push(kind);
        self.qty.push(qty);
        self.source.push(source);
        self.event_id.push(event_id);
        self.rid.push(rid);
    }
}

/// Splits `events` into the orders and ledger rows they record: a confirmed line
/// is an order line and a `sale` movement; a feed's non-zero change is a
/// `receipt` (a positive delta) or an `adjustment`.
fn rows_of(events: &[&Event]) -> (OrderRows, LedgerRows, SideRows) {
    let (mut orders, mut ledger, mut side) = (
        OrderRows::default(),
        LedgerRows::default(),
        SideRows::default(),
    );
    for e in events {
        let at = chrono::DateTime::from_timestamp_millis(e.at_ms).unwrap_or_default();
        if let (Some(units), Some(rid)) = (e.oversold, &e.reservation_id) {
            side.oversold_rid.push(rid.clone());
            side.oversold_reason.push(format!(
                "{units} unit(s) of {} sold that a feed had removed while they were held: \
                 the shopper paid for stock that does not exist; refund or source it",
                e.whole_sku()
            ));
        }
        match e.kind {
            EventKind::Reserved => {
                side.hold_rid
                    .push(e.reservation_id.clone().unwrap_or_default());
                side.hold_sku.push(e.whole_sku().to_owned());
                side.hold_qty.push(e.qty);
                side.hold_buyer.push(e.buyer.clone());
                side.hold_at.push(at);
            }
            EventKind::LatePayment => {
                side.late_rid
                    .push(e.reservation_id.clone().unwrap_or_default());
                side.late_state
                    .push(e.state.clone().unwrap_or_else(|| "expired".into()));
            }
            EventKind::Confirmed | EventKind::Released | EventKind::Expired => {
                side.end_rid
                    .push(e.reservation_id.clone().unwrap_or_default());
                side.end_sku.push(e.whole_sku().to_owned());
                side.end_state.push(match e.kind {
                    EventKind::Confirmed => "confirmed",
                    EventKind::Released => "released",
                    _ => "expired",
                });
                side.end_at.push(at);
                side.end_oversold.push(e.oversold.unwrap_or(0));
                side.end_qty.push(e.qty);
                side.end_buyer.push(e.buyer.clone());
            }
            EventKind::Snapshot if e.version.is_some() => {
                side.version_sku.push(e.whole_sku().to_owned());
                side.version.push(e.version.unwrap_or(-1));
            }
            _ => {}
        }
        match e.kind {
            EventKind::Confirmed => {
                let rid = e.reservation_id.clone().unwrap_or_default();
                orders.rid.push(rid.clone());
                orders
                    .at
                    .push(chrono::DateTime::from_timestamp_millis(e.at_ms).unwrap_or_default());
                orders.line_rid.push(rid.clone());
                orders.line_sku.push(e.whole_sku().to_owned());
                orders.line_qty.push(e.qty);
                let event_id = format!("{rid}:{}", e.whole_sku());
                ledger.push(
                    e,
                    "sale",
                    -e.qty,
                    "checkout".to_owned(),
                    event_id,
                    Some(rid),
                );
            }
            EventKind::Delta | EventKind::Snapshot if e.qty != 0 => {
                let kind = if e.kind == EventKind::Delta && e.qty > 0 {
                    "receipt"
                } else {
                    "adjustment"
                };
                let source = e.source.clone().unwrap_or_else(|| "feed".to_owned());
                let event_id = e
                    .event_id
                    .clone()
                    .unwrap_or_else(|| format!("{}:{}", e.shard, e.id));
                ledger.push(e, kind, e.qty, source, event_id, None);
            }
            _ => {}
        }
    }
    side.fold_lines();
    (orders, ledger, side)
}

/// Records new holds and how holds ended, raises snapshot versions and opens
/// oversell remediations.
async fn record_side(tx: &mut sqlx::PgConnection, side: &SideRows) -> Result<(), EngineError> {
    // Servers share a shard's events between their consumers, so a line's
    // events reach PostgreSQL in any order: an end before its hold (another
    // server's batch committed first), a batch taken over from a consumer
    // that died after its commit recorded again, a hold made again under its
    // id after it ended (a cart undone and made again, as a split SKU's
    // gathering does) before or after the earlier hold's end. So the row is
    // made of what does not depend on that order: the line's latest hold and
    // latest end seen (`held` says whether a hold was seen; without one,
    // `created_at` stands in with the end's time). The line is ended when its
    // latest end is at or after its latest hold (that end is the latest
    // hold's own: an earlier hold's end came before the hold made after it),
    // open otherwise. Each upsert keeps the later of the row's and the
    // batch's, so any order, split or repetition of the events gives the same
    // row. Redis' clock orders them, in milliseconds: a hold ended and made
    // again within one millisecond is recorded as ended. `hold_line_ended`
    // (migration 0019) is that rule, written once in SQL.
    let lines = &side.lines;
    if !lines.rid.is_empty() {
        sqlx::query(
            "INSERT INTO holds AS r (reservation_id, sku, qty, buyer, held, created_at, ended_at,
                                     end_state, oversold_units)
             SELECT rid, sku, qty, buyer, held, at, end_at, end_state, oversold
               FROM UNNEST($1::text[], $2::text[], $3::bigint[], $4::text[], $5::bool[],
                           $6::timestamptz[], $7::timestamptz[], $8::text[], $9::bigint[])
                    AS t(rid, sku, qty, buyer, held, at, end_at, end_state, oversold)
             ON CONFLICT (reservation_id, sku) DO UPDATE SET
                 held = r.held OR EXCLUDED.held,
                 -- The latest hold, or without one the latest end.
                 created_at = coalesce(
                     greatest(CASE WHEN r.held THEN r.created_at END,
                              CASE WHEN EXCLUDED.held THEN EXCLUDED.created_at END),
                     greatest(r.ended_at, EXCLUDED.ended_at)),
                 -- The latest end, if it is at or after the latest hold.
                 ended_at = CASE WHEN hold_line_ended(r.held, r.created_at, r.ended_at,
                                          EXCLUDED.held, EXCLUDED.created_at, EXCLUDED.ended_at)
                     THEN greatest(r.ended_at, EXCLUDED.ended_at) END,
                 -- The state of that end (the row's on a tie: the same end).
                 end_state = CASE WHEN hold_line_ended(r.held, r.created_at, r.ended_at,
                                          EXCLUDED.held, EXCLUDED.created_at, EXCLUDED.ended_at)
                     THEN CASE WHEN coalesce(EXCLUDED.ended_at > r.ended_at, r.ended_at IS NULL)
                               THEN EXCLUDED.end_state ELSE r.end_state END END,
                 oversold_units = CASE WHEN hold_line_ended(r.held, r.created_at, r.ended_at,
                                          EXCLUDED.held, EXCLUDED.created_at, EXCLUDED.ended_at)
                     THEN CASE WHEN coalesce(EXCLUDED.ended_at > r.ended_at, r.ended_at IS NULL)
                               THEN EXCLUDED.oversold_units ELSE r.oversold_units END
                     ELSE 0 END,
                 -- What was held: the latest hold's.
                 qty = CASE WHEN EXCLUDED.held
                                 AND (NOT r.held OR EXCLUDED.created_at >= r.created_at)
                            THEN EXCLUDED.qty ELSE r.qty END,
                 buyer = CASE WHEN EXCLUDED.held
                                   AND (NOT r.held OR EXCLUDED.created_at >= r.created_at)
                              THEN coalesce(EXCLUDED.buyer, r.buyer)
                              ELSE coalesce(r.buyer, EXCLUDED.buyer) END",
        )
        .bind(&lines.rid)
        .bind(&lines.sku)
        .bind(&lines.qty)
        .bind(&lines.buyer)
        .bind(&lines.held)
        .bind(&lines.at)
        .bind(&lines.end_at)
        .bind(&lines.end_state)
        .bind(&lines.oversold)
        .execute(&mut *tx)
        .await?;
    }
    if !side.version_sku.is_empty() {
        sqlx::query(
            "UPDATE skus s SET snapshot_version = greatest(s.snapshot_version, v.version)
               FROM (SELECT sku, max(version) AS version
                       FROM UNNEST($1::text[], $2::bigint[]) AS t(sku, version) GROUP BY sku) v
              WHERE s.sku = v.sku",
        )
        .bind(&side.version_sku)
        .bind(&side.version)
        .execute(&mut *tx)
        .await?;
    }
    if !side.late_rid.is_empty() {
        sqlx::query(
            "INSERT INTO remediations (reservation_id, hold_state, reason, kind)
             SELECT rid, state, 'payment confirmed after the hold ended; no stock was taken', 'late_payment'
               FROM UNNEST($1::text[], $2::text[]) AS t(rid, state)
             ON CONFLICT (reservation_id) DO NOTHING",
        )
        .bind(&side.late_rid)
        .bind(&side.late_state)
        .execute(&mut *tx)
        .await?;
    }
    if !side.oversold_rid.is_empty() {
        sqlx::query(
            "INSERT INTO remediations (reservation_id, hold_state, reason, kind)
             SELECT rid, 'confirmed', reason, 'oversold'
               FROM UNNEST($1::text[], $2::text[]) AS t(rid, reason)
             ON CONFLICT (reservation_id) DO NOTHING",
        )
        .bind(&side.oversold_rid)
        .bind(&side.oversold_reason)
        .execute(&mut *tx)
        .await?;
        tracing::warn!(
            reservations = side.oversold_rid.len(),
            "oversell remediations recorded: feeds lowered stock under holds that were then paid"
        );
    }
    Ok(())
}

/// Inserts `orders` and their lines (each once, whatever is retried).
async fn insert_orders(tx: &mut sqlx::PgConnection, orders: &OrderRows) -> Result<(), EngineError> {
    if orders.rid.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO orders (reservation_id, confirmed_at)
         SELECT DISTINCT ON (rid) rid, at FROM UNNEST($1::text[], $2::timestamptz[]) AS t(rid, at)
         ON CONFLICT (reservation_id) DO NOTHING",
    )
    .bind(&orders.rid)
    .bind(&orders.at)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO order_lines (reservation_id, sku, qty)
         SELECT t.rid, t.sku, t.qty FROM UNNEST($1::text[], $2::text[], $3::bigint[]) AS t(rid, sku, qty)
         JOIN skus s ON s.sku = t.sku
         ON CONFLICT (reservation_id, sku) DO NOTHING",
    )
    .bind(&orders.line_rid)
    .bind(&orders.line_sku)
    .bind(&orders.line_qty)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Inserts the `ledger` rows not recorded before and moves `on_hand` and
/// `sold_recorded` by exactly those; returns the indexes (in `ledger`) of the
/// rows it inserted. The SKUs' rows are locked first, in code order, so two
/// batches (or a batch and a warm-up) never wait on each other in a circle.
async fn insert_ledger(
    tx: &mut sqlx::PgConnection,
    ledger: &LedgerRows,
) -> Result<Vec<usize>, EngineError> {
    if ledger.sku.is_empty() {
        return Ok(Vec::new());
    }
    let mut skus: Vec<&String> = ledger.sku.iter().collect();
    skus.sort();
    skus.dedup();
    sqlx::query("SELECT 1 FROM skus WHERE sku = ANY($1) ORDER BY sku FOR NO KEY UPDATE")
        .bind(&skus)
        .execute(&mut *tx)
        .await?;
    let rows: Vec<(String, String)> = sqlx::query_as(
        "WITH ins AS (
             INSERT INTO ledger (sku, kind, qty, source, event_id, reservation_id)
             SELECT t.sku, t.kind, t.qty, t.src, t.eid, t.rid
               FROM UNNEST($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[])
                    AS t(sku, kind, qty, src, eid, rid)
               JOIN skus s ON s.sku = t.sku
             ON CONFLICT (source, event_id) DO NOTHING
             RETURNING sku, kind, qty, source, event_id
         ), moved AS (
             UPDATE skus s
                SET on_hand = s.on_hand + agg.qty,
                    sold_recorded = s.sold_recorded + agg.sold,
                    fed_recorded = s.fed_recorded + agg.fed,
                    updated_at = now()
               FROM (SELECT sku, sum(qty)::bigint AS qty,
                            sum(CASE WHEN kind = 'sale' THEN -qty ELSE 0 END)::bigint AS sold,
                            sum(CASE WHEN kind = 'sale' THEN 0 ELSE qty END)::bigint AS fed
                       FROM ins GROUP BY sku) agg
              WHERE s.sku = agg.sku
         )
         SELECT source, event_id FROM ins",
    )
    .bind(&ledger.sku)
    .bind(&ledger.kind)
    .bind(&ledger.qty)
    .bind(&ledger.source)
    .bind(&ledger.event_id)
    .bind(&ledger.rid)
    .fetch_all(&mut *tx)
    .await?;
    let inserted: std::collections::HashSet<(&str, &str)> =
        rows.iter().map(|(s, e)| (s.as_str(), e.as_str())).collect();
    Ok((0..ledger.sku.len())
        .filter(|&i| inserted.contains(&(ledger.source[i].as_str(), ledger.event_id[i].as_str())))
        .collect())
}

/// Applies to their counters the movements just inserted (`inserted`, indexes
/// in `ledger`) that are older than the counter: Redis lost its data while
/// they were on their way here and warm-up rebuilt the counter without them
/// (see `lua/late.lua`). Runs before the commit, while the SKUs' rows are
/// locked. Returns how many were applied.
async fn apply_late(
    engine: &Engine,
    ledger: &LedgerRows,
    inserted: &[usize],
) -> Result<u64, EngineError> {
    if inserted.is_empty() {
        return Ok(0);
    }
    let mut skus: Vec<&str> = inserted
        .iter()
        .map(|&i| ledger.counter[i].as_str())
        .collect();
    skus.sort_unstable();
    skus.dedup();
    let mut pipe = redis::pipe();
    for sku in &skus {
        pipe.cmd("HMGET")
            .arg(engine.keys.sku(sku))
            .arg(&["available", "epoch"]);
    }
    let mut conn = engine.conn.clone();
    let epochs: Vec<(Option<String>, Option<String>)> = pipe.query_async(&mut conn).await?;
    let current: BTreeMap<&str, String> = skus
        .iter()
        .zip(epochs)
        .filter_map(|(sku, (available, epoch))| {
            available.map(|_| (*sku, epoch.unwrap_or_default()))
        })
        .collect();
    let late: Vec<usize> = inserted
        .iter()
        .copied()
        .filter(|&i| {
            current
                .get(ledger.counter[i].as_str())
                .is_some_and(|epoch| *epoch != ledger.epoch[i])
        })
        .collect();
    if late.is_empty() {
        return Ok(0);
    }
    let script = &engine.scripts.late;
    script.prepare_invoke().load_async(&mut conn).await?;
    let ttl_ms = engine.config.guard_ttl.as_millis() as u64;
    let mut pipe = redis::pipe();
    for &i in &late {
        let sku = &ledger.counter[i];
        pipe.invoke_script(
            script
                .key(engine.keys.sku(sku))
                .key(engine.keys.events(engine.keys.shard_of(sku)))
                .key(
                    engine
                        .keys
                        .seen(sku, &ledger.source[i], &ledger.event_id[i]),
                )
                .arg(sku)
                .arg(ledger.qty[i])
                .arg(if ledger.kind[i] == "sale" {
                    "sale"
                } else {
                    "feed"
                })
                .arg(&ledger.epoch[i])
                .arg(ttl_ms)
                .arg(ledger.version[i]),
        );
    }
    let replies: Vec<Vec<Value>> = pipe.query_async(&mut conn).await?;
    let mut applied = 0;
    for (reply, &i) in replies.into_iter().zip(&late) {
        if crate::reply::Reply::new(reply).tag()? == "applied" {
            applied += 1;
            tracing::warn!(
                sku = %ledger.sku[i], kind = ledger.kind[i], qty = ledger.qty[i],
                "a movement older than its counter (Redis lost its data while it was being \
                 recorded) was applied to the rebuilt counter"
            );
        }
    }
    Ok(applied)
}

/// Records how far each shard's stream is written behind (its last entry id and
/// that entry's time), for lag figures.
async fn record_progress(
    tx: &mut sqlx::PgConnection,
    batches: &[ShardBatch],
) -> Result<(), EngineError> {
    let (mut shard, mut last_id, mut last_ms) = (Vec::new(), Vec::new(), Vec::new());
    for b in batches.iter().filter(|b| !b.ids.is_empty()) {
        let last = b.ids.last().cloned().unwrap_or_default();
        let ms: i64 = last
            .split('-')
            .next()
            .and_then(|m| m.parse().ok())
            .unwrap_or(0);
        shard.push(i32::from(b.shard));
        last_id.push(last);
        last_ms.push(ms);
    }
    sqlx::query(
        "INSERT INTO write_behind_progress (shard, last_event_id, last_event_ms, committed_at)
         SELECT * , now() FROM UNNEST($1::int[], $2::text[], $3::bigint[])
         ON CONFLICT (shard) DO UPDATE
            SET last_event_id = EXCLUDED.last_event_id, last_event_ms = EXCLUDED.last_event_ms,
                committed_at = now()",
    )
    .bind(&shard)
    .bind(&last_id)
    .bind(&last_ms)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Where events PostgreSQL refused as data are kept, with the reason.
pub const PARKED_KEY: &str = "hf:record:{parked}";

/// Applies `events` to PostgreSQL in one transaction (and to their counters
/// those older than the counter, see [`apply_late`]); returns the rows it added.
async fn record_events(
    engine: &Engine,
    pg: &PgPool,
    events: &[&Event],
    batches: &[ShardBatch],
) -> Result<BatchReport, EngineError> {
    let (orders, ledger, side) = rows_of(events);
    let mut tx = pg.begin().await?;
    insert_orders(&mut tx, &orders).await?;
    record_side(&mut tx, &side).await?;
    let inserted = insert_ledger(&mut tx, &ledger).await?;
    apply_late(engine, &ledger, &inserted).await?;
    let sales = inserted
        .iter()
        .filter(|&&i| ledger.kind[i] == "sale")
        .count() as u64;
    let movements = inserted.len() as u64 - sales;
    record_progress(&mut tx, batches).await?;
    tx.commit().await?;
    Ok(BatchReport {
        sales,
        movements,
        ..BatchReport::default()
    })
}

/// Runs the write-behind until `shutdown`, reclaiming dead consumers' entries every
/// `claim_idle`, and backing off (doubling up to `max_backoff`) while a backend fails.
pub async fn run_write_behind(mut worker: WriteBehind, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    let mut backoff = Duration::from_millis(100);
    let mut last_claim = Instant::now();
    let mut last_trim = Instant::now();
    let mut batches: u64 = 0;
    loop {
        batches += 1;
        let began = tokio::time::Instant::now();
        // Each batch in its own span, so its log lines (and traces) group.
        let step = async {
            if last_claim.elapsed() >= worker.config.claim_idle {
                last_claim = Instant::now();
                worker.reclaim_once().await?;
            }
            worker.run_once().await
        }
        .instrument(tracing::info_span!("write_behind_batch", batch = batches));
        let result = tokio::select! {
            () = &mut shutdown => break,
            r = step => r,
        };
        match result {
            Ok(report) => {
                worker.stats.set_error(worker.part, None);
                backoff = Duration::from_millis(100);
                if worker.part == 0 && last_trim.elapsed() >= Duration::from_secs(1) {
                    last_trim = Instant::now();
                    match worker.engine.trim_acknowledged(worker.config.retain).await {
                        Ok(n) => {
                            worker.stats.trimmed.fetch_add(n, Ordering::Relaxed);
                        }
                        Err(e) => tracing::debug!(error = %e, "trimming the event streams failed"),
                    }
                }
                if report.entries > 0 {
                    tracing::debug!(
                        entries = report.entries,
                        sales = report.sales,
                        "write-behind batch committed"
                    );
                }
                // No backlog: let the next batch gather (see `gather`).
                let gathered = crate::pace::gathered_until(
                    began,
                    worker.config.gather,
                    report.entries > 0,
                    report.full,
                );
                if let Some(until) = gathered {
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = tokio::time::sleep_until(until) => {}
                    }
                }
            }
            Err(e) => {
                // Redis may have restarted empty: make the groups again next time.
                worker.groups_ready = false;
                worker.stats.failures.fetch_add(1, Ordering::Relaxed);
                worker.stats.set_error(worker.part, Some(e.to_string()));
                tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "write-behind batch failed; events wait in the stream");
                tokio::select! {
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(worker.config.max_backoff);
            }
        }
    }
}

impl Engine {
    /// Deletes the consumers of `group` on `stream` that have nothing pending
    /// and have not read for `idle` (names left by processes that are gone),
    /// never `own`; returns how many went. One script checks and deletes, so
    /// no entry a consumer takes meanwhile is dropped with it.
    pub async fn forget_idle_consumers(
        &self,
        stream: &str,
        group: &str,
        idle: Duration,
        own: &str,
    ) -> Result<u64, EngineError> {
        Ok(self
            .scripts
            .forget_consumers
            .key(stream)
            .arg(group)
            .arg(idle.as_millis() as u64)
            .arg(own)
            .invoke_async(&mut self.conn.clone())
            .await?)
    }

    /// Trims each shard's event stream behind what every consumer group has
    /// acknowledged, keeping at least `retain` of history, and returns how many
    /// entries went. A stream without a group is left alone: nothing has read it,
    /// so nothing may go. Never a blind cap: while PostgreSQL is down the streams
    /// grow (see [`Engine::stream_entries`] and the documented memory budget).
    pub async fn trim_acknowledged(&self, retain: Duration) -> Result<u64, EngineError> {
        let mut conn = self.conn.clone();
        let keep_from_ms = chrono::Utc::now().timestamp_millis() - retain.as_millis() as i64;
        let mut trimmed = 0;
        for shard in 0..self.keys.shards() {
            let key = self.keys.events(shard);
            let Some(floor) = self.acknowledged_floor(&key).await? else {
                continue;
            };
            let floor = if id_ms(&floor) > keep_from_ms {
                format!("{}-0", keep_from_ms.max(0))
            } else {
                floor
            };
            let n: u64 = redis::cmd("XTRIM")
                .arg(&key)
                .arg("MINID")
                .arg("~")
                .arg(&floor)
                .query_async(&mut conn)
                .await?;
            trimmed += n;
        }
        Ok(trimmed)
    }

    /// The oldest id any consumer group of stream `key` still needs: the first
    /// entry pending on a consumer, else the entry after the last delivered.
    /// `None` when the stream has no group (or does not exist).
    async fn acknowledged_floor(&self, key: &str) -> Result<Option<String>, EngineError> {
        let mut conn = self.conn.clone();
        let groups: redis::RedisResult<Vec<BTreeMap<String, Value>>> = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(key)
            .query_async(&mut conn)
            .await;
        let Ok(groups) = groups else { return Ok(None) };
        let mut floor: Option<String> = None;
        for g in &groups {
            let text = |k: &str| {
                g.get(k)
                    .and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
            };
            let (Some(name), Some(delivered)) = (text("name"), text("last-delivered-id")) else {
                return Ok(None);
            };
            let pending: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
                .arg(key)
                .arg(&name)
                .arg("-")
                .arg("+")
                .arg(1)
                .query_async(&mut conn)
                .await?;
            // MINID keeps ids >= the floor: the first pending entry, or (all
            // acknowledged) the last delivered one, which is harmless to keep.
            let needed = pending.first().map_or(delivered, |(id, ..)| id.clone());
            floor = Some(match floor {
                Some(f) if id_before(&f, &needed) => f,
                _ => needed,
            });
        }
        Ok(floor)
    }

    /// Entries in every shard's event stream (acknowledged or not): the memory
    /// the streams hold, for the backlog metric.
    pub async fn stream_entries(&self) -> Result<u64, EngineError> {
        let mut pipe = redis::pipe();
        for key in self.keys.all_events() {
            pipe.cmd("XLEN").arg(key);
        }
        let lens: Vec<u64> = pipe.query_async(&mut self.conn.clone()).await?;
        Ok(lens.into_iter().sum())
    }

    /// How far the write-behind group is behind, over every shard.
    pub async fn write_behind_lag(&self) -> Result<Lag, EngineError> {
        let mut conn = self.conn.clone();
        let now_ms = chrono::Utc::now().timestamp_millis();
        let mut lag = Lag::default();
        for shard in 0..self.keys.shards() {
            let key = self.keys.events(shard);
            let groups: redis::RedisResult<Vec<BTreeMap<String, Value>>> = redis::cmd("XINFO")
                .arg("GROUPS")
                .arg(&key)
                .query_async(&mut conn)
                .await;
            let Ok(groups) = groups else { continue }; // no stream yet
            let Some(group) = groups.iter().find(|g| {
                g.get("name")
                    .and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
                    .as_deref()
                    == Some(GROUP)
            }) else {
                continue;
            };
            let int = |k: &str| {
                group
                    .get(k)
                    .and_then(|v| redis::from_redis_value_ref::<u64>(v).ok())
                    .unwrap_or(0)
            };
            lag.entries += int("pending") + int("lag");
            // The oldest unfinished entry: the first pending one, else the first undelivered.
            let last_delivered = group
                .get("last-delivered-id")
                .and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
                .unwrap_or_else(|| "0-0".into());
            let pending: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
                .arg(&key)
                .arg(GROUP)
                .arg("-")
                .arg("+")
                .arg(1)
                .query_async(&mut conn)
                .await?;
            let oldest = match pending.first() {
                Some((id, ..)) => Some(id.clone()),
                None if int("lag") > 0 => {
                    let next: Vec<(String, Value)> = redis::cmd("XRANGE")
                        .arg(&key)
                        .arg(format!("({last_delivered}"))
                        .arg("+")
                        .arg("COUNT")
                        .arg(1)
                        .query_async(&mut conn)
                        .await?;
                    next.into_iter().next().map(|(id, _)| id)
                }
                None => None,
            };
            if let Some(ms) =
                oldest.and_then(|id| id.split('-').next().and_then(|m| m.parse::<i64>().ok()))
            {
                lag.oldest_ms = lag.oldest_ms.max((now_ms - ms).max(0) as u64);
            }
        }
        Ok(lag)
    }
}

/// The milliseconds part of a stream id (`<ms>-<seq>`); 0 when malformed.
fn id_ms(id: &str) -> i64 {
    id.split('-')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0)
}

/// Whether stream id `a` comes before `b`.
fn id_before(a: &str, b: &str) -> bool {
    let parts = |id: &str| {
        let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
        (
            ms.parse::<u64>().unwrap_or(0),
            seq.parse::<u64>().unwrap_or(0),
        )
    };
    parts(a) < parts(b)
}

#[cfg(test)]
mod tests {
    #[test]
    fn stream_ids_order_numerically() {
        assert!(super::id_before("9-5", "10-0"));
        assert!(super::id_before("10-2", "10-10"));
        assert!(!super::id_before("10-10", "10-10"));
        assert_eq!(super::id_ms("1700000000000-3"), 1_700_000_000_000);
    }

    fn at(ms: i64) -> chrono::DateTime<chrono::Utc> {
        chrono::DateTime::from_timestamp_millis(ms).unwrap_or_default()
    }

    fn hold(side: &mut super::SideRows, rid: &str, ms: i64) {
        side.hold_rid.push(rid.into());
        side.hold_sku.push("S".into());
        side.hold_qty.push(1);
        side.hold_buyer.push(None);
        side.hold_at.push(at(ms));
    }

    fn end(side: &mut super::SideRows, rid: &str, state: &'static str, ms: i64) {
        side.end_rid.push(rid.into());
        side.end_sku.push("S".into());
        side.end_state.push(state);
        side.end_at.push(at(ms));
        side.end_oversold.push(0);
        side.end_qty.push(1);
        side.end_buyer.push(None);
    }

    /// One row per hold line; an end at or after the line's latest hold rides
    /// on that hold's row; an end before it (the hold made again after it)
    /// is dropped; an end whose hold is not in the batch is a row of its own.
    #[test]
    fn ends_fold_onto_their_hold_made_in_the_same_batch() {
        let mut side = super::SideRows::default();
        hold(&mut side, "paid", 1);
        end(&mut side, "paid", "confirmed", 1);
        hold(&mut side, "remade", 2);
        end(&mut side, "remade", "released", 3);
        hold(&mut side, "remade", 4);
        hold(&mut side, "open", 5);
        end(&mut side, "earlier", "expired", 6);
        hold(&mut side, "twice", 7);
        end(&mut side, "twice", "released", 8);
        end(&mut side, "twice", "confirmed", 8);
        side.fold_lines();

        let l = &side.lines;
        let mut rows: Vec<_> = (0..l.rid.len())
            .map(|i| {
                (
                    l.rid[i].as_str(),
                    l.held[i],
                    l.at[i].timestamp_millis(),
                    l.end_state[i],
                    l.end_at[i].map(|t| t.timestamp_millis()),
                )
            })
            .collect();
        rows.sort();
        assert_eq!(
            rows,
            [
                ("earlier", false, 6, Some("expired"), Some(6)),
                ("open", true, 5, None, None),
                ("paid", true, 1, Some("confirmed"), Some(1)),
                ("remade", true, 4, None, None),
                ("twice", true, 7, Some("confirmed"), Some(8)),
            ]
        );
        assert_eq!(l.qty.len(), 5);
        assert_eq!(l.oversold.len(), 5);
    }

    /// A line's event: `Some(state)` an end, `None` a hold; at `ms`, holding `qty`.
    type LineEvent = (Option<&'static str>, i64, i64);

    /// Records each batch of `events` (indexes into it, in stream order) in
    /// `order`, for reservation `rid`, each batch in a transaction of its own.
    async fn record_batches(
        pg: &sqlx::PgPool,
        rid: &str,
        events: &[LineEvent],
        batches: &[Vec<usize>],
    ) {
        for batch in batches {
            let mut side = super::SideRows::default();
            for &i in batch {
                match events[i] {
                    (None, ms, qty) => {
                        hold(&mut side, rid, ms);
                        *side.hold_qty.last_mut().unwrap() = qty;
                    }
                    (Some(state), ms, qty) => {
                        end(&mut side, rid, state, ms);
                        *side.end_qty.last_mut().unwrap() = qty;
                    }
                }
            }
            side.fold_lines();
            let mut tx = pg.begin().await.unwrap();
            super::record_side(&mut tx, &side).await.unwrap();
            tx.commit().await.unwrap();
        }
    }

    /// Every way to cut `n` events into batches (each batch in stream order,
    /// not necessarily neighbours: a batch taken over by `XAUTOCLAIM` skips
    /// entries pending elsewhere), in every order of commit.
    fn every_split_and_order(n: usize) -> Vec<Vec<Vec<usize>>> {
        fn partitions(n: usize) -> Vec<Vec<Vec<usize>>> {
            let mut all = vec![Vec::new()];
            for i in 0..n {
                let mut next = Vec::new();
                for p in &all {
                    for b in 0..p.len() {
                        let mut q: Vec<Vec<usize>> = p.clone();
                        q[b].push(i);
                        next.push(q);
                    }
                    let mut q = p.clone();
                    q.push(vec![i]);
                    next.push(q);
                }
                all = next;
            }
            all
        }
        fn orders(p: &[Vec<usize>]) -> Vec<Vec<Vec<usize>>> {
            if p.len() <= 1 {
                return vec![p.to_vec()];
            }
            let mut all = Vec::new();
            for first in 0..p.len() {
                let mut rest = p.to_vec();
                let head = rest.remove(first);
                for mut tail in orders(&rest) {
                    tail.insert(0, head.clone());
                    all.push(tail);
                }
            }
            all
        }
        partitions(n).iter().flat_map(|p| orders(p)).collect()
    }

    /// The row of `rid`: qty, whether held, created and ended (ms), end state.
    async fn line_row(
        pg: &sqlx::PgPool,
        rid: &str,
    ) -> (i64, bool, i64, Option<i64>, Option<String>) {
        let (qty, held, created, ended, state): (
            i64,
            bool,
            chrono::DateTime<chrono::Utc>,
            Option<chrono::DateTime<chrono::Utc>>,
            Option<String>,
        ) = sqlx::query_as(
            "SELECT qty, held, created_at, ended_at, end_state FROM holds
                  WHERE reservation_id = $1 AND sku = 'S'",
        )
        .bind(rid)
        .fetch_one(pg)
        .await
        .unwrap();
        (
            qty,
            held,
            created.timestamp_millis(),
            ended.map(|t| t.timestamp_millis()),
            state,
        )
    }

    /// A hold released and made again under its id, then paid: whatever the
    /// batches (any split, any order of commit, every batch recorded twice),
    /// the row is the later hold's, paid; without the payment, that hold's,
    /// open. The write-behind's consumers commit in any order, and a batch
    /// whose consumer died after its commit is recorded again.
    #[sqlx::test(migrator = "crate::postgres::MIGRATOR")]
    async fn a_hold_made_again_is_recorded_alike_in_any_order_and_split(pg: sqlx::PgPool) {
        let paid: [LineEvent; 4] = [
            (None, 100, 1),
            (Some("released"), 110, 1),
            (None, 120, 2),
            (Some("confirmed"), 130, 2),
        ];
        let cases = [
            (
                &paid[..],
                (2, true, 120, Some(130), Some("confirmed".to_owned())),
            ),
            (&paid[..3], (2, true, 120, None, None)),
            (
                &paid[..2],
                (1, true, 100, Some(110), Some("released".to_owned())),
            ),
        ];
        let mut runs = 0;
        for (n, (events, want)) in cases.iter().enumerate() {
            for (k, batches) in every_split_and_order(events.len()).iter().enumerate() {
                let rid = format!("r{n}-{k}");
                record_batches(&pg, &rid, events, batches).await;
                assert_eq!(&line_row(&pg, &rid).await, want, "{batches:?}");
                // Every batch again, in the same order: nothing changes.
                record_batches(&pg, &rid, events, batches).await;
                assert_eq!(&line_row(&pg, &rid).await, want, "{batches:?} twice");
                runs += 1;
            }
        }
        assert_eq!(runs, 75 + 13 + 3, "every split and order tried");
    }
}
