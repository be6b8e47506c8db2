//! Split SKUs under the races and histories an attack on them found: a feed
//! while units are on their way between parts, a receipt after a debt was
//! handed to another part, settings written by a process that never saw the
//! split, and a merge while shoppers keep asking. Each test states the
//! invariant it checks.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use holdfast_engine::keys::part_name;
use holdfast_engine::testkit::{TestRedis, add_sku};
use holdfast_engine::warmup::{WarmOptions, warm_all};
use holdfast_engine::{Backends, Engine, ReserveOutcome, ReserveRequest, SplitOutcome, postgres};
use redis::Value;
use sqlx::PgPool;

async fn setup(pg: &PgPool, sku: &str, on_hand: i64, limit: i32) -> (TestRedis, Backends) {
    let redis = TestRedis::start();
    add_sku(pg, sku, on_hand).await;
    if limit > 0 {
        sqlx::query("UPDATE skus SET per_buyer_limit = $2 WHERE sku = $1")
            .bind(sku)
            .bind(limit)
            .execute(pg)
            .await
            .unwrap();
    }
    let b = holdfast_engine::testkit::backends(pg.clone(), &redis.url()).await;
    warm_all(&b.engine, pg, WarmOptions::default(), |_| {})
        .await
        .unwrap();
    (redis, b)
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
