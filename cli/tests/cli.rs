//! The `holdfast` binary as an operator runs it: `warm`, `reconcile`, `--help`,
//! and a start-up failure in one line.

mod common;

use std::process::Command;

use holdfast_engine::testkit::{TestRedis, closed_port};
use holdfast_engine::{Engine, EngineConfig, catalog, redis_conn};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn warm_then_reconcile_from_the_command_line(pool: PgPoolOptions, opts: PgConnectOptions) {
    let pg_url = common::pg_url(&opts);
    let pg = pool.connect_with(opts).await.unwrap();
    catalog::load_demo_drop(&pg).await.unwrap();
    let redis = TestRedis::start();

    let (ok, out, err) = common::holdfast(&["warm"], &redis.url(), &pg_url);
    assert!(ok, "warm failed: {err}");
    assert!(out.contains("warm-up finished"), "{out}");
    assert!(
        out.contains("counters written") && out.contains("  6"),
        "six demo SKUs warmed:\n{out}"
    );
    assert!(
        err.contains("warming: 100%"),
        "progress shown on stderr: {err}"
    );

    let (ok, out, _) = common::holdfast(&["warm"], &redis.url(), &pg_url);
    assert!(ok);
    assert!(
        out.lines()
            .any(|l| l.contains("already warm") && l.trim_end().ends_with('6')),
        "idempotent:\n{out}"
    );

    // Corrupt one counter upward by hand: reconciliation must bring it down.
    let engine = Engine::new(
        redis_conn::connect(&redis.url()).await.unwrap(),
        EngineConfig::default(),
    );
    let mut conn = redis_conn::connect(&redis.url()).await.unwrap();
    redis::cmd("HSET")
        .arg(engine.keyspace().sku("DROP-005"))
        .arg("available")
        .arg(99)
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    // The truth check names the lie and exits non-zero.
    let (ok, out, _) = common::holdfast(&["verify"], &redis.url(), &pg_url);
    assert!(!ok, "verify must fail on a drifting counter:\n{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("FAIL") && l.contains("stock conserved")),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("DROP-005") && l.contains("available 99")),
        "the failing SKU's figures:\n{out}"
    );

    let (ok, out, err) = common::holdfast(&["reconcile"], &redis.url(), &pg_url);
    assert!(ok, "reconcile failed: {err}");
    assert!(out.contains("reconciliation run"), "{out}");
    let row = |name: &str| {
        out.lines()
            .find(|l| l.contains(name))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(row("SKUs checked").trim_end().ends_with('6'), "{out}");
    assert!(row("corrected down").trim_end().ends_with('1'), "{out}");
    let (ok, out, err) = common::holdfast(&["verify"], &redis.url(), &pg_url);
    assert!(ok, "verify after reconcile: {out}{err}");
    assert!(out.contains("every check held"), "{out}");
    assert_eq!(
        engine.figures("DROP-005").await.unwrap().unwrap().available,
        25
    );
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn tokens_are_created_once_listed_and_revoked(_pool: PgPoolOptions, opts: PgConnectOptions) {
    let pg_url = common::pg_url(&opts);
    let redis = TestRedis::start();
    let (ok, out, err) = common::holdfast(
        &[
            "token",
            "create",
            "--name",
            "checkout-prod",
            "--scopes",
            "checkout,read",
        ],
        &redis.url(),
        &pg_url,
    );
    assert!(ok, "{err}");
    let secret = out.lines().nth(1).unwrap_or_default();
    assert!(secret.starts_with("hf_") && secret.len() > 40, "{out}");
    assert!(err.contains("shown once"), "{err}");
    let (ok, listed, _) = common::holdfast(&["token", "list"], &redis.url(), &pg_url);
    assert!(ok);
    assert!(
        listed.contains("checkout-prod")
            && listed.contains("checkout,read")
            && listed.contains("active"),
        "{listed}"
    );
    assert!(!listed.contains(secret), "the secret is never listed");
    let (ok, _, err) = common::holdfast(
        &["token", "create", "--name", "x", "--scopes", "admin"],
        &redis.url(),
        &pg_url,
    );
    assert!(!ok && err.contains("unknown scope 'admin'"), "{err}");
    let id = listed.split_whitespace().next().unwrap();
    let (ok, out, _) = common::holdfast(&["token", "revoke", id], &redis.url(), &pg_url);
    assert!(ok && out.contains("revoked"), "{out}");
    let (ok, _, err) = common::holdfast(&["token", "revoke", id], &redis.url(), &pg_url);
    assert!(!ok && err.contains("no active token"), "{err}");
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn serve_with_demo_loads_and_warms_the_drop(_pool: PgPoolOptions, opts: PgConnectOptions) {
    let pg_url = common::pg_url(&opts);
    let redis = TestRedis::start();
    let (mut child, url, printed, _out) = common::serve(&redis, &pg_url, &[("HOLDFAST_DEMO", "1")]);
    assert!(url.starts_with("http://127.0.0.1:"), "{printed}");
    assert!(
        printed.contains(
            "Demo sign-in: users admin, support, merchandiser and viewer, password 'holdfast-demo'"
        ),
        "{printed}"
    );

    // Signed out, the dashboard sends to the login page; the demo's admin gets in.
    let http = reqwest::Client::new();
    let html = http.get(&url).send().await.unwrap().text().await.unwrap();
    assert!(!html.contains("Winter Launch Drop"));
    let login = http
        .post(format!("{url}/api/login"))
        .header("origin", &url)
        .form(&[("username", "admin"), ("password", "holdfast-demo")])
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), 200);
    let cookie = login.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let html = http
        .get(&url)
        .header("cookie", cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(html.contains("Winter Launch Drop"), "{html}");
    let engine = Engine::new(
        redis_conn::connect(&redis.url()).await.unwrap(),
        EngineConfig::default(),
    );
    let f = engine.figures("DROP-001").await.unwrap();
    assert_eq!(
        f.map(|f| (f.available, f.per_buyer_limit)),
        Some((2_000, 2)),
        "warmed with its limit"
    );
    // Every background worker runs on: none stops and is started again (the
    // failover watch, with no cluster to watch, once returned at once).
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let metrics = common::metrics(&http, &url).await;
    assert!(
        metrics
            .lines()
            .any(|l| l == "holdfast_worker_restarts_total 0"),
        "{metrics}"
    );
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn the_binary_prints_one_line_and_exits_non_zero_when_redis_is_down() {
    let closed = closed_port();
    let url = format!("redis://127.0.0.1:{}", closed.port());
    let out = Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .arg("serve")
        .env("REDIS_URL", &url)
        .env("HOLDFAST_LOG", "off")
        .env("HOLDFAST_LISTEN", "127.0.0.1:0")
        .output()
        .expect("run holdfast");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "exactly one line: {stderr}");
    assert!(
        lines[0].starts_with(&format!("error: cannot reach Redis at {url}")),
        "{stderr}"
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "{stderr}"
    );
}

#[test]
fn help_lists_the_commands_and_environment() {
    let out = Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .args(["serve", "--help"])
        .output()
        .expect("run holdfast --help");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "REDIS_URL",
        "DATABASE_URL",
        "HOLDFAST_LISTEN",
        "--allow-evicting-redis",
        "--demo",
    ] {
        assert!(help.contains(needle), "--help mentions {needle}:\n{help}");
    }
}

/// Resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_burst_of_sign_ins_keeps_the_servers_memory_bounded(
    _pool: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pg_url = common::pg_url(&opts);
    let redis = TestRedis::start();
    let (mut child, url, _, _out) = common::serve(&redis, &pg_url, &[]);
    let http = reqwest::Client::new();
    let attempt = |i: usize| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            http.post(format!("{url}/api/login"))
                .header("origin", &url)
                .form(&[
                    ("username", format!("ghost-{i}")),
                    ("password", "not-the-password".to_owned()),
                ])
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    // Warm up (first hashes allocate the pool the hasher reuses).
    futures_util::future::join_all((0..4).map(attempt)).await;
    let before = rss_kib(child.id());
    let mut statuses = Vec::new();
    for round in 0..4 {
        let burst = (0..48).map(|i| attempt(1_000 * (round + 1) + i));
        statuses.extend(futures_util::future::join_all(burst).await);
    }
    let after = rss_kib(child.id());
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        statuses.iter().all(|s| *s == 401 || *s == 429),
        "{statuses:?}"
    );
    assert!(statuses.contains(&429), "{statuses:?}");
    // Four hashes of ~19 MiB at most at once; 192 attempts unbounded took
    // hundreds of MiB.
    let grew_mib = after.saturating_sub(before) / 1024;
    assert!(grew_mib < 120, "resident memory grew by {grew_mib} MiB");
}

