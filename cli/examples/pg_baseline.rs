//! Benchmark: the Redis path against the obvious alternative, a PostgreSQL
//! `SELECT … FOR UPDATE` on one hot row, with the same number of clients, in one
//! run. Budget: the Redis path at least 50 times faster.
//!
//! The Redis side is `Engine::reserve` (one Lua script per reservation). The
//! PostgreSQL side is the transaction a naive checkout runs: lock the stock row,
//! check, decrement, commit. PostgreSQL's default `max_connections` is 100 with 3
//! reserved, so `--clients` tasks share a pool of at most 90 connections.
//!
//! ```sh
//! cargo build --release -p holdfast-server --examples
//! target/release/examples/pg_baseline --clients 100 --seconds 5
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use holdfast_engine::testkit::{TestRedis, flag, stock};
use holdfast_engine::{Engine, EngineConfig, ReserveRequest};

async fn engine_rps(engine: &Engine, clients: usize, seconds: u64) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..clients {
        let (engine, stop, done) = (engine.clone(), stop.clone(), done.clone());
        tasks.spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                engine
                    .reserve(&ReserveRequest::single(format!("r{c}-{i}"), "HOT-1", 1))
                    .await
                    .unwrap();
                done.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    while tasks.join_next().await.is_some() {}
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

async fn pg_rps(pool: &sqlx::PgPool, clients: usize, seconds: u64) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (pool, stop, done) = (pool.clone(), stop.clone(), done.clone());
        tasks.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let mut tx = pool.begin().await.unwrap();
                let available: i64 = sqlx::query_scalar("SELECT available FROM hot_stock WHERE id = 1 FOR UPDATE")
                    .fetch_one(&mut *tx)
                    .await
                    .unwrap();
                if available > 0 {
                    sqlx::query("UPDATE hot_stock SET available = available - 1, reserved = reserved + 1 WHERE id = 1")
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                }
                tx.commit().await.unwrap();
                done.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    while tasks.join_next().await.is_some() {}
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let clients = flag("--clients", 100) as usize;
    let seconds = flag("--seconds", 5);
    let redis = TestRedis::start();
    let engine = Engine::new(redis.connection().await, EngineConfig::default());
    stock(&engine, "HOT-1", 1_000_000_000_000).await;
    let redis_rps = engine_rps(&engine, clients, seconds).await;

    let (_, url) = holdfast_engine::testkit::fresh_database("holdfast_bench_pg").await;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(clients.min(90) as u32)
        .connect(&url)
        .await
        .unwrap();
    sqlx::query("CREATE TABLE hot_stock (id int PRIMARY KEY, available bigint NOT NULL, reserved bigint NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO hot_stock VALUES (1, 1000000000000, 0)")
        .execute(&pool)
        .await
        .unwrap();
    let pg = pg_rps(&pool, clients, seconds).await;
    let ratio = redis_rps / pg;
    println!("| path | clients | reservations/s |");
    println!("|---|---|---|");
    println!("| Redis: `Engine::reserve` (Lua) | {clients} | {redis_rps:.0} |");
    println!(
        "| PostgreSQL: `SELECT … FOR UPDATE`, update, commit | {clients} (pool of {}) | {pg:.0} |",
        clients.min(90)
    );
    println!("\nratio Redis / PostgreSQL: **{ratio:.0}x** (budget: at least 50x)");
    println!(
        "{{\"bench\":\"redis_vs_pg_for_update\",\"clients\":{clients},\"redis_rps\":{redis_rps:.0},\"pg_rps\":{pg:.0},\"ratio\":{ratio:.1}}}"
    );
}
