//! The event log: every mutating script appends one entry per SKU it changed to
//! its shard's stream (`hf:{hfN.j}:events`), in the same atomic step.
//!
//! One log feeds the live dashboard, the shopper badges and the write-behind to
//! PostgreSQL. Entry fields:
//!
//! | field | meaning |
//! |---|---|
//! | `kind` | `reserved`, `confirmed`, `released`, `expired`, `warmed`, `delta`, `snapshot`, `settled`, `corrected`, `late_payment`, `moved` |
//! | `sku` | the SKU changed, or the part of a split SKU (`SKU~j/k`, see [`crate::split`]) |
//! | `qty` | units moved (signed for `delta` and `snapshot`) |
//! | `rid` | the reservation id, empty when none |
//! | `available`, `reserved`, `sold_pending` | the SKU's figures right after the change (empty if its counter was missing) |
//! | `ts` | Redis' clock, Unix milliseconds |
//! | `source`, `event_id`, `version` | for feed events only |

use std::collections::HashMap;
use std::time::Duration;

use crate::redis_conn::{EntryRange, RedisConn};
use redis::Value;
use serde::{Deserialize, Serialize};

use crate::error::EngineError;
use crate::keys::Keyspace;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// Units held.
    Reserved,
    /// A hold paid: units sold (pending write-behind).
    Confirmed,
    /// A hold released: units returned.
    Released,
    /// A hold expired: units returned.
    Expired,
    /// A counter set by warm-up.
    Warmed,
    /// A feed's stock movement.
    Delta,
    /// A feed's absolute count.
    Snapshot,
    /// Sales written to PostgreSQL: `sold_pending` fell by `qty` (one event
    /// per SKU for each `settle.lua` call, which settles many lines; `rid` only
    /// when it settled one).
    Settled,
    /// Reconciliation fixed a drifted counter: `available` changed by `qty`.
    Corrected,
    /// A payment arrived after its hold had ended: no stock moved; the
    /// write-behind records a remediation (so it is kept even while PostgreSQL
    /// is down).
    LatePayment,
    /// Units moved between two parts of a split SKU ([`crate::split`]): out
    /// of one (`qty` negative) or into another (positive). On hand is the same.
    Moved,
}

impl EventKind {
    /// Parses the `kind` field.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "reserved" => Self::Reserved,
            "confirmed" => Self::Confirmed,
            "released" => Self::Released,
            "expired" => Self::Expired,
            "warmed" => Self::Warmed,
            "delta" => Self::Delta,
            "snapshot" => Self::Snapshot,
            "settled" => Self::Settled,
            "corrected" => Self::Corrected,
            "late_payment" => Self::LatePayment,
            "moved" => Self::Moved,
            _ => return None,
        })
    }

    /// Whether an event of this kind can leave more units available than
    /// before it (a release, an expiry, a warm-up, a feed's receipt or count, a
    /// correction, units moved into a part). A hold, a payment or a settlement
    /// never does, so its `available` figure, however late it arrives, says
    /// nothing of stock coming back.
    pub fn can_restock(self) -> bool {
        match self {
            Self::Released
            | Self::Expired
            | Self::Warmed
            | Self::Delta
            | Self::Snapshot
            | Self::Corrected
            | Self::Moved => true,
            Self::Reserved | Self::Confirmed | Self::Settled | Self::LatePayment => false,
        }
    }
}

