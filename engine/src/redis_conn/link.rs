//! One connection type for one Redis node or a Redis Cluster.
//!
//! Everything in the engine talks through [`RedisConn`]. On a cluster a
//! command goes to the master of its key's slot, a script by its first key
//! (every script keeps its keys in one slot: see [`crate::keys`]). A pipeline
//! that is not a transaction is split by slot, one pipeline per slot sent to
//! its master, the replies put back in order: code that pipelines reads over
//! many SKUs (warm, reconcile, figures) needs no cluster branch. Reads go to
//! every slot at once; a pipeline that writes runs its slots in the order of
//! their first commands, so a claim pipelined before a script still runs
//! first. A transaction (`MULTI`) must stay in one slot, as Redis requires.
//!
//! What has no key (a scan of one shard's keys, `CONFIG GET`, a lock listing)
//! says where it goes: [`RedisConn::query_at`] (the master of a key's slot),
//! [`RedisConn::query_masters`] (every master) and [`RedisConn::scan_match`]
//! (every master's keys).
//! Stream readers never block on a cluster ([`RedisConn::read_streams`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::try_join_all;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::{Cmd, FromRedisValue, Pipeline, RedisFuture, RedisResult, Value};

use super::entries::{StreamEntries, StreamReads};

/// How often a stream reader on a cluster looks again while its streams are
/// empty (it cannot block: one `XREAD` may only name streams of one slot, and a
/// blocked command would hold up the multiplexed connection it shares).
pub const CLUSTER_POLL: Duration = Duration::from_millis(50);

/// A connection to one Redis node (self-reconnecting) or to a Redis Cluster
/// (following its slots and failovers). Cheap to clone: clones share the
/// connection.
#[derive(Clone)]
pub enum RedisConn {
    /// One Redis server.
    Node(ConnectionManager),
    /// A Redis Cluster (or Valkey cluster).
    Cluster(ClusterLink),
}

/// A cluster connection that replaces itself when it stops answering.
///
/// The cluster client follows slot moves and failovers, but after a master
/// dies under load a client was seen to stay stuck (every command timing out
/// for minutes, while a fresh client in another process worked at once). So
/// when every command has failed for [`HEAL_AFTER`] (timeouts, refused or
/// dropped connections), a fresh client connection is opened and every clone
/// of this link switches to it; a failing reopen is tried again after
/// another [`HEAL_AFTER`]. Clones share the connection and the healing.
#[derive(Clone)]
pub struct ClusterLink {
    shared: Arc<Shared>,
}

struct Shared {
    client: redis::cluster::ClusterClient,
    conn: std::sync::RwLock<ClusterConnection>,
    /// Since when every command failed (`None`: the last one answered).
    failing_since: std::sync::Mutex<Option<Instant>>,
    /// When a fresh connection was last tried.
    last_reopen: std::sync::Mutex<Option<Instant>>,
}

/// Every cluster link of this process, for [`ClusterLink::reopen_all`].
static LINKS: std::sync::Mutex<Vec<std::sync::Weak<Shared>>> = std::sync::Mutex::new(Vec::new());

/// How long every command must fail before a [`ClusterLink`] opens a fresh
/// connection: longer than a failover's usual gap (about 4 s with a 2 s node
/// timeout) would be kinder, but a stuck client never recovers, so sooner is
/// better; opening one while the cluster elects is harmless (the old one is
/// kept when the new one cannot connect).
pub const HEAL_AFTER: Duration = Duration::from_secs(3);

impl ClusterLink {
    /// A link over `conn`, reopened from `client` when it stops answering.
    pub fn new(client: redis::cluster::ClusterClient, conn: ClusterConnection) -> Self {
        let shared = Arc::new(Shared {
            client,
            conn: std::sync::RwLock::new(conn),
            failing_since: std::sync::Mutex::new(None),
            last_reopen: std::sync::Mutex::new(None),
        });
        let mut links = LINKS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        links.retain(|l| l.strong_count() > 0);
        links.push(Arc::downgrade(&shared));
        Self { shared }
    }

    /// Reopens every cluster link of this process: after a failover the
    /// clients' slot maps may still point at a master that is frozen (its
    /// commands time out, they do not redirect), so the failover watch
    /// ([`crate::failover`]) has every link start over from the cluster's
    /// current map.
    pub async fn reopen_all() {
        let links: Vec<Arc<Shared>> = LINKS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .collect();
        for shared in links {
            Self { shared }.reopen().await;
        }
    }

