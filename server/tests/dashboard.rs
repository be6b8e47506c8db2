//! The dashboard's server functions and live socket: role checks on every server
//! function, cross-site refusal, sign-in with one-time passwords, audited
//! actions, and the WebSocket's snapshot, deltas, replay after a reconnect and
//! job progress.

mod common;

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use holdfast_app::api::GUARDED;
use holdfast_domain::Role;
use holdfast_engine::ReserveRequest;
use holdfast_engine::testkit::{TestRedis, stock};
use holdfast_engine::users;
use serde_json::Value;
use sqlx::PgPool;
use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest};

const PASSWORD: &str = "correct horse battery";

/// A valid form body for each server function, so a refusal can only come from
/// the role or origin check, never from a missing argument.
fn body(path: &str) -> &'static str {
    match path {
        "/api/drop_overview" => "",
        "/api/sku_detail" => "sku=DROP-001",
        "/api/search_holds" => "query=nobody",
        "/api/release_hold" => "reservation_id=r-none&reason=test",
        "/api/split_sku" => "sku=DROP-001&parts=1",
        "/api/force_release_lock" => "name=none&confirm=none",
        "/api/set_lane_paused" => "lane=feeds&paused=false",
        "/api/replay_dead_letter" => "id=0-1",
        "/api/start_reconcile" => "correct_up=false",
        "/api/start_warmup" => "force=false",
        "/api/manual_reserve" => "sku=DROP-001&qty=1",
        "/api/audit_log" => "search=",
        "/api/import_drop" => "text=drop%2Csku&format=csv&dry_run=true&reason=test",
        "/api/export_drop" => "code=winter-launch&format=csv",
        "/api/drop_readiness" => "code=winter-launch",
        "/api/drop_report" => "code=winter-launch",
        "/api/arm_drop" => "code=winter-launch&pause_feeds=false",
        "/api/create_user" => "username=newbie&role=viewer",
        "/api/set_user_role" => "username=viewer&role=viewer",
        "/api/delete_user" => "username=nobody",
        "/api/create_token" => "name=t&scopes=read",
        "/api/revoke_token" => "id=999999",
        "/api/list_locks"
        | "/api/ingestion_status"
        | "/api/operations_status"
        | "/api/verify_now"
        | "/api/deployment_checks"
        | "/api/list_users"
        | "/api/list_tokens" => "",
        other => panic!("no test body for {other}: add one"),
    }
}

struct Dash {
    base: String,
    http: reqwest::Client,
}

impl Dash {
    async fn call(
        &self,
        path: &str,
        form: &str,
        cookie: Option<&str>,
        origin: Option<&str>,
    ) -> (u16, String) {
        let mut req = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form.to_owned());
        if let Some(c) = cookie {
            req = req.header("cookie", c);
        }
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        let res = req.send().await.unwrap();
        (res.status().as_u16(), res.text().await.unwrap())
    }

    /// Calls from this site's own pages (the right Origin).
    async fn own(&self, path: &str, form: &str, cookie: Option<&str>) -> (u16, String) {
        self.call(path, form, cookie, Some(&self.base)).await
    }

    async fn login(&self, username: &str, password: &str) -> String {
        let res = self
            .http
            .post(format!("{}/api/login", self.base))
            .header("content-type", "application/x-www-form-urlencoded")
            .header("origin", &self.base)
            .body(format!(
                "username={username}&password={}",
                password.replace(' ', "+")
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200, "login of {username}");
        let cookie = res
            .headers()
            .get_all("set-cookie")
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .find(|c| c.starts_with("holdfast_session="))
            .expect("a session cookie");
        assert!(
            cookie.contains("HttpOnly") && cookie.contains("SameSite=Lax"),
            "{cookie}"
        );
        cookie.split(';').next().unwrap().to_owned()
    }
}

