//! Debts of split SKUs: held units a feed removed (`owed`), spread over
//! parts that cannot see each other.
//!
//! An unsplit SKU's debt is paid by the first units that come back: no unit
//! goes on sale while it owes. A split SKU's debt sits on the parts whose
//! holds will pay it back ([`Engine::spread_owed`]), so a part that owes
//! nothing cannot know, in its own script, that another part does. Hence:
//!
//! **Holding back.** Before a feed lowers a split SKU, every part is marked
//! `hold_back` (a deadline, ms; `split.lua`). On a marked part, units coming
//! back (a release, an expiry, an overdue payment) or arriving (a transfer,
//! a feed) pay the part's own debt first, and the rest is *parked*: counted
//! in `parked` and in `moving` (so every sum of the SKU's units still counts
//! them, and the sold-out check still sees them), not on sale.
//!
//! **Routing** ([`Engine::route_parked`]). The engine reads every part and
//! sends parked units to the parts that owe (`move.lua`'s `aim`, then a
//! transfer like any other, paying the target's debt when it lands), and
//! puts the rest on sale where it is (`unpark`) once no part owes. It runs
//! right after the call that parked them, and from the rebalancer and every
//! finishing of transfers, so units a crash left parked are routed too. A
//! part's mark is cleared (`let_go`, only if it is still the token read)
//! once no part owes and no unit is parked, and the mark's deadline has
//! passed (or it was the caller's own feed's); while any part owes, every
//! part is kept marked.
//!
//! **Handing a debt on** ([`Engine::before_paying`]). A part taking on
//! another's debt owes it and sends as many units to that part
//! (`move.lua`'s `owe_out`), which pay the debt there when they land: what
//! the other part no longer owes by then arrives as units (parked, then
//! routed). So however many payments hand the same debt at once, no unit of
//! it is counted twice (remediations opened for units that were not
//! oversold) or lost.

use std::time::Duration;

use crate::engine::Engine;
use crate::error::EngineError;
use crate::keys::{self, part_name};
use crate::locks::Lease;
use crate::model::Line;

use super::PartFull;

/// How long a feed's `hold_back` mark stands at least (ms): longer than any
/// feed's own steps, so a mark is not cleared while its feed is still
/// gathering units to part 0 (before its debt exists).
const HOLD_BACK_MS: i64 = 10_000;

/// How many rounds [`Engine::route_parked`] makes before leaving the rest to
/// the rebalancer (each round routes what it read; units parked again on
/// arrival, because a debt was paid meanwhile, wait for the next).
const ROUTE_ROUNDS: usize = 4;

/// The lease of a payment handing a split SKU's debt on: longer than its
/// few steps take.
const DEBT_LEASE: Duration = Duration::from_secs(2);

/// How many times a payment under the debt lease hands its debt on and
/// tries again (see [`Engine::paying_judged`]) before it reports.
const JUDGE_ROUNDS: usize = 4;

/// How long a payment waits for that lease before going ahead without.
const DEBT_WAIT: Duration = Duration::from_secs(2);

/// A new transfer id for units or a debt moving to pay a debt: `move.lua`
/// parks what of them lands where nothing is owed any more (while the part
/// is marked), where a gathering's or rebalancing's units go on sale.
pub(super) fn debt_tid() -> String {
    format!("debt-{}", uuid::Uuid::new_v4().simple())
}

/// Whether transfer `tid` is a debt's ([`debt_tid`]).
pub(super) fn is_debt_tid(tid: &str) -> bool {
    tid.starts_with("debt-")
}

/// The lease under which `sku`'s debt is handed between its parts (a
/// payment's hand-off, a feed's spreading).
fn debt_lease(sku: &str) -> String {
    format!("debts:{sku}")
}

