//! Ingestion lanes: signed webhooks land in a Redis Stream per lane (`orders` for
//! marketplace order webhooks, `feeds` for bulk supplier and ERP syncs), and each
//! lane has its own consumers, concurrency and rate, so a huge catalogue sync
//! cannot slow checkout: events are applied a few at a time at the lane's pace,
//! and the feeds lane slows further while checkout is busy ([`crate::pace`]).
//! A lane can be paused (bulk feeds during a drop); a lane
//! over its cap refuses new payloads instead of growing without bound. Events are
//! applied once per source and event id (the Lua guards); payloads and events that
//! cannot be applied go to a dead-letter stream with the reason, and can be replayed.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tracing::Instrument;

use crate::redis_conn::{AutoClaimed, Entry, RedisConn, StreamReads};
use redis::Value;
use serde::Serialize;

use crate::engine::Engine;
use crate::error::EngineError;
use crate::keys::Keyspace;
use crate::pace::{Pacer, Yield};
use crate::payload::{self, Change, FeedEvent};
use crate::redis_conn;
use crate::stock::{DeltaOutcome, SnapshotOutcome};

/// The consumer group of every lane.
pub const GROUP: &str = "holdfast-ingest";
pub use holdfast_domain::lane::{Lane, LaneState, LaneStatus};

/// The stream of lane `lane`.
pub fn lane_key(lane: Lane) -> String {
    format!("hf:ingest:{{{lane}}}")
}

fn paused_key(lane: Lane) -> String {
    format!("hf:ingest:{{{lane}}}:paused")
}

/// The payload bytes waiting on `lane` (kept by `lua/enqueue.lua` and the consumers).
fn bytes_key(lane: Lane) -> String {
    format!("hf:ingest:{{{lane}}}:bytes")
}

/// `lua/enqueue.lua`: a lane's intake, capped in payloads and bytes.
static ENQUEUE: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(include_str!("../../lua/enqueue.lua")));

/// Attempts a payload that fails on its own data (or crashes its consumer)
/// gets before it is dead-lettered; an outage is retried without counting.
pub const MAX_ATTEMPTS: u32 = 3;

/// Source names that are not webhook sources: the ledger records sales,
/// corrections and feeds under them, and a webhook source of the same name
/// would share their `(source, event_id)` space.
pub const RESERVED_SOURCES: &[&str] = &[
    "checkout",
    "reconcile",
    "feed",
    "warm",
    "manual",
    "dashboard",
    "cli",
    "holdfast",
];

/// Whether `name` may name a webhook source: 1 to 40 of `a-z 0-9 _ -`, not
/// reserved.
pub fn check_source_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > 40
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
    {
        return Err("a source name is 1 to 40 of a-z, 0-9, '_' and '-'".into());
    }
    if RESERVED_SOURCES.contains(&name) {
        return Err(format!(
            "'{name}' is reserved (the ledger uses it for its own entries)"
        ));
    }
    Ok(())
}

/// The dead-letter stream.
pub const DEAD_KEY: &str = "hf:ingest:{dead}";

/// How one lane runs.
#[derive(Debug, Clone)]
pub struct LaneConfig {
    /// Which lane.
    pub name: Lane,
    /// Most payloads waiting before new ones are refused.
    pub cap: u64,
    /// Most payload bytes waiting before new ones are refused.
    pub cap_bytes: u64,
    /// Consumer tasks.
    pub concurrency: usize,
    /// Most events applied per second by the whole lane (0: unlimited).
    pub rate_per_sec: u32,
    /// Whether and how the lane gives way to this process's checkout
    /// ([`crate::pace`]); `None`: it keeps its rate whatever checkout does.
    pub yields: Option<Yield>,
    /// Payloads read per consumer per call.
    pub batch: usize,
    /// Payloads pending this long on another consumer are taken over (it died
    /// after the sender was answered 202).
    pub claim_idle: Duration,
}

impl LaneConfig {
    /// One consumer's share of the lane's rates (each of `concurrency`
    /// consumers paces itself; 0 stays unlimited).
    fn pace_share(&self) -> u32 {
        if self.rate_per_sec == 0 {
            0
        } else {
            (self.rate_per_sec / self.concurrency.max(1) as u32).max(1)
        }
    }

    /// [`LaneConfig::yields`] with its rate shared among the consumers.
    fn yield_share(&self) -> Option<Yield> {
        self.yields.map(|y| Yield {
            rate: (y.rate / self.concurrency.max(1) as u32).max(1),
            ..y
        })
    }

    /// The defaults for lane `name`: orders are small and urgent, feeds big and patient.
    pub fn default_for(name: Lane) -> Self {
        match name {
            Lane::Orders => Self {
                name,
                cap: 100_000,
                cap_bytes: 64 * 1024 * 1024,
                concurrency: 2,
                rate_per_sec: 0,
                yields: None,
                batch: 50,
                claim_idle: CLAIM_IDLE,
            },
            Lane::Feeds => Self {
                name,
                cap: 20_000,
                cap_bytes: 256 * 1024 * 1024,
                concurrency: 1,
                rate_per_sec: 5_000,
                yields: Some(FEEDS_YIELD),
                // Feed payloads are big (up to 10,000 events, megabytes): one
                // at a time, so a read never carries tens of megabytes and a
                // consumer holds no more than the payload it works on.
                batch: 1,
                claim_idle: CLAIM_IDLE,
            },
        }
    }
}

