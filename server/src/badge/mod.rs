//! Shopper stock badges: a public, read-only view of each SKU ("In stock", "Only 3
//! left", "Sold out"), live over WebSockets and pollable as cacheable JSON.
//!
//! One [`BadgeHub`] per process turns the event feed into the latest badge per
//! watched SKU, held in a `watch` channel: a slow connection simply sees the
//! newest value when it catches up, it never buffers a backlog. No cookies, no
//! private data; an Origin allow-list, connections per client address and
//! subscriptions per connection are limited.

pub mod routes;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use holdfast_domain::StockState;
use holdfast_engine::events::Event;
use holdfast_engine::{Engine, catalog, postgres};
use serde::Serialize;
use sqlx::PgPool;
use tokio::sync::{broadcast, watch};

use crate::http::ratelimit::{Limit, RateLimiter};

/// What a shopper sees for one SKU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Badge {
    /// The SKU code.
    pub sku: String,
    /// `in_stock`, `low`, `sold_out`, or `unknown` (not on sale).
    pub state: StockState,
    /// Units left, only when low (the count is what "Only 3 left" shows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub left: Option<i64>,
}

impl Badge {
    fn new(sku: &str, available: Option<i64>, threshold: i64) -> Self {
        let state = StockState::of(available, threshold);
        let left = available.filter(|_| state == StockState::Low);
        Self {
            sku: sku.to_owned(),
            state,
            left,
        }
    }
}

/// Limits of the public badge endpoints.
#[derive(Debug, Clone)]
pub struct BadgeConfig {
    /// Origins (`https://shop.example`) whose pages may use the live feed; the
    /// server's own origin is always allowed.
    pub origins: Vec<String>,
    /// Most open WebSockets per client address.
    pub max_connections_per_client: usize,
    /// Most SKUs one connection (or one poll) may follow.
    pub max_subscriptions: usize,
    /// Polls per second per client address (bursts of twice that).
    pub polls_per_second: u32,
}

impl Default for BadgeConfig {
    fn default() -> Self {
        Self {
            origins: Vec::new(),
            max_connections_per_client: 50,
            max_subscriptions: 20,
            polls_per_second: 10,
        }
    }
}

/// The latest badge per watched SKU, fed by the event stream.
pub struct BadgeHub {
    engine: Engine,
    pg: PgPool,
    /// Limits and the Origin allow-list.
    pub config: BadgeConfig,
    skus: Mutex<HashMap<String, watch::Sender<Badge>>>,
    thresholds: Mutex<HashMap<String, (i64, Instant)>>,
    connections: Mutex<HashMap<IpAddr, usize>>,
    /// Polls per client address.
    pub polls: RateLimiter,
}

/// How long a SKU's low-stock threshold is cached.
const THRESHOLD_TTL: Duration = Duration::from_secs(60);
/// How long a threshold stands in after PostgreSQL failed to answer, before it
/// is asked again.
const THRESHOLD_RETRY: Duration = Duration::from_secs(5);
/// Threshold for a SKU PostgreSQL does not know.
const DEFAULT_THRESHOLD: i64 = 5;

impl BadgeHub {
    /// A hub reading counters through `engine` and thresholds from `pg`.
    pub fn new(engine: Engine, pg: PgPool, config: BadgeConfig) -> Self {
        Self {
            engine,
            pg,
            skus: Mutex::default(),
            thresholds: Mutex::default(),
            connections: Mutex::default(),
            polls: RateLimiter::new(Limit::per_second(config.polls_per_second)),
            config,
        }
    }

