//! Benchmark: reserving through the HTTP API on one hot SKU (auth, idempotency,
//! JSON, the engine) next to `redis-benchmark` calling EVALSHA of the same
//! `reserve.lua` with the same number of clients, against the same Redis, in one
//! run. The API is driven twice: by reqwest (closed loop, one task per client)
//! and by `wrk` (one thread, a fresh `Idempotency-Key` per request), the same
//! kind of lean single-threaded C client as `redis-benchmark`. Budget: the API
//! reaches at least 0.6 of raw EVALSHA.
//!
//! With `--profile 1`, the server is sampled by `perf` during the `wrk` run and
//! the hottest functions are printed.
//!
//! ```sh
//! cargo build --release -p holdfast-cli --bin holdfast --examples
//! target/release/examples/http_vs_evalsha --clients 50 --seconds 5 --profile 1
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
    let profile = (flag("--profile", 0) == 1)
        .then(|| common::Profile::start(server.pid(), seconds))
        .flatten();
    let wrk = common::wrk_reserve(&base, &token, SKU, clients, seconds, "wrk");
    let top = profile.map(|p| p.top(25)).unwrap_or_default();
    drop(server);
    let requests = (http.rps.max(wrk.rps) * seconds as f64).max(50_000.0) as u64;
    let (r_rps, r_p50, r_p99, held) =
        redis_benchmark_reserve(redis.port(), &engine, SKU, clients, requests);
    // Each call holds a unit under a fresh hold key (a repeated random key
    // is a retry, which holds nothing): fewer means the script did not reserve.
    assert!(
        held * 100 >= requests * 99,
        "redis-benchmark's calls held {held} units of {requests}: the script is not reserving"
    );
    let ratio = http.rps / r_rps;
    let wrk_ratio = wrk.rps / r_rps;
    println!("| path | clients | reserves/s | p50 ms | p99 ms |");
    println!("|---|---|---|---|---|");
    println!(
        "| HTTP API (`POST /api/v1/reservations`) | {clients} | {:.0} | {:.2} | {:.2} |",
        http.rps, http.p50, http.p99
    );
    println!(
        "| HTTP API, `wrk -t1` (a fresh Idempotency-Key per request) | {clients} | {:.0} | {:.2} | {:.2} |",
        wrk.rps, wrk.p50, wrk.p99
    );
    println!(
        "| redis-benchmark EVALSHA reserve.lua ({held} units held by {requests} calls) | {clients} | {r_rps:.0} | {r_p50:.2} | {r_p99:.2} |"
    );
    println!(
        "\nratio HTTP / raw EVALSHA (budget: at least 0.6): reqwest **{ratio:.2}**, wrk **{wrk_ratio:.2}**; reqwest's answers: {:?}; wrk's answers other than 2xx: {}",
        http.statuses, wrk.failed
    );
    if !top.is_empty() {
        println!("\nThe server during the wrk run, hottest functions (self time, `perf`):\n\n```");
        for line in &top {
            println!("{line}");
        }
        println!("```");
    }
    println!(
        "{{\"bench\":\"http_vs_evalsha\",\"clients\":{clients},\"http_rps\":{:.0},\"wrk_rps\":{:.0},\"evalsha_rps\":{r_rps:.0},\"ratio\":{ratio:.3},\"wrk_ratio\":{wrk_ratio:.3}}}",
        http.rps, wrk.rps
    );
}
