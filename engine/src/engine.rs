//! The [`Engine`]: the typed entry point to the Lua scripts.
//!
//! A hold's life: [`Engine::reserve`] takes units from `available` into
//! `reserved`; then exactly one of [`Engine::confirm`] (moves them to
//! `sold_pending`), [`Engine::release`] (returns them) or the reaper
//! ([`Engine::reap_once`], which releases holds past their deadline) ends it.
//! Each step is one atomic script that also appends its event to the shard's
//! stream, so `available + reserved + sold_pending` only changes by supply.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use crate::redis_conn::RedisConn;
use redis::Value;

use crate::error::EngineError;
use crate::hold_cache::{HoldCache, Known};
use crate::idempotency::KeyUse;
use crate::keys::Keyspace;
use crate::model::{
    ConfirmOutcome, Figures, Hold, HoldState, Invalid, Line, ReapReport, ReleaseOutcome,
    ReserveOutcome, ReserveRequest,
};
use crate::reply::Reply;
use crate::scripts::Scripts;
use crate::telemetry::{Measured, Telemetry};

/// Limits and lifetimes. The defaults suit a flash sale; all are configurable.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Hash-tag shards (fixed per deployment, see [`Keyspace`]).
    pub shards: u16,
    /// Hold lifetime when a request names none.
    pub default_hold_ttl: Duration,
    /// Longest hold a request may ask for.
    pub max_hold_ttl: Duration,
    /// Most units of one SKU in one reservation.
    pub max_qty_per_line: i64,
    /// Most lines in one cart.
    pub max_lines: usize,
    /// How long an ended hold is remembered (retries, late confirms).
    pub tombstone_ttl: Duration,
    /// How long a buyer's per-SKU count is kept after their last hold.
    pub buyer_ttl: Duration,
    /// How long an applied feed event id is remembered.
    pub guard_ttl: Duration,
    /// Failed sign-ins for one username from all addresses within
    /// [`crate::users::LOGIN_WINDOW`] before it is refused for the rest of it.
    pub login_failures_per_user: i64,
    /// Failed sign-ins for one username from one address within the window.
    pub login_failures_per_user_and_address: i64,
    /// Failed sign-ins from one client address (any usernames) within the window.
    pub login_failures_per_address: i64,
    /// Most events one webhook payload may carry (more: dead-lettered).
    pub max_payload_events: usize,
    /// Redis replicas that must acknowledge a payment before it is answered
    /// (0: answered as soon as the master has it). See [`crate::replicas`].
    pub confirm_replicas: u32,
    /// Longest wait for those acknowledgements before answering 503.
    pub confirm_replica_timeout: Duration,
    /// How many one-shard holds this process remembers so that confirming or
    /// releasing one is a single Redis call ([`crate::hold_cache`]; a few
    /// hundred bytes each). 0: every confirm and release looks the hold up first.
    pub hold_cache_entries: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            shards: crate::keys::DEFAULT_SHARDS,
            default_hold_ttl: Duration::from_secs(600),
            max_hold_ttl: Duration::from_secs(3_600),
            max_qty_per_line: 10,
            max_lines: 20,
            tombstone_ttl: Duration::from_secs(24 * 3_600),
            buyer_ttl: Duration::from_secs(7 * 24 * 3_600),
            guard_ttl: Duration::from_secs(24 * 3_600),
            login_failures_per_user: crate::users::LOGIN_FAILURES_PER_USER,
            login_failures_per_user_and_address: crate::users::LOGIN_FAILURES,
            login_failures_per_address: crate::users::LOGIN_FAILURES_PER_ADDRESS,
            max_payload_events: crate::payload::DEFAULT_MAX_EVENTS,
            confirm_replicas: 0,
            confirm_replica_timeout: Duration::from_millis(1_000),
            hold_cache_entries: 200_000,
        }
    }
}

/// The reservation engine over one Redis. Cheap to clone; share one per process.
#[derive(Clone)]
pub struct Engine {
    /// Redis, every round trip timed into `telemetry`.
    pub(crate) conn: Measured<RedisConn>,
    pub(crate) telemetry: Arc<Telemetry>,
    pub(crate) scripts: Arc<Scripts>,
    pub(crate) keys: Keyspace,
    /// Shards not selling after a failover ([`crate::failover`]).
    fence: Arc<crate::failover::ShardFence>,
    pub(crate) config: Arc<EngineConfig>,
    /// Replica acknowledgements for payments, when asked for.
    pub(crate) acks: Option<crate::replicas::ReplicaAcks>,
    /// Reservation attempts counted for drop reports ([`crate::attempts`]).
    attempts: Arc<crate::attempts::Attempts>,
    /// Checkout calls served, which lanes yielding to checkout watch ([`crate::pace`]).
    activity: Arc<crate::pace::CheckoutActivity>,
    /// The one-shard holds this process made ([`crate::hold_cache`]).
    holds: Arc<HoldCache>,
    /// The split SKUs this process has seen ([`crate::split`]).
    pub(crate) splits: Arc<crate::split::Splits>,
}

/// Whether `s` is a valid SKU code: what PostgreSQL's `skus.sku` check accepts.
pub fn valid_sku(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && s.len() <= 64
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// The fields of a hold hash that [`parse_hold`] reads, in its order.
/// In a claim (`hf:claim:{<rid>}`), between the request's fingerprint and the
/// SKU it was answered sold out of from memory.
const FROM_MEMORY: &str = "|sold_out_from_memory:";

/// A claim that says the request fingerprinted `fp` was answered sold out of
/// `sku` without a hold: its retries get that answer again.
pub(crate) fn claim_from_memory(fp: &str, sku: &str) -> String {
    format!("{fp}{FROM_MEMORY}{sku}")
}

/// A reservation id's claim: the owning request's fingerprint, and the SKU when
/// that request was answered sold out from memory.
pub(crate) struct Claim<'a> {
    pub(crate) fp: &'a str,
    pub(crate) from_memory: Option<&'a str>,
}

impl<'a> Claim<'a> {
    pub(crate) fn parse(value: &'a str) -> Self {
        match value.split_once(FROM_MEMORY) {
            Some((fp, sku)) => Self {
                fp,
                from_memory: Some(sku),
            },
            None => Self {
                fp: value,
                from_memory: None,
            },
        }
    }
}

/// The `state` of a refused request's record in a hold hash (`reserve.lua`).
const REFUSED: &str = "refused";

const HOLD_FIELDS: [&str; 9] = [
    "state",
    "lines",
    "buyer",
    "deadline",
    "created",
    "parts",
    "preparing",
    "fp",
    "after",
];

/// Where the request fingerprint is in a row of [`HOLD_FIELDS`].
const FP_FIELD: usize = 7;

/// Whether `s` may be a reservation id or a buyer: both become part of Redis keys,
/// so printable ASCII without spaces or braces, 1 to 128 characters.
pub fn valid_key_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':' | '@' | '+'))
}

fn invalid(field: &str, message: impl Into<String>) -> Invalid {
    Invalid {
        field: field.to_owned(),
        message: message.into(),
    }
}

impl Engine {
    /// An engine over `conn` (one node or a cluster) with `config`.
    pub fn new(conn: impl Into<RedisConn>, config: EngineConfig) -> Self {
        let conn = conn.into();
        let scripts = Scripts::new();
        let telemetry = Arc::new(Telemetry::new(scripts.names()));
        Self {
            conn: Measured::new(conn, telemetry.clone()),
            telemetry,
            scripts: Arc::new(scripts),
            keys: Keyspace::new(config.shards),
            fence: Arc::new(crate::failover::ShardFence::new(
                Keyspace::new(config.shards).shards(),
            )),
            holds: Arc::new(HoldCache::new(config.hold_cache_entries)),
            config: Arc::new(config),
            acks: None,
            attempts: Arc::default(),
            activity: Arc::default(),
            splits: Arc::default(),
        }
    }

    /// This engine answering payments only once replicas acknowledged them
    /// ([`crate::replicas`]), the rounds running on `conn`, a connection used
    /// for nothing else; as configured by `confirm_replicas` (0: unchanged).
    pub fn with_replica_acks(mut self, conn: impl Into<RedisConn>) -> Self {
        if self.config.confirm_replicas > 0 {
            self.acks = Some(crate::replicas::ReplicaAcks::start(
                conn.into(),
                self.config.confirm_replicas,
                self.config.confirm_replica_timeout,
            ));
        }
        self
    }

