//! Carts whose lines fall in several shards: reserved, confirmed, released and
//! expired as one unit, although each shard's part is its own atomic script
//! (Redis Cluster runs a script on one slot only).
//!
//! The protocol (docs/stock-rules.md, "Carts across shards"):
//!
//! - **Reserve.** Every part carries the list of the cart's shards (`parts`, the
//!   home part first) and the same deadline: the first part's. A retry finds the
//!   parts it already made (same fingerprint) and makes only the missing ones; a
//!   part made for another request is a conflict. Any failure part-way (a sold-out
//!   line, a limit, a transport error) undoes every part made, and forgets the id,
//!   so a retry gets the same answer as the first request.
//! - **Confirm.** Two phases: every part is prepared (`held` -> `confirming`,
//!   refused once the shared deadline has passed), then committed, the home part
//!   first. A failed prepare rolls the prepared parts back and the payment is late
//!   for the whole cart. The home part's state is the decision: once it is
//!   `confirmed`, the cart is sold, and anyone finding a part still `confirming`
//!   commits it.
//! - **Expire.** The reaper never ends a part alone: a due part ends its whole
//!   cart. A part `confirming` for longer than [`STALE_CONFIRMING`] belongs to a
//!   confirmer that died: the home part's state decides whether it is committed
//!   or rolled back (and then expired).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::engine::{ConfirmMode, Engine, Part, PartCall};
use crate::error::EngineError;
use crate::model::{
    ConfirmOutcome, HoldState, Line, ReleaseOutcome, ReserveOutcome, ReserveRequest,
};

/// A part left `confirming` this long lost its confirmer (a crash between the
/// phases); the reaper then finishes what the home part decided.
pub const STALE_CONFIRMING: Duration = Duration::from_secs(30);

/// The lease one attempt holds while it builds a cart (`hf:building:{<rid>}`),
/// renewed every third of it while the build runs: an attempt whose process
/// died keeps the id busy (409) at most this long.
pub const BUILD_LEASE: Duration = Duration::from_secs(10);

/// How long the lease outlives an attempt whose last call failed in transit:
/// past the response timeout, so a command still on its way has landed or
/// been dropped before the next attempt looks at the parts.
const BUILD_LINGER: Duration = Duration::from_secs(6);