async fn setup(pool: PgPool) -> (Dash, TestRedis, holdfast_engine::Backends) {
    holdfast_engine::catalog::load_demo_drop(&pool)
        .await
        .unwrap();
    for (name, role) in [
        ("viewer", Role::Viewer),
        ("support", Role::Support),
        ("merchandiser", Role::Merchandiser),
        ("admin", Role::Admin),
    ] {
        users::create(&pool, name, role, PASSWORD, false)
            .await
            .unwrap();
    }
    let redis = TestRedis::start();
    let backends = common::backends(pool, &redis.url()).await;
    stock(&backends.engine, "DROP-001", 50).await;
    let server = common::spawn_live(backends.clone(), &redis.url()).await;
    let dash = Dash {
        base: server.base.clone(),
        http: reqwest::Client::new(),
    };
    (dash, redis, backends)
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn every_server_function_refuses_roles_without_its_permission(pool: PgPool) {
    let (dash, _redis, _b) = setup(pool).await;
    let viewer = dash.login("viewer", PASSWORD).await;
    let support = dash.login("support", PASSWORD).await;
    let merchandiser = dash.login("merchandiser", PASSWORD).await;
    let admin = dash.login("admin", PASSWORD).await;
    for (path, need) in GUARDED {
        let form = body(path);
        let (status, text) = dash.own(path, form, None).await;
        assert_eq!(status, 401, "{path} without a session: {text}");
        assert!(text.contains("not signed in"), "{path}: {text}");
        for (role, cookie) in [
            (Role::Viewer, &viewer),
            (Role::Support, &support),
            (Role::Merchandiser, &merchandiser),
        ] {
            let (status, text) = dash.own(path, form, Some(cookie)).await;
            if !role.may(*need) {
                assert_eq!(status, 403, "{path} as {role:?}: {text}");
                assert!(text.contains("cannot do this"), "{path}: {text}");
            } else {
                assert!(
                    status != 401 && status != 403,
                    "{path} as {role:?} was refused: {text}"
                );
            }
        }
        // An admin passes the guard everywhere (the call itself may still fail,
        // e.g. an unknown lock is a 404).
        let (status, text) = dash.own(path, form, Some(&admin)).await;
        assert!(
            status != 401 && status != 403,
            "{path} as admin was refused: {text}"
        );
    }
}

/// The Drops page's calls answer what went wrong with its status, never a
/// 500: an unknown drop is 404, a file form other than CSV or JSON 400, and
/// a merchandiser arming with the feeds paused 403 (pausing is for operators).
#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn the_drops_pages_refusals_carry_their_status(pool: PgPool) {
    let (dash, _redis, _b) = setup(pool).await;
    let merchandiser = dash.login("merchandiser", PASSWORD).await;
    for (path, form, want) in [
        ("/api/drop_readiness", "code=nope", 404),
        ("/api/drop_report", "code=nope", 404),
        ("/api/export_drop", "code=nope&format=csv", 404),
        ("/api/arm_drop", "code=nope&pause_feeds=false", 404),
        ("/api/export_drop", "code=winter-launch&format=xml", 400),
        (
            "/api/import_drop",
            "text=drop%2Csku&format=xml&dry_run=true&reason=x",
            400,
        ),
        ("/api/arm_drop", "code=winter-launch&pause_feeds=true", 403),
    ] {
        let (status, text) = dash.own(path, form, Some(&merchandiser)).await;
        assert_eq!(status, want, "{path} {form}: {text}");
        assert!(
            text.contains("No drop has the code 'nope'")
                || text.contains("is not a file form")
                || text.contains("for operators"),
            "{path}: {text}"
        );
    }
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_forged_cross_site_call_is_refused_and_changes_nothing(pool: PgPool) {
    let (dash, _redis, b) = setup(pool).await;
    let admin = dash.login("admin", PASSWORD).await;
    b.engine
        .reserve(&ReserveRequest::single("r-1", "DROP-001", 2))
        .await
        .unwrap();
    let form = "reservation_id=r-1&reason=forged";
    for origin in [
        Some("https://evil.example"),
        Some("http://127.0.0.1.evil.example"),
        None,
    ] {
        let (status, text) = dash
            .call("/api/release_hold", form, Some(&admin), origin)
            .await;
        assert_eq!(status, 403, "origin {origin:?}: {text}");
        assert!(text.contains("cross-site"), "{text}");
    }
    // Login itself is protected too (login CSRF).
    let (status, _) = dash
        .call(
            "/api/login",
            "username=admin&password=x",
            None,
            Some("https://evil.example"),
        )
        .await;
    assert_eq!(status, 403);
    assert_eq!(
        b.engine
            .figures("DROP-001")
            .await
            .unwrap()
            .unwrap()
            .reserved,
        2
    );

    let (status, text) = dash
        .own(
            "/api/release_hold",
            "reservation_id=r-1&reason=customer+asked",
            Some(&admin),
        )
        .await;
    assert_eq!(status, 200, "{text}");
    let f = b.engine.figures("DROP-001").await.unwrap().unwrap();
    assert_eq!((f.available, f.reserved), (50, 0));
    let entries = holdfast_engine::audit::recent(&b.pg, Some("release_hold"), None, 10)
        .await
        .unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(
        (entries[0].actor.as_str(), entries[0].subject.as_str()),
        ("admin", "r-1")
    );
    assert_eq!(entries[0].detail["reason"], "customer asked");
    // Releasing again says so, readably.
    let (status, text) = dash
        .own(
            "/api/release_hold",
            "reservation_id=r-1&reason=again",
            Some(&admin),
        )
        .await;
    assert_eq!(status, 409, "{text}");
    assert!(text.contains("already ended"), "{text}");
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn the_first_admin_signs_in_once_with_a_one_time_password(pool: PgPool) {
    let redis = TestRedis::start();
    let backends = common::backends(pool.clone(), &redis.url()).await;
    let server = common::spawn(backends).await;
    let dash = Dash {
        base: server.base.clone(),
        http: reqwest::Client::new(),
    };

    let password = users::ensure_first_admin(&pool)
        .await
        .unwrap()
        .expect("a one-time password");
    assert!(
        users::ensure_first_admin(&pool).await.unwrap().is_none(),
        "only once"
    );
    let (status, _) = dash
        .own(
            "/api/login",
            &format!("username=admin&password={}", "wrong-password"),
            None,
        )
        .await;
    assert_eq!(status, 401);
    let cookie = dash.login("admin", &password).await;
    let (status, text) = dash.own("/api/list_users", "", Some(&cookie)).await;
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("new password"), "{text}");
    // Guessing is throttled: after five wrong passwords even the right one waits.
    for _ in 0..5 {
        let (status, _) = dash
            .own("/api/login", "username=admin&password=wrong-password", None)
            .await;
        assert_eq!(status, 401);
    }
    let res = dash
        .http
        .post(format!("{}/api/login", server.base))
        .header("origin", &server.base)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("username=admin&password={password}"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 429);
    assert!(res.headers().get("retry-after").is_some());
    // The live socket refuses it too: no snapshot before a password is chosen.
    assert_eq!(
        live(&server.base, Some(&cookie), Some(&server.base), None)
            .await
            .err(),
        Some(403)
    );
    // While the name is throttled, its current password cannot be checked either.
    let (status, text) = dash
        .own(
            "/api/change_password",
            &format!("current_password={password}&new_password=a-much-longer-one&repeat=a-much-longer-one"),
            Some(&cookie),
        )
        .await;
    assert_eq!(status, 429, "{text}");
    forget_failed_sign_ins(&redis).await;
    let (status, text) = dash
        .own(
            "/api/change_password",
            &format!("current_password={password}&new_password=short&repeat=short"),
            Some(&cookie),
        )
        .await;
    assert_eq!(status, 400, "{text}");
    // A session alone cannot change the password: the current one is asked for.
    let (status, text) = dash
        .own(
            "/api/change_password",
            "current_password=not-the-password&new_password=a-much-longer-one&repeat=a-much-longer-one",
            Some(&cookie),
        )
        .await;
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("current password"), "{text}");
    let (status, text) = dash
        .own(
            "/api/change_password",
            &format!("current_password={password}&new_password=a-much-longer-one&repeat=a-much-longer-one"),
            Some(&cookie),
        )
        .await;
    assert_eq!(status, 200, "{text}");
    let (status, text) = dash.own("/api/list_users", "", Some(&cookie)).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("\"admin\""), "{text}");
    // The one-time password no longer works (the guessing window is cleared
    // first, so the answer is about the password).
    forget_failed_sign_ins(&redis).await;
    let (status, _) = dash
        .own(
            "/api/login",
            &format!("username=admin&password={password}"),
            None,
        )
        .await;
    assert_eq!(status, 401);
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_forced_lock_release_needs_its_name_and_is_audited(pool: PgPool) {
    let (dash, _redis, b) = setup(pool).await;
    let lease = b
        .engine
        .acquire_lock("nightly-import", Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    let viewer = dash.login("viewer", PASSWORD).await;
    let (status, text) = dash.own("/api/list_locks", "", Some(&viewer)).await;
    assert_eq!(status, 200);
    let locks: Value = serde_json::from_str(&text).unwrap();
    let lock = locks
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "nightly-import")
        .expect("listed");
    assert_eq!(lock["fence"], lease.fence);

    let admin = dash.login("admin", PASSWORD).await;
    let (status, text) = dash
        .own(
            "/api/force_release_lock",
            "name=nightly-import&confirm=nightly",
            Some(&admin),
        )
        .await;
    assert_eq!(status, 400, "{text}");
    assert!(
        b.engine
            .list_locks()
            .await
            .unwrap()
            .iter()
            .any(|l| l.name == "nightly-import")
    );
    let (status, text) = dash
        .own(
            "/api/force_release_lock",
            "name=nightly-import&confirm=nightly-import",
            Some(&admin),
        )
        .await;
    assert_eq!(status, 200, "{text}");
    assert!(
        !b.engine
            .list_locks()
            .await
            .unwrap()
            .iter()
            .any(|l| l.name == "nightly-import")
    );
    assert!(
        !b.engine.release_lock(&lease).await.unwrap(),
        "the old holder lost it"
    );
    let entries = holdfast_engine::audit::recent(&b.pg, Some("force_release_lock"), None, 10)
        .await
        .unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].detail["fence"], lease.fence);
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn live(
    base: &str,
    cookie: Option<&str>,
    origin: Option<&str>,
    cursor: Option<&str>,
) -> Result<Socket, u16> {
    let query = cursor
        .map(|c| format!("?cursor={}", c.replace('|', "%7C")))
        .unwrap_or_default();
    let mut req = format!("{}/live{query}", base.replace("http://", "ws://"))
        .into_client_request()
        .unwrap();
    if let Some(c) = cookie {
        req.headers_mut().insert("cookie", c.parse().unwrap());
    }
    if let Some(o) = origin {
        req.headers_mut().insert("origin", o.parse().unwrap());
    }
    match tokio_tungstenite::connect_async(req).await {
        Ok((ws, _)) => Ok(ws),
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => Err(r.status().as_u16()),
        Err(e) => panic!("{e}"),
    }
}

