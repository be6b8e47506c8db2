//! Hostile input on the open endpoints: numbers chosen to overflow, and frames
//! larger than any legitimate client sends (issue: hardening).

mod common;

use futures_util::SinkExt;
use holdfast_engine::testkit::TestRedis;
use holdfast_server::routes::ingest::{IngestConfig, sign};
use holdfast_server::state::StateOptions;
use reqwest::StatusCode;
use sqlx::PgPool;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const SECRET: &str = "hostile-secret-0123456789";

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn overflowing_numbers_are_refused_not_panicked_on(pool: PgPool) {
    let redis = TestRedis::start();
    let backends = common::backends(pool, &redis.url()).await;
    let options = StateOptions {
        ingest: IngestConfig::parse(&[format!("erp=feeds:{SECRET}")]).unwrap(),
        ..StateOptions::default()
    };
    let server = common::spawn_with(backends, options, None).await;
    let http = reqwest::Client::new();
    let body = br#"{"event_id":"e","type":"delta","sku":"X-1","delta":1}"#;
    let ts = i64::MIN;
    let res = http
        .post(server.url("/ingest/erp"))
        .header("X-Holdfast-Timestamp", ts.to_string())
        .header("X-Holdfast-Signature", sign(SECRET, ts, body))
        .body(body.to_vec())
        .send()
        .await
        .expect("an answer, not a dropped connection");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let v: serde_json::Value = res.json().await.unwrap();
    assert_eq!(v["code"], "stale_timestamp");

    // A delta of i64::MIN is invalid, not a panic of the parser.
    let bad = format!(
        r#"{{"event_id":"m","type":"delta","sku":"X-1","delta":{}}}"#,
        i64::MIN
    );
    assert!(holdfast_engine::payload::parse(bad.as_bytes()).is_err());
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_frame_larger_than_the_limit_closes_the_badge_socket(pool: PgPool) {
    let redis = TestRedis::start();
    let backends = common::backends(pool, &redis.url()).await;
    let server = common::spawn_live(backends, &redis.url()).await;
    let req = format!("{}/public/ws", server.base.replace("http://", "ws://"))
        .into_client_request()
        .unwrap();
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    // 64 KiB in one frame: far over the 4 KiB a subscription can need.
    let big = format!(r#"{{"subscribe": ["{}"]}}"#, "A".repeat(64 * 1024));
    let _ = ws.send(Message::Text(big.into())).await;
    let closed = tokio::time::timeout(std::time::Duration::from_secs(3), async {
        use futures_util::StreamExt;
        loop {
            match ws.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return true,
                Some(Ok(_)) => {}
            }
        }
    })
    .await
    .unwrap_or(false);
    assert!(
        closed,
        "the server closes the socket instead of buffering the frame"
    );
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_burst_of_sign_ins_hashes_a_bounded_number_at_once(pool: PgPool) {
    let redis = TestRedis::start();
    let backends = common::backends(pool, &redis.url()).await;
    let server = common::spawn(backends).await;
    let http = reqwest::Client::new();
    let attempts = (0..24).map(|i| {
        let http = http.clone();
        let base = server.base.clone();
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
    assert!(
        statuses.iter().all(|s| *s == 401 || *s == 429),
        "{statuses:?}"
    );
    assert!(
        statuses.contains(&429),
        "more than four at once are refused, not queued: {statuses:?}"
    );
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn handshakes_cut_off_do_not_use_up_a_clients_badge_slots(pool: PgPool) {
    use tokio::io::AsyncWriteExt;
    let redis = TestRedis::start();
    let backends = common::backends(pool, &redis.url()).await;
    let server = common::spawn_live(backends, &redis.url()).await;
    let addr = server.base.trim_start_matches("http://").to_owned();
    // More cut-off handshakes than the 50 slots an address has.
    for _ in 0..60 {
        let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let req = format!(
            "GET /public/ws HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        );
        tcp.write_all(req.as_bytes()).await.unwrap();
        // Reset before the server's answer is read.
        #[allow(deprecated)] // SO_LINGER 0: a reset, exactly what is wanted here
        tcp.set_linger(Some(std::time::Duration::ZERO)).unwrap();
        drop(tcp);
    }
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let req = format!("{}/public/ws", server.base.replace("http://", "ws://"))
        .into_client_request()
        .unwrap();
    assert!(
        tokio_tungstenite::connect_async(req).await.is_ok(),
        "the address still has its slots"
    );
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn invented_tokens_are_refused_cheaply_and_cannot_flood_postgresql(pool: PgPool) {
    let redis = TestRedis::start();
    let backends = common::backends(pool.clone(), &redis.url()).await;
    let server = common::spawn(backends).await;
    let http = reqwest::Client::new();
    let real =
        holdfast_engine::tokens::create(&pool, "real", &[holdfast_engine::tokens::Scope::Read])
            .await
            .unwrap()
            .secret;
    let get = |token: String| {
        let http = http.clone();
        let url = server.url("/api/v1/stock/X-1");
        async move {
            http.get(url)
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    // Known once, remembered after.
    assert_eq!(
        get(real.clone()).await,
        503,
        "not warmed, but authenticated"
    );
    // Not a token's shape: refused without a lookup.
    assert_eq!(get("hf_nope".into()).await, 401);
    // 100 invented tokens of the right shape from one address.
    let mut statuses = Vec::new();
    for i in 0..100u32 {
        statuses.push(get(format!("hf_{:064x}", i)).await);
    }
    assert!(
        statuses.iter().all(|s| *s == 401 || *s == 429),
        "{statuses:?}"
    );
    let refused = statuses.iter().filter(|s| **s == 429).count();
    assert!(
        refused >= 50,
        "most were refused before PostgreSQL: {refused}"
    );
    assert_eq!(
        get(real).await,
        503,
        "a known token is not held up by the flood"
    );
}
