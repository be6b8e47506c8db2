//! Reserve: the race, retries, conflicts, not-warmed vs sold-out, limits, carts.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use holdfast_engine::testkit::{
    TestRedis, skus_in_distinct_shards, skus_same_and_other_shard, stock, stock_with_limit,
};
use holdfast_engine::{ConfirmOutcome, HoldState, Line, ReserveOutcome, ReserveRequest};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_hundred_reservers_take_exactly_the_stock_and_nothing_goes_negative() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    stock(&engine, "HOT-1", 50).await;

    // A sampler on its own connection reads the counter as fast as it can.
    let stop = Arc::new(AtomicBool::new(false));
    let lowest = Arc::new(AtomicI64::new(i64::MAX));
    let sampler = {
        let (stop, lowest) = (stop.clone(), lowest.clone());
        let mut conn = redis.connection().await;
        let key = engine.keyspace().sku("HOT-1");
        tokio::spawn(async move {
            let mut samples = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let v: i64 = redis::cmd("HGET")
                    .arg(&key)
                    .arg("available")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                lowest.fetch_min(v, Ordering::Relaxed);
                samples += 1;
            }
            samples
        })
    };

    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..500 {
        let engine = engine.clone();
        tasks.spawn(async move {
            engine
                .reserve(&ReserveRequest::single(format!("race-{i}"), "HOT-1", 1))
                .await
        });
    }
    let (mut reserved, mut sold_out) = (0, 0);
    while let Some(outcome) = tasks.join_next().await {
        match outcome.unwrap().unwrap() {
            ReserveOutcome::Reserved { .. } => reserved += 1,
            ReserveOutcome::SoldOut { available, .. } => {
                assert_eq!(available, 0);
                sold_out += 1;
            }
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.await.unwrap();

    assert_eq!(reserved, 50, "exactly the stock is reserved");
    assert_eq!(sold_out, 450);
    assert!(samples > 0, "the sampler ran");
    assert!(
        lowest.load(Ordering::Relaxed) >= 0,
        "no sample was negative"
    );
    let f = engine.figures("HOT-1").await.unwrap().unwrap();
    assert_eq!((f.available, f.reserved, f.sold_pending), (0, 50, 0));
    assert_eq!(
        f.available + f.reserved + f.sold_pending,
        50,
        "conservation"
    );
    assert_eq!(f.open_holds, 50);
}

#[tokio::test]
async fn a_retry_moves_nothing_and_a_changed_request_is_a_conflict() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    stock(&engine, "SKU-A", 10).await;

    let req = ReserveRequest::single("order-1", "SKU-A", 2).for_buyer("alice");
    let first = engine.reserve(&req).await.unwrap();
    let ReserveOutcome::Reserved {
        expires_at_ms,
        available_after,
        ..
    } = first
    else {
        panic!("expected Reserved, got {first:?}")
    };
    assert_eq!(available_after, vec![("SKU-A".to_owned(), 8)]);

    let again = engine.reserve(&req).await.unwrap();
    assert_eq!(
        again,
        ReserveOutcome::AlreadyReserved {
            reservation_id: "order-1".into(),
            state: HoldState::Held,
            expires_at_ms,
            available_after: vec![("SKU-A".to_owned(), 8)],
        },
        "a retry answers what the first call did"
    );
    let f = engine.figures("SKU-A").await.unwrap().unwrap();
    assert_eq!((f.available, f.reserved), (8, 2), "a retry moves nothing");

    let changed = ReserveRequest::single("order-1", "SKU-A", 3).for_buyer("alice");
    assert_eq!(
        engine.reserve(&changed).await.unwrap(),
        ReserveOutcome::Conflict {
            reservation_id: "order-1".into()
        }
    );
    let f = engine.figures("SKU-A").await.unwrap().unwrap();
    assert_eq!(
        (f.available, f.reserved),
        (8, 2),
        "a conflict moves nothing"
    );
}

