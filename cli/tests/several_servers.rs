//! Several `holdfast serve` processes on one Redis and one PostgreSQL behave as
//! one: they start together on an empty database, a badge on one server follows
//! sales made on another within a second, a sold-out answer remembered by one
//! server is forgotten when stock returns through another, a rehearsal spread
//! over all of them (each shopper's retry and payment on another server than
//! its reservation) passes every truth check, when one server dies with
//! sales it had read but not recorded, the others record them, each once, and
//! a server frozen in the middle of a PostgreSQL transaction does not stop the
//! others from recording.

mod common;

use std::io::BufReader;
use std::process::ChildStdout;
use std::time::{Duration, Instant};

use clap::Parser;
use futures_util::{SinkExt, StreamExt};
use holdfast_cli::config::Cli;
use holdfast_engine::testkit::{TestPostgres, TestRedis, signal};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

/// One running server: the process, its base URL, what it printed, its output
/// (kept open).
type Server = (common::KillOnDrop, String, String, BufReader<ChildStdout>);

/// A WebSocket client.
type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Starts `n` servers at once on `redis` and `db`, with `extra` settings.
fn start_servers(n: usize, redis: &TestRedis, db: &str, extra: &[(&str, &str)]) -> Vec<Server> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|_| {
                s.spawn(|| {
                    let mut env = vec![
                        ("HOLDFAST_TAKEOVER_AFTER_SECS", "2"),
                        ("HOLDFAST_RECONCILE_EVERY_SECS", "0"),
                        ("HOLDFAST_VERIFY_EVERY_SECS", "0"),
                        ("HOLDFAST_REAPER_INTERVAL_MS", "100"),
                    ];
                    // Later settings win (the process sees the last one).
                    env.extend_from_slice(extra);
                    common::serve(redis, db, &env)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                let (child, url, printed, out) = h.join().unwrap();
                (common::KillOnDrop(child), url, printed, out)
            })
            .collect()
    })
}

/// The next badge message on `ws`, within `within`.
async fn badge(ws: &mut Socket, within: Duration) -> Value {
    match tokio::time::timeout(within, ws.next()).await {
        Ok(Some(Ok(Message::Text(t)))) => serde_json::from_str(&t).unwrap(),
        other => panic!("no badge message within {within:?}: {other:?}"),
    }
}

