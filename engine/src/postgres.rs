//! PostgreSQL: connecting, creating the database when it is missing, and migrating.

use std::time::Duration;

use sqlx::{
    PgPool, Postgres,
    migrate::{MigrateDatabase, Migrator},
    postgres::PgPoolOptions,
};

use crate::error::{EngineError, redact_url};

/// The schema migrations in the workspace's `migrations/` folder, embedded at build time.
pub static MIGRATOR: Migrator = sqlx::migrate!("../migrations");

/// Connects to `url`, creating the database if the server answers but it does not
/// exist yet, and applies any pending migrations.
///
/// Fails fast (a few seconds) when the server is unreachable, with an error that
/// names the URL, so a mistyped `DATABASE_URL` is one readable line at start-up.
pub async fn connect_and_migrate(url: &str, max_connections: u32) -> Result<PgPool, EngineError> {
    let unreachable = |e: sqlx::Error| EngineError::PostgresUnreachable {
        url: redact_url(url),
        reason: one_line(&e.to_string()),
    };
    let exists = tokio::time::timeout(Duration::from_secs(5), Postgres::database_exists(url))
        .await
        .map_err(|_| EngineError::PostgresUnreachable {
            url: redact_url(url),
            reason: "no answer within 5 s".into(),
        })?
        .map_err(unreachable)?;
    if !exists {
        tracing::info!(url = %redact_url(url), "creating the database");
        Postgres::create_database(url).await.map_err(unreachable)?;
    }
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(5))
        .connect(url)
        .await
        .map_err(unreachable)?;
    MIGRATOR.run(&pool).await?;
    Ok(pool)
}

/// Whether PostgreSQL answers a trivial query within `timeout`.
pub async fn ping(pool: &PgPool, timeout: Duration) -> Result<(), String> {
    match tokio::time::timeout(timeout, sqlx::query("SELECT 1").execute(pool)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(one_line(&e.to_string())),
        Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
    }
}

/// Collapses a driver message onto one line: start-up errors must be a single line.
pub(crate) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Records that lock `lock_name` was used with fencing token `token`, refusing a
/// token older than the newest one seen.
///
/// Call it first inside the transaction that writes under the lock: it takes the
/// lock's fence row, so a holder with a newer token waits for this transaction
/// and a holder whose lease lapsed (and was followed by another) is refused.
pub async fn fence(
    tx: &mut sqlx::Transaction<'_, Postgres>,
    lock_name: &str,
    token: i64,
) -> Result<(), EngineError> {
    let accepted: Option<i64> = sqlx::query_scalar(
        "INSERT INTO fences (lock_name, token) VALUES ($1, $2)
         ON CONFLICT (lock_name) DO UPDATE SET token = EXCLUDED.token, updated_at = now()
          WHERE fences.token <= EXCLUDED.token
         RETURNING token",
    )
    .bind(lock_name)
    .bind(token)
    .fetch_optional(&mut **tx)
    .await?;
    match accepted {
        Some(_) => Ok(()),
        None => Err(EngineError::StaleFence {
            lock: lock_name.to_owned(),
            token,
        }),
    }
}
