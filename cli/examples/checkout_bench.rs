//! Benchmark: checkout reserve latency through the HTTP API at a fixed arrival
//! rate, alone and while a 100,000-line bulk feed is ingested through the `feeds`
//! lane at the same time.
//!
//! Starts a private `redis-server`, a fresh database `holdfast_bench_api` on the
//! PostgreSQL of `DATABASE_URL`, and the release `holdfast` binary; then drives it
//! open-loop (latency counts from each request's scheduled time, so a stall cannot
//! hide behind fewer requests). Requests are released by a thread of its own
//! that wakes every 250 µs and sends what is due; tokio's timer (`--tokio-timer
//! 1`, as before) wakes on whole milliseconds, which sent every request up to a
//! millisecond late, five at a time at 5,000/s, and counted that as the
//! server's latency. The table shows how late the generator sent, how busy
//! the machine was (steadier arrivals batch less on the way through, so the
//! same load costs more CPU than millisecond bursts), and how much of a core
//! Redis and the server each used.
//!
//! ```sh
//! cargo build --release -p holdfast-cli --bin holdfast --examples
//! target/release/examples/checkout_bench --rate 2000 --seconds 10
//! target/release/examples/checkout_bench --rate 2000 --seconds 10 --pause-feeds 1
//! ```

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use holdfast_engine::testkit::{TestRedis, flag};
use holdfast_engine::tokens::{self, Scope};
use holdfast_engine::warmup;
use sqlx::Executor;

mod common;

const SECRET: &str = "bench-feed-secret-0123";

/// The server's process id, once it runs (for its CPU time).
static SERVER_PID: AtomicU32 = AtomicU32::new(0);

/// What one load phase measured.
struct Phase {
    /// Latencies from each request's scheduled time (µs), sorted.
    lat: Vec<u64>,
    /// How late the generator sent each request (µs), sorted.
    late: Vec<u64>,
    /// Requests not answered 201.
    failed: u64,
    /// Each second's p99 (ms, by the second each request was due).
    p99s: Vec<f64>,
    /// The machine's CPU over the phase (everything on it: generator, server,
    /// Redis, PostgreSQL).
    cpu: Cpu,
    /// Redis' own time by command over the phase: (command, calls, µs), the
    /// costliest first.
    redis: Vec<(String, u64, u64)>,
}

/// Jiffies of all CPUs from `/proc/stat`: busy (user, nice, system, irq,
/// softirq) and stolen by the hypervisor, of a total; and of Redis and the
/// server alone (user and system, from `/proc/<pid>/stat`).
#[derive(Clone, Copy, Default)]
struct Cpu {
    busy: u64,
    steal: u64,
    total: u64,
    procs: [u64; 2],
}

/// User and system jiffies of process `pid` (0 when unreadable).
fn proc_jiffies(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) in parentheses,
    // counted from the state (some are not numbers, e.g. -1); utime and stime
    // are the 14th and 15th of the line.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)
}

impl Cpu {
    fn now(pids: [u32; 2]) -> Self {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let f: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .filter_map(|v| v.parse().ok())
            .collect();
        let at = |i: usize| f.get(i).copied().unwrap_or(0);
        Self {
            busy: at(0) + at(1) + at(2) + at(5) + at(6),
            steal: at(7),
            total: (0..8).map(at).sum(),
            procs: pids.map(proc_jiffies),
        }
    }

    fn since(self, start: Self) -> Self {
        Self {
            busy: self.busy.saturating_sub(start.busy),
            steal: self.steal.saturating_sub(start.steal),
            total: self.total.saturating_sub(start.total),
            procs: [0, 1].map(|i| self.procs[i].saturating_sub(start.procs[i])),
        }
    }

    /// Redis' and the server's CPU, in percent of one core.
    fn processes(self) -> [f64; 2] {
        // Each CPU's jiffies count in `total`: two cores tick twice as fast.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        self.procs
            .map(|p| 100.0 * p as f64 * cores / self.total.max(1) as f64)
    }

    /// Busy and stolen shares of the machine, in percent.
    fn shares(self) -> (f64, f64) {
        let t = self.total.max(1) as f64;
        (100.0 * self.busy as f64 / t, 100.0 * self.steal as f64 / t)
    }
}