/// One entry of an event stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// The stream entry id (`<ms>-<seq>`), unique within its shard.
    pub id: String,
    /// The shard whose stream holds it.
    pub shard: u16,
    /// What happened.
    pub kind: EventKind,
    /// The SKU changed.
    pub sku: String,
    /// Units moved.
    pub qty: i64,
    /// The reservation, for hold events.
    pub reservation_id: Option<String>,
    /// `available` right after.
    pub available: Option<i64>,
    /// `reserved` right after.
    pub reserved: Option<i64>,
    /// `sold_pending` right after.
    pub sold_pending: Option<i64>,
    /// Redis' clock, Unix milliseconds.
    pub at_ms: i64,
    /// The feed it came from, for feed events.
    pub source: Option<String>,
    /// The feed's own event id, for feed events.
    pub event_id: Option<String>,
    /// `owed` right after (held units a feed removed), when the script reports it.
    #[serde(default)]
    pub owed: Option<i64>,
    /// For a confirmation: units of this line sold that a feed had removed (an
    /// oversell to remediate).
    #[serde(default)]
    pub oversold: Option<i64>,
    /// For a snapshot: its version.
    #[serde(default)]
    pub version: Option<i64>,
    /// For a new hold: its buyer, when one was given.
    #[serde(default)]
    pub buyer: Option<String>,
    /// For a late payment: how the hold had ended.
    #[serde(default)]
    pub state: Option<String>,
    /// For a sale or a feed movement: the epoch of the counter it moved (see
    /// `lua/late.lua`); `None` for a counter warmed before epochs existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<String>,
}

impl Event {
    /// The SKU the event is about: for a part of a split SKU (`sku` names
    /// the part, `SKU~j/k`), the SKU itself.
    pub fn whole_sku(&self) -> &str {
        crate::keys::base_sku(&self.sku)
    }

    /// An event of `kind` about `sku`, with every other figure unknown (what
    /// a stream entry's fields then fill in).
    pub fn new(id: String, shard: u16, kind: EventKind, sku: String) -> Self {
        Self {
            id,
            shard,
            kind,
            sku,
            qty: 0,
            reservation_id: None,
            available: None,
            reserved: None,
            sold_pending: None,
            at_ms: 0,
            source: None,
            event_id: None,
            owed: None,
            oversold: None,
            version: None,
            buyer: None,
            state: None,
            epoch: None,
        }
    }

    /// Whether this event shows stock coming back: of a kind that can restock
    /// ([`EventKind::can_restock`]) and leaving units available. A hold's
    /// event reporting units left is not one, however late it is read.
    pub fn shows_restock(&self) -> bool {
        self.kind.can_restock() && self.available.is_some_and(|a| a > 0)
    }

    /// The event stream entry `id` of `shard` records (its `fields` as
    /// written, see [`crate::redis_conn::Entry`]); `None` when it is no event
    /// (no kind or SKU: an entry trimmed while pending has no fields).
    pub(crate) fn from_entry(
        id: String,
        shard: u16,
        fields: Vec<(String, Vec<u8>)>,
    ) -> Option<Self> {
        let mut event = Self::new(id, shard, EventKind::Snapshot, String::new());
        let (mut kind, mut sku) = (None, None);
        // One pass: a field written twice keeps its last value.
        for (name, value) in fields {
            let Ok(text) = String::from_utf8(value) else {
                continue;
            };
            let some = |t: String| Some(t).filter(|t| !t.is_empty());
            let int = |t: &str| t.parse::<i64>().ok();
            match name.as_str() {
                "kind" => kind = Some(text),
                "sku" => sku = Some(text),
                "qty" => event.qty = int(&text).unwrap_or(0),
                "rid" => event.reservation_id = some(text),
                "available" => event.available = int(&text),
                "reserved" => event.reserved = int(&text),
                "sold_pending" => event.sold_pending = int(&text),
                "ts" => event.at_ms = int(&text).unwrap_or(0),
                "source" => event.source = some(text),
                "event_id" => event.event_id = some(text),
                "owed" => event.owed = int(&text),
                "oversold" => event.oversold = int(&text).filter(|n| *n > 0),
                "version" => event.version = int(&text),
                "buyer" => event.buyer = some(text),
                "state" => event.state = some(text),
                "epoch" => event.epoch = some(text),
                _ => {}
            }
        }
        event.kind = EventKind::parse(&kind?)?;
        event.sku = sku?;
        Some(event)
    }
}

/// Where a reader is in every shard's stream. Serialises to one string, so a
/// dashboard can hand it back after a reconnect and miss nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamCursor {
    ids: Vec<String>,
}

impl StreamCursor {
    /// From the very start of every stream.
    pub fn beginning(shards: u16) -> Self {
        Self {
            ids: vec!["0-0".to_owned(); usize::from(shards)],
        }
    }

