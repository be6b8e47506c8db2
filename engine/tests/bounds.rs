//! Caches an attacker can feed stay bounded (issue: hardening).

use holdfast_engine::tokens::{self, REFUSED_REMEMBERED, Scope, TokenCache};
use sqlx::PgPool;

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn invented_tokens_cannot_grow_the_token_cache(pool: PgPool) {
    let real = tokens::create(&pool, "checkout", &[Scope::Checkout])
        .await
        .unwrap();
    let cache = std::sync::Arc::new(TokenCache::default());
    assert!(cache.verify(&pool, &real.secret).await.unwrap().is_some());
    for i in 0..REFUSED_REMEMBERED + 1_500 {
        let invented = format!("hf_{i:064x}");
        assert!(cache.verify(&pool, &invented).await.unwrap().is_none());
    }
    assert_eq!(
        cache.remembered(),
        REFUSED_REMEMBERED + 1,
        "the refusals are capped; the live token stays"
    );
    assert!(
        cache.knows(&real.secret),
        "a live token is never evicted by refusals"
    );
    assert_eq!(
        cache.answer(&format!("hf_{:064x}", 0)),
        None,
        "the oldest refusal went first"
    );
    assert_eq!(
        cache.answer(&format!("hf_{:064x}", REFUSED_REMEMBERED + 1_499)),
        Some(false),
        "the newest refusal is remembered"
    );

    // The cap is a setting (HOLDFAST_REFUSED_TOKENS_REMEMBERED).
    let small = std::sync::Arc::new(TokenCache::with_refused_cap(10));
    assert!(small.verify(&pool, &real.secret).await.unwrap().is_some());
    for i in 0..50 {
        let invented = format!("hf_{i:064x}");
        assert!(small.verify(&pool, &invented).await.unwrap().is_none());
    }
    assert_eq!(small.remembered(), 11, "ten refusals and the live token");
    assert_eq!(small.answer(&format!("hf_{:064x}", 49)), Some(false));
    assert_eq!(small.answer(&format!("hf_{:064x}", 40)), Some(false));
    assert_eq!(small.answer(&format!("hf_{:064x}", 39)), None);
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn two_admins_removed_at_once_leave_one(pool: PgPool) {
    use holdfast_engine::users::{self, Role, UserError};
    for round in 0..10 {
        let (a, b) = (format!("a{round}"), format!("b{round}"));
        sqlx::query("DELETE FROM users")
            .execute(&pool)
            .await
            .unwrap();
        for name in [&a, &b] {
            users::create(&pool, name, Role::Admin, "long enough password", false)
                .await
                .unwrap();
        }
        // Both demoted at once (or one demoted, one deleted): one must be refused.
        let (x, y) = if round % 2 == 0 {
            tokio::join!(
                users::set_role(&pool, &a, Role::Viewer),
                users::set_role(&pool, &b, Role::Viewer)
            )
        } else {
            tokio::join!(
                users::set_role(&pool, &a, Role::Viewer),
                users::delete(&pool, &b)
            )
        };
        let refused = [&x, &y]
            .iter()
            .filter(|r| matches!(r, Err(UserError::LastAdmin)))
            .count();
        assert_eq!(refused, 1, "round {round}: {x:?} {y:?}");
        let admins: i64 = sqlx::query_scalar("SELECT count(*) FROM users WHERE role = 'admin'")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(admins, 1, "round {round}");
    }
}

/// Checks of API tokens waiting on a lock in this test's database.
async fn checks_waiting(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
          WHERE datname = current_database() AND query LIKE '%FROM api_tokens%'
            AND wait_event_type = 'Lock'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Holds every check of a token back (until the transaction ends).
async fn hold_checks_back(pool: &PgPool) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut blocker = pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE api_tokens IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    blocker
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn requests_with_a_token_being_checked_share_that_check(pool: PgPool) {
    let real = tokens::create(&pool, "shop", &[Scope::Checkout])
        .await
        .unwrap();
    let cache = std::sync::Arc::new(TokenCache::default());
    let blocker = hold_checks_back(&pool).await;
    let mut requests = Vec::new();
    for _ in 0..50 {
        let (cache, pool, secret) = (cache.clone(), pool.clone(), real.secret.clone());
        requests.push(tokio::spawn(
            async move { cache.verify(&pool, &secret).await },
        ));
    }
    for _ in 0..400 {
        if checks_waiting(&pool).await > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    // The first ten go away (their clients gone) while the check waits:
    // the others keep waiting for that same check, none starts another.
    for request in &requests[..10] {
        request.abort();
    }
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let waiting = checks_waiting(&pool).await;
    assert!(
        cache.knows(&real.secret),
        "a token being checked is not counted as an invented one"
    );
    blocker.rollback().await.unwrap();
    let mut answers = Vec::new();
    for request in requests.drain(10..) {
        answers.push(request.await.unwrap().map(|info| info.is_some()).ok());
    }
    assert_eq!(waiting, 1, "one check with PostgreSQL for 50 requests");
    // One answer for all: the token (or, had the check outlived its time
    // limit on a slow machine, the same failure for all).
    assert!(answers.iter().all(|a| *a == answers[0]), "{answers:?}");
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_check_whose_client_left_finishes_and_leaves_nothing_behind(pool: PgPool) {
    let cache = std::sync::Arc::new(TokenCache::default());
    let invented = format!("hf_{:064x}", 42);
    let blocker = hold_checks_back(&pool).await;
    // The request is dropped while its check waits on PostgreSQL.
    let gone = tokio::time::timeout(
        std::time::Duration::from_millis(50),
        cache.verify(&pool, &invented),
    )
    .await;
    assert!(gone.is_err(), "the check was still waiting");
    assert!(cache.knows(&invented), "its check goes on");
    blocker.rollback().await.unwrap();
    // The check ends by itself; the invented token then counts again.
    let mut waited = 0;
    while cache.knows(&invented) && waited < 200 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        waited += 1;
    }
    assert!(
        !cache.knows(&invented),
        "an invented token whose check ended still counts against the limit"
    );
}
