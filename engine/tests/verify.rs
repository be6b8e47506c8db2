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

    let report = verify(&b.engine, &pg, &options).await.unwrap();
    let failed = failed(&report);
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
