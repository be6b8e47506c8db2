//! Benchmark: warm-up and reconciliation of 100,000 SKUs (or `--skus`), Redis
//! memory per SKU and per open hold, write-behind throughput into PostgreSQL,
//! and its lag while a drop is running.
//!
//! Uses a private `redis-server` and a fresh database `holdfast_bench` on the
//! PostgreSQL in `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`).
//!
//! ```sh
//! cargo run --release -p holdfast-engine --example record_bench -- --skus 100000 --sales 20000 [--workers 2] [--page 2000]
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use holdfast_engine::reconcile::{ReconcileOptions, reconcile_all};
use holdfast_engine::record::{WriteBehind, WriteBehindConfig, WriteBehindStats, run_write_behind};
use holdfast_engine::redis_conn;
use holdfast_engine::testkit::{TestRedis, flag};
use holdfast_engine::warmup::{WarmOptions, warm_all};
use holdfast_engine::{ConfirmOutcome, Engine, EngineConfig, ReserveOutcome, ReserveRequest};

/// The server's allocator (see `cli/src/main.rs`): the write-behind measured
/// here runs inside the server, and glibc's allocator costs it noticeably more.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Runs `n` reserve+confirm pairs over `clients` tasks on `sku_count` SKUs.
async fn drop_sales(engine: &Engine, n: u64, clients: u64, sku_count: u64, prefix: &str) {
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..clients {
        let engine = engine.clone();
        let prefix = prefix.to_owned();
        tasks.spawn(async move {
            let mut i = c;
            while i < n {
                let rid = format!("{prefix}-{i}");
                let sku = format!("B-{:06}", i % sku_count);
                let r = engine
                    .reserve(&ReserveRequest::single(&rid, &sku, 1))
                    .await
                    .unwrap();
                assert!(matches!(r, ReserveOutcome::Reserved { .. }), "{r:?}");
                assert_eq!(
                    engine.confirm(&rid).await.unwrap(),
                    ConfirmOutcome::Confirmed
                );
                i += clients;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
}

/// Redis' `used_memory`, bytes.
async fn used_memory(conn: &holdfast_engine::RedisConn) -> i64 {
    let info = redis_conn::info(conn, Duration::from_secs(5))
        .await
        .unwrap();
    redis_conn::ServerStats::from_info(&info).used_memory as i64
}

#[tokio::main]
async fn main() {
    let skus = flag("--skus", 100_000);
    let sales = flag("--sales", 20_000);
    let redis = TestRedis::start();
    let engine = Engine::new(redis.connection().await, EngineConfig::default());
    let (pg, _) = holdfast_engine::testkit::fresh_database("holdfast_bench").await;

    let t = Instant::now();
    sqlx::query(
        "INSERT INTO skus (sku, title, product, on_hand)
         SELECT 'B-' || lpad(i::text, 6, '0'), 'Bench ' || i, 'Bench', 1000 FROM generate_series(0, $1 - 1) i",
    )
    .bind(skus as i64)
    .execute(&pg)
    .await
    .unwrap();
    eprintln!(
        "loaded {skus} SKUs into PostgreSQL in {} ms",
        t.elapsed().as_millis()
    );

    let mut conn = redis.connection().await;
    let before_warm = used_memory(&conn).await;
    let options = WarmOptions {
        page: flag("--page", WarmOptions::default().page as u64) as usize,
        ..WarmOptions::default()
    };
    let warm = warm_all(&engine, &pg, options, |_| {}).await.unwrap();
    assert_eq!(warm.warmed, skus);
    let per_sku = (used_memory(&conn).await - before_warm) as f64 / skus as f64;
    // The counter alone (without its warm-up event, trimmed once written behind).
    let mut pipe = redis::pipe();
    let sample = skus.min(1_000);
    for i in 0..sample {
        pipe.cmd("MEMORY").arg("USAGE").arg(
            engine
                .keyspace()
                .sku(&format!("B-{:06}", i * (skus / sample))),
        );
    }
    let sizes: Vec<i64> = pipe.query_async(&mut conn).await.unwrap();
    let per_counter = sizes.iter().sum::<i64>() as f64 / sizes.len() as f64;

    // Corrupt 1% of counters upward so reconciliation has real work.
    let mut pipe = redis::pipe();
    for i in (0..skus).step_by(100) {
        pipe.cmd("HINCRBY")
            .arg(engine.keyspace().sku(&format!("B-{i:06}")))
            .arg("available")
            .arg(5);
    }
    pipe.query_async::<()>(&mut conn).await.unwrap();
    let rec = reconcile_all(&engine, &pg, &ReconcileOptions::default(), |_| {})
        .await
        .unwrap();
    assert_eq!(rec.corrected_down, skus.div_ceil(100));

    // Write-behind throughput: first the warm-up's and reconciliation's
    // entries (one per SKU, nothing to write to PostgreSQL for most), then a
    // backlog of sales alone, each drained by `--workers` parts side by side
    // (the server's default) and timed apart.
    let workers = flag("--workers", WriteBehindConfig::default().workers as u64) as usize;
    let stats = Arc::new(WriteBehindStats::default());
    let mut parts = Vec::new();
    for part in 0..workers {
        let mut worker = WriteBehind::new(
            engine.clone(),
            pg.clone(),
            redis.connection().await,
            WriteBehindConfig {
                consumer: "bench".into(),
                ..WriteBehindConfig::default()
            },
            stats.clone(),
        )
        .part(part, workers);
        worker.ensure_groups().await.unwrap();
        parts.push(worker);
    }
    // Timed until the first part sees nothing left (the others may still be
    // waiting out an empty read).
    let drain_backlog = async |parts: &mut Vec<WriteBehind>| {
        let backlog = engine.write_behind_lag().await.unwrap().entries;
        let t = Instant::now();
        let done = futures_util::future::join_all(parts.iter_mut().map(|w| async {
            while engine.write_behind_lag().await.unwrap().entries > 0 {
                w.run_once().await.unwrap();
            }
            t.elapsed().as_secs_f64()
        }))
        .await;
        (backlog, done.into_iter().fold(f64::MAX, f64::min))
    };
    let (warm_backlog, warm_drain) = drain_backlog(&mut parts).await;
    drop_sales(&engine, sales, 50, skus.min(2_000), "tp").await;
    let started = Instant::now();
    let (backlog, drain) = drain_backlog(&mut parts).await;
    // On the monotonic clock, for a profile of the drain alone
    // (`perf record -k mono`, then `perf report --time from,to`).
    eprintln!("sales drained between {started:?} and {:?}", Instant::now());
    let recorded: i64 = sqlx::query_scalar("SELECT count(*) FROM ledger WHERE kind = 'sale'")
        .fetch_one(&pg)
        .await
        .unwrap();
    assert_eq!(recorded as u64, sales);

    // Lag during a drop: the parts run while shoppers buy; sample the lag.
    let (tx, rx) = tokio::sync::watch::channel(false);
    let tasks: Vec<_> = parts
        .into_iter()
        .map(|w| {
            let mut rx = rx.clone();
            tokio::spawn(run_write_behind(w, async move {
                let _ = rx.wait_for(|s| *s).await;
            }))
        })
        .collect();
    let sampling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let (engine, sampling) = (engine.clone(), sampling.clone());
        tokio::spawn(async move {
            let (mut worst_ms, mut worst_entries) = (0u64, 0u64);
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                let lag = engine.write_behind_lag().await.unwrap();
                worst_ms = worst_ms.max(lag.oldest_ms);
                worst_entries = worst_entries.max(lag.entries);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (worst_ms, worst_entries)
        })
    };
    let t = Instant::now();
    drop_sales(&engine, sales, 50, 50, "drop").await;
    let drop_secs = t.elapsed().as_secs_f64();
    while engine.write_behind_lag().await.unwrap().entries > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let caught_up = t.elapsed().as_secs_f64() - drop_secs;
    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    let (worst_ms, worst_entries) = sampler.await.unwrap();
    tx.send(true).unwrap();
    for task in tasks {
        task.await.unwrap();
    }

    // Memory per open hold: 10,000 holds of one unit (with a buyer, so the
    // per-buyer counter is there too) on 2,000 SKUs, left open.
    let holds = 10_000u64;
    let before_holds = used_memory(&conn).await;
    for i in 0..holds {
        let sku = format!("B-{:06}", i % skus.min(2_000));
        let req =
            ReserveRequest::single(format!("open-{i}"), &sku, 1).for_buyer(format!("buyer-{i}"));
        let r = engine.reserve(&req).await.unwrap();
        assert!(matches!(r, ReserveOutcome::Reserved { .. }), "{r:?}");
    }
    let per_hold = (used_memory(&conn).await - before_holds) as f64 / holds as f64;

    println!("| measure | result | budget |");
    println!("|---|---|---|");
    println!(
        "| warm-up of {skus} SKUs | {} ms | 1,000,000 under 30 s |",
        warm.elapsed_ms
    );
    println!(
        "| reconciliation of {skus} SKUs ({} corrected) | {} ms | 1,000,000 under 30 s |",
        rec.corrected_down, rec.elapsed_ms
    );
    println!(
        "| Redis memory per SKU: counter alone (MEMORY USAGE, {sample} sampled); with its warm-up stream entry | {per_counter:.0} B; {per_sku:.0} B | (no budget) |"
    );
    println!(
        "| Redis memory per open hold (hold, due and SKU sets, buyer counter, stream entry; {holds} holds) | {per_hold:.0} B | (no budget) |"
    );
    println!(
        "| write-behind drain of the warm-up's and reconciliation's {warm_backlog} stream entries | {:.0} entries/s ({warm_drain:.2} s) | (no budget) |",
        warm_backlog as f64 / warm_drain
    );
    println!(
        "| write-behind drain of {sales} sales (reserve and confirm: {backlog} stream entries; {workers} parts) | {:.0} sales/s ({:.0} entries/s) | >= 20,000 sales/s |",
        sales as f64 / drain,
        backlog as f64 / drain
    );
    println!(
        "| lag during a drop of {sales} sales in {drop_secs:.2} s ({:.0} sales/s), write-behind running | worst {:.2} s ({worst_entries} entries); caught up {caught_up:.2} s after the last sale | under 1 s at 10,000 sales/s |",
        sales as f64 / drop_secs,
        worst_ms as f64 / 1000.0
    );
}
