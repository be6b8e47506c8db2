//! Split SKUs under the races and histories two attacks on them found: a
//! feed while units are on their way between parts, a receipt after a debt
//! was handed to another part, settings written by a process that never saw
//! the split, a merge while shoppers keep asking, a change of parts cut short
//! by a Redis error (and reconciliation, warm-up and settings meeting it),
//! and a cart made again after gathering. Each test states the invariant it
//! checks.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use holdfast_engine::keys::part_name;
use holdfast_engine::reconcile::{ReconcileOptions, reconcile_all};
use holdfast_engine::testkit::{TestRedis, add_sku};
use holdfast_engine::warmup::{WarmOptions, warm_all};
use holdfast_engine::{Backends, Engine, ReserveOutcome, ReserveRequest, SplitOutcome, postgres};
use redis::Value;
use sqlx::PgPool;

/// A test Redis and the backends over it and `pg`, with `sku` warmed.
async fn setup(pg: &PgPool, sku: &str, on_hand: i64, limit: i32) -> (TestRedis, Backends) {
    holdfast_engine::testkit::warmed_sku(pg, sku, on_hand, limit).await
}

/// A buyer whose requests on `sku` (split into `parts`) land on part `part`,
/// found by trying (a probe hold of 1, released at once), whatever hash the
/// routing uses.
async fn buyer_on(engine: &Engine, sku: &str, part: u16, parts: u16, tag: &str) -> String {
    let ks = engine.keyspace();
    let mut conn = engine.connection();
    for i in 0..500 {
        let buyer = format!("{tag}-{i}");
        let rid = format!("probe-{tag}-{i}");
        let r = engine
            .reserve(&ReserveRequest::single(&rid, sku, 1).for_buyer(&buyer))
            .await
            .unwrap();
        assert!(matches!(r, ReserveOutcome::Reserved { .. }), "probe: {r:?}");
        let score: Option<f64> = redis::cmd("ZSCORE")
            .arg(ks.sku_holds(&part_name(sku, part, parts)))
            .arg(&rid)
            .query_async(&mut conn)
            .await
            .unwrap();
        engine.release(&rid).await.unwrap();
        if score.is_some() {
            return buyer;
        }
    }
    panic!("no buyer lands on part {part}/{parts}");
}

/// (available, moving, reserved, sold_pending, owed) of the whole SKU.
async fn totals(engine: &Engine, sku: &str) -> (i64, i64, i64, i64, i64) {
    let f = engine.figures(sku).await.unwrap().unwrap();
    (f.available, f.moving, f.reserved, f.sold_pending, f.owed)
}

/// The first step of a move (`out`), as a gather in another request makes it,
/// its mover not yet at the second step.
async fn move_out(redis: &TestRedis, engine: &Engine, from: &str, to: &str, tid: &str, qty: i64) {
    let ks = engine.keyspace();
    let mut conn = redis.connection().await;
    let reply: Vec<Value> = engine
        .scripts()
        .move_units
        .key(ks.sku(from))
        .key(ks.moves(from))
        .key(ks.events(ks.shard_of(from)))
        .arg("out")
        .arg(tid)
        .arg(qty)
        .arg(from)
        .arg(to)
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(redis::from_redis_value_ref::<i64>(&reply[1]).unwrap(), qty);
}

