//! The checkout API through HTTP: every status code path, idempotency, scopes and
//! the sold-out cache, against real Redis and PostgreSQL.

mod common;

use std::time::Duration;

use holdfast_engine::testkit::{TestRedis, stock};
use holdfast_engine::tokens::{self, Scope};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;

struct Api {
    http: Client,
    server: common::TestServer,
    token: String,
}

impl Api {
    async fn post(
        &self,
        path: &str,
        key: Option<&str>,
        body: Value,
    ) -> (StatusCode, Value, Option<String>) {
        let (status, text, retry) = self.post_text(path, key, body).await;
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::Null),
            retry,
        )
    }

    /// [`Api::post`] with the answer's bytes as sent.
    async fn post_text(
        &self,
        path: &str,
        key: Option<&str>,
        body: Value,
    ) -> (StatusCode, String, Option<String>) {
        let mut req = self
            .http
            .post(self.server.url(path))
            .bearer_auth(&self.token)
            .json(&body);
        if let Some(k) = key {
            req = req.header("Idempotency-Key", k);
        }
        let res = req.send().await.unwrap();
        let retry = res
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        let status = res.status();
        (status, res.text().await.unwrap_or_default(), retry)
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let res = self
            .http
            .get(self.server.url(path))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap();
        let status = res.status();
        (status, res.json().await.unwrap_or(Value::Null))
    }
}

async fn setup(pool: PgPool, scopes: &[Scope]) -> (Api, TestRedis, holdfast_engine::Engine) {
    setup_with(pool, scopes, true).await
}

