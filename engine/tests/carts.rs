//! A cart is all or nothing across shards: one deadline, the reaper never ends
//! part of a cart alone, confirm sells every line or none, any failure part-way
//! undoes what was done, a retry answers the same, conflicts are seen in every
//! shard. Faults are injected between shards; a randomized run mixes carts with
//! the other operations and checks conservation.

use std::collections::HashSet;
use std::time::Duration;

use holdfast_engine::testkit::{TestRedis, stock};
use holdfast_engine::{
    ConfirmOutcome, Engine, HoldState, Line, ReleaseOutcome, ReserveOutcome, ReserveRequest,
};

/// Three SKUs in three different shards.
fn three_shards(engine: &Engine) -> [String; 3] {
    let ks = engine.keyspace();
    let mut seen = HashSet::new();
    let picked: Vec<String> = (0..)
        .map(|i| format!("CRT-{i}"))
        .filter(|s| seen.insert(ks.shard_of(s)))
        .take(3)
        .collect();
    [picked[0].clone(), picked[1].clone(), picked[2].clone()]
}

fn cart(rid: &str, skus: &[&str], qty: i64) -> ReserveRequest {
    ReserveRequest {
        reservation_id: rid.into(),
        lines: skus
            .iter()
            .map(|s| Line {
                sku: (*s).into(),
                qty,
            })
            .collect(),
        buyer: None,
        ttl_ms: Some(1_000),
    }
}

async fn figures(engine: &Engine, sku: &str) -> (i64, i64, i64) {
    let f = engine.figures(sku).await.unwrap().unwrap();
    (f.available, f.reserved, f.sold_pending)
}

/// `script` invoked on the part of `rid` in `sku`'s shard: its keys (hold,
/// due set, stream, then the line's counter, holds and buyer counter), for
/// the caller's arguments.
fn on_part<'a>(
    script: &'a redis::Script,
    engine: &Engine,
    rid: &str,
    sku: &str,
) -> redis::ScriptInvocation<'a> {
    let ks = engine.keyspace();
    let shard = ks.shard_of(sku);
    let mut inv = script.prepare_invoke();
    inv.key(ks.hold(shard, rid))
        .key(ks.due(shard))
        .key(ks.events(shard))
        .key(ks.sku(sku))
        .key(ks.sku_holds(sku))
        .key(ks.buyer(sku, ""));
    inv
}

/// Runs `lua/confirm.lua` in `mode` on the part of `rid` in `sku`'s shard, as a
/// confirmer that then dies would leave it.
async fn confirm_part(redis: &TestRedis, engine: &Engine, rid: &str, sku: &str, mode: &str) {
    let script = redis::Script::new(include_str!("../../lua/confirm.lua"));
    let mut inv = on_part(&script, engine, rid, sku);
    inv.arg(rid).arg(86_400_000).arg(mode).arg(sku);
    let _: redis::Value = inv
        .invoke_async(&mut redis.connection().await)
        .await
        .unwrap();
}

#[tokio::test]
async fn every_part_shares_one_deadline_and_expires_together() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let [a, b, c] = three_shards(&engine);
    for sku in [&a, &b, &c] {
        stock(&engine, sku, 5).await;
    }
    let ReserveOutcome::Reserved { expires_at_ms, .. } = engine
        .reserve(&cart("c-1", &[&a, &b, &c], 1))
        .await
        .unwrap()
    else {
        panic!("reserved");
    };
    let ks = engine.keyspace();
    let mut conn = redis.connection().await;
    for sku in [&a, &b, &c] {
        let deadline: i64 = redis::cmd("HGET")
            .arg(ks.hold(ks.shard_of(sku), "c-1"))
            .arg("deadline")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(deadline, expires_at_ms, "{sku}'s part ends with the cart");
    }
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let report = engine.reap_once(100).await.unwrap();
    assert_eq!(report.released, 3, "{report:?}");
    for sku in [&a, &b, &c] {
        assert_eq!(figures(&engine, sku).await, (5, 0, 0), "{sku}");
    }
    assert_eq!(
        engine.confirm("c-1").await.unwrap(),
        ConfirmOutcome::Expired {
            state: HoldState::Expired
        }
    );
    for sku in [&a, &b, &c] {
        assert_eq!(
            figures(&engine, sku).await,
            (5, 0, 0),
            "nothing sold of {sku}"
        );
    }
}