#[tokio::test]
async fn not_warmed_and_sold_out_are_different_answers() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;

    let cold = engine
        .reserve(&ReserveRequest::single("r1", "COLD-1", 1))
        .await
        .unwrap();
    assert_eq!(
        cold,
        ReserveOutcome::NotWarmed {
            sku: "COLD-1".into()
        }
    );
    assert_eq!(
        engine.figures("COLD-1").await.unwrap(),
        None,
        "a missing counter stays missing"
    );

    stock(&engine, "EMPTY-1", 0).await;
    let empty = engine
        .reserve(&ReserveRequest::single("r2", "EMPTY-1", 1))
        .await
        .unwrap();
    assert_eq!(
        empty,
        ReserveOutcome::SoldOut {
            sku: "EMPTY-1".into(),
            available: 0,
            replayed: false,
        }
    );

    stock(&engine, "FEW-1", 2).await;
    let few = engine
        .reserve(&ReserveRequest::single("r3", "FEW-1", 3))
        .await
        .unwrap();
    assert_eq!(
        few,
        ReserveOutcome::SoldOut {
            sku: "FEW-1".into(),
            available: 2,
            replayed: false,
        },
        "says what is left"
    );
}

#[tokio::test]
async fn invalid_requests_never_reach_redis() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    stock(&engine, "SKU-B", 10).await;
    let field = |o: ReserveOutcome| match o {
        ReserveOutcome::Invalid(inv) => inv.field,
        other => panic!("expected Invalid, got {other:?}"),
    };
    assert_eq!(
        field(
            engine
                .reserve(&ReserveRequest::single("r", "SKU-B", 0))
                .await
                .unwrap()
        ),
        "qty"
    );
    assert_eq!(
        field(
            engine
                .reserve(&ReserveRequest::single("r", "SKU-B", -1))
                .await
                .unwrap()
        ),
        "qty"
    );
    assert_eq!(
        field(
            engine
                .reserve(&ReserveRequest::single("r", "SKU-B", 11))
                .await
                .unwrap()
        ),
        "qty"
    );
    assert_eq!(
        field(
            engine
                .reserve(&ReserveRequest::single("r", "bad sku", 1))
                .await
                .unwrap()
        ),
        "sku"
    );
    assert_eq!(
        field(
            engine
                .reserve(&ReserveRequest::single("r{x}", "SKU-B", 1))
                .await
                .unwrap()
        ),
        "reservation_id"
    );
    assert_eq!(
        field(
            engine
                .reserve(&ReserveRequest::single("", "SKU-B", 1))
                .await
                .unwrap()
        ),
        "reservation_id"
    );
    assert_eq!(
        field(
            engine
                .reserve(&ReserveRequest::single("r", "SKU-B", 1).with_ttl_ms(10))
                .await
                .unwrap()
        ),
        "ttl_ms"
    );
    let twice = ReserveRequest {
        reservation_id: "r".into(),
        lines: vec![
            Line {
                sku: "SKU-B".into(),
                qty: 1,
            },
            Line {
                sku: "SKU-B".into(),
                qty: 1,
            },
        ],
        buyer: None,
        ttl_ms: None,
    };
    assert_eq!(field(engine.reserve(&twice).await.unwrap()), "sku");
    let f = engine.figures("SKU-B").await.unwrap().unwrap();
    assert_eq!((f.available, f.reserved), (10, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_per_buyer_limit_holds_under_a_retry_storm() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    stock_with_limit(&engine, "LTD-1", 100, 2).await;

    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..40 {
        let engine = engine.clone();
        tasks.spawn(async move {
            engine
                .reserve(&ReserveRequest::single(format!("tab-{i}"), "LTD-1", 1).for_buyer("bob"))
                .await
        });
    }
    let mut reserved = 0;
    while let Some(outcome) = tasks.join_next().await {
        match outcome.unwrap().unwrap() {
            ReserveOutcome::Reserved { .. } => reserved += 1,
            ReserveOutcome::LimitExceeded { limit, already, .. } => {
                assert_eq!((limit, already), (2, 2))
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(reserved, 2, "one buyer gets at most the limit");

    let other = engine
        .reserve(&ReserveRequest::single("carol-1", "LTD-1", 2).for_buyer("carol"))
        .await
        .unwrap();
    assert!(
        matches!(other, ReserveOutcome::Reserved { .. }),
        "other buyers are unaffected: {other:?}"
    );

    // Releasing a hold gives the allowance back; confirming keeps it used.
    let held: Vec<_> = engine.holds_of("LTD-1", 10).await.unwrap();
    let bobs: Vec<_> = held
        .iter()
        .filter(|h| h.buyer.as_deref() == Some("bob"))
        .collect();
    assert_eq!(bobs.len(), 2);
    engine.confirm(&bobs[0].reservation_id).await.unwrap();
    engine.release(&bobs[1].reservation_id).await.unwrap();
    let again = engine
        .reserve(&ReserveRequest::single("bob-late", "LTD-1", 1).for_buyer("bob"))
        .await
        .unwrap();
    assert!(
        matches!(again, ReserveOutcome::Reserved { .. }),
        "{again:?}"
    );
    let over = engine
        .reserve(&ReserveRequest::single("bob-over", "LTD-1", 1).for_buyer("bob"))
        .await
        .unwrap();
    assert!(
        matches!(over, ReserveOutcome::LimitExceeded { .. }),
        "{over:?}"
    );
}

#[tokio::test]
async fn a_cart_in_one_shard_is_all_or_nothing() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let (a, b, _) = skus_same_and_other_shard(&engine);
    stock(&engine, &a, 5).await;
    stock(&engine, &b, 1).await;

    let cart = |rid: &str, qb: i64| ReserveRequest {
        reservation_id: rid.into(),
        lines: vec![
            Line {
                sku: a.clone(),
                qty: 2,
            },
            Line {
                sku: b.clone(),
                qty: qb,
            },
        ],
        buyer: None,
        ttl_ms: None,
    };
    let failed = engine.reserve(&cart("cart-1", 2)).await.unwrap();
    assert_eq!(
        failed,
        ReserveOutcome::SoldOut {
            sku: b.clone(),
            available: 1,
            replayed: false,
        }
    );
    assert_eq!(
        engine.figures(&a).await.unwrap().unwrap().available,
        5,
        "nothing held on the other line"
    );

    let ok = engine.reserve(&cart("cart-2", 1)).await.unwrap();
    assert!(
        matches!(ok, ReserveOutcome::Reserved { ref available_after, .. } if available_after.len() == 2),
        "{ok:?}"
    );
    let hold = engine.hold("cart-2").await.unwrap().unwrap();
    assert_eq!(hold.lines.len(), 2);
    assert_eq!(
        engine.release("cart-2").await.unwrap(),
        holdfast_engine::ReleaseOutcome::Released
    );
    assert_eq!(engine.figures(&a).await.unwrap().unwrap().available, 5);
    assert_eq!(engine.figures(&b).await.unwrap().unwrap().available, 1);
}

#[tokio::test]
async fn a_cart_across_shards_compensates_and_can_be_retried() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let (a, _, c) = skus_same_and_other_shard(&engine);
    stock(&engine, &a, 5).await;
    stock(&engine, &c, 0).await;
    let cart = ReserveRequest {
        reservation_id: "x-cart".into(),
        lines: vec![
            Line {
                sku: a.clone(),
                qty: 1,
            },
            Line {
                sku: c.clone(),
                qty: 1,
            },
        ],
        buyer: Some("dan".into()),
        ttl_ms: None,
    };
    let failed = engine.reserve(&cart).await.unwrap();
    assert_eq!(
        failed,
        ReserveOutcome::SoldOut {
            sku: c.clone(),
            available: 0,
            replayed: false,
        }
    );
    let fa = engine.figures(&a).await.unwrap().unwrap();
    assert_eq!(
        (fa.available, fa.reserved, fa.open_holds),
        (5, 0, 0),
        "the first shard's hold was undone"
    );
    assert_eq!(
        engine.hold("x-cart").await.unwrap(),
        None,
        "the failed id holds nothing"
    );

    stock(&engine, &c, 3).await;
    assert_eq!(
        engine.reserve(&cart).await.unwrap(),
        ReserveOutcome::SoldOut {
            sku: c.clone(),
            available: 0,
            replayed: true,
        },
        "the same cart gets its first answer"
    );
    assert_eq!(engine.figures(&a).await.unwrap().unwrap().available, 5);
    let cart = ReserveRequest {
        reservation_id: "x-cart-2".into(),
        ..cart
    };
    let ok = engine.reserve(&cart).await.unwrap();
    assert!(matches!(ok, ReserveOutcome::Reserved { .. }), "{ok:?}");
    let retry = engine.reserve(&cart).await.unwrap();
    assert!(
        matches!(
            retry,
            ReserveOutcome::AlreadyReserved {
                state: HoldState::Held,
                ..
            }
        ),
        "{retry:?}"
    );
    assert_eq!(
        engine.confirm("x-cart-2").await.unwrap(),
        ConfirmOutcome::Confirmed
    );
    assert_eq!(engine.figures(&a).await.unwrap().unwrap().sold_pending, 1);
    assert_eq!(engine.figures(&c).await.unwrap().unwrap().sold_pending, 1);
}

#[tokio::test]
async fn a_sku_without_holds_lists_none() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    stock(&engine, "QUIET-1", 5).await;
    // An empty pipeline is an error in Redis; listing must not send one.
    assert!(engine.holds_of("QUIET-1", 50).await.unwrap().is_empty());
    assert!(
        engine
            .holds_of("NEVER-WARMED", 50)
            .await
            .unwrap()
            .is_empty()
    );
    engine
        .reserve(&ReserveRequest::single("q1", "QUIET-1", 1))
        .await
        .unwrap();
    engine.release("q1").await.unwrap();
    assert!(engine.holds_of("QUIET-1", 50).await.unwrap().is_empty());
}

#[tokio::test]
async fn one_id_raced_into_two_shards_holds_at_most_once() {
    let redis = TestRedis::start();
    // Two engines: two connections, so the two attempts' commands interleave.
    let (left, right) = (redis.engine().await, redis.engine().await);
    let (a, _, c) = skus_same_and_other_shard(&left);
    stock(&left, &a, 1_000).await;
    stock(&left, &c, 1_000).await;
    let mut held = 0;
    for i in 0..300 {
        let id = format!("race-{i}");
        let (to_a, to_c) = (
            ReserveRequest::single(&id, &a, 1),
            ReserveRequest::single(&id, &c, 1),
        );
        let (x, y) = tokio::join!(left.reserve(&to_a), right.reserve(&to_c));
        let made = [x.unwrap(), y.unwrap()]
            .into_iter()
            .filter(|o| matches!(o, ReserveOutcome::Reserved { .. }))
            .count();
        assert!(made <= 1, "{id}: one id, two holds");
        held += made as i64;
        // Whatever was answered, Redis keeps at most one hold for the id.
        let hold = left.hold(&id).await.unwrap();
        assert!(
            hold.as_ref().is_none_or(|h| h.lines.len() == 1),
            "{id}: {hold:?}"
        );
    }
    let (fa, fc) = (
        left.figures(&a).await.unwrap().unwrap(),
        left.figures(&c).await.unwrap().unwrap(),
    );
    assert_eq!(
        fa.reserved + fc.reserved,
        held,
        "every unit held is a hold answered"
    );
    assert_eq!(fa.available + fa.reserved, 1_000);
    assert_eq!(fc.available + fc.reserved, 1_000);
}

#[tokio::test]
async fn a_refusal_is_the_answer_for_its_id_and_never_blocks_the_first_request() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let (a, _, c) = skus_same_and_other_shard(&engine);
    stock(&engine, &a, 1).await;
    stock(&engine, &c, 0).await;
    let sold_out = engine
        .reserve(&ReserveRequest::single("ref-1", &a, 2))
        .await
        .unwrap();
    assert_eq!(
        sold_out,
        ReserveOutcome::SoldOut {
            sku: a.clone(),
            available: 1,
            replayed: false,
        }
    );
    stock(&engine, &a, 5).await;
    assert_eq!(
        engine
            .reserve(&ReserveRequest::single("ref-1", &a, 2))
            .await
            .unwrap(),
        ReserveOutcome::SoldOut {
            sku: a.clone(),
            available: 1,
            replayed: true,
        },
        "the same request gets the same answer"
    );
    assert!(
        matches!(
            engine
                .reserve(&ReserveRequest::single("ref-1", &a, 1))
                .await
                .unwrap(),
            ReserveOutcome::Conflict { .. }
        ),
        "another request under the id"
    );
    assert_eq!(
        engine.hold("ref-1").await.unwrap(),
        None,
        "a refusal is no hold"
    );
    assert_eq!(
        engine.release("ref-1").await.unwrap(),
        holdfast_engine::ReleaseOutcome::Unknown
    );
    assert_eq!(
        engine.confirm("ref-1").await.unwrap(),
        ConfirmOutcome::Unknown
    );

    // A hold, then its id sent for a sold-out SKU in another shard: a conflict
    // that leaves nothing behind, so the hold's own retry still replays.
    let first = engine
        .reserve(&ReserveRequest::single("ref-2", &a, 1))
        .await
        .unwrap();
    assert!(
        matches!(first, ReserveOutcome::Reserved { .. }),
        "{first:?}"
    );
    assert!(matches!(
        engine
            .reserve(&ReserveRequest::single("ref-2", &c, 1))
            .await
            .unwrap(),
        ReserveOutcome::Conflict { .. }
    ));
    assert!(
        matches!(
            engine
                .reserve(&ReserveRequest::single("ref-2", &a, 1))
                .await
                .unwrap(),
            ReserveOutcome::AlreadyReserved { .. }
        ),
        "the first request's retry is not blocked by the conflicting one"
    );
}

