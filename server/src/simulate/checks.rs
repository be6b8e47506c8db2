//! Setting up the rehearsal's SKU, and the truth checks after the run: nothing
//! oversold, stock conserved in Redis and in PostgreSQL, every hold ended exactly
//! once, retries answered alike, the per-buyer limit kept.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use holdfast_engine::Backends;
use holdfast_engine::stock::WarmSpec;
use serde::Serialize;

use super::DROP;
use super::load::Tally;

/// One check's verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What was checked.
    pub name: &'static str,
    /// Whether it held.
    pub passed: bool,
    /// The figures behind the verdict.
    pub detail: String,
}

fn check(name: &'static str, passed: bool, detail: String) -> Check {
    Check {
        name,
        passed,
        detail,
    }
}

/// Creates `sku` with `units` on hand in the `rehearsal` drop and warms its counter.
pub async fn create_sku(b: &Backends, sku: &str, units: i64, limit: i64) -> anyhow::Result<()> {
    let mut tx = b.pg.begin().await?;
    sqlx::query(
        "INSERT INTO drops (code, name) VALUES ($1, 'Drop rehearsal') ON CONFLICT (code) DO NOTHING",
    )
    .bind(DROP)
    .execute(&mut *tx)
    .await?;
    let inserted = sqlx::query(
        "INSERT INTO skus (sku, title, product, variant, on_hand, low_stock_threshold, per_buyer_limit)
         VALUES ($1, 'Rehearsal ' || $1, 'Drop rehearsal', $1, $2, $3, $4) ON CONFLICT (sku) DO NOTHING",
    )
    .bind(sku)
    .bind(units)
    .bind((units / 10).clamp(1, 1_000) as i32)
    .bind(i32::try_from(limit).ok().filter(|l| *l > 0))
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if inserted == 0 {
        anyhow::bail!(
            "SKU {sku} already exists; a rehearsal needs a SKU of its own (leave out --sku)"
        );
    }
    sqlx::query(
        "INSERT INTO drop_skus (drop_code, sku, position)
         SELECT $1, $2, coalesce(max(position), 0) + 1 FROM drop_skus WHERE drop_code = $1",
    )
    .bind(DROP)
    .bind(sku)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    let spec = WarmSpec {
        per_buyer_limit: limit.max(0),
        ..WarmSpec::new(sku, units)
    };
    b.engine.warm(&spec, false).await?;
    Ok(())
}

/// The id of the newest event in `sku`'s shard stream (`0-0` when empty).
pub async fn stream_position(b: &Backends, sku: &str) -> anyhow::Result<String> {
    let keys = b.engine.keyspace();
    let rows: Vec<(String, HashMap<String, String>)> = redis::cmd("XREVRANGE")
        .arg(keys.events(keys.shard_of(sku)))
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(1)
        .query_async(&mut b.engine.connection())
        .await?;
    Ok(rows
        .into_iter()
        .next()
        .map_or_else(|| "0-0".to_owned(), |(id, _)| id))
}

/// `(kind, reservation id)` of every event about `sku` after `after`.
async fn events_since(
    b: &Backends,
    sku: &str,
    after: &str,
) -> anyhow::Result<Vec<(String, String)>> {
    let keys = b.engine.keyspace();
    let stream = keys.events(keys.shard_of(sku));
    let mut from = format!("({after}");
    let mut out = Vec::new();
    loop {
        let rows: Vec<(String, HashMap<String, String>)> = redis::cmd("XRANGE")
            .arg(&stream)
            .arg(&from)
            .arg("+")
            .arg("COUNT")
            .arg(10_000)
            .query_async(&mut b.engine.connection())
            .await?;
        let Some((last, _)) = rows.last() else { break };
        from = format!("({last}");
        for (_, f) in rows {
            if f.get("sku").map(String::as_str) == Some(sku) {
                out.push((
                    f.get("kind").cloned().unwrap_or_default(),
                    f.get("rid")
                        .or_else(|| f.get("reservation_id"))
                        .cloned()
                        .unwrap_or_default(),
                ));
            }
        }
    }
    Ok(out)
}

struct Pg {
    on_hand: i64,
    sold_recorded: i64,
}

async fn pg_figures(b: &Backends, sku: &str) -> anyhow::Result<Pg> {
    let (on_hand, sold_recorded): (i64, i64) =
        sqlx::query_as("SELECT on_hand, sold_recorded FROM skus WHERE sku = $1")
            .bind(sku)
            .fetch_one(&b.pg)
            .await?;
    Ok(Pg {
        on_hand,
        sold_recorded,
    })
}