impl Engine {
    /// Reserves a cart whose lines fall in `groups` (several shards), all or
    /// nothing, with one deadline.
    ///
    /// One attempt at a time builds a cart ([`BUILD_LEASE`]): two attempts
    /// with the same request (a retry after a deadline, while the first still
    /// runs in its task) would each take the other's parts for their own, and
    /// one's undo could delete a part the other answered 201 for. A second
    /// attempt meanwhile is [`EngineError::Busy`] (409, retry in a moment).
    pub(crate) async fn reserve_cart(
        &self,
        req: &ReserveRequest,
        groups: &[(u16, Vec<Line>)],
        ttl: Duration,
        fp: &str,
    ) -> Result<ReserveOutcome, EngineError> {
        let rid = &req.reservation_id;
        // The id is claimed for this request first (see `reserve_alone`): owned
        // by another, nothing is written. The lease is taken in the same trip.
        let build = self.keys.cart_build(rid);
        let token = uuid::Uuid::new_v4().simple().to_string();
        let mut pipe = redis::pipe();
        self.claim_into(&mut pipe, rid, fp);
        pipe.cmd("SET")
            .arg(&build)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(BUILD_LEASE.as_millis() as u64);
        let (owner, leased): (Option<String>, Option<String>) =
            match pipe.query_async(&mut self.conn.clone()).await {
                Ok(replies) => replies,
                Err(e) => {
                    // The lease may have been written all the same (the reply
                    // was what got lost): shortened if it is this attempt's.
                    let _ = self.end_build(&build, &token, BUILD_LINGER).await;
                    return Err(e.into());
                }
            };
        let conflict = owner.is_some_and(|o| crate::engine::Claim::parse(&o).fp != fp);
        if leased.is_none() {
            return if conflict {
                Ok(ReserveOutcome::Conflict {
                    reservation_id: rid.clone(),
                })
            } else {
                Err(EngineError::Busy(format!(
                    "reservation {rid} is still being made by an earlier attempt; retry in a moment"
                )))
            };
        }
        let mut in_doubt = false;
        let outcome = if conflict {
            Ok(ReserveOutcome::Conflict {
                reservation_id: rid.clone(),
            })
        } else {
            // Renewed while the build runs, by a task of its own (a slow
            // renewal never holds the build up), so a slow build (many shards,
            // a slow Redis) keeps it, and one whose process died frees it soon.
            let lost = Arc::new(AtomicBool::new(false));
            let renewer = AbortOnDrop(tokio::spawn({
                let (engine, build, token, lost, rid) = (
                    self.clone(),
                    build.clone(),
                    token.clone(),
                    lost.clone(),
                    rid.clone(),
                );
                async move {
                    let mut renew = tokio::time::interval(BUILD_LEASE / 3);
                    renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    renew.tick().await;
                    loop {
                        renew.tick().await;
                        if !matches!(
                            engine.extend_build(&build, &token, BUILD_LEASE).await,
                            Ok(true)
                        ) {
                            lost.store(true, Ordering::Relaxed);
                            tracing::warn!(reservation = %rid,
                                "a cart's build lease could not be renewed; another attempt may start");
                        }
                    }
                }
            }));
            let outcome = self
                .build_cart(req, groups, ttl, fp, &mut in_doubt, &lost)
                .await;
            // Stopped here, and also if the build panicked (the guard's drop).
            drop(renewer);
            outcome
        };
        // Every call answered: nothing of this attempt can still reach Redis,
        // so the next may start at once. A call cut short (a timeout, a lost
        // connection), the build's or an undo's, may still be on its way: the
        // lease stays a while more.
        let linger = if in_doubt || matches!(&outcome, Err(EngineError::Redis(_))) {
            BUILD_LINGER
        } else {
            Duration::ZERO
        };
        if let Err(e) = self.end_build(&build, &token, linger).await {
            tracing::warn!(reservation = %rid, error = %e,
                "could not give a cart's build lease back; it lapses by itself");
        }
        outcome
    }

    /// Gives the build lease `key` (held with `token`) back, at once or
    /// after `linger`.
    async fn end_build(&self, key: &str, token: &str, linger: Duration) -> Result<(), EngineError> {
        if linger.is_zero() {
            let mut inv = self.scripts.lock_release.prepare_invoke();
            inv.key(key).arg(token).arg("0");
            inv.invoke_async::<i64>(&mut self.conn.clone()).await?;
        } else {
            self.extend_build(key, token, linger).await?;
        }
        Ok(())
    }

    /// Sets the build lease `key` to lapse `after` from now, if `token` still
    /// holds it; `false` when it does not.
    async fn extend_build(
        &self,
        key: &str,
        token: &str,
        after: Duration,
    ) -> Result<bool, EngineError> {
        let mut inv = self.scripts.lock_extend.prepare_invoke();
        inv.key(key).arg(token).arg(after.as_millis() as u64);
        Ok(inv.invoke_async::<i64>(&mut self.conn.clone()).await? == 1)
    }

