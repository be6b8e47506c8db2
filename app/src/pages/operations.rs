//! Reconciliation and warm-up: drift per SKU, past runs, and starting either with
//! a live progress bar.

use leptos::prelude::*;

use crate::api::operations::{
    DeploymentChecks, StartReconcile, StartWarmup, VerifyNow, operations_status,
};
use crate::components::{IfAllowed, JobBar, error_text, short_time, thousands};
use crate::live::Live;
use holdfast_domain::Permission;
use holdfast_domain::doctor::DoctorReport;
use holdfast_domain::verify::VerifyReport;

/// The operations page (`/operations`).
#[component]
pub fn OperationsPage() -> impl IntoView {
    let live = expect_context::<Live>();
    let warm = ServerAction::<StartWarmup>::new();
    let reconcile = ServerAction::<StartReconcile>::new();
    let verify = ServerAction::<VerifyNow>::new();
    let checks = ServerAction::<DeploymentChecks>::new();
    // Runs and drift are re-read when a job ends.
    let finished = Memo::new(move |_| {
        live.jobs.with(|j| {
            j.iter()
                .filter(|j| j.state != crate::dto::ops::JobState::Running)
                .count()
        })
    });
    let status = Resource::new(move || finished.get(), |_| operations_status());
    let force = RwSignal::new(false);
    let up = RwSignal::new(false);
    let started = move |r: Option<Result<u64, ServerFnError>>| match r {
        Some(Err(e)) => Some(view! { <p class="notice error" role="alert">{error_text(&e)}</p> }),
        _ => None,
    };
    view! {
        <section>
            <h1>"Reconciliation and warm-up"</h1>
            <IfAllowed need=Permission::Operate>
                <div class="actions panel">
                    <div>
                        <button type="button" on:click=move |_| { warm.dispatch(StartWarmup { force: force.get_untracked() }); }>"Run a warm-up"</button>
                        <label><input type="checkbox" prop:checked=move || force.get() on:change:target=move |ev| force.set(ev.target().checked())/>
                            " overwrite existing counters (never during a sale)"</label>
                    </div>
                    <div>
                        <button type="button" on:click=move |_| { reconcile.dispatch(StartReconcile { correct_up: up.get_untracked() }); }>"Run a reconciliation now"</button>
                        <label><input type="checkbox" prop:checked=move || up.get() on:change:target=move |ev| up.set(ev.target().checked())/>
                            " also correct stranded units upward"</label>
                    </div>
                    <div>
                        <button type="button" on:click=move |_| { verify.dispatch(VerifyNow {}); }>"Verify now"</button>
                        <span class="muted">" the truth check, on live data, without stopping sales"</span>
                    </div>
                    <div>
                        <button type="button" disabled=move || checks.pending().get() on:click=move |_| { checks.dispatch(DeploymentChecks {}); }>"Check the deployment"</button>
                        <span class="muted">" what `holdfast doctor` checks before a drop: eviction policy, persistence, headroom, clock skew, connections, TLS"</span>
                    </div>
                    {move || started(warm.value().get())}
                    {move || started(reconcile.value().get())}
                    {move || match verify.value().get() {
                        Some(Err(e)) => Some(view! { <p class="notice error" role="alert">{error_text(&e)}</p> }.into_any()),
                        Some(Ok(report)) => Some(view! { <Verification report/> }.into_any()),
                        None => None,
                    }}
                    {move || match checks.value().get() {
                        Some(Err(e)) => Some(view! { <p class="notice error" role="alert">{error_text(&e)}</p> }.into_any()),
                        Some(Ok(report)) => Some(view! { <Deployment report/> }.into_any()),
                        None => None,
                    }}
                </div>
            </IfAllowed>
            <h2>"Jobs"</h2>
            <div class="jobs" aria-live="polite">
                {move || {
                    let jobs = live.jobs.get();
                    if jobs.is_empty() {
                        view! { <p class="empty">"No job has run since the server started."</p> }.into_any()
                    } else {
                        jobs.into_iter().map(|job| view! { <JobBar job/> }).collect_view().into_any()
                    }
                }}
            </div>
            <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
                {move || Suspend::new(async move {
                    match status.await {
                        Ok(s) => {
                            if live.jobs.with_untracked(Vec::is_empty) && !s.jobs.is_empty() {
                                live.jobs.set(s.jobs.clone());
                            }
                            let verified = s.verified.clone();
                            view! {
                                <h2>"Last verification"</h2>
                                {match verified {
                                    Some(report) => view! { <Verification report/> }.into_any(),
                                    None => view! { <p class="empty">"No verification has run since the server started."</p> }.into_any(),
                                }}
                                <h2>"Drift per SKU"</h2>
                                <div class="table-wrap"><table class="drift">
                                    <thead><tr><th scope="col">"SKU"</th><th scope="col" class="num">"On hand (PostgreSQL)"</th><th scope="col" class="num">"Available (Redis)"</th><th scope="col" class="num">"Drift"</th></tr></thead>
                                    <tbody>{s.drift.into_iter().map(|d| view! {
                                        <tr data-sku=d.sku.clone()>
                                            <td class="sku"><a href=format!("/sku/{}", d.sku)>{d.sku.clone()}</a></td>
                                            <td class="num">{thousands(d.on_hand)}</td>
                                            <td class="num">{d.available.map_or_else(|| "not warmed".into(), thousands)}</td>
                                            <td class="num" class:bad=d.drift != 0>{thousands(d.drift)}</td>
                                        </tr>
                                    }).collect_view()}</tbody>
                                </table></div>
                                <h2>"Reconciliation runs"</h2>
                                {if s.runs.is_empty() {
                                    view! { <p class="empty">"No reconciliation has run yet."</p> }.into_any()
                                } else {
                                    view! {
                                        <div class="table-wrap"><table>
                                            <thead><tr><th scope="col">"Run"</th><th scope="col">"Started (UTC)"</th><th scope="col">"By"</th><th scope="col" class="num">"Checked"</th><th scope="col" class="num">"Drifted"</th><th scope="col" class="num">"Corrected"</th><th scope="col">"State"</th></tr></thead>
                                            <tbody>{s.runs.into_iter().map(|r| view! {
                                                <tr><td>{r.id}</td><td>{short_time(&r.started_at)}</td><td>{r.trigger}</td><td class="num">{r.checked}</td>
                                                    <td class="num">{r.drifted}</td><td class="num">{r.corrected}</td><td>{if r.finished { "finished" } else { "running or stopped" }}</td></tr>
                                            }).collect_view()}</tbody>
                                        </table></div>
                                    }.into_any()
                                }}
                            }.into_any()
                        }
                        Err(e) => view! { <p class="notice error" role="alert">{error_text(&e)}</p> }.into_any(),
                    }
                })}
            </Transition>
        </section>
    }
}