/// Reserves `qty` of `sku` on `base`: the status and the body.
async fn reserve(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    key: &str,
    sku: &str,
    qty: i64,
) -> (u16, Value) {
    let r = http
        .post(format!("{base}/api/v1/reservations"))
        .bearer_auth(token)
        .header("Idempotency-Key", key)
        .json(&json!({ "sku": sku, "qty": qty, "buyer": key, "ttl_ms": 60_000 }))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// Each write-behind consumer of process `pid` with entries pending, summed
/// over the shard streams.
async fn pending_on(conn: &mut holdfast_engine::RedisConn, pid: u32) -> u64 {
    let engine_keys = holdfast_engine::keys::Keyspace::default();
    let mut total = 0;
    for shard in 0..engine_keys.shards() {
        let consumers: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("XINFO")
            .arg("CONSUMERS")
            .arg(engine_keys.events(shard))
            .arg(holdfast_engine::record::GROUP)
            .query_async(conn)
            .await
            .unwrap_or_default();
        for fields in consumers {
            let name: String = fields
                .get("name")
                .and_then(|v| redis::from_redis_value_ref(v).ok())
                .unwrap_or_default();
            let pending: u64 = fields
                .get("pending")
                .and_then(|v| redis::from_redis_value_ref(v).ok())
                .unwrap_or(0);
            if name.contains(&format!("-{pid}-")) {
                total += pending;
            }
        }
    }
    total
}

#[tokio::test]
async fn three_servers_behave_as_one_and_survive_losing_one() {
    let redis = TestRedis::start();
    let pg_server = TestPostgres::start();
    let db = pg_server.url("holdfast");
    // All three create and migrate the empty database at the same moment.
    let mut servers = start_servers(3, &redis, &db, &[]);
    let bases: Vec<String> = servers.iter().map(|s| s.1.clone()).collect();
    let (pg, token) = common::demo_with_token(&redis.url(), &db).await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();

    // A badge on server 3 follows a sell-out on server 1 and a release on server 2.
    let (mut ws, _) =
        tokio_tungstenite::connect_async(format!("{}/public/ws", bases[2].replace("http", "ws")))
            .await
            .unwrap();
    ws.send(Message::Text(
        json!({"subscribe": ["DROP-006"]}).to_string().into(),
    ))
    .await
    .unwrap();
    assert_eq!(
        badge(&mut ws, Duration::from_secs(2)).await["state"],
        "in_stock"
    );
    let (status, first) = reserve(&http, &bases[0], &token, "pin-a", "DROP-006", 10).await;
    assert_eq!(status, 201, "{first}");
    assert_eq!(badge(&mut ws, Duration::from_secs(1)).await["left"], 2);
    let (status, _) = reserve(&http, &bases[0], &token, "pin-b", "DROP-006", 2).await;
    assert_eq!(status, 201);
    assert_eq!(
        badge(&mut ws, Duration::from_secs(1)).await["state"],
        "sold_out"
    );
    // Server 2 answers sold out (and may remember it)…
    let (status, body) = reserve(&http, &bases[1], &token, "pin-c", "DROP-006", 1).await;
    assert_eq!(status, 409, "{body}");
    // …stock returns through server 1…
    let id = first["id"].as_str().unwrap();
    let released = http
        .post(format!("{}/api/v1/reservations/{id}/release", bases[0]))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(released.status(), 200);
    assert_eq!(
        badge(&mut ws, Duration::from_secs(1)).await["state"],
        "in_stock"
    );
    // …and server 2 sells it within a second (its sold-out memory cleared).
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut n = 0;
    loop {
        n += 1;
        let (status, body) = reserve(
            &http,
            &bases[1],
            &token,
            &format!("pin-d{n}"),
            "DROP-006",
            1,
        )
        .await;
        if status == 201 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "server 2 still refuses after stock came back: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A rehearsal spread over the three passes every truth check.
    let args = common::rehearsal_over(&redis.url(), &db, &bases);
    holdfast_cli::commands::run(Cli::parse_from(args))
        .await
        .expect("a rehearsal over three servers passes every truth check");

    // Server 1 dies holding sales it read but had not recorded: PostgreSQL's
    // rows are locked so no server can record, sales go on through all three
    // until server 1 has some pending, then it is killed and the lock lifted.
    let mut blocker = pg.begin().await.unwrap();
    sqlx::query("SELECT sku FROM skus WHERE sku = 'DROP-001' FOR UPDATE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let mut conn = holdfast_engine::redis_conn::connect(&redis.url())
        .await
        .unwrap();
    let victim = servers[0].0.0.id();
    let mut confirmed = 0_i64;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut i = 0;
    while confirmed < 30 || pending_on(&mut conn, victim).await == 0 {
        assert!(Instant::now() < deadline, "server 1 never read a sale");
        for base in &bases {
            i += 1;
            let (status, held) =
                reserve(&http, base, &token, &format!("kill-{i}"), "DROP-001", 1).await;
            assert_eq!(status, 201, "{held}");
            let id = held["id"].as_str().unwrap();
            assert_eq!(common::confirm(&http, base, &token, id).await, 200);
            confirmed += 1;
        }
    }
    let stranded = pending_on(&mut conn, victim).await;
    servers[0].0.kill();
    let killed = Instant::now();
    blocker.rollback().await.unwrap();

    let recorded =
        common::recorded_units(&pg, "DROP-001", confirmed, Duration::from_secs(30)).await;
    let took = killed.elapsed();
    assert_eq!(recorded, confirmed, "every sale recorded once");
    let (orders, units): (i64, i64) = sqlx::query_as(
        "SELECT count(*), coalesce(sum(qty), 0)::bigint FROM order_lines WHERE sku = 'DROP-001'",
    )
    .fetch_one(&pg)
    .await
    .unwrap();
    assert_eq!(
        (orders, units),
        (confirmed, confirmed),
        "one order line per paid hold"
    );
    println!(
        "server 1 killed with {stranded} sale(s) read and unrecorded; the others recorded all \
         {confirmed} in {took:?}"
    );
    let (ok, out, err) = common::holdfast(&["verify"], &redis.url(), &db);
    assert!(ok, "verify after losing a server:\n{out}{err}");

    // Server 2 freezes (SIGSTOP) in the middle of recording: it is made to wait
    // for a row lock with sales read, frozen, and the lock lifted, so its
    // transaction gets the lock and then sits open, holding it, while the
    // process cannot go on. PostgreSQL ends that transaction after
    // IDLE_IN_TRANSACTION; server 3 takes the frozen server's sales over and
    // records every sale, each once, while server 2 is still frozen.
    let mut blocker = pg.begin().await.unwrap();
    sqlx::query("SELECT sku FROM skus WHERE sku = 'DROP-001' FOR UPDATE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let victim = servers[1].0.0.id();
    let live = [bases[1].clone(), bases[2].clone()];
    let deadline = Instant::now() + Duration::from_secs(20);
    while pending_on(&mut conn, victim).await == 0 {
        assert!(Instant::now() < deadline, "server 2 never read a sale");
        for base in &live {
            i += 1;
            let (status, held) =
                reserve(&http, base, &token, &format!("freeze-{i}"), "DROP-001", 1).await;
            assert_eq!(status, 201, "{held}");
            let id = held["id"].as_str().unwrap();
            assert_eq!(common::confirm(&http, base, &token, id).await, 200);
            confirmed += 1;
        }
    }
    signal(victim, "STOP");
    let frozen = Instant::now();
    blocker.rollback().await.unwrap();
    let recorded =
        common::recorded_units(&pg, "DROP-001", confirmed, Duration::from_secs(45)).await;
    let took = frozen.elapsed();
    signal(victim, "CONT");
    assert_eq!(
        recorded, confirmed,
        "every sale recorded while a server is frozen mid-transaction"
    );
    println!("server 2 frozen mid-recording: server 3 recorded all {confirmed} sales in {took:?}");
    let (ok, out, err) = common::holdfast(&["verify"], &redis.url(), &db);
    assert!(ok, "verify after a frozen server:\n{out}{err}");
}