    /// Parses [`StreamCursor::encode`]'s output; `None` if malformed or for another
    /// shard count.
    pub fn decode(s: &str, shards: u16) -> Option<Self> {
        let ids: Vec<String> = s.split('|').map(str::to_owned).collect();
        let well_formed = ids.iter().all(|id| {
            id.split_once('-')
                .is_some_and(|(ms, seq)| ms.parse::<u64>().is_ok() && seq.parse::<u64>().is_ok())
        });
        (ids.len() == usize::from(shards) && well_formed).then_some(Self { ids })
    }

    /// `id|id|…`, one per shard.
    pub fn encode(&self) -> String {
        self.ids.join("|")
    }

    /// The last id seen in `shard`.
    pub fn position(&self, shard: u16) -> &str {
        &self.ids[usize::from(shard)]
    }

    /// Moves `shard`'s position to `id` (an event just delivered); ignores an
    /// unknown shard.
    pub fn advance(&mut self, shard: u16, id: &str) {
        if let Some(slot) = self.ids.get_mut(usize::from(shard)) {
            id.clone_into(slot);
        }
    }

    /// Whether the event `id` of `shard` comes after this cursor's position.
    pub fn is_before(&self, shard: u16, id: &str) -> bool {
        let parse = |s: &str| {
            s.split_once('-')
                .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)))
        };
        match (
            self.ids.get(usize::from(shard)).and_then(|p| parse(p)),
            parse(id),
        ) {
            (Some(at), Some(next)) => next > at,
            _ => false,
        }
    }
}

/// The shards holding `sku`'s events: its own, and each part's when it is
/// split ([`crate::split`]).
async fn shards_of(engine: &crate::Engine, sku: &str) -> Result<Vec<u16>, EngineError> {
    let keys = engine.keyspace();
    let parts = engine.parts_of(sku).await?.unwrap_or(1);
    let mut shards: Vec<u16> = (0..parts)
        .map(|j| keys.shard_of(&crate::keys::part_name(sku, j, parts)))
        .collect();
    shards.sort_unstable();
    shards.dedup();
    Ok(shards)
}

/// The newest events (up to `limit`) about `sku` (any of its parts), newest
/// first, looking back at most `scan` entries of each of its shards' streams.
pub async fn recent_for_sku(
    engine: &crate::Engine,
    sku: &str,
    limit: usize,
    scan: usize,
) -> Result<Vec<Event>, EngineError> {
    let mut out = Vec::new();
    for shard in shards_of(engine, sku).await? {
        let EntryRange(entries) = newest_entries(engine, shard, scan).await?;
        out.extend(
            entries
                .into_iter()
                .filter_map(|entry| Event::from_entry(entry.id, shard, entry.fields))
                .filter(|e| e.whole_sku() == sku)
                .take(limit),
        );
    }
    out.sort_by_key(|e| std::cmp::Reverse(entry_order(&e.id)));
    out.truncate(limit);
    Ok(out)
}

/// The newest `count` (at least 1) entries of `shard`'s stream, newest first.
async fn newest_entries(
    engine: &crate::Engine,
    shard: u16,
    count: usize,
) -> Result<EntryRange, EngineError> {
    Ok(redis::cmd("XREVRANGE")
        .arg(engine.keyspace().events(shard))
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(count.max(1))
        .query_async(&mut engine.connection())
        .await?)
}

/// A stream entry id (`<ms>-<seq>`) as numbers, for ordering entries of
/// several streams (Redis' clock gives every stream's ids).
fn entry_order(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}

/// The id of the newest entry in `sku`'s shard streams (`0-0` when empty): a
/// position to read [`for_sku_since`] from later.
pub async fn latest_id(engine: &crate::Engine, sku: &str) -> Result<String, EngineError> {
    let mut newest = "0-0".to_owned();
    for shard in shards_of(engine, sku).await? {
        let EntryRange(entries) = newest_entries(engine, shard, 1).await?;
        if let Some(e) = entries.into_iter().next()
            && entry_order(&e.id) > entry_order(&newest)
        {
            newest = e.id;
        }
    }
    Ok(newest)
}

