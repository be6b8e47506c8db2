//! Split SKUs: one SKU's stock in parts on several shards. Exactly the stock
//! is sold, never a negative part, never "sold out" while the SKU as a whole
//! has the units, one buyer's limit over every part, and holds on parts
//! confirmed, released and expired like any other.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use holdfast_engine::keys::{base_sku, parse_part, part_name};
use holdfast_engine::testkit::{TestRedis, stock, stock_with_limit};
use holdfast_engine::{
    ConfirmOutcome, Engine, HoldState, ReleaseOutcome, ReserveOutcome, ReserveRequest, SplitOutcome,
};
use redis::Value;

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

async fn race(parts: u16) {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let sku = format!("SPLIT-RACE-{parts}");
    stock(&engine, &sku, 2_000).await;
    assert_eq!(
        engine.set_parts(&sku, parts).await.unwrap(),
        SplitOutcome::Changed { from: 1, to: parts }
    );
    let f = engine.figures(&sku).await.unwrap().unwrap();
    assert_eq!((f.available, f.parts, f.moving), (2_000, parts, 0));

    let shoppers = 20_000;
    let gate = Arc::new(tokio::sync::Semaphore::new(400));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..shoppers {
        let (engine, gate, sku) = (engine.clone(), gate.clone(), sku.clone());
        tasks.spawn(async move {
            let _permit = gate.acquire().await.unwrap();
            let started = chrono::Utc::now().timestamp_millis();
            let outcome = engine
                .reserve(&ReserveRequest::single(
                    format!("race-{parts}-{i}"),
                    &sku,
                    1,
                ))
                .await;
            (started, chrono::Utc::now().timestamp_millis(), outcome)
        });
    }
    let (mut held, mut refusals, mut busy) = (0, Vec::new(), 0);
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
        "split {parts}: {held} held, {} sold out, {busy} busy, {} events",
        refusals.len(),
        timeline.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_thousand_shoppers_on_four_parts_take_exactly_the_stock() {
    race(4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_thousand_shoppers_on_eight_parts_take_exactly_the_stock() {
    race(8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_buyer_cannot_pass_the_limit_by_landing_on_other_parts() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    stock_with_limit(&engine, "SPLIT-LIMIT", 500, 2).await;
    engine.set_parts("SPLIT-LIMIT", 4).await.unwrap();
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

#[tokio::test]
async fn holds_on_parts_are_confirmed_released_and_expired_like_any_other() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    stock(&engine, "SPLIT-LIFE", 40).await;
    engine.set_parts("SPLIT-LIFE", 4).await.unwrap();

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

#[tokio::test]
async fn sold_out_only_when_every_part_is_empty_and_a_refusal_stays_refused() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    stock(&engine, "SPLIT-LAST", 4).await;
    engine.set_parts("SPLIT-LAST", 4).await.unwrap();
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

#[tokio::test]
async fn parts_change_only_between_drops_and_keep_every_unit() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    stock_with_limit(&engine, "SPLIT-CHANGE", 1_001, 3).await;
    assert_eq!(
        engine.set_parts("SPLIT-CHANGE", 1).await.unwrap(),
        SplitOutcome::Unchanged
    );
    assert!(matches!(
        engine.set_parts("SPLIT-CHANGE", 0).await.unwrap(),
        SplitOutcome::Invalid(_)
    ));
    assert_eq!(
        engine.set_parts("NO-SUCH-SKU", 4).await.unwrap(),
        SplitOutcome::NotWarmed
    );

    let buyer = |id: &str| ReserveRequest::single(id, "SPLIT-CHANGE", 2).for_buyer("loyal");
    assert!(matches!(
        engine.reserve(&buyer("b1")).await.unwrap(),
        ReserveOutcome::Reserved { .. }
    ));
    let SplitOutcome::Refused(why) = engine.set_parts("SPLIT-CHANGE", 4).await.unwrap() else {
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
            engine.set_parts("SPLIT-CHANGE", to).await.unwrap(),
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

#[tokio::test]
async fn a_transfer_cut_short_is_finished_once() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    stock(&engine, "SPLIT-MOVE", 100).await;
    engine.set_parts("SPLIT-MOVE", 2).await.unwrap();
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
