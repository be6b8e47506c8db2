//! Benchmark: the worked example of a flash sale. 2,000 units, 160,000 shoppers
//! arriving at 8,000 a second for 20 seconds, everyone who gets a hold pays at
//! once. Runs `holdfast simulate` (release) against a release server with its
//! workers, on a private Redis and a fresh database, and reports how long after
//! the last arrival every attempt had its answer, whether exactly 2,000 sold, and
//! the simulator's truth checks. Writes the report (JSON) and the plot (SVG).
//!
//! Budget: every attempt decided within 4 s of the last arrival; none oversold.
//! And the first second, when the units sell: with `--connections N` the
//! simulator opens N connections before the step, as a load balancer holds
//! them, so the first second's p99 measures the server rather than connection
//! set-up (budget under 50 ms); without, shoppers open connections as they come.
//!
//! ```sh
//! cargo build --release -p holdfast-cli --bin holdfast --examples
//! target/release/examples/drop_rehearsal --out bench/output
//! target/release/examples/drop_rehearsal --out bench/output/preopened --connections 1000
//! ```

use std::process::Command;

use holdfast_engine::testkit::{TestRedis, flag};

mod common;

#[tokio::main]
async fn main() {
    let shoppers = flag("--shoppers", 160_000);
    let units = flag("--units", 2_000);
    let rate = flag("--rate", 8_000);
    let seconds = flag("--seconds", 20);
    let connections = flag("--connections", 0);
    let out = std::env::args()
        .skip_while(|a| a != "--out")
        .nth(1)
        .unwrap_or_else(|| "bench/output".into());
    std::fs::create_dir_all(&out).unwrap();
    let redis = TestRedis::start();
    common::pin_service(redis.pid());
    let (_pg, pg_url) = holdfast_engine::testkit::fresh_database("holdfast_bench_drop").await;
    let server = common::start(&redis.url(), &pg_url, &[("HOLDFAST_API_RATE", "0".into())]).await;
    let exe = common::holdfast_exe();
    let json = format!("{out}/drop.json");
    let plot = format!("{out}/drop.svg");
    let out = Command::new(exe)
        .args(["simulate", "--url", &format!("http://{}", server.addr)])
        .args([
            "--shoppers",
            &shoppers.to_string(),
            "--units",
            &units.to_string(),
        ])
        .args([
            "--peak-rps",
            &rate.to_string(),
            "--peak-secs",
            &seconds.to_string(),
            "--decay-secs",
            "0",
        ])
        .args([
            "--confirm",
            "1",
            "--abandon",
            "0",
            "--think-ms",
            "0",
            "--retry",
            "0",
            "--repeat",
            "0",
        ])
        .args([
            "--per-buyer-limit",
            "0",
            "--connections",
            &connections.to_string(),
            "--settle-secs",
            "120",
            "--json",
            &json,
            "--plot",
            &plot,
        ])
        .env("REDIS_URL", redis.url())
        .env("DATABASE_URL", &pg_url)
        .env("HOLDFAST_LOG", "warn")
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("run holdfast simulate");
    let status = out.status;
    // Its report is read from the JSON file; what it says of its errors is
    // shown here, so an error is never only a count.
    for line in String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.trim_start().starts_with("e.g."))
    {
        println!(
            "simulate's error:{}",
            line.trim_start().trim_start_matches("e.g.")
        );
    }
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let decided = r["decided_ms_after_last_arrival"]
        .as_u64()
        .unwrap_or(u64::MAX);
    println!("| figure | value | budget |");
    println!("|---|---|---|");
    println!(
        "| shoppers, arrival rate | {} at {rate}/s for {:.1} s | |",
        r["attempts"],
        r["arrival_secs"].as_f64().unwrap_or(0.0)
    );
    println!(
        "| connections opened before the step | {} | |",
        if connections > 0 {
            connections.to_string()
        } else {
            "none (opened as shoppers come)".into()
        }
    );
    println!(
        "| units sold | {} of {units} | exactly {units} |",
        r["sold_units"]
    );
    println!("| refused (sold out) | {} | |", r["rejected_sold_out"]);
    println!("| every attempt answered after the last arrival | {decided} ms | within 4,000 ms |");
    println!(
        "| reserve latency p50 / p99 | {:.2} / {:.2} ms | |",
        r["p50_ms"].as_f64().unwrap_or(0.0),
        r["p99_ms"].as_f64().unwrap_or(0.0)
    );
    for second in r["timeline"].as_array().into_iter().flatten().take(3) {
        let at = second["at"].as_u64().unwrap_or(0);
        let budget = if at == 0 && connections > 0 {
            "< 50 ms (connections pre-opened)"
        } else {
            ""
        };
        println!(
            "| second {}: attempts, p50 / p99 | {}, {:.2} / {:.2} ms | {budget} |",
            at + 1,
            second["attempts"],
            second["p50_ms"].as_f64().unwrap_or(0.0),
            second["p99_ms"].as_f64().unwrap_or(0.0)
        );
    }
    println!("| errors | {} | 0 |", r["errors"]);
    let checks = r["checks"].as_array().map_or(0, Vec::len);
    let passed = r["checks"]
        .as_array()
        .map_or(0, |c| c.iter().filter(|c| c["passed"] == true).count());
    println!("| truth checks passed | {passed} of {checks} | all |");
    println!("\nThe first two seconds, a tenth of a second at a time (by scheduled arrival):\n");
    println!("| from ms | attempts | held | p50 ms | p99 ms |");
    println!("|---|---|---|---|---|");
    for slot in r["first_seconds"].as_array().into_iter().flatten() {
        println!(
            "| {} | {} | {} | {:.1} | {:.1} |",
            slot["at_ms"],
            slot["attempts"],
            slot["held"],
            slot["p50_ms"].as_f64().unwrap_or(0.0),
            slot["p99_ms"].as_f64().unwrap_or(0.0)
        );
    }
    println!("\nplot: `{plot}`; report: `{json}`; simulate exited with {status}");
    println!(
        "{{\"bench\":\"drop_rehearsal\",\"connections\":{connections},\"first_second_p99_ms\":{},\"attempts\":{},\"sold\":{},\"decided_ms_after_last_arrival\":{decided},\"p99_ms\":{},\"passed\":{}}}",
        r["timeline"][0]["p99_ms"], r["attempts"], r["sold_units"], r["p99_ms"], r["passed"]
    );
}
