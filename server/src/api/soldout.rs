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

/// Clears `cache` whenever `events` show a SKU's stock coming back, until
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
                Ok(e) if e.available.is_some_and(|a| a > 0) => cache.clear(&e.sku),
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
}
