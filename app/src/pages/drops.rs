//! Setting up drops (`/drops`, merchandisers and admins): paste a CSV or JSON
//! drop file, preview what it changes, import it all or nothing; export a drop
//! to edit it; arm a drop before its start and read its readiness.

use leptos::prelude::*;

use crate::api::drops::{ArmDrop, DropReadiness, ExportDrop, ImportDrop, LoadDropReport};
use crate::components::error_text;
use crate::pages::report::ReportView;
use holdfast_domain::readiness::Readiness;
use holdfast_domain::sheet::{CSV_COLUMNS, ImportOutcome};

/// The drops page.
#[component]
pub fn DropsPage() -> impl IntoView {
    let text = RwSignal::new(String::new());
    let format = RwSignal::new("csv".to_owned());
    let reason = RwSignal::new(String::new());
    let import = ServerAction::<ImportDrop>::new();
    let export = ServerAction::<ExportDrop>::new();
    let run = move |dry_run: bool| {
        import.dispatch(ImportDrop {
            text: text.get_untracked(),
            format: format.get_untracked(),
            dry_run,
            reason: reason.get_untracked(),
        });
    };
    let export_code = RwSignal::new(String::new());
    view! {
        <section class="panel">
            <h1>"Drops"</h1>
            <h2>"Import a drop file"</h2>
            <p class="muted">
                {format!("CSV columns: {} (see docs/drops.md). ", CSV_COLUMNS.join(", "))}
                "Preview first: nothing is written until you import, and then all of the file or none of it. \
                 A SKU's stock is the units the drop is given: a change moves stock on hand by the difference."
            </p>
            <label>"Upload a file "
                <input type="file" name="file" accept=".csv,.json,text/csv,application/json"
                    on:change:target=move |ev| {
                        #[cfg(feature = "hydrate")]
                        read_file(&ev.target(), text, format);
                        #[cfg(not(feature = "hydrate"))]
                        let _ = ev;
                    }/>
            </label>
            <label>"Form "
                <select name="format" prop:value=move || format.get() on:change:target=move |ev| format.set(ev.target().value())>
                    <option value="csv">"CSV"</option>
                    <option value="json">"JSON"</option>
                </select>
            </label>
            <label>"File contents"
                <textarea name="text" rows="10" spellcheck="false" class="mono"
                    prop:value=move || text.get()
                    on:input:target=move |ev| text.set(ev.target().value())></textarea>
            </label>
            <label>"Reason (for the audit log)"
                <input type="text" name="reason" placeholder="restock from PO 4411"
                    on:input:target=move |ev| reason.set(ev.target().value())/>
            </label>
            <div class="controls">
                <button type="button" disabled=move || import.pending().get() on:click=move |_| run(true)>"Preview"</button>
                <button type="button" disabled=move || import.pending().get() on:click=move |_| run(false)>"Import"</button>
            </div>
            {move || import.value().get().map(|answer| match answer {
                Ok(ImportOutcome::Refused(problems)) => view! {
                    <div class="notice error" role="alert" data-outcome="refused">
                        <p>{format!("Refused: {} problem(s). Nothing changed.", problems.len())}</p>
                        <ul>{problems.iter().map(|p| view! { <li>{p.to_string()}</li> }).collect_view()}</ul>
                    </div>
                }.into_any(),
                Ok(ImportOutcome::Done(report)) => {
                    let head = match (report.dry_run, report.changes.is_empty()) {
                        (_, true) => format!("Drop {}: nothing to change; it matches the file.", report.code),
                        (true, false) => format!("Drop {}: importing would change {} thing(s). Nothing was written.", report.code, report.changes.len()),
                        (false, false) => format!(
                            "Drop {}: {} change(s) imported; {} counter(s) created, {} stock change(s) applied.",
                            report.code, report.changes.len(), report.counters_warmed, report.stock_changes_applied
                        ),
                    };
                    view! {
                        <div class="notice ok" role="status" data-outcome=if report.dry_run { "preview" } else { "imported" }>
                            <p>{head}</p>
                            <ul>{report.changes.iter().map(|c| view! { <li>{c.to_string()}</li> }).collect_view()}</ul>
                            {(!report.not_in_file.is_empty()).then(|| view! {
                                <p class="muted">{format!("Left in the drop as they are (not in the file): {}", report.not_in_file.join(", "))}</p>
                            })}
                            {import_warnings(&report.warnings)}
                        </div>
                    }.into_any()
                }
                Err(e) => view! { <p class="notice error" role="alert">{error_text(&e)}</p> }.into_any(),
            })}
            <crate::pages::drop_editor::DropEditor/>
            <ArmPanel/>
            <ReportPanel/>
            <h2>"Export a drop"</h2>
            <div class="controls">
                <label>"Drop code "
                    <input type="text" name="code" placeholder="winter-launch"
                        on:input:target=move |ev| export_code.set(ev.target().value())/>
                </label>
                <button type="button" disabled=move || export.pending().get() on:click=move |_| {
                    export.dispatch(ExportDrop { code: export_code.get_untracked(), format: format.get_untracked() });
                }>"Export"</button>
                <button type="button" disabled=move || export.value().with(|v| !matches!(v, Some(Ok(_)))) on:click=move |_| {
                    if let Some(Ok(file)) = export.value().get_untracked() {
                        text.set(file);
                    }
                }>"Edit it above"</button>
            </div>
            {move || export.value().get().map(|answer| match answer {
                Ok(file) => view! {
                    <textarea class="mono" rows="8" readonly=true aria-label="Exported drop file" prop:value=file></textarea>
                }.into_any(),
                Err(e) => view! { <p class="notice error" role="alert">{error_text(&e)}</p> }.into_any(),
            })}
        </section>
    }
}

