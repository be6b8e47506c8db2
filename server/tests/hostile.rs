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
    assert!(
        holdfast_engine::payload::parse(
            bad.as_bytes(),
            holdfast_engine::payload::DEFAULT_MAX_EVENTS
        )
        .is_err()
    );
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
    let closed = common::closes_within(&mut ws, std::time::Duration::from_secs(3)).await;
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
    let get = |token: String| stock_status(http.clone(), server.url("/api/v1/stock/X-1"), token);
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

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_real_tokens_first_burst_is_never_rate_limited(pool: PgPool) {
    // A drop's first moment: hundreds of requests with one shop token reach a
    // server that has not checked it yet. None is taken for an invented token
    // and answered 429 (the pre-authentication limit, 10 a second).
    let redis = TestRedis::start();
    let backends = common::backends(pool.clone(), &redis.url()).await;
    let server = common::spawn(backends).await;
    let real =
        holdfast_engine::tokens::create(&pool, "shop", &[holdfast_engine::tokens::Scope::Read])
            .await
            .unwrap()
            .secret;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(200)
        .build()
        .unwrap();
    let mut burst = tokio::task::JoinSet::new();
    for _ in 0..200 {
        let (http, url, token) = (http.clone(), server.url("/api/v1/stock/X-1"), real.clone());
        burst.spawn(stock_status(http, url, token));
    }
    let mut statuses = Vec::new();
    while let Some(status) = burst.join_next().await {
        statuses.push(status.unwrap());
    }
    assert!(
        statuses.iter().all(|s| *s == 503),
        "every one authenticated (the SKU is not warmed): {statuses:?}"
    );
    // That they cost PostgreSQL one check: engine/tests/bounds.rs.
}

