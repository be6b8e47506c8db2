//! Shopper badges: live updates over the public WebSocket, the polling fallback
//! with ETags, the Origin allow-list and the limits.

mod common;

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use holdfast_engine::testkit::{TestRedis, stock};
use holdfast_engine::{ReleaseOutcome, ReserveRequest};
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest};

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connect(base: &str, origin: Option<&str>) -> Result<Socket, u16> {
    let mut req = format!("{}/public/ws", base.replace("http://", "ws://"))
        .into_client_request()
        .unwrap();
    if let Some(o) = origin {
        req.headers_mut().insert("origin", o.parse().unwrap());
    }
    match tokio_tungstenite::connect_async(req).await {
        Ok((ws, _)) => Ok(ws),
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
            if r.status().is_server_error() {
                eprintln!(
                    "handshake failed: {:?}",
                    r.body()
                        .as_ref()
                        .map(|b| String::from_utf8_lossy(b).into_owned())
                );
            }
            Err(r.status().as_u16())
        }
        Err(e) => panic!("{e}"),
    }
}

async fn next(ws: &mut Socket) -> Value {
    let msg = tokio::time::timeout(Duration::from_secs(2), ws.next())
        .await
        .expect("a message within 2 s");
    match msg.unwrap().unwrap() {
        Message::Text(t) => serde_json::from_str(&t).unwrap(),
        other => panic!("{other:?}"),
    }
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_badge_follows_the_stock_live(pool: PgPool) {
    holdfast_engine::catalog::load_demo_drop(&pool)
        .await
        .unwrap();
    let redis = TestRedis::start();
    let backends = common::backends(pool, &redis.url()).await;
    let engine = backends.engine.clone();
    stock(&engine, "DROP-006", 12).await;
    let server = common::spawn_live(backends, &redis.url()).await;

    let mut ws = connect(&server.base, None).await.unwrap();
    ws.send(Message::Text(
        json!({"subscribe": ["DROP-006", "DROP-001"]})
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    let mut first = [next(&mut ws).await, next(&mut ws).await];
    first.sort_by_key(|b| b["sku"].as_str().unwrap().to_owned());
    assert_eq!(
        first[0],
        json!({"sku": "DROP-001", "state": "unknown"}),
        "not warmed: no false 'sold out'"
    );
    assert_eq!(first[1], json!({"sku": "DROP-006", "state": "in_stock"}));

    engine
        .reserve(&ReserveRequest::single("b-1", "DROP-006", 9).with_ttl_ms(60_000))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // The demo's per-order maximum is 10 and its threshold for DROP-006 is 5.
    assert_eq!(
        next(&mut ws).await,
        json!({"sku": "DROP-006", "state": "low", "left": 3})
    );
    engine
        .reserve(&ReserveRequest::single("b-2", "DROP-006", 3))
        .await
        .unwrap();
    assert_eq!(
        next(&mut ws).await,
        json!({"sku": "DROP-006", "state": "sold_out"})
    );
    assert_eq!(
        engine.release("b-2").await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(
        next(&mut ws).await,
        json!({"sku": "DROP-006", "state": "low", "left": 3}),
        "back in stock"
    );
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn polling_is_cacheable_and_origins_and_limits_hold(pool: PgPool) {
    let redis = TestRedis::start();
    let backends = common::backends(pool, &redis.url()).await;
    stock(&backends.engine, "P-1", 100).await;
    let server = common::spawn_live(backends, &redis.url()).await;
    let http = reqwest::Client::new();

    let res = http
        .get(server.url("/public/stock?skus=P-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["cache-control"], "public, max-age=1");
    assert!(res.headers().get("set-cookie").is_none(), "no cookies");
    let etag = res.headers()["etag"].to_str().unwrap().to_owned();
    assert_eq!(
        res.json::<Value>().await.unwrap(),
        json!([{"sku": "P-1", "state": "in_stock"}])
    );
    let again = http
        .get(server.url("/public/stock?skus=P-1"))
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 304, "unchanged: not modified");
    let many = (0..21)
        .map(|i| format!("S-{i}"))
        .collect::<Vec<_>>()
        .join(",");
    assert_eq!(
        http.get(server.url(&format!("/public/stock?skus={many}")))
            .send()
            .await
            .unwrap()
            .status(),
        422
    );

    // A page from another site is refused; the server's own pages are not.
    assert_eq!(
        connect(&server.base, Some("https://evil.example"))
            .await
            .err(),
        Some(403)
    );
    let own = server.base.clone();
    let same_origin = connect(&server.base, Some(&own)).await;
    assert!(same_origin.is_ok());
    drop(same_origin);

    // Too many subscriptions on one connection are refused with a reason.
    let mut ws = connect(&server.base, None).await.unwrap();
    let skus: Vec<String> = (0..21).map(|i| format!("S-{i}")).collect();
    ws.send(Message::Text(json!({"subscribe": skus}).to_string().into()))
        .await
        .unwrap();
    assert!(
        next(&mut ws).await["error"]
            .as_str()
            .unwrap()
            .contains("at most 20")
    );

    // Connections per client address are limited (50 by default). `ws` is open;
    // give the server a moment to count the closed same-origin connection out.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut open = Vec::new();
    for _ in 0..49 {
        open.push(connect(&server.base, None).await.unwrap());
    }
    assert_eq!(
        connect(&server.base, None).await.err(),
        Some(429),
        "the 51st from one address"
    );
    drop(open);
}