#[tokio::test]
async fn one_id_raced_as_a_cart_and_as_a_one_shard_hold_holds_at_most_once() {
    let redis = TestRedis::start();
    let (left, right) = (redis.engine().await, redis.engine().await);
    // Three SKUs in three different shards: a cart over two, a hold in the third.
    let skus = skus_in_distinct_shards(&left, "TRI", 3);
    for sku in &skus {
        stock(&left, sku, 1_000).await;
    }
    let line = |sku: &String| Line {
        sku: sku.clone(),
        qty: 1,
    };
    let mut held = 0;
    for i in 0..200 {
        let id = format!("tri-{i}");
        let cart = ReserveRequest {
            reservation_id: id.clone(),
            lines: vec![line(&skus[0]), line(&skus[1])],
            buyer: None,
            ttl_ms: None,
        };
        let single = ReserveRequest::single(&id, &skus[2], 1);
        let (x, y) = tokio::join!(left.reserve(&cart), right.reserve(&single));
        let (x, y) = (x.unwrap(), y.unwrap());
        let made = [&x, &y]
            .iter()
            .filter(|o| matches!(o, ReserveOutcome::Reserved { .. }))
            .count();
        assert!(made <= 1, "{id}: {x:?} and {y:?}");
        let lines = left.hold(&id).await.unwrap().map_or(0, |h| h.lines.len());
        assert!(
            lines == 0
                || (made == 1
                    && lines
                        == if matches!(x, ReserveOutcome::Reserved { .. }) {
                            2
                        } else {
                            1
                        }),
            "{id}: {lines} lines held after {x:?} and {y:?}"
        );
        held += lines as i64;
    }
    let reserved: i64 = {
        let mut sum = 0;
        for sku in &skus {
            sum += left.figures(sku).await.unwrap().unwrap().reserved;
        }
        sum
    };
    assert_eq!(
        reserved, held,
        "every unit reserved belongs to a hold answered"
    );
}

