//! Signed webhooks through the lanes: signatures, replays, stale snapshots, dead
//! letters, pausing and back-pressure, against real Redis.

mod common;

use std::sync::Arc;
use std::time::Duration;

use holdfast_domain::Lane;
use holdfast_engine::ingest::{self, LaneConfig, LaneConsumer, LaneStats};
use holdfast_engine::testkit::{TestRedis, stock};
use holdfast_engine::{Engine, ReserveRequest};
use holdfast_server::routes::ingest::{IngestConfig, sign};
use holdfast_server::state::StateOptions;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::PgPool;

const SECRET: &str = "erp-secret-0123456789";

struct Hook {
    base: String,
    http: reqwest::Client,
}

impl Hook {
    async fn send(
        &self,
        source: &str,
        body: &[u8],
        ts: i64,
        signature: &str,
    ) -> (StatusCode, Value) {
        let res = self
            .http
            .post(format!("{}/ingest/{source}", self.base))
            .header("X-Holdfast-Timestamp", ts.to_string())
            .header("X-Holdfast-Signature", signature)
            .body(body.to_vec())
            .send()
            .await
            .unwrap();
        let status = res.status();
        (status, res.json().await.unwrap_or(Value::Null))
    }

    async fn signed(&self, body: &Value) -> (StatusCode, Value) {
        let body = body.to_string().into_bytes();
        let ts = chrono::Utc::now().timestamp();
        self.send("erp", &body, ts, &sign(SECRET, ts, &body)).await
    }
}

async fn setup(pool: PgPool, cap: u64) -> (Hook, TestRedis, Engine) {
    setup_with(pool, StateOptions::default().ingest_rate, |ingest| {
        ingest.caps.insert(Lane::Feeds, cap);
    })
    .await
}

/// A server with the `erp` source, `rate` webhooks per second, and the
/// ingestion settings `configure` leaves.
async fn setup_with(
    pool: PgPool,
    rate: u32,
    configure: impl FnOnce(&mut IngestConfig),
) -> (Hook, TestRedis, Engine) {
    let redis = TestRedis::start();
    let backends = common::backends(pool, &redis.url()).await;
    let engine = backends.engine.clone();
    let mut ingest = IngestConfig::parse(&[format!("erp=feeds:{SECRET}")]).unwrap();
    configure(&mut ingest);
    let options = StateOptions {
        ingest,
        ingest_rate: rate,
        ..StateOptions::default()
    };
    let server = common::spawn_with(backends, options, None).await;
    (
        Hook {
            base: server.base,
            http: reqwest::Client::new(),
        },
        redis,
        engine,
    )
}

async fn consumer(engine: &Engine, redis: &TestRedis) -> (LaneConsumer, Arc<LaneStats>) {
    let stats = Arc::new(LaneStats::default());
    let c = LaneConsumer::new(
        engine.clone(),
        redis.connection().await,
        LaneConfig::default_for(Lane::Feeds),
        "t".into(),
        stats.clone(),
    );
    (c, stats)
}

async fn drain(c: &mut LaneConsumer, redis: &TestRedis) {
    let mut conn = redis.connection().await;
    for _ in 0..100 {
        c.process_once(Duration::from_millis(20)).await.unwrap();
        if ingest::status(&mut conn, Lane::Feeds)
            .await
            .unwrap()
            .backlog
            == 0
        {
            return;
        }
    }
    panic!("the lane did not drain");
}

