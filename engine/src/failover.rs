//! Noticing a Redis Cluster failover, and not selling on the shards it moved
//! until they are checked against PostgreSQL.
//!
//! Replication is asynchronous: a replica promoted to master may have missed
//! its old master's last writes, so units sold there could read as available
//! again. Every server watches which master serves each shard's slot
//! ([`ShardMasters`], four times a second). When one changes, the server stops
//! reserving on that shard ([`ShardFence`]: reservations there answer "not
//! warmed", 503 with `Retry-After`, never sold out), rebuilds the shard's
//! counters from PostgreSQL as after a loss (PostgreSQL's stock less the
//! holds that survived), reconciles them, and resumes. A master restarted before the cluster could fail it over keeps
//! its node id but not its run id: that counts as a change too, since it may
//! have loaded data older than PostgreSQL's. Each step is logged, audited (`failover`,
//! `failover_resumed`) and counted for `/metrics`.
//!
//! What this cannot bring back is a sale whose only trace was in the lost
//! writes (its event never reached the stream the write-behind reads): that is
//! what `--confirm-replicas` is for, on one master with replicas.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::PgPool;

use crate::engine::Engine;
use crate::error::EngineError;
use crate::reconcile::{ReconcileOptions, reconcile_all};
use crate::redis_conn::nodes::{Address, Nodes};

/// Which shards are not selling now, in this process.
#[derive(Debug)]
pub struct ShardFence {
    fenced: Box<[AtomicBool]>,
}

impl ShardFence {
    /// No shard fenced, of `shards`.
    pub fn new(shards: u16) -> Self {
        Self {
            fenced: (0..shards).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// Whether reservations on `shard` are held back.
    pub fn is_fenced(&self, shard: u16) -> bool {
        self.fenced
            .get(usize::from(shard))
            .is_some_and(|f| f.load(Ordering::Relaxed))
    }

    /// Holds back (or lets go again) reservations on `shards`.
    pub fn set(&self, shards: &[u16], fenced: bool) {
        for shard in shards {
            if let Some(f) = self.fenced.get(usize::from(*shard)) {
                f.store(fenced, Ordering::Relaxed);
            }
        }
    }

    /// The shards held back now.
    pub fn fenced(&self) -> Vec<u16> {
        (0..self.fenced.len() as u16)
            .filter(|s| self.is_fenced(*s))
            .collect()
    }
}

/// A shard whose master changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    /// The shard.
    pub shard: u16,
    /// The same node restarted (its run id changed, not its node id): it may
    /// have loaded data older than PostgreSQL's.
    pub restarted: bool,
}

/// The master (node id and run id) serving each shard, as last seen, asked
/// of the cluster's nodes directly ([`Nodes`]: not through the cluster
/// client, whose map can still name an old master for seconds).
pub struct ShardMasters {
    nodes: Nodes,
    seen: Option<Vec<Option<String>>>,
}

impl ShardMasters {
    /// Watches the cluster that `redis_url` (its seed URLs) names.
    pub fn new(redis_url: &str) -> Self {
        Self {
            nodes: Nodes::new(redis_url),
            seen: None,
        }
    }

