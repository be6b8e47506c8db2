//! A bulk feed gives way to checkout: the `feeds` lane applies its events step
//! by step at its pace, slows to its yield rate while checkout is busy and
//! catches up once checkout is quiet, keeps the payloads it is slowly working
//! through (or was paused on) from being taken over as abandoned, and stops
//! part-way for a pause or a restart without counting that as a failed
//! attempt. An event id the ledger has is still checked against its event.
//! Real Redis, real PostgreSQL.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use holdfast_engine::ingest::{self, Lane, LaneConfig, LaneConsumer, LaneStats};
use holdfast_engine::pace::Yield;
use holdfast_engine::testkit::{TestRedis, queue_payload};
use holdfast_engine::warmup::{WarmOptions, warm_all};
use holdfast_engine::{Backends, ReserveOutcome, ReserveRequest, postgres};
use sqlx::PgPool;

/// `n` catalogue SKUs `CAT-0000`… with 100 units each and `HOT-1` with plenty,
/// warmed into a private Redis.
async fn setup(pg: &PgPool, n: i64) -> (TestRedis, Backends) {
    sqlx::query(
        "INSERT INTO skus (sku, title, product, on_hand)
         SELECT 'CAT-' || lpad(i::text, 4, '0'), 'c', 'c', 100 FROM generate_series(0, $1 - 1) i
         UNION ALL SELECT 'HOT-1', 'h', 'h', 1000000",
    )
    .bind(n)
    .execute(pg)
    .await
    .unwrap();
    let redis = TestRedis::start();
    let backends = holdfast_engine::testkit::backends(pg.clone(), &redis.url()).await;
    warm_all(&backends.engine, pg, WarmOptions::default(), |_| {})
        .await
        .unwrap();
    (redis, backends)
}

/// A payload raising each of `CAT-0000`… `CAT-{n-1}` by 5.
fn feed_of(n: usize, tag: &str) -> Vec<u8> {
    let events: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            serde_json::json!({"event_id": format!("{tag}-{i}"), "type": "delta",
                               "sku": format!("CAT-{i:04}"), "delta": 5})
        })
        .collect();
    serde_json::json!({ "events": events })
        .to_string()
        .into_bytes()
}

fn consumer(
    b: &Backends,
    conn: holdfast_engine::RedisConn,
    lane: LaneConfig,
    name: &str,
) -> (LaneConsumer, Arc<LaneStats>) {
    let stats = Arc::new(LaneStats::default());
    let consumer = LaneConsumer::new(b.engine.clone(), conn, lane, name.into(), stats.clone());
    (consumer, stats)
}

/// The feeds lane at `rate` events a second (0: unlimited), yielding as `yields` says.
fn feeds_lane(rate: u32, yields: Option<Yield>) -> LaneConfig {
    LaneConfig {
        rate_per_sec: rate,
        yields,
        ..LaneConfig::default_for(Lane::Feeds)
    }
}

/// A consumer `feeds-1` of `lane` (its group made), and a payload of `n`
/// events tagged `tag` queued for it.
async fn consumer_with_payload(
    b: &Backends,
    redis: &TestRedis,
    lane: LaneConfig,
    n: usize,
    tag: &str,
) -> (LaneConsumer, Arc<LaneStats>) {
    let (mut feeds, stats) = consumer(b, redis.connection().await, lane, "feeds-1");
    feeds.process_once(Duration::from_millis(10)).await.unwrap();
    queue_payload(
        &mut redis.connection().await,
        Lane::Feeds,
        "erp",
        &feed_of(n, tag),
    )
    .await;
    (feeds, stats)
}