/// Reads the file chosen in `input` into `text` (in the browser), and sets
/// `format` from its name.
#[cfg(feature = "hydrate")]
fn read_file(input: &web_sys::HtmlInputElement, text: RwSignal<String>, format: RwSignal<String>) {
    use wasm_bindgen::JsCast;
    use wasm_bindgen::closure::Closure;
    let Some(file) = input.files().and_then(|f| f.get(0)) else {
        return;
    };
    let name = file.name().to_lowercase();
    if name.ends_with(".json") {
        format.set("json".to_owned());
    } else if name.ends_with(".csv") {
        format.set("csv".to_owned());
    }
    let Ok(reader) = web_sys::FileReader::new() else {
        return;
    };
    let done = reader.clone();
    let onload = Closure::<dyn FnMut()>::new(move || {
        if let Some(contents) = done.result().ok().and_then(|v| v.as_string()) {
            text.set(contents);
        }
    });
    reader.set_onload(Some(onload.as_ref().unchecked_ref()));
    // The reader calls it once; the closure lives as long as the page.
    onload.forget();
    let _ = reader.read_as_text(&file);
}

/// Arming a drop before its start, and its readiness.
#[component]
fn ArmPanel() -> impl IntoView {
    let code = RwSignal::new(String::new());
    let pause_feeds = RwSignal::new(false);
    let check = ServerAction::<DropReadiness>::new();
    let arm = ServerAction::<ArmDrop>::new();
    // The newer of the two answers.
    let shown = RwSignal::new(None::<Result<Readiness, ServerFnError>>);
    Effect::new(move |_| {
        if let Some(v) = check.value().get() {
            shown.set(Some(v));
        }
    });
    Effect::new(move |_| {
        if let Some(v) = arm.value().get() {
            shown.set(Some(v));
        }
    });
    let busy = move || check.pending().get() || arm.pending().get();
    view! {
        <h2>"Arm a drop"</h2>
        <p class="muted">"Before the start: warms the counters its SKUs lack, writes its schedule and limits into them, then checks everything the drop depends on."</p>
        <div class="controls">
            <label>"Drop to arm "
                <input type="text" name="arm_code" placeholder="winter-launch"
                    on:input:target=move |ev| code.set(ev.target().value())/>
            </label>
            <label><input type="checkbox" name="pause_feeds"
                on:change:target=move |ev| pause_feeds.set(ev.target().checked())/>" pause the feeds lane"</label>
            <button type="button" disabled=busy on:click=move |_| {
                check.dispatch(DropReadiness { code: code.get_untracked() });
            }>"Check readiness"</button>
            <button type="button" disabled=busy on:click=move |_| {
                arm.dispatch(ArmDrop { code: code.get_untracked(), pause_feeds: pause_feeds.get_untracked() });
            }>"Arm"</button>
        </div>
        {move || shown.get().map(|answer| match answer {
            Ok(report) => {
                let ready = report.ready();
                view! {
                    <div class=if ready { "notice ok" } else { "notice error" } role="status" data-ready=ready.to_string()>
                        <p>{if ready { format!("Drop {} is ready.", report.code) } else { format!("Drop {} is not ready.", report.code) }}</p>
                        <ul>{report.armed.iter().map(|a| view! { <li>{format!("Armed: {a}")}</li> }).collect_view()}</ul>
                        <div class="table-wrap"><table class="readiness">
                            <thead><tr><th scope="col">"Check"</th><th scope="col">"State"</th><th scope="col">"Found"</th></tr></thead>
                            <tbody>{report.lines.into_iter().map(|l| view! {
                                <tr data-ok=l.ok.to_string()><td>{l.name}</td><td>{if l.ok { "ok" } else { "not ready" }}</td><td>{l.finding}</td></tr>
                            }).collect_view()}</tbody>
                        </table></div>
                    </div>
                }.into_any()
            }
            Err(e) => view! { <p class="notice error" role="alert">{error_text(&e)}</p> }.into_any(),
        })}
    }
}

/// A drop's report: per SKU, what sold and how every hold ended; CSV to copy.
#[component]
fn ReportPanel() -> impl IntoView {
    let code = RwSignal::new(String::new());
    let load = ServerAction::<LoadDropReport>::new();
    view! {
        <h2>"Report"</h2>
        <div class="controls">
            <label>"Drop to report on "
                <input type="text" name="report_code" placeholder="winter-launch"
                    on:input:target=move |ev| code.set(ev.target().value())/>
            </label>
            <button type="button" disabled=move || load.pending().get() on:click=move |_| {
                load.dispatch(LoadDropReport { code: code.get_untracked() });
            }>"Show report"</button>
        </div>
        {move || load.value().get().map(|answer| match answer {
            Ok(report) => view! { <ReportView report/> }.into_any(),
            Err(e) => view! { <p class="notice error" role="alert">{error_text(&e)}</p> }.into_any(),
        })}
    }
}

/// An import's warnings (a stock lowered below the units sold, …), as a list;
/// nothing when there are none. The file box and the form editor show them alike.
pub(crate) fn import_warnings(warnings: &[String]) -> impl IntoView + use<> {
    (!warnings.is_empty()).then(|| {
        let items = warnings
            .iter()
            .map(|w| view! { <li>{format!("Warning: {w}")}</li> })
            .collect_view();
        view! { <ul class="warnings" aria-label="Warnings">{items}</ul> }
    })
}