#[tokio::test]
async fn a_part_ended_behind_the_engines_back_sells_nothing() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let [a, b, _] = three_shards(&engine);
    stock(&engine, &a, 5).await;
    stock(&engine, &b, 5).await;
    engine.reserve(&cart("c-2", &[&a, &b], 1)).await.unwrap();
    // The sequence that sold half a cart before: one part released on its own.
    let ks = engine.keyspace();
    let shard = ks.shard_of(&b);
    let release = redis::Script::new(include_str!("../../lua/release.lua"));
    let _: redis::Value = release
        .key(ks.hold(shard, "c-2"))
        .key(ks.due(shard))
        .key(ks.events(shard))
        .key(ks.sku(&b))
        .key(ks.sku_holds(&b))
        .key(ks.buyer(&b, ""))
        .arg("c-2")
        .arg("released")
        .arg(86_400_000)
        .arg(&b)
        .invoke_async(&mut redis.connection().await)
        .await
        .unwrap();
    let outcome = engine.confirm("c-2").await.unwrap();
    assert!(
        matches!(outcome, ConfirmOutcome::Expired { .. }),
        "{outcome:?}"
    );
    assert_eq!(figures(&engine, &a).await.2, 0, "no part sold alone");
    assert_eq!(figures(&engine, &b).await.2, 0);
}

#[tokio::test]
async fn a_failure_between_shards_undoes_the_parts_made_and_a_retry_answers_the_same() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let [a, b, c] = three_shards(&engine);
    stock(&engine, &a, 5).await;
    stock(&engine, &b, 0).await;
    stock(&engine, &c, 5).await;
    for attempt in 0..2 {
        let outcome = engine
            .reserve(&cart("c-3", &[&a, &c, &b], 2))
            .await
            .unwrap();
        assert!(
            matches!(&outcome, ReserveOutcome::SoldOut { sku, .. } if *sku == b),
            "attempt {attempt}: {outcome:?}"
        );
        assert_eq!(figures(&engine, &a).await, (5, 0, 0), "attempt {attempt}");
        assert_eq!(figures(&engine, &c).await, (5, 0, 0), "attempt {attempt}");
    }
    assert_eq!(
        engine.hold("c-3").await.unwrap(),
        None,
        "the id is free again"
    );

    // A transport-level failure on a later shard (a counter that is not a hash
    // makes that shard's script fail) undoes the earlier parts too.
    let ks = engine.keyspace();
    let mut conn = redis.connection().await;
    redis::cmd("DEL")
        .arg(ks.sku(&b))
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    redis::cmd("SET")
        .arg(ks.sku(&b))
        .arg("not a hash")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let failed = engine.reserve(&cart("c-4", &[&a, &c, &b], 1)).await;
    assert!(failed.is_err(), "{failed:?}");
    assert_eq!(figures(&engine, &a).await, (5, 0, 0));
    assert_eq!(figures(&engine, &c).await, (5, 0, 0));
    assert_eq!(engine.hold("c-4").await.unwrap(), None);
}

