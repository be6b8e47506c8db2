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
    assert!(
        !cache.knows(&format!("hf_{:064x}", 0)),
        "the oldest refusal went first"
    );
}
