//! Late payments: a confirm that arrived after its hold ended takes no stock and
//! leaves a remediation record (refund or re-reserve) for support to act on.

use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::error::EngineError;

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
        "SELECT id, reservation_id, hold_state, reason, status, created_at FROM remediations
         WHERE $1::text IS NULL OR reservation_id ILIKE $1
         ORDER BY id DESC LIMIT $2",
    )
    .bind(pattern)
    .bind(limit.clamp(1, 500))
    .fetch_all(pg)
    .await?)
}
