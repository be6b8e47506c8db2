//! A drop's schedule: when its SKUs start and stop selling, to the second and the
//! same on every server.
//!
//! The start and end live in PostgreSQL (`drops.starts_at`, `ends_at`) and in
//! each SKU's Redis counter (`opens`, `closes`, Unix ms), where `reserve.lua`
//! compares them with Redis' own clock (`TIME`): every server flips at the same
//! instant whatever its own clock says, and nobody gets in early through a
//! skewed one. Warm-up writes them with the counter (so they survive a Redis
//! loss); [`schedule_drop`] changes them at once for every SKU of a drop.
//!
//! A SKU follows at most one scheduled drop: [`schedule_drop`] refuses a
//! schedule for a drop sharing a SKU with another scheduled drop that has not
//! ended (the SKU would otherwise sell in the gap between them). A SKU in a
//! scheduled drop and in unscheduled ones follows the schedule; in no
//! scheduled drop it always sells. Drops that have ended step aside once the
//! SKU is in one that has not: a SKU of a past drop can be sold again in a
//! new one (scheduled or not), and the past drop keeps its schedule, so its
//! report keeps its window.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::{Engine, EngineError};

/// The SQL columns `opens_ms` and `closes_ms` (Unix ms, 0 for none) of the SKU
/// aliased `s`, by the rule above: the latest start and the earliest end of its
/// drops that have not ended (of all its drops when every one has), so a SKU
/// put in several scheduled drops by hand (SQL) sells only where all of them
/// are open, never in a gap. The one place that rule is written.
pub(crate) const WINDOW_COLUMNS: &str = "
    COALESCE((SELECT (extract(epoch FROM max(d.starts_at)) * 1000)::bigint
                FROM drop_skus ds JOIN drops d ON d.code = ds.drop_code
               WHERE ds.sku = s.sku AND (d.ends_at IS NULL OR d.ends_at > now()
                     OR NOT EXISTS (SELECT 1 FROM drop_skus ls JOIN drops l ON l.code = ls.drop_code
                                     WHERE ls.sku = s.sku AND (l.ends_at IS NULL OR l.ends_at > now())))),
             0) AS opens_ms,
    COALESCE((SELECT (extract(epoch FROM min(d.ends_at)) * 1000)::bigint
                FROM drop_skus ds JOIN drops d ON d.code = ds.drop_code
               WHERE ds.sku = s.sku AND (d.ends_at IS NULL OR d.ends_at > now()
                     OR NOT EXISTS (SELECT 1 FROM drop_skus ls JOIN drops l ON l.code = ls.drop_code
                                     WHERE ls.sku = s.sku AND (l.ends_at IS NULL OR l.ends_at > now())))),
             0) AS closes_ms";

/// When a drop sells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DropSchedule {
    /// Reservations before this instant answer `not_started`; `None`: at once.
    pub starts_at: Option<DateTime<Utc>>,
    /// Reservations from this instant answer `ended`; `None`: never.
    pub ends_at: Option<DateTime<Utc>>,
}

impl DropSchedule {
    /// This schedule to the millisecond, the precision Redis decides with
    /// (`opens`/`closes` are Unix ms): finer digits would be kept by
    /// PostgreSQL (to the microsecond) or dropped, and two bounds a fraction
    /// of a millisecond apart would be one instant in Redis. Every schedule
    /// taken in (files, the API, the command line) goes through this first.
    pub fn to_millis(self) -> Self {
        use chrono::SubsecRound;
        Self {
            starts_at: self.starts_at.map(|t| t.trunc_subsecs(3)),
            ends_at: self.ends_at.map(|t| t.trunc_subsecs(3)),
        }
    }

