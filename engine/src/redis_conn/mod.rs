//! Redis: connecting to one node or a cluster, and refusing evicting policies.
//!
//! `REDIS_URL` names one node, or a Redis Cluster: several seed URLs separated
//! by commas, or one node that runs in cluster mode (asked at start-up). Both
//! give a [`RedisConn`], which every part of Holdfast works through.
//!
//! A `rediss://` URL speaks TLS and verifies the server's certificate and host
//! name against the system's trust roots, or against the CA named by the URL's
//! `ssl_ca_certs` parameter; `ssl_certfile` and `ssl_keyfile` add a client
//! certificate (Redis' `tls-auth-clients`). The parameter names are redis-py's,
//! so one URL serves both. A user and password in the URL authenticate (`AUTH`,
//! ACL users included). A URL ending in `#insecure` (TLS without certificate
//! checks) fails to connect, and `holdfast doctor` says why.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::error::{EngineError, redact_url};
use crate::postgres::one_line;

mod entries;
mod link;
pub mod nodes;
pub use entries::{AutoClaimed, Entry, EntryRange, StreamEntries, StreamReads};
pub use link::{CLUSTER_POLL, ClusterLink, HEAL_AFTER, RedisConn, SlotRange, slot_ranges};

/// What Redis said about memory eviction, as checked at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictionCheck {
    /// `noeviction`: Redis refuses writes rather than delete anything.
    Safe(String),
    /// An evicting policy (`allkeys-*` or `volatile-*`), accepted only because
    /// the operator overrode the check.
    Overridden(String),
    /// `CONFIG GET` is not allowed (some managed services): the policy is unknown.
    Unknown(String),
}

/// Opens a connection to `url` and proves it answers `PING`: a Redis Cluster
/// when `url` lists several seed nodes separated by commas, or when its one
/// node says it runs in cluster mode; otherwise one node, through a
/// [`ConnectionManager`] that reconnects by itself after Redis restarts.
pub async fn connect(url: &str) -> Result<RedisConn, EngineError> {
    let seeds: Vec<&str> = url
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if seeds.len() > 1 {
        return connect_cluster(url, &seeds).await;
    }
    let mut conn = connect_node(url).await?;
    if runs_in_cluster_mode(&mut conn).await {
        return connect_cluster(url, &seeds).await;
    }
    Ok(RedisConn::Node(conn))
}

/// Opens a [`ConnectionManager`] to the one node at `url` (never a cluster
/// client): for what concerns that node itself, such as a test's or an
/// operator's look at one server.
pub async fn connect_node(url: &str) -> Result<ConnectionManager, EngineError> {
    let unreachable = unreachable(url);
    let client = client(url).map_err(&unreachable)?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(3)))
        .set_response_timeout(Some(Duration::from_secs(5)))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500));
    let mut conn = ConnectionManager::new_with_config(client, config)
        .await
        .map_err(|e| unreachable(one_line(&e.to_string())))?;
    answers(&mut conn, &unreachable).await?;
    Ok(conn)
}

/// Proves `conn` answers `PING`, or fails with `unreachable`'s error.
async fn answers(
    conn: &mut impl redis::aio::ConnectionLike,
    unreachable: &impl Fn(String) -> EngineError,
) -> Result<(), EngineError> {
    redis::cmd("PING")
        .query_async::<String>(conn)
        .await
        .map(drop)
        .map_err(|e| unreachable(one_line(&e.to_string())))
}

/// The start-up error for `url` (password hidden) failing with a reason.
fn unreachable(url: &str) -> impl Fn(String) -> EngineError {
    let url = redact_url(url);
    move |reason| EngineError::RedisUnreachable {
        url: url.clone(),
        reason,
    }
}

/// Whether the node behind `conn` is a cluster node (`cluster_enabled:1`).
async fn runs_in_cluster_mode(conn: &mut ConnectionManager) -> bool {
    let text: redis::RedisResult<String> =
        redis::cmd("INFO").arg("cluster").query_async(conn).await;
    text.is_ok_and(|t| {
        parse_info(&t)
            .get("cluster_enabled")
            .is_some_and(|v| v == "1")
    })
}

