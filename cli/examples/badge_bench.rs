//! Benchmark: live badge connections (10,000 by default; the budget is 50,000)
//! on one server process: its memory per connection, and how long after a
//! sell-out 99% of them show it.
//!
//! Starts a private `redis-server`, a fresh database and the release `holdfast`
//! binary; opens the connections from this process (a tokio-tungstenite client
//! with small buffers), each following one SKU; reads the server's resident
//! memory before and after; then sells the SKU out and times every connection's
//! "sold_out" message. Connections come from 20,000 per loopback source
//! address (127.0.0.1, 127.0.0.2, …), since one address pair has about 28,000
//! ephemeral ports; both processes need an open-files limit above the count.
//!
//! ```sh
//! cargo build --release -p holdfast-cli --bin holdfast --examples
//! target/release/examples/badge_bench --connections 10000
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use holdfast_engine::testkit::{TestRedis, flag, stock};
use holdfast_engine::{Engine, EngineConfig};
use tokio::sync::{Semaphore, watch};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

/// Resident memory of process `pid`, in KiB.
mod common;

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .map(str::to_owned)
        })
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

#[tokio::main]
async fn main() {
    let n = flag("--connections", 10_000) as usize;
    let redis = TestRedis::start();
    let (pg, pg_url) = holdfast_engine::testkit::fresh_database("holdfast_bench_badge").await;
    sqlx::query("INSERT INTO skus (sku, title, product, on_hand, low_stock_threshold) VALUES ('BADGE-1', 'B', 'B', 100, 5)")
        .execute(&pg)
        .await
        .unwrap();
    let engine = Engine::new(redis.connection().await, EngineConfig::default());
    stock(&engine, "BADGE-1", 100).await;

    let server = common::start(
        &redis.url(),
        &pg_url,
        &[
            (
                "HOLDFAST_BADGE_MAX_CONNECTIONS_PER_CLIENT",
                (n + 10).to_string(),
            ),
            ("HOLDFAST_MAX_CONNECTIONS", (n + 1_000).to_string()),
            // Every connection a badge socket, every subscribe from the
            // benchmark's few loopback addresses.
            ("HOLDFAST_MAX_SOCKETS", (n + 10).to_string()),
            ("HOLDFAST_BADGE_POLLS_PER_SECOND", "100000".to_owned()),
        ],
    )
    .await;
    let pid = server.pid();
    let base = server.addr.clone();
    // One connection first, so the SKU's channel and the process's fixed costs exist before measuring.
    let config = WebSocketConfig::default()
        .read_buffer_size(4096)
        .write_buffer_size(0);
    let url = format!("ws://{base}/public/ws");
    let subscribe = Message::Text(r#"{"subscribe":["BADGE-1"]}"#.into());
    let (mut probe, _) = tokio_tungstenite::connect_async_with_config(&url, Some(config), true)
        .await
        .unwrap();
    probe.send(subscribe.clone()).await.unwrap();
    probe.next().await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss_kib(pid);

    let (go_tx, go_rx) = watch::channel::<Option<Instant>>(None);
    let connecting = Arc::new(Semaphore::new(200));
    let mut tasks = tokio::task::JoinSet::new();
    // Each connection says whether it opened (a refused one must not leave
    // the count waiting).
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<bool>(n);
    let started = Instant::now();
    let server_addr: std::net::SocketAddr = base.parse().unwrap();
    for i in 0..n {
        let source = std::net::Ipv4Addr::new(127, 0, 0, 1 + (i / 20_000) as u8);
        let (url, subscribe, mut go_rx, ready_tx, connecting) = (
            url.clone(),
            subscribe.clone(),
            go_rx.clone(),
            ready_tx.clone(),
            connecting.clone(),
        );
        tasks.spawn(async move {
            let permit = connecting.acquire_owned().await.unwrap();
            let opened = async {
                let socket = tokio::net::TcpSocket::new_v4().ok()?;
                // A port of an earlier run's connection still in TIME_WAIT
                // may be bound again (they went to another server port):
                // without it a second run within a minute ran out of ports.
                socket.set_reuseaddr(true).ok()?;
                socket.bind((source, 0).into()).ok()?;
                let stream = socket.connect(server_addr).await.ok()?;
                stream.set_nodelay(true).ok()?;
                let (mut ws, _) =
                    tokio_tungstenite::client_async_with_config(&url, stream, Some(config))
                        .await
                        .ok()?;
                ws.send(subscribe).await.ok()?;
                let first = ws.next().await?.ok()?;
                first
                    .to_text()
                    .unwrap_or_default()
                    .contains("in_stock")
                    .then_some(ws)
            };
            let opened = tokio::time::timeout(Duration::from_secs(30), opened)
                .await
                .ok()
                .flatten();
            drop(permit);
            let _ = ready_tx.send(opened.is_some()).await;
            let mut ws = opened?;
            go_rx.wait_for(Option::is_some).await.ok()?;
            let t0 = (*go_rx.borrow()).unwrap_or_else(Instant::now);
            while let Some(Ok(m)) = ws.next().await {
                if m.to_text().unwrap_or_default().contains("sold_out") {
                    return Some(t0.elapsed());
                }
            }
            None
        });
    }
    drop(ready_tx);
    let (mut answered, mut connected) = (0, 0);
    while answered < n {
        let Some(opened) = ready_rx.recv().await else {
            break;
        };
        answered += 1;
        connected += usize::from(opened);
    }
    let connect_secs = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss_kib(pid);

    go_tx.send(Some(Instant::now())).unwrap();
    stock(&engine, "BADGE-1", 0).await;
    let mut seen: Vec<Duration> = Vec::with_capacity(n);
    while let Some(r) = tasks.join_next().await {
        if let Ok(Some(d)) = r {
            seen.push(d);
        }
    }
    seen.sort_unstable();
    let p = |q: f64| {
        seen.get(((seen.len().max(1) - 1) as f64 * q) as usize)
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
    };
    let within_1s = seen
        .iter()
        .filter(|d| **d <= Duration::from_secs(1))
        .count();
    let per_conn_kib = after.saturating_sub(before) as f64 / connected.max(1) as f64;
    println!("| measure | result | budget |");
    println!("|---|---|---|");
    println!(
        "| connections open on one process | {connected} of {n} (opened in {connect_secs:.1} s) | 50,000 |"
    );
    println!(
        "| server memory per connection (RSS {before} KiB -> {after} KiB) | {per_conn_kib:.1} KiB | <= 8 KiB |"
    );
    println!(
        "| sell-out seen by connections | {} ({:.2}% within 1 s); p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms | 99% within 1 s |",
        seen.len(),
        100.0 * within_1s as f64 / n as f64,
        p(0.5),
        p(0.99),
        p(1.0)
    );
}
