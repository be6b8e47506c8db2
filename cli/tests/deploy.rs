//! What an operator deploying Holdfast relies on: traces exported over OTLP when
//! the standard variables ask for it (and flushed when the server stops), and
//! the deployment files in `docs/deploy/` naming only real settings.

mod common;

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::HeaderMap;
use holdfast_engine::testkit::TestRedis;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::net::TcpListener;

/// One export a fake collector received: its content type and body.
type Export = (String, Vec<u8>);

/// A minimal OTLP/HTTP collector on a free port: accepts `POST /v1/traces` and
/// keeps what arrived.
async fn collector() -> (String, Arc<Mutex<Vec<Export>>>) {
    let got = Arc::new(Mutex::new(Vec::new()));
    let kept = got.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let kept = kept.clone();
            async move {
                let kind = headers
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                kept.lock().unwrap().push((kind, body.to_vec()));
                ""
            }
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, got)
}

/// Waits (at most 20 s) for an export whose body contains `needle`.
async fn received(got: &Mutex<Vec<Export>>, needle: &str) -> Export {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(export) = got
            .lock()
            .unwrap()
            .iter()
            .find(|(_, body)| String::from_utf8_lossy(body).contains(needle))
        {
            return export.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no export mentioning {needle} arrived"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Asks the server at `url` for its readiness with the caller's request id.
async fn request_with_id(url: &str, id: &str) {
    let answer = reqwest::Client::new()
        .get(format!("{url}/readyz"))
        .header("x-request-id", id)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.headers()["x-request-id"], id);
}

/// A span as exported: its service, its name and its attributes (key, string value).
type Span = (String, String, Vec<(String, String)>);

/// Every span in an OTLP/JSON export.
fn spans(body: &[u8]) -> Vec<Span> {
    let json: serde_json::Value = serde_json::from_slice(body).expect("an OTLP/JSON body");
    let attrs = |v: &serde_json::Value| -> Vec<(String, String)> {
        v.as_array()
            .into_iter()
            .flatten()
            .map(|a| {
                (
                    a["key"].as_str().unwrap_or_default().to_owned(),
                    a["value"]["stringValue"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                )
            })
            .collect()
    };
    let mut out = Vec::new();
    for rs in json["resourceSpans"].as_array().into_iter().flatten() {
        let service = attrs(&rs["resource"]["attributes"])
            .into_iter()
            .find(|(k, _)| k == "service.name")
            .map(|(_, v)| v)
            .unwrap_or_default();
        for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
            for span in ss["spans"].as_array().into_iter().flatten() {
                out.push((
                    service.clone(),
                    span["name"].as_str().unwrap_or_default().to_owned(),
                    attrs(&span["attributes"]),
                ));
            }
        }
    }
    out
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn requests_are_traced_over_otlp_json(_pool: PgPoolOptions, opts: PgConnectOptions) {
    let pg_url = common::pg_url(&opts);
    let redis = TestRedis::start();
    let (otlp, got) = collector().await;
    let (mut child, url, _, _out) = common::serve(
        &redis,
        &pg_url,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("HOLDFAST_LOG", "info"),
        ],
    );
    request_with_id(&url, "trace-me-json-1").await;
    let (kind, body) = received(&got, "trace-me-json-1").await;
    let _ = child.kill();
    let _ = child.wait();
    assert!(kind.starts_with("application/json"), "{kind}");
    let spans = spans(&body);
    let request = spans
        .iter()
        .find(|(_, name, attrs)| {
            name == "request"
                && attrs
                    .iter()
                    .any(|(k, v)| k == "request_id" && v == "trace-me-json-1")
        })
        .unwrap_or_else(|| panic!("a request span with its id: {spans:?}"));
    assert_eq!(request.0, "holdfast", "the default service name");
    assert!(
        request.2.iter().any(|(k, v)| k == "path" && v == "/readyz"),
        "{request:?}"
    );
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn spans_still_buffered_are_sent_when_the_server_stops(
    _pool: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pg_url = common::pg_url(&opts);
    let redis = TestRedis::start();
    let (otlp, got) = collector().await;
    // Protobuf (the default protocol), a named service, and batches sent only
    // every 10 minutes: the span can only arrive through the flush at shutdown.
    let (mut child, url, _, _out) = common::serve(
        &redis,
        &pg_url,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp),
            ("OTEL_SERVICE_NAME", "holdfast-eu-1"),
            ("OTEL_BSP_SCHEDULE_DELAY", "600000"),
            ("HOLDFAST_LOG", "info"),
        ],
    );
    request_with_id(&url, "trace-me-at-exit-1").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        got.lock().unwrap().is_empty(),
        "nothing is sent before the batch is due"
    );
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let (kind, body) = received(&got, "trace-me-at-exit-1").await;
    let status = child.wait().unwrap();
    assert!(status.success(), "a clean exit after SIGTERM: {status}");
    assert_eq!(kind, "application/x-protobuf");
    // Protobuf keeps strings as they are: the span's id and service are in it.
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.contains("holdfast-eu-1") && text.contains("request_id"),
        "{text}"
    );
}

#[test]
fn a_trace_setting_it_cannot_honour_stops_the_start() {
    let out = Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .arg("serve")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .output()
        .expect("run holdfast");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("error: OTEL_EXPORTER_OTLP_PROTOCOL=grpc is not supported"),
        "{stderr}"
    );
}

#[test]
fn the_deployment_files_name_only_real_settings() {
    let help = Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .args(["serve", "--help"])
        .output()
        .expect("run holdfast serve --help");
    let help = String::from_utf8_lossy(&help.stdout);
    let env_file = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/deploy/holdfast.env");
    let text = std::fs::read_to_string(env_file).unwrap();
    let mut names = 0;
    for line in text.lines() {
        let line = line.trim_start_matches('#').trim();
        let Some((name, _)) = line.split_once('=') else {
            continue;
        };
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_') {
            continue;
        }
        names += 1;
        if !name.starts_with("OTEL_") {
            assert!(
                help.contains(&format!("[env: {name}")),
                "{name} in holdfast.env is not a `holdfast serve` setting"
            );
        }
    }
    assert!(
        names >= 5,
        "the env file lists the settings a deployment needs"
    );
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/deploy/holdfast.service"
    ))
    .unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/holdfast serve"));
    assert!(unit.contains("EnvironmentFile=/etc/holdfast/holdfast.env"));
}