    /// This engine (its scripts, caches, fences, counters and settings, all
    /// shared) talking to the same Redis over `conn` instead. For work that
    /// must not share a connection with the engine's other users: a
    /// connection's I/O is driven on the runtime that opened it, or that last
    /// reopened it, so background work on threads of lower priority gets its
    /// own and never drives checkout's.
    pub fn over(&self, conn: impl Into<RedisConn>) -> Self {
        Self {
            conn: Measured::new(conn.into(), self.telemetry.clone()),
            ..self.clone()
        }
    }

    /// The key layout in use.
    pub fn keyspace(&self) -> Keyspace {
        self.keys
    }

    /// The configuration in use.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The scripts (for their SHAs, e.g. in benchmarks).
    pub fn scripts(&self) -> &Scripts {
        &self.scripts
    }

    /// A clone of the Redis connection, for reads outside the scripts.
    pub fn connection(&self) -> RedisConn {
        self.conn.inner().clone()
    }

    /// Refuses to work over Redis data laid out in another shard count or tag
    /// scheme than this engine's (keys would be looked for where they are
    /// not: every SKU would read as not warmed, its holds stranded). The
    /// first process to look records its layout ([`Keyspace::LAYOUT`]).
    pub async fn check_layout(&self) -> Result<(), EngineError> {
        let want = self.keys.layout();
        let had: Option<String> = redis::cmd("SET")
            .arg(Keyspace::LAYOUT)
            .arg(&want)
            .arg("NX")
            .arg("GET")
            .query_async(&mut self.conn.clone())
            .await?;
        match had {
            Some(had) if had != want => Err(EngineError::Unsupported(format!(
                "Redis holds data laid out as `{had}`, and this process is set to `{want}` \
                 (--redis-shards / HOLDFAST_REDIS_SHARDS): use the count the data was written \
                 with, or empty Redis (FLUSHALL) and warm again from PostgreSQL"
            ))),
            _ => Ok(()),
        }
    }

    /// This process's count of reservation attempts, for drop reports.
    pub fn attempts(&self) -> &crate::attempts::Attempts {
        &self.attempts
    }

    /// The checkout calls this process has served ([`crate::pace`]).
    pub fn checkout_activity(&self) -> &crate::pace::CheckoutActivity {
        &self.activity
    }

    /// The shards this process holds reservations back on after a failover.
    pub fn shard_fence(&self) -> &crate::failover::ShardFence {
        &self.fence
    }

    /// What this engine measures (Redis round trips, reservation outcomes).
    pub fn telemetry(&self) -> &Arc<Telemetry> {
        &self.telemetry
    }

    fn validate(&self, req: &ReserveRequest) -> Result<Duration, Invalid> {
        if !valid_key_part(&req.reservation_id) {
            return Err(invalid(
                "reservation_id",
                "must be 1 to 128 characters: letters, digits and . _ - : @ +",
            ));
        }
        if req.lines.is_empty() {
            return Err(invalid("lines", "at least one line is needed"));
        }
        if req.lines.len() > self.config.max_lines {
            return Err(invalid(
                "lines",
                format!("at most {} lines per cart", self.config.max_lines),
            ));
        }
        let mut seen = HashSet::new();
        for line in &req.lines {
            if !valid_sku(&line.sku) {
                return Err(invalid(
                    "sku",
                    format!("'{}' is not a valid SKU code", line.sku),
                ));
            }
            if !seen.insert(line.sku.as_str()) {
                return Err(invalid(
                    "sku",
                    format!("{} appears twice; combine the lines", line.sku),
                ));
            }
            if line.qty < 1 || line.qty > self.config.max_qty_per_line {
                return Err(invalid(
                    "qty",
                    format!("must be between 1 and {}", self.config.max_qty_per_line),
                ));
            }
        }
        if let Some(buyer) = &req.buyer
            && !valid_key_part(buyer)
        {
            return Err(invalid(
                "buyer",
                "must be 1 to 128 characters: letters, digits and . _ - : @ +",
            ));
        }
        let ttl = req
            .ttl_ms
            .map_or(self.config.default_hold_ttl, Duration::from_millis);
        if ttl < Duration::from_secs(1) || ttl > self.config.max_hold_ttl {
            return Err(invalid(
                "ttl_ms",
                format!(
                    "must be between 1000 and {}",
                    self.config.max_hold_ttl.as_millis()
                ),
            ));
        }
        Ok(ttl)
    }

    /// Holds the request's units: one atomic script when all lines share a shard,
    /// otherwise one per shard with the successful ones released again when a later
    /// one fails (all or nothing either way).
    pub async fn reserve(&self, req: &ReserveRequest) -> Result<ReserveOutcome, EngineError> {
        self.activity.note();
        let outcome = self.reserve_uncounted(req).await;
        if let Ok(outcome) = &outcome {
            self.telemetry.count_outcome(outcome.kind());
        }
        outcome
    }

    async fn reserve_uncounted(&self, req: &ReserveRequest) -> Result<ReserveOutcome, EngineError> {
        let ttl = match self.validate(req) {
            Ok(ttl) => ttl,
            Err(inv) => return Ok(ReserveOutcome::Invalid(inv)),
        };
        let fp = fingerprint(req);
        if self.route(req).is_some() {
            return self.reserve_routed(req, ttl, &fp).await;
        }
        let outcome = self.reserve_lines(req, &req.lines, ttl, &fp).await?;
        match &outcome {
            // The SKU was split since this process last looked (reserve.lua
            // said so): route it.
            ReserveOutcome::NotWarmed { sku } if self.splits.parts(sku) > 1 => {
                self.reserve_routed(req, ttl, &fp).await
            }
            _ => Ok(outcome),
        }
    }

    /// Holds `lines` (the request's, each naming its part for a split SKU)
    /// for `req`: one script when they share a shard, a cart otherwise.
    pub(crate) async fn reserve_lines(
        &self,
        req: &ReserveRequest,
        lines: &[Line],
        ttl: Duration,
        fp: &str,
    ) -> Result<ReserveOutcome, EngineError> {
        let groups = self.group_by_shard(lines);
        // A shard whose master just changed sells nothing until it is
        // checked: "not warmed" (retry shortly), never sold out.
        if let Some((_, lines)) = groups.iter().find(|(s, _)| self.fence.is_fenced(*s)) {
            return Ok(ReserveOutcome::NotWarmed {
                sku: crate::keys::base_sku(&lines[0].sku).to_owned(),
            });
        }
        if let [(shard, lines)] = groups.as_slice() {
            return self.reserve_alone(*shard, req, lines, ttl, fp).await;
        }
        // A cart writes its parts one shard after another and undoes them if a
        // later one fails: it runs in a task of its own, so a caller that stops
        // waiting (an API deadline during a failover) never leaves it half
        // made. A retry under the same id then meets what it finished.
        let (engine, req, fp) = (self.clone(), req.clone(), fp.to_owned());
        tokio::spawn(async move { engine.reserve_cart(&req, &groups, ttl, &fp).await })
            .await
            .map_err(|e| EngineError::UnexpectedReply(format!("the cart stopped: {e}")))?
    }

