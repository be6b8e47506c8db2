//! Confirm, release, expiry through the reaper, locks, and the event stream.

use std::time::Duration;

use holdfast_engine::events::{EventKind, EventReader, StreamCursor};
use holdfast_engine::testkit::{TestRedis, skus_same_and_other_shard, stock};
use holdfast_engine::{
    ConfirmOutcome, HoldState, Line, ReleaseOutcome, ReserveOutcome, ReserveRequest,
};

#[tokio::test]
async fn confirm_moves_stock_once_and_release_is_exactly_once() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    stock(&engine, "SKU-C", 10).await;

    engine
        .reserve(&ReserveRequest::single("pay-1", "SKU-C", 3))
        .await
        .unwrap();
    assert_eq!(
        engine.confirm("pay-1").await.unwrap(),
        ConfirmOutcome::Confirmed
    );
    assert_eq!(
        engine.confirm("pay-1").await.unwrap(),
        ConfirmOutcome::AlreadyConfirmed
    );
    let f = engine.figures("SKU-C").await.unwrap().unwrap();
    assert_eq!(
        (f.available, f.reserved, f.sold_pending, f.sold),
        (7, 0, 3, 3),
        "moved once"
    );
    assert_eq!(
        engine.release("pay-1").await.unwrap(),
        ReleaseOutcome::AlreadyGone {
            state: HoldState::Confirmed
        },
        "a confirmed sale is not released"
    );

    engine
        .reserve(&ReserveRequest::single("drop-1", "SKU-C", 2))
        .await
        .unwrap();
    assert_eq!(
        engine.release("drop-1").await.unwrap(),
        ReleaseOutcome::Released
    );
    for _ in 0..3 {
        assert_eq!(
            engine.release("drop-1").await.unwrap(),
            ReleaseOutcome::AlreadyGone {
                state: HoldState::Released
            }
        );
    }
    let f = engine.figures("SKU-C").await.unwrap().unwrap();
    assert_eq!(
        (f.available, f.reserved, f.sold_pending),
        (7, 0, 3),
        "released once"
    );
    assert_eq!(
        engine.confirm("drop-1").await.unwrap(),
        ConfirmOutcome::Expired {
            state: HoldState::Released
        },
        "paying for a released hold is a late payment"
    );
    assert_eq!(
        engine.confirm("never-made").await.unwrap(),
        ConfirmOutcome::Unknown
    );
    assert_eq!(
        engine.release("never-made").await.unwrap(),
        ReleaseOutcome::Unknown
    );
    assert_eq!(engine.figures("SKU-C").await.unwrap().unwrap().available, 7);
}

