//! Reconciliation and warm-up: past runs, drift per SKU, and starting either as a
//! job whose progress every dashboard tab sees live.

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::dto::ops::{JobView, RunView};
use holdfast_domain::verify::VerifyReport;

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
    /// The last verification (scheduled or "Verify now"), if one ran.
    pub verified: Option<VerifyReport>,
}

/// Runs, drift and jobs now.
#[server(endpoint = "operations_status")]
pub async fn operations_status() -> Result<OperationsView, ServerFnError> {
    use holdfast_domain::Permission;
    use holdfast_engine::{catalog, reconcile};

    use crate::server::{convert, guard, jobs::JobBoard};

    let caller = guard::authorize(Permission::View).await?;
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
        verified: use_context::<std::sync::Arc<holdfast_engine::verify::LastVerify>>()
            .and_then(|v| v.get()),
    })
}

/// Runs the truth check now (admin) on live data, without stopping sales, and
/// returns what it found; the result is also the page's "last verification".
#[server(endpoint = "verify_now")]
pub async fn verify_now() -> Result<VerifyReport, ServerFnError> {
    use holdfast_domain::Permission;
    use holdfast_engine::verify::{LastVerify, VerifyOptions, verify};

    use crate::server::guard;

    let caller = guard::authorize(Permission::Operate).await?;
    let b = &caller.backends;
    let report = verify(&b.engine, &b.pg, &VerifyOptions::default())
        .await
        .map_err(guard::internal("Verifying"))?;
    guard::audit(
        &caller,
        "verify",
        "all skus",
        serde_json::json!({ "passed": report.passed(), "violations": report.violations() }),
    )
    .await;
    if let Some(last) = use_context::<std::sync::Arc<LastVerify>>() {
        last.set(report.clone());
    }
    Ok(report)
}

#[cfg(feature = "ssr")]
fn job_board() -> Result<std::sync::Arc<crate::server::jobs::JobBoard>, ServerFnError> {
    use_context().ok_or_else(|| ServerFnError::new("server misconfigured: no job board"))
}

/// Starts dashboard job `kind` (admin) unless one is running (then `busy` is the
/// answer): writes the audit entry `action` with `detail`, and runs `work` in the
/// background, reporting progress through the job. The job ends with the summary
/// `work` returns, or with its error (logged, and shown as "`what` stopped").
/// Returns the job id at once; progress arrives over the live connection.
#[cfg(feature = "ssr")]
async fn launch<F, Fut>(
    kind: crate::dto::ops::JobKind,
    action: &'static str,
    what: &'static str,
    detail: serde_json::Value,
    busy: &str,
    work: F,
) -> Result<u64, ServerFnError>
where
    F: FnOnce(holdfast_engine::Backends, crate::server::jobs::JobHandle) -> Fut + Send + 'static,
    Fut: Future<
            Output = (
                crate::server::jobs::JobHandle,
                Result<String, holdfast_engine::EngineError>,
            ),
        > + Send
        + 'static,
{
    use holdfast_domain::Permission;

    use crate::server::guard;

    let caller = guard::authorize(Permission::Operate).await?;
    let board = job_board()?;
    let Some(job) = board.try_start(kind, &caller.user.username) else {
        return Err(guard::refuse(http::StatusCode::CONFLICT, busy.to_owned()));
    };
    let id = job.id();
    let mut detail = detail;
    detail["job"] = serde_json::json!(id);
    guard::audit(&caller, action, "all skus", detail).await;
    let backends = caller.backends.clone();
    tokio::spawn(async move {
        match work(backends, job).await {
            (job, Ok(summary)) => job.finish(summary),
            (job, Err(e)) => {
                tracing::warn!(error = %e, action, "dashboard job failed");
                job.fail(format!("{what} stopped: {e}"));
            }
        }
    });
    Ok(id)
}

/// Starts a reconciliation (admin) and returns its job id at once; progress
/// arrives over the live connection.
#[server(endpoint = "start_reconcile")]
pub async fn start_reconcile(correct_up: bool) -> Result<u64, ServerFnError> {
    use holdfast_engine::reconcile::{ReconcileOptions, reconcile_all};

    use crate::dto::ops::JobKind;

    let trigger = crate::server::guard::authorize(holdfast_domain::Permission::Operate)
        .await
        .map(|c| format!("dashboard:{}", c.user.username))?;
    launch(
        JobKind::Reconcile,
        "start_reconcile",
        "The reconciliation",
        serde_json::json!({ "correct_up": correct_up }),
        "A reconciliation is already running; watch its progress below.",
        move |backends, mut job| async move {
            let options = ReconcileOptions {
                correct_up,
                trigger,
                ..ReconcileOptions::default()
            };
            let result = reconcile_all(&backends.engine, &backends.pg, &options, |p| {
                job.progress(p.done, p.total);
            })
            .await
            .map(|r| format!(
                "Checked {} SKUs: {} drifted, {} corrected down, {} corrected up, {} reported, {} not warmed ({} ms).",
                r.checked, r.drifted, r.corrected_down, r.corrected_up, r.reported, r.not_warmed, r.elapsed_ms
            ));
            (job, result)
        },
    )
    .await
}

/// Starts a warm-up (admin) and returns its job id at once; progress arrives over
/// the live connection. Without `force` only counters Redis lacks are written;
/// `force` overwrites every counter from PostgreSQL (never during a sale).
#[server(endpoint = "start_warmup")]
pub async fn start_warmup(force: bool) -> Result<u64, ServerFnError> {
    use holdfast_engine::warmup::{WarmOptions, warm_all};

    use crate::dto::ops::JobKind;

    launch(
        JobKind::Warmup,
        "start_warmup",
        "The warm-up",
        serde_json::json!({ "force": force }),
        "A warm-up is already running; watch its progress below.",
        move |backends, mut job| async move {
            let options = WarmOptions {
                force,
                ..WarmOptions::default()
            };
            let result = warm_all(&backends.engine, &backends.pg, options, |p| {
                job.progress(p.done, p.total);
            })
            .await
            .map(|r| {
                format!(
                    "{} SKUs: {} warmed, {} already had counters ({} ms).",
                    r.skus, r.warmed, r.existing, r.elapsed_ms
                )
            });
            (job, result)
        },
    )
    .await
}

/// Runs the deployment checks (`holdfast doctor`) against this server's own
/// settings and services (admin), read-only: eviction policy, persistence,
/// client and memory headroom, clock skew, PostgreSQL connections, webhook
/// sources, badge origins, TLS.
#[server(endpoint = "deployment_checks")]
pub async fn deployment_checks() -> Result<holdfast_domain::doctor::DoctorReport, ServerFnError> {
    use holdfast_domain::Permission;
    use holdfast_engine::doctor::{self, DoctorConfig};

    use crate::server::guard;

    guard::authorize(Permission::Operate).await?;
    let config = use_context::<std::sync::Arc<DoctorConfig>>().ok_or_else(|| {
        guard::refuse(
            http::StatusCode::SERVICE_UNAVAILABLE,
            "the deployment checks are not available on this server; run `holdfast doctor`",
        )
    })?;
    Ok(doctor::run(&config).await)
}