    /// A one-shard hold in one round trip: a pipeline that claims the id for this
    /// request (`SET NX GET` of its fingerprint: who owned it before, if anyone)
    /// and runs the script. The claim is where every attempt under the id meets, whichever
    /// shard its lines are in: when another request owns it, whatever this call
    /// wrote (a hold, a refusal's record) is undone and the answer is a conflict.
    /// Only a request that does not own the id ever undoes, so a hold once
    /// answered 201 to its owner stands.
    async fn reserve_alone(
        &self,
        shard: u16,
        req: &ReserveRequest,
        lines: &[Line],
        ttl: Duration,
        fp: &str,
    ) -> Result<ReserveOutcome, EngineError> {
        let rid = &req.reservation_id;
        let call = PartCall {
            shard,
            req,
            lines,
            ttl,
            fp,
            deadline_ms: 0,
            cart: "",
        };
        let inv = self.reserve_invocation(&call);
        let mut pipe = redis::pipe();
        self.claim_into(&mut pipe, rid, fp);
        pipe.invoke_script(&inv);
        let (owner, script_reply): (Option<String>, Vec<Value>) = match pipe
            .query_async(&mut self.conn.clone())
            .await
        {
            Ok(replies) => replies,
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                // Redis restarted and forgot the script: load it, then once more.
                inv.load_async(&mut self.conn.clone()).await?;
                pipe.query_async(&mut self.conn.clone()).await?
            }
            Err(e) => return Err(e.into()),
        };
        let (reply, replayed) = Reply::new(script_reply).unwrap_replay();
        let outcome = self.reserve_outcome(req, lines, &reply, replayed)?;
        // No owner before: this call claimed the id, for the claim's whole life.
        let claimed_now = owner.is_none();
        let claim = owner.as_deref().map(Claim::parse);
        // Another request owns the id: a conflict. This request was answered
        // from memory before: that answer stands. Otherwise the script's does.
        let refused_before = match claim {
            Some(c) if c.fp != fp => {
                self.holds.forget(rid);
                None
            }
            Some(Claim {
                from_memory: Some(sku),
                ..
            }) => Some(sku),
            _ => {
                // Memory of the hold must not outlive the claim, which the
                // look-up path checks the hold against: a claim made now has
                // its whole life; one made earlier under this request (a
                // retry, a split SKU's second round, a resend after Redis
                // forgot the script) has what Redis says is left, asked only
                // then. Not known: not remembered (looked up instead).
                if let ReserveOutcome::Reserved { expires_at_ms, .. } = &outcome {
                    let claim_ms = if claimed_now {
                        self.claim_ttl_ms() as i64
                    } else {
                        self.claim_left_ms(rid).await.unwrap_or(0)
                    };
                    if claim_ms > 0 {
                        let created_at_ms = expires_at_ms - ttl.as_millis() as i64;
                        self.holds.remember(Known {
                            shard,
                            // A minute's margin before the claim ends.
                            until_ms: chrono::Utc::now().timestamp_millis() + claim_ms - 60_000,
                            hold: Hold {
                                reservation_id: rid.clone(),
                                state: HoldState::Held,
                                lines: lines.to_vec(),
                                buyer: req.buyer.clone(),
                                expires_at_ms: *expires_at_ms,
                                created_at_ms,
                            },
                        });
                    }
                }
                return Ok(outcome);
            }
        };
        match outcome {
            // This request's hold here, made now or left by an attempt whose
            // undo was cut short: never the owner's, so it goes.
            ReserveOutcome::Reserved { .. } | ReserveOutcome::AlreadyReserved { .. } => {
                self.undo_part(shard, rid, lines, fp).await?
            }
            // Its refusal's record goes too (the same script: only this
            // request's record, never a hold another made since).
            ReserveOutcome::SoldOut { .. }
            | ReserveOutcome::LimitExceeded { .. }
            | ReserveOutcome::BuyerRequired { .. }
                if !replayed =>
            {
                self.undo_part(shard, rid, lines, fp).await?
            }
            _ => {}
        }
        // This request was answered sold out from memory before: that stands.
        Ok(match refused_before {
            Some(sku) => ReserveOutcome::SoldOut {
                sku: sku.to_owned(),
                available: 0,
                replayed: true,
            },
            None => ReserveOutcome::Conflict {
                reservation_id: rid.clone(),
            },
        })
    }

    /// Adds to `pipe` the claim of reservation id `rid` for the request
    /// fingerprinted `fp` (kept as long as a tombstone), in one command whose
    /// reply, the pipeline's first, is the id's owner before it: `None` when
    /// this call claimed it.
    pub(crate) fn claim_into(&self, pipe: &mut redis::Pipeline, rid: &str, fp: &str) {
        pipe.cmd("SET")
            .arg(self.keys.claim(rid))
            .arg(fp)
            .arg("NX")
            .arg("GET")
            .arg("PX")
            .arg(self.claim_ttl_ms());
    }

    /// How long the claim of reservation id `rid` has left, in ms (0 or less:
    /// none, or no expiry).
    async fn claim_left_ms(&self, rid: &str) -> Result<i64, EngineError> {
        Ok(redis::cmd("PTTL")
            .arg(self.keys.claim(rid))
            .query_async(&mut self.conn.clone())
            .await?)
    }

    /// How long a claim is kept: past the longest hold and its tombstone, so an
    /// id is owned for as long as anything under it is remembered.
    fn claim_ttl_ms(&self) -> u64 {
        (self.config.tombstone_ttl + self.config.max_hold_ttl).as_millis() as u64
    }

    /// Forgets every hold this process remembers making (Redis lost its data);
    /// confirm and release look holds up until it makes new ones.
    pub fn forget_known_holds(&self) {
        self.holds.clear();
    }

    /// Whether a request owns reservation id `rid` (its claim is kept as long as
    /// anything under the id is remembered, see `claim_into`).
    pub async fn id_claimed(&self, rid: &str) -> Result<bool, EngineError> {
        let found: i64 = redis::cmd("EXISTS")
            .arg(self.keys.claim(rid))
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(found > 0)
    }

    /// Answers `req` sold out (of `sku`) from memory, if its id lets it: the id
    /// is claimed for the request with that answer in one command (`SET NX GET`),
    /// so a retry gets the same answer even once stock returns. `None`: Redis
    /// must decide (the id already belongs to this request, which holds units or
    /// was refused by the script). A claim by another request is a conflict.
    pub async fn refuse_from_memory(
        &self,
        req: &ReserveRequest,
        sku: &str,
    ) -> Result<Option<ReserveOutcome>, EngineError> {
        self.activity.note();
        if let Err(inv) = self.validate(req) {
            return Ok(Some(ReserveOutcome::Invalid(inv)));
        }
        let rid = &req.reservation_id;
        let fp = fingerprint(req);
        let before: Option<String> = redis::cmd("SET")
            .arg(self.keys.claim(rid))
            .arg(claim_from_memory(&fp, sku))
            .arg("NX")
            .arg("GET")
            .arg("PX")
            .arg(self.claim_ttl_ms())
            .query_async(&mut self.conn.clone())
            .await?;
        let sold_out = |sku: &str| ReserveOutcome::SoldOut {
            sku: sku.to_owned(),
            available: 0,
            replayed: true,
        };
        Ok(match before.as_deref().map(Claim::parse) {
            None => Some(sold_out(sku)),
            Some(claim) if claim.fp != fp => Some(ReserveOutcome::Conflict {
                reservation_id: rid.clone(),
            }),
            Some(Claim {
                from_memory: Some(first),
                ..
            }) => Some(sold_out(first)),
            Some(_) => None,
        })
    }

    /// Whether `req`'s lines fall in more than one shard: such a cart takes a script
    /// per shard (and its caller an idempotency claim), one shard takes one script.
    /// A split SKU's line counts in the shard of the part it is routed to.
    pub fn spans_shards(&self, req: &ReserveRequest) -> bool {
        match self.route(req) {
            Some(lines) => self.group_by_shard(&lines).len() > 1,
            None => self.group_by_shard(&req.lines).len() > 1,
        }
    }

    pub(crate) fn group_by_shard(&self, lines: &[Line]) -> Vec<(u16, Vec<Line>)> {
        let mut groups: Vec<(u16, Vec<Line>)> = Vec::new();
        for line in lines {
            let shard = self.keys.shard_of(&line.sku);
            match groups.iter_mut().find(|(s, _)| *s == shard) {
                Some((_, group)) => group.push(line.clone()),
                None => groups.push((shard, vec![line.clone()])),
            }
        }
        groups
    }

    /// KEYS for a script over `lines` of hold `rid` in `shard`: hold, due, stream,
    /// then counters, holds zset and buyer counter per line.
    fn hold_keys(&self, shard: u16, rid: &str, lines: &[Line], buyer: &str) -> Vec<String> {
        let mut keys = vec![
            self.keys.hold(shard, rid),
            self.keys.due(shard),
            self.keys.events(shard),
        ];
        for line in lines {
            keys.push(self.keys.sku(&line.sku));
            keys.push(self.keys.sku_holds(&line.sku));
            keys.push(self.keys.buyer(&line.sku, buyer));
        }
        keys
    }

    /// Runs `reserve.lua` for one shard's part of a request.
    pub(crate) async fn reserve_in_shard(
        &self,
        call: &PartCall<'_>,
    ) -> Result<ReserveOutcome, EngineError> {
        let inv = self.reserve_invocation(call);
        let (reply, replayed) = Reply::new(
            inv.invoke_async::<Vec<Value>>(&mut self.conn.clone())
                .await?,
        )
        .unwrap_replay();
        self.reserve_outcome(call.req, call.lines, &reply, replayed)
    }

    /// `reserve.lua`'s invocation for `call`.
    fn reserve_invocation(&self, call: &PartCall<'_>) -> redis::ScriptInvocation<'_> {
        let PartCall {
            shard,
            req,
            lines,
            ttl,
            fp,
            deadline_ms,
            cart: parts,
        } = *call;
        let buyer = req.buyer.as_deref().unwrap_or("");
        let mut inv = self.scripts.reserve.prepare_invoke();
        for key in self.hold_keys(shard, &req.reservation_id, lines, buyer) {
            inv.key(key);
        }
        inv.arg(&req.reservation_id)
            .arg(ttl.as_millis() as u64)
            .arg(buyer)
            .arg(fp)
            .arg(self.config.buyer_ttl.as_millis() as u64)
            .arg(deadline_ms)
            .arg(parts)
            .arg(self.config.tombstone_ttl.as_millis() as u64);
        for line in lines {
            inv.arg(&line.sku).arg(line.qty);
        }
        inv
    }

    /// The command words (`EVALSHA`, the script's hash, its keys and
    /// arguments) this engine sends to hold `req`, a request in one shard
    /// (valid, not split), without the claim that shares its round trip: what
    /// a raw-Redis benchmark replays, so it runs the script exactly as checkout
    /// does.
    #[cfg(feature = "testkit")]
    pub fn reserve_words(&self, req: &ReserveRequest) -> Result<Vec<String>, EngineError> {
        let ttl = self
            .validate(req)
            .map_err(|inv| EngineError::UnexpectedReply(format!("not a valid request: {inv:?}")))?;
        let fp = fingerprint(req);
        let groups = self.group_by_shard(&req.lines);
        let [(shard, lines)] = groups.as_slice() else {
            return Err(EngineError::UnexpectedReply(
                "the request spans shards".into(),
            ));
        };
        let call = PartCall {
            shard: *shard,
            req,
            lines,
            ttl,
            fp: &fp,
            deadline_ms: 0,
            cart: "",
        };
        let mut pipe = redis::pipe();
        pipe.invoke_script(&self.reserve_invocation(&call));
        Ok(pipe
            .cmd_iter()
            .flat_map(|cmd| cmd.args_iter())
            .map(|arg| match arg {
                redis::Arg::Simple(word) => String::from_utf8_lossy(word).into_owned(),
                // Only a SCAN-style cursor is not a plain word: never in a script call.
                _ => String::new(),
            })
            .collect())
    }

    /// Reads `reserve.lua`'s reply for `lines` of `req` (`replayed`: a refusal
    /// kept from an earlier attempt, see [`Reply::unwrap_replay`]).
    fn reserve_outcome(
        &self,
        req: &ReserveRequest,
        lines: &[Line],
        reply: &Reply,
        replayed: bool,
    ) -> Result<ReserveOutcome, EngineError> {
        let rid = req.reservation_id.clone();
        Ok(match reply.tag()?.as_str() {
            "reserved" => ReserveOutcome::Reserved {
                reservation_id: rid,
                expires_at_ms: reply.int(1)?,
                available_after: lines
                    .iter()
                    .enumerate()
                    .map(|(i, l)| Ok((l.sku.clone(), reply.int(2 + i)?)))
                    .collect::<Result<_, EngineError>>()?,
            },
            "retry" => ReserveOutcome::AlreadyReserved {
                reservation_id: rid,
                state: reply.state(1)?,
                expires_at_ms: reply.int(2)?,
                available_after: first_answer(&reply.text(4)?, &reply.text(3)?),
            },
            "conflict" => ReserveOutcome::Conflict {
                reservation_id: rid,
            },
            "not_warmed" => ReserveOutcome::NotWarmed {
                sku: reply.text(1)?,
            },
            // The line named another split of the SKU than its counter's: the
            // count is learnt and the caller routes again ([`crate::split`]).
            "split" => {
                let sku = reply.text(1)?;
                self.splits.learn(
                    crate::keys::base_sku(&sku),
                    reply.int(2)?.clamp(1, 1 << 15) as u16,
                );
                ReserveOutcome::NotWarmed { sku }
            }
            // A cart's part asked for a deadline already past: the cart took
            // longer to make than its hold time (a slow Redis).
            "lapsed" => {
                return Err(EngineError::Busy(format!(
                    "reservation {rid}: its hold time ended while its parts were being made; \
                     retry in a moment"
                )));
            }
            // The SKU's parts are being changed ([`crate::split`]): retry shortly.
            "changing" => {
                return Err(EngineError::Busy(format!(
                    "the parts of {} are being changed; retry in a moment (a change cut \
                     short is finished by the servers within seconds)",
                    crate::keys::base_sku(&reply.text(1)?)
                )));
            }
            // One part of a split SKU short: the caller gathers ([`crate::split`]).
            "short" => ReserveOutcome::SoldOut {
                sku: reply.text(1)?,
                available: reply.int(2)?,
                replayed: false,
            },
            "sold_out" => ReserveOutcome::SoldOut {
                sku: reply.text(1)?,
                available: reply.int(2)?,
                replayed,
            },
            "limit" => ReserveOutcome::LimitExceeded {
                sku: reply.text(1)?,
                limit: reply.int(2)?,
                already: reply.int(3)?,
            },
            "buyer_required" => ReserveOutcome::BuyerRequired {
                sku: reply.text(1)?,
                limit: reply.int(2)?,
            },
            "not_started" => ReserveOutcome::NotStarted {
                sku: reply.text(1)?,
                starts_at_ms: reply.int(2)?,
            },
            "ended" => ReserveOutcome::Ended {
                sku: reply.text(1)?,
                ended_at_ms: reply.int(2)?,
            },
            // The script checks every number itself too (a caller that skipped
            // validation cannot write a bad hold).
            "invalid" => ReserveOutcome::Invalid(invalid(&reply.text(1)?, reply.text(2)?)),
            other => return Err(EngineError::UnexpectedReply(format!("reserve: {other}"))),
        })
    }

    /// Undoes what the request fingerprinted `fp` made under `rid` in one shard
    /// (a cart's part whose other part failed, or a hold or refusal of a request
    /// that does not own the id) and forgets it there, so the caller may try the
    /// same cart again. One script ends the hold and deletes its record
    /// (`release.lua`'s 'undo'): a copy of the request that made a hold again
    /// meanwhile keeps it until its own undo, and another request's hold under
    /// the id is never touched.
    pub(crate) async fn undo_part(
        &self,
        shard: u16,
        rid: &str,
        lines: &[Line],
        fp: &str,
    ) -> Result<(), EngineError> {
        let buyer: Option<String> = redis::cmd("HGET")
            .arg(self.keys.hold(shard, rid))
            .arg("buyer")
            .query_async(&mut self.conn.clone())
            .await?;
        let hold = Hold {
            reservation_id: rid.to_owned(),
            state: HoldState::Held,
            lines: lines.to_vec(),
            buyer: buyer.filter(|b| !b.is_empty()),
            expires_at_ms: 0,
            created_at_ms: 0,
        };
        let named = Named {
            made_by: Some(fp),
            key: None,
        };
        self.run_on_hold(
            &self.scripts.release,
            shard,
            &hold,
            Some("undo"),
            None,
            named,
        )
        .await?;
        Ok(())
    }

    /// Finds reservation `rid` in every shard it has lines in (one pipelined read),
    /// each part with what the cart protocol needs.
    pub(crate) async fn locate_parts(&self, rid: &str) -> Result<Vec<Part>, EngineError> {
        if !valid_key_part(rid) {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for shard in 0..self.keys.shards() {
            pipe.cmd("HMGET")
                .arg(self.keys.hold(shard, rid))
                .arg(&HOLD_FIELDS);
        }
        pipe.cmd("GET").arg(self.keys.claim(rid));
        let mut replies: Vec<Value> = pipe.query_async(&mut self.conn.clone()).await?;
        let owner: Option<String> = match replies.pop() {
            Some(v) => redis::from_redis_value_ref(&v)
                .map_err(|e| EngineError::UnexpectedReply(format!("claim of {rid}: {e}")))?,
            None => None,
        };
        let owner = owner.as_deref().map(|o| Claim::parse(o).fp);
        let mut found = Vec::new();
        for (shard, reply) in replies.iter().enumerate() {
            let row: Vec<Option<String>> = redis::from_redis_value_ref(reply)
                .map_err(|e| EngineError::UnexpectedReply(format!("hold {rid}: {e}")))?;
            // What a request that does not own the id left (an undo cut short)
            // is not part of the owner's reservation.
            let fp = row.get(FP_FIELD).cloned().flatten();
            if owner.is_some_and(|o| fp.as_deref().is_some_and(|f| f != o)) {
                continue;
            }
            if let Some(hold) = parse_hold(rid, &row)? {
                found.push(Part::new(shard as u16, hold, &row));
            }
        }
        Ok(found)
    }

    /// Finds reservation `rid` in every shard it has lines in.
    async fn locate(&self, rid: &str) -> Result<Vec<(u16, Hold)>, EngineError> {
        Ok(self
            .locate_parts(rid)
            .await?
            .into_iter()
            .map(|p| (p.shard, p.hold))
            .collect())
    }

    /// One reservation, with its lines from every shard; `None` when unknown.
    pub async fn hold(&self, rid: &str) -> Result<Option<Hold>, EngineError> {
        Ok(whole(self.locate(rid).await?.into_iter().map(|(_, h)| h))
            .map(crate::split::hold_of_skus))
    }

    /// Confirms reservation `rid` (payment captured): its units become sold. A
    /// cart over several shards is sold whole or not at all ([`crate::cart`]).
    pub async fn confirm(&self, rid: &str) -> Result<ConfirmOutcome, EngineError> {
        Ok(self.confirm_showing(rid, None).await?.0)
    }

    /// [`Engine::confirm`], with the reservation as it stands afterwards (`None`
    /// when Redis does not know it), read in the same calls: no second look.
    /// `key`: the `Idempotency-Key` the payment came with, kept in the hold
    /// ([`KeyUse`]); [`EngineError::KeyReused`] when it was kept for another
    /// request, and then nothing moved.
    pub async fn confirm_showing(
        &self,
        rid: &str,
        key: Option<&KeyUse>,
    ) -> Result<(ConfirmOutcome, Option<Hold>), EngineError> {
        self.activity.note();
        let direct = Some(ConfirmMode::Direct.as_str());
        if let Some((known, mut reply)) = self
            .run_remembered(rid, &self.scripts.confirm, None, direct, key)
            .await?
        {
            if reply.tag()? == "indebted" {
                let fp = known.fp();
                let named = Named {
                    made_by: Some(&fp),
                    key,
                };
                reply = self.confirm_judged(known.shard, &known.hold, named).await?;
            }
            if !reply.is_miss()? {
                let outcome = self.confirm_reply(rid, &reply)?;
                return self.confirmed(rid, &[Part::known(&known)], outcome).await;
            }
            self.holds.forget(rid);
        }
        let parts = self.locate_parts(rid).await?;
        let outcome = match parts.as_slice() {
            [] => ConfirmOutcome::Unknown,
            [part] if part.cart.is_empty() => {
                let named = Named { made_by: None, key };
                let mut reply = self
                    .run_on_hold(
                        &self.scripts.confirm,
                        part.shard,
                        &part.hold,
                        None,
                        Some(ConfirmMode::Direct.as_str()),
                        named,
                    )
                    .await?;
                if reply.tag()? == "indebted" {
                    reply = self.confirm_judged(part.shard, &part.hold, named).await?;
                }
                self.confirm_reply(rid, &reply)?
            }
            [first, ..] => {
                self.keep_key(first.shard, rid, key).await?;
                // A cart's parts commit without the check: its split lines'
                // debts are judged for the whole SKU first (split.rs).
                let lines: Vec<Line> = parts.iter().flat_map(|p| p.hold.lines.clone()).collect();
                // A cart's commit does not check: handed on, then paid.
                let unchecked = || async { Ok(None) };
                self.paying_judged(&lines, unchecked, || self.confirm_cart(rid, parts.clone()))
                    .await?
            }
        };
        self.confirmed(rid, &parts, outcome).await
    }

    /// What [`Engine::confirm_showing`] answers once `parts` of `rid` were
    /// confirmed with `outcome`: after the replicas acknowledged a payment,
    /// when asked for, with the reservation as it stands.
    async fn confirmed(
        &self,
        rid: &str,
        parts: &[Part],
        outcome: ConfirmOutcome,
    ) -> Result<(ConfirmOutcome, Option<Hold>), EngineError> {
        let shown = whole(parts.iter().map(|p| p.hold.clone()));
        // Where the payment writes: the replicas of these slots' masters
        // must hold it ([`crate::replicas`]).
        let slots: Vec<u16> = parts
            .iter()
            .map(|p| crate::keys::key_slot(self.keys.hold(p.shard, rid).as_bytes()))
            .collect();
        if let (Some(acks), ConfirmOutcome::Confirmed | ConfirmOutcome::AlreadyConfirmed) =
            (&self.acks, &outcome)
        {
            acks.wait(slots).await?;
        }
        let after = match outcome {
            ConfirmOutcome::Confirmed | ConfirmOutcome::AlreadyConfirmed => {
                Some(HoldState::Confirmed)
            }
            ConfirmOutcome::Expired { state } => Some(state),
            ConfirmOutcome::Unknown | ConfirmOutcome::Lost => None,
        };
        Ok((
            outcome,
            after
                .zip(shown)
                .map(|(state, h)| crate::split::hold_of_skus(Hold { state, ..h })),
        ))
    }

    /// Reads `confirm.lua`'s reply (logging any oversell it reports).
    pub(crate) fn confirm_reply(
        &self,
        rid: &str,
        reply: &Reply,
    ) -> Result<ConfirmOutcome, EngineError> {
        Ok(match reply.tag()?.as_str() {
            "confirmed" => {
                // {'confirmed', sku, oversold, ...}: lines that sold units a
                // feed had removed. The write-behind records the remediation
                // from the event; this is the operator's first sign.
                for pair in (1..).step_by(2).take_while(|i| reply.text(*i).is_ok()) {
                    let (sku, units) = (reply.text(pair)?, reply.int(pair + 1)?);
                    tracing::warn!(
                        reservation = %rid, %sku, units,
                        "oversold: a feed lowered stock under this hold before it was paid"
                    );
                }
                ConfirmOutcome::Confirmed
            }
            "already_confirmed" => ConfirmOutcome::AlreadyConfirmed,
            "expired" => ConfirmOutcome::Expired {
                state: reply.state(1)?,
            },
            "unknown" => ConfirmOutcome::Unknown,
            "key_reused" => return Err(EngineError::KeyReused),
            other => return Err(EngineError::UnexpectedReply(format!("confirm: {other}"))),
        })
    }

    /// Pays one-shard hold `hold` after `confirm.lua` answered `indebted` (a
    /// line's part of a split SKU would owe beyond its own holds): the
    /// excess goes to parts whose holds can still pay it, then the payment
    /// is made, reporting as oversold what is still unbacked.
    async fn confirm_judged(
        &self,
        shard: u16,
        hold: &Hold,
        named: Named<'_>,
    ) -> Result<Reply, EngineError> {
        let on_hold = |mode: ConfirmMode| {
            self.run_on_hold(
                &self.scripts.confirm,
                shard,
                hold,
                None,
                Some(mode.as_str()),
                named,
            )
        };
        let checked = || async {
            let reply = on_hold(ConfirmMode::Direct).await?;
            Ok((reply.tag()? != "indebted").then_some(reply))
        };
        self.paying_judged(&hold.lines, checked, || on_hold(ConfirmMode::DirectJudged))
            .await
    }

    /// Runs `confirm.lua` in `mode` on one part.
    pub(crate) async fn confirm_step(
        &self,
        part: &Part,
        mode: ConfirmMode,
    ) -> Result<Reply, EngineError> {
        self.run_on_hold(
            &self.scripts.confirm,
            part.shard,
            &part.hold,
            None,
            Some(mode.as_str()),
            Named::default(),
        )
        .await
    }

    /// Releases reservation `rid` (shopper, checkout or support): its units return.
    /// Idempotent: only the call that ends the hold returns units. A cart is
    /// released whole; while its confirmation is being decided, nothing moves and
    /// the answer is [`EngineError::Busy`].
    pub async fn release(&self, rid: &str) -> Result<ReleaseOutcome, EngineError> {
        Ok(self.release_showing(rid, None).await?.0)
    }

    /// [`Engine::release`], with the reservation as it stands afterwards (`None`
    /// when Redis does not know it), read in the same calls: no second look.
    /// `key` as for [`Engine::confirm_showing`].
    pub async fn release_showing(
        &self,
        rid: &str,
        key: Option<&KeyUse>,
    ) -> Result<(ReleaseOutcome, Option<Hold>), EngineError> {
        self.activity.note();
        let (outcome, shown) = self.release_parts(rid, key).await?;
        let after = match outcome {
            ReleaseOutcome::Released => Some(HoldState::Released),
            ReleaseOutcome::AlreadyGone { state } => Some(state),
            ReleaseOutcome::Unknown => None,
        };
        Ok((
            outcome,
            after
                .zip(shown)
                .map(|(state, h)| crate::split::hold_of_skus(Hold { state, ..h })),
        ))
    }

    /// Releases every part of `rid`; the reservation as it was found.
    async fn release_parts(
        &self,
        rid: &str,
        key: Option<&KeyUse>,
    ) -> Result<(ReleaseOutcome, Option<Hold>), EngineError> {
        let released = Some(HoldState::Released.as_str());
        if let Some((known, reply)) = self
            .run_remembered(rid, &self.scripts.release, released, None, key)
            .await?
        {
            return match release_outcome(&reply)? {
                ReleaseOutcome::AlreadyGone {
                    state: HoldState::Confirming,
                } => Err(busy(rid)),
                outcome => Ok((outcome, Some(known.hold))),
            };
        }
        let parts = self.locate(rid).await?;
        let shown = whole(parts.iter().map(|(_, h)| h.clone()));
        if parts.is_empty() {
            return Ok((ReleaseOutcome::Unknown, None));
        }
        if parts.iter().any(|(_, h)| h.state == HoldState::Confirming) {
            return Err(busy(rid));
        }
        // One part keeps the key in its own call; a cart over shards first.
        let key_in_script = if parts.len() == 1 { key } else { None };
        if parts.len() > 1 {
            self.keep_key(parts[0].0, rid, key).await?;
        }
        let named = Named {
            made_by: None,
            key: key_in_script,
        };
        let mut outcome = None;
        for (shard, hold) in &parts {
            let reply = self
                .run_on_hold(&self.scripts.release, *shard, hold, released, None, named)
                .await?;
            let part = release_outcome(&reply)?;
            outcome = match (outcome, part) {
                (Some(ReleaseOutcome::Released), _) | (_, ReleaseOutcome::Released) => {
                    Some(ReleaseOutcome::Released)
                }
                (_, p) => Some(p),
            };
        }
        Ok((outcome.unwrap_or(ReleaseOutcome::Unknown), shown))
    }

    /// Runs `release.lua` on one shard's part of `hold`. `reason` is `Released` or
    /// `Expired` (which only ends a hold past its deadline). A part whose cart is
    /// being confirmed is left alone: `AlreadyGone { state: Confirming }`.
    pub(crate) async fn release_in_shard(
        &self,
        shard: u16,
        hold: &Hold,
        reason: HoldState,
    ) -> Result<ReleaseOutcome, EngineError> {
        let reply = self
            .run_on_hold(
                &self.scripts.release,
                shard,
                hold,
                Some(reason.as_str()),
                None,
                Named::default(),
            )
            .await?;
        release_outcome(&reply)
    }

    /// Keeps `key` (when given) in the hold of `rid`'s part in `shard` before
    /// a cart over several shards is confirmed or released (`lua/key_use.lua`);
    /// [`EngineError::KeyReused`] when it was kept for another request.
    async fn keep_key(
        &self,
        shard: u16,
        rid: &str,
        key: Option<&KeyUse>,
    ) -> Result<(), EngineError> {
        let Some(key) = key else {
            return Ok(());
        };
        let answer: String = self
            .scripts
            .key_use
            .key(self.keys.hold(shard, rid))
            .arg(key.field())
            .arg(key.fp())
            .arg(self.config.tombstone_ttl.as_millis() as u64)
            .invoke_async(&mut self.conn.clone())
            .await?;
        match answer.as_str() {
            "key_reused" => Err(EngineError::KeyReused),
            // Unknown: the cart's own steps find that out and answer it.
            "kept" | "unknown" => Ok(()),
            other => Err(EngineError::UnexpectedReply(format!("key_use: {other}"))),
        }
    }

    /// Runs `script` (confirm's or release's, with `before` and `after` as in
    /// [`Engine::run_on_hold`]) on hold `rid` as this process remembers making
    /// it, naming the request that made it: one call. `None` when it is not
    /// remembered, or the script found another hold or none (the entry is
    /// forgotten and nothing moved): the caller looks the hold up.
    async fn run_remembered(
        &self,
        rid: &str,
        script: &redis::Script,
        before: Option<&str>,
        after: Option<&str>,
        key: Option<&KeyUse>,
    ) -> Result<Option<(Known, Reply)>, EngineError> {
        let Some(known) = self.holds.get(rid, chrono::Utc::now().timestamp_millis()) else {
            return Ok(None);
        };
        let fp = known.fp();
        let named = Named {
            made_by: Some(&fp),
            key,
        };
        let reply = self
            .run_on_hold(script, known.shard, &known.hold, before, after, named)
            .await?;
        if reply.is_miss()? {
            self.holds.forget(rid);
            return Ok(None);
        }
        Ok(Some((known, reply)))
    }

    /// Runs `confirm.lua` or `release.lua` on one shard's part of `hold`: KEYS from
    /// its lines; ARGV the id, `before` (release's reason), the tombstone
    /// lifetime, `after` (confirm's mode), then each line's SKU (checked against
    /// the hold) and what `named` names (checked too).
    async fn run_on_hold(
        &self,
        script: &redis::Script,
        shard: u16,
        hold: &Hold,
        before: Option<&str>,
        after: Option<&str>,
        named: Named<'_>,
    ) -> Result<Reply, EngineError> {
        let rid = &hold.reservation_id;
        let mut inv = script.prepare_invoke();
        for key in self.hold_keys(shard, rid, &hold.lines, hold.buyer.as_deref().unwrap_or("")) {
            inv.key(key);
        }
        inv.arg(rid);
        if let Some(before) = before {
            inv.arg(before);
        }
        inv.arg(self.config.tombstone_ttl.as_millis() as u64);
        if let Some(after) = after {
            inv.arg(after);
        }
        for line in &hold.lines {
            inv.arg(&line.sku);
        }
        if let Some(key) = named.key {
            inv.arg(key.arg());
        }
        if let Some(fp) = named.made_by {
            inv.arg(format!("fp:{fp}"));
        }
        let reply = Reply::new(
            inv.invoke_async::<Vec<Value>>(&mut self.conn.clone())
                .await?,
        );
        // Units that came back to a part of a split SKU while another part
        // may owe were parked (`release.lua`): routed to the debts now.
        if matches!(reply.tag()?.as_str(), "released" | "expired") && reply.int(2).unwrap_or(0) > 0
        {
            self.route_after(&hold.lines).await;
        }
        Ok(reply)
    }

    /// One reaper pass: in each shard, lists up to `batch` holds past their deadline
    /// and expires each through the same idempotent release. Several reapers may run
    /// at once; each hold is still released exactly once.
    pub async fn reap_once(&self, batch: usize) -> Result<ReapReport, EngineError> {
        let mut report = ReapReport::default();
        for shard in 0..self.keys.shards() {
            let mut inv = self.scripts.reap.prepare_invoke();
            inv.key(self.keys.due(shard)).arg(batch.max(1));
            let due: Vec<String> = inv.invoke_async(&mut self.conn.clone()).await?;
            report.due += due.len() as u64;
            for rid in due {
                let row: Vec<Option<String>> = redis::cmd("HMGET")
                    .arg(self.keys.hold(shard, &rid))
                    .arg(&HOLD_FIELDS)
                    .query_async(&mut self.conn.clone())
                    .await?;
                let hold = match parse_hold(&rid, &row) {
                    Ok(Some(hold))
                        if !Part::new(shard, hold.clone(), &row).cart.is_empty()
                            && !self.orphaned(&rid, &row).await? =>
                    {
                        // A part of a cart: the cart ends whole, never one part alone.
                        match self.expire_cart(&rid).await {
                            Ok(n) => report.released += n,
                            Err(e @ EngineError::UnexpectedReply(_)) => {
                                tracing::error!(shard, reservation = %rid, error = %e, "could not expire a cart; set aside");
                                self.set_aside(shard, &rid).await?;
                                report.skipped += 1;
                            }
                            Err(e) => return Err(e),
                        }
                        continue;
                    }
                    Ok(Some(hold)) => hold,
                    Ok(None) => {
                        // The hold vanished but its index entry did not: drop the entry.
                        redis::cmd("ZREM")
                            .arg(self.keys.due(shard))
                            .arg(&rid)
                            .query_async::<()>(&mut self.conn.clone())
                            .await?;
                        continue;
                    }
                    Err(e) => {
                        // One unreadable hold must not stop the reaper for everyone,
                        // nor sit at the front of the due set: it moves aside for
                        // an operator (its units stay reserved until then).
                        tracing::error!(shard, reservation = %rid, error = %e, "a malformed hold was set aside");
                        self.set_aside(shard, &rid).await?;
                        report.skipped += 1;
                        continue;
                    }
                };
                match self
                    .release_in_shard(shard, &hold, HoldState::Expired)
                    .await
                {
                    Ok(ReleaseOutcome::Released) => report.released += 1,
                    Ok(_) => {}
                    Err(e @ EngineError::UnexpectedReply(_)) => {
                        tracing::error!(shard, reservation = %rid, error = %e, "could not expire a hold; set aside");
                        self.set_aside(shard, &rid).await?;
                        report.skipped += 1;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(report)
    }

    /// Whether the part of `rid` read as `row` (a [`HOLD_FIELDS`] row) belongs
    /// to no reservation: the id's claim names another request (the claim was
    /// lost with Redis' data and taken since, or a losing request's undo was
    /// cut short). No cart of the owner's includes it, so [`Engine::expire_cart`]
    /// never finds it: it ends alone, or would sit at the front of the due set
    /// for ever.
    async fn orphaned(&self, rid: &str, row: &[Option<String>]) -> Result<bool, EngineError> {
        let Some(fp) = row.get(FP_FIELD).cloned().flatten() else {
            return Ok(false);
        };
        let owner: Option<String> = redis::cmd("GET")
            .arg(self.keys.claim(rid))
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(owner.is_some_and(|o| Claim::parse(&o).fp != fp))
    }

    /// Moves hold `rid` from shard `shard`'s due set to its set-aside set, for an
    /// operator to look at; the reaper no longer trips over it.
    pub(crate) async fn set_aside(&self, shard: u16, rid: &str) -> Result<(), EngineError> {
        redis::pipe()
            .atomic()
            .cmd("ZREM")
            .arg(self.keys.due(shard))
            .arg(rid)
            .ignore()
            .cmd("ZADD")
            .arg(self.keys.set_aside(shard))
            .arg(chrono::Utc::now().timestamp_millis())
            .arg(rid)
            .ignore()
            .query_async::<()>(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Appends a `late_payment` event for reservation `rid`, whose hold had ended
    /// (`state`) when its payment arrived. Any shard's stream will do (the
    /// write-behind reads them all): the one the id hashes to, with no lookup.
    pub async fn note_late_payment(&self, rid: &str, state: HoldState) -> Result<(), EngineError> {
        let shard = self.keys.shard_of(rid);
        let now = self.redis_time_ms().await?;
        redis::cmd("XADD")
            .arg(self.keys.events(shard))
            .arg("*")
            .arg("kind")
            .arg("late_payment")
            .arg("sku")
            .arg("")
            .arg("qty")
            .arg(0)
            .arg("rid")
            .arg(rid)
            .arg("state")
            .arg(state.as_str())
            .arg("ts")
            .arg(now)
            .query_async::<()>(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Redis' clock, Unix milliseconds: the one the scripts stamp holds with.
    pub(crate) async fn redis_time_ms(&self) -> Result<i64, EngineError> {
        let (secs, micros): (i64, i64) = redis::cmd("TIME")
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(secs * 1_000 + micros / 1_000)
    }

    /// A SKU's live figures; `None` when its counter is missing (not warmed).
    pub async fn figures(&self, sku: &str) -> Result<Option<Figures>, EngineError> {
        Ok(self
            .figures_many(std::slice::from_ref(&sku))
            .await?
            .pop()
            .flatten())
    }

    /// The live figures of every SKU in `skus`, in order, in one round trip;
    /// `None` for a SKU whose counter is missing.
    pub async fn figures_many(
        &self,
        skus: &[impl AsRef<str>],
    ) -> Result<Vec<Option<Figures>>, EngineError> {
        // Redis refuses an empty pipeline.
        if skus.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for sku in skus {
            pipe.cmd("HMGET")
                .arg(self.keys.sku(sku.as_ref()))
                .arg(&[
                    "available",
                    "reserved",
                    "sold_pending",
                    "sold",
                    "limit",
                    "owed",
                    "opens",
                    "closes",
                    "parts",
                    "moving",
                ])
                .cmd("ZCARD")
                .arg(self.keys.sku_holds(sku.as_ref()));
        }
        let replies: Vec<Value> = pipe.query_async(&mut self.conn.clone()).await?;
        let mut figures = replies
            .chunks(2)
            .map(|pair| {
                let bad = |e: redis::ParsingError| EngineError::UnexpectedReply(e.to_string());
                let [row, holds] = pair else {
                    return Err(EngineError::UnexpectedReply(format!(
                        "figures: expected two replies per SKU, got {pair:?}"
                    )));
                };
                let row: Vec<Option<i64>> = redis::from_redis_value_ref(row).map_err(bad)?;
                let open_holds: u64 = redis::from_redis_value_ref(holds).map_err(bad)?;
                let field = |i: usize| row.get(i).copied().flatten();
                Ok(field(0).map(|available| Figures {
                    available,
                    reserved: field(1).unwrap_or(0),
                    sold_pending: field(2).unwrap_or(0),
                    sold: field(3).unwrap_or(0),
                    open_holds,
                    per_buyer_limit: field(4).unwrap_or(0),
                    owed: field(5).unwrap_or(0),
                    opens_at_ms: field(6).unwrap_or(0),
                    closes_at_ms: field(7).unwrap_or(0),
                    parts: field(8).unwrap_or(1).clamp(1, 1 << 15) as u16,
                    moving: field(9).unwrap_or(0),
                }))
            })
            .collect::<Result<Vec<_>, EngineError>>()?;
        // A split SKU's figures are its parts' together (part 0, read above,
        // says how many there are).
        for (sku, f) in skus.iter().zip(figures.iter_mut()) {
            // A part's own figures ([`Engine::part_figures`]) are its alone.
            if let Some(f) = f
                && crate::keys::parse_part(sku.as_ref()).is_none()
            {
                self.splits.learn(sku.as_ref(), f.parts);
                if f.parts > 1 {
                    self.add_parts(sku.as_ref(), f.parts, f).await?;
                }
            }
        }
        Ok(figures)
    }

    /// Up to `limit` open holds on `sku`, soonest deadline first (of every
    /// part of a split SKU).
    pub async fn holds_of(&self, sku: &str, limit: usize) -> Result<Vec<Hold>, EngineError> {
        let parts = self.parts_of(sku).await?.unwrap_or(1);
        let mut holds = Vec::new();
        for part in 0..parts {
            let name = crate::keys::part_name(sku, part, parts);
            holds.extend(self.holds_of_part(&name, limit).await?);
        }
        holds.sort_by_key(|h| h.expires_at_ms);
        holds.truncate(limit);
        Ok(holds.into_iter().map(crate::split::hold_of_skus).collect())
    }

    /// Up to `limit` open holds on one part of a SKU (an unsplit SKU's only part).
    async fn holds_of_part(&self, sku: &str, limit: usize) -> Result<Vec<Hold>, EngineError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let rids: Vec<String> = redis::cmd("ZRANGE")
            .arg(self.keys.sku_holds(sku))
            .arg(0)
            .arg(limit as i64 - 1)
            .query_async(&mut self.conn.clone())
            .await?;
        // Redis refuses an empty pipeline.
        if rids.is_empty() {
            return Ok(Vec::new());
        }
        let shard = self.keys.shard_of(sku);
        let mut pipe = redis::pipe();
        for rid in &rids {
            pipe.cmd("HMGET")
                .arg(self.keys.hold(shard, rid))
                .arg(&HOLD_FIELDS);
        }
        let rows: Vec<Vec<Option<String>>> = pipe.query_async(&mut self.conn.clone()).await?;
        let mut holds = Vec::with_capacity(rows.len());
        for (rid, row) in rids.iter().zip(rows) {
            match parse_hold(rid, &row) {
                Ok(Some(hold)) => holds.push(hold),
                Ok(None) => {}
                // A list of holds shows the readable ones; the bad one is reported.
                Err(e) => tracing::error!(%sku, error = %e, "skipping a malformed hold"),
            }
        }
        Ok(holds)
    }
}

/// What makes two reservation requests the same request (so a retry, not a
/// conflict): the buyer and the lines, in any order. Not `ttl_ms` (policy rather
/// than what was asked for), nor how the body was written.
pub fn fingerprint(req: &ReserveRequest) -> String {
    fingerprint_of(&req.lines, req.buyer.as_deref())
}

/// [`fingerprint`] of a request for `lines` by `buyer` (a hold's own lines and
/// buyer give the fingerprint of the request that made it).
pub(crate) fn fingerprint_of(lines: &[Line], buyer: Option<&str>) -> String {
    let mut lines: Vec<String> = lines
        .iter()
        .map(|l| format!("{}={}", crate::keys::base_sku(&l.sku), l.qty))
        .collect();
    lines.sort();
    format!("{}|{}", buyer.unwrap_or(""), lines.join(","))
}

/// One shard's part of a reservation, as `reserve.lua` is called for it.
#[derive(Clone, Copy)]
pub(crate) struct PartCall<'a> {
    /// The shard.
    pub(crate) shard: u16,
    /// The whole request (id, buyer).
    pub(crate) req: &'a ReserveRequest,
    /// This shard's lines.
    pub(crate) lines: &'a [Line],
    /// The hold's lifetime, when `deadline_ms` is 0.
    pub(crate) ttl: Duration,
    /// The request's fingerprint (same id + same request = a retry).
    pub(crate) fp: &'a str,
    /// The cart's deadline, Unix ms; 0 for now + `ttl`.
    pub(crate) deadline_ms: i64,
    /// The cart's shards, home first; '' for a one-shard hold.
    pub(crate) cart: &'a str,
}

/// How a cart's part is confirmed (`confirm.lua`'s mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConfirmMode {
    /// A hold in one shard: confirm (or expire, if overdue) at once, unless
    /// a line's part of a split SKU would owe beyond its holds (`indebted`).
    Direct,
    /// [`ConfirmMode::Direct`] once the parts' debts were judged for the
    /// whole SKU: confirm whatever they owe.
    DirectJudged,
    /// Phase one: `held` -> `confirming`, refused once overdue.
    Prepare,
    /// Phase two: `confirming` -> `confirmed`.
    Commit,
    /// Undo phase one: `confirming` -> `held`.
    Rollback,
}

impl ConfirmMode {
    fn as_str(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::DirectJudged => "direct_judged",
            Self::Prepare => "prepare",
            Self::Commit => "commit",
            Self::Rollback => "rollback",
        }
    }
}

/// One shard's part of a reservation, with what the cart protocol needs.
#[derive(Debug, Clone)]
pub(crate) struct Part {
    /// The shard it lives in.
    pub(crate) shard: u16,
    /// The part as a hold (its lines only).
    pub(crate) hold: Hold,
    /// Every part's shard, the home part first; empty for a one-shard hold.
    pub(crate) cart: Vec<u16>,
    /// When its confirmation was prepared (Unix ms), while `confirming`.
    pub(crate) preparing_ms: Option<i64>,
    /// Each line's `available` right after the part was made (its first
    /// answer); empty when not read.
    pub(crate) after: Vec<(String, i64)>,
}

impl Part {
    /// A one-shard hold this process made, as a part.
    fn known(known: &Known) -> Self {
        Self {
            shard: known.shard,
            hold: known.hold.clone(),
            cart: Vec::new(),
            preparing_ms: None,
            after: Vec::new(),
        }
    }

    /// The part in `shard` from its `HOLD_FIELDS` row.
    fn new(shard: u16, hold: Hold, row: &[Option<String>]) -> Self {
        let field = |i: usize| row.get(i).cloned().flatten();
        Self {
            shard,
            hold,
            cart: field(5)
                .unwrap_or_default()
                .split(',')
                .filter_map(|s| s.parse().ok())
                .collect(),
            preparing_ms: field(6).and_then(|v| v.parse().ok()),
            after: first_answer(&field(1).unwrap_or_default(), &field(8).unwrap_or_default()),
        }
    }
}

/// What `release.lua`'s reply says. A part whose cart is being confirmed is
/// `AlreadyGone { state: Confirming }`.
fn release_outcome(reply: &Reply) -> Result<ReleaseOutcome, EngineError> {
    Ok(match reply.tag()?.as_str() {
        "released" => ReleaseOutcome::Released,
        "gone" => ReleaseOutcome::AlreadyGone {
            state: reply.state(1)?,
        },
        "unknown" => ReleaseOutcome::Unknown,
        "key_reused" => return Err(EngineError::KeyReused),
        "busy" => ReleaseOutcome::AlreadyGone {
            state: HoldState::Confirming,
        },
        // Not yet due: another reaper's clock ran ahead; leave it for later.
        "not_due" => ReleaseOutcome::AlreadyGone {
            state: HoldState::Held,
        },
        other => return Err(EngineError::UnexpectedReply(format!("release: {other}"))),
    })
}

/// What a confirm or release names after the hold's lines: the scripts'
/// optional last arguments.
#[derive(Debug, Clone, Copy, Default)]
struct Named<'a> {
    /// The `Idempotency-Key` the call came with, kept in the hold.
    key: Option<&'a KeyUse>,
    /// The fingerprint of the request that made the hold, when this process
    /// knows the hold from memory: another hold under the id is left alone.
    made_by: Option<&'a str>,
}

/// A release refused while reservation `rid`'s confirmation is being decided.
fn busy(rid: &str) -> EngineError {
    EngineError::Busy(format!(
        "reservation {rid} is being confirmed; retry in a moment"
    ))
}

/// A hold from `HMGET state lines buyer deadline created`; `None` when absent.
/// One reservation from its parts (one per shard it has lines in): the first
/// part with every part's lines; `None` without parts.
fn whole(parts: impl Iterator<Item = Hold>) -> Option<Hold> {
    parts.reduce(|mut hold, part| {
        hold.lines.extend(part.lines);
        hold
    })
}

/// A retried hold's first answer: each line's SKU (from the hold's `lines`,
/// `sku=qty,...`) with its `available` count right after it was made (`after`, in
/// the same order). Holds made before `after` was kept answer none.
fn first_answer(lines: &str, after: &str) -> Vec<(String, i64)> {
    lines
        .split(',')
        .filter_map(|pair| pair.split_once('=').map(|(sku, _)| sku))
        .zip(after.split(',').map_while(|a| a.parse::<i64>().ok()))
        .map(|(sku, a)| (sku.to_owned(), a))
        .collect()
}

fn parse_hold(rid: &str, row: &[Option<String>]) -> Result<Option<Hold>, EngineError> {
    let field = |i: usize| row.get(i).cloned().flatten();
    // A refused request's record (reserve.lua keeps it for retries) is no hold.
    let Some(state) = field(0).filter(|s| s != REFUSED) else {
        return Ok(None);
    };
    let state = HoldState::parse(&state)
        .ok_or_else(|| EngineError::UnexpectedReply(format!("hold {rid}: state '{state}'")))?;
    let lines = field(1)
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|pair| {
            let (sku, qty) = pair.split_once('=').ok_or_else(|| {
                EngineError::UnexpectedReply(format!("hold {rid}: line '{pair}'"))
            })?;
            let qty = qty
                .parse()
                .map_err(|_| EngineError::UnexpectedReply(format!("hold {rid}: qty '{qty}'")))?;
            Ok(Line {
                sku: sku.to_owned(),
                qty,
            })
        })
        .collect::<Result<Vec<_>, EngineError>>()?;
    let int = |i: usize| field(i).and_then(|v| v.parse().ok()).unwrap_or(0);
    Ok(Some(Hold {
        reservation_id: rid.to_owned(),
        state,
        lines,
        buyer: field(2).filter(|b| !b.is_empty()),
        expires_at_ms: int(3),
        created_at_ms: int(4),
    }))
}

#[cfg(test)]
mod tests {
    use super::{fingerprint, valid_sku};
    use crate::model::{Line, ReserveRequest};

    #[test]
    fn sku_codes_match_the_database_rule() {
        assert!(valid_sku("DROP-001"));
        assert!(valid_sku("a.b_c-9"));
        assert!(!valid_sku(""));
        assert!(!valid_sku("-lead"));
        assert!(!valid_sku("has space"));
        assert!(!valid_sku("brace{tag}"));
        assert!(!valid_sku(&"x".repeat(65)));
    }

    #[test]
    fn fingerprint_ignores_line_order_and_ttl() {
        let a = ReserveRequest {
            reservation_id: "r".into(),
            lines: vec![
                Line {
                    sku: "A".into(),
                    qty: 1,
                },
                Line {
                    sku: "B".into(),
                    qty: 2,
                },
            ],
            buyer: Some("b".into()),
            ttl_ms: Some(5_000),
        };
        let mut b = a.clone();
        b.lines.reverse();
        b.ttl_ms = None;
        assert_eq!(fingerprint(&a), fingerprint(&b));
        b.lines[0].qty = 3;
        assert_ne!(fingerprint(&a), fingerprint(&b));
    }
}