/// How the `feeds` lane gives way to checkout by default: above 100 checkout
/// calls a second on this process, it applies at most 500 events a second (a
/// 10,000-line sync then takes 20 s instead of 2 s, and checkout keeps its CPU).
pub const FEEDS_YIELD: Yield = Yield {
    above: 100,
    rate: 500,
};

/// The answer to a payload offered to a lane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Intake {
    /// Appended; the id is the stream entry id.
    Accepted(String),
    /// The lane is at its cap of payloads or bytes: retry later.
    Full {
        /// Payloads waiting.
        backlog: u64,
        /// Payload bytes waiting.
        bytes: u64,
    },
}

/// A lane's caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Most payloads waiting.
    pub payloads: u64,
    /// Most payload bytes waiting.
    pub bytes: u64,
}

/// Appends a raw payload from `source` to `lane`, unless the lane is at one of
/// its `caps`.
pub async fn enqueue(
    conn: &mut RedisConn,
    lane: Lane,
    source: &str,
    body: &[u8],
    caps: Caps,
) -> Result<Intake, EngineError> {
    let reply: Value = ENQUEUE
        .key(lane_key(lane))
        .key(bytes_key(lane))
        .arg(caps.payloads)
        .arg(caps.bytes)
        .arg(source)
        .arg(body)
        .invoke_async(conn)
        .await?;
    let fields: Vec<Value> = redis::from_redis_value(reply)
        .map_err(|e| EngineError::UnexpectedReply(format!("enqueue: {e}")))?;
    let text = |v: &Value| redis::from_redis_value_ref::<String>(v).ok();
    let int = |v: Option<&Value>| {
        v.and_then(|v| redis::from_redis_value_ref::<u64>(v).ok())
            .unwrap_or(0)
    };
    match fields.first().and_then(text).as_deref() {
        Some("ok") => fields
            .get(1)
            .and_then(text)
            .map(Intake::Accepted)
            .ok_or_else(|| EngineError::UnexpectedReply("enqueue: no id".into())),
        Some("full") => Ok(Intake::Full {
            backlog: int(fields.get(1)),
            bytes: int(fields.get(2)),
        }),
        other => Err(EngineError::UnexpectedReply(format!(
            "enqueue answered {other:?}"
        ))),
    }
}

/// Payload bytes waiting on `lane`.
pub async fn lane_bytes(conn: &mut RedisConn, lane: Lane) -> Result<u64, EngineError> {
    let n: Option<i64> = redis::cmd("GET")
        .arg(bytes_key(lane))
        .query_async(conn)
        .await?;
    Ok(n.unwrap_or(0).max(0).unsigned_abs())
}

/// Stops `lane`'s consumers (payloads still queue, up to the cap).
pub async fn pause(conn: &mut RedisConn, lane: Lane) -> Result<(), EngineError> {
    Ok(redis::cmd("SET")
        .arg(paused_key(lane))
        .arg("1")
        .query_async(conn)
        .await?)
}

/// Lets `lane`'s consumers run again.
pub async fn resume(conn: &mut RedisConn, lane: Lane) -> Result<(), EngineError> {
    Ok(redis::cmd("DEL")
        .arg(paused_key(lane))
        .query_async(conn)
        .await?)
}

/// The state of `lane`.
pub async fn status(conn: &mut RedisConn, lane: Lane) -> Result<LaneStatus, EngineError> {
    let (backlog, paused): (u64, bool) = redis::pipe()
        .cmd("XLEN")
        .arg(lane_key(lane))
        .cmd("EXISTS")
        .arg(paused_key(lane))
        .query_async(conn)
        .await?;
    // XPENDING fails before the group exists (no consumer has started): nothing is pending.
    let pending: redis::RedisResult<Vec<Value>> = redis::cmd("XPENDING")
        .arg(lane_key(lane))
        .arg(GROUP)
        .query_async(conn)
        .await;
    let pending = pending
        .ok()
        .and_then(|v| {
            v.first()
                .and_then(|c| redis::from_redis_value_ref::<u64>(c).ok())
        })
        .unwrap_or(0);
    Ok(LaneStatus {
        lane,
        backlog,
        pending,
        state: if paused {
            LaneState::Paused
        } else {
            LaneState::Running
        },
    })
}

/// The state of every lane, in [`Lane::ALL`] order.
pub async fn statuses(conn: &mut RedisConn) -> Result<Vec<LaneStatus>, EngineError> {
    let mut out = Vec::with_capacity(Lane::ALL.len());
    for lane in Lane::ALL {
        out.push(status(conn, lane).await?);
    }
    Ok(out)
}

/// A payload or event that could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetter {
    /// Its id in the dead-letter stream.
    pub id: String,
    /// The lane it came through.
    pub lane: String,
    /// The source that sent it.
    pub source: String,
    /// The payload (for a single refused event of a batch, that event alone).
    pub body: String,
    /// Why it was not applied.
    pub reason: String,
}

/// Most dead letters kept (the oldest go first).
const DEAD_LETTERS_KEPT: u64 = 100_000;