#[test]
fn the_demo_password_is_refused_beyond_loopback() {
    let (ok, _, err) = common::holdfast(
        &["serve", "--demo", "--listen", "0.0.0.0:0"],
        "redis://127.0.0.1:1",
        "postgres://127.0.0.1:1/none",
    );
    assert!(!ok);
    assert!(err.contains("--demo-password"), "{err}");
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_drop_goes_out_and_back_in_as_a_file(pool: PgPoolOptions, opts: PgConnectOptions) {
    let pg_url = common::pg_url(&opts);
    let pg = pool.connect_with(opts).await.unwrap();
    catalog::load_demo_drop(&pg).await.unwrap();
    let redis = TestRedis::start();
    let dir = tempfile::tempdir().unwrap();

    let (ok, csv, err) = common::holdfast(
        &["drop", "export", catalog::DEMO_DROP],
        &redis.url(),
        &pg_url,
    );
    assert!(ok, "{err}");
    assert!(csv.starts_with("drop,drop_name,"), "{csv}");
    assert_eq!(csv.lines().count(), 7, "a header and six SKUs:\n{csv}");
    let file = dir.path().join("winter.csv");
    std::fs::write(&file, &csv).unwrap();
    let path = file.to_str().unwrap();
    let (ok, out, err) = common::holdfast(&["drop", "import", path], &redis.url(), &pg_url);
    assert!(ok, "{err}");
    assert!(out.contains("nothing to change"), "{out}");

    // A preview of an edit, then the edit: the pin set gets 8 more units.
    let edited = csv.replace("Enamel Pin Set,12,", "Enamel Pin Set,20,");
    assert_ne!(edited, csv);
    std::fs::write(&file, &edited).unwrap();
    let (ok, out, err) = common::holdfast(
        &["drop", "import", path, "--dry-run"],
        &redis.url(),
        &pg_url,
    );
    assert!(ok, "{err}");
    assert!(out.contains("DROP-006 stock: 12 -> 20"), "{out}");
    assert!(out.contains("dry run: nothing was written"), "{out}");
    let (ok, out, err) = common::holdfast(
        &["drop", "import", path, "--reason", "found a box"],
        &redis.url(),
        &pg_url,
    );
    assert!(ok, "{err}");
    assert!(out.contains("changed 1 thing(s)"), "{out}");
    let engine = Engine::new(
        redis_conn::connect(&redis.url()).await.unwrap(),
        EngineConfig::default(),
    );
    assert_eq!(
        engine.figures("DROP-006").await.unwrap().unwrap().available,
        20
    );
    let reason: String =
        sqlx::query_scalar("SELECT reason FROM stock_changes WHERE sku = 'DROP-006'")
            .fetch_one(&pg)
            .await
            .unwrap();
    assert_eq!(reason, "found a box");

    // A bad file: exit 2, each problem by line and column, nothing changed.
    let bad = edited.replace("Enamel Pin Set,20,", "Enamel Pin Set,many,");
    std::fs::write(&file, bad).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .args(["drop", "import", path])
        .env("REDIS_URL", redis.url())
        .env("DATABASE_URL", &pg_url)
        .env("HOLDFAST_LOG", "warn")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 7, column stock: 'many' is not a whole number"),
        "{err}"
    );
    assert_eq!(
        engine.figures("DROP-006").await.unwrap().unwrap().available,
        20
    );
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_sku_is_split_and_shown_from_the_command_line(
    pool: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pg_url = common::pg_url(&opts);
    let pg = pool.connect_with(opts).await.unwrap();
    catalog::load_demo_drop(&pg).await.unwrap();
    let redis = TestRedis::start();
    let (ok, _, err) = common::holdfast(&["warm"], &redis.url(), &pg_url);
    assert!(ok, "warm failed: {err}");

    let (ok, out, err) = common::holdfast(&["split", "DROP-001"], &redis.url(), &pg_url);
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 2, "one part shown:\n{out}");
    let (ok, out, err) = common::holdfast(
        &["split", "DROP-001", "--parts", "4"],
        &redis.url(),
        &pg_url,
    );
    assert!(ok, "{err}");
    assert!(out.contains("now in 4 part(s) (was 1)"), "{out}");
    assert_eq!(out.lines().count(), 6, "four parts shown:\n{out}");
    // A reader that stops early (`| head -1`): the command ends quietly.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let closed = Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .args(["split", "DROP-001"])
        .env("REDIS_URL", redis.url())
        .env("DATABASE_URL", &pg_url)
        .env("HOLDFAST_LOG", "warn")
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&closed.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(closed.status.code(), Some(141), "{err}");
    let parts: i16 = sqlx::query_scalar("SELECT parts FROM skus WHERE sku = 'DROP-001'")
        .fetch_one(&pg)
        .await
        .unwrap();
    assert_eq!(parts, 4, "the system of record knows the split");
    let entries = holdfast_engine::audit::recent(&pg, Some("split_sku"), None, 10)
        .await
        .unwrap();
    assert_eq!(entries.len(), 1);
    assert!(entries[0].actor.starts_with("cli:"), "{}", entries[0].actor);
    // A count out of range is refused by the parser, with the range.
    let (ok, _, err) = common::holdfast(
        &["split", "DROP-001", "--parts", "17"],
        &redis.url(),
        &pg_url,
    );
    assert!(!ok);
    assert!(err.contains("1..=16"), "{err}");
    // A hold open: refused, saying why, and nothing changes.
    let engine = Engine::new(
        redis_conn::connect(&redis.url()).await.unwrap(),
        EngineConfig::default(),
    );
    let held = engine
        .reserve(
            &holdfast_engine::ReserveRequest::single("cli-hold", "DROP-001", 1).for_buyer("b-1"),
        )
        .await
        .unwrap();
    assert!(
        matches!(held, holdfast_engine::ReserveOutcome::Reserved { .. }),
        "{held:?}"
    );
    let (ok, _, err) = common::holdfast(
        &["split", "DROP-001", "--parts", "1"],
        &redis.url(),
        &pg_url,
    );
    assert!(!ok);
    assert!(err.contains("open holds"), "{err}");
    assert_eq!(engine.figures("DROP-001").await.unwrap().unwrap().parts, 4);
}