async fn backlog(redis: &TestRedis) -> u64 {
    ingest::status(&mut redis.connection().await, Lane::Feeds)
        .await
        .unwrap()
        .backlog
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn bad_signatures_stale_timestamps_and_tampered_bodies_are_refused(pool: PgPool) {
    let (hook, redis, _engine) = setup(pool, 1_000).await;
    let body = json!({"event_id": "e1", "type": "delta", "sku": "F-1", "delta": 5})
        .to_string()
        .into_bytes();
    let now = chrono::Utc::now().timestamp();

    let (s, e) = hook
        .send(
            "erp",
            &body,
            now,
            &sign("another-secret-xxxxxxx", now, &body),
        )
        .await;
    assert_eq!(
        (s, e["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("bad_signature"))
    );
    let old = now - 301;
    let (s, e) = hook
        .send("erp", &body, old, &sign(SECRET, old, &body))
        .await;
    assert_eq!(
        (s, e["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("stale_timestamp"))
    );
    let mut tampered = body.clone();
    tampered[10] ^= 1;
    let (s, _) = hook
        .send("erp", &tampered, now, &sign(SECRET, now, &body))
        .await;
    assert_eq!(
        s,
        StatusCode::UNAUTHORIZED,
        "a one-byte change breaks the signature"
    );
    let (s, _) = hook.send("erp", &body, now, "sha256=zz").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    // An unknown source is answered exactly as a wrong signature: the answer
    // never says which sources exist.
    let (s, unknown) = hook
        .send("nobody", &body, now, &sign(SECRET, now, &body))
        .await;
    let (_, wrong) = hook
        .send(
            "erp",
            &body,
            now,
            &sign("another-secret-0123456789", now, &body),
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_eq!(unknown, wrong);
    // Every earlier refusal is the same for both too: missing headers, a stale
    // timestamp, an oversized body.
    for (ts, sig, body) in [
        (now, "", body.clone()),
        (1, "sha256=00", body.clone()),
        (now, "sha256=00", vec![b'x'; 3 * 1024 * 1024]),
    ] {
        let (a_status, a) = hook.send("erp", &body, ts, sig).await;
        let (b_status, b) = hook.send("nobody", &body, ts, sig).await;
        assert_eq!((a_status, a), (b_status, b));
    }
    assert_eq!(backlog(&redis).await, 0, "nothing was enqueued");

    let (s, ok) = hook
        .send("erp", &body, now, &sign(SECRET, now, &body))
        .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    assert!(
        ok["event_id"].as_str().is_some_and(|id| id.contains('-')),
        "{ok}"
    );
    assert_eq!(ok["lane"], "feeds");
    assert_eq!(backlog(&redis).await, 1);
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_webhook_delivered_twice_is_applied_once(pool: PgPool) {
    let (hook, redis, engine) = setup(pool, 1_000).await;
    stock(&engine, "F-2", 10).await;
    let body = json!({"event_id": "recv-77", "type": "delta", "sku": "F-2", "delta": 50, "reason": "received"});
    assert_eq!(hook.signed(&body).await.0, StatusCode::ACCEPTED);
    assert_eq!(
        hook.signed(&body).await.0,
        StatusCode::ACCEPTED,
        "the second delivery is accepted too"
    );
    let (mut c, stats) = consumer(&engine, &redis).await;
    drain(&mut c, &redis).await;
    assert_eq!(
        engine.figures("F-2").await.unwrap().unwrap().available,
        60,
        "applied once"
    );
    assert_eq!(stats.applied.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(
        stats.duplicates.load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_stale_snapshot_during_a_sale_changes_nothing_and_is_dead_lettered(pool: PgPool) {
    let (hook, redis, engine) = setup(pool, 1_000).await;
    stock(&engine, "F-3", 100).await;
    engine
        .reserve(&ReserveRequest::single("sale-1", "F-3", 5))
        .await
        .unwrap();
    hook.signed(
        &json!({"event_id": "s9", "type": "snapshot", "sku": "F-3", "on_hand": 90, "version": 9}),
    )
    .await;
    let (mut c, stats) = consumer(&engine, &redis).await;
    drain(&mut c, &redis).await;
    let f = engine.figures("F-3").await.unwrap().unwrap();
    assert_eq!(
        (f.available, f.reserved),
        (85, 5),
        "on_hand 90 less the 5 held"
    );

    hook.signed(
        &json!({"event_id": "s8", "type": "snapshot", "sku": "F-3", "on_hand": 500, "version": 8}),
    )
    .await;
    drain(&mut c, &redis).await;
    let f = engine.figures("F-3").await.unwrap().unwrap();
    assert_eq!(
        (f.available, f.reserved),
        (85, 5),
        "the stale snapshot changed nothing"
    );
    assert_eq!(stats.stale.load(std::sync::atomic::Ordering::Relaxed), 1);
    let dead = ingest::dead_letters(&mut redis.connection().await, 10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert!(
        dead[0].reason.contains("stale snapshot: version 8"),
        "{:?}",
        dead[0]
    );
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn bad_payloads_and_unknown_skus_are_dead_lettered_and_can_be_replayed(pool: PgPool) {
    let (hook, redis, engine) = setup(pool, 1_000).await;
    let body = b"{\"event_id\": 12".to_vec();
    let ts = chrono::Utc::now().timestamp();
    assert_eq!(
        hook.send("erp", &body, ts, &sign(SECRET, ts, &body))
            .await
            .0,
        StatusCode::ACCEPTED
    );
    hook.signed(&json!({"events": [
        {"event_id": "a1", "type": "delta", "sku": "NEW-1", "delta": 7},
    ]}))
    .await;
    let (mut c, stats) = consumer(&engine, &redis).await;
    drain(&mut c, &redis).await;
    let mut conn = redis.connection().await;
    let dead = ingest::dead_letters(&mut conn, 10).await.unwrap();
    assert_eq!(dead.len(), 2, "{dead:?}");
    assert!(
        dead[0].reason.contains("NEW-1 has no stock counter"),
        "{:?}",
        dead[0]
    );
    assert!(
        dead[1].reason.starts_with("not a valid payload"),
        "{:?}",
        dead[1]
    );
    assert_eq!(stats.dead.load(std::sync::atomic::Ordering::Relaxed), 2);

    // The SKU is created and warmed; the dead letter is replayed and applies.
    stock(&engine, "NEW-1", 0).await;
    assert!(matches!(
        ingest::replay(&mut conn, &dead[0].id).await.unwrap(),
        ingest::Replay::Requeued(_)
    ));
    drain(&mut c, &redis).await;
    assert_eq!(engine.figures("NEW-1").await.unwrap().unwrap().available, 7);
    assert_eq!(ingest::dead_letters(&mut conn, 10).await.unwrap().len(), 1);
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_paused_lane_queues_and_a_full_lane_answers_429(pool: PgPool) {
    let (hook, redis, engine) = setup(pool, 3).await;
    stock(&engine, "F-4", 0).await;
    let mut conn = redis.connection().await;
    ingest::pause(&mut conn, Lane::Feeds).await.unwrap();
    for i in 0..3 {
        let (s, _) = hook
            .signed(
                &json!({"event_id": format!("p{i}"), "type": "delta", "sku": "F-4", "delta": 1}),
            )
            .await;
        assert_eq!(s, StatusCode::ACCEPTED);
    }
    let res = hook
        .http
        .post(format!("{}/ingest/erp", hook.base))
        .header(
            "X-Holdfast-Timestamp",
            chrono::Utc::now().timestamp().to_string(),
        )
        .header("X-Holdfast-Signature", {
            let ts = chrono::Utc::now().timestamp();
            sign(SECRET, ts, b"{}")
        })
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "over the cap");
    assert!(res.headers().contains_key("retry-after"));

    let (mut c, _) = consumer(&engine, &redis).await;
    c.process_once(Duration::from_millis(20)).await.unwrap();
    assert_eq!(
        engine.figures("F-4").await.unwrap().unwrap().available,
        0,
        "paused: nothing applied"
    );
    assert!(
        ingest::status(&mut conn, Lane::Feeds)
            .await
            .unwrap()
            .paused()
    );
    ingest::resume(&mut conn, Lane::Feeds).await.unwrap();
    drain(&mut c, &redis).await;
    assert_eq!(engine.figures("F-4").await.unwrap().unwrap().available, 3);
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_lane_is_capped_in_bytes_and_counts_them_out_again(pool: PgPool) {
    let (hook, redis, engine) = setup_with(pool, StateOptions::default().ingest_rate, |ingest| {
        ingest.byte_caps.insert(Lane::Feeds, 3 * 1024 * 1024);
    })
    .await;
    stock(&engine, "BIG-1", 10).await;
    // A valid payload padded to about 1.5 MiB: two fit under 3 MiB, a third not.
    let padded = |id: &str| {
        json!({"events": [{"event_id": id, "type": "delta", "sku": "BIG-1", "delta": 1}],
               "note": "x".repeat(1_500_000)})
    };
    let (s, _) = hook.signed(&padded("b-1")).await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let (s, _) = hook.signed(&padded("b-2")).await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let (s, full) = hook.signed(&padded("b-3")).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "{full}");
    assert_eq!(full["code"], "lane_full");
    let mut conn = redis.connection().await;
    assert!(ingest::lane_bytes(&mut conn, Lane::Feeds).await.unwrap() >= 3_000_000);
    // Consumed, the bytes are counted out and the lane takes payloads again.
    let (mut c, _) = consumer(&engine, &redis).await;
    for _ in 0..5 {
        c.process_once(Duration::from_millis(50)).await.unwrap();
    }
    assert_eq!(ingest::lane_bytes(&mut conn, Lane::Feeds).await.unwrap(), 0);
    let (s, _) = hook.signed(&padded("b-3")).await;
    assert_eq!(s, StatusCode::ACCEPTED);
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn bad_signatures_are_limited_before_the_body_is_hashed(pool: PgPool) {
    let (hook, _redis, _engine) = setup_with(pool, 5, |_| {}).await;
    let body = vec![b'{'; 1024 * 1024];
    let now = chrono::Utc::now().timestamp();
    let mut statuses = Vec::new();
    for _ in 0..30 {
        let (s, _) = hook.send("erp", &body, now, "sha256=00").await;
        statuses.push(s.as_u16());
    }
    assert!(
        statuses.iter().all(|s| *s == 401 || *s == 429),
        "{statuses:?}"
    );
    assert!(
        statuses.iter().filter(|s| **s == 429).count() >= 15,
        "an address sending bad signatures is held off: {statuses:?}"
    );
}

#[test]
fn source_settings_refuse_reserved_names_and_never_echo_secrets() {
    let secret = "super-secret-value-0123456789";
    for bad in [
        format!("checkout=orders:{secret}"),
        format!("reconcile=feeds:{secret}"),
        format!("Bad Name=feeds:{secret}"),
        format!("erp=nowhere:{secret}"),
        format!("erp:{secret}"),
        "erp=feeds:short".to_owned(),
    ] {
        let err = IngestConfig::parse(std::slice::from_ref(&bad)).unwrap_err();
        assert!(!err.contains(secret), "{err}");
        assert!(!err.contains("short"), "{err}");
    }
    assert!(
        IngestConfig::parse(&[format!("checkout=orders:{secret}")])
            .unwrap_err()
            .contains("reserved")
    );
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_payload_that_keeps_failing_is_dead_lettered_and_the_lane_goes_on(pool: PgPool) {
    let (hook, redis, engine) = setup(pool, 100).await;
    stock(&engine, "OK-2", 5).await;
    // A counter Redis cannot read as one (a key of the wrong type): every
    // attempt to apply a delta to it fails in the script.
    let _: () = redis::cmd("SET")
        .arg(engine.keyspace().sku("BROKEN-1"))
        .arg("not a hash")
        .query_async(&mut redis.connection().await)
        .await
        .unwrap();
    let (s, _) = hook
        .signed(&json!({"event_id": "p-1", "type": "delta", "sku": "BROKEN-1", "delta": 1}))
        .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let (s, _) = hook
        .signed(&json!({"event_id": "g-1", "type": "delta", "sku": "OK-2", "delta": 3}))
        .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let (mut c, stats) = consumer(&engine, &redis).await;
    let mut failures = 0;
    for _ in 0..10 {
        if c.process_once(Duration::from_millis(20)).await.is_err() {
            failures += 1;
        }
        if backlog(&redis).await == 0 {
            break;
        }
    }
    assert_eq!(
        failures,
        ingest::MAX_ATTEMPTS - 1,
        "retried, then set aside"
    );
    assert_eq!(backlog(&redis).await, 0, "the lane is not blocked");
    let f = engine.figures("OK-2").await.unwrap().unwrap();
    assert_eq!(f.available, 8, "the payload behind it was applied");
    assert_eq!(stats.dead.load(std::sync::atomic::Ordering::Relaxed), 1);
    let letters = ingest::dead_letters(&mut redis.connection().await, 10)
        .await
        .unwrap();
    assert_eq!(letters.len(), 1);
    assert!(
        letters[0].reason.contains("failed 3 times"),
        "{:?}",
        letters[0].reason
    );
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_payload_that_keeps_crashing_its_consumers_is_set_aside(pool: PgPool) {
    let (_hook, redis, engine) = setup(pool, 100).await;
    stock(&engine, "CR-1", 5).await;
    let mut conn = redis.connection().await;
    let body = br#"{"event_id":"c-1","type":"delta","sku":"CR-1","delta":1}"#;
    let id = holdfast_engine::testkit::queue_payload(&mut conn, Lane::Feeds, "erp", body).await;
    // Three consumers took it and died before finishing (a panic, a kill):
    // each counted its attempt in Redis, where the count outlives them.
    let _: () = redis::cmd("SET")
        .arg(format!("{}:tries:{id}", ingest::lane_key(Lane::Feeds)))
        .arg(ingest::MAX_ATTEMPTS)
        .query_async(&mut conn)
        .await
        .unwrap();
    let (mut c, stats) = consumer(&engine, &redis).await;
    drain(&mut c, &redis).await;
    assert_eq!(stats.dead.load(std::sync::atomic::Ordering::Relaxed), 1);
    let f = engine.figures("CR-1").await.unwrap().unwrap();
    assert_eq!(
        f.available, 5,
        "the payload that crashed consumers is not run again"
    );
    let letters = ingest::dead_letters(&mut conn, 10).await.unwrap();
    assert!(
        letters[0].reason.contains("stopped its consumer"),
        "{}",
        letters[0].reason
    );
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn invented_source_names_share_their_senders_limit(pool: PgPool) {
    let (hook, _redis, _engine) = setup_with(pool, 5, |_| {}).await;
    let now = chrono::Utc::now().timestamp();
    let mut statuses = Vec::new();
    for i in 0..40 {
        // A new long name each time: one limit for the address all the same.
        let name = format!("{i:04}{}", "a".repeat(2_000));
        let (s, _) = hook.send(&name, b"{}", now, "sha256=00").await;
        statuses.push(s.as_u16());
    }
    assert!(
        statuses.iter().filter(|s| **s == 429).count() >= 20,
        "{statuses:?}"
    );
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn the_largest_webhook_body_is_a_setting(pool: PgPool) {
    let (hook, _redis, _engine) = setup_with(pool, 0, |ingest| ingest.max_body = 1_024).await;
    let now = chrono::Utc::now().timestamp();
    let small = br#"{"event_id":"s-1","type":"delta","sku":"S-1","delta":1}"#;
    let (s, _) = hook
        .send("erp", small, now, &sign(SECRET, now, small))
        .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let big = vec![b' '; 2_048];
    let (s, body) = hook.send("erp", &big, now, &sign(SECRET, now, &big)).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(body["code"], "payload_too_large");
}

/// Starts `POST /ingest/erp` from local address `from` declaring a body of
/// `length` bytes, with signature headers when `signed`, and sends 10 bytes of it.
async fn start_body(
    base: &str,
    from: std::net::Ipv4Addr,
    length: usize,
    signed: bool,
) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let host = base.trim_start_matches("http://");
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind((from, 0).into()).unwrap();
    let mut stream = socket.connect(host.parse().unwrap()).await.unwrap();
    let headers = if signed {
        format!(
            "X-Holdfast-Timestamp: {}\r\nX-Holdfast-Signature: sha256=00\r\n",
            chrono::Utc::now().timestamp()
        )
    } else {
        String::new()
    };
    stream
        .write_all(
            format!(
                "POST /ingest/erp HTTP/1.1\r\nHost: {host}\r\nContent-Length: {length}\r\n{headers}\r\n{{\"padding"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    stream
}

/// The status of the answer read from `stream` within `within`, if any.
async fn status_within(stream: &mut tokio::net::TcpStream, within: Duration) -> Option<u16> {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(within, stream.read(&mut buf))
        .await
        .ok()?
        .ok()?;
    std::str::from_utf8(&buf[..n])
        .ok()?
        .split(' ')
        .nth(1)?
        .parse()
        .ok()
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn webhook_bodies_are_read_only_signed_and_a_few_at_a_time(pool: PgPool) {
    let (hook, _redis, _engine) = setup_with(pool, 0, |_| {}).await;
    let max = holdfast_server::routes::ingest::BODY_LIMIT;
    let local = std::net::Ipv4Addr::LOCALHOST;

    // No signature headers: refused at once, its body never waited for.
    let mut unsigned = start_body(&hook.base, local, max, false).await;
    assert_eq!(
        status_within(&mut unsigned, Duration::from_secs(1)).await,
        Some(401)
    );

    // One sender's bodies being read at once are bounded: the next is 429 at
    // once, and a place comes back when a body ends.
    let per_address = holdfast_server::routes::receiving::BODIES_PER_ADDRESS;
    let mut open = Vec::new();
    for _ in 0..per_address {
        open.push(start_body(&hook.base, local, max, true).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut one_more = start_body(&hook.base, local, 100, true).await;
    assert_eq!(
        status_within(&mut one_more, Duration::from_secs(1)).await,
        Some(429)
    );
    let (s, _) = hook
        .signed(&json!({"event_id": "f-1", "type": "delta", "sku": "F-1", "delta": 1}))
        .await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "the same sender");
    drop(open);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (s, _) = hook
        .signed(&json!({"event_id": "f-2", "type": "delta", "sku": "F-1", "delta": 1}))
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "places given back");

    // Senders not known yet, together: at most BODIES_IN_FLIGHT of the
    // largest bodies.
    let in_flight = holdfast_server::routes::receiving::BODIES_IN_FLIGHT;
    let mut open = Vec::new();
    for i in 0..in_flight {
        let from = std::net::Ipv4Addr::new(127, 0, 0, 2 + (i / per_address) as u8);
        open.push(start_body(&hook.base, from, max, true).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut another_sender = start_body(
        &hook.base,
        std::net::Ipv4Addr::new(127, 0, 0, 200),
        max,
        true,
    )
    .await;
    assert_eq!(
        status_within(&mut another_sender, Duration::from_secs(1)).await,
        Some(429)
    );
    for stream in &mut open {
        assert_eq!(
            status_within(stream, Duration::from_millis(10)).await,
            None,
            "each of those still being read"
        );
    }
    // A sender whose webhook was verified (f-2 above) reads from a budget of
    // its own: invented signatures from elsewhere do not shut it out.
    let (s, _) = hook
        .signed(&json!({"event_id": "f-3", "type": "delta", "sku": "F-1", "delta": 1}))
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "a known sender");
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_full_dead_letter_store_keeps_a_large_payload_cut_short(pool: PgPool) {
    let (hook, redis, engine) = setup(pool, 100).await;
    let mut conn = redis.connection().await;
    // Dead letters past the store's cap: many small ones first, then large
    // ones (an estimate from a few entries would miss them).
    for i in 0..600 {
        redis::cmd("XADD")
            .arg(ingest::DEAD_KEY)
            .arg("*")
            .arg("body")
            .arg(format!("small-{i}"))
            .query_async::<()>(&mut conn)
            .await
            .unwrap();
    }
    let filler = "x".repeat(2 * 1024 * 1024);
    let full = ingest::DEAD_STORE_BYTES as usize / filler.len() + 32;
    for _ in 0..full {
        redis::cmd("XADD")
            .arg(ingest::DEAD_KEY)
            .arg("*")
            .arg("lane")
            .arg("feeds")
            .arg("source")
            .arg("erp")
            .arg("body")
            .arg(&filler)
            .arg("reason")
            .arg("filler")
            .query_async::<()>(&mut conn)
            .await
            .unwrap();
    }
    // A payload that cannot be parsed, larger than what a full store keeps.
    let bad = format!("{{\"events\": \"{}\"", "y".repeat(20_000));
    let ts = chrono::Utc::now().timestamp();
    let (s, _) = hook
        .send("erp", bad.as_bytes(), ts, &sign(SECRET, ts, bad.as_bytes()))
        .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let (mut c, _) = consumer(&engine, &redis).await;
    drain(&mut c, &redis).await;
    let newest = ingest::dead_letters(&mut conn, 1).await.unwrap().remove(0);
    assert_eq!(newest.body.len(), ingest::DEAD_BODY_KEPT_WHEN_FULL);
    assert!(newest.reason.contains("cut short"), "{}", newest.reason);
    assert_eq!(
        ingest::replay(&mut conn, &newest.id).await.unwrap(),
        ingest::Replay::Cut(bad.len() as u64)
    );
    // A small one is still kept whole.
    let small = "not json";
    let (s, _) = hook
        .send(
            "erp",
            small.as_bytes(),
            ts,
            &sign(SECRET, ts, small.as_bytes()),
        )
        .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    drain(&mut c, &redis).await;
    let newest = ingest::dead_letters(&mut conn, 1).await.unwrap().remove(0);
    assert_eq!(newest.body, small);
}