/// Every event about `sku` (any of its parts) after stream entry `after`,
/// oldest first, read in pages of 10,000 from each of its shards' streams.
pub async fn for_sku_since(
    engine: &crate::Engine,
    sku: &str,
    after: &str,
) -> Result<Vec<Event>, EngineError> {
    let keys = engine.keyspace();
    let mut out = Vec::new();
    for shard in shards_of(engine, sku).await? {
        let stream = keys.events(shard);
        let mut from = format!("({after}");
        loop {
            let EntryRange(entries) = redis::cmd("XRANGE")
                .arg(&stream)
                .arg(&from)
                .arg("+")
                .arg("COUNT")
                .arg(10_000)
                .query_async(&mut engine.connection())
                .await?;
            let Some(last) = entries.last() else { break };
            from = format!("({}", last.id);
            out.extend(
                entries
                    .into_iter()
                    .filter_map(|entry| Event::from_entry(entry.id, shard, entry.fields))
                    .filter(|e| e.whole_sku() == sku),
            );
        }
    }
    out.sort_by_key(|e| entry_order(&e.id));
    Ok(out)
}

/// Tails every shard's event stream. Give it a connection of its own: a blocking
/// `XREAD` would hold up every other command on a shared multiplexed connection.
///
/// Events of a split SKU's parts come out as the SKU's own, with the figures
/// of all its parts together ([`crate::split`]): a live view never shows one
/// part's stock as the SKU's.
pub struct EventReader {
    conn: RedisConn,
    keys: Keyspace,
    /// The latest figures of each part of every split SKU seen, by SKU.
    parts: HashMap<String, Vec<Option<PartLive>>>,
    /// SKUs whose counter said they were not split when their first event
    /// came (bounded: forgotten all at once past [`UNSPLIT_REMEMBERED`]).
    unsplit: std::collections::HashSet<String>,
    /// Every shard's stream key, in shard order (made once: a busy reader
    /// reads hundreds of times a second).
    streams: Vec<String>,
    /// Whether the last read stopped at its count on some stream.
    backlog: bool,
}

/// How many SKUs an [`EventReader`] remembers as not split before it forgets
/// them (and asks each one's counter again at its next event).
const UNSPLIT_REMEMBERED: usize = 100_000;

/// One part's figures, as its latest event (or a read) gave them.
#[derive(Debug, Clone, Copy, Default)]
struct PartLive {
    available: i64,
    reserved: i64,
    sold_pending: i64,
    owed: i64,
}

impl EventReader {
    /// A reader over `conn` (dedicated) for the streams of `keys`.
    pub fn new(conn: RedisConn, keys: Keyspace) -> Self {
        Self {
            conn,
            streams: keys.all_events(),
            keys,
            parts: HashMap::new(),
            unsplit: std::collections::HashSet::new(),
            backlog: false,
        }
    }

    /// Whether the last [`EventReader::read`] returned its whole `count` from
    /// some stream, so more may be waiting there now.
    pub fn backlog(&self) -> bool {
        self.backlog
    }