/// Memory the dead letters may take in Redis before a large payload is kept
/// cut short: a sender whose payloads all fail (2 MiB each, up to the
/// webhook rate) would otherwise fill Redis, which evicts nothing, and
/// checkout's writes would fail.
pub const DEAD_STORE_BYTES: u64 = 256 * 1024 * 1024;

/// What is kept of a payload buried while the store is at [`DEAD_STORE_BYTES`]:
/// small enough that [`DEAD_LETTERS_KEPT`] cut letters stay under it.
pub const DEAD_BODY_KEPT_WHEN_FULL: usize = 1024;

/// How long a consumer uses its count of the dead letters' size (adding what
/// it buried since) before counting again: a count visits every node of the
/// stream, and one whose entries are each over Redis' node size has a node
/// per entry.
const DEAD_RECOUNT_EVERY: Duration = Duration::from_secs(5);

/// Appends a dead letter: `body` whole, or (`cut`) its first
/// [`DEAD_BODY_KEPT_WHEN_FULL`] bytes, with its length and why it was cut.
async fn bury(conn: &mut RedisConn, letter: Letter<'_>, cut: bool) -> Result<(), EngineError> {
    let Letter {
        lane,
        source,
        body,
        reason,
    } = letter;
    let mut cmd = redis::cmd("XADD");
    cmd.arg(DEAD_KEY)
        .arg("MAXLEN")
        .arg("~")
        .arg(DEAD_LETTERS_KEPT)
        .arg("*")
        .arg("lane")
        .arg(lane.as_str())
        .arg("source")
        .arg(source);
    if cut && body.len() > DEAD_BODY_KEPT_WHEN_FULL {
        let mut end = DEAD_BODY_KEPT_WHEN_FULL;
        while !body.is_char_boundary(end) {
            end -= 1;
        }
        tracing::warn!(
            source,
            bytes = body.len(),
            "the dead-letter store is at its cap: a payload was kept cut short"
        );
        cmd.arg("body").arg(&body[..end]).arg("cut").arg(body.len()).arg("reason").arg(format!(
            "{reason} (kept cut short: the dead letters hold {} MiB, so only the first {} bytes of \
             this {}-byte payload were kept; it cannot be replayed, ask its sender to send it again)",
            DEAD_STORE_BYTES >> 20,
            end,
            body.len()
        ));
    } else {
        cmd.arg("body").arg(body).arg("reason").arg(reason);
    }
    cmd.query_async::<()>(conn).await?;
    Ok(())
}

/// A dead letter to append: where it came from, what, and why.
#[derive(Clone, Copy)]
struct Letter<'a> {
    lane: Lane,
    source: &'a str,
    body: &'a str,
    reason: &'a str,
}

/// What the dead letters take in Redis now, counted over every entry
/// (`SAMPLES 0`: Redis' default estimate reads five entries and scales them,
/// which misjudges a stream of mixed sizes a hundredfold either way). It
/// visits every node of the stream (up to one per entry), so a consumer
/// counts at most every [`DEAD_RECOUNT_EVERY`]. A Redis whose ACL refuses
/// `MEMORY`, or that does not know it, counts as empty: payloads are kept
/// whole, as before there was a cap.
async fn dead_store_bytes(conn: &mut RedisConn) -> Result<u64, EngineError> {
    let counted: Result<Option<u64>, _> = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(DEAD_KEY)
        .arg("SAMPLES")
        .arg(0)
        .query_async(conn)
        .await;
    match counted {
        Ok(bytes) => Ok(bytes.unwrap_or(0)),
        Err(e)
            if matches!(
                e.kind(),
                redis::ErrorKind::Server(
                    redis::ServerErrorKind::NoPerm | redis::ServerErrorKind::ResponseError
                )
            ) =>
        {
            tracing::warn!(error = %e, "Redis refused MEMORY USAGE: the dead letters' size is not bounded");
            Ok(0)
        }
        Err(e) => Err(e.into()),
    }
}

/// How many dead letters wait.
pub async fn dead_letter_count(conn: &mut RedisConn) -> Result<u64, EngineError> {
    Ok(redis::cmd("XLEN").arg(DEAD_KEY).query_async(conn).await?)
}

/// The newest `count` dead letters, newest first.
pub async fn dead_letters(
    conn: &mut RedisConn,
    count: usize,
) -> Result<Vec<DeadLetter>, EngineError> {
    let rows: Vec<(String, HashMap<String, String>)> = redis::cmd("XREVRANGE")
        .arg(DEAD_KEY)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(count.max(1))
        .query_async(conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(id, mut f)| DeadLetter {
            id,
            lane: f.remove("lane").unwrap_or_default(),
            source: f.remove("source").unwrap_or_default(),
            body: f.remove("body").unwrap_or_default(),
            reason: f.remove("reason").unwrap_or_default(),
        })
        .collect())
}

/// What became of a dead letter asked to be replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replay {
    /// Back on its lane, as this entry.
    Requeued(String),
    /// No such dead letter (never, or replayed already).
    Unknown,
    /// Kept cut short (the store was at [`DEAD_STORE_BYTES`]): it cannot be
    /// replayed; its sender must send it again. The payload's whole length.
    Cut(u64),
}

