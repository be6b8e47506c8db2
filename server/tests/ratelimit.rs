//! Rate limits: per API token and per webhook source, 429 with Retry-After.

mod common;

use holdfast_engine::testkit::TestRedis;
use holdfast_engine::tokens::{self, Scope};
use holdfast_server::routes::ingest::{IngestConfig, sign};
use holdfast_server::state::StateOptions;
use sqlx::PgPool;

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn tokens_and_sources_get_429_with_retry_after_past_their_rate(pool: PgPool) {
    let redis = TestRedis::start();
    let backends = common::backends(pool.clone(), &redis.url()).await;
    let secret = "src-secret-0123456789";
    let options = StateOptions {
        api_rate: 2,
        ingest_rate: 1,
        ingest: IngestConfig::parse(&[format!("erp=feeds:{secret}")]).unwrap(),
        ..StateOptions::default()
    };
    let base = common::spawn_with(backends, options, None).await.base;
    let http = reqwest::Client::new();
    let a = tokens::create(&pool, "a", &[Scope::Read])
        .await
        .unwrap()
        .secret;
    let b = tokens::create(&pool, "b", &[Scope::Read])
        .await
        .unwrap()
        .secret;

    // Rate 2/s, burst 4: four calls pass, the fifth is refused.
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let r = http
            .get(format!("{base}/api/v1/stock/X-1"))
            .bearer_auth(&a)
            .send()
            .await
            .unwrap();
        statuses.push((
            r.status().as_u16(),
            r.headers().get("retry-after").is_some(),
        ));
    }
    assert_eq!(&statuses[..4], &[(503, true); 4], "not warmed, but allowed");
    assert_eq!(statuses[4], (429, true), "the fifth call is rate limited");
    let other = http
        .get(format!("{base}/api/v1/stock/X-1"))
        .bearer_auth(&b)
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 503, "another token has its own budget");

    // Webhooks: rate 1/s, burst 2.
    let mut codes = Vec::new();
    for i in 0..3 {
        let body = format!(r#"{{"event_id":"e{i}","type":"delta","sku":"X-1","delta":1}}"#);
        let ts = chrono::Utc::now().timestamp();
        let r = http
            .post(format!("{base}/ingest/erp"))
            .header("X-Holdfast-Timestamp", ts.to_string())
            .header("X-Holdfast-Signature", sign(secret, ts, body.as_bytes()))
            .body(body)
            .send()
            .await
            .unwrap();
        codes.push(r.status().as_u16());
    }
    assert_eq!(codes, vec![202, 202, 429]);
}