#[tokio::test]
async fn a_retry_completes_the_cart_and_conflicts_are_seen_in_every_shard() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let [a, b, c] = three_shards(&engine);
    for sku in [&a, &b, &c] {
        stock(&engine, sku, 5).await;
    }
    let first = engine.reserve(&cart("c-5", &[&a, &b], 1)).await.unwrap();
    assert!(matches!(first, ReserveOutcome::Reserved { .. }));
    let again = engine.reserve(&cart("c-5", &[&a, &b], 1)).await.unwrap();
    assert!(
        matches!(again, ReserveOutcome::AlreadyReserved { .. }),
        "{again:?}"
    );
    assert_eq!(figures(&engine, &a).await, (4, 1, 0), "nothing held twice");

    // The same id for another request, in other shards: a conflict.
    let other = engine.reserve(&cart("c-5", &[&c, &b], 1)).await.unwrap();
    assert!(
        matches!(other, ReserveOutcome::Conflict { .. }),
        "{other:?}"
    );
    let single = engine
        .reserve(&ReserveRequest::single("c-6", &c, 1))
        .await
        .unwrap();
    assert!(matches!(single, ReserveOutcome::Reserved { .. }));
    let cart_over_it = engine.reserve(&cart("c-6", &[&a, &b], 1)).await.unwrap();
    assert!(
        matches!(cart_over_it, ReserveOutcome::Conflict { .. }),
        "{cart_over_it:?}"
    );
    assert_eq!(figures(&engine, &c).await, (4, 1, 0));
    // A one-SKU hold with a cart's id, in a shard the cart is not in.
    let single_over_cart = engine
        .reserve(&ReserveRequest::single("c-5", &c, 1))
        .await
        .unwrap();
    assert!(
        matches!(single_over_cart, ReserveOutcome::Conflict { .. }),
        "{single_over_cart:?}"
    );
    assert_eq!(figures(&engine, &c).await, (4, 1, 0), "undone");
    // After Redis forgot its scripts (a restart), the pipelined path reloads them.
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async::<()>(&mut redis.connection().await)
        .await
        .unwrap();
    let after_flush = engine
        .reserve(&ReserveRequest::single("c-12", &c, 1))
        .await
        .unwrap();
    assert!(
        matches!(after_flush, ReserveOutcome::Reserved { .. }),
        "{after_flush:?}"
    );
}

#[tokio::test]
async fn confirm_sells_every_line_or_none_and_release_waits_for_it() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let [a, b, _] = three_shards(&engine);
    stock(&engine, &a, 5).await;
    stock(&engine, &b, 5).await;
    engine.reserve(&cart("c-7", &[&a, &b], 2)).await.unwrap();
    assert_eq!(
        engine.confirm("c-7").await.unwrap(),
        ConfirmOutcome::Confirmed
    );
    assert_eq!(figures(&engine, &a).await, (3, 0, 2));
    assert_eq!(figures(&engine, &b).await, (3, 0, 2));
    assert_eq!(
        engine.confirm("c-7").await.unwrap(),
        ConfirmOutcome::AlreadyConfirmed
    );
    assert_eq!(
        engine.release("c-7").await.unwrap(),
        ReleaseOutcome::AlreadyGone {
            state: HoldState::Confirmed
        }
    );

    // A confirmer that prepared one part and died: release refuses to split it,
    // a retried confirm finishes it.
    engine.reserve(&cart("c-8", &[&a, &b], 1)).await.unwrap();
    confirm_part(&redis, &engine, "c-8", &a, "prepare").await;
    assert!(engine.release("c-8").await.is_err(), "busy while deciding");
    assert_eq!(
        engine.confirm("c-8").await.unwrap(),
        ConfirmOutcome::Confirmed
    );
    assert_eq!(figures(&engine, &a).await, (2, 0, 3));
    assert_eq!(figures(&engine, &b).await, (2, 0, 3));
}

#[tokio::test]
async fn the_reaper_finishes_what_the_home_part_decided() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let [a, b, _] = three_shards(&engine);
    stock(&engine, &a, 5).await;
    stock(&engine, &b, 5).await;
    let ks = engine.keyspace();
    // The home part is the one in the shard of the cart's first line.
    let (home, other) = (a.clone(), b.clone());
    let mut conn = redis.connection().await;
    let age = |rid: &'static str, sku: String| {
        let key = ks.hold(ks.shard_of(&sku), rid);
        redis::cmd("HSET")
            .arg(key)
            .arg("preparing")
            .arg(chrono::Utc::now().timestamp_millis() - 60_000)
            .clone()
    };

    // Died after committing the home part: the cart is sold.
    engine.reserve(&cart("c-9", &[&a, &b], 1)).await.unwrap();
    confirm_part(&redis, &engine, "c-9", &home, "prepare").await;
    confirm_part(&redis, &engine, "c-9", &other, "prepare").await;
    confirm_part(&redis, &engine, "c-9", &home, "commit").await;
    age("c-9", other.clone())
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    // Died before committing anything: the cart expires whole.
    engine.reserve(&cart("c-10", &[&a, &b], 1)).await.unwrap();
    confirm_part(&redis, &engine, "c-10", &other, "prepare").await;
    age("c-10", other.clone())
        .query_async::<()>(&mut conn)
        .await
        .unwrap();

    tokio::time::sleep(Duration::from_millis(1_100)).await;
    engine.reap_once(100).await.unwrap();
    assert_eq!(
        engine.hold("c-9").await.unwrap().unwrap().state,
        HoldState::Confirmed
    );
    assert_eq!(
        engine.confirm("c-9").await.unwrap(),
        ConfirmOutcome::AlreadyConfirmed,
        "every part sold"
    );
    assert!(matches!(
        engine.confirm("c-10").await.unwrap(),
        ConfirmOutcome::Expired { .. }
    ));
    // c-9 sold one of each; c-10 sold nothing and returned its units.
    assert_eq!(figures(&engine, &a).await, (4, 0, 1));
    assert_eq!(figures(&engine, &b).await, (4, 0, 1));
}

