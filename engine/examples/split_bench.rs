//! Benchmark: one hot SKU, unsplit vs split into 4 and 8 parts, on one Redis
//! node and on a three-master Redis Cluster, the same number of clients, in
//! one run on private `redis-server`s:
//!
//! 1. plenty of stock: reserves/s, p50 and p99 of one-unit reservations;
//! 2. a sell-out: `--units` units and twice as many shoppers, every attempt
//!    decided; exactly the units held, how many reservations gathered from
//!    other parts and how many transfers that took.
//!
//! ```sh
//! cargo run --release -p holdfast-engine --example split_bench -- --clients 50 --seconds 5 --units 20000
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use holdfast_engine::testkit::{
    TestCluster, TestRedis, add_sku, flag, fresh_database, reserve_load,
};
use holdfast_engine::warmup::{WarmOptions, warm_all};
use holdfast_engine::{Engine, EngineConfig, ReserveOutcome, ReserveRequest, redis_conn};

/// One row of the table.
struct Row {
    redis: &'static str,
    parts: u16,
    rps: f64,
    p50: f64,
    p99: f64,
    sellout_ms: f64,
    held: u64,
    gathers: u64,
    multi: u64,
    moves: u64,
}

/// SKU `sku` with `units` units in the catalogue and in Redis, split into `parts`.
async fn prepare(engine: &Engine, pg: &sqlx::PgPool, sku: &str, units: i64, parts: u16) {
    add_sku(pg, sku, units).await;
    warm_all(engine, pg, WarmOptions::default(), |_| {})
        .await
        .expect("warm");
    engine.set_parts(pg, sku, parts).await.expect("split");
}

/// `shoppers` one-unit reservations by `clients` tasks: every one decided;
/// (held, elapsed ms).
async fn sell_out(engine: &Engine, sku: &str, clients: u64, shoppers: u64) -> (u64, f64) {
    let next = Arc::new(AtomicU64::new(0));
    let held = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (engine, next, held, sku) =
            (engine.clone(), next.clone(), held.clone(), sku.to_owned());
        tasks.spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= shoppers {
                    break;
                }
                let req = ReserveRequest::single(format!("{sku}-{n}"), &sku, 1);
                match engine.reserve(&req).await {
                    Ok(ReserveOutcome::Reserved { .. }) => {
                        held.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(ReserveOutcome::SoldOut { .. })
                    | Err(holdfast_engine::EngineError::Busy(_)) => {}
                    other => panic!("unexpected {other:?}"),
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    (
        held.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64() * 1_000.0,
    )
}

async fn measure(
    engine: &Engine,
    pg: &sqlx::PgPool,
    redis: &'static str,
    parts: u16,
    (clients, seconds, units): (u64, u64, i64),
) -> Row {
    let tag = if redis == "one node" { "N" } else { "C" };
    let plenty = format!("PLENTY-{tag}{parts}");
    prepare(engine, pg, &plenty, 1_000_000_000, parts).await;
    let (rps, p50, p99) = reserve_load(engine, clients, seconds, move |_| plenty.clone()).await;
    let sku = format!("SELLOUT-{tag}{parts}");
    prepare(engine, pg, &sku, units, parts).await;
    let before = engine.split_stats();
    let (held, sellout_ms) = sell_out(engine, &sku, clients, units as u64 * 2).await;
    let after = engine.split_stats();
    assert_eq!(held, units as u64, "exactly the units are held");
    let f = engine.figures(&sku).await.expect("figures").expect("warm");
    assert_eq!(
        (f.available, f.reserved, f.moving),
        (0, units, 0),
        "nothing oversold or stuck"
    );
    Row {
        redis,
        parts,
        rps,
        p50,
        p99,
        sellout_ms,
        held,
        gathers: after.gathers - before.gathers,
        multi: after.multi_part - before.multi_part,
        moves: after.moves - before.moves,
    }
}

#[tokio::main]
async fn main() {
    let clients = flag("--clients", 50);
    let seconds = flag("--seconds", 5);
    let units = flag("--units", 20_000) as i64;
    let (pg, _) = fresh_database("holdfast_split_bench").await;
    let mut rows = Vec::new();

    let node = TestRedis::start();
    let engine = Engine::new(node.connection().await, EngineConfig::default());
    for parts in [1, 4, 8] {
        rows.push(measure(&engine, &pg, "one node", parts, (clients, seconds, units)).await);
    }
    drop(node);
    let cluster = TestCluster::start(3, 0);
    let conn = redis_conn::connect(&cluster.url()).await.expect("cluster");
    let engine = Engine::new(conn, EngineConfig::default());
    for parts in [1, 4, 8] {
        rows.push(
            measure(
                &engine,
                &pg,
                "3-master cluster",
                parts,
                (clients, seconds, units),
            )
            .await,
        );
    }

    println!(
        "One hot SKU, {clients} clients; plenty of stock for {seconds} s, then {units} units and {} shoppers:\n",
        units * 2
    );
    println!(
        "| Redis | parts | reserves/s | p50 ms | p99 ms | sell-out: all decided in | held | short parts (refusals included) | held after gathering | transfers |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {:.0} | {:.2} | {:.2} | {:.0} ms | {} | {} | {} | {} |",
            r.redis,
            r.parts,
            r.rps,
            r.p50,
            r.p99,
            r.sellout_ms,
            r.held,
            r.gathers,
            r.multi,
            r.moves
        );
    }
}
