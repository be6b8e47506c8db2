//! The engine survives an emptied script cache and a Redis that restarts empty.

use std::time::Duration;

use holdfast_engine::testkit::{TestRedis, stock};
use holdfast_engine::{ReserveOutcome, ReserveRequest};

#[tokio::test]
async fn script_flush_mid_run_is_invisible_to_callers() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    stock(&engine, "SKU-S", 100).await;
    let mut admin = redis.connection().await;
    for i in 0..60 {
        if i % 10 == 5 {
            redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query_async::<()>(&mut admin)
                .await
                .unwrap();
        }
        let outcome = engine
            .reserve(&ReserveRequest::single(format!("f-{i}"), "SKU-S", 1))
            .await
            .unwrap();
        assert!(
            matches!(outcome, ReserveOutcome::Reserved { .. }),
            "call {i}: {outcome:?}"
        );
    }
    let f = engine.figures("SKU-S").await.unwrap().unwrap();
    assert_eq!((f.available, f.reserved), (40, 60));
}

#[tokio::test]
async fn a_redis_that_restarts_empty_reads_as_not_warmed_never_sold_out() {
    let mut redis = TestRedis::start();
    let engine = redis.engine().await;
    stock(&engine, "SKU-R", 3).await;
    let first = engine
        .reserve(&ReserveRequest::single("k-1", "SKU-R", 1))
        .await
        .unwrap();
    assert!(matches!(first, ReserveOutcome::Reserved { .. }));

    redis.restart();
    // The connection heals by itself; calls during the outage fail as errors, never
    // as a stock answer.
    let mut answer = None;
    for _ in 0..50 {
        match engine
            .reserve(&ReserveRequest::single("k-2", "SKU-R", 1))
            .await
        {
            Ok(outcome) => {
                answer = Some(outcome);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    assert_eq!(
        answer,
        Some(ReserveOutcome::NotWarmed {
            sku: "SKU-R".into()
        })
    );

    // Warmed again (scripts reload after NOSCRIPT), sales resume.
    stock(&engine, "SKU-R", 2).await;
    let resumed = engine
        .reserve(&ReserveRequest::single("k-3", "SKU-R", 1))
        .await
        .unwrap();
    assert!(
        matches!(resumed, ReserveOutcome::Reserved { .. }),
        "{resumed:?}"
    );
}