/// The status of `GET url` with API token `token`.
async fn stock_status(http: reqwest::Client, url: String, token: String) -> u16 {
    http.get(url)
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Transactions committed in the test's database so far.
async fn transactions(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn badge_socket(base: &str) -> common::Socket {
    let req = format!("{}/public/ws", base.replace("http://", "ws://"))
        .into_client_request()
        .unwrap();
    tokio_tungstenite::connect_async(req).await.unwrap().0
}

/// The next text message within 2 s.
async fn next_text(ws: &mut common::Socket) -> serde_json::Value {
    use futures_util::StreamExt;
    loop {
        let msg = tokio::time::timeout(std::time::Duration::from_secs(2), ws.next())
            .await
            .expect("a message within 2 s")
            .expect("open")
            .expect("a frame");
        if let Message::Text(t) = msg {
            return serde_json::from_str(&t).unwrap();
        }
    }
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn invented_badge_skus_cost_no_database_work_and_subscribing_is_paced(pool: PgPool) {
    holdfast_engine::catalog::load_demo_drop(&pool)
        .await
        .unwrap();
    let redis = TestRedis::start();
    let backends = common::backends(pool.clone(), &redis.url()).await;
    holdfast_engine::testkit::stock(&backends.engine, "DROP-001", 40).await;
    let server = common::spawn_live(backends, &redis.url()).await;
    let mut ws = badge_socket(&server.base).await;
    // A real SKU first: its badge arrives (and loads the thresholds once).
    ws.send(Message::Text(r#"{"subscribe":["DROP-001"]}"#.into()))
        .await
        .unwrap();
    assert_eq!(
        next_text(&mut ws).await["state"],
        "low",
        "40 is under its threshold"
    );
    tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
    let before = transactions(&pool).await;
    // The burst allows four more subscribe messages at once; each names 20
    // invented SKUs, answered "unknown" without asking PostgreSQL.
    for round in 0..4 {
        let skus: Vec<String> = (0..20).map(|i| format!("FAKE-{round}-{i}")).collect();
        ws.send(Message::Text(
            serde_json::json!({ "subscribe": skus }).to_string().into(),
        ))
        .await
        .unwrap();
        for _ in 0..20 {
            assert_eq!(next_text(&mut ws).await["state"], "unknown");
        }
    }
    // Past the burst: refused until the pace allows another.
    for _ in 0..3 {
        ws.send(Message::Text(r#"{"subscribe":["FAKE-X"]}"#.into()))
            .await
            .unwrap();
    }
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(next_text(&mut ws).await);
    }
    assert!(
        answers
            .iter()
            .any(|a| a["error"].as_str().is_some_and(|e| e.contains("too often"))),
        "{answers:?}"
    );
    // PostgreSQL publishes its counts within about a second.
    tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
    let spent = transactions(&pool).await - before;
    assert!(
        spent < 20,
        "80 invented SKUs cost {spent} PostgreSQL transactions"
    );
    // The polling endpoint answers the same from memory.
    let res = reqwest::get(server.url("/public/stock?skus=FAKE-A,FAKE-B,DROP-001"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
    let spent_with_poll = transactions(&pool).await - before;
    assert!(spent_with_poll < 20, "{spent_with_poll}");
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_badge_socket_that_answers_nothing_is_closed(pool: PgPool) {
    use futures_util::StreamExt;
    let redis = TestRedis::start();
    let backends = common::backends(pool, &redis.url()).await;
    let options = StateOptions {
        badge: holdfast_server::badge::BadgeConfig {
            ping_every: std::time::Duration::from_millis(300),
            idle_timeout: std::time::Duration::from_secs(1),
            ..Default::default()
        },
        ..StateOptions::default()
    };
    let server = common::spawn_with(backends, options, Some(&redis.url())).await;
    // A reading client answers pings (tungstenite does so while reading) and stays.
    let mut alive = badge_socket(&server.base).await;
    let mut pings = 0;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
    while let Ok(Some(Ok(msg))) = tokio::time::timeout_at(deadline, alive.next()).await {
        assert!(
            !matches!(msg, Message::Close(_)),
            "a live client was closed"
        );
        pings += usize::from(matches!(msg, Message::Ping(_)));
    }
    assert!(pings >= 3, "{pings} pings in 2 s");
    // A client that never reads never answers a ping: closed after the timeout.
    let mut silent = badge_socket(&server.base).await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let closed = common::closes_within(&mut silent, std::time::Duration::from_secs(2)).await;
    assert!(closed, "the silent socket is still open");
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn invented_session_cookies_cannot_flood_the_live_handshake(pool: PgPool) {
    let redis = TestRedis::start();
    let backends = common::backends(pool.clone(), &redis.url()).await;
    let server = common::spawn_live(backends, &redis.url()).await;
    let handshake = |cookie: String| {
        let mut req = format!("{}/live", server.base.replace("http://", "ws://"))
            .into_client_request()
            .unwrap();
        req.headers_mut()
            .insert("origin", server.base.parse().unwrap());
        req.headers_mut().insert(
            "cookie",
            format!("holdfast_session={cookie}").parse().unwrap(),
        );
        async move {
            match tokio_tungstenite::connect_async(req).await {
                Err(tokio_tungstenite::tungstenite::Error::Http(r)) => r.status().as_u16(),
                Ok(_) => 101,
                Err(e) => panic!("{e}"),
            }
        }
    };
    // Not the shape of a session secret: refused without a lookup.
    assert_eq!(handshake("x".repeat(5_000)).await, 401);
    tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
    let before = transactions(&pool).await;
    let mut statuses = Vec::new();
    for i in 0..100u32 {
        statuses.push(handshake(format!("{i:064x}")).await);
    }
    assert!(
        statuses.iter().all(|s| *s == 401 || *s == 429),
        "{statuses:?}"
    );
    let limited = statuses.iter().filter(|s| **s == 429).count();
    assert!(limited >= 80, "only {limited} of 100 were held off");
    tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
    let spent = transactions(&pool).await - before;
    assert!(spent < 30, "100 invented cookies cost {spent} transactions");
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_refused_token_used_again_still_counts_against_the_limit(pool: PgPool) {
    let redis = TestRedis::start();
    let backends = common::backends(pool, &redis.url()).await;
    let server = common::spawn(backends).await;
    let http = reqwest::Client::new();
    let invented = format!("hf_{:064x}", 7);
    let mut statuses = Vec::new();
    for _ in 0..60 {
        let res = http
            .get(server.url("/api/v1/stock/X-1"))
            .bearer_auth(&invented)
            .send()
            .await
            .unwrap();
        statuses.push(res.status().as_u16());
    }
    // Its refusal is remembered, but each use is charged: past the burst, 429.
    assert!(
        statuses.iter().filter(|s| **s == 429).count() >= 30,
        "{statuses:?}"
    );
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn refused_badge_handshakes_do_not_hand_back_open_sockets_slots(pool: PgPool) {
    let redis = TestRedis::start();
    let backends = common::backends(pool, &redis.url()).await;
    let options = StateOptions {
        badge: holdfast_server::badge::BadgeConfig {
            max_connections_per_client: 3,
            ..holdfast_server::badge::BadgeConfig::default()
        },
        ..StateOptions::default()
    };
    let server = common::spawn_with(backends, options, Some(&redis.url())).await;
    let mut open = Vec::new();
    let mut statuses = Vec::new();
    // Every socket stays open: past the third, each is refused, and a refusal
    // must not free a slot an open socket holds.
    for _ in 0..12 {
        let req = format!("{}/public/ws", server.base.replace("http://", "ws://"))
            .into_client_request()
            .unwrap();
        match tokio_tungstenite::connect_async(req).await {
            Ok((ws, _)) => {
                statuses.push(101);
                open.push(ws);
            }
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
                statuses.push(r.status().as_u16())
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(
        statuses,
        [vec![101; 3], vec![429; 9]].concat(),
        "three admitted, every later one refused"
    );
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_silent_badge_socket_is_closed_at_its_timeout_not_at_the_next_ping(pool: PgPool) {
    let redis = TestRedis::start();
    let backends = common::backends(pool, &redis.url()).await;
    let options = StateOptions {
        badge: holdfast_server::badge::BadgeConfig {
            // Pings far apart: the close must not wait for one.
            ping_every: std::time::Duration::from_secs(25),
            idle_timeout: std::time::Duration::from_secs(2),
            ..Default::default()
        },
        ..StateOptions::default()
    };
    let server = common::spawn_with(backends, options, Some(&redis.url())).await;
    let started = std::time::Instant::now();
    let mut silent = badge_socket(&server.base).await;
    let closed = common::closes_within(&mut silent, std::time::Duration::from_secs(6)).await;
    let took = started.elapsed();
    assert!(closed, "still open after 6 s");
    assert!(
        took >= std::time::Duration::from_millis(1_800) && took < std::time::Duration::from_secs(5),
        "closed after {took:?}, not at the 2 s timeout"
    );
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_body_that_never_arrives_is_the_callers_timeout_not_a_server_error(pool: PgPool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let redis = TestRedis::start();
    let backends = common::backends(pool, &redis.url()).await;
    let options = StateOptions {
        ingest: IngestConfig::parse(&[format!("erp=feeds:{SECRET}")]).unwrap(),
        edge: holdfast_server::http::edge::EdgeConfig {
            api_deadline: holdfast_server::http::deadline::Deadline(
                std::time::Duration::from_millis(500),
            ),
            ..Default::default()
        },
        ..StateOptions::default()
    };
    let server = common::spawn_with(backends, options, None).await;
    let addr = server.base.trim_start_matches("http://").to_owned();
    for path in ["/ingest/erp", "/ingest/nobody", "/api/v1/reservations"] {
        let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
        // Ten bytes promised, one sent (a webhook's signature headers with it:
        // without them it is refused before its body is waited for).
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Authorization: Bearer hf_{:064x}\r\nX-Holdfast-Timestamp: {}\r\n\
             X-Holdfast-Signature: sha256=00\r\nContent-Length: 10\r\n\r\n{{",
            0,
            chrono::Utc::now().timestamp()
        );
        tcp.write_all(req.as_bytes()).await.unwrap();
        // The whole answer (the server closes the connection after it).
        let mut answer = Vec::new();
        let read = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            tcp.read_to_end(&mut answer),
        )
        .await;
        assert!(read.is_ok(), "{path}: no whole answer within 5 s");
        let head = String::from_utf8_lossy(&answer).into_owned();
        if path.starts_with("/ingest") {
            assert!(head.starts_with("HTTP/1.1 408"), "{path}: {head}");
            assert!(head.contains("request_timeout"), "{path}: {head}");
        } else {
            // The API checks the token before it reads a body.
            assert!(head.starts_with("HTTP/1.1 401"), "{path}: {head}");
        }
    }
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn badge_subscribes_count_against_their_address_across_sockets(pool: PgPool) {
    use futures_util::StreamExt;
    let redis = TestRedis::start();
    let backends = common::backends(pool, &redis.url()).await;
    let options = StateOptions {
        badge: holdfast_server::badge::BadgeConfig {
            // Bursts of two a second from one address.
            polls_per_second: 1,
            ..holdfast_server::badge::BadgeConfig::default()
        },
        ..StateOptions::default()
    };
    let server = common::spawn_with(backends, options, Some(&redis.url())).await;
    // A fresh socket per subscribe (each with its own pace): the address's
    // count still applies, and the refusal says when to ask again.
    let mut answers = Vec::new();
    for i in 0..4 {
        let req = format!("{}/public/ws", server.base.replace("http://", "ws://"))
            .into_client_request()
            .unwrap();
        let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
        ws.send(Message::Text(
            format!(r#"{{"subscribe": ["INVENTED-{i}"]}}"#).into(),
        ))
        .await
        .unwrap();
        let first = tokio::time::timeout(std::time::Duration::from_secs(3), async {
            while let Some(Ok(msg)) = ws.next().await {
                if let Message::Text(t) = msg {
                    return serde_json::from_str::<serde_json::Value>(&t).unwrap();
                }
            }
            serde_json::Value::Null
        })
        .await
        .unwrap();
        answers.push(first);
    }
    assert_eq!(answers[0]["sku"], "INVENTED-0", "{answers:?}");
    assert_eq!(answers[1]["sku"], "INVENTED-1", "{answers:?}");
    for refused in &answers[2..] {
        assert_eq!(refused["retry_after"], 1, "{answers:?}");
    }
}
