//! A change of a split SKU's parts whose process stalls past its lease (a
//! long pause, a network that holds its packets) and then carries on, after
//! another change took the lease and finished. The stall is real: the stalled
//! engine talks to Redis through a proxy in this test that holds its traffic
//! from the first step of a chosen kind until told to let it through (its
//! client waits for the answer as a paused process would). Each test states
//! the invariant it checks.
//!
//! Single node only: the proxy fronts one server (the fencing it tests is a
//! field of each part's counter, the same on a cluster).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use holdfast_engine::keys::{Keyspace, part_name};
use holdfast_engine::reconcile::{ReconcileOptions, reconcile_all};
use holdfast_engine::{
    Engine, EngineConfig, EngineError, ReserveOutcome, ReserveRequest, SplitOutcome, postgres,
};
use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// A gate in the proxy: once armed, the first chunk a client sends that
/// contains `trigger` (and everything after it on that connection) waits
/// until `open` is notified.
struct Gate {
    trigger: Vec<u8>,
    armed: AtomicBool,
    holding: Notify,
    open: Notify,
}

/// Starts a proxy to the Redis on `upstream`; its port.
async fn proxy(upstream: u16, gate: Arc<Gate>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = TcpStream::connect(("127.0.0.1", upstream)).await.unwrap();
            let (mut client_rx, mut client_tx) = client.into_split();
            let (mut server_rx, mut server_tx) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut server_rx, &mut client_tx).await;
            });
            let gate = gate.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match client_rx.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    let chunk = &buf[..n];
                    if gate.armed.load(Ordering::SeqCst)
                        && chunk.windows(gate.trigger.len()).any(|w| w == gate.trigger)
                        && gate.armed.swap(false, Ordering::SeqCst)
                    {
                        gate.holding.notify_one();
                        gate.open.notified().await;
                    }
                    if server_tx.write_all(chunk).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// An engine whose Redis traffic passes `gate`, waiting as long as it must
/// for an answer (a stalled process, not one that gives up).
async fn stalling_engine(redis_port: u16, gate: Arc<Gate>) -> Engine {
    let port = proxy(redis_port, gate).await;
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_secs(60)));
    let conn = redis::aio::ConnectionManager::new_with_config(client, config)
        .await
        .unwrap();
    Engine::new(conn, EngineConfig::default())
}

/// A change of `sku` to `parts` by an engine of its own whose traffic
/// stalls at its first `split.lua` or `move.lua` step of `mode` (a RESP
/// argument): returns once it is held there, with its task and its gate.
async fn stalled_change(
    pg: &PgPool,
    redis_port: u16,
    sku: &str,
    parts: u16,
    mode: &str,
) -> (JoinHandle<Result<SplitOutcome, EngineError>>, Arc<Gate>) {
    let gate = Arc::new(Gate {
        trigger: format!("${}\r\n{mode}\r\n", mode.len()).into_bytes(),
        armed: AtomicBool::new(true),
        holding: Notify::new(),
        open: Notify::new(),
    });
    let stalled = stalling_engine(redis_port, gate.clone()).await;
    let task = {
        let (pg, sku) = (pg.clone(), sku.to_owned());
        tokio::spawn(async move { stalled.set_parts(&pg, &sku, parts).await })
    };
    tokio::time::timeout(Duration::from_secs(10), gate.holding.notified())
        .await
        .unwrap_or_else(|_| panic!("the change never reached a '{mode}' step"));
    (task, gate)
}

/// Lets the stalled change through; what it answers.
async fn wake(
    task: JoinHandle<Result<SplitOutcome, EngineError>>,
    gate: &Gate,
) -> Result<SplitOutcome, EngineError> {
    gate.open.notify_one();
    let woke = tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("the stalled change ends once it wakes")
        .unwrap();
    eprintln!("the stalled change after it woke: {woke:?}");
    woke
}

async fn field(engine: &Engine, name: &str, field: &str) -> Option<i64> {
    redis::cmd("HGET")
        .arg(engine.keyspace().sku(name))
        .arg(field)
        .query_async(&mut engine.connection())
        .await
        .unwrap()
}

/// Each part's available units, part 0 first.
async fn availables(engine: &Engine, sku: &str, parts: u16) -> Vec<Option<i64>> {
    let mut out = Vec::new();
    for j in 0..parts {
        out.push(field(engine, &part_name(sku, j, parts), "available").await);
    }
    out
}

