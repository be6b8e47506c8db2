//! Late payments: a confirm that arrived after its hold ended takes no stock and
//! leaves a remediation record (refund or re-reserve) for support to act on.

use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::error::EngineError;
use crate::model::ConfirmOutcome;

/// One remediation record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow)]
pub struct Remediation {
    /// Database id.
    pub id: i64,
    /// The reservation whose payment came late.
    pub reservation_id: String,
    /// How the hold had ended (`expired` or `released`).
    pub hold_state: String,
    /// Why the record exists.
    pub reason: String,
    /// `late_payment`, `oversold` or `unknown_confirm`.
    pub kind: String,
    /// `open`, `refunded`, `fulfilled` or `closed`.
    pub status: String,
    /// When it was written.
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// Records a late payment for `reservation_id` once (a retried confirm adds nothing).
pub async fn record_late_payment(
    pg: &PgPool,
    reservation_id: &str,
    hold_state: &str,
) -> Result<(), EngineError> {
    sqlx::query(
        "INSERT INTO remediations (reservation_id, hold_state, reason) VALUES ($1, $2, $3)
         ON CONFLICT (reservation_id) DO NOTHING",
    )
    .bind(reservation_id)
    .bind(hold_state)
    .bind("payment confirmed after the hold ended; no stock was taken")
    .execute(pg)
    .await?;
    Ok(())
}

/// Decides a confirm for reservation `id` that Redis does not know, from the
/// system of record: an order means it was confirmed (and recorded) before Redis
/// lost it; a hold the write-behind recorded means Redis lost an open or ended
/// hold, so a remediation with its buyer and lines is written (once); otherwise
/// it never existed.
pub async fn confirm_unknown(pg: &PgPool, id: &str) -> Result<ConfirmOutcome, EngineError> {
    if ordered(pg, id).await? {
        return Ok(ConfirmOutcome::AlreadyConfirmed);
    }
    let lines: Vec<(String, i64, Option<String>)> =
        sqlx::query_as("SELECT sku, qty, buyer FROM holds WHERE reservation_id = $1 ORDER BY sku")
            .bind(id)
            .fetch_all(pg)
            .await?;
    if lines.is_empty() {
        return Ok(ConfirmOutcome::Unknown);
    }
    let buyer = lines
        .iter()
        .find_map(|(_, _, b)| b.clone())
        .unwrap_or_else(|| "no buyer given".to_owned());
    let what = lines
        .iter()
        .map(|(sku, qty, _)| format!("{qty} x {sku}"))
        .collect::<Vec<_>>()
        .join(", ");
    sqlx::query(
        "INSERT INTO remediations (reservation_id, hold_state, reason, kind)
         VALUES ($1, 'unknown', $2, 'unknown_confirm') ON CONFLICT (reservation_id) DO NOTHING",
    )
    .bind(id)
    .bind(format!(
        "payment confirmed for a reservation Redis no longer knows (it lost its data): \
         {what} for {buyer}; no stock was taken: refund or re-reserve"
    ))
    .execute(pg)
    .await?;
    tracing::warn!(reservation = %id, "a confirm for a hold Redis lost: remediation recorded");
    Ok(ConfirmOutcome::Lost)
}

/// Whether the system of record has an order for reservation `id` (it was
/// confirmed, and the write-behind recorded the sale).
pub async fn ordered(pg: &PgPool, id: &str) -> Result<bool, EngineError> {
    Ok(
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM orders WHERE reservation_id = $1)")
            .bind(id)
            .fetch_one(pg)
            .await?,
    )
}

/// The newest `limit` records, optionally only those for reservation ids
/// containing `search`.
pub async fn list(
    pg: &PgPool,
    search: Option<&str>,
    limit: i64,
) -> Result<Vec<Remediation>, EngineError> {
    let pattern = search
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| format!("%{}%", s.replace('%', "\\%").replace('_', "\\_")));
    Ok(sqlx::query_as::<_, Remediation>(
        "SELECT id, reservation_id, hold_state, reason, kind, status, created_at FROM remediations
         WHERE $1::text IS NULL OR reservation_id ILIKE $1
         ORDER BY id DESC LIMIT $2",
    )
    .bind(pattern)
    .bind(limit.clamp(1, 500))
    .fetch_all(pg)
    .await?)
}
