//! The system of record: write-behind exactly once through crashes and outages,
//! warm-up after a Redis loss, fencing, and reconciliation.

use std::sync::Arc;
use std::time::Duration;

use holdfast_engine::reconcile::{self, ReconcileOptions};
use holdfast_engine::record::{
    Fault, WriteBehind, WriteBehindConfig, WriteBehindStats, run_write_behind,
};
use holdfast_engine::testkit::{TestPostgres, TestRedis, add_sku};
use holdfast_engine::warmup::{WarmOptions, warm_all, warm_list};
use holdfast_engine::{Engine, EngineError, ReserveOutcome, ReserveRequest, postgres};
use sqlx::PgPool;

async fn sell(engine: &Engine, prefix: &str, sku: &str, n: usize) {
    for i in 0..n {
        let rid = format!("{prefix}-{i}");
        let r = engine
            .reserve(&ReserveRequest::single(&rid, sku, 1))
            .await
            .unwrap();
        assert!(matches!(r, ReserveOutcome::Reserved { .. }), "{rid}: {r:?}");
        assert_eq!(
            engine.confirm(&rid).await.unwrap(),
            holdfast_engine::ConfirmOutcome::Confirmed
        );
    }
}

fn worker(
    engine: &Engine,
    pg: &PgPool,
    conn: holdfast_engine::RedisConn,
    config: WriteBehindConfig,
) -> WriteBehind {
    counted(engine, pg, conn, config).0
}

/// A worker and the stats it keeps.
fn counted(
    engine: &Engine,
    pg: &PgPool,
    conn: holdfast_engine::RedisConn,
    config: WriteBehindConfig,
) -> (WriteBehind, Arc<WriteBehindStats>) {
    let stats = Arc::new(WriteBehindStats::default());
    let w = WriteBehind::new(engine.clone(), pg.clone(), conn, config, stats.clone());
    (w, stats)
}

/// Runs `w` (as `serve` does) until `stop` turns true.
fn until_stopped(
    w: WriteBehind,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let mut stop = stop.clone();
    tokio::spawn(run_write_behind(w, async move {
        let _ = stop.wait_for(|s| *s).await;
    }))
}

fn config(name: &str) -> WriteBehindConfig {
    WriteBehindConfig {
        consumer: name.into(),
        block: Duration::from_millis(20),
        ..WriteBehindConfig::default()
    }
}

async fn counts(pg: &PgPool, sku: &str) -> (i64, i64, i64, i64) {
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM order_lines WHERE sku = $1")
        .bind(sku)
        .fetch_one(pg)
        .await
        .unwrap();
    let sales: i64 =
        sqlx::query_scalar("SELECT count(*) FROM ledger WHERE sku = $1 AND kind = 'sale'")
            .bind(sku)
            .fetch_one(pg)
            .await
            .unwrap();
    let (on_hand, sold): (i64, i64) =
        sqlx::query_as("SELECT on_hand, sold_recorded FROM skus WHERE sku = $1")
            .bind(sku)
            .fetch_one(pg)
            .await
            .unwrap();
    (orders, sales, on_hand, sold)
}

/// A consumer that fails right after its PostgreSQL commit, as a crash there would.
fn dies_after_commit(name: &str) -> WriteBehindConfig {
    WriteBehindConfig {
        fault: Some(Fault::AfterCommit),
        ..config(name)
    }
}

/// A consumer that takes over entries pending for a millisecond.
fn takes_over(name: &str) -> WriteBehindConfig {
    WriteBehindConfig {
        claim_idle: Duration::from_millis(1),
        ..config(name)
    }
}

/// Drains the write-behind with `w` until the group has nothing left.
async fn drain(engine: &Engine, w: &mut WriteBehind) {
    w.ensure_groups().await.unwrap();
    for _ in 0..200 {
        w.run_once().await.unwrap();
        if engine.write_behind_lag().await.unwrap().entries == 0 {
            return;
        }
    }
    panic!("write-behind did not drain");
}

/// Adds each `(sku, on_hand)` to PostgreSQL and warms every counter from it.
async fn stocked(engine: &Engine, pg: &PgPool, skus: &[(&str, i64)]) {
    for (sku, on_hand) in skus {
        add_sku(pg, sku, *on_hand).await;
    }
    warm_all(engine, pg, WarmOptions::default(), |_| {})
        .await
        .unwrap();
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_consumer_dying_after_commit_changes_nothing_twice(pg: PgPool) {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    stocked(&engine, &pg, &[("WB-1", 100)]).await;
    sell(&engine, "o", "WB-1", 20).await;
    assert_eq!(
        engine.figures("WB-1").await.unwrap().unwrap().sold_pending,
        20
    );

    // A commits, then dies before settling.
    let mut a = worker(
        &engine,
        &pg,
        redis.connection().await,
        dies_after_commit("a"),
    );
    a.ensure_groups().await.unwrap();
    assert!(a.run_once().await.is_err(), "a fails after its commit");
    assert_eq!(
        counts(&pg, "WB-1").await,
        (20, 20, 80, 20),
        "committed once"
    );
    let lag = engine.write_behind_lag().await.unwrap();
    assert_eq!(
        lag.entries, 41,
        "the warm-up, 20 reservations and 20 confirmations wait unacknowledged: {lag:?}"
    );

    // B takes A's entries over, commits again (a no-op) and settles, then dies before acknowledging.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let mut b = worker(
        &engine,
        &pg,
        redis.connection().await,
        WriteBehindConfig {
            fault: Some(Fault::BeforeAck),
            claim_idle: Duration::from_millis(1),
            ..config("b")
        },
    );
    assert!(
        b.reclaim_once().await.is_err(),
        "b fails before acknowledging"
    );
    assert_eq!(
        counts(&pg, "WB-1").await,
        (20, 20, 80, 20),
        "still committed once"
    );
    assert_eq!(
        engine.figures("WB-1").await.unwrap().unwrap().sold_pending,
        0,
        "settled by b"
    );

    // C takes over what they left pending.
    let mut c = worker(&engine, &pg, redis.connection().await, takes_over("c"));
    tokio::time::sleep(Duration::from_millis(5)).await;
    c.reclaim_once().await.unwrap();
    drain(&engine, &mut c).await;
    assert_eq!(
        counts(&pg, "WB-1").await,
        (20, 20, 80, 20),
        "still exactly once"
    );
    let f = engine.figures("WB-1").await.unwrap().unwrap();
    assert_eq!(
        (f.available, f.reserved, f.sold_pending),
        (80, 0, 0),
        "settled once"
    );
}

/// The counter's own `settled` (sales it knows PostgreSQL has recorded).
async fn settled(redis: &TestRedis, engine: &Engine, sku: &str) -> i64 {
    redis::cmd("HGET")
        .arg(engine.keyspace().sku(sku))
        .arg("settled")
        .query_async::<Option<i64>>(&mut redis.connection().await)
        .await
        .unwrap()
        .unwrap_or_default()
}