/// A feed removes ALL the stock of a split SKU while another request's gather
/// has units on their way between two parts (its `out` done, its `in` not
/// yet): part 0 takes the whole decrease, and the transfer's units must not
/// land on sale in the other part. Invariant: after a feed that takes every
/// unit, nothing can be reserved.
#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_feed_taking_everything_while_a_transfer_is_on_its_way_leaves_nothing_on_sale(
    pg: PgPool,
) {
    use holdfast_engine::stock::DeltaOutcome;
    let sku = "ATK-FEED-MOVE";
    let (redis, b) = setup(&pg, sku, 100, 0).await;
    let engine = b.engine.clone();
    assert_eq!(
        engine.set_parts(&pg, sku, 2).await.unwrap(),
        SplitOutcome::Changed { from: 1, to: 2 }
    );
    let buyers = [
        buyer_on(&engine, sku, 1, 2, "fm-a").await,
        buyer_on(&engine, sku, 1, 2, "fm-b").await,
    ];
    assert_eq!(totals(&engine, sku).await, (100, 0, 0, 0, 0));
    // Another request's gather for part 1: 20 units out of part 0, on their way.
    move_out(
        &redis,
        &engine,
        &part_name(sku, 0, 2),
        &part_name(sku, 1, 2),
        "inflight-1",
        20,
    )
    .await;
    // The supplier: all 100 units are gone (damaged).
    assert!(matches!(
        engine
            .apply_delta(sku, -100, "erp", "gone-1")
            .await
            .unwrap(),
        DeltaOutcome::Applied { .. }
    ));
    // The mover carries on (as its own request would, milliseconds later).
    engine.finish_moves(sku).await.unwrap();
    let after = totals(&engine, sku).await;
    let parts: Vec<(i64, i64)> = engine
        .part_figures(sku)
        .await
        .unwrap()
        .iter()
        .map(|f| (f.available, f.owed))
        .collect();
    eprintln!("after the feed and the transfer: {after:?}, parts (available, owed) {parts:?}");
    let mut held = 0;
    for (i, buyer) in buyers.iter().enumerate() {
        let r = engine
            .reserve(&ReserveRequest::single(format!("after-{i}"), sku, 10).for_buyer(buyer))
            .await
            .unwrap();
        if matches!(r, ReserveOutcome::Reserved { .. }) {
            held += 10;
        }
    }
    assert_eq!(
        held, 0,
        "held {held} units of a SKU whose every unit a feed removed (figures {after:?}, parts {parts:?})"
    );
}

/// The same without any hand-made step: shoppers whose parts are short keep
/// gathering (units move between the parts) while a feed takes every unit.
/// Invariant: after the feed, the SKU has nothing available (whatever is
/// available is a unit that does not exist).
#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_feed_taking_everything_while_shoppers_gather_leaves_nothing_on_sale(pg: PgPool) {
    use holdfast_engine::stock::DeltaOutcome;
    let redis = TestRedis::start();
    let b = holdfast_engine::testkit::backends(pg.clone(), &redis.url()).await;
    let engine = b.engine.clone();
    let mut hits = Vec::new();
    for round in 0..15 {
        let sku = format!("ATK-FEED-RACE-{round}");
        add_sku(&pg, &sku, 400).await;
        warm_all(&engine, &pg, WarmOptions::default(), |_| {})
            .await
            .unwrap();
        engine.set_parts(&pg, &sku, 4).await.unwrap();
        let mut buyers = Vec::new();
        for part in 0..4u16 {
            buyers.push(buyer_on(&engine, &sku, part, 4, &format!("r{round}p{part}")).await);
        }
        // Hold most of each part so that a part is short and gathers.
        for (part, buyer) in buyers.iter().enumerate() {
            for i in 0..9 {
                let r = engine
                    .reserve(
                        &ReserveRequest::single(format!("{sku}-base-{part}-{i}"), &sku, 10)
                            .for_buyer(buyer),
                    )
                    .await
                    .unwrap();
                assert!(matches!(r, ReserveOutcome::Reserved { .. }), "{r:?}");
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = tokio::task::JoinSet::new();
        for (part, buyer) in buyers.iter().enumerate() {
            let (engine, stop, sku, buyer) =
                (engine.clone(), stop.clone(), sku.clone(), buyer.clone());
            tasks.spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let rid = format!("{sku}-{part}-{i}");
                    let r = engine
                        .reserve(&ReserveRequest::single(&rid, &sku, 10).for_buyer(&buyer))
                        .await;
                    if let Ok(ReserveOutcome::Reserved { .. }) = r {
                        engine.release(&rid).await.unwrap();
                    }
                }
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(40)).await;
        // Every unit is gone, the held ones too.
        let applied = engine
            .apply_delta(&sku, -400, "erp", &format!("gone-{round}"))
            .await
            .unwrap();
        assert!(matches!(applied, DeltaOutcome::Applied { .. }));
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        stop.store(true, Ordering::Relaxed);
        while tasks.join_next().await.is_some() {}
        engine.finish_moves(&sku).await.unwrap();
        let t = totals(&engine, &sku).await;
        eprintln!("round {round}: (available, moving, reserved, pending, owed) {t:?}");
        if t.0 > 0 {
            hits.push((round, t));
        }
    }
    assert!(
        hits.is_empty(),
        "a feed took all 400 units, yet units stayed on sale (round, (available, moving, reserved, pending, owed)): {hits:?}"
    );
}