#[tokio::test]
async fn a_refusal_in_either_path_keeps_the_id_from_another_request() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let skus = skus_in_distinct_shards(&engine, "REF", 3);
    stock(&engine, &skus[0], 5).await;
    stock(&engine, &skus[1], 5).await;
    stock(&engine, &skus[2], 0).await;
    let cart = |id: &str, a: &String, b: &String| ReserveRequest {
        reservation_id: id.into(),
        lines: vec![
            Line {
                sku: a.clone(),
                qty: 1,
            },
            Line {
                sku: b.clone(),
                qty: 1,
            },
        ],
        buyer: None,
        ttl_ms: None,
    };
    // A one-shard refusal, then a cart over two other shards under its id.
    let refused = engine
        .reserve(&ReserveRequest::single("r-1", &skus[2], 1))
        .await
        .unwrap();
    assert!(
        matches!(refused, ReserveOutcome::SoldOut { .. }),
        "{refused:?}"
    );
    let again = engine
        .reserve(&cart("r-1", &skus[0], &skus[1]))
        .await
        .unwrap();
    assert!(
        matches!(again, ReserveOutcome::Conflict { .. }),
        "{again:?}"
    );
    // A cart refused, then a one-shard hold under its id.
    let refused = engine
        .reserve(&cart("r-2", &skus[0], &skus[2]))
        .await
        .unwrap();
    assert!(
        matches!(refused, ReserveOutcome::SoldOut { .. }),
        "{refused:?}"
    );
    let again = engine
        .reserve(&ReserveRequest::single("r-2", &skus[1], 1))
        .await
        .unwrap();
    assert!(
        matches!(again, ReserveOutcome::Conflict { .. }),
        "{again:?}"
    );
    for sku in &skus[..2] {
        let f = engine.figures(sku).await.unwrap().unwrap();
        assert_eq!((f.available, f.reserved), (5, 0), "{sku}: nothing moved");
    }
}

