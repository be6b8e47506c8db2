//! The overview is rendered on the server with the drop's SKUs and live figures,
//! for signed-in users only.

mod common;

use holdfast_engine::catalog;
use holdfast_engine::testkit::{TestRedis, stock};
use holdfast_engine::users::{self, Role};
use sqlx::PgPool;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

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

/// Pages keep answering while another server of the same process builds its
/// router, as the tests do with many servers to a process. Listing the pages'
/// routes holds back every resource of the process while it runs, so it is done
/// once: before, a page whose resource was first polled meanwhile never
/// answered (a test's page once took the whole 15 s request timeout).
#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn pages_answer_while_another_server_builds_its_router(pool: PgPool) {
    let redis = TestRedis::start();
    let backends = common::backends(pool.clone(), &redis.url()).await;
    let server = common::spawn(backends.clone()).await;
    let other = common::state(
        backends,
        holdfast_server::state::StateOptions::default(),
        "127.0.0.1:0".parse().unwrap(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let building = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let _in_runtime = runtime.enter();
            let until = Instant::now() + Duration::from_secs(60);
            let mut built = 0u32;
            while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                drop(holdfast_server::startup::router(other.clone()));
                built += 1;
            }
            built
        })
    };
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    for i in 0..100 {
        let answer = async {
            let res = client.get(server.url("/login")).send().await?;
            Ok::<_, reqwest::Error>((res.status(), res.text().await?))
        };
        let (status, body) = answer
            .await
            .unwrap_or_else(|e| panic!("page {i} did not answer within 5 s: {e}"));
        assert_eq!(status, 200, "page {i}");
        assert!(body.contains("Sign in to Holdfast"), "page {i}: {body}");
    }
    stop.store(true, Ordering::Relaxed);
    assert!(
        building.join().unwrap() > 0,
        "routers were built while the pages were asked for"
    );
}
