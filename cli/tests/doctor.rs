//! `holdfast doctor` as an operator runs it: the table, an exit code that
//! follows the worst line, `serve`'s settings read as `serve` reads them, and
//! the Redis connections a real server opens against the doctor's count.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use holdfast_engine::doctor::{CheckLevel, DoctorReport, redis_connections_per_server};
use holdfast_engine::redis_conn;
use holdfast_engine::testkit::TestRedis;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// Runs `holdfast doctor args…` against `redis` and `pg` with `env`; its exit
/// code and what it printed on stdout.
fn doctor(redis: &str, pg: &str, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .arg("doctor")
        .args(args)
        .env("REDIS_URL", redis)
        .env("DATABASE_URL", pg)
        .env("HOLDFAST_LOG", "warn")
        // The settings under test come from `env` and `args` only.
        .env_remove("HOLDFAST_INGEST_SOURCES")
        .env_remove("HOLDFAST_BADGE_ORIGINS")
        .env_remove("HOLDFAST_PG_MAX_CONNECTIONS")
        .envs(env.iter().copied())
        .output()
        .expect("run holdfast doctor");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// What was printed with every run of whitespace as one space, so text the
/// table wrapped reads as one line again.
fn flat(out: &str) -> String {
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The table's row for `check`, as printed (level first).
fn row<'a>(out: &'a str, check: &str) -> &'a str {
    out.lines()
        .find(|l| l.get(6..).is_some_and(|rest| rest.starts_with(check)))
        .unwrap_or_else(|| panic!("no '{check}' row in:\n{out}"))
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn an_evicting_redis_fails_and_exits_2(_pool: PgPoolOptions, opts: PgConnectOptions) {
    let pg = common::pg_url(&opts);
    let redis = TestRedis::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    let (code, out) = doctor(&redis.url(), &pg, &[], &[]);
    assert_eq!(code, Some(2), "{out}");
    let eviction = row(&out, "redis eviction policy");
    assert!(
        eviction.starts_with("fail") && eviction.contains("allkeys-lru"),
        "{out}"
    );
    assert!(
        flat(&out).contains("→ Set `maxmemory-policy noeviction`"),
        "{out}"
    );
    assert!(
        out.lines()
            .last()
            .is_some_and(|l| l.contains("NOT READY") && l.ends_with("(exit 2)")),
        "{out}"
    );
    // The override `serve` accepts changes nothing here: the doctor reports it.
    let (code, _) = doctor(&redis.url(), &pg, &["--allow-evicting-redis"], &[]);
    assert_eq!(code, Some(2));
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn the_test_redis_passes_and_warnings_exit_0_unless_strict(
    _pool: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pg = common::pg_url(&opts);
    let redis = TestRedis::start();
    let (code, out) = doctor(&redis.url(), &pg, &[], &[]);
    assert_eq!(code, Some(0), "warnings alone exit 0:\n{out}");
    for check in [
        "redis eviction policy",
        "clock skew",
        "redis tls",
        "postgres max_connections",
    ] {
        assert!(row(&out, check).starts_with("pass"), "{check}:\n{out}");
    }
    // The test Redis persists nothing, and no source or origin is configured.
    for check in ["redis persistence", "webhook sources", "badge origins"] {
        assert!(row(&out, check).starts_with("warn"), "{check}:\n{out}");
    }
    assert!(
        flat(&out).contains("`holdfast warm`"),
        "the way back is named:\n{out}"
    );
    let (code, _) = doctor(&redis.url(), &pg, &["--strict"], &[]);
    assert_eq!(code, Some(1), "--strict: a warning exits 1");

    // `serve`'s own flags and variables are read, with `serve`'s rules.
    let (_, out) = doctor(
        &redis.url(),
        &pg,
        &[
            "--ingest-source",
            "erp=feeds:0123456789abcdef",
            "--badge-origin",
            "https://shop.example",
        ],
        &[],
    );
    assert!(
        row(&out, "webhook sources").starts_with("pass") && out.contains("erp → feeds"),
        "{out}"
    );
    assert!(row(&out, "badge origins").starts_with("pass"), "{out}");
    let (code, out) = doctor(
        &redis.url(),
        &pg,
        &[],
        &[("HOLDFAST_INGEST_SOURCES", "erp=feeds:too-short")],
    );
    assert_eq!(code, Some(2), "{out}");
    let sources = row(&out, "webhook sources");
    assert!(sources.starts_with("fail"), "{out}");
    assert!(
        !out.contains("too-short"),
        "the secret is never printed:\n{out}"
    );

    // The same report as JSON, for machines.
    let (code, out) = doctor(&redis.url(), &pg, &["--json"], &[]);
    assert_eq!(code, Some(0));
    let report: DoctorReport = serde_json::from_str(&out).expect("--json prints the report");
    assert_eq!(report.worst(), CheckLevel::Warn);
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn more_servers_than_postgres_can_hold_exit_2(pool: PgPoolOptions, opts: PgConnectOptions) {
    let pg = common::pg_url(&opts);
    let db = pool.connect_with(opts).await.unwrap();
    let max: i32 = sqlx::query_scalar("SELECT current_setting('max_connections')::int")
        .fetch_one(&db)
        .await
        .unwrap();
    let redis = TestRedis::start();
    // The pool size comes from serve's variable; the fleet from --servers.
    let servers = (max / 10 + 1).to_string();
    let (code, out) = doctor(
        &redis.url(),
        &pg,
        &["--servers", &servers],
        &[("HOLDFAST_PG_MAX_CONNECTIONS", "10")],
    );
    assert_eq!(code, Some(2), "{out}");
    let line = row(&out, "postgres max_connections");
    assert!(line.starts_with("fail"), "{out}");
    assert!(
        flat(&out).contains(&format!("{servers} server(s) × pool 10")),
        "{out}"
    );
    let (code, out) = doctor(&redis.url(), &pg, &["--servers", "1"], &[]);
    assert_eq!(code, Some(0), "{out}");
}

#[test]
fn help_states_the_exit_codes() {
    let out = Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .args(["doctor", "--help"])
        .output()
        .expect("run holdfast doctor --help");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "Exit codes",
        "--strict",
        "--servers",
        "2  some line failed",
        "--ingest-source",
        "HOLDFAST_PG_MAX_CONNECTIONS",
    ] {
        assert!(help.contains(needle), "--help mentions {needle}:\n{help}");
    }
}

/// Clients connected to the Redis `conn` talks to, not counting `conn`.
async fn clients(conn: &mut holdfast_engine::RedisConn) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("clients")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse::<u64>().ok())
        .unwrap()
        - 1
}