#[tokio::test]
async fn a_retry_stands_while_a_conflicting_attempt_is_in_flight() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let (a, _, c) = skus_same_and_other_shard(&engine);
    stock(&engine, &a, 5).await;
    let first = engine
        .reserve(&ReserveRequest::single("fly-1", &a, 1))
        .await
        .unwrap();
    assert!(
        matches!(first, ReserveOutcome::Reserved { .. }),
        "{first:?}"
    );
    // Another request's attempt under the id, caught between its write and its
    // look (it will see the first hold and undo itself).
    let ks = engine.keyspace();
    let mut conn = redis.connection().await;
    redis::cmd("HSET")
        .arg(ks.hold(ks.shard_of(&c), "fly-1"))
        .arg("state")
        .arg("held")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    assert!(
        matches!(
            engine
                .reserve(&ReserveRequest::single("fly-1", &a, 1))
                .await
                .unwrap(),
            ReserveOutcome::AlreadyReserved { .. }
        ),
        "the retry of the hold that stands"
    );
}

#[tokio::test]
async fn copies_of_two_requests_under_one_id_are_told_201_only_for_the_hold_that_stays() {
    let redis = TestRedis::start();
    let engines = [
        redis.engine().await,
        redis.engine().await,
        redis.engine().await,
    ];
    let (a, _, c) = skus_same_and_other_shard(&engines[0]);
    stock(&engines[0], &a, 10_000).await;
    stock(&engines[0], &c, 10_000).await;
    let mut held = 0;
    for i in 0..150 {
        let id = format!("dup-{i}");
        let (to_a, to_c) = (
            ReserveRequest::single(&id, &a, 1),
            ReserveRequest::single(&id, &c, 1),
        );
        // Three copies of each request, interleaved over three connections.
        let (a1, c1, a2, c2, a3, c3) = tokio::join!(
            engines[0].reserve(&to_a),
            engines[1].reserve(&to_c),
            engines[2].reserve(&to_a),
            engines[0].reserve(&to_c),
            engines[1].reserve(&to_a),
            engines[2].reserve(&to_c),
        );
        let told = |o: &ReserveOutcome| {
            matches!(
                o,
                ReserveOutcome::Reserved { .. } | ReserveOutcome::AlreadyReserved { .. }
            )
        };
        let a_told = [a1.unwrap(), a2.unwrap(), a3.unwrap()].iter().any(told);
        let c_told = [c1.unwrap(), c2.unwrap(), c3.unwrap()].iter().any(told);
        assert!(
            !(a_told && c_told),
            "{id}: both requests were told they hold"
        );
        let hold = engines[0].hold(&id).await.unwrap();
        let held_sku = hold.as_ref().map(|h| h.lines[0].sku.clone());
        let want = if a_told {
            Some(a.clone())
        } else if c_told {
            Some(c.clone())
        } else {
            None
        };
        assert_eq!(held_sku, want, "{id}: the hold is the one answered");
        held += i64::from(hold.is_some());
    }
    let reserved = engines[0].figures(&a).await.unwrap().unwrap().reserved
        + engines[0].figures(&c).await.unwrap().unwrap().reserved;
    assert_eq!(reserved, held);
}

