//! The background workers run on threads of their own at a lower priority
//! than the request threads (`--background-threads`, `--background-nice`),
//! still record every sale and return every expired hold from there (also
//! after every Redis connection is cut), and their threads end with the
//! server.
//!
//! One test in its own binary: it counts the process' threads by name.

mod common;

use std::time::{Duration, Instant};

use holdfast_engine::testkit::{TestRedis, add_sku};
use holdfast_engine::tokens::{self, Scope};
use holdfast_engine::warmup::{WarmOptions, warm_all};
use holdfast_server::background::THREAD_NAME;
use serde_json::{Value, json};
use sqlx::PgPool;

/// The nice value of each of this process' threads named `name`.
fn nice_of_threads(name: &str) -> Vec<i32> {
    let mut nice = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let path = task.path();
        // A thread may end between the listing and the read.
        let (Ok(comm), Ok(stat)) = (
            std::fs::read_to_string(path.join("comm")),
            std::fs::read_to_string(path.join("stat")),
        ) else {
            continue;
        };
        if comm.trim_end() == name {
            nice.push(nice_in(&stat));
        }
    }
    nice
}

/// The nice value in a `/proc/…/stat` line: its 19th field, the 17th after
/// the command name (which may hold spaces, so the line is cut at its `)`).
fn nice_in(stat: &str) -> i32 {
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    after_name
        .split_whitespace()
        .nth(16)
        .unwrap()
        .parse()
        .unwrap()
}

/// The calling thread's nice value.
fn own_nice() -> i32 {
    nice_in(&std::fs::read_to_string("/proc/thread-self/stat").unwrap())
}

/// Rows of `holds` for `sku` by end state (`open` for none).
async fn recorded(pool: &PgPool, sku: &str) -> Vec<(String, i64)> {
    sqlx::query_as(
        "SELECT coalesce(end_state, 'open'), count(*) FROM holds WHERE sku = $1
          GROUP BY 1 ORDER BY 1",
    )
    .bind(sku)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// A shopper's client of one server.
struct Shop<'a> {
    http: &'a reqwest::Client,
    base: &'a str,
    token: &'a str,
}

impl Shop<'_> {
    /// Holds one unit of `BG-1`, retried while a cut connection is reopened
    /// (a 503 says so and asks for the retry).
    async fn reserve(&self, key: &str, ttl_ms: u64) -> Value {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let held = self
                .http
                .post(format!("{}/api/v1/reservations", self.base))
                .bearer_auth(self.token)
                .header("idempotency-key", key)
                .json(&json!({"sku": "BG-1", "qty": 1, "ttl_ms": ttl_ms}))
                .send()
                .await
                .unwrap();
            let status = held.status();
            if status == 503 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            let body: Value = held.json().await.unwrap();
            assert_eq!(status, 201, "{key}: {body}");
            return body;
        }
    }

    /// Holds and pays for `paid` units, and holds `lapsed` more for a second.
    async fn sell(&self, prefix: &str, paid: usize, lapsed: usize) {
        for i in 0..paid {
            let held = self.reserve(&format!("{prefix}-pay-{i}"), 60_000).await;
            let id = held["id"].as_str().unwrap();
            let confirmed = self
                .http
                .post(format!("{}/api/v1/reservations/{id}/confirm", self.base))
                .bearer_auth(self.token)
                .header("idempotency-key", format!("confirm-{id}"))
                .send()
                .await
                .unwrap();
            assert_eq!(confirmed.status(), 200, "{id}");
        }
        for i in 0..lapsed {
            self.reserve(&format!("{prefix}-lapse-{i}"), 1_000).await;
        }
    }

    /// `BG-1`'s figures.
    async fn stock(&self) -> Value {
        self.http
            .get(format!("{}/api/v1/stock/BG-1", self.base))
            .bearer_auth(self.token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

/// Waits until PostgreSQL holds `paid` paid and `lapsed` expired holds of
/// `BG-1` and Redis has the lapsed units back (stock 100 less those paid).
async fn settled(pool: &PgPool, shop: &Shop<'_>, paid: i64, lapsed: i64) {
    let expected = vec![
        ("confirmed".to_owned(), paid),
        ("expired".to_owned(), lapsed),
    ];
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut got = recorded(pool, "BG-1").await;
    while got != expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        got = recorded(pool, "BG-1").await;
    }
    assert_eq!(got, expected, "paid and expired holds recorded");
    let stock = shop.stock().await;
    assert_eq!(
        (&stock["available"], &stock["reserved"]),
        (&json!(100 - paid), &json!(0)),
        "the expired holds' units came back: {stock}"
    );
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn background_work_runs_at_a_lower_priority_and_ends_with_the_server(pool: PgPool) {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    add_sku(&pool, "BG-1", 100).await;
    warm_all(&engine, &pool, WarmOptions::default(), |_| {})
        .await
        .unwrap();
    let token = tokens::create(&pool, "shop", &[Scope::Checkout, Scope::Read])
        .await
        .unwrap()
        .secret;
    let db = holdfast_engine::testkit::pg_url(&pool.connect_options());
    assert!(
        nice_of_threads(THREAD_NAME).is_empty(),
        "no background threads before the server"
    );
    let app = common::application(&[
        "--redis-url",
        &redis.url(),
        "--database-url",
        &db,
        "--listen",
        "127.0.0.1:0",
        "--background-threads",
        "2",
        "--background-nice",
        "7",
        "--reaper-interval-ms",
        "50",
    ])
    .await;
    let base = format!("http://{}", app.addr());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until(async {
        let _ = stopped.await;
    }));

    // Two threads (and any blocking ones they started), each 7 nicer than
    // this one, which answers requests at the priority it had.
    let request_nice = own_nice();
    let nice = nice_of_threads(THREAD_NAME);
    assert!(nice.len() >= 2, "background threads: {nice:?}");
    assert!(
        nice.iter().all(|n| *n == (request_nice + 7).min(19)),
        "background threads' nice {nice:?}, the request thread's {request_nice}"
    );

    // From those threads the write-behind records each sale and the reaper
    // returns each expired hold.
    let http = reqwest::Client::new();
    let shop = Shop {
        http: &http,
        base: &base,
        token: &token,
    };
    shop.sell("first", 10, 5).await;
    settled(&pool, &shop, 10, 5).await;

    // Every Redis connection cut at once (a restart of a proxy, a network
    // reset): the request threads and the background threads each reopen
    // their own, checkout answers again and the workers record again.
    let mut admin = redis.connection().await;
    let killed: i64 = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"][..])
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(killed >= 3, "the server's connections were cut: {killed}");
    shop.sell("again", 10, 5).await;
    settled(&pool, &shop, 20, 10).await;

    // Stopped, the server ends its background threads too.
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !nice_of_threads(THREAD_NAME).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        nice_of_threads(THREAD_NAME),
        Vec::<i32>::new(),
        "background threads left after the server stopped"
    );
}