#[tokio::test]
async fn mixed_carts_and_operations_keep_every_unit_accounted_for() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let skus = three_shards(&engine);
    for sku in &skus {
        stock(&engine, sku, 40).await;
    }
    let mut tasks = Vec::new();
    for worker in 0..6u64 {
        let engine = engine.clone();
        let skus = skus.clone();
        tasks.push(tokio::spawn(async move {
            // A small xorshift: reproducible per worker, no extra dependency.
            let mut state = worker * 2_654_435_761 + 1;
            let mut next = move |bound: u64| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state % bound
            };
            for i in 0..25 {
                let rid = format!("w{worker}-{i}");
                let n = 1 + next(3) as usize;
                let lines: Vec<&str> = skus.iter().take(n).map(String::as_str).collect();
                let _ = engine.reserve(&cart(&rid, &lines, 1)).await;
                match next(4) {
                    0 => {
                        let _ = engine.confirm(&rid).await;
                    }
                    1 => {
                        let _ = engine.release(&rid).await;
                    }
                    2 => {
                        // Pay right at the deadline, racing the reaper.
                        tokio::time::sleep(Duration::from_millis(900 + next(200))).await;
                        let _ = engine.confirm(&rid).await;
                    }
                    _ => {} // abandoned: the reaper ends it
                }
            }
        }));
    }
    let reaper = {
        let engine = engine.clone();
        tokio::spawn(async move {
            for _ in 0..80 {
                let _ = engine.reap_once(50).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    for t in tasks {
        t.await.unwrap();
    }
    reaper.await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    engine.reap_once(1_000).await.unwrap();

    // Every cart's parts agree, and every unit is available or sold.
    for worker in 0..6u64 {
        for i in 0..25 {
            let rid = format!("w{worker}-{i}");
            let ks = engine.keyspace();
            let mut conn = engine.connection();
            let mut states = HashSet::new();
            for sku in &skus {
                let state: Option<String> = redis::cmd("HGET")
                    .arg(ks.hold(ks.shard_of(sku), &rid))
                    .arg("state")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                if let Some(s) = state {
                    states.insert(s);
                }
            }
            assert!(states.len() <= 1, "{rid}: parts disagree: {states:?}");
        }
    }
    let mut sold = Vec::new();
    for sku in &skus {
        let f = engine.figures(sku).await.unwrap().unwrap();
        assert_eq!(f.reserved, 0, "{sku}: every hold ended");
        assert!(f.available >= 0);
        assert_eq!(f.available + f.sold_pending, 40, "{sku}: conserved");
        sold.push(f.sold);
    }
    // A line of a cart is sold only with the lines before it.
    assert!(sold[0] >= sold[1] && sold[1] >= sold[2], "{sold:?}");
}

#[tokio::test]
async fn a_stale_confirmer_is_rolled_back_whole_and_cannot_sell_half() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let [a, b, _] = three_shards(&engine);
    stock(&engine, &a, 5).await;
    stock(&engine, &b, 5).await;
    engine.reserve(&cart("c-11", &[&a, &b], 1)).await.unwrap();
    // A confirmer prepared both parts and stalled.
    confirm_part(&redis, &engine, "c-11", &a, "prepare").await;
    confirm_part(&redis, &engine, "c-11", &b, "prepare").await;
    let ks = engine.keyspace();
    let mut conn = redis.connection().await;
    for sku in [&a, &b] {
        redis::cmd("HSET")
            .arg(ks.hold(ks.shard_of(sku), "c-11"))
            .arg("preparing")
            .arg(chrono::Utc::now().timestamp_millis() - 60_000)
            .query_async::<()>(&mut conn)
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    engine.reap_once(100).await.unwrap();
    // The stalled confirmer wakes and commits: the home part is no longer
    // confirming, so nothing is sold.
    confirm_part(&redis, &engine, "c-11", &b, "commit").await;
    assert!(matches!(
        engine.confirm("c-11").await.unwrap(),
        ConfirmOutcome::Expired { .. }
    ));
    assert_eq!(figures(&engine, &a).await, (5, 0, 0));
    assert_eq!(figures(&engine, &b).await, (5, 0, 0));
}

/// A caller that stops waiting part-way (an API deadline during a failover)
/// never leaves a cart half made: the cart runs to its end on its own, whole
/// or undone, whenever the caller gives up.
#[tokio::test]
async fn a_cart_whose_caller_gives_up_is_whole_or_undone() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let skus = three_shards(&engine);
    for sku in &skus {
        stock(&engine, sku, 1_000).await;
    }
    let names: Vec<&str> = skus.iter().map(String::as_str).collect();
    for i in 0..40u64 {
        let rid = format!("gave-up-{i}");
        let _ = tokio::time::timeout(
            Duration::from_micros(i * 100),
            engine.reserve(&cart(&rid, &names, 1)),
        )
        .await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ks = engine.keyspace();
    let mut conn = redis.connection().await;
    let mut whole = 0;
    for i in 0..40u64 {
        let rid = format!("gave-up-{i}");
        let mut parts = 0;
        for sku in &skus {
            let exists: bool = redis::cmd("EXISTS")
                .arg(ks.hold(ks.shard_of(sku), &rid))
                .query_async(&mut conn)
                .await
                .unwrap();
            parts += usize::from(exists);
        }
        assert!(parts == 0 || parts == 3, "{rid}: {parts} of 3 parts");
        whole += usize::from(parts == 3);
    }
    let held: i64 = figures(&engine, &skus[0]).await.1;
    assert_eq!(held, whole as i64, "each whole cart holds one unit of each");
}

/// Takes back the part of cart `rid` in `sku`'s shard (`release.lua`'s undo),
/// as an attempt whose undo was cut short between parts leaves a cart: part
/// made, units conserved.
async fn undo_part(redis: &TestRedis, engine: &Engine, rid: &str, sku: &str) {
    let script = redis::Script::new(include_str!("../../lua/release.lua"));
    let mut inv = on_part(&script, engine, rid, sku);
    inv.arg(rid).arg("undo").arg(86_400_000).arg(sku);
    let reply: Vec<redis::Value> = inv
        .invoke_async(&mut redis.connection().await)
        .await
        .unwrap();
    assert_eq!(
        reply.first(),
        Some(&redis::Value::BulkString(b"released".to_vec()))
    );
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[tokio::test]
async fn a_retry_is_the_same_cart_whatever_the_order_of_its_lines() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let [a, b, _] = three_shards(&engine);
    stock(&engine, &a, 5).await;
    stock(&engine, &b, 5).await;
    let ReserveOutcome::Reserved {
        expires_at_ms,
        mut available_after,
        ..
    } = engine.reserve(&cart("o-1", &[&a, &b], 2)).await.unwrap()
    else {
        panic!("not reserved")
    };
    available_after.sort();
    match engine.reserve(&cart("o-1", &[&b, &a], 2)).await.unwrap() {
        ReserveOutcome::AlreadyReserved {
            expires_at_ms: again,
            available_after: mut after,
            ..
        } => {
            after.sort();
            assert_eq!(
                (again, after),
                (expires_at_ms, available_after),
                "the first answer"
            );
        }
        other => panic!("{other:?}"),
    }
    // Part-made (an undo cut short), then retried in the other order: made whole.
    engine.reserve(&cart("o-2", &[&a, &b], 1)).await.unwrap();
    undo_part(&redis, &engine, "o-2", &b).await;
    let again = engine.reserve(&cart("o-2", &[&b, &a], 1)).await.unwrap();
    assert!(
        matches!(again, ReserveOutcome::Reserved { .. }),
        "{again:?}"
    );
    let hold = engine.hold("o-2").await.unwrap().unwrap();
    assert_eq!(hold.lines.len(), 2, "{hold:?}");
    assert_eq!(figures(&engine, &a).await, (2, 3, 0));
    assert_eq!(figures(&engine, &b).await, (2, 3, 0));
    assert_eq!(
        engine.confirm("o-2").await.unwrap(),
        ConfirmOutcome::Confirmed
    );
}

#[tokio::test]
async fn a_retry_never_adds_a_part_to_a_cart_whose_deadline_has_passed() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let [a, b, _] = three_shards(&engine);
    stock(&engine, &a, 5).await;
    stock(&engine, &b, 5).await;
    // Two carts part-made, 1 s holds; one is then expired whole by the reaper,
    // the other only past its deadline.
    for rid in ["d-1", "d-2"] {
        engine.reserve(&cart(rid, &[&a, &b], 1)).await.unwrap();
        undo_part(&redis, &engine, rid, &b).await;
    }
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let mut conn = redis.connection().await;
    let ks = engine.keyspace();
    redis::cmd("ZREM")
        .arg(ks.due(ks.shard_of(&a)))
        .arg("d-2")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    engine.reap_once(100).await.unwrap();
    assert_eq!(
        figures(&engine, &a).await,
        (4, 1, 0),
        "d-1 expired, d-2 not reaped"
    );
    for rid in ["d-1", "d-2"] {
        match engine.reserve(&cart(rid, &[&a, &b], 1)).await.unwrap() {
            ReserveOutcome::Reserved { expires_at_ms, .. } => {
                assert!(expires_at_ms > now_ms() + 500, "{rid}: a fresh deadline");
            }
            other => panic!("{rid}: {other:?}"),
        }
        let hold = engine.hold(rid).await.unwrap().unwrap();
        assert_eq!(
            (hold.state, hold.lines.len()),
            (HoldState::Held, 2),
            "{rid}"
        );
    }
    assert_eq!(figures(&engine, &a).await, (3, 2, 0), "one unit each, once");
    assert_eq!(figures(&engine, &b).await, (3, 2, 0));

    // The script itself refuses a part whose deadline has passed, writing nothing.
    let shard = ks.shard_of(&b);
    let script = redis::Script::new(include_str!("../../lua/reserve.lua"));
    let mut inv = on_part(&script, &engine, "d-3", &b);
    inv.arg("d-3")
        .arg(1_000)
        .arg("")
        .arg("fp")
        .arg(1_000)
        .arg(now_ms() - 10)
        .arg(format!("{},{shard}", ks.shard_of(&a)))
        .arg(86_400_000)
        .arg(&b)
        .arg(1);
    let reply: Vec<redis::Value> = inv.invoke_async(&mut conn).await.unwrap();
    assert_eq!(
        reply.first(),
        Some(&redis::Value::BulkString(b"lapsed".to_vec()))
    );
    let exists: bool = redis::cmd("EXISTS")
        .arg(ks.hold(shard, "d-3"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!exists);
    assert_eq!(figures(&engine, &b).await, (3, 2, 0));
}

#[tokio::test]
async fn one_attempt_at_a_time_builds_a_cart() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let skus = three_shards(&engine);
    for sku in &skus {
        stock(&engine, sku, 1_000).await;
    }
    let names: Vec<&str> = skus.iter().map(String::as_str).collect();
    let ks = engine.keyspace();
    let mut conn = redis.connection().await;

    // While another attempt holds the lease: busy, nothing written.
    redis::cmd("SET")
        .arg(ks.cart_build("one-1"))
        .arg("another")
        .arg("PX")
        .arg(60_000)
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let busy = engine.reserve(&cart("one-1", &names, 1)).await;
    assert!(
        matches!(busy, Err(holdfast_engine::EngineError::Busy(_))),
        "{busy:?}"
    );
    assert_eq!(figures(&engine, &skus[0]).await, (1_000, 0, 0));
    redis::cmd("DEL")
        .arg(ks.cart_build("one-1"))
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let made = engine.reserve(&cart("one-1", &names, 1)).await.unwrap();
    assert!(matches!(made, ReserveOutcome::Reserved { .. }), "{made:?}");
    let lease: bool = redis::cmd("EXISTS")
        .arg(ks.cart_build("one-1"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!lease, "given back when the attempt ends");

    // Copies of one request at once: every copy answered "held" answers for a
    // whole cart, and each cart holds its units once.
    let mut whole = 1;
    for i in 0..20 {
        let rid = format!("copies-{i}");
        let copies = (0..8).map(|_| {
            let engine = engine.clone();
            let req = cart(&rid, &names, 1);
            tokio::spawn(async move { engine.reserve(&req).await })
        });
        let answers = futures_util::future::join_all(copies).await;
        let mut held = false;
        for answer in answers {
            match answer.unwrap() {
                Ok(ReserveOutcome::Reserved { .. } | ReserveOutcome::AlreadyReserved { .. }) => {
                    held = true;
                }
                Err(holdfast_engine::EngineError::Busy(_)) => {}
                other => panic!("{rid}: {other:?}"),
            }
        }
        let hold = engine.hold(&rid).await.unwrap();
        if held {
            let hold = hold.unwrap_or_else(|| panic!("{rid}: answered held, but gone"));
            assert_eq!(
                (hold.state, hold.lines.len()),
                (HoldState::Held, 3),
                "{rid}"
            );
            whole += 1;
        } else {
            assert_eq!(hold, None, "{rid}");
        }
    }
    for sku in &skus {
        assert_eq!(
            figures(&engine, sku).await,
            (1_000 - whole, whole, 0),
            "{sku}"
        );
    }
}

#[tokio::test]
async fn a_part_of_a_cart_whose_id_another_request_now_owns_still_expires() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let [a, b, _] = three_shards(&engine);
    stock(&engine, &a, 5).await;
    stock(&engine, &b, 5).await;
    engine.reserve(&cart("own-1", &[&a, &b], 1)).await.unwrap();
    // The claim lost (a node that restarted without its data) and taken by
    // another request since: the parts belong to no reservation.
    let ks = engine.keyspace();
    let mut conn = redis.connection().await;
    redis::cmd("SET")
        .arg(ks.claim("own-1"))
        .arg("another-request")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    engine.reap_once(100).await.unwrap();
    assert_eq!(figures(&engine, &a).await, (5, 0, 0), "its units came back");
    assert_eq!(figures(&engine, &b).await, (5, 0, 0));
    for sku in [&a, &b] {
        let due: i64 = redis::cmd("ZCARD")
            .arg(ks.due(ks.shard_of(sku)))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(due, 0, "nothing left at the front of the due set");
    }
}

#[tokio::test]
async fn a_cart_whose_first_answer_is_lost_frees_its_id_within_seconds() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let [a, b, _] = three_shards(&engine);
    stock(&engine, &a, 5).await;
    stock(&engine, &b, 5).await;
    // Writes wait well past the connection's response timeout (5 s on one
    // node; on a cluster 2 s, tried three times, so a 9 s pause once let
    // the third try through in a loaded CI run), with room for a loaded
    // machine to be late sending: the claim and the lease are written once
    // the pause ends, their answer lost.
    // Every node of a cluster: paused through the cluster client, one node
    // only was, and a cart whose claim lay elsewhere was made at once.
    redis.pause_writes(15_000).await;
    let started = std::time::Instant::now();
    let first = engine.reserve(&cart("lost-1", &[&a, &b], 1)).await;
    assert!(first.is_err(), "{first:?}");
    // The lease is shortened, not left for its whole life: the retry gets
    // through within seconds of the pause. A retry sent while writes are
    // still paused times out as the first did; a client retries that too.
    loop {
        match engine.reserve(&cart("lost-1", &[&a, &b], 1)).await {
            Ok(ReserveOutcome::Reserved { .. } | ReserveOutcome::AlreadyReserved { .. }) => break,
            Err(holdfast_engine::EngineError::Busy(_) | holdfast_engine::EngineError::Redis(_))
                if started.elapsed() < Duration::from_secs(35) =>
            {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            other => panic!("after {:?}: {other:?}", started.elapsed()),
        }
    }
    assert_eq!(figures(&engine, &a).await, (4, 1, 0));
    assert_eq!(figures(&engine, &b).await, (4, 1, 0));
}