    /// [`Engine::reserve_cart`]'s work, under the build lease; `in_doubt` is
    /// set when an undo's call failed in transit (it may still land), or was
    /// not made because the lease could not be renewed (`lease_lost`).
    async fn build_cart(
        &self,
        req: &ReserveRequest,
        groups: &[(u16, Vec<Line>)],
        ttl: Duration,
        fp: &str,
        in_doubt: &mut bool,
        lease_lost: &AtomicBool,
    ) -> Result<ReserveOutcome, EngineError> {
        let rid = &req.reservation_id;
        // What an earlier attempt left: a retry completes it; anything else with
        // this id anywhere is a conflict (detected across every shard). The
        // same request may list its lines in another order (the fingerprint
        // does not count it): parts are matched as sets, and the parts already
        // made keep their cart list (and so their home part).
        let mut existing = self.locate_parts(rid).await?;
        let mut shards: Vec<u16> = groups.iter().map(|(s, _)| *s).collect();
        let cart = match existing.first() {
            Some(p) if same_set(&p.cart, &shards) => p.cart.clone(),
            Some(_) => {
                return Ok(ReserveOutcome::Conflict {
                    reservation_id: rid.clone(),
                });
            }
            None => std::mem::take(&mut shards),
        };
        let ours = |p: &Part| {
            p.cart == cart
                && groups
                    .iter()
                    .any(|(s, lines)| *s == p.shard && same_lines(&p.hold.lines, lines))
        };
        if existing.iter().any(|p| !ours(p)) {
            return Ok(ReserveOutcome::Conflict {
                reservation_id: rid.clone(),
            });
        }
        if existing.len() == groups.len() {
            // Complete: the first answer again, from the parts' records.
            let home = &existing[0].hold;
            return Ok(ReserveOutcome::AlreadyReserved {
                reservation_id: rid.clone(),
                state: existing
                    .iter()
                    .map(|p| p.hold.state)
                    .find(|s| *s != HoldState::Held)
                    .unwrap_or(HoldState::Held),
                expires_at_ms: home.expires_at_ms,
                available_after: existing.iter().flat_map(|p| p.after.clone()).collect(),
            });
        }
        if !existing.is_empty() {
            // Part-made by an attempt that failed, and ended since (the reaper
            // expired it whole) or past its deadline: no part may be added with
            // a deadline gone. It is taken back, and the cart made afresh.
            let now = self.redis_time_ms().await?;
            if existing
                .iter()
                .any(|p| p.hold.state != HoldState::Held || p.hold.expires_at_ms <= now)
            {
                for p in &existing {
                    self.undo_part(p.shard, rid, &p.hold.lines, fp).await?;
                }
                existing.clear();
            }
        }
        let cart_list = cart
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let mut deadline = existing.first().map_or(0, |p| p.hold.expires_at_ms);
        let mut made: Vec<(u16, Vec<Line>)> = existing
            .iter()
            .map(|p| (p.shard, p.hold.lines.clone()))
            .collect();
        let mut after: Vec<(String, i64)> = existing.iter().flat_map(|p| p.after.clone()).collect();
        // The home part first when the cart is new, so it always has the deadline.
        for shard in &cart {
            let Some((_, lines)) = groups.iter().find(|(s, _)| s == shard) else {
                continue;
            };
            if made.iter().any(|(s, _)| s == shard) {
                continue;
            }
            if lease_lost.load(Ordering::Relaxed) {
                *in_doubt = true;
                return Err(lapsed_lease(rid));
            }
            let outcome = self
                .reserve_in_shard(&PartCall {
                    shard: *shard,
                    req,
                    lines,
                    ttl,
                    fp,
                    deadline_ms: deadline,
                    cart: &cart_list,
                })
                .await;
            match outcome {
                Ok(ReserveOutcome::Reserved {
                    expires_at_ms,
                    available_after,
                    ..
                }) => {
                    deadline = expires_at_ms;
                    after.extend(available_after);
                    made.push((*shard, lines.clone()));
                }
                failed => {
                    // Undo every part made, this attempt's or an earlier one's,
                    // so the id is free again and a retry answers the same.
                    if lease_lost.load(Ordering::Relaxed) {
                        // Another attempt may be building now, with the same
                        // request: an undo could take its parts. They are
                        // left to end at the cart's deadline.
                        tracing::warn!(reservation = %rid,
                            "a cart's build lease was lost; its parts are left to expire, not undone");
                        *in_doubt = true;
                    } else {
                        *in_doubt |= !self.undo_parts(rid, &made, fp).await;
                    }
                    return match failed {
                        Ok(ReserveOutcome::AlreadyReserved { .. }) => {
                            Ok(ReserveOutcome::Conflict {
                                reservation_id: rid.clone(),
                            })
                        }
                        other => other,
                    };
                }
            }
        }
        // Answered "held" only under the lease: another attempt that took it
        // could otherwise be undoing these parts as it fails.
        if lease_lost.load(Ordering::Relaxed) {
            *in_doubt = true;
            return Err(lapsed_lease(rid));
        }
        Ok(ReserveOutcome::Reserved {
            reservation_id: rid.clone(),
            expires_at_ms: deadline,
            available_after: after,
        })
    }