/// A counter rebuilt while its holds stay (a master back with old data, whose
/// counters the failover check builds again from PostgreSQL) already counts
/// each earlier sale: the one recorded before the rebuild in its `settled`,
/// the one recorded after by the late apply. Settling those sales afterwards,
/// on holds that never saw their settle, must move nothing again, or the
/// counter's `settled` runs ahead of PostgreSQL's `sold_recorded`.
#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn sales_from_before_a_rebuilt_counter_are_settled_once(pg: PgPool) {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    stocked(&engine, &pg, &[("RB-1", 50)]).await;
    let rebuild = || async {
        redis::cmd("DEL")
            .arg(engine.keyspace().sku("RB-1"))
            .query_async::<()>(&mut redis.connection().await)
            .await
            .unwrap();
        warm_list(&engine, &pg, &["RB-1".to_owned()]).await.unwrap();
    };

    // Recorded before the rebuild, settled after it (the write-behind died
    // between its commit and the settle).
    sell(&engine, "early", "RB-1", 3).await;
    let mut dying = worker(
        &engine,
        &pg,
        redis.connection().await,
        dies_after_commit("dying"),
    );
    dying.ensure_groups().await.unwrap();
    assert!(dying.run_once().await.is_err(), "dies after its commit");
    assert_eq!(counts(&pg, "RB-1").await, (3, 3, 47, 3));
    rebuild().await;
    assert_eq!(settled(&redis, &engine, "RB-1").await, 3, "from PostgreSQL");
    let mut w = worker(&engine, &pg, redis.connection().await, takes_over("next"));
    tokio::time::sleep(Duration::from_millis(5)).await;
    w.reclaim_once().await.unwrap();
    drain(&engine, &mut w).await;
    assert_eq!(counts(&pg, "RB-1").await, (3, 3, 47, 3));
    assert_eq!(settled(&redis, &engine, "RB-1").await, 3, "settled once");

    // Sold before the rebuild, recorded after it.
    sell(&engine, "late", "RB-1", 2).await;
    rebuild().await;
    drain(&engine, &mut w).await;
    assert_eq!(counts(&pg, "RB-1").await, (5, 5, 45, 5));
    assert_eq!(settled(&redis, &engine, "RB-1").await, 5, "settled once");
    let f = engine.figures("RB-1").await.unwrap().unwrap();
    assert_eq!((f.available, f.reserved, f.sold_pending), (45, 0, 0));
    let report = holdfast_engine::verify::verify(&engine, &pg, &Default::default())
        .await
        .unwrap();
    assert!(report.passed(), "{:?}", report.checks);
}

/// Servers share a shard's events, so a hold's end can be recorded before the
/// hold: here one consumer takes the holds and stalls, another records their
/// payments and releases first. Every hold still ends up recorded once, with
/// its buyer, its own creation time and how it ended.
#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_hold_ended_before_it_is_recorded_is_recorded_with_its_end(pg: PgPool) {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    stocked(&engine, &pg, &[("OO-1", 50)]).await;
    let mut w = worker(&engine, &pg, redis.connection().await, config("first"));
    drain(&engine, &mut w).await;
    for i in 0..4 {
        let r = engine
            .reserve(&ReserveRequest::single(format!("oo-{i}"), "OO-1", 1).for_buyer("ann"))
            .await
            .unwrap();
        assert!(matches!(r, ReserveOutcome::Reserved { .. }), "{r:?}");
    }
    // A stalled consumer takes the four hold events and records nothing.
    let stream = engine.keyspace().events(engine.keyspace().shard_of("OO-1"));
    let taken: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(holdfast_engine::record::GROUP)
        .arg("stalled")
        .arg("COUNT")
        .arg(4)
        .arg("STREAMS")
        .arg(&stream)
        .arg(">")
        .query_async(&mut redis.connection().await)
        .await
        .unwrap();
    assert!(!matches!(taken, redis::Value::Nil), "the holds were taken");
    for i in 0..3 {
        engine.confirm(&format!("oo-{i}")).await.unwrap();
    }
    engine.release("oo-3").await.unwrap();
    // The ends are recorded first...
    w.run_once().await.unwrap();
    // ...then the holds, taken over from the stalled consumer.
    let mut next = worker(&engine, &pg, redis.connection().await, takes_over("next"));
    tokio::time::sleep(Duration::from_millis(5)).await;
    next.reclaim_once().await.unwrap();
    drain(&engine, &mut next).await;

    type HoldRow = (String, i64, Option<String>, Option<String>, bool);
    // Times are Redis' milliseconds: a hold paid within its own millisecond
    // ends at the moment it was made.
    let rows: Vec<HoldRow> = sqlx::query_as(
        "SELECT reservation_id, qty, buyer, end_state, created_at <= ended_at
           FROM holds WHERE sku = 'OO-1' ORDER BY reservation_id",
    )
    .fetch_all(&pg)
    .await
    .unwrap();
    let ann = Some("ann".to_owned());
    let ended = |state: &str| Some(state.to_owned());
    assert_eq!(
        rows,
        [
            ("oo-0".into(), 1, ann.clone(), ended("confirmed"), true),
            ("oo-1".into(), 1, ann.clone(), ended("confirmed"), true),
            ("oo-2".into(), 1, ann.clone(), ended("confirmed"), true),
            ("oo-3".into(), 1, ann.clone(), ended("released"), true),
        ]
    );
    assert_eq!(counts(&pg, "OO-1").await, (3, 3, 47, 3));
}

/// Holds made and ended before the write-behind reads them are recorded in
/// the batch that records their ends: each row with how it ended, the open
/// hold open; a batch recorded again after a crash changes none of them.
#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn holds_ended_in_the_batch_that_records_them_are_recorded_ended(pg: PgPool) {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    stocked(&engine, &pg, &[("IB-1", 50)]).await;
    for rid in ["ib-paid", "ib-released", "ib-open"] {
        let r = engine
            .reserve(&ReserveRequest::single(rid, "IB-1", 2).for_buyer("bea"))
            .await
            .unwrap();
        assert!(matches!(r, ReserveOutcome::Reserved { .. }), "{r:?}");
    }
    engine.confirm("ib-paid").await.unwrap();
    engine.release("ib-released").await.unwrap();

    type HoldRow = (String, i64, Option<String>, Option<String>, bool);
    let rows = || async {
        sqlx::query_as::<_, HoldRow>(
            "SELECT reservation_id, qty, buyer, end_state, coalesce(created_at <= ended_at, false)
               FROM holds WHERE sku = 'IB-1' ORDER BY reservation_id",
        )
        .fetch_all(&pg)
        .await
        .unwrap()
    };
    // Every event in one batch, committed, then the consumer dies.
    let mut a = worker(
        &engine,
        &pg,
        redis.connection().await,
        dies_after_commit("a"),
    );
    a.ensure_groups().await.unwrap();
    assert!(a.run_once().await.is_err(), "a fails after its commit");
    let bea = Some("bea".to_owned());
    let expected: Vec<HoldRow> = vec![
        ("ib-open".into(), 2, bea.clone(), None, false),
        (
            "ib-paid".into(),
            2,
            bea.clone(),
            Some("confirmed".into()),
            true,
        ),
        (
            "ib-released".into(),
            2,
            bea.clone(),
            Some("released".into()),
            true,
        ),
    ];
    let mut got = rows().await;
    assert_eq!(got, expected);

    // Another consumer records the same batch again: nothing changes.
    let mut b = worker(&engine, &pg, redis.connection().await, takes_over("b"));
    tokio::time::sleep(Duration::from_millis(5)).await;
    b.reclaim_once().await.unwrap();
    drain(&engine, &mut b).await;
    got = rows().await;
    assert_eq!(got, expected);
    assert_eq!(counts(&pg, "IB-1").await, (1, 1, 48, 2));
}

