//! Helpers shared by the server's integration tests.

#![allow(dead_code)]

use holdfast_engine::Backends;
#[allow(unused_imports)]
pub use holdfast_engine::testkit::{backends, pg_url};
use holdfast_server::startup::spawn_in_background;
use holdfast_server::state::{AppState, StateOptions, leptos_options};
use tokio::net::TcpListener;

/// A WebSocket client.
pub type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

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

/// Whether `server` answers `/healthz` with 200 within a second.
pub async fn healthy(server: &TestServer) -> bool {
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(1))
        .build()
        .expect("an HTTP client");
    client
        .get(server.url("/healthz"))
        .send()
        .await
        .is_ok_and(|r| r.status() == 200)
}

/// Whether the server ends `ws` (a close frame, an error or the end of the
/// stream) within `within`, reading and discarding whatever comes before.
pub async fn closes_within(ws: &mut Socket, within: std::time::Duration) -> bool {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    tokio::time::timeout(within, async {
        loop {
            match ws.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return true,
                Some(Ok(_)) => {}
            }
        }
    })
    .await
    .unwrap_or(false)
}

/// The state a test server listening on `addr` serves, over `backends` with
/// `options`.
pub fn state(backends: Backends, options: StateOptions, addr: std::net::SocketAddr) -> AppState {
    AppState::build(
        leptos_options("target/site", addr),
        backends,
        std::sync::Arc::new(holdfast_server::workers::WorkerStats::new()),
        options,
    )
}

/// Serves the full router over `backends` with `options` on port 0, the live side
/// reading the Redis at `live_from` when given.
pub async fn spawn_with(
    backends: Backends,
    options: StateOptions,
    live_from: Option<&str>,
) -> TestServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
    let addr = listener.local_addr().expect("local addr");
    let state = state(backends, options, addr);
    spawn_in_background(listener, state, live_from).await;
    TestServer {
        base: format!("http://{addr}"),
    }
}

/// Serves the full router over `backends` on port 0, with the live event feed
/// reading the Redis at `redis_url`.
pub async fn spawn_live(backends: Backends, redis_url: &str) -> TestServer {
    spawn_with(backends, StateOptions::default(), Some(redis_url)).await
}

/// Serves the full router over `backends` on port 0.
pub async fn spawn(backends: Backends) -> TestServer {
    spawn_with(backends, StateOptions::default(), None).await
}

/// `holdfast serve`'s flags, as the binary parses them.
#[derive(clap::Parser)]
struct ServeFlags {
    #[command(flatten)]
    global: holdfast_server::config::GlobalArgs,
    #[command(flatten)]
    serve: holdfast_server::config::ServeArgs,
}

/// The application `holdfast serve` builds from `args` (after the program
/// name), not yet serving.
pub async fn application(args: &[&str]) -> holdfast_server::startup::Application {
    use clap::Parser;
    let flags = ServeFlags::parse_from(std::iter::once("holdfast").chain(args.iter().copied()));
    holdfast_server::startup::Application::build(&flags.global, flags.serve)
        .await
        .unwrap()
}