impl Engine {
    /// Marks every part of `sku` `hold_back` before a feed lowers it: from
    /// here, units coming back to a part or arriving at it are parked, not
    /// put on sale. The mark's token (a deadline), for [`Engine::after_feed`].
    pub(crate) async fn hold_back(&self, sku: &str, parts: u16) -> Result<i64, EngineError> {
        let token = self.redis_time_ms().await? + HOLD_BACK_MS;
        self.mark_parts(sku, parts, token, |_| true).await?;
        Ok(token)
    }

    /// Marks with `token` the parts of `sku` that `mark` picks (by index).
    async fn mark_parts(
        &self,
        sku: &str,
        parts: u16,
        token: i64,
        mark: impl Fn(usize) -> bool,
    ) -> Result<(), EngineError> {
        let token = token.to_string();
        for j in (0..parts).filter(|&j| mark(usize::from(j))) {
            self.run_split(&part_name(sku, j, parts), 0, &["hold_back", &token])
                .await?;
        }
        Ok(())
    }

    /// After a feed applied to part 0 of `sku` (having marked the parts
    /// with `token`, see [`Engine::hold_back`]): units that reached another
    /// part meanwhile (a transfer that was on its way, units parked there)
    /// come to part 0, paying its debt first (a few rounds, until no other
    /// part has any and nothing is moving); the debt left goes to the parts
    /// whose holds will pay it back (under the SKU's debt lease, see
    /// [`Engine::paying_judged`]); units on sale or parked anywhere pay the
    /// debts; and the marks are cleared if nothing is owed.
    pub(crate) async fn after_feed(
        &self,
        sku: &str,
        parts: u16,
        token: Option<i64>,
    ) -> Result<(), EngineError> {
        for _ in 0..4 {
            let rows = self.read_full(sku, parts).await?;
            let stray = rows
                .iter()
                .enumerate()
                .flat_map(|(j, r)| r.map(|r| (j, r)))
                .any(|(j, r)| r.moving > 0 || (j > 0 && r.available > 0));
            if !stray {
                break;
            }
            self.gather_all(sku, parts).await?;
        }
        // Under the SKU's debt lease, as a payment's hand-off is: a payment
        // meanwhile finds the debt where the feed left it, not half handed.
        let lease = self.wait_for_lease(&debt_lease(sku)).await?;
        let spread = self.spread_owed(sku, parts).await;
        if let Some(lease) = &lease {
            self.release_lock(lease).await?;
        }
        spread?;
        self.settle_debts(sku, parts, token).await?;
        Ok(())
    }

    /// Pays `sku`'s debts with what can pay them (parked units, then units
    /// on sale in other parts), keeps every part marked while any owes, and
    /// clears the marks once none does (those whose deadline passed, and
    /// `own`, the caller's feed's). How many units moved.
    pub(crate) async fn settle_debts(
        &self,
        sku: &str,
        parts: u16,
        own: Option<i64>,
    ) -> Result<i64, EngineError> {
        // Units on sale first: what of them lands where nothing is owed is
        // parked, and routed next.
        let moved = self.pay_debts(sku, parts).await? + self.route_parked(sku, parts).await?;
        let rows = self.read_full(sku, parts).await?;
        let present = || rows.iter().flatten();
        if present().any(|r| r.owed > 0) {
            // Parts remade since (a loss of data) or a mark that lapsed and
            // was cleared before this debt: marked again while it lasts.
            if present().any(|r| r.hold_back == 0) {
                let token = self.redis_time_ms().await? + HOLD_BACK_MS;
                self.mark_parts(sku, parts, token, |j| {
                    rows.get(j)
                        .copied()
                        .flatten()
                        .is_some_and(|r| r.hold_back == 0)
                })
                .await?;
            }
        } else if present().all(|r| r.parked == 0) && present().any(|r| r.hold_back > 0) {
            let now = self.redis_time_ms().await?;
            for (j, row) in rows.iter().enumerate() {
                let Some(row) = row else { continue };
                if row.hold_back > 0 && (row.hold_back <= now || Some(row.hold_back) == own) {
                    self.run_split(
                        &part_name(sku, j as u16, parts),
                        0,
                        &["let_go", &row.hold_back.to_string()],
                    )
                    .await?;
                }
            }
        }
        Ok(moved)
    }