/// Puts dead letter `id` back on its lane (after the cause was fixed, e.g. the SKU
/// was created and warmed).
pub async fn replay(conn: &mut RedisConn, id: &str) -> Result<Replay, EngineError> {
    let rows: Vec<(String, HashMap<String, String>)> = redis::cmd("XRANGE")
        .arg(DEAD_KEY)
        .arg(id)
        .arg(id)
        .query_async(conn)
        .await?;
    let Some((_, f)) = rows.into_iter().next() else {
        return Ok(Replay::Unknown);
    };
    if let Some(length) = f.get("cut") {
        return Ok(Replay::Cut(length.parse().unwrap_or(0)));
    }
    // A letter from an unknown lane (written by an older version) goes to feeds.
    let lane = f
        .get("lane")
        .and_then(|l| Lane::parse(l).ok())
        .unwrap_or(Lane::Feeds);
    // Counted in like any payload; a replay is an operator's decision, so no cap.
    let unlimited = Caps {
        payloads: u64::MAX,
        bytes: u64::MAX,
    };
    let source = f.get("source").cloned().unwrap_or_default();
    let body = f.get("body").cloned().unwrap_or_default();
    let Intake::Accepted(new_id) = enqueue(conn, lane, &source, body.as_bytes(), unlimited).await?
    else {
        return Err(EngineError::UnexpectedReply(
            "a replay was refused by an unlimited lane".into(),
        ));
    };
    redis::cmd("XDEL")
        .arg(DEAD_KEY)
        .arg(id)
        .query_async::<()>(conn)
        .await?;
    Ok(Replay::Requeued(new_id))
}

/// What a lane's consumers did.
#[derive(Debug, Default)]
pub struct LaneStats {
    /// Events applied.
    pub applied: AtomicU64,
    /// Events seen before (same source and id): skipped.
    pub duplicates: AtomicU64,
    /// Snapshots refused as stale.
    pub stale: AtomicU64,
    /// Payloads or events dead-lettered.
    pub dead: AtomicU64,
    /// Feed events that lowered stock under open holds (leaving units owed).
    pub shortfalls: AtomicU64,
}

/// What one consumer call did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Processed {
    /// Payloads read.
    pub payloads: u64,
    /// Events applied.
    pub applied: u64,
}

fn documented(e: &FeedEvent) -> String {
    let v = match e.change {
        Change::Delta(d) => {
            serde_json::json!({"event_id": e.event_id, "type": "delta", "sku": e.sku, "delta": d})
        }
        Change::Snapshot { on_hand, version } => serde_json::json!({
            "event_id": e.event_id, "type": "snapshot", "sku": e.sku, "on_hand": on_hand, "version": version
        }),
    };
    v.to_string()
}

/// A lane entry as `(id, source, raw body)`.
fn payload_of(mut entry: Entry) -> (String, String, Vec<u8>) {
    let source = entry
        .take("source")
        .and_then(|s| String::from_utf8(s).ok())
        .unwrap_or_default();
    let body = entry.take("body").unwrap_or_default();
    (entry.id, source, body)
}

/// One consumer of one lane.
pub struct LaneConsumer {
    engine: Engine,
    conn: RedisConn,
    lane: LaneConfig,
    name: String,
    stats: Arc<LaneStats>,
    group_ready: bool,
    last_claim: Instant,
    ledger: Option<sqlx::PgPool>,
    pacer: Pacer,
    /// Entries this consumer has read and not finished (the rest of its
    /// batch, or what a pause left): all renewed together ([`LaneConsumer::keep`]).
    holding: Vec<String>,
    /// When `holding` was last renewed.
    kept_at: Instant,
    /// The attempt counter of the payload being applied, given back when the
    /// work stops for a pause or a shutdown rather than a failure.
    trying: Option<String>,
    /// The dead letters' size as last counted (and when), plus what this
    /// consumer buried since.
    dead_size: Option<(Instant, u64)>,
}

/// What a step's claim said of one event.
enum Claimed {
    /// Claimed for this payload (or its redelivery): apply it.
    Now,
    /// The ledger recorded it, as this same event: nothing to do.
    Before,
    /// The id was used before for a different event.
    Conflict(String),
}

/// What became of one claimed event.
enum Verdict {
    /// Applied to its counter.
    Applied,
    /// Redis had already applied it (counted as a duplicate).
    Duplicate,
    /// Refused, with the reason it is dead-lettered under.
    Refused(String),
}

/// `lua/give_back.lua`: lowers a payload's attempt counter if it still exists.
static GIVE_BACK: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(include_str!("../../lua/give_back.lua")));

/// What applying one payload came to.
#[derive(Debug, Clone, Copy, Default)]
struct Applied {
    /// Events applied.
    events: u64,
    /// The lane was paused part-way: the payload's remaining events wait (its
    /// applied ones are skipped by their guards when it is taken up again).
    interrupted: bool,
}

/// The default for [`LaneConfig::claim_idle`]: longer than a healthy consumer
/// ever keeps a payload, so a live one is never robbed.
pub const CLAIM_IDLE: Duration = Duration::from_secs(30);