    /// Reads which master serves each shard now (`CLUSTER SLOTS`) and returns
    /// the shards whose master is another than at the last look: none the
    /// first time.
    pub async fn changed(&mut self, engine: &Engine) -> Result<Vec<Moved>, EngineError> {
        let Some(ranges) = self.nodes.cluster_slots().await else {
            return Err(EngineError::UnexpectedReply(
                "no cluster node answered CLUSTER SLOTS".into(),
            ));
        };
        let ranges = crate::redis_conn::slot_ranges(&ranges);
        // Each master's identity is its node id and its run id: a master
        // restarted so fast that the cluster did not fail it over keeps its
        // node id but not its run id, and may have come back with data older
        // than PostgreSQL's (an RDB file it received as a replica once). Run
        // ids are asked of each master at once; a master that does not answer
        // keeps the run id last seen, so a frozen node never holds up seeing
        // the others move.
        let mut addresses: Vec<Address> = ranges
            .iter()
            .map(|r| (r.master_host.clone(), r.master_port))
            .collect();
        addresses.sort();
        addresses.dedup();
        let mut info = redis::cmd("INFO");
        info.arg("server");
        let nodes = &self.nodes;
        let runs: Vec<Option<String>> =
            futures_util::future::join_all(addresses.iter().map(|address| {
                let info = &info;
                async move {
                    let text: String = nodes.query(address, info).await?;
                    crate::redis_conn::parse_info(&text).remove("run_id")
                }
            }))
            .await;
        let run_of = |host: &str, port: u16| {
            addresses
                .iter()
                .position(|(h, p)| h == host && *p == port)
                .and_then(|i| runs[i].clone())
        };
        let identities: Vec<(u16, u16, String, Option<String>)> = ranges
            .iter()
            .map(|r| {
                let run = run_of(&r.master_host, r.master_port);
                (r.first, r.last, r.master_id.clone(), run)
            })
            .collect();
        let keys = engine.keyspace();
        let node = |id: &str| id.split('/').next().unwrap_or_default().to_owned();
        let now: Vec<Option<String>> = (0..keys.shards())
            .map(|shard| {
                let slot = crate::keys::key_slot(keys.due(shard).as_bytes());
                let (_, _, master, run) = identities
                    .iter()
                    .find(|(start, end, _, _)| (*start..=*end).contains(&slot))?;
                let before = self
                    .seen
                    .as_ref()
                    .and_then(|seen| seen[usize::from(shard)].clone());
                Some(match (run, before) {
                    (Some(run), _) => format!("{master}/{run}"),
                    // No answer from the master: same node, same run as before.
                    (None, Some(before)) if node(&before) == *master => before,
                    (None, _) => format!("{master}/"),
                })
            })
            .collect();
        let changed = match &self.seen {
            None => Vec::new(),
            Some(before) => (0..keys.shards())
                .filter_map(|s| {
                    // A shard with no master right now (the cluster is still
                    // deciding) is not a change yet; the next look sees who won.
                    let (Some(b), Some(n)) = (&before[usize::from(s)], &now[usize::from(s)]) else {
                        return None;
                    };
                    let run = |id: &str| id.split('/').nth(1).unwrap_or_default().to_owned();
                    // The same node with a run id not known on one side is
                    // no news: only a new node or a new known run id is.
                    let restarted = node(b) == node(n);
                    let unknown = run(b).is_empty() || run(n).is_empty();
                    (b != n && !(restarted && unknown)).then_some(Moved {
                        shard: s,
                        restarted,
                    })
                })
                .collect(),
        };
        // Keep the last known master of a shard without one now.
        let merged = match self.seen.take() {
            Some(before) => now.into_iter().zip(before).map(|(n, b)| n.or(b)).collect(),
            None => now,
        };
        self.seen = Some(merged);
        Ok(changed)
    }
}

/// What the failover watch counts, for `/metrics`.
#[derive(Debug, Default)]
pub struct FailoverStats {
    /// Shards whose master changed (each a failover seen by this process).
    pub shards_moved: AtomicU64,
    /// Checks against PostgreSQL that finished and let a shard sell again.
    pub resumed: AtomicU64,
    /// Milliseconds the last fenced shards stayed out of sale.
    pub last_fenced_ms: AtomicU64,
}

/// How often the watch asks which master serves each shard.
pub const WATCH_EVERY: Duration = Duration::from_millis(250);

/// Watches the cluster's masters until `shutdown`: a shard whose master
/// changed is fenced, reconciled against PostgreSQL (retried until it
/// succeeds: a shard is never let go unchecked) and let go. On a single node
/// there is nothing to watch: it only waits for `shutdown` (returning early
/// would read as a worker that stopped on its own, started again and again).
pub async fn run_failover_watch(
    engine: Engine,
    pg: PgPool,
    redis_url: String,
    stats: Arc<FailoverStats>,
    shutdown: impl Future<Output = ()>,
) {
    if !engine.connection().is_cluster() {
        shutdown.await;
        return;
    }
    tokio::pin!(shutdown);
    let mut masters = ShardMasters::new(&redis_url);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            () = tokio::time::sleep(WATCH_EVERY) => {}
        }
        let moved = match masters.changed(&engine).await {
            Ok(moved) if moved.is_empty() => continue,
            Ok(moved) => moved,
            Err(e) => {
                tracing::debug!(error = %e, "asking the cluster for its masters failed; retrying");
                continue;
            }
        };
        let restarted: Vec<u16> = moved
            .iter()
            .filter(|m| m.restarted)
            .map(|m| m.shard)
            .collect();
        let moved: Vec<u16> = moved.iter().map(|m| m.shard).collect();
        let check = recheck(&engine, &pg, &stats, &moved, &restarted);
        tokio::select! {
            () = &mut shutdown => break,
            () = check => {}
        }
    }
}