/// Fires `rate` reservations per second for `seconds`.
async fn drive(
    base: &str,
    token: &str,
    (rate, seconds): (u64, u64),
    tag: &str,
    redis: &TestRedis,
) -> Phase {
    let pids = [redis.pid().unwrap_or(0), SERVER_PID.load(Ordering::Relaxed)];
    let stats = redis.command_stats().await;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(512)
        .build()
        .unwrap();
    let total = rate * seconds;
    let cpu = Cpu::now(pids);
    let (due_tx, mut due_rx) = tokio::sync::mpsc::unbounded_channel();
    let started = Instant::now();
    let when = move |i: u64| started + Duration::from_secs_f64(i as f64 / rate as f64);
    if flag("--tokio-timer", 0) == 1 {
        tokio::spawn(async move {
            for i in 0..total {
                tokio::time::sleep_until(when(i).into()).await;
                let _ = due_tx.send(vec![i]);
            }
        });
    } else {
        // Wakes at most every 250 µs and sends everything due at once.
        let tick = Duration::from_micros(250);
        std::thread::spawn(move || {
            let mut next = 0;
            while next < total {
                let now = Instant::now();
                let mut due = Vec::new();
                while next < total && when(next) <= now {
                    due.push(next);
                    next += 1;
                }
                if !due.is_empty() && due_tx.send(due).is_err() {
                    return;
                }
                if next < total {
                    std::thread::sleep(when(next).saturating_duration_since(now).max(tick));
                }
            }
        });
    }
    // Parsed and built once: per request they were the generator's CPU, taken
    // from the server it measures on a small machine.
    let url = reqwest::Url::parse(&format!("{base}/api/v1/reservations")).unwrap();
    let auth = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}")).unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    while let Some(batch) = due_rx.recv().await {
        for i in batch {
            let due = when(i);
            let (http, url, auth, key) = (
                http.clone(),
                url.clone(),
                auth.clone(),
                format!("{tag}-{i}"),
            );
            tasks.spawn(async move {
                // How late the generator itself sends: part of the latency measured
                // from `due`, but none of it the server's.
                let late = due.elapsed().as_micros() as u64;
                let res = http
                    .post(url)
                    .header(reqwest::header::AUTHORIZATION, auth)
                    .header("Idempotency-Key", key)
                    .header("content-type", "application/json")
                    .body(r#"{"sku":"HOT-1","qty":1,"ttl_ms":600000}"#)
                    .send()
                    .await;
                let ok = matches!(&res, Ok(r) if r.status() == 201);
                (i / rate, due.elapsed().as_micros() as u64, late, ok)
            });
        }
    }
    let (mut lat, mut failed) = (Vec::with_capacity(total as usize), 0);
    let mut lateness = Vec::with_capacity(total as usize);
    let mut by_second = vec![Vec::new(); seconds as usize];
    while let Some(r) = tasks.join_next().await {
        let (second, us, late, ok) = r.unwrap();
        lat.push(us);
        lateness.push(late);
        by_second[second as usize].push(us);
        failed += u64::from(!ok);
    }
    let cpu = Cpu::now(pids).since(cpu);
    let mut by_command: Vec<(String, u64, u64)> = redis
        .command_stats()
        .await
        .into_iter()
        .map(|(name, (calls, us))| {
            let (c0, u0) = stats.get(&name).copied().unwrap_or_default();
            (name, calls.saturating_sub(c0), us.saturating_sub(u0))
        })
        .filter(|(_, calls, _)| *calls > 0)
        .collect();
    by_command.sort_by_key(|(_, _, us)| std::cmp::Reverse(*us));
    lat.sort_unstable();
    lateness.sort_unstable();
    let p99s = by_second
        .into_iter()
        .map(|mut s| {
            s.sort_unstable();
            pct(&s, 0.99)
        })
        .collect();
    Phase {
        lat,
        late: lateness,
        failed,
        p99s,
        cpu,
        redis: by_command,
    }
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0
}

