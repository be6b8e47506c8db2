//! Shopper stock badges: a public, read-only view of each SKU ("In stock", "Only 3
//! left", "Sold out"), live over WebSockets and pollable as cacheable JSON.
//!
//! One [`BadgeHub`] per process turns the event feed into the latest badge per
//! watched SKU, held in a `watch` channel: a slow connection simply sees the
//! newest value when it catches up, it never buffers a backlog. No cookies, no
//! private data; an Origin allow-list, connections per client address,
//! subscriptions per connection and subscribe messages per connection are
//! limited. Only SKUs with a stock counter get a watch entry and thresholds come
//! from one in-memory copy of the catalogue, so invented SKUs cost one Redis
//! read each and no memory or PostgreSQL work.

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

use crate::http::per_address::{AddressPlace, PerAddress};
use holdfast_engine::ratelimit::{Limit, RateLimiter};

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
    /// When the SKU's drop starts, Unix ms (the badge counts down to it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub starts_at: Option<i64>,
    /// When the SKU's drop ends, Unix ms (the badge reads "Sale ended" after).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ends_at: Option<i64>,
}

/// A drop's start and end as a badge carries them (Unix ms; `None`: no bound).
type Window = (Option<i64>, Option<i64>);

impl Badge {
    fn new(sku: &str, available: Option<i64>, threshold: i64, window: Window) -> Self {
        let state = StockState::of(available, threshold);
        let left = available.filter(|_| state == StockState::Low);
        Self {
            sku: sku.to_owned(),
            state,
            left,
            starts_at: window.0,
            ends_at: window.1,
        }
    }

