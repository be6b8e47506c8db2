//! Hot-key shedding: a per-process memory of SKUs that just sold out, so a flood
//! of shoppers after the sell-out is answered 409 without a Redis round trip. An
//! entry lasts a short time and is cleared as soon as the event stream shows stock
//! coming back (a release, an expiry, a receipt).
//!
//! It also remembers the reservations whose last attempt failed here (a 5xx):
//! that attempt may have held units, so its retry must ask Redis (which answers
//! with the hold) and never this memory. A retry that reaches another server
//! while the SKU is known sold out there is answered 409; the units the failed
//! attempt held come back when its hold expires.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// SKUs known to be sold out, with when that was seen.
#[derive(Debug)]
pub struct SoldOutCache {
    entries: Mutex<HashMap<String, Instant>>,
    ttl: Duration,
    /// Attempts answered sold out from memory, without Redis.
    pub hits: prometheus_client::metrics::counter::Counter,
    /// Reservations whose last attempt failed here, with when.
    distrusted: Mutex<HashMap<String, Instant>>,
}

/// How long a failed attempt's reservation bypasses the cache: past the longest
/// hold, whatever it held has come back.
const DISTRUST_FOR: Duration = Duration::from_secs(3_600);
/// Failed attempts remembered at most (a Redis outage fails every request; past
/// this the oldest are forgotten, and with them only the bypass).
const DISTRUST_CAP: usize = 100_000;

impl SoldOutCache {
    /// A cache whose entries last `ttl`; a zero `ttl` turns it off.
    pub fn new(ttl: Duration) -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            ttl,
            hits: Default::default(),
            distrusted: Mutex::new(HashMap::new()),
        }
    }

    /// Remembers that an attempt at reservation `rid` failed: its retries bypass
    /// the cache.
    pub fn distrust(&self, rid: &str) {
        if let Ok(mut d) = self.distrusted.lock() {
            if d.len() >= DISTRUST_CAP {
                d.retain(|_, at| at.elapsed() < DISTRUST_FOR);
                if d.len() >= DISTRUST_CAP
                    && let Some(oldest) =
                        d.iter().min_by_key(|(_, at)| **at).map(|(k, _)| k.clone())
                {
                    d.remove(&oldest);
                }
            }
            d.insert(rid.to_owned(), Instant::now());
        }
    }

    /// Whether an attempt at reservation `rid` failed here lately.
    pub fn distrusts(&self, rid: &str) -> bool {
        self.distrusted
            .lock()
            .is_ok_and(|d| d.get(rid).is_some_and(|at| at.elapsed() < DISTRUST_FOR))
    }

    /// Whether `sku` sold out less than `ttl` ago and has not come back since
    /// (counted in [`SoldOutCache::hits`] when it did).
    pub fn is_sold_out(&self, sku: &str) -> bool {
        let hit = self
            .entries
            .lock()
            .is_ok_and(|e| e.get(sku).is_some_and(|at| at.elapsed() < self.ttl));
        if hit {
            self.hits.inc();
        }
        hit
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