/// Connects to the cluster that `seeds` (URLs of some of its nodes) belong to.
/// The client learns every node from them and follows slot moves and
/// failovers; user, password and TLS come from the first seed.
async fn connect_cluster(url: &str, seeds: &[&str]) -> Result<RedisConn, EngineError> {
    let unreachable = unreachable(url);
    let mut nodes = Vec::new();
    let mut certs = None;
    for seed in seeds {
        let (node, tls) = tls_parts(seed).map_err(&unreachable)?;
        nodes.push(node);
        certs = certs.or(tls);
    }
    // Shorter waits than on one node: a frozen master must not hold a
    // command (or a reconnect, which asks every seed) past the API's 3 s
    // deadline, and the cluster's own node timeout decides failovers anyway.
    let mut builder = redis::cluster::ClusterClientBuilder::new(nodes)
        .connection_timeout(Duration::from_secs(1))
        .response_timeout(Duration::from_secs(2))
        .retries(2);
    if let Some(certs) = certs {
        builder = builder.certs(certs);
    }
    let client = builder
        .build()
        .map_err(|e| unreachable(one_line(&e.to_string())))?;
    let conn = client
        .get_async_connection()
        .await
        .map_err(|e| unreachable(one_line(&e.to_string())))?;
    let mut conn = RedisConn::Cluster(ClusterLink::new(client, conn));
    answers(&mut conn, &unreachable).await?;
    Ok(conn)
}

/// The URL parameters that name certificate files: taken out of the URL before
/// it reaches the client, which has no such parameters.
const CA_CERTS: &str = "ssl_ca_certs";
const CERT_FILE: &str = "ssl_certfile";
const KEY_FILE: &str = "ssl_keyfile";

/// One URL query parameter, decoded.
type Pair = (String, String);

/// A Redis client for `url` (not yet connected): plain for `redis://` and Unix
/// sockets; TLS for `rediss://`, with the certificate files its parameters name
/// read now, so a wrong path is a start-up error that names it.
pub fn client(url: &str) -> Result<redis::Client, String> {
    let (url, certs) = tls_parts(url)?;
    match certs {
        None => redis::Client::open(url.as_str()),
        Some(certs) => redis::Client::build_with_tls(url.as_str(), certs),
    }
    .map_err(|e| one_line(&e.to_string()))
}

/// `url` without the certificate parameters, and the certificates they name
/// (read now); `None` when it names none.
fn tls_parts(url: &str) -> Result<(String, Option<redis::TlsCertificates>), String> {
    crate::tls::install_provider();
    let parsed = url::Url::parse(url).ok();
    let is_ours = |k: &str| [CA_CERTS, CERT_FILE, KEY_FILE].contains(&k);
    let Some(mut parsed) = parsed.filter(|u| u.query_pairs().any(|(k, _)| is_ours(&k))) else {
        return Ok((url.to_owned(), None));
    };
    if !matches!(parsed.scheme(), "rediss" | "valkeys") {
        return Err(format!(
            "{CA_CERTS}, {CERT_FILE} and {KEY_FILE} need a rediss:// URL (TLS); this one is {}://",
            parsed.scheme()
        ));
    }
    let (files, rest): (Vec<Pair>, Vec<Pair>) = parsed
        .query_pairs()
        .into_owned()
        .partition(|(k, _)| is_ours(k));
    let file = |name: &str| {
        files
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let read = |name: &str, path: &str| {
        std::fs::read(path).map_err(|e| format!("cannot read {name} {path}: {e}"))
    };
    let root_cert = file(CA_CERTS).map(|p| read(CA_CERTS, p)).transpose()?;
    let client_tls = match (file(CERT_FILE), file(KEY_FILE)) {
        (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
            client_cert: read(CERT_FILE, cert)?,
            client_key: read(KEY_FILE, key)?,
        }),
        (None, None) => None,
        _ => {
            return Err(format!(
                "{CERT_FILE} and {KEY_FILE} go together: give both or neither"
            ));
        }
    };
    parsed.set_query(None);
    if !rest.is_empty() {
        parsed.query_pairs_mut().extend_pairs(rest);
    }
    Ok((
        parsed.to_string(),
        Some(redis::TlsCertificates {
            client_tls,
            root_cert,
        }),
    ))
}

