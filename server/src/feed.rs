//! The process's single reader of the event streams, fanned out over a broadcast
//! channel to everything that needs live events: the sold-out cache, the badge hub
//! and the dashboards' live hub. One Redis connection per process, however many
//! listeners.

use std::sync::Arc;
use std::time::Duration;

use holdfast_engine::events::{Event, EventReader, StreamCursor};
use holdfast_engine::{EngineError, redis_conn};
use tokio::sync::broadcast;

/// The sending side; subscribe to receive every event from now on.
#[derive(Clone)]
pub struct Feed {
    tx: broadcast::Sender<Arc<Event>>,
}

impl Feed {
    /// A feed with room for `capacity` undelivered events per listener; a slower
    /// listener is told how many it missed (`RecvError::Lagged`).
    pub fn new(capacity: usize) -> Self {
        Self {
            tx: broadcast::channel(capacity).0,
        }
    }

    /// A receiver of every event published after this call.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.tx.subscribe()
    }

    /// Tails every shard stream from its current end and publishes each event,
    /// until `shutdown`; reconnects with backoff while Redis is unavailable.
    pub async fn run(
        self,
        redis_url: String,
        keys: holdfast_engine::keys::Keyspace,
        shutdown: impl Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        let mut backoff = Duration::from_millis(100);
        // Kept across reconnects, so a Redis blip delays events instead of dropping them.
        let mut cursor = None;
        loop {
            let attempt = self.tail(&redis_url, keys, &mut cursor);
            tokio::select! {
                () = &mut shutdown => return,
                Err(e) = attempt => {
                    tracing::warn!(error = %e, "event feed interrupted; reconnecting");
                }
            }
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }

    async fn tail(
        &self,
        redis_url: &str,
        keys: holdfast_engine::keys::Keyspace,
        cursor: &mut Option<StreamCursor>,
    ) -> Result<(), EngineError> {
        let mut reader = EventReader::new(redis_conn::connect(redis_url).await?, keys);
        if cursor.is_none() {
            *cursor = Some(reader.tail_cursor().await?);
        }
        let Some(cursor) = cursor.as_mut() else {
            return Ok(());
        };
        loop {
            for event in reader
                .read(cursor, 500, Some(Duration::from_millis(1_000)))
                .await?
            {
                // No listeners is fine: nothing to deliver.
                let _ = self.tx.send(Arc::new(event));
            }
        }
    }
}
