//! Benchmark: answering shoppers after a sell-out. The same closed-loop load of
//! reservations on a sold-out SKU, once with the in-memory sold-out cache (the
//! default) and once with it off (every refusal is a Redis round trip), in one
//! run.
//!
//! ```sh
//! cargo build --release -p holdfast-cli --bin holdfast --examples
//! target/release/examples/soldout_bench --clients 50 --seconds 5
//! ```

use holdfast_engine::testkit::flag;

mod common;

const SKU: &str = "GONE-1";

#[tokio::main]
async fn main() {
    let clients = flag("--clients", 50) as usize;
    let seconds = flag("--seconds", 5);
    let mut rows = Vec::new();
    for (label, cache_ms) in [
        ("sold-out cache on (default)", "2000"),
        ("sold-out cache off: Redis answers", "0"),
    ] {
        let (_redis, server, _engine, token) = common::stack(
            "holdfast_bench_soldout",
            SKU,
            0,
            &[("HOLDFAST_SOLD_OUT_CACHE_MS", cache_ms.to_owned())],
        )
        .await;
        let base = format!("http://{}", server.addr);
        common::closed_loop(&base, &token, SKU, clients, 1, "warm").await;
        let r = common::closed_loop(&base, &token, SKU, clients, seconds, "run").await;
        assert_eq!(
            r.statuses.keys().copied().collect::<Vec<_>>(),
            [409],
            "every attempt refused as sold out"
        );
        rows.push((label, r));
    }
    println!("| rejections after a sell-out | clients | answers/s | p50 ms | p99 ms |");
    println!("|---|---|---|---|---|");
    for (label, r) in &rows {
        println!(
            "| {label} | {clients} | {:.0} | {:.2} | {:.2} |",
            r.rps, r.p50, r.p99
        );
    }
    let ratio = rows[0].1.rps / rows[1].1.rps;
    println!("\nratio cache / Redis: **{ratio:.2}**");
    println!(
        "{{\"bench\":\"sold_out_cache\",\"clients\":{clients},\"cache_rps\":{:.0},\"redis_rps\":{:.0},\"ratio\":{ratio:.3}}}",
        rows[0].1.rps, rows[1].1.rps
    );
}
