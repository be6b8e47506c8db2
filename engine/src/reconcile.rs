//! Reconciliation: measure drift between Redis and PostgreSQL, record it, repair it
//! toward under-selling.
//!
//! Per SKU, `expected = on_hand - reserved - sold_pending + (sold_recorded - settled)`
//! (the last term is sales PostgreSQL has committed that Redis has not yet settled)
//! and `drift = available - expected`. Positive drift means Redis could sell units
//! that do not exist: it is corrected down at once. Negative drift means units are
//! stranded: it is reported, and corrected up only when asked. A correction
//! applies while the counters' conserved sum (`Counters::conserved`, which no
//! reservation, payment, release, settle or feed changes) is what was measured
//! (`correct.lua`): a SKU selling all day is corrected between its sales; one
//! rebuilt meanwhile (or, split, whose units kept moving between its parts) is
//! left for the next run. Each correction is a ledger movement.
//!
//! The run holds the `reconcile` lock. Every PostgreSQL write carries its fencing
//! token and is refused if a later holder has written (see [`crate::postgres::fence`]).

use std::time::{Duration, Instant};

use redis::Value;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::engine::Engine;
use crate::error::EngineError;
use crate::postgres::fence;
use crate::reply::Reply;
use crate::warmup::{read_counters, stock_page};

/// The lock a reconciliation run holds.
pub const LOCK: &str = "reconcile";

/// How reconciliation runs.
#[derive(Debug, Clone)]
pub struct ReconcileOptions {
    /// Also correct negative drift (stranded units) up.
    pub correct_up: bool,
    /// Who or what started it (`cli`, `schedule`, `dashboard:<user>`), recorded with the run.
    pub trigger: String,
    /// SKUs per page.
    pub page: usize,
    /// The lease; extended after every page.
    pub lease: Duration,
    /// Skip the run (answering [`EngineError::Busy`]) when another one started
    /// less than this long ago: with several servers each scheduling a run
    /// every interval, one run per interval happens, whichever server's turn
    /// comes first. Checked under the lock, so two servers cannot both pass.
    pub unless_run_within: Option<Duration>,
    /// Only the SKUs of these shards (all when `None`): after a failover,
    /// the shards whose master changed.
    pub shards: Option<Vec<u16>>,
}

impl Default for ReconcileOptions {
    fn default() -> Self {
        Self {
            correct_up: false,
            trigger: "cli".into(),
            page: 2_000,
            lease: Duration::from_secs(30),
            unless_run_within: None,
            shards: None,
        }
    }
}

/// Progress after each page.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ReconcileProgress {
    /// SKUs checked so far.
    pub done: u64,
    /// SKUs in PostgreSQL when the run started.
    pub total: u64,
    /// SKUs with drift so far.
    pub drifted: u64,
}

/// What a run found and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ReconcileReport {
    /// The run's id in `reconciliation_runs`.
    pub run_id: i64,
    /// The fencing token the run wrote with.
    pub fence: i64,
    /// SKUs checked.
    pub checked: u64,
    /// SKUs with non-zero drift.
    pub drifted: u64,
    /// Positive drift corrected down.
    pub corrected_down: u64,
    /// Negative drift corrected up (only with `correct_up`).
    pub corrected_up: u64,
    /// Negative drift reported and left.
    pub reported: u64,
    /// SKUs not corrected: rebuilt between reading and correcting, or split
    /// with units moving between their parts (left for the next run).
    pub moved: u64,
    /// SKUs without a counter in Redis.
    pub not_warmed: u64,
    /// Wall time, milliseconds.
    pub elapsed_ms: u64,
}

/// One drifted SKU of a page.
struct Finding {
    sku: String,
    on_hand: i64,
    available: i64,
    reserved: i64,
    sold_pending: i64,
    drift: i64,
    /// The counters' conserved sum (`Counters::conserved`) as measured: the
    /// correction applies while it is unchanged (`lua/correct.lua`).
    conserved: i64,
    target: Option<i64>,
    /// Parts of a split SKU (1: not split): its figures are theirs together.
    parts: u16,
}

