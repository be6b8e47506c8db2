//! Hot-key shedding: a per-process memory of SKUs that just sold out, so a flood
//! of shoppers after the sell-out is answered 409 without running the reserve
//! script. An entry lasts a short time and is cleared as soon as the event
//! stream shows stock coming back (a release, an expiry, a receipt).
//!
//! Each such answer claims the reservation id for its request with the answer
//! (`Engine::refuse_from_memory`, one `SET NX GET`, far cheaper than the
//! script), so a retry gets it again; an id already claimed by its request (a
//! hold, a refusal) is answered by Redis. Whatever Redis recorded first for an
//! attempt is what its retries get, even when the attempt itself was answered
//! 503 (Redis ran it late).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// SKUs known to be sold out, with when that was seen.
#[derive(Debug)]
pub struct SoldOutCache {
    entries: Mutex<HashMap<String, Instant>>,
    ttl: Duration,
    /// Attempts answered sold out from memory, without the reserve script.
    pub hits: prometheus_client::metrics::counter::Counter,
}

impl SoldOutCache {
    /// A cache whose entries last `ttl`; a zero `ttl` turns it off.
    pub fn new(ttl: Duration) -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            ttl,
            hits: Default::default(),
        }
    }

    /// Whether `sku` sold out less than `ttl` ago and has not come back since.
    /// An answer given on it is counted with [`SoldOutCache::answered`].
    pub fn is_sold_out(&self, sku: &str) -> bool {
        self.entries
            .lock()
            .is_ok_and(|e| e.get(sku).is_some_and(|at| at.elapsed() < self.ttl))
    }

    /// Counts an attempt answered sold out from this memory.
    pub fn answered(&self) {
        self.hits.inc();
    }

    /// Remembers that `sku` has nothing left (unless the cache is off: a zero `ttl`).
    pub fn mark(&self, sku: &str) {
        if self.ttl.is_zero() {
            return;
        }
        if let Ok(mut e) = self.entries.lock() {
            e.insert(sku.to_owned(), Instant::now());
        }
    }

    /// Forgets `sku` (stock came back).
    pub fn clear(&self, sku: &str) {
        if let Ok(mut e) = self.entries.lock() {
            e.remove(sku);
        }
    }

    /// Forgets everything (the event feed missed events, so any entry may be stale).
    pub fn clear_all(&self) {
        if let Ok(mut e) = self.entries.lock() {
            e.clear();
        }
    }
}

/// Clears `cache` whenever `events` show a SKU's stock coming back
/// ([`holdfast_engine::events::Event::shows_restock`]), until
/// `shutdown`; after missed events (a lag) it forgets everything.
pub async fn clear_on_restock(
    mut events: tokio::sync::broadcast::Receiver<std::sync::Arc<holdfast_engine::events::Event>>,
    cache: std::sync::Arc<SoldOutCache>,
    shutdown: impl Future<Output = ()>,
) {
    use tokio::sync::broadcast::error::RecvError;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            event = events.recv() => match event {
                // Not a hold's event reporting units left: one read late (the
                // feed gathers) would otherwise wipe the sell-out the next
                // attempt saw.
                Ok(e) if e.shows_restock() => {
                    // Marked under the SKU the shopper named; a split
                    // SKU's events name its part (`SKU~j/k`).
                    cache.clear(e.whole_sku())
                }
                Ok(_) => {}
                Err(RecvError::Lagged(_)) => cache.clear_all(),
                Err(RecvError::Closed) => return,
            }
        }
    }
}

impl Default for SoldOutCache {
    fn default() -> Self {
        Self::new(Duration::from_secs(2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_expire_and_clear() {
        let cache = SoldOutCache::new(Duration::from_millis(30));
        assert!(!cache.is_sold_out("A"));
        cache.mark("A");
        assert!(cache.is_sold_out("A"));
        cache.clear("A");
        assert!(!cache.is_sold_out("A"));
        cache.mark("B");
        std::thread::sleep(Duration::from_millis(40));
        assert!(!cache.is_sold_out("B"), "lapses after the ttl");
    }

    fn event(
        kind: holdfast_engine::events::EventKind,
        available: i64,
    ) -> holdfast_engine::events::Event {
        let mut e = holdfast_engine::events::Event::new("1-0".into(), 0, kind, "A".into());
        e.available = Some(available);
        e
    }

    /// Waits (at most 5 s) until the clearing task has forgotten `sku`.
    async fn cleared(cache: &SoldOutCache, sku: &str) {
        tokio::time::timeout(Duration::from_secs(5), async {
            while cache.is_sold_out(sku) {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{sku} was not cleared"));
    }

    /// A hold's event read after the sell-out (the feed gathers events, so the
    /// last-but-one hold's "1 left" can come after the attempt that found 0)
    /// keeps the sell-out; a release clears it.
    #[tokio::test]
    async fn only_an_event_that_can_restock_clears_a_sell_out() {
        use holdfast_engine::events::EventKind;
        let cache = std::sync::Arc::new(SoldOutCache::new(Duration::from_secs(60)));
        let (tx, rx) = tokio::sync::broadcast::channel(8);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(clear_on_restock(rx, cache.clone(), async move {
            let _ = stop_rx.await;
        }));
        cache.mark("A");
        tx.send(std::sync::Arc::new(event(EventKind::Reserved, 1)))
            .unwrap();
        tx.send(std::sync::Arc::new(event(EventKind::Confirmed, 1)))
            .unwrap();
        // A marker the task handles after the two: a different SKU's release.
        let mut marker = event(EventKind::Released, 1);
        marker.sku = "B".into();
        cache.mark("B");
        tx.send(std::sync::Arc::new(marker)).unwrap();
        cleared(&cache, "B").await;
        assert!(
            cache.is_sold_out("A"),
            "a hold's late event is not a restock"
        );
        tx.send(std::sync::Arc::new(event(EventKind::Released, 1)))
            .unwrap();
        cleared(&cache, "A").await;
        // A split SKU's part restocked clears the SKU itself.
        cache.mark("A");
        let mut part = event(EventKind::Released, 1);
        part.sku = "A~2/4".into();
        tx.send(std::sync::Arc::new(part)).unwrap();
        cleared(&cache, "A").await;
        stop_tx.send(()).unwrap();
        task.await.unwrap();
    }
}
