//! `PUT|GET /api/v1/drops/{code}` through HTTP: its own scope, JSON and CSV
//! bodies, a dry run, refusals by line and column, a body bigger than a
//! checkout call's limit, and the imported drop selling through the checkout API.

mod common;

use holdfast_engine::testkit::TestRedis;
use holdfast_engine::tokens::{self, Scope};
use reqwest::Client;
use serde_json::{Value, json};
use sqlx::PgPool;

async fn token(pool: &PgPool, name: &str, scopes: &[Scope]) -> String {
    tokens::create(pool, name, scopes).await.unwrap().secret
}

/// `PUT url` with `body` as JSON: the status and the JSON answer.
async fn put(http: &Client, url: &str, token: &str, body: &Value) -> (u16, Value) {
    let res = http
        .put(url)
        .bearer_auth(token)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_pim_pushes_a_drop_that_then_sells(pool: PgPool) {
    let redis = TestRedis::start();
    let server = common::spawn(common::backends(pool.clone(), &redis.url()).await).await;
    let http = Client::new();
    let catalog = token(&pool, "pim", &[Scope::Catalog]).await;
    let checkout = token(&pool, "shop", &[Scope::Checkout]).await;
    let url = server.url("/api/v1/drops/autumn");
    let drop = json!({
        "name": "Autumn",
        "skus": [
            {"sku": "AU-1", "product": "Coat", "variant": "S", "stock": 3, "per_buyer_limit": 1},
            {"sku": "AU-2", "product": "Hat", "stock": 0}
        ]
    });

    // Only the catalog scope may push.
    let res = http
        .put(&url)
        .bearer_auth(&checkout)
        .json(&drop)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 403);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["code"], "forbidden");

    // A dry run answers the changes and changes nothing.
    let (status, preview) = put(&http, &format!("{url}?dry_run=true"), &catalog, &drop).await;
    assert_eq!(status, 200);
    assert_eq!(preview["dry_run"], true);
    assert_eq!(preview["changes"].as_array().unwrap().len(), 3, "{preview}");
    let res = http.get(&url).bearer_auth(&catalog).send().await.unwrap();
    assert_eq!(res.status(), 404);

    let res = http
        .put(&url)
        .bearer_auth(&catalog)
        .json(&drop)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let report: Value = res.json().await.unwrap();
    assert_eq!(report["changes"], preview["changes"]);
    assert_eq!(report["counters_warmed"], 2);
    // Sent again: nothing changes.
    let res = http
        .put(&url)
        .bearer_auth(&catalog)
        .json(&drop)
        .send()
        .await
        .unwrap();
    let again: Value = res.json().await.unwrap();
    assert_eq!(again["changes"], json!([]), "{again}");

    // It sells through the checkout API, limit and all.
    let reserve = |key: &str, qty: i64| {
        http.post(server.url("/api/v1/reservations"))
            .bearer_auth(&checkout)
            .header("Idempotency-Key", key)
            .json(&json!({"sku": "AU-1", "qty": qty, "buyer": "bo"}))
            .send()
    };
    assert_eq!(reserve("k1", 2).await.unwrap().status(), 409);
    assert_eq!(reserve("k2", 1).await.unwrap().status(), 201);

    // Read back: what PUT takes back unchanged, in CSV too.
    let res = http.get(&url).bearer_auth(&catalog).send().await.unwrap();
    let sheet: Value = res.json().await.unwrap();
    assert_eq!(sheet["skus"][0]["title"], "Coat — S");
    let csv = holdfast_domain::sheet::to_csv(&serde_json::from_value(sheet).unwrap());
    let res = http
        .put(&url)
        .bearer_auth(&catalog)
        .header("Content-Type", "text/csv")
        .body(csv.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let same: Value = res.json().await.unwrap();
    assert_eq!(same["changes"], json!([]), "{same}");

    // A CSV with a bad row: 422 naming line and column, nothing changed.
    let bad = csv.replace("AU-2,Hat,,Hat,0", "AU-2,Hat,,Hat,lots");
    assert_ne!(bad, csv);
    let res = http
        .put(&url)
        .bearer_auth(&catalog)
        .header("Content-Type", "text/csv")
        .body(bad)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 422);
    let err: Value = res.json().await.unwrap();
    assert_eq!(err["code"], "invalid");
    assert_eq!(err["problems"][0]["line"], 3, "{err}");
    assert_eq!(err["problems"][0]["column"], "stock");

    // The body's drop must be the path's.
    let other = json!({"code": "winter", "skus": drop["skus"]});
    let res = http
        .put(&url)
        .bearer_auth(&catalog)
        .json(&other)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 422);

    // A drop of 2,000 SKUs (about 150 KiB, far over a checkout call's 16 KiB limit).
    let many: Vec<Value> = (0..2_000)
        .map(|i| json!({"sku": format!("BIG-{i:04}"), "product": "Sticker", "stock": 10}))
        .collect();
    let big_drop = json!({"name": "Big", "skus": many});
    let (status, big) = put(&http, &server.url("/api/v1/drops/big"), &catalog, &big_drop).await;
    assert_eq!(status, 200);
    assert_eq!(big["counters_warmed"], 2_000);
    // Over the drop limit (4 MiB): 413 naming that limit, not a checkout call's.
    let res = http
        .put(server.url("/api/v1/drops/huge"))
        .bearer_auth(&catalog)
        .header("Content-Type", "text/csv")
        .body(vec![b' '; 5 * 1024 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 413);
    let err: Value = res.json().await.unwrap();
    assert_eq!(err["code"], "payload_too_large");
    assert!(
        err["message"].as_str().unwrap().contains("4194304 bytes"),
        "{err}"
    );

    // The report: JSON, and CSV for a spreadsheet.
    let res = http
        .get(format!("{url}/report"))
        .bearer_auth(&catalog)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let report: Value = res.json().await.unwrap();
    assert_eq!(report["skus"].as_array().unwrap().len(), 2, "{report}");
    assert_eq!(report["skus"][0]["stock"], 3);
    let res = http
        .get(format!("{url}/report?format=csv"))
        .bearer_auth(&catalog)
        .send()
        .await
        .unwrap();
    assert!(
        res.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/csv")
    );
    let text = res.text().await.unwrap();
    assert!(text.starts_with("sku,title,stock,units_sold,"), "{text}");
    let res = http
        .get(server.url("/api/v1/drops/nope/report"))
        .bearer_auth(&catalog)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 404);

    // Who did it is in the audit log.
    let actors: Vec<String> =
        sqlx::query_scalar("SELECT actor FROM audit_log WHERE action = 'import_drop' ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(actors, ["token:pim", "token:pim"]);
}