#[tokio::main]
async fn main() {
    let rate = flag("--rate", 2_000);
    let seconds = flag("--seconds", 10);
    let feed_lines = flag("--feed-lines", 100_000);
    // 1: pause the feeds lane during the busy phase (payloads are still received,
    // signed and queued, but not applied), as an operator would during a drop.
    let pause_feeds = flag("--pause-feeds", 0) == 1;
    let redis = TestRedis::start();
    common::pin_service(redis.pid());
    let (pg, pg_url) = holdfast_engine::testkit::fresh_database("holdfast_bench_api").await;
    pg.execute("INSERT INTO skus (sku, title, product, on_hand) VALUES ('HOT-1', 'Hot', 'Hot', 1000000000)")
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO skus (sku, title, product, on_hand)
         SELECT 'CAT-' || lpad(i::text, 6, '0'), 'Catalogue ' || i, 'Catalogue', 100 FROM generate_series(0, $1 - 1) i",
    )
    .bind(feed_lines as i64)
    .execute(&pg)
    .await
    .unwrap();
    let engine = holdfast_engine::Engine::new(
        redis.connection().await,
        holdfast_engine::EngineConfig::default(),
    );
    warmup::warm_all(&engine, &pg, warmup::WarmOptions::default(), |_| {})
        .await
        .unwrap();
    let token = tokens::create(&pg, "bench", &[Scope::Checkout])
        .await
        .unwrap()
        .secret;

    let server = common::start(
        &redis.url(),
        &pg_url,
        &[
            ("HOLDFAST_INGEST_SOURCES", format!("erp=feeds:{SECRET}")),
            ("HOLDFAST_API_RATE", "0".into()),
            ("HOLDFAST_INGEST_RATE", "0".into()),
        ],
    )
    .await;
    let base = format!("http://{}", server.addr);
    // Warm the connection pool and the server, then let the write-behind finish the
    // warm-up's events so they do not land in the measurement.
    SERVER_PID.store(server.pid(), Ordering::Relaxed);
    drive(&base, &token, (500, 1), "warmup", &redis).await;
    for _ in 0..600 {
        let ready: serde_json::Value = reqwest::get(format!("{base}/readyz"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if ready["write_behind"]["lag"]["entries"] == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let alone = drive(&base, &token, (rate, seconds), "alone", &redis).await;

    if pause_feeds {
        holdfast_engine::ingest::pause(&mut redis.connection().await, holdfast_domain::Lane::Feeds)
            .await
            .unwrap();
    }
    // The same load while a bulk feed arrives: 10,000-line pages, signed, posted
    // as fast as accepted. The pages are made and signed before the load starts,
    // so the generator's own JSON and HMAC work (on the same cores) does not
    // delay the checkout requests it times.
    let ts = chrono::Utc::now().timestamp();
    let pages: Vec<(String, String)> = (0..feed_lines.div_ceil(10_000))
        .map(|page| {
            let events: Vec<serde_json::Value> = (page * 10_000..((page + 1) * 10_000).min(feed_lines))
                .map(|i| serde_json::json!({"event_id": format!("cat-{i}"), "type": "delta", "sku": format!("CAT-{i:06}"), "delta": 5}))
                .collect();
            let body = serde_json::json!({ "events": events }).to_string();
            let sig = holdfast_server::routes::ingest::sign(SECRET, ts, body.as_bytes());
            (body, sig)
        })
        .collect();
    let feed = {
        let base = base.clone();
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut accepted = 0u64;
            for (body, sig) in pages {
                let r = http
                    .post(format!("{base}/ingest/erp"))
                    .header("X-Holdfast-Timestamp", ts.to_string())
                    .header("X-Holdfast-Signature", sig)
                    .body(body)
                    .send()
                    .await
                    .unwrap();
                accepted += u64::from(r.status() == 202);
            }
            accepted
        })
    };
    if pause_feeds {
        holdfast_engine::ingest::pause(&mut redis.connection().await, holdfast_domain::Lane::Feeds)
            .await
            .unwrap();
    }
    let feed_started = Instant::now();
    let busy = drive(&base, &token, (rate, seconds), "busy", &redis).await;
    let pages = feed.await.unwrap();
    let applied: i64 = {
        let mut n = 0;
        for i in (0..feed_lines).step_by((feed_lines / 100).max(1) as usize) {
            let a = engine
                .figures(&format!("CAT-{i:06}"))
                .await
                .unwrap()
                .map(|f| f.available);
            n += i64::from(a == Some(105));
        }
        n
    };

    println!(
        "| checkout load ({rate} reserves/s for {seconds} s) | p50 ms | p99 ms | max ms | failed | sent late p50 / p99 ms | machine CPU busy / stolen % | Redis / server CPU % of a core |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let row = |name: &str, p: &Phase| {
        let (busy, stolen) = p.cpu.shares();
        let [redis_cpu, server_cpu] = p.cpu.processes();
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | {} | {:.2} / {:.2} | {busy:.0} / {stolen:.1} | {redis_cpu:.0} / {server_cpu:.0} |",
            pct(&p.lat, 0.5),
            pct(&p.lat, 0.99),
            pct(&p.lat, 1.0),
            p.failed,
            pct(&p.late, 0.5),
            pct(&p.late, 0.99)
        );
    };
    row("alone", &alone);
    let during = if pause_feeds {
        "received (lane paused)"
    } else {
        "ingested"
    };
    row(
        &format!("with a {feed_lines}-line bulk feed {during} meanwhile"),
        &busy,
    );
    let seconds_of = |p99s: &[f64]| {
        p99s.iter()
            .map(|p| format!("{p:.1}"))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    println!(
        "\np99 ms by second: alone {}; with the feed {}",
        seconds_of(&alone.p99s),
        seconds_of(&busy.p99s)
    );
    let top = |p: &Phase| {
        p.redis
            .iter()
            .take(6)
            .map(|(name, calls, us)| {
                format!(
                    "{name} {calls} calls, {:.0} ms ({:.1} µs each)",
                    *us as f64 / 1000.0,
                    *us as f64 / (*calls).max(1) as f64
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    println!(
        "\nRedis' time by command, alone: {}\nwith the feed: {}",
        top(&alone),
        top(&busy)
    );
    println!(
        "\nfeed: {pages} pages of 10,000 lines accepted (202); after {:.1} s, {applied}% of sampled SKUs had their delta applied (the feeds lane applies at most HOLDFAST_FEEDS_RATE = 5,000 events/s by default, and HOLDFAST_FEEDS_BUSY_RATE = 500 while checkout is busy)",
        feed_started.elapsed().as_secs_f64()
    );
}
