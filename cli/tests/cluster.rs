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

/// The SKU the failover tests sell (150 units in the demo drop).
const SKU: &str = "DROP-004";

/// Server settings for the failover tests: no scheduled checks in the way, a
/// quick reaper.
const ENV: &[(&str, &str)] = &[
    ("HOLDFAST_RECONCILE_EVERY_SECS", "0"),
    ("HOLDFAST_VERIFY_EVERY_SECS", "0"),
    ("HOLDFAST_REAPER_INTERVAL_MS", "100"),
];

/// A drop on 3 masters with a replica each and one server, with the demo
/// drop warmed and a token: what the failover tests start from.
struct ClusterSale {
    cluster: TestCluster,
    redis: String,
    db: String,
    base: String,
    pg: sqlx::PgPool,
    token: String,
    /// [`SKU`]'s stock.
    stock: i64,
    /// The node that is master of [`SKU`]'s shard.
    victim: usize,
    _pg_server: TestPostgres,
    _server: common::KillOnDrop,
}

impl ClusterSale {
    async fn start(env: &[(&str, &str)]) -> Self {
        let cluster = TestCluster::start(3, 1);
        let redis = cluster.url();
        let pg_server = TestPostgres::start();
        let db = pg_server.url("holdfast");
        let served = common::serve_at(&redis, &db, env);
        let base = served.1.clone();
        let server = common::KillOnDrop(served.0);
        let (pg, token) = common::demo_with_token(&redis, &db).await;
        let (stock, _) = holdfast_engine::catalog::recorded(&pg, SKU)
            .await
            .unwrap()
            .unwrap();
        let keys = holdfast_engine::keys::Keyspace::default();
        let victim = cluster.master_of(&keys.sku(SKU));
        Self {
            cluster,
            redis,
            db,
            base,
            pg,
            token,
            stock,
            victim,
            _pg_server: pg_server,
            _server: server,
        }
    }
}

/// One sale attempt's answers: the reservation's status, the payment's
/// (0 when none was made), and the longest of the two calls.
struct Attempt {
    at: Duration,
    reserve: u16,
    confirm: u16,
    took: Duration,
}

/// Kill -9 the master of a SKU's shard in the middle of its sale (three
/// masters, a replica each): no answer is a 500, none takes longer than the
/// API's deadline, the units paid for never exceed the stock, the server
/// notices the new master, stops selling on the shard, checks it against
/// PostgreSQL and sells again by itself, and every phase's time is printed.
#[tokio::test]
async fn killing_a_master_mid_sale_oversells_nothing_and_selling_resumes_by_itself() {
    sale_through_a_failover(Fault::Kill).await;
}

/// The same with the master frozen (SIGSTOP, a paused VM) rather than killed:
/// it answers nothing and redirects nothing, so the clients must learn the new
/// master from the cluster; it stays frozen until the sale has resumed.
#[tokio::test]
async fn freezing_a_master_mid_sale_oversells_nothing_and_selling_resumes_by_itself() {
    sale_through_a_failover(Fault::Freeze).await;
}

/// The same with a graceful failover (`CLUSTER FAILOVER` on the replica): the
/// server notices the new master at once, asking the nodes themselves rather
/// than its cluster client (whose map was seen naming the old master for
/// seconds), and sells on.
#[tokio::test]
async fn a_graceful_failover_mid_sale_is_noticed_and_selling_goes_on() {
    sale_through_a_failover(Fault::Handover).await;
}

/// How the master dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// SIGKILL.
    Kill,
    /// SIGSTOP (SIGCONT at the end).
    Freeze,
    /// `CLUSTER FAILOVER` on its replica.
    Handover,
}