/// A feed lowers a split SKU under holds on part 1: part 0's debt is handed
/// to part 1 (spread_owed). A receipt then lands on part 0 (delta.lua, part
/// 0 alone): it must pay the debt first ("a receipt pays it first too"), as
/// the same history on an unsplit SKU does, leaving nothing on sale.
#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_receipt_pays_a_debt_handed_to_another_part(pg: PgPool) {
    use holdfast_engine::stock::DeltaOutcome;
    for parts in [1u16, 2] {
        let sku = format!("ATK-DEBT-{parts}");
        let redis = TestRedis::start();
        add_sku(&pg, &sku, 100).await;
        let b = holdfast_engine::testkit::backends(pg.clone(), &redis.url()).await;
        let engine = b.engine.clone();
        warm_all(&engine, &pg, WarmOptions::default(), |_| {})
            .await
            .unwrap();
        if parts > 1 {
            engine.set_parts(&pg, &sku, parts).await.unwrap();
        }
        let buyer = buyer_on(&engine, &sku, parts - 1, parts, "debt").await;
        let other = buyer_on(&engine, &sku, 0, parts, "newcomer").await;
        assert!(matches!(
            engine
                .reserve(&ReserveRequest::single(format!("h-{parts}"), &sku, 10).for_buyer(&buyer))
                .await
                .unwrap(),
            ReserveOutcome::Reserved { .. }
        ));
        // Everything is gone, the held 10 too: owed.
        assert!(matches!(
            engine.apply_delta(&sku, -100, "erp", "d-1").await.unwrap(),
            DeltaOutcome::Applied { .. }
        ));
        // 5 arrive: they pay 5 of the 10 owed.
        assert!(matches!(
            engine.apply_delta(&sku, 5, "erp", "d-2").await.unwrap(),
            DeltaOutcome::Applied { .. }
        ));
        let t = totals(&engine, &sku).await;
        let by_part: Vec<(i64, i64, i64)> = engine
            .part_figures(&sku)
            .await
            .unwrap()
            .iter()
            .map(|f| (f.available, f.reserved, f.owed))
            .collect();
        eprintln!("{parts} part(s): {t:?}, parts (available, reserved, owed) {by_part:?}");
        // A newcomer on part 0.
        let r = engine
            .reserve(&ReserveRequest::single(format!("new-{parts}"), &sku, 5).for_buyer(&other))
            .await
            .unwrap();
        assert!(
            !matches!(r, ReserveOutcome::Reserved { .. }),
            "{parts} part(s): after -100 and +5 under a 10-unit hold, 5 more units were sold: {r:?} (figures {t:?}, parts {by_part:?})"
        );
        drop(redis);
    }
}