/// The report's peak attempts per second counts every reservation attempt at
/// the drop's SKUs, refusals included (sold out, those answered from the
/// sold-out memory too), and not requests for SKUs nobody has.
#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn the_report_counts_attempts_refusals_included(pool: PgPool) {
    let redis = TestRedis::start();
    let backends = common::backends(pool.clone(), &redis.url()).await;
    let server = common::spawn(backends.clone()).await;
    let http = Client::new();
    let catalog = token(&pool, "pim", &[Scope::Catalog]).await;
    let checkout = token(&pool, "shop", &[Scope::Checkout]).await;
    let drop = json!({"skus": [{"sku": "TRY-1", "product": "Cap", "stock": 2}]});
    let (status, _) = put(&http, &server.url("/api/v1/drops/tries"), &catalog, &drop).await;
    assert_eq!(status, 200);

    let mut statuses = Vec::new();
    for i in 0..10 {
        for sku in ["TRY-1", "NOBODY-HAS-IT"] {
            let res = http
                .post(server.url("/api/v1/reservations"))
                .bearer_auth(&checkout)
                .header("Idempotency-Key", format!("try-{sku}-{i}"))
                .json(&json!({"sku": sku, "qty": 1}))
                .send()
                .await
                .unwrap();
            if sku == "TRY-1" {
                statuses.push(res.status().as_u16());
            }
        }
    }
    assert_eq!(statuses.iter().filter(|s| **s == 201).count(), 2);
    assert_eq!(statuses.iter().filter(|s| **s == 409).count(), 8);
    backends.engine.attempts().flush(&pool).await.unwrap();

    let counted: Vec<(String, i64)> =
        sqlx::query_as("SELECT sku, sum(n)::bigint FROM attempts GROUP BY sku ORDER BY sku")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(counted, [("TRY-1".to_owned(), 10)]);
    let report: Value = http
        .get(server.url("/api/v1/drops/tries/report"))
        .bearer_auth(&catalog)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let sku = &report["skus"][0];
    let peak = sku["peak_attempts_per_second"].as_i64().unwrap();
    // A form it does not know, or a code no drop can have: said plainly.
    for (path, want) in [
        ("/api/v1/drops/tries/report?format=xml", 400),
        ("/api/v1/drops/tries%00/report", 404),
        ("/api/v1/drops/tries%00", 404),
    ] {
        let res = http
            .get(server.url(path))
            .bearer_auth(&catalog)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), want, "{path}");
    }
    // Ten attempts in at most a few seconds: the busiest second has several,
    // never fewer than the holds taken in it.
    assert!(
        (4..=10).contains(&peak) && peak >= sku["peak_holds_per_second"].as_i64().unwrap(),
        "{report}"
    );
}

/// A whole drop is seconds of real work, not a checkout call: it is answered
/// within the bulk deadline (the request timeout), however short the API's
/// deadline for checkout calls is. The CI once saw a 10,000-SKU drop answered
/// 503 at the 3 s checkout deadline while the import went on to its end.
#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_large_drop_is_answered_within_the_bulk_deadline_not_a_checkout_calls(pool: PgPool) {
    use holdfast_server::http::deadline::Deadline;
    use std::time::Duration;
    let redis = TestRedis::start();
    let options = holdfast_server::state::StateOptions {
        edge: holdfast_server::http::edge::EdgeConfig {
            // The shortest the configuration allows; a 10,000-SKU import takes longer.
            api_deadline: Deadline(Duration::from_millis(100)),
            ..Default::default()
        },
        ..Default::default()
    };
    let server = common::spawn_with(
        common::backends(pool.clone(), &redis.url()).await,
        options,
        None,
    )
    .await;
    let http = Client::new();
    let catalog = token(&pool, "pim", &[Scope::Catalog]).await;
    let mut csv = String::from("drop,drop_name,sku,product,stock\n");
    for i in 0..10_000 {
        csv.push_str(&format!("large,Large,LARGE-{i:05},Product {},5\n", i / 50));
    }
    let started = std::time::Instant::now();
    let res = http
        .put(server.url("/api/v1/drops/large"))
        .bearer_auth(&catalog)
        .header("Content-Type", "text/csv")
        .body(csv)
        .send()
        .await
        .unwrap();
    let took = started.elapsed();
    let status = res.status();
    let body: Value = res.json().await.unwrap();
    assert_eq!(status, 200, "{body} after {took:?}");
    assert_eq!(body["counters_warmed"], 10_000, "{body}");
    assert!(
        took > Duration::from_millis(100),
        "the import took {took:?}: it no longer shows that the bulk deadline applies"
    );
}