#[tokio::test]
async fn a_request_refused_from_memory_stays_refused_and_holds_nothing() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    stock(&engine, "MEM-1", 0).await;
    let req = ReserveRequest::single("mem-1", "MEM-1", 1);
    let refused = ReserveOutcome::SoldOut {
        sku: "MEM-1".into(),
        available: 0,
        replayed: true,
    };
    assert_eq!(
        engine.refuse_from_memory(&req, "MEM-1").await.unwrap(),
        Some(refused.clone())
    );
    // Stock comes back; the same request reaches the script: still refused,
    // and the hold the script made is undone.
    stock(&engine, "MEM-1", 3).await;
    assert_eq!(engine.reserve(&req).await.unwrap(), refused);
    let f = engine.figures("MEM-1").await.unwrap().unwrap();
    assert_eq!((f.available, f.reserved), (3, 0));
    assert_eq!(engine.hold("mem-1").await.unwrap(), None);
    // Another request under the id: a conflict, from memory or not.
    let other = ReserveRequest::single("mem-1", "MEM-1", 2);
    assert!(matches!(
        engine.refuse_from_memory(&other, "MEM-1").await.unwrap(),
        Some(ReserveOutcome::Conflict { .. })
    ));
    assert!(matches!(
        engine.reserve(&other).await.unwrap(),
        ReserveOutcome::Conflict { .. }
    ));
}