    /// The badge of `sku` from its figures (`None`: no counter).
    fn of(sku: &str, figures: Option<&holdfast_domain::Figures>, threshold: i64) -> Self {
        let window = figures.map_or((None, None), |f| {
            (
                Some(f.opens_at_ms).filter(|&t| t > 0),
                Some(f.closes_at_ms).filter(|&t| t > 0),
            )
        });
        Self::new(sku, figures.map(|f| f.available), threshold, window)
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
    /// Polls per second per client address (bursts of twice that); a socket's
    /// subscribe message counts as one.
    pub polls_per_second: u32,
    /// Subscribe messages one connection may send in a burst; then one per
    /// [`BadgeConfig::resubscribe_every`].
    pub subscribe_burst: u32,
    /// Pace of subscribe messages after the burst.
    pub resubscribe_every: Duration,
    /// How often the server pings an open socket.
    pub ping_every: Duration,
    /// A socket from which nothing (not even a pong) arrived for this long is closed.
    pub idle_timeout: Duration,
    /// Largest message (and frame) a page may send, in bytes.
    pub max_message: usize,
    /// Longest wait for a page to take one message.
    pub send_timeout: Duration,
}

impl Default for BadgeConfig {
    fn default() -> Self {
        Self {
            origins: Vec::new(),
            max_connections_per_client: 50,
            max_subscriptions: 20,
            polls_per_second: 10,
            subscribe_burst: 5,
            resubscribe_every: Duration::from_secs(1),
            ping_every: Duration::from_secs(25),
            idle_timeout: Duration::from_secs(60),
            max_message: 4 * 1024,
            send_timeout: crate::http::socket::DEFAULT_SEND_TIMEOUT,
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
    thresholds: Mutex<Thresholds>,
    reloading: tokio::sync::Mutex<()>,
    connections: Arc<PerAddress>,
    /// Polls per client address.
    pub polls: RateLimiter<IpAddr>,
}

/// The catalogue's thresholds in memory, and when they were read.
#[derive(Default)]
struct Thresholds {
    by_sku: HashMap<String, i64>,
    read_at: Option<Instant>,
    tried_at: Option<Instant>,
}

/// How long the catalogue's thresholds are used before they are read again.
const THRESHOLD_TTL: Duration = Duration::from_secs(30);
/// How long after PostgreSQL failed to answer before it is asked again (the
/// last copy, or the default, stands in meanwhile).
const THRESHOLD_RETRY: Duration = Duration::from_secs(5);
/// How often every watched badge is read again from Redis, for changes no event
/// carries (a rescheduled drop reaches open badges within this).
pub const REFRESH_EVERY: Duration = Duration::from_secs(10);
/// Threshold for a SKU the catalogue does not list.
const DEFAULT_THRESHOLD: i64 = 5;

impl BadgeHub {
    /// A hub reading counters through `engine` and thresholds from `pg`.
    pub fn new(engine: Engine, pg: PgPool, config: BadgeConfig) -> Self {
        Self {
            engine,
            pg,
            skus: Mutex::default(),
            thresholds: Mutex::default(),
            reloading: tokio::sync::Mutex::new(()),
            connections: Arc::default(),
            polls: RateLimiter::new(Limit::per_second(config.polls_per_second)),
            config,
        }
    }

    /// `sku`'s low-stock threshold from the in-memory catalogue, read again
    /// (one query for every SKU, by one caller at a time) when it is old.
    async fn threshold(&self, sku: &str) -> i64 {
        let due = self.thresholds.lock().is_ok_and(|t| {
            t.read_at.is_none_or(|at| at.elapsed() >= THRESHOLD_TTL)
                && t.tried_at.is_none_or(|at| at.elapsed() >= THRESHOLD_RETRY)
        });
        if due && let Ok(_reload) = self.reloading.try_lock() {
            let read = postgres::quick(catalog::thresholds(&self.pg)).await;
            if let Ok(mut t) = self.thresholds.lock() {
                t.tried_at = Some(Instant::now());
                match read {
                    Ok(by_sku) => {
                        t.by_sku = by_sku;
                        t.read_at = Some(Instant::now());
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "could not read the low-stock thresholds")
                    }
                }
            }
        }
        self.thresholds
            .lock()
            .ok()
            .and_then(|t| t.by_sku.get(sku).copied())
            .unwrap_or(DEFAULT_THRESHOLD)
    }

    /// How many SKUs have a watch entry (bounded by the SKUs with counters).
    pub fn watched(&self) -> usize {
        self.skus.lock().map_or(0, |s| s.len())
    }

    /// The badges of `skus` read from Redis now, in one round trip.
    pub async fn current_many(&self, skus: &[String]) -> Vec<Badge> {
        let figures = self.engine.figures_many(skus).await.unwrap_or_default();
        let mut badges = Vec::with_capacity(skus.len());
        for (i, sku) in skus.iter().enumerate() {
            let f = figures.get(i).copied().flatten();
            badges.push(Badge::of(sku, f.as_ref(), self.threshold(sku).await));
        }
        badges
    }

    /// A receiver of each of `skus`' badges: its current value now, the newest
    /// after each change. The ones no socket watches yet are read from Redis
    /// in one round trip.
    pub async fn watch_many(&self, skus: Vec<String>) -> Vec<(String, watch::Receiver<Badge>)> {
        let mut watched = Vec::with_capacity(skus.len());
        let mut unread = Vec::new();
        if let Ok(known) = self.skus.lock() {
            for sku in skus {
                match known.get(&sku) {
                    Some(tx) => watched.push((sku, tx.subscribe())),
                    None => unread.push(sku),
                }
            }
        }
        if unread.is_empty() {
            return watched;
        }
        let badges = self.current_many(&unread).await;
        let Ok(mut known) = self.skus.lock() else {
            return watched;
        };
        if known.len() > 10_000 {
            known.retain(|_, tx| tx.receiver_count() > 0);
        }
        for (sku, badge) in unread.into_iter().zip(badges) {
            let rx = if badge.state == StockState::Unknown {
                // No counter: an invented or unwarmed SKU gets a one-off answer
                // and no entry (it appears on the next subscribe once warmed).
                watch::channel(badge).1
            } else {
                known
                    .entry(sku.clone())
                    .or_insert_with(|| watch::channel(badge).0)
                    .subscribe()
            };
            watched.push((sku, rx));
        }
        watched
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
        // Events carry stock, not the schedule: the badge keeps the one it has.
        let window = self.skus.lock().ok().and_then(|s| {
            s.get(&event.sku).map(|tx| {
                let b = tx.borrow();
                (b.starts_at, b.ends_at)
            })
        });
        if let (Some(window), Some(available)) = (window, event.available) {
            let threshold = self.threshold(&event.sku).await;
            self.publish(Badge::new(&event.sku, Some(available), threshold, window));
        }
    }

    /// Reads every watched badge from Redis again, in one round trip: after
    /// missed events, and every [`REFRESH_EVERY`] for what events do not carry
    /// (a drop rescheduled, a threshold changed).
    async fn refresh_all(&self) {
        let skus: Vec<String> = self
            .skus
            .lock()
            .map(|s| s.keys().cloned().collect())
            .unwrap_or_default();
        for badge in self.current_many(&skus).await {
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
        let mut refresh = tokio::time::interval(REFRESH_EVERY);
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                _ = refresh.tick() => self.refresh_all().await,
                e = events.recv() => match e {
                    Ok(event) => self.apply(&event).await,
                    Err(RecvError::Lagged(_)) => self.refresh_all().await,
                    Err(RecvError::Closed) => return,
                }
            }
        }
    }

    /// Badge sockets open now, from every address.
    pub fn connections(&self) -> usize {
        self.connections.total()
    }

    /// Counts a new connection from `ip`, given back when the place is
    /// dropped; `None` when `ip` has its limit open.
    pub fn admit(&self, ip: IpAddr) -> Option<AddressPlace> {
        self.connections
            .take(ip, self.config.max_connections_per_client)
    }
}