/// A process that never saw the split (a restarted server, the CLI) writes a
/// drop's settings: every part must get them, and `follow_catalogue` must
/// see a part that lacks them. Invariant: one buyer's limit over the whole
/// SKU.
#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_limit_set_by_a_process_that_never_saw_the_split_reaches_every_part(pg: PgPool) {
    let sku = "ATK-LIMIT";
    let (redis, b) = setup(&pg, sku, 100, 0).await;
    let engine = b.engine.clone();
    engine.set_parts(&pg, sku, 4).await.unwrap();
    let buyer = buyer_on(&engine, sku, 3, 4, "lim").await;
    // Merchandising sets a limit of 1 per buyer; a fresh process applies it.
    sqlx::query("UPDATE skus SET per_buyer_limit = 1 WHERE sku = $1")
        .bind(sku)
        .execute(&pg)
        .await
        .unwrap();
    let fresh = redis.engine().await;
    holdfast_engine::schedule::follow_catalogue(&fresh, &pg)
        .await
        .unwrap();
    // And again, from the process that knows the split: part 0 agrees, so
    // nothing is rewritten.
    holdfast_engine::schedule::follow_catalogue(&engine, &pg)
        .await
        .unwrap();
    let limits: Vec<i64> = engine
        .part_figures(sku)
        .await
        .unwrap()
        .iter()
        .map(|f| f.per_buyer_limit)
        .collect();
    eprintln!("limits by part: {limits:?}");
    let mut held = 0;
    for i in 0..5 {
        if let ReserveOutcome::Reserved { .. } = engine
            .reserve(&ReserveRequest::single(format!("lim-{i}"), sku, 1).for_buyer(&buyer))
            .await
            .unwrap()
        {
            held += 1;
        }
    }
    assert_eq!(
        held, 1,
        "a buyer limited to 1 held {held} (limits by part {limits:?})"
    );
}

/// Merging a split SKU back (4 -> 1) while shoppers ask for more than one
/// part has: while the units are on their way to part 0, requests are told
/// to retry (busy), never sold out. Invariant: sold out only when the whole
/// SKU is short, and every unit is kept.
#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn merging_parts_never_answers_sold_out_while_the_units_are_in_other_parts(pg: PgPool) {
    let redis = TestRedis::start();
    let b = holdfast_engine::testkit::backends(pg.clone(), &redis.url()).await;
    let engine = b.engine.clone();
    let false_sold_out = Arc::new(AtomicU64::new(0));
    let mut merges = 0;
    for round in 0..10 {
        let sku = format!("ATK-MERGE-{round}");
        // 8 units a part: a request for 10 needs more than one part.
        add_sku(&pg, &sku, 32).await;
        warm_all(&engine, &pg, WarmOptions::default(), |_| {})
            .await
            .unwrap();
        engine.set_parts(&pg, &sku, 4).await.unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = tokio::task::JoinSet::new();
        // Two workers, each with at most one hold of 10 open: at least 22 of
        // the 32 units are there whenever one of them asks.
        for w in 0..2 {
            let (engine, stop, sku, bad) = (
                engine.clone(),
                stop.clone(),
                sku.clone(),
                false_sold_out.clone(),
            );
            tasks.spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let rid = format!("{sku}-m{w}-{i}");
                    match engine
                        .reserve(&ReserveRequest::single(&rid, &sku, 10))
                        .await
                    {
                        Ok(ReserveOutcome::Reserved { .. }) => {
                            engine.release(&rid).await.unwrap();
                        }
                        Ok(ReserveOutcome::SoldOut { available, .. }) => {
                            eprintln!("{rid}: sold out with {available} left");
                            bad.fetch_add(1, Ordering::Relaxed);
                        }
                        _ => {}
                    }
                }
            });
        }
        // Merge as soon as no hold is open at the moment of the check.
        for _ in 0..500 {
            match engine.set_parts(&pg, &sku, 1).await.unwrap() {
                SplitOutcome::Changed { .. } => {
                    merges += 1;
                    break;
                }
                _ => tokio::task::yield_now().await,
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        stop.store(true, Ordering::Relaxed);
        while tasks.join_next().await.is_some() {}
        let t = totals(&engine, &sku).await;
        assert_eq!(t, (32, 0, 0, 0, 0), "round {round}: every unit kept");
    }
    eprintln!("{merges} merges");
    assert!(merges > 0, "some merge went through between the holds");
    assert_eq!(
        false_sold_out.load(Ordering::Relaxed),
        0,
        "requests for 10 of a 32-unit SKU (at most 10 held by the other worker) were answered sold out ({merges} merges)"
    );
}