/// Waits (up to `settle`) for every hold to end and every sale to reach
/// PostgreSQL, then runs every check.
#[allow(clippy::too_many_arguments)]
pub async fn run_all(
    b: &Backends,
    sku: &str,
    units: i64,
    limit: i64,
    tally: &Tally,
    start_id: &str,
    settle: Duration,
) -> anyhow::Result<Vec<Check>> {
    let deadline = Instant::now() + settle;
    loop {
        let f = b.engine.figures(sku).await?.unwrap_or_default();
        let pg = pg_figures(b, sku).await?;
        let settled = f.reserved == 0 && f.sold_pending == 0 && pg.sold_recorded == f.sold;
        if settled || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let f = b.engine.figures(sku).await?.unwrap_or_default();
    let pg = pg_figures(b, sku).await?;
    let api_sold = tally.sold_units.load(Ordering::Relaxed) as i64;
    let mut checks = vec![
        check(
            "nothing oversold",
            f.sold <= units && api_sold <= units && f.available >= 0,
            format!(
                "{} of {units} units sold (Redis), {api_sold} confirmed to shoppers; available {}",
                f.sold, f.available
            ),
        ),
        check(
            "sales match what shoppers were told",
            f.sold == api_sold,
            format!("Redis sold {} = confirmed to shoppers {api_sold}", f.sold),
        ),
        check(
            "stock conserved in Redis",
            f.available + f.reserved + f.sold == units,
            format!(
                "available {} + reserved {} + sold {} = {} (stock {units})",
                f.available,
                f.reserved,
                f.sold,
                f.available + f.reserved + f.sold
            ),
        ),
        check(
            "no hold left open",
            f.reserved == 0 && f.open_holds == 0,
            format!("reserved {}, open holds {}", f.reserved, f.open_holds),
        ),
        check(
            "PostgreSQL has every sale and conserves stock",
            pg.sold_recorded == f.sold
                && pg.on_hand + pg.sold_recorded == units
                && f.available + f.reserved + f.sold_pending == pg.on_hand,
            format!(
                "sold recorded {} (Redis {}), on hand {} + sold {} = {} (stock {units}); Redis available+reserved+pending {} = on hand {}",
                pg.sold_recorded,
                f.sold,
                pg.on_hand,
                pg.sold_recorded,
                pg.on_hand + pg.sold_recorded,
                f.available + f.reserved + f.sold_pending,
                pg.on_hand
            ),
        ),
    ];

    let events = events_since(b, sku, start_id).await?;
    let mut endings: HashMap<&str, Vec<&str>> = HashMap::new();
    let mut reserved = 0u64;
    for (kind, rid) in &events {
        match kind.as_str() {
            "reserved" => reserved += 1,
            "confirmed" | "released" | "expired" => {
                endings.entry(rid.as_str()).or_default().push(kind.as_str())
            }
            _ => {}
        }
    }
    let holds = tally
        .holds
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let not_once = holds
        .iter()
        .filter(|(id, _)| endings.get(id.as_str()).map_or(0, Vec::len) != 1)
        .count();
    let count = |k: &str| endings.values().flatten().filter(|e| **e == k).count() as u64;
    let (confirmed, released, expired) = (count("confirmed"), count("released"), count("expired"));
    let expected_expired =
        tally.abandoned.load(Ordering::Relaxed) + tally.late.load(Ordering::Relaxed);
    checks.push(check(
        "every hold ended exactly once",
        not_once == 0
            && reserved == holds.len() as u64
            && confirmed == tally.confirmed.load(Ordering::Relaxed)
            && released == tally.released.load(Ordering::Relaxed)
            && expired == expected_expired,
        format!(
            "{} holds: {not_once} not ended exactly once; {confirmed} confirmed, {released} released, {expired} expired (expected {expected_expired}); {reserved} reserve events",
            holds.len()
        ),
    ));
    let mismatch = tally.retry_mismatch.load(Ordering::Relaxed);
    checks.push(check(
        "a retry with the same key gets the same answer",
        mismatch == 0,
        format!(
            "{} retries, {mismatch} answered differently",
            tally.retries.load(Ordering::Relaxed)
        ),
    ));
    let most = tally
        .per_buyer
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .values()
        .copied()
        .max()
        .unwrap_or(0);
    checks.push(check(
        "the per-buyer limit held",
        limit <= 0 || most <= limit,
        format!("most units bought by one buyer: {most} (limit {limit})"),
    ));
    let errors = tally.errors.load(Ordering::Relaxed);
    checks.push(check(
        "no errors",
        errors == 0,
        format!("{errors} transport failures or unexpected answers"),
    ));
    Ok(checks)
}
