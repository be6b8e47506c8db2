//! `/metrics` speaks Prometheus text and reflects live state.

mod common;

use holdfast_engine::ingest;
use holdfast_engine::testkit::TestRedis;
use sqlx::PgPool;

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn metrics_expose_health_lag_and_lanes(pool: PgPool) {
    let redis = TestRedis::start();
    let server = common::spawn(common::backends(pool, &redis.url()).await).await;
    let mut conn = redis.connection().await;
    ingest::pause(&mut conn, holdfast_domain::Lane::Feeds)
        .await
        .unwrap();
    holdfast_engine::testkit::queue_payload(&mut conn, holdfast_domain::Lane::Feeds, "erp", b"{}")
        .await;

    let res = reqwest::get(server.url("/metrics")).await.unwrap();
    assert_eq!(res.status(), 200);
    assert!(
        res.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let text = res.text().await.unwrap();
    for line in [
        "holdfast_redis_up 1",
        "holdfast_postgres_up 1",
        "holdfast_reaper_released_total 0",
        "holdfast_write_behind_lag_entries 0",
        "holdfast_ingest_backlog{lane=\"feeds\"} 1",
        "holdfast_ingest_paused{lane=\"feeds\"} 1",
        "holdfast_ingest_paused{lane=\"orders\"} 0",
        "holdfast_ingest_applied_total{lane=\"orders\"} 0",
        "# TYPE holdfast_write_behind_events_total counter",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing `{line}` in:\n{text}"
        );
    }
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn with_a_scrape_token_only_the_scraper_reads_metrics(pool: PgPool) {
    use holdfast_server::routes::metrics::MetricsAccess;
    use holdfast_server::state::StateOptions;
    let redis = TestRedis::start();
    let options = StateOptions {
        metrics: MetricsAccess(Some("scrape-token-0123456789".into())),
        ..StateOptions::default()
    };
    let server =
        common::spawn_with(common::backends(pool, &redis.url()).await, options, None).await;
    let http = reqwest::Client::new();
    for wrong in [None, Some("nope"), Some("scrape-token-012345678")] {
        let mut req = http.get(server.url("/metrics"));
        if let Some(t) = wrong {
            req = req.bearer_auth(t);
        }
        let res = req.send().await.unwrap();
        assert_eq!(res.status(), 401, "{wrong:?}");
        assert!(
            !res.text().await.unwrap().contains("holdfast_"),
            "{wrong:?}"
        );
    }
    let res = http
        .get(server.url("/metrics"))
        .bearer_auth("scrape-token-0123456789")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(res.text().await.unwrap().contains("holdfast_redis_up 1"));
}