    /// Why this schedule cannot be used, if it cannot.
    pub fn problem(&self) -> Option<&'static str> {
        use chrono::Datelike;
        match (self.starts_at, self.ends_at) {
            // RFC 3339 writes four-digit years: an export could not be read back.
            (Some(s), _) if s.year() > 9999 => Some("the start must be before the year 10000"),
            (_, Some(e)) if e.year() > 9999 => Some("the end must be before the year 10000"),
            (Some(s), Some(e)) if e <= s => Some("the end must come after the start"),
            // 0 means "no bound" in Redis: 1970-01-01T00:00:00Z itself is refused too.
            (Some(s), _) if s.timestamp_millis() <= 0 => Some("the start must be after 1970"),
            (_, Some(e)) if e.timestamp_millis() <= 0 => Some("the end must be after 1970"),
            _ => None,
        }
    }
}

/// What [`schedule_drop`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScheduleOutcome {
    /// Recorded, and every warmed counter of the drop's SKUs follows it now.
    Scheduled {
        /// Counters updated in Redis.
        counters: u64,
        /// SKUs without a counter yet (warm-up writes their schedule).
        not_warmed: u64,
    },
    /// No drop has that code.
    UnknownDrop,
    /// The schedule cannot be used (the end before the start, a SKU in another
    /// scheduled drop, …); nothing changed.
    Invalid(String),
}

/// The schedule of drop `code`; `None` when there is no such drop.
pub async fn drop_schedule(pg: &PgPool, code: &str) -> Result<Option<DropSchedule>, EngineError> {
    Ok(named_drop(pg, code).await?.map(|(_, schedule)| schedule))
}

/// The name and schedule of drop `code`; `None` when there is no such drop.
pub async fn named_drop(
    pg: &PgPool,
    code: &str,
) -> Result<Option<(String, DropSchedule)>, EngineError> {
    // No drop has a code outside the rule (a NUL byte would even fail the
    // query as a database error, read as an outage).
    if !crate::drop_file::valid_drop_code(code) {
        return Ok(None);
    }
    type Row = (String, Option<DateTime<Utc>>, Option<DateTime<Utc>>);
    let row: Option<Row> =
        sqlx::query_as("SELECT name, starts_at, ends_at FROM drops WHERE code = $1")
            .bind(code)
            .fetch_optional(pg)
            .await?;
    Ok(row.map(|(name, starts_at, ends_at)| (name, DropSchedule { starts_at, ends_at })))
}

/// Sets drop `code`'s schedule in PostgreSQL, then in the counter of each of its
/// SKUs, so it takes effect on every server at once. Run again after a failure
/// half-way (Redis unreachable): it converges.
pub async fn schedule_drop(
    engine: &Engine,
    pg: &PgPool,
    code: &str,
    schedule: DropSchedule,
) -> Result<ScheduleOutcome, EngineError> {
    if !crate::drop_file::valid_drop_code(code) {
        return Ok(ScheduleOutcome::UnknownDrop);
    }
    let schedule = schedule.to_millis();
    if let Some(problem) = schedule.problem() {
        return Ok(ScheduleOutcome::Invalid(problem.to_owned()));
    }
    let mut tx = pg.begin().await?;
    // The drop first, then its SKUs: an import of another drop listing them
    // waits (or is waited for), so the check below cannot miss it.
    lock_drop(&mut tx, code, &[]).await?;
    let skus: Vec<String> = sqlx::query_scalar("SELECT sku FROM drop_skus WHERE drop_code = $1")
        .bind(code)
        .fetch_all(&mut *tx)
        .await?;
    lock_drop(&mut tx, code, &skus).await?;
    if (schedule.starts_at.is_some() || schedule.ends_at.is_some())
        && let Some(problem) = shared_with_scheduled(&mut *tx, code, &skus).await?
    {
        return Ok(ScheduleOutcome::Invalid(problem));
    }
    let updated = sqlx::query("UPDATE drops SET starts_at = $2, ends_at = $3 WHERE code = $1")
        .bind(code)
        .bind(schedule.starts_at)
        .bind(schedule.ends_at)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if updated == 0 {
        return Ok(ScheduleOutcome::UnknownDrop);
    }
    tx.commit().await?;
    let (counters, not_warmed) = push_settings(engine, pg, code).await?;
    Ok(ScheduleOutcome::Scheduled {
        counters,
        not_warmed,
    })
}

