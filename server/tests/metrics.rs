//! `/metrics` speaks Prometheus text and reflects live state.

mod common;

use holdfast_engine::ingest;
use holdfast_engine::testkit::TestRedis;
use sqlx::PgPool;

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn metrics_expose_health_lag_and_lanes(pool: PgPool) {
    let redis = TestRedis::start();
    let server = common::spawn(common::backends(pool, &redis.url()).await).await;
    let mut conn = redis.connection().await;
    ingest::pause(&mut conn, holdfast_domain::Lane::Feeds)
        .await
        .unwrap();
    holdfast_engine::testkit::queue_payload(&mut conn, holdfast_domain::Lane::Feeds, "erp", b"{}")
        .await;

    let res = reqwest::get(server.url("/metrics")).await.unwrap();
    assert_eq!(res.status(), 200);
    assert!(
        res.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    let text = res.text().await.unwrap();
    assert!(text.ends_with("# EOF\n"), "OpenMetrics ends with # EOF");
    for line in [
        "holdfast_redis_up 1",
        "holdfast_postgres_up 1",
        "holdfast_reaper_released_total 0",
        "holdfast_write_behind_lag_entries 0",
        "holdfast_ingest_backlog{lane=\"feeds\"} 1",
        "holdfast_ingest_paused{lane=\"feeds\"} 1",
        "holdfast_ingest_paused{lane=\"orders\"} 0",
        "holdfast_ingest_applied_total{lane=\"orders\"} 0",
        "# TYPE holdfast_write_behind_events counter",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing `{line}` in:\n{text}"
        );
    }
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_postgres_pool_with_every_connection_busy_shows_in_the_wait(pool: PgPool) {
    let redis = TestRedis::start();
    let server = common::spawn(common::backends(pool.clone(), &redis.url()).await).await;
    let wait = || async {
        let text = scrape(&server).await;
        text.lines()
            .find_map(|l| l.strip_prefix("holdfast_postgres_pool_acquire_wait_seconds "))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no pool wait in:\n{text}"))
    };
    let free = wait().await;
    assert!(free < 0.25, "a free connection is taken at once: {free}");
    // Every connection of the pool busy: the scrape waits its whole limit.
    let mut busy = Vec::new();
    for _ in 0..pool.options().get_max_connections() {
        busy.push(pool.acquire().await.unwrap());
    }
    assert_eq!(wait().await, 0.25, "an exhausted pool");
    drop(busy);
    assert!(wait().await < 0.25, "free again");
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn with_a_scrape_token_only_the_scraper_reads_metrics(pool: PgPool) {
    use holdfast_server::routes::metrics::MetricsAccess;
    use holdfast_server::state::StateOptions;
    let redis = TestRedis::start();
    let options = StateOptions {
        metrics: MetricsAccess(Some("scrape-token-0123456789".into())),
        ..StateOptions::default()
    };
    let server =
        common::spawn_with(common::backends(pool, &redis.url()).await, options, None).await;
    let http = reqwest::Client::new();
    for wrong in [None, Some("nope"), Some("scrape-token-012345678")] {
        let mut req = http.get(server.url("/metrics"));
        if let Some(t) = wrong {
            req = req.bearer_auth(t);
        }
        let res = req.send().await.unwrap();
        assert_eq!(res.status(), 401, "{wrong:?}");
        assert!(
            !res.text().await.unwrap().contains("holdfast_"),
            "{wrong:?}"
        );
    }
    let res = http
        .get(server.url("/metrics"))
        .bearer_auth("scrape-token-0123456789")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(res.text().await.unwrap().contains("holdfast_redis_up 1"));
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn after_a_short_sale_every_metric_is_exported_with_its_type(pool: PgPool) {
    use holdfast_engine::tokens::{self, Scope};
    let redis = TestRedis::start();
    let backends = common::backends(pool.clone(), &redis.url()).await;
    holdfast_engine::catalog::load_demo_drop(&pool)
        .await
        .unwrap();
    holdfast_engine::warmup::warm_all(
        &backends.engine,
        &pool,
        holdfast_engine::warmup::WarmOptions::default(),
        |_| {},
    )
    .await
    .unwrap();
    let server = common::spawn_live(backends, &redis.url()).await;
    let token = tokens::create(&pool, "metrics", &[Scope::Checkout, Scope::Read])
        .await
        .unwrap()
        .secret;
    let http = reqwest::Client::new();
    // Reservations until one SKU sells out, then one more (answered from memory).
    let sku = "DROP-006";
    let mut sold_out = 0;
    for i in 0..200 {
        let res = http
            .post(server.url("/api/v1/reservations"))
            .bearer_auth(&token)
            .header("idempotency-key", format!("m-{i}"))
            .json(&serde_json::json!({"sku": sku, "qty": 1, "buyer": format!("b-{i}")}))
            .send()
            .await
            .unwrap();
        if res.status() == 409 {
            sold_out += 1;
            if sold_out == 2 {
                break;
            }
        }
    }
    assert_eq!(sold_out, 2, "{sku} sold out within 200 attempts");
    http.get(server.url(&format!("/api/v1/stock/{sku}")))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    // The live hub catches up with the sale.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let text = loop {
        let text = scrape(&server).await;
        if text.contains(&format!("holdfast_sku_available{{sku=\"{sku}\"}} 0"))
            || std::time::Instant::now() > deadline
        {
            break text;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    for (name, kind) in [
        ("holdfast_http_request_duration_seconds", "histogram"),
        ("holdfast_redis_command_duration_seconds", "histogram"),
        ("holdfast_reservations", "counter"),
        ("holdfast_sold_out_cache_hits", "counter"),
        ("holdfast_feed_reads", "counter"),
        ("holdfast_split_gathers", "counter"),
        ("holdfast_split_moves", "counter"),
        ("holdfast_split_moved_units", "counter"),
        ("holdfast_sku_available", "gauge"),
        ("holdfast_sku_reserved", "gauge"),
        ("holdfast_sku_sold_pending", "gauge"),
        ("holdfast_sku_drift", "gauge"),
        ("holdfast_open_holds", "gauge"),
        ("holdfast_live_connections", "gauge"),
        ("holdfast_badge_connections", "gauge"),
        ("holdfast_ingest_received_payloads", "counter"),
        ("holdfast_ingest_received_bytes", "counter"),
        ("holdfast_redis_used_memory_bytes", "gauge"),
        ("holdfast_redis_maxmemory_bytes", "gauge"),
        ("holdfast_redis_memory_fragmentation_ratio", "gauge"),
        ("holdfast_redis_connected_clients", "gauge"),
        ("holdfast_redis_maxclients", "gauge"),
        ("holdfast_redis_evicted_keys", "counter"),
        ("holdfast_redis_keyspace_misses", "counter"),
        ("holdfast_redis_master", "gauge"),
        ("holdfast_redis_replicas", "gauge"),
        ("holdfast_redis_replica_lag_bytes", "gauge"),
        ("holdfast_redis_aof_enabled", "gauge"),
        ("holdfast_redis_server_changes", "counter"),
        ("holdfast_postgres_pool_connections", "gauge"),
        ("holdfast_postgres_pool_max_connections", "gauge"),
        ("holdfast_postgres_pool_acquire_wait_seconds", "gauge"),
        ("holdfast_write_behind_lag_seconds", "gauge"),
    ] {
        let line = format!("# TYPE {name} {kind}");
        assert!(
            text.lines().any(|l| l == line),
            "missing `{line}` in:\n{text}"
        );
    }
    // Every metric the shipped alert rules and Grafana dashboard query exists.
    let exported: std::collections::HashSet<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    for name in queried_metrics() {
        assert!(
            exported.contains(name.as_str()),
            "the rules or dashboard query `{name}`, which /metrics does not export:\n{text}"
        );
    }
    // The live feed read the sale's events (the live hub saw them).
    let feed_reads: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("holdfast_feed_reads_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    assert!(feed_reads > 0, "the feed's reads are counted:\n{text}");
    for line in [
        "holdfast_reservations_total{outcome=\"reserved\"}",
        "holdfast_reservations_total{outcome=\"sold_out\"} 1",
        "holdfast_sold_out_cache_hits_total 1",
        "holdfast_redis_command_duration_seconds_count{command=\"reserve\"}",
        "holdfast_http_request_duration_seconds_bucket{le=\"0.00025\",route=\"/api/v1/reservations\",status=\"4xx\"}",
        "holdfast_http_request_duration_seconds_bucket{le=\"1.024\",route=\"/api/v1/stock/{sku}\",status=\"2xx\"}",
        "holdfast_sku_available{sku=\"DROP-006\"} 0",
        "holdfast_redis_evicted_keys_total 0",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(line)),
            "missing `{line}` in:\n{text}"
        );
    }
}

/// The metric names the alert rules' and the dashboard's queries use.
fn queried_metrics() -> std::collections::BTreeSet<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations");
    let mut queries = Vec::new();
    // The rules' `expr:` values, one line or an indented block.
    let rules = std::fs::read_to_string(root.join("prometheus-rules.yml")).unwrap();
    let mut in_expr: Option<usize> = None;
    for line in rules.lines() {
        let indent = line.len() - line.trim_start().len();
        match in_expr {
            Some(at) if indent > at && !line.trim().is_empty() => queries.push(line.to_owned()),
            _ => in_expr = None,
        }
        if let Some(rest) = line.trim_start().strip_prefix("expr:") {
            queries.push(rest.to_owned());
            in_expr = Some(indent);
        }
    }
    // Every `expr` in the dashboard.
    fn exprs(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                        _ => exprs(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| exprs(v, out)),
            _ => {}
        }
    }
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("grafana-dashboard.json")).unwrap(),
    )
    .unwrap();
    exprs(&dashboard, &mut queries);
    assert!(queries.len() > 20, "found the queries: {queries:?}");
    let mut names = std::collections::BTreeSet::new();
    for q in &queries {
        let mut rest = q.as_str();
        while let Some(at) = rest.find("holdfast_") {
            let name: String = rest[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = &rest[at + name.len()..];
            names.insert(name);
        }
    }
    names
}

/// The text of one `/metrics` scrape of `server`.
async fn scrape(server: &common::TestServer) -> String {
    reqwest::get(server.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}