/// The process that made a hold confirms or releases it from memory (one Redis
/// call), any other after looking it up; the answers are the same. Memory that
/// no longer matches Redis (its data lost and the id taken by another request
/// since) is never acted on: the hold in Redis is the one confirmed.
#[tokio::test]
async fn a_hold_known_from_memory_is_never_mistaken_for_another() {
    let redis = TestRedis::start();
    let maker = redis.engine().await;
    let other = redis.engine().await;
    stock(&maker, "MEM-1", 5).await;
    maker
        .reserve(&ReserveRequest::single("mem-1", "MEM-1", 2))
        .await
        .unwrap();
    assert_eq!(
        other.release("mem-1").await.unwrap(),
        ReleaseOutcome::Released
    );
    let gone = HoldState::Released;
    assert_eq!(
        maker.confirm("mem-1").await.unwrap(),
        ConfirmOutcome::Expired { state: gone }
    );
    assert_eq!(
        maker.release("mem-1").await.unwrap(),
        ReleaseOutcome::AlreadyGone { state: gone }
    );
    assert_eq!(maker.figures("MEM-1").await.unwrap().unwrap().available, 5);

    // Redis loses everything; another request takes the id (the same line,
    // for a buyer). The maker still remembers its own hold.
    let mut conn = redis.connection().await;
    redis::cmd("FLUSHALL")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    stock(&maker, "MEM-1", 5).await;
    let taken = ReserveRequest {
        buyer: Some("buyer-b".into()),
        ..ReserveRequest::single("mem-1", "MEM-1", 1)
    };
    assert!(matches!(
        other.reserve(&taken).await.unwrap(),
        ReserveOutcome::Reserved { .. }
    ));
    let (outcome, shown) = maker.confirm_showing("mem-1", None).await.unwrap();
    assert_eq!(outcome, ConfirmOutcome::Confirmed);
    let shown = shown.unwrap();
    assert_eq!(
        (shown.buyer.as_deref(), shown.lines[0].qty),
        (Some("buyer-b"), 1),
        "the hold in Redis, not the one remembered"
    );
    let f = maker.figures("MEM-1").await.unwrap().unwrap();
    assert_eq!((f.available, f.reserved, f.sold), (4, 0, 1));

    // Released from memory after the maker's own hold: one unit back, once.
    maker
        .reserve(&ReserveRequest::single("mem-2", "MEM-1", 3))
        .await
        .unwrap();
    assert_eq!(
        maker.release("mem-2").await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(
        other.release("mem-2").await.unwrap(),
        ReleaseOutcome::AlreadyGone { state: gone }
    );
    assert_eq!(maker.figures("MEM-1").await.unwrap().unwrap().available, 4);

    // The id taken after a loss by a hold of more lines (here already paid):
    // whatever its state, memory's one line is not it.
    let (a, b, _) = skus_same_and_other_shard(&maker);
    stock(&maker, &a, 5).await;
    stock(&maker, &b, 5).await;
    maker
        .reserve(&ReserveRequest::single("mem-3", &a, 1))
        .await
        .unwrap();
    redis::cmd("FLUSHALL")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    stock(&maker, &a, 5).await;
    stock(&maker, &b, 5).await;
    let two = ReserveRequest {
        lines: [&a, &b]
            .map(|sku| Line {
                sku: sku.clone(),
                qty: 1,
            })
            .to_vec(),
        ..ReserveRequest::single("mem-3", &a, 1)
    };
    assert!(matches!(
        other.reserve(&two).await.unwrap(),
        ReserveOutcome::Reserved { .. }
    ));
    assert_eq!(
        other.confirm("mem-3").await.unwrap(),
        ConfirmOutcome::Confirmed
    );
    let (outcome, shown) = maker.confirm_showing("mem-3", None).await.unwrap();
    assert_eq!(
        (outcome, shown.map(|h| h.lines.len())),
        (ConfirmOutcome::AlreadyConfirmed, Some(2))
    );
    let (outcome, shown) = maker.release_showing("mem-3", None).await.unwrap();
    assert_eq!(
        (outcome, shown.map(|h| h.lines.len())),
        (
            ReleaseOutcome::AlreadyGone {
                state: HoldState::Confirmed
            },
            Some(2)
        )
    );
}

#[tokio::test]
async fn confirm_after_the_deadline_is_expired_and_moves_no_stock_to_sold() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    stock(&engine, "SKU-D", 5).await;
    engine
        .reserve(&ReserveRequest::single("late-1", "SKU-D", 2).with_ttl_ms(1_000))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_100)).await;

    // No reaper has run: the confirm itself notices the deadline.
    assert_eq!(
        engine.confirm("late-1").await.unwrap(),
        ConfirmOutcome::Expired {
            state: HoldState::Expired
        }
    );
    let f = engine.figures("SKU-D").await.unwrap().unwrap();
    assert_eq!(
        (f.available, f.reserved, f.sold_pending, f.sold),
        (5, 0, 0, 0)
    );
    assert_eq!(
        engine.confirm("late-1").await.unwrap(),
        ConfirmOutcome::Expired {
            state: HoldState::Expired
        }
    );
    let report = engine.reap_once(100).await.unwrap();
    assert_eq!(report.released, 0, "nothing left for the reaper");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_reapers_release_each_expired_hold_once() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    stock(&engine, "SKU-E", 300).await;
    for i in 0..200 {
        let r = engine
            .reserve(&ReserveRequest::single(format!("h-{i}"), "SKU-E", 1).with_ttl_ms(1_000))
            .await
            .unwrap();
        assert!(matches!(r, ReserveOutcome::Reserved { .. }));
    }
    engine
        .reserve(&ReserveRequest::single("long-1", "SKU-E", 1))
        .await
        .unwrap();
    assert_eq!(
        engine.figures("SKU-E").await.unwrap().unwrap().available,
        99
    );
    tokio::time::sleep(Duration::from_millis(1_100)).await;

    let reaper = |engine: holdfast_engine::Engine| async move {
        let mut released = 0;
        loop {
            let report = engine.reap_once(25).await.unwrap();
            released += report.released;
            if report.due == 0 {
                return released;
            }
        }
    };
    let (a, b) = tokio::join!(
        tokio::spawn(reaper(engine.clone())),
        tokio::spawn(reaper(engine.clone()))
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a + b, 200, "each hold released exactly once ({a} + {b})");
    let f = engine.figures("SKU-E").await.unwrap().unwrap();
    assert_eq!(
        (f.available, f.reserved, f.open_holds),
        (299, 1, 1),
        "only the long hold remains"
    );
    assert_eq!(
        engine.release("h-7").await.unwrap(),
        ReleaseOutcome::AlreadyGone {
            state: HoldState::Expired
        }
    );
}

