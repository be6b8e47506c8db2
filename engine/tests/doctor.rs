//! `doctor`: each check against real services, private `redis-server`s
//! configured the way a deployment might be, and the test PostgreSQL.

use holdfast_domain::Lane;
use holdfast_engine::doctor::{CheckLevel, DoctorConfig, DoctorReport, check, run};
use holdfast_engine::postgres;
use holdfast_engine::testkit::{TestRedis, closed_port, pg_url};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

fn config(redis_url: &str, database_url: &str) -> DoctorConfig {
    DoctorConfig {
        redis_url: redis_url.to_owned(),
        database_url: database_url.to_owned(),
        pg_pool_size: 16,
        write_behind_workers: holdfast_engine::record::DEFAULT_WORKERS,
        servers: 1,
        webhook_sources: Ok(vec![("erp".into(), Lane::Feeds)]),
        badge_origins: vec!["https://shop.example".into()],
        settings: Ok(()),
    }
}

fn level(report: &DoctorReport, name: &str) -> CheckLevel {
    report
        .get(name)
        .unwrap_or_else(|| panic!("no '{name}' line in {report:#?}"))
        .level
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn an_evicting_redis_fails_and_the_test_redis_passes(
    _pool: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pg = pg_url(&opts);
    for policy in ["allkeys-lru", "volatile-lru"] {
        let redis = TestRedis::start_with(&["--maxmemory-policy", policy]);
        let report = run(&config(&redis.url(), &pg)).await;
        let eviction = report.get(check::REDIS_EVICTION).unwrap();
        assert_eq!(eviction.level, CheckLevel::Fail, "{eviction:?}");
        assert!(eviction.finding.contains(policy), "{eviction:?}");
        assert!(eviction.action.contains("noeviction"), "{eviction:?}");
        assert_eq!(report.worst(), CheckLevel::Fail);
    }

    let redis = TestRedis::start();
    let report = run(&config(&redis.url(), &pg)).await;
    for name in [
        check::REDIS_REACHABLE,
        check::REDIS_EVICTION,
        check::REDIS_MAXCLIENTS,
        check::CLOCK_SKEW,
        check::REDIS_TLS,
        check::POSTGRES_REACHABLE,
        check::POSTGRES_CONNECTIONS,
        check::POSTGRES_TLS,
        check::WEBHOOK_SOURCES,
        check::BADGE_ORIGINS,
    ] {
        assert_eq!(level(&report, name), CheckLevel::Pass, "{report:#?}");
    }
    // The test Redis persists nothing and has no maxmemory: risks, not faults.
    assert_eq!(level(&report, check::REDIS_PERSISTENCE), CheckLevel::Warn);
    assert_eq!(level(&report, check::REDIS_MEMORY), CheckLevel::Warn);
    assert_eq!(report.worst(), CheckLevel::Warn);
    let skew = report.get(check::CLOCK_SKEW).unwrap();
    assert!(skew.finding.contains("ms"), "{skew:?}");
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn redis_persistence_memory_and_clients_are_judged_from_its_own_figures(
    _pool: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pg = pg_url(&opts);
    let aof = TestRedis::start_with(&["--appendonly", "yes", "--appendfsync", "everysec"]);
    let report = run(&config(&aof.url(), &pg)).await;
    assert_eq!(level(&report, check::REDIS_PERSISTENCE), CheckLevel::Pass);

    // An empty Redis uses about 1 MB: a 1 MB limit leaves no headroom; 1 GB does.
    let tight = TestRedis::start_with(&["--maxmemory", "1mb"]);
    let report = run(&config(&tight.url(), &pg)).await;
    let memory = report.get(check::REDIS_MEMORY).unwrap();
    assert_eq!(memory.level, CheckLevel::Fail, "{memory:?}");
    let roomy = TestRedis::start_with(&["--maxmemory", "1gb"]);
    let report = run(&config(&roomy.url(), &pg)).await;
    assert_eq!(level(&report, check::REDIS_MEMORY), CheckLevel::Pass);

    // maxclients sized for exactly one server: fine alone is too tight (over
    // 80%), two servers cannot both connect.
    let need = holdfast_engine::doctor::redis_connections_per_server(
        holdfast_engine::record::DEFAULT_WORKERS,
    );
    let small = TestRedis::start_with(&["--maxclients", &need.peak.to_string()]);
    let report = run(&config(&small.url(), &pg)).await;
    assert_eq!(level(&report, check::REDIS_MAXCLIENTS), CheckLevel::Warn);
    let two = DoctorConfig {
        servers: 2,
        ..config(&small.url(), &pg)
    };
    let report = run(&two).await;
    let clients = report.get(check::REDIS_MAXCLIENTS).unwrap();
    assert_eq!(clients.level, CheckLevel::Fail, "{clients:?}");
    assert!(
        clients
            .finding
            .contains(&format!("one server opens up to {}", need.peak)),
        "{clients:?}"
    );
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn more_pools_than_max_connections_fail(pool: PgPoolOptions, opts: PgConnectOptions) {
    let pg = pg_url(&opts);
    let db = pool.connect_with(opts).await.unwrap();
    let max: i32 = sqlx::query_scalar("SELECT current_setting('max_connections')::int")
        .fetch_one(&db)
        .await
        .unwrap();
    let redis = TestRedis::start();
    let pool_size = 16;
    let servers = u32::try_from(max).unwrap() / pool_size + 1;
    let report = run(&DoctorConfig {
        servers,
        ..config(&redis.url(), &pg)
    })
    .await;
    let line = report.get(check::POSTGRES_CONNECTIONS).unwrap();
    assert_eq!(line.level, CheckLevel::Fail, "{line:?}");
    assert!(
        line.finding.contains(&format!("max_connections {max}"))
            && line
                .finding
                .contains(&format!("{servers} server(s) × pool {pool_size}")),
        "{line:?}"
    );
    assert_eq!(report.worst(), CheckLevel::Fail);

    let one = run(&config(&redis.url(), &pg)).await;
    assert_eq!(level(&one, check::POSTGRES_CONNECTIONS), CheckLevel::Pass);
}

#[tokio::test]
async fn unreachable_services_are_failing_lines_not_errors() {
    let (redis, pg) = (closed_port(), closed_port());
    let report = run(&config(
        &format!("redis://127.0.0.1:{}", redis.port()),
        &format!("postgres://postgres@127.0.0.1:{}/holdfast", pg.port()),
    ))
    .await;
    assert_eq!(level(&report, check::REDIS_REACHABLE), CheckLevel::Fail);
    assert_eq!(level(&report, check::POSTGRES_REACHABLE), CheckLevel::Fail);
    assert!(
        report.get(check::REDIS_EVICTION).is_none()
            && report.get(check::POSTGRES_CONNECTIONS).is_none(),
        "checks that need a service are left out: {report:#?}"
    );
    // What needs no service is still checked.
    assert_eq!(level(&report, check::REDIS_TLS), CheckLevel::Pass);
    assert_eq!(level(&report, check::WEBHOOK_SOURCES), CheckLevel::Pass);
    assert_eq!(report.worst(), CheckLevel::Fail);
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_database_not_created_yet_is_no_fault(_pool: PgPoolOptions, opts: PgConnectOptions) {
    let redis = TestRedis::start();
    let missing = opts.clone().database("holdfast_doctor_never_created");
    let report = run(&config(&redis.url(), &pg_url(&missing))).await;
    let reachable = report.get(check::POSTGRES_REACHABLE).unwrap();
    assert_eq!(reachable.level, CheckLevel::Pass, "{reachable:?}");
    assert!(
        reachable.finding.contains("does not exist yet"),
        "{reachable:?}"
    );
    assert_eq!(
        level(&report, check::POSTGRES_CONNECTIONS),
        CheckLevel::Pass
    );
}
