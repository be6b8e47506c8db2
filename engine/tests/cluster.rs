//! The engine on a real three-master Redis Cluster, named as `REDIS_URL`
//! names one (seed URLs separated by commas, or one node that runs in cluster
//! mode): warm, single holds and carts over shards on different masters,
//! expiry, the write-behind, the live event reader, reconciliation, locks and
//! `verify`, each doing on a cluster what it does on one node.

use std::sync::Arc;
use std::time::Duration;

use holdfast_engine::events::EventReader;
use holdfast_engine::reconcile::{self, ReconcileOptions};
use holdfast_engine::record::{WriteBehind, WriteBehindConfig, WriteBehindStats};
use holdfast_engine::testkit::{TestCluster, add_sku};
use holdfast_engine::verify::{VerifyOptions, verify};
use holdfast_engine::warmup::{WarmOptions, warm_all};
use holdfast_engine::{
    Backends, ConfirmOutcome, EngineConfig, Line, ReleaseOutcome, ReserveOutcome, ReserveRequest,
    postgres, redis_conn,
};
use sqlx::PgPool;

#[sqlx::test(migrator = "postgres::MIGRATOR")]
async fn the_engine_works_the_same_on_a_three_master_cluster(pg: PgPool) {
    let cluster = TestCluster::start(3, 0);
    let redis = redis_conn::connect(&cluster.url()).await.unwrap();
    assert!(redis.is_cluster(), "seed URLs make a cluster connection");
    let b = Backends::new(pg.clone(), redis.clone(), EngineConfig::default());
    let engine = &b.engine;
    let ks = engine.keyspace();

    // One SKU per shard: every master gets some.
    let skus: Vec<String> =
        holdfast_engine::testkit::skus_in_distinct_shards(engine, "CL", usize::from(ks.shards()));
    let masters: std::collections::HashSet<usize> =
        skus.iter().map(|s| cluster.master_of(&ks.sku(s))).collect();
    assert_eq!(masters.len(), 3, "the shards spread over all three masters");
    for sku in &skus {
        add_sku(&pg, sku, 100).await;
    }
    let warmed = warm_all(engine, &pg, WarmOptions::default(), |_| {})
        .await
        .unwrap();
    assert_eq!(warmed.warmed, skus.len() as u64);

    // The live reader sees what happens from here on, on every master.
    let mut reader = EventReader::new(redis_conn::connect(&cluster.url()).await.unwrap(), ks);
    let mut cursor = reader.tail_cursor().await.unwrap();

    // A single hold on every SKU, paid.
    for (i, sku) in skus.iter().enumerate() {
        let rid = format!("one-{i}");
        let r = engine
            .reserve(&ReserveRequest::single(&rid, sku, 2))
            .await
            .unwrap();
        assert!(matches!(r, ReserveOutcome::Reserved { .. }), "{sku}: {r:?}");
        assert_eq!(
            engine.confirm(&rid).await.unwrap(),
            ConfirmOutcome::Confirmed
        );
    }
    // A cart over three shards on different masters: held, then released.
    let picked: Vec<&String> = {
        let mut seen = std::collections::HashSet::new();
        skus.iter()
            .filter(|s| seen.insert(cluster.master_of(&ks.sku(s))))
            .collect()
    };
    let cart = |rid: &str, ttl_ms| ReserveRequest {
        reservation_id: rid.into(),
        lines: picked
            .iter()
            .map(|s| Line {
                sku: (*s).clone(),
                qty: 1,
            })
            .collect(),
        buyer: None,
        ttl_ms: Some(ttl_ms),
    };
    let r = engine.reserve(&cart("cart-1", 60_000)).await.unwrap();
    assert!(matches!(r, ReserveOutcome::Reserved { .. }), "{r:?}");
    assert_eq!(
        engine.release("cart-1").await.unwrap(),
        ReleaseOutcome::Released
    );
    // Another cart expires, and the reaper brings its units back.
    let r = engine.reserve(&cart("cart-2", 1_000)).await.unwrap();
    assert!(matches!(r, ReserveOutcome::Reserved { .. }), "{r:?}");
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let reaped = engine.reap_once(100).await.unwrap();
    assert!(reaped.due >= 1, "the expired cart was due: {reaped:?}");
    for sku in &skus {
        let f = engine.figures(sku).await.unwrap().unwrap();
        assert_eq!(
            (f.available, f.reserved, f.sold_pending),
            (98, 0, 2),
            "{sku} after the sale, the release and the expiry"
        );
    }

    let mut seen = 0;
    for _ in 0..40 {
        seen += reader
            .read(&mut cursor, 1_000, Some(Duration::from_millis(100)))
            .await
            .unwrap()
            .len();
    }
    assert!(
        seen >= skus.len() * 2,
        "the reader saw every master's events: {seen}"
    );

    // The write-behind records every sale, reading each shard's stream.
    let mut writer = WriteBehind::new(
        engine.clone(),
        pg.clone(),
        redis_conn::connect(&cluster.url()).await.unwrap(),
        WriteBehindConfig {
            consumer: "cluster-test".into(),
            block: Duration::from_millis(50),
            ..WriteBehindConfig::default()
        },
        Arc::new(WriteBehindStats::default()),
    );
    writer.ensure_groups().await.unwrap();
    for _ in 0..100 {
        writer.run_once().await.unwrap();
        if engine.write_behind_lag().await.unwrap().entries == 0 {
            break;
        }
    }
    let sold: i64 = sqlx::query_scalar("SELECT coalesce(sum(sold_recorded), 0)::bigint FROM skus")
        .fetch_one(&pg)
        .await
        .unwrap();
    assert_eq!(sold, 2 * skus.len() as i64, "every sale recorded once");

    // Reconciliation (with its lock) finds no drift; the lock list reads
    // every master; verify passes.
    let report = reconcile::reconcile_all(engine, &pg, &ReconcileOptions::default(), |_| {})
        .await
        .unwrap();
    assert_eq!(report.drifted, 0, "{report:?}");
    let lease = engine
        .acquire_lock("cluster-test", Duration::from_secs(30))
        .await
        .unwrap()
        .expect("a free lock");
    let locks = engine.list_locks().await.unwrap();
    assert!(locks.iter().any(|l| l.name == "cluster-test"), "{locks:?}");
    engine.release_lock(&lease).await.unwrap();
    let checked = verify(
        engine,
        &pg,
        &VerifyOptions {
            rereads: 1,
            max_lag: Duration::from_secs(3_600),
        },
    )
    .await
    .unwrap();
    assert!(checked.passed(), "{:?}", checked.checks);

    // One node's URL alone is enough: it says it runs in cluster mode.
    let first = cluster.url().split(',').next().unwrap().to_owned();
    let alone = redis_conn::connect(&first).await.unwrap();
    assert!(
        alone.is_cluster(),
        "a cluster node's URL makes a cluster connection"
    );
}

