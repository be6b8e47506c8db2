//! Split SKUs: one SKU's stock in parts on several shards. Exactly the stock
//! is sold, never a negative part, never "sold out" while the SKU as a whole
//! has the units, one buyer's limit over every part, and holds on parts
//! confirmed, released and expired like any other.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use holdfast_engine::keys::{base_sku, parse_part, part_name};
use holdfast_engine::testkit::{TestRedis, add_sku};
use holdfast_engine::warmup::{WarmOptions, warm_all};
use holdfast_engine::{
    Backends, ConfirmOutcome, Engine, HoldState, ReleaseOutcome, ReserveOutcome, ReserveRequest,
    SplitOutcome, postgres,
};
use redis::Value;
use sqlx::PgPool;

/// A test Redis and the backends over it and `pg`, with `sku` warmed.
async fn setup(pg: &PgPool, sku: &str, on_hand: i64, limit: i32) -> (TestRedis, Backends) {
    holdfast_engine::testkit::warmed_sku(pg, sku, on_hand, limit).await
}

/// Every entry of every shard stream for `sku`'s parts (and its own name):
/// (Redis ms, the part's name, its available and moving after the change).
async fn part_timeline(
    redis: &TestRedis,
    engine: &Engine,
    sku: &str,
) -> Vec<(i64, String, i64, i64)> {
    let ks = engine.keyspace();
    let mut conn = redis.connection().await;
    let mut out = Vec::new();
    let mut streams: Vec<String> = (0..ks.shards()).map(|s| ks.events(s)).collect();
    streams.dedup();
    for stream in streams {
        let entries: Vec<(String, HashMap<String, Value>)> = redis::cmd("XRANGE")
            .arg(&stream)
            .arg("-")
            .arg("+")
            .query_async(&mut conn)
            .await
            .unwrap();
        for (_, fields) in entries {
            let text = |k: &str| {
                fields
                    .get(k)
                    .and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
                    .unwrap_or_default()
            };
            let name = text("sku");
            if base_sku(&name) != sku || text("available").is_empty() {
                continue;
            }
            // Part 0 also goes by the SKU's own name (warm-up, a feed).
            let part = parse_part(&name).map_or(0, |(_, j, _)| j);
            out.push((
                text("ts").parse().unwrap(),
                format!("{part}"),
                text("available").parse().unwrap(),
                text("moving").parse().unwrap_or(0),
            ));
        }
    }
    out.sort_by_key(|e| e.0);
    out
}

