//! `verify`: the truth check passes on an honest store and names what breaks it.

use std::time::Duration;

use holdfast_engine::testkit::{TestRedis, add_sku, nudge_counter};
use holdfast_engine::verify::{VerifyOptions, verify};
use holdfast_engine::warmup::{WarmOptions, warm_all};
use holdfast_engine::{Backends, ReserveRequest, postgres};
use sqlx::PgPool;

async fn setup(pg: &PgPool) -> (TestRedis, Backends) {
    let redis = TestRedis::start();
    for sku in ["VER-1", "VER-2"] {
        add_sku(pg, sku, 10).await;
    }
    let b = holdfast_engine::testkit::backends(pg.clone(), &redis.url()).await;
    warm_all(&b.engine, pg, WarmOptions::default(), |_| {})
        .await
        .unwrap();
    (redis, b)
}

fn failed(report: &holdfast_engine::verify::VerifyReport) -> Vec<&str> {
    report
        .checks
        .iter()
        .filter(|c| !c.passed)
        .map(|c| c.name.as_str())
        .collect()
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn an_honest_store_passes_and_each_lie_is_named(pg: PgPool) {
    let (redis, b) = setup(&pg).await;
    b.engine
        .reserve(&ReserveRequest::single("v-1", "VER-1", 2))
        .await
        .unwrap();
    let options = VerifyOptions {
        rereads: 1,
        max_lag: Duration::from_secs(3_600),
    };
    let report = verify(&b.engine, &pg, &options).await.unwrap();
    assert!(report.passed(), "{:?}", report.checks);
    assert_eq!(report.checked, 2);

    // Units that do not exist made sellable.
    let keys = b.engine.keyspace();
    let mut conn = redis.connection().await;
    nudge_counter(&b.engine, "VER-2", "available", 5).await;
    // An open hold the reaper would never see.
    redis::cmd("ZREM")
        .arg(keys.due(keys.shard_of("VER-1")))
        .arg("v-1")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    // A ledger that does not explain what PostgreSQL recorded.
    sqlx::query("UPDATE skus SET sold_recorded = 4 WHERE sku = 'VER-1'")
        .execute(&pg)
        .await
        .unwrap();

    // An order line of an order never recorded, and a ledger row of no SKU
    // (nothing in the schema refuses them: their writers keep this).
    sqlx::query(
        "INSERT INTO order_lines (reservation_id, sku, qty) VALUES ('v-ghost', 'VER-1', 1)",
    )
    .execute(&pg)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO ledger (sku, kind, qty, source, event_id)
         VALUES ('NO-SUCH', 'receipt', 1, 'erp', 'g-1'), ('NO-SUCH', 'receipt', 2, 'erp', 'g-2')",
    )
    .execute(&pg)
    .await
    .unwrap();

    let report = verify(&b.engine, &pg, &options).await.unwrap();
    let failed = failed(&report);
    let orphans = report
        .checks
        .iter()
        .find(|c| c.name == "every ledger row and order line has its SKU and order")
        .expect("the check runs");
    assert!(!orphans.passed);
    assert!(
        orphans.detail.contains("2 ledger row(s)") && orphans.detail.contains("1 order line(s)"),
        "{orphans:?}"
    );
    // The same pass over the ledger finds both: the SKU whose totals differ
    // (VER-1), and the rows of no SKU, which are not a SKU's disagreement.
    let agree = report
        .checks
        .iter()
        .find(|c| c.name == "ledger and on_hand agree")
        .expect("the check runs");
    assert!(agree.detail.starts_with("1 SKU(s)"), "{agree:?}");
    assert!(
        report
            .skus
            .iter()
            .any(|v| v.sku == "VER-1" && v.check == "ledger and on_hand agree"),
        "{:?}",
        report.skus
    );
    assert!(
        !report.skus.iter().any(|v| v.sku == "NO-SUCH"),
        "{:?}",
        report.skus
    );
    assert!(
        failed.iter().any(|f| f.starts_with("stock conserved")),
        "{failed:?}"
    );
    assert!(
        failed.contains(&"every open hold is due, every due entry is a hold"),
        "{failed:?}"
    );
    assert!(failed.contains(&"ledger and on_hand agree"), "{failed:?}");
    assert!(
        report
            .skus
            .iter()
            .any(|v| v.sku == "VER-2" && v.figures.contains("drift 5")),
        "{:?}",
        report.skus
    );
    assert!(!report.passed());
}

