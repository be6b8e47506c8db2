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
        panic!("redis-server on port {} did not start; see {}", self.port, log.display());
    }
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
