//! Benchmark: reserve throughput through the engine on one hot SKU, next to
//! `redis-benchmark` running EVALSHA of the same `reserve.lua` with the same
//! number of clients, against the same private `redis-server`, in one run.
//!
//! ```sh
//! cargo run --release -p holdfast-engine --example reserve_bench -- --clients 50 --seconds 5
//! ```
//!
//! Prints a Markdown table and one JSON line (for scripts).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use holdfast_engine::testkit::{TestRedis, flag, redis_benchmark_reserve, stock};
use holdfast_engine::{Engine, EngineConfig, ReserveOutcome, ReserveRequest};

const SKU: &str = "BENCH-1";
const STOCK: i64 = 1_000_000_000_000;

/// Latency percentile, in milliseconds, of a sorted sample of nanoseconds.
fn pct(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    f64::from(sorted[i]) / 1_000_000.0
}

async fn engine_run(engine: &Engine, clients: usize, seconds: u64) -> (f64, f64, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (engine, stop, next) = (engine.clone(), stop.clone(), next.clone());
        tasks.spawn(async move {
            let mut lat = Vec::with_capacity(200_000);
            while !stop.load(Ordering::Relaxed) {
                let rid = format!("b-{}", next.fetch_add(1, Ordering::Relaxed));
                let t = Instant::now();
                let out = engine
                    .reserve(&ReserveRequest::single(rid, SKU, 1))
                    .await
                    .expect("reserve");
                lat.push(t.elapsed().as_nanos() as u32);
                assert!(matches!(out, ReserveOutcome::Reserved { .. }), "{out:?}");
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
    (all.len() as f64 / elapsed, pct(&all, 0.5), pct(&all, 0.99))
}

#[tokio::main]
async fn main() {
    let (clients, seconds) = (flag("--clients", 50) as usize, flag("--seconds", 5));
    let redis = TestRedis::start();
    let engine = Engine::new(redis.connection().await, EngineConfig::default());
    let mut admin = redis.connection().await;

    stock(&engine, SKU, STOCK).await;
    // Load the script so EVALSHA finds it.
    let warm_up = engine
        .reserve(&ReserveRequest::single("warm-up", SKU, 1))
        .await
        .unwrap();
    assert!(matches!(warm_up, ReserveOutcome::Reserved { .. }));

    let (e_rps, e_p50, e_p99) = engine_run(&engine, clients, seconds).await;
    redis::cmd("FLUSHALL")
        .query_async::<()>(&mut admin)
        .await
        .unwrap();
    stock(&engine, SKU, STOCK).await;
    engine
        .reserve(&ReserveRequest::single("warm-up", SKU, 1))
        .await
        .unwrap();
    let requests = (e_rps * seconds as f64).max(50_000.0) as u64;
    let (r_rps, r_p50, r_p99) =
        redis_benchmark_reserve(redis.port(), &engine, SKU, clients, requests);
    let ratio = e_rps / r_rps;

    println!("| path | clients | reserves/s | p50 ms | p99 ms |");
    println!("|---|---|---|---|---|");
    println!(
        "| engine (Rust, one multiplexed connection) | {} | {:.0} | {:.3} | {:.3} |",
        clients, e_rps, e_p50, e_p99
    );
    println!(
        "| redis-benchmark EVALSHA reserve.lua | {} | {:.0} | {:.3} | {:.3} |",
        clients, r_rps, r_p50, r_p99
    );
    println!("\nratio engine / raw EVALSHA: {ratio:.2}");
    println!(
        "{{\"bench\":\"reserve_engine_vs_evalsha\",\"clients\":{},\"engine_rps\":{:.0},\"engine_p50_ms\":{:.3},\"engine_p99_ms\":{:.3},\"evalsha_rps\":{:.0},\"evalsha_p50_ms\":{:.3},\"evalsha_p99_ms\":{:.3},\"ratio\":{:.3}}}",
        clients, e_rps, e_p50, e_p99, r_rps, r_p50, r_p99, ratio
    );
}
