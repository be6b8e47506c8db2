//! Split SKUs: one hot SKU's stock in `k` parts on `k` shards, so the SKU
//! everyone wants is not one key on one Redis core.
//!
//! Part `j` of SKU `X` is named `X~j/k` ([`crate::keys::part_name`]) and lives
//! in a shard of its own ([`crate::keys::Keyspace::shard_of`]); part 0 is the
//! SKU's own counter, so its history (feed versions, `fed`, `settled`, epoch)
//! stays where it was. Every part has the full set of counters and its own
//! holds: a hold on a split SKU names its part in its line, and confirm,
//! release and expiry run on that part exactly as on an unsplit SKU.
//!
//! **Routing.** A request goes to one part, chosen by its buyer (so one
//! buyer's holds and purchases are all counted on one part and the per-buyer
//! limit is exact) or else by its reservation id (so a retry meets its hold).
//! `reserve.lua` refuses a line that names another split than the counter's
//! (`{'split', …}`): a process that has not seen the SKU split yet learns the
//! count and routes again, and never holds under an old count.
//!
//! **Stealing.** A part short of the request answers `short` (and remembers
//! nothing); the engine then moves units to it from the other parts
//! (`move.lua`: out of the source into `moving`, into the target once per
//! transfer id, then the source forgets the transfer) and tries again.
//!
//! **Sold out only when it is true.** Every part counts rises of its
//! `available` in `gen` (releases, expiries, feeds, corrections, warm-ups,
//! transfers in). The engine reads every part's `available`, `moving` and
//! `gen`, and if their sum is below the request reads every `gen` again. When
//! none changed, no part's `available` rose between its two reads, and every
//! first read comes before every second one: at the moment between the two
//! passes, the SKU as a whole (units on their way included) had fewer units
//! than asked for. Only then is the answer "sold out"; when a `gen` moved, it
//! looks again (a few times, then answers busy, never a false sold out).
//!
//! **Changing the count** ([`Engine::set_parts`]) marks every part as
//! changing (`parts` 0) first: reservations answer busy, feeds wait, only the
//! change moves units, and nothing measures or corrects the SKU until the new
//! parts are stocked and marked with the new count.

use std::collections::HashMap;
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use holdfast_domain::Counters;
use redis::Value;

use crate::engine::Engine;
use crate::error::EngineError;
use crate::keys::{self, MAX_PARTS, base_sku, part_name};
use crate::model::{Figures, Hold, Line, ReserveOutcome, ReserveRequest};
use crate::reply::Reply;

mod debts;

/// How many times a reservation on a split SKU gathers and tries again before
/// it answers busy (each round either holds, moves units, or looks again).
const ROUNDS: usize = 8;

/// The split counts this process has seen, by SKU (absent: not split).
#[derive(Default)]
pub(crate) struct Splits {
    known: RwLock<HashMap<String, u16>>,
    /// Whether any SKU is split: an unsplit deployment routes without a look-up.
    any: AtomicBool,
    /// Reservations whose part was short and gathered from the others.
    gathers: AtomicU64,
    /// Reservations held only after units were gathered for them.
    multi_part: AtomicU64,
    /// Transfers between parts, and the units they moved.
    moves: AtomicU64,
    units_moved: AtomicU64,
}

/// What this process's split SKUs did since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SplitStats {
    /// Reservations whose part was short, so units were gathered from the
    /// other parts (or the SKU was found sold out) before answering.
    pub gathers: u64,
    /// Reservations held only after units were gathered from other parts:
    /// the ones that needed more than their own part.
    pub multi_part: u64,
    /// Transfers of units from one part to another (gathering, rebalancing,
    /// feeds).
    pub moves: u64,
    /// Units those transfers moved.
    pub units_moved: u64,
}

impl Splits {
    /// Whether this process knows of any split SKU (none: nothing to route).
    pub(crate) fn any(&self) -> bool {
        self.any.load(Ordering::Relaxed)
    }

    /// How many parts `sku` has, as far as this process knows (1: not split).
    pub(crate) fn parts(&self, sku: &str) -> u16 {
        if !self.any.load(Ordering::Relaxed) {
            return 1;
        }
        self.known
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(sku)
            .copied()
            .unwrap_or(1)
    }

    /// Records that `sku` has `parts` parts (as a counter said).
    pub(crate) fn learn(&self, sku: &str, parts: u16) {
        if self.parts(sku) == parts.max(1) {
            return;
        }
        let mut known = self
            .known
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if parts > 1 {
            known.insert(sku.to_owned(), parts);
            self.any.store(true, Ordering::Relaxed);
        } else {
            known.remove(sku);
        }
    }
}

/// What [`Engine::set_parts`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SplitOutcome {
    /// The SKU is now split into this many parts (1: not split), its stock
    /// spread over them.
    Changed {
        /// Parts before.
        from: u16,
        /// Parts now.
        to: u16,
    },
    /// It already had that many parts.
    Unchanged,
    /// Not changed: something is in flight on the SKU (open holds, sales not
    /// yet written to PostgreSQL, units moving between parts).
    Refused(String),
    /// The SKU has no counter in Redis.
    NotWarmed,
    /// Not a count this engine splits into.
    Invalid(String),
}

/// One part's counters, as the gathering and the figures read them.
#[derive(Debug, Clone, Copy, Default)]
struct PartRow {
    available: i64,
    moving: i64,
    gen_: i64,
}

/// One part's counters, whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PartFull {
    pub(crate) available: i64,
    pub(crate) reserved: i64,
    pub(crate) sold_pending: i64,
    pub(crate) owed: i64,
    pub(crate) moving: i64,
    pub(crate) settled: i64,
    /// `gen`: rises of `available` (see the module's "Sold out only when it is true").
    pub(crate) rises: i64,
    /// Feed movements applied (part 0's is the SKU's; see `lua/delta.lua`).
    pub(crate) fed: i64,
    /// Transfers received (`lua/move.lua`'s `in`).
    pub(crate) ins: i64,
    /// Units that came back while another part may owe, waiting to be
    /// routed (counted in `moving` too; see [`debts`]).
    pub(crate) parked: i64,
    /// The part's `hold_back` mark (0: none): a deadline, ms (see [`debts`]).
    pub(crate) hold_back: i64,
}

impl PartFull {
    /// The larger of each field of two reads of one part.
    fn max(self, other: Self) -> Self {
        Self {
            available: self.available.max(other.available),
            reserved: self.reserved.max(other.reserved),
            sold_pending: self.sold_pending.max(other.sold_pending),
            owed: self.owed.min(other.owed),
            moving: self.moving.max(other.moving),
            settled: self.settled.max(other.settled),
            rises: self.rises.max(other.rises),
            fed: self.fed.min(other.fed),
            ins: self.ins.max(other.ins),
            parked: self.parked.max(other.parked),
            hold_back: self.hold_back.max(other.hold_back),
        }
    }

    /// What only a transfer between parts changes: the part's units
    /// (`available + reserved + sold_pending - owed + moving`, with the sales
    /// it settled added back and the feed movements it took taken off),
    /// `moving`, and the transfers it received (`ins`). Reservations,
    /// payments, releases, expiries, settles and feeds keep all three; an
    /// `in` raises the units and `ins`, a `done` lowers the units and
    /// `moving` (`gen` would not do: every release raises it). The SKU's drift depends on its parts
    /// only through the sum of the first, so a measure needs this alone to be
    /// read at one moment, however busy the shoppers are.
    pub(crate) fn mark(&self) -> (i64, i64, i64) {
        (
            whole_of(std::slice::from_ref(self))
                .conserved()
                .unwrap_or_default(),
            self.in_flight(),
            self.ins,
        )
    }

    /// Units on their way to another part: `moving` less the units parked
    /// here (which stay this part's until routed; see [`debts`]).
    pub(crate) fn in_flight(&self) -> i64 {
        self.moving - self.parked
    }

    /// [`PartFull::mark`] as `snapshot.lua` compares it (`units:moving:ins`).
    pub(crate) fn fingerprint(&self) -> String {
        let (units, moving, ins) = self.mark();
        format!("{units}:{moving}:{ins}")
    }
}

