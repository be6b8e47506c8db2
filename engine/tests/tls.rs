//! TLS and authentication to Redis and PostgreSQL, against local servers that
//! present a certificate from a CA the test creates: verified connections
//! work, unverifiable ones are refused, and a wrong password is refused.

use std::time::Duration;

use holdfast_engine::testkit::{TestCa, TestCluster, TestPostgres, TestRedis, stock};
use holdfast_engine::{
    ConfirmOutcome, Engine, EngineConfig, EngineError, ReserveOutcome, ReserveRequest, postgres,
    redis_conn,
};

/// The reason a Redis connection to `url` was refused.
async fn redis_refusal(url: &str) -> String {
    match redis_conn::connect(url).await {
        Ok(_) => panic!("{url} connected"),
        Err(EngineError::RedisUnreachable { reason, .. }) => reason,
        Err(other) => panic!("{url}: unexpected error {other}"),
    }
}

#[tokio::test]
async fn redis_over_tls_verifies_the_server_and_authenticates() {
    let ca = TestCa::new();
    let redis = TestRedis::start_tls_as(&ca, "holdfast", "s3cret-pass");
    let port = redis.port();
    let ca_file = ca.file("ca.crt");
    let good = format!("rediss://holdfast:s3cret-pass@127.0.0.1:{port}/?ssl_ca_certs={ca_file}");

    // Verified and authenticated: the scripts run over it.
    let engine = Engine::new(
        redis_conn::connect(&good).await.unwrap(),
        EngineConfig::default(),
    );
    stock(&engine, "TLS-1", 5).await;
    let figures = engine.figures("TLS-1").await.unwrap().expect("warmed");
    assert_eq!(figures.available, 5);
    // The host name is checked too: the certificate names localhost and 127.0.0.1.
    let by_name = format!("rediss://holdfast:s3cret-pass@localhost:{port}/?ssl_ca_certs={ca_file}");
    redis_conn::connect(&by_name).await.unwrap();

    // Without the CA, the system's roots do not vouch for the server.
    let reason = redis_refusal(&format!("rediss://holdfast:s3cret-pass@127.0.0.1:{port}")).await;
    assert!(reason.contains("certificate"), "{reason}");
    // Another CA does not either.
    let other = TestCa::new();
    let reason = redis_refusal(&format!(
        "rediss://holdfast:s3cret-pass@127.0.0.1:{port}/?ssl_ca_certs={}",
        other.file("ca.crt")
    ))
    .await;
    assert!(reason.contains("certificate"), "{reason}");
    // Wrong password, no user, plain TCP to the TLS port: all refused.
    let reason = redis_refusal(&format!(
        "rediss://holdfast:wrong@127.0.0.1:{port}/?ssl_ca_certs={ca_file}"
    ))
    .await;
    assert!(reason.contains("authentication failed"), "{reason}");
    let reason = redis_refusal(&format!(
        "rediss://127.0.0.1:{port}/?ssl_ca_certs={ca_file}"
    ))
    .await;
    assert!(reason.to_lowercase().contains("auth"), "{reason}");
    redis_refusal(&format!("redis://holdfast:s3cret-pass@127.0.0.1:{port}")).await;

    // Certificate files are read at once and named when wrong.
    let reason = redis_refusal(&format!(
        "rediss://holdfast:s3cret-pass@127.0.0.1:{port}/?ssl_ca_certs=/nonexistent/ca.pem"
    ))
    .await;
    assert!(reason.contains("/nonexistent/ca.pem"), "{reason}");
    let reason = redis_refusal(&format!(
        "rediss://holdfast:s3cret-pass@127.0.0.1:{port}/?ssl_ca_certs={ca_file}&ssl_certfile={ca_file}"
    ))
    .await;
    assert!(reason.contains("go together"), "{reason}");
    let reason = redis_refusal(&format!("redis://127.0.0.1:{port}/?ssl_ca_certs={ca_file}")).await;
    assert!(reason.contains("rediss://"), "{reason}");
}

