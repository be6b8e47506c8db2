//! Untrusted input, generated: every parser an outsider can reach is fed
//! random and hostile values through the real server (API bodies and
//! `Idempotency-Key`s, webhook headers and bodies, badge messages, `Host` and
//! forwarding headers, session cookies), and must answer with a refusal, never
//! a 500, a panic or a dropped connection. The number of cases per parser is
//! `HOLDFAST_FUZZ_CASES` (default 300), so a CI run is bounded.

mod common;

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use holdfast_engine::testkit::{TestRedis, stock};
use holdfast_engine::tokens::{self, Scope};
use holdfast_server::routes::ingest::{IngestConfig, sign};
use holdfast_server::state::StateOptions;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use serde_json::Value;
use sqlx::PgPool;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const SECRET: &str = "fuzz-secret-0123456789";

fn cases() -> u32 {
    std::env::var("HOLDFAST_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

/// `n` values drawn from `strategy` (deterministic per strategy and run).
fn draw<S: Strategy>(strategy: S, n: u32) -> Vec<S::Value> {
    let mut runner = TestRunner::new(Config {
        cases: n,
        ..Config::default()
    });
    (0..n)
        .map(|_| strategy.new_tree(&mut runner).unwrap().current())
        .collect()
}

/// Any JSON value, nested a little, with the API's field names likely.
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        prop_oneof![Just(i64::MIN), Just(i64::MAX), Just(0), Just(-1), Just(1)]
            .prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "\\PC{0,40}".prop_map(Value::from),
        "[A-Z0-9-]{1,12}".prop_map(Value::from),
        "[\\x00-\\x1f\u{202e}\u{fffd}]{0,8}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            proptest::collection::btree_map(
                prop_oneof![
                    Just("sku".to_owned()),
                    Just("qty".to_owned()),
                    Just("lines".to_owned()),
                    Just("buyer".to_owned()),
                    Just("ttl_ms".to_owned()),
                    Just("skus".to_owned()),
                    "\\PC{0,8}",
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Statuses a refusal may have; 500 (and a dropped connection) never.
fn refusal(status: u16) -> bool {
    matches!(status, 200..=299 | 400..=499 | 503)
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn api_bodies_and_idempotency_keys_are_refused_cleanly(pool: PgPool) {
    let redis = TestRedis::start();
    let backends = common::backends(pool.clone(), &redis.url()).await;
    stock(&backends.engine, "FZ-1", 1_000_000).await;
    let server = common::spawn(backends).await;
    let token = tokens::create(&pool, "fuzz", &[Scope::Checkout, Scope::Read])
        .await
        .unwrap()
        .secret;
    let http = reqwest::Client::new();
    let bodies = draw(json(), cases());
    let raw = draw(proptest::collection::vec(any::<u8>(), 0..256), cases());
    let keys = draw("[\\x20-\\x7e]{0,300}", cases());
    for (i, ((body, raw), key)) in bodies.iter().zip(&raw).zip(&keys).enumerate() {
        for payload in [body.to_string().into_bytes(), raw.clone()] {
            let res = http
                .post(server.url("/api/v1/reservations"))
                .bearer_auth(&token)
                .header("Idempotency-Key", key.as_str())
                .header("content-type", "application/json")
                .body(payload.clone())
                .send()
                .await
                .unwrap_or_else(|e| panic!("case {i}: no answer for {body}: {e}"));
            let status = res.status().as_u16();
            assert!(
                refusal(status),
                "case {i}: {status} for {body} with key {key:?}"
            );
        }
        // Any id in a path.
        let res = http
            .post(server.url(&format!("/api/v1/reservations/{}/confirm", urlencode(key))))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        assert!(refusal(res.status().as_u16()), "case {i}: confirm {key:?}");
    }
    // Still serving, and stock is still consistent.
    let f = stock_of(&http, &server, &token).await;
    assert!(f["available"].as_i64().unwrap() >= 0, "{f}");
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

async fn stock_of(http: &reqwest::Client, server: &common::TestServer, token: &str) -> Value {
    http.get(server.url("/api/v1/stock/FZ-1"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn webhook_headers_and_bodies_are_refused_cleanly(pool: PgPool) {
    let redis = TestRedis::start();
    let backends = common::backends(pool, &redis.url()).await;
    let options = StateOptions {
        ingest: IngestConfig::parse(&[format!("erp=feeds:{SECRET}")]).unwrap(),
        ingest_rate: 0,
        ..StateOptions::default()
    };
    let server = common::spawn_with(backends, options, None).await;
    let http = reqwest::Client::new();
    let stamps = draw(
        prop_oneof![
            "[ -~]{0,30}",
            any::<i64>().prop_map(|n| n.to_string()),
            Just(i64::MIN.to_string()),
            Just("99999999999999999999999".to_owned()),
        ],
        cases(),
    );
    let signatures = draw("(sha256=)?[0-9a-fA-Fz]{0,80}", cases());
    let bodies = draw(json(), cases());
    let now = chrono::Utc::now().timestamp();
    for (i, ((ts, sig), body)) in stamps.iter().zip(&signatures).zip(&bodies).enumerate() {
        let bytes = body.to_string().into_bytes();
        let res = http
            .post(server.url("/ingest/erp"))
            .header("X-Holdfast-Timestamp", ts.as_str())
            .header("X-Holdfast-Signature", sig.as_str())
            .body(bytes.clone())
            .send()
            .await
            .unwrap_or_else(|e| panic!("case {i}: {e}"));
        let status = res.status().as_u16();
        assert!(
            matches!(status, 401 | 400 | 413 | 429),
            "case {i}: {status}"
        );
        // Correctly signed, any body: queued (the lane's consumer parses it).
        let res = http
            .post(server.url("/ingest/erp"))
            .header("X-Holdfast-Timestamp", now.to_string())
            .header("X-Holdfast-Signature", sign(SECRET, now, &bytes))
            .body(bytes)
            .send()
            .await
            .unwrap();
        assert!(refusal(res.status().as_u16()), "case {i}");
    }
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn badge_messages_hosts_and_cookies_are_refused_cleanly(pool: PgPool) {
    let redis = TestRedis::start();
    let backends = common::backends(pool, &redis.url()).await;
    stock(&backends.engine, "FZ-2", 10).await;
    let server = common::spawn_live(backends, &redis.url()).await;
    let http = reqwest::Client::new();
    // Badge socket messages: answered or ignored, the socket and server stay.
    let messages = draw(
        prop_oneof![
            json().prop_map(|v| v.to_string()),
            json().prop_map(|v| serde_json::json!({ "subscribe": v }).to_string()),
            "\\PC{0,200}",
        ],
        cases(),
    );
    let req = format!("{}/public/ws", server.base.replace("http://", "ws://"))
        .into_client_request()
        .unwrap();
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    for (i, m) in messages.iter().enumerate() {
        if ws.send(Message::Text(m.clone().into())).await.is_err() {
            panic!("case {i}: the socket closed on {m:?}");
        }
    }
    // Drain what came back for a moment; nothing may be a close.
    let _ = tokio::time::timeout(Duration::from_millis(500), async {
        while let Some(Ok(msg)) = ws.next().await {
            assert!(!matches!(msg, Message::Close(_)), "closed: {msg:?}");
        }
    })
    .await;
    // Polls with any SKU list.
    let lists = draw("[ -~]{0,120}", cases());
    for (i, list) in lists.iter().enumerate() {
        let res = http
            .get(server.url(&format!("/public/stock?skus={}", urlencode(list))))
            .header("x-forwarded-for", format!("10.0.{}.{}", i / 250, i % 250))
            .send()
            .await
            .unwrap();
        assert!(refusal(res.status().as_u16()), "case {i}: {list:?}");
    }
    // Any Host, forwarding and cookie header: refused or served, never a 500.
    let hosts = draw("[ -~]{0,60}", cases());
    let cookies = draw("[ -~]{0,200}", cases());
    for (i, (host, cookie)) in hosts.iter().zip(&cookies).enumerate() {
        let Ok(res) = http
            .post(server.url("/api/current_user"))
            .header("host", host.as_str())
            .header("forwarded", host.as_str())
            .header("x-forwarded-for", cookie.as_str())
            .header("cookie", cookie.as_str())
            .header("origin", server.base.as_str())
            .send()
            .await
        else {
            // reqwest refuses to send some header values itself: nothing reached the server.
            continue;
        };
        let status = res.status().as_u16();
        assert!(
            refusal(status) || status == 421,
            "case {i}: {status} for Host {host:?}"
        );
    }
    assert!(common::healthy(&server).await);
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn server_function_arguments_are_refused_as_the_callers_fault(pool: PgPool) {
    let redis = TestRedis::start();
    let backends = common::backends(pool, &redis.url()).await;
    let server = common::spawn(backends).await;
    let http = reqwest::Client::new();
    let bodies = draw("[ -~]{0,80}", cases());
    let endpoints = [
        "/api/login",
        "/api/change_password",
        "/api/create_user",
        "/api/set_user_role",
        "/api/manual_reserve",
        "/api/search_holds",
        "/api/set_lane_paused",
    ];
    for (i, body) in bodies.iter().enumerate() {
        let endpoint = endpoints[i % endpoints.len()];
        for content_type in ["application/x-www-form-urlencoded", "application/json"] {
            let res = http
                .post(server.url(endpoint))
                .header("origin", server.base.as_str())
                .header("content-type", content_type)
                .body(body.clone())
                .send()
                .await
                .unwrap();
            let status = res.status().as_u16();
            assert!(
                refusal(status),
                "case {i}: {endpoint} {status} for {body:?}"
            );
        }
    }
    // Missing arguments and an oversized body, exactly.
    let res = http
        .post(server.url("/api/change_password"))
        .header("origin", server.base.as_str())
        .header("content-type", "application/x-www-form-urlencoded")
        .body("new_password=x&repeat=x")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    let res = http
        .post(server.url("/api/login"))
        .header("origin", server.base.as_str())
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!(
            "username=a&password={}",
            "x".repeat(3 * 1024 * 1024)
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 413);
}
