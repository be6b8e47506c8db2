//! Creating and editing a drop in a form (on the Drops page): the drop's name
//! and schedule, and a row per SKU. Saving sends the drop as its JSON file
//! through the same import as a file (checked whole, all or nothing, stock
//! changes through the feed's delta path), and each problem is shown next to
//! its field.

use leptos::prelude::*;

use crate::api::drops::{ExportDrop, ImportDrop};
use crate::components::error_text;
use holdfast_domain::sheet::{DropSheet, ImportOutcome, Problem, SheetSku};

/// The editable fields of a SKU row, as the form names them.
const SKU_FIELDS: [(&str, &str); 7] = [
    ("sku", "SKU"),
    ("product", "Product"),
    ("variant", "Variant"),
    ("title", "Title"),
    ("stock", "Stock"),
    ("per_buyer_limit", "Per-buyer limit"),
    ("low_stock_threshold", "Low-stock at"),
];

/// `field` of `s` as the form shows it.
fn value_of(s: &SheetSku, field: &str) -> String {
    let num = |v: Option<i32>| v.map(|n| n.to_string()).unwrap_or_default();
    match field {
        "sku" => s.sku.clone(),
        "product" => s.product.clone(),
        "variant" => s.variant.clone().unwrap_or_default(),
        "title" => s.title.clone().unwrap_or_default(),
        "stock" => s.stock.to_string(),
        "per_buyer_limit" => num(s.per_buyer_limit),
        _ => num(s.low_stock_threshold),
    }
}

/// Sets `field` of `s` from the form's text; a number that does not read is
/// kept as a value the import refuses next to the field.
fn set_field(s: &mut SheetSku, field: &str, text: &str) {
    let text = text.trim();
    let opt = || (!text.is_empty()).then(|| text.to_owned());
    let small = || {
        if text.is_empty() {
            None
        } else {
            Some(text.parse::<i32>().unwrap_or(-1))
        }
    };
    match field {
        "sku" => s.sku = text.to_owned(),
        "product" => s.product = text.to_owned(),
        "variant" => s.variant = opt(),
        "title" => s.title = opt(),
        "stock" => s.stock = text.parse().unwrap_or(-1),
        "per_buyer_limit" => s.per_buyer_limit = small(),
        _ => s.low_stock_threshold = small(),
    }
}

fn blank_sku() -> SheetSku {
    SheetSku {
        sku: String::new(),
        product: String::new(),
        variant: None,
        title: None,
        stock: 0,
        per_buyer_limit: None,
        low_stock_threshold: None,
    }
}

/// The problems of `answer` at `column` (a JSON path such as `skus[2].stock`).
fn problems_at(answer: &Option<Result<ImportOutcome, ServerFnError>>, column: &str) -> String {
    match answer {
        Some(Ok(ImportOutcome::Refused(problems))) => problems
            .iter()
            .filter(|p: &&Problem| p.column == column)
            .map(|p| p.message.clone())
            .collect::<Vec<_>>()
            .join("; "),
        _ => String::new(),
    }
}