/// A key under part `part`'s buyer prefix that makes the change's buyer
/// step fail (WRONGTYPE): a stand-in for any Redis error (a reset connection,
/// a timeout, a failover) in the middle of `set_parts`.
async fn poison(engine: &Engine, part: &str) -> String {
    let key = engine.keyspace().buyer(part, "zz-poison");
    redis::cmd("HSET")
        .arg(&key)
        .arg("x")
        .arg("1")
        .query_async::<()>(&mut engine.connection())
        .await
        .unwrap();
    key
}

async fn unpoison(engine: &Engine, key: &str) {
    redis::cmd("DEL")
        .arg(key)
        .query_async::<()>(&mut engine.connection())
        .await
        .unwrap();
}

async fn parts_field(engine: &Engine, name: &str) -> Option<i64> {
    redis::cmd("HGET")
        .arg(engine.keyspace().sku(name))
        .arg("parts")
        .query_async(&mut engine.connection())
        .await
        .unwrap()
}

/// Sum of available+moving+reserved+sold_pending-owed over every part counter
/// that exists in Redis (of any count), read directly.
async fn raw_total(engine: &Engine, sku: &str) -> i64 {
    let mut names = vec![sku.to_owned()];
    for k in 2..=16u16 {
        for j in 1..k {
            names.push(part_name(sku, j, k));
        }
    }
    let mut total = 0;
    for n in names {
        let row: Vec<Option<i64>> = redis::cmd("HMGET")
            .arg(engine.keyspace().sku(&n))
            .arg(&["available", "moving", "reserved", "sold_pending", "owed"])
            .query_async(&mut engine.connection())
            .await
            .unwrap();
        if row[0].is_some() {
            let f = |i: usize| row[i].unwrap_or(0);
            total += f(0) + f(1) + f(2) + f(3) - f(4);
        }
    }
    total
}

/// Splits 4 -> 2 with a Redis error after the first old part was drained:
/// the change is cut short, every part still marked changing.
async fn cut_short(pg: &PgPool, engine: &Engine, sku: &str) -> String {
    assert_eq!(
        engine.set_parts(pg, sku, 4).await.unwrap(),
        SplitOutcome::Changed { from: 1, to: 4 }
    );
    let key = poison(engine, &part_name(sku, 1, 4)).await;
    let r = engine.set_parts(pg, sku, 2).await;
    eprintln!("set_parts 4->2 with a Redis error midway: {r:?}");
    assert!(r.is_err(), "the injected error surfaces: {r:?}");
    key
}

/// Invariant: a change cut short by an error must not leave the SKU stuck
/// (reservations answering busy forever): the rebalancer finishes it to the
/// count PostgreSQL recorded, and the SKU sells again.
#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_change_cut_short_is_finished_and_sells_again(pg: PgPool) {
    let sku = "ATK2-STUCK";
    let (_redis, b) = setup(&pg, sku, 100, 0).await;
    let engine = b.engine.clone();
    let key = cut_short(&pg, &engine, sku).await;
    unpoison(&engine, &key).await; // the error was transient
    // What the servers do in the background, several times.
    for _ in 0..3 {
        // The rebalancer finishes a change cut short, then evens out.
        let _ = engine.finish_change(&pg, sku).await;
        let _ = engine.rebalance(sku).await;
        let _ = engine.finish_moves(sku).await;
        let _ = warm_all(&engine, &pg, WarmOptions::default(), |_| {}).await;
        let _ = holdfast_engine::schedule::follow_catalogue(&engine, &pg).await;
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    let pg_parts: i16 = sqlx::query_scalar("SELECT parts FROM skus WHERE sku = $1")
        .bind(sku)
        .fetch_one(&pg)
        .await
        .unwrap();
    let mut answers = Vec::new();
    for i in 0..5 {
        let r = engine
            .reserve(
                &ReserveRequest::single(format!("after-{i}"), sku, 1).for_buyer(format!("b{i}")),
            )
            .await;
        answers.push(format!("{r:?}"));
    }
    eprintln!(
        "part 0 parts={:?}, PostgreSQL parts={pg_parts}, answers {answers:?}",
        parts_field(&engine, sku).await
    );
    assert!(
        answers.iter().any(|a| a.starts_with("Ok(Reserved")),
        "every reservation of a SKU with 100 units answers busy after a change was cut short \
         (part 0 parts={:?}, PostgreSQL parts={pg_parts}): {answers:?}",
        parts_field(&engine, sku).await
    );
}

