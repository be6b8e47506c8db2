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

/// The release `holdfast` binary beside the benchmark's own executable.
pub fn holdfast_exe() -> std::path::PathBuf {
    std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("holdfast")
}

/// Pins process `pid` (every thread) to the CPUs named in
/// `HOLDFAST_BENCH_SERVICE_CPUS` (a `taskset` list such as `0`), when it is set.
/// `scripts/bench.sh` sets it when it runs a benchmark with the load generator
/// on the other cores (`taskset -c`): the server and Redis it starts then stay
/// off the generator's cores (PostgreSQL is pinned by the script).
pub fn pin_service(pid: Option<u32>) {
    let (Ok(cpus), Some(pid)) = (std::env::var("HOLDFAST_BENCH_SERVICE_CPUS"), pid) else {
        return;
    };
    let pinned = Command::new("taskset")
        .args(["-a", "-p", "-c", &cpus, &pid.to_string()])
        .stdout(Stdio::null())
        .status();
    assert!(
        pinned.is_ok_and(|s| s.success()),
        "taskset could not pin process {pid} to CPUs {cpus}"
    );
}

/// Starts `holdfast serve` on a free port against `redis_url` and `pg_url` with the
/// extra environment `env` (scheduled reconciliation off), and waits for `/readyz`.
///
/// The load comes from one address standing in for thousands of shoppers (as
/// it would through a trusted load balancer), so the cap on connections per
/// client address is lifted.
pub async fn start(redis_url: &str, pg_url: &str, env: &[(&str, String)]) -> Server {
    let port = holdfast_engine::testkit::free_port();
    let exe = holdfast_exe();
    let mut cmd = Command::new(&exe);
    cmd.arg("serve")
        .env("REDIS_URL", redis_url)
        .env("DATABASE_URL", pg_url)
        .env("HOLDFAST_LISTEN", format!("127.0.0.1:{port}"))
        .env("HOLDFAST_RECONCILE_EVERY_SECS", "0")
        .env("HOLDFAST_MAX_CONNECTIONS_PER_ADDRESS", "100000")
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
    pin_service(Some(child.id()));
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

/// What a closed-loop run measured.
pub struct Closed {
    /// Requests completed per second.
    pub rps: f64,
    /// Median latency, ms.
    pub p50: f64,
    /// 99th percentile, ms.
    pub p99: f64,
    /// How many answers had each status.
    pub statuses: std::collections::BTreeMap<u16, u64>,
}

/// `clients` loops each posting a reservation of one unit of `sku` (a fresh
/// idempotency key per request) back to back for `seconds`.
pub async fn closed_loop(
    base: &str,
    token: &str,
    sku: &str,
    clients: usize,
    seconds: u64,
    tag: &str,
) -> Closed {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(clients * 2)
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(0));
    let body = format!(r#"{{"sku":"{sku}","qty":1,"ttl_ms":600000}}"#);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (http, stop, next, url, token, body, tag) = (
            http.clone(),
            stop.clone(),
            next.clone(),
            format!("{base}/api/v1/reservations"),
            token.to_owned(),
            body.clone(),
            tag.to_owned(),
        );
        tasks.spawn(async move {
            let mut lat = Vec::new();
            let mut statuses = std::collections::BTreeMap::new();
            while !stop.load(Ordering::Relaxed) {
                let key = format!("{tag}-{}", next.fetch_add(1, Ordering::Relaxed));
                let t = std::time::Instant::now();
                let status = http
                    .post(&url)
                    .bearer_auth(&token)
                    .header("Idempotency-Key", key)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await
                    .map_or(0, |r| r.status().as_u16());
                lat.push(t.elapsed().as_micros() as u64);
                *statuses.entry(status).or_insert(0u64) += 1;
            }
            (lat, statuses)
        });
    }
    let started = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut all, mut statuses) = (Vec::new(), std::collections::BTreeMap::new());
    while let Some(r) = tasks.join_next().await {
        let (lat, st) = r.unwrap();
        all.extend(lat);
        for (k, v) in st {
            *statuses.entry(k).or_insert(0) += v;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort_unstable();
    let pct = |p: f64| {
        all.get(((all.len().max(1) - 1) as f64 * p).round() as usize)
            .map_or(0.0, |v| *v as f64 / 1000.0)
    };
    Closed {
        rps: all.len() as f64 / elapsed,
        p50: pct(0.5),
        p99: pct(0.99),
        statuses,
    }
}

/// A private Redis, a fresh database `db` with SKU `sku` stocked with `units`
/// and warmed, a checkout token, and the release server over them (rate limits
/// off, plus `env`).
pub async fn stack(
    db: &str,
    sku: &str,
    units: i64,
    env: &[(&str, String)],
) -> (
    holdfast_engine::testkit::TestRedis,
    Server,
    holdfast_engine::Engine,
    String,
) {
    let redis = holdfast_engine::testkit::TestRedis::start();
    pin_service(redis.pid());
    let (pg, pg_url) = holdfast_engine::testkit::fresh_database(db).await;
    sqlx::query("INSERT INTO skus (sku, title, product, on_hand) VALUES ($1, 'Hot', 'Hot', $2)")
        .bind(sku)
        .bind(units)
        .execute(&pg)
        .await
        .unwrap();
    let engine = holdfast_engine::Engine::new(
        redis.connection().await,
        holdfast_engine::EngineConfig::default(),
    );
    holdfast_engine::warmup::warm_all(
        &engine,
        &pg,
        holdfast_engine::warmup::WarmOptions::default(),
        |_| {},
    )
    .await
    .unwrap();
    let token =
        holdfast_engine::tokens::create(&pg, "bench", &[holdfast_engine::tokens::Scope::Checkout])
            .await
            .unwrap()
            .secret;
    let mut all = vec![("HOLDFAST_API_RATE", "0".to_owned())];
    all.extend(env.iter().map(|(k, v)| (*k, v.clone())));
    let server = start(&redis.url(), &pg_url, &all).await;
    (redis, server, engine, token)
}

/// What a `wrk` run measured.
pub struct Wrk {
    /// Requests completed per second.
    pub rps: f64,
    /// Median latency, ms.
    pub p50: f64,
    /// 99th percentile, ms.
    pub p99: f64,
    /// Answers other than 2xx or 3xx, and socket errors.
    pub failed: u64,
}

/// `wrk` (one thread, `clients` connections, `seconds`) posting a reservation of
/// one unit of `sku` per request, each with its own `Idempotency-Key` (`run`
/// makes the keys of one run differ from another's): the lean C client beside
/// `redis-benchmark`, so neither side pays for a heavier client.
pub fn wrk_reserve(
    base: &str,
    token: &str,
    sku: &str,
    clients: usize,
    seconds: u64,
    run: &str,
) -> Wrk {
    let script =
        std::env::temp_dir().join(format!("holdfast-wrk-{}-{run}.lua", std::process::id()));
    std::fs::write(
        &script,
        format!(
            r#"wrk.method = "POST"
wrk.body = '{{"sku":"{sku}","qty":1,"ttl_ms":600000}}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {token}"
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end
local n = 0
function request()
  n = n + 1
  wrk.headers["Idempotency-Key"] = "{run}-" .. tid .. "-" .. n
  return wrk.format()
end
"#
        ),
    )
    .expect("write the wrk script");
    let out = Command::new("wrk")
        .args([
            "-t1",
            "-c",
            &clients.to_string(),
            "-d",
            &format!("{seconds}s"),
        ])
        .args(["--latency", "-s"])
        .arg(&script)
        .arg(format!("{base}/api/v1/reservations"))
        .output()
        .expect("run wrk (Debian package wrk)");
    let _ = std::fs::remove_file(&script);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "wrk failed: {text}");
    parse_wrk(&text)
}