/// Two SKUs in two different shards, named `prefix-i`.
fn two_shards(engine: &Engine, prefix: &str) -> (String, String) {
    let ks = engine.keyspace();
    let first = format!("{prefix}-0");
    let other = (1..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|s| ks.shard_of(s) != ks.shard_of(&first))
        .unwrap();
    (first, other)
}

/// A cart `rid` of one unit of each of `skus`.
fn cart_of(rid: &str, skus: &[&str]) -> ReserveRequest {
    ReserveRequest {
        reservation_id: rid.into(),
        lines: skus
            .iter()
            .map(|s| holdfast_engine::Line {
                sku: (*s).into(),
                qty: 1,
            })
            .collect(),
        buyer: None,
        ttl_ms: Some(60_000),
    }
}

/// How `rid`'s line of `sku` is recorded: its end state, and whether it is open.
async fn hold_row(pg: &PgPool, rid: &str, sku: &str) -> (Option<String>, bool) {
    sqlx::query_as(
        "SELECT end_state, ended_at IS NULL FROM holds WHERE reservation_id = $1 AND sku = $2",
    )
    .bind(rid)
    .bind(sku)
    .fetch_one(pg)
    .await
    .unwrap()
}

/// The stage of a cart undone and made again: SKU `a` (5 units) warmed and
/// `b` (1 unit) only in the catalogue, in two shards named after `prefix`,
/// and a write-behind worker that has recorded the warm-up.
async fn cart_stage(
    redis: &TestRedis,
    engine: &Engine,
    pg: &PgPool,
    prefix: &str,
) -> (String, String, WriteBehind) {
    let (a, b) = two_shards(engine, prefix);
    stocked(engine, pg, &[(a.as_str(), 5)]).await;
    add_sku(pg, &b, 1).await;
    let mut w = worker(engine, pg, redis.connection().await, config("warm"));
    drain(engine, &mut w).await;
    (a, b, w)
}

/// Holds cart `rid` over `a` and `b` (one unit each) after undoing it once:
/// `b` is in the catalogue but not warmed yet, so the first attempt holds `a`,
/// finds `b`'s counter missing and undoes `a` (a hold and a release of `rid`'s
/// line of `a`; "not warmed" is never remembered, so the id is free again);
/// `between` runs then; `b` is warmed and the same request made again holds
/// both.
async fn cart_undone_and_made_again<F: Future<Output = ()>>(
    engine: &Engine,
    pg: &PgPool,
    rid: &str,
    a: &str,
    b: &str,
    between: F,
) {
    let r = engine.reserve(&cart_of(rid, &[a, b])).await.unwrap();
    assert!(
        matches!(&r, ReserveOutcome::NotWarmed { sku } if sku == b),
        "{r:?}"
    );
    between.await;
    warm_list(engine, pg, &[b.to_owned()]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let r = engine.reserve(&cart_of(rid, &[a, b])).await.unwrap();
    assert!(matches!(r, ReserveOutcome::Reserved { .. }), "{r:?}");
}

/// Attack on the fold: a cart undone and made again (a hold, its release, the
/// hold again under the same id) whose first hold is recorded in one batch and
/// whose release and second hold in the next. One by one, the release ends
/// the first hold and the second hold opens the row again; the batch must
/// leave the line open, and its payment must record it confirmed.
#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_release_recorded_with_the_hold_made_again_after_it_leaves_that_hold_open(pg: PgPool) {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let (a, b, mut w) = cart_stage(&redis, &engine, &pg, "RA").await;
    // One entry per shard per batch: the first hold alone, without its release.
    let mut one = worker(
        &engine,
        &pg,
        redis.connection().await,
        WriteBehindConfig {
            batch_max: 1,
            ..config("one")
        },
    );
    cart_undone_and_made_again(&engine, &pg, "ra-1", &a, &b, async {
        one.run_once().await.unwrap();
    })
    .await;
    assert_eq!(
        hold_row(&pg, "ra-1", &a).await,
        (None, true),
        "the first hold, recorded"
    );
    // The release and the hold made again after it, in one batch.
    drain(&engine, &mut w).await;
    assert_eq!(
        hold_row(&pg, "ra-1", &a).await,
        (None, true),
        "held again after its release: open"
    );
    assert_eq!(
        engine.confirm("ra-1").await.unwrap(),
        holdfast_engine::ConfirmOutcome::Confirmed
    );
    drain(&engine, &mut w).await;
    assert_eq!(counts(&pg, &a).await.1, 1, "the sale is in the ledger");
    assert_eq!(
        hold_row(&pg, "ra-1", &a).await,
        (Some("confirmed".into()), false),
        "paid: recorded confirmed"
    );
}

