//! Test helpers: private `redis-server` processes that tests may kill and restart.
//!
//! Tests that only need *a* Redis can share the one in `REDIS_URL`; tests that stop,
//! flush or reconfigure Redis start their own here so they never disturb others.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` on a free loopback port with its own temporary directory,
/// killed when dropped.
///
/// With `HOLDFAST_TEST_CLUSTER=1` in the environment ([`cluster_mode`]), each
/// plain server is a one-node Redis Cluster holding every slot: it refuses any
/// command, pipeline transaction or script whose keys span slots, as a real
/// cluster does, so a suite run that way proves the code it drives works on a
/// cluster (the engine then talks to it through the cluster client). With
/// `HOLDFAST_TEST_CLUSTER=3` each plain server is a cluster of three masters
/// (this node and two peers, no replicas): the slots, and so the shards, are
/// spread over three processes, as in production, and kill and restart act on
/// all three.
pub struct TestRedis {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    extra_args: Vec<String>,
    /// The CA whose certificate the server presents, when it speaks TLS only.
    tls_ca: Option<PathBuf>,
    /// How this server takes part in a cluster.
    cluster: ClusterRole,
    /// The other masters of its cluster, when it is the first of three
    /// (`HOLDFAST_TEST_CLUSTER=3`); killed and restarted with it.
    peers: Vec<TestRedis>,
}

/// How a [`TestRedis`] takes part in a Redis Cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClusterRole {
    /// A plain server.
    None,
    /// A cluster of one node that holds every slot.
    Alone,
    /// A node of a [`TestCluster`] (slots given by `redis-cli --cluster create`).
    Member,
}

