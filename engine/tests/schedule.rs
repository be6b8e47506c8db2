//! A drop's schedule, decided inside `reserve.lua` against Redis' clock: before
//! the start `not_started`, from the end `ended`, holds taken in time still paid
//! after the end, a reschedule effective at once, and the schedule surviving a
//! Redis loss through warm-up.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use holdfast_domain::{ConfirmOutcome, ReserveOutcome, ReserveRequest};
use holdfast_engine::catalog::{self, DEMO_DROP};
use holdfast_engine::schedule::{self, DropSchedule, ScheduleOutcome};
use holdfast_engine::testkit::{TestRedis, backends};
use holdfast_engine::warmup::{WarmOptions, warm_all};
use holdfast_engine::{Backends, Engine};
use sqlx::PgPool;

fn at(ms: i64) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp_millis(ms)
}

fn hold(rid: &str, sku: &str) -> ReserveRequest {
    ReserveRequest {
        buyer: Some(format!("buyer-{rid}")),
        ..ReserveRequest::single(rid, sku, 1)
    }
}

async fn demo(pool: PgPool, redis: &TestRedis) -> Backends {
    catalog::load_demo_drop(&pool).await.unwrap();
    let b = backends(pool, &redis.url()).await;
    warm_all(&b.engine, &b.pg, WarmOptions::default(), |_| {})
        .await
        .unwrap();
    b
}

