//! Benchmark: reserving through the HTTP API on one hot SKU (auth, idempotency,
//! JSON, the engine) next to `redis-benchmark` calling EVALSHA of the same
//! `reserve.lua` with the same number of clients, against the same Redis, in one
//! run. Budget: the API reaches at least half of raw EVALSHA.
//!
//! ```sh
//! cargo build --release -p holdfast-server --bin holdfast --examples
//! target/release/examples/http_vs_evalsha --clients 50 --seconds 5
//! ```

use holdfast_engine::testkit::{flag, redis_benchmark_reserve};

mod common;

const SKU: &str = "HOT-1";

#[tokio::main]
async fn main() {
    let clients = flag("--clients", 50) as usize;
    let seconds = flag("--seconds", 5);
    let (redis, server, engine, token) =
        common::stack("holdfast_bench_ratio", SKU, 1_000_000_000_000, &[]).await;
    let base = format!("http://{}", server.addr);
    // Warm the server and its connection pool; this also loads the script.
    common::closed_loop(&base, &token, SKU, clients, 1, "warm").await;
    let http = common::closed_loop(&base, &token, SKU, clients, seconds, "run").await;
    drop(server);
    let requests = (http.rps * seconds as f64).max(50_000.0) as u64;
    let (r_rps, r_p50, r_p99) =
        redis_benchmark_reserve(redis.port(), &engine, SKU, clients, requests);
    let ratio = http.rps / r_rps;
    println!("| path | clients | reserves/s | p50 ms | p99 ms |");
    println!("|---|---|---|---|---|");
    println!(
        "| HTTP API (`POST /api/v1/reservations`) | {clients} | {:.0} | {:.2} | {:.2} |",
        http.rps, http.p50, http.p99
    );
    println!(
        "| redis-benchmark EVALSHA reserve.lua | {clients} | {r_rps:.0} | {r_p50:.2} | {r_p99:.2} |"
    );
    println!(
        "\nratio HTTP / raw EVALSHA: **{ratio:.2}** (budget: at least 0.5); answers: {:?}",
        http.statuses
    );
    println!(
        "{{\"bench\":\"http_vs_evalsha\",\"clients\":{clients},\"http_rps\":{:.0},\"evalsha_rps\":{r_rps:.0},\"ratio\":{ratio:.3}}}",
        http.rps
    );
}
