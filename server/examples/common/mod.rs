//! What the server benchmarks share: starting the release `holdfast` binary next
//! to the benchmark's own executable and waiting until it is ready.

// Each benchmark compiles this module on its own and uses only part of it.
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running `holdfast serve`, killed when dropped.
pub struct Server {
    child: Child,
    /// `127.0.0.1:<port>`.
    pub addr: String,
}

impl Server {
    /// The process id (for reading its memory).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `holdfast serve` on a free port against `redis_url` and `pg_url` with the
/// extra environment `env` (scheduled reconciliation off), and waits for `/readyz`.
pub async fn start(redis_url: &str, pg_url: &str, env: &[(&str, String)]) -> Server {
    let port = holdfast_engine::testkit::free_port();
    let exe = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("holdfast");
    let mut cmd = Command::new(&exe);
    cmd.arg("serve")
        .env("REDIS_URL", redis_url)
        .env("DATABASE_URL", pg_url)
        .env("HOLDFAST_LISTEN", format!("127.0.0.1:{port}"))
        .env("HOLDFAST_RECONCILE_EVERY_SECS", "0")
        .env("HOLDFAST_LOG", "warn")
        .stdout(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().unwrap_or_else(|e| {
        panic!(
            "start {} (build it with --release first): {e}",
            exe.display()
        )
    });
    let server = Server {
        child,
        addr: format!("127.0.0.1:{port}"),
    };
    for _ in 0..100 {
        if reqwest::get(format!("http://{}/readyz", server.addr))
            .await
            .is_ok_and(|r| r.status() == 200)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server
}