/// Reads `maxmemory-policy` and refuses anything but `noeviction` unless
/// `allow_evicting` is set.
///
/// Under an `allkeys-*` policy Redis may delete a stock counter under memory
/// pressure; a deleted counter reads as "not warmed" and a deleted hold leaks
/// reserved units. A `volatile-*` policy spares the counters but deletes keys
/// with a lifetime: feed event guards (a redelivered event applies twice),
/// per-buyer counters (the limit is lifted), ended-hold tombstones (a retry
/// holds stock twice) and lock leases. Both are start-up errors, not warnings.
pub async fn check_eviction_policy(
    conn: &mut RedisConn,
    url: &str,
    allow_evicting: bool,
) -> Result<EvictionCheck, EngineError> {
    // Each master of a cluster has its own setting: the first that evicts
    // is the answer.
    let reply: redis::RedisResult<Vec<Vec<String>>> = conn
        .query_masters(redis::cmd("CONFIG").arg("GET").arg("maxmemory-policy"))
        .await;
    let policies = match reply {
        Ok(pairs) if pairs.iter().all(|p| p.len() == 2) && !pairs.is_empty() => pairs
            .into_iter()
            .map(|mut p| p.remove(1))
            .collect::<Vec<_>>(),
        Ok(other) => {
            return Ok(EvictionCheck::Unknown(format!(
                "unexpected reply {other:?}"
            )));
        }
        Err(e) => return Ok(EvictionCheck::Unknown(one_line(&e.to_string()))),
    };
    let policy = policies
        .iter()
        .find(|p| *p != "noeviction")
        .unwrap_or(&policies[0])
        .clone();
    if policy == "noeviction" {
        return Ok(EvictionCheck::Safe(policy));
    }
    if allow_evicting {
        return Ok(EvictionCheck::Overridden(policy));
    }
    Err(EngineError::EvictingRedis {
        url: redact_url(url),
        policy,
    })
}

/// Whether Redis answers `PING` within `timeout`.
pub async fn ping(conn: &RedisConn, timeout: Duration) -> Result<(), String> {
    let mut conn = conn.clone();
    let cmd = redis::cmd("PING");
    match tokio::time::timeout(timeout, cmd.query_async::<String>(&mut conn)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(one_line(&e.to_string())),
        Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
    }
}

/// A stream consumer's name for `role` (e.g. `record`, `feeds-0`), unique to
/// this process among every server of a deployment: host name, process id and
/// a random tag drawn once per process. Two servers must never share a name
/// (containers often all run as pid 1): a consumer re-reads its own pending
/// entries, so a shared name would let two servers apply the same entries at
/// once, and neither could tell the other had died.
pub fn consumer_name(role: &str) -> String {
    static PROCESS: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let process = PROCESS.get_or_init(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "host".to_owned());
        let tag = uuid::Uuid::new_v4().simple().to_string();
        format!("{host}-{}-{}", std::process::id(), &tag[..6])
    });
    format!("{role}-{process}")
}

/// How long a stream consumer with nothing pending may stay silent before
/// [`crate::Engine::forget_idle_consumers`] deletes it: far longer than any
/// live consumer's pause between reads (seconds), so only names left by
/// processes that are gone (every restart makes a new one) go.
pub const FORGET_CONSUMERS_AFTER: Duration = Duration::from_secs(3_600);

/// Creates consumer group `group` on `stream` (and the stream), doing nothing if
/// it exists. Needed again after Redis loses its data.
pub async fn ensure_group(
    conn: &mut RedisConn,
    stream: &str,
    group: &str,
) -> Result<(), EngineError> {
    let created: redis::RedisResult<()> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg(group)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(conn)
        .await;
    match created {
        Err(e) if e.code() != Some("BUSYGROUP") => Err(e.into()),
        _ => Ok(()),
    }
}

/// Redis' `INFO` fields (`name:value` lines, every section), read within
/// `timeout`.
pub async fn info(
    conn: &RedisConn,
    timeout: Duration,
) -> Result<std::collections::HashMap<String, String>, String> {
    let mut conn = conn.clone();
    let cmd = redis::cmd("INFO");
    // On a cluster: the first master's (each master reports only itself).
    let read = conn.query_masters::<String>(&cmd);
    let text = match tokio::time::timeout(timeout, read).await {
        Ok(Ok(texts)) => texts.into_iter().next().unwrap_or_default(),
        Ok(Err(e)) => return Err(one_line(&e.to_string())),
        Err(_) => return Err(format!("no answer within {} ms", timeout.as_millis())),
    };
    Ok(parse_info(&text))
}