/// The arguments that make a `redis-server` speak TLS only, presenting `ca`'s
/// server certificate (clients are not asked for one).
fn tls_args(ca: &TestCa) -> Vec<String> {
    [
        "--tls-cert-file",
        &ca.file("server.crt"),
        "--tls-key-file",
        &ca.file("server.key"),
        "--tls-ca-cert-file",
        &ca.file("ca.crt"),
        "--tls-auth-clients",
        "no",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

/// The arguments that make a `redis-server` a cluster node (its state file in
/// its own directory; a failed master's replica takes over after 2 s).
const CLUSTER_ARGS: [&str; 6] = [
    "--cluster-enabled",
    "yes",
    "--cluster-config-file",
    "nodes.conf",
    "--cluster-node-timeout",
    "2000",
];

/// How many masters each plain test server's cluster has: 0 (a plain server),
/// 1 (`HOLDFAST_TEST_CLUSTER=1`: one node holding every slot) or 3
/// (`HOLDFAST_TEST_CLUSTER=3`).
pub fn cluster_masters() -> usize {
    match std::env::var("HOLDFAST_TEST_CLUSTER").as_deref() {
        Ok("1") => 1,
        Ok("3") => 3,
        _ => 0,
    }
}

/// Whether plain test servers run as clusters ([`cluster_masters`] is not 0).
pub fn cluster_mode() -> bool {
    cluster_masters() > 0
}

impl TestRedis {
    /// Starts a fresh, empty, non-persistent `redis-server` and waits until it answers.
    ///
    /// # Panics
    /// When `redis-server` is not installed or does not come up within 10 s: a test
    /// cannot proceed without it, and silently skipping would hide the gap.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Like [`TestRedis::start`], with extra `redis-server` arguments (e.g.
    /// `["--maxmemory-policy", "allkeys-lru"]`).
    pub fn start_with(args: &[&str]) -> Self {
        match cluster_masters() {
            0 => Self::launch(args, None, ClusterRole::None),
            1 => Self::launch(args, None, ClusterRole::Alone),
            masters => {
                let mut first = Self::launch(args, None, ClusterRole::Member);
                first.peers = (1..masters)
                    .map(|_| Self::launch(args, None, ClusterRole::Member))
                    .collect();
                let ports: Vec<u16> = first.nodes().map(|n| n.port).collect();
                form_cluster(&ports, 0, None);
                for node in first.nodes() {
                    node.await_cluster_ok();
                }
                first
            }
        }
    }

    /// This node and its peers.
    fn nodes(&self) -> impl Iterator<Item = &TestRedis> {
        std::iter::once(self).chain(self.peers.iter())
    }

    /// A server that speaks TLS only (no plain port), presenting `ca`'s server
    /// certificate, with extra `args` (e.g. ACL users).
    pub fn start_tls(ca: &TestCa, args: &[&str]) -> Self {
        let mut all = tls_args(ca);
        all.extend(args.iter().map(|s| (*s).to_owned()));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        Self::launch(&all, Some(ca.dir.path().join("ca.crt")), ClusterRole::None)
    }

    /// A TLS-only server (as [`TestRedis::start_tls`]) whose one usable account
    /// is the ACL user `user` with `password` (the default user is off).
    pub fn start_tls_as(ca: &TestCa, user: &str, password: &str) -> Self {
        let secret = format!(">{password}");
        Self::start_tls(
            ca,
            &[
                "--user", "default", "off", "--user", user, "on", &secret, "~*", "&*", "+@all",
            ],
        )
    }

    fn launch(args: &[&str], tls_ca: Option<PathBuf>, cluster: ClusterRole) -> Self {
        let pick_port = if cluster == ClusterRole::None {
            free_port
        } else {
            free_cluster_port
        };
        let port = pick_port();
        let dir = tempfile::tempdir().expect("create a temp dir for redis-server");
        let mut extra_args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
        if cluster != ClusterRole::None {
            extra_args.extend(CLUSTER_ARGS.iter().map(|s| (*s).to_owned()));
        }
        let mut redis = Self {
            port,
            dir,
            child: None,
            extra_args,
            tls_ca,
            cluster,
            peers: Vec::new(),
        };
        // The port was free a moment ago; another process may take it (or,
        // on a cluster node, its bus port, port + 10000) before redis-server
        // binds: a node that exits at once is started again on another port.
        for _ in 0..4 {
            if redis.try_spawn() {
                break;
            }
            redis.port = pick_port();
        }
        if redis.child.is_none() {
            redis.spawn();
        }
        if cluster == ClusterRole::Alone {
            redis.command(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]);
            redis.await_cluster_ok();
        }
        redis
    }

    /// Runs one command on this node (blocking), panicking on failure.
    fn command(&self, args: &[&str]) -> redis::Value {
        let client = crate::redis_conn::client(&self.node_url()).expect("a test redis URL");
        let mut conn = client
            .get_connection()
            .expect("connect to a test redis-server");
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        cmd.query(&mut conn)
            .unwrap_or_else(|e| panic!("{args:?} on port {}: {e}", self.port))
    }

    /// Waits (up to 20 s) until this node, if a replica, says its link to its
    /// master is up (the first full sync done).
    fn await_replica_synced(&self) {
        self.await_text(&["INFO", "replication"], "its replica link up", |info| {
            !info.contains("role:slave") || info.contains("master_link_status:up")
        });
    }

    /// Waits (up to 20 s) until this node says `cluster_state:ok`.
    fn await_cluster_ok(&self) {
        self.await_text(&["CLUSTER", "INFO"], "cluster_state:ok", |info| {
            info.contains("cluster_state:ok")
        });
    }

    /// Asks this node `args` every 50 ms until its text answer is `done`;
    /// panics after 20 s naming what it waited for (`what`) and the last answer.
    fn await_text(&self, args: &[&str], what: &str, done: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text: String = redis::from_redis_value(self.command(args)).expect("a text answer");
            if done(&text) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the node on port {} never reached {what}:\n{text}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The URL of this server: `redis://`, or for a TLS server `rediss://` naming
    /// the test CA (`ssl_ca_certs`).
    pub fn url(&self) -> String {
        if !self.peers.is_empty() {
            return self
                .nodes()
                .map(Self::node_url)
                .collect::<Vec<_>>()
                .join(",");
        }
        self.node_url()
    }

    /// This one node's URL.
    fn node_url(&self) -> String {
        match &self.tls_ca {
            None => format!("redis://127.0.0.1:{}", self.port),
            Some(ca) => format!(
                "rediss://127.0.0.1:{}/?ssl_ca_certs={}",
                self.port,
                ca.display()
            ),
        }
    }

    /// The TCP port this server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's working directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kills the server (SIGKILL: no chance to save anything) and waits for it
    /// to exit; with its peers, when it has some.
    pub fn kill(&mut self) {
        for peer in &mut self.peers {
            peer.kill();
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server (and its peers) again on the same ports, empty
    /// (nothing is persisted; a cluster node keeps its place and slots, from
    /// its `nodes.conf`).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
        for peer in &mut self.peers {
            peer.spawn();
        }
        // A member of a `TestCluster` is left to rejoin at its own pace (tests
        // watch that happen); a suite's cluster must be whole again.
        if self.cluster == ClusterRole::Alone || !self.peers.is_empty() {
            for node in self.nodes() {
                node.await_cluster_ok();
            }
        }
    }

    /// The process id, while it runs (to pause it with SIGSTOP, say).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is currently running.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Starts redis-server on this node's port, panicking unless it answers.
    fn spawn(&mut self) {
        if !self.try_spawn() {
            panic!(
                "redis-server on port {} exited at start; see {}",
                self.port,
                self.dir.path().join("redis.log").display()
            );
        }
    }

    /// Starts redis-server on this node's port: true once it answers, false
    /// if it exited first (its port was taken); panics if it does neither.
    fn try_spawn(&mut self) -> bool {
        let log: PathBuf = self.dir.path().join("redis.log");
        let port = self.port.to_string();
        let ports: &[&str] = if self.tls_ca.is_some() {
            &["--port", "0", "--tls-port", &port]
        } else {
            &["--port", &port]
        };
        let child = Command::new("redis-server")
            .args(ports)
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(&log)
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server (is it installed and on PATH?)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return true;
            }
            if let Some(child) = self.child.as_mut()
                && child.try_wait().is_ok_and(|status| status.is_some())
            {
                self.child = None;
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "redis-server on port {} did not start; see {}",
            self.port,
            log.display()
        );
    }
}

impl TestRedis {
    /// A connection to this server as Holdfast makes one (self-reconnecting;
    /// a cluster client when the server is a cluster node).
    pub async fn connection(&self) -> crate::RedisConn {
        crate::redis_conn::connect(&self.url())
            .await
            .expect("connect to the test redis-server")
    }

    /// Pauses writes for `ms` on this server and on every peer of its
    /// cluster (`CLIENT PAUSE … WRITE`), node by node: through a cluster
    /// client the command reaches one node only, and work on the others
    /// goes on.
    pub async fn pause_writes(&self, ms: u64) {
        for port in std::iter::once(self.port).chain(self.peers.iter().map(|p| p.port)) {
            let client =
                redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("a node's URL");
            let mut conn = client
                .get_multiplexed_async_connection()
                .await
                .expect("connect to a node");
            redis::cmd("CLIENT")
                .arg("PAUSE")
                .arg(ms)
                .arg("WRITE")
                .query_async::<()>(&mut conn)
                .await
                .expect("pause a node's writes");
        }
    }

    /// An engine over this server with `config`.
    pub async fn engine_with(&self, config: crate::EngineConfig) -> crate::Engine {
        crate::Engine::new(self.connection().await, config)
    }

    /// An engine over this server with the default configuration.
    pub async fn engine(&self) -> crate::Engine {
        self.engine_with(crate::EngineConfig::default()).await
    }

    /// Redis' own count of calls and time in µs by command (lower-case names,
    /// e.g. `evalsha`), from `INFO commandstats`, summed over a cluster's masters.
    pub async fn command_stats(&self) -> std::collections::HashMap<String, (u64, u64)> {
        let infos: Vec<String> = self
            .connection()
            .await
            .query_masters(redis::cmd("INFO").arg("commandstats"))
            .await
            .expect("INFO commandstats on the test redis-server");
        let mut stats = std::collections::HashMap::new();
        for line in infos.iter().flat_map(|info| info.lines()) {
            let Some((name, rest)) = line
                .strip_prefix("cmdstat_")
                .and_then(|l| l.split_once(':'))
            else {
                continue;
            };
            let field = |k: &str| -> u64 {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(k))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            };
            let entry: &mut (u64, u64) = stats.entry(name.to_owned()).or_default();
            entry.0 += field("calls=");
            entry.1 += field("usec=");
        }
        stats
    }

    /// How many times Redis has run `command` ([`TestRedis::command_stats`]).
    pub async fn command_calls(&self, command: &str) -> u64 {
        self.command_stats()
            .await
            .get(command)
            .map_or(0, |(calls, _)| *calls)
    }

    /// This server's clock (`TIME`), Unix milliseconds: the one the scripts use.
    pub async fn now_ms(&self) -> i64 {
        let (secs, micros): (i64, i64) = redis::cmd("TIME")
            .query_async(&mut self.connection().await)
            .await
            .expect("TIME on the test redis-server");
        secs * 1_000 + micros / 1_000
    }
}

/// Warms `sku` with `available` units (no limit, nothing pending), panicking on failure.
pub async fn stock(engine: &crate::Engine, sku: &str, available: i64) {
    stock_with_limit(engine, sku, available, 0).await;
}

/// Warms `sku` with `available` units and a per-buyer limit.
pub async fn stock_with_limit(engine: &crate::Engine, sku: &str, available: i64, limit: i64) {
    let spec = crate::stock::WarmSpec {
        per_buyer_limit: limit,
        ..crate::stock::WarmSpec::new(sku, available)
    };
    engine.warm(&spec, true).await.expect("warm a test counter");
}

/// `n` SKU codes (`<prefix>-<i>`) that fall in `n` different shards.
pub fn skus_in_distinct_shards(engine: &crate::Engine, prefix: &str, n: usize) -> Vec<String> {
    let ks = engine.keyspace();
    let mut skus: Vec<String> = Vec::with_capacity(n);
    for i in 0.. {
        if skus.len() == n {
            break;
        }
        let sku = format!("{prefix}-{i}");
        if skus.iter().all(|s| ks.shard_of(s) != ks.shard_of(&sku)) {
            skus.push(sku);
        }
    }
    skus
}

/// Two SKU codes that fall in the same shard, and one that falls in another.
pub fn skus_same_and_other_shard(engine: &crate::Engine) -> (String, String, String) {
    let ks = engine.keyspace();
    let first = "CART-0".to_owned();
    let shard = ks.shard_of(&first);
    let same = (1..)
        .map(|i| format!("CART-{i}"))
        .find(|s| ks.shard_of(s) == shard)
        .expect("same shard");
    let other = (1..)
        .map(|i| format!("CART-{i}"))
        .find(|s| ks.shard_of(s) != shard)
        .expect("other shard");
    (first, same, other)
}

/// A Redis Cluster of `masters` masters with `replicas` replicas each, on free
/// loopback ports, formed by `redis-cli --cluster create`; every node is
/// killed when dropped. Node `i` of [`TestCluster::node`] starts as a master
/// for `i < masters`.
pub struct TestCluster {
    nodes: Vec<TestRedis>,
    masters: usize,
}

impl TestCluster {
    /// Starts the nodes, forms the cluster and waits until every node says
    /// `cluster_state:ok` (about 2 s: Redis' own delay before a new cluster
    /// takes writes).
    pub fn start(masters: usize, replicas: usize) -> Self {
        Self::launch(masters, replicas, &[], None)
    }

    /// Like [`TestCluster::start`], every node speaking TLS only (clients,
    /// the cluster bus and replication), presenting `ca`'s certificate.
    pub fn start_tls(ca: &TestCa, masters: usize, replicas: usize) -> Self {
        let mut args = tls_args(ca);
        args.extend(["--tls-cluster", "yes", "--tls-replication", "yes"].map(str::to_owned));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Self::launch(masters, replicas, &args, Some(ca))
    }

    fn launch(masters: usize, replicas: usize, args: &[&str], ca: Option<&TestCa>) -> Self {
        assert!(
            masters >= 3,
            "redis-cli forms clusters of three masters or more"
        );
        let ca_file = ca.map(|ca| ca.dir.path().join("ca.crt"));
        let nodes: Vec<TestRedis> = (0..masters * (1 + replicas))
            .map(|_| TestRedis::launch(args, ca_file.clone(), ClusterRole::Member))
            .collect();
        let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
        form_cluster(&ports, replicas, ca_file.as_deref());
        for node in &nodes {
            node.await_cluster_ok();
        }
        // A replica takes over only once it has synced with its master (an
        // unsynced one has "data too old" and never does): wait for every link.
        for node in &nodes {
            node.await_replica_synced();
        }
        Self { nodes, masters }
    }

    /// The cluster's seed URLs, comma-separated (how `REDIS_URL` names a cluster).
    pub fn url(&self) -> String {
        self.nodes[..self.masters]
            .iter()
            .map(TestRedis::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Node `i` (to kill, pause or restart it).
    pub fn node(&mut self, i: usize) -> &mut TestRedis {
        &mut self.nodes[i]
    }

    /// How many nodes there are.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there are no nodes (never, once started).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The index of a running replica of node `master`.
    pub fn replica_of(&self, master: usize) -> usize {
        let port = format!("master_port:{}", self.nodes[master].port);
        self.nodes
            .iter()
            .position(|n| {
                n.is_running()
                    && redis::from_redis_value::<String>(n.command(&["INFO", "replication"]))
                        .is_ok_and(|info| info.lines().any(|l| l.trim() == port))
            })
            .expect("the master has a running replica")
    }

    /// Promotes replica node `replica` with a graceful `CLUSTER FAILOVER`
    /// (its master hands over, losing nothing) and waits until it is master.
    pub fn promote(&self, replica: usize) {
        let node = &self.nodes[replica];
        node.command(&["CLUSTER", "FAILOVER"]);
        node.await_text(&["INFO", "replication"], "role:master", |info| {
            info.contains("role:master")
        });
    }

    /// The index of the node that is master of `key`'s slot now, asked of a
    /// running node.
    pub fn master_of(&self, key: &str) -> usize {
        let asker = self
            .nodes
            .iter()
            .find(|n| n.is_running())
            .expect("a running node");
        let slot: i64 = redis::from_redis_value(asker.command(&["CLUSTER", "KEYSLOT", key]))
            .expect("CLUSTER KEYSLOT is a number");
        let slots = asker.command(&["CLUSTER", "SLOTS"]);
        let redis::Value::Array(ranges) = slots else {
            panic!("CLUSTER SLOTS: {slots:?}")
        };
        let slot = u16::try_from(slot).expect("a slot number");
        if let Some(range) = crate::redis_conn::slot_ranges(&ranges)
            .into_iter()
            .find(|r| (r.first..=r.last).contains(&slot))
        {
            return self
                .nodes
                .iter()
                .position(|n| n.port == range.master_port)
                .expect("the master is one of ours");
        }
        panic!("no master serves slot {slot}")
    }
}

/// Forms a cluster of the nodes on `ports` with `redis-cli --cluster create`,
/// `replicas` replicas per master; over TLS verified by `ca_file` when given.
fn form_cluster(ports: &[u16], replicas: usize, ca_file: Option<&Path>) {
    let mut create = Command::new("redis-cli");
    if let Some(ca_file) = ca_file {
        create.arg("--tls").arg("--cacert").arg(ca_file);
    }
    create.arg("--cluster").arg("create");
    for port in ports {
        create.arg(format!("127.0.0.1:{port}"));
    }
    let out = create
        .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
        .stdin(Stdio::null())
        .output()
        .expect("run redis-cli --cluster create (is redis-tools installed?)");
    assert!(
        out.status.success(),
        "redis-cli --cluster create failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Sends `SIG<name>` (`STOP`, `CONT`, …) to process `pid`, panicking when
/// `kill` fails.
pub fn signal(pid: u32, name: &str) {
    let sent = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(sent.success(), "kill -{name} {pid}");
}

/// A loopback TCP port that was free a moment ago.
///
/// The OS picks it; another process could take it before we bind it again, which
/// makes start-up fail loudly rather than run against the wrong server.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("find a free port")
}

/// A loopback port free a moment ago whose cluster bus port (port + 10000) was
/// free too and exists: the OS hands out ports up to 60999, and a node whose bus
/// port is above 65535 or taken (after a benchmark that left thousands of
/// sockets behind, say) exits at start.
pub fn free_cluster_port() -> u16 {
    loop {
        let port = free_port();
        let Some(bus) = port.checked_add(10_000) else {
            continue;
        };
        if TcpListener::bind(("127.0.0.1", bus)).is_ok() {
            return port;
        }
    }
}

/// A loopback port on which nothing listens (for "unreachable" tests), held
/// so for as long as this value lives.
///
/// A port merely free a moment ago is not enough: tests run in parallel, and
/// another test's `redis-server` was once given that same port, so the
/// "unreachable" service answered. This keeps a socket bound to the port
/// without listening, so no one else can take it and a connection to it is
/// refused.
pub struct ClosedPort {
    port: u16,
    _held: socket2::Socket,
}

impl ClosedPort {
    /// The port's number.
    pub fn port(&self) -> u16 {
        self.port
    }
}

/// Binds a loopback port and keeps it closed (see [`ClosedPort`]).
pub fn closed_port() -> ClosedPort {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("make a socket");
    let any = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    socket.bind(&any.into()).expect("bind a loopback port");
    let port = socket
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .map(|a| a.port())
        .expect("the bound port");
    ClosedPort {
        port,
        _held: socket,
    }
}

/// A throwaway certificate authority and a server certificate it signed for
/// `localhost` and `127.0.0.1` (ECDSA P-256, valid two days), made with the
/// `openssl` command in a temp dir: `ca.crt`, `server.crt`, `server.key`.
pub struct TestCa {
    dir: tempfile::TempDir,
}

impl TestCa {
    /// Creates the CA and the server certificate.
    ///
    /// # Panics
    /// When `openssl` is missing or fails.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir for certificates");
        let ca = Self { dir };
        let ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
        ca.openssl(
            &format!("req -x509 {ec} -keyout ca.key -out ca.crt -days 2"),
            &[
                "-subj",
                "/CN=Holdfast test CA",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        );
        ca.openssl(
            &format!("req {ec} -keyout server.key -out server.csr"),
            &["-subj", "/CN=localhost"],
        );
        // Client use too: cluster nodes present it to each other on the
        // cluster bus, which always asks for a certificate.
        std::fs::write(
            ca.dir.path().join("server.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
             keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n",
        )
        .expect("write the certificate extensions");
        ca.openssl(
            "x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
             -out server.crt -days 2 -extfile server.ext",
            &[],
        );
        ca
    }

    /// The path of one of the files (`ca.crt`, `server.crt`, `server.key`).
    pub fn file(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// Runs `openssl` with `words` (split on spaces) then `args` (kept whole).
    fn openssl(&self, words: &str, args: &[&str]) {
        let out = Command::new("openssl")
            .args(words.split_whitespace())
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .expect("run openssl (is it installed?)");
        assert!(
            out.status.success(),
            "openssl {words} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

/// A private PostgreSQL server (initdb in a temp dir, trust auth, loopback only)
/// that tests may stop and start again. Stopped when dropped.
pub struct TestPostgres {
    port: u16,
    dir: tempfile::TempDir,
    bin: PathBuf,
    running: bool,
    /// Extra `-c name=value` settings for every start.
    settings: Vec<String>,
}

impl TestPostgres {
    /// Initialises and starts a fresh cluster on a free port.
    ///
    /// # Panics
    /// When the PostgreSQL server binaries are missing or the cluster does not start.
    pub fn start() -> Self {
        let mut pg = Self::init();
        pg.start_again();
        pg
    }

    /// Like [`TestPostgres::start`], with TLS on (`ssl=on`), presenting `ca`'s
    /// server certificate; plain connections are still accepted, so a test can
    /// show what each `sslmode` does.
    pub fn start_tls(ca: &TestCa) -> Self {
        let mut pg = Self::init();
        for name in ["server.crt", "server.key"] {
            let to = pg.dir.path().join(name);
            std::fs::copy(ca.dir.path().join(name), &to).expect("copy the server certificate");
            pg.give_to_postgres(&to);
        }
        let key = pg.dir.path().join("server.key");
        let ok = Command::new("chmod").arg("600").arg(&key).status();
        assert!(ok.is_ok_and(|s| s.success()), "chmod the server key");
        pg.settings = vec![
            "ssl=on".into(),
            format!(
                "ssl_cert_file={}",
                pg.dir.path().join("server.crt").display()
            ),
            format!("ssl_key_file={}", key.display()),
        ];
        pg.start_again();
        pg
    }

    /// Runs initdb in a fresh temp dir (not started).
    fn init() -> Self {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL server binaries under /usr/lib/postgresql")
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|p| p.join("initdb").exists())
            .max_by_key(|p| {
                p.parent()
                    .and_then(|v| v.file_name())
                    .and_then(|v| v.to_str())
                    .and_then(|v| v.parse::<u32>().ok())
                    .unwrap_or(0)
            })
            .expect("an initdb under /usr/lib/postgresql/*/bin");
        let dir = tempfile::tempdir().expect("temp dir for PostgreSQL");
        let pg = Self {
            port: free_port(),
            dir,
            bin,
            running: false,
            settings: Vec::new(),
        };
        pg.give_to_postgres(pg.dir.path());
        let data = pg.dir.path().join("data");
        let status = pg
            .as_postgres(&pg.bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args(["--username=postgres", "--auth=trust", "--no-sync"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run initdb");
        assert!(status.success(), "initdb failed");
        pg
    }

    /// Makes `path` (recursively) the `postgres` user's when running as root,
    /// since the server runs as that user.
    fn give_to_postgres(&self, path: &Path) {
        if is_root() {
            let ok = Command::new("chown")
                .arg("-R")
                .arg("postgres:postgres")
                .arg(path)
                .status();
            assert!(
                ok.is_ok_and(|s| s.success()),
                "chown {} to postgres",
                path.display()
            );
        }
    }

    fn as_postgres(&self, program: &Path) -> Command {
        if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        }
    }

    /// A URL for database `db` on this server.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Stops the server at once (`-m immediate`: like a crash, no clean shutdown).
    pub fn stop(&mut self) {
        if self.running {
            let _ = self
                .as_postgres(&self.bin.join("pg_ctl"))
                .arg("-D")
                .arg(self.dir.path().join("data"))
                .args(["-m", "immediate", "-w", "stop"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            self.running = false;
        }
    }

    /// Starts the (stopped) server again on the same port with the same data.
    pub fn start_again(&mut self) {
        let mut opts = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {} -c fsync=off",
            self.port,
            self.dir.path().display()
        );
        for setting in &self.settings {
            opts.push_str(" -c ");
            opts.push_str(setting);
        }
        let status = self
            .as_postgres(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .arg("-l")
            .arg(self.dir.path().join("server.log"))
            .args(["-w", "-o", &opts, "start"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run pg_ctl start");
        assert!(
            status.success(),
            "PostgreSQL did not start; see {}",
            self.dir.path().join("server.log").display()
        );
        self.running = true;
    }
}

impl Drop for TestPostgres {
    fn drop(&mut self) {
        self.stop();
    }
}

fn is_root() -> bool {
    std::env::var("USER").is_ok_and(|u| u == "root")
        || Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0"))
}

/// A fresh, migrated database `name` on the PostgreSQL of `DATABASE_URL` (default
/// `postgres://postgres@127.0.0.1:5432/postgres`), dropped first if it exists; for
/// benchmarks. Returns the pool and the database's URL.
///
/// # Panics
/// When PostgreSQL cannot be reached.
pub async fn fresh_database(name: &str) -> (sqlx::PgPool, String) {
    use sqlx::Executor;
    let base = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let server = base.split('?').next().unwrap_or(&base);
    let server = server
        .rsplit_once('/')
        .map_or(server, |(b, _)| b)
        .to_owned();
    let admin = sqlx::PgPool::connect(&format!("{server}/postgres"))
        .await
        .expect("connect to PostgreSQL");
    admin
        .execute(format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)").as_str())
        .await
        .expect("drop the old database");
    let url = format!("{server}/{name}");
    let pool = crate::postgres::connect_and_migrate(&url, 8)
        .await
        .expect("create the database");
    (pool, url)
}

/// The `p` percentile (0 to 1), in milliseconds, of a sorted sample of
/// nanoseconds (0 for an empty sample).
pub fn percentile_ms(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1_000_000.0
}

/// Closed-loop reserve load for benchmarks: `clients` tasks, each reserving
/// one unit of `sku_of(n)` (the `n`-th call overall) again and again for
/// `seconds`, every call expected to reserve: (reserves/s, p50 ms, p99 ms).
pub async fn reserve_load(
    engine: &crate::Engine,
    clients: u64,
    seconds: u64,
    sku_of: impl Fn(u64) -> String + Clone + Send + 'static,
) -> (f64, f64, f64) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (engine, stop, next, sku_of) =
            (engine.clone(), stop.clone(), next.clone(), sku_of.clone());
        tasks.spawn(async move {
            let mut lat = Vec::with_capacity(200_000);
            while !stop.load(Ordering::Relaxed) {
                let n = next.fetch_add(1, Ordering::Relaxed);
                // The SKU in the id: runs on several SKUs of one Redis never meet.
                let sku = sku_of(n);
                let request = crate::ReserveRequest::single(format!("b-{sku}-{n}"), sku, 1);
                let t = Instant::now();
                let out = engine.reserve(&request).await.expect("reserve");
                lat.push(t.elapsed().as_nanos() as u64);
                assert!(
                    matches!(out, crate::ReserveOutcome::Reserved { .. }),
                    "{out:?}"
                );
            }
            lat
        });
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    while let Some(lat) = tasks.join_next().await {
        all.extend(lat.expect("client task"));
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort_unstable();
    (
        all.len() as f64 / elapsed,
        percentile_ms(&all, 0.5),
        percentile_ms(&all, 0.99),
    )
}

/// The number after `--name` on the command line, or `default` (for benchmarks).
///
/// # Panics
/// When the value is not a number.
pub fn flag(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} takes a number, not '{v}'"))
        })
}

/// Runs `redis-benchmark` with `clients` connections calling `EVALSHA` of
/// `reserve.lua` `requests` times on the Redis at `port` (one unit of `sku` per
/// call): the words [`crate::Engine::reserve`] sends for such a request
/// ([`crate::Engine::reserve_words`]), so the script does the same work as a
/// checkout call. redis-benchmark draws a fresh random number for each
/// `__rand_int__` on its own, so the hold's key and the id written into the
/// SKU's holds, the due set and the event differ within a call (the work is
/// the same; the records are a benchmark's, not a consistent hold). Returns (calls/s, p50 ms, p99 ms,
/// units held): the counter is read before and after, so a run whose calls
/// held nothing (a script refusing its arguments) shows it. The script must be
/// loaded (reserve once through the engine first). Needs `redis-benchmark` on
/// `PATH` (Debian package redis-tools).
///
/// # Panics
/// When `redis-benchmark` fails or the counter cannot be read.
pub fn redis_benchmark_reserve(
    port: u16,
    engine: &crate::Engine,
    sku: &str,
    clients: usize,
    requests: u64,
) -> (f64, f64, f64, u64) {
    // redis-benchmark puts a fresh 12-digit number in place of each
    // `__rand_int__` (in the hold's key and in the id argument, each drawn
    // on its own).
    let words = engine
        .reserve_words(&crate::model::ReserveRequest {
            ttl_ms: Some(600_000),
            ..crate::model::ReserveRequest::single("rb-__rand_int__", sku, 1)
        })
        .expect("the words of a reservation");
    let counter = engine.keyspace().sku(sku);
    let mut redis = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .and_then(|c| c.get_connection())
        .expect("a connection to the benchmark's Redis");
    let mut available = || -> i64 {
        redis::cmd("HGET")
            .arg(&counter)
            .arg("available")
            .query(&mut redis)
            .expect("the counter's available units")
    };
    let before = available();
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args([
            "-c",
            &clients.to_string(),
            "-n",
            &requests.to_string(),
            "-r",
            "1000000000",
            "--csv",
        ])
        .args(&words)
        .output()
        .expect("run redis-benchmark (package redis-tools)");
    assert!(
        out.status.success(),
        "redis-benchmark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let held = u64::try_from(before - available()).unwrap_or(0);
    let csv = String::from_utf8_lossy(&out.stdout);
    let row = csv
        .lines()
        .find(|l| l.starts_with("\"EVALSHA"))
        .expect("redis-benchmark CSV row");
    let cols: Vec<f64> = row
        .split(',')
        .skip(1)
        .map(|c| c.trim_matches('"').parse().unwrap_or(0.0))
        .collect();
    // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
    (cols[0], cols[3], cols[5], held)
}

/// A `postgres://` URL for the database `opts` points at (`sqlx::test` hands out
/// options, not URLs).
pub fn pg_url(opts: &sqlx::postgres::PgConnectOptions) -> String {
    format!(
        "postgres://{}@{}:{}/{}",
        opts.get_username(),
        opts.get_host(),
        opts.get_port(),
        opts.get_database().unwrap_or("postgres")
    )
}

/// Backends over the test database `pool` and the Redis at `redis_url`, with the
/// default engine configuration.
pub async fn backends(pool: sqlx::PgPool, redis_url: &str) -> crate::Backends {
    let redis = crate::redis_conn::connect(redis_url)
        .await
        .expect("connect to the test Redis");
    crate::Backends::new(pool, redis, crate::EngineConfig::default())
}

/// Adds `sku` with `on_hand` units to the catalogue in `pg` (title and product
/// are the code).
pub async fn add_sku(pg: &sqlx::PgPool, sku: &str, on_hand: i64) {
    sqlx::query("INSERT INTO skus (sku, title, product, on_hand) VALUES ($1, $1, $1, $2)")
        .bind(sku)
        .bind(on_hand)
        .execute(pg)
        .await
        .expect("insert a test SKU");
}

/// A private Redis and the backends over it and `pg`, with `sku` in the
/// catalogue (`on_hand` units, per-buyer `limit`, 0 for none) and warmed
/// from it.
///
/// # Panics
/// When PostgreSQL or Redis fails.
pub async fn warmed_sku(
    pg: &sqlx::PgPool,
    sku: &str,
    on_hand: i64,
    limit: i32,
) -> (TestRedis, crate::Backends) {
    let redis = TestRedis::start();
    add_sku(pg, sku, on_hand).await;
    if limit > 0 {
        sqlx::query("UPDATE skus SET per_buyer_limit = $2 WHERE sku = $1")
            .bind(sku)
            .bind(limit)
            .execute(pg)
            .await
            .expect("set a test limit");
    }
    let b = backends(pg.clone(), &redis.url()).await;
    crate::warmup::warm_all(&b.engine, pg, crate::warmup::WarmOptions::default(), |_| {})
        .await
        .expect("warm the test SKU");
    (redis, b)
}

/// The buyers among `buyers` whose request for one more unit of `sku` is not
/// refused for their per-buyer limit, with what they were answered (request
/// ids `<tag>-<i>`).
pub async fn past_their_limit(
    engine: &crate::Engine,
    sku: &str,
    buyers: &[String],
    tag: &str,
) -> Vec<String> {
    let mut past = Vec::new();
    for (i, buyer) in buyers.iter().enumerate() {
        let req = crate::ReserveRequest::single(format!("{tag}-{i}"), sku, 1).for_buyer(buyer);
        let r = engine.reserve(&req).await.expect("a reservation's answer");
        if !matches!(r, crate::ReserveOutcome::LimitExceeded { .. }) {
            past.push(format!("{buyer}: {r:?}"));
        }
    }
    past
}

/// A runtime of `workers` threads of its own, for callers that must act
/// truly at once with the test's own task (as concurrent HTTP requests do):
/// on the test's single thread they would take turns at every await. Shut
/// it down with `shutdown_background` (dropping it inside a runtime panics).
pub fn threads_of_their_own(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("a test runtime")
}

/// Writes everything in the streams behind to PostgreSQL with a write-behind
/// of its own over `redis_url`; panics if it cannot catch up.
pub async fn drain_write_behind(b: &crate::Backends, redis_url: &str) {
    use crate::record::{WriteBehind, WriteBehindConfig, WriteBehindStats};
    let conn = crate::redis_conn::connect(redis_url)
        .await
        .expect("connect to the test Redis");
    let mut w = WriteBehind::new(
        b.engine.clone(),
        b.pg.clone(),
        conn,
        WriteBehindConfig::default(),
        std::sync::Arc::new(WriteBehindStats::default()),
    );
    w.ensure_groups().await.expect("write-behind groups");
    for _ in 0..200 {
        w.run_once().await.expect("a write-behind batch");
        if b.engine.write_behind_lag().await.expect("lag").entries == 0 {
            return;
        }
    }
    panic!("write-behind did not drain");
}

/// Moves `field` of `sku`'s counters by `by` behind the engine's back (a drifted
/// or corrupted counter, for tests of reconciliation and verification).
pub async fn nudge_counter(engine: &crate::Engine, sku: &str, field: &str, by: i64) {
    redis::cmd("HINCRBY")
        .arg(engine.keyspace().sku(sku))
        .arg(field)
        .arg(by)
        .query_async::<()>(&mut engine.connection())
        .await
        .expect("nudge a test counter");
}

/// Queues a raw webhook payload from `source` on `lane` with no caps, as the
/// webhook route would after checking its signature; returns its entry id.
pub async fn queue_payload(
    conn: &mut crate::RedisConn,
    lane: holdfast_domain::Lane,
    source: &str,
    body: &[u8],
) -> String {
    let unlimited = crate::ingest::Caps {
        payloads: u64::MAX,
        bytes: u64::MAX,
    };
    match crate::ingest::enqueue(conn, lane, source, body, unlimited).await {
        Ok(crate::ingest::Intake::Accepted(id)) => id,
        other => panic!("queueing a payload failed: {other:?}"),
    }
}
