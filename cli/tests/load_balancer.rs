//! `docs/deploy/haproxy.cfg`, run as it is (only its `bind` and `server`
//! addresses and its `maxconn` replaced) in front of two `holdfast serve` processes: checkout and
//! a badge's WebSocket work through it, and when one server is killed mid-sale
//! every sale goes through (requests that hit the dead server are retried on
//! the other by HAProxy, safely: each carries an Idempotency-Key; a client
//! connection HAProxy closes as it marks the server down is sent again with
//! the same key, as a checkout does), the dead server is
//! taken out by its `/readyz/checkout` check, a PostgreSQL outage takes no
//! server out (checkout goes on), and every paid hold is recorded once.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use holdfast_engine::testkit::{TestPostgres, TestRedis, free_port};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

/// HAProxy with the documented configuration, listening on `port` and sending
/// to `servers` (`host:port`). Killed when dropped.
struct Haproxy {
    child: Child,
    /// Holds the configuration file for as long as HAProxy runs.
    _dir: tempfile::TempDir,
}

impl Haproxy {
    fn start(port: u16, servers: &[String]) -> Self {
        let documented = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/deploy/haproxy.cfg"
        ))
        .unwrap();
        let mut config = String::new();
        let mut replaced = (false, false);
        for line in documented.lines() {
            let trimmed = line.trim_start();
            if trimmed.starts_with("maxconn ") {
                config.push_str("    maxconn 2000\n");
            } else if trimmed.starts_with("bind ") {
                config.push_str(&format!("    bind 127.0.0.1:{port}\n"));
                replaced.0 = true;
            } else if trimmed.starts_with("server ") {
                if !replaced.1 {
                    for (i, s) in servers.iter().enumerate() {
                        config.push_str(&format!("    server holdfast{} {s} check\n", i + 1));
                    }
                    replaced.1 = true;
                }
            } else {
                config.push_str(line);
                config.push('\n');
            }
        }
        assert_eq!(
            replaced,
            (true, true),
            "the example has a bind and server lines"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("haproxy.cfg");
        std::fs::write(&path, config).unwrap();
        let haproxy = if std::path::Path::new("/usr/sbin/haproxy").exists() {
            "/usr/sbin/haproxy"
        } else {
            "haproxy"
        };
        let check = Command::new(haproxy)
            .arg("-c")
            .arg("-f")
            .arg(&path)
            .output()
            .expect("run haproxy (scripts/test.sh installs it)");
        assert!(
            check.status.success(),
            "haproxy rejects the example: {}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
        let child = Command::new(haproxy)
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Self { child, _dir: dir }
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn the_documented_haproxy_keeps_a_sale_going_when_a_server_dies() {
    let redis = TestRedis::start();
    let mut pg_server = TestPostgres::start();
    let db = pg_server.url("holdfast");
    let (pg, token) = common::demo_with_token(&redis.url(), &db).await;
    let env = [
        ("HOLDFAST_TRUSTED_PROXIES", "127.0.0.1/32"),
        ("HOLDFAST_TAKEOVER_AFTER_SECS", "2"),
        ("HOLDFAST_RECONCILE_EVERY_SECS", "0"),
        ("HOLDFAST_VERIFY_EVERY_SECS", "0"),
    ];
    let first = common::serve(&redis, &db, &env);
    let second = common::serve(&redis, &db, &env);
    let servers: Vec<String> = [&first.1, &second.1]
        .iter()
        .map(|u| u.trim_start_matches("http://").to_owned())
        .collect();
    let mut first = common::KillOnDrop(first.0);
    let _second = common::KillOnDrop(second.0);
    let port = free_port();
    let _haproxy = Haproxy::start(port, &servers);
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !http
        .get(format!("{base}/readyz"))
        .send()
        .await
        .is_ok_and(|r| r.status() == 200)
    {
        assert!(Instant::now() < deadline, "HAProxy never passed a request");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A badge through the proxy (a WebSocket upgrade) follows sales.
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://127.0.0.1:{port}/public/ws"))
        .await
        .expect("a WebSocket through HAProxy");
    ws.send(Message::Text(
        json!({"subscribe": ["DROP-001"]}).to_string().into(),
    ))
    .await
    .unwrap();
    let mut next = async || match tokio::time::timeout(Duration::from_secs(2), ws.next()).await {
        Ok(Some(Ok(Message::Text(t)))) => serde_json::from_str::<Value>(&t).unwrap(),
        other => panic!("no badge message: {other:?}"),
    };
    assert_eq!(next().await["state"], "in_stock");

    // A sale through the proxy; the first server is killed halfway.
    let mut paid = 0_i64;
    for i in 0..300 {
        if i == 150 {
            first.kill();
        }
        sell_one(&http, &base, &token, &format!("lb-{i}")).await;
        paid += 1;
    }
    // The badge socket lived on the first or the second server; either way a
    // new one through the proxy works and shows the stock left.
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://127.0.0.1:{port}/public/ws"))
        .await
        .expect("a WebSocket through HAProxy after the kill");
    ws.send(Message::Text(
        json!({"subscribe": ["DROP-001"]}).to_string().into(),
    ))
    .await
    .unwrap();
    let answer = match tokio::time::timeout(Duration::from_secs(2), ws.next()).await {
        Ok(Some(Ok(Message::Text(t)))) => serde_json::from_str::<Value>(&t).unwrap(),
        other => panic!("no badge message after the kill: {other:?}"),
    };
    assert_eq!(answer["state"], "in_stock", "{answer}");

    // PostgreSQL, which both servers share, goes down: the proxy's check is
    // /readyz/checkout, so the server stays in rotation and shoppers can still
    // buy (their sales wait in Redis), while /readyz says recording is down.
    pg_server.stop();
    tokio::time::sleep(Duration::from_secs(3)).await;
    for i in 0..20 {
        sell_one(&http, &base, &token, &format!("lb-pg-down-{i}")).await;
        paid += 1;
    }
    let full = http.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(full.status(), 503, "/readyz says PostgreSQL is down");
    let sell = http
        .get(format!("{base}/readyz/checkout"))
        .send()
        .await
        .unwrap();
    assert_eq!(sell.status(), 200, "the server can still sell");
    pg_server.start_again();

    let recorded = common::recorded_units(&pg, "DROP-001", paid, Duration::from_secs(60)).await;
    assert_eq!(recorded, paid, "every paid hold recorded once");
    println!(
        "{paid} holds paid through HAProxy, 150 of them after a server was killed and 20 while \
         PostgreSQL was down, each answered as paid"
    );
    let (ok, out, err) = common::holdfast(&["verify"], &redis.url(), &db);
    assert!(ok, "verify:\n{out}{err}");
}

/// Sends the request `make` builds, again with the same Idempotency-Key when
/// the connection fails before an answer (as a checkout does: HAProxy closes
/// a client's connection when it marks the server behind it down, and a
/// request sent on it that instant never reaches a server, or its answer
/// never comes back); at most three tries.
async fn send_retrying(
    what: &str,
    make: impl Fn() -> reqwest::RequestBuilder,
) -> reqwest::Response {
    for attempt in 1..=3 {
        match make().send().await {
            Ok(res) => return res,
            Err(e) if attempt < 3 => {
                eprintln!("{what}: {e}; sent again with the same Idempotency-Key");
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
    unreachable!("three tries end in an answer or a panic")
}

/// Reserves one unit of DROP-001 and pays for it through the proxy, under
/// Idempotency-Key `key`; any other answer than 201 then 200 fails the test
/// (a request sent again after a lost answer gets the first one's).
async fn sell_one(http: &reqwest::Client, base: &str, token: &str, key: &str) {
    let held = send_retrying(&format!("reservation {key}"), || {
        http.post(format!("{base}/api/v1/reservations"))
            .bearer_auth(token)
            .header("Idempotency-Key", key)
            .json(&json!({ "sku": "DROP-001", "qty": 1, "buyer": key }))
    })
    .await;
    let status = held.status();
    let body: Value = held.json().await.unwrap_or(Value::Null);
    assert_eq!(status, 201, "reservation {key}: {body}");
    let id = body["id"].as_str().unwrap();
    let confirmed = send_retrying(&format!("payment {key}"), || {
        http.post(format!("{base}/api/v1/reservations/{id}/confirm"))
            .bearer_auth(token)
            .header("Idempotency-Key", format!("{key}-pay"))
    })
    .await;
    assert_eq!(confirmed.status(), 200, "payment {key}");
}
