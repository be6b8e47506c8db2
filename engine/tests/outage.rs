//! PostgreSQL down during a sale: token checks answer from memory at once, and
//! a revocation still takes effect once PostgreSQL is back.

use std::time::{Duration, Instant};

use holdfast_engine::postgres;
use holdfast_engine::testkit::TestPostgres;
use holdfast_engine::tokens::{self, Scope, TOKEN_CACHE_TTL, TokenCache};

#[tokio::test]
async fn verified_tokens_keep_working_while_postgres_is_down() {
    let mut pg_server = TestPostgres::start();
    let pg = postgres::connect_and_migrate(&pg_server.url("holdfast"), 4)
        .await
        .unwrap();
    let known = tokens::create(&pg, "checkout", &[Scope::Checkout])
        .await
        .unwrap();
    let stranger = tokens::create(&pg, "never-used", &[Scope::Read])
        .await
        .unwrap();
    let cache = std::sync::Arc::new(TokenCache::default());
    assert!(cache.verify(&pg, &known.secret).await.unwrap().is_some());

    pg_server.stop();
    tokio::time::sleep(TOKEN_CACHE_TTL + Duration::from_millis(200)).await;
    let started = Instant::now();
    for _ in 0..20 {
        let info = cache.verify(&pg, &known.secret).await.unwrap();
        assert_eq!(info.map(|i| i.id), Some(known.info.id));
    }
    assert!(
        started.elapsed() < Duration::from_millis(1_000),
        "20 checks without PostgreSQL took {:?}",
        started.elapsed()
    );
    assert!(
        cache.verify(&pg, &stranger.secret).await.is_err(),
        "a token never verified cannot be vouched for"
    );

    pg_server.start_again();
    let mut revoked = false;
    for _ in 0..100 {
        if tokens::revoke(&pg, known.info.id).await.is_ok() {
            revoked = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(revoked, "PostgreSQL came back");
    // The first checks after PostgreSQL's return may still answer from memory
    // while it is asked in the background; within moments the revocation holds.
    let mut honoured = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if cache.verify(&pg, &known.secret).await.unwrap().is_none() {
            honoured = true;
            break;
        }
    }
    assert!(
        honoured,
        "the revocation is honoured once PostgreSQL answers"
    );
}