async fn pg_parts(pg: &PgPool, sku: &str) -> i16 {
    sqlx::query_scalar("SELECT parts FROM skus WHERE sku = $1")
        .bind(sku)
        .fetch_one(pg)
        .await
        .unwrap()
}

/// Holds one unit each for `n` new buyers; how many were held.
async fn hold_each(engine: &Engine, sku: &str, tag: &str, n: usize) -> usize {
    let mut held = 0;
    for i in 0..n {
        let r = engine
            .reserve(
                &ReserveRequest::single(format!("{tag}-{i}"), sku, 1)
                    .for_buyer(format!("{tag}-b{i}")),
            )
            .await
            .unwrap();
        match r {
            ReserveOutcome::Reserved { .. } => held += 1,
            ReserveOutcome::SoldOut { .. } => {}
            other => panic!("{tag}-{i}: {other:?}"),
        }
    }
    held
}

/// Invariant: a change whose lease lapsed acts on no part a newer change has
/// touched. Change A (1 -> 4) stalls at its first step, marking part 0 as
/// changing; its lease lapses; an operator's change to 2 parts takes the
/// lease and finishes; shoppers hold units. When A wakes, its step is
/// refused and it stops (busy): part 0 still says 2 parts (were A's mark and
/// its undo to "1 part" let through, the units on part 1 would be stranded
/// and a reconciliation reading part 0 alone would put them on sale twice),
/// every unit is still sold exactly once, and PostgreSQL records 2 parts.
#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_change_that_stalled_past_its_lease_acts_on_no_part_a_newer_change_touched(pg: PgPool) {
    let sku = "STALL-MARK";
    let (redis, b) = holdfast_engine::testkit::warmed_sku(&pg, sku, 100, 0).await;
    let engine = b.engine.clone();
    let (a, gate) = stalled_change(&pg, redis.port(), sku, 4, "mark").await;
    // Past A's lease (5 s).
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    assert_eq!(
        engine.set_parts(&pg, sku, 2).await.unwrap(),
        SplitOutcome::Changed { from: 1, to: 2 },
        "the lapsed lease is free for another change"
    );
    assert_eq!(hold_each(&engine, sku, "early", 10).await, 10);

    let woke = wake(a, &gate).await;
    assert!(
        matches!(woke, Err(EngineError::Busy(_))),
        "the stalled change stops: {woke:?}"
    );

    let part1 = part_name(sku, 1, 2);
    assert_eq!(
        field(&engine, sku, "parts").await,
        Some(2),
        "part 0's count"
    );
    assert_eq!(
        field(&engine, &part1, "parts").await,
        Some(2),
        "part 1's count"
    );
    assert_eq!(pg_parts(&pg, sku).await, 2, "PostgreSQL's count");
    let f = engine.figures(sku).await.unwrap().unwrap();
    assert_eq!((f.available, f.reserved, f.moving), (90, 10, 0), "{f:?}");

    // Reconciliation finds nothing to add, and the 90 units left are sold
    // exactly once, whichever part each buyer lands on.
    let run = reconcile_all(&engine, &pg, &ReconcileOptions::default(), |_| {})
        .await
        .unwrap();
    assert_eq!(run.drifted, 0, "Redis and PostgreSQL agree: {run:?}");
    assert_eq!(hold_each(&engine, sku, "late", 120).await, 90);
    let f = engine.figures(sku).await.unwrap().unwrap();
    assert_eq!((f.available, f.reserved), (0, 100), "{f:?}");
}

