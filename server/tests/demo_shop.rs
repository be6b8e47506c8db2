//! The demo shop's buy path: hold, pay, release through the demo backend, only
//! when the server runs the demo, only from its own page, and never on holds
//! the checkout API made.

mod common;

use holdfast_engine::ReserveRequest;
use holdfast_engine::testkit::{TestRedis, stock};
use holdfast_server::state::StateOptions;
use serde_json::{Value, json};
use sqlx::PgPool;

async fn shop(
    pool: PgPool,
    sells: bool,
) -> (common::TestServer, TestRedis, holdfast_engine::Backends) {
    holdfast_engine::catalog::load_demo_drop(&pool)
        .await
        .unwrap();
    let redis = TestRedis::start();
    let backends = common::backends(pool, &redis.url()).await;
    stock(&backends.engine, "DROP-004", 3).await;
    let options = StateOptions {
        demo_shop_sells: sells,
        ..StateOptions::default()
    };
    let server = common::spawn_with(backends.clone(), options, None).await;
    (server, redis, backends)
}

async fn post(
    server: &common::TestServer,
    path: &str,
    body: Value,
    origin: Option<&str>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new().post(server.url(path)).json(&body);
    if let Some(o) = origin {
        req = req.header("origin", o);
    }
    let res = req.send().await.unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_shopper_holds_pays_and_releases_through_the_demo_shop(pool: PgPool) {
    let (server, _redis, backends) = shop(pool, true).await;
    let own = Some(server.base.as_str());
    let page = reqwest::get(server.url("/demo/shop"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains(r#"class="hold" data-sku="DROP-004""#),
        "{page}"
    );
    assert!(page.contains("/demo-shop.js"));

    // Hold: 201 with the hold's deadline (two minutes away).
    let hold = json!({"sku": "DROP-004", "shopper": "tab1"});
    let (status, held) = post(&server, "/demo/shop/hold", hold.clone(), own).await;
    assert_eq!(status, 201, "{held}");
    assert_eq!(held["outcome"], "reserved");
    let id = held["reservation_id"].as_str().unwrap().to_owned();
    let left = held["expires_at_ms"].as_i64().unwrap() - chrono::Utc::now().timestamp_millis();
    assert!((100_000..=125_000).contains(&left), "{left} ms left");
    let f = backends.engine.figures("DROP-004").await.unwrap().unwrap();
    assert_eq!((f.available, f.reserved), (2, 1));

    // Pay: the unit is sold.
    let (status, paid) = post(
        &server,
        "/demo/shop/pay",
        json!({"reservation_id": id}),
        own,
    )
    .await;
    assert_eq!(status, 200, "{paid}");
    let f = backends.engine.figures("DROP-004").await.unwrap().unwrap();
    assert_eq!((f.available, f.reserved, f.sold), (2, 0, 1));

    // Release another: the unit is back on sale.
    let (_, held) = post(&server, "/demo/shop/hold", hold.clone(), own).await;
    let other = held["reservation_id"].as_str().unwrap().to_owned();
    let (status, _) = post(
        &server,
        "/demo/shop/release",
        json!({"reservation_id": other}),
        own,
    )
    .await;
    assert_eq!(status, 200);
    let f = backends.engine.figures("DROP-004").await.unwrap().unwrap();
    assert_eq!((f.available, f.reserved), (2, 0));

    // Sold out is said as such.
    for _ in 0..2 {
        post(
            &server,
            "/demo/shop/hold",
            json!({"sku": "DROP-004", "shopper": "tab2"}),
            own,
        )
        .await;
    }
    let (status, refused) = post(&server, "/demo/shop/hold", hold, own).await;
    assert_eq!(status, 409);
    assert_eq!(refused["outcome"], "sold_out");
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn the_demo_shop_cannot_be_used_against_real_stock(pool: PgPool) {
    let (server, _redis, backends) = shop(pool.clone(), true).await;
    let own = Some(server.base.as_str());
    // A hold the checkout API made (not a demo hold) cannot be paid or released here.
    backends
        .engine
        .reserve(&ReserveRequest::single("t1-order-9", "DROP-004", 1))
        .await
        .unwrap();
    for path in ["/demo/shop/pay", "/demo/shop/release"] {
        let (status, _) = post(&server, path, json!({"reservation_id": "t1-order-9"}), own).await;
        assert_eq!(status, 404, "{path}");
    }
    assert_eq!(
        backends
            .engine
            .figures("DROP-004")
            .await
            .unwrap()
            .unwrap()
            .reserved,
        1
    );
    // Another site's page cannot hold.
    let hold = json!({"sku": "DROP-004", "shopper": "x"});
    for origin in [Some("https://evil.example"), None] {
        let (status, _) = post(&server, "/demo/shop/hold", hold.clone(), origin).await;
        assert_eq!(status, 403, "{origin:?}");
    }

    // Without the demo, the page only shows badges and the backend is not there.
    let (plain, _redis2, _b) = shop_again(pool).await;
    let page = reqwest::get(plain.url("/demo/shop"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!page.contains("Add to cart"));
    let (status, _) = post(&plain, "/demo/shop/hold", hold, Some(plain.base.as_str())).await;
    assert_eq!(status, 404);
}

/// A second server over the same database, not running the demo.
async fn shop_again(pool: PgPool) -> (common::TestServer, TestRedis, holdfast_engine::Backends) {
    let redis = TestRedis::start();
    let backends = common::backends(pool, &redis.url()).await;
    let server = common::spawn_with(backends.clone(), StateOptions::default(), None).await;
    (server, redis, backends)
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn the_demo_shop_sells_only_the_demo_drop_one_shopper_per_address(pool: PgPool) {
    let (server, _redis, backends) = shop(pool, true).await;
    let own = Some(server.base.as_str());
    // A warmed SKU outside the demo drop is not for sale here.
    stock(&backends.engine, "REAL-1", 5).await;
    let (status, _) = post(&server, "/demo/shop/hold", json!({"sku": "REAL-1"}), own).await;
    assert_eq!(status, 404);
    assert_eq!(
        backends
            .engine
            .figures("REAL-1")
            .await
            .unwrap()
            .unwrap()
            .reserved,
        0
    );
    // DROP-005 allows one per buyer: a new "shopper" name does not make a new buyer.
    holdfast_engine::testkit::stock_with_limit(&backends.engine, "DROP-005", 5, 1).await;
    let mut outcomes = Vec::new();
    for shopper in ["a", "b", "c"] {
        let (_, v) = post(
            &server,
            "/demo/shop/hold",
            json!({"sku": "DROP-005", "shopper": shopper}),
            own,
        )
        .await;
        outcomes.push(v["outcome"].as_str().unwrap_or_default().to_owned());
    }
    assert_eq!(outcomes, ["reserved", "limit_exceeded", "limit_exceeded"]);
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn purchases_are_paced_per_address(pool: PgPool) {
    let (server, _redis, backends) = shop(pool, true).await;
    let own = Some(server.base.as_str());
    stock(&backends.engine, "DROP-006", 20).await;
    let mut statuses = Vec::new();
    for _ in 0..8 {
        let (_, held) = post(&server, "/demo/shop/hold", json!({"sku": "DROP-006"}), own).await;
        let id = held["reservation_id"].as_str().unwrap().to_owned();
        let (status, _) = post(
            &server,
            "/demo/shop/pay",
            json!({"reservation_id": id}),
            own,
        )
        .await;
        statuses.push(status);
        // Within the calls-per-second pace.
        tokio::time::sleep(std::time::Duration::from_millis(450)).await;
    }
    assert_eq!(&statuses[..6], &[200; 6], "{statuses:?}");
    assert!(statuses[6..].iter().all(|s| *s == 429), "{statuses:?}");
    assert_eq!(
        backends
            .engine
            .figures("DROP-006")
            .await
            .unwrap()
            .unwrap()
            .sold,
        6
    );
}
