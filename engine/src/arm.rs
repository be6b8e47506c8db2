//! Arming a drop before its start: its counters warmed and carrying its
//! schedule and limits, checked against PostgreSQL, and the things around it a
//! drop depends on (Redis' eviction policy, the write-behind, the feeds lane,
//! open holds, the schedule) read into one [`Readiness`]. `holdfast drop arm`
//! and the dashboard's readiness panel both come here.

use chrono::{DateTime, SecondsFormat, Utc};
use holdfast_domain::Lane;
use holdfast_domain::readiness::Readiness;
use sqlx::PgPool;

use crate::engine::Engine;
use crate::error::EngineError;
use crate::redis_conn::{EvictionCheck, check_eviction_policy};
use crate::schedule::{drop_schedule, push_settings};
use crate::verify::{lasting_drift, read_settings};
use crate::warmup::{read_counters, stock_rows, warm_list};

/// Oldest event the write-behind may still owe PostgreSQL for a drop to count
/// as ready.
pub const WRITE_BEHIND_READY_MS: u64 = 1_000;

/// What arming does besides checking.
#[derive(Debug, Clone, Copy, Default)]
pub struct ArmOptions {
    /// Pause the feeds lane, so supplier feeds wait until after the drop's rush.
    pub pause_feeds: bool,
}

/// The SKUs of drop `code`, in its order; `None` when there is no such drop.
async fn drop_skus(pg: &PgPool, code: &str) -> Result<Option<Vec<String>>, EngineError> {
    if drop_schedule(pg, code).await?.is_none() {
        return Ok(None);
    }
    Ok(Some(
        sqlx::query_scalar("SELECT sku FROM drop_skus WHERE drop_code = $1 ORDER BY position, sku")
            .bind(code)
            .fetch_all(pg)
            .await?,
    ))
}

/// Arms drop `code`: pauses the feeds lane when asked, warms the counters its
/// SKUs lack, writes its schedule and limits into them, then reads its
/// [`readiness`]. `None` when there is no such drop.
pub async fn arm(
    engine: &Engine,
    pg: &PgPool,
    code: &str,
    options: ArmOptions,
) -> Result<Option<Readiness>, EngineError> {
    let Some(skus) = drop_skus(pg, code).await? else {
        return Ok(None);
    };
    let mut done = Vec::new();
    if options.pause_feeds {
        crate::ingest::pause(&mut engine.connection(), Lane::Feeds).await?;
        done.push(
            "paused the feeds lane (resume it on the Ingestion page after the rush)".to_owned(),
        );
    }
    let warm = warm_list(engine, pg, &skus).await?;
    let moved = crate::drop_file::apply_pending_stock(engine, pg).await?;
    if moved > 0 {
        done.push(format!("applied {moved} waiting stock change(s)"));
    }
    done.push(format!(
        "warmed {} counter(s) ({} already there)",
        warm.warmed, warm.existing
    ));
    let (set, _) = push_settings(engine, pg, code).await?;
    done.push(format!(
        "wrote the schedule and limits into {set} counter(s)"
    ));
    let mut report = check(engine, pg, code, &skus).await?;
    report.armed = done;
    Ok(Some(report))
}

/// Drop `code`'s readiness, read without changing anything; `None` when there
/// is no such drop.
pub async fn readiness(
    engine: &Engine,
    pg: &PgPool,
    code: &str,
) -> Result<Option<Readiness>, EngineError> {
    let Some(skus) = drop_skus(pg, code).await? else {
        return Ok(None);
    };
    Ok(Some(check(engine, pg, code, &skus).await?))
}

