//! Helpers shared by the CLI's integration tests.

#![allow(dead_code)]

use holdfast_engine::Backends;
#[allow(unused_imports)]
pub use holdfast_engine::testkit::{backends, pg_url};
use holdfast_server::startup::spawn_in_background;
use holdfast_server::state::{AppState, leptos_options};
use tokio::net::TcpListener;

/// Serves the full router over `backends` on port 0, the live side reading the
/// Redis at `redis_url`; returns `http://127.0.0.1:<port>`.
pub async fn spawn_live(backends: Backends, redis_url: &str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
    let addr = listener.local_addr().expect("local addr");
    let state = AppState::new(leptos_options("target/site", addr), backends);
    spawn_in_background(listener, state, Some(redis_url)).await;
    format!("http://{addr}")
}
