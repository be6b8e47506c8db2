//! The public badge endpoints: `GET /public/stock?skus=…` (cacheable JSON, the
//! polling fallback) and `GET /public/ws` (live updates).
//!
//! WebSocket protocol: the page sends `{"subscribe": ["DROP-001", …]}` (again to
//! change the set); the server answers with each SKU's badge at once and then
//! whenever it changes: `{"sku": "DROP-001", "state": "low", "left": 3}`.

use axum::Extension;
use axum::Router;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use holdfast_app::server::guard::ClientIp;

use crate::http::edge::Connection;
use crate::http::socket::send_within;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::WatchStream;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::FromRef;

use super::{Badge, BadgeHub};

/// The badge routes, over the [`BadgeHub`] of any state that has one.
pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Arc<BadgeHub>: FromRef<S>,
{
    Router::new()
        .route("/public/stock", get(poll))
        .route("/public/ws", get(live))
}

/// Whether a page from `origin` may use the feed: the server's own origin, or one
/// on the deployment's allow-list. Requests without an Origin (not from a
/// browser page) cannot be cross-site attacks and are allowed.
fn origin_allowed(hub: &BadgeHub, headers: &HeaderMap) -> Result<Option<String>, ()> {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return Ok(None);
    };
    let own = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|host| {
            origin == format!("http://{host}") || origin == format!("https://{host}")
        });
    if own || hub.config.origins.iter().any(|o| o == origin) {
        Ok(Some(origin.to_owned()))
    } else {
        Err(())
    }
}

/// The SKUs of a poll, or why they are refused.
fn parse_skus(hub: &BadgeHub, list: &str) -> Result<Vec<String>, String> {
    let skus: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let max = hub.config.max_subscriptions;
    if skus.is_empty()
        || skus.len() > max
        || !skus.iter().all(|s| holdfast_engine::engine::valid_sku(s))
    {
        return Err(format!("give 1 to {max} valid SKU codes"));
    }
    Ok(skus)
}

/// Query of `GET /public/stock`.
#[derive(Debug, Deserialize)]
pub struct PollQuery {
    /// Comma-separated SKU codes.
    pub skus: String,
}

/// `GET /public/stock?skus=A,B`: the badges as JSON, with an ETag and a one-second
/// public cache, so polling pages cost little.
async fn poll(
    State(hub): State<Arc<BadgeHub>>,
    Extension(ClientIp(client)): Extension<ClientIp>,
    headers: HeaderMap,
    Query(q): Query<PollQuery>,
) -> Response {
    // The client's address as the edge resolved it (through trusted proxies).
    if let Err(secs) = hub.polls.check(&client) {
        let retry = [(header::RETRY_AFTER, secs.to_string())];
        return (StatusCode::TOO_MANY_REQUESTS, retry, "polling too fast").into_response();
    }
    let skus = match parse_skus(&hub, &q.skus) {
        Ok(s) => s,
        Err(why) => return (StatusCode::UNPROCESSABLE_ENTITY, why).into_response(),
    };
    let badges: Vec<Badge> = hub.current_many(&skus).await;
    let body = serde_json::to_string(&badges).unwrap_or_default();
    let etag = format!(
        "\"{}\"",
        &hex::encode(Sha256::digest(body.as_bytes()))[..16]
    );
    let mut response = if headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        == Some(etag.as_str())
    {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, "application/json")], body).into_response()
    };
    let h = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, v);
    }
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=1"),
    );
    h.insert(header::VARY, HeaderValue::from_static("Origin"));
    if let Ok(Some(origin)) = origin_allowed(&hub, &headers)
        && let Ok(v) = HeaderValue::from_str(&origin)
    {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
    }
    response
}

/// Bytes each badge socket reads into at a time (and holds while idle).
const READ_BUFFER: usize = 1024;

/// `GET /public/ws`: the live feed. Refused (403) for an origin outside the
/// allow-list and (429) past the connections allowed per client address.
async fn live(
    State(hub): State<Arc<BadgeHub>>,
    connection: Connection,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    if origin_allowed(&hub, &headers).is_err() {
        return (
            StatusCode::FORBIDDEN,
            "this origin may not embed Holdfast badges",
        )
            .into_response();
    }
    let client = connection
        .client
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
    // Given back when dropped: after the socket closes, and also when the
    // upgrade never happens (the closure holding it is dropped unrun), so a
    // failed handshake cannot leak a place.
    let Some(socket_place) = connection.socket_place() else {
        return crate::http::edge::SocketPlace::refused();
    };
    let Some(place) = hub.admit(client) else {
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, "10")],
            "too many connections",
        )
            .into_response();
    };
    // Badge connections are mostly idle: small buffers keep tens of thousands
    // of them cheap. A subscription is a few hundred bytes; a longer message
    // (up to `max_message`) grows the buffer for as long as it takes.
    let max_message = hub.config.max_message;
    ws.read_buffer_size(max_message.min(READ_BUFFER))
        .write_buffer_size(0)
        .max_write_buffer_size(64 * 1024)
        .max_message_size(max_message)
        // A frame is buffered whole before the message limit applies: bound it too.
        .max_frame_size(max_message)
        .on_upgrade(move |socket| async move {
            serve_socket(&hub, socket, client).await;
            drop((place, socket_place));
            // The connection's place under the server's caps, held until now.
            drop(connection.slot);
        })
}

