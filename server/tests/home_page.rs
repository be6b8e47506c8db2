//! The dashboard home is rendered on the server with the demo drop's SKUs.

mod common;

use holdfast_engine::catalog;
use holdfast_engine::testkit::TestRedis;
use sqlx::PgPool;

#[sqlx::test(migrator = "holdfast_engine::store::MIGRATOR")]
async fn home_lists_the_demo_drop_from_postgres(pool: PgPool) {
    catalog::load_demo_drop(&pool).await.unwrap();
    sqlx::query("UPDATE skus SET on_hand = 1234 WHERE sku = 'DROP-004'")
        .execute(&pool)
        .await
        .unwrap();
    let redis = TestRedis::start();
    let server = common::spawn(common::backends(pool, &redis.url()).await).await;

    let html = reqwest::get(server.url("/"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(html.contains("Winter Launch Drop"), "drop name rendered");
    for sku in [
        "DROP-001", "DROP-002", "DROP-003", "DROP-004", "DROP-005", "DROP-006",
    ] {
        assert!(html.contains(sku), "{sku} rendered on the server");
    }
    assert!(html.contains("1234"), "figures come from PostgreSQL");
    assert!(
        html.contains("/pkg/holdfast.js"),
        "the hydration script is linked"
    );
}

#[sqlx::test(migrator = "holdfast_engine::store::MIGRATOR")]
async fn home_explains_an_empty_catalogue(pool: PgPool) {
    let redis = TestRedis::start();
    let server = common::spawn(common::backends(pool, &redis.url()).await).await;
    let html = reqwest::get(server.url("/"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(html.contains("No drop is loaded yet"), "{html}");
}
