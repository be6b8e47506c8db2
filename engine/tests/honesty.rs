//! Stock stays honest under faults: each test is a sequence that broke the
//! promise before (oversold units, lost sales, guards gone after a Redis loss),
//! run against a real redis-server and a real PostgreSQL.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use holdfast_engine::checkout;
use holdfast_engine::ingest::{self, Lane, LaneConfig, LaneConsumer, LaneStats};
use holdfast_engine::reconcile::{self, ReconcileOptions};
use holdfast_engine::record::{WriteBehind, WriteBehindConfig, WriteBehindStats};
use holdfast_engine::stock::{DeltaOutcome, SnapshotOutcome};
use holdfast_engine::testkit::{TestRedis, add_sku};
use holdfast_engine::warmup::{WarmOptions, warm_all};
use holdfast_engine::{
    Backends, ConfirmOutcome, Engine, ReleaseOutcome, ReserveOutcome, ReserveRequest, postgres,
};
use sqlx::PgPool;

async fn setup(pg: &PgPool, skus: &[(&str, i64)]) -> (TestRedis, Backends) {
    let redis = TestRedis::start();
    for (sku, on_hand) in skus {
        add_sku(pg, sku, *on_hand).await;
    }
    let backends = holdfast_engine::testkit::backends(pg.clone(), &redis.url()).await;
    warm_all(&backends.engine, pg, WarmOptions::default(), |_| {})
        .await
        .unwrap();
    (redis, backends)
}

fn writer(b: &Backends, conn: holdfast_engine::RedisConn) -> WriteBehind {
    WriteBehind::new(
        b.engine.clone(),
        b.pg.clone(),
        conn,
        WriteBehindConfig {
            consumer: "honesty".into(),
            block: Duration::from_millis(20),
            ..WriteBehindConfig::default()
        },
        Arc::new(WriteBehindStats::default()),
    )
}

/// Writes everything in the streams behind to PostgreSQL.
async fn drain(b: &Backends, w: &mut WriteBehind) {
    for _ in 0..200 {
        w.run_once().await.unwrap();
        if b.engine.write_behind_lag().await.unwrap().entries == 0 {
            return;
        }
    }
    panic!("the write-behind did not drain");
}

async fn reserve(engine: &Engine, rid: &str, sku: &str, qty: i64) {
    let r = engine
        .reserve(&ReserveRequest::single(rid, sku, qty).for_buyer("ann"))
        .await
        .unwrap();
    assert!(matches!(r, ReserveOutcome::Reserved { .. }), "{rid}: {r:?}");
}

/// Units `sku` has available now.
async fn available(b: &Backends, sku: &str) -> i64 {
    b.engine.figures(sku).await.unwrap().unwrap().available
}

/// A consumer of `lane` over the test's Redis.
async fn consumer_of(
    b: &Backends,
    redis: &TestRedis,
    lane: LaneConfig,
    name: String,
    stats: Arc<LaneStats>,
) -> LaneConsumer {
    LaneConsumer::new(
        b.engine.clone(),
        redis.connection().await,
        lane,
        name,
        stats,
    )
}

async fn on_hand(pg: &PgPool, sku: &str) -> i64 {
    sqlx::query_scalar("SELECT on_hand FROM skus WHERE sku = $1")
        .bind(sku)
        .fetch_one(pg)
        .await
        .unwrap()
}

