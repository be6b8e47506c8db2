//! A deployment whose Redis speaks TLS only with an ACL user, and whose
//! PostgreSQL is reached with `sslmode=verify-full`, both presenting
//! certificates from a CA the test creates: every command and a sale through
//! `holdfast serve` work, and a URL that cannot verify the server is refused at
//! start-up in one line.

mod common;

use std::time::Duration;

use holdfast_engine::doctor::{CheckLevel, DoctorReport};
use holdfast_engine::testkit::{TestCa, TestPostgres, TestRedis};
use serde_json::{Value, json};

#[tokio::test]
async fn a_sale_over_tls_to_redis_and_postgres() {
    let ca = TestCa::new();
    let ca_file = ca.file("ca.crt");
    let redis = TestRedis::start_tls_as(&ca, "holdfast", "tls-pass");
    let pg_server = TestPostgres::start_tls(&ca);
    let port = redis.port();
    let redis_url = format!("rediss://holdfast:tls-pass@127.0.0.1:{port}/?ssl_ca_certs={ca_file}");
    let pg_url = format!(
        "{}?sslmode=verify-full&sslrootcert={ca_file}",
        pg_server.url("holdfast")
    );
    // Loading, `holdfast warm` and `holdfast token create`, all over TLS.
    let (pg, token) = common::demo_with_token(&redis_url, &pg_url).await;

    let (child, base, _, _out) = common::serve(
        &redis,
        &pg_url,
        &[
            ("REDIS_URL", redis_url.as_str()),
            ("HOLDFAST_RECONCILE_EVERY_SECS", "0"),
            ("HOLDFAST_VERIFY_EVERY_SECS", "0"),
        ],
    );
    let mut child = common::KillOnDrop(child);
    let http = reqwest::Client::new();
    let held = http
        .post(format!("{base}/api/v1/reservations"))
        .bearer_auth(&token)
        .header("Idempotency-Key", "tls-1")
        .json(&json!({ "sku": "DROP-001", "qty": 1, "buyer": "tls-buyer" }))
        .send()
        .await
        .unwrap();
    assert_eq!(held.status(), 201);
    let id = held.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(common::confirm(&http, &base, &token, &id).await, 200);
    // The write-behind records the sale in PostgreSQL over TLS.
    let recorded = common::recorded_units(&pg, "DROP-001", 1, Duration::from_secs(20)).await;
    assert_eq!(recorded, 1, "the sale reached PostgreSQL once");
    child.kill();

    let (ok, out, err) = common::holdfast(&["verify"], &redis_url, &pg_url);
    assert!(ok, "verify over TLS:\n{out}{err}");
    let report = std::process::Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .args(["doctor", "--json"])
        .env("REDIS_URL", &redis_url)
        .env("DATABASE_URL", &pg_url)
        .env("HOLDFAST_LOG", "warn")
        .output()
        .unwrap();
    let report: DoctorReport = serde_json::from_slice(&report.stdout).expect("a JSON report");
    let tls = report
        .checks
        .iter()
        .find(|c| c.name == "redis tls")
        .expect("a redis tls line");
    assert_eq!(tls.level, CheckLevel::Pass, "{}", tls.finding);
    assert!(tls.finding.contains("verified"), "{}", tls.finding);
    assert!(!tls.finding.contains("tls-pass"), "no password shown");

    // URLs that cannot verify the server are refused in one line.
    let unverified = format!("rediss://holdfast:tls-pass@127.0.0.1:{port}");
    let (ok, _, err) = common::holdfast(&["warm"], &unverified, &pg_url);
    assert!(!ok && err.contains("certificate"), "{err}");
    assert!(!err.contains("tls-pass"), "no password shown: {err}");
    let no_root = format!("{}?sslmode=verify-full", pg_server.url("holdfast"));
    let (ok, _, err) = common::holdfast(&["warm"], &redis_url, &no_root);
    assert!(!ok && err.contains("certificate"), "{err}");
}