    /// `event` as the whole SKU's when it is about a part of a split SKU (or
    /// about part 0 under the SKU's own name, e.g. a feed's movement): its
    /// figures become every part's together. Parts not seen yet are read.
    async fn whole(&mut self, mut event: Event) -> Result<Event, EngineError> {
        let (base, part, parts) = match crate::keys::parse_part(&event.sku) {
            Some((base, part, parts)) => (base.to_owned(), part, parts),
            None => match self.parts.get(&event.sku) {
                Some(known) => (event.sku.clone(), 0, known.len() as u16),
                None if self.unsplit.contains(&event.sku) => return Ok(event),
                // Part 0's event (a feed's, say) before any other part's: its
                // counter says whether the SKU is split, once per SKU.
                None => {
                    let parts: Option<u16> = redis::cmd("HGET")
                        .arg(self.keys.sku(&event.sku))
                        .arg("parts")
                        .query_async(&mut self.conn)
                        .await?;
                    match parts.unwrap_or(1).min(crate::keys::MAX_PARTS) {
                        k if k > 1 => (event.sku.clone(), 0, k),
                        _ => {
                            if self.unsplit.len() >= UNSPLIT_REMEMBERED {
                                self.unsplit.clear();
                            }
                            self.unsplit.insert(event.sku.clone());
                            return Ok(event);
                        }
                    }
                }
            },
        };
        let slots = self.parts.entry(base.clone()).or_default();
        if slots.len() != usize::from(parts) {
            *slots = vec![None; usize::from(parts)];
        }
        if let Some(available) = event.available {
            slots[usize::from(part)] = Some(PartLive {
                available,
                reserved: event.reserved.unwrap_or(0),
                sold_pending: event.sold_pending.unwrap_or(0),
                owed: event.owed.unwrap_or(0),
            });
        }
        if slots.iter().any(Option::is_none) {
            let mut pipe = redis::pipe();
            for j in 0..parts {
                pipe.cmd("HMGET")
                    .arg(self.keys.sku(&crate::keys::part_name(&base, j, parts)))
                    .arg(&["available", "reserved", "sold_pending", "owed"]);
            }
            let rows: Vec<[Option<i64>; 4]> = pipe.query_async(&mut self.conn).await?;
            for (slot, [a, r, p, o]) in slots.iter_mut().zip(rows) {
                if slot.is_none() {
                    *slot = a.map(|available| PartLive {
                        available,
                        reserved: r.unwrap_or(0),
                        sold_pending: p.unwrap_or(0),
                        owed: o.unwrap_or(0),
                    });
                }
            }
        }
        let known: Vec<PartLive> = slots.iter().flatten().copied().collect();
        event.sku = base;
        if event.available.is_some() {
            event.available = Some(known.iter().map(|p| p.available).sum());
            event.reserved = Some(known.iter().map(|p| p.reserved).sum());
            event.sold_pending = Some(known.iter().map(|p| p.sold_pending).sum());
            event.owed = Some(known.iter().map(|p| p.owed).sum());
        }
        Ok(event)
    }

    /// A cursor at the current end of every stream: reading from it returns only
    /// what is appended afterwards.
    pub async fn tail_cursor(&mut self) -> Result<StreamCursor, EngineError> {
        let mut pipe = redis::pipe();
        for key in self.keys.all_events() {
            pipe.cmd("XREVRANGE")
                .arg(key)
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(1);
        }
        let rows: Vec<Vec<(String, Value)>> = pipe.query_async(&mut self.conn).await?;
        Ok(StreamCursor {
            ids: rows
                .into_iter()
                .map(|r| {
                    r.into_iter()
                        .next()
                        .map_or_else(|| "0-0".to_owned(), |(id, _)| id)
                })
                .collect(),
        })
    }

    /// Up to `count` events per shard after `cursor`, waiting up to `block` for the
    /// first one; advances `cursor` past what it returns. Events of one shard come
    /// in stream order.
    pub async fn read(
        &mut self,
        cursor: &mut StreamCursor,
        count: usize,
        block: Option<Duration>,
    ) -> Result<Vec<Event>, EngineError> {
        let mut head = redis::cmd("XREAD");
        let count = count.max(1);
        head.arg("COUNT").arg(count);
        let streams = self
            .conn
            .read_streams(&head, &self.streams, &cursor.ids, block)
            .await?;
        self.backlog = streams.iter().any(|s| s.entries.len() >= count);
        let mut events = Vec::new();
        // Where each stream's read ended: the cursor moves there only once
        // every event is ready, so a failure on the way (a split SKU's parts
        // read from Redis) reads them all again rather than dropping them.
        let mut ends = Vec::new();
        for stream in streams {
            let Some(shard) = self.streams.iter().position(|k| *k == stream.key) else {
                continue;
            };
            let shard = shard as u16;
            if let Some(last) = stream.entries.last() {
                ends.push((usize::from(shard), last.id.clone()));
            }
            for entry in stream.entries {
                if let Some(event) = Event::from_entry(entry.id, shard, entry.fields) {
                    events.push(event);
                }
            }
        }
        let mut whole = Vec::with_capacity(events.len());
        for event in events {
            whole.push(self.whole(event).await?);
        }
        for (shard, id) in ends {
            cursor.ids[shard] = id;
        }
        Ok(whole)
    }
}