async fn sale_through_a_failover(fault: Fault) {
    let ClusterSale {
        mut cluster,
        redis,
        db,
        base,
        pg,
        token,
        stock,
        victim,
        _pg_server,
        _server,
    } = ClusterSale::start(ENV).await;
    let sku = SKU;

    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let shoppers: Vec<_> = (0..4)
        .map(|w| {
            let (http, base, token, stop) =
                (http.clone(), base.clone(), token.clone(), stop.clone());
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    n += 1;
                    let key = format!("fo-{w}-{n}");
                    let t = std::time::Instant::now();
                    let held = http
                        .post(format!("{base}/api/v1/reservations"))
                        .bearer_auth(&token)
                        .header("Idempotency-Key", &key)
                        .json(&serde_json::json!({ "sku": sku, "qty": 1, "buyer": key }))
                        .send()
                        .await
                        .expect("the server answers");
                    let reserve = held.status().as_u16();
                    let body: serde_json::Value = held.json().await.unwrap_or_default();
                    let mut took = t.elapsed();
                    let mut confirm = 0;
                    if reserve == 201 {
                        let id = body["id"].as_str().unwrap().to_owned();
                        let t = std::time::Instant::now();
                        confirm = common::confirm(&http, &base, &token, &id).await;
                        took = took.max(t.elapsed());
                    }
                    seen.push(Attempt {
                        at: started.elapsed(),
                        reserve,
                        confirm,
                        took,
                    });
                    tokio::time::sleep(Duration::from_millis(60)).await;
                }
                seen
            })
        })
        .collect();

    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let killed_at = started.elapsed();
    let frozen = match fault {
        Fault::Kill => {
            cluster.node(victim).kill();
            None
        }
        Fault::Freeze => {
            let pid = cluster.node(victim).pid().unwrap();
            holdfast_engine::testkit::signal(pid, "STOP");
            Some(pid)
        }
        Fault::Handover => {
            cluster.promote(cluster.replica_of(victim));
            None
        }
    };
    // Until the server has seen the failover through and answers normally
    // on the SKU again (a hold, or sold out once the stock is gone).
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    let resumed_check = loop {
        let metrics = common::metrics(&http, &base).await;
        if common::metric(&metrics, "holdfast_failover_resumed_total") >= 1.0 {
            break common::metric(&metrics, "holdfast_failover_last_fenced_seconds");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the server never finished checking the failed-over shard"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut attempts = Vec::new();
    for s in shoppers {
        attempts.extend(s.await.unwrap());
    }
    if let Some(pid) = frozen {
        holdfast_engine::testkit::signal(pid, "CONT");
    }
    attempts.sort_by_key(|a| a.at);

    let server_errors: Vec<(u16, u16)> = attempts
        .iter()
        .filter(|a| a.reserve >= 500 && a.reserve != 503 || a.confirm >= 500 && a.confirm != 503)
        .map(|a| (a.reserve, a.confirm))
        .collect();
    assert!(
        server_errors.is_empty(),
        "answers other than 503 among 5xx: {server_errors:?}"
    );
    let slowest = attempts.iter().map(|a| a.took).max().unwrap_or_default();
    assert!(
        slowest < Duration::from_millis(3_500),
        "a call took {slowest:?}, past the 3 s API deadline"
    );
    let paid = attempts.iter().filter(|a| a.confirm == 200).count() as i64;
    assert!(paid <= stock, "{paid} units paid for, {stock} in stock");
    let after_kill: Vec<&Attempt> = attempts.iter().filter(|a| a.at > killed_at).collect();
    let first_refused = after_kill
        .iter()
        .find(|a| a.reserve == 503 || a.confirm == 503)
        .map(|a| a.at - killed_at);
    let selling_again = after_kill
        .iter()
        .rev()
        .take_while(|a| a.reserve == 201 || a.reserve == 409)
        .last()
        .map(|a| a.at - killed_at);
    assert!(
        selling_again.is_some(),
        "the SKU answers normally again by itself after the failover"
    );
    let recorded = common::recorded_units(&pg, sku, paid, Duration::from_secs(30)).await;
    assert!(recorded <= stock, "{recorded} recorded sold of {stock}");
    let audited: Vec<String> = sqlx::query_scalar(
        "SELECT action FROM audit_log WHERE action LIKE 'failover%' ORDER BY id",
    )
    .fetch_all(&pg)
    .await
    .unwrap();
    assert!(
        audited.iter().any(|a| a == "failover") && audited.iter().any(|a| a == "failover_resumed"),
        "the failover is in the audit log: {audited:?}"
    );
    println!(
        "master of {sku}'s shard ({fault:?}) at {killed_at:?}: first 503 after {first_refused:?}, \
         shard fenced then checked against PostgreSQL for {resumed_check:.2} s, answering \
         normally again {selling_again:?} after the kill; {} attempts, {paid} paid of {stock}, \
         {recorded} recorded, slowest call {slowest:?}",
        attempts.len()
    );
    let (ok, out, err) = common::holdfast(&["verify"], &redis, &db);
    assert!(ok, "verify after the failover:\n{out}{err}");
}

/// A master killed and restarted at once, before the cluster fails it over,
/// with an RDB file older than its last sales (a node keeps the one it
/// received as a replica, or a `SAVE`): it comes back as the same master with
/// old counters. The server notices its new run id, fences its shards,
/// rebuilds their counters from PostgreSQL and sells on: never more units than
/// the stock.
#[tokio::test]
async fn a_master_back_with_old_data_resells_nothing() {
    let ClusterSale {
        mut cluster,
        redis,
        db,
        base,
        pg,
        token,
        stock,
        victim,
        _pg_server,
        _server,
    } = ClusterSale::start(ENV).await;
    let sku = SKU;
    let port = cluster.node(victim).port().to_string();
    let saved = std::process::Command::new("redis-cli")
        .args(["-p", &port, "SAVE"])
        .output()
        .unwrap();
    assert!(saved.status.success(), "SAVE on the master");

    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    // One sale: 201 then 200 → true; sold out → false; anything else (a 503
    // while the shard is fenced) → None, to try again.
    let sell = async |key: String| -> Option<bool> {
        let held = http
            .post(format!("{base}/api/v1/reservations"))
            .bearer_auth(&token)
            .header("Idempotency-Key", &key)
            .json(&serde_json::json!({ "sku": sku, "qty": 1, "buyer": key }))
            .send()
            .await
            .ok()?;
        match held.status().as_u16() {
            409 => Some(false),
            201 => {
                let body: serde_json::Value = held.json().await.ok()?;
                let id = body["id"].as_str()?.to_owned();
                (common::confirm(&http, &base, &token, &id).await == 200).then_some(true)
            }
            _ => None,
        }
    };
    let mut paid = 0_i64;
    for i in 0..60 {
        assert_eq!(sell(format!("old-{i}")).await, Some(true));
        paid += 1;
    }
    // Every sale so far recorded: the test measures the old data, not a loss
    // of unrecorded sales (which only --confirm-replicas on a replica covers).
    assert_eq!(
        common::recorded_units(&pg, sku, paid, Duration::from_secs(20)).await,
        paid
    );
    cluster.node(victim).kill();
    cluster.node(victim).restart();

    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut n = 0;
    loop {
        n += 1;
        match sell(format!("after-{n}")).await {
            Some(true) => paid += 1,
            Some(false) => break,
            None => tokio::time::sleep(Duration::from_millis(100)).await,
        }
        assert!(std::time::Instant::now() < deadline, "never sold out again");
    }
    assert!(paid <= stock, "{paid} units paid for, {stock} in stock");
    let recorded = common::recorded_units(&pg, sku, paid, Duration::from_secs(30)).await;
    assert_eq!(recorded, paid, "every paid unit recorded once");
    let audited: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE action = 'failover_resumed'")
            .fetch_one(&pg)
            .await
            .unwrap();
    assert!(audited >= 1, "the restart was treated as a failover");
    println!("a master back with old data: {paid} paid of {stock}, {recorded} recorded");
    let (ok, out, err) = common::holdfast(&["verify"], &redis, &db);
    assert!(ok, "verify after the restart:\n{out}{err}");
}