#[tokio::test]
async fn the_reaper_worker_returns_holds_by_itself() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    stock(&engine, "SKU-F", 4).await;
    for i in 0..4 {
        engine
            .reserve(&ReserveRequest::single(format!("w-{i}"), "SKU-F", 1).with_ttl_ms(1_000))
            .await
            .unwrap();
    }
    let stats = std::sync::Arc::new(holdfast_engine::reaper::ReaperStats::default());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(holdfast_engine::reaper::run_reaper(
        engine.clone(),
        holdfast_engine::reaper::ReaperConfig {
            interval: Duration::from_millis(100),
            batch: 2,
        },
        stats.clone(),
        async move {
            let _ = rx.await;
        },
    ));
    let mut back = false;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if engine.figures("SKU-F").await.unwrap().unwrap().available == 4 {
            back = true;
            break;
        }
    }
    tx.send(()).unwrap();
    worker.await.unwrap();
    assert!(back, "expired holds came back within 4 s");
    assert_eq!(stats.released.load(std::sync::atomic::Ordering::Relaxed), 4);
}

#[tokio::test]
async fn locks_belong_to_their_holder_and_fences_only_grow() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let lease = engine
        .acquire_lock("reconcile:DROP-1", Duration::from_millis(800))
        .await
        .unwrap()
        .unwrap();
    assert!(
        engine
            .acquire_lock("reconcile:DROP-1", Duration::from_secs(5))
            .await
            .unwrap()
            .is_none(),
        "held"
    );

    let thief = holdfast_engine::locks::Lease {
        token: "not-the-token".into(),
        ..lease.clone()
    };
    assert!(
        !engine.release_lock(&thief).await.unwrap(),
        "another token cannot release"
    );
    assert!(
        !engine
            .extend_lock(&thief, Duration::from_secs(5))
            .await
            .unwrap(),
        "nor extend"
    );
    assert!(
        engine
            .extend_lock(&lease, Duration::from_millis(800))
            .await
            .unwrap()
    );

    let listed = engine.list_locks().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, "reconcile:DROP-1");
    assert_eq!(listed[0].holder, lease.token);
    assert_eq!(listed[0].fence, lease.fence);
    assert!(listed[0].remaining_ms > 0 && listed[0].remaining_ms <= 800);

    // The holder stops extending: the lease lapses and the next holder gets a larger fence.
    tokio::time::sleep(Duration::from_millis(900)).await;
    let next = engine
        .acquire_lock("reconcile:DROP-1", Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert!(next.fence > lease.fence, "{} > {}", next.fence, lease.fence);
    assert!(
        !engine.release_lock(&lease).await.unwrap(),
        "the lapsed holder cannot release the new lease"
    );
    assert!(engine.release_lock(&next).await.unwrap());
    let third = engine
        .acquire_lock("reconcile:DROP-1", Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert!(third.fence > next.fence);
    assert!(engine.force_release_lock("reconcile:DROP-1").await.unwrap());
    assert!(engine.list_locks().await.unwrap().is_empty());
}

#[tokio::test]
async fn every_change_is_one_event_with_the_figures_after_it() {
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    let mut reader = EventReader::new(redis.connection().await, engine.keyspace());
    let mut cursor = reader.tail_cursor().await.unwrap();
    stock(&engine, "SKU-G", 10).await;
    engine
        .reserve(&ReserveRequest::single("ev-1", "SKU-G", 2))
        .await
        .unwrap();
    engine.confirm("ev-1").await.unwrap();
    engine
        .reserve(&ReserveRequest::single("ev-2", "SKU-G", 1))
        .await
        .unwrap();
    engine.release("ev-2").await.unwrap();
    engine
        .reserve(&ReserveRequest::single("ev-3", "SKU-G", 99))
        .await
        .unwrap(); // invalid: no event
    engine
        .reserve(&ReserveRequest::single("ev-4", "SKU-G", 9))
        .await
        .unwrap(); // sold out: no event

    let events = reader
        .read(&mut cursor, 100, Some(Duration::from_millis(100)))
        .await
        .unwrap();
    let kinds: Vec<EventKind> = events.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        vec![
            EventKind::Warmed,
            EventKind::Reserved,
            EventKind::Confirmed,
            EventKind::Reserved,
            EventKind::Released
        ]
    );
    let confirmed = &events[2];
    assert_eq!(confirmed.reservation_id.as_deref(), Some("ev-1"));
    assert_eq!(
        (
            confirmed.qty,
            confirmed.available,
            confirmed.reserved,
            confirmed.sold_pending
        ),
        (2, Some(8), Some(0), Some(2))
    );
    let last = events.last().unwrap();
    assert_eq!(
        (last.available, last.reserved, last.sold_pending),
        (Some(8), Some(0), Some(2))
    );

    // Resuming from an encoded cursor yields only what came after it.
    let saved = StreamCursor::decode(&cursor.encode(), engine.keyspace().shards()).unwrap();
    engine
        .reserve(&ReserveRequest::single("ev-5", "SKU-G", 1))
        .await
        .unwrap();
    let mut resumed = saved;
    let more = reader
        .read(&mut resumed, 100, Some(Duration::from_millis(100)))
        .await
        .unwrap();
    assert_eq!(more.len(), 1);
    assert_eq!(more[0].reservation_id.as_deref(), Some("ev-5"));
}

