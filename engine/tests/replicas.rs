//! Payments acknowledged by a replica (`--confirm-replicas 1`): a paid hold
//! survives losing the master to its promoted replica, a lagging replica makes
//! the payment wait and then answer "retry" (never hang, never claim it paid),
//! and without the option a sale the replica had not received is lost by the
//! promotion, which is why the option exists.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use holdfast_engine::testkit::{TestRedis, stock};
use holdfast_engine::{
    ConfirmOutcome, Engine, EngineConfig, EngineError, HoldState, ReserveRequest,
};

/// The replication link between a master and its replica, through a relay
/// the test controls: cutting it drops what the master sent and the replica
/// has not read (a network partition), which pausing a process cannot do
/// (the kernel keeps the bytes and the replica applies them on resuming).
struct Link {
    port: u16,
    cut: Arc<AtomicBool>,
}

impl Link {
    async fn to(master: &TestRedis) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let (target, flag) = (master.port(), cut.clone());
        tokio::spawn(async move {
            while let Ok((replica, _)) = listener.accept().await {
                if flag.load(Ordering::SeqCst) {
                    continue;
                }
                let Ok(master) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else {
                    continue;
                };
                let (mut from_replica, mut to_replica) = replica.into_split();
                let (mut from_master, mut to_master) = master.into_split();
                let down = flag.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n) = from_master.read(&mut buf).await {
                        if n == 0 || down.load(Ordering::SeqCst) {
                            return;
                        }
                        if to_replica.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
                let up = flag.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n) = from_replica.read(&mut buf).await {
                        if n == 0 || up.load(Ordering::SeqCst) {
                            return;
                        }
                        if to_master.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Self { port, cut }
    }

    /// From now on nothing more crosses: what the master sends is dropped.
    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }
}

/// A master and a replica of it, linked through a [`Link`].
async fn pair() -> (TestRedis, TestRedis, Link) {
    let master = TestRedis::start();
    let link = Link::to(&master).await;
    let replica = TestRedis::start_with(&["--replicaof", "127.0.0.1", &link.port.to_string()]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut replica.connection().await)
            .await
            .unwrap();
        if info.contains("master_link_status:up") {
            return (master, replica, link);
        }
        assert!(
            Instant::now() < deadline,
            "the replica never linked: {info}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn signal(redis: &TestRedis, sig: &str) {
    let pid = redis.pid().expect("running").to_string();
    assert!(
        Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success()
    );
}

/// Promotes `replica` to a master and returns an engine over it.
async fn promote(replica: &TestRedis) -> Engine {
    let mut conn = replica.connection().await;
    redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    Engine::new(conn, EngineConfig::default())
}

fn acked(timeout_ms: u64) -> EngineConfig {
    EngineConfig {
        confirm_replicas: 1,
        confirm_replica_timeout: Duration::from_millis(timeout_ms),
        ..EngineConfig::default()
    }
}

#[tokio::test]
async fn acknowledged_payments_survive_promoting_the_replica() {
    let (mut master, replica, link) = pair().await;
    let engine = Engine::new(master.connection().await, acked(1_000))
        .with_replica_acks(master.connection().await);
    stock(&engine, "REP-1", 100).await;
    let rids: Vec<String> = (0..40).map(|i| format!("rep-{i}")).collect();
    for rid in &rids {
        engine
            .reserve(&ReserveRequest::single(rid, "REP-1", 1).with_ttl_ms(60_000))
            .await
            .unwrap();
    }
    // Concurrent payments share acknowledgement rounds.
    let started = Instant::now();
    let paid = futures_util::future::join_all(rids.iter().map(|rid| engine.confirm(rid))).await;
    println!(
        "40 concurrent payments acknowledged by a replica in {:?}",
        started.elapsed()
    );
    for outcome in paid {
        assert_eq!(outcome.unwrap(), ConfirmOutcome::Confirmed);
    }
    // The master is cut off and dies the moment the last payment is answered:
    // whatever the replica had not received by then is lost.
    link.cut();
    master.kill();
    let promoted = promote(&replica).await;
    let figures = promoted
        .figures("REP-1")
        .await
        .unwrap()
        .expect("the counter");
    assert_eq!(figures.sold, 40, "every acknowledged payment survived");
    assert_eq!(figures.available, 60);
    for rid in &rids {
        let hold = promoted.hold(rid).await.unwrap().expect("the hold");
        assert_eq!(hold.state, HoldState::Confirmed, "{rid}");
    }
}

#[tokio::test]
async fn a_lagging_replica_makes_payments_retry_and_never_hang() {
    let (master, replica, _link) = pair().await;
    let engine = Engine::new(master.connection().await, acked(300))
        .with_replica_acks(master.connection().await);
    stock(&engine, "REP-2", 5).await;
    engine
        .reserve(&ReserveRequest::single("lag-1", "REP-2", 1))
        .await
        .unwrap();
    signal(&replica, "-STOP");
    let started = Instant::now();
    let refused = engine.confirm("lag-1").await;
    let took = started.elapsed();
    assert!(
        matches!(
            refused,
            Err(EngineError::ReplicasBehind {
                wanted: 1,
                acked: 0,
                ..
            })
        ),
        "{refused:?}"
    );
    assert!(took < Duration::from_millis(1_500), "answered in {took:?}");
    // Other work on the engine's own connection is not held up meanwhile.
    assert!(engine.figures("REP-2").await.unwrap().is_some());
    signal(&replica, "-CONT");
    // The payment stands on the master; the retry waits again and is answered.
    let retried = engine.confirm("lag-1").await.unwrap();
    assert_eq!(retried, ConfirmOutcome::AlreadyConfirmed);
}

#[tokio::test]
async fn without_acknowledgements_a_promotion_loses_the_last_sale() {
    let (mut master, replica, link) = pair().await;
    let engine = Engine::new(master.connection().await, EngineConfig::default());
    stock(&engine, "REP-3", 5).await;
    // Let the counter reach the replica, then cut the link.
    tokio::time::sleep(Duration::from_millis(300)).await;
    link.cut();
    engine
        .reserve(&ReserveRequest::single("lost-1", "REP-3", 1))
        .await
        .unwrap();
    assert_eq!(
        engine.confirm("lost-1").await.unwrap(),
        ConfirmOutcome::Confirmed,
        "answered paid at once"
    );
    master.kill();
    signal(&replica, "-CONT");
    let promoted = promote(&replica).await;
    let figures = promoted
        .figures("REP-3")
        .await
        .unwrap()
        .expect("the counter");
    assert_eq!(figures.sold, 0, "the paid unit came back: {figures:?}");
    assert!(promoted.hold("lost-1").await.unwrap().is_none());
}
