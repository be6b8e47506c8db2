//! `/healthz` and `/readyz` against real Redis and PostgreSQL.

mod common;

use holdfast_engine::testkit::TestRedis;
use serde_json::Value;
use sqlx::PgPool;

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn readyz_reports_which_dependency_failed(pool: PgPool) {
    let mut redis = TestRedis::start();
    let server = common::spawn(common::backends(pool, &redis.url()).await).await;
    let http = reqwest::Client::new();

    let live = http.get(server.url("/healthz")).send().await.unwrap();
    assert_eq!(live.status(), 200);

    let ready = http.get(server.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    let body: Value = ready.json().await.unwrap();
    assert_eq!(body["status"], "ready");
    assert_eq!(body["redis"]["ok"], true);
    assert_eq!(body["postgres"]["ok"], true);
    let sell = http
        .get(server.url("/readyz/checkout"))
        .send()
        .await
        .unwrap();
    assert_eq!(sell.status(), 200);
    let body: Value = sell.json().await.unwrap();
    assert_eq!(body["status"], "ready", "{body}");

    redis.kill();
    let sell = http
        .get(server.url("/readyz/checkout"))
        .send()
        .await
        .unwrap();
    assert_eq!(sell.status(), 503, "checkout needs Redis");
    let body: Value = sell.json().await.unwrap();
    assert_eq!(body["redis"]["ok"], false, "{body}");
    let degraded = http.get(server.url("/readyz")).send().await.unwrap();
    assert_eq!(degraded.status(), 503);
    let body: Value = degraded.json().await.unwrap();
    assert_eq!(body["status"], "degraded");
    assert_eq!(body["redis"]["ok"], false);
    // Which dependency, in fixed words: no addresses or driver messages to
    // an unauthenticated caller.
    let said = body["redis"]["error"].as_str().unwrap_or_default();
    assert!(said.starts_with("Redis is not answering"), "{body}");
    assert!(
        !said.contains("127.0.0.1") && !said.contains("refused"),
        "{body}"
    );
    assert_eq!(body["postgres"]["ok"], true);

    // The connection heals by itself once Redis is back.
    redis.restart();
    let mut healed = false;
    for _ in 0..50 {
        let r = http.get(server.url("/readyz")).send().await.unwrap();
        if r.status() == 200 {
            healed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(healed, "readyz recovers after Redis restarts");
}
