//! The process's single reader of the event streams, fanned out over a broadcast
//! channel to everything that needs live events: the sold-out cache, the badge hub
//! and the dashboards' live hub. One Redis connection per process, however many
//! listeners.
//!
//! Under a steady load the reader gathers: after a read that brought events it
//! waits until its gather time has passed since that read began
//! ([`gathered_until`], the write-behind's rule too). One `XREAD`
//! over every shard's stream costs Redis about the same whether it finds one
//! event or hundreds, and at 5,000 checkout calls a second reading as fast as
//! events came made the reader one of Redis' largest costs (765 reads a second,
//! 145 µs each). The first event after a quiet spell is passed on at once; a
//! backlog (a read that stopped at its count) is read on without waiting.

use std::sync::Arc;
use std::time::Duration;

use holdfast_engine::events::{Event, EventReader, StreamCursor};
use holdfast_engine::pace::gathered_until;
use holdfast_engine::{EngineError, redis_conn};
use tokio::sync::broadcast;

/// Default for a feed's gather time ([`Feed::new`]): well inside what its listeners need (the
/// dashboards flush every 200 ms, badges promise a second), and a sold-out
/// SKU whose stock comes back is served from Redis again at most this much
/// later.
pub const DEFAULT_GATHER: Duration = Duration::from_millis(10);

/// Most entries read from one stream at a time.
const READ_COUNT: usize = 500;

/// How long a feed must have run before a failure for its reconnect backoff
/// to start again from the shortest wait.
const STEADY: Duration = Duration::from_secs(10);

/// The sending side; subscribe to receive every event from now on.
#[derive(Clone)]
pub struct Feed {
    tx: broadcast::Sender<Arc<Event>>,
    gather: Duration,
    /// Reads of the streams that brought events (for `/metrics`).
    pub reads: prometheus_client::metrics::counter::Counter,
}

