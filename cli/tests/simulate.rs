//! `holdfast simulate` against a real server with its workers: a small drop with
//! confirms, releases, abandoned holds (expired by the reaper), retries and a
//! per-buyer limit passes every truth check; and the checks catch a lie.

mod common;

use std::time::Duration;

use clap::Parser;
use holdfast_cli::config::Cli;
use holdfast_cli::simulate::{checks, load::Tally};
use holdfast_engine::reaper::ReaperConfig;
use holdfast_engine::record::WriteBehindConfig;
use holdfast_engine::testkit::TestRedis;
use holdfast_server::workers::{WorkerConfig, WorkerStats, Workers};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_rehearsal_passes_every_truth_check(_pool: PgPoolOptions, opts: PgConnectOptions) {
    let pg_url = common::pg_url(&opts);
    let redis = TestRedis::start();
    let pool = PgPool::connect(&pg_url).await.unwrap();
    let backends = common::backends(pool, &redis.url()).await;
    let stats = WorkerStats::new();
    let config = WorkerConfig {
        reaper: ReaperConfig {
            interval: Duration::from_millis(100),
            ..ReaperConfig::default()
        },
        write_behind: WriteBehindConfig::default(),
        reconcile_every: None,
        reconcile_correct_up: false,
        verify_every: None,
        lanes: Vec::new(),
    };
    let workers = Workers::start(&backends, &redis.url(), config, &stats, None)
        .await
        .unwrap();
    let server = common::spawn_live(backends.clone(), &redis.url()).await;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let plot = dir.path().join("plot.svg");

    let cli = Cli::parse_from([
        "holdfast",
        "--redis-url",
        &redis.url(),
        "--database-url",
        &pg_url,
        "simulate",
        "--url",
        &server,
        "--shoppers",
        "400",
        "--units",
        "60",
        "--peak-rps",
        "200",
        "--peak-secs",
        "1",
        "--decay-secs",
        "1",
        "--hold-ttl-secs",
        "1",
        // Longer than the hold's life: some payments and releases come late.
        "--think-ms",
        "2500",
        "--settle-secs",
        "30",
        "--json",
        json.to_str().unwrap(),
        "--plot",
        plot.to_str().unwrap(),
    ]);
    holdfast_cli::commands::run(cli)
        .await
        .expect("every truth check passes");

    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(report["passed"], true);
    // The rehearsal's own checks and the operators' truth check (`holdfast verify`).
    let checks = report["checks"].as_array().unwrap();
    assert_eq!(checks.len(), 19, "{checks:?}");
    assert!(checks.iter().any(|c| {
        c["name"]
            .as_str()
            .unwrap_or("")
            .starts_with("stock conserved")
    }));
    assert!(report["attempts"].as_u64().unwrap() >= 400);
    assert!(report["held"].as_u64().unwrap() > 0);
    assert!(
        report["abandoned"].as_u64().unwrap() > 0,
        "some holds were left to expire"
    );
    // A release that reaches an expired hold is answered 200 with the hold
    // shown expired, and counted as an expiry, not a release (the check "every
    // hold ended exactly once" compares these with the event stream).
    assert!(
        report["late_releases"].as_u64().unwrap() > 0,
        "some releases came after the hold expired: {report}"
    );
    assert!(
        report["late_payments"].as_u64().unwrap() > 0,
        "some payments came after the hold expired: {report}"
    );
    assert!(
        report["rejected_sold_out"].as_u64().unwrap() > 0,
        "400 shoppers for 60 units"
    );
    let sold = report["sold_units"].as_i64().unwrap();
    assert!(sold > 0 && sold <= 60);
    // The first two seconds by tenths add up to the same attempts as the
    // timeline's first two seconds (both by scheduled arrival).
    let slots = report["first_seconds"].as_array().unwrap();
    for second in 0..2 {
        let in_slots: u64 = slots
            .iter()
            .filter(|s| s["at_ms"].as_u64().unwrap() / 1_000 == second)
            .map(|s| s["attempts"].as_u64().unwrap())
            .sum();
        assert_eq!(
            in_slots,
            report["timeline"][second as usize]["attempts"]
                .as_u64()
                .unwrap(),
            "{slots:?}"
        );
    }
    let held: u64 = slots.iter().map(|s| s["held"].as_u64().unwrap()).sum();
    assert!(held > 0 && held <= report["held"].as_u64().unwrap());
    assert!(
        slots
            .windows(2)
            .all(|w| w[0]["at_ms"].as_u64() < w[1]["at_ms"].as_u64())
    );
    assert!(
        slots
            .iter()
            .all(|s| s["p50_ms"].as_f64() <= s["p99_ms"].as_f64())
    );
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("attempts/s") && svg.contains("p99"));
    // The temporary token was revoked.
    let live: i64 = sqlx::query_scalar("SELECT count(*) FROM api_tokens WHERE revoked_at IS NULL")
        .fetch_one(&backends.pg)
        .await
        .unwrap();
    assert_eq!(live, 0);
    workers.stop().await;
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn the_checks_catch_a_sale_redis_never_made(pool: PgPool) {
    let redis = TestRedis::start();
    let backends = common::backends(pool, &redis.url()).await;
    checks::create_sku(&backends, "SIM-LIE", 10, 2)
        .await
        .unwrap();
    let start = checks::stream_position(&backends, "SIM-LIE").await.unwrap();
    let tally = Tally::default();
    // Shoppers were told 3 units were sold; Redis sold none.
    tally
        .sold_units
        .store(3, std::sync::atomic::Ordering::Relaxed);
    let results = checks::run_all(&backends, "SIM-LIE", 10, 2, &tally, &start, Duration::ZERO)
        .await
        .unwrap();
    let failed: Vec<&str> = results
        .iter()
        .filter(|c| !c.passed)
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(failed, ["sales match what shoppers were told"]);
}