/// Takes, until `tx` ends, the lock of drop `code` and then of each of `skus`
/// (in code order): one change of a drop at a time, and of a SKU's drops at a
/// time. Everyone takes them in this order, so two changes never wait on each
/// other; taking one again in the same transaction is free.
pub(crate) async fn lock_drop(
    tx: &mut sqlx::PgConnection,
    code: &str,
    skus: &[String],
) -> Result<(), EngineError> {
    let mut locks = sku_locks(skus);
    locks.insert(0, format!("holdfast:drop:{code}"));
    take_locks(tx, &locks).await
}

/// Takes, until `tx` ends, the locks of `skus` (in code order), as
/// [`lock_drop`] does after its drop's.
async fn lock_skus(tx: &mut sqlx::PgConnection, skus: &[String]) -> Result<(), EngineError> {
    take_locks(tx, &sku_locks(skus)).await
}

/// The lock names of `skus`, in code order (the order everyone takes them in).
fn sku_locks(skus: &[String]) -> Vec<String> {
    let mut locks: Vec<String> = skus.iter().map(|s| format!("holdfast:sku:{s}")).collect();
    locks.sort();
    locks
}

/// Takes the advisory locks named `locks`, in their order, until `tx` ends.
async fn take_locks(tx: &mut sqlx::PgConnection, locks: &[String]) -> Result<(), EngineError> {
    sqlx::query(
        "SELECT pg_advisory_xact_lock(hashtextextended(k, 0))
           FROM UNNEST($1::text[]) WITH ORDINALITY AS t(k, n) ORDER BY n",
    )
    .bind(locks)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Why drop `code` cannot have a schedule while it holds `skus`, if it cannot:
/// one window per SKU, so a SKU in another scheduled drop would sell in the
/// gap between the two (its window spans both).
pub(crate) async fn shared_with_scheduled(
    pg: impl sqlx::PgExecutor<'_>,
    code: &str,
    skus: &[String],
) -> Result<Option<String>, EngineError> {
    let shared: Vec<(String, String)> = sqlx::query_as(
        "SELECT o.sku, o.drop_code
           FROM drop_skus o JOIN drops d ON d.code = o.drop_code
          WHERE o.sku = ANY($2) AND o.drop_code <> $1
            AND (d.starts_at IS NOT NULL OR d.ends_at IS NOT NULL)
            AND (d.ends_at IS NULL OR d.ends_at > now())
          ORDER BY o.sku, o.drop_code LIMIT 5",
    )
    .bind(code)
    .bind(skus)
    .fetch_all(pg)
    .await?;
    if shared.is_empty() {
        return Ok(None);
    }
    let list: Vec<String> = shared
        .iter()
        .map(|(sku, other)| format!("{sku} (in {other})"))
        .collect();
    Ok(Some(format!(
        "a SKU can follow one scheduled drop only, and these are in another \
         scheduled drop that has not ended: {}; clear that drop's schedule, or \
         schedule this one once it has ended",
        list.join(", ")
    )))
}

/// Writes what PostgreSQL says of drop `code`'s SKUs into their warmed
/// counters: each SKU's window (by the rule above) and per-buyer limit. Returns
/// `(counters set, SKUs without a counter)`; warm-up writes the latter's.
pub(crate) async fn push_settings(
    engine: &Engine,
    pg: &PgPool,
    code: &str,
) -> Result<(u64, u64), EngineError> {
    let settings: Vec<(String, i64, i64, Option<i32>)> = sqlx::query_as(&format!(
        "SELECT s.sku, {WINDOW_COLUMNS}, s.per_buyer_limit
           FROM skus s JOIN drop_skus x ON x.sku = s.sku
          WHERE x.drop_code = $1 ORDER BY s.sku"
    ))
    .bind(code)
    .fetch_all(pg)
    .await?;
    write_settings(engine, &settings).await
}

/// Writes each row's window and limit (`sku, opens, closes, limit`) into its
/// SKU's counter; counts the counters written and the SKUs without one.
async fn write_settings(
    engine: &Engine,
    settings: &[(String, i64, i64, Option<i32>)],
) -> Result<(u64, u64), EngineError> {
    let (mut counters, mut not_warmed) = (0, 0);
    // A pipeline runs EVALSHA only: the script is loaded first (as warm-up does).
    engine
        .scripts
        .schedule
        .prepare_invoke()
        .load_async(&mut engine.conn.clone())
        .await?;
    for chunk in settings.chunks(500) {
        let mut pipe = redis::pipe();
        // Every part of a split SKU decides by the same window and limit: how
        // many each has is read first (one round trip; any process may write
        // settings, whether or not it has seen the split).
        let mut ask = redis::pipe();
        for (sku, ..) in chunk {
            ask.cmd("HGET").arg(engine.keys.sku(sku)).arg("parts");
        }
        let counts: Vec<Option<u16>> = ask.query_async(&mut engine.conn.clone()).await?;
        let mut first = Vec::new();
        for ((sku, opens, closes, limit), parts) in chunk.iter().zip(counts) {
            // 0: its parts are being changed; every part there is gets them.
            let names = match parts.unwrap_or(1).min(crate::keys::MAX_PARTS) {
                0 => engine.existing_parts(sku).await?,
                1 => vec![sku.clone()],
                k => (0..k).map(|j| crate::keys::part_name(sku, j, k)).collect(),
            };
            first.push(true);
            first.extend((1..names.len()).map(|_| false));
            for name in &names {
                pipe.invoke_script(
                    engine
                        .scripts
                        .schedule
                        .key(engine.keys.sku(name))
                        .arg(opens)
                        .arg(closes)
                        .arg(limit.unwrap_or(0)),
                );
            }
        }
        let set: Vec<i64> = pipe.query_async(&mut engine.conn.clone()).await?;
        for (one, counted) in set.into_iter().zip(first) {
            if !counted {
                continue;
            }
            if one == 1 {
                counters += 1;
            } else {
                not_warmed += 1;
            }
        }
    }
    Ok((counters, not_warmed))
}

/// Writes the schedule and per-buyer limit PostgreSQL has into every counter
/// that has others (an import or schedule whose process died between its
/// commit and Redis); returns how many counters it corrected. Each SKU is
/// read and written under its lock, so a change committed meanwhile is
/// either read here or written after this (never undone by it). Servers run
/// it at start and every minute.
pub async fn follow_catalogue(engine: &Engine, pg: &PgPool) -> Result<u64, EngineError> {
    let mut corrected = 0;
    let mut after = String::new();
    loop {
        let rows = crate::warmup::stock_page(pg, &after, 500).await?;
        let Some(last) = rows.last() else { break };
        after = last.sku.clone();
        let skus: Vec<&str> = rows.iter().map(|r| r.sku.as_str()).collect();
        let settings = crate::verify::read_settings(engine, &skus).await?;
        let off: Vec<String> = rows
            .iter()
            .zip(settings)
            .filter(|(row, set)| *set != row.settings())
            .map(|(row, _)| row.sku.clone())
            .collect();
        if off.is_empty() {
            continue;
        }
        let mut tx = pg.begin().await?;
        lock_skus(&mut tx, &off).await?;
        let settings: Vec<(String, i64, i64, Option<i32>)> = sqlx::query_as(&format!(
            "SELECT s.sku, {WINDOW_COLUMNS}, s.per_buyer_limit
               FROM skus s WHERE s.sku = ANY($1) ORDER BY s.sku"
        ))
        .bind(&off)
        .fetch_all(&mut *tx)
        .await?;
        corrected += write_settings(engine, &settings).await?.0;
        tx.commit().await?;
    }
    Ok(corrected)
}