/// A subscription request from a page.
#[derive(Debug, Deserialize)]
struct Subscribe {
    subscribe: Vec<String>,
}

/// Serves one badge socket: subscriptions (paced: a burst, then one per
/// `resubscribe_every`), the badges as they change, a ping every `ping_every`,
/// and a close as soon as nothing has come back for `idle_timeout`.
async fn serve_socket(hub: &BadgeHub, mut socket: WebSocket, client: std::net::IpAddr) {
    let config = &hub.config;
    let mut streams = tokio_stream::StreamMap::new();
    let mut pace = Pace::new(config.subscribe_burst, config.resubscribe_every);
    // Closed once nothing (not even a pong) has come for the idle timeout:
    // the deadline moves with every frame received.
    let silence = tokio::time::sleep(config.idle_timeout);
    tokio::pin!(silence);
    let mut ping = tokio::time::interval(config.ping_every);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ping.tick().await;
    loop {
        tokio::select! {
            incoming = socket.recv() => {
                let Some(Ok(message)) = incoming else { return };
                silence.as_mut().reset(tokio::time::Instant::now() + config.idle_timeout);
                let Message::Text(text) = message else { continue };
                // Paced per socket, and counted as a poll of the address: each
                // subscribe costs a Redis read, and sockets can be opened anew.
                if !pace.admit() || hub.polls.check(&client).is_err() {
                    if !send_within(&mut socket, config.send_timeout, Message::Text(r#"{"error":"subscribing too often; wait a second","retry_after":1}"#.into())).await { return; }
                    continue;
                }
                let Ok(request) = serde_json::from_str::<Subscribe>(&text) else {
                    if !send_within(&mut socket, config.send_timeout, Message::Text(r#"{"error":"send {\"subscribe\": [\"SKU\", …]}"}"#.into())).await { return; }
                    continue;
                };
                let max = config.max_subscriptions;
                if request.subscribe.len() > max
                    || !request.subscribe.iter().all(|s| holdfast_engine::engine::valid_sku(s))
                {
                    if !send_within(&mut socket, config.send_timeout, Message::Text(format!(r#"{{"error":"subscribe to at most {max} valid SKU codes"}}"#).into())).await { return; }
                    continue;
                }
                streams = tokio_stream::StreamMap::new();
                for (sku, rx) in hub.watch_many(request.subscribe).await {
                    // WatchStream yields the current badge first, then the newest after each change.
                    streams.insert(sku, WatchStream::new(rx));
                }
            }
            Some((_, badge)) = streams.next(), if !streams.is_empty() => {
                let text = serde_json::to_string(&badge).unwrap_or_default();
                if !send_within(&mut socket, config.send_timeout, Message::Text(text.into())).await {
                    return;
                }
            }
            () = &mut silence => {
                let _ = send_within(&mut socket, config.send_timeout, Message::Close(None)).await;
                return;
            }
            _ = ping.tick() => {
                if !send_within(&mut socket, config.send_timeout, Message::Ping(Default::default())).await {
                    return;
                }
            }
        }
    }
}

/// A per-connection token bucket: `burst` at once, then one per `every`.
pub(crate) struct Pace {
    tokens: f64,
    burst: f64,
    every: Duration,
    at: Instant,
}

impl Pace {
    /// A full bucket.
    pub(crate) fn new(burst: u32, every: Duration) -> Self {
        Self {
            tokens: f64::from(burst.max(1)),
            burst: f64::from(burst.max(1)),
            every,
            at: Instant::now(),
        }
    }

    /// Takes one token; `false` when there is none.
    pub(crate) fn admit(&mut self) -> bool {
        let refill = self.at.elapsed().as_secs_f64() / self.every.as_secs_f64().max(1e-3);
        self.tokens = (self.tokens + refill).min(self.burst);
        self.at = Instant::now();
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}
