//! The live hub: the only consumer of the event feed on behalf of dashboards.
//!
//! It applies every event to an in-memory picture of each SKU (events carry the
//! counters' values after the change, so applying one is idempotent), and every
//! 200 ms publishes the SKUs that changed as one pre-serialised message for all
//! tabs. It also keeps ten minutes of `available` samples per drop SKU for the
//! charts, re-measures drift every few seconds, samples locks, lanes and the
//! write-behind once a second while a tab is connected, and keeps the most recent
//! events so a reconnecting tab can be given exactly what it missed.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use holdfast_app::dto::live::{EventView, Sample, ServerMsg, SkuHistory, SkuLive};
use holdfast_app::dto::ops::{JobView, LaneView, OpsView, WriteBehindView};
use holdfast_app::server::convert;
use holdfast_app::server::jobs::JobBoard;
use holdfast_domain::Lane;
use holdfast_engine::events::{Event, EventKind, EventReader, StreamCursor};
use holdfast_engine::{Backends, EngineError, catalog, ingest, redis_conn};
use tokio::sync::{broadcast, watch};

use crate::workers::WorkerStats;

/// Events kept for replay after a reconnect.
const RECENT: usize = 20_000;
/// Chart history kept per SKU.
const HISTORY_MS: i64 = 10 * 60 * 1_000;
/// SKUs with chart history (the drops' SKUs, at most this many).
const TRACKED_MAX: usize = 2_000;

/// What the hub publishes to every tab.
#[derive(Debug, Clone)]
pub enum HubMsg {
    /// A [`ServerMsg::Figures`] as JSON, with the raw events of the same window
    /// (each tab forwards those of the SKU it watches).
    Figures(Arc<String>, Arc<Vec<EventView>>),
    /// A [`ServerMsg::Job`] as JSON.
    Job(Arc<String>),
}

struct State {
    figures: HashMap<String, SkuLive>,
    tracked: HashSet<String>,
    history: HashMap<String, VecDeque<Sample>>,
    cursor: StreamCursor,
    /// Per shard, the position before the oldest event still in `recent`.
    floor: StreamCursor,
    recent: VecDeque<(u16, EventView)>,
    dirty: HashSet<String>,
    window: Vec<EventView>,
}

/// The hub; share it behind an `Arc`.
pub struct LiveHub {
    /// The sockets' limits.
    pub config: LiveConfig,
    backends: Backends,
    jobs: Arc<JobBoard>,
    workers: Arc<WorkerStats>,
    state: std::sync::Mutex<Option<State>>,
    tx: broadcast::Sender<HubMsg>,
    ops: watch::Sender<Option<Arc<String>>>,
    clients: AtomicUsize,
    /// `/live` handshakes per client address.
    pub handshakes: holdfast_engine::ratelimit::RateLimiter,
    /// Open tabs per account (each checks its session every few seconds).
    pub tabs: Arc<crate::http::per_address::PerKey<i64>>,
}

/// Most dashboard tabs one account may have open at once: past it, one
/// account's sockets (each checking its session in PostgreSQL every
/// [`crate::live::ws::SESSION_RECHECK`]) could load the system of record.
pub const TABS_PER_ACCOUNT: usize = 16;

/// The dashboard sockets' limits.
#[derive(Debug, Clone)]
pub struct LiveConfig {
    /// Largest message (and frame) a tab may send, in bytes: a tab sends only
    /// small subscription messages.
    pub max_message: usize,
    /// How often the server pings an open tab.
    pub ping_every: Duration,
    /// A tab from which nothing (not even a pong) arrived for this long is closed.
    pub idle_timeout: Duration,
    /// Handshakes per client address per second (bursts of twice that),
    /// checked before any session lookup: invented cookies cannot flood
    /// PostgreSQL.
    pub handshakes_per_second: u32,
    /// Longest wait for a tab to take one message.
    pub send_timeout: Duration,
}

impl Default for LiveConfig {
    fn default() -> Self {
        Self {
            max_message: 16 * 1024,
            ping_every: Duration::from_secs(20),
            idle_timeout: Duration::from_secs(60),
            handshakes_per_second: 5,
            send_timeout: crate::http::socket::DEFAULT_SEND_TIMEOUT,
        }
    }
}

/// Counts a connected tab for as long as it lives.
pub struct ClientGuard(Arc<LiveHub>);