#[tokio::test]
async fn what_another_request_left_under_an_id_is_not_part_of_the_owners_hold() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let (a, _, c) = skus_same_and_other_shard(&engine);
    stock(&engine, &a, 5).await;
    let made = engine
        .reserve(&ReserveRequest::single("own-1", &a, 1))
        .await
        .unwrap();
    assert!(matches!(made, ReserveOutcome::Reserved { .. }), "{made:?}");
    // A non-owner's undo cut short left a released hash in another shard.
    let ks = engine.keyspace();
    let mut conn = redis.connection().await;
    redis::cmd("HSET")
        .arg(ks.hold(ks.shard_of(&c), "own-1"))
        .arg(&[
            "state",
            "released",
            "lines",
            &format!("{c}=1"),
            "fp",
            "|other",
            "deadline",
            "0",
        ])
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let hold = engine.hold("own-1").await.unwrap().unwrap();
    assert_eq!(hold.lines.len(), 1, "only the owner's line: {hold:?}");
    assert_eq!(
        engine.confirm("own-1").await.unwrap(),
        ConfirmOutcome::Confirmed
    );
}

/// The words a raw-Redis benchmark replays (`Engine::reserve_words`) hold a
/// unit exactly as the engine does: a fresh id is held, the same id again is a
/// retry that holds nothing more (a benchmark whose words the script refused
/// once measured a script that did no work).
#[tokio::test]
async fn the_words_a_benchmark_replays_reserve_like_the_engine() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    stock(&engine, "WORDS-1", 10).await;
    // Loads the script, as a benchmark does before it replays the words.
    engine
        .reserve(&ReserveRequest::single("words-0", "WORDS-1", 1))
        .await
        .unwrap();
    let mut conn = redis.connection().await;
    let mut replay = async |rid: &str| -> Vec<redis::Value> {
        let words = engine
            .reserve_words(&ReserveRequest::single(rid, "WORDS-1", 2))
            .unwrap();
        assert_eq!(words[0], "EVALSHA");
        let mut cmd = redis::cmd(&words[0]);
        for w in &words[1..] {
            cmd.arg(w);
        }
        cmd.query_async(&mut conn).await.unwrap()
    };
    let first = replay("words-1").await;
    assert_eq!(
        redis::from_redis_value_ref::<String>(&first[0]).unwrap(),
        "reserved",
        "{first:?}"
    );
    let again = replay("words-1").await;
    assert_eq!(
        redis::from_redis_value_ref::<String>(&again[0]).unwrap(),
        "retry",
        "{again:?}"
    );
    let f = engine.figures("WORDS-1").await.unwrap().unwrap();
    assert_eq!((f.available, f.reserved), (7, 3));
    let hold = engine.hold("words-1").await.unwrap().unwrap();
    assert_eq!(hold.state, HoldState::Held);
}