/// The shard count is fixed per deployment: a process set to another count
/// than the data in Redis was written with is refused, saying both.
#[tokio::test]
async fn a_shard_count_other_than_the_datas_is_refused() {
    let redis = holdfast_engine::testkit::TestRedis::start();
    let with = |shards| EngineConfig {
        shards,
        ..EngineConfig::default()
    };
    let first = redis.engine_with(with(16)).await;
    first
        .check_layout()
        .await
        .expect("the first process records its layout");
    first
        .check_layout()
        .await
        .expect("the same layout passes again");
    let other = redis.engine_with(with(64)).await;
    let refused = other.check_layout().await.unwrap_err().to_string();
    assert!(
        refused.contains("shards=16") && refused.contains("shards=64"),
        "{refused}"
    );
}

/// A shard fenced after a failover answers "not warmed" (a retry, never sold
/// out) and moves nothing; let go, it sells again; other shards never stop.
#[tokio::test]
async fn a_fenced_shard_answers_not_warmed_until_let_go() {
    let redis = holdfast_engine::testkit::TestRedis::start();
    let engine = redis.engine().await;
    let skus = holdfast_engine::testkit::skus_in_distinct_shards(&engine, "FEN", 2);
    for sku in &skus {
        holdfast_engine::testkit::stock(&engine, sku, 5).await;
    }
    let shard = engine.keyspace().shard_of(&skus[0]);
    engine.shard_fence().set(&[shard], true);
    assert_eq!(engine.shard_fence().fenced(), vec![shard]);
    let held = engine
        .reserve(&ReserveRequest::single("f-1", &skus[0], 1))
        .await
        .unwrap();
    assert_eq!(
        held,
        ReserveOutcome::NotWarmed {
            sku: skus[0].clone()
        }
    );
    let figures = engine.figures(&skus[0]).await.unwrap().unwrap();
    assert_eq!(
        (figures.available, figures.reserved),
        (5, 0),
        "nothing moved"
    );
    let other = engine
        .reserve(&ReserveRequest::single("f-2", &skus[1], 1))
        .await
        .unwrap();
    assert!(
        matches!(other, ReserveOutcome::Reserved { .. }),
        "{other:?}"
    );
    engine.shard_fence().set(&[shard], false);
    let held = engine
        .reserve(&ReserveRequest::single("f-1", &skus[0], 1))
        .await
        .unwrap();
    assert!(matches!(held, ReserveOutcome::Reserved { .. }), "{held:?}");
}