impl LaneConsumer {
    /// Consumer `name` of `lane`, reading with `conn` (its own: reads block).
    pub fn new(
        engine: Engine,
        conn: RedisConn,
        lane: LaneConfig,
        name: String,
        stats: Arc<LaneStats>,
    ) -> Self {
        // Look for a dead predecessor's payloads on the first call.
        let last_claim = Instant::now()
            .checked_sub(lane.claim_idle)
            .unwrap_or_else(Instant::now);
        let pacer = Pacer::new(
            lane.pace_share(),
            lane.yield_share(),
            engine.checkout_activity(),
        );
        Self {
            engine,
            conn,
            lane,
            name,
            stats,
            group_ready: false,
            last_claim,
            ledger: None,
            pacer,
            holding: Vec::new(),
            kept_at: Instant::now(),
            trying: None,
            dead_size: None,
        }
    }

    /// Dead-letters `body`, cut short when the dead letters are at
    /// [`DEAD_STORE_BYTES`] (counted at most every [`DEAD_RECOUNT_EVERY`]).
    async fn bury(
        &mut self,
        lane: Lane,
        source: &str,
        body: &str,
        reason: &str,
    ) -> Result<(), EngineError> {
        let large = body.len() > DEAD_BODY_KEPT_WHEN_FULL;
        let cut = large && self.dead_store_bytes().await? >= DEAD_STORE_BYTES;
        let letter = Letter {
            lane,
            source,
            body,
            reason,
        };
        bury(&mut self.conn, letter, cut).await?;
        if let Some((_, size)) = &mut self.dead_size {
            *size += (if cut {
                DEAD_BODY_KEPT_WHEN_FULL
            } else {
                body.len()
            }) as u64;
        }
        Ok(())
    }

    /// The dead letters' size: this consumer's count, or a new one when it is
    /// older than [`DEAD_RECOUNT_EVERY`].
    async fn dead_store_bytes(&mut self) -> Result<u64, EngineError> {
        if let Some((at, size)) = self.dead_size
            && at.elapsed() < DEAD_RECOUNT_EVERY
        {
            return Ok(size);
        }
        let size = dead_store_bytes(&mut self.conn).await?;
        self.dead_size = Some((Instant::now(), size));
        Ok(size)
    }

    /// Also asks PostgreSQL's ledger, before applying a payload, which of its
    /// events were recorded already: Redis' guards last a day, the ledger for
    /// ever, so an event redelivered after its guard lapsed (or after Redis lost
    /// it) is still applied once. While PostgreSQL does not answer within
    /// [`crate::postgres::QUICK_LOOKUP`], Redis' guards alone decide.
    pub fn with_ledger(mut self, pg: sqlx::PgPool) -> Self {
        self.ledger = Some(pg);
        self
    }

    /// The event ids of `events` the ledger has recorded for `source`.
    async fn recorded(
        &self,
        source: &str,
        events: &[FeedEvent],
    ) -> std::collections::HashSet<String> {
        let Some(pg) = &self.ledger else {
            return Default::default();
        };
        let ids: Vec<&str> = events.iter().map(|e| e.event_id.as_str()).collect();
        let lookup = async {
            Ok(sqlx::query_scalar::<_, String>(
                "SELECT event_id FROM ledger WHERE source = $1 AND event_id = ANY($2)",
            )
            .bind(source)
            .bind(&ids)
            .fetch_all(pg)
            .await?)
        };
        match crate::postgres::quick(lookup).await {
            Ok(found) => found.into_iter().collect(),
            Err(e) => {
                tracing::debug!(error = %e, "ledger not asked; Redis' event guards decide");
                Default::default()
            }
        }
    }

    /// Reads and applies up to one batch of payloads (its own unfinished ones first).
    /// Does nothing while the lane is paused.
    pub async fn process_once(&mut self, block: Duration) -> Result<Processed, EngineError> {
        // The group is made once, and again after any failure (Redis may have
        // restarted empty), not on every poll.
        if !self.group_ready {
            redis_conn::ensure_group(&mut self.conn, &lane_key(self.lane.name), GROUP).await?;
            self.group_ready = true;
        }
        let result = self.process(block).await;
        if result.is_err() {
            self.group_ready = false;
        }
        result
    }