/// Invariant: conservation. While a change is cut short (or simply under way:
/// part 0 is marked last), reconciliation must not take part 0 alone for the
/// SKU and write the other parts' units onto it again (with correct_up).
#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn reconciliation_during_a_change_cut_short_creates_no_units(pg: PgPool) {
    let sku = "ATK2-RECON";
    let (_redis, b) = setup(&pg, sku, 100, 0).await;
    let engine = b.engine.clone();
    let key = cut_short(&pg, &engine, sku).await;
    assert_eq!(
        raw_total(&engine, sku).await,
        100,
        "the change kept every unit so far"
    );
    let report = reconcile_all(
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
    eprintln!("reconcile during the change: {report:?}");
    unpoison(&engine, &key).await;
    let r = engine.set_parts(&pg, sku, 2).await.unwrap();
    eprintln!("retry: {r:?}");
    let f = engine.figures(sku).await.unwrap().unwrap();
    let mut held = 0;
    for i in 0..400 {
        let r = engine
            .reserve(&ReserveRequest::single(format!("take-{i}"), sku, 1))
            .await;
        if matches!(r, Ok(ReserveOutcome::Reserved { .. })) {
            held += 1;
        }
    }
    assert_eq!(
        (
            raw_total(&engine, sku).await,
            f.available + f.moving + f.reserved + f.sold_pending - f.owed,
            held
        ),
        (100, 100, 100),
        "on hand 100: units on sale after reconciliation met the change (raw, figures, held)"
    );
}

/// Invariant: conservation. A forced warm-up while the parts are marked
/// changing must not write part 0 as if the SKU were not split, on top of
/// the units the other parts keep.
#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_forced_warm_up_during_a_change_creates_no_units(pg: PgPool) {
    let sku = "ATK2-WARM";
    let (_redis, b) = setup(&pg, sku, 100, 0).await;
    let engine = b.engine.clone();
    let key = cut_short(&pg, &engine, sku).await;
    warm_all(
        &engine,
        &pg,
        WarmOptions {
            force: true,
            ..WarmOptions::default()
        },
        |_| {},
    )
    .await
    .unwrap();
    let during = raw_total(&engine, sku).await;
    unpoison(&engine, &key).await;
    let r = engine.set_parts(&pg, sku, 2).await.unwrap();
    eprintln!("retry: {r:?}");
    let mut held = 0;
    for i in 0..400 {
        let r = engine
            .reserve(&ReserveRequest::single(format!("take-{i}"), sku, 1))
            .await;
        if matches!(r, Ok(ReserveOutcome::Reserved { .. })) {
            held += 1;
        }
    }
    assert_eq!(
        (during, raw_total(&engine, sku).await, held),
        (100, 100, 100),
        "on hand 100 (raw units after the forced warm-up, after the retry, units held)"
    );
}

