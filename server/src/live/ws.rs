//! `GET /live`: the WebSocket each dashboard tab holds.
//!
//! The handshake must come from a signed-in user's browser on this very site:
//! the session cookie is checked and so is `Origin` (a page elsewhere could
//! otherwise open the socket with the user's cookie). The tab gets a snapshot,
//! then the hub's deltas, operations samples and job progress; it may send
//! `{"type":"watch","sku":…}` to receive one SKU's raw events.

use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use holdfast_app::dto::live::{ClientMsg, ServerMsg};
use holdfast_app::server::guard::{CookiePolicy, same_origin};
use serde::Deserialize;
use tokio::sync::broadcast::error::RecvError;

use crate::http::edge::Connection;
use crate::http::socket::send_within;
use crate::live::hub::HubMsg;
use std::sync::Arc;

use holdfast_engine::Backends;

use crate::live::LiveHub;

/// Query of `/live`.
#[derive(Debug, Deserialize)]
pub struct LiveQuery {
    /// The last cursor an earlier connection of this tab saw.
    pub cursor: Option<String>,
}

/// Refuses a cross-site or signed-out handshake; otherwise upgrades.
pub async fn live(
    State(backends): State<Backends>,
    State(hub): State<Arc<LiveHub>>,
    State(cookies): State<CookiePolicy>,
    connection: Connection,
    Query(query): Query<LiveQuery>,
    headers: HeaderMap,
    upgrade: WebSocketUpgrade,
) -> Response {
    if !same_origin(&headers, cookies.secure) {
        return (StatusCode::FORBIDDEN, "cross-site WebSocket refused").into_response();
    }
    let Some(secret) = cookies
        .read(&headers)
        .filter(|s| holdfast_engine::users::well_formed_secret(s))
    else {
        return (StatusCode::UNAUTHORIZED, "sign in first").into_response();
    };
    if let Err(secs) = hub.handshakes.check(&connection.key()) {
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(axum::http::header::RETRY_AFTER, secs.to_string())],
            "too many connection attempts",
        )
            .into_response();
    }
    // Under the same per-address limit on cookies that miss as every other
    // session check, besides this handshake limit.
    let found =
        holdfast_engine::users::session_user_from(&backends, &secret, connection.client).await;
    let user = match found {
        Ok(Some(user)) if user.must_change_password => {
            return (StatusCode::FORBIDDEN, "choose a new password first").into_response();
        }
        Ok(Some(user)) => user,
        Ok(None) => {
            return (StatusCode::UNAUTHORIZED, "session ended; sign in again").into_response();
        }
        // Throttled (429, Retry-After) or PostgreSQL failing (503): as the
        // API answers it, logged there once.
        Err(e) => return crate::http::error::ApiError::from(e).into_response(),
    };
    let Some(socket_place) = connection.socket_place() else {
        return crate::http::edge::SocketPlace::refused();
    };
    let Some(tab) = hub.tabs.take(user.id, crate::live::hub::TABS_PER_ACCOUNT) else {
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(axum::http::header::RETRY_AFTER, "10")],
            "too many dashboard tabs open for this account; close some",
        )
            .into_response();
    };
    // A tab sends only small subscription messages: refuse anything larger,
    // frame by frame (a frame is buffered whole before a message limit applies).
    upgrade
        .max_frame_size(hub.config.max_message)
        .max_message_size(hub.config.max_message)
        .on_upgrade(move |socket| async move {
            let session = Session {
                pg: backends.pg.clone(),
                secret,
                user,
            };
            serve(socket, hub, query.cursor, session).await;
            // The connection's places under the server's caps, held until now.
            drop((connection.slot, socket_place, tab));
        })
}

/// How often an open socket's session is checked again: a logout, a password
/// change, a deletion or a demotion closes the socket within this long.
pub const SESSION_RECHECK: Duration = Duration::from_secs(5);

/// The session a socket was opened with, to check again while it is open.
struct Session {
    pg: sqlx::PgPool,
    secret: String,
    user: holdfast_engine::users::User,
}

