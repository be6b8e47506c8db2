//! Helpers shared by the CLI's integration tests.

#![allow(dead_code)]

use holdfast_engine::Backends;
#[allow(unused_imports)]
pub use holdfast_engine::testkit::{backends, pg_url};
use holdfast_server::startup::spawn_in_background;
use holdfast_server::state::{AppState, leptos_options};
use tokio::net::TcpListener;

/// Serves the full router over `backends` on port 0, the live side reading the
/// Redis at `redis_url`; returns `http://127.0.0.1:<port>`.
pub async fn spawn_live(backends: Backends, redis_url: &str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
    let addr = listener.local_addr().expect("local addr");
    let state = AppState::new(leptos_options("target/site", addr), backends);
    spawn_in_background(listener, state, Some(redis_url)).await;
    format!("http://{addr}")
}

/// Starts `holdfast serve` on a free port with `env`; the child, its URL, what
/// it printed up to then, and its output (kept open: the server prints on).
/// The caller kills and reaps the child; the lint cannot see that across the
/// return.
pub fn serve(
    redis: &holdfast_engine::testkit::TestRedis,
    pg_url: &str,
    env: &[(&str, &str)],
) -> Served {
    serve_at(&redis.url(), pg_url, env)
}

/// What [`serve`] returns: the child, its URL, what it printed, its output.
pub type Served = (
    std::process::Child,
    String,
    String,
    std::io::BufReader<std::process::ChildStdout>,
);

/// [`serve`] on the Redis (or cluster) that `redis_url` names.
#[allow(clippy::zombie_processes)]
pub fn serve_at(redis_url: &str, pg_url: &str, env: &[(&str, &str)]) -> Served {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .arg("serve")
        .env("REDIS_URL", redis_url)
        .env("DATABASE_URL", pg_url)
        .env("HOLDFAST_LISTEN", "127.0.0.1:0")
        .env("HOLDFAST_LOG", "warn")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start holdfast serve");
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut printed = String::new();
    loop {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap_or(0) == 0 {
            let _ = child.kill();
            let _ = child.wait();
            panic!("holdfast serve exited early: {printed}");
        }
        printed.push_str(&line);
        if let Some(url) = line.trim().strip_prefix("Holdfast is serving at ") {
            return (child, url.to_owned(), printed, out);
        }
    }
}

/// Runs the `holdfast` binary with `args` against `redis` and `pg`: (success,
/// stdout, stderr).
pub fn holdfast(args: &[&str], redis: &str, pg: &str) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .args(args)
        .env("REDIS_URL", redis)
        .env("DATABASE_URL", pg)
        .env("HOLDFAST_LOG", "warn")
        .output()
        .expect("run holdfast");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A child process killed and reaped when dropped, so a failing test leaves no
/// server behind (one would hold the test's output open).
pub struct KillOnDrop(pub std::process::Child);

impl KillOnDrop {
    /// Kills and reaps the process now.
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Loads the demo drop into the (migrated or empty) database at `db`, warms
/// its counters in the Redis at `redis` with `holdfast warm`, and creates an
/// API token with the checkout and read scopes: the pool and the token.
pub async fn demo_with_token(redis: &str, db: &str) -> (sqlx::PgPool, String) {
    let pg = holdfast_engine::postgres::connect_and_migrate(db, 2)
        .await
        .expect("PostgreSQL");
    holdfast_engine::catalog::load_demo_drop(&pg)
        .await
        .expect("the demo drop");
    let (ok, _, err) = holdfast(&["warm"], redis, db);
    assert!(ok, "warm: {err}");
    let (ok, out, err) = holdfast(
        &[
            "token",
            "create",
            "--name",
            "test",
            "--scopes",
            "checkout,read",
        ],
        redis,
        db,
    );
    assert!(ok, "token create: {err}");
    let token = out.lines().nth(1).expect("the secret").to_owned();
    (pg, token)
}

/// Waits until PostgreSQL has recorded `sold` units of `sku` (at most `limit`),
/// then a little longer, and returns the units recorded: a test compares them
/// with what it sold, so a sale recorded twice shows.
pub async fn recorded_units(
    pg: &sqlx::PgPool,
    sku: &str,
    sold: i64,
    limit: std::time::Duration,
) -> i64 {
    let started = std::time::Instant::now();
    let read = || async {
        holdfast_engine::catalog::recorded(pg, sku)
            .await
            .expect("read sold_recorded")
            .map_or(0, |(_, sold)| sold)
    };
    while read().await < sold && started.elapsed() < limit {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    read().await
}

/// Pays hold `id` on the server at `base` with `token`: the answer's status.
pub async fn confirm(http: &reqwest::Client, base: &str, token: &str, id: &str) -> u16 {
    http.post(format!("{base}/api/v1/reservations/{id}/confirm"))
        .bearer_auth(token)
        .send()
        .await
        .expect("an answer to the payment")
        .status()
        .as_u16()
}

/// The command line of a short rehearsal (600 shoppers, 80 units, holds of
/// 1 s, a fifth of reservations retried) spread over the servers at `bases`,
/// with Redis at `redis` and PostgreSQL at `db`: it fails unless every truth
/// check passes.
pub fn rehearsal_over(redis: &str, db: &str, bases: &[String]) -> Vec<String> {
    let mut args: Vec<String> = [
        "holdfast",
        "--redis-url",
        redis,
        "--database-url",
        db,
        "simulate",
    ]
    .map(str::to_owned)
    .to_vec();
    for base in bases {
        args.extend(["--url".to_owned(), base.clone()]);
    }
    args.extend(
        [
            "--shoppers",
            "600",
            "--units",
            "80",
            "--peak-rps",
            "300",
            "--peak-secs",
            "1",
            "--decay-secs",
            "1",
            "--hold-ttl-secs",
            "1",
            "--think-ms",
            "200",
            "--retry",
            "0.2",
            "--settle-secs",
            "30",
        ]
        .map(str::to_owned),
    );
    args
}

/// The value of series `name` (exactly, labels included) in a `/metrics`
/// text, 0 when absent.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The server at `base`'s `/metrics` text.
pub async fn metrics(http: &reqwest::Client, base: &str) -> String {
    http.get(format!("{base}/metrics"))
        .send()
        .await
        .expect("/metrics answers")
        .text()
        .await
        .expect("/metrics is text")
}