/// A Redis Cluster whose nodes speak TLS only (to clients, to each other and
/// to their replicas): seed URLs naming the CA reach every master, the engine
/// sells on each of them and payments wait for their replica's
/// acknowledgement over TLS; without the CA, or with another, it is refused.
#[tokio::test]
async fn a_cluster_over_tls_verifies_every_node() {
    let ca = TestCa::new();
    let cluster = TestCluster::start_tls(&ca, 3, 1);
    let url = cluster.url();
    assert!(
        url.split(',').all(|seed| seed.starts_with("rediss://")),
        "{url}"
    );
    let config = EngineConfig {
        confirm_replicas: 1,
        confirm_replica_timeout: Duration::from_secs(2),
        ..EngineConfig::default()
    };
    let conn = redis_conn::connect(&url).await.unwrap();
    assert!(conn.is_cluster(), "TLS seeds make a cluster connection");
    let engine =
        Engine::new(conn, config).with_replica_acks(redis_conn::connect(&url).await.unwrap());
    engine.check_layout().await.unwrap();

    let ks = engine.keyspace();
    let skus = holdfast_engine::testkit::skus_in_distinct_shards(&engine, "TLSC", 12);
    let masters: std::collections::HashSet<usize> =
        skus.iter().map(|s| cluster.master_of(&ks.sku(s))).collect();
    assert_eq!(masters.len(), 3, "the SKUs live on all three masters");
    for (i, sku) in skus.iter().enumerate() {
        stock(&engine, sku, 5).await;
        let rid = format!("tls-{i}");
        let held = engine
            .reserve(&ReserveRequest::single(&rid, sku, 2))
            .await
            .unwrap();
        assert!(matches!(held, ReserveOutcome::Reserved { .. }), "{held:?}");
        assert_eq!(
            engine.confirm(&rid).await.unwrap(),
            ConfirmOutcome::Confirmed
        );
        let figures = engine.figures(sku).await.unwrap().expect("warmed");
        assert_eq!((figures.available, figures.sold_pending), (3, 2), "{sku}");
    }

    // Without the CA, or with another, no node is trusted.
    let seeds_without_ca: Vec<String> = url
        .split(',')
        .map(|seed| seed.split("/?").next().unwrap().to_owned())
        .collect();
    let reason = redis_refusal(&seeds_without_ca.join(",")).await;
    assert!(reason.contains("certificate"), "{reason}");
    let other = TestCa::new();
    let with_other: Vec<String> = seeds_without_ca
        .iter()
        .map(|seed| format!("{seed}/?ssl_ca_certs={}", other.file("ca.crt")))
        .collect();
    let reason = redis_refusal(&with_other.join(",")).await;
    assert!(reason.contains("certificate"), "{reason}");
}

#[tokio::test]
async fn postgres_over_tls_verifies_the_server() {
    let ca = TestCa::new();
    let pg = TestPostgres::start_tls(&ca);
    let ca_file = ca.file("ca.crt");
    let url = format!(
        "{}?sslmode=verify-full&sslrootcert={ca_file}",
        pg.url("holdfast")
    );

    let pool = postgres::connect_and_migrate(&url, 2).await.unwrap();
    let encrypted: bool =
        sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(encrypted, "the session is encrypted");
    pool.close().await;

    // verify-full without the CA: the system's roots do not vouch for it.
    let unverified = format!("{}?sslmode=verify-full", pg.url("holdfast"));
    match postgres::connect_and_migrate(&unverified, 2).await {
        Ok(_) => panic!("connected without the CA"),
        Err(EngineError::PostgresUnreachable { reason, .. }) => {
            assert!(reason.to_lowercase().contains("certificate"), "{reason}");
        }
        Err(other) => panic!("unexpected error {other}"),
    }
    // Another CA does not either.
    let other = TestCa::new();
    let wrong = format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        pg.url("holdfast"),
        other.file("ca.crt")
    );
    assert!(postgres::connect_and_migrate(&wrong, 2).await.is_err());
}