/// A split SKU's counters: its parts' (part 0 first), read at rest, summed.
/// Feeds apply to part 0 alone, so its `fed` is the SKU's; `moving` is the
/// units parked (nothing is in flight at rest), which exist and are not on
/// sale.
pub(crate) fn whole_of(rows: &[PartFull]) -> Counters {
    let sum = |f: fn(&PartFull) -> i64| rows.iter().map(f).sum::<i64>();
    Counters {
        available: Some(sum(|r| r.available)),
        reserved: sum(|r| r.reserved),
        sold_pending: sum(|r| r.sold_pending),
        settled: sum(|r| r.settled),
        owed: sum(|r| r.owed),
        moving: sum(|r| r.moving),
        fed: rows.first().map_or(0, |r| r.fed),
        parts: rows.len() as u16,
        changing: false,
    }
}

/// Every part of a split SKU read for a measure or a count
/// ([`Engine::read_at_rest`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PartsRead {
    /// Each part's figures, part 0 first (`None`: the part has no counter).
    pub(crate) rows: Vec<Option<PartFull>>,
    /// Whether `rows` are every part at one moment with no unit on its way
    /// between parts: their sums are the SKU's exactly. Otherwise each field
    /// is the larger of two reads (the smaller `owed`), so no unit on its way
    /// is missed (one may be counted twice): a bound that only holds back more.
    pub(crate) exact: bool,
}

/// How many times [`Engine::read_at_rest`] reads the parts for a moment at rest.
const AT_REST_TRIES: usize = 20;

/// How many times [`Engine::correct_split`] reads the parts at rest and
/// tries its correction while units move to or from part 0.
const CORRECT_TRIES: usize = 5;

/// What gathering for a short part found.
enum Gathered {
    /// Units were moved to the part, or it has enough again: try once more.
    Again,
    /// Every part together had fewer units than asked for, at one moment.
    SoldOut(i64),
    /// A part's counter is missing.
    NotWarmed,
}

impl Engine {
    /// What this process's split SKUs did since it started.
    pub fn split_stats(&self) -> SplitStats {
        SplitStats {
            gathers: self.splits.gathers.load(Ordering::Relaxed),
            multi_part: self.splits.multi_part.load(Ordering::Relaxed),
            moves: self.splits.moves.load(Ordering::Relaxed),
            units_moved: self.splits.units_moved.load(Ordering::Relaxed),
        }
    }

    /// How many parts `sku` has in Redis (1: not split), read from its counter
    /// and remembered; `None` when the counter is missing.
    pub async fn parts_of(&self, sku: &str) -> Result<Option<u16>, EngineError> {
        let (available, parts): (Option<i64>, Option<u16>) = redis::cmd("HMGET")
            .arg(self.keys.sku(sku))
            .arg(&["available", "parts"])
            .query_async(&mut self.conn.clone())
            .await?;
        let parts = parts.unwrap_or(1).max(1);
        self.splits.learn(sku, parts);
        Ok(available.map(|_| parts))
    }

    /// Each part's own figures, in part order (one, the SKU's, when it is
    /// not split); empty when the SKU has no counter.
    pub async fn part_figures(&self, sku: &str) -> Result<Vec<Figures>, EngineError> {
        let Some(parts) = self.parts_of(sku).await? else {
            return Ok(Vec::new());
        };
        let names: Vec<String> = (0..parts).map(|j| part_name(sku, j, parts)).collect();
        Ok(self
            .figures_many(&names)
            .await?
            .into_iter()
            .map(Option::unwrap_or_default)
            .collect())
    }

    /// `req` with each line of a split SKU naming its part (by buyer, else by
    /// reservation id); `None` when no line is of a split SKU.
    pub(crate) fn route(&self, req: &ReserveRequest) -> Option<Vec<Line>> {
        // The hot path of an unsplit deployment: no allocation, no lock.
        if req.lines.iter().all(|l| self.splits.parts(&l.sku) < 2) {
            return None;
        }
        let by = req.buyer.as_deref().unwrap_or(&req.reservation_id);
        Some(
            req.lines
                .iter()
                .map(|l| {
                    let parts = self.splits.parts(&l.sku);
                    Line {
                        sku: part_name(&l.sku, part_for(by, parts), parts),
                        qty: l.qty,
                    }
                })
                .collect(),
        )
    }

    /// The reservation loop for a request with lines of split SKUs: hold on
    /// the routed parts; a part that is short gathers units from the others
    /// and tries again; a process that had not seen the split learns it and
    /// routes again. Answers as for the whole SKU (its code, not a part's).
    pub(crate) async fn reserve_routed(
        &self,
        req: &ReserveRequest,
        ttl: std::time::Duration,
        fp: &str,
    ) -> Result<ReserveOutcome, EngineError> {
        let mut gathered = false;
        for _ in 0..ROUNDS {
            let lines = self.route(req).unwrap_or_else(|| req.lines.clone());
            let outcome = self.reserve_lines(req, &lines, ttl, fp).await?;
            let (sku, part, parts) = match &outcome {
                ReserveOutcome::NotWarmed { sku } => {
                    let routed = keys::parse_part(sku).map_or(1, |(_, _, k)| k);
                    if self.splits.parts(base_sku(sku)) != routed {
                        // Told of another split (`reserve.lua`'s 'split'): route again.
                        continue;
                    }
                    // A part that is gone (the SKU's parts changed since this
                    // process looked): ask part 0 for the count.
                    if routed > 1
                        && self.parts_of(base_sku(sku)).await? != Some(routed)
                        && self.splits.parts(base_sku(sku)) != routed
                    {
                        continue;
                    }
                    return Ok(to_whole_skus(outcome));
                }
                // A part short (`reserve.lua`'s 'short', which names the part).
                ReserveOutcome::SoldOut {
                    sku,
                    replayed: false,
                    ..
                } => match keys::parse_part(sku) {
                    Some((_, part, parts)) => (sku, part, parts),
                    None => return Ok(to_whole_skus(outcome)),
                },
                ReserveOutcome::Reserved { .. } if gathered => {
                    self.splits.multi_part.fetch_add(1, Ordering::Relaxed);
                    return Ok(to_whole_skus(outcome));
                }
                _ => return Ok(to_whole_skus(outcome)),
            };
            gathered = true;
            let base = base_sku(sku).to_owned();
            let qty = lines.iter().find(|l| l.sku == *sku).map_or(1, |l| l.qty);
            match self.gather(&base, part, parts, qty).await? {
                Gathered::Again => continue,
                Gathered::NotWarmed => return Ok(ReserveOutcome::NotWarmed { sku: base }),
                Gathered::SoldOut(total) => {
                    self.remember_sold_out(&req.reservation_id, fp, &base)
                        .await?;
                    return Ok(ReserveOutcome::SoldOut {
                        sku: base,
                        available: total,
                        replayed: false,
                    });
                }
            }
        }
        Err(EngineError::Busy(format!(
            "reservation {}: stock is moving between the parts of a split SKU; retry in a moment",
            req.reservation_id
        )))
    }

    /// Keeps "sold out" as the answer to reservation id `rid` (owned by the
    /// request fingerprinted `fp`) in its claim, as an answer from memory is
    /// kept: a retry gets it again even once units come back.
    async fn remember_sold_out(&self, rid: &str, fp: &str, sku: &str) -> Result<(), EngineError> {
        let claim = self.keys.claim(rid);
        let owner: Option<String> = redis::cmd("GET")
            .arg(&claim)
            .query_async(&mut self.conn.clone())
            .await?;
        if owner.as_deref() == Some(fp) {
            redis::cmd("SET")
                .arg(&claim)
                .arg(crate::engine::claim_from_memory(fp, sku))
                .arg("XX")
                .arg("KEEPTTL")
                .query_async::<()>(&mut self.conn.clone())
                .await?;
        }
        Ok(())
    }