/// Every one of the first `n` catalogue SKUs has exactly its +5, once.
async fn every_delta_applied_once(b: &Backends, n: usize) {
    for i in 0..n {
        let sku = format!("CAT-{i:04}");
        let f = b.engine.figures(&sku).await.unwrap().unwrap();
        assert_eq!(f.available, 105, "{sku}");
    }
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_bulk_feed_gives_way_to_busy_checkout_and_catches_up_after(pg: PgPool) {
    const EVENTS: usize = 2_000;
    let (redis, b) = setup(&pg, EVENTS as i64).await;
    let lane = feeds_lane(
        0,
        Some(Yield {
            above: 50,
            rate: 200,
        }),
    );
    let (mut feeds, stats) = consumer_with_payload(&b, &redis, lane, EVENTS, "bulk").await;

    // Checkout at about 300 calls a second for 2.5 s.
    let engine = b.engine.clone();
    let checkout = tokio::spawn(async move {
        let started = Instant::now();
        let mut n = 0;
        while started.elapsed() < Duration::from_millis(2_500) {
            let r = engine
                .reserve(&ReserveRequest::single(format!("r-{n}"), "HOT-1", 1))
                .await
                .unwrap();
            assert!(matches!(r, ReserveOutcome::Reserved { .. }), "{r:?}");
            n += 1;
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        n
    });
    // The lane starts once checkout has been busy for a moment.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let lane_task = tokio::spawn(async move {
        let mut applied = 0;
        while applied < EVENTS as u64 {
            applied += feeds
                .process_once(Duration::from_millis(10))
                .await
                .unwrap()
                .applied;
        }
        applied
    });
    let reservations = checkout.await.unwrap();
    let busy_for = started.elapsed().as_secs_f64();
    let during = stats.applied.load(Ordering::Relaxed);
    assert!(
        reservations as f64 / 2.5 > 50.0,
        "checkout was busy: {reservations} reservations"
    );
    // 200 a second while busy, and at most a step banked ahead.
    let allowed = (200.0 * busy_for) as u64 + 2 * holdfast_engine::pace::STEP as u64;
    assert!(
        during <= allowed,
        "{during} events applied in {busy_for:.2} s of busy checkout (at most {allowed})"
    );
    assert!(
        during >= 50,
        "the lane still moves while it yields: {during}"
    );

    // Quiet again: the rest is applied at full speed after a second.
    let quiet = Instant::now();
    let applied = tokio::time::timeout(Duration::from_secs(30), lane_task)
        .await
        .expect("the lane caught up")
        .unwrap();
    assert_eq!(applied, EVENTS as u64);
    let rest = EVENTS as u64 - during;
    let at_yield_rate = Duration::from_secs_f64(rest as f64 / 200.0);
    assert!(
        quiet.elapsed() < at_yield_rate,
        "the {rest} left took {:?}: no faster than while yielding ({at_yield_rate:?})",
        quiet.elapsed()
    );
    every_delta_applied_once(&b, EVENTS).await;
    assert_eq!(stats.dead.load(Ordering::Relaxed), 0);
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn payloads_worked_through_slowly_or_paused_stay_their_consumers(pg: PgPool) {
    const EACH: usize = 20;
    let (redis, b) = setup(&pg, 3 * EACH as i64).await;
    // A batch of three payloads at 20 events a second: a step of 20 events
    // takes a second, more than three times the 300 ms after which another
    // consumer would take an idle entry over as abandoned; the rest of the
    // batch waits its turn for longer still, and a pause of a second comes
    // in between.
    let lane = LaneConfig {
        claim_idle: Duration::from_millis(300),
        batch: 3,
        ..feeds_lane(20, None)
    };
    let (mut slow, slow_stats) = consumer(&b, redis.connection().await, lane.clone(), "feeds-1");
    slow.process_once(Duration::from_millis(10)).await.unwrap();
    let mut conn = redis.connection().await;
    for p in 0..3 {
        let events: Vec<serde_json::Value> = (p * EACH..(p + 1) * EACH)
            .map(|i| {
                serde_json::json!({"event_id": format!("slow-{i}"), "type": "delta",
                                   "sku": format!("CAT-{i:04}"), "delta": 5})
            })
            .collect();
        let body = serde_json::json!({ "events": events }).to_string();
        queue_payload(&mut conn, Lane::Feeds, "erp", body.as_bytes()).await;
    }
    let (mut other, other_stats) = consumer(&b, redis.connection().await, lane, "feeds-2");
    let started = Instant::now();
    let slow_task = tokio::spawn(async move {
        let mut applied = 0;
        while applied < 3 * EACH as u64 {
            applied += slow
                .process_once(Duration::from_millis(10))
                .await
                .unwrap()
                .applied;
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "only {applied} applied by their consumer in 30 s"
            );
        }
        applied
    });
    let (mut paused, mut resumed) = (false, false);
    while !slow_task.is_finished() {
        other.process_once(Duration::from_millis(50)).await.unwrap();
        let at = started.elapsed();
        if !paused && at > Duration::from_millis(1_200) {
            ingest::pause(&mut conn, Lane::Feeds).await.unwrap();
            paused = true;
        }
        if paused && !resumed && at > Duration::from_millis(2_200) {
            ingest::resume(&mut conn, Lane::Feeds).await.unwrap();
            resumed = true;
        }
    }
    assert!(resumed, "the pause came while the payloads were worked on");
    assert_eq!(slow_task.await.unwrap(), 3 * EACH as u64);
    assert_eq!(
        other_stats.applied.load(Ordering::Relaxed)
            + other_stats.duplicates.load(Ordering::Relaxed)
            + other_stats.dead.load(Ordering::Relaxed),
        0,
        "the other consumer never took a payload over"
    );
    assert_eq!(slow_stats.dead.load(Ordering::Relaxed), 0);
    every_delta_applied_once(&b, 3 * EACH).await;
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn restarts_mid_payload_never_dead_letter_it(pg: PgPool) {
    const EVENTS: usize = 200;
    let (redis, b) = setup(&pg, EVENTS as i64).await;
    // 100 events a second: each consumer stops (as its server would on a
    // restart) a third of a second in, and the next takes the payload over.
    let lane = LaneConfig {
        claim_idle: Duration::from_millis(200),
        ..feeds_lane(100, None)
    };
    // The group made and the payload queued; its consumers come and go below.
    drop(consumer_with_payload(&b, &redis, lane.clone(), EVENTS, "restart").await);
    let mut applied = 0;
    for restart in 0..5 {
        let (next, stats) = consumer(
            &b,
            redis.connection().await,
            lane.clone(),
            &format!("feeds-r{restart}"),
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let run = tokio::spawn(ingest::run_consumer(next, async {
            let _ = stopped.await;
        }));
        tokio::time::sleep(Duration::from_millis(350)).await;
        let _ = stop.send(());
        run.await.unwrap();
        let now = stats.applied.load(Ordering::Relaxed);
        // Taken up again from its start: what the one before applied is skipped
        // by the events' guards (counted as duplicates).
        assert!(
            now + stats.duplicates.load(Ordering::Relaxed) > 0,
            "consumer {restart} took the payload up"
        );
        applied += now;
        assert_eq!(stats.dead.load(Ordering::Relaxed), 0, "restart {restart}");
        // Idle long enough for the next one to take it over.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        applied < EVENTS as u64,
        "the restarts came mid-payload: {applied}"
    );
    // The last one finishes it.
    let (mut last, stats) = consumer(&b, redis.connection().await, lane, "feeds-last");
    let mut conn = redis.connection().await;
    while ingest::status(&mut conn, Lane::Feeds)
        .await
        .unwrap()
        .pending
        > 0
    {
        last.process_once(Duration::from_millis(10)).await.unwrap();
    }
    assert_eq!(stats.dead.load(Ordering::Relaxed), 0);
    assert_eq!(ingest::dead_letter_count(&mut conn).await.unwrap(), 0);
    every_delta_applied_once(&b, EVENTS).await;
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn an_id_reused_after_the_ledger_recorded_it_is_dead_lettered(pg: PgPool) {
    let (redis, b) = setup(&pg, 3).await;
    let stats = Arc::new(LaneStats::default());
    let mut feeds = LaneConsumer::new(
        b.engine.clone(),
        redis.connection().await,
        feeds_lane(0, None),
        "feeds-1".into(),
        stats.clone(),
    )
    .with_ledger(pg.clone());
    let mut conn = redis.connection().await;
    let mut send = async |body: &str| {
        queue_payload(&mut conn, Lane::Feeds, "erp", body.as_bytes()).await;
    };
    send(r#"{"event_id":"x","type":"delta","sku":"CAT-0000","delta":5}"#).await;
    feeds.process_once(Duration::from_millis(10)).await.unwrap();
    holdfast_engine::testkit::drain_write_behind(&b, &redis.url()).await;
    // The ledger has `x` now. The same id for another event, beside a new one,
    // then the first event again.
    send(
        r#"{"events":[{"event_id":"x","type":"delta","sku":"CAT-0001","delta":50},
                       {"event_id":"y","type":"delta","sku":"CAT-0001","delta":5}]}"#,
    )
    .await;
    send(r#"{"event_id":"x","type":"delta","sku":"CAT-0000","delta":5}"#).await;
    for _ in 0..3 {
        feeds.process_once(Duration::from_millis(10)).await.unwrap();
    }
    let available = async |sku: &str| b.engine.figures(sku).await.unwrap().unwrap().available;
    assert_eq!(available("CAT-0000").await, 105, "applied once");
    assert_eq!(
        available("CAT-0001").await,
        105,
        "y applied, the reused x not"
    );
    let mut conn = redis.connection().await;
    let letters = ingest::dead_letters(&mut conn, 10).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert!(letters[0].reason.contains("used before"), "{letters:?}");
    assert!(letters[0].body.contains("CAT-0001"), "{letters:?}");
    assert_eq!(
        stats.duplicates.load(Ordering::Relaxed),
        1,
        "the resend of x"
    );
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn pausing_a_lane_stops_a_payload_part_way_and_it_resumes_whole(pg: PgPool) {
    const EVENTS: usize = 600;
    let (redis, b) = setup(&pg, EVENTS as i64).await;
    // About 100 events before each pause is noticed (within a second).
    let lane = feeds_lane(100, None);
    let mut conn = redis.connection().await;
    let (mut feeds, stats) = consumer_with_payload(&b, &redis, lane, EVENTS, "paused").await;
    // Paused part-way four times: more than the attempts a failing payload
    // gets before it is dead-lettered, none of them a failure.
    let mut applied = 0;
    for _ in 0..4 {
        ingest::resume(&mut conn, Lane::Feeds).await.unwrap();
        let pause_soon = {
            let mut conn = redis.connection().await;
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                ingest::pause(&mut conn, Lane::Feeds).await.unwrap();
            })
        };
        let done = feeds.process_once(Duration::from_millis(10)).await.unwrap();
        pause_soon.await.unwrap();
        assert!(
            (done.applied as usize) < EVENTS,
            "the pause stopped the payload part-way: {done:?}"
        );
        applied += done.applied;
        let status = ingest::status(&mut conn, Lane::Feeds).await.unwrap();
        assert_eq!(status.pending, 1, "the payload waits, not dead-lettered");
    }
    assert!(applied > 0);
    ingest::resume(&mut conn, Lane::Feeds).await.unwrap();
    while ingest::status(&mut conn, Lane::Feeds)
        .await
        .unwrap()
        .pending
        > 0
    {
        applied += feeds
            .process_once(Duration::from_millis(10))
            .await
            .unwrap()
            .applied;
    }
    assert_eq!(applied, EVENTS as u64, "every event applied once in all");
    every_delta_applied_once(&b, EVENTS).await;
    assert_eq!(stats.dead.load(Ordering::Relaxed), 0);
    assert_eq!(ingest::dead_letter_count(&mut conn).await.unwrap(), 0);
}
