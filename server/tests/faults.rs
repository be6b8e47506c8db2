//! The API under faults: a confirm for a hold Redis lost, a release while a cart
//! is being confirmed, a Redis that stops answering (the request deadline; a
//! reservation or a keyed payment it makes after the 503 is what the retry
//! gets), and a retry after a failed attempt that must not be answered from
//! memory.

mod common;

use std::time::{Duration, Instant};

use holdfast_engine::idempotency::{self, Begin};
use holdfast_engine::record::{WriteBehind, WriteBehindConfig, WriteBehindStats};
use holdfast_engine::testkit::{TestRedis, stock};
use holdfast_engine::tokens::{self, Scope};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;

async fn token(pool: &PgPool) -> String {
    tokens::create(pool, "faults", &[Scope::Checkout, Scope::Read])
        .await
        .unwrap()
        .secret
}

async fn post(
    http: &Client,
    url: String,
    token: &str,
    key: &str,
    body: Value,
) -> (StatusCode, Value, Option<String>) {
    let res = http
        .post(url)
        .bearer_auth(token)
        .header("Idempotency-Key", key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let retry = res
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let status = res.status();
    (status, res.json().await.unwrap_or(Value::Null), retry)
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_confirm_for_a_hold_redis_lost_is_410_reservation_lost(pool: PgPool) {
    sqlx::query("INSERT INTO skus (sku, title, product, on_hand) VALUES ('L-1', 'L', 'L', 10)")
        .execute(&pool)
        .await
        .unwrap();
    let redis = TestRedis::start();
    let backends = common::backends(pool.clone(), &redis.url()).await;
    holdfast_engine::warmup::warm_all(&backends.engine, &pool, Default::default(), |_| {})
        .await
        .unwrap();
    let server = common::spawn(backends.clone()).await;
    let (http, token) = (Client::new(), token(&pool).await);
    let (s, held, _) = post(
        &http,
        server.url("/api/v1/reservations"),
        &token,
        "lost-1",
        json!({"sku": "L-1", "qty": 2, "buyer": "bo"}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    let id = held["id"].as_str().unwrap().to_owned();
    let (_, sold, _) = post(
        &http,
        server.url("/api/v1/reservations"),
        &token,
        "sold-1",
        json!({"sku": "L-1", "qty": 1}),
    )
    .await;
    let sold_id = sold["id"].as_str().unwrap().to_owned();
    let (s, _, _) = post(
        &http,
        server.url(&format!("/api/v1/reservations/{sold_id}/confirm")),
        &token,
        "sold-1-confirm",
        json!({}),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let mut w = WriteBehind::new(
        backends.engine.clone(),
        pool.clone(),
        redis.connection().await,
        WriteBehindConfig {
            consumer: "faults".into(),
            block: Duration::from_millis(20),
            ..WriteBehindConfig::default()
        },
        std::sync::Arc::new(WriteBehindStats::default()),
    );
    w.run_once().await.unwrap();

    // Redis loses everything (a restart without persistence).
    redis::cmd("FLUSHALL")
        .query_async::<()>(&mut redis.connection().await)
        .await
        .unwrap();
    let (s, body, _) = post(
        &http,
        server.url(&format!("/api/v1/reservations/{id}/confirm")),
        &token,
        "lost-1-confirm",
        json!({}),
    )
    .await;
    assert_eq!(s, StatusCode::GONE, "{body}");
    assert_eq!(body["code"], "reservation_lost");
    let kind: String =
        sqlx::query_scalar("SELECT kind FROM remediations WHERE reservation_id = $1")
            .bind(&id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(kind, "unknown_confirm");

    // A confirm retried for an order PostgreSQL recorded is still answered as
    // confirmed, from the system of record.
    let (s, body, _) = post(
        &http,
        server.url(&format!("/api/v1/reservations/{sold_id}/confirm")),
        &token,
        "sold-1-confirm-again",
        json!({}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["state"], "confirmed");
    assert_eq!(body["lines"][0]["sku"], "L-1");
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_redis_that_stops_answering_gets_503_within_the_deadline(pool: PgPool) {
    let redis = TestRedis::start_with(&["--enable-debug-command", "yes"]);
    let backends = common::backends(pool.clone(), &redis.url()).await;
    stock(&backends.engine, "D-1", 5).await;
    let server = common::spawn(backends).await;
    let (http, token) = (Client::new(), token(&pool).await);
    // Verify the token while Redis answers, then freeze Redis for 6 s.
    let warm = http
        .get(server.url("/api/v1/stock/D-1"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(warm.status(), StatusCode::OK);
    let url = redis.url();
    let sleeper = tokio::spawn(async move {
        let mut conn = holdfast_engine::redis_conn::connect(&url).await.unwrap();
        let _: redis::RedisResult<()> = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(6)
            .query_async(&mut conn)
            .await;
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let (s, body, retry) = post(
        &http,
        server.url("/api/v1/reservations"),
        &token,
        "slow-1",
        json!({"sku": "D-1", "qty": 1}),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["code"], "unavailable");
    assert!(retry.is_some(), "Retry-After is sent");
    assert!(took < Duration::from_millis(4_500), "answered in {took:?}");
    sleeper.await.unwrap();

    // Retrying with the same key as Retry-After says, once Redis answers again,
    // gets the real outcome: the hold (made late, or now).
    let started = Instant::now();
    let (s, body) = loop {
        let (s, body, retry) = post(
            &http,
            server.url("/api/v1/reservations"),
            &token,
            "slow-1",
            json!({"sku": "D-1", "qty": 1}),
        )
        .await;
        if s.is_success() || started.elapsed() > Duration::from_secs(20) {
            break (s, body);
        }
        let wait = retry.and_then(|r| r.parse().ok()).unwrap_or(1);
        tokio::time::sleep(Duration::from_secs(wait)).await;
    };
    assert_eq!(s, StatusCode::CREATED, "{body}");
    assert_eq!(body["state"], "held");
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_hold_redis_made_after_a_503_is_what_its_retry_gets(pool: PgPool) {
    let redis = TestRedis::start();
    let backends = common::backends(pool.clone(), &redis.url()).await;
    stock(&backends.engine, "P-1", 2).await;
    let server = common::spawn(backends).await;
    let (http, token) = (Client::new(), token(&pool).await);
    let reserve = |key: &'static str| {
        post(
            &http,
            server.url("/api/v1/reservations"),
            &token,
            key,
            json!({"sku": "P-1", "qty": 1}),
        )
    };
    // The token is known and Redis has the script before the fault.
    let (s, body, _) = reserve("first-1").await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    // Redis holds every write for 4 s: the hold is made after the API gave up.
    let mut admin = redis.connection().await;
    redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(4_000)
        .arg("WRITE")
        .query_async::<()>(&mut admin)
        .await
        .unwrap();
    let (s, body, _) = reserve("late-1").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let made = Instant::now() + Duration::from_secs(10);
    loop {
        let available: Option<i64> = redis::cmd("HGET")
            .arg(holdfast_engine::keys::Keyspace::default().sku("P-1"))
            .arg("available")
            .query_async(&mut admin)
            .await
            .unwrap();
        if available == Some(0) {
            break;
        }
        assert!(
            Instant::now() < made,
            "the paused attempt never ran: {available:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The next shopper's sold-out answer teaches this server's memory ...
    let (s, body, _) = reserve("other-1").await;
    assert_eq!(
        (s, body["code"].as_str(), body["available"].as_i64()),
        (StatusCode::CONFLICT, Some("sold_out"), Some(0))
    );
    // ... which never answers the retry of the attempt that failed here: Redis
    // does, with the hold it made.
    let (s, body, _) = reserve("late-1").await;
    assert_eq!(
        (s, body["state"].as_str()),
        (StatusCode::CREATED, Some("held")),
        "{body}"
    );
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_payment_redis_made_after_a_503_is_what_its_keyed_retry_gets(pool: PgPool) {
    let redis = TestRedis::start();
    let backends = common::backends(pool.clone(), &redis.url()).await;
    let engine = backends.engine.clone();
    stock(&engine, "Q-1", 3).await;
    let server = common::spawn(backends).await;
    let (http, token) = (Client::new(), token(&pool).await);
    let call = |path: String, key: &'static str, body: Value| {
        post(&http, server.url(&path), &token, key, body)
    };
    let hold = |key: &'static str| {
        let call = &call;
        async move {
            let (s, b, _) = call(
                "/api/v1/reservations".into(),
                key,
                json!({"sku": "Q-1", "qty": 1}),
            )
            .await;
            assert_eq!(s, StatusCode::CREATED, "{b}");
            b["id"].as_str().unwrap().to_owned()
        }
    };
    let pay = |id: &str, key: &'static str| {
        call(format!("/api/v1/reservations/{id}/confirm"), key, json!({}))
    };
    // The token is known and Redis has the scripts before the fault.
    let warm = hold("warm").await;
    assert_eq!(pay(&warm, "warm-pay").await.0, StatusCode::OK);
    let id = hold("paid-late").await;
    // Redis holds every write for 4 s: the payment is made after the API gave up.
    let mut admin = redis.connection().await;
    redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(4_000)
        .arg("WRITE")
        .query_async::<()>(&mut admin)
        .await
        .unwrap();
    let (s, body, retry) = pay(&id, "pay-k").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(retry.is_some(), "Retry-After is set");
    let made = Instant::now() + Duration::from_secs(10);
    while engine.figures("Q-1").await.unwrap().unwrap().sold < 2 {
        assert!(Instant::now() < made, "the paused payment never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The 503 was not kept: the retry with the key gets what Redis did.
    let (s, body, _) = pay(&id, "pay-k").await;
    assert_eq!(
        (s, body["state"].as_str()),
        (StatusCode::OK, Some("confirmed")),
        "{body}"
    );
    // And the payment that ran late kept the key: a release under it is refused.
    let (s, body, _) = call(
        format!("/api/v1/reservations/{id}/release"),
        "pay-k",
        json!({}),
    )
    .await;
    assert_eq!(
        (s, body["code"].as_str()),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("idempotency_key_reused")
        )
    );
    let f = engine.figures("Q-1").await.unwrap().unwrap();
    assert_eq!((f.available, f.reserved, f.sold), (1, 0, 2), "paid once");
}

#[tokio::test]
async fn a_retry_after_a_failed_attempt_is_never_answered_from_memory() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let begin = idempotency::begin(&engine, 7, "k", "fp").await.unwrap();
    assert_eq!(
        begin,
        Begin::Fresh {
            after_failure: false
        }
    );
    idempotency::finish(
        &engine,
        7,
        "k",
        "fp",
        503,
        r#"{"code":"unavailable"}"#,
        false,
    )
    .await;
    assert_eq!(
        idempotency::begin(&engine, 7, "k", "fp").await.unwrap(),
        Begin::Fresh {
            after_failure: true
        },
        "the failed attempt may have reserved: the retry asks Redis"
    );
    assert_eq!(
        idempotency::begin(&engine, 7, "k", "fp").await.unwrap(),
        Begin::InProgress,
        "claimed by that retry"
    );
    let answer = r#"{"id":"t7-k","state":"held","expires_at":"2026-12-07T12:00:00Z"}"#;
    idempotency::finish(&engine, 7, "k", "fp", 201, answer, true).await;
    assert_eq!(
        idempotency::begin(&engine, 7, "k", "fp").await.unwrap(),
        Begin::Replay(201, answer.to_owned()),
        "the first answer's bytes, its keys in their order"
    );
}
