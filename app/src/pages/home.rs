//! The dashboard home: the current drop's SKUs, with a filter and sort that work
//! in the browser once the page has hydrated.

use leptos::prelude::*;

use crate::api::catalog::load_drop_overview;
use crate::dto::{DropOverview, SkuSummary};

/// How the SKU table is ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SortKey {
    Sku,
    Title,
    OnHandDesc,
}

impl SortKey {
    fn parse(value: &str) -> Self {
        match value {
            "title" => Self::Title,
            "on_hand" => Self::OnHandDesc,
            _ => Self::Sku,
        }
    }

    fn sort(self, rows: &mut [SkuSummary]) {
        match self {
            Self::Sku => rows.sort_by(|a, b| a.sku.cmp(&b.sku)),
            Self::Title => rows.sort_by(|a, b| a.title.cmp(&b.title)),
            Self::OnHandDesc => {
                rows.sort_by(|a, b| b.on_hand.cmp(&a.on_hand).then(a.sku.cmp(&b.sku)))
            }
        }
    }
}

/// The home page.
#[component]
pub fn HomePage() -> impl IntoView {
    let overview = Resource::new(|| (), |_| load_drop_overview(None));
    // Effects run only in the browser, so this flips once the WASM has hydrated the
    // page; end-to-end tests wait for it before using the controls.
    let hydrated = RwSignal::new(false);
    Effect::new(move |_| hydrated.set(true));

    view! {
        <section class="home" data-hydrated=move || hydrated.get().to_string()>
            <Suspense fallback=|| view! { <p class="muted">"Loading the drop…"</p> }>
                {move || Suspend::new(async move {
                    match overview.await {
                        Ok(Some(drop)) => view! { <DropTable drop/> }.into_any(),
                        Ok(None) => view! {
                            <p class="empty">
                                "No drop is loaded yet. Start Holdfast with --demo to load the demo drop."
                            </p>
                        }.into_any(),
                        Err(e) => view! { <p class="error" role="alert">{e.to_string()}</p> }.into_any(),
                    }
                })}
            </Suspense>
        </section>
    }
}

/// A drop's SKUs with a text filter and a sort order.
#[component]
fn DropTable(drop: DropOverview) -> impl IntoView {
    let filter = RwSignal::new(String::new());
    let sort = RwSignal::new(SortKey::Sku);
    let total = drop.skus.len();
    let skus = StoredValue::new(drop.skus);

    let visible = Memo::new(move |_| {
        let needle = filter.get().trim().to_lowercase();
        let mut rows: Vec<SkuSummary> = skus.with_value(|all| {
            all.iter()
                .filter(|s| {
                    needle.is_empty()
                        || s.sku.to_lowercase().contains(&needle)
                        || s.title.to_lowercase().contains(&needle)
                })
                .cloned()
                .collect()
        });
        sort.get().sort(&mut rows);
        rows
    });

    view! {
        <h1>{drop.name}</h1>
        <div class="controls">
            <label>
                "Filter "
                <input
                    type="search"
                    name="filter"
                    placeholder="SKU or title"
                    prop:value=move || filter.get()
                    on:input:target=move |ev| filter.set(ev.target().value())
                />
            </label>
            <label>
                "Sort by "
                <select name="sort" on:change:target=move |ev| sort.set(SortKey::parse(&ev.target().value()))>
                    <option value="sku">"SKU"</option>
                    <option value="title">"Title"</option>
                    <option value="on_hand">"On hand (most first)"</option>
                </select>
            </label>
            <span class="count" aria-live="polite">
                {move || format!("Showing {} of {} SKUs", visible.with(Vec::len), total)}
            </span>
        </div>
        <table class="skus">
            <thead>
                <tr><th scope="col">"SKU"</th><th scope="col">"Title"</th><th scope="col" class="num">"On hand"</th></tr>
            </thead>
            <tbody>
                <For each=move || visible.get() key=|s| s.sku.clone() children=sku_row/>
            </tbody>
        </table>
    }
}

/// One row of the SKU table.
fn sku_row(s: SkuSummary) -> impl IntoView {
    let key = s.sku.clone();
    view! {
        <tr data-sku=key>
            <td class="sku">{s.sku}</td>
            <td>{s.title}</td>
            <td class="num">{s.on_hand}</td>
        </tr>
    }
}
