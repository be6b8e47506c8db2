//! Start-up checks: unreachable services and an evicting Redis fail in one clear line.

mod common;

use holdfast_engine::testkit::{TestRedis, closed_port};
use holdfast_engine::{EngineConfig, EngineError};
use holdfast_server::startup;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

#[tokio::test]
async fn unreachable_redis_names_the_url_and_what_to_do() {
    let closed = closed_port();
    let url = format!("redis://127.0.0.1:{}", closed.port());
    let err = startup::connect(
        &url,
        "postgres://unused@127.0.0.1:1/x",
        false,
        2,
        EngineConfig::default(),
    )
    .await
    .err()
    .expect("connecting to a closed port must fail");
    assert!(
        matches!(err, EngineError::RedisUnreachable { .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains(&url), "message names the URL: {msg}");
    assert!(msg.contains("REDIS_URL"), "message says what to do: {msg}");
    assert!(!msg.contains('\n'), "one line: {msg}");
}

#[tokio::test]
async fn unreachable_postgres_names_the_url_without_the_password() {
    let redis = TestRedis::start();
    let closed = closed_port();
    let url = format!(
        "postgres://holdfast:hunter2@127.0.0.1:{}/holdfast",
        closed.port()
    );
    let err = startup::connect(&redis.url(), &url, false, 2, EngineConfig::default())
        .await
        .err()
        .expect("connecting to a closed port must fail");
    assert!(
        matches!(err, EngineError::PostgresUnreachable { .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("holdfast:***@127.0.0.1"),
        "URL shown redacted: {msg}"
    );
    assert!(!msg.contains("hunter2"), "password never shown: {msg}");
    assert!(
        msg.contains("DATABASE_URL"),
        "message says what to do: {msg}"
    );
}

#[tokio::test]
async fn evicting_redis_is_refused_unless_overridden() {
    let redis = TestRedis::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    let err = startup::connect(
        &redis.url(),
        "postgres://unused@127.0.0.1:1/x",
        false,
        2,
        EngineConfig::default(),
    )
    .await
    .err()
    .expect("allkeys-lru must be refused");
    match &err {
        EngineError::EvictingRedis { policy, .. } => assert_eq!(policy, "allkeys-lru"),
        other => panic!("expected EvictingRedis, got {other:?}"),
    }
    assert!(
        err.to_string().contains("--allow-evicting-redis"),
        "names the override: {err}"
    );
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn evicting_redis_starts_only_with_the_override_and_volatile_is_refused_too(
    _pool: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pg = common::pg_url(&opts);
    let evicting = TestRedis::start_with(&["--maxmemory-policy", "allkeys-lfu"]);
    let backends = startup::connect(&evicting.url(), &pg, true, 2, EngineConfig::default()).await;
    assert!(backends.is_ok(), "override accepted: {:?}", backends.err());

    // volatile-* spares counters but evicts event guards, buyer counters,
    // tombstones and locks: refused like allkeys-*, with the same override.
    let volatile = TestRedis::start_with(&["--maxmemory-policy", "volatile-lru"]);
    let refused = startup::connect(&volatile.url(), &pg, false, 2, EngineConfig::default()).await;
    match refused {
        Err(EngineError::EvictingRedis { policy, .. }) => assert_eq!(policy, "volatile-lru"),
        other => panic!("volatile-lru must be refused: {:?}", other.err()),
    }
    let overridden = startup::connect(&volatile.url(), &pg, true, 2, EngineConfig::default()).await;
    assert!(overridden.is_ok(), "{:?}", overridden.err());
}