/// The count the maxclients line works with is what a real server opens.
#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_real_server_opens_the_redis_connections_doctor_counts(
    _pool: PgPoolOptions,
    opts: PgConnectOptions,
) {
    use std::io::BufRead;
    let pg = common::pg_url(&opts);
    let redis = TestRedis::start();
    let mut child = Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .arg("serve")
        .env("REDIS_URL", redis.url())
        .env("DATABASE_URL", &pg)
        .env("HOLDFAST_LISTEN", "127.0.0.1:0")
        .env("HOLDFAST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start holdfast serve");
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("Holdfast is serving at ") {
        line.clear();
        if out.read_line(&mut line).unwrap_or(0) == 0 {
            let _ = child.kill();
            let _ = child.wait();
            panic!("holdfast serve exited early");
        }
    }
    let need = redis_connections_per_server(holdfast_engine::record::DEFAULT_WORKERS);
    let mut conn = redis_conn::connect(&redis.url()).await.unwrap();
    // The workers and the live side connect on their own after start-up: wait
    // for the held connections, then watch a while for more.
    let (mut most, mut settled) = (0, None);
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(20) {
        let now = clients(&mut conn).await;
        most = most.max(now);
        if now >= need.steady && settled.is_none() {
            settled = Some(Instant::now());
        }
        if settled.is_some_and(|at| at.elapsed() > Duration::from_secs(3)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let held = clients(&mut conn).await;
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        held, need.steady,
        "a serving server holds the connections doctor counts: {need:?}"
    );
    assert!(
        most <= need.peak,
        "never more than doctor's peak: saw {most}, {need:?}"
    );
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn settings_serve_would_refuse_fail_the_report(_pool: PgPoolOptions, opts: PgConnectOptions) {
    let pg = common::pg_url(&opts);
    let redis = TestRedis::start();
    let (code, out) = doctor(&redis.url(), &pg, &[], &[]);
    assert!(row(&out, "serve settings").starts_with("pass"), "{out}");
    assert_eq!(code, Some(0), "{out}");
    for (name, value) in [
        // Longer than the 15 s request timeout: serve refuses.
        ("HOLDFAST_API_DEADLINE_MS", "20000"),
        ("HOLDFAST_TRUSTED_PROXIES", "10.0.0.0/99"),
        ("HOLDFAST_HOLD_TTL_SECS", "7200"),
        ("HOLDFAST_LANE_CAPS", "orders:0"),
        (
            "HOLDFAST_INGEST_SOURCES",
            "erp=feeds:0123456789abcdef,erp=orders:0123456789abcdef",
        ),
    ] {
        let (code, out) = doctor(&redis.url(), &pg, &[], &[(name, value)]);
        assert_eq!(code, Some(2), "{name}={value}:\n{out}");
        assert!(
            row(&out, "serve settings").starts_with("fail"),
            "{name}:\n{out}"
        );
    }
}
