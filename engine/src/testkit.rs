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
pub struct TestRedis {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    extra_args: Vec<String>,
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
        let port = free_port();
        let dir = tempfile::tempdir().expect("create a temp dir for redis-server");
        let mut redis = Self {
            port,
            dir,
            child: None,
            extra_args: args.iter().map(|s| (*s).to_owned()).collect(),
        };
        redis.spawn();
        redis
    }

    /// The `redis://` URL of this server.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The TCP port this server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's working directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kills the server (SIGKILL: no chance to save anything) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty (nothing is persisted).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Whether the process is currently running.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    fn spawn(&mut self) {
        let log: PathBuf = self.dir.path().join("redis.log");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
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
                return;
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
    /// A connection to this server (self-reconnecting).
    pub async fn connection(&self) -> redis::aio::ConnectionManager {
        crate::kv::connect(&self.url())
            .await
            .expect("connect to the test redis-server")
    }

    /// An engine over this server with `config`.
    pub async fn engine_with(&self, config: crate::EngineConfig) -> crate::Engine {
        crate::Engine::new(self.connection().await, config)
    }

    /// An engine over this server with the default configuration.
    pub async fn engine(&self) -> crate::Engine {
        self.engine_with(crate::EngineConfig::default()).await
    }
}

/// Warms `sku` with `available` units (no limit, nothing pending), panicking on failure.
pub async fn stock(engine: &crate::Engine, sku: &str, available: i64) {
    stock_with_limit(engine, sku, available, 0).await;
}

/// Warms `sku` with `available` units and a per-buyer limit.
pub async fn stock_with_limit(engine: &crate::Engine, sku: &str, available: i64, limit: i64) {
    let spec = crate::stock::WarmSpec {
        sku: sku.to_owned(),
        available,
        sold_pending: 0,
        per_buyer_limit: limit,
    };
    engine.warm(&spec, true).await.expect("warm a test counter");
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

impl Drop for TestRedis {
    fn drop(&mut self) {
        self.kill();
    }
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

/// A loopback port on which nothing listens (for "unreachable" tests).
pub fn closed_port() -> u16 {
    free_port()
}