    /// Undoes every part in `made` (best effort: a part that cannot be undone now
    /// keeps the cart's deadline and is ended whole by the reaper). `false`
    /// when an undo failed.
    async fn undo_parts(&self, rid: &str, made: &[(u16, Vec<Line>)], fp: &str) -> bool {
        let mut all = true;
        for (shard, lines) in made {
            if let Err(e) = self.undo_part(*shard, rid, lines, fp).await {
                tracing::warn!(reservation = %rid, shard, error = %e,
                    "could not undo a cart's part; it ends with the cart's deadline");
                all = false;
            }
        }
        all
    }

    /// Confirms a cart over several shards in two phases (see the module doc).
    pub(crate) async fn confirm_cart(
        &self,
        rid: &str,
        mut parts: Vec<Part>,
    ) -> Result<ConfirmOutcome, EngineError> {
        parts.sort_by_key(home_rank);
        if parts.iter().all(|p| p.hold.state == HoldState::Confirmed) {
            return Ok(ConfirmOutcome::AlreadyConfirmed);
        }
        let expected = parts.first().map_or(0, |p| p.cart.len());
        if parts.len() < expected && parts[0].hold.state != HoldState::Confirmed {
            // A part is missing (an undo that half failed): the cart cannot be
            // sold whole. End what is left; the payment is late.
            for p in &parts {
                self.release_in_shard(p.shard, &p.hold, HoldState::Released)
                    .await?;
            }
            return Ok(ConfirmOutcome::Expired {
                state: HoldState::Released,
            });
        }
        // Phase one: prepare every part that is not already decided. Only the
        // parts this call prepared are its to roll back: a part another
        // confirmer prepared stays theirs.
        let mut prepared = Vec::new();
        let mut late = None;
        if parts[0].hold.state != HoldState::Confirmed {
            for p in &parts {
                let reply = self.confirm_step(p, ConfirmMode::Prepare).await;
                match reply.and_then(|r| Ok((r.tag()?, r))) {
                    Ok((tag, _)) if tag == "prepared" => prepared.push(p),
                    Ok((tag, _)) if tag == "prepared_before" || tag == "already_confirmed" => {}
                    Ok((tag, r)) if tag == "expired" => {
                        late = Some(r.state(1)?);
                        break;
                    }
                    Ok((tag, _)) => {
                        self.roll_back(rid, &prepared).await;
                        return Err(EngineError::UnexpectedReply(format!(
                            "confirm (prepare): {tag}"
                        )));
                    }
                    Err(e) => {
                        self.roll_back(rid, &prepared).await;
                        return Err(e);
                    }
                }
            }
            if let Some(state) = late {
                self.roll_back(rid, &prepared).await;
                // The cart expires whole (a no-op for parts not yet due).
                self.expire_cart(rid).await?;
                return Ok(ConfirmOutcome::Expired { state });
            }
        }
        // Phase two: the home part's commit is the decision. Only once it is
        // confirmed are the other parts committed; if it was rolled back
        // meanwhile (the reaper found this confirmer stale), nothing is sold.
        let home = self.confirm_step(&parts[0], ConfirmMode::Commit).await?;
        let mut outcome = match self.confirm_reply(rid, &home)? {
            decided @ (ConfirmOutcome::Confirmed | ConfirmOutcome::AlreadyConfirmed) => decided,
            ConfirmOutcome::Expired { state } => {
                self.roll_back(rid, &prepared).await;
                self.expire_cart(rid).await?;
                return Ok(ConfirmOutcome::Expired { state });
            }
            other => return Ok(other),
        };
        for p in &parts[1..] {
            let reply = self.confirm_step(p, ConfirmMode::Commit).await?;
            match self.confirm_reply(rid, &reply)? {
                ConfirmOutcome::Confirmed => outcome = ConfirmOutcome::Confirmed,
                ConfirmOutcome::AlreadyConfirmed => {}
                other => {
                    // The home part is sold, so this part must be: it was prepared
                    // before the home part committed. Anything else is a fault
                    // to look at, never a silent half-sale.
                    tracing::error!(reservation = %rid, shard = p.shard, ?other,
                        "a cart's part could not be committed after its home part was");
                    self.set_aside(p.shard, rid).await?;
                }
            }
        }
        Ok(outcome)
    }

