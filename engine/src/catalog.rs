//! The catalogue as PostgreSQL records it: SKUs, drops, and the demo drop.

use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::error::EngineError;

/// The code of the demo drop that `holdfast serve --demo` loads.
pub const DEMO_DROP: &str = "winter-launch";

/// One SKU as the system of record knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow)]
pub struct SkuRecord {
    /// The stock-keeping unit code, e.g. `DROP-001`.
    pub sku: String,
    /// Human title shown on the dashboard.
    pub title: String,
    /// Product this SKU is a variant of; variants of one product show together.
    pub product: String,
    /// Size, colour or edition, when the product has variants.
    pub variant: Option<String>,
    /// Units the business owns, as far as PostgreSQL knows.
    pub on_hand: i64,
    /// At or below this many available units the SKU shows as low stock.
    pub low_stock_threshold: i32,
    /// Most units one buyer may hold or buy of this SKU, if limited.
    pub per_buyer_limit: Option<i32>,
}

/// A drop: a named sale and its SKUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow)]
pub struct DropRecord {
    /// Short code used in URLs, e.g. `winter-launch`.
    pub code: String,
    /// Display name.
    pub name: String,
}

/// The SKUs of drop `code`, in the drop's order; empty when the drop is unknown.
pub async fn drop_skus(pool: &PgPool, code: &str) -> Result<Vec<SkuRecord>, EngineError> {
    let rows = sqlx::query_as::<_, SkuRecord>(
        "SELECT s.sku, s.title, s.product, s.variant, s.on_hand, s.low_stock_threshold, s.per_buyer_limit
           FROM drop_skus d JOIN skus s ON s.sku = d.sku
          WHERE d.drop_code = $1
          ORDER BY d.position, s.sku",
    )
    .bind(code)
    .fetch_all(pool)
    .await?;
    Ok(rows)
}

/// One SKU's catalogue record; `None` when PostgreSQL does not know it.
pub async fn sku(pool: &PgPool, sku: &str) -> Result<Option<SkuRecord>, EngineError> {
    Ok(sqlx::query_as::<_, SkuRecord>(
        "SELECT sku, title, product, variant, on_hand, low_stock_threshold, per_buyer_limit
           FROM skus WHERE sku = $1",
    )
    .bind(sku)
    .fetch_optional(pool)
    .await?)
}

/// Every catalogue SKU's low-stock threshold, in one query: the badges keep it
/// in memory, so a shopper's request for any SKU, real or invented, costs
/// PostgreSQL nothing.
pub async fn thresholds(
    pool: &PgPool,
) -> Result<std::collections::HashMap<String, i64>, EngineError> {
    let rows: Vec<(String, i32)> = sqlx::query_as("SELECT sku, low_stock_threshold FROM skus")
        .fetch_all(pool)
        .await?;
    Ok(rows.into_iter().map(|(s, t)| (s, i64::from(t))).collect())
}

/// The SKUs of every drop, each once: newest drop first, in each drop's order.
pub async fn all_drop_skus(pool: &PgPool) -> Result<Vec<String>, EngineError> {
    Ok(sqlx::query_scalar(
        "SELECT sku FROM (
             SELECT d.sku, min(row) AS first
               FROM (SELECT ds.sku, row_number() OVER (ORDER BY dr.created_at DESC, dr.code, ds.position, ds.sku) AS row
                       FROM drop_skus ds JOIN drops dr ON dr.code = ds.drop_code) d
              GROUP BY d.sku) s
          ORDER BY first",
    )
    .fetch_all(pool)
    .await?)
}

/// Every drop, newest first.
pub async fn drops(pool: &PgPool) -> Result<Vec<DropRecord>, EngineError> {
    Ok(sqlx::query_as::<_, DropRecord>(
        "SELECT code, name FROM drops ORDER BY created_at DESC, code",
    )
    .fetch_all(pool)
    .await?)
}

/// One SKU of the demo drop: (sku, product, variant, on hand, low-stock threshold, per-buyer limit).
type DemoSku = (
    &'static str,
    &'static str,
    Option<&'static str>,
    i64,
    i32,
    Option<i32>,
);

/// The demo drop: a product with variants, a few single SKUs, one tiny edition.
const DEMO_SKUS: &[DemoSku] = &[
    (
        "DROP-001",
        "Holdfast Hoodie",
        Some("Black / M"),
        2_000,
        50,
        Some(2),
    ),
    (
        "DROP-002",
        "Holdfast Hoodie",
        Some("Black / L"),
        800,
        40,
        Some(2),
    ),
    (
        "DROP-003",
        "Holdfast Hoodie",
        Some("Sand / M"),
        500,
        25,
        Some(2),
    ),
    ("DROP-004", "Trail Cap", Some("Olive"), 150, 10, None),
    ("DROP-005", "Signed Print No. 7", None, 25, 5, Some(1)),
    ("DROP-006", "Enamel Pin Set", None, 12, 5, None),
];

