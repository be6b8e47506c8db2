//! The OpenAPI document matches the routes: every documented operation is served
//! by a handler (a JSON answer from the API, not the router's 404 or 405), and the
//! document lists exactly the API's operations.

mod common;

use holdfast_engine::testkit::TestRedis;
use serde_json::Value;
use sqlx::PgPool;

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn every_documented_operation_is_served(pool: PgPool) {
    let redis = TestRedis::start();
    let server = common::spawn(common::backends(pool, &redis.url()).await).await;
    let http = reqwest::Client::new();
    let doc: Value = http
        .get(server.url("/api/v1/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        doc["openapi"].as_str().is_some_and(|v| v.starts_with('3')),
        "an OpenAPI 3 document"
    );

    let mut operations = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().unwrap().keys() {
            operations.push(format!("{} {path}", method.to_uppercase()));
        }
    }
    operations.sort();
    assert_eq!(
        operations,
        vec![
            "GET /api/v1/drops/{code}",
            "GET /api/v1/drops/{code}/report",
            "GET /api/v1/reservations/{id}",
            "GET /api/v1/stock",
            "GET /api/v1/stock/{sku}",
            "POST /api/v1/reservations",
            "POST /api/v1/reservations/{id}/confirm",
            "POST /api/v1/reservations/{id}/release",
            "PUT /api/v1/drops/{code}",
        ],
        "the document lists the API's operations"
    );

    for op in &operations {
        let (method, path) = op.split_once(' ').unwrap();
        let url = server.url(
            &path
                .replace("{id}", "t1-x")
                .replace("{sku}", "A-1")
                .replace("{code}", "spring"),
        );
        let req = match method {
            "GET" => http.get(url),
            "PUT" => http.put(url).json(&serde_json::json!({})),
            _ => http.post(url).json(&serde_json::json!({})),
        };
        let res = req.send().await.unwrap();
        let status = res.status().as_u16();
        let body: Value = res.json().await.unwrap_or(Value::Null);
        assert_eq!(
            status, 401,
            "{op} is routed to a handler that checks the token"
        );
        assert_eq!(
            body["code"], "unauthorized",
            "{op} answers the API's JSON error"
        );
        let documented = &doc["paths"][path][method.to_lowercase()]["responses"]["401"];
        assert!(documented.is_object(), "{op} documents its 401");
    }
    let missing = http
        .get(server.url("/api/v1/nothing-here"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404, "undocumented paths are not served");
}
