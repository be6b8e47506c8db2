//! Benchmark: reserve throughput through the engine on one hot SKU, next to
//! `redis-benchmark` running EVALSHA of the same `reserve.lua` with the same
//! number of clients, against the same private `redis-server`, in one run.
//!
//! ```sh
//! cargo run --release -p holdfast-engine --example reserve_bench -- --clients 50 --seconds 5
//! ```
//!
//! Prints a Markdown table and one JSON line (for scripts). The table also
//! shows Redis' own time per call (`INFO commandstats`): the script's, and the
//! id's claim the engine pipelines with it.

use std::collections::HashMap;

use holdfast_engine::testkit::{TestRedis, flag, redis_benchmark_reserve, reserve_load, stock};
use holdfast_engine::{Engine, EngineConfig, ReserveOutcome, ReserveRequest};

const SKU: &str = "BENCH-1";
const STOCK: i64 = 1_000_000_000_000;

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

    let stats_before = redis.command_stats().await;
    let (e_rps, e_p50, e_p99) =
        reserve_load(&engine, clients as u64, seconds, |_| SKU.to_owned()).await;
    let stats_engine = redis.command_stats().await;
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
    let stats_between = redis.command_stats().await;
    let (r_rps, r_p50, r_p99, held) =
        redis_benchmark_reserve(redis.port(), &engine, SKU, clients, requests);
    let stats_after = redis.command_stats().await;
    let e_cost = RedisCost::between(&stats_before, &stats_engine);
    let r_cost = RedisCost::between(&stats_between, &stats_after);
    // Each call holds a unit under a fresh hold key (a repeated random key
    // is a retry, which holds nothing): fewer means the script did not reserve.
    assert!(
        held * 100 >= requests * 99,
        "redis-benchmark's calls held {held} units of {requests}: the script is not reserving"
    );
    let ratio = e_rps / r_rps;

    println!(
        "| path | clients | reserves/s | p50 ms | p99 ms | Redis µs per EVALSHA | Redis µs per claim (`SET`) |"
    );
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| engine (Rust, one multiplexed connection) | {} | {:.0} | {:.3} | {:.3} | {:.2} | {:.2} |",
        clients, e_rps, e_p50, e_p99, e_cost.per_script, e_cost.per_claim
    );
    println!(
        "| redis-benchmark EVALSHA reserve.lua ({held} units held by {requests} calls) | {} | {:.0} | {:.3} | {:.3} | {:.2} | {:.2} |",
        clients, r_rps, r_p50, r_p99, r_cost.per_script, r_cost.per_claim
    );
    println!("\nratio engine / raw EVALSHA: {ratio:.2}");
    println!(
        "{{\"bench\":\"reserve_engine_vs_evalsha\",\"clients\":{},\"engine_rps\":{:.0},\"engine_p50_ms\":{:.3},\"engine_p99_ms\":{:.3},\"evalsha_rps\":{:.0},\"evalsha_p50_ms\":{:.3},\"evalsha_p99_ms\":{:.3},\"ratio\":{:.3}}}",
        clients, e_rps, e_p50, e_p99, r_rps, r_p50, r_p99, ratio
    );
}

/// Redis' own time (`INFO commandstats`) over a phase of the benchmark.
struct RedisCost {
    /// µs inside Redis per `EVALSHA` (the reserve script).
    per_script: f64,
    /// µs inside Redis per `EVALSHA` for the id's claim (`SET`), which the
    /// engine pipelines with each call (the script itself never runs `SET`:
    /// Redis counts a script's own commands under their names too).
    per_claim: f64,
}

impl RedisCost {
    /// The cost between two readings of the command statistics.
    fn between(before: &HashMap<String, (u64, u64)>, after: &HashMap<String, (u64, u64)>) -> Self {
        let delta = |name: &str| {
            let (c0, u0) = before.get(name).copied().unwrap_or_default();
            let (c1, u1) = after.get(name).copied().unwrap_or_default();
            (c1.saturating_sub(c0), u1.saturating_sub(u0))
        };
        let (scripts, script_us) = delta("evalsha");
        let per = |us: u64| us as f64 / scripts.max(1) as f64;
        Self {
            per_script: per(script_us),
            per_claim: per(delta("set").1),
        }
    }
}