    /// Routes the units parked in `sku`'s parts: to the parts that owe (the
    /// part's own debt first, then the largest), and on sale where they are
    /// once no part owes. How many units were routed.
    pub(crate) async fn route_parked(&self, sku: &str, parts: u16) -> Result<i64, EngineError> {
        let mut routed = 0;
        for _ in 0..ROUTE_ROUNDS {
            let rows = self.read_full(sku, parts).await?;
            if rows.iter().flatten().all(|r| r.parked == 0) {
                break;
            }
            let mut owed: Vec<i64> = rows.iter().map(|r| r.map_or(0, |r| r.owed)).collect();
            for (j, row) in rows.iter().enumerate() {
                let Some(PartFull { parked, .. }) = row else {
                    continue;
                };
                routed += self.route_from(sku, parts, j, *parked, &mut owed).await?;
            }
        }
        Ok(routed)
    }

    /// Routes up to `parked` units parked in part `j` of `sku` to the debts
    /// in `owed` (each part's, as read; lowered by what is sent).
    async fn route_from(
        &self,
        sku: &str,
        parts: u16,
        j: usize,
        parked: i64,
        owed: &mut [i64],
    ) -> Result<i64, EngineError> {
        let from = part_name(sku, j as u16, parts);
        let mut left = parked;
        while left > 0 {
            let target = if owed[j] > 0 {
                Some(j)
            } else {
                (0..owed.len())
                    .filter(|&o| owed[o] > 0)
                    .max_by_key(|&o| owed[o])
            };
            let Some(o) = target else {
                let reply = self.run_move(&from, "unpark", "", left, "", None).await?;
                return Ok(parked - left + reply.int(1).unwrap_or(0));
            };
            let to = part_name(sku, o as u16, parts);
            let tid = debt_tid();
            let want = left.min(owed[o]);
            let reply = self.run_move(&from, "aim", &tid, want, &to, None).await?;
            let got = reply.int(1).unwrap_or(0);
            if got < 1 {
                break;
            }
            if o != j {
                self.deliver(&from, &to, &tid, got).await?;
            }
            owed[o] -= got;
            left -= got;
        }
        Ok(parked - left)
    }

    /// Units of `sku` parked by the script that ended `lines`' hold (see the
    /// module's notes), routed now so they are not held back longer than the
    /// debts need. A failure is logged: the rebalancer routes them later.
    pub(crate) async fn route_after(&self, lines: &[Line]) {
        for line in lines {
            let Some((sku, _, parts)) = keys::parse_part(&line.sku) else {
                continue;
            };
            if let Err(e) = self.settle_debts(sku, parts, None).await {
                tracing::warn!(%sku, error = %e, "units parked by a returning hold were not routed yet; the rebalancer will");
            }
        }
    }

    /// Pays each part's debt (units in holds a feed removed) with units on
    /// sale in the other parts: units that do not exist are not sold while
    /// there is a debt (arriving units pay a part's debt first). How many
    /// units moved.
    async fn pay_debts(&self, sku: &str, parts: u16) -> Result<i64, EngineError> {
        let Some(full) = self.read_all_parts(sku, parts).await? else {
            return Ok(0);
        };
        let mut available: Vec<i64> = full.iter().map(|r| r.available).collect();
        let mut moved = 0;
        for (owing, row) in full.iter().enumerate() {
            let mut debt = row.owed;
            while debt > 0 {
                let Some(rich) = (0..available.len())
                    .filter(|&j| j != owing && available[j] > 0)
                    .max_by_key(|&j| available[j])
                else {
                    break;
                };
                let got = self
                    .move_units_with(
                        &part_name(sku, rich as u16, parts),
                        &part_name(sku, owing as u16, parts),
                        debt.min(available[rich]),
                        None,
                        &debt_tid(),
                    )
                    .await?;
                if got < 1 {
                    break;
                }
                available[rich] -= got;
                debt -= got;
                moved += got;
            }
        }
        Ok(moved)
    }

