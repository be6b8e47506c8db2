//! The demo drop loads idempotently and never overwrites what has changed since.

use holdfast_engine::catalog::{self, DEMO_DROP};
use sqlx::PgPool;

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn demo_drop_loads_once_and_keeps_later_changes(pool: PgPool) {
    let first = catalog::load_demo_drop(&pool).await.unwrap();
    assert_eq!(first.inserted as usize, first.total);
    let skus = catalog::drop_skus(&pool, DEMO_DROP).await.unwrap();
    assert_eq!(skus.len(), first.total);
    assert_eq!(skus[0].sku, "DROP-001");
    assert_eq!(skus[0].on_hand, 2_000);
    assert_eq!(
        skus[0].product, skus[1].product,
        "hoodie variants share a product"
    );

    sqlx::query("UPDATE skus SET on_hand = 1990 WHERE sku = 'DROP-001'")
        .execute(&pool)
        .await
        .unwrap();
    let second = catalog::load_demo_drop(&pool).await.unwrap();
    assert_eq!(second.inserted, 0);
    let skus = catalog::drop_skus(&pool, DEMO_DROP).await.unwrap();
    assert_eq!(skus.len(), first.total);
    assert_eq!(skus[0].on_hand, 1_990, "a reload never resets stock");
}

#[sqlx::test(migrator = "holdfast_engine::postgres::MIGRATOR")]
async fn an_unknown_drop_has_no_skus(pool: PgPool) {
    assert!(
        catalog::drop_skus(&pool, "no-such-drop")
            .await
            .unwrap()
            .is_empty()
    );
    assert!(catalog::drops(&pool).await.unwrap().is_empty());
}