/// A SKU whose counter is gone (a Redis that lost it) sells nothing: verify
/// says so instead of passing with it counted aside, and passes again once
/// warm-up writes it back.
#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_sku_without_its_counter_fails_verify_until_warmed(pg: PgPool) {
    let (redis, b) = setup(&pg).await;
    let options = VerifyOptions::default();
    let keys = b.engine.keyspace();
    redis::cmd("DEL")
        .arg(keys.sku("VER-2"))
        .query_async::<()>(&mut redis.connection().await)
        .await
        .unwrap();
    let report = verify(&b.engine, &pg, &options).await.unwrap();
    assert_eq!(
        failed(&report),
        ["every SKU warmed (has its counter in Redis)"],
        "{:?}",
        report.checks
    );
    let warmed = report.checks.iter().find(|c| !c.passed).unwrap();
    assert!(warmed.detail.starts_with("1 SKU(s)"), "{}", warmed.detail);

    warm_all(&b.engine, &pg, WarmOptions::default(), |_| {})
        .await
        .unwrap();
    let report = verify(&b.engine, &pg, &options).await.unwrap();
    assert!(report.passed(), "{:?}", report.checks);
}

/// `verify` run again and again during a sale (carts over two shards being
/// held, paid and released, single holds expiring) never blames a hold that
/// merely moved between its reads: the hold and due-set check and the cart
/// check pass every time.
#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn verify_during_a_sale_blames_no_hold_that_moved(pg: PgPool) {
    let redis = TestRedis::start();
    let b = holdfast_engine::testkit::backends(pg.clone(), &redis.url()).await;
    let ks = b.engine.keyspace();
    let mut shards = std::collections::HashSet::new();
    let skus: Vec<String> = (0..)
        .map(|i| format!("MOVE-{i}"))
        .filter(|s| shards.insert(ks.shard_of(s)))
        .take(2)
        .collect();
    for sku in &skus {
        add_sku(&pg, sku, 1_000_000).await;
    }
    warm_all(&b.engine, &pg, WarmOptions::default(), |_| {})
        .await
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let shoppers: Vec<_> = (0..4)
        .map(|w| {
            let (engine, stop, skus) = (b.engine.clone(), stop.clone(), skus.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    n += 1;
                    let rid = format!("move-{w}-{n}");
                    let request = if n % 3 == 0 {
                        ReserveRequest {
                            ttl_ms: Some(50),
                            ..ReserveRequest::single(&rid, &skus[0], 1)
                        }
                    } else {
                        ReserveRequest {
                            reservation_id: rid.clone(),
                            lines: skus
                                .iter()
                                .map(|s| holdfast_engine::Line {
                                    sku: s.clone(),
                                    qty: 1,
                                })
                                .collect(),
                            buyer: None,
                            ttl_ms: Some(5_000),
                        }
                    };
                    engine.reserve(&request).await.unwrap();
                    match n % 3 {
                        1 => drop(engine.confirm(&rid).await.unwrap()),
                        2 => drop(engine.release(&rid).await.unwrap()),
                        _ => {}
                    }
                }
                n
            })
        })
        .collect();
    let reaper = {
        let (engine, stop) = (b.engine.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                engine.reap_once(500).await.unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let options = VerifyOptions {
        rereads: 1,
        max_lag: Duration::from_secs(3_600),
    };
    let watched = [
        "every open hold is due, every due entry is a hold",
        "carts consistent across shards",
    ];
    for round in 0..15 {
        let report = verify(&b.engine, &pg, &options).await.unwrap();
        for check in report
            .checks
            .iter()
            .filter(|c| watched.contains(&c.name.as_str()))
        {
            assert!(check.passed, "round {round}: {check:?}");
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut made = 0;
    for s in shoppers {
        made += s.await.unwrap();
    }
    reaper.await.unwrap();
    assert!(
        made > 100,
        "the sale went on during the checks: {made} reservations"
    );
}