/// `--confirm-replicas 1` on a cluster: a payment is answered once the
/// replica of its shard's master holds it; with that replica paused it is
/// answered "retry" within the timeout (and its retry succeeds once the
/// replica is back); and every acknowledged payment survives killing the
/// master the moment they are answered and promoting its replica.
#[tokio::test]
async fn payments_acknowledged_by_replicas_survive_a_cluster_failover() {
    let mut cluster = TestCluster::start(3, 1);
    let config = EngineConfig {
        confirm_replicas: 1,
        confirm_replica_timeout: Duration::from_millis(300),
        ..EngineConfig::default()
    };
    let engine =
        holdfast_engine::Engine::new(redis_conn::connect(&cluster.url()).await.unwrap(), config)
            .with_replica_acks(redis_conn::connect(&cluster.url()).await.unwrap());
    let sku = "ACK-1";
    holdfast_engine::testkit::stock(&engine, sku, 1_000).await;
    let master = cluster.master_of(&engine.keyspace().sku(sku));
    let replica = cluster.replica_of(master);

    // The replica paused: the payment stands on the master, answered "retry".
    holdfast_engine::testkit::signal(cluster.node(replica).pid().unwrap(), "STOP");
    engine
        .reserve(&ReserveRequest::single("ack-paused", sku, 1))
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let paused = engine.confirm("ack-paused").await;
    assert!(
        matches!(
            paused,
            Err(holdfast_engine::EngineError::ReplicasBehind { .. })
        ),
        "{paused:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "answered within the timeout"
    );
    holdfast_engine::testkit::signal(cluster.node(replica).pid().unwrap(), "CONT");
    let mut retried = None;
    for _ in 0..50 {
        match engine.confirm("ack-paused").await {
            Ok(outcome) => {
                retried = Some(outcome);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    assert!(
        matches!(
            retried,
            Some(ConfirmOutcome::AlreadyConfirmed | ConfirmOutcome::Confirmed)
        ),
        "{retried:?}"
    );

    // 40 acknowledged payments, then the master dies at once.
    let mut paid = vec!["ack-paused".to_owned()];
    for i in 0..40 {
        let rid = format!("ack-{i}");
        engine
            .reserve(&ReserveRequest::single(&rid, sku, 1))
            .await
            .unwrap();
        assert_eq!(
            engine.confirm(&rid).await.unwrap(),
            ConfirmOutcome::Confirmed
        );
        paid.push(rid);
    }
    cluster.node(master).kill();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let figures = loop {
        if let Ok(Some(f)) = engine.figures(sku).await {
            break f;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the replica never took over"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        (figures.available, figures.sold_pending),
        (1_000 - 41, 41),
        "every acknowledged payment survived the promotion"
    );
}