    async fn threshold(&self, sku: &str) -> i64 {
        if let Ok(t) = self.thresholds.lock()
            && let Some((v, at)) = t.get(sku)
            && at.elapsed() < THRESHOLD_TTL
        {
            return *v;
        }
        let (v, fresh_for) = match postgres::quick(catalog::threshold(&self.pg, sku)).await {
            Ok(found) => (found.unwrap_or(DEFAULT_THRESHOLD), THRESHOLD_TTL),
            Err(e) => {
                // Keep the last known threshold (or the default) and ask again
                // soon, rather than remembering a guess for a minute.
                tracing::warn!(%sku, error = %e, "could not read a low-stock threshold");
                let last = self
                    .thresholds
                    .lock()
                    .ok()
                    .and_then(|t| t.get(sku).map(|(v, _)| *v));
                (last.unwrap_or(DEFAULT_THRESHOLD), THRESHOLD_RETRY)
            }
        };
        if let Ok(mut t) = self.thresholds.lock() {
            // Stored as if read `THRESHOLD_TTL - fresh_for` ago, so it lapses after `fresh_for`.
            let at = Instant::now()
                .checked_sub(THRESHOLD_TTL - fresh_for)
                .unwrap_or_else(Instant::now);
            t.insert(sku.to_owned(), (v, at));
        }
        v
    }

    /// The badge of `sku` read from Redis now.
    pub async fn current(&self, sku: &str) -> Badge {
        let available = self
            .engine
            .figures(sku)
            .await
            .ok()
            .flatten()
            .map(|f| f.available);
        Badge::new(sku, available, self.threshold(sku).await)
    }

    /// A receiver of `sku`'s badge: its current value now, the newest after each change.
    pub async fn watch(&self, sku: &str) -> watch::Receiver<Badge> {
        if let Ok(skus) = self.skus.lock()
            && let Some(tx) = skus.get(sku)
        {
            return tx.subscribe();
        }
        let badge = self.current(sku).await;
        let Ok(mut skus) = self.skus.lock() else {
            return watch::channel(badge).1;
        };
        if skus.len() > 10_000 {
            skus.retain(|_, tx| tx.receiver_count() > 0);
        }
        skus.entry(sku.to_owned())
            .or_insert_with(|| watch::channel(badge).0)
            .subscribe()
    }

    fn publish(&self, badge: Badge) {
        let Ok(skus) = self.skus.lock() else { return };
        if let Some(tx) = skus.get(&badge.sku) {
            tx.send_if_modified(|b| {
                let changed = *b != badge;
                *b = badge;
                changed
            });
        }
    }

    async fn apply(&self, event: &Event) {
        let watched = self.skus.lock().is_ok_and(|s| s.contains_key(&event.sku));
        if watched && let Some(available) = event.available {
            let threshold = self.threshold(&event.sku).await;
            self.publish(Badge::new(&event.sku, Some(available), threshold));
        }
    }

    async fn refresh_all(&self) {
        let skus: Vec<String> = self
            .skus
            .lock()
            .map(|s| s.keys().cloned().collect())
            .unwrap_or_default();
        for sku in skus {
            let badge = self.current(&sku).await;
            self.publish(badge);
        }
    }

    /// Follows `events` until `shutdown`, updating watched badges; after missing
    /// events (a lag) it re-reads every watched SKU from Redis.
    pub async fn run(
        self: Arc<Self>,
        mut events: broadcast::Receiver<Arc<Event>>,
        shutdown: impl Future<Output = ()>,
    ) {
        use tokio::sync::broadcast::error::RecvError;
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                e = events.recv() => match e {
                    Ok(event) => self.apply(&event).await,
                    Err(RecvError::Lagged(_)) => self.refresh_all().await,
                    Err(RecvError::Closed) => return,
                }
            }
        }
    }

    /// Counts a new connection from `ip`; `false` when it is over its limit.
    pub fn admit(&self, ip: IpAddr) -> bool {
        let Ok(mut c) = self.connections.lock() else {
            return false;
        };
        let n = c.entry(ip).or_insert(0);
        if *n >= self.config.max_connections_per_client {
            return false;
        }
        *n += 1;
        true
    }

    /// Forgets a closed connection from `ip`.
    pub fn leave(&self, ip: IpAddr) {
        if let Ok(mut c) = self.connections.lock()
            && let Some(n) = c.get_mut(&ip)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.remove(&ip);
            }
        }
    }
}