/// A verification's checks and the SKUs that failed them.
#[component]
fn Verification(report: VerifyReport) -> impl IntoView {
    let passed = report.passed();
    view! {
        <div class="verification" data-passed=passed.to_string()>
            <p class:bad=!passed>
                {if passed { "Every check held" } else { "Violations found" }}
                {format!(" · {} SKUs checked · {}", thousands(report.checked), short_time_ms(report.at_ms))}
            </p>
            <div class="table-wrap"><table>
                <thead><tr><th scope="col">"Check"</th><th scope="col">"Result"</th><th scope="col">"Detail"</th></tr></thead>
                <tbody>{report.checks.into_iter().map(|c| view! {
                    <tr><td>{c.name}</td><td class:bad=!c.passed>{if c.passed { "held" } else { "FAILED" }}</td><td>{c.detail}</td></tr>
                }).collect_view()}</tbody>
            </table></div>
            {(!report.skus.is_empty()).then(|| view! {
                <div class="table-wrap"><table>
                    <thead><tr><th scope="col">"SKU"</th><th scope="col">"Check"</th><th scope="col">"Figures"</th></tr></thead>
                    <tbody>{report.skus.into_iter().map(|v| view! {
                        <tr><td class="sku">{v.sku}</td><td>{v.check}</td><td>{v.figures}</td></tr>
                    }).collect_view()}</tbody>
                </table></div>
            })}
        </div>
    }
}

/// The deployment checks' lines, worst first as found.
#[component]
fn Deployment(report: DoctorReport) -> impl IntoView {
    let worst = report.worst().as_str();
    view! {
        <div class="deployment" data-worst=worst>
            <p class:bad=worst == "fail">{format!("Deployment checks: worst line {worst}")}</p>
            <div class="table-wrap"><table>
                <thead><tr><th scope="col">"Result"</th><th scope="col">"Check"</th><th scope="col">"Found"</th><th scope="col">"What to do"</th></tr></thead>
                <tbody>{report.checks.into_iter().map(|c| {
                    let level = c.level.as_str();
                    view! {
                        <tr data-level=level><td class:bad=level == "fail">{level}</td><td>{c.name}</td><td>{c.finding}</td><td>{c.action}</td></tr>
                    }
                }).collect_view()}</tbody>
            </table></div>
        </div>
    }
}

/// `HH:MM:SS UTC` of Unix milliseconds `ms`, without a date library (the page
/// compiles to WASM).
fn short_time_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1_000).rem_euclid(86_400);
    format!(
        "{:02}:{:02}:{:02} UTC",
        secs / 3_600,
        secs % 3_600 / 60,
        secs % 60
    )
}
