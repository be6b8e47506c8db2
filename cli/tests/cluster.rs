//! A drop on Redis Cluster through the HTTP API: three masters with a replica
//! each, three `holdfast serve` processes named the cluster by its seed URLs,
//! a rehearsal spread over the three servers passing every truth check, and
//! `holdfast verify` agreeing afterwards.

mod common;

use std::time::Duration;

use clap::Parser;
use holdfast_cli::config::Cli;
use holdfast_engine::testkit::{TestCluster, TestPostgres};

#[tokio::test]
async fn a_drop_on_a_cluster_with_three_servers_passes_every_truth_check() {
    let cluster = TestCluster::start(3, 1);
    let redis = cluster.url();
    let pg_server = TestPostgres::start();
    let db = pg_server.url("holdfast");
    let env = [
        ("HOLDFAST_TAKEOVER_AFTER_SECS", "2"),
        ("HOLDFAST_RECONCILE_EVERY_SECS", "0"),
        ("HOLDFAST_VERIFY_EVERY_SECS", "0"),
        ("HOLDFAST_REAPER_INTERVAL_MS", "100"),
    ];
    let first = common::serve_at(&redis, &db, &env);
    let (pg, token) = common::demo_with_token(&redis, &db).await;
    let servers: Vec<common::Served> = std::iter::once(first)
        .chain((0..2).map(|_| common::serve_at(&redis, &db, &env)))
        .collect();
    let bases: Vec<String> = servers.iter().map(|s| s.1.clone()).collect();
    let _alive: Vec<common::KillOnDrop> = servers
        .into_iter()
        .map(|s| common::KillOnDrop(s.0))
        .collect();

    // One paid hold on each server, recorded once.
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    for (i, base) in bases.iter().enumerate() {
        let held = http
            .post(format!("{base}/api/v1/reservations"))
            .bearer_auth(&token)
            .header("Idempotency-Key", format!("cluster-{i}"))
            .json(&serde_json::json!({ "sku": "DROP-002", "qty": 1, "buyer": format!("b{i}") }))
            .send()
            .await
            .unwrap();
        assert_eq!(held.status(), 201);
        let body: serde_json::Value = held.json().await.unwrap();
        let id = body["id"].as_str().unwrap();
        // Paid on the next server: any server finishes what another began.
        let next = &bases[(i + 1) % bases.len()];
        assert_eq!(common::confirm(&http, next, &token, id).await, 200);
    }
    let recorded = common::recorded_units(&pg, "DROP-002", 3, Duration::from_secs(30)).await;
    assert_eq!(recorded, 3, "each sale recorded once");

    let args = common::rehearsal_over(&redis, &db, &bases);
    holdfast_cli::commands::run(Cli::parse_from(args))
        .await
        .expect("a rehearsal on a cluster passes every truth check");
    let (ok, out, err) = common::holdfast(&["verify"], &redis, &db);
    assert!(ok, "verify on a cluster:\n{out}{err}");
}
