//! A drop's start to the second, the same on every server: two `holdfast serve`
//! processes, one with its clock an hour fast (libfaketime), both answer
//! `not_started` until Redis' clock reaches the start and sell from then; the
//! schedule is set with `holdfast drop schedule`.

mod common;

use std::time::{Duration, Instant};

use holdfast_engine::testkit::TestRedis;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// Debian's libfaketime, preloaded to skew one server's clock.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// Asks `base` for one unit of DROP-002 with a fresh key.
async fn reserve(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    key: &str,
) -> (StatusCode, Value) {
    let r = http
        .post(format!("{base}/api/v1/reservations"))
        .bearer_auth(token)
        .header("Idempotency-Key", key)
        .json(&json!({ "sku": "DROP-002", "qty": 1, "buyer": key }))
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn two_servers_with_skewed_clocks_open_a_drop_at_redis_instant(
    _pool: PgPoolOptions,
    opts: PgConnectOptions,
) {
    assert!(
        std::path::Path::new(LIBFAKETIME).exists(),
        "this test needs libfaketime (Debian package faketime; scripts/test.sh installs it)"
    );
    let pg_url = common::pg_url(&opts);
    let redis = TestRedis::start();
    let (mut honest, honest_url, _, _o1) =
        common::serve(&redis, &pg_url, &[("HOLDFAST_DEMO", "1")]);
    // The second server's wall clock runs an hour ahead (its timers do not:
    // only the time of day is faked).
    let (mut skewed, skewed_url, _, _o2) = common::serve(
        &redis,
        &pg_url,
        &[
            ("HOLDFAST_DEMO", "1"),
            ("LD_PRELOAD", LIBFAKETIME),
            ("FAKETIME", "+3600s"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ],
    );
    let (ok, out, err) = common::holdfast(
        &[
            "token",
            "create",
            "--name",
            "drop",
            "--scopes",
            "checkout,read",
        ],
        &redis.url(),
        &pg_url,
    );
    assert!(ok, "{err}");
    let token = out.lines().nth(1).unwrap().trim().to_owned();

    // The drop starts 3 s from now by Redis' clock.
    let starts = redis.now_ms().await + 3_000;
    let starts_at = chrono::DateTime::from_timestamp_millis(starts)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let (ok, out, err) = common::holdfast(
        &[
            "drop",
            "schedule",
            "winter-launch",
            "--starts-at",
            &starts_at,
        ],
        &redis.url(),
        &pg_url,
    );
    assert!(ok, "{err}");
    assert!(out.contains("6 counter(s) follow it now"), "{out}");

    let http = reqwest::Client::new();
    // The skew took: the servers' own clocks (their Date headers) disagree by an hour.
    let date = |url: String| {
        let http = http.clone();
        async move {
            let r = http.get(format!("{url}/healthz")).send().await.unwrap();
            let d = r.headers()["date"].to_str().unwrap().to_owned();
            chrono::DateTime::parse_from_rfc2822(&d)
                .unwrap()
                .timestamp()
        }
    };
    let skew = date(skewed_url.clone()).await - date(honest_url.clone()).await;
    assert!((3_590..=3_610).contains(&skew), "skew {skew} s");
    let mut first_sale = [None, None];
    let mut refused_key: Option<(String, String)> = None;
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut n = 0;
    while first_sale.iter().any(Option::is_none) {
        assert!(
            Instant::now() < deadline,
            "a server never sold: {first_sale:?}"
        );
        for (i, base) in [&honest_url, &skewed_url].into_iter().enumerate() {
            if first_sale[i].is_some() {
                continue;
            }
            n += 1;
            let (status, body) = reserve(&http, base, &token, &format!("k-{i}-{n}")).await;
            let now = redis.now_ms().await;
            match status {
                StatusCode::CREATED => first_sale[i] = Some(now),
                StatusCode::CONFLICT => {
                    refused_key.get_or_insert_with(|| (base.clone(), format!("k-{i}-{n}")));
                    assert_eq!(body["code"], "not_started", "{body}");
                    assert_eq!(body["starts_at"], starts_at.as_str(), "{body}");
                    assert!(
                        now <= starts + 50,
                        "refused as not started at {now}, after {starts}"
                    );
                }
                other => panic!("server {i}: {other} {body}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // Neither sold before Redis' start; both sold within moments of it.
    for (i, sold) in first_sale.iter().enumerate() {
        let sold = sold.unwrap();
        assert!(sold >= starts, "server {i} sold at {sold}, before {starts}");
        assert!(sold < starts + 2_000, "server {i} sold only at {sold}");
    }

    // A key refused as not started is not kept: the same request gets in now.
    let (base, key) = refused_key.expect("some request came before the start");
    let (status, body) = reserve(&http, &base, &token, &key).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    let (ok, out, _) = common::holdfast(&["drop", "show", "winter-launch"], &redis.url(), &pg_url);
    assert!(ok && out.contains("ends none"), "{out}");
    let (ok, _, err) = common::holdfast(
        &[
            "drop",
            "schedule",
            "winter-launch",
            "--ends-at",
            "2000-01-01T00:00:00Z",
        ],
        &redis.url(),
        &pg_url,
    );
    assert!(
        !ok && err.contains("the end must come after the start"),
        "{err}"
    );
    for child in [&mut honest, &mut skewed] {
        let _ = child.kill();
        let _ = child.wait();
    }
}