    async fn process(&mut self, block: Duration) -> Result<Processed, EngineError> {
        let paused: bool = redis::cmd("EXISTS")
            .arg(paused_key(self.lane.name))
            .query_async(&mut self.conn)
            .await?;
        if paused {
            // What a pause left part-way stays this consumer's meanwhile.
            if !self.holding.is_empty() && self.kept_at.elapsed() >= self.keep_every() {
                self.keep().await?;
            }
            tokio::time::sleep(block.min(self.keep_every())).await;
            return Ok(Processed::default());
        }
        let mut entries = self.read("0", None).await?;
        if entries.is_empty() && self.last_claim.elapsed() >= self.lane.claim_idle {
            self.last_claim = Instant::now();
            entries = self.claim_abandoned().await?;
        }
        if entries.is_empty() {
            entries = self.read(">", Some(block)).await?;
        }
        self.holding = entries.iter().map(|(id, _, _)| id.clone()).collect();
        self.kept_at = Instant::now();
        let mut done = Processed::default();
        for (id, source, body) in entries {
            done.payloads += 1;
            // Attempts are counted in Redis before each try, so a payload that
            // crashes its consumer (the count survives the restart, and a
            // takeover by another consumer) is set aside like one that fails.
            let tries_key = format!("{}:tries:{id}", lane_key(self.lane.name));
            let (tries,): (u32,) = redis::pipe()
                .cmd("INCR")
                .arg(&tries_key)
                .cmd("PEXPIRE")
                .arg(&tries_key)
                .arg(24 * 3_600 * 1_000)
                .ignore()
                .query_async(&mut self.conn)
                .await?;
            self.trying = Some(tries_key.clone());
            let failed = if tries > MAX_ATTEMPTS {
                Some(format!(
                    "failed or stopped its consumer {} times",
                    tries - 1
                ))
            } else {
                match self.apply(&source, &body).await {
                    Ok(Applied {
                        events,
                        interrupted: true,
                    }) => {
                        // Paused part-way: not an attempt that failed, and the
                        // payload stays pending (and this consumer's) for when
                        // the lane runs again.
                        done.applied += events;
                        self.give_back().await?;
                        return Ok(done);
                    }
                    Ok(applied) => {
                        done.applied += applied.events;
                        None
                    }
                    Err(e) if e.refused_input() => {
                        if tries < MAX_ATTEMPTS {
                            return Err(e);
                        }
                        Some(format!("failed {MAX_ATTEMPTS} times: {e}"))
                    }
                    Err(e) => {
                        // An outage is not the payload's fault: not counted.
                        let _ = self.give_back().await;
                        return Err(e);
                    }
                }
            };
            if let Some(reason) = failed {
                // A payload that keeps failing on its own data must not block
                // the lane: it is dead-lettered with the reason.
                self.stats.dead.fetch_add(1, Ordering::Relaxed);
                tracing::error!(lane = %self.lane.name, entry = %id, %source, %reason,
                    "a payload was dead-lettered so the lane goes on");
                self.bury(
                    self.lane.name,
                    &source,
                    &String::from_utf8_lossy(&body),
                    &reason,
                )
                .await?;
            }
            redis::cmd("DEL")
                .arg(&tries_key)
                .query_async::<()>(&mut self.conn)
                .await?;
            self.trying = None;
            self.finish(&id, body.len()).await?;
            self.holding.retain(|held| *held != id);
        }
        Ok(done)
    }

    /// Gives back the attempt counted for the payload in progress: its work
    /// stopped for a pause, an outage or a shutdown, not because it failed.
    /// Only a counter that still exists is lowered (another consumer may have
    /// finished the payload and deleted it meanwhile).
    pub async fn give_back(&mut self) -> Result<(), EngineError> {
        if let Some(key) = self.trying.take() {
            GIVE_BACK
                .key(key)
                .invoke_async::<()>(&mut self.conn)
                .await?;
        }
        Ok(())
    }

    /// How often the entries held are renewed: well inside `claim_idle`.
    fn keep_every(&self) -> Duration {
        KEEP_EVERY.min(self.lane.claim_idle / 3)
    }

    /// Acknowledges and deletes a handled payload, counting its bytes out of
    /// the lane (only if this call deleted it, so a payload two consumers
    /// handled is counted out once).
    async fn finish(&mut self, id: &str, size: usize) -> Result<(), EngineError> {
        let lane = self.lane.name;
        let (_, deleted): (i64, i64) = redis::pipe()
            .cmd("XACK")
            .arg(lane_key(lane))
            .arg(GROUP)
            .arg(id)
            .cmd("XDEL")
            .arg(lane_key(lane))
            .arg(id)
            .query_async(&mut self.conn)
            .await?;
        if deleted == 1 {
            redis::cmd("DECRBY")
                .arg(bytes_key(lane))
                .arg(size)
                .query_async::<()>(&mut self.conn)
                .await?;
        }
        Ok(())
    }

    /// Takes over payloads another consumer of this lane left pending longer than
    /// its `claim_idle`: that process died after the sender was answered 202.
    async fn claim_abandoned(&mut self) -> Result<Vec<(String, String, Vec<u8>)>, EngineError> {
        self.engine
            .forget_idle_consumers(
                &lane_key(self.lane.name),
                GROUP,
                redis_conn::FORGET_CONSUMERS_AFTER,
                &self.name,
            )
            .await?;
        let reply: AutoClaimed = redis::cmd("XAUTOCLAIM")
            .arg(lane_key(self.lane.name))
            .arg(GROUP)
            .arg(&self.name)
            .arg(self.lane.claim_idle.as_millis() as u64)
            .arg("0-0")
            .arg("COUNT")
            .arg(self.lane.batch.max(1))
            .query_async(&mut self.conn)
            .await?;
        if !reply.claimed.is_empty() {
            tracing::warn!(
                lane = %self.lane.name,
                payloads = reply.claimed.len(),
                "took over payloads a dead consumer left unfinished"
            );
        }
        Ok(reply.claimed.into_iter().map(payload_of).collect())
    }