impl Feed {
    /// A feed with room for `capacity` undelivered events per listener (a
    /// slower listener is told how many it missed, `RecvError::Lagged`) that
    /// reads at most once per `gather` while events keep coming.
    pub fn new(capacity: usize, gather: Duration) -> Self {
        Self {
            tx: broadcast::channel(capacity).0,
            gather,
            reads: Default::default(),
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
            let began = tokio::time::Instant::now();
            tokio::select! {
                () = &mut shutdown => return,
                Err(e) = attempt => {
                    tracing::warn!(error = %e, "event feed interrupted; reconnecting");
                }
            }
            // A feed that ran a while before this failure starts its backoff
            // again: an old blip must not make every later reconnect slow.
            if began.elapsed() >= STEADY {
                backoff = Duration::from_millis(100);
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
            let began = tokio::time::Instant::now();
            let events = reader
                .read(cursor, READ_COUNT, Some(Duration::from_millis(1_000)))
                .await?;
            if !events.is_empty() {
                self.reads.inc();
            }
            let gathered = gathered_until(began, self.gather, !events.is_empty(), reader.backlog());
            for event in events {
                // No listeners is fine: nothing to deliver.
                let _ = self.tx.send(Arc::new(event));
            }
            if let Some(until) = gathered {
                tokio::time::sleep_until(until).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use holdfast_engine::ReserveRequest;
    use holdfast_engine::testkit::{TestRedis, cluster_mode, stock};
    use tokio::sync::broadcast::Receiver;

    /// The next event within `within`, if any.
    async fn next(rx: &mut Receiver<Arc<Event>>, within: Duration) -> Option<Arc<Event>> {
        tokio::time::timeout(within, rx.recv()).await.ok()?.ok()
    }

    /// `feed` running on `redis` until the returned sender says stop.
    fn started(
        feed: &Feed,
        redis: &TestRedis,
        engine: &holdfast_engine::Engine,
    ) -> (
        tokio::sync::watch::Sender<bool>,
        tokio::task::JoinHandle<()>,
    ) {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let running = tokio::spawn(
            feed.clone()
                .run(redis.url(), engine.keyspace(), async move {
                    let _ = stopped.wait_for(|s| *s).await;
                }),
        );
        (stop, running)
    }

    /// Holds (made by `hold`) until one reaches `rx`: a feed starts at the
    /// streams' end, and after a reconnect it reads on from where it was.
    async fn until_passed_on(
        engine: &holdfast_engine::Engine,
        rx: &mut Receiver<Arc<Event>>,
        hold: &mut impl FnMut() -> ReserveRequest,
    ) {
        for _ in 0..100 {
            let req = hold();
            // Refused while Redis comes back: the next one may pass.
            if engine.reserve(&req).await.is_err() {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            while let Some(e) = next(rx, Duration::from_millis(100)).await {
                if e.reservation_id.as_deref() == Some(req.reservation_id.as_str()) {
                    return;
                }
            }
        }
        panic!("the feed never passed a hold on");
    }

    /// Redis killed while the feed runs, and back empty: the feed reconnects
    /// and passes on the holds made afterwards.
    #[tokio::test]
    async fn the_feed_comes_back_after_redis_is_killed_and_restarted_empty() {
        let mut redis = TestRedis::start();
        let engine = redis.engine().await;
        stock(&engine, "FEED-2", 1_000).await;
        let feed = Feed::new(4_096, DEFAULT_GATHER);
        let mut rx = feed.subscribe();
        let (stop, running) = started(&feed, &redis, &engine);
        let mut n = 0;
        let mut hold = || {
            n += 1;
            ReserveRequest::single(format!("back-{n}"), "FEED-2", 1)
        };
        until_passed_on(&engine, &mut rx, &mut hold).await;
        redis.kill();
        // The feed meets the closed connection and waits to reconnect.
        tokio::time::sleep(Duration::from_millis(500)).await;
        redis.restart();
        // The engine's connection comes back on its own; then warm again.
        for _ in 0..100 {
            if engine.figures("FEED-2").await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        stock(&engine, "FEED-2", 1_000).await;
        until_passed_on(&engine, &mut rx, &mut hold).await;
        let _ = stop.send(true);
        running.await.unwrap();
    }

    /// While events keep coming the feed reads at most once per gather time
    /// (a steady trickle of 300 holds, one every 5 ms, is read in a handful of
    /// reads rather than one per hold) and loses none; after a quiet spell the
    /// first event is passed on at once, and so is the next (the gather time
    /// runs from the start of the read that waited out the quiet spell, not
    /// from its end); a backlog is read without waiting.
    #[tokio::test]
    async fn a_trickle_is_read_in_gathered_reads_and_a_quiet_spell_ends_at_once() {
        const GATHER: Duration = Duration::from_millis(300);
        let redis = TestRedis::start();
        let engine = redis.engine().await;
        stock(&engine, "FEED-1", 10_000).await;
        let feed = Feed::new(16_384, GATHER);
        let mut rx = feed.subscribe();
        let (stop, running) = started(&feed, &redis, &engine);
        let mut n = 0;
        let mut hold = || {
            n += 1;
            ReserveRequest::single(format!("feed-{n}"), "FEED-1", 1)
        };
        until_passed_on(&engine, &mut rx, &mut hold).await;
        while next(&mut rx, GATHER * 2).await.is_some() {}

        // A quiet spell, then two holds one after the other: each passed on
        // well within the gather time.
        tokio::time::sleep(GATHER * 2).await;
        for which in ["first", "second"] {
            let began = tokio::time::Instant::now();
            engine.reserve(&hold()).await.unwrap();
            assert!(next(&mut rx, Duration::from_secs(2)).await.is_some());
            let took = began.elapsed();
            assert!(
                took < GATHER / 2,
                "the {which} event after a quiet spell took {took:?}"
            );
        }
        tokio::time::sleep(GATHER * 2).await;

        // A trickle of 300 holds over about 1.5 s.
        let (reads, calls) = (feed.reads.get(), redis.command_calls("xread").await);
        let trickle_began = tokio::time::Instant::now();
        let mut sent = Vec::new();
        for _ in 0..300 {
            let req = hold();
            engine.reserve(&req).await.unwrap();
            sent.push(req.reservation_id.clone());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut got = Vec::new();
        while got.len() < sent.len() {
            let Some(e) = next(&mut rx, Duration::from_secs(2)).await else {
                break;
            };
            got.extend(e.reservation_id.clone());
        }
        assert_eq!(got, sent, "every hold of the trickle, in order");
        let took = trickle_began.elapsed();
        let reads = feed.reads.get() - reads;
        // One read per gather time, and one more where the trickle began.
        let most = took.as_millis() / GATHER.as_millis() + 2;
        assert!(
            u128::from(reads) <= most,
            "{reads} reads for 300 holds in {took:?} (at most {most})"
        );
        if !cluster_mode() {
            // Redis agrees (a cluster is read one stream at a time, polled).
            let calls = redis.command_calls("xread").await - calls;
            assert!(
                u128::from(calls) <= most + 1,
                "{calls} XREAD calls for 300 holds in {took:?}"
            );
        }

        // A backlog: 1,600 events on one stream wait; the feed reads them
        // READ_COUNT at a time without gathering between (four reads, so
        // waiting would take at least three gather times).
        let _ = stop.send(true);
        running.await.unwrap();
        let feed = Feed::new(16_384, GATHER);
        let mut rx = feed.subscribe();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let keys = engine.keyspace();
        let mut reader = EventReader::new(redis.connection().await, keys);
        let mut cursor = Some(reader.tail_cursor().await.unwrap());
        for _ in 0..1_600 {
            engine.reserve(&hold()).await.unwrap();
        }
        let began = tokio::time::Instant::now();
        let draining = tokio::spawn({
            let feed = feed.clone();
            let url = redis.url();
            async move {
                let mut stopped = stopped;
                tokio::select! {
                    r = feed.tail(&url, keys, &mut cursor) => r,
                    _ = stopped.wait_for(|s| *s) => Ok(()),
                }
            }
        });
        let mut drained = 0;
        while drained < 1_600 {
            assert!(
                next(&mut rx, Duration::from_secs(2)).await.is_some(),
                "the backlog stopped after {drained} events"
            );
            drained += 1;
        }
        let took = began.elapsed();
        assert!(
            took < GATHER * 2,
            "a backlog of 1,600 took {took:?} to read"
        );
        let _ = stop.send(true);
        draining.await.unwrap().unwrap();
    }
}