/// Reconciles every SKU under the `reconcile` lock; [`EngineError::Busy`] when
/// another run holds it.
pub async fn reconcile_all(
    engine: &Engine,
    pg: &PgPool,
    options: &ReconcileOptions,
    progress: impl FnMut(ReconcileProgress),
) -> Result<ReconcileReport, EngineError> {
    let floor = crate::postgres::last_fence(pg, LOCK).await?;
    let Some(lease) = engine
        .acquire_lock_above(LOCK, options.lease, floor)
        .await?
    else {
        return Err(EngineError::Busy(
            "a reconciliation is already running (the reconcile lock is held)".into(),
        ));
    };
    let result = match ran_within(pg, options.unless_run_within).await {
        Ok(false) => run(engine, pg, options, &lease, progress).await,
        Ok(true) => Err(EngineError::Busy(
            "a reconciliation ran within the interval (on this or another server)".into(),
        )),
        Err(e) => Err(e),
    };
    let result = match result {
        // A run that failed after its lease lapsed (it was paused, or too
        // slow) says so: that, not the error it met on the way, is the cause.
        Err(e)
            if !matches!(e, EngineError::LeaseLost(_))
                && !engine
                    .extend_lock(&lease, options.lease)
                    .await
                    .unwrap_or(true) =>
        {
            tracing::warn!(error = %e, "reconciliation failed after its lease lapsed");
            Err(EngineError::LeaseLost(LOCK.into()))
        }
        other => other,
    };
    if let Err(e) = engine.release_lock(&lease).await {
        tracing::warn!(error = %e, "could not release the reconcile lock; it lapses by itself");
    }
    result
}

/// Whether a reconciliation started less than `within` ago (PostgreSQL's
/// clock, which every server shares).
async fn ran_within(pg: &PgPool, within: Option<Duration>) -> Result<bool, EngineError> {
    let Some(within) = within else {
        return Ok(false);
    };
    // The newest run by id (its primary key, so no scan however many runs).
    let recent: Option<bool> = sqlx::query_scalar(
        "SELECT started_at > now() - make_interval(secs => $1)
           FROM reconciliation_runs ORDER BY id DESC LIMIT 1",
    )
    .bind(within.as_secs_f64())
    .fetch_optional(pg)
    .await?;
    Ok(recent.unwrap_or(false))
}

async fn run(
    engine: &Engine,
    pg: &PgPool,
    options: &ReconcileOptions,
    lease: &crate::locks::Lease,
    mut progress: impl FnMut(ReconcileProgress),
) -> Result<ReconcileReport, EngineError> {
    let started = Instant::now();
    let token = lease.fence;
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM skus")
        .fetch_one(pg)
        .await?;
    let mut tx = pg.begin().await?;
    fence(&mut tx, LOCK, token).await?;
    let run_id: i64 = sqlx::query_scalar(
        "INSERT INTO reconciliation_runs (trigger, fencing_token) VALUES ($1, $2) RETURNING id",
    )
    .bind(&options.trigger)
    .bind(token)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;

    let mut report = ReconcileReport {
        run_id,
        fence: token,
        ..ReconcileReport::default()
    };
    let script = &engine.scripts.correct;
    script
        .prepare_invoke()
        .load_async(&mut engine.conn.clone())
        .await?;
    let mut after = String::new();
    loop {
        let page = stock_page(pg, &after, options.page.max(1)).await?;
        let Some(last) = page.last() else { break };
        after = last.sku.clone();
        let rows: Vec<_> = match &options.shards {
            None => page,
            Some(shards) => page
                .into_iter()
                .filter(|r| shards.contains(&engine.keys.shard_of(&r.sku)))
                .collect(),
        };
        let skus: Vec<&str> = rows.iter().map(|r| r.sku.as_str()).collect();
        let counters = read_counters(engine, &skus).await?;
        let mut findings = Vec::new();
        for (row, c) in rows.iter().zip(&counters) {
            report.checked += 1;
            let (Some(available), Some(conserved)) = (c.available, c.conserved()) else {
                report.not_warmed += 1;
                continue;
            };
            let expected = c.expected_available(&row.recorded());
            let drift = c.drift(&row.recorded()).unwrap_or(0);
            if drift == 0 {
                continue;
            }
            report.drifted += 1;
            // The target is `available - owed`: a negative one becomes owed units.
            let target = (drift > 0 || options.correct_up).then_some(expected);
            findings.push(Finding {
                sku: row.sku.clone(),
                on_hand: row.on_hand,
                available,
                reserved: c.reserved,
                sold_pending: c.sold_pending,
                drift,
                conserved,
                target,
                parts: c.parts,
            });
        }
        if !findings.is_empty() {
            if !engine.extend_lock(lease, options.lease).await? {
                return Err(EngineError::LeaseLost(LOCK.into()));
            }
            record_page(engine, pg, token, run_id, &findings, &mut report).await?;
        }
        progress(ReconcileProgress {
            done: report.checked,
            total: total as u64,
            drifted: report.drifted,
        });
    }
    report.elapsed_ms = started.elapsed().as_millis() as u64;
    let mut tx = pg.begin().await?;
    fence(&mut tx, LOCK, token).await?;
    sqlx::query(
        "UPDATE reconciliation_runs SET finished_at = now(), skus_checked = $2, drifted = $3,
                corrected = $4, not_warmed = $5 WHERE id = $1",
    )
    .bind(run_id)
    .bind(report.checked as i32)
    .bind(report.drifted as i32)
    .bind((report.corrected_down + report.corrected_up) as i32)
    .bind(report.not_warmed as i32)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(report)
}