async fn race(pg: PgPool, parts: u16) {
    let sku = format!("SPLIT-RACE-{parts}");
    let (redis, b) = setup(&pg, &sku, 2_000, 0).await;
    let engine = b.engine.clone();
    assert_eq!(
        engine.set_parts(&pg, &sku, parts).await.unwrap(),
        SplitOutcome::Changed { from: 1, to: parts }
    );
    let f = engine.figures(&sku).await.unwrap().unwrap();
    assert_eq!((f.available, f.parts, f.moving), (2_000, parts, 0));

    let shoppers = 20_000;
    // 200 in flight: on a three-master cluster on two loaded cores, more
    // made the client's 2 s command timeout fire (a run fails, not a rule).
    let gate = Arc::new(tokio::sync::Semaphore::new(200));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..shoppers {
        let (engine, gate, sku) = (engine.clone(), gate.clone(), sku.clone());
        tasks.spawn(async move {
            let _permit = gate.acquire().await.unwrap();
            let started = chrono::Utc::now().timestamp_millis();
            // A third of the shoppers are seven buyers (their parts run short
            // first and take units from the others); the rest go by id.
            let mut req = ReserveRequest::single(format!("race-{parts}-{i}"), &sku, 1);
            if i % 3 == 0 {
                req = req.for_buyer(format!("regular-{}", i % 7));
            }
            let outcome = engine.reserve(&req).await;
            (started, chrono::Utc::now().timestamp_millis(), outcome)
        });
    }
    let (mut held, mut refusals, mut busy) = (0, Vec::new(), 0usize);
    while let Some(done) = tasks.join_next().await {
        let (started, ended, outcome) = done.unwrap();
        match outcome {
            Ok(ReserveOutcome::Reserved {
                available_after, ..
            }) => {
                assert_eq!(
                    available_after[0].0, sku,
                    "answers name the SKU, not a part"
                );
                held += 1;
            }
            Ok(ReserveOutcome::SoldOut {
                sku: s, available, ..
            }) => {
                assert_eq!(s, sku);
                assert!(available < 1, "refused with {available} left");
                refusals.push((started, ended));
            }
            Err(holdfast_engine::EngineError::Busy(_)) => busy += 1,
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    assert_eq!(held, 2_000, "exactly the stock is held");
    assert_eq!(held + refusals.len() + busy, shoppers);
    let f = engine.figures(&sku).await.unwrap().unwrap();
    assert_eq!(
        (f.available, f.reserved, f.moving, f.open_holds),
        (0, 2_000, 0, 2_000),
        "every unit is in a hold and none is on its way"
    );

    // The SKU's total (each part's latest available plus its units moving)
    // through time, from the events: no part is ever negative, and every
    // refusal saw a moment within its call when the total was below 1.
    let timeline = part_timeline(&redis, &engine, &sku).await;
    assert!(
        timeline.iter().all(|e| e.2 >= 0 && e.3 >= 0),
        "never a negative part"
    );
    let mut latest: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    let mut totals: Vec<(i64, i64)> = Vec::new();
    for (ts, part, available, moving) in &timeline {
        latest.insert(part.clone(), (*available, *moving));
        let total = latest.values().map(|(a, m)| a + m).sum();
        totals.push((*ts, total));
    }
    let total_at = |t: i64| {
        totals
            .iter()
            .take_while(|(ts, _)| *ts <= t)
            .last()
            .map_or(2_000, |(_, total)| *total)
    };
    let mut early = 0;
    for (started, ended) in &refusals {
        let lowest = totals
            .iter()
            .filter(|(ts, _)| ts >= started && ts <= ended)
            .map(|(_, total)| *total)
            .chain([total_at(*started), total_at(*ended)])
            .min()
            .unwrap();
        if lowest >= 1 {
            early += 1;
        }
    }
    assert_eq!(
        early,
        0,
        "{early} of {} refusals came while the SKU had a unit left throughout the call",
        refusals.len()
    );
    eprintln!(
        "split {parts}: {held} held, {} sold out, {busy} busy, {} events, {:?}",
        refusals.len(),
        timeline.len(),
        engine.split_stats()
    );
    assert!(
        engine.split_stats().moves >= u64::from(parts),
        "the race took units from part to part (set_parts made k - 1 moves): {:?}",
        engine.split_stats()
    );
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn twenty_thousand_shoppers_on_four_parts_take_exactly_the_stock(pg: PgPool) {
    race(pg, 4).await;
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn twenty_thousand_shoppers_on_eight_parts_take_exactly_the_stock(pg: PgPool) {
    race(pg, 8).await;
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn one_buyer_cannot_pass_the_limit_by_landing_on_other_parts(pg: PgPool) {
    let (_redis, b) = setup(&pg, "SPLIT-LIMIT", 500, 2).await;
    let engine = b.engine.clone();
    engine.set_parts(&pg, "SPLIT-LIMIT", 4).await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..40 {
        let engine = engine.clone();
        tasks.spawn(async move {
            engine
                .reserve(
                    &ReserveRequest::single(format!("limit-{i}"), "SPLIT-LIMIT", 1)
                        .for_buyer("b-1"),
                )
                .await
                .unwrap()
        });
    }
    let (mut held, mut limited) = (0, 0);
    while let Some(outcome) = tasks.join_next().await {
        match outcome.unwrap() {
            ReserveOutcome::Reserved { .. } => held += 1,
            ReserveOutcome::LimitExceeded { sku, limit, .. } => {
                assert_eq!((sku.as_str(), limit), ("SPLIT-LIMIT", 2));
                limited += 1;
            }
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    assert_eq!((held, limited), (2, 38));
    // Other buyers land on other parts, each with a limit of their own.
    let mut parts = std::collections::BTreeSet::new();
    for b in 0..40 {
        let req = ReserveRequest::single(format!("other-{b}"), "SPLIT-LIMIT", 2)
            .for_buyer(format!("buyer-{b}"));
        assert!(matches!(
            engine.reserve(&req).await.unwrap(),
            ReserveOutcome::Reserved { .. }
        ));
        parts.insert(
            engine
                .hold(&req.reservation_id)
                .await
                .unwrap()
                .unwrap()
                .lines[0]
                .sku
                .clone(),
        );
    }
    assert_eq!(
        parts.len(),
        1,
        "holds show the SKU, not its parts: {parts:?}"
    );
    let f = engine.figures("SPLIT-LIMIT").await.unwrap().unwrap();
    assert_eq!(
        (f.available, f.reserved, f.per_buyer_limit),
        (500 - 82, 82, 2)
    );
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn holds_on_parts_are_confirmed_released_and_expired_like_any_other(pg: PgPool) {
    let (redis, b) = setup(&pg, "SPLIT-LIFE", 40, 0).await;
    let engine = b.engine.clone();
    engine.set_parts(&pg, "SPLIT-LIFE", 4).await.unwrap();

    let req = |id: &str, qty| ReserveRequest::single(id, "SPLIT-LIFE", qty);
    for id in ["pay", "drop", "lapse"] {
        let r = if id == "lapse" {
            req(id, 3).with_ttl_ms(1_000)
        } else {
            req(id, 3)
        };
        assert!(matches!(
            engine.reserve(&r).await.unwrap(),
            ReserveOutcome::Reserved { .. }
        ));
    }
    // A retry is the first answer; the same id for another request a conflict.
    assert!(matches!(
        engine.reserve(&req("pay", 3)).await.unwrap(),
        ReserveOutcome::AlreadyReserved {
            state: HoldState::Held,
            ..
        }
    ));
    assert!(matches!(
        engine.reserve(&req("pay", 4)).await.unwrap(),
        ReserveOutcome::Conflict { .. }
    ));
    let shown = engine.hold("pay").await.unwrap().unwrap();
    assert_eq!(
        (shown.lines[0].sku.as_str(), shown.lines[0].qty),
        ("SPLIT-LIFE", 3)
    );
    let open = engine.holds_of("SPLIT-LIFE", 10).await.unwrap();
    assert_eq!(open.len(), 3, "holds of every part: {open:?}");

    assert_eq!(
        engine.confirm("pay").await.unwrap(),
        ConfirmOutcome::Confirmed
    );
    assert_eq!(
        engine.release("drop").await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(
        engine.release("drop").await.unwrap(),
        ReleaseOutcome::AlreadyGone {
            state: HoldState::Released
        }
    );
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    let reaped = engine.reap_once(100).await.unwrap();
    assert_eq!(reaped.released, 1);
    let f = engine.figures("SPLIT-LIFE").await.unwrap().unwrap();
    assert_eq!(
        (f.available, f.reserved, f.sold_pending, f.open_holds),
        (37, 0, 3, 0)
    );

    // A second process, which never saw the split, routes the same way.
    let other = redis.engine().await;
    assert!(matches!(
        other.reserve(&req("elsewhere", 2)).await.unwrap(),
        ReserveOutcome::Reserved { .. }
    ));
    assert!(matches!(
        other.reserve(&req("pay", 3)).await.unwrap(),
        ReserveOutcome::AlreadyReserved {
            state: HoldState::Confirmed,
            ..
        }
    ));
    assert_eq!(
        other.release("elsewhere").await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(
        engine
            .figures("SPLIT-LIFE")
            .await
            .unwrap()
            .unwrap()
            .available,
        37
    );
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn sold_out_only_when_every_part_is_empty_and_a_refusal_stays_refused(pg: PgPool) {
    let (_redis, b) = setup(&pg, "SPLIT-LAST", 4, 0).await;
    let engine = b.engine.clone();
    engine.set_parts(&pg, "SPLIT-LAST", 4).await.unwrap();
    // Ids that all land on one part: the others' units must come to it.
    for i in 0..4 {
        let r = ReserveRequest::single(format!("last-{i}"), "SPLIT-LAST", 1).for_buyer("same-part");
        assert!(
            matches!(
                engine.reserve(&r).await.unwrap(),
                ReserveOutcome::Reserved { .. }
            ),
            "unit {i} was there, in another part"
        );
    }
    let refused = ReserveRequest::single("late", "SPLIT-LAST", 1);
    assert!(matches!(
        engine.reserve(&refused).await.unwrap(),
        ReserveOutcome::SoldOut { available: 0, .. }
    ));
    engine.release("last-2").await.unwrap();
    // The refused request keeps its answer; a new one gets the unit back.
    assert!(matches!(
        engine.reserve(&refused).await.unwrap(),
        ReserveOutcome::SoldOut { .. }
    ));
    assert!(matches!(
        engine
            .reserve(&ReserveRequest::single("new", "SPLIT-LAST", 1))
            .await
            .unwrap(),
        ReserveOutcome::Reserved { .. }
    ));
    let f = engine.figures("SPLIT-LAST").await.unwrap().unwrap();
    assert_eq!((f.available, f.reserved, f.moving), (0, 4, 0));
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn parts_change_only_between_drops_and_keep_every_unit(pg: PgPool) {
    let (redis, b) = setup(&pg, "SPLIT-CHANGE", 1_001, 3).await;
    let engine = b.engine.clone();
    add_sku(&pg, "COLD-SKU", 4).await;
    assert_eq!(
        engine.set_parts(&pg, "SPLIT-CHANGE", 1).await.unwrap(),
        SplitOutcome::Unchanged
    );
    assert!(matches!(
        engine.set_parts(&pg, "SPLIT-CHANGE", 0).await.unwrap(),
        SplitOutcome::Invalid(_)
    ));
    assert_eq!(
        engine.set_parts(&pg, "COLD-SKU", 4).await.unwrap(),
        SplitOutcome::NotWarmed
    );
    assert!(matches!(
        engine.set_parts(&pg, "NO-SUCH-SKU", 4).await.unwrap(),
        SplitOutcome::Invalid(_)
    ));

    let buyer = |id: &str| ReserveRequest::single(id, "SPLIT-CHANGE", 2).for_buyer("loyal");
    assert!(matches!(
        engine.reserve(&buyer("b1")).await.unwrap(),
        ReserveOutcome::Reserved { .. }
    ));
    let SplitOutcome::Refused(why) = engine.set_parts(&pg, "SPLIT-CHANGE", 4).await.unwrap() else {
        panic!("a split with a hold open");
    };
    assert!(why.contains("2 units in open holds"), "{why}");
    // Refused, nothing changed: the hold is still confirmable where it is.
    assert_eq!(
        engine.figures("SPLIT-CHANGE").await.unwrap().unwrap().parts,
        1
    );
    assert_eq!(
        engine.release("b1").await.unwrap(),
        ReleaseOutcome::Released
    );

    // The buyer bought 2 before (their count outlives their holds): it follows
    // them from part to part.
    let mut conn = redis.connection().await;
    let ks = engine.keyspace();
    redis::cmd("SET")
        .arg(ks.buyer("SPLIT-CHANGE", "loyal"))
        .arg(2)
        .arg("PX")
        .arg(600_000)
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    for (from, to) in [(1, 4), (4, 8), (8, 3), (3, 1)] {
        assert_eq!(
            engine.set_parts(&pg, "SPLIT-CHANGE", to).await.unwrap(),
            SplitOutcome::Changed { from, to }
        );
        let f = engine.figures("SPLIT-CHANGE").await.unwrap().unwrap();
        assert_eq!(
            (f.available, f.reserved, f.moving, f.parts),
            (1_001, 0, 0, to.max(1))
        );
        assert_eq!(f.per_buyer_limit, 3, "every part keeps the limit");
    }
    assert!(matches!(
        engine.reserve(&buyer("b3")).await.unwrap(),
        ReserveOutcome::LimitExceeded { already: 2, .. }
    ));
    // No part is left behind in Redis.
    for parts in [4, 8, 3] {
        for j in 1..parts {
            let exists: i64 = redis::cmd("EXISTS")
                .arg(ks.sku(&part_name("SPLIT-CHANGE", j, parts)))
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(exists, 0, "part {j}/{parts} was dropped");
        }
    }
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_transfer_cut_short_is_finished_once(pg: PgPool) {
    let (redis, b) = setup(&pg, "SPLIT-MOVE", 100, 0).await;
    let engine = b.engine.clone();
    engine.set_parts(&pg, "SPLIT-MOVE", 2).await.unwrap();
    let ks = engine.keyspace();
    let (from, to) = (part_name("SPLIT-MOVE", 1, 2), part_name("SPLIT-MOVE", 0, 2));
    // The first step of a move, and then its mover dies.
    let mut conn = redis.connection().await;
    let reply: Vec<Value> = engine
        .scripts()
        .move_units
        .key(ks.sku(&from))
        .key(ks.moves(&from))
        .key(ks.events(ks.shard_of(&from)))
        .arg("out")
        .arg("t-1")
        .arg(30)
        .arg(&from)
        .arg(&to)
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(redis::from_redis_value_ref::<i64>(&reply[1]).unwrap(), 30);
    let f = engine.figures("SPLIT-MOVE").await.unwrap().unwrap();
    assert_eq!(
        (f.available, f.moving),
        (70, 30),
        "on their way, counted as such"
    );

    assert_eq!(engine.finish_moves("SPLIT-MOVE").await.unwrap(), 1);
    assert_eq!(engine.finish_moves("SPLIT-MOVE").await.unwrap(), 0);
    let f = engine.figures("SPLIT-MOVE").await.unwrap().unwrap();
    assert_eq!((f.available, f.moving), (100, 0));
    // Delivering it again changes nothing: the target remembers it.
    let again: Vec<Value> = engine
        .scripts()
        .move_units
        .key(ks.sku(&to))
        .key(ks.moved_in(&to, "t-1"))
        .key(ks.events(ks.shard_of(&to)))
        .arg("in")
        .arg("t-1")
        .arg(30)
        .arg(&to)
        .arg(86_400_000)
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        redis::from_redis_value_ref::<String>(&again[0]).unwrap(),
        "already"
    );
    assert_eq!(
        engine
            .figures("SPLIT-MOVE")
            .await
            .unwrap()
            .unwrap()
            .available,
        100
    );
}

/// `sku`'s figures: available, moving, reserved, sold pending, owed.
async fn totals(engine: &Engine, sku: &str) -> (i64, i64, i64, i64, i64) {
    let f = engine.figures(sku).await.unwrap().unwrap();
    (f.available, f.moving, f.reserved, f.sold_pending, f.owed)
}

async fn hold(engine: &Engine, rid: &str, sku: &str, qty: i64) {
    let req = ReserveRequest::single(rid, sku, qty).for_buyer(rid);
    let outcome = engine.reserve(&req).await.unwrap();
    assert!(
        matches!(outcome, ReserveOutcome::Reserved { .. }),
        "{rid}: {outcome:?}"
    );
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_split_sku_is_rebuilt_with_its_parts_after_redis_loses_data(pg: PgPool) {
    let (redis, b) = setup(&pg, "SPLIT-LOSS", 100, 0).await;
    let engine = b.engine.clone();
    engine.set_parts(&pg, "SPLIT-LOSS", 4).await.unwrap();
    for i in 0..6 {
        hold(&engine, &format!("loss-{i}"), "SPLIT-LOSS", 2).await;
    }
    // Part 0 alone is lost (its master restarted empty): rebuilt from
    // PostgreSQL with what the other parts do not hold, never on top of it.
    let mut conn = redis.connection().await;
    redis::cmd("DEL")
        .arg(engine.keyspace().sku("SPLIT-LOSS"))
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let report = warm_all(&engine, &pg, WarmOptions::default(), |_| {})
        .await
        .unwrap();
    assert_eq!(report.warmed, 1);
    let f = engine.figures("SPLIT-LOSS").await.unwrap().unwrap();
    assert_eq!(f.parts, 4, "still split");
    assert!(f.available + f.reserved <= 100, "no unit made twice: {f:?}");
    // Everything lost: rebuilt split as PostgreSQL recorded it, every part
    // there (empty ones included), the units on part 0.
    redis::cmd("FLUSHALL")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let fresh = redis.engine().await;
    warm_all(&fresh, &pg, WarmOptions::default(), |_| {})
        .await
        .unwrap();
    let f = fresh.figures("SPLIT-LOSS").await.unwrap().unwrap();
    assert_eq!((f.available, f.reserved, f.parts), (100, 0, 4));
    for i in 0..30 {
        hold(&fresh, &format!("after-{i}"), "SPLIT-LOSS", 1).await;
    }
    assert_eq!(totals(&fresh, "SPLIT-LOSS").await, (70, 0, 30, 0, 0));
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn drift_on_one_part_is_measured_on_the_whole_and_corrected(pg: PgPool) {
    use holdfast_engine::reconcile::{ReconcileOptions, reconcile_all};
    let (_redis, b) = setup(&pg, "SPLIT-DRIFT", 80, 0).await;
    let engine = b.engine.clone();
    engine.set_parts(&pg, "SPLIT-DRIFT", 4).await.unwrap();
    hold(&engine, "d-1", "SPLIT-DRIFT", 3).await;
    let clean = reconcile_all(&engine, &pg, &ReconcileOptions::default(), |_| {})
        .await
        .unwrap();
    assert_eq!(
        clean.drifted, 0,
        "parts together agree with PostgreSQL: {clean:?}"
    );
    // Five units appear on part 2 that do not exist.
    holdfast_engine::testkit::nudge_counter(
        &engine,
        &part_name("SPLIT-DRIFT", 2, 4),
        "available",
        5,
    )
    .await;
    let run = reconcile_all(&engine, &pg, &ReconcileOptions::default(), |_| {})
        .await
        .unwrap();
    assert_eq!((run.drifted, run.corrected_down), (1, 1), "{run:?}");
    assert_eq!(totals(&engine, "SPLIT-DRIFT").await, (77, 0, 3, 0, 0));
    let again = reconcile_all(&engine, &pg, &ReconcileOptions::default(), |_| {})
        .await
        .unwrap();
    assert_eq!(again.drifted, 0);
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_feed_lowering_a_split_sku_under_open_holds_sells_nothing_it_removed(pg: PgPool) {
    use holdfast_engine::stock::{DeltaOutcome, SnapshotOutcome};
    let (_redis, b) = setup(&pg, "SPLIT-FEED", 100, 0).await;
    let engine = b.engine.clone();
    engine.set_parts(&pg, "SPLIT-FEED", 4).await.unwrap();
    // 20 units held, spread over the parts by buyer.
    for i in 0..10 {
        hold(&engine, &format!("f-{i}"), "SPLIT-FEED", 2).await;
    }
    assert_eq!(totals(&engine, "SPLIT-FEED").await, (80, 0, 20, 0, 0));
    // A receipt lands on part 0.
    assert!(matches!(
        engine
            .apply_delta("SPLIT-FEED", 10, "erp", "e-1")
            .await
            .unwrap(),
        DeltaOutcome::Applied { .. }
    ));
    assert_eq!(totals(&engine, "SPLIT-FEED").await, (90, 0, 20, 0, 0));
    // 105 damaged: the 90 available go, and 15 of the held units are owed.
    assert!(matches!(
        engine
            .apply_delta("SPLIT-FEED", -105, "erp", "e-2")
            .await
            .unwrap(),
        DeltaOutcome::Applied { .. }
    ));
    assert_eq!(totals(&engine, "SPLIT-FEED").await, (0, 0, 20, 0, 15));
    let nobody = ReserveRequest::single("too-late", "SPLIT-FEED", 1);
    assert!(matches!(
        engine.reserve(&nobody).await.unwrap(),
        ReserveOutcome::SoldOut { .. }
    ));
    // Every hold comes back: 15 pay the debt, 5 are on sale again.
    for i in 0..10 {
        engine.release(&format!("f-{i}")).await.unwrap();
    }
    assert_eq!(totals(&engine, "SPLIT-FEED").await, (5, 0, 0, 0, 0));
    // A count of 40 with 4 units held: 36 on sale.
    for i in 0..2 {
        hold(&engine, &format!("g-{i}"), "SPLIT-FEED", 2).await;
    }
    assert!(matches!(
        engine
            .apply_snapshot("SPLIT-FEED", 40, 1, "erp", "s-1")
            .await
            .unwrap(),
        SnapshotOutcome::Applied { .. }
    ));
    assert_eq!(totals(&engine, "SPLIT-FEED").await, (36, 0, 4, 0, 0));
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn sales_on_parts_are_recorded_under_their_sku(pg: PgPool) {
    use holdfast_engine::record::{WriteBehind, WriteBehindConfig, WriteBehindStats};
    let (redis, b) = setup(&pg, "SPLIT-SOLD", 50, 0).await;
    let engine = b.engine.clone();
    engine.set_parts(&pg, "SPLIT-SOLD", 4).await.unwrap();
    for i in 0..8 {
        hold(&engine, &format!("s-{i}"), "SPLIT-SOLD", 1).await;
        assert_eq!(
            engine.confirm(&format!("s-{i}")).await.unwrap(),
            ConfirmOutcome::Confirmed
        );
    }
    let mut writer = WriteBehind::new(
        engine.clone(),
        pg.clone(),
        redis.connection().await,
        WriteBehindConfig {
            consumer: "split".into(),
            block: std::time::Duration::from_millis(20),
            ..WriteBehindConfig::default()
        },
        Arc::new(WriteBehindStats::default()),
    );
    for _ in 0..50 {
        writer.run_once().await.unwrap();
        if engine.write_behind_lag().await.unwrap().entries == 0 {
            break;
        }
    }
    let (on_hand, sold): (i64, i64) =
        sqlx::query_as("SELECT on_hand, sold_recorded FROM skus WHERE sku = 'SPLIT-SOLD'")
            .fetch_one(&pg)
            .await
            .unwrap();
    assert_eq!((on_hand, sold), (42, 8));
    let lines: i64 =
        sqlx::query_scalar("SELECT count(*) FROM order_lines WHERE sku = 'SPLIT-SOLD'")
            .fetch_one(&pg)
            .await
            .unwrap();
    assert_eq!(lines, 8);
    assert_eq!(
        totals(&engine, "SPLIT-SOLD").await,
        (42, 0, 0, 0, 0),
        "settled on every part"
    );
    let report = holdfast_engine::verify::verify(&engine, &pg, &Default::default())
        .await
        .unwrap();
    assert!(report.passed(), "{:?} {:?}", report.checks, report.skus);
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn rebalancing_evens_out_parts_while_stock_is_plentiful(pg: PgPool) {
    let (_redis, b) = setup(&pg, "SPLIT-EVEN", 400, 0).await;
    let engine = b.engine.clone();
    engine.set_parts(&pg, "SPLIT-EVEN", 4).await.unwrap();
    let spread =
        |parts: &[holdfast_engine::Figures]| parts.iter().map(|f| f.available).collect::<Vec<_>>();
    assert_eq!(
        spread(&engine.part_figures("SPLIT-EVEN").await.unwrap()),
        [100; 4]
    );
    // One buyer's part sells 150 (gathering from the others on the way).
    for i in 0..150 {
        let r = ReserveRequest::single(format!("even-{i}"), "SPLIT-EVEN", 1).for_buyer("one-part");
        assert!(matches!(
            engine.reserve(&r).await.unwrap(),
            ReserveOutcome::Reserved { .. }
        ));
    }
    assert_eq!(totals(&engine, "SPLIT-EVEN").await, (250, 0, 150, 0, 0));
    let moved = engine.rebalance("SPLIT-EVEN").await.unwrap();
    let after = spread(&engine.part_figures("SPLIT-EVEN").await.unwrap());
    assert_eq!(
        after.iter().sum::<i64>(),
        250,
        "nothing made or lost: {after:?}"
    );
    assert!(
        after.iter().all(|a| *a * 2 >= 250 / 4),
        "{after:?} after moving {moved}"
    );
    assert_eq!(
        engine.rebalance("SPLIT-EVEN").await.unwrap(),
        0,
        "even: nothing to move"
    );
    assert_eq!(
        Engine::split_skus(&pg).await.unwrap(),
        vec!["SPLIT-EVEN".to_owned()]
    );
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_cart_with_a_split_sku_gathers_and_is_one_unit(pg: PgPool) {
    let (_redis, b) = setup(&pg, "SPLIT-CART", 8, 0).await;
    let engine = b.engine.clone();
    // Another SKU in a shard none of the parts is in: the cart spans shards.
    let ks = engine.keyspace();
    let taken: Vec<u16> = (0..4)
        .map(|j| ks.shard_of(&part_name("SPLIT-CART", j, 4)))
        .collect();
    let other = (0..)
        .map(|i| format!("CART-OTHER-{i}"))
        .find(|s| !taken.contains(&ks.shard_of(s)))
        .unwrap();
    add_sku(&pg, &other, 5).await;
    warm_all(&engine, &pg, WarmOptions::default(), |_| {})
        .await
        .unwrap();
    engine.set_parts(&pg, "SPLIT-CART", 4).await.unwrap();
    let cart = |id: &str, qty: i64| ReserveRequest {
        reservation_id: id.to_owned(),
        lines: vec![
            holdfast_engine::Line {
                sku: "SPLIT-CART".into(),
                qty,
            },
            holdfast_engine::Line {
                sku: other.clone(),
                qty: 1,
            },
        ],
        buyer: Some("cart-buyer".into()),
        ttl_ms: None,
    };
    // 5 of 8 units: more than the buyer's part has (2), gathered from the others.
    let got = engine.reserve(&cart("cart-1", 5)).await.unwrap();
    assert!(matches!(got, ReserveOutcome::Reserved { .. }), "{got:?}");
    assert!(matches!(
        engine.reserve(&cart("cart-1", 5)).await.unwrap(),
        ReserveOutcome::AlreadyReserved { .. }
    ));
    let shown = engine.hold("cart-1").await.unwrap().unwrap();
    let mut skus: Vec<&str> = shown.lines.iter().map(|l| l.sku.as_str()).collect();
    skus.sort_unstable();
    let mut want = vec![other.as_str(), "SPLIT-CART"];
    want.sort_unstable();
    assert_eq!(skus, want, "the cart shows SKUs, not parts");
    // 4 more: only 3 left in all the parts together; nothing of the cart is held.
    let got = engine.reserve(&cart("cart-2", 4)).await.unwrap();
    assert!(
        matches!(&got, ReserveOutcome::SoldOut { sku, .. } if sku == "SPLIT-CART"),
        "{got:?}"
    );
    assert_eq!(totals(&engine, "SPLIT-CART").await, (3, 0, 5, 0, 0));
    assert_eq!(engine.figures(&other).await.unwrap().unwrap().available, 4);
    let report = holdfast_engine::verify::verify(&engine, &pg, &Default::default())
        .await
        .unwrap();
    assert!(report.passed(), "{:?} {:?}", report.checks, report.skus);
    assert_eq!(
        engine.confirm("cart-1").await.unwrap(),
        ConfirmOutcome::Confirmed
    );
    assert_eq!(totals(&engine, "SPLIT-CART").await, (3, 0, 0, 5, 0));
}

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn live_events_show_the_whole_sku_not_a_part(pg: PgPool) {
    use holdfast_engine::events::EventReader;
    let (redis, b) = setup(&pg, "SPLIT-LIVE", 60, 0).await;
    let engine = b.engine.clone();
    engine.set_parts(&pg, "SPLIT-LIVE", 4).await.unwrap();
    // A reader started after the split, as a server's live feed would be.
    let mut reader = EventReader::new(redis.connection().await, engine.keyspace());
    let mut cursor = reader.tail_cursor().await.unwrap();
    for i in 0..12 {
        hold(&engine, &format!("live-{i}"), "SPLIT-LIVE", 2).await;
    }
    engine.release("live-3").await.unwrap();
    engine.confirm("live-4").await.unwrap();
    let mut events = Vec::new();
    for _ in 0..20 {
        events.extend(
            reader
                .read(
                    &mut cursor,
                    1_000,
                    Some(std::time::Duration::from_millis(50)),
                )
                .await
                .unwrap(),
        );
        if events.len() >= 14 {
            break;
        }
    }
    assert_eq!(
        events.len(),
        14,
        "12 holds, a release, a confirm: {events:?}"
    );
    assert!(
        events.iter().all(|e| e.sku == "SPLIT-LIVE"),
        "every event names the SKU: {events:?}"
    );
    // Each event's figures are every part's together: the last ones are the
    // SKU's figures now, whatever part moved last.
    let f = engine.figures("SPLIT-LIVE").await.unwrap().unwrap();
    let last = events.last().unwrap();
    assert_eq!(
        (last.available, last.reserved, last.sold_pending),
        (Some(f.available), Some(f.reserved), Some(f.sold_pending))
    );
    assert_eq!((f.available, f.reserved, f.sold_pending), (38, 20, 2));
    // Holds shown for support name the SKU too.
    let recent = holdfast_engine::events::recent_for_sku(&engine, "SPLIT-LIVE", 50, 1_000)
        .await
        .unwrap();
    assert!(
        recent.len() >= 14,
        "the SKU page's events come from every part's shard"
    );
}