    /// Hands part 0's debt (units in holds a feed removed) to the parts whose
    /// holds will pay it back when they end, up to each one's held units not
    /// already owed.
    pub(crate) async fn spread_owed(&self, sku: &str, parts: u16) -> Result<(), EngineError> {
        self.hand_debt(sku, parts, 0, 0).await.map(|_| ())
    }

    /// Hands part `from`'s debt beyond its own holds (less `paying` units of
    /// them being paid for: then at most `paying`) to the other parts of
    /// `sku` whose holds can still pay it back (their reserved units beyond
    /// their own debt, as it stands when it takes it on). Each such part
    /// owes its share and sends as many units to `from` (`move.lua`'s `owe_out`, then a transfer finished like
    /// any other, by [`Engine::finish_moves`] after a crash), which pay
    /// `from`'s debt when they land: a hand-off repeated by a concurrent
    /// payment leaves units, not a second debt. How many units were handed.
    async fn hand_debt(
        &self,
        sku: &str,
        parts: u16,
        from: u16,
        paying: i64,
    ) -> Result<i64, EngineError> {
        let mut rows = self.read_full(sku, parts).await?;
        if rows.iter().flatten().any(|r| r.moving > 0) {
            // Parked units pay debts first (a debt they would pay is no
            // oversell), and a transfer under way may give room back: both
            // finished, then read again.
            self.finish_moves_older(sku, parts, 0).await?;
            rows = self.read_full(sku, parts).await?;
        }
        let Some(Some(owing)) = rows.get(usize::from(from)) else {
            return Ok(0);
        };
        // A payment of a hold whose units are not there (one remembered
        // from before a loss of Redis' data) hands nothing.
        if owing.reserved < paying {
            return Ok(0);
        }
        // Never more than it owes (a step of its own would otherwise take
        // units on sale elsewhere to pay a debt that is not there).
        let mut debt = (owing.owed - (owing.reserved - paying)).min(owing.owed);
        if paying > 0 {
            debt = debt.min(paying);
        }
        let from_name = part_name(sku, from, parts);
        let mut moved = 0;
        for (j, row) in rows.iter().enumerate() {
            let Some(row) = row else { continue };
            let room = row.reserved - row.owed;
            if debt <= 0 {
                break;
            }
            if j == usize::from(from) || room <= 0 {
                continue;
            }
            let name = part_name(sku, j as u16, parts);
            let tid = debt_tid();
            let reply = self
                .run_move(&name, "owe_out", &tid, debt.min(room), &from_name, None)
                .await?;
            let taken = if reply.tag()? == "owing" {
                reply.int(1)?
            } else {
                0
            };
            if taken < 1 {
                continue;
            }
            self.deliver(&name, &from_name, &tid, taken).await?;
            debt -= taken;
            moved += taken;
        }
        if moved > 0 {
            // What `from` no longer owed when the units landed was parked.
            self.route_parked(sku, parts).await?;
        }
        Ok(moved)
    }

