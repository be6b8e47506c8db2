//! The drop overview: every SKU of a drop with available, reserved, sold and
//! drift, low-stock and sold-out states, take rate and estimated sell-out, and a
//! live chart per SKU; variants grouped under their product, a page of rows at a
//! time (the totals count every SKU).

use holdfast_domain::StockState;
use leptos::prelude::*;
use leptos_router::hooks::use_query_map;

use crate::api::overview::load_drop_overview;
use crate::components::{DropClock, Sparkline, error_text, thousands};
use crate::dto::live::SkuLive;
use crate::dto::{DropOverview, SkuSummary};
use crate::live::Live;

/// The overview page (`/?drop=code`).
#[component]
pub fn OverviewPage() -> impl IntoView {
    let query = use_query_map();
    let overview = Resource::new(move || query.with(|q| q.get("drop")), load_drop_overview);
    view! {
        <section class="overview">
            <Suspense fallback=|| view! { <p class="muted">"Loading the drop…"</p> }>
                {move || Suspend::new(async move {
                    match overview.await {
                        Ok(Some(drop)) => view! { <DropView drop/> }.into_any(),
                        Ok(None) => view! {
                            <p class="empty">
                                "No drop is loaded yet. Start Holdfast with --demo to load the demo drop."
                            </p>
                        }.into_any(),
                        Err(e) => view! { <p class="notice error" role="alert">{error_text(&e)}</p> }.into_any(),
                    }
                })}
            </Suspense>
        </section>
    }
}

/// Figures of `sku`: live when the tab has them, else as rendered.
fn figures(live: Live, initial: &SkuLive) -> Memo<SkuLive> {
    let initial = initial.clone();
    Memo::new(move |_| live.sku(&initial.sku).unwrap_or_else(|| initial.clone()))
}

/// SKU rows shown at once: a drop of thousands of SKUs renders (and follows
/// live) one page of them, while the totals count every SKU.
const PAGE_ROWS: usize = 100;

/// Whether `s` matches the filter `needle` (lower case; empty matches all).
fn matches(s: &SkuSummary, needle: &str) -> bool {
    needle.is_empty()
        || s.sku.to_lowercase().contains(needle)
        || s.title.to_lowercase().contains(needle)
        || s.product.to_lowercase().contains(needle)
}

