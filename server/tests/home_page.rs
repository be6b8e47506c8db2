//! The overview is rendered on the server with the drop's SKUs and live figures,
//! for signed-in users only.

mod common;

use holdfast_engine::catalog;
use holdfast_engine::testkit::{TestRedis, stock};
use holdfast_engine::users::{self, Role};
use sqlx::PgPool;

async fn sign_in(server: &common::TestServer, pool: &PgPool) -> String {
    users::create(pool, "merch", Role::Viewer, "a-long-password", false)
        .await
        .unwrap();
    let res = reqwest::Client::new()
        .post(server.url("/api/login"))
        .header("origin", &server.base)
        .form(&[("username", "merch"), ("password", "a-long-password")])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    res.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned()
}

async fn page(server: &common::TestServer, cookie: Option<&str>) -> String {
    // As a browser navigates: a signed-out visitor is redirected with a 302.
    let mut req = reqwest::Client::new()
        .get(server.url("/"))
        .header("accept", "text/html");
    if let Some(c) = cookie {
        req = req.header("cookie", c);
    }
    req.send().await.unwrap().text().await.unwrap()
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn the_overview_lists_the_demo_drop_with_live_figures(pool: PgPool) {
    catalog::load_demo_drop(&pool).await.unwrap();
    let redis = TestRedis::start();
    let backends = common::backends(pool.clone(), &redis.url()).await;
    stock(&backends.engine, "DROP-004", 1234).await;
    let server = common::spawn(backends).await;

    let signed_out = page(&server, None).await;
    assert!(!signed_out.contains("Winter Launch Drop"));
    assert!(
        signed_out.contains("Sign in to Holdfast"),
        "{}",
        &signed_out[signed_out.len().saturating_sub(1500)..]
    );

    let cookie = sign_in(&server, &pool).await;
    let html = page(&server, Some(&cookie)).await;
    assert!(html.contains("Winter Launch Drop"), "drop name rendered");
    for sku in [
        "DROP-001", "DROP-002", "DROP-003", "DROP-004", "DROP-005", "DROP-006",
    ] {
        assert!(html.contains(sku), "{sku} rendered on the server");
    }
    assert!(html.contains("1,234"), "figures come from Redis");
    assert!(html.contains("not warmed"), "SKUs without counters say so");
    assert!(
        html.contains("/pkg/holdfast.js"),
        "the hydration script is linked"
    );
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn the_overview_explains_an_empty_catalogue(pool: PgPool) {
    let redis = TestRedis::start();
    let server = common::spawn(common::backends(pool.clone(), &redis.url()).await).await;
    let cookie = sign_in(&server, &pool).await;
    let html = page(&server, Some(&cookie)).await;
    assert!(html.contains("No drop is loaded yet"), "{html}");
}
