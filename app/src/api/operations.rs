//! Reconciliation and warm-up: past runs, drift per SKU, and starting either as a
//! job whose progress every dashboard tab sees live.

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::dto::ops::{JobView, RunView};

/// One SKU's drift now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriftRow {
    /// SKU.
    pub sku: String,
    /// PostgreSQL's on-hand count.
    pub on_hand: i64,
    /// Redis' available count; `None` when not warmed.
    pub available: Option<i64>,
    /// Redis minus what PostgreSQL implies.
    pub drift: i64,
}

/// What the operations page shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationsView {
    /// Newest first.
    pub runs: Vec<RunView>,
    /// The drops' SKUs.
    pub drift: Vec<DriftRow>,
    /// Running and recent jobs, newest first.
    pub jobs: Vec<JobView>,
}

/// Runs, drift and jobs now.
#[server(endpoint = "operations_status")]
pub async fn operations_status() -> Result<OperationsView, ServerFnError> {
    use holdfast_engine::users::Role;
    use holdfast_engine::{catalog, reconcile};

    use crate::server::{convert, guard, jobs::JobBoard};

    let caller = guard::authorize(Role::Viewer).await?;
    let b = &caller.backends;
    let internal = guard::internal("Reading reconciliation runs");
    let runs = reconcile::recent_runs(&b.pg, 20).await.map_err(&internal)?;
    let skus = catalog::all_drop_skus(&b.pg).await.map_err(&internal)?;
    let drift = reconcile::measure(&b.engine, &b.pg, &skus)
        .await
        .map_err(&internal)?
        .into_iter()
        .map(|d| DriftRow {
            sku: d.sku,
            on_hand: d.on_hand,
            available: d.available,
            drift: d.drift,
        })
        .collect();
    Ok(OperationsView {
        runs: runs.into_iter().map(convert::run_view).collect(),
        drift,
        jobs: use_context::<std::sync::Arc<JobBoard>>()
            .map(|j| j.recent())
            .unwrap_or_default(),
    })
}

#[cfg(feature = "ssr")]
fn job_board() -> Result<std::sync::Arc<crate::server::jobs::JobBoard>, ServerFnError> {
    use_context().ok_or_else(|| ServerFnError::new("server misconfigured: no job board"))
}

/// Starts a reconciliation (admin) and returns its job id at once; progress
/// arrives over the live connection.
#[server(endpoint = "start_reconcile")]
pub async fn start_reconcile(correct_up: bool) -> Result<u64, ServerFnError> {
    use holdfast_engine::reconcile::{ReconcileOptions, reconcile_all};
    use holdfast_engine::users::Role;

    use crate::dto::ops::JobKind;
    use crate::server::guard;

    let caller = guard::authorize(Role::Admin).await?;
    let board = job_board()?;
    if board.running(JobKind::Reconcile) {
        return Err(guard::refuse(
            http::StatusCode::CONFLICT,
            "A reconciliation is already running; watch its progress below.",
        ));
    }
    let mut job = board.start(JobKind::Reconcile, &caller.user.username);
    let id = job.id();
    guard::audit(
        &caller,
        "start_reconcile",
        "all skus",
        serde_json::json!({ "job": id, "correct_up": correct_up }),
    )
    .await;
    let backends = caller.backends.clone();
    let options = ReconcileOptions {
        correct_up,
        trigger: format!("dashboard:{}", caller.user.username),
        ..ReconcileOptions::default()
    };
    tokio::spawn(async move {
        let result = reconcile_all(&backends.engine, &backends.pg, &options, |p| {
            job.progress(p.done, p.total);
        })
        .await;
        match result {
            Ok(r) => job.finish(format!(
                "Checked {} SKUs: {} drifted, {} corrected down, {} corrected up, {} reported, {} not warmed ({} ms).",
                r.checked, r.drifted, r.corrected_down, r.corrected_up, r.reported, r.not_warmed, r.elapsed_ms
            )),
            Err(e) => {
                tracing::warn!(error = %e, "dashboard reconciliation failed");
                job.fail(format!("The reconciliation stopped: {e}"));
            }
        }
    });
    Ok(id)
}

/// Starts a warm-up (admin) and returns its job id at once; progress arrives over
/// the live connection. Without `force` only counters Redis lacks are written;
/// `force` overwrites every counter from PostgreSQL (never during a sale).
#[server(endpoint = "start_warmup")]
pub async fn start_warmup(force: bool) -> Result<u64, ServerFnError> {
    use holdfast_engine::users::Role;
    use holdfast_engine::warmup::{WarmOptions, warm_all};

    use crate::dto::ops::JobKind;
    use crate::server::guard;

    let caller = guard::authorize(Role::Admin).await?;
    let board = job_board()?;
    if board.running(JobKind::Warmup) {
        return Err(guard::refuse(
            http::StatusCode::CONFLICT,
            "A warm-up is already running; watch its progress below.",
        ));
    }
    let mut job = board.start(JobKind::Warmup, &caller.user.username);
    let id = job.id();
    guard::audit(
        &caller,
        "start_warmup",
        "all skus",
        serde_json::json!({ "job": id, "force": force }),
    )
    .await;
    let backends = caller.backends.clone();
    tokio::spawn(async move {
        let options = WarmOptions {
            force,
            ..WarmOptions::default()
        };
        let result = warm_all(&backends.engine, &backends.pg, options, |p| {
            job.progress(p.done, p.total);
        })
        .await;
        match result {
            Ok(r) => job.finish(format!(
                "{} SKUs: {} warmed, {} already had counters ({} ms).",
                r.skus, r.warmed, r.existing, r.elapsed_ms
            )),
            Err(e) => {
                tracing::warn!(error = %e, "dashboard warm-up failed");
                job.fail(format!("The warm-up stopped: {e}"));
            }
        }
    });
    Ok(id)
}