/// The drop form.
#[component]
pub fn DropEditor() -> impl IntoView {
    let sheet = RwSignal::new(DropSheet {
        code: String::new(),
        name: String::new(),
        starts_at: None,
        ends_at: None,
        skus: vec![blank_sku()],
    });
    // Rows are re-drawn only when one is added or a drop is loaded, so typing
    // never loses focus.
    let rows = RwSignal::new(1usize);
    let generation = RwSignal::new(0u32);
    let load_code = RwSignal::new(String::new());
    let load = ServerAction::<ExportDrop>::new();
    let save = ServerAction::<ImportDrop>::new();
    Effect::new(move |_| {
        if let Some(Ok(text)) = load.value().get()
            && let Ok(loaded) = serde_json::from_str::<DropSheet>(&text)
        {
            rows.set(loaded.skus.len());
            sheet.set(loaded);
            generation.update(|g| *g += 1);
        }
    });
    let send = move |dry_run: bool| {
        let text = sheet.with_untracked(|s| serde_json::to_string(s).unwrap_or_default());
        save.dispatch(ImportDrop {
            text,
            format: "json".to_owned(),
            dry_run,
            reason: "dashboard form".to_owned(),
        });
    };
    let answer = move || save.value().get();
    let field_text = move |column: &'static str| {
        let initial = sheet.with_untracked(|s| match column {
            "code" => s.code.clone(),
            "name" => s.name.clone(),
            "starts_at" => s.starts_at.clone().unwrap_or_default(),
            _ => s.ends_at.clone().unwrap_or_default(),
        });
        view! {
            <input type="text" name=column prop:value=initial
                on:input:target=move |ev| {
                    let v = ev.target().value();
                    sheet.update(|s| match column {
                        "code" => s.code = v.trim().to_owned(),
                        "name" => s.name = v,
                        "starts_at" => s.starts_at = (!v.trim().is_empty()).then(|| v.trim().to_owned()),
                        _ => s.ends_at = (!v.trim().is_empty()).then(|| v.trim().to_owned()),
                    });
                }/>
            <span class="field-error" data-problem=column>{move || problems_at(&answer(), column)}</span>
        }
    };
    view! {
        <h2>"Create or edit a drop"</h2>
        <div class="controls">
            <label>"Drop to edit "
                <input type="text" name="edit_code" placeholder="winter-launch"
                    on:input:target=move |ev| load_code.set(ev.target().value())/>
            </label>
            <button type="button" on:click=move |_| {
                load.dispatch(ExportDrop { code: load_code.get_untracked(), format: "json".to_owned() });
            }>"Load"</button>
            {move || load.value().get().and_then(Result::err).map(|e| view! { <span class="notice error" role="alert">{error_text(&e)}</span> })}
        </div>
        {move || {
            generation.get();
            view! {
                <div class="drop-form">
                    <label>"Code" {field_text("code")}</label>
                    <label>"Name" {field_text("name")}</label>
                    <label>"Starts at (RFC 3339, UTC or with an offset; blank: at once)" {field_text("starts_at")}</label>
                    <label>"Ends at (blank: never)" {field_text("ends_at")}</label>
                </div>
                <div class="table-wrap"><table class="drop-skus">
                    <thead><tr>{SKU_FIELDS.iter().map(|(_, label)| view! { <th scope="col">{*label}</th> }).collect_view()}</tr></thead>
                    <tbody>{move || (0..rows.get()).map(|i| view! {
                        <tr data-row=i>{SKU_FIELDS.iter().map(|(field, label)| {
                            let field = *field;
                            let initial = sheet.with_untracked(|s| s.skus.get(i).map(|k| value_of(k, field)).unwrap_or_default());
                            let column = format!("skus[{i}].{field}");
                            let shown = column.clone();
                            view! {
                                <td>
                                    <input type="text" name=column.clone() aria-label=format!("{label}, row {}", i + 1) prop:value=initial
                                        on:input:target=move |ev| {
                                            let v = ev.target().value();
                                            sheet.update(|s| if let Some(k) = s.skus.get_mut(i) { set_field(k, field, &v) });
                                        }/>
                                    <span class="field-error" data-problem=column>{move || problems_at(&answer(), &shown)}</span>
                                </td>
                            }
                        }).collect_view()}</tr>
                    }).collect_view()}</tbody>
                </table></div>
            }
        }}
        <div class="controls">
            <button type="button" on:click=move |_| {
                sheet.update(|s| s.skus.push(blank_sku()));
                rows.update(|n| *n += 1);
            }>"Add a SKU"</button>
            <button type="button" disabled=move || save.pending().get() on:click=move |_| send(true)>"Check"</button>
            <button type="button" disabled=move || save.pending().get() on:click=move |_| send(false)>"Save"</button>
        </div>
        {move || answer().map(|a| match a {
            Ok(ImportOutcome::Done(report)) => view! {
                <p class="notice ok" role="status" data-form="saved">{
                    match (report.dry_run, report.changes.len()) {
                        (_, 0) => format!("Drop {}: nothing to change.", report.code),
                        (true, n) => format!("Drop {}: saving would change {n} thing(s).", report.code),
                        (false, n) => format!("Drop {}: saved, {n} change(s).", report.code),
                    }
                }</p>
                {crate::pages::drops::import_warnings(&report.warnings)}
            }.into_any(),
            Ok(ImportOutcome::Refused(problems)) => view! {
                <p class="notice error" role="alert" data-form="refused">{format!("Not saved: {} problem(s), shown next to their fields.", problems.len())}</p>
            }.into_any(),
            Err(e) => view! { <p class="notice error" role="alert">{error_text(&e)}</p> }.into_any(),
        })}
    }
}