impl Drop for ClientGuard {
    fn drop(&mut self) {
        self.0.clients.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a tab receives when it connects.
pub struct Subscription {
    /// The snapshot message, as JSON.
    pub snapshot: String,
    /// Deltas after the snapshot.
    pub deltas: broadcast::Receiver<HubMsg>,
    /// Operations samples.
    pub ops: watch::Receiver<Option<Arc<String>>>,
    /// Keeps the tab counted.
    pub guard: ClientGuard,
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

impl LiveHub {
    /// A hub over `backends`, forwarding `jobs` and reading lane rates from
    /// `workers`, its sockets held to `config`.
    pub fn new(
        backends: Backends,
        jobs: Arc<JobBoard>,
        workers: Arc<WorkerStats>,
        config: LiveConfig,
    ) -> Self {
        Self {
            backends,
            jobs,
            workers,
            state: std::sync::Mutex::new(None),
            tx: broadcast::channel(1_024).0,
            ops: watch::channel(None).0,
            clients: AtomicUsize::new(0),
            tabs: Arc::default(),
            handshakes: holdfast_engine::ratelimit::RateLimiter::new(
                holdfast_engine::ratelimit::Limit::per_second(config.handshakes_per_second),
            ),
            config,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<State>> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Connected tabs.
    pub fn clients(&self) -> usize {
        self.clients.load(Ordering::Relaxed)
    }

    /// The live figures of the drops' SKUs (the ones the overview shows), in
    /// SKU order, at most `limit` of them; empty until the hub has loaded.
    pub fn drop_figures(&self, limit: usize) -> Vec<SkuLive> {
        let state = self.lock();
        let Some(s) = state.as_ref() else {
            return Vec::new();
        };
        let mut skus: Vec<&String> = s.tracked.iter().collect();
        skus.sort();
        skus.into_iter()
            .filter_map(|sku| s.figures.get(sku).cloned())
            .take(limit)
            .collect()
    }

    /// Open holds on all the drops' SKUs (every one, not only those with
    /// per-SKU series).
    pub fn drop_open_holds(&self) -> u64 {
        let state = self.lock();
        state.as_ref().map_or(0, |s| {
            s.tracked
                .iter()
                .filter_map(|sku| s.figures.get(sku))
                .map(|f| f.open_holds)
                .sum()
        })
    }

    /// A snapshot for a tab watching `watched`, and the deltas after it. With the
    /// `resume` cursor of an earlier connection, the watched SKU's events since
    /// then are included (when they are still held).
    pub fn subscribe(
        self: &Arc<Self>,
        resume: Option<&str>,
        watched: Option<&str>,
    ) -> Subscription {
        self.clients.fetch_add(1, Ordering::Relaxed);
        let guard = ClientGuard(self.clone());
        let shards = self.backends.engine.keyspace().shards();
        let state = self.lock();
        // Subscribing under the lock: every delta published after this snapshot
        // reaches the receiver, and none published before it does.
        let deltas = self.tx.subscribe();
        let msg = match state.as_ref() {
            None => ServerMsg::Snapshot {
                cursor: StreamCursor::beginning(shards).encode(),
                skus: Vec::new(),
                history: Vec::new(),
                jobs: self.jobs.recent(),
                replayed: None,
            },
            Some(s) => {
                let replayed = resume
                    .and_then(|c| StreamCursor::decode(c, shards))
                    .filter(|c| (0..shards).all(|sh| !c.is_before(sh, s.floor.position(sh))))
                    .map(|c| {
                        s.recent
                            .iter()
                            .filter(|(sh, e)| c.is_before(*sh, &e.id))
                            .filter(|(_, e)| watched.is_some_and(|w| w == e.sku))
                            .map(|(_, e)| e.clone())
                            .collect()
                    });
                ServerMsg::Snapshot {
                    cursor: s.cursor.encode(),
                    // Drop SKUs and the watched one; others arrive as they change.
                    skus: s
                        .figures
                        .values()
                        .filter(|f| s.tracked.contains(&f.sku) || watched == Some(f.sku.as_str()))
                        .cloned()
                        .collect(),
                    history: s
                        .history
                        .iter()
                        .map(|(sku, samples)| SkuHistory {
                            sku: sku.clone(),
                            samples: samples.iter().copied().collect(),
                        })
                        .collect(),
                    jobs: self.jobs.recent(),
                    replayed,
                }
            }
        };
        drop(state);
        Subscription {
            snapshot: serde_json::to_string(&msg).unwrap_or_default(),
            deltas,
            ops: self.ops.subscribe(),
            guard,
        }
    }

    /// Runs the hub on `events` (from the feed) until `shutdown`.
    pub async fn run(
        self: Arc<Self>,
        redis_url: String,
        mut events: broadcast::Receiver<Arc<Event>>,
        shutdown: impl Future<Output = ()>,
    ) {
        use tokio::sync::broadcast::error::RecvError;
        tokio::pin!(shutdown);
        let mut jobs = self.jobs.subscribe();
        loop {
            match self.load(&redis_url).await {
                Ok(()) => break,
                Err(e) => tracing::warn!(error = %e, "live hub could not load figures; retrying"),
            }
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
        let mut flush = tokio::time::interval(Duration::from_millis(200));
        let mut sample = tokio::time::interval(Duration::from_secs(1));
        let mut drift = tokio::time::interval(Duration::from_secs(5));
        for t in [&mut flush, &mut sample, &mut drift] {
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        }
        let mut lane_counts = HashMap::new();
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                event = events.recv() => match event {
                    Ok(e) => self.apply(&e),
                    Err(RecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, "live hub fell behind the feed; reloading");
                        if let Err(e) = self.load(&redis_url).await {
                            tracing::warn!(error = %e, "live hub reload failed");
                        }
                    }
                    Err(RecvError::Closed) => return,
                },
                job = jobs.recv() => if let Ok(job) = job { self.publish_job(&job) },
                _ = flush.tick() => self.flush(),
                _ = sample.tick() => {
                    self.sample();
                    if self.clients() > 0 {
                        self.sample_ops(&mut lane_counts).await;
                    }
                }
                _ = drift.tick() => self.refresh_drift().await,
            }
        }
    }

    /// (Re)reads every tracked SKU's figures and the stream positions.
    async fn load(&self, redis_url: &str) -> Result<(), EngineError> {
        let b = &self.backends;
        let tracked = self.drop_skus().await?;
        let keys = b.engine.keyspace();
        let cursor = EventReader::new(redis_conn::connect(redis_url).await?, keys)
            .tail_cursor()
            .await?;
        let figures = convert::figures_of(b, &tracked).await?;
        let mut guard = self.lock();
        let previous = guard.take();
        let mut state = State {
            figures: figures.into_iter().map(|f| (f.sku.clone(), f)).collect(),
            tracked: tracked.into_iter().collect(),
            history: previous.map(|p| p.history).unwrap_or_default(),
            floor: cursor.clone(),
            cursor,
            recent: VecDeque::new(),
            dirty: HashSet::new(),
            window: Vec::new(),
        };
        state.dirty.extend(state.figures.keys().cloned());
        *guard = Some(state);
        Ok(())
    }

    fn apply(&self, e: &Event) {
        let mut guard = self.lock();
        let Some(s) = guard.as_mut() else { return };
        if !s.cursor.is_before(e.shard, &e.id) {
            // Already reflected in what was loaded.
            return;
        }
        s.cursor.advance(e.shard, &e.id);
        if e.sku.is_empty() {
            // An event about a reservation, not a SKU (a late payment).
            return;
        }
        let f = s.figures.entry(e.sku.clone()).or_insert_with(|| SkuLive {
            sku: e.sku.clone(),
            available: 0,
            reserved: 0,
            sold_pending: 0,
            owed: 0,
            sold: 0,
            open_holds: 0,
            drift: 0,
            warmed: true,
        });
        f.warmed = true;
        if let Some(a) = e.available {
            f.available = a;
        }
        if let Some(r) = e.reserved {
            f.reserved = r;
        }
        if let Some(p) = e.sold_pending {
            f.sold_pending = p;
        }
        if let Some(o) = e.owed {
            f.owed = o;
        }
        match e.kind {
            EventKind::Reserved => f.open_holds += 1,
            EventKind::Released | EventKind::Expired => {
                f.open_holds = f.open_holds.saturating_sub(1)
            }
            EventKind::Confirmed => {
                f.open_holds = f.open_holds.saturating_sub(1);
                f.sold += e.qty;
            }
            _ => {}
        }
        s.dirty.insert(e.sku.clone());
        let view = convert::event_view(e);
        // Raw events go out only to connected tabs; with none, keep them for replay alone.
        if self.tx.receiver_count() > 0 {
            s.window.push(view.clone());
        }
        s.recent.push_back((e.shard, view));
        while s.recent.len() > RECENT {
            if let Some((shard, old)) = s.recent.pop_front() {
                s.floor.advance(shard, &old.id);
            }
        }
    }

    fn flush(&self) {
        let mut guard = self.lock();
        let Some(s) = guard.as_mut() else { return };
        if s.dirty.is_empty() && s.window.is_empty() {
            return;
        }
        if self.tx.receiver_count() == 0 {
            // Nobody to tell: a tab that connects later gets a snapshot.
            s.dirty.clear();
            s.window.clear();
            return;
        }
        let skus: Vec<SkuLive> = s
            .dirty
            .drain()
            .filter_map(|sku| s.figures.get(&sku).cloned())
            .collect();
        let msg = ServerMsg::Figures {
            cursor: s.cursor.encode(),
            skus,
            at_ms: now_ms(),
        };
        let events = std::mem::take(&mut s.window);
        if let Ok(json) = serde_json::to_string(&msg) {
            // Published under the lock; see `subscribe`.
            let _ = self
                .tx
                .send(HubMsg::Figures(Arc::new(json), Arc::new(events)));
        }
    }

    fn publish_job(&self, job: &JobView) {
        if let Ok(json) = serde_json::to_string(&ServerMsg::Job(job.clone())) {
            let _guard = self.lock();
            let _ = self.tx.send(HubMsg::Job(Arc::new(json)));
        }
    }

    fn sample(&self) {
        let now = now_ms();
        let mut guard = self.lock();
        let Some(s) = guard.as_mut() else { return };
        for sku in &s.tracked {
            let Some(f) = s.figures.get(sku) else {
                continue;
            };
            let samples = s.history.entry(sku.clone()).or_default();
            // One point per change, and one every ten seconds when flat.
            let stale = samples
                .back()
                .is_none_or(|last| last.available != f.available || now - last.at_ms >= 10_000);
            if stale {
                samples.push_back(Sample {
                    at_ms: now,
                    available: f.available,
                });
            }
            while samples.front().is_some_and(|x| x.at_ms < now - HISTORY_MS) {
                samples.pop_front();
            }
        }
    }

    /// The drops' SKUs now (a drop or SKU added since start-up joins the charts).
    async fn drop_skus(&self) -> Result<Vec<String>, EngineError> {
        let mut skus = catalog::all_drop_skus(&self.backends.pg).await?;
        skus.truncate(TRACKED_MAX);
        Ok(skus)
    }

    async fn refresh_drift(&self) {
        if self.lock().is_none() {
            return;
        }
        let skus = match self.drop_skus().await {
            Ok(skus) => skus,
            Err(e) => {
                tracing::debug!(error = %e, "drop list refresh failed");
                return;
            }
        };
        let new: Vec<String> = match self.lock().as_ref() {
            Some(s) => skus
                .iter()
                .filter(|k| !s.tracked.contains(*k))
                .cloned()
                .collect(),
            None => return,
        };
        if !new.is_empty()
            && let Ok(figures) = convert::figures_of(&self.backends, &new).await
        {
            let mut guard = self.lock();
            if let Some(s) = guard.as_mut() {
                for f in figures {
                    s.tracked.insert(f.sku.clone());
                    s.dirty.insert(f.sku.clone());
                    // Events may already have brought newer figures.
                    s.figures.entry(f.sku.clone()).or_insert(f);
                }
            }
        }
        let b = &self.backends;
        match holdfast_engine::reconcile::measure(&b.engine, &b.pg, &skus).await {
            Ok(drifts) => {
                let mut guard = self.lock();
                let Some(s) = guard.as_mut() else { return };
                for d in drifts {
                    if let Some(f) = s.figures.get_mut(&d.sku)
                        && f.drift != d.drift
                    {
                        f.drift = d.drift;
                        s.dirty.insert(d.sku);
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "drift refresh failed"),
        }
    }

    async fn sample_ops(&self, lane_counts: &mut HashMap<Lane, (u64, std::time::Instant)>) {
        let engine = &self.backends.engine;
        let mut conn = engine.connection();
        let mut ops = OpsView {
            at_ms: now_ms(),
            ..OpsView::default()
        };
        match engine.list_locks().await {
            Ok(locks) => ops.locks = locks.into_iter().map(convert::lock_view).collect(),
            Err(e) => tracing::debug!(error = %e, "lock sample failed"),
        }
        for s in ingest::statuses(&mut conn).await.unwrap_or_default() {
            let lane = s.lane;
            let applied = self
                .workers
                .lanes
                .get(&lane)
                .map_or(0, |l| l.applied.load(Ordering::Relaxed));
            let now = std::time::Instant::now();
            let rate = lane_counts.get(&lane).map_or(0.0, |(before, at)| {
                applied.saturating_sub(*before) as f64
                    / now.duration_since(*at).as_secs_f64().max(0.001)
            });
            lane_counts.insert(lane, (applied, now));
            ops.lanes.push(LaneView::new(&s, rate));
        }
        ops.dead_letters = ingest::dead_letter_count(&mut conn).await.unwrap_or(0);
        ops.write_behind = engine
            .write_behind_lag()
            .await
            .ok()
            .map(|l| WriteBehindView {
                pending: l.entries,
                lag_ms: l.oldest_ms,
            });
        if let Ok(json) = serde_json::to_string(&ServerMsg::Ops(ops)) {
            self.ops.send_replace(Some(Arc::new(json)));
        }
    }
}
