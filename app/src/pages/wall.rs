//! The wall view of a drop (`/wall?drop=code`): no navigation, large type, for
//! a screen on the wall during the drop. A clock (time to the start, or since
//! it), the drop's totals with units taken per second, and per SKU its
//! available units, its take rate and a wide live chart of available units.

use leptos::prelude::*;
use leptos_router::hooks::use_query_map;

use crate::api::overview::load_drop_overview;
use crate::components::{DropClock, Sparkline, error_text, thousands};
use crate::dto::DropOverview;
use crate::dto::live::Sample;
use crate::live::Live;

/// The wall page.
#[component]
pub fn WallPage() -> impl IntoView {
    let query = use_query_map();
    let overview = Resource::new(move || query.with(|q| q.get("drop")), load_drop_overview);
    view! {
        <section class="wall">
            <Suspense fallback=|| view! { <p class="muted">"Loading the drop…"</p> }>
                {move || Suspend::new(async move {
                    match overview.await {
                        Ok(Some(drop)) => view! { <Wall drop/> }.into_any(),
                        Ok(None) => view! { <p class="empty">"No such drop."</p> }.into_any(),
                        Err(e) => view! { <p class="notice error" role="alert">{error_text(&e)}</p> }.into_any(),
                    }
                })}
            </Suspense>
        </section>
    }
}

#[component]
fn Wall(drop: DropOverview) -> impl IntoView {
    let live = expect_context::<Live>();
    live.seed(&drop.figures);
    let names: Vec<String> = drop.skus.iter().map(|s| s.sku.clone()).collect();
    let totals = {
        let names = names.clone();
        Memo::new(move |_| {
            live.figures.with(|m| {
                names
                    .iter()
                    .filter_map(|n| m.get(n))
                    .fold((0, 0), |t, f| (t.0 + f.available, t.1 + f.sold))
            })
        })
    };
    let rate = Memo::new(move |_| names.iter().map(|n| live.take_rate(n)).sum::<f64>());
    // Units taken per second over the last ten minutes, a sample a second
    // (tenths, as the chart draws whole numbers).
    let taken = RwSignal::new(Vec::<Sample>::new());
    Effect::new(move |_| {
        let now = live.now_ms.get();
        let due = taken.with_untracked(|t| t.last().is_none_or(|s| now - s.at_ms >= 1_000));
        if due {
            let tenths = (rate.get_untracked() * 10.0).round() as i64;
            taken.update(|t| {
                t.push(Sample {
                    at_ms: now,
                    available: tenths,
                });
                t.retain(|s| now - s.at_ms <= 10 * 60 * 1_000);
            });
        }
    });
    view! {
        <header class="wall-head">
            <h1>{drop.name.clone()}</h1>
            <DropClock starts_at_ms=drop.starts_at_ms ends_at_ms=drop.ends_at_ms/>
        </header>
        <div class="wall-tiles" aria-label="Drop totals">
            <div class="tile"><span class="label">"Available"</span><span class="value" data-total="available">{move || thousands(totals.get().0)}</span></div>
            <div class="tile"><span class="label">"Sold"</span><span class="value" data-total="sold">{move || thousands(totals.get().1)}</span></div>
            <div class="tile"><span class="label">"Units taken / s"</span><span class="value" data-total="rate">{move || format!("{:.1}", rate.get())}</span></div>
        </div>
        <div class="wall-chart">
            <span class="label">"Units taken per second, last 10 minutes"</span>
            <Sparkline samples=Signal::derive(move || taken.get()) width=1200 height=140 label="Units taken per second over the last 10 minutes".to_owned()/>
        </div>
        <div class="wall-skus">
            {drop.skus.into_iter().map(|s| {
                let sku = s.sku.clone();
                let available = {
                    let sku = sku.clone();
                    move || live.sku(&sku).map_or(0, |f| f.available)
                };
                let sku_rate = {
                    let sku = sku.clone();
                    move || live.take_rate(&sku)
                };
                let samples = live.samples(&sku);
                view! {
                    <div class="wall-sku" data-sku=sku.clone()>
                        <span class="name">{s.variant.clone().map_or_else(|| s.title.clone(), |v| format!("{} — {v}", s.product))}</span>
                        <span class="value" data-field="available">{move || thousands(available())}</span>
                        <span class="rate">{move || format!("{:.1}/s", sku_rate())}</span>
                        <Sparkline samples width=640 height=72 label=format!("Available units of {sku} over the last 10 minutes")/>
                    </div>
                }
            }).collect_view()}
        </div>
    }
}