    /// The connection in use now (a cheap clone).
    pub fn current(&self) -> ClusterConnection {
        self.shared
            .conn
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Notes how a command went; after [`HEAL_AFTER`] of nothing but
    /// connection failures, opens a fresh connection in the background.
    fn note<T>(&self, result: &RedisResult<T>) {
        let lock = |m: &std::sync::Mutex<Option<Instant>>| {
            *m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        match result {
            Ok(_) => {
                *self
                    .shared
                    .failing_since
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
            }
            // A server's answer (an error reply) is an answer.
            Err(e)
                if !(e.is_timeout()
                    || e.is_connection_dropped()
                    || e.is_io_error()
                    || e.is_connection_refusal()
                    || e.kind()
                        == redis::ErrorKind::Server(redis::ServerErrorKind::ClusterDown)) => {}
            Err(_) => {
                let now = Instant::now();
                let since = {
                    let mut f = self
                        .shared
                        .failing_since
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    *f.get_or_insert(now)
                };
                let recently = lock(&self.shared.last_reopen)
                    .is_some_and(|t| now.duration_since(t) < HEAL_AFTER);
                if now.duration_since(since) >= HEAL_AFTER && !recently {
                    *self
                        .shared
                        .last_reopen
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(now);
                    let link = self.clone();
                    tokio::spawn(async move { link.reopen().await });
                }
            }
        }
    }

    /// Opens a fresh connection and switches every clone to it; keeps the
    /// old one when the cluster cannot be reached.
    async fn reopen(&self) {
        match self.shared.client.get_async_connection().await {
            Ok(fresh) => {
                *self
                    .shared
                    .conn
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = fresh;
                tracing::warn!(
                    "opened a fresh Redis Cluster connection (the old one stopped answering, or the cluster failed over)"
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, "a fresh Redis Cluster connection failed; retrying later")
            }
        }
    }
}

impl std::fmt::Debug for RedisConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Node(_) => "RedisConn::Node",
            Self::Cluster(_) => "RedisConn::Cluster",
        })
    }
}