    /// Makes payment `pay` of a hold with `lines`, its split SKUs' debts
    /// handed on first ([`Engine::before_paying`]) when any part of them
    /// owes: one such payment per SKU at a time (a lease per SKU, taken in
    /// order), so no payment searches for room to hand a debt to while
    /// another is handing one, and none reports as oversold a unit another
    /// payment's hand-off was about to back. `attempt` pays only if no line
    /// would owe beyond its part's holds (`None` otherwise); `pay` pays and
    /// reports (see [`Engine::hand_then_pay`]). A lease not had within
    /// [`DEBT_WAIT`] (a stalled holder) is gone without: the payment is
    /// made, its report of an oversell may then be high.
    pub(crate) async fn paying_judged<T, A, F>(
        &self,
        lines: &[Line],
        mut attempt: impl FnMut() -> A,
        pay: impl FnOnce() -> F,
    ) -> Result<T, EngineError>
    where
        A: Future<Output = Result<Option<T>, EngineError>>,
        F: Future<Output = Result<T, EngineError>>,
    {
        // No lookup where nothing is split (a line on a part names it, even
        // to a process that has not seen the split).
        if !self.splits.any() && lines.iter().all(|l| keys::parse_part(&l.sku).is_none()) {
            return pay().await;
        }
        let mut skus: Vec<(&str, u16)> = lines
            .iter()
            .map(|line| match keys::parse_part(&line.sku) {
                Some((sku, _, parts)) => (sku, parts),
                None => (line.sku.as_str(), self.splits.parts(&line.sku)),
            })
            .filter(|(_, parts)| *parts > 1)
            .collect();
        skus.sort_unstable();
        skus.dedup();
        let mut owing = false;
        for (sku, parts) in &skus {
            owing |= self
                .read_full(sku, *parts)
                .await?
                .iter()
                .flatten()
                .any(|r| r.owed > 0);
        }
        if !owing {
            return pay().await;
        }
        let mut leases = Vec::new();
        for (sku, _) in &skus {
            if let Some(lease) = self.wait_for_lease(&debt_lease(sku)).await? {
                leases.push(lease);
            }
        }
        let paid = self.hand_then_pay(lines, &mut attempt, pay).await;
        for lease in &leases {
            self.release_lock(lease).await?;
        }
        paid
    }

    /// Under the debt leases: hands the lines' debts on, then `attempt`s
    /// the payment, which answers `None` (changing nothing) while a line's
    /// part would still owe beyond its holds: a payment made without the
    /// lease (one with no such debt when it looked) can take the room a
    /// hand-off counted on. Again while a round hands something on; then
    /// `pay`, which reports what is still unbacked as oversold.
    async fn hand_then_pay<T, A, F>(
        &self,
        lines: &[Line],
        attempt: &mut impl FnMut() -> A,
        pay: impl FnOnce() -> F,
    ) -> Result<T, EngineError>
    where
        A: Future<Output = Result<Option<T>, EngineError>>,
        F: Future<Output = Result<T, EngineError>>,
    {
        for _ in 0..JUDGE_ROUNDS {
            let handed = self.before_paying(lines).await?;
            if let Some(paid) = attempt().await? {
                return Ok(paid);
            }
            if handed == 0 {
                break;
            }
        }
        pay().await
    }

    /// Lease `name`, waiting up to [`DEBT_WAIT`] for it; `None` if it stayed
    /// taken.
    async fn wait_for_lease(&self, name: &str) -> Result<Option<Lease>, EngineError> {
        let deadline = tokio::time::Instant::now() + DEBT_WAIT;
        loop {
            if let Some(lease) = self.acquire_lock(name, DEBT_LEASE).await? {
                return Ok(Some(lease));
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(lock = %name, "a payment's debt hand-off went ahead without its lease (held past {DEBT_WAIT:?})");
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Before a hold with lines on parts of split SKUs is paid (`confirm.lua`
    /// answered `indebted`, or a cart): a part whose debt (held units a feed
    /// removed) the payment would leave beyond its own holds hands the excess
    /// to parts whose holds can still pay it back, so `confirm.lua` reports
    /// as oversold only what the whole SKU cannot back, as an unsplit SKU's
    /// would. Each part judging alone reported the sum of every part's excess
    /// (74 units where the SKU oversold 50). One pipelined read of the
    /// parts per line of a split SKU; nothing for any other line.
    async fn before_paying(&self, lines: &[Line]) -> Result<i64, EngineError> {
        let mut handed = 0;
        for line in lines {
            let (sku, part, parts) = match keys::parse_part(&line.sku) {
                Some(named) => named,
                None => (line.sku.as_str(), 0, self.splits.parts(&line.sku)),
            };
            if parts > 1 {
                handed += self.hand_debt(sku, parts, part, line.qty).await?;
            }
        }
        Ok(handed)
    }
}