    /// Reads every part of `sku` (split into `parts`): one pipelined call.
    /// `None` when a part's counter is missing.
    async fn read_parts(&self, sku: &str, parts: u16) -> Result<Option<Vec<PartRow>>, EngineError> {
        let mut pipe = redis::pipe();
        for j in 0..parts {
            pipe.cmd("HMGET")
                .arg(self.keys.sku(&part_name(sku, j, parts)))
                .arg(&["available", "moving", "gen"]);
        }
        let rows: Vec<(Option<i64>, Option<i64>, Option<i64>)> =
            pipe.query_async(&mut self.conn.clone()).await?;
        Ok(rows
            .into_iter()
            .map(|(available, moving, gen_)| {
                available.map(|available| PartRow {
                    available,
                    moving: moving.unwrap_or(0),
                    gen_: gen_.unwrap_or(0),
                })
            })
            .collect())
    }

    /// Gathers units for part `part` of `sku`, short of `qty`: moves units to
    /// it from the others (the richest first, up to half of what each has or
    /// what is needed, whichever is more), or finds that the SKU as a whole
    /// has fewer than `qty` (see the module's notes).
    async fn gather(
        &self,
        sku: &str,
        part: u16,
        parts: u16,
        qty: i64,
    ) -> Result<Gathered, EngineError> {
        self.splits.gathers.fetch_add(1, Ordering::Relaxed);
        let Some(first) = self.read_parts(sku, parts).await? else {
            return Ok(Gathered::NotWarmed);
        };
        let home = first[usize::from(part)];
        if home.available >= qty {
            return Ok(Gathered::Again);
        }
        let total: i64 = first.iter().map(|r| r.available + r.moving).sum();
        if total < qty {
            let Some(second) = self.read_parts(sku, parts).await? else {
                return Ok(Gathered::NotWarmed);
            };
            let still = first.iter().zip(&second).all(|(a, b)| a.gen_ == b.gen_);
            return Ok(if still {
                Gathered::SoldOut(total)
            } else {
                Gathered::Again
            });
        }
        if first.iter().any(|r| r.moving > 0) {
            // A transfer under way (or one a crash left): finish what is old
            // enough to be left, so its units count again.
            self.finish_moves_older(sku, parts, MOVE_GRACE_MS).await?;
        }
        let mut donors: Vec<(u16, i64)> = first
            .iter()
            .enumerate()
            .filter(|(j, r)| *j != usize::from(part) && r.available > 0)
            .map(|(j, r)| (j as u16, r.available))
            .collect();
        donors.sort_by_key(|(_, available)| std::cmp::Reverse(*available));
        let mut need = qty - home.available;
        let target = part_name(sku, part, parts);
        let mut moved = 0;
        for (donor, available) in donors {
            if need <= 0 {
                break;
            }
            let want = need.max(available / 2);
            let got = self
                .move_units(&part_name(sku, donor, parts), &target, want)
                .await?;
            need -= got;
            moved += got;
        }
        if moved == 0 {
            // The units are on their way between other parts: a moment for
            // their transfers to land before looking again.
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        Ok(Gathered::Again)
    }

    /// Moves up to `want` units from part `from` to part `to` (whole, or not
    /// at all if `from` has none); how many moved.
    pub(crate) async fn move_units(
        &self,
        from: &str,
        to: &str,
        want: i64,
    ) -> Result<i64, EngineError> {
        self.move_units_as(from, to, want, None).await
    }

    /// [`Engine::move_units`]; with the fencing token of a change of the
    /// SKU's parts (`change`), also moves out of a part marked as changing,
    /// which only that change may do, unless a newer change has touched the
    /// part (then [`EngineError::Busy`]: see [`Engine::run_split`]).
    async fn move_units_as(
        &self,
        from: &str,
        to: &str,
        want: i64,
        change: Option<i64>,
    ) -> Result<i64, EngineError> {
        let tid = uuid::Uuid::new_v4().simple().to_string();
        self.move_units_with(from, to, want, change, &tid).await
    }

    /// [`Engine::move_units_as`] under transfer id `tid` (a debt's transfer
    /// is named so: see [`debts::debt_tid`]).
    async fn move_units_with(
        &self,
        from: &str,
        to: &str,
        want: i64,
        change: Option<i64>,
        tid: &str,
    ) -> Result<i64, EngineError> {
        let out = self.run_move(from, "out", tid, want, to, change).await?;
        fenced(from, &out)?;
        if out.tag()? != "out" {
            return Ok(0);
        }
        let taken = out.int(1)?;
        if taken < 1 {
            return Ok(0);
        }
        self.deliver(from, to, tid, taken).await?;
        self.splits.moves.fetch_add(1, Ordering::Relaxed);
        self.splits
            .units_moved
            .fetch_add(taken as u64, Ordering::Relaxed);
        Ok(taken)
    }

    /// The second and third steps of transfer `tid` of `qty` units from part
    /// `from` to part `to`: into `to` (once), then `from` forgets it; if `to`
    /// has no counter, the units go back to `from`.
    async fn deliver(&self, from: &str, to: &str, tid: &str, qty: i64) -> Result<(), EngineError> {
        let guard_ms = self.config.guard_ttl.as_millis().to_string();
        let got = self.run_move(to, "in", tid, qty, &guard_ms, None).await?;
        let finish = if got.tag()? == "not_warmed" {
            "back"
        } else {
            "done"
        };
        self.run_move(from, finish, tid, qty, "", None).await?;
        Ok(())
    }

    /// Runs one step of `move.lua` on part `name` (`change`: the fencing
    /// token of the change of parts forcing it, ARGV[6] and ARGV[7]).
    async fn run_move(
        &self,
        name: &str,
        mode: &str,
        tid: &str,
        qty: i64,
        extra: &str,
        change: Option<i64>,
    ) -> Result<Reply, EngineError> {
        let second = if mode == "in" {
            self.keys.moved_in(name, tid)
        } else {
            self.keys.moves(name)
        };
        // A debt's units landing where the debt was paid meanwhile are
        // parked (`move.lua`'s 'park'); any other transfer's go on sale.
        let sixth = if change.is_some() {
            "force"
        } else if debts::is_debt_tid(tid) {
            "park"
        } else {
            ""
        };
        let mut inv = self.scripts.move_units.prepare_invoke();
        inv.key(self.keys.sku(name))
            .key(second)
            .key(self.keys.events(self.keys.shard_of(name)))
            .arg(mode)
            .arg(tid)
            .arg(qty)
            .arg(name)
            .arg(extra)
            .arg(sixth)
            .arg(change.unwrap_or(0));
        Ok(Reply::new(
            inv.invoke_async::<Vec<Value>>(&mut self.conn.clone())
                .await?,
        ))
    }

    /// Finishes every transfer out of a part of `sku` that began at least
    /// `older_ms` ago (a crash between its steps left it): into its target
    /// (guarded, so never twice), then forgotten. How many were finished.
    pub async fn finish_moves(&self, sku: &str) -> Result<u64, EngineError> {
        let Some(parts) = self.parts_of(sku).await? else {
            return Ok(0);
        };
        self.finish_moves_older(sku, parts, 0).await
    }

    async fn finish_moves_older(
        &self,
        sku: &str,
        parts: u16,
        older_ms: i64,
    ) -> Result<u64, EngineError> {
        let names: Vec<String> = (0..parts).map(|j| part_name(sku, j, parts)).collect();
        self.finish_moves_of(sku, &names, older_ms).await
    }

    /// Finishes the transfers out of parts `names` of `sku` that began at
    /// least `older_ms` ago.
    async fn finish_moves_of(
        &self,
        sku: &str,
        names: &[String],
        older_ms: i64,
    ) -> Result<u64, EngineError> {
        // Units parked in these parts (see [`debts`]) are routed first: they
        // are no transfer, but they count in `moving` until routed.
        if let Some((base, _, parts)) = names.first().and_then(|n| keys::parse_part(n)) {
            self.route_parked(base, parts).await?;
        }
        let now = self.redis_time_ms().await?;
        let mut finished = 0;
        for from in names {
            let from = from.as_str();
            let records: HashMap<String, String> = redis::cmd("HGETALL")
                .arg(self.keys.moves(from))
                .query_async(&mut self.conn.clone())
                .await?;
            for (tid, record) in records {
                let mut fields = record.split('|');
                let (Some(qty), Some(to), Some(at)) = (
                    fields.next().and_then(|q| q.parse::<i64>().ok()),
                    fields.next(),
                    fields.next().and_then(|t| t.parse::<i64>().ok()),
                ) else {
                    tracing::error!(%sku, part = %from, transfer = %tid, %record, "a malformed transfer record");
                    continue;
                };
                if now - at < older_ms {
                    continue;
                }
                self.deliver(from, to, &tid, qty).await?;
                finished += 1;
            }
        }
        Ok(finished)
    }

    /// Splits `sku`'s stock into `parts` parts on as many shards (1 puts it
    /// back in one counter), between drops: refused while any of its units
    /// are held, sold but not yet written to PostgreSQL, or moving between
    /// parts. The SKU's available units are spread evenly over the new parts.
    /// Per-buyer counts move with their buyer to the buyer's new part. The
    /// count is recorded in PostgreSQL first (so a counter rebuilt after
    /// Redis lost data is rebuilt with its parts), and set back to what Redis
    /// has when the change is refused or fails.
    pub async fn set_parts(
        &self,
        pg: &sqlx::PgPool,
        sku: &str,
        parts: u16,
    ) -> Result<SplitOutcome, EngineError> {
        if !(1..=MAX_PARTS).contains(&parts) {
            return Ok(SplitOutcome::Invalid(format!(
                "a SKU is split into 1 to {MAX_PARTS} parts"
            )));
        }
        let known: Option<i16> = sqlx::query_scalar("SELECT parts FROM skus WHERE sku = $1")
            .bind(sku)
            .fetch_optional(pg)
            .await?;
        if known.is_none() {
            return Ok(SplitOutcome::Invalid(format!(
                "{sku} is not in the catalogue"
            )));
        }
        let lock = format!("split:{sku}");
        // A token above any a part has seen, even if Redis lost the counter
        // (its shard's data) but not the parts: or every change would be
        // refused by parts that remember a larger one.
        let floor = self.newest_fence(sku).await?;
        let Some(lease) = self.acquire_lock_above(&lock, SPLIT_LEASE, floor).await? else {
            return Ok(SplitOutcome::Refused(format!(
                "{sku} is being split by someone else; try again when they are done"
            )));
        };
        let outcome = match sqlx::query(
            "UPDATE skus SET parts = $2, parts_changing = true WHERE sku = $1",
        )
        .bind(sku)
        .bind(parts as i16)
        .execute(pg)
        .await
        {
            Ok(_) => match self.set_parts_locked(sku, parts, &lease).await {
                // Cut short (a Redis error): once more, from where it stopped
                // (the change finds the parts marked changing and carries on);
                // not when it lost its lease (another may be finishing it).
                Err(e) if !matches!(e, EngineError::Busy(_)) => {
                    tracing::warn!(%sku, parts, error = %e, "changing a SKU's parts was cut short; trying once more");
                    self.set_parts_locked(sku, parts, &lease).await
                }
                done => done,
            },
            Err(e) => Err(e.into()),
        };
        // PostgreSQL keeps what Redis has now, and the change is over; one
        // still cut short keeps its target and stays marked as changing, so
        // the rebalancer finishes it (see `finish_change`). Only while the
        // lease is still this change's: after it lapsed, a newer change may be
        // under way, and its mark must stay.
        if self.extend_lock(&lease, SPLIT_LEASE).await.unwrap_or(false) {
            match self.parts_raw(sku).await {
                Ok(Some(0)) | Err(_) => {}
                Ok(now) => record_change_over(pg, sku, now).await?,
            }
        }
        self.release_lock(&lease).await?;
        outcome
    }

    /// The largest fencing token any part of `sku` has seen (0: none).
    async fn newest_fence(&self, sku: &str) -> Result<i64, EngineError> {
        let names = self.existing_parts(sku).await?;
        let mut pipe = redis::pipe();
        for name in &names {
            pipe.cmd("HGET").arg(self.keys.sku(name)).arg("fence");
        }
        let seen: Vec<Option<i64>> = pipe.query_async(&mut self.conn.clone()).await?;
        Ok(seen.into_iter().flatten().max().unwrap_or(0))
    }

    /// Renews a change's lease, or stops the change when the lease has
    /// lapsed (its process stalled past [`SPLIT_LEASE`]): another process may
    /// be finishing the change by now, and two must not change one SKU's
    /// parts at once.
    async fn keep_lease(&self, sku: &str, lease: &crate::locks::Lease) -> Result<(), EngineError> {
        if self.extend_lock(lease, SPLIT_LEASE).await? {
            Ok(())
        } else {
            Err(EngineError::Busy(format!(
                "the change of {sku}'s parts stalled past its lease and was stopped; \
                 a server's rebalancer finishes it"
            )))
        }
    }

    /// Hands part `name`'s debt (units a feed removed that its holds were to
    /// pay back; with no holds left, a debt of the SKU's) to part 0 of `sku`,
    /// where receipts and returning units pay it: part 0 takes it on first,
    /// so a crash between the two steps owes twice (sells less), never none.
    async fn hand_debt_home(&self, sku: &str, name: &str, fence: i64) -> Result<(), EngineError> {
        let owed: Option<i64> = redis::cmd("HGET")
            .arg(self.keys.sku(name))
            .arg("owed")
            .query_async(&mut self.conn.clone())
            .await?;
        let owed = owed.unwrap_or(0);
        if owed > 0 {
            self.run_split(sku, fence, &["owe", &owed.to_string()])
                .await?;
            self.run_split(name, fence, &["owe", &(-owed).to_string()])
                .await?;
        }
        Ok(())
    }

    /// The `parts` field of `sku`'s counter as it is (0: its parts are being
    /// changed); `None` without a counter.
    async fn parts_raw(&self, sku: &str) -> Result<Option<u16>, EngineError> {
        let (available, parts): (Option<i64>, Option<u16>) = redis::cmd("HMGET")
            .arg(self.keys.sku(sku))
            .arg(&["available", "parts"])
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(available.map(|_| parts.unwrap_or(1)))
    }

    /// Finishes a change of `sku`'s parts that was cut short (its counter
    /// still marked changing, nobody changing it now), to the count
    /// PostgreSQL recorded for it. Whether there was one to finish.
    pub async fn finish_change(&self, pg: &sqlx::PgPool, sku: &str) -> Result<bool, EngineError> {
        let recorded: Option<(i16, bool)> =
            sqlx::query_as("SELECT parts, parts_changing FROM skus WHERE sku = $1")
                .bind(sku)
                .fetch_optional(pg)
                .await?;
        let Some((target, changing)) = recorded else {
            return Ok(false);
        };
        if self.parts_raw(sku).await? != Some(0) {
            if changing {
                // Marked changing in PostgreSQL only: its process ended before
                // it marked a part, or before it recorded its end. Set straight
                // to what Redis has, under the change's lease (so no change is
                // under way).
                if let Some(lease) = self
                    .acquire_lock(&format!("split:{sku}"), SPLIT_LEASE)
                    .await?
                {
                    let now = self.parts_raw(sku).await;
                    if let Ok(now) = now
                        && now != Some(0)
                    {
                        record_change_over(pg, sku, now).await?;
                    }
                    self.release_lock(&lease).await?;
                }
            }
            return Ok(false);
        }
        let outcome = self
            .set_parts(pg, sku, target.clamp(1, MAX_PARTS as i16) as u16)
            .await?;
        if let SplitOutcome::Refused(why) = &outcome {
            // Its process may still be at it (the lease is its own): later.
            tracing::debug!(%sku, why, "a change of a SKU's parts cut short is not finished yet");
            return Ok(false);
        }
        tracing::warn!(%sku, ?outcome, "finished a change of a SKU's parts that was cut short");
        Ok(true)
    }

    async fn set_parts_locked(
        &self,
        sku: &str,
        parts: u16,
        lease: &crate::locks::Lease,
    ) -> Result<SplitOutcome, EngineError> {
        // The count part 0 says (0: a change was cut short).
        let Some(from) = self.parts_raw(sku).await? else {
            return Ok(SplitOutcome::NotWarmed);
        };
        if from == parts {
            return Ok(SplitOutcome::Unchanged);
        }
        // Every part there is, whatever count named it (a change cut short
        // leaves some), with part 0 first.
        let old = self.existing_parts(sku).await?;
        let was = if from > 0 {
            from
        } else {
            old.iter()
                .filter_map(|n| keys::parse_part(n).map(|(_, _, k)| k))
                .max()
                .unwrap_or(1)
        };
        self.finish_moves_of(sku, &old, 0).await?;
        // From here on no hold is made and no unit leaves a part by anyone but
        // this change: every part is marked as changing (reservations answer
        // busy, retry shortly; never sold out), then checked for anything in
        // flight, and the marks are taken back if something is.
        let mut busy = (0, 0, 0);
        for name in &old {
            let reply = self.run_split(name, lease.fence, &["mark", "0"]).await?;
            if reply.tag()? == "marked" {
                busy.0 += reply.int(1)?;
                busy.1 += reply.int(2)?;
                busy.2 += reply.int(3)?;
            }
        }
        if busy.0 > 0 || busy.1 > 0 {
            for name in &old {
                self.run_split(name, lease.fence, &["mark", &was.to_string()])
                    .await?;
            }
            return Ok(SplitOutcome::Refused(format!(
                "{sku} has {} units in open holds and {} sold units not yet written to PostgreSQL: \
                 change its parts when none are left (between drops)",
                busy.0, busy.1
            )));
        }
        self.keep_lease(sku, lease).await?;
        // Transfers that began before the marks land now.
        self.finish_moves_of(sku, &old, 0).await?;
        self.splits.learn(sku, parts);
        let new: Vec<String> = (0..parts).map(|j| part_name(sku, j, parts)).collect();
        self.make_parts(sku, parts, 0, lease.fence).await?;
        // Everything back to part 0, the old parts dropped, then spread.
        for name in old.iter().skip(1).filter(|n| !new.contains(n)) {
            // Its buyers first: a change cut short before the drop finds the
            // part (and them) again when it is run once more.
            self.move_buyers(sku, name, &new, lease.fence).await?;
            let mut dropped = None;
            for _ in 0..3 {
                self.finish_moves_of(sku, std::slice::from_ref(name), 0)
                    .await?;
                self.move_units_as(name, sku, ALL, Some(lease.fence))
                    .await?;
                self.hand_debt_home(sku, name, lease.fence).await?;
                let reply = self.run_split(name, lease.fence, &["drop"]).await?;
                if reply.tag()? != "busy" {
                    dropped = Some(reply);
                    break;
                }
            }
            match dropped {
                Some(reply) if reply.tag()? == "dropped" => {
                    let (sold, settled) = (reply.int(1)?, reply.int(2)?);
                    redis::pipe()
                        .cmd("HINCRBY")
                        .arg(self.keys.sku(sku))
                        .arg("sold")
                        .arg(sold)
                        .ignore()
                        .cmd("HINCRBY")
                        .arg(self.keys.sku(sku))
                        .arg("settled")
                        .arg(settled)
                        .ignore()
                        .query_async::<()>(&mut self.conn.clone())
                        .await?;
                }
                Some(_) => {}
                None => tracing::error!(%sku, part = %name,
                    "an old part could not be emptied and was left; the next change of the SKU's parts empties it"),
            }
            self.keep_lease(sku, lease).await?;
        }
        // Part 0's own buyers, whose part may now be another.
        self.move_buyers(sku, sku, &new, lease.fence).await?;
        if parts > 1 {
            let available = self
                .read_parts(sku, 1)
                .await?
                .map_or(0, |rows| rows[0].available);
            let share = available / i64::from(parts);
            for name in new.iter().skip(1) {
                self.move_units_as(sku, name, share, Some(lease.fence))
                    .await?;
                self.keep_lease(sku, lease).await?;
            }
        }
        // Open for sale under the new count: the other parts first, part 0
        // (which processes that have not seen the change meet) last.
        for name in new.iter().rev() {
            self.run_split(name, lease.fence, &["mark", &parts.to_string()])
                .await?;
        }
        Ok(SplitOutcome::Changed {
            from: was,
            to: parts,
        })
    }

    /// Part 0's name, then every other part of `sku` that has a counter, of
    /// any count (one pipelined look).
    pub(crate) async fn existing_parts(&self, sku: &str) -> Result<Vec<String>, EngineError> {
        let names: Vec<String> = (2..=MAX_PARTS)
            .flat_map(|k| (1..k).map(move |j| part_name(sku, j, k)))
            .collect();
        let mut pipe = redis::pipe();
        for name in &names {
            pipe.cmd("EXISTS").arg(self.keys.sku(name));
        }
        let found: Vec<i64> = pipe.query_async(&mut self.conn.clone()).await?;
        let mut out = vec![sku.to_owned()];
        out.extend(
            names
                .into_iter()
                .zip(found)
                .filter(|(_, f)| *f > 0)
                .map(|(n, _)| n),
        );
        Ok(out)
    }

    /// Moves the per-buyer counts kept on part `from` of `sku` to each buyer's
    /// part among `new` (found with `SCAN`: an operator's action between drops),
    /// each step fenced by the change's token `fence` like its other steps: a
    /// change that stalled past its lease moves no count onto a part a newer
    /// change dropped (where no reservation would see it).
    async fn move_buyers(
        &self,
        sku: &str,
        from: &str,
        new: &[String],
        fence: i64,
    ) -> Result<(), EngineError> {
        let prefix = self.keys.buyer(from, "");
        let found = self
            .connection()
            .scan_match(&format!("{}*", glob_escape(&prefix)))
            .await?;
        for key in found {
            let Some(buyer) = key.strip_prefix(&prefix) else {
                continue;
            };
            let to = &new[usize::from(part_for(buyer, new.len() as u16))];
            let target = self.keys.buyer(to, buyer);
            if target == key {
                continue;
            }
            let (count, ttl): (Option<i64>, i64) = redis::pipe()
                .cmd("GET")
                .arg(&key)
                .cmd("PTTL")
                .arg(&key)
                .query_async(&mut self.conn.clone())
                .await?;
            let Some(count) = count else { continue };
            let (count, ttl) = (count.to_string(), ttl.max(0).to_string());
            for (part, key, args) in [
                (to.as_str(), &target, ["buyer_in", &count, &ttl].as_slice()),
                (from, &key, ["buyer_out"].as_slice()),
            ] {
                let reply = self.run_split_on(part, Some(key), fence, args).await?;
                if reply.tag()? == "gone" {
                    return Err(EngineError::Busy(format!(
                        "part {part} of {sku} is gone: a newer change of its parts took over"
                    )));
                }
            }
            tracing::debug!(%sku, %buyer, count, "moved a buyer's count to its new part");
        }
        Ok(())
    }

    /// Runs one step of `split.lua` on part `name`: `args[0]` the mode, the
    /// rest its arguments; `fence` the fencing token of the change the step
    /// belongs to (0 for a step of anything else). A change's step on a part
    /// a newer change has touched is refused ([`EngineError::Busy`]).
    async fn run_split(&self, name: &str, fence: i64, args: &[&str]) -> Result<Reply, EngineError> {
        self.run_split_on(name, None, fence, args).await
    }

    /// [`Engine::run_split`] with a second key of the part's slot (KEYS[2]:
    /// a buyer's counter on it).
    async fn run_split_on(
        &self,
        name: &str,
        second: Option<&str>,
        fence: i64,
        args: &[&str],
    ) -> Result<Reply, EngineError> {
        let mut inv = self.scripts.split.prepare_invoke();
        inv.key(self.keys.sku(name));
        if let Some(key) = second {
            inv.key(key);
        }
        let (mode, rest) = args.split_first().unwrap_or((&"", &[]));
        inv.arg(*mode).arg(fence);
        for arg in rest {
            inv.arg(*arg);
        }
        let reply = Reply::new(
            inv.invoke_async::<Vec<Value>>(&mut self.conn.clone())
                .await?,
        );
        fenced(name, &reply)?;
        Ok(reply)
    }

    /// Moves every other part's available units to part 0 (a feed's decrease
    /// or snapshot, a correction: applied where nothing else can be sold).
    ///
    /// Every transfer under way is finished first (into its target, once:
    /// its own mover then finds it done), so no unit is on its way to
    /// another part when this returns, unless a gathering began since.
    pub(crate) async fn gather_all(&self, sku: &str, parts: u16) -> Result<(), EngineError> {
        self.finish_moves_older(sku, parts, 0).await?;
        for j in 1..parts {
            self.move_units(&part_name(sku, j, parts), sku, ALL).await?;
        }
        self.finish_moves_older(sku, parts, 0).await?;
        Ok(())
    }

    /// Every part's counters; `None` when one is missing.
    async fn read_all_parts(
        &self,
        sku: &str,
        parts: u16,
    ) -> Result<Option<Vec<PartFull>>, EngineError> {
        Ok(self
            .read_full(sku, parts)
            .await?
            .into_iter()
            .collect::<Option<Vec<_>>>())
    }

    /// Every part's counters (`None`: missing), in part order.
    async fn read_full(&self, sku: &str, parts: u16) -> Result<Vec<Option<PartFull>>, EngineError> {
        let mut pipe = redis::pipe();
        for j in 0..parts {
            pipe.cmd("HMGET")
                .arg(self.keys.sku(&part_name(sku, j, parts)))
                .arg(&[
                    "available",
                    "reserved",
                    "sold_pending",
                    "owed",
                    "moving",
                    "settled",
                    "gen",
                    "fed",
                    "ins",
                    "parked",
                    "hold_back",
                ]);
        }
        let rows: Vec<[Option<i64>; 11]> = pipe.query_async(&mut self.conn.clone()).await?;
        Ok(rows
            .into_iter()
            .map(|[a, r, p, o, m, s, g, f, i, k, h]| {
                a.map(|available| PartFull {
                    available,
                    reserved: r.unwrap_or(0),
                    sold_pending: p.unwrap_or(0),
                    owed: o.unwrap_or(0),
                    moving: m.unwrap_or(0),
                    settled: s.unwrap_or(0),
                    rises: g.unwrap_or(0),
                    fed: f.unwrap_or(0),
                    ins: i.unwrap_or(0),
                    parked: k.unwrap_or(0),
                    hold_back: h.unwrap_or(0),
                })
            })
            .collect())
    }

    /// Every part of `sku` (split into `parts`) as at one moment with no unit
    /// on its way between parts, so that their sums are the SKU's exactly:
    /// the transfers under way are finished, then every part is read twice.
    /// When both reads of every part agree in [`PartFull::mark`] and no part
    /// has units moving, no transfer touched any part between its two reads
    /// (an `in` raises `ins`; an `out` then `done` lowers the units), and
    /// every first read came before every second one: at the moment between
    /// the two, the parts' units were as read, with nothing in flight, while
    /// shoppers go on holding, paying and releasing. A plain read can count a
    /// unit twice (landed in its target, not yet forgotten by its source) or
    /// not at all (read in its target before it landed, in its source after
    /// it left): a measure of drift, or a count applied, was then off by
    /// those units. The rows returned are the second read's (their sum of
    /// units is the moment's; single fields may have moved with shoppers).
    ///
    /// Tried [`AT_REST_TRIES`] times; while shoppers keep moving units the
    /// answer may not be exact (see [`PartsRead::exact`]).
    pub(crate) async fn read_at_rest(
        &self,
        sku: &str,
        parts: u16,
    ) -> Result<PartsRead, EngineError> {
        let names: Vec<String> = (0..parts).map(|j| part_name(sku, j, parts)).collect();
        let mut last = self.read_full(sku, parts).await?;
        for round in 0..AT_REST_TRIES {
            if round > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
            self.finish_moves_of(sku, &names, 0).await?;
            let first = self.read_full(sku, parts).await?;
            let second = self.read_full(sku, parts).await?;
            let marks = |rows: &[Option<PartFull>]| -> Vec<Option<(i64, i64, i64)>> {
                rows.iter().map(|r| r.map(|r| r.mark())).collect()
            };
            if marks(&first) == marks(&second) && first.iter().flatten().all(|r| r.in_flight() == 0)
            {
                return Ok(PartsRead {
                    rows: second,
                    exact: true,
                });
            }
            last = first
                .iter()
                .zip(&second)
                .map(|(a, b)| match (a, b) {
                    (Some(a), Some(b)) => Some(a.max(*b)),
                    (a, b) => a.or(*b),
                })
                .collect();
        }
        Ok(PartsRead {
            rows: last,
            exact: false,
        })
    }

    /// What the parts other than part 0 keep of `sku`'s on-hand units (their
    /// holds, sales pending, `available - owed`), read at rest (see
    /// [`Engine::read_at_rest`]), and part 0 as read at that moment (for
    /// `snapshot.lua`'s compare-and-set): what a count applied to part 0 must
    /// leave them. `None` while units keep moving between the parts.
    pub(crate) async fn kept_by_other_parts(
        &self,
        sku: &str,
        parts: u16,
    ) -> Result<Option<(i64, PartFull)>, EngineError> {
        let read = self.read_at_rest(sku, parts).await?;
        let Some(Some(home)) = read.rows.first().copied() else {
            return Ok(None);
        };
        if !read.exact {
            return Ok(None);
        }
        let kept = read
            .rows
            .iter()
            .skip(1)
            .flatten()
            .map(|r| r.reserved + r.sold_pending + r.available - r.owed + r.moving)
            .sum();
        Ok(Some((kept, home)))
    }

    /// What warm-up must take off PostgreSQL's `on_hand` and `sold_recorded`
    /// when it writes part 0 of `sku` (split into `parts`): what the other
    /// parts hold (available, reserved, sold pending; every part's units
    /// moving) and the sales they settled. Their counters stand as they are.
    pub(crate) async fn warm_share(
        &self,
        sku: &str,
        parts: u16,
    ) -> Result<(i64, i64), EngineError> {
        // At rest, or else a bound that counts a unit on its way twice rather
        // than not at all: part 0 gets at most what is its own.
        let rows = self.read_at_rest(sku, parts).await?.rows;
        let (mut held, mut settled) = (0, 0);
        for (j, row) in rows.iter().enumerate() {
            let Some(r) = row else { continue };
            held += r.moving;
            if j > 0 {
                held += r.available + r.reserved + r.sold_pending;
                settled += r.settled;
            }
        }
        Ok((held, settled))
    }

    /// After warm-up wrote part 0 of `sku`: it is marked as split into
    /// `parts`, and every other part that is missing (lost with its shard's
    /// data) is made again with part 0's settings and its share of the
    /// stock (see [`Engine::lost_part_share`]), after the counts of the
    /// buyers routed to it (which went with it) are restored from `pg`'s
    /// confirmed holds: before any reservation can reach it.
    pub(crate) async fn keep_parts(
        &self,
        pg: &mut sqlx::PgConnection,
        sku: &str,
        parts: u16,
        recorded: &holdfast_domain::Recorded,
    ) -> Result<(), EngineError> {
        if self
            .run_split(sku, 0, &["mark", &parts.to_string()])
            .await?
            .tag()?
            != "marked"
        {
            return Ok(());
        }
        self.splits.learn(sku, parts);
        let [limit, opens, closes] = self.settings_of(sku).await?;
        for j in 1..parts {
            let name = part_name(sku, j, parts);
            let exists: bool = redis::cmd("EXISTS")
                .arg(self.keys.sku(&name))
                .query_async(&mut self.conn.clone())
                .await?;
            if exists {
                continue;
            }
            let share = self.lost_part_share(sku, parts, j, recorded).await?;
            crate::warmup::restore_buyers(self, pg, &[(sku, parts)], Some(j)).await?;
            let made = self
                .run_split(
                    &name,
                    0,
                    &[
                        "make",
                        &parts.to_string(),
                        &limit.to_string(),
                        &opens.to_string(),
                        &closes.to_string(),
                        &share.available.max(0).to_string(),
                        &(-share.available).max(0).to_string(),
                        &share.reserved.to_string(),
                        &share.settled.to_string(),
                    ],
                )
                .await?;
            if made.tag()? == "made" {
                tracing::warn!(%sku, part = %name, available = share.available,
                    reserved = share.reserved,
                    "a part of a split SKU lost with its shard's data was made again with its share");
            }
        }
        self.copy_settings(sku, parts).await
    }

    /// What part `j` of `sku` (split into `parts`), lost with its shard's
    /// data, must be made again with: as warm-up rebuilds a lost counter from
    /// PostgreSQL, every unit the other parts do not keep (read at rest, or
    /// else counting a unit on its way twice: the part then gets less, never
    /// more), less the units in its holds that survived (kept as reserved);
    /// and the sales PostgreSQL recorded that the other parts have not
    /// settled, as its `settled`. A negative `available` is a debt. Like any
    /// counter rebuilt from PostgreSQL, sales made on the part and lost before
    /// PostgreSQL recorded them are on sale again.
    async fn lost_part_share(
        &self,
        sku: &str,
        parts: u16,
        j: u16,
        recorded: &holdfast_domain::Recorded,
    ) -> Result<PartFull, EngineError> {
        let name = part_name(sku, j, parts);
        let read = self.read_at_rest(sku, parts).await?;
        let home_fed = read.rows.first().copied().flatten().map_or(0, |r| r.fed);
        let (mut kept, mut settled) = (0, 0);
        for (i, row) in read.rows.iter().enumerate() {
            let Some(r) = row else { continue };
            if i != usize::from(j) {
                kept += r.available + r.reserved + r.sold_pending - r.owed + r.moving;
                settled += r.settled;
            }
        }
        let held: i64 = self
            .holds_of(&name, 100_000)
            .await?
            .iter()
            .flat_map(|h| &h.lines)
            .filter(|l| l.sku == name)
            .map(|l| l.qty)
            .sum();
        Ok(PartFull {
            available: recorded.on_hand + (home_fed - recorded.fed_recorded) - kept - held,
            reserved: held,
            sold_pending: 0,
            owed: 0,
            moving: 0,
            settled: recorded.sold_recorded - settled,
            rises: 0,
            fed: 0,
            ins: 0,
            parked: 0,
            hold_back: 0,
        })
    }

    /// Writes part 0's window and limit into every other part of `sku` (a
    /// forced warm-up, or a process that had not seen the split, wrote them
    /// to part 0 alone).
    async fn copy_settings(&self, sku: &str, parts: u16) -> Result<(), EngineError> {
        let [limit, opens, closes] = self.settings_of(sku).await?;
        for j in 1..parts {
            let mut inv = self.scripts.schedule.prepare_invoke();
            inv.key(self.keys.sku(&part_name(sku, j, parts)))
                .arg(opens)
                .arg(closes)
                .arg(limit);
            inv.invoke_async::<i64>(&mut self.conn.clone()).await?;
        }
        Ok(())
    }

    /// Makes every part of `sku` but part 0 that is missing, empty, with part
    /// 0's window and limit, marked `mark` (the count, or 0 while changing),
    /// for the change with fencing token `fence`.
    async fn make_parts(
        &self,
        sku: &str,
        parts: u16,
        mark: u16,
        fence: i64,
    ) -> Result<(), EngineError> {
        let [limit, opens, closes] = self.settings_of(sku).await?;
        for j in 1..parts {
            self.run_split(
                &part_name(sku, j, parts),
                fence,
                &[
                    "make",
                    &mark.to_string(),
                    &limit.to_string(),
                    &opens.to_string(),
                    &closes.to_string(),
                ],
            )
            .await?;
        }
        Ok(())
    }

    /// Part 0's per-buyer limit, opening and closing time (0 where unset).
    async fn settings_of(&self, sku: &str) -> Result<[i64; 3], EngineError> {
        let (limit, opens, closes): (Option<i64>, Option<i64>, Option<i64>) = redis::cmd("HMGET")
            .arg(self.keys.sku(sku))
            .arg(&["limit", "opens", "closes"])
            .query_async(&mut self.conn.clone())
            .await?;
        Ok([limit.unwrap_or(0), opens.unwrap_or(0), closes.unwrap_or(0)])
    }

    /// Corrects a split SKU's drift (`available - owed` of all its parts
    /// minus what the equation expects) on part 0, as `correct.lua` does an
    /// unsplit SKU's: while the parts' conserved sum is still `conserved`
    /// (read at rest, see [`Engine::read_at_rest`]) and no unit moved to or
    /// from part 0 since, however busy its shoppers are. The parts are
    /// marked `hold_back` first, as for a feed lowering stock: a correction
    /// may leave part 0 owing units held elsewhere, and nothing may go on
    /// sale on another part then (see [`debts`]); the debt goes where a
    /// feed's goes. Whether it wrote (a SKU whose parts kept moving, or whose
    /// sum changed, is left for the next run).
    pub(crate) async fn correct_split(
        &self,
        sku: &str,
        parts: u16,
        drift: i64,
        conserved: i64,
    ) -> Result<bool, EngineError> {
        let token = self.hold_back(sku, parts).await?;
        let mut owing = None;
        for _ in 0..CORRECT_TRIES {
            let read = self.read_at_rest(sku, parts).await?;
            let Some(rows) = read.rows.iter().copied().collect::<Option<Vec<_>>>() else {
                break;
            };
            if !read.exact {
                continue;
            }
            if whole_of(&rows).conserved() != Some(conserved) {
                // Not the SKU measured: the next run measures it again.
                break;
            }
            let home = rows[0];
            let mut inv = self.scripts.correct.prepare_invoke();
            inv.key(self.keys.sku(sku))
                .key(self.keys.events(self.keys.shard_of(sku)))
                .arg(sku)
                .arg(home.mark().0)
                .arg(-drift)
                .arg(format!("{}:{}", home.in_flight(), home.ins));
            let reply = Reply::new(
                inv.invoke_async::<Vec<Value>>(&mut self.conn.clone())
                    .await?,
            );
            match reply.tag()?.as_str() {
                "moved" => continue,
                "corrected" => owing = Some(reply.int(2)? > 0),
                _ => {}
            }
            break;
        }
        match owing {
            // Units elsewhere pay part 0's debt, or it goes to the holds.
            Some(true) => self.after_feed(sku, parts, Some(token)).await?,
            // Units it put on sale (or parked) pay the other parts' debts.
            _ => {
                self.settle_debts(sku, parts, Some(token)).await?;
            }
        }
        Ok(owing.is_some())
    }

    /// Evens out `sku`'s parts while stock is plentiful, so that a part runs
    /// short (and a reservation gathers) only near the end: every part below
    /// half the parts' mean gets units up to the mean from the parts above
    /// it. Nothing moves once fewer units than parts are left (reservations
    /// gather those themselves). How many units moved.
    pub async fn rebalance(&self, sku: &str) -> Result<i64, EngineError> {
        let Some(parts) = self.parts_of(sku).await? else {
            return Ok(0);
        };
        if parts < 2 {
            return Ok(0);
        }
        // A debt first: units parked, or on sale in one part while another
        // owes units (held units a feed removed), pay it (see [`debts`]).
        let mut moved = self.settle_debts(sku, parts, None).await?;
        let Some(full) = self.read_all_parts(sku, parts).await? else {
            return Ok(moved);
        };
        if full.iter().any(|r| r.in_flight() > 0 || r.parked > 0) {
            // A transfer a crash left half done: finished, then evened next time.
            return Ok(moved + self.finish_moves_older(sku, parts, MOVE_GRACE_MS).await? as i64);
        }
        let mut available: Vec<i64> = match self.read_parts(sku, parts).await? {
            Some(rows) => rows.iter().map(|r| r.available).collect(),
            None => return Ok(moved),
        };
        let total: i64 = available.iter().sum();
        let mean = total / i64::from(parts);
        if mean < 1 {
            return Ok(moved);
        }
        for short in 0..available.len() {
            if available[short] * 2 >= mean {
                continue;
            }
            while available[short] < mean {
                let Some(rich) = (0..available.len())
                    .filter(|&j| available[j] > mean)
                    .max_by_key(|&j| available[j])
                else {
                    break;
                };
                let want = (available[rich] - mean).min(mean - available[short]);
                let got = self
                    .move_units(
                        &part_name(sku, rich as u16, parts),
                        &part_name(sku, short as u16, parts),
                        want,
                    )
                    .await?;
                if got < 1 {
                    break;
                }
                available[rich] -= got;
                available[short] += got;
                moved += got;
            }
        }
        Ok(moved)
    }

    /// The split SKUs, and those whose parts are being changed (or whose
    /// change was cut short, whatever its target), as PostgreSQL records them
    /// (a few: an index finds them).
    pub async fn split_skus(pg: &sqlx::PgPool) -> Result<Vec<String>, EngineError> {
        Ok(sqlx::query_scalar(
            "SELECT sku FROM skus WHERE parts > 1 OR parts_changing ORDER BY sku",
        )
        .fetch_all(pg)
        .await?)
    }

    /// Adds to `figures` (read from part 0's counter, which says the SKU has
    /// `parts` parts) the other parts' figures: one pipelined call.
    pub(crate) async fn add_parts(
        &self,
        sku: &str,
        parts: u16,
        figures: &mut Figures,
    ) -> Result<(), EngineError> {
        let mut pipe = redis::pipe();
        for j in 1..parts {
            let name = part_name(sku, j, parts);
            pipe.cmd("HMGET")
                .arg(self.keys.sku(&name))
                .arg(&[
                    "available",
                    "reserved",
                    "sold_pending",
                    "sold",
                    "owed",
                    "moving",
                ])
                .cmd("ZCARD")
                .arg(self.keys.sku_holds(&name));
        }
        let replies: Vec<Value> = pipe.query_async(&mut self.conn.clone()).await?;
        for pair in replies.chunks(2) {
            let bad = |e: redis::ParsingError| EngineError::UnexpectedReply(e.to_string());
            let [row, holds] = pair else { continue };
            let row: Vec<Option<i64>> = redis::from_redis_value_ref(row).map_err(bad)?;
            let holds: u64 = redis::from_redis_value_ref(holds).map_err(bad)?;
            let field = |i: usize| row.get(i).copied().flatten().unwrap_or(0);
            figures.available += field(0);
            figures.reserved += field(1);
            figures.sold_pending += field(2);
            figures.sold += field(3);
            figures.owed += field(4);
            figures.moving += field(5);
            figures.open_holds += holds;
        }
        figures.parts = parts;
        Ok(())
    }
}

/// Records in PostgreSQL that the change of `sku`'s parts is over, with the
/// count Redis has now (`None`: no counter; the target recorded stays, for
/// the warm-up that makes it).
async fn record_change_over(
    pg: &sqlx::PgPool,
    sku: &str,
    now: Option<u16>,
) -> Result<(), EngineError> {
    sqlx::query(
        "UPDATE skus SET parts = coalesce($2, parts), parts_changing = false WHERE sku = $1",
    )
    .bind(sku)
    .bind(now.map(|n| n as i16))
    .execute(pg)
    .await?;
    Ok(())
}

/// Stops a change of parts whose step on part `name` was refused because a
/// newer change (which took the lease after this one's lapsed) has touched
/// the part: `{'fenced', seen}` from `split.lua` or `move.lua`.
fn fenced(name: &str, reply: &Reply) -> Result<(), EngineError> {
    if reply.tag()? == "fenced" {
        return Err(EngineError::Busy(format!(
            "a change of {name}'s parts stalled past its lease and was stopped: \
             a newer change (fencing token {}) has taken over",
            reply.int(1)?
        )));
    }
    Ok(())
}

/// The lease a change of a SKU's parts holds, renewed after each step: short,
/// because while a change cut short (its process killed) holds it, the SKU
/// answers busy until the rebalancer can take it and finish the change.
const SPLIT_LEASE: std::time::Duration = std::time::Duration::from_secs(5);

/// More units than any part holds: "all of them" to `move.lua`.
const ALL: i64 = 1_000_000_000_000_000;

/// How long a transfer may be under way before a gathering finishes it
/// itself (its own mover is normally done within a few milliseconds).
const MOVE_GRACE_MS: i64 = 2_000;

/// The part (of `parts`) that requests keyed by `by` (a buyer, or a
/// reservation id) go to: stable across processes.
pub(crate) fn part_for(by: &str, parts: u16) -> u16 {
    // FNV-1a's low bits depend only on the low bits of each byte, so ids that
    // differ in a counter (`order-1`, `order-2`, …) would go round the parts in
    // turn; a finaliser (MurmurHash3's) mixes every bit into the low ones.
    let mut h = keys::fnv(by);
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    (h % u32::from(parts.max(1))) as u16
}

/// `outcome` naming SKUs, not parts.
fn to_whole_skus(outcome: ReserveOutcome) -> ReserveOutcome {
    let whole = |s: String| base_sku(&s).to_owned();
    match outcome {
        ReserveOutcome::Reserved {
            reservation_id,
            expires_at_ms,
            available_after,
        } => ReserveOutcome::Reserved {
            reservation_id,
            expires_at_ms,
            available_after: available_after
                .into_iter()
                .map(|(s, a)| (whole(s), a))
                .collect(),
        },
        ReserveOutcome::AlreadyReserved {
            reservation_id,
            state,
            expires_at_ms,
            available_after,
        } => ReserveOutcome::AlreadyReserved {
            reservation_id,
            state,
            expires_at_ms,
            available_after: available_after
                .into_iter()
                .map(|(s, a)| (whole(s), a))
                .collect(),
        },
        ReserveOutcome::NotWarmed { sku } => ReserveOutcome::NotWarmed { sku: whole(sku) },
        ReserveOutcome::SoldOut {
            sku,
            available,
            replayed,
        } => ReserveOutcome::SoldOut {
            sku: whole(sku),
            available,
            replayed,
        },
        ReserveOutcome::LimitExceeded {
            sku,
            limit,
            already,
        } => ReserveOutcome::LimitExceeded {
            sku: whole(sku),
            limit,
            already,
        },
        ReserveOutcome::BuyerRequired { sku, limit } => ReserveOutcome::BuyerRequired {
            sku: whole(sku),
            limit,
        },
        ReserveOutcome::NotStarted { sku, starts_at_ms } => ReserveOutcome::NotStarted {
            sku: whole(sku),
            starts_at_ms,
        },
        ReserveOutcome::Ended { sku, ended_at_ms } => ReserveOutcome::Ended {
            sku: whole(sku),
            ended_at_ms,
        },
        other => other,
    }
}

/// `hold` naming SKUs, not parts.
pub(crate) fn hold_of_skus(hold: Hold) -> Hold {
    Hold {
        lines: hold
            .lines
            .into_iter()
            .map(|l| Line {
                sku: base_sku(&l.sku).to_owned(),
                qty: l.qty,
            })
            .collect(),
        ..hold
    }
}

/// `text` with `SCAN`'s glob characters escaped.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{glob_escape, part_for};

    #[test]
    fn a_buyer_always_lands_on_one_part() {
        assert_eq!(part_for("buyer-7", 4), part_for("buyer-7", 4));
        let used: std::collections::BTreeSet<u16> =
            (0..200).map(|i| part_for(&format!("b{i}"), 8)).collect();
        assert_eq!(used.len(), 8, "200 buyers reach every part");
        assert_eq!(part_for("anyone", 1), 0);
    }

    #[test]
    fn scan_patterns_escape_globs() {
        assert_eq!(
            glob_escape("hf:{hf1}:buyer:A~1/4:"),
            "hf:{hf1}:buyer:A~1/4:"
        );
        assert_eq!(glob_escape("a*b?[c]"), "a\\*b\\?\\[c\\]");
    }
}