#[tokio::test]
async fn deltas_apply_once_and_stale_snapshots_are_refused() {
    use holdfast_engine::stock::{DeltaOutcome, SnapshotOutcome};
    let redis = TestRedis::start();
    let engine = redis.engine().await;
    assert_eq!(
        engine.apply_delta("SKU-H", 5, "erp", "e1").await.unwrap(),
        DeltaOutcome::NotWarmed
    );
    stock(&engine, "SKU-H", 10).await;
    assert_eq!(
        engine.apply_delta("SKU-H", 50, "erp", "e1").await.unwrap(),
        DeltaOutcome::Applied {
            available: 60,
            owed: 0
        }
    );
    assert_eq!(
        engine.apply_delta("SKU-H", 50, "erp", "e1").await.unwrap(),
        DeltaOutcome::Duplicate
    );
    engine
        .reserve(&ReserveRequest::single("snap-1", "SKU-H", 5))
        .await
        .unwrap();
    assert_eq!(
        engine.apply_delta("SKU-H", -70, "erp", "e2").await.unwrap(),
        DeltaOutcome::Applied {
            available: 0,
            owed: 15
        },
        "held units cannot be taken back: available stops at 0 and the rest is owed"
    );

    // Snapshot: on_hand 30 with 5 held -> 25 available.
    assert_eq!(
        engine
            .apply_snapshot("SKU-H", 30, 7, "erp", "s1")
            .await
            .unwrap(),
        SnapshotOutcome::Applied {
            available: 25,
            previous: 0,
            owed: 0
        }
    );
    assert_eq!(
        engine
            .apply_snapshot("SKU-H", 500, 6, "erp", "s2")
            .await
            .unwrap(),
        SnapshotOutcome::Stale { current_version: 7 }
    );
    assert_eq!(
        engine
            .apply_snapshot("SKU-H", 500, 7, "erp", "s3")
            .await
            .unwrap(),
        SnapshotOutcome::Stale { current_version: 7 }
    );
    let f = engine.figures("SKU-H").await.unwrap().unwrap();
    assert_eq!(
        (f.available, f.reserved),
        (25, 5),
        "a stale snapshot changes nothing"
    );
}