/// `INFO`'s text as a map of field to value (section headers and blank lines
/// skipped).
pub fn parse_info(text: &str) -> std::collections::HashMap<String, String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.trim_end().split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The health figures of a Redis server an operator watches, from its `INFO`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServerStats {
    /// Bytes Redis allocated.
    pub used_memory: u64,
    /// `maxmemory` (0: no limit).
    pub maxmemory: u64,
    /// Resident memory over allocated memory (above 1.5: fragmented).
    pub fragmentation_ratio: f64,
    /// Clients connected now.
    pub connected_clients: u64,
    /// Most clients Redis accepts.
    pub maxclients: u64,
    /// Keys evicted since start (anything above 0 means lost counters or holds).
    pub evicted_keys: u64,
    /// Key lookups that found nothing, since start.
    pub keyspace_misses: u64,
    /// Whether this server is a master (false: a replica).
    pub master: bool,
    /// Replicas connected to this master.
    pub replicas: u64,
    /// Bytes the slowest replica is behind this master (0 without replicas).
    pub replica_lag_bytes: u64,
    /// Whether the append-only file is on.
    pub aof_enabled: bool,
    /// The server process's id: it changes when Redis restarts, or when the
    /// address now reaches another node (a fail-over).
    pub run_id: String,
}

impl ServerStats {
    /// The figures in `info` (missing fields read as 0 or false).
    pub fn from_info(info: &std::collections::HashMap<String, String>) -> Self {
        let num = |k: &str| info.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let master_offset = num("master_repl_offset");
        // `slave0:ip=…,port=…,state=online,offset=123,lag=0`
        let replica_offsets: Vec<u64> = info
            .iter()
            .filter(|(k, _)| {
                k.strip_prefix("slave")
                    .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
            })
            .filter_map(|(_, v)| {
                v.split(',')
                    .find_map(|kv| kv.strip_prefix("offset="))
                    .and_then(|o| o.parse().ok())
            })
            .collect();
        Self {
            used_memory: num("used_memory"),
            maxmemory: num("maxmemory"),
            fragmentation_ratio: info
                .get("mem_fragmentation_ratio")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0),
            connected_clients: num("connected_clients"),
            maxclients: num("maxclients"),
            evicted_keys: num("evicted_keys"),
            keyspace_misses: num("keyspace_misses"),
            master: info.get("role").is_none_or(|r| r == "master"),
            replicas: num("connected_slaves"),
            replica_lag_bytes: replica_offsets
                .iter()
                .map(|o| master_offset.saturating_sub(*o))
                .max()
                .unwrap_or(0),
            aof_enabled: num("aof_enabled") == 1,
            run_id: info.get("run_id").cloned().unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod info_tests {
    use super::*;

    #[test]
    fn info_fields_become_the_health_figures() {
        let text = "# Server\r\nrun_id:abc\r\n\r\n# Clients\r\nconnected_clients:7\r\nmaxclients:10000\r\n\
                    # Memory\r\nused_memory:1024\r\nmaxmemory:0\r\nmem_fragmentation_ratio:1.62\r\n\
                    # Stats\r\nevicted_keys:3\r\nkeyspace_misses:9\r\n\
                    # Replication\r\nrole:master\r\nconnected_slaves:2\r\n\
                    slave0:ip=10.0.0.2,port=6379,state=online,offset=900,lag=0\r\n\
                    slave1:ip=10.0.0.3,port=6379,state=online,offset=1000,lag=1\r\n\
                    master_repl_offset:1000\r\n# Persistence\r\naof_enabled:1\r\n";
        let s = ServerStats::from_info(&parse_info(text));
        assert_eq!(s.connected_clients, 7);
        assert_eq!(s.maxclients, 10_000);
        assert_eq!(s.used_memory, 1_024);
        assert!((s.fragmentation_ratio - 1.62).abs() < 1e-9);
        assert_eq!(s.evicted_keys, 3);
        assert_eq!(s.keyspace_misses, 9);
        assert!(s.master);
        assert_eq!(s.replicas, 2);
        assert_eq!(s.replica_lag_bytes, 100);
        assert!(s.aof_enabled);
        assert_eq!(s.run_id, "abc");
    }
}
