//! The audit log of manual actions: who did what to which subject, and when.
//! Append-only; the dashboard lists it newest first.

use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::error::EngineError;

/// One audit entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct AuditEntry {
    /// Database id (increasing).
    pub id: i64,
    /// The username that acted.
    pub actor: String,
    /// What was done, e.g. `release_hold`.
    pub action: String,
    /// What it was done to, e.g. a reservation id or lock name.
    pub subject: String,
    /// Anything else worth keeping (reason, outcome).
    pub detail: serde_json::Value,
    /// When.
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// Appends an entry.
pub async fn record(
    pg: impl sqlx::PgExecutor<'_>,
    actor: &str,
    action: &str,
    subject: &str,
    detail: serde_json::Value,
) -> Result<(), EngineError> {
    sqlx::query("INSERT INTO audit_log (actor, action, subject, detail) VALUES ($1, $2, $3, $4)")
        .bind(actor)
        .bind(action)
        .bind(subject)
        .bind(detail)
        .execute(pg)
        .await?;
    Ok(())
}

/// Appends an entry for a manual action that has already happened: a failure to
/// write it is logged, never returned, so the action's own answer stands.
pub async fn note(
    pg: &PgPool,
    actor: &str,
    action: &str,
    subject: &str,
    detail: serde_json::Value,
) {
    if let Err(e) = record(pg, actor, action, subject, detail).await {
        tracing::error!(error = %e, actor, action, subject, "could not write the audit log");
    }
}

/// The audit actor for the command line: `cli:` and the operating-system user
/// (`$USER`, or `unknown`), so the log tells dashboard users and operators apart.
pub fn cli_actor() -> String {
    format!(
        "cli:{}",
        std::env::var("USER")
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| "unknown".to_owned())
    )
}

/// Up to `limit` entries older than `before` (the newest when `None`), newest
/// first, optionally only those whose actor, action or subject contains `search`.
pub async fn recent(
    pg: &PgPool,
    search: Option<&str>,
    before: Option<i64>,
    limit: i64,
) -> Result<Vec<AuditEntry>, EngineError> {
    let pattern = search
        .filter(|s| !s.trim().is_empty())
        .map(|s| format!("%{}%", s.trim().replace('%', "\\%").replace('_', "\\_")));
    Ok(sqlx::query_as::<_, AuditEntry>(
        "SELECT id, actor, action, subject, detail, created_at FROM audit_log
         WHERE ($1::bigint IS NULL OR id < $1)
           AND ($2::text IS NULL OR actor ILIKE $2 OR action ILIKE $2 OR subject ILIKE $2)
         ORDER BY id DESC LIMIT $3",
    )
    .bind(before)
    .bind(pattern)
    .bind(limit.clamp(1, 500))
    .fetch_all(pg)
    .await?)
}