/// Attack on the fold after a crash: a batch holding a cart's line and
/// releasing it (the cart undone) is committed and its consumer dies; the
/// hold made again under the id is recorded by another consumer; then the
/// dead consumer's batch is taken over and recorded again. Recording it again
/// must change nothing: the line stays open.
#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_batch_recorded_again_does_not_end_the_hold_made_again_since(pg: PgPool) {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let (a, b, mut w) = cart_stage(&redis, &engine, &pg, "RB").await;
    let mut dies = worker(
        &engine,
        &pg,
        redis.connection().await,
        dies_after_commit("dies"),
    );
    dies.ensure_groups().await.unwrap();
    cart_undone_and_made_again(&engine, &pg, "rb-1", &a, &b, async {
        assert!(dies.run_once().await.is_err(), "fails after its commit");
    })
    .await;
    assert_eq!(
        hold_row(&pg, "rb-1", &a).await,
        (Some("released".into()), false),
        "the undone hold, recorded released"
    );
    // Another consumer records the hold made again: the row is open again.
    w.run_once().await.unwrap();
    assert_eq!(
        hold_row(&pg, "rb-1", &a).await,
        (None, true),
        "held again: open"
    );
    // The dead consumer's batch, taken over and recorded again.
    let mut next = worker(&engine, &pg, redis.connection().await, takes_over("next"));
    tokio::time::sleep(Duration::from_millis(5)).await;
    next.reclaim_once().await.unwrap();
    assert_eq!(
        hold_row(&pg, "rb-1", &a).await,
        (None, true),
        "recording the old batch again leaves the hold made since open"
    );
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn two_consumers_record_each_sale_once(pg: PgPool) {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    stocked(&engine, &pg, &[("WB-2", 500)]).await;
    let seller = {
        let engine = engine.clone();
        tokio::spawn(async move { sell(&engine, "two", "WB-2", 150).await })
    };
    let (tx, rx) = tokio::sync::watch::channel(false);
    let mut workers = Vec::new();
    for name in ["x", "y"] {
        let w = worker(&engine, &pg, redis.connection().await, config(name));
        workers.push(until_stopped(w, &rx));
    }
    seller.await.unwrap();
    for _ in 0..100 {
        if engine.write_behind_lag().await.unwrap().entries == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tx.send(true).unwrap();
    for w in workers {
        w.await.unwrap();
    }
    assert_eq!(counts(&pg, "WB-2").await, (150, 150, 350, 150));
    assert_eq!(
        engine.figures("WB-2").await.unwrap().unwrap().sold_pending,
        0
    );
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn parts_share_the_shards_and_a_dead_part_is_taken_over(pg: PgPool) {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let skus = holdfast_engine::testkit::skus_in_distinct_shards(&engine, "PT", 12);
    for sku in &skus {
        add_sku(&pg, sku, 50).await;
    }
    warm_all(&engine, &pg, WarmOptions::default(), |_| {})
        .await
        .unwrap();
    let shards = engine.keyspace().shards();
    let of_part = |part: u16| {
        skus.iter()
            .filter(|s| engine.keyspace().shard_of(s) % 3 == part)
            .count()
    };
    assert!(
        (0..3).all(|p| of_part(p) > 0),
        "every part owns some of the SKUs ({shards} shards)"
    );
    let sellers: Vec<_> = skus
        .iter()
        .map(|sku| {
            let (engine, sku) = (engine.clone(), sku.clone());
            tokio::spawn(async move { sell(&engine, &format!("pt-{sku}"), &sku, 4).await })
        })
        .collect();
    for s in sellers {
        s.await.unwrap();
    }

    // Parts 0 and 2 of three run; part 1 commits its shards' sales, then dies
    // before settling, every time.
    let (tx, rx) = tokio::sync::watch::channel(false);
    let mut running = Vec::new();
    for (part, config) in [
        (0, config("p")),
        (1, dies_after_commit("p")),
        (2, config("p")),
    ] {
        let w = worker(&engine, &pg, redis.connection().await, config).part(part, 3);
        running.push(until_stopped(w, &rx));
    }
    let on_part = |part: u16| -> Vec<&String> {
        skus.iter()
            .filter(|s| engine.keyspace().shard_of(s) % 3 == part)
            .collect()
    };
    let mut settled = false;
    for _ in 0..400 {
        let mut done = true;
        for sku in on_part(0).into_iter().chain(on_part(2)) {
            done &= engine.figures(sku).await.unwrap().unwrap().sold_pending == 0;
        }
        for sku in on_part(1) {
            done &= counts(&pg, sku).await == (4, 4, 46, 4);
        }
        if done {
            settled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(settled, "parts 0 and 2 settled, part 1 committed");
    tx.send(true).unwrap();
    for r in running {
        r.await.unwrap();
    }
    for sku in &skus {
        assert_eq!(
            counts(&pg, sku).await,
            (4, 4, 46, 4),
            "{sku}: recorded once"
        );
        let pending = engine.figures(sku).await.unwrap().unwrap().sold_pending;
        let dead = engine.keyspace().shard_of(sku) % 3 == 1;
        assert_eq!(
            pending,
            if dead { 4 } else { 0 },
            "{sku}: settled by its part"
        );
    }
    let lag = engine.write_behind_lag().await.unwrap();
    assert!(lag.entries > 0, "the dead part's entries wait: {lag:?}");

    // Another process's part 1 takes them over: nothing is recorded twice.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let mut heir = worker(&engine, &pg, redis.connection().await, takes_over("q")).part(1, 3);
    heir.ensure_groups().await.unwrap();
    let taken = heir.reclaim_once().await.unwrap();
    assert!(taken.entries > 0, "the pending entries were taken over");
    let mut all = vec![
        worker(&engine, &pg, redis.connection().await, config("p")).part(0, 3),
        heir,
        worker(&engine, &pg, redis.connection().await, config("p")).part(2, 3),
    ];
    let mut drained = false;
    for _ in 0..200 {
        for w in &mut all {
            w.run_once().await.unwrap();
        }
        if engine.write_behind_lag().await.unwrap().entries == 0 {
            drained = true;
            break;
        }
    }
    assert!(drained, "the parts drained every shard");
    for sku in &skus {
        assert_eq!(counts(&pg, sku).await, (4, 4, 46, 4), "{sku}: still once");
        assert_eq!(
            engine.figures(sku).await.unwrap().unwrap().sold_pending,
            0,
            "{sku}: settled"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped_mid_sale_loses_nothing() {
    let mut postgres = TestPostgres::start();
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let pg = postgres::connect_and_migrate(&postgres.url("holdfast"), 4)
        .await
        .unwrap();
    stocked(&engine, &pg, &[("PG-1", 300)]).await;

    let (w, stats) = counted(
        &engine,
        &pg,
        redis.connection().await,
        WriteBehindConfig {
            max_backoff: Duration::from_millis(200),
            ..config("pgdown")
        },
    );
    let (tx, rx) = tokio::sync::watch::channel(false);
    let task = until_stopped(w, &rx);

    sell(&engine, "before", "PG-1", 30).await;
    postgres.stop();
    // The sale goes on: Redis decides, events wait in the stream.
    sell(&engine, "during", "PG-1", 40).await;
    // The pool retries connecting for its acquire timeout (5 s) before a batch
    // fails, so allow well beyond that.
    let mut saw_failure = false;
    for _ in 0..200 {
        if stats.last_error().is_some() {
            saw_failure = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(saw_failure, "the write-behind reports PostgreSQL down");
    assert!(
        engine.write_behind_lag().await.unwrap().entries > 0,
        "events wait in the stream"
    );

    postgres.start_again();
    sell(&engine, "after", "PG-1", 10).await;
    let mut drained = false;
    for _ in 0..300 {
        if engine.write_behind_lag().await.unwrap().entries == 0 && stats.last_error().is_none() {
            drained = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tx.send(true).unwrap();
    task.await.unwrap();
    assert!(drained, "the backlog drained after PostgreSQL came back");
    assert_eq!(
        counts(&pg, "PG-1").await,
        (80, 80, 220, 80),
        "every order exactly once"
    );
    let ledger_sum: i64 = sqlx::query_scalar("SELECT coalesce(sum(qty), 0)::bigint FROM ledger WHERE sku = 'PG-1' AND kind <> 'correction'")
        .fetch_one(&pg)
        .await
        .unwrap();
    assert_eq!(300 + ledger_sum, 220, "ledger and on_hand agree");
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn after_redis_loses_everything_warm_up_resumes_the_sale_without_oversell(pg: PgPool) {
    let mut redis = TestRedis::start();
    let engine = redis.engine().await;
    add_sku(&pg, "RL-1", 50).await;
    let first = warm_all(&engine, &pg, WarmOptions::default(), |_| {})
        .await
        .unwrap();
    assert_eq!((first.warmed, first.existing), (1, 0));
    sell(&engine, "pre", "RL-1", 10).await;
    let mut w = worker(&engine, &pg, redis.connection().await, config("rl"));
    drain(&engine, &mut w).await;

    redis.restart();
    let mut answer = None;
    for _ in 0..50 {
        if let Ok(o) = engine
            .reserve(&ReserveRequest::single("cold", "RL-1", 1))
            .await
        {
            answer = Some(o);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        answer,
        Some(ReserveOutcome::NotWarmed { sku: "RL-1".into() })
    );

    let mut progress = Vec::new();
    let report = warm_all(&engine, &pg, WarmOptions::default(), |p| progress.push(p))
        .await
        .unwrap();
    assert_eq!(report.warmed, 1);
    assert_eq!(progress.last().map(|p| (p.done, p.total)), Some((1, 1)));
    let again = warm_all(&engine, &pg, WarmOptions::default(), |_| {})
        .await
        .unwrap();
    assert_eq!((again.warmed, again.existing), (0, 1), "idempotent");

    let mut sold = 0;
    for i in 0..60 {
        match engine
            .reserve(&ReserveRequest::single(format!("post-{i}"), "RL-1", 1))
            .await
            .unwrap()
        {
            ReserveOutcome::Reserved { .. } => sold += 1,
            ReserveOutcome::SoldOut { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(sold, 40, "exactly what PostgreSQL says is left");
    let f = engine.figures("RL-1").await.unwrap().unwrap();
    assert_eq!(
        f.available + f.reserved + f.sold_pending,
        40,
        "conservation against on_hand 40"
    );
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_paused_lock_holder_cannot_write_with_its_old_fence(pg: PgPool) {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let a = engine
        .acquire_lock("reconcile", Duration::from_millis(200))
        .await
        .unwrap()
        .unwrap();
    // A pauses past its lease (as a stopped process would); B takes over and writes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b = engine
        .acquire_lock("reconcile", Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert!(b.fence > a.fence);
    let mut tx = pg.begin().await.unwrap();
    postgres::fence(&mut tx, "reconcile", b.fence)
        .await
        .unwrap();
    tx.commit().await.unwrap();

    // A wakes up and tries to write with its old token.
    let mut tx = pg.begin().await.unwrap();
    let stale = postgres::fence(&mut tx, "reconcile", a.fence).await;
    assert!(
        matches!(stale, Err(EngineError::StaleFence { token, .. }) if token == a.fence),
        "{stale:?}"
    );

    // And a whole reconciliation cannot start while B holds the lock.
    let busy = reconcile::reconcile_all(&engine, &pg, &ReconcileOptions::default(), |_| {}).await;
    assert!(matches!(busy, Err(EngineError::Busy(_))), "{busy:?}");
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn reconciliation_corrects_down_at_once_and_up_only_when_asked(pg: PgPool) {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    for (sku, on_hand) in [
        ("RC-HIGH", 100),
        ("RC-LOW", 50),
        ("RC-OK", 10),
        ("RC-COLD", 5),
    ] {
        add_sku(&pg, sku, on_hand).await;
    }
    warm_all(&engine, &pg, WarmOptions::default(), |_| {})
        .await
        .unwrap();
    let mut admin = redis.connection().await;
    let ks = engine.keyspace();
    redis::cmd("HSET")
        .arg(ks.sku("RC-HIGH"))
        .arg("available")
        .arg(130)
        .query_async::<()>(&mut admin)
        .await
        .unwrap();
    redis::cmd("HSET")
        .arg(ks.sku("RC-LOW"))
        .arg("available")
        .arg(44)
        .query_async::<()>(&mut admin)
        .await
        .unwrap();
    redis::cmd("DEL")
        .arg(ks.sku("RC-COLD"))
        .query_async::<()>(&mut admin)
        .await
        .unwrap();
    // A sale committed in PostgreSQL but not yet settled in Redis is not drift.
    sell(&engine, "inflight", "RC-OK", 3).await;
    let mut w = worker(
        &engine,
        &pg,
        redis.connection().await,
        dies_after_commit("rc"),
    );
    w.ensure_groups().await.unwrap();
    assert!(w.run_once().await.is_err());

    let report = reconcile::reconcile_all(&engine, &pg, &ReconcileOptions::default(), |_| {})
        .await
        .unwrap();
    assert_eq!(
        (
            report.checked,
            report.drifted,
            report.corrected_down,
            report.reported,
            report.not_warmed
        ),
        (4, 2, 1, 1, 1),
        "{report:?}"
    );
    assert_eq!(
        engine.figures("RC-HIGH").await.unwrap().unwrap().available,
        100,
        "corrected down at once"
    );
    assert_eq!(
        engine.figures("RC-LOW").await.unwrap().unwrap().available,
        44,
        "stranded units only reported"
    );
    assert_eq!(
        engine.figures("RC-OK").await.unwrap().unwrap().available,
        7,
        "in-flight sale untouched"
    );
    let ledger: (String, i64, Option<i64>) =
        sqlx::query_as("SELECT kind, qty, fencing_token FROM ledger WHERE sku = 'RC-HIGH' AND source = 'reconcile'")
            .fetch_one(&pg)
            .await
            .unwrap();
    assert_eq!(
        ledger,
        ("correction".into(), -30, Some(report.fence)),
        "the correction is in the ledger"
    );
    let results: Vec<(String, i64, String)> = sqlx::query_as(
        "SELECT sku, drift, action FROM reconciliation_results WHERE run_id = $1 ORDER BY sku",
    )
    .bind(report.run_id)
    .fetch_all(&pg)
    .await
    .unwrap();
    assert_eq!(
        results,
        vec![
            ("RC-HIGH".into(), 30, "corrected_down".into()),
            ("RC-LOW".into(), -6, "reported".into())
        ]
    );

    let up = reconcile::reconcile_all(
        &engine,
        &pg,
        &ReconcileOptions {
            correct_up: true,
            ..ReconcileOptions::default()
        },
        |_| {},
    )
    .await
    .unwrap();
    assert_eq!((up.drifted, up.corrected_up), (1, 1), "{up:?}");
    assert_eq!(
        engine.figures("RC-LOW").await.unwrap().unwrap().available,
        50
    );
    assert!(
        up.fence > report.fence,
        "each run fences with a newer token"
    );
}

/// Invariant: a drift on a SKU that sells all day is corrected in one run,
/// between its sales: shoppers holding, paying and releasing change the
/// counters' fields between the measure and the correction, never the sum the
/// drift depends on. (A compare-and-set on the fields was refused under such
/// churn, run after run.)
#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn reconciliation_corrects_a_sku_while_its_shoppers_buy(pg: PgPool) {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let sku = "RC-BUSY";
    stocked(&engine, &pg, &[(sku, 400)]).await;
    // Shoppers on threads of their own: truly at once, as HTTP requests are.
    let shoppers_rt = holdfast_engine::testkit::threads_of_their_own(2);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut shoppers = Vec::new();
    for n in 0..8 {
        let (engine, stop) = (engine.clone(), stop.clone());
        shoppers.push(shoppers_rt.spawn(async move {
            let mut bought = 0;
            for i in 0.. {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let rid = format!("busy-{n}-{i}");
                let r = engine.reserve(&ReserveRequest::single(&rid, sku, 1)).await;
                if let Ok(ReserveOutcome::Reserved { .. }) = r {
                    if i % 10 == 0 {
                        engine.confirm(&rid).await.unwrap();
                        bought += 1;
                    } else {
                        engine.release(&rid).await.unwrap();
                    }
                }
            }
            bought
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Seven units that do not exist go on sale.
    holdfast_engine::testkit::nudge_counter(&engine, sku, "available", 7).await;
    let report = reconcile::reconcile_all(&engine, &pg, &ReconcileOptions::default(), |_| {})
        .await
        .unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut bought = 0;
    for b in shoppers {
        bought += b.await.unwrap();
    }
    shoppers_rt.shutdown_background();
    assert_eq!(
        (report.drifted, report.corrected_down, report.moved),
        (1, 1, 0),
        "{report:?}"
    );
    assert!(bought > 0, "the shoppers bought during the run");
    let f = engine.figures(sku).await.unwrap().unwrap();
    assert_eq!(
        (f.available + f.sold_pending, f.reserved),
        (400, 0),
        "the seven units are gone, and only they: {f:?}"
    );
    let ledger: i64 =
        sqlx::query_scalar("SELECT qty FROM ledger WHERE sku = $1 AND source = 'reconcile'")
            .bind(sku)
            .fetch_one(&pg)
            .await
            .unwrap();
    assert_eq!(ledger, -7);
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn an_event_postgresql_refuses_is_set_aside_and_recording_goes_on(pool: PgPool) {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    add_sku(&pool, "OK-1", 20).await;
    warm_all(&engine, &pool, WarmOptions::default(), |_| {})
        .await
        .unwrap();
    let (mut w, stats) = counted(&engine, &pool, redis.connection().await, config("poison"));
    w.ensure_groups().await.unwrap();
    sell(&engine, "before", "OK-1", 2).await;
    // An entry whose event id PostgreSQL cannot store (a NUL byte is not valid
    // text there), among good ones in the same shard.
    let shard = engine.keyspace().shard_of("OK-1");
    let _: String = redis::cmd("XADD")
        .arg(engine.keyspace().events(shard))
        .arg("*")
        .arg("kind")
        .arg("delta")
        .arg("sku")
        .arg("OK-1")
        .arg("qty")
        .arg("1")
        .arg("source")
        .arg("erp")
        .arg("event_id")
        .arg("poison\u{0}id")
        .query_async(&mut redis.connection().await)
        .await
        .unwrap();
    sell(&engine, "after", "OK-1", 3).await;
    for _ in 0..20 {
        w.run_once()
            .await
            .expect("one bad event does not stop recording");
        if engine.write_behind_lag().await.unwrap().entries == 0 {
            break;
        }
    }
    assert_eq!(engine.write_behind_lag().await.unwrap().entries, 0);
    let (orders, sales, _, sold) = counts(&pool, "OK-1").await;
    assert_eq!(
        (orders, sales, sold),
        (5, 5, 5),
        "every good event is recorded"
    );
    assert_eq!(stats.parked.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert!(
        stats
            .reconcile_requested
            .load(std::sync::atomic::Ordering::Relaxed)
    );
    let parked: Vec<(String, std::collections::HashMap<String, String>)> = redis::cmd("XRANGE")
        .arg(holdfast_engine::record::PARKED_KEY)
        .arg("-")
        .arg("+")
        .query_async(&mut redis.connection().await)
        .await
        .unwrap();
    assert_eq!(parked.len(), 1);
    assert!(parked[0].1["event"].contains("OK-1"));
    assert!(!parked[0].1["reason"].is_empty());
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_buyer_search_reads_the_index_and_is_bounded(pool: PgPool) {
    use holdfast_engine::checkout::{MAX_FOUND_HOLDS, find_holds};
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    add_sku(&pool, "BS-1", 1_000).await;
    add_sku(&pool, "BS-2", 1_000).await;
    warm_all(&engine, &pool, WarmOptions::default(), |_| {})
        .await
        .unwrap();
    let hold = |rid: String, sku: &'static str, buyer: &'static str| {
        let engine = engine.clone();
        async move {
            let r = engine
                .reserve(&ReserveRequest::single(&rid, sku, 1).for_buyer(buyer))
                .await
                .unwrap();
            assert!(matches!(r, ReserveOutcome::Reserved { .. }), "{r:?}");
        }
    };
    for i in 0..(MAX_FOUND_HOLDS + 50) {
        hold(format!("many-{i}"), "BS-1", "busy-buyer").await;
    }
    hold("one-1".into(), "BS-1", "ann").await;
    hold("one-2".into(), "BS-2", "ann").await;
    hold("gone-1".into(), "BS-2", "ann").await;
    engine.release("gone-1").await.unwrap();
    let backends = holdfast_engine::Backends::new(
        pool.clone(),
        redis.connection().await,
        engine.config().clone(),
    );
    let mut w = worker(&engine, &pool, redis.connection().await, config("search"));
    drain(&engine, &mut w).await;
    let mut found: Vec<String> = find_holds(&backends, "ann")
        .await
        .unwrap()
        .into_iter()
        .map(|h| h.reservation_id)
        .collect();
    found.sort();
    assert_eq!(
        found,
        vec!["one-1", "one-2"],
        "live holds only, in every SKU"
    );
    let many = find_holds(&backends, "busy-buyer").await.unwrap();
    assert_eq!(many.len() as i64, MAX_FOUND_HOLDS, "bounded");
    assert!(
        many.iter()
            .any(|h| h.reservation_id == format!("many-{}", MAX_FOUND_HOLDS + 49)),
        "newest first"
    );
    assert_eq!(
        find_holds(&backends, "one-1").await.unwrap().len(),
        1,
        "by id"
    );
    assert!(find_holds(&backends, "nobody").await.unwrap().is_empty());
}

/// Names left in a stream group by processes that are gone (nothing pending,
/// silent past the threshold) are deleted; a consumer with entries pending,
/// one that read recently and the caller itself stay.
#[tokio::test]
async fn consumers_left_by_gone_processes_are_forgotten() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let mut conn = redis.connection().await;
    let reader = conn.clone();
    // A consumer that reads (and so exists, with what it read pending).
    let read_as = |name: &'static str| {
        let mut conn = reader.clone();
        async move {
            redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg("g")
                .arg(name)
                .arg("COUNT")
                .arg(1)
                .arg("STREAMS")
                .arg("s")
                .arg(">")
                .query_async::<redis::Value>(&mut conn)
                .await
                .unwrap();
        }
    };
    // A consumer that exists with nothing read.
    let join_as = |name: &'static str| {
        let mut conn = reader.clone();
        async move {
            redis::cmd("XGROUP")
                .arg("CREATECONSUMER")
                .arg("s")
                .arg("g")
                .arg(name)
                .query_async::<i64>(&mut conn)
                .await
                .unwrap();
        }
    };
    redis::cmd("XGROUP")
        .arg("CREATE")
        .arg("s")
        .arg("g")
        .arg("$")
        .arg("MKSTREAM")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    join_as("gone").await;
    join_as("me").await;
    redis::cmd("XADD")
        .arg("s")
        .arg("*")
        .arg("k")
        .arg("v")
        .query_async::<String>(&mut conn)
        .await
        .unwrap();
    read_as("busy").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    join_as("recent").await;

    let kept = |conn: &mut holdfast_engine::RedisConn| {
        let mut conn = conn.clone();
        async move {
            let rows: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("XINFO")
                .arg("CONSUMERS")
                .arg("s")
                .arg("g")
                .query_async(&mut conn)
                .await
                .unwrap();
            let mut names: Vec<String> = rows
                .iter()
                .map(|r| redis::from_redis_value_ref(&r["name"]).unwrap())
                .collect();
            names.sort();
            names
        }
    };
    let hour = Duration::from_secs(3_600);
    assert_eq!(
        engine
            .forget_idle_consumers("s", "g", hour, "me")
            .await
            .unwrap(),
        0
    );
    assert_eq!(kept(&mut conn).await, ["busy", "gone", "me", "recent"]);
    let idle = Duration::from_millis(200);
    assert_eq!(
        engine
            .forget_idle_consumers("s", "g", idle, "me")
            .await
            .unwrap(),
        1
    );
    assert_eq!(kept(&mut conn).await, ["busy", "me", "recent"]);
    assert_eq!(
        engine
            .forget_idle_consumers("nothing", "g", idle, "me")
            .await
            .unwrap(),
        0,
        "no group: nothing to forget"
    );
}

/// Per-buyer limits survive Redis losing its data: warm-up gives each buyer's
/// counter back what PostgreSQL says they bought, so a buyer at the limit
/// stays at it; a buyer whose hold was lost with Redis may hold again.
#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_buyer_at_the_limit_stays_there_after_redis_loses_its_data(pg: PgPool) {
    let mut redis = TestRedis::start();
    let engine = redis.engine().await;
    add_sku(&pg, "BL-1", 50).await;
    add_sku(&pg, "BL-2", 50).await;
    sqlx::query("UPDATE skus SET per_buyer_limit = 2 WHERE sku = 'BL-1'")
        .execute(&pg)
        .await
        .unwrap();
    warm_all(&engine, &pg, WarmOptions::default(), |_| {})
        .await
        .unwrap();
    let hold =
        |rid: &str, buyer: &str, qty| ReserveRequest::single(rid, "BL-1", qty).for_buyer(buyer);
    let bought = engine.reserve(&hold("ann-1", "ann", 2)).await.unwrap();
    assert!(
        matches!(bought, ReserveOutcome::Reserved { .. }),
        "{bought:?}"
    );
    engine.confirm("ann-1").await.unwrap();
    // BL-2 has no limit yet; Redis counts ann's units all the same.
    let unlimited = engine
        .reserve(&ReserveRequest::single("ann-u", "BL-2", 2).for_buyer("ann"))
        .await
        .unwrap();
    assert!(
        matches!(unlimited, ReserveOutcome::Reserved { .. }),
        "{unlimited:?}"
    );
    engine.confirm("ann-u").await.unwrap();
    let held = engine.reserve(&hold("bob-1", "bob", 2)).await.unwrap();
    assert!(matches!(held, ReserveOutcome::Reserved { .. }), "{held:?}");
    let mut w = worker(&engine, &pg, redis.connection().await, config("bl"));
    drain(&engine, &mut w).await;

    redis.restart();
    let engine = redis.engine().await;
    warm_all(&engine, &pg, WarmOptions::default(), |_| {})
        .await
        .unwrap();
    let again = engine.reserve(&hold("ann-2", "ann", 1)).await.unwrap();
    assert!(
        matches!(again, ReserveOutcome::LimitExceeded { .. }),
        "ann bought 2 of 2: {again:?}"
    );
    let bob = engine.reserve(&hold("bob-2", "bob", 2)).await.unwrap();
    assert!(
        matches!(bob, ReserveOutcome::Reserved { .. }),
        "bob's hold went with Redis: {bob:?}"
    );
    // A limit set on BL-2 after the loss counts what ann bought before it.
    sqlx::query("UPDATE skus SET per_buyer_limit = 2 WHERE sku = 'BL-2'")
        .execute(&pg)
        .await
        .unwrap();
    holdfast_engine::schedule::follow_catalogue(&engine, &pg)
        .await
        .unwrap();
    let over = engine
        .reserve(&ReserveRequest::single("ann-u2", "BL-2", 1).for_buyer("ann"))
        .await
        .unwrap();
    assert!(
        matches!(over, ReserveOutcome::LimitExceeded { .. }),
        "{over:?}"
    );
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn warm_up_in_small_pages_writes_each_counter_once(pg: PgPool) {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    for i in 0..50 {
        add_sku(&pg, &format!("WP-{i:02}"), 10 + i).await;
    }
    // Most counters exist already: left alone, whichever page they fall in.
    warm_all(&engine, &pg, WarmOptions::default(), |_| {})
        .await
        .unwrap();
    for i in [3, 17, 18, 41] {
        redis::cmd("DEL")
            .arg(engine.keyspace().sku(&format!("WP-{i:02}")))
            .query_async::<()>(&mut redis.connection().await)
            .await
            .unwrap();
    }
    let mut seen = Vec::new();
    let report = warm_all(
        &engine,
        &pg,
        WarmOptions {
            page: 7,
            ..WarmOptions::default()
        },
        |p| seen.push(p.done),
    )
    .await
    .unwrap();
    assert_eq!((report.skus, report.warmed, report.existing), (50, 4, 46));
    assert_eq!(
        seen.len(),
        8,
        "one progress report per page (50 in pages of 7)"
    );
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "progress only rises: {seen:?}"
    );
    assert_eq!(seen.last(), Some(&50));
    for i in 0..50 {
        let f = engine
            .figures(&format!("WP-{i:02}"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(f.available, 10 + i, "WP-{i:02}");
    }

    // Forced, in one page: one warm.lua call per shard, several SKUs in some;
    // each keeps its live holds.
    let shards: Vec<u16> = (0..50)
        .map(|i| engine.keyspace().shard_of(&format!("WP-{i:02}")))
        .collect();
    assert!(
        (0..50).any(|i| shards[i + 1..].contains(&shards[i])),
        "some shard holds two of the SKUs"
    );
    for i in (0..50).step_by(3) {
        let r = engine
            .reserve(&ReserveRequest::single(
                format!("wp-{i}"),
                format!("WP-{i:02}"),
                3,
            ))
            .await
            .unwrap();
        assert!(matches!(r, ReserveOutcome::Reserved { .. }), "{r:?}");
    }
    let report = warm_all(
        &engine,
        &pg,
        WarmOptions {
            force: true,
            page: 50,
        },
        |_| {},
    )
    .await
    .unwrap();
    assert_eq!((report.skus, report.warmed), (50, 50));
    for i in 0..50 {
        let sku = format!("WP-{i:02}");
        let held = if i % 3 == 0 { 3 } else { 0 };
        let f = engine.figures(&sku).await.unwrap().unwrap();
        assert_eq!((f.available, f.reserved), (10 + i - held, held), "{sku}");
        // Its `warmed` event carries the figures it was warmed to.
        let entries: Vec<(String, std::collections::HashMap<String, String>)> =
            redis::cmd("XRANGE")
                .arg(engine.keyspace().events(engine.keyspace().shard_of(&sku)))
                .arg("-")
                .arg("+")
                .query_async(&mut redis.connection().await)
                .await
                .unwrap();
        let last = entries
            .iter()
            .rev()
            .map(|(_, f)| f)
            .find(|f| f["sku"] == sku && f["kind"] == "warmed")
            .unwrap();
        assert_eq!(last["available"], (10 + i - held).to_string(), "{sku}");
        assert_eq!(last["reserved"], held.to_string(), "{sku}");
        assert_eq!(last["sold_pending"], "0", "{sku}");
    }
}

/// The `settled` events of `sku` in its shard's stream: their quantities.
async fn settled_events(redis: &TestRedis, engine: &Engine, sku: &str) -> Vec<i64> {
    type Entry = (String, std::collections::HashMap<String, String>);
    let entries: Vec<Entry> = redis::cmd("XRANGE")
        .arg(engine.keyspace().events(engine.keyspace().shard_of(sku)))
        .arg("-")
        .arg("+")
        .query_async(&mut redis.connection().await)
        .await
        .unwrap();
    entries
        .iter()
        .filter(|(_, f)| f["kind"] == "settled" && f["sku"] == sku)
        .map(|(_, f)| f["qty"].parse().unwrap())
        .collect()
}

/// A batch's sales are settled many lines to a `settle.lua` call (in chunks):
/// every sale leaves `sold_pending` once, and each SKU gets one `settled`
/// event per call instead of one per sale, carrying what the call settled. A
/// batch settled again (its consumer died before acknowledging it) moves
/// nothing and adds no event.
#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_batch_settles_every_sale_once_with_one_event_per_sku_and_call(pg: PgPool) {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    stocked(&engine, &pg, &[("ST-1", 200), ("ST-2", 20)]).await;
    // More sales of one SKU than one call takes.
    sell(&engine, "many", "ST-1", 150).await;
    sell(&engine, "few", "ST-2", 10).await;
    let mut dying = worker(
        &engine,
        &pg,
        redis.connection().await,
        WriteBehindConfig {
            fault: Some(Fault::BeforeAck),
            ..config("settler")
        },
    );
    dying.ensure_groups().await.unwrap();
    assert!(dying.run_once().await.is_err(), "dies before acknowledging");
    let mut first = Vec::new();
    for (sku, sold) in [("ST-1", 150), ("ST-2", 10)] {
        let settles = settled_events(&redis, &engine, sku).await;
        assert_eq!(settles.iter().sum::<i64>(), sold, "{sku}: {settles:?}");
        assert!(
            settles.len() <= (sold as usize).div_ceil(64),
            "{sku}: one settled event per call, not per sale: {settles:?}"
        );
        first.push(settles);
    }
    // The same consumer reads its pending entries again and settles them again.
    let mut again = worker(&engine, &pg, redis.connection().await, config("settler"));
    drain(&engine, &mut again).await;
    for ((sku, sold, on_hand), settles) in
        [("ST-1", 150, 50), ("ST-2", 10, 10)].into_iter().zip(first)
    {
        let f = engine.figures(sku).await.unwrap().unwrap();
        assert_eq!(
            (f.available, f.reserved, f.sold_pending),
            (on_hand, 0, 0),
            "{sku}"
        );
        assert_eq!(
            settled(&redis, &engine, sku).await,
            sold,
            "{sku}: settled once each"
        );
        assert_eq!(counts(&pg, sku).await, (sold, sold, on_hand, sold), "{sku}");
        assert_eq!(
            settled_events(&redis, &engine, sku).await,
            settles,
            "{sku}: no new event"
        );
    }
}

/// Waits (up to `within`) until the write-behind has nothing left; says whether it got there.
async fn drained_within(engine: &Engine, within: Duration) -> bool {
    let until = std::time::Instant::now() + within;
    while std::time::Instant::now() < until {
        if engine.write_behind_lag().await.unwrap().entries == 0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_trickle_is_recorded_in_gathered_batches_and_a_backlog_without_waiting(pg: PgPool) {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    stocked(&engine, &pg, &[("GA-1", 1_000)]).await;

    // A steady trickle: a sale (two events) every 25 ms for about a second,
    // while a write-behind that gathers for 400 ms runs.
    let (w, stats) = counted(
        &engine,
        &pg,
        redis.connection().await,
        WriteBehindConfig {
            gather: Duration::from_millis(400),
            ..config("trickle")
        },
    );
    let (tx, rx) = tokio::sync::watch::channel(false);
    let task = until_stopped(w, &rx);
    // Its groups made and the warm-up's events recorded (the lag counts only
    // groups that exist), before counting.
    for _ in 0..500 {
        if stats.batches.load(std::sync::atomic::Ordering::Relaxed) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(drained_within(&engine, Duration::from_secs(10)).await);
    let before = stats.batches.load(std::sync::atomic::Ordering::Relaxed);
    let started = std::time::Instant::now();
    for i in 0..40 {
        sell(&engine, &format!("t{i}"), "GA-1", 1).await;
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let spent = started.elapsed();
    assert!(drained_within(&engine, Duration::from_secs(10)).await);
    let batches = stats.batches.load(std::sync::atomic::Ordering::Relaxed) - before;
    // One batch at the first event, then one per 400 ms at most, and two to
    // spare (a batch per event without gathering: about 120).
    let most = 2 + (spent.as_millis() / 400) as u64 + 3;
    assert!(
        batches <= most,
        "{batches} batches for 40 sales over {spent:?} (at most {most})"
    );
    assert_eq!(counts(&pg, "GA-1").await, (40, 40, 960, 40));
    // Shutting down while it waits to gather is prompt.
    tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(2), task)
        .await
        .expect("shutdown does not wait out the gathering")
        .unwrap();

    // A backlog: 30 sales waiting, reads of 10 entries, a gathering of 5 s.
    // Each full read goes on at once, so it drains long before one wait.
    sell(&engine, "b", "GA-1", 30).await;
    let (w, stats) = counted(
        &engine,
        &pg,
        redis.connection().await,
        WriteBehindConfig {
            gather: Duration::from_secs(5),
            batch_max: 10,
            ..config("backlog")
        },
    );
    let (tx, rx) = tokio::sync::watch::channel(false);
    let task = until_stopped(w, &rx);
    assert!(
        drained_within(&engine, Duration::from_secs(4)).await,
        "a backlog is recorded without gathering between full reads"
    );
    assert!(stats.batches.load(std::sync::atomic::Ordering::Relaxed) >= 6);
    assert_eq!(counts(&pg, "GA-1").await, (70, 70, 930, 70));
    tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(2), task)
        .await
        .expect("shutdown is prompt")
        .unwrap();
}