impl Session {
    /// Whether the session still belongs to the same user with the same role and
    /// no pending password change. PostgreSQL not answering keeps the socket
    /// open (the dashboard must not go dark with the system of record).
    async fn still_valid(&self) -> bool {
        match holdfast_engine::postgres::quick(holdfast_engine::users::session_user(
            &self.pg,
            &self.secret,
        ))
        .await
        {
            Ok(Some(now)) => {
                now.id == self.user.id && now.role == self.user.role && !now.must_change_password
            }
            Ok(None) => false,
            Err(_) => true,
        }
    }
}

async fn serve(mut socket: WebSocket, hub: Arc<LiveHub>, resume: Option<String>, session: Session) {
    // The first message may name the watched SKU; wait for it briefly so a
    // resumed tab gets its missed events in the snapshot.
    let mut watched: Option<String> = None;
    if resume.is_some()
        && let Ok(Some(Ok(Message::Text(text)))) =
            tokio::time::timeout(Duration::from_millis(500), socket.recv()).await
        && let Ok(ClientMsg::Watch { sku }) = serde_json::from_str(&text)
    {
        watched = sku;
    }
    let config = hub.config.clone();
    let mut sub = hub.subscribe(resume.as_deref(), watched.as_deref());
    if !send_within(
        &mut socket,
        config.send_timeout,
        Message::Text(sub.snapshot.clone().into()),
    )
    .await
    {
        return;
    }
    let mut ping = tokio::time::interval(config.ping_every);
    ping.tick().await;
    // A browser answers every ping; silence this long means the tab or its
    // network is gone, and the socket would only hold memory. The deadline
    // moves with every frame received.
    let silence = tokio::time::sleep(config.idle_timeout);
    tokio::pin!(silence);
    let mut recheck = tokio::time::interval(SESSION_RECHECK);
    recheck.tick().await;
    loop {
        tokio::select! {
            msg = sub.deltas.recv() => {
                let out = match msg {
                    Ok(HubMsg::Figures(json, events)) => {
                        if !send_within(&mut socket, config.send_timeout, Message::Text(json.as_str().into())).await {
                            return;
                        }
                        let mine: Vec<_> = events
                            .iter()
                            .filter(|e| watched.as_deref() == Some(e.sku.as_str()))
                            .cloned()
                            .collect();
                        if mine.is_empty() {
                            continue;
                        }
                        serde_json::to_string(&ServerMsg::Events { events: mine }).unwrap_or_default()
                    }
                    Ok(HubMsg::Job(json)) => json.as_str().to_owned(),
                    // Too slow to keep up: start over from a fresh snapshot.
                    Err(RecvError::Lagged(_)) => {
                        let fresh = hub.subscribe(None, watched.as_deref());
                        sub.deltas = fresh.deltas;
                        fresh.snapshot
                    }
                    Err(RecvError::Closed) => return,
                };
                if !send_within(&mut socket, config.send_timeout, Message::Text(out.into())).await {
                    return;
                }
            }
            changed = sub.ops.changed() => {
                if changed.is_err() {
                    return;
                }
                let json = sub.ops.borrow_and_update().clone();
                if let Some(json) = json
                    && !send_within(&mut socket, config.send_timeout, Message::Text(json.as_str().into())).await
                {
                    return;
                }
            }
            incoming = socket.recv() => match incoming {
                Some(Ok(Message::Text(text))) => {
                    silence.as_mut().reset(tokio::time::Instant::now() + config.idle_timeout);
                    if let Ok(ClientMsg::Watch { sku }) = serde_json::from_str(&text) {
                        watched = sku;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => silence.as_mut().reset(tokio::time::Instant::now() + config.idle_timeout),
            },
            () = &mut silence => return,
            _ = ping.tick() => {
                if !send_within(&mut socket, config.send_timeout, Message::Ping(Vec::new().into())).await {
                    return;
                }
            }
            _ = recheck.tick() => {
                if !session.still_valid().await {
                    let close = Message::Close(Some(axum::extract::ws::CloseFrame {
                        code: 4001,
                        reason: "session ended".into(),
                    }));
                    let _ = send_within(&mut socket, config.send_timeout, close).await;
                    return;
                }
            }
        }
    }
}