async fn flush(redis: &TestRedis) {
    redis::cmd("FLUSHALL")
        .query_async::<()>(&mut redis.connection().await)
        .await
        .unwrap();
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_snapshot_under_open_holds_never_makes_units_that_do_not_exist_sellable(pg: PgPool) {
    let (redis, b) = setup(&pg, &[("OWE-1", 10)]).await;
    let mut w = writer(&b, redis.connection().await);
    reserve(&b.engine, "owe-hold", "OWE-1", 10).await;

    let applied = b
        .engine
        .apply_snapshot("OWE-1", 0, 1, "erp", "snap-1")
        .await
        .unwrap();
    assert_eq!(
        applied,
        SnapshotOutcome::Applied {
            available: 0,
            previous: 0,
            owed: 10
        }
    );
    drain(&b, &mut w).await;
    assert_eq!(
        on_hand(&pg, "OWE-1").await,
        0,
        "PostgreSQL follows the feed"
    );

    // The hold ends: its units pay the debt instead of becoming sellable.
    assert_eq!(
        b.engine.release("owe-hold").await.unwrap(),
        ReleaseOutcome::Released
    );
    let f = b.engine.figures("OWE-1").await.unwrap().unwrap();
    assert_eq!((f.available, f.reserved, f.owed), (0, 0, 0));
    let r = b
        .engine
        .reserve(&ReserveRequest::single("after", "OWE-1", 1))
        .await
        .unwrap();
    assert!(matches!(r, ReserveOutcome::SoldOut { .. }), "{r:?}");

    drain(&b, &mut w).await;
    let report = reconcile::reconcile_all(&b.engine, &pg, &ReconcileOptions::default(), |_| {})
        .await
        .unwrap();
    assert_eq!(report.drifted, 0, "no drift: {report:?}");
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_delta_below_what_is_held_is_recorded_whole_and_owed(pg: PgPool) {
    let (redis, b) = setup(&pg, &[("OWE-2", 10)]).await;
    let mut w = writer(&b, redis.connection().await);
    reserve(&b.engine, "d-hold", "OWE-2", 7).await;
    assert_eq!(
        b.engine
            .apply_delta("OWE-2", -7, "erp", "d-1")
            .await
            .unwrap(),
        DeltaOutcome::Applied {
            available: 0,
            owed: 4
        },
        "3 available units go, the 4 others are owed"
    );
    drain(&b, &mut w).await;
    assert_eq!(
        on_hand(&pg, "OWE-2").await,
        3,
        "the whole decrease is recorded"
    );
    // Expiry (the reaper's path) pays the debt too.
    b.engine.release("d-hold").await.unwrap();
    let f = b.engine.figures("OWE-2").await.unwrap().unwrap();
    assert_eq!(
        (f.available, f.owed),
        (3, 0),
        "3 real units are sellable again"
    );
    // A receipt pays any debt before adding stock.
    reserve(&b.engine, "d-hold-2", "OWE-2", 3).await;
    b.engine
        .apply_delta("OWE-2", -5, "erp", "d-2")
        .await
        .unwrap();
    assert_eq!(b.engine.figures("OWE-2").await.unwrap().unwrap().owed, 5);
    b.engine
        .apply_delta("OWE-2", 8, "erp", "d-3")
        .await
        .unwrap();
    let f = b.engine.figures("OWE-2").await.unwrap().unwrap();
    assert_eq!((f.available, f.owed), (3, 0));
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn confirming_an_owed_unit_is_an_oversell_support_sees(pg: PgPool) {
    let (redis, b) = setup(&pg, &[("OWE-3", 5)]).await;
    let mut w = writer(&b, redis.connection().await);
    reserve(&b.engine, "paid-late", "OWE-3", 2).await;
    b.engine
        .apply_snapshot("OWE-3", 1, 1, "erp", "s-1")
        .await
        .unwrap();
    assert_eq!(
        checkout::confirm_payment(&b, "paid-late", None)
            .await
            .unwrap()
            .0,
        ConfirmOutcome::Confirmed,
        "the shopper paid: the sale stands"
    );
    drain(&b, &mut w).await;
    let (kind, reason): (String, String) =
        sqlx::query_as("SELECT kind, reason FROM remediations WHERE reservation_id = 'paid-late'")
            .fetch_one(&pg)
            .await
            .unwrap();
    assert_eq!(kind, "oversold");
    assert!(reason.contains("1 unit(s) of OWE-3"), "{reason}");
    // The line itself says how many units were short (a drop's report sums them).
    let short: i64 = sqlx::query_scalar(
        "SELECT oversold_units FROM holds WHERE reservation_id = 'paid-late' AND sku = 'OWE-3'",
    )
    .fetch_one(&pg)
    .await
    .unwrap();
    assert_eq!(short, 1);
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn fencing_never_goes_backwards_after_redis_loses_its_data(pg: PgPool) {
    let (redis, b) = setup(&pg, &[("FEN-1", 10)]).await;
    let mut last = 0;
    for _ in 0..3 {
        last = reconcile::reconcile_all(&b.engine, &pg, &ReconcileOptions::default(), |_| {})
            .await
            .unwrap()
            .fence;
    }
    flush(&redis).await;
    warm_all(&b.engine, &pg, WarmOptions::default(), |_| {})
        .await
        .unwrap();
    let after = reconcile::reconcile_all(&b.engine, &pg, &ReconcileOptions::default(), |_| {})
        .await
        .expect("reconciliation works at once after the loss");
    assert!(after.fence > last, "{} > {last}", after.fence);
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn warm_up_restores_snapshot_versions_and_feed_guards(pg: PgPool) {
    let (redis, b) = setup(&pg, &[("GRD-1", 10)]).await;
    let mut w = writer(&b, redis.connection().await);
    b.engine
        .apply_snapshot("GRD-1", 50, 2, "erp", "snap-v2")
        .await
        .unwrap();
    b.engine
        .apply_delta("GRD-1", 5, "erp", "delta-1")
        .await
        .unwrap();
    drain(&b, &mut w).await;
    assert_eq!(on_hand(&pg, "GRD-1").await, 55);

    flush(&redis).await;
    let report = warm_all(&b.engine, &pg, WarmOptions::default(), |_| {})
        .await
        .unwrap();
    assert_eq!(report.warmed, 1);
    assert!(report.guards >= 2, "{report:?}");
    assert_eq!(
        b.engine
            .apply_snapshot("GRD-1", 10, 1, "erp", "snap-v1")
            .await
            .unwrap(),
        SnapshotOutcome::Stale { current_version: 2 },
        "a late, older snapshot stays refused"
    );
    assert_eq!(
        b.engine
            .apply_delta("GRD-1", 5, "erp", "delta-1")
            .await
            .unwrap(),
        DeltaOutcome::Duplicate,
        "a redelivered event applies once"
    );
    assert_eq!(available(&b, "GRD-1").await, 55);
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_paid_hold_whose_record_lapsed_is_still_paid_while_its_id_is_claimed(pg: PgPool) {
    let (redis, b) = setup(&pg, &[("LAPSE-1", 10)]).await;
    let mut w = writer(&b, redis.connection().await);
    reserve(&b.engine, "lapsed-hold", "LAPSE-1", 1).await;
    b.engine.confirm("lapsed-hold").await.unwrap();
    drain(&b, &mut w).await;
    // The paid hold's record lapses (its tombstone is shorter than the id's
    // claim, which outlives it by the longest hold).
    let ks = b.engine.keyspace();
    let record = ks.hold(ks.shard_of("LAPSE-1"), "lapsed-hold");
    let gone: i64 = redis::cmd("DEL")
        .arg(&record)
        .query_async(&mut redis.connection().await)
        .await
        .unwrap();
    assert_eq!(gone, 1, "{record}");
    assert!(b.engine.id_claimed("lapsed-hold").await.unwrap());
    assert_eq!(
        checkout::confirm_payment(&b, "lapsed-hold", None)
            .await
            .unwrap()
            .0,
        ConfirmOutcome::AlreadyConfirmed,
        "the order says it was paid: not 404"
    );
    let remediations: i64 = sqlx::query_scalar("SELECT count(*) FROM remediations")
        .fetch_one(&pg)
        .await
        .unwrap();
    assert_eq!(remediations, 0);
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_paid_confirm_for_a_hold_redis_lost_is_remediated_with_buyer_and_lines(pg: PgPool) {
    let (redis, b) = setup(&pg, &[("LOST-1", 10)]).await;
    let mut w = writer(&b, redis.connection().await);
    reserve(&b.engine, "lost-hold", "LOST-1", 2).await;
    reserve(&b.engine, "sold-hold", "LOST-1", 1).await;
    b.engine.confirm("sold-hold").await.unwrap();
    drain(&b, &mut w).await;

    flush(&redis).await;
    warm_all(&b.engine, &pg, WarmOptions::default(), |_| {})
        .await
        .unwrap();
    assert_eq!(
        checkout::confirm_payment(&b, "lost-hold", None)
            .await
            .unwrap()
            .0,
        ConfirmOutcome::Lost
    );
    let (kind, reason): (String, String) =
        sqlx::query_as("SELECT kind, reason FROM remediations WHERE reservation_id = 'lost-hold'")
            .fetch_one(&pg)
            .await
            .unwrap();
    assert_eq!(kind, "unknown_confirm");
    assert!(
        reason.contains("2 x LOST-1") && reason.contains("ann"),
        "{reason}"
    );
    assert_eq!(
        checkout::confirm_payment(&b, "sold-hold", None)
            .await
            .unwrap()
            .0,
        ConfirmOutcome::AlreadyConfirmed,
        "a recorded order stands"
    );
    assert_eq!(
        checkout::confirm_payment(&b, "never-made", None)
            .await
            .unwrap()
            .0,
        ConfirmOutcome::Unknown
    );
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn the_scripts_refuse_bad_numbers_before_writing_anything(pg: PgPool) {
    // A second SKU in LUA-1's shard: one script only ever sees one shard.
    let ks = holdfast_engine::keys::Keyspace::default();
    let twin = (2..)
        .map(|i| format!("LUA-{i}"))
        .find(|s| ks.shard_of(s) == ks.shard_of("LUA-1"))
        .unwrap();
    let (redis, b) = setup(&pg, &[("LUA-1", 10), (&twin, 10)]).await;
    let keys = b.engine.keyspace();
    let shard = keys.shard_of("LUA-1");
    let script = redis::Script::new(include_str!("../../lua/reserve.lua"));
    let mut conn = redis.connection().await;
    // A caller that skipped validation: qty 0, then a cart whose second line is
    // not a whole number. Neither may change any counter.
    for (rid, lines) in [
        ("bad-0", vec![("LUA-1", "0")]),
        ("bad-neg", vec![("LUA-1", "-3")]),
        ("bad-frac", vec![("LUA-1", "1"), (twin.as_str(), "1.5")]),
        ("bad-dup", vec![("LUA-1", "10"), ("LUA-1", "10")]),
    ] {
        let mut inv = script.prepare_invoke();
        inv.key(keys.hold(shard, rid))
            .key(keys.due(shard))
            .key(keys.events(shard));
        for (sku, _) in &lines {
            inv.key(keys.sku(sku))
                .key(keys.sku_holds(sku))
                .key(keys.buyer(sku, ""));
        }
        inv.arg(rid)
            .arg(60_000)
            .arg("")
            .arg("fp")
            .arg(60_000)
            .arg(0)
            .arg("");
        for (sku, qty) in &lines {
            inv.arg(*sku).arg(*qty);
        }
        let reply: Vec<redis::Value> = inv.invoke_async(&mut conn).await.unwrap();
        let tag: String = redis::from_redis_value_ref(&reply[0]).unwrap();
        assert_eq!(tag, "invalid", "{rid}");
    }
    for sku in ["LUA-1", twin.as_str()] {
        let f = b.engine.figures(sku).await.unwrap().unwrap();
        assert_eq!((f.available, f.reserved), (10, 0), "{sku} untouched");
    }
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_forced_warm_up_keeps_what_is_held(pg: PgPool) {
    let (_redis, b) = setup(&pg, &[("FRC-1", 10)]).await;
    reserve(&b.engine, "frc", "FRC-1", 3).await;
    warm_all(
        &b.engine,
        &pg,
        WarmOptions {
            force: true,
            ..WarmOptions::default()
        },
        |_| {},
    )
    .await
    .unwrap();
    let f = b.engine.figures("FRC-1").await.unwrap().unwrap();
    assert_eq!(
        (f.available, f.reserved),
        (7, 3),
        "computed from live figures in Lua"
    );
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn streams_are_trimmed_only_behind_the_write_behind(pg: PgPool) {
    let (redis, b) = setup(&pg, &[("TRM-1", 5_000)]).await;
    let mut w = writer(&b, redis.connection().await);
    w.ensure_groups().await.unwrap();
    // PostgreSQL "down": nothing is written behind while 3,000 sales pile up.
    for i in 0..1_500 {
        let rid = format!("trm-{i}");
        reserve(&b.engine, &rid, "TRM-1", 1).await;
        b.engine.confirm(&rid).await.unwrap();
    }
    let before = b.engine.stream_entries().await.unwrap();
    assert_eq!(
        b.engine.trim_acknowledged(Duration::ZERO).await.unwrap(),
        0,
        "nothing unacknowledged is trimmed"
    );
    assert_eq!(b.engine.stream_entries().await.unwrap(), before);

    drain(&b, &mut w).await;
    let trimmed = b.engine.trim_acknowledged(Duration::ZERO).await.unwrap();
    assert!(trimmed > 0, "acknowledged entries go");
    let sold: i64 = sqlx::query_scalar("SELECT sold_recorded FROM skus WHERE sku = 'TRM-1'")
        .fetch_one(&pg)
        .await
        .unwrap();
    assert_eq!(sold, 1_500, "every sale recorded exactly once");
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn an_entry_that_comes_back_empty_raises_an_alarm(pg: PgPool) {
    let (redis, b) = setup(&pg, &[("GONE-1", 10)]).await;
    let stats = Arc::new(WriteBehindStats::default());
    let mut w = WriteBehind::new(
        b.engine.clone(),
        pg.clone(),
        redis.connection().await,
        WriteBehindConfig {
            consumer: "gone".into(),
            block: Duration::from_millis(20),
            claim_idle: Duration::from_millis(1),
            ..WriteBehindConfig::default()
        },
        stats.clone(),
    );
    w.ensure_groups().await.unwrap();
    reserve(&b.engine, "gone-hold", "GONE-1", 1).await;
    // Deliver the entry to a consumer that dies, then lose the entry itself.
    let keys = b.engine.keyspace();
    let stream = keys.events(keys.shard_of("GONE-1"));
    let mut conn = redis.connection().await;
    let read: redis::streams::StreamReadReply = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(holdfast_engine::record::GROUP)
        .arg("dead-consumer")
        .arg("STREAMS")
        .arg(&stream)
        .arg(">")
        .query_async(&mut conn)
        .await
        .unwrap();
    let id = read.keys[0].ids.last().unwrap().id.clone();
    redis::cmd("XDEL")
        .arg(&stream)
        .arg(&id)
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    w.reclaim_once().await.unwrap();
    assert!(stats.lost_entries.load(Ordering::Relaxed) >= 1);
    assert!(stats.reconcile_requested.load(Ordering::Relaxed));
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn one_event_id_is_one_event_per_source(pg: PgPool) {
    let (redis, b) = setup(&pg, &[("DUP-1", 10), ("DUP-2", 10)]).await;
    let mut conn = redis.connection().await;
    let stats = Arc::new(LaneStats::default());
    let mut consumer = consumer_of(
        &b,
        &redis,
        LaneConfig::default_for(Lane::Feeds),
        "dup".into(),
        stats.clone(),
    )
    .await;
    for body in [
        r#"{"event_id":"e-1","type":"delta","sku":"DUP-1","delta":5}"#,
        r#"{"event_id":"e-1","type":"delta","sku":"DUP-2","delta":5}"#,
        r#"{"event_id":"e-1","type":"delta","sku":"DUP-1","delta":5}"#,
    ] {
        holdfast_engine::testkit::queue_payload(&mut conn, Lane::Feeds, "erp", body.as_bytes())
            .await;
    }
    for _ in 0..5 {
        consumer
            .process_once(Duration::from_millis(20))
            .await
            .unwrap();
    }
    assert_eq!(available(&b, "DUP-1").await, 15);
    assert_eq!(
        available(&b, "DUP-2").await,
        10,
        "the reused id for another SKU is not applied"
    );
    let letters = ingest::dead_letters(&mut conn, 10).await.unwrap();
    assert_eq!(letters.len(), 1);
    assert!(letters[0].reason.contains("used before"), "{letters:?}");
    assert_eq!(
        stats.duplicates.load(Ordering::Relaxed),
        1,
        "the redelivery is a duplicate"
    );
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn payloads_a_dead_consumer_left_are_taken_over(pg: PgPool) {
    let (redis, b) = setup(&pg, &[("DEAD-1", 10)]).await;
    let mut conn = redis.connection().await;
    let lane = LaneConfig {
        claim_idle: Duration::from_millis(50),
        ..LaneConfig::default_for(Lane::Feeds)
    };
    let mut dying = consumer_of(
        &b,
        &redis,
        lane.clone(),
        "feeds-4242-0".into(),
        Arc::default(),
    )
    .await;
    // Make the group, then let the "dying" consumer take a payload and never finish.
    dying.process_once(Duration::from_millis(10)).await.unwrap();
    holdfast_engine::testkit::queue_payload(
        &mut conn,
        Lane::Feeds,
        "erp",
        br#"{"event_id":"x-1","type":"delta","sku":"DEAD-1","delta":3}"#,
    )
    .await;
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(ingest::GROUP)
        .arg("feeds-4242-0")
        .arg("COUNT")
        .arg(1)
        .arg("STREAMS")
        .arg(ingest::lane_key(Lane::Feeds))
        .arg(">")
        .query_async(&mut conn)
        .await
        .unwrap();
    drop(dying);
    tokio::time::sleep(Duration::from_millis(80)).await;
    let mut heir = consumer_of(&b, &redis, lane, "feeds-4343-0".into(), Arc::default()).await;
    let done = heir.process_once(Duration::from_millis(10)).await.unwrap();
    assert_eq!(done.applied, 1, "the abandoned payload was applied");
    assert_eq!(available(&b, "DEAD-1").await, 13);
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn the_reaper_sets_a_malformed_hold_aside_and_goes_on(pg: PgPool) {
    let (redis, b) = setup(&pg, &[("REAP-1", 10)]).await;
    let engine = holdfast_engine::testkit::backends(pg.clone(), &redis.url())
        .await
        .engine;
    engine
        .reserve(&ReserveRequest::single("short", "REAP-1", 2).with_ttl_ms(1_000))
        .await
        .unwrap();
    let keys = b.engine.keyspace();
    let shard = keys.shard_of("REAP-1");
    let mut conn = redis.connection().await;
    redis::pipe()
        .cmd("HSET")
        .arg(keys.hold(shard, "broken"))
        .arg("state")
        .arg("held")
        .arg("lines")
        .arg("REAP-1=notanumber")
        .ignore()
        .cmd("ZADD")
        .arg(keys.due(shard))
        .arg(1)
        .arg("broken")
        .ignore()
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let report = engine.reap_once(100).await.unwrap();
    assert_eq!((report.released, report.skipped), (1, 1), "{report:?}");
    let aside: Vec<String> = redis::cmd("ZRANGE")
        .arg(keys.set_aside(shard))
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(aside, ["broken"]);
    assert_eq!(
        engine.reap_once(100).await.unwrap().skipped,
        0,
        "not tripped over again"
    );
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn feed_movements_in_flight_are_not_drift(pg: PgPool) {
    let (redis, b) = setup(&pg, &[("FLY-1", 20)]).await;
    let mut w = writer(&b, redis.connection().await);
    // Applied in Redis, not yet written behind: a damaged-stock delta and a receipt.
    b.engine
        .apply_delta("FLY-1", -5, "erp", "fly-1")
        .await
        .unwrap();
    b.engine
        .apply_delta("FLY-1", 8, "erp", "fly-2")
        .await
        .unwrap();
    let options = ReconcileOptions {
        correct_up: true,
        ..ReconcileOptions::default()
    };
    let report = reconcile::reconcile_all(&b.engine, &pg, &options, |_| {})
        .await
        .unwrap();
    assert_eq!(report.drifted, 0, "in flight, not drift: {report:?}");
    drain(&b, &mut w).await;
    assert_eq!(on_hand(&pg, "FLY-1").await, 23);
    let report = reconcile::reconcile_all(&b.engine, &pg, &options, |_| {})
        .await
        .unwrap();
    assert_eq!(report.drifted, 0, "{report:?}");
    assert_eq!(
        available(&b, "FLY-1").await,
        23,
        "nothing stranded or corrected"
    );
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_feed_event_redelivered_after_its_guard_lapsed_applies_once(pg: PgPool) {
    let (redis, b) = setup(&pg, &[("LATE-1", 10)]).await;
    let mut w = writer(&b, redis.connection().await);
    let mut conn = redis.connection().await;
    let mut consumer = consumer_of(
        &b,
        &redis,
        LaneConfig::default_for(Lane::Feeds),
        "ledger".into(),
        Arc::new(LaneStats::default()),
    )
    .await
    .with_ledger(pg.clone());
    let body = br#"{"event_id":"old-1","type":"delta","sku":"LATE-1","delta":5}"#;
    holdfast_engine::testkit::queue_payload(&mut conn, Lane::Feeds, "erp", body).await;
    consumer
        .process_once(Duration::from_millis(20))
        .await
        .unwrap();
    drain(&b, &mut w).await;
    // A day later the guard and the claim are gone; the supplier sends it again.
    let keys = b.engine.keyspace();
    redis::pipe()
        .cmd("DEL")
        .arg(keys.seen("LATE-1", "erp", "old-1"))
        .cmd("DEL")
        .arg(holdfast_engine::keys::Keyspace::feed_event("erp", "old-1"))
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    holdfast_engine::testkit::queue_payload(&mut conn, Lane::Feeds, "erp", body).await;
    consumer
        .process_once(Duration::from_millis(20))
        .await
        .unwrap();
    assert_eq!(
        available(&b, "LATE-1").await,
        15,
        "the ledger remembers what Redis forgot"
    );
    // A version in epoch microseconds is a valid snapshot version.
    let snap = br#"{"event_id":"us-1","type":"snapshot","sku":"LATE-1","on_hand":20,"version":1700000000000000}"#;
    holdfast_engine::testkit::queue_payload(&mut conn, Lane::Feeds, "erp", snap).await;
    consumer
        .process_once(Duration::from_millis(20))
        .await
        .unwrap();
    assert_eq!(available(&b, "LATE-1").await, 20);
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_late_payment_is_kept_in_the_stream_for_the_write_behind(pg: PgPool) {
    let (redis, b) = setup(&pg, &[("LP-1", 10)]).await;
    let mut w = writer(&b, redis.connection().await);
    reserve(&b.engine, "lp", "LP-1", 1).await;
    b.engine.release("lp").await.unwrap();
    sqlx::query("DELETE FROM remediations")
        .execute(&pg)
        .await
        .unwrap();
    // Recorded directly; remove that row to see the stream's copy do it too.
    assert!(matches!(
        checkout::confirm_payment(&b, "lp", None).await.unwrap().0,
        ConfirmOutcome::Expired { .. }
    ));
    sqlx::query("DELETE FROM remediations")
        .execute(&pg)
        .await
        .unwrap();
    drain(&b, &mut w).await;
    let kind: String =
        sqlx::query_scalar("SELECT kind FROM remediations WHERE reservation_id = 'lp'")
            .fetch_one(&pg)
            .await
            .unwrap();
    assert_eq!(kind, "late_payment");
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_confirm_for_an_id_whose_owner_never_held_is_unknown_not_lost(pg: PgPool) {
    let (redis, b) = setup(&pg, &[("OWN-1", 0), ("OWN-2", 10)]).await;
    let ks = b.engine.keyspace();
    // Two SKUs in different shards (or the test proves nothing).
    assert_ne!(ks.shard_of("OWN-1"), ks.shard_of("OWN-2"));
    let mut w = writer(&b, redis.connection().await);
    // The id's owner was refused (sold out) ...
    let refused = b
        .engine
        .reserve(&ReserveRequest::single("own-1", "OWN-1", 1))
        .await
        .unwrap();
    assert!(
        matches!(refused, ReserveOutcome::SoldOut { .. }),
        "{refused:?}"
    );
    // ... and another request under it held, saw the owner's claim and undid
    // its hold, which the write-behind still records as a hold made.
    let other = b
        .engine
        .reserve(&ReserveRequest::single("own-1", "OWN-2", 1))
        .await
        .unwrap();
    assert!(
        matches!(other, ReserveOutcome::Conflict { .. }),
        "{other:?}"
    );
    drain(&b, &mut w).await;
    let recorded: i64 =
        sqlx::query_scalar("SELECT count(*) FROM holds WHERE reservation_id = 'own-1'")
            .fetch_one(&pg)
            .await
            .unwrap();
    assert_eq!(recorded, 1, "the undone hold is in the system of record");
    assert_eq!(
        checkout::confirm_payment(&b, "own-1", None)
            .await
            .unwrap()
            .0,
        ConfirmOutcome::Unknown,
        "Redis lost nothing: no remediation"
    );
    let remediations: i64 = sqlx::query_scalar("SELECT count(*) FROM remediations")
        .fetch_one(&pg)
        .await
        .unwrap();
    assert_eq!(remediations, 0);
}

/// Every entry of every shard's stream, with its fields.
async fn entries(b: &Backends, redis: &TestRedis) -> Vec<(String, Vec<(String, String)>)> {
    let mut conn = redis.connection().await;
    let mut all = Vec::new();
    for key in b.engine.keyspace().all_events() {
        let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(&key)
            .arg("-")
            .arg("+")
            .query_async(&mut conn)
            .await
            .unwrap();
        for id in reply.ids {
            let fields = id
                .map
                .iter()
                .map(|(k, v)| (k.clone(), redis::from_redis_value_ref::<String>(v).unwrap()))
                .collect();
            all.push((key.clone(), fields));
        }
    }
    all
}

/// Redis loses its data while the write-behind carries a sale and a feed
/// movement to PostgreSQL; warm-up rebuilds the counter from rows that do not
/// have them yet, and then they are recorded. Before, the counter kept the sold
/// units and the units the feed took away (and reconciliation counted the gap
/// as in flight, so nothing saw it); now the write-behind applies them to the
/// rebuilt counter as it records them, once, even when the feed event was
/// redelivered to the new counter first.
#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn movements_recorded_after_redis_lost_their_counter_are_applied_to_the_new_one(pg: PgPool) {
    let (redis, b) = setup(&pg, &[("INF-1", 10), ("INF-2", 10), ("INF-3", 10)]).await;
    let mut w = writer(&b, redis.connection().await);
    drain(&b, &mut w).await;
    // INF-1: 3 sold, 2 taken by a feed. INF-2: 4 sold, and a feed's -1 that is
    // redelivered to the rebuilt counter before the write-behind records it.
    for (rid, sku, sold, delta, event) in [
        ("inf-a", "INF-1", 3, -2, "inf-d1"),
        ("inf-b", "INF-2", 4, -1, "inf-d2"),
    ] {
        reserve(&b.engine, rid, sku, sold).await;
        assert_eq!(
            b.engine.confirm(rid).await.unwrap(),
            ConfirmOutcome::Confirmed
        );
        b.engine
            .apply_delta(sku, delta, "erp", event)
            .await
            .unwrap();
    }
    // INF-3: a supplier count (version 7) says 4.
    b.engine
        .apply_snapshot("INF-3", 4, 7, "erp", "inf-s7")
        .await
        .unwrap();
    let carried = entries(&b, &redis).await;

    // The loss, and a warm-up from PostgreSQL, which has none of it yet.
    flush(&redis).await;
    warm_all(&b.engine, &pg, WarmOptions::default(), |_| {})
        .await
        .unwrap();
    assert_eq!(
        (available(&b, "INF-1").await, available(&b, "INF-2").await),
        (10, 10)
    );

    // The write-behind records what it carried (as it would, having read it
    // before the loss), after the feed redelivered INF-2's event to the new
    // counter.
    let mut conn = redis.connection().await;
    for (key, fields) in &carried {
        let mut add = redis::cmd("XADD");
        add.arg(key).arg("*");
        for (k, v) in fields {
            add.arg(k).arg(v);
        }
        add.query_async::<()>(&mut conn).await.unwrap();
    }
    assert_eq!(
        b.engine
            .apply_delta("INF-2", -1, "erp", "inf-d2")
            .await
            .unwrap(),
        DeltaOutcome::Applied {
            available: 9,
            owed: 0
        },
        "the feed redelivers its event to the new counter"
    );
    w.ensure_groups().await.unwrap();
    drain(&b, &mut w).await;

    assert_eq!(on_hand(&pg, "INF-1").await, 5);
    assert_eq!(on_hand(&pg, "INF-2").await, 5);
    assert_eq!(available(&b, "INF-1").await, 5, "3 sold and 2 taken away");
    assert_eq!(
        available(&b, "INF-2").await,
        5,
        "4 sold, the feed's -1 once"
    );
    // Nothing drifts, and nothing is hidden as in flight.
    let report = reconcile::reconcile_all(&b.engine, &pg, &ReconcileOptions::default(), |_| {})
        .await
        .unwrap();
    assert_eq!(report.drifted, 0, "{report:?}");
    assert_eq!(
        (on_hand(&pg, "INF-3").await, available(&b, "INF-3").await),
        (4, 4)
    );
    assert_eq!(
        b.engine
            .apply_snapshot("INF-3", 40, 6, "erp", "inf-s6")
            .await
            .unwrap(),
        SnapshotOutcome::Stale { current_version: 7 },
        "an older count stays refused"
    );
    for sku in ["INF-1", "INF-2", "INF-3"] {
        let f = b.engine.figures(sku).await.unwrap().unwrap();
        assert_eq!((f.reserved, f.sold_pending), (0, 0), "{sku}: {f:?}");
    }
    let counters: Vec<(i64, i64)> = {
        let mut pipe = redis::pipe();
        for sku in ["INF-1", "INF-2", "INF-3"] {
            pipe.cmd("HMGET")
                .arg(b.engine.keyspace().sku(sku))
                .arg(&["settled", "fed"]);
        }
        pipe.query_async(&mut conn).await.unwrap()
    };
    let recorded: Vec<(i64, i64)> =
        sqlx::query_as("SELECT sold_recorded, fed_recorded FROM skus ORDER BY sku")
            .fetch_all(&pg)
            .await
            .unwrap();
    assert_eq!(
        counters, recorded,
        "the counters count what PostgreSQL recorded"
    );
    // The feed's event stays applied once.
    assert_eq!(
        b.engine
            .apply_delta("INF-1", -2, "erp", "inf-d1")
            .await
            .unwrap(),
        DeltaOutcome::Duplicate
    );
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_loss_of_redis_data_is_noticed_and_the_counters_warmed_again(pg: PgPool) {
    use holdfast_engine::warmup::rewarm_after_loss;
    let (redis, b) = setup(&pg, &[("MRK-1", 7), ("MRK-2", 3)]).await;
    let (mut one, mut two) = (None, None);
    for seen in [&mut one, &mut two] {
        assert_eq!(
            rewarm_after_loss(&b.engine, &pg, seen).await.unwrap(),
            None,
            "a first look only sets the mark"
        );
        assert!(seen.is_some());
    }
    assert_eq!(
        rewarm_after_loss(&b.engine, &pg, &mut one).await.unwrap(),
        None
    );

    flush(&redis).await;
    let report = rewarm_after_loss(&b.engine, &pg, &mut one)
        .await
        .unwrap()
        .expect("the loss is noticed");
    assert_eq!(report.warmed, 2, "{report:?}");
    assert_eq!(
        (available(&b, "MRK-1").await, available(&b, "MRK-2").await),
        (7, 3)
    );
    // Another server that looked before the loss finds a new mark: it warms
    // too (nothing is missing now), then both agree.
    let again = rewarm_after_loss(&b.engine, &pg, &mut two).await.unwrap();
    assert_eq!(again.map(|r| r.warmed), Some(0));
    assert_eq!(one, two);
    assert_eq!(
        rewarm_after_loss(&b.engine, &pg, &mut one).await.unwrap(),
        None
    );

    // Lost again, and a server starting now sets a new mark on its first look
    // (it cannot tell): the one that ran before still warms.
    flush(&redis).await;
    let mut newcomer = None;
    assert_eq!(
        rewarm_after_loss(&b.engine, &pg, &mut newcomer)
            .await
            .unwrap(),
        None
    );
    assert!(newcomer.is_some() && newcomer != one);
    let report = rewarm_after_loss(&b.engine, &pg, &mut one).await.unwrap();
    assert_eq!(report.map(|r| r.warmed), Some(2));
    assert_eq!(available(&b, "MRK-2").await, 3);
}