/// Invariant: a stalled change's forced transfer out of a part (which only
/// a change may make while the part is marked as changing) is refused once
/// a newer change touched the part. Change A (1 -> 4) stalls just before
/// moving part 0's units to its new parts; its lease lapses; the rebalancer
/// finishes the change (the count PostgreSQL recorded: 4 parts), spreading
/// the units evenly. A's late transfer moves nothing, and the SKU is still
/// even and whole.
#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_stalled_change_moves_no_units_after_another_finished_it(pg: PgPool) {
    let sku = "STALL-FORCE";
    let (redis, b) = holdfast_engine::testkit::warmed_sku(&pg, sku, 100, 0).await;
    let engine = b.engine.clone();
    let (a, gate) = stalled_change(&pg, redis.port(), sku, 4, "force").await;
    assert_eq!(
        field(&engine, sku, "parts").await,
        Some(0),
        "marked changing"
    );
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    assert!(
        engine.finish_change(&pg, sku).await.unwrap(),
        "the change cut short is finished by another"
    );
    let even = availables(&engine, sku, 4).await;
    assert_eq!(even, vec![Some(25); 4], "spread evenly by the finisher");

    let woke = wake(a, &gate).await;
    assert!(matches!(woke, Err(EngineError::Busy(_))), "{woke:?}");
    assert_eq!(
        availables(&engine, sku, 4).await,
        even,
        "the stalled change moved nothing"
    );
    assert_eq!(field(&engine, sku, "parts").await, Some(4));
    assert_eq!(hold_each(&engine, sku, "buyer", 110).await, 100);
}

/// Invariant: fencing never locks an operator out. A Redis that lost the
/// lease's token counter (its shard's data) while the parts kept theirs
/// still lets the next change through: its token starts above the largest
/// any part has seen.
#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_lost_token_counter_does_not_lock_changes_out(pg: PgPool) {
    let sku = "STALL-FLOOR";
    let (_redis, b) = holdfast_engine::testkit::warmed_sku(&pg, sku, 60, 0).await;
    let engine = b.engine.clone();
    for parts in [3, 2, 4] {
        assert!(matches!(
            engine.set_parts(&pg, sku, parts).await.unwrap(),
            SplitOutcome::Changed { .. }
        ));
    }
    let seen = field(&engine, sku, "fence").await.unwrap();
    assert!(seen >= 3, "every change raised part 0's token: {seen}");
    redis::cmd("DEL")
        .arg(Keyspace::fence(&format!("split:{sku}")))
        .query_async::<()>(&mut engine.connection())
        .await
        .unwrap();
    assert_eq!(
        engine.set_parts(&pg, sku, 1).await.unwrap(),
        SplitOutcome::Changed { from: 4, to: 1 }
    );
    assert!(field(&engine, sku, "fence").await.unwrap() > seen);
    let f = engine.figures(sku).await.unwrap().unwrap();
    assert_eq!(f.available, 60, "{f:?}");
}

/// Invariant: the per-buyer limit is per SKU, whatever a stalled change
/// does. 40 buyers bought their one allowed unit of an unsplit SKU. Change A
/// (1 -> 8) stalls while moving their counts to their new parts; its lease
/// lapses; the rebalancer finishes the change (the counts move to their
/// parts), and an operator merges the SKU back into one part (they move back
/// to part 0). When A wakes, it moves no count onto a part that is gone, so
/// no buyer can buy a second unit.
#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn a_stalled_change_moves_no_buyer_count_onto_a_part_that_is_gone(pg: PgPool) {
    let sku = "STALL-BUYERS";
    let (redis, b) = holdfast_engine::testkit::warmed_sku(&pg, sku, 500, 1).await;
    let engine = b.engine.clone();
    let buyers: Vec<String> = (0..40).map(|i| format!("limited-{i}")).collect();
    // What a confirmed purchase leaves in Redis once PostgreSQL recorded it.
    for buyer in &buyers {
        redis::cmd("SET")
            .arg(engine.keyspace().buyer(sku, buyer))
            .arg(1)
            .arg("PX")
            .arg(600_000)
            .query_async::<()>(&mut engine.connection())
            .await
            .unwrap();
    }
    let (a, gate) = stalled_change(&pg, redis.port(), sku, 8, "buyer_in").await;
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    assert!(engine.finish_change(&pg, sku).await.unwrap());
    assert_eq!(
        engine.set_parts(&pg, sku, 1).await.unwrap(),
        SplitOutcome::Changed { from: 8, to: 1 }
    );
    let woke = wake(a, &gate).await;
    assert!(matches!(woke, Err(EngineError::Busy(_))), "{woke:?}");
    assert_eq!(field(&engine, sku, "parts").await, Some(1));
    let again = holdfast_engine::testkit::past_their_limit(&engine, sku, &buyers, "again").await;
    assert!(again.is_empty(), "buyers past their limit of 1: {again:?}");
}