impl From<ConnectionManager> for RedisConn {
    fn from(conn: ConnectionManager) -> Self {
        Self::Node(conn)
    }
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Node(c) => c.req_packed_command(cmd),
            Self::Cluster(link) => {
                let (link, mut c) = (link.clone(), link.current());
                Box::pin(async move {
                    let result = c.req_packed_command(cmd).await;
                    link.note(&result);
                    result
                })
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Node(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(link) => {
                let (link, mut c) = (link.clone(), link.current());
                Box::pin(async move {
                    let result = if pipeline.is_transaction() {
                        c.req_packed_commands(pipeline, offset, count).await
                    } else {
                        split_by_slot(c, pipeline).await
                    };
                    link.note(&result);
                    result
                })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Node(c) => c.get_db(),
            Self::Cluster(link) => link.current().get_db(),
        }
    }
}

/// Runs a non-transaction `pipeline` on a cluster: its commands grouped by
/// slot, one pipeline per group; the replies put back in the pipeline's order.
/// A pipeline that writes runs its groups one after another in the order of
/// their first command (so one that claims an id and then runs a script keeps
/// that order, as on one node): one round trip per slot it touches. One that
/// only reads sends every group at once.
async fn split_by_slot(conn: ClusterConnection, pipeline: &Pipeline) -> RedisResult<Vec<Value>> {
    let mut groups: Vec<(Option<u16>, Pipeline, Vec<usize>)> = Vec::new();
    for (i, cmd) in pipeline.cmd_iter().enumerate() {
        let slot = first_key(cmd).map(|k| crate::keys::key_slot(&k));
        // A command without a key goes alone, wherever the client sends it.
        let found = slot.and_then(|s| groups.iter_mut().find(|g| g.0 == Some(s)));
        match found {
            Some(group) => {
                group.1.add_command(cmd.clone());
                group.2.push(i);
            }
            None => {
                let mut pipe = redis::pipe();
                pipe.add_command(cmd.clone());
                groups.push((slot, pipe, vec![i]));
            }
        }
    }
    let mut ordered = vec![Value::Nil; pipeline.len()];
    let replies: Vec<Vec<Value>> = if pipeline.cmd_iter().all(reads_only) {
        // Nothing written: the order between slots cannot matter, so the
        // groups go at once (a lookup of a hold in every shard is one round
        // trip, not one per shard).
        let sent = groups.iter().map(|(_, pipe, _)| {
            let mut conn = conn.clone();
            async move { conn.req_packed_commands(pipe, 0, pipe.len()).await }
        });
        try_join_all(sent).await?
    } else {
        let mut conn = conn;
        let mut replies = Vec::with_capacity(groups.len());
        for (_, pipe, _) in &groups {
            replies.push(conn.req_packed_commands(pipe, 0, pipe.len()).await?);
        }
        replies
    };
    for ((_, _, places), values) in groups.iter().zip(replies) {
        for (place, value) in places.iter().zip(values) {
            ordered[*place] = value;
        }
    }
    Ok(ordered)
}

/// Whether `cmd` only reads (the read commands Holdfast pipelines).
fn reads_only(cmd: &Cmd) -> bool {
    let Some(redis::Arg::Simple(name)) = cmd.args_iter().next() else {
        return false;
    };
    const READS: [&[u8]; 17] = [
        b"GET",
        b"MGET",
        b"HGET",
        b"HMGET",
        b"HGETALL",
        b"EXISTS",
        b"TTL",
        b"PTTL",
        b"ZSCORE",
        b"ZRANGE",
        b"ZCARD",
        b"ZRANGEBYSCORE",
        b"XLEN",
        b"XRANGE",
        b"XREVRANGE",
        b"XINFO",
        b"XPENDING",
    ];
    READS.iter().any(|r| name.eq_ignore_ascii_case(r))
}

/// The first key of `cmd`, for the commands Holdfast pipelines: the argument
/// after the name, a script's first key, a stream read's first stream; `None`
/// for commands without keys.
fn first_key(cmd: &Cmd) -> Option<Vec<u8>> {
    let args: Vec<&[u8]> = cmd
        .args_iter()
        .map(|a| match a {
            redis::Arg::Simple(bytes) => bytes,
            // A cursor (or a kind this version does not know) is never a key.
            _ => &b""[..],
        })
        .collect();
    let name = args.first()?.to_ascii_uppercase();
    match name.as_slice() {
        b"EVAL" | b"EVALSHA" | b"EVAL_RO" | b"EVALSHA_RO" | b"FCALL" | b"FCALL_RO" => {
            let keys: usize = std::str::from_utf8(args.get(2)?).ok()?.parse().ok()?;
            (keys > 0)
                .then(|| args.get(3).map(|k| k.to_vec()))
                .flatten()
        }
        b"XREAD" | b"XREADGROUP" => {
            let at = args
                .iter()
                .position(|a| a.eq_ignore_ascii_case(b"STREAMS"))?;
            args.get(at + 1).map(|k| k.to_vec())
        }
        b"PING" | b"INFO" | b"TIME" | b"CONFIG" | b"CLUSTER" | b"SCRIPT" | b"WAIT" | b"DBSIZE"
        | b"FLUSHALL" | b"FLUSHDB" | b"MULTI" | b"EXEC" | b"SCAN" => None,
        _ => args.get(1).map(|k| k.to_vec()),
    }
}

impl RedisConn {
    /// Whether this is a cluster connection.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }

    /// Runs `cmd` on the master that serves `key`'s slot (on one node: there).
    /// For commands without a key that concern one shard, e.g. `SCAN` of a
    /// shard's holds.
    pub async fn query_at<T: FromRedisValue>(&mut self, key: &str, cmd: &Cmd) -> RedisResult<T> {
        match self {
            Self::Node(c) => cmd.query_async(c).await,
            Self::Cluster(link) => {
                let mut c = link.current();
                let route = Route::with_key(key, SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                let value = c.route_command(cmd.clone(), routing).await?;
                Ok(redis::from_redis_value(value.extract_error()?)?)
            }
        }
    }

    /// Runs `cmd` on every master and returns each one's reply (one on a
    /// single node): settings and health that each master has on its own.
    pub async fn query_masters<T: FromRedisValue>(&mut self, cmd: &Cmd) -> RedisResult<Vec<T>> {
        match self {
            Self::Node(c) => Ok(vec![cmd.query_async(c).await?]),
            Self::Cluster(link) => {
                let mut c = link.current();
                let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                let value = c.route_command(cmd.clone(), routing).await?;
                let Value::Map(replies) = value else {
                    return Ok(vec![redis::from_redis_value(value.extract_error()?)?]);
                };
                replies
                    .into_iter()
                    .map(|(_, v)| Ok(redis::from_redis_value(v.extract_error()?)?))
                    .collect()
            }
        }
    }

    /// Every key matching `pattern`, on every master (`SCAN`, never `KEYS`):
    /// for operator views such as the lock list, never on the hot path.
    pub async fn scan_match(&mut self, pattern: &str) -> RedisResult<Vec<String>> {
        let masters = match self {
            Self::Node(_) => vec![None],
            Self::Cluster(_) => self.master_slots().await?.into_iter().map(Some).collect(),
        };
        let mut found = Vec::new();
        for master in masters {
            let mut cursor = 0_u64;
            loop {
                let mut cmd = redis::cmd("SCAN");
                cmd.arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1_000);
                let (next, keys): (u64, Vec<String>) = match (&mut *self, master) {
                    (Self::Cluster(link), Some(slot)) => {
                        let mut c = link.current();
                        let route = Route::new(slot, SlotAddr::Master);
                        let routing =
                            RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                        let value = c.route_command(cmd, routing).await?;
                        redis::from_redis_value(value.extract_error()?)?
                    }
                    (conn, _) => cmd.query_async(conn).await?,
                };
                found.extend(keys);
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        Ok(found)
    }

    /// One slot of each master (the first of its first range), from
    /// `CLUSTER SLOTS`: routing by slot reaches a master whatever address it
    /// announces. Empty on a single node.
    pub async fn master_slots(&mut self) -> RedisResult<Vec<u16>> {
        if !self.is_cluster() {
            return Ok(Vec::new());
        }
        let ranges: Vec<Value> = redis::cmd("CLUSTER").arg("SLOTS").query_async(self).await?;
        let mut seen = Vec::new();
        let mut slots = Vec::new();
        for range in slot_ranges(&ranges) {
            if !seen.contains(&range.master_id) {
                seen.push(range.master_id);
                slots.push(range.first);
            }
        }
        Ok(slots)
    }

    /// Reads `keys` from `ids` with `head` (an `XREAD` or `XREADGROUP … COUNT n`
    /// up to, not including, `BLOCK` and `STREAMS`), waiting up to `block` for
    /// an entry when there is none. On one node that is one blocking command
    /// (give the reader a connection of its own). On a cluster, one
    /// non-blocking read per stream (each in its own slot), all at once, again
    /// every [`CLUSTER_POLL`] until something arrives or `block` has passed.
    pub async fn read_streams(
        &mut self,
        head: &Cmd,
        keys: &[String],
        ids: &[String],
        block: Option<Duration>,
    ) -> RedisResult<Vec<StreamEntries>> {
        let c = match self {
            Self::Node(c) => {
                let mut cmd = head.clone();
                if let Some(block) = block {
                    cmd.arg("BLOCK").arg(block.as_millis().max(1) as u64);
                }
                cmd.arg("STREAMS").arg(keys).arg(ids);
                let StreamReads(streams) = cmd.query_async(c).await?;
                return Ok(streams);
            }
            Self::Cluster(link) => link.clone(),
        };
        let deadline = block.map(|b| tokio::time::Instant::now() + b);
        loop {
            let reads = keys.iter().zip(ids).map(|(key, id)| {
                let mut conn = RedisConn::Cluster(c.clone());
                let mut cmd = head.clone();
                cmd.arg("STREAMS").arg(key).arg(id);
                async move { cmd.query_async::<StreamReads>(&mut conn).await }
            });
            let found: Vec<StreamEntries> = try_join_all(reads)
                .await?
                .into_iter()
                .flat_map(|StreamReads(streams)| streams)
                .filter(|s| !s.entries.is_empty())
                .collect();
            match deadline {
                Some(deadline) if found.is_empty() && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep_until(
                        deadline.min(tokio::time::Instant::now() + CLUSTER_POLL),
                    )
                    .await;
                }
                _ => return Ok(found),
            }
        }
    }
}

/// One range of `CLUSTER SLOTS`: its slots and the master serving them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotRange {
    /// The first slot.
    pub first: u16,
    /// The last slot.
    pub last: u16,
    /// The master's host, as the cluster announces it.
    pub master_host: String,
    /// The master's port.
    pub master_port: u16,
    /// The master's node id.
    pub master_id: String,
}

/// The ranges of a `CLUSTER SLOTS` reply (`[first, last, [host, port, id, …],
/// replicas…]` each); malformed entries are skipped.
pub fn slot_ranges(reply: &[Value]) -> Vec<SlotRange> {
    let int = |v: Option<&Value>| v.and_then(|v| redis::from_redis_value_ref::<u16>(v).ok());
    reply
        .iter()
        .filter_map(|range| {
            let Value::Array(parts) = range else {
                return None;
            };
            let Some(Value::Array(master)) = parts.get(2) else {
                return None;
            };
            Some(SlotRange {
                first: int(parts.first())?,
                last: int(parts.get(1))?,
                master_host: redis::from_redis_value_ref(master.first()?).ok()?,
                master_port: int(master.get(1))?,
                master_id: redis::from_redis_value_ref(master.get(2)?).ok()?,
            })
        })
        .collect()
}