/// Fences `moved`, reconciles them until a run succeeds, and lets them go.
async fn recheck(
    engine: &Engine,
    pg: &PgPool,
    stats: &FailoverStats,
    moved: &[u16],
    restarted: &[u16],
) {
    let started = Instant::now();
    engine.shard_fence().set(moved, true);
    // Every cluster connection starts over from the new map: one still
    // pointing at a frozen old master would only time out there.
    crate::redis_conn::ClusterLink::reopen_all().await;
    stats
        .shards_moved
        .fetch_add(moved.len() as u64, Ordering::Relaxed);
    tracing::error!(
        shards = ?moved,
        "Redis Cluster failover: the master of these shards changed; not selling on them until \
         their counters are checked against PostgreSQL"
    );
    crate::audit::note(
        pg,
        "system",
        "failover",
        "redis",
        serde_json::json!({ "shards": moved }),
    )
    .await;
    // A master restarted in place may be back with old counters: rebuild
    // those from PostgreSQL first. A promoted replica's counters are live
    // (at most a few writes behind): reconciling them is enough.
    while !restarted.is_empty() {
        match rebuild(engine, pg, restarted).await {
            Ok(()) => break,
            Err(e) => {
                tracing::warn!(error = %e, shards = ?restarted, "rebuilding restarted shards failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
    let options = ReconcileOptions {
        trigger: "failover".into(),
        shards: Some(moved.to_vec()),
        ..ReconcileOptions::default()
    };
    let report = loop {
        match reconcile_all(engine, pg, &options, |_| {}).await {
            Ok(report) => break report,
            // Another server is checking: wait for the lock, then check too
            // (cheap, and this process must see the shard checked itself).
            Err(EngineError::Busy(_)) => tokio::time::sleep(Duration::from_millis(200)).await,
            Err(e) => {
                tracing::warn!(error = %e, shards = ?moved, "checking failed-over shards failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    engine.shard_fence().set(moved, false);
    let took = started.elapsed();
    stats.resumed.fetch_add(1, Ordering::Relaxed);
    stats
        .last_fenced_ms
        .store(took.as_millis() as u64, Ordering::Relaxed);
    tracing::warn!(
        shards = ?moved,
        checked = report.checked,
        corrected_down = report.corrected_down,
        took_ms = took.as_millis() as u64,
        "failed-over shards checked against PostgreSQL; selling there again"
    );
    crate::audit::note(
        pg,
        "system",
        "failover_resumed",
        "redis",
        serde_json::json!({
            "shards": moved,
            "checked": report.checked,
            "drifted": report.drifted,
            "corrected_down": report.corrected_down,
            "took_ms": took.as_millis() as u64,
        }),
    )
    .await;
}

/// Builds the counters of `shards`' SKUs again from PostgreSQL, as after a
/// loss: each counter is deleted, then warmed as a new one (PostgreSQL's stock
/// less the holds Redis still has; a sale not yet recorded is applied when it
/// is, see `lua/late.lua`). Not a forced warm-up: that keeps the live
/// counter's own record of what it settled, and a counter that came back old
/// would keep its old record and hand recorded sales back.
async fn rebuild(engine: &Engine, pg: &PgPool, shards: &[u16]) -> Result<(), EngineError> {
    let keys = engine.keyspace();
    let skus: Vec<String> = sqlx::query_scalar("SELECT sku FROM skus")
        .fetch_all(pg)
        .await?
        .into_iter()
        .filter(|sku: &String| shards.contains(&keys.shard_of(sku)))
        .collect();
    for chunk in skus.chunks(1_000) {
        let mut pipe = redis::pipe();
        for sku in chunk {
            pipe.cmd("DEL").arg(keys.sku(sku)).ignore();
        }
        pipe.query_async::<()>(&mut engine.connection()).await?;
    }
    crate::warmup::warm_list(engine, pg, &skus).await?;
    Ok(())
}