/// Every command Redis has run so far, summed over every command name
/// (scripts' own commands included).
async fn commands_run(redis: &TestRedis) -> u64 {
    redis
        .command_stats()
        .await
        .values()
        .map(|(calls, _)| calls)
        .sum()
}

#[tokio::test]
async fn a_hold_made_under_a_claim_its_request_made_before_is_remembered() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    // First asked before the SKU was warmed: the id is claimed for this
    // request, and the answer is not kept, so the retry makes the hold.
    let early = ReserveRequest::single("early-1", "LATE-WARM-1", 1);
    assert!(matches!(
        engine.reserve(&early).await.unwrap(),
        ReserveOutcome::NotWarmed { .. }
    ));
    stock(&engine, "LATE-WARM-1", 5).await;
    assert!(matches!(
        engine.reserve(&early).await.unwrap(),
        ReserveOutcome::Reserved { .. }
    ));
    // A hold whose id was claimed by the call that made it.
    let fresh = ReserveRequest::single("fresh-1", "LATE-WARM-1", 1);
    assert!(matches!(
        engine.reserve(&fresh).await.unwrap(),
        ReserveOutcome::Reserved { .. }
    ));
    // The first confirm loads its script: not counted.
    engine
        .reserve(&ReserveRequest::single("warm-1", "LATE-WARM-1", 1))
        .await
        .unwrap();
    engine.confirm("warm-1").await.unwrap();
    // Both are confirmed from memory, in the same commands: no look-up first.
    let mut cost = Vec::new();
    for rid in ["fresh-1", "early-1"] {
        let before = commands_run(&redis).await;
        assert!(matches!(
            engine.confirm(rid).await.unwrap(),
            ConfirmOutcome::Confirmed
        ));
        // Less the reading of the statistics itself.
        cost.push(commands_run(&redis).await - before - 1);
    }
    assert_eq!(cost[0], cost[1], "commands per confirm: {cost:?}");
}

#[tokio::test]
async fn two_lines_on_one_counter_are_refused_before_anything_moves() {
    // The script reads each counter once and writes it from that read.
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    stock(&engine, "SHARED-1", 1).await;
    stock(&engine, "OTHER-1", 1).await;
    // Loads the script, which the words below run by its SHA.
    engine
        .reserve(&ReserveRequest::single("shared-0", "SHARED-1", 1))
        .await
        .unwrap();
    engine.release("shared-0").await.unwrap();
    // Two lines whose counter keys are one and the same, as only a caller
    // bypassing the engine could send: each line alone would pass the stock
    // check against the one unit.
    let words = engine
        .reserve_words(&ReserveRequest::single("shared-1", "SHARED-1", 1))
        .unwrap();
    let keys: usize = words[2].parse().unwrap();
    let (key_words, arg_words) = words[3..].split_at(keys);
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(&words[1])
        .arg(keys + 3)
        .arg(key_words)
        .arg(&key_words[3..]);
    cmd.arg(&arg_words[..8])
        .arg("SHARED-1")
        .arg(1)
        .arg("OTHER-1")
        .arg(1);
    let mut conn = redis.connection().await;
    let reply: Vec<redis::Value> = cmd.query_async(&mut conn).await.unwrap();
    let tag = redis::from_redis_value_ref::<String>(&reply[0]).unwrap();
    assert_eq!(tag, "invalid", "{reply:?}");
    let f = engine.figures("SHARED-1").await.unwrap().unwrap();
    assert_eq!((f.available, f.reserved), (1, 0), "nothing moved");
}