/// Invariant: per-buyer limit. A limit written while the parts are marked
/// changing must reach every part there is, and the parts kept by the retried
/// change too.
#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_limit_set_during_a_change_reaches_every_part(pg: PgPool) {
    let sku = "ATK2-LIMIT";
    let (_redis, b) = setup(&pg, sku, 100, 0).await;
    let engine = b.engine.clone();
    // 1 -> 4 cut short at part 0's buyers (after the new parts were made).
    let key = poison(&engine, sku).await;
    let r = engine.set_parts(&pg, sku, 4).await;
    assert!(r.is_err(), "{r:?}");
    unpoison(&engine, &key).await;
    sqlx::query("UPDATE skus SET per_buyer_limit = 2 WHERE sku = $1")
        .bind(sku)
        .execute(&pg)
        .await
        .unwrap();
    holdfast_engine::schedule::follow_catalogue(&engine, &pg)
        .await
        .unwrap();
    assert_eq!(
        engine.set_parts(&pg, sku, 4).await.unwrap(),
        SplitOutcome::Changed { from: 4, to: 4 }
    );
    let mut limits = Vec::new();
    for j in 0..4 {
        let l: Option<i64> = redis::cmd("HGET")
            .arg(engine.keyspace().sku(&part_name(sku, j, 4)))
            .arg("limit")
            .query_async(&mut engine.connection())
            .await
            .unwrap();
        limits.push(l);
    }
    // One buyer per part, 5 units each.
    let mut over = Vec::new();
    for i in 0..40 {
        let buyer = format!("lb-{i}");
        let mut got = 0;
        for n in 0..5 {
            if let Ok(ReserveOutcome::Reserved { .. }) = engine
                .reserve(&ReserveRequest::single(format!("l-{i}-{n}"), sku, 1).for_buyer(&buyer))
                .await
            {
                got += 1;
            }
        }
        if got > 2 {
            over.push((buyer, got));
        }
    }
    assert!(
        over.is_empty(),
        "limit 2 per buyer; part limits {limits:?}; buyers over it: {over:?}"
    );
}