/// Reads `wrk --latency`'s report.
fn parse_wrk(text: &str) -> Wrk {
    let ms = |v: &str| {
        let (n, unit) = v.split_at(v.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(v.len()));
        let n: f64 = n.parse().unwrap_or(f64::NAN);
        match unit {
            "us" => n / 1000.0,
            "s" => n * 1000.0,
            "m" => n * 60_000.0,
            _ => n,
        }
    };
    let field = |prefix: &str| {
        text.lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(prefix).map(|r| r.trim().to_owned()))
    };
    let errors: u64 = field("Socket errors:").map_or(0, |s| {
        s.split(',')
            .filter_map(|p| p.split_whitespace().last()?.parse::<u64>().ok())
            .sum()
    });
    Wrk {
        rps: field("Requests/sec:")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0),
        p50: field("50%").map_or(f64::NAN, |v| ms(&v)),
        p99: field("99%").map_or(f64::NAN, |v| ms(&v)),
        failed: field("Non-2xx or 3xx responses:")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
            + errors,
    }
}

/// Samples process `pid`'s stacks with `perf` (CPU clock, 999 Hz) for
/// `seconds`, in the background; [`Profile::top`] then reads the hottest
/// functions. `None` when `perf` is not installed (package linux-perf).
pub struct Profile {
    child: Child,
    data: std::path::PathBuf,
}

impl Profile {
    /// Starts sampling.
    pub fn start(pid: u32, seconds: u64) -> Option<Self> {
        let data = std::env::temp_dir().join(format!("holdfast-perf-{pid}.data"));
        let child = Command::new("perf")
            .args(["record", "-e", "cpu-clock", "-F", "999", "-g", "-p"])
            .arg(pid.to_string())
            .arg("-o")
            .arg(&data)
            .args(["--", "sleep", &seconds.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        Some(Self { child, data })
    }

    /// The `n` functions with the most samples of their own (self time), as
    /// `perf report` prints them.
    pub fn top(mut self, n: usize) -> Vec<String> {
        let _ = self.child.wait();
        let out = Command::new("perf")
            .args(["report", "--stdio", "--no-children", "--sort", "dso,symbol"])
            .args(["-g", "none", "--percent-limit", "0.5", "-i"])
            .arg(&self.data)
            .output();
        let _ = std::fs::remove_file(&self.data);
        out.map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
                .take(n)
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect()
        })
        .unwrap_or_default()
    }
}
