//! Setting up the rehearsal's SKU, and the truth checks after the run: nothing
//! oversold, every sale told to shoppers made in Redis, every hold ended exactly
//! once, retries answered alike, the per-buyer limit kept, and then the
//! operators' truth check (`holdfast_engine::verify`, as `holdfast verify` runs it).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use holdfast_engine::Backends;
use holdfast_engine::catalog::{self, NewSku};
use holdfast_engine::events::{self, EventKind};
use holdfast_engine::stock::WarmSpec;
use holdfast_engine::verify::{self, VerifyOptions};
use serde::Serialize;

use super::DROP;
use super::load::Tally;

/// One check's verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// Whether it held.
    pub passed: bool,
    /// The figures behind the verdict.
    pub detail: String,
}

fn check(name: &str, passed: bool, detail: String) -> Check {
    Check {
        name: name.to_owned(),
        passed,
        detail,
    }
}

/// Creates `sku` with `units` on hand in the `rehearsal` drop and warms its counter.
pub async fn create_sku(b: &Backends, sku: &str, units: i64, limit: i64) -> anyhow::Result<()> {
    let title = format!("Rehearsal {sku}");
    let new = NewSku {
        sku,
        title: &title,
        product: "Drop rehearsal",
        variant: Some(sku),
        on_hand: units,
        low_stock_threshold: (units / 10).clamp(1, 1_000) as i32,
        per_buyer_limit: i32::try_from(limit).ok().filter(|l| *l > 0),
    };
    if !catalog::add_sku(&b.pg, DROP, "Drop rehearsal", &new).await? {
        anyhow::bail!(
            "SKU {sku} already exists; a rehearsal needs a SKU of its own (leave out --sku)"
        );
    }
    let spec = WarmSpec {
        per_buyer_limit: limit.max(0),
        ..WarmSpec::new(sku, units)
    };
    b.engine.warm(&spec, false).await?;
    Ok(())
}

/// The id of the newest event in `sku`'s shard stream (`0-0` when empty).
pub async fn stream_position(b: &Backends, sku: &str) -> anyhow::Result<String> {
    Ok(events::latest_id(&b.engine, sku).await?)
}

/// Units PostgreSQL has recorded as sold of `sku`.
async fn sold_recorded(b: &Backends, sku: &str) -> anyhow::Result<i64> {
    let (_, sold) = catalog::recorded(&b.pg, sku)
        .await?
        .ok_or_else(|| anyhow::anyhow!("SKU {sku} is not in PostgreSQL"))?;
    Ok(sold)
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
        let settled =
            f.reserved == 0 && f.sold_pending == 0 && sold_recorded(b, sku).await? == f.sold;
        if settled || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let f = b.engine.figures(sku).await?.unwrap_or_default();
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
            "no hold left open",
            f.reserved == 0 && f.open_holds == 0,
            format!("reserved {}, open holds {}", f.reserved, f.open_holds),
        ),
    ];

    let events = events::for_sku_since(&b.engine, sku, start_id).await?;
    let mut endings: HashMap<&str, Vec<&str>> = HashMap::new();
    let mut reserved_ids: Vec<&str> = Vec::new();
    for e in &events {
        let rid = e.reservation_id.as_deref().unwrap_or_default();
        match e.kind {
            EventKind::Reserved => reserved_ids.push(rid),
            EventKind::Confirmed => endings.entry(rid).or_default().push("confirmed"),
            EventKind::Released => endings.entry(rid).or_default().push("released"),
            EventKind::Expired => endings.entry(rid).or_default().push("expired"),
            _ => {}
        }
    }
    let holds = tally
        .holds
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let held: std::collections::HashSet<&str> = holds.iter().map(|(id, _)| id.as_str()).collect();
    // A hold no shopper was told of: a retry whose first answer came from the
    // sold-out cache, run while a release had just brought stock back; the
    // engine undoes it (released at once) and the retry keeps its first answer.
    let (reserved, undone): (Vec<&str>, Vec<&str>) =
        reserved_ids.into_iter().partition(|id| held.contains(id));
    let reserved = reserved.len() as u64;
    let not_once = holds
        .iter()
        .map(|(id, _)| id.as_str())
        .chain(undone.iter().copied())
        .filter(|id| endings.get(id).map_or(0, Vec::len) != 1)
        .count()
        + undone
            .iter()
            .filter(|id| endings.get(*id).is_some_and(|e| e != &["released"]))
            .count();
    endings.retain(|id, _| held.contains(id));
    let count = |k: &str| endings.values().flatten().filter(|e| **e == k).count() as u64;
    let (confirmed, released, expired) = (count("confirmed"), count("released"), count("expired"));
    // Abandoned holds expire; so does a hold a payment reached after its
    // deadline (the confirm expires it), and one a release reached after the
    // reaper had expired it (the answer shows it expired; a release between
    // the deadline and the reaper's pass still releases it).
    let expected_expired = tally.abandoned.load(Ordering::Relaxed)
        + tally.late.load(Ordering::Relaxed)
        + tally.late_releases.load(Ordering::Relaxed);
    checks.push(check(
        "every hold ended exactly once",
        not_once == 0
            && reserved == holds.len() as u64
            && confirmed == tally.confirmed.load(Ordering::Relaxed)
            && released == tally.released.load(Ordering::Relaxed)
            && expired == expected_expired,
        format!(
            "{} holds: {not_once} not ended exactly once; {confirmed} confirmed, {released} released, {expired} expired (expected {expected_expired}); {reserved} reserve events; {} undone at once (a retry answered from the sold-out cache before)",
            holds.len(),
            undone.len()
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
    // The operators' truth check, the same one `holdfast verify` runs: the
    // conservation equation in Redis and PostgreSQL, holds, carts, the ledger,
    // the write-behind and the streams.
    let truth = verify::verify(&b.engine, &b.pg, &VerifyOptions::default()).await?;
    checks.extend(truth.checks.into_iter().map(|c| Check {
        name: c.name,
        passed: c.passed,
        detail: c.detail,
    }));
    Ok(checks)
}