/// Invariant: conservation, with no injected error at all. Reconciliation
/// (correct_up) running while an operator changes the SKU's parts must not
/// take the units still in other parts (a merge drains them one by one; a
/// split spreads them before part 0 is marked last) for stranded ones.
#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn reconciliation_racing_an_ordinary_change_creates_no_units(pg: PgPool) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let sku = "ATK2-RACE";
    let (_redis, b) = setup(&pg, sku, 1000, 0).await;
    let engine = b.engine.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let rec = {
        let (engine, pg, stop) = (engine.clone(), pg.clone(), stop.clone());
        tokio::spawn(async move {
            let mut corrected = 0;
            while !stop.load(Ordering::Relaxed) {
                if let Ok(r) = reconcile_all(
                    &engine,
                    &pg,
                    &ReconcileOptions {
                        correct_up: true,
                        ..ReconcileOptions::default()
                    },
                    |_| {},
                )
                .await
                {
                    corrected += r.corrected_up + r.corrected_down;
                }
            }
            corrected
        })
    };
    let mut seen = Vec::new();
    for round in 0..60 {
        let to = if round % 2 == 0 { 8 } else { 1 };
        let r = engine.set_parts(&pg, sku, to).await;
        let total = raw_total(&engine, sku).await;
        seen.push(total);
        if total != 1000 {
            eprintln!("round {round}: set_parts({to}) = {r:?}, raw units {total}");
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let corrected = rec.await.unwrap();
    // Measured again with the reconciler stopped (a read racing its own
    // gathering could miss units on their way to part 0).
    seen.push(raw_total(&engine, sku).await);
    let f = engine.figures(sku).await.unwrap().unwrap();
    eprintln!("at rest: raw {:?}, figures {f:?}", seen.last());
    assert!(
        seen.iter().all(|t| *t == 1000),
        "on hand 1000; raw units after each change: {seen:?} (reconciliation corrected {corrected})"
    );
}

/// Invariant: the write-behind records holds as they are. A cart whose split
/// line's part is short is undone (its other shard's part released) and made
/// again under the same id after the gather: PostgreSQL's `holds` row of the
/// other line opens again, and its confirm is recorded on it.
#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_cart_that_gathered_is_recorded_as_confirmed(pg: PgPool) {
    use holdfast_engine::record::{WriteBehind, WriteBehindConfig, WriteBehindStats};
    let sku = "ATK2-CART";
    let (redis, b) = setup(&pg, sku, 8, 0).await;
    let engine = b.engine.clone();
    let ks = engine.keyspace();
    let taken: Vec<u16> = (0..4).map(|j| ks.shard_of(&part_name(sku, j, 4))).collect();
    let other = (0..)
        .map(|i| format!("ATK2-OTHER-{i}"))
        .find(|s| !taken.contains(&ks.shard_of(s)))
        .unwrap();
    add_sku(&pg, &other, 5).await;
    warm_all(&engine, &pg, WarmOptions::default(), |_| {})
        .await
        .unwrap();
    engine.set_parts(&pg, sku, 4).await.unwrap();
    let req = ReserveRequest {
        reservation_id: "cart-g".into(),
        lines: vec![
            holdfast_engine::Line {
                sku: other.clone(),
                qty: 1,
            },
            holdfast_engine::Line {
                sku: sku.into(),
                qty: 5,
            },
        ],
        buyer: Some("cart-buyer".into()),
        ttl_ms: None,
    };
    let got = engine.reserve(&req).await.unwrap();
    assert!(matches!(got, ReserveOutcome::Reserved { .. }), "{got:?}");
    assert_eq!(
        engine.confirm("cart-g").await.unwrap(),
        holdfast_engine::ConfirmOutcome::Confirmed
    );
    let mut writer = WriteBehind::new(
        engine.clone(),
        pg.clone(),
        redis.connection().await,
        WriteBehindConfig {
            consumer: "atk".into(),
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
    let rows: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT sku, end_state FROM holds WHERE reservation_id = 'cart-g' ORDER BY sku",
    )
    .fetch_all(&pg)
    .await
    .unwrap();
    let mut want = vec![
        (other.clone(), Some("confirmed".to_owned())),
        (sku.to_owned(), Some("confirmed".to_owned())),
    ];
    want.sort();
    assert_eq!(rows, want, "PostgreSQL's record of a confirmed cart");
}

/// Invariant: nothing stays busy for good. A merge back into one part cut
/// short (the change and its retry both failing) is finished by the
/// rebalancer like any change: it visits the SKUs PostgreSQL marks as being
/// changed, not only those recorded as split (a merge's target is 1 part,
/// so the SKU was never visited and answered busy until an operator ran
/// the change again).
#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_merge_cut_short_is_finished_by_the_rebalancer(pg: PgPool) {
    let sku = "ATK2-MERGE";
    let (_redis, b) = setup(&pg, sku, 100, 0).await;
    let engine = b.engine.clone();
    assert_eq!(
        engine.set_parts(&pg, sku, 4).await.unwrap(),
        SplitOutcome::Changed { from: 1, to: 4 }
    );
    let key = poison(&engine, &part_name(sku, 1, 4)).await;
    let r = engine.set_parts(&pg, sku, 1).await;
    assert!(r.is_err(), "the injected error surfaces: {r:?}");
    assert_eq!(parts_field(&engine, sku).await, Some(0), "cut short");
    unpoison(&engine, &key).await;
    // What the rebalancer does every second.
    let listed = Engine::split_skus(&pg).await.unwrap();
    assert!(listed.contains(&sku.to_owned()), "{listed:?}");
    for listed in listed {
        engine.finish_change(&pg, &listed).await.unwrap();
    }
    assert_eq!(parts_field(&engine, sku).await, Some(1), "merged");
    assert!(
        !Engine::split_skus(&pg)
            .await
            .unwrap()
            .contains(&sku.to_owned()),
        "no longer listed once merged"
    );
    assert_eq!(raw_total(&engine, sku).await, 100);
    assert_eq!(engine.figures(sku).await.unwrap().unwrap().available, 100);
    let r = engine
        .reserve(&ReserveRequest::single("after-merge", sku, 10))
        .await
        .unwrap();
    assert!(matches!(r, ReserveOutcome::Reserved { .. }), "{r:?}");
}
