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

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn requests_with_a_token_being_checked_share_that_check(pool: PgPool) {
    let real = tokens::create(&pool, "shop", &[Scope::Checkout])
        .await
        .unwrap();
    let cache = std::sync::Arc::new(TokenCache::default());
    // Holds every check back while 50 requests arrive with the new token.
    let mut blocker = pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE api_tokens IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let mut requests = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let (cache, pool, secret) = (cache.clone(), pool.clone(), real.secret.clone());
        requests.spawn(async move { cache.verify(&pool, &secret).await });
    }
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
          WHERE query LIKE '%FROM api_tokens%' AND wait_event_type = 'Lock'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        cache.knows(&real.secret),
        "a token being checked is not counted as an invented one"
    );
    blocker.rollback().await.unwrap();
    while let Some(answer) = requests.join_next().await {
        assert!(
            answer.unwrap().unwrap().is_some(),
            "every request is let in"
        );
    }
    assert_eq!(waiting, 1, "one check with PostgreSQL for 50 requests");
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn a_check_whose_client_left_leaves_nothing_behind(pool: PgPool) {
    let cache = std::sync::Arc::new(TokenCache::default());
    let invented = format!("hf_{:064x}", 42);
    let mut blocker = pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE api_tokens IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    // The request is dropped while its check waits on PostgreSQL.
    let gone = tokio::time::timeout(
        std::time::Duration::from_millis(50),
        cache.verify(&pool, &invented),
    )
    .await;
    assert!(gone.is_err(), "the check was still waiting");
    blocker.rollback().await.unwrap();
    assert!(
        !cache.knows(&invented),
        "an invented token whose check was abandoned still counts against the limit"
    );
}