#[component]
fn DropView(drop: DropOverview) -> impl IntoView {
    let live = expect_context::<Live>();
    live.seed(&drop.figures);
    let filter = RwSignal::new(String::new());
    let page = RwSignal::new(0usize);
    let total_skus = drop.skus.len();
    // Variants grouped under their product, products in first-seen order.
    let mut products: Vec<(String, Vec<(SkuSummary, SkuLive)>)> = Vec::new();
    for (s, f) in drop.skus.into_iter().zip(drop.figures) {
        match products.iter_mut().find(|(p, _)| *p == s.product) {
            Some((_, rows)) => rows.push((s, f)),
            None => products.push((s.product.clone(), vec![(s, f)])),
        }
    }
    let rows = StoredValue::new(
        products
            .into_iter()
            .flat_map(|(_, rows)| rows)
            .collect::<Vec<_>>(),
    );
    // Every SKU of the drop counts, on whichever page it is.
    let totals = Memo::new(move |_| {
        live.figures.with(|m| {
            rows.with_value(|rows| {
                rows.iter()
                    .filter_map(|(s, _)| m.get(&s.sku))
                    .fold((0, 0, 0, 0), |t, f| {
                        (
                            t.0 + f.available,
                            t.1 + f.reserved,
                            t.2 + f.sold,
                            t.3 + i64::from(f.available == 0 && f.warmed),
                        )
                    })
            })
        })
    });
    // The rows the filter keeps (indices into `rows`).
    let matching = Memo::new(move |_| {
        let needle = filter.get().trim().to_lowercase();
        rows.with_value(|rows| {
            rows.iter()
                .enumerate()
                .filter(|(_, (s, _))| matches(s, &needle))
                .map(|(i, _)| i)
                .collect::<Vec<usize>>()
        })
    });
    let pages = Memo::new(move |_| matching.with(|m| m.len().div_ceil(PAGE_ROWS).max(1)));
    let current = Memo::new(move |_| page.get().min(pages.get() - 1));
    let shown = move || matching.with(Vec::len);
    // This page's rows, grouped by product as they come.
    let page_groups = move || {
        let first = current.get() * PAGE_ROWS;
        let mut groups: Vec<(String, Vec<(SkuSummary, SkuLive)>)> = Vec::new();
        matching.with(|m| {
            rows.with_value(|rows| {
                for &i in m.iter().skip(first).take(PAGE_ROWS) {
                    let (s, f) = rows[i].clone();
                    match groups.last_mut() {
                        Some((p, g)) if *p == s.product => g.push((s, f)),
                        _ => groups.push((s.product.clone(), vec![(s, f)])),
                    }
                }
            })
        });
        groups
    };
    let switcher = (drop.drops.len() > 1).then(|| {
        let current = drop.code.clone();
        view! {
            <form class="drop-switch" method="get" action="/">
                <label>"Drop "
                    <select name="drop" onchange="this.form.submit()">
                        {drop.drops.iter().map(|(code, name)| view! {
                            <option value=code.clone() selected=*code == current>{name.clone()}</option>
                        }).collect_view()}
                    </select>
                </label>
            </form>
        }
    });
    let wall = format!("/wall?drop={}", drop.code);
    view! {
        <div class="page-head">
            <h1>{drop.name}</h1>
            {switcher}
            <DropClock starts_at_ms=drop.starts_at_ms ends_at_ms=drop.ends_at_ms/>
            <a class="wall-link" href=wall>"Wall view"</a>
        </div>
        <div class="tiles" aria-label="Drop totals">
            <div class="tile"><span class="label">"Available"</span><span class="value" data-total="available">{move || thousands(totals.get().0)}</span></div>
            <div class="tile"><span class="label">"Reserved"</span><span class="value" data-total="reserved">{move || thousands(totals.get().1)}</span></div>
            <div class="tile"><span class="label">"Sold"</span><span class="value" data-total="sold">{move || thousands(totals.get().2)}</span></div>
            <div class="tile"><span class="label">"Sold out"</span><span class="value">{move || format!("{} of {}", totals.get().3, total_skus)}</span></div>
        </div>
        <div class="controls">
            <label>"Filter "
                <input type="search" name="filter" placeholder="SKU, title or product"
                    prop:value=move || filter.get()
                    on:input:target=move |ev| {
                        filter.set(ev.target().value());
                        page.set(0);
                    }/>
            </label>
            <span class="count" aria-live="polite">{move || format!("Showing {} of {} SKUs", shown(), total_skus)}</span>
            <Show when=move || { pages.get() > 1 }>
                <nav class="pager" aria-label="Pages of SKUs">
                    <button type="button" disabled=move || { current.get() == 0 }
                        on:click=move |_| page.set(current.get_untracked().saturating_sub(1))>"Previous"</button>
                    <span class="page-of">{move || format!("Page {} of {}", current.get() + 1, pages.get())}</span>
                    <button type="button" disabled=move || { current.get() + 1 >= pages.get() }
                        on:click=move |_| page.set(current.get_untracked() + 1)>"Next"</button>
                </nav>
            </Show>
        </div>
        <div class="table-wrap">
        <table class="skus">
            <thead>
                <tr>
                    <th scope="col">"SKU"</th>
                    <th scope="col">"Variant"</th>
                    <th scope="col" class="num">"Available"</th>
                    <th scope="col" class="num">"Reserved"</th>
                    <th scope="col" class="num">"Sold"</th>
                    <th scope="col" class="num">"Drift"</th>
                    <th scope="col" class="num">"Units/s"</th>
                    <th scope="col" class="num">"Sells out in"</th>
                    <th scope="col">"Last 10 min"</th>
                </tr>
            </thead>
            {move || page_groups().into_iter().map(|(product, rows)| view! {
                <tbody class="product">
                    <tr class="product-row"><th scope="rowgroup" colspan="9">{product}</th></tr>
                    {rows.into_iter().map(|(s, f)| view! { <SkuRow summary=s initial=f/> }).collect_view()}
                </tbody>
            }).collect_view()}
        </table>
        </div>
    }
}

#[component]
fn SkuRow(summary: SkuSummary, initial: SkuLive) -> impl IntoView {
    let live = expect_context::<Live>();
    let f = figures(live, &initial);
    let sku = summary.sku.clone();
    let low = summary.low_stock_threshold;
    let state = move || {
        let f = f.get();
        match StockState::of(f.warmed.then_some(f.available), low) {
            StockState::Unknown => ("not warmed", "state cold"),
            StockState::SoldOut => ("sold out", "state out"),
            StockState::Low => ("low stock", "state low"),
            StockState::InStock => ("", "state"),
        }
    };
    let rate_sku = sku.clone();
    let rate = Memo::new(move |_| live.take_rate(&rate_sku));
    let eta = move || {
        let (r, a) = (rate.get(), f.get().available);
        if a == 0 {
            "—".to_owned()
        } else if r < 0.05 {
            "not selling".to_owned()
        } else {
            crate::components::duration((a as f64 / r * 1_000.0) as i64)
        }
    };
    let samples = live.samples(&sku);
    let variant = summary
        .variant
        .clone()
        .unwrap_or_else(|| summary.title.clone());
    view! {
        <tr data-sku=sku.clone()>
            <td class="sku"><a href=format!("/sku/{sku}")>{sku.clone()}</a></td>
            <td>{variant}<span class=move || state().1>{move || state().0}</span></td>
            <td class="num" data-field="available">{move || thousands(f.get().available)}</td>
            <td class="num" data-field="reserved">{move || thousands(f.get().reserved)}</td>
            <td class="num" data-field="sold">{move || thousands(f.get().sold)}</td>
            <td class="num" data-field="drift" class:bad=move || f.get().drift != 0>{move || thousands(f.get().drift)}</td>
            <td class="num">{move || format!("{:.1}", rate.get())}</td>
            <td class="num">{eta}</td>
            <td><Sparkline samples label=format!("Available units of {sku} over the last 10 minutes")/></td>
        </tr>
    }
}
