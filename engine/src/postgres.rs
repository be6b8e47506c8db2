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
        match Postgres::create_database(url).await {
            // Another server of the deployment, started at the same moment,
            // created it first (`duplicate_database`, or the catalog's unique
            // index when both inserts raced): it exists, which is all we need.
            Err(e)
                if e.as_database_error()
                    .and_then(|d| d.code())
                    .is_some_and(|c| c == "42P04" || c == "23505") => {}
            other => other.map_err(unreachable)?,
        }
    }
    // Bounded waits: a request never queues longer than ACQUIRE_TIMEOUT for a
    // connection, and no statement runs longer than STATEMENT_TIMEOUT (a stuck
    // query fails and is retried rather than holding a connection forever).
    // A transaction left open by a process that froze (paused, swapped out, cut
    // off mid-batch) is ended by PostgreSQL after IDLE_IN_TRANSACTION, so its
    // row locks cannot stop every other server from recording.
    //
    // No JIT: every statement here is short, but a page of warm-up or a batch
    // of the write-behind (thousands of array elements) is estimated above
    // PostgreSQL's `jit_above_cost`, and compiling it with LLVM took more CPU
    // than running it: a profile of warming a million SKUs on two cores spent
    // 22% of all CPU in libLLVM (BENCHMARKS.md).
    let options: sqlx::postgres::PgConnectOptions = url.parse().map_err(unreachable)?;
    let options = options.options([
        (
            "statement_timeout",
            format!("{}", STATEMENT_TIMEOUT.as_millis()),
        ),
        (
            "idle_in_transaction_session_timeout",
            format!("{}", IDLE_IN_TRANSACTION.as_millis()),
        ),
        ("jit", "off".to_owned()),
    ]);
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(options)
        .await
        .map_err(unreachable)?;
    MIGRATOR.run(&pool).await?;
    Ok(pool)
}

/// Longest wait for a pooled connection: past it the caller gets an error
/// (the API answers 503 with `Retry-After`) instead of queueing behind an outage.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest any one statement may run (PostgreSQL's `statement_timeout`).
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest a transaction may sit open with no statement running
/// (PostgreSQL's `idle_in_transaction_session_timeout`): past it PostgreSQL
/// closes the session and rolls the transaction back. Holdfast's transactions
/// wait between statements only for one Redis call (answered in milliseconds,
/// cut at 5 s), so only a frozen or cut-off process reaches it; what it was
/// recording stays pending in Redis and is recorded again.
pub const IDLE_IN_TRANSACTION: Duration = Duration::from_secs(10);

/// How long a lookup on a path that must not wait on PostgreSQL (token checks,
/// badge thresholds) may take before the last known answer is used instead.
pub const QUICK_LOOKUP: Duration = Duration::from_millis(300);

/// Runs `lookup` for at most [`QUICK_LOOKUP`]; a slow PostgreSQL reads as an error.
pub async fn quick<T>(
    lookup: impl Future<Output = Result<T, EngineError>>,
) -> Result<T, EngineError> {
    tokio::time::timeout(QUICK_LOOKUP, lookup)
        .await
        .unwrap_or_else(|_| Err(EngineError::Postgres(sqlx::Error::PoolTimedOut)))
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

/// The newest fencing token PostgreSQL has accepted for lock `lock_name` (0 when
/// none): the floor for the next acquisition, so tokens never go backwards after
/// Redis loses its counter.
pub async fn last_fence(pg: &PgPool, lock_name: &str) -> Result<i64, EngineError> {
    let token: Option<i64> = sqlx::query_scalar("SELECT token FROM fences WHERE lock_name = $1")
        .bind(lock_name)
        .fetch_optional(pg)
        .await?;
    Ok(token.unwrap_or(0))
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

/// How a connection pool is used right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolUse {
    /// Connections open (in use and idle).
    pub open: u32,
    /// Open connections waiting for work.
    pub idle: u32,
    /// Most connections the pool opens.
    pub max: u32,
}

/// How long a caller waits for one of `pool`'s connections now: a connection is
/// taken and handed straight back. The pool library does not count its waiting
/// callers, so this probe stands for them: near zero while a connection is
/// free, rising when every connection is busy, and `limit` when none came
/// within it (the pool is exhausted).
pub async fn acquire_wait(pool: &PgPool, limit: Duration) -> Duration {
    let started = std::time::Instant::now();
    match tokio::time::timeout(limit, pool.acquire()).await {
        Ok(Ok(conn)) => {
            drop(conn);
            started.elapsed()
        }
        // No connection (PostgreSQL down, or none freed in time): the whole wait.
        Ok(Err(_)) | Err(_) => limit,
    }
}

/// `pool`'s use now (no I/O).
pub fn pool_use(pool: &PgPool) -> PoolUse {
    PoolUse {
        open: pool.size(),
        idle: u32::try_from(pool.num_idle()).unwrap_or(u32::MAX),
        max: pool.options().get_max_connections(),
    }
}