    /// Rolls prepared parts back to `held` (best effort: a part left
    /// `confirming` is resolved by the reaper from the home part's state).
    async fn roll_back(&self, rid: &str, prepared: &[&Part]) {
        for p in prepared {
            if let Err(e) = self.confirm_step(p, ConfirmMode::Rollback).await {
                tracing::warn!(reservation = %rid, shard = p.shard, error = %e,
                    "could not roll a cart's part back; the reaper will");
            }
        }
    }

    /// Ends cart `rid` as a whole once its deadline has passed: every part is
    /// expired together. A part still `confirming` past [`STALE_CONFIRMING`] is
    /// finished as the home part decided (committed if the home part is
    /// `confirmed`, otherwise rolled back and expired); a fresher one is left for
    /// its confirmer. Returns how many parts this call ended.
    pub(crate) async fn expire_cart(&self, rid: &str) -> Result<u64, EngineError> {
        let mut parts = self.locate_parts(rid).await?;
        parts.sort_by_key(home_rank);
        let Some(home) = parts.first() else {
            return Ok(0);
        };
        // Redis' clock, the one `preparing` was written with.
        let now = self.redis_time_ms().await?;
        let stale = |p: &Part| {
            p.preparing_ms
                .is_none_or(|at| now - at >= STALE_CONFIRMING.as_millis() as i64)
        };
        // The home part decides, by its own transition: a stale confirmer's home
        // part is rolled back unless it was committed meanwhile.
        let home_confirmed = match home.hold.state {
            HoldState::Confirmed => true,
            HoldState::Confirming if !stale(home) => return Ok(0),
            HoldState::Confirming => {
                let reply = self.confirm_step(home, ConfirmMode::Rollback).await?;
                reply.tag()? == "already_confirmed"
            }
            _ => false,
        };
        let mut ended = 0;
        for p in &parts {
            let state = if p.shard == home.shard && !home_confirmed {
                // Rolled back just now, or held: it expires with the rest.
                HoldState::Held
            } else {
                p.hold.state
            };
            match state {
                HoldState::Confirming if home_confirmed => {
                    let reply = self.confirm_step(p, ConfirmMode::Commit).await?;
                    self.confirm_reply(rid, &reply)?;
                }
                HoldState::Confirming => {
                    self.confirm_step(p, ConfirmMode::Rollback).await?;
                    if self
                        .release_in_shard(p.shard, &p.hold, HoldState::Expired)
                        .await?
                        == ReleaseOutcome::Released
                    {
                        ended += 1;
                    }
                }
                HoldState::Held if home_confirmed => {
                    // Cannot happen through the protocol (parts are prepared before
                    // the home part commits); never sell or free it alone.
                    tracing::error!(reservation = %rid, shard = p.shard,
                        "a cart's part is held while its home part is confirmed; set aside for an operator");
                    self.set_aside(p.shard, rid).await?;
                }
                HoldState::Held
                    if self
                        .release_in_shard(p.shard, &p.hold, HoldState::Expired)
                        .await?
                        == ReleaseOutcome::Released =>
                {
                    ended += 1;
                }
                _ => {}
            }
        }
        Ok(ended)
    }
}

/// A task stopped when this is dropped (a `JoinHandle` dropped detaches it).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The answer of a build that lost its lease part-way: its parts stay for
/// the retry to complete (or the reaper to end), never answered "held" here.
fn lapsed_lease(rid: &str) -> EngineError {
    EngineError::Busy(format!(
        "reservation {rid}: its build lease lapsed while its parts were being made; retry in a moment"
    ))
}

/// Whether `a` and `b` hold the same shards, in any order.
fn same_set(a: &[u16], b: &[u16]) -> bool {
    a.len() == b.len() && a.iter().all(|s| b.contains(s))
}

/// Whether two lists of lines are the same lines, in any order.
fn same_lines(a: &[Line], b: &[Line]) -> bool {
    a.len() == b.len() && a.iter().all(|l| b.contains(l))
}

/// Sorts the home part (the first shard of the cart list) first.
fn home_rank(p: &Part) -> (bool, u16) {
    (p.cart.first() != Some(&p.shard), p.shard)
}