/// The next message of `kind`, skipping others, within `within`.
async fn next_of(ws: &mut Socket, kind: &str, within: Duration) -> Value {
    tokio::time::timeout(within, async {
        loop {
            match ws.next().await.expect("open").expect("frame") {
                Message::Text(t) => {
                    let v: Value = serde_json::from_str(&t).unwrap();
                    if v["type"] == kind {
                        return v;
                    }
                }
                _ => continue,
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {kind} message within {within:?}"))
}

fn figure(msg: &Value, sku: &str, field: &str) -> Option<i64> {
    msg["skus"].as_array()?.iter().find(|s| s["sku"] == sku)?[field].as_i64()
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn the_live_socket_streams_changes_and_replays_what_a_reconnect_missed(pool: PgPool) {
    let (dash, _redis, b) = setup(pool).await;
    let viewer = dash.login("viewer", PASSWORD).await;
    let base = dash.base.clone();
    assert_eq!(live(&base, None, Some(&base), None).await.err(), Some(401));
    assert_eq!(
        live(&base, Some(&viewer), Some("https://evil.example"), None)
            .await
            .err(),
        Some(403)
    );
    assert_eq!(
        live(&base, Some(&viewer), None, None).await.err(),
        Some(403)
    );

    let mut ws = live(&base, Some(&viewer), Some(&base), None)
        .await
        .expect("connects");
    let snapshot = next_of(&mut ws, "snapshot", Duration::from_secs(3)).await;
    assert_eq!(figure(&snapshot, "DROP-001", "available"), Some(50));
    ws.send(Message::Text(r#"{"type":"watch","sku":"DROP-001"}"#.into()))
        .await
        .unwrap();

    // A reservation made elsewhere shows within a second.
    b.engine
        .reserve(&ReserveRequest::single("live-1", "DROP-001", 3))
        .await
        .unwrap();
    let delta = next_of(&mut ws, "figures", Duration::from_secs(1)).await;
    assert_eq!(figure(&delta, "DROP-001", "available"), Some(47));
    assert_eq!(figure(&delta, "DROP-001", "reserved"), Some(3));
    let events = next_of(&mut ws, "events", Duration::from_secs(1)).await;
    assert_eq!(events["events"][0]["reservation_id"], "live-1");
    let cursor = delta["cursor"].as_str().unwrap().to_owned();
    drop(ws);

    // While disconnected: two more changes.
    b.engine
        .reserve(&ReserveRequest::single("live-2", "DROP-001", 1))
        .await
        .unwrap();
    b.engine.release("live-1").await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut ws = live(&base, Some(&viewer), Some(&base), Some(&cursor))
        .await
        .expect("reconnects");
    ws.send(Message::Text(r#"{"type":"watch","sku":"DROP-001"}"#.into()))
        .await
        .unwrap();
    let snapshot = next_of(&mut ws, "snapshot", Duration::from_secs(3)).await;
    assert_eq!(figure(&snapshot, "DROP-001", "available"), Some(49));
    assert_eq!(figure(&snapshot, "DROP-001", "reserved"), Some(1));
    let replayed: Vec<(String, String)> = snapshot["replayed"]
        .as_array()
        .expect("missed events replayed")
        .iter()
        .map(|e| {
            (
                e["kind"].as_str().unwrap().to_owned(),
                e["reservation_id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        replayed,
        [
            ("reserved".to_owned(), "live-2".to_owned()),
            ("released".to_owned(), "live-1".to_owned())
        ]
    );
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_warm_up_reports_progress_to_every_tab_until_done(pool: PgPool) {
    let (dash, _redis, b) = setup(pool).await;
    let admin = dash.login("admin", PASSWORD).await;
    let mut ws = live(&dash.base, Some(&admin), Some(&dash.base), None)
        .await
        .expect("connects");
    next_of(&mut ws, "snapshot", Duration::from_secs(3)).await;
    let (status, text) = dash
        .own("/api/start_warmup", "force=false", Some(&admin))
        .await;
    assert_eq!(status, 200, "{text}");
    let id: u64 = text.trim().parse().expect("a job id");
    let done = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let job = next_of(&mut ws, "job", Duration::from_secs(10)).await;
            if job["id"] == id && job["state"]["state"] == "finished" {
                return job;
            }
        }
    })
    .await
    .expect("the job finishes");
    assert_eq!(done["done"], done["total"]);
    assert_eq!(done["total"], 6, "the demo drop's six SKUs");
    // DROP-001 was stocked by the test; the other five were warmed by the job.
    assert!(b.engine.figures("DROP-006").await.unwrap().is_some());
    let audit = holdfast_engine::audit::recent(&b.pg, Some("start_warmup"), None, 5)
        .await
        .unwrap();
    assert_eq!(audit.len(), 1);
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn an_open_live_socket_closes_when_its_session_ends(pool: PgPool) {
    let (dash, _redis, _b) = setup(pool.clone()).await;
    let cookie = dash.login("viewer", PASSWORD).await;
    let mut ws = live(&dash.base, Some(&cookie), Some(&dash.base), None)
        .await
        .expect("the socket opens");
    next_of(&mut ws, "snapshot", Duration::from_secs(3)).await;
    let (status, _) = dash.own("/api/logout", "", Some(&cookie)).await;
    assert_eq!(status, 200);
    let closed = common::closes_within(&mut ws, Duration::from_secs(8)).await;
    assert!(closed, "a logged-out tab stops receiving within seconds");
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn one_account_opens_a_bounded_number_of_live_tabs(pool: PgPool) {
    let (dash, _redis, _b) = setup(pool.clone()).await;
    let cookie = dash.login("viewer", PASSWORD).await;
    let max = holdfast_server::live::hub::TABS_PER_ACCOUNT;
    let open_one = || live(&dash.base, Some(&cookie), Some(&dash.base), None);
    let mut tabs = Vec::new();
    for _ in 0..max {
        // Under the handshake rate (5 a second per address).
        tokio::time::sleep(Duration::from_millis(250)).await;
        tabs.push(open_one().await.expect("a tab within the account's bound"));
    }
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(open_one().await.err(), Some(429), "one tab past the bound");
    drop(tabs.pop());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(open_one().await.is_ok(), "a closed tab's place came back");
}

/// Clears every sign-in failure count (the guessing window), so a later
/// answer is about the password alone.
async fn forget_failed_sign_ins(redis: &TestRedis) {
    let mut conn = redis.connection().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("hf:login:*")
        .query_async(&mut conn)
        .await
        .unwrap();
    if !keys.is_empty() {
        redis::cmd("DEL")
            .arg(keys)
            .query_async::<()>(&mut conn)
            .await
            .unwrap();
    }
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn an_admin_runs_the_deployment_checks_from_the_operations_page(pool: PgPool) {
    use holdfast_domain::doctor::{CheckLevel, DoctorReport};
    let db = holdfast_engine::testkit::pg_url(&pool.connect_options());
    users::create(&pool, "admin", Role::Admin, PASSWORD, false)
        .await
        .unwrap();
    let redis = TestRedis::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    let backends = common::backends(pool, &redis.url()).await;
    let options = holdfast_server::state::StateOptions {
        doctor: Some(std::sync::Arc::new(holdfast_engine::doctor::DoctorConfig {
            redis_url: redis.url(),
            database_url: db,
            pg_pool_size: 4,
            write_behind_workers: holdfast_engine::record::DEFAULT_WORKERS,
            servers: 1,
            webhook_sources: Ok(Vec::new()),
            badge_origins: Vec::new(),
            settings: Ok(()),
        })),
        ..holdfast_server::state::StateOptions::default()
    };
    let server = common::spawn_with(backends, options, None).await;
    let dash = Dash {
        base: server.base.clone(),
        http: reqwest::Client::new(),
    };
    let admin = dash.login("admin", PASSWORD).await;
    let (status, text) = dash.own("/api/deployment_checks", "", Some(&admin)).await;
    assert_eq!(status, 200, "{text}");
    let report: DoctorReport = serde_json::from_str(&text).unwrap();
    // This Redis evicts keys: the report fails on it, as `holdfast doctor` does.
    assert_eq!(report.worst(), CheckLevel::Fail, "{report:?}");
    assert!(
        report
            .checks
            .iter()
            .any(|c| c.level == CheckLevel::Fail && c.finding.contains("allkeys-lru")),
        "{report:?}"
    );
    assert!(
        report.checks.iter().any(|c| c.level == CheckLevel::Pass),
        "the other checks ran: {report:?}"
    );
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn an_admin_splits_a_sku_from_the_dashboard_and_it_is_audited(pool: PgPool) {
    let (dash, _redis, b) = setup(pool).await;
    let admin = dash.login("admin", PASSWORD).await;
    let support = dash.login("support", PASSWORD).await;
    let (status, _) = dash
        .own("/api/split_sku", "sku=DROP-001&parts=4", Some(&support))
        .await;
    assert_eq!(status, 403, "support may not split");
    let (status, text) = dash
        .own("/api/split_sku", "sku=DROP-001&parts=4", Some(&admin))
        .await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("4 part(s)"), "{text}");
    let f = b.engine.figures("DROP-001").await.unwrap().unwrap();
    assert_eq!((f.available, f.parts), (50, 4));
    let (status, text) = dash
        .own("/api/sku_detail", "sku=DROP-001", Some(&admin))
        .await;
    assert_eq!(status, 200, "{text}");
    let detail: Value = serde_json::from_str(&text).unwrap();
    let parts: Vec<i64> = serde_json::from_value(detail["part_available"].clone()).unwrap();
    assert_eq!((parts.len(), parts.iter().sum::<i64>()), (4, 50));
    assert_eq!(detail["figures"]["available"], 50, "{detail}");
    // With a hold open, a change is refused and says why.
    b.engine
        .reserve(&ReserveRequest::single("r-split", "DROP-001", 2))
        .await
        .unwrap();
    let (status, text) = dash
        .own("/api/split_sku", "sku=DROP-001&parts=1", Some(&admin))
        .await;
    assert_eq!(status, 409, "{text}");
    assert!(text.contains("open holds"), "{text}");
    let (status, text) = dash
        .own("/api/split_sku", "sku=DROP-001&parts=17", Some(&admin))
        .await;
    assert_eq!(status, 400, "{text}");
    let entries = holdfast_engine::audit::recent(&b.pg, Some("split_sku"), None, 10)
        .await
        .unwrap();
    assert_eq!(entries.len(), 1, "only the change is audited");
    assert_eq!(entries[0].detail["to"], 4);
}

/// What a raw `POST` of `head`'s request (and `body`, maybe partial) gets
/// back within 3 s: the answer's first bytes, or empty if the server closed
/// or said nothing (the connection is kept open meanwhile, body unfinished).
async fn raw_answer(base: &str, head: &str, body: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://");
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(head.as_bytes()).await.unwrap();
    let _ = tcp.write_all(body).await;
    let mut buf = vec![0u8; 8192];
    match tokio::time::timeout(Duration::from_secs(3), tcp.read(&mut buf)).await {
        Ok(Ok(n)) => String::from_utf8_lossy(&buf[..n]).into_owned(),
        _ => String::new(),
    }
}

/// A server function's request head, for `path`, with extra header lines.
fn head(dash: &Dash, path: &str, extra: &str) -> String {
    let host = dash.base.trim_start_matches("http://");
    format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nOrigin: {}\r\n\
         Content-Type: application/x-www-form-urlencoded\r\n{extra}\r\n",
        dash.base
    )
}

/// Server functions' bodies are read whole before the function can check its
/// caller, so what an unsigned caller may make the server hold is bounded:
/// forms are small, refused as they are declared or as they run past the
/// bound, and the drop file is read only for a signed-in caller, two at once
/// per account. The signed-in merchandiser's file, larger than the 2 MiB the
/// server-function reader took before, goes through.
#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn server_function_bodies_are_bounded_before_they_are_read(pool: PgPool) {
    let (dash, _redis, b) = setup(pool).await;
    let limit = holdfast_server::http::server_fns::FORM_BODY_LIMIT;

    // A form declared over its bound: 413 at once, nothing read.
    let declared = head(&dash, "/api/login", "Content-Length: 1000000\r\n");
    let answer = raw_answer(&dash.base, &declared, b"").await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    // One sent in chunks, running past the bound: cut off there, 413.
    let chunked = head(&dash, "/api/login", "Transfer-Encoding: chunked\r\n");
    let chunk = format!(
        "{:x}\r\nusername=a&password={}\r\n",
        limit + 20,
        "x".repeat(limit)
    );
    let answer = raw_answer(&dash.base, &chunked, chunk.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    // Within the bound, a form is the function's as before.
    let (status, text) = dash
        .own("/api/login", "username=nobody&password=wrong", None)
        .await;
    assert_eq!(status, 401, "{text}");

    // The drop file, 3 MiB declared, without a session: 401 at once, in the
    // words the function itself uses, its body never waited for.
    let file = head(&dash, "/api/import_drop", "Content-Length: 3145728\r\n");
    let answer = raw_answer(&dash.base, &file, b"text=").await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(
        answer.contains(holdfast_app::server::guard::NOT_SIGNED_IN),
        "{answer}"
    );
    let (status, text) = dash
        .own("/api/import_drop", body("/api/import_drop"), None)
        .await;
    assert_eq!(status, 401);
    assert!(
        text.contains(holdfast_app::server::guard::NOT_SIGNED_IN),
        "{text}"
    );

    // Signed in but not allowed to edit drops, or from another site: the
    // function's own 403, at once.
    let viewer = dash.login("viewer", PASSWORD).await;
    let file = head(
        &dash,
        "/api/import_drop",
        &format!("Cookie: {viewer}\r\nContent-Length: 3145728\r\n"),
    );
    let answer = raw_answer(&dash.base, &file, b"text=").await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(answer.contains("cannot do this"), "{answer}");
    let merchandiser = dash.login("merchandiser", PASSWORD).await;
    let cross = format!(
        "POST /api/import_drop HTTP/1.1\r\nHost: {}\r\nOrigin: http://evil.example\r\n\
         Cookie: {merchandiser}\r\nContent-Length: 3145728\r\n\r\n",
        dash.base.trim_start_matches("http://")
    );
    let answer = raw_answer(&dash.base, &cross, b"text=").await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(
        answer.contains(holdfast_app::server::guard::CROSS_SITE),
        "{answer}"
    );

    // Signed in: 10,000 SKUs as JSON, over 2 MiB as a form, previewed.
    let skus: Vec<Value> = (0..10_000)
        .map(|i| {
            serde_json::json!({
                "sku": format!("BULK-{i:05}"),
                "product": "Sticker",
                "variant": "matte/7cm/vinyl",
                "title": format!(
                    "Sticker number {i:05}: die-cut, matte, seven centimetres across, \
                     printed on recycled vinyl"
                ),
                "stock": 10,
            })
        })
        .collect();
    let sheet = serde_json::json!({"code": "bulk", "name": "Bulk", "skus": skus}).to_string();
    let res = dash
        .http
        .post(format!("{}/api/import_drop", dash.base))
        .header("origin", &dash.base)
        .header("cookie", &merchandiser)
        .form(&[
            ("text", sheet.as_str()),
            ("format", "json"),
            ("dry_run", "true"),
            ("reason", "bulk"),
        ])
        .build()
        .unwrap();
    let size = res.body().and_then(|b| b.as_bytes()).unwrap().len();
    assert!(size > 2 * 1024 * 1024, "the form is {size} bytes");
    let res = dash.http.execute(res).await.unwrap();
    let status = res.status();
    let text = res.text().await.unwrap();
    assert_eq!(status, 200, "{}", &text[..text.len().min(300)]);
    assert!(
        text.starts_with(r#"{"outcome":"done""#),
        "{}",
        &text[..text.len().min(300)]
    );
    assert!(text.contains("BULK-09999"), "every SKU previewed");

    // Two files of the account on their way: a third is 429 at once; once
    // they are given up, the account sends again.
    let cookie_line = format!("Cookie: {merchandiser}\r\nContent-Length: 1048576\r\n");
    let slow = head(&dash, "/api/import_drop", &cookie_line);
    let mut held = Vec::new();
    for _ in 0..2 {
        use tokio::io::AsyncWriteExt;
        let addr = dash.base.trim_start_matches("http://");
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tcp.write_all(slow.as_bytes()).await.unwrap();
        tcp.write_all(b"text=").await.unwrap();
        held.push(tcp);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, text) = dash
        .own(
            "/api/import_drop",
            body("/api/import_drop"),
            Some(&merchandiser),
        )
        .await;
    assert_eq!(status, 429, "{text}");
    drop(held);
    let mut status = 0;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        (status, _) = dash
            .own(
                "/api/import_drop",
                body("/api/import_drop"),
                Some(&merchandiser),
            )
            .await;
        if status != 429 {
            break;
        }
    }
    assert_eq!(status, 200, "the account's places came back");

    // Imports run on after their callers leave, so the process bounds how
    // many run at once: with every place taken, one more is 409 busy.
    let taken = b
        .imports
        .clone()
        .try_acquire_many_owned(holdfast_engine::drop_file::IMPORTS_AT_ONCE as u32)
        .unwrap();
    let small = "text=drop%2Csku%2Cproduct%2Cstock%0Asmall%2CS-1%2CSticker%2C1\
                 &format=csv&dry_run=true&reason=t";
    let (status, text) = dash
        .own("/api/import_drop", small, Some(&merchandiser))
        .await;
    assert_eq!(status, 409, "{text}");
    assert!(text.contains("drop imports are running"), "{text}");
    drop(taken);
    let (status, text) = dash
        .own("/api/import_drop", small, Some(&merchandiser))
        .await;
    assert_eq!(status, 200, "{text}");
    assert!(text.starts_with(r#"{"outcome":"done""#), "{text}");
}
