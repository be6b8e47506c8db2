//! Every limit is a setting: a server built from `holdfast serve`'s own flags
//! with non-default limits applies each of them, seen from outside over HTTP
//! and WebSocket (issue: hardening).
//!
//! One test in its own binary: how many passwords are hashed at once is fixed
//! per process at the first hash.

mod common;

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use holdfast_engine::testkit::TestRedis;
use holdfast_engine::tokens::{self, Scope};
use holdfast_engine::users::{self, Role};
use holdfast_server::routes::ingest::sign;
use sqlx::PgPool;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const SECRET: &str = "settings-secret-0123456789";
const PASSWORD: &str = "correct horse battery";

async fn ws_status(req: tokio_tungstenite::tungstenite::handshake::client::Request) -> u16 {
    match tokio_tungstenite::connect_async(req).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => r.status().as_u16(),
        Ok(_) => 101,
        Err(e) => panic!("{e}"),
    }
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn every_limit_setting_takes_effect(pool: PgPool) {
    let redis = TestRedis::start();
    users::create(&pool, "admin", Role::Admin, PASSWORD, false)
        .await
        .unwrap();
    let token = tokens::create(&pool, "shop", &[Scope::Checkout, Scope::Read])
        .await
        .unwrap()
        .secret;
    let db = holdfast_engine::testkit::pg_url(&pool.connect_options());
    let app = common::application(&[
        "--redis-url",
        &redis.url(),
        "--database-url",
        &db,
        "--listen",
        "127.0.0.1:0",
        "--ingest-source",
        &format!("erp=feeds:{SECRET}"),
        "--api-max-body-bytes",
        "2048",
        "--api-deadline-ms",
        "400",
        "--unknown-tokens-per-second",
        "1",
        "--live-handshakes-per-second",
        "1",
        "--live-max-message-bytes",
        "512",
        "--badge-max-message-bytes",
        "512",
        "--badge-subscribe-burst",
        "1",
        "--badge-subscribes-per-second",
        "1",
        "--password-hashes-at-once",
        "1",
        "--webhook-max-events",
        "2",
    ])
    .await;
    let base = format!("http://{}", app.addr());
    let ws_base = base.replace("http://", "ws://");
    tokio::spawn(app.run_until(std::future::pending()));
    let http = reqwest::Client::new();

    // API body: 413 above 2 KiB, read (and refused on its content) below.
    let post = |len: usize| {
        http.post(format!("{base}/api/v1/reservations"))
            .bearer_auth(&token)
            .header("idempotency-key", format!("k-{len}"))
            .header("content-type", "application/json")
            .body(format!(r#"{{"pad":"{}"}}"#, "x".repeat(len)))
            .send()
    };
    assert_eq!(post(3_000).await.unwrap().status().as_u16(), 413);
    assert_ne!(post(1_500).await.unwrap().status().as_u16(), 413);

    // API deadline: with Redis paused, the answer is 503 after about 400 ms.
    let stock = || {
        http.get(format!("{base}/api/v1/stock/SET-1"))
            .bearer_auth(&token)
            .send()
    };
    let code = |v: serde_json::Value| v["code"].as_str().unwrap_or_default().to_owned();
    let before = stock().await.unwrap().json().await.unwrap();
    assert_ne!(code(before), "unavailable");
    let mut admin = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1_500)
        .arg("ALL")
        .query_async(&mut admin)
        .await
        .unwrap();
    let started = Instant::now();
    let paused = stock().await.unwrap();
    let took = started.elapsed();
    assert_eq!(paused.status().as_u16(), 503);
    assert_eq!(code(paused.json().await.unwrap()), "unavailable");
    assert!(
        took >= Duration::from_millis(350) && took < Duration::from_millis(2_000),
        "answered after {took:?}, not at the 400 ms deadline"
    );
    // The pause ends on its own (the pausing connection is paused too).
    let resumed = Instant::now() + Duration::from_secs(10);
    while redis::cmd("PING")
        .query_async::<String>(&mut admin)
        .await
        .is_err()
    {
        assert!(Instant::now() < resumed, "Redis never resumed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Invented tokens: one check per second per address (bursts of two).
    let mut statuses = Vec::new();
    for i in 0..6 {
        let res = http
            .get(format!("{base}/api/v1/stock/SET-1"))
            .bearer_auth(format!("hf_{i:064x}"))
            .send()
            .await
            .unwrap();
        statuses.push(res.status().as_u16());
    }
    assert!(statuses.contains(&429), "{statuses:?}");
    assert!(statuses.contains(&401), "{statuses:?}");

    // Dashboard handshakes: one per second per address (bursts of two).
    let live_request = |cookie: &str| {
        let mut req = format!("{ws_base}/live").into_client_request().unwrap();
        req.headers_mut().insert("origin", base.parse().unwrap());
        req.headers_mut().insert(
            "cookie",
            format!("holdfast_session={cookie}").parse().unwrap(),
        );
        req
    };
    let mut statuses = Vec::new();
    for i in 0..6u32 {
        statuses.push(ws_status(live_request(&format!("{i:064x}"))).await);
    }
    assert!(statuses.contains(&429), "{statuses:?}");

    // Passwords hashed at once: one, so a burst of sign-ins is partly refused.
    let attempts = (0..10).map(|i| {
        let http = http.clone();
        let base = base.clone();
        async move {
            http.post(format!("{base}/api/login"))
                .header("origin", &base)
                .header("content-type", "application/x-www-form-urlencoded")
                .body(format!("username=ghost-{i}&password=not-the-password"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    });
    let statuses = futures_util::future::join_all(attempts).await;
    assert!(statuses.contains(&429), "{statuses:?}");

    // The dashboard socket refuses a message over 512 bytes. The handshake
    // allowance refills at one a second.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let res = http
        .post(format!("{base}/api/login"))
        .header("origin", &base)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("username=admin&password={PASSWORD}"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let session = res
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find_map(|c| {
            c.split(';')
                .next()
                .and_then(|p| p.strip_prefix("holdfast_session="))
                .map(str::to_owned)
        })
        .expect("a session cookie");
    let (mut tab, _) = tokio_tungstenite::connect_async(live_request(&session))
        .await
        .unwrap();
    let small = r#"{"type":"watch","sku":null}"#;
    tab.send(Message::Text(small.into())).await.unwrap();
    tab.send(Message::Text("x".repeat(1_024).into()))
        .await
        .unwrap();
    assert!(common::closes_within(&mut tab, Duration::from_secs(3)).await);

    // Badge sockets: messages over 512 bytes close it; a second subscribe
    // within the second is refused.
    let badge = || async {
        let req = format!("{ws_base}/public/ws")
            .into_client_request()
            .unwrap();
        tokio_tungstenite::connect_async(req).await.unwrap().0
    };
    let mut ws = badge().await;
    let big = format!(r#"{{"subscribe": ["{}"]}}"#, "A".repeat(1_024));
    ws.send(Message::Text(big.into())).await.unwrap();
    assert!(common::closes_within(&mut ws, Duration::from_secs(3)).await);
    let mut ws = badge().await;
    for _ in 0..2 {
        ws.send(Message::Text(r#"{"subscribe": ["SET-1"]}"#.into()))
            .await
            .unwrap();
    }
    let paced = tokio::time::timeout(Duration::from_secs(3), async {
        while let Some(Ok(msg)) = ws.next().await {
            if let Message::Text(t) = msg
                && t.contains("subscribing too often")
            {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    assert!(paced, "the second subscribe within a second is refused");

    // Webhook events: a payload of three is dead-lettered whole.
    let body = serde_json::json!({"events": [
        {"event_id": "s1", "type": "delta", "sku": "SET-1", "delta": 1},
        {"event_id": "s2", "type": "delta", "sku": "SET-1", "delta": 1},
        {"event_id": "s3", "type": "delta", "sku": "SET-1", "delta": 1},
    ]})
    .to_string()
    .into_bytes();
    let ts = chrono::Utc::now().timestamp();
    let res = http
        .post(format!("{base}/ingest/erp"))
        .header("X-Holdfast-Timestamp", ts.to_string())
        .header("X-Holdfast-Signature", sign(SECRET, ts, &body))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 202);
    let mut conn = holdfast_engine::redis_conn::connect(&redis.url())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let letters = loop {
        let letters = holdfast_engine::ingest::dead_letters(&mut conn, 5)
            .await
            .unwrap();
        if !letters.is_empty() || Instant::now() > deadline {
            break letters;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert!(
        letters[0].reason.contains("at most 2"),
        "{}",
        letters[0].reason
    );
}