/// What loading the demo drop did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DemoLoad {
    /// SKUs inserted by this call (0 when the demo was already loaded).
    pub inserted: u64,
    /// SKUs in the demo drop.
    pub total: usize,
}

/// A SKU to add to the catalogue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewSku<'a> {
    /// Its code.
    pub sku: &'a str,
    /// Human title.
    pub title: &'a str,
    /// The product it is a variant of.
    pub product: &'a str,
    /// Its variant, if any.
    pub variant: Option<&'a str>,
    /// Units on hand.
    pub on_hand: i64,
    /// Low-stock threshold.
    pub low_stock_threshold: i32,
    /// Per-buyer limit, if any.
    pub per_buyer_limit: Option<i32>,
}

/// Creates drop `code` named `name` unless it exists.
async fn ensure_drop(
    tx: &mut sqlx::PgConnection,
    code: &str,
    name: &str,
) -> Result<(), EngineError> {
    sqlx::query("INSERT INTO drops (code, name) VALUES ($1, $2) ON CONFLICT (code) DO NOTHING")
        .bind(code)
        .bind(name)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Inserts `new` unless its code exists (an existing row is never changed) and
/// lists it in drop `code` at `position` (`None`: after the drop's last SKU).
/// Returns whether the SKU row was new.
async fn insert_sku(
    tx: &mut sqlx::PgConnection,
    code: &str,
    new: &NewSku<'_>,
    position: Option<i32>,
) -> Result<bool, EngineError> {
    let inserted = sqlx::query(
        "INSERT INTO skus (sku, title, product, variant, on_hand, low_stock_threshold, per_buyer_limit)
         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (sku) DO NOTHING",
    )
    .bind(new.sku)
    .bind(new.title)
    .bind(new.product)
    .bind(new.variant)
    .bind(new.on_hand)
    .bind(new.low_stock_threshold)
    .bind(new.per_buyer_limit)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    sqlx::query(
        "INSERT INTO drop_skus (drop_code, sku, position)
         SELECT $1, $2, coalesce($3, (SELECT coalesce(max(position), 0) + 1 FROM drop_skus WHERE drop_code = $1))
         ON CONFLICT DO NOTHING",
    )
    .bind(code)
    .bind(new.sku)
    .bind(position)
    .execute(&mut *tx)
    .await?;
    Ok(inserted == 1)
}

/// Adds `new` to drop `code` (created as `name` if missing), all or nothing.
/// Answers `false`, changing nothing, when the SKU already exists.
pub async fn add_sku(
    pool: &PgPool,
    code: &str,
    name: &str,
    new: &NewSku<'_>,
) -> Result<bool, EngineError> {
    let mut tx = pool.begin().await?;
    ensure_drop(&mut tx, code, name).await?;
    if !insert_sku(&mut tx, code, new, None).await? {
        return Ok(false);
    }
    tx.commit().await?;
    Ok(true)
}

/// `(on_hand, sold_recorded)` of `sku` in PostgreSQL; `None` when unknown.
pub async fn recorded(pool: &PgPool, sku: &str) -> Result<Option<(i64, i64)>, EngineError> {
    Ok(
        sqlx::query_as("SELECT on_hand, sold_recorded FROM skus WHERE sku = $1")
            .bind(sku)
            .fetch_optional(pool)
            .await?,
    )
}

/// Loads the demo drop idempotently: existing rows are left exactly as they are, so
/// a restart never resets stock that has since been sold or corrected.
pub async fn load_demo_drop(pool: &PgPool) -> Result<DemoLoad, EngineError> {
    let mut tx = pool.begin().await?;
    ensure_drop(&mut tx, DEMO_DROP, "Winter Launch Drop").await?;
    let mut inserted = 0;
    for (position, (sku, product, variant, on_hand, threshold, limit)) in
        DEMO_SKUS.iter().enumerate()
    {
        let title = match variant {
            Some(v) => format!("{product} — {v}"),
            None => (*product).to_owned(),
        };
        let new = NewSku {
            sku,
            title: &title,
            product,
            variant: *variant,
            on_hand: *on_hand,
            low_stock_threshold: *threshold,
            per_buyer_limit: *limit,
        };
        if insert_sku(&mut tx, DEMO_DROP, &new, Some(position as i32)).await? {
            inserted += 1;
        }
    }
    tx.commit().await?;
    Ok(DemoLoad {
        inserted,
        total: DEMO_SKUS.len(),
    })
}
