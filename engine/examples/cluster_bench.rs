//! Benchmark for running at scale, in one run on private `redis-server`s:
//!
//! 1. reserve throughput over many SKUs, one node vs a three-master Redis
//!    Cluster, the same number of concurrent clients;
//! 2. confirm latency with and without waiting for a replica's
//!    acknowledgement (`--confirm-replicas 1`), one master and one replica;
//! 3. a failover: a master of a three-master, three-replica cluster is killed
//!    (SIGKILL) and a SKU it served is reserved every 10 ms until it sells again.
//!
//! ```sh
//! cargo run --release -p holdfast-engine --example cluster_bench -- --clients 50 --seconds 5 --skus 1000
//! ```

use std::time::{Duration, Instant};

use holdfast_engine::testkit::{TestCluster, TestRedis, flag, percentile_ms, reserve_load, stock};
use holdfast_engine::{Engine, EngineConfig, ReserveOutcome, ReserveRequest, redis_conn};

const STOCK: i64 = 1_000_000_000_000;

/// Warms `skus` SKUs (`B-<i>`) with effectively unlimited stock.
async fn warm(engine: &Engine, skus: u64) {
    for i in 0..skus {
        stock(engine, &format!("B-{i}"), STOCK).await;
    }
}

/// `clients` tasks each reserving then confirming, `rounds` times: the
/// confirms' (p50 ms, p99 ms, confirms/s).
async fn confirm_run(engine: &Engine, clients: u64, rounds: u64, tag: &str) -> (f64, f64, f64) {
    let mut tasks = tokio::task::JoinSet::new();
    let started = Instant::now();
    for c in 0..clients {
        let (engine, tag) = (engine.clone(), tag.to_owned());
        tasks.spawn(async move {
            let mut lat = Vec::new();
            for i in 0..rounds {
                let rid = format!("{tag}-{c}-{i}");
                engine
                    .reserve(&ReserveRequest::single(&rid, "B-0", 1))
                    .await
                    .expect("reserve");
                let t = Instant::now();
                engine.confirm(&rid).await.expect("confirm");
                lat.push(t.elapsed().as_nanos() as u64);
            }
            lat
        });
    }
    let mut all = Vec::new();
    while let Some(lat) = tasks.join_next().await {
        all.extend(lat.expect("client task"));
    }
    let rate = all.len() as f64 / started.elapsed().as_secs_f64();
    all.sort_unstable();
    (percentile_ms(&all, 0.5), percentile_ms(&all, 0.99), rate)
}

/// The SKU of the `n`-th reservation: the `--skus` SKUs in turn.
fn sku_of(n: u64) -> String {
    static SKUS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    format!("B-{}", n % *SKUS.get_or_init(|| flag("--skus", 1_000)))
}

#[tokio::main]
async fn main() {
    let clients = flag("--clients", 50);
    let seconds = flag("--seconds", 5);
    let skus = flag("--skus", 1_000);

    // 1. One node vs a three-master cluster.
    let node = TestRedis::start();
    let engine = Engine::new(node.connection().await, EngineConfig::default());
    warm(&engine, skus).await;
    let (n_rps, n_p50, n_p99) = reserve_load(&engine, clients, seconds, sku_of).await;
    drop(node);
    let cluster = TestCluster::start(3, 0);
    let conn = redis_conn::connect(&cluster.url()).await.expect("cluster");
    let engine = Engine::new(conn, EngineConfig::default());
    warm(&engine, skus).await;
    let (c_rps, c_p50, c_p99) = reserve_load(&engine, clients, seconds, sku_of).await;
    drop(cluster);
    println!("| Redis | clients | SKUs | reserves/s | p50 ms | p99 ms |");
    println!("|---|---|---|---|---|---|");
    println!("| one node | {clients} | {skus} | {n_rps:.0} | {n_p50:.3} | {n_p99:.3} |");
    println!("| 3-master cluster | {clients} | {skus} | {c_rps:.0} | {c_p50:.3} | {c_p99:.3} |");

    // 2. Confirm with and without a replica's acknowledgement.
    let master = TestRedis::start();
    let port = master.port().to_string();
    let _replica = TestRedis::start_with(&["--replicaof", "127.0.0.1", &port]);
    let plain = Engine::new(master.connection().await, EngineConfig::default());
    stock(&plain, "B-0", STOCK).await;
    let acked = Engine::new(
        master.connection().await,
        EngineConfig {
            confirm_replicas: 1,
            ..EngineConfig::default()
        },
    )
    .with_replica_acks(master.connection().await);
    // Wait for the replica to be in sync before measuring.
    let mut synced = false;
    for _ in 0..200 {
        if acked
            .confirm("never-made")
            .await
            .is_ok_and(|o| o == holdfast_engine::ConfirmOutcome::Unknown)
        {
            let info = redis_conn::info(&master.connection().await, Duration::from_secs(1))
                .await
                .unwrap_or_default();
            // Online: past its first sync (Redis waits 5 s before a diskless one).
            if info
                .get("slave0")
                .is_some_and(|v| v.contains("state=online"))
            {
                synced = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(synced, "the replica never connected");
    let rounds = 200;
    let (p_p50, p_p99, p_rate) = confirm_run(&plain, clients, rounds, "plain").await;
    let (a_p50, a_p99, a_rate) = confirm_run(&acked, clients, rounds, "acked").await;
    println!();
    println!("| confirm | clients | confirms/s | p50 ms | p99 ms |");
    println!("|---|---|---|---|---|");
    println!("| answered at once | {clients} | {p_rate:.0} | {p_p50:.3} | {p_p99:.3} |");
    println!(
        "| after 1 replica acknowledged | {clients} | {a_rate:.0} | {a_p50:.3} | {a_p99:.3} |"
    );

    // 3. Failover: kill a master, reserve on one of its SKUs until it sells.
    let mut cluster = TestCluster::start(3, 1);
    let conn = redis_conn::connect(&cluster.url()).await.expect("cluster");
    let engine = Engine::new(conn, EngineConfig::default());
    warm(&engine, 64).await;
    let ks = engine.keyspace();
    let victim = cluster.master_of(&ks.sku("B-0"));
    let killed = Instant::now();
    cluster.node(victim).kill();
    let (mut first_error, mut errors) = (None, 0);
    let mut n = 0;
    let back = loop {
        n += 1;
        let request = ReserveRequest::single(format!("f-{n}"), "B-0", 1);
        match tokio::time::timeout(Duration::from_secs(6), engine.reserve(&request)).await {
            Ok(Ok(ReserveOutcome::Reserved { .. })) if first_error.is_some() || n > 3 => {
                break killed.elapsed();
            }
            Ok(Ok(_)) => {}
            _ => {
                errors += 1;
                first_error.get_or_insert(killed.elapsed());
            }
        }
        assert!(
            killed.elapsed() < Duration::from_secs(60),
            "never sold again"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    println!();
    println!(
        "failover: master killed; first failed reserve after {:?}, {errors} failed calls, \
         selling again after {back:?} (cluster-node-timeout 2000 ms)",
        first_error.unwrap_or_default()
    );
    println!(
        "{{\"bench\":\"cluster\",\"clients\":{clients},\"skus\":{skus},\"node_rps\":{n_rps:.0},\"cluster_rps\":{c_rps:.0},\"confirm_p99_ms\":{p_p99:.3},\"confirm_acked_p99_ms\":{a_p99:.3},\"failover_ms\":{}}}",
        back.as_millis()
    );
}
