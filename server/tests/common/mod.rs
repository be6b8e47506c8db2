//! Helpers shared by the server's integration tests.

#![allow(dead_code)]

use holdfast_engine::{Backends, kv};
use holdfast_server::state::{AppState, leptos_options};
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;
use tokio::net::TcpListener;

/// A Holdfast server on a free loopback port, stopped when the test's runtime ends.
pub struct TestServer {
    /// `http://127.0.0.1:<port>`.
    pub base: String,
}

impl TestServer {
    /// The absolute URL of `path` on this server.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

/// Serves the full router over `backends` on port 0, with the live event feed
/// reading the Redis at `redis_url`.
pub async fn spawn_live(backends: Backends, redis_url: &str) -> TestServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
    let addr = listener.local_addr().expect("local addr");
    let state = AppState::new(leptos_options("target/site", addr), backends);
    let (stop, rx) = tokio::sync::watch::channel(false);
    holdfast_server::start_live(&state, redis_url, rx);
    // Live until the test's runtime ends.
    std::mem::forget(stop);
    let router = holdfast_server::router(state);
    tokio::spawn(holdfast_server::serve(
        listener,
        router,
        std::future::pending(),
    ));
    // Give the feed a moment to position itself at the streams' end.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    TestServer {
        base: format!("http://{addr}"),
    }
}

/// Serves the full router over `backends` on port 0.
pub async fn spawn(backends: Backends) -> TestServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
    let addr = listener.local_addr().expect("local addr");
    let state = AppState::new(leptos_options("target/site", addr), backends);
    let router = holdfast_server::router(state);
    tokio::spawn(holdfast_server::serve(
        listener,
        router,
        std::future::pending(),
    ));
    TestServer {
        base: format!("http://{addr}"),
    }
}

/// Backends over a test database and the Redis at `redis_url`.
pub async fn backends(pool: PgPool, redis_url: &str) -> Backends {
    let redis = kv::connect(redis_url)
        .await
        .expect("connect to the test Redis");
    Backends::new(pool, redis, holdfast_engine::EngineConfig::default())
}

/// A `postgres://` URL for the database `opts` points at (sqlx::test hands out options, not URLs).
pub fn pg_url(opts: &PgConnectOptions) -> String {
    format!(
        "postgres://{}@{}:{}/{}",
        opts.get_username(),
        opts.get_host(),
        opts.get_port(),
        opts.get_database().unwrap_or("postgres")
    )
}