fn shown(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

async fn check(
    engine: &Engine,
    pg: &PgPool,
    code: &str,
    skus: &[String],
) -> Result<Readiness, EngineError> {
    let mut r = Readiness {
        code: code.to_owned(),
        lines: Vec::new(),
        armed: Vec::new(),
    };
    let rows = stock_rows(pg, skus).await?;
    let names: Vec<&str> = rows.iter().map(|r| r.sku.as_str()).collect();
    let counters = read_counters(engine, &names).await?;
    let settings = read_settings(engine, &names).await?;

    let missing: Vec<&str> = names
        .iter()
        .zip(&counters)
        .filter(|(_, c)| c.available.is_none())
        .map(|(s, _)| *s)
        .collect();
    r.line(
        "counters warmed",
        !skus.is_empty() && missing.is_empty(),
        if skus.is_empty() {
            "the drop has no SKUs".to_owned()
        } else if missing.is_empty() {
            format!("all {} SKU(s) have a counter in Redis", names.len())
        } else {
            format!(
                "{} of {} SKU(s) have no counter ({}): arm the drop to warm them",
                missing.len(),
                names.len(),
                missing
                    .iter()
                    .take(5)
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
    );

    let mut off = Vec::new();
    let mut unfollowed = Vec::new();
    for ((row, c), set) in rows.iter().zip(&counters).zip(&settings) {
        let Some(available) = c.available else {
            continue;
        };
        let negative = available < 0 || c.reserved < 0 || c.sold_pending < 0 || c.owed < 0;
        if negative
            || (c.drift(&row.recorded()).unwrap_or(0) != 0
                && lasting_drift(engine, pg, &row.sku, 2).await?)
        {
            off.push(row.sku.as_str());
        }
        let wanted = [
            row.opens_ms,
            row.closes_ms,
            i64::from(row.per_buyer_limit.unwrap_or(0)),
        ];
        if *set != wanted {
            unfollowed.push(row.sku.as_str());
        }
    }
    r.line(
        "counters agree with PostgreSQL",
        off.is_empty(),
        if off.is_empty() {
            "every warmed counter conserves stock (available + moving + reserved + sold_pending - owed = on_hand)".to_owned()
        } else {
            format!(
                "{} SKU(s) drift or are negative ({}): run `holdfast reconcile` (or Reconcile on the dashboard) before the start",
                off.len(),
                off.iter().take(5).copied().collect::<Vec<_>>().join(", ")
            )
        },
    );
    r.line(
        "schedule and limits in the counters",
        unfollowed.is_empty(),
        if unfollowed.is_empty() {
            "every warmed counter has the drop's start, end and per-buyer limits".to_owned()
        } else {
            format!(
                "{} counter(s) disagree with PostgreSQL ({}): arm the drop to write them",
                unfollowed.len(),
                unfollowed
                    .iter()
                    .take(5)
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
    );

    let mut conn = engine.connection();
    let (ok, finding) = match check_eviction_policy(&mut conn, "", false).await {
        Ok(EvictionCheck::Safe(_)) => (
            true,
            "noeviction: Redis never deletes a counter or hold".to_owned(),
        ),
        Ok(EvictionCheck::Unknown(why)) => (
            false,
            format!("could not read maxmemory-policy ({why}); make sure it is noeviction"),
        ),
        Ok(EvictionCheck::Overridden(p)) => (
            false,
            format!("maxmemory-policy is {p}: Redis may delete counters and holds; set noeviction"),
        ),
        Err(e) => (false, e.to_string()),
    };
    r.line("Redis eviction policy", ok, finding);

    let (waiting, oldest_ms) =
        crate::drop_file::pending_stock(pg, Some(skus), std::time::Duration::from_secs(2)).await?;
    r.line(
        "stock changes applied",
        waiting == 0,
        if waiting == 0 {
            "every stock change from the drop's files is in the ledger".to_owned()
        } else {
            format!(
                "{waiting} stock change(s) wait, the oldest {} s: arm the drop to apply them (is Redis taking writes?)",
                oldest_ms / 1000
            )
        },
    );

    let lag = engine.write_behind_lag().await?;
    r.line(
        "write-behind caught up",
        lag.oldest_ms <= WRITE_BEHIND_READY_MS,
        if lag.entries == 0 {
            "PostgreSQL has every event".to_owned()
        } else {
            format!(
                "{} event(s) waiting, the oldest {} ms: {}",
                lag.entries,
                lag.oldest_ms,
                if lag.oldest_ms <= WRITE_BEHIND_READY_MS {
                    "keeping up"
                } else {
                    "is the write-behind running and PostgreSQL up?"
                }
            )
        },
    );

    let lane = crate::ingest::status(&mut conn, Lane::Feeds).await?;
    r.line(
        "feeds lane",
        true,
        format!(
            "{}, {} payload(s) waiting",
            if lane.paused() {
                "paused (supplier feeds wait; resume after the rush)"
            } else {
                "running (supplier feeds apply during the drop; arming can pause them)"
            },
            lane.backlog
        ),
    );

    let open: u64 = engine
        .figures_many(&names)
        .await?
        .iter()
        .flatten()
        .map(|f| f.open_holds)
        .sum();
    r.line(
        "open holds",
        true,
        format!(
            "{open} open hold(s) on the drop's SKUs (their units are not available until they end)"
        ),
    );

    let schedule = drop_schedule(pg, code).await?.unwrap_or_default();
    let now = Utc::now();
    let (ok, finding) = match (schedule.starts_at, schedule.ends_at) {
        (_, Some(end)) if end <= now => (
            false,
            format!(
                "the drop ended at {}: reschedule it to sell again",
                shown(end)
            ),
        ),
        (Some(start), _) if start > now => {
            (true, format!("opens at {} (by Redis' clock)", shown(start)))
        }
        (Some(start), _) => (true, format!("open since {}", shown(start))),
        (None, _) => (
            true,
            "no start set: it sells as soon as its counters exist".to_owned(),
        ),
    };
    r.line("schedule", ok, finding);
    Ok(r)
}