/// Corrects a page's drifted SKUs in Redis and records findings and corrections,
/// inside one fenced transaction: the fence row stays locked until commit, so a
/// successor cannot write in between, and a stale holder is refused before it
/// touches Redis.
async fn record_page(
    engine: &Engine,
    pg: &PgPool,
    token: i64,
    run_id: i64,
    findings: &[Finding],
    report: &mut ReconcileReport,
) -> Result<(), EngineError> {
    let mut tx = pg.begin().await?;
    fence(&mut tx, LOCK, token).await?;

    let to_fix: Vec<&Finding> = findings.iter().filter(|f| f.target.is_some()).collect();
    let mut outcomes = Vec::new();
    let whole: Vec<&&Finding> = to_fix.iter().filter(|f| f.parts < 2).collect();
    if !whole.is_empty() {
        let script = &engine.scripts.correct;
        let mut pipe = redis::pipe();
        for f in &whole {
            pipe.invoke_script(
                script
                    .key(engine.keys.sku(&f.sku))
                    .key(engine.keys.events(engine.keys.shard_of(&f.sku)))
                    .arg(&f.sku)
                    .arg(f.conserved)
                    .arg(-f.drift),
            );
        }
        let replies: Vec<Vec<Value>> = pipe.query_async(&mut engine.conn.clone()).await?;
        for reply in replies {
            outcomes.push(Reply::new(reply).tag()? == "corrected");
        }
    }
    // A split SKU is corrected on part 0, once its other parts' units are
    // there (one SKU at a time: there are few), in `to_fix`'s order.
    let mut whole_outcomes = outcomes.into_iter();
    let mut outcomes = Vec::with_capacity(to_fix.len());
    for f in &to_fix {
        outcomes.push(if f.parts < 2 {
            whole_outcomes.next().unwrap_or(false)
        } else {
            engine
                .correct_split(&f.sku, f.parts, f.drift, f.conserved)
                .await?
        });
    }

    let (mut r_sku, mut r_on, mut r_av, mut r_res, mut r_sp, mut r_drift, mut r_action) =
        (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
    let (mut l_sku, mut l_qty, mut l_eid, mut l_note) = (vec![], vec![], vec![], vec![]);
    let mut fixed = to_fix.iter().zip(&outcomes);
    for f in findings {
        let action = match f.target {
            None => {
                report.reported += 1;
                "reported"
            }
            Some(target) => {
                let corrected = fixed.next().is_some_and(|(_, ok)| *ok);
                if !corrected {
                    report.moved += 1;
                    "none"
                } else {
                    l_sku.push(f.sku.clone());
                    l_qty.push(target - f.available);
                    l_eid.push(format!("run-{run_id}:{}", f.sku));
                    l_note.push(format!(
                        "available {} -> {target} (drift {})",
                        f.available, f.drift
                    ));
                    if f.drift > 0 {
                        report.corrected_down += 1;
                        "corrected_down"
                    } else {
                        report.corrected_up += 1;
                        "corrected_up"
                    }
                }
            }
        };
        r_sku.push(f.sku.clone());
        r_on.push(f.on_hand);
        r_av.push(f.available);
        r_res.push(f.reserved);
        r_sp.push(f.sold_pending);
        r_drift.push(f.drift);
        r_action.push(action);
    }
    sqlx::query(
        "INSERT INTO reconciliation_results (run_id, sku, on_hand, available, reserved, sold_pending, drift, action)
         SELECT $1, * FROM UNNEST($2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[], $8::text[])",
    )
    .bind(run_id)
    .bind(&r_sku)
    .bind(&r_on)
    .bind(&r_av)
    .bind(&r_res)
    .bind(&r_sp)
    .bind(&r_drift)
    .bind(&r_action)
    .execute(&mut *tx)
    .await?;
    if !l_sku.is_empty() {
        sqlx::query(
            "INSERT INTO ledger (sku, kind, qty, source, event_id, fencing_token, note)
             SELECT t.sku, 'correction', t.qty, 'reconcile', t.eid, $5, t.note
               FROM UNNEST($1::text[], $2::bigint[], $3::text[], $4::text[]) AS t(sku, qty, eid, note)
               JOIN skus s ON s.sku = t.sku
             ON CONFLICT (source, event_id) DO NOTHING",
        )
        .bind(&l_sku)
        .bind(&l_qty)
        .bind(&l_eid)
        .bind(&l_note)
        .bind(token)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// A SKU's figures on both sides, as the dashboard shows them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkuDrift {
    /// The SKU.
    pub sku: String,
    /// PostgreSQL's on-hand count.
    pub on_hand: i64,
    /// Sales PostgreSQL has recorded.
    pub sold_recorded: i64,
    /// Redis' available units; `None` when the counter was never warmed.
    pub available: Option<i64>,
    /// `available` minus what PostgreSQL implies it should be (0 = in step).
    pub drift: i64,
}

/// Measures drift for `skus` now, correcting nothing (the same equation a
/// reconciliation run uses). SKUs PostgreSQL does not know are left out.
pub async fn measure(
    engine: &Engine,
    pg: &PgPool,
    skus: &[String],
) -> Result<Vec<SkuDrift>, EngineError> {
    let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT sku, on_hand, sold_recorded, fed_recorded FROM skus WHERE sku = ANY($1) ORDER BY sku",
    )
    .bind(skus)
    .fetch_all(pg)
    .await?;
    let names: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    let counters = read_counters(engine, &names).await?;
    Ok(rows
        .into_iter()
        .zip(counters)
        .map(|((sku, on_hand, sold_recorded, fed_recorded), c)| {
            let recorded = holdfast_domain::Recorded {
                on_hand,
                sold_recorded,
                fed_recorded,
            };
            let drift = c.drift(&recorded).unwrap_or(0);
            SkuDrift {
                sku,
                on_hand,
                sold_recorded,
                available: c.available,
                drift,
            }
        })
        .collect())
}

/// One past reconciliation run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow)]
pub struct RunSummary {
    /// Run id.
    pub id: i64,
    /// What started it (`cli`, `schedule`, `dashboard:<user>`).
    pub trigger: String,
    /// When it started.
    pub started_at: chrono::DateTime<chrono::Utc>,
    /// When it finished; `None` while running or if it died.
    pub finished_at: Option<chrono::DateTime<chrono::Utc>>,
    /// SKUs checked.
    pub skus_checked: i32,
    /// SKUs found drifted.
    pub drifted: i32,
    /// SKUs corrected.
    pub corrected: i32,
}

/// The newest `limit` runs.
pub async fn recent_runs(pg: &PgPool, limit: i64) -> Result<Vec<RunSummary>, EngineError> {
    Ok(sqlx::query_as::<_, RunSummary>(
        "SELECT id, trigger, started_at, finished_at, skus_checked, drifted, corrected
         FROM reconciliation_runs ORDER BY id DESC LIMIT $1",
    )
    .bind(limit)
    .fetch_all(pg)
    .await?)
}