    async fn read(
        &mut self,
        from: &str,
        block: Option<Duration>,
    ) -> Result<Vec<(String, String, Vec<u8>)>, EngineError> {
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(GROUP)
            .arg(&self.name)
            .arg("COUNT")
            .arg(self.lane.batch.max(1));
        if let Some(b) = block {
            cmd.arg("BLOCK").arg(b.as_millis().max(1) as u64);
        }
        cmd.arg("STREAMS").arg(lane_key(self.lane.name)).arg(from);
        let StreamReads(streams) = cmd.query_async(&mut self.conn).await?;
        let mut out = Vec::new();
        for stream in streams {
            out.extend(stream.entries.into_iter().map(payload_of));
        }
        Ok(out)
    }

    /// Counts and logs a feed that left `owed` units on `sku`: it lowered stock
    /// below what open holds keep. Nothing is lost (the decrease is recorded in
    /// full and returning units pay the debt first), but a held unit confirmed
    /// meanwhile is an oversell, so operators hear of it at once.
    fn note_owed(&self, sku: &str, owed: i64, source: &str, event_id: &str) {
        if owed > 0 {
            self.stats.shortfalls.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                %sku, owed, %source, %event_id,
                "a feed lowered stock under open holds: units owed until holds end"
            );
        }
    }

    /// Claims the ids of `events` for their payload, in one round trip: the
    /// first payload with an id wins, a redelivery of the same payload passes
    /// (the script's guard then skips an event that was applied), and a
    /// different event under an id used before is refused with the reason, as
    /// PostgreSQL's ledger would refuse it. An id the ledger has `recorded` is
    /// only compared (its event is not applied again): with the claim it left,
    /// or, once that lapsed, taken as the same event. One answer per event.
    async fn claim_step(
        &mut self,
        source: &str,
        events: &[FeedEvent],
        recorded: &std::collections::HashSet<String>,
    ) -> Result<Vec<Claimed>, EngineError> {
        let ttl = self.engine.config.guard_ttl.as_millis() as u64;
        let fingerprints: Vec<String> = events.iter().map(documented).collect();
        let mut pipe = redis::pipe();
        for (event, fingerprint) in events.iter().zip(&fingerprints) {
            let key = Keyspace::feed_event(source, &event.event_id);
            if recorded.contains(&event.event_id) {
                pipe.cmd("GET").arg(key);
            } else {
                pipe.cmd("SET")
                    .arg(key)
                    .arg(fingerprint)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl)
                    .arg("GET");
            }
        }
        let firsts: Vec<Option<String>> = pipe.query_async(&mut self.conn).await?;
        Ok(events
            .iter()
            .zip(fingerprints)
            .zip(firsts)
            .map(|((event, fingerprint), first)| match first {
                Some(seen) if seen != fingerprint => Claimed::Conflict(format!(
                    "event id {} of {source} was used before for a different event ({seen}); \
                     an event id names one event: send a new id",
                    event.event_id
                )),
                _ if recorded.contains(&event.event_id) => Claimed::Before,
                _ => Claimed::Now,
            })
            .collect())
    }

    /// Keeps the entries this consumer holds its own (the payload it works
    /// through and the rest of its batch): a payload paced over longer than
    /// the lane's `claim_idle` would otherwise look abandoned to the other
    /// consumers. Also answers whether the lane was paused meanwhile.
    async fn keep(&mut self) -> Result<bool, EngineError> {
        let lane = lane_key(self.lane.name);
        let mut pipe = redis::pipe();
        if !self.holding.is_empty() {
            pipe.cmd("XCLAIM")
                .arg(&lane)
                .arg(GROUP)
                .arg(&self.name)
                .arg(0)
                .arg(&self.holding)
                .arg("JUSTID")
                .ignore();
        }
        pipe.cmd("EXISTS").arg(paused_key(self.lane.name));
        let (paused,): (bool,) = pipe.query_async(&mut self.conn).await?;
        self.kept_at = Instant::now();
        Ok(paused)
    }

    /// Waits until the pacer lets `events` more be applied, renewing the
    /// entries held meanwhile; `true` when the lane was paused instead.
    async fn wait_for_pace(&mut self, events: usize) -> Result<bool, EngineError> {
        let ready = self.pacer.book(events, self.engine.checkout_activity());
        loop {
            if self.kept_at.elapsed() >= self.keep_every() && self.keep().await? {
                return Ok(true);
            }
            if tokio::time::Instant::now() >= ready {
                return Ok(false);
            }
            let renew_at = tokio::time::Instant::from_std(self.kept_at + self.keep_every());
            tokio::time::sleep_until(ready.min(renew_at)).await;
        }
    }

    /// Applies payload `id`, step by step at the lane's pace ([`crate::pace`]).
    async fn apply(&mut self, source: &str, body: &[u8]) -> Result<Applied, EngineError> {
        let lane = self.lane.name;
        let max = self.engine.config.max_payload_events;
        // Parsing megabytes of JSON takes milliseconds of CPU: off the runtime's
        // workers, so the checkout requests queued on them are not held up.
        let parsed = if body.len() > PARSE_ASIDE_ABOVE {
            let owned = body.to_vec();
            tokio::task::spawn_blocking(move || payload::parse(&owned, max))
                .await
                .map_err(|e| EngineError::UnexpectedReply(format!("payload parser failed: {e}")))?
        } else {
            payload::parse(body, max)
        };
        let events = match parsed {
            Ok(events) => events,
            Err(e) => {
                self.stats.dead.fetch_add(1, Ordering::Relaxed);
                self.bury(lane, source, &String::from_utf8_lossy(body), &e.to_string())
                    .await?;
                return Ok(Applied::default());
            }
        };
        let mut applied = Applied::default();
        let recorded = self.recorded(source, &events).await;
        for step in events.chunks(crate::pace::STEP) {
            // The pace is for work: events the ledger has (a payload taken up
            // again after a pause, or sent twice) cost a look, not a turn.
            let fresh = step
                .iter()
                .filter(|e| !recorded.contains(&e.event_id))
                .count();
            if self.wait_for_pace(fresh).await? {
                applied.interrupted = true;
                return Ok(applied);
            }
            let claims = self.claim_step(source, step, &recorded).await?;
            for (event, claim) in step.iter().zip(claims) {
                let refused = match claim {
                    Claimed::Before => {
                        self.stats.duplicates.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    Claimed::Conflict(reason) => Some(reason),
                    Claimed::Now => match self.apply_event(source, event).await? {
                        Verdict::Applied => None,
                        Verdict::Duplicate => continue,
                        Verdict::Refused(reason) => Some(reason),
                    },
                };
                match refused {
                    None => {
                        applied.events += 1;
                        self.stats.applied.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(reason) => {
                        self.stats.dead.fetch_add(1, Ordering::Relaxed);
                        self.bury(lane, source, &documented(event), &reason).await?;
                    }
                }
            }
        }
        Ok(applied)
    }

    /// Applies one event whose id is claimed (a duplicate is counted here).
    async fn apply_event(
        &mut self,
        source: &str,
        event: &FeedEvent,
    ) -> Result<Verdict, EngineError> {
        /// How an event landed, whichever kind it is.
        enum Landed {
            Applied(i64),
            Duplicate,
            NotWarmed,
            Refused(String),
        }
        let landed = match event.change {
            Change::Delta(delta) => match self
                .engine
                .apply_delta(&event.sku, delta, source, &event.event_id)
                .await?
            {
                DeltaOutcome::Applied { owed, .. } => Landed::Applied(owed),
                DeltaOutcome::Duplicate => Landed::Duplicate,
                DeltaOutcome::NotWarmed => Landed::NotWarmed,
            },
            Change::Snapshot { on_hand, version } => match self
                .engine
                .apply_snapshot(&event.sku, on_hand, version, source, &event.event_id)
                .await?
            {
                SnapshotOutcome::Applied { owed, .. } => Landed::Applied(owed),
                SnapshotOutcome::Duplicate => Landed::Duplicate,
                SnapshotOutcome::NotWarmed => Landed::NotWarmed,
                SnapshotOutcome::Stale { current_version } => {
                    self.stats.stale.fetch_add(1, Ordering::Relaxed);
                    Landed::Refused(format!(
                        "stale snapshot: version {version} is not newer than {current_version}"
                    ))
                }
            },
        };
        Ok(match landed {
            Landed::Applied(owed) => {
                self.note_owed(&event.sku, owed, source, &event.event_id);
                Verdict::Applied
            }
            Landed::Duplicate => {
                self.stats.duplicates.fetch_add(1, Ordering::Relaxed);
                Verdict::Duplicate
            }
            Landed::NotWarmed => Verdict::Refused(format!(
                "{} has no stock counter (unknown SKU, or not warmed)",
                event.sku
            )),
            Landed::Refused(reason) => Verdict::Refused(reason),
        })
    }
}

/// Payloads larger than this are parsed on a blocking thread.
const PARSE_ASIDE_ABOVE: usize = 64 * 1024;

/// How often a consumer working through one payload renews its hold on it
/// and looks whether its lane was paused (more often for a lane whose
/// `claim_idle` is under three times this).
const KEEP_EVERY: Duration = Duration::from_secs(1);

/// Runs `consumer` until `shutdown`, backing off on errors (the lane's pace is
/// kept step by step inside each batch: [`crate::pace`]).
pub async fn run_consumer(mut consumer: LaneConsumer, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    let mut backoff = Duration::from_millis(100);
    let mut batches: u64 = 0;
    loop {
        batches += 1;
        // Each batch in its own span, so its log lines (and traces) group.
        let span = tracing::info_span!("lane_batch", lane = %consumer.lane.name, batch = batches);
        let step = consumer
            .process_once(Duration::from_millis(500))
            .instrument(span);
        let result = tokio::select! {
            () = &mut shutdown => None,
            r = step => Some(r),
        };
        let Some(result) = result else {
            // Stopped mid-payload by a shutdown (a restart, a deploy): not an
            // attempt that failed. The payload stays pending; another
            // consumer takes it over once it has been idle long enough.
            if let Err(e) = consumer.give_back().await {
                tracing::warn!(lane = %consumer.lane.name, error = %e, "could not give back a payload's attempt");
            }
            return;
        };
        match result {
            Ok(_) => backoff = Duration::from_millis(100),
            Err(e) => {
                tracing::warn!(lane = %consumer.lane.name, error = %e, "ingestion consumer failed; retrying");
                backoff = (backoff * 2).min(Duration::from_secs(5));
                tokio::select! {
                    () = &mut shutdown => return,
                    () = tokio::time::sleep(backoff) => {}
                }
            }
        }
    }
}
