//! Sending on a WebSocket with a deadline: a client that stops reading must not
//! hold a server task (and its idle and session checks) on a blocked send.

use std::time::Duration;

use axum::extract::ws::{Message, WebSocket};

/// Default longest wait for a client to take one message
/// (`HOLDFAST_SOCKET_SEND_TIMEOUT_SECS`).
pub const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends `message`; `false` when the socket failed or the client did not take
/// it within `timeout` (the caller then closes the socket).
pub async fn send_within(socket: &mut WebSocket, timeout: Duration, message: Message) -> bool {
    matches!(
        tokio::time::timeout(timeout, socket.send(message)).await,
        Ok(Ok(()))
    )
}