/// [`setup`], with or without the live event feed (whose reads of the figures
/// after each event would blur a count of one request's Redis calls).
async fn setup_with(
    pool: PgPool,
    scopes: &[Scope],
    live: bool,
) -> (Api, TestRedis, holdfast_engine::Engine) {
    let redis = TestRedis::start();
    let backends = common::backends(pool.clone(), &redis.url()).await;
    let engine = backends.engine.clone();
    let server = if live {
        common::spawn_live(backends, &redis.url()).await
    } else {
        common::spawn(backends).await
    };
    let token = tokens::create(&pool, "test-checkout", scopes)
        .await
        .unwrap()
        .secret;
    (
        Api {
            http: Client::new(),
            server,
            token,
        },
        redis,
        engine,
    )
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn tokens_and_scopes_are_checked(pool: PgPool) {
    let (api, _redis, _engine) = setup(pool.clone(), &[Scope::Read]).await;
    let body = json!({"sku": "A-1", "qty": 1});
    let none = api
        .http
        .post(api.server.url("/api/v1/reservations"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(none.status(), 401);
    let err: Value = none.json().await.unwrap();
    assert_eq!(err["code"], "unauthorized");
    let bad = api
        .http
        .post(api.server.url("/api/v1/reservations"))
        .bearer_auth("hf_nope")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 401);
    let (status, err, _) = api.post("/api/v1/reservations", Some("k1"), body).await;
    assert_eq!(status, 403, "a read token cannot reserve");
    assert_eq!(err["code"], "forbidden");

    // A revoked token stops working (after the short verification cache).
    let id = tokens::list(&pool).await.unwrap()[0].id;
    assert!(tokens::revoke(&pool, id).await.unwrap());
    tokio::time::sleep(tokens::TOKEN_CACHE_TTL + Duration::from_millis(100)).await;
    let (status, _) = api.get("/api/v1/stock/A-1").await;
    assert_eq!(status, 401);
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn reserve_answers_every_outcome_with_its_status(pool: PgPool) {
    let (api, _redis, engine) = setup(pool, &[Scope::Checkout]).await;
    stock(&engine, "A-1", 3).await;

    let (s, b, _) = api
        .post(
            "/api/v1/reservations",
            Some("r1"),
            json!({"sku": "A-1", "qty": 2}),
        )
        .await;
    assert_eq!(s, 201, "{b}");
    assert_eq!(b["state"], "held");
    assert_eq!(b["lines"][0]["available_after"], 1);
    let id = b["id"].as_str().unwrap().to_owned();
    assert!(b["expires_at"].is_string());

    let (s, replay, _) = api
        .post(
            "/api/v1/reservations",
            Some("r1"),
            json!({"sku": "A-1", "qty": 2}),
        )
        .await;
    assert_eq!(
        (s, &replay),
        (StatusCode::CREATED, &b),
        "same key, same body: the stored response"
    );
    let (s, e, _) = api
        .post(
            "/api/v1/reservations",
            Some("r1"),
            json!({"sku": "A-1", "qty": 1}),
        )
        .await;
    assert_eq!(s, 422, "same key, different body");
    assert_eq!(e["code"], "idempotency_key_reused");

    let (s, e, _) = api
        .post(
            "/api/v1/reservations",
            Some("r2"),
            json!({"sku": "A-1", "qty": 2}),
        )
        .await;
    assert_eq!(s, 409);
    assert_eq!(
        (
            e["code"].as_str(),
            e["available"].as_i64(),
            e["sku"].as_str()
        ),
        (Some("sold_out"), Some(1), Some("A-1"))
    );
    stock(&engine, "A-1", 5).await;
    let (s, again, _) = api
        .post(
            "/api/v1/reservations",
            Some("r2"),
            json!({"sku": "A-1", "qty": 2}),
        )
        .await;
    assert_eq!(
        (s, again),
        (StatusCode::CONFLICT, e),
        "a 409 is replayed for its key"
    );

    let (s, e, retry) = api
        .post(
            "/api/v1/reservations",
            Some("r3"),
            json!({"sku": "COLD-1", "qty": 1}),
        )
        .await;
    assert_eq!(s, 503, "not warmed is never a 409");
    assert_eq!(e["code"], "not_warmed");
    assert_eq!(retry.as_deref(), Some("5"));
    stock(&engine, "COLD-1", 1).await;
    let (s, _, _) = api
        .post(
            "/api/v1/reservations",
            Some("r3"),
            json!({"sku": "COLD-1", "qty": 1}),
        )
        .await;
    assert_eq!(s, 201, "after a 503 the same key runs again and succeeds");

    let (s, e, _) = api
        .post(
            "/api/v1/reservations",
            None,
            json!({"sku": "A-1", "qty": 1}),
        )
        .await;
    assert_eq!(
        (s, e["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("Idempotency-Key"))
    );
    let (s, e, _) = api
        .post(
            "/api/v1/reservations",
            Some("r4"),
            json!({"sku": "A-1", "qty": 0}),
        )
        .await;
    assert_eq!(
        (s, e["code"].as_str(), e["field"].as_str()),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("invalid"),
            Some("qty")
        )
    );
    let (s, e, _) = api
        .post(
            "/api/v1/reservations",
            Some("r5"),
            json!({"sku": "bad sku"}),
        )
        .await;
    assert_eq!(
        (s, e["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("sku"))
    );
    let (s, e, _) = api
        .post("/api/v1/reservations", Some("r6"), json!({"skew": "A-1"}))
        .await;
    assert_eq!(
        (s, e["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("bad_request"))
    );
    let raw = api
        .http
        .post(api.server.url("/api/v1/reservations"))
        .bearer_auth(&api.token)
        .header("Idempotency-Key", "r7")
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 400);
    let huge = api
        .http
        .post(api.server.url("/api/v1/reservations"))
        .bearer_auth(&api.token)
        .header("Idempotency-Key", "r8")
        .body(vec![b' '; 64 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(huge.status(), 413, "bodies are limited");
    let refused: Value = huge.json().await.expect("the API's JSON error shape");
    assert_eq!(refused["code"], "payload_too_large");
    assert!(
        refused["message"].as_str().unwrap().contains("16384 bytes"),
        "{refused}"
    );

    // Read, confirm, release.
    let (s, got) = api.get(&format!("/api/v1/reservations/{id}")).await;
    assert_eq!((s, got["state"].as_str()), (StatusCode::OK, Some("held")));
    let (s, c, _) = api
        .post(
            &format!("/api/v1/reservations/{id}/confirm"),
            None,
            json!({}),
        )
        .await;
    assert_eq!(
        (s, c["state"].as_str()),
        (StatusCode::OK, Some("confirmed"))
    );
    let (s, c, _) = api
        .post(
            &format!("/api/v1/reservations/{id}/confirm"),
            None,
            json!({}),
        )
        .await;
    assert_eq!(
        (s, c["state"].as_str()),
        (StatusCode::OK, Some("confirmed")),
        "confirming twice is fine"
    );
    let (s, _, _) = api
        .post("/api/v1/reservations/t999-x/confirm", None, json!({}))
        .await;
    assert_eq!(s, 404, "another token's (or no) reservation");
    let (s, stockv) = api.get("/api/v1/stock/A-1").await;
    assert_eq!(
        (s, stockv["sold_pending"].as_i64()),
        (StatusCode::OK, Some(2))
    );
    let (s, many) = api.get("/api/v1/stock?skus=A-1,COLD-1,NOPE-1").await;
    assert_eq!(
        (s, many.as_array().map(Vec::len)),
        (StatusCode::OK, Some(2)),
        "unwarmed SKUs are left out"
    );
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_late_confirm_is_410_and_records_a_remediation(pool: PgPool) {
    let (api, _redis, engine) = setup(pool.clone(), &[Scope::Checkout]).await;
    stock(&engine, "L-1", 2).await;
    let (s, b, _) = api
        .post(
            "/api/v1/reservations",
            Some("late"),
            json!({"sku": "L-1", "qty": 1, "ttl_ms": 1000}),
        )
        .await;
    assert_eq!(s, 201);
    let id = b["id"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let (s, e, _) = api
        .post(
            &format!("/api/v1/reservations/{id}/confirm"),
            None,
            json!({}),
        )
        .await;
    assert_eq!(
        (s, e["code"].as_str()),
        (StatusCode::GONE, Some("hold_expired"))
    );
    let state: String =
        sqlx::query_scalar("SELECT hold_state FROM remediations WHERE reservation_id = $1")
            .bind(&id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(state, "expired");
    assert_eq!(
        engine.figures("L-1").await.unwrap().unwrap().available,
        2,
        "no stock taken"
    );

    let (s, b, _) = api
        .post(
            "/api/v1/reservations",
            Some("rel"),
            json!({"sku": "L-1", "qty": 1}),
        )
        .await;
    assert_eq!(s, 201);
    let id = b["id"].as_str().unwrap().to_owned();
    for _ in 0..2 {
        let (s, r, _) = api
            .post(
                &format!("/api/v1/reservations/{id}/release"),
                None,
                json!({}),
            )
            .await;
        assert_eq!((s, r["state"].as_str()), (StatusCode::OK, Some("released")));
    }
    assert_eq!(engine.figures("L-1").await.unwrap().unwrap().available, 2);
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn the_sold_out_cache_sheds_load_and_clears_when_stock_returns(pool: PgPool) {
    let (api, redis, engine) = setup(pool, &[Scope::Checkout]).await;
    stock(&engine, "HOT-9", 1).await;
    let (s, b, _) = api
        .post(
            "/api/v1/reservations",
            Some("first"),
            json!({"sku": "HOT-9", "qty": 1}),
        )
        .await;
    assert_eq!(s, 201);
    let id = b["id"].as_str().unwrap().to_owned();
    let (s, _, _) = api
        .post(
            "/api/v1/reservations",
            Some("second"),
            json!({"sku": "HOT-9", "qty": 1}),
        )
        .await;
    assert_eq!(s, 409);

    let before = redis.command_calls("evalsha").await;
    for i in 0..20 {
        let (s, e, _) = api
            .post(
                "/api/v1/reservations",
                Some(&format!("flood-{i}")),
                json!({"sku": "HOT-9", "qty": 1}),
            )
            .await;
        assert_eq!(
            (s, e["available"].as_i64()),
            (StatusCode::CONFLICT, Some(0))
        );
    }
    let after = redis.command_calls("evalsha").await;
    assert_eq!(
        after, before,
        "rejections after a sell-out never reached Redis' scripts"
    );
    // An invalid request is refused as invalid, never from memory.
    let (s, e, _) = api
        .post(
            "/api/v1/reservations",
            Some("bad-0"),
            json!({"sku": "HOT-9", "qty": 0}),
        )
        .await;
    assert_eq!(
        (s, e["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("qty"))
    );
    // Never for an id Redis knows: the first shopper's retry (its 201 lost on
    // the way) gets its hold again, and another request under its key a 422.
    let (s, again, _) = api
        .post(
            "/api/v1/reservations",
            Some("first"),
            json!({"sku": "HOT-9", "qty": 1}),
        )
        .await;
    assert_eq!(
        (s, &again),
        (StatusCode::CREATED, &b),
        "the first answer again"
    );
    let (s, e, _) = api
        .post(
            "/api/v1/reservations",
            Some("first"),
            json!({"sku": "HOT-9", "qty": 2}),
        )
        .await;
    assert_eq!(
        (s, e["code"].as_str()),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("idempotency_key_reused")
        )
    );

    // Stock comes back: the event stream clears the cache at once.
    let (s, _, _) = api
        .post(
            &format!("/api/v1/reservations/{id}/release"),
            None,
            json!({}),
        )
        .await;
    assert_eq!(s, 200);
    let mut reserved = false;
    for i in 0..20 {
        let (s, _, _) = api
            .post(
                "/api/v1/reservations",
                Some(&format!("back-{i}")),
                json!({"sku": "HOT-9", "qty": 1}),
            )
            .await;
        if s == 201 {
            reserved = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(reserved, "a released unit is sold again within a second");
    // A memory answer is kept for its key like any other: the retry of a
    // shopper turned away from memory is still refused, stock or not.
    let (s, e, _) = api
        .post(
            "/api/v1/reservations",
            Some("flood-0"),
            json!({"sku": "HOT-9", "qty": 1}),
        )
        .await;
    assert_eq!(
        (s, e["code"].as_str(), e["available"].as_i64()),
        (StatusCode::CONFLICT, Some("sold_out"), Some(0))
    );
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_cart_is_all_or_nothing_over_http(pool: PgPool) {
    let (api, _redis, engine) = setup(pool, &[Scope::Checkout]).await;
    stock(&engine, "C-1", 5).await;
    stock(&engine, "C-2", 0).await;
    let cart =
        json!({"lines": [{"sku": "C-1", "qty": 2}, {"sku": "C-2", "qty": 1}], "buyer": "ann"});
    let (s, e, _) = api.post("/api/v1/reservations", Some("cart-1"), cart).await;
    assert_eq!((s, e["sku"].as_str()), (StatusCode::CONFLICT, Some("C-2")));
    assert_eq!(
        engine.figures("C-1").await.unwrap().unwrap().available,
        5,
        "nothing held"
    );
    let (s, e, _) = api
        .post(
            "/api/v1/reservations",
            Some("cart-2"),
            json!({"sku": "C-1", "lines": []}),
        )
        .await;
    assert_eq!(
        (s, e["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("lines"))
    );
    // A cart over two shards: its retry is the same request however written
    // (lines in another order, another ttl_ms), as for a one-shard hold.
    let ks = engine.keyspace();
    let other = (3..100)
        .map(|i| format!("C-{i}"))
        .find(|s| ks.shard_of(s) != ks.shard_of("C-1"))
        .unwrap();
    stock(&engine, &other, 5).await;
    let (s, first, _) = api
        .post_text(
            "/api/v1/reservations",
            Some("cart-3"),
            json!({"lines": [{"sku": "C-1", "qty": 1}, {"sku": other, "qty": 1}]}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{first}");
    let (s, again, _) = api
        .post_text(
            "/api/v1/reservations",
            Some("cart-3"),
            json!({"ttl_ms": 5000, "lines": [{"sku": other, "qty": 1}, {"sku": "C-1", "qty": 1}]}),
        )
        .await;
    // Byte for byte: the store keeps the answer's text, not a tree whose keys
    // would come back in another order.
    assert_eq!((s, &again), (StatusCode::CREATED, &first));
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_reservation_is_its_own_idempotency_record_for_24_hours(pool: PgPool) {
    let (api, redis, engine) = setup(pool, &[Scope::Checkout]).await;
    stock(&engine, "E-1", 5).await;
    let (s, first, _) = api
        .post(
            "/api/v1/reservations",
            Some("exp-1"),
            json!({"sku": "E-1", "qty": 2}),
        )
        .await;
    assert_eq!(s, 201);
    let id = first["id"].as_str().unwrap().to_owned();

    // No separate key store: the hold itself is the record.
    let mut admin = redis.connection().await;
    let (_, stored): (u64, Vec<String>) = redis::cmd("SCAN")
        .arg(0)
        .arg("MATCH")
        .arg("hf:idem:*")
        .arg("COUNT")
        .arg(1_000)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(
        stored,
        Vec::<String>::new(),
        "a one-shard hold keeps no key of its own"
    );

    // Released, the hold is remembered 24 hours, and so is the key's answer.
    let (s, _, _) = api
        .post(
            &format!("/api/v1/reservations/{id}/release"),
            None,
            json!({}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (_, holds): (u64, Vec<String>) = redis::cmd("SCAN")
        .arg(0)
        .arg("MATCH")
        .arg("hf:*:hold:*")
        .arg("COUNT")
        .arg(1_000)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(holds.len(), 1, "one hold record");
    let ttl: i64 = redis::cmd("TTL")
        .arg(&holds[0])
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(ttl > 86_000 && ttl <= 86_400, "kept 24 hours: {ttl}");
    let (s, again, _) = api
        .post(
            "/api/v1/reservations",
            Some("exp-1"),
            json!({"sku": "E-1", "qty": 2}),
        )
        .await;
    assert_eq!(
        (s, &again),
        (StatusCode::CREATED, &first),
        "a retry gets the first answer, whatever became of the hold"
    );
    assert_eq!(
        engine.figures("E-1").await.unwrap().unwrap().available,
        5,
        "held once, released once"
    );
    let (s, e, _) = api
        .post(
            "/api/v1/reservations",
            Some("exp-1"),
            json!({"sku": "E-1", "qty": 1}),
        )
        .await;
    assert_eq!(
        (s, e["code"].as_str()),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("idempotency_key_reused")
        )
    );
    // The same key for a SKU in another shard is still the same key.
    let other = (0..100)
        .map(|i| format!("E-{i}"))
        .find(|s| engine.keyspace().shard_of(s) != engine.keyspace().shard_of("E-1"))
        .unwrap();
    stock(&engine, &other, 5).await;
    let (s, e, _) = api
        .post(
            "/api/v1/reservations",
            Some("exp-1"),
            json!({"sku": other, "qty": 2}),
        )
        .await;
    assert_eq!(
        (s, e["code"].as_str()),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("idempotency_key_reused")
        )
    );
    assert_eq!(engine.figures(&other).await.unwrap().unwrap().available, 5);
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_limited_sku_needs_a_buyer_so_the_limit_cannot_be_skipped(pool: PgPool) {
    let (api, _redis, engine) = setup(pool, &[Scope::Checkout]).await;
    holdfast_engine::testkit::stock_with_limit(&engine, "LIM-1", 100, 2).await;
    stock(&engine, "FREE-1", 100).await;
    // Leaving the buyer out was a way around the limit: refused, nothing held.
    let (s, body, _) = api
        .post(
            "/api/v1/reservations",
            Some("nb-1"),
            json!({"sku": "LIM-1", "qty": 2}),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["code"], "buyer_required");
    assert_eq!(body["field"], "buyer");
    // In a cart too, whatever the other lines.
    let (s, body, _) = api
        .post(
            "/api/v1/reservations",
            Some("nb-2"),
            json!({"lines": [{"sku": "FREE-1", "qty": 1}, {"sku": "LIM-1", "qty": 1}]}),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let f = engine.figures("LIM-1").await.unwrap().unwrap();
    assert_eq!((f.available, f.reserved), (100, 0));
    let f = engine.figures("FREE-1").await.unwrap().unwrap();
    assert_eq!((f.available, f.reserved), (100, 0), "all or nothing");
    // With a buyer the limit counts; a SKU without a limit needs none.
    let (s, _, _) = api
        .post(
            "/api/v1/reservations",
            Some("b-1"),
            json!({"sku": "LIM-1", "qty": 2, "buyer": "ann"}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, body, _) = api
        .post(
            "/api/v1/reservations",
            Some("b-2"),
            json!({"sku": "LIM-1", "qty": 1, "buyer": "ann"}),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["code"], "buyer_limit_reached");
    let (s, _, _) = api
        .post(
            "/api/v1/reservations",
            Some("free-1"),
            json!({"sku": "FREE-1", "qty": 3}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
}

/// Redis round trips the engine made so far, from `/metrics`.
async fn redis_round_trips(api: &Api) -> f64 {
    let text = api
        .http
        .get(api.server.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with("holdfast_redis_command_duration_seconds_count"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// What `request` answered and the Redis round trips it cost: the count from
/// `/metrics` before and after, less a scrape's own (scraped until two in a
/// row cost the same: the live side has caught up with earlier events).
async fn round_trips<T>(api: &Api, request: impl Future<Output = T>) -> (T, f64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut before = redis_round_trips(api).await;
    let mut cost = -1.0;
    loop {
        let now = redis_round_trips(api).await;
        let spent = now - before;
        before = now;
        if spent == cost || std::time::Instant::now() > deadline {
            break;
        }
        cost = spent;
    }
    let answer = request.await;
    let after = redis_round_trips(api).await;
    (answer, after - before - cost)
}

/// `POST /api/v1/reservations/{id}/{action}` (confirm, release) on `api`.
fn on<'a>(
    api: &'a Api,
    id: &str,
    action: &str,
) -> impl Future<Output = (StatusCode, Value, Option<String>)> + use<'a> {
    let path = format!("/api/v1/reservations/{id}/{action}");
    async move { api.post(&path, None, json!({})).await }
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn checkout_calls_cost_one_redis_round_trip(pool: PgPool) {
    let (api, redis, engine) = setup_with(pool.clone(), &[Scope::Checkout], false).await;
    let act = |id: &str, action: &str| on(&api, id, action);
    stock(&engine, "O-1", 3).await;
    stock(&engine, "O-0", 1).await;
    // Redis learns the scripts first (a NOSCRIPT costs a load and a resend).
    let (s, first, _) = api
        .post(
            "/api/v1/reservations",
            Some("o0"),
            json!({"sku": "O-0", "qty": 1}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{first}");
    let id = first["id"].as_str().unwrap();
    for action in ["confirm", "release"] {
        assert_eq!(act(id, action).await.0, StatusCode::OK);
    }
    let hold = json!({"sku": "O-1", "qty": 2});
    let ((s, first, _), trips) = round_trips(
        &api,
        api.post("/api/v1/reservations", Some("o1"), hold.clone()),
    )
    .await;
    assert_eq!((s, trips), (StatusCode::CREATED, 1.0), "a hold: {first}");
    let ((s, again, _), trips) = round_trips(
        &api,
        api.post("/api/v1/reservations", Some("o1"), hold.clone()),
    )
    .await;
    assert_eq!(
        (s, &again, trips),
        (StatusCode::CREATED, &first, 1.0),
        "a retry"
    );
    let ((s, refused, _), trips) = round_trips(
        &api,
        api.post("/api/v1/reservations", Some("o2"), hold.clone()),
    )
    .await;
    assert_eq!(
        (s, trips),
        (StatusCode::CONFLICT, 1.0),
        "sold out: {refused}"
    );
    let ((s, again, _), trips) =
        round_trips(&api, api.post("/api/v1/reservations", Some("o2"), hold)).await;
    assert_eq!(
        (s, &again, trips),
        (StatusCode::CONFLICT, &refused, 1.0),
        "a refusal's retry"
    );
    // The server that made a hold confirms and releases it from memory: one.
    let id = first["id"].as_str().unwrap();
    let ((s, confirmed, _), trips) = round_trips(&api, act(id, "confirm")).await;
    assert_eq!(
        (s, confirmed["state"].as_str(), trips),
        (StatusCode::OK, Some("confirmed"), 1.0)
    );
    let (s, other, _) = api
        .post(
            "/api/v1/reservations",
            Some("o3"),
            json!({"sku": "O-1", "qty": 1}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let other = other["id"].as_str().unwrap();
    let ((s, released, _), trips) = round_trips(&api, act(other, "release")).await;
    assert_eq!(
        (s, released["state"].as_str(), trips),
        (StatusCode::OK, Some("released"), 1.0)
    );
    // A second server behind the same load balancer did not make these holds:
    // it finds each hold's shard, then runs the script (two), and answers alike.
    let second = Api {
        http: Client::new(),
        server: common::spawn(common::backends(pool, &redis.url()).await).await,
        token: api.token.clone(),
    };
    let ((s, again, _), trips) = round_trips(&second, on(&second, id, "confirm")).await;
    assert_eq!((s, &again, trips), (StatusCode::OK, &confirmed, 2.0));
    let ((s, again, _), trips) = round_trips(&second, on(&second, other, "release")).await;
    assert_eq!((s, &again, trips), (StatusCode::OK, &released, 2.0));
    let (s, third, _) = api
        .post(
            "/api/v1/reservations",
            Some("o4"),
            json!({"sku": "O-1", "qty": 1}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let third = third["id"].as_str().unwrap();
    let ((s, paid, _), trips) = round_trips(&second, on(&second, third, "confirm")).await;
    assert_eq!(
        (s, paid["state"].as_str(), trips),
        (StatusCode::OK, Some("confirmed"), 2.0)
    );
    let ((s, again, _), trips) = round_trips(&api, act(third, "confirm")).await;
    assert_eq!((s, &again, trips), (StatusCode::OK, &paid, 1.0));
    let f = engine.figures("O-1").await.unwrap().unwrap();
    assert_eq!((f.available, f.reserved, f.sold), (0, 0, 3));
}

/// `POST /api/v1/reservations/{id}/{action}` on `api` with `Idempotency-Key` `key`.
fn keyed<'a>(
    api: &'a Api,
    id: &str,
    action: &str,
    key: &'a str,
) -> impl Future<Output = (StatusCode, Value, Option<String>)> + use<'a> {
    let path = format!("/api/v1/reservations/{id}/{action}");
    async move { api.post(&path, Some(key), json!({})).await }
}

/// The answer's status and error code.
fn refusal(answer: &(StatusCode, Value, Option<String>)) -> (StatusCode, Option<&str>) {
    (answer.0, answer.1["code"].as_str())
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_key_on_confirm_or_release_is_kept_in_the_hold_in_the_same_round_trip(pool: PgPool) {
    let (api, redis, engine) = setup_with(pool.clone(), &[Scope::Checkout], false).await;
    stock(&engine, "K-0", 1).await;
    stock(&engine, "K-1", 5).await;
    let hold = |key: &'static str| {
        let api = &api;
        async move {
            let (s, b, _) = api
                .post(
                    "/api/v1/reservations",
                    Some(key),
                    json!({"sku": "K-1", "qty": 1}),
                )
                .await;
            assert_eq!(s, StatusCode::CREATED, "{b}");
            b["id"].as_str().unwrap().to_owned()
        }
    };
    // Redis learns the scripts first (a NOSCRIPT costs a load and a resend).
    let (s, warm, _) = api
        .post(
            "/api/v1/reservations",
            Some("k0"),
            json!({"sku": "K-0", "qty": 1}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let warm = warm["id"].as_str().unwrap();
    assert_eq!(
        keyed(&api, warm, "confirm", "k0-pay").await.0,
        StatusCode::OK
    );
    assert_eq!(
        keyed(&api, warm, "release", "k0-rel").await.0,
        StatusCode::OK
    );

    // A payment with a key: one call, and its repeat the same answer in one.
    let paid = hold("k1").await;
    let ((s, first, _), trips) = round_trips(&api, keyed(&api, &paid, "confirm", "pay-1")).await;
    assert_eq!(
        (s, first["state"].as_str(), trips),
        (StatusCode::OK, Some("confirmed"), 1.0)
    );
    let ((s, again, _), trips) = round_trips(&api, keyed(&api, &paid, "confirm", "pay-1")).await;
    assert_eq!(
        (s, &again, trips),
        (StatusCode::OK, &first, 1.0),
        "a repeat"
    );
    // The key with another request on the hold: refused, nothing moves.
    let (refused, trips) = round_trips(&api, keyed(&api, &paid, "release", "pay-1")).await;
    assert_eq!(
        (refusal(&refused), trips),
        (
            (
                StatusCode::UNPROCESSABLE_ENTITY,
                Some("idempotency_key_reused")
            ),
            1.0
        ),
        "{refused:?}"
    );
    assert_eq!(refused.1["field"], "Idempotency-Key");
    let f = engine.figures("K-1").await.unwrap().unwrap();
    assert_eq!((f.available, f.reserved, f.sold), (4, 0, 1));
    // A key used near the end of the ended hold's record keeps the record a
    // tombstone's lifetime (24 hours) from then, not to the record's end.
    let ks = engine.keyspace();
    let record = ks.hold(ks.shard_of("K-1"), &paid);
    let mut admin = redis.connection().await;
    redis::cmd("PEXPIRE")
        .arg(&record)
        .arg(3_000)
        .query_async::<()>(&mut admin)
        .await
        .unwrap();
    let (s, _, _) = keyed(&api, &paid, "release", "late-rel").await;
    assert_eq!(s, StatusCode::OK);
    let left: i64 = redis::cmd("PTTL")
        .arg(&record)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(
        left > 23 * 3_600_000,
        "kept 24 hours from the key's use: {left} ms"
    );

    // A release with a key: the same, and the key then refuses a payment.
    let left = hold("k2").await;
    let ((s, released, _), trips) = round_trips(&api, keyed(&api, &left, "release", "rel-2")).await;
    assert_eq!(
        (s, released["state"].as_str(), trips),
        (StatusCode::OK, Some("released"), 1.0)
    );
    let (s, again, _) = keyed(&api, &left, "release", "rel-2").await;
    assert_eq!((s, &again), (StatusCode::OK, &released));
    let refused = keyed(&api, &left, "confirm", "rel-2").await;
    assert_eq!(
        refusal(&refused),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("idempotency_key_reused")
        ),
        "no late payment is recorded under a key kept for the release"
    );
    let late: i64 =
        sqlx::query_scalar("SELECT count(*) FROM remediations WHERE reservation_id = $1")
            .bind(&left)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(late, 0);

    // Another server did not make the hold: it finds it, then runs the
    // script (two calls), and keeps and checks the key alike.
    let second = Api {
        http: Client::new(),
        server: common::spawn(common::backends(pool.clone(), &redis.url()).await).await,
        token: api.token.clone(),
    };
    let third = hold("k3").await;
    let ((s, on_second, _), trips) =
        round_trips(&second, keyed(&second, &third, "confirm", "pay-3")).await;
    assert_eq!((s, trips), (StatusCode::OK, 2.0), "{on_second}");
    let (s, again, _) = keyed(&api, &third, "confirm", "pay-3").await;
    assert_eq!(
        (s, &again),
        (StatusCode::OK, &on_second),
        "the maker answers alike"
    );
    let refused = keyed(&second, &third, "release", "pay-3").await;
    assert_eq!(
        refusal(&refused),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("idempotency_key_reused")
        )
    );

    // A cart over two shards keeps its key in its first part before its steps.
    let ks = engine.keyspace();
    let other = (2..100)
        .map(|i| format!("K-{i}"))
        .find(|s| ks.shard_of(s) != ks.shard_of("K-1"))
        .unwrap();
    stock(&engine, &other, 5).await;
    let (s, cart, _) = api
        .post(
            "/api/v1/reservations",
            Some("kc"),
            json!({"lines": [{"sku": "K-1", "qty": 1}, {"sku": other, "qty": 1}]}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{cart}");
    let cart = cart["id"].as_str().unwrap();
    let (s, first, _) = keyed(&api, cart, "confirm", "cart-pay").await;
    assert_eq!(
        (s, first["state"].as_str()),
        (StatusCode::OK, Some("confirmed")),
        "{first}"
    );
    let (s, again, _) = keyed(&second, cart, "confirm", "cart-pay").await;
    assert_eq!((s, &again), (StatusCode::OK, &first));
    let refused = keyed(&api, cart, "release", "cart-pay").await;
    assert_eq!(
        refusal(&refused),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("idempotency_key_reused")
        )
    );
    let f = engine.figures(&other).await.unwrap().unwrap();
    assert_eq!((f.available, f.reserved, f.sold), (4, 0, 1));
    let f = engine.figures("K-1").await.unwrap().unwrap();
    assert_eq!((f.available, f.reserved, f.sold), (2, 0, 3));
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn many_skus_are_read_in_one_redis_round_trip(pool: PgPool) {
    let (api, _redis, engine) = setup(pool, &[Scope::Read]).await;
    for sku in ["M-1", "M-2", "M-3", "M-4", "M-5"] {
        stock(&engine, sku, 3).await;
    }
    let (s, _) = api.get("/api/v1/stock?skus=M-1").await;
    assert_eq!(s, StatusCode::OK, "the token is known before counting");
    let ((s, got), trips) = round_trips(
        &api,
        api.get("/api/v1/stock?skus=M-1,M-2,M-3,M-4,M-5,NOPE-9"),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        got.as_array().unwrap().len(),
        5,
        "the unwarmed one is left out"
    );
    assert_eq!(trips, 1.0, "six SKUs, one round trip");
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_payment_no_replica_acknowledged_is_503_and_its_retry_is_answered_once_one_does(
    pool: PgPool,
) {
    // A master with no replica yet, payments waiting for one.
    let redis = TestRedis::start();
    let config = holdfast_engine::EngineConfig {
        confirm_replicas: 1,
        confirm_replica_timeout: Duration::from_millis(100),
        ..holdfast_engine::EngineConfig::default()
    };
    let mut backends =
        holdfast_engine::Backends::new(pool.clone(), redis.connection().await, config);
    backends.engine = backends.engine.with_replica_acks(redis.connection().await);
    let engine = backends.engine.clone();
    let api = Api {
        http: Client::new(),
        server: common::spawn(backends).await,
        token: tokens::create(&pool, "replicas", &[Scope::Checkout])
            .await
            .unwrap()
            .secret,
    };
    stock(&engine, "R-1", 3).await;
    let (s, b, _) = api
        .post(
            "/api/v1/reservations",
            Some("rep"),
            json!({"sku": "R-1", "qty": 1}),
        )
        .await;
    assert_eq!(s, 201, "reservations do not wait for replicas");
    let id = b["id"].as_str().unwrap().to_owned();
    let pay = format!("/api/v1/reservations/{id}/confirm");
    let (s, e, retry) = api.post(&pay, Some("rep-pay"), json!({})).await;
    assert_eq!(
        (s, e["code"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("unavailable"))
    );
    assert!(retry.is_some(), "Retry-After is set");
    assert!(
        e["message"]
            .as_str()
            .unwrap_or_default()
            .contains("1 Redis replica"),
        "{e}"
    );
    // A replica joins; the retry (same key) is answered paid.
    let replica = TestRedis::start_with(&["--replicaof", "127.0.0.1", &redis.port().to_string()]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (s, b, _) = api.post(&pay, Some("rep-pay"), json!({})).await;
        if s == StatusCode::OK {
            assert_eq!(b["state"], "confirmed", "{b}");
            break;
        }
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{b}");
        assert!(
            std::time::Instant::now() < deadline,
            "the replica never acknowledged"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let figures = engine.figures("R-1").await.unwrap().unwrap();
    assert_eq!((figures.sold, figures.available), (1, 2), "sold once");
    drop(replica);
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_split_sku_checks_out_over_http_like_any_other(pool: PgPool) {
    let (api, _redis, engine) =
        setup_with(pool.clone(), &[Scope::Checkout, Scope::Read], false).await;
    holdfast_engine::testkit::add_sku(&pool, "S-1", 40).await;
    stock(&engine, "S-1", 40).await;
    assert_eq!(
        engine.set_parts(&pool, "S-1", 4).await.unwrap(),
        holdfast_engine::SplitOutcome::Changed { from: 1, to: 4 }
    );
    // Redis learns the scripts first (a NOSCRIPT costs a load and a resend).
    stock(&engine, "W-1", 1).await;
    let (s, warm, _) = api
        .post(
            "/api/v1/reservations",
            Some("w1"),
            json!({"sku": "W-1", "qty": 1}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    for action in ["confirm", "release"] {
        assert_eq!(
            on(&api, warm["id"].as_str().unwrap(), action).await.0,
            StatusCode::OK
        );
    }
    // Each part has 10: a hold of 2 is one call on its part.
    let hold = json!({"sku": "S-1", "qty": 2});
    let ((s, first, _), trips) = round_trips(
        &api,
        api.post("/api/v1/reservations", Some("s1"), hold.clone()),
    )
    .await;
    assert_eq!((s, trips), (StatusCode::CREATED, 1.0), "{first}");
    assert_eq!(first["lines"][0]["sku"], "S-1", "{first}");
    let (s, again, _) = api.post("/api/v1/reservations", Some("s1"), hold).await;
    assert_eq!(
        (s, &again["id"]),
        (StatusCode::CREATED, &first["id"]),
        "{again}"
    );
    let (s, stock_now) = api.get("/api/v1/stock/S-1").await;
    assert_eq!(
        (s, &stock_now["available"]),
        (StatusCode::OK, &json!(38)),
        "{stock_now}"
    );
    let id = first["id"].as_str().unwrap().to_owned();
    let ((s, confirmed, _), trips) = round_trips(&api, on(&api, &id, "confirm")).await;
    assert_eq!(
        (s, confirmed["state"].as_str(), trips),
        (StatusCode::OK, Some("confirmed"), 1.0),
        "{confirmed}"
    );
    // The rest, whichever parts the requests land on.
    let mut held = 2;
    for i in 0..5 {
        let (s, body, _) = api
            .post(
                "/api/v1/reservations",
                Some(&format!("rest-{i}")),
                json!({"sku": "S-1", "qty": 10}),
            )
            .await;
        match s {
            StatusCode::CREATED => held += 10,
            StatusCode::CONFLICT => {
                assert_eq!(body["code"], "sold_out", "{body}");
                assert_eq!(body["sku"], "S-1", "{body}");
            }
            other => panic!("{other}: {body}"),
        }
    }
    assert_eq!(
        held, 32,
        "three holds of 10 and 8 left, too few for a fourth"
    );
    let (s, body, _) = api
        .post(
            "/api/v1/reservations",
            Some("last"),
            json!({"sku": "S-1", "qty": 8}),
        )
        .await;
    assert_eq!(
        s,
        StatusCode::CREATED,
        "the last 8, spread over the parts: {body}"
    );
    let f = engine.figures("S-1").await.unwrap().unwrap();
    assert_eq!(
        (f.available, f.reserved, f.sold_pending, f.moving),
        (0, 38, 2, 0)
    );
}