/// Reserves until the answer is no longer `not_started` (at most 10 s).
async fn first_sale(engine: &Engine, sku: &str) -> (ReserveOutcome, u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut tries = 0;
    loop {
        tries += 1;
        let outcome = engine
            .reserve(&hold(&format!("early-{tries}"), sku))
            .await
            .unwrap();
        if !matches!(outcome, ReserveOutcome::NotStarted { .. }) {
            return (outcome, tries);
        }
        assert!(Instant::now() < deadline, "the drop never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_drop_sells_from_its_start_until_its_end_by_redis_clock(pool: PgPool) {
    let redis = TestRedis::start();
    let b = demo(pool, &redis).await;
    let now = redis.now_ms().await;
    let (starts, ends) = (now + 1_500, now + 4_000);
    let scheduled = schedule::schedule_drop(
        &b.engine,
        &b.pg,
        DEMO_DROP,
        DropSchedule {
            starts_at: at(starts),
            ends_at: at(ends),
        },
    )
    .await
    .unwrap();
    assert_eq!(
        scheduled,
        ScheduleOutcome::Scheduled {
            counters: 6,
            not_warmed: 0
        }
    );

    // Before the start: refused, saying when, and nothing moved.
    let before = b.engine.figures("DROP-002").await.unwrap().unwrap();
    assert_eq!(
        b.engine
            .reserve(&hold("too-early", "DROP-002"))
            .await
            .unwrap(),
        ReserveOutcome::NotStarted {
            sku: "DROP-002".into(),
            starts_at_ms: starts
        }
    );
    assert_eq!(b.engine.figures("DROP-002").await.unwrap().unwrap(), before);

    // The first sale comes at the start by Redis' clock, not before.
    let (outcome, tries) = first_sale(&b.engine, "DROP-002").await;
    let sold_at = redis.now_ms().await;
    assert!(
        matches!(outcome, ReserveOutcome::Reserved { .. }),
        "{outcome:?}"
    );
    assert!(tries > 1, "it was refused before the start");
    assert!(
        sold_at >= starts,
        "sold at {sold_at}, before the start {starts}"
    );
    let ReserveOutcome::Reserved { reservation_id, .. } = outcome else {
        unreachable!()
    };

    // From the end: refused; the hold taken in time is still paid, and its retry
    // still answers with it.
    while redis.now_ms().await < ends {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        b.engine
            .reserve(&hold("too-late", "DROP-003"))
            .await
            .unwrap(),
        ReserveOutcome::Ended {
            sku: "DROP-003".into(),
            ended_at_ms: ends
        }
    );
    assert!(matches!(
        b.engine
            .reserve(&hold(&reservation_id, "DROP-002"))
            .await
            .unwrap(),
        ReserveOutcome::AlreadyReserved { .. }
    ));
    assert_eq!(
        b.engine.confirm(&reservation_id).await.unwrap(),
        ConfirmOutcome::Confirmed
    );

    // Rescheduled (no end): sells again at once.
    let open = DropSchedule {
        starts_at: at(starts),
        ends_at: None,
    };
    schedule::schedule_drop(&b.engine, &b.pg, DEMO_DROP, open)
        .await
        .unwrap();
    assert!(matches!(
        b.engine
            .reserve(&hold("reopened", "DROP-003"))
            .await
            .unwrap(),
        ReserveOutcome::Reserved { .. }
    ));
    assert_eq!(
        schedule::drop_schedule(&b.pg, DEMO_DROP).await.unwrap(),
        Some(open)
    );
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn the_schedule_survives_a_redis_loss_and_bad_schedules_change_nothing(pool: PgPool) {
    let redis = TestRedis::start();
    let b = demo(pool, &redis).await;
    let starts = redis.now_ms().await + 3_600_000;
    let later = DropSchedule {
        starts_at: at(starts),
        ends_at: None,
    };
    schedule::schedule_drop(&b.engine, &b.pg, DEMO_DROP, later)
        .await
        .unwrap();

    // Redis loses everything; warm-up rebuilds the counters with the schedule.
    let mut conn = redis.connection().await;
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    warm_all(&b.engine, &b.pg, WarmOptions::default(), |_| {})
        .await
        .unwrap();
    assert_eq!(
        b.engine
            .reserve(&hold("after-loss", "DROP-004"))
            .await
            .unwrap(),
        ReserveOutcome::NotStarted {
            sku: "DROP-004".into(),
            starts_at_ms: starts
        }
    );

    // An end before the start, the epoch (0 means "none" in Redis), a SKU shared
    // with another scheduled drop, or an unknown drop: refused, nothing changed.
    sqlx::query("INSERT INTO drops (code, name) VALUES ('spring', 'Spring')")
        .execute(&b.pg)
        .await
        .unwrap();
    sqlx::query("INSERT INTO drop_skus (drop_code, sku) VALUES ('spring', 'DROP-003')")
        .execute(&b.pg)
        .await
        .unwrap();
    for (code, bad) in [
        (
            DEMO_DROP,
            DropSchedule {
                starts_at: at(starts),
                ends_at: at(starts - 1_000),
            },
        ),
        (
            DEMO_DROP,
            DropSchedule {
                starts_at: None,
                ends_at: at(0),
            },
        ),
        (
            "spring",
            DropSchedule {
                starts_at: at(starts + 86_400_000),
                ends_at: None,
            },
        ),
    ] {
        let outcome = schedule::schedule_drop(&b.engine, &b.pg, code, bad)
            .await
            .unwrap();
        assert!(
            matches!(outcome, ScheduleOutcome::Invalid(_)),
            "{bad:?}: {outcome:?}"
        );
    }
    assert_eq!(
        schedule::drop_schedule(&b.pg, "spring").await.unwrap(),
        Some(DropSchedule::default()),
        "the shared SKU kept spring unscheduled"
    );
    assert_eq!(
        schedule::schedule_drop(&b.engine, &b.pg, "no-such-drop", later)
            .await
            .unwrap(),
        ScheduleOutcome::UnknownDrop
    );
    assert_eq!(
        schedule::drop_schedule(&b.pg, DEMO_DROP).await.unwrap(),
        Some(later)
    );
    assert!(matches!(
        b.engine
            .reserve(&hold("still-early", "DROP-004"))
            .await
            .unwrap(),
        ReserveOutcome::NotStarted { .. }
    ));
}

/// A counter left with another schedule or limit than PostgreSQL's (a process
/// killed between an import's commit and its Redis writes) is corrected by
/// `follow_catalogue`, which servers run at start and every minute; counters
/// that already follow are left alone.
#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn counters_left_behind_by_a_dead_process_follow_the_catalogue_again(pool: PgPool) {
    let redis = TestRedis::start();
    let b = demo(pool, &redis).await;
    let opens = redis.now_ms().await + 3_600_000;
    schedule::schedule_drop(
        &b.engine,
        &b.pg,
        DEMO_DROP,
        DropSchedule {
            starts_at: at(opens),
            ends_at: None,
        },
    )
    .await
    .unwrap();
    assert_eq!(
        schedule::follow_catalogue(&b.engine, &b.pg).await.unwrap(),
        0
    );
    // What a dead process left: the old window (none) and no limit.
    redis::cmd("HSET")
        .arg(b.engine.keyspace().sku("DROP-001"))
        .arg(&["opens", "0", "limit", "0"])
        .query_async::<()>(&mut redis.connection().await)
        .await
        .unwrap();
    let early = b.engine.reserve(&hold("early", "DROP-001")).await.unwrap();
    assert!(
        matches!(early, ReserveOutcome::Reserved { .. }),
        "{early:?}"
    );
    b.engine.release("early").await.unwrap();

    assert_eq!(
        schedule::follow_catalogue(&b.engine, &b.pg).await.unwrap(),
        1
    );
    let f = b.engine.figures("DROP-001").await.unwrap().unwrap();
    assert_eq!((f.opens_at_ms, f.per_buyer_limit), (opens, 2));
    let refused = b.engine.reserve(&hold("again", "DROP-001")).await.unwrap();
    assert!(
        matches!(refused, ReserveOutcome::NotStarted { .. }),
        "{refused:?}"
    );
}
