//! One SKU: live figures and chart, open holds with a countdown to expiry and a
//! release button (support), and the SKU's recent events as they happen.

use leptos::prelude::*;
use leptos_router::hooks::use_params_map;

use crate::api::sku::{ReleaseHold, SplitSku, load_sku_detail};
use crate::components::{IfAllowed, Outcome, Sparkline, duration, error_text, me, thousands};
use crate::dto::holds::{HoldView, SkuDetail};
use crate::dto::live::EventView;
use crate::live::Live;
use holdfast_domain::Permission;

/// The SKU page (`/sku/:sku`).
#[component]
pub fn SkuPage() -> impl IntoView {
    let params = use_params_map();
    let sku = move || params.with(|p| p.get("sku").unwrap_or_default());
    let live = expect_context::<Live>();
    // Refetched when a hold of this SKU changes, at most once a second.
    let version = RwSignal::new(0u32);
    let detail = Resource::new(
        move || (sku(), version.get()),
        |(sku, _)| load_sku_detail(sku),
    );
    Effect::new(move |_| live.watch(Some(sku())));
    on_cleanup(move || live.watch(None));
    let pending = StoredValue::new(false);
    Effect::new(move |seen: Option<usize>| {
        let n = live.events.with(|e| {
            e.iter()
                .filter(|e| {
                    matches!(
                        e.kind.as_str(),
                        "reserved" | "released" | "expired" | "confirmed"
                    )
                })
                .count()
        });
        if seen.is_some_and(|s| s != n) && !pending.get_value() {
            pending.set_value(true);
            set_timeout(
                move || {
                    pending.set_value(false);
                    version.update(|v| *v += 1);
                },
                std::time::Duration::from_millis(1_000),
            );
        }
        n
    });
    let release = ServerAction::<ReleaseHold>::new();
    let split = ServerAction::<SplitSku>::new();
    Effect::new(move |_| {
        if matches!(release.value().get(), Some(Ok(_)))
            || matches!(split.value().get(), Some(Ok(_)))
        {
            version.update(|v| *v += 1);
        }
    });

    view! {
        <section class="sku-page">
            <Transition fallback=|| view! { <p class="muted">"Loading the SKU…"</p> }>
                {move || Suspend::new(async move {
                    match detail.await {
                        Ok(d) => view! { <SkuView sku=sku() detail=d release split/> }.into_any(),
                        Err(e) => view! { <p class="notice error" role="alert">{error_text(&e)}</p> }.into_any(),
                    }
                })}
            </Transition>
        </section>
    }
}

#[component]
fn SkuView(
    sku: String,
    detail: SkuDetail,
    release: ServerAction<ReleaseHold>,
    split: ServerAction<SplitSku>,
) -> impl IntoView {
    let live = expect_context::<Live>();
    live.seed(std::slice::from_ref(&detail.figures));
    let initial = detail.figures.clone();
    let key = sku.clone();
    let f = Memo::new(move |_| live.sku(&key).unwrap_or_else(|| initial.clone()));
    let skew = detail.server_now_ms - crate::live::now_ms();
    let samples = live.samples(&sku);
    let initial_events = detail.events.clone();
    let events = move || {
        let mut list: Vec<EventView> = live.events.get();
        for e in &initial_events {
            if !list.iter().any(|x| x.id == e.id) {
                list.push(e.clone());
            }
        }
        list.truncate(50);
        list
    };
    let reason = RwSignal::new("customer asked to cancel".to_owned());
    let holds = detail.holds.clone();
    let can_release = me().may(Permission::ReleaseHolds);
    view! {
        <div class="page-head">
            <h1>{format!("{} · {}", sku, detail.title)}</h1>
            <span class="muted">{detail.product.clone()}</span>
        </div>
        <div class="tiles">
            <div class="tile"><span class="label">"Available"</span><span class="value" data-field="available">{move || thousands(f.get().available)}</span></div>
            <div class="tile"><span class="label">"Reserved"</span><span class="value" data-field="reserved">{move || thousands(f.get().reserved)}</span></div>
            <div class="tile"><span class="label">"Sold"</span><span class="value" data-field="sold">{move || thousands(f.get().sold)}</span></div>
            <div class="tile"><span class="label">"Awaiting PostgreSQL"</span><span class="value">{move || thousands(f.get().sold_pending)}</span></div>
            <div class={move || if f.get().owed > 0 { "tile bad" } else { "tile" }} title="Held units a feed removed: returning units pay them back before they are sellable; a sale of one is an oversell to remediate">
                <span class="label">"Owed (feed shortfall)"</span><span class="value" data-field="owed">{move || thousands(f.get().owed)}</span>
            </div>
            <div class="tile"><span class="label">"Drift"</span><span class="value" data-field="drift">{move || thousands(f.get().drift)}</span></div>
            <div class="tile"><span class="label">"On hand (PostgreSQL)"</span><span class="value">{thousands(detail.on_hand)}</span></div>
        </div>
        <div class="panel chart">
            <h2>"Available, last 10 minutes"</h2>
            <Sparkline samples width=720 height=120 label=format!("Available units of {sku} over the last 10 minutes")/>
        </div>
        <div class="panel">
            <h2>{format!("Open holds ({})", holds.len())}</h2>
            <IfAllowed need=Permission::ReleaseHolds>
                <label class="reason">"Reason for releases "
                    <input type="text" name="reason" prop:value=move || reason.get()
                        on:input:target=move |ev| reason.set(ev.target().value())/>
                </label>
            </IfAllowed>
            <Outcome value=release.value().into()/>
            {if holds.is_empty() {
                view! { <p class="empty">"No open holds on this SKU."</p> }.into_any()
            } else {
                view! {
                    <div class="table-wrap">
                    <table class="holds">
                        <thead><tr>
                            <th scope="col">"Reservation"</th><th scope="col">"Buyer"</th>
                            <th scope="col" class="num">"Units"</th><th scope="col" class="num">"Expires in"</th>
                            {can_release.then(|| view! { <th scope="col"><span class="sr-only">"Actions"</span></th> })}
                        </tr></thead>
                        <tbody>
                            {holds.into_iter().map(|h| view! { <HoldRow hold=h sku=sku.clone() skew release reason can_release/> }).collect_view()}
                        </tbody>
                    </table>
                    </div>
                }.into_any()
            }}
        </div>
        <PartsPanel sku=sku.clone() parts=detail.part_available.clone() split/>
        <div class="panel">
            <h2>"Recent events"</h2>
            <ol class="events" aria-live="polite">
                {move || events().into_iter().map(|e| view! {
                    <li data-kind=e.kind.clone()>
                        <span class="kind">{e.kind.clone()}</span>
                        <span class="num">{format!("{:+}", if matches!(e.kind.as_str(), "reserved" | "confirmed") { -e.qty } else { e.qty })}</span>
                        <span class="muted">{e.reservation_id.clone().unwrap_or_default()}</span>
                        <span class="muted">{e.available.map(|a| format!("available {a}")).unwrap_or_default()}</span>
                    </li>
                }).collect_view()}
            </ol>
        </div>
    }
}

/// How the SKU's stock is split over Redis shards, and (admin) splitting it.
#[component]
fn PartsPanel(sku: String, parts: Vec<i64>, split: ServerAction<SplitSku>) -> impl IntoView {
    let count = parts.len().max(1);
    let sku = StoredValue::new(sku);
    view! {
        <div class="panel" data-panel="parts">
            <h2>{if count > 1 { format!("Split into {count} parts") } else { "One counter (not split)".to_owned() }}</h2>
            {(count > 1).then(|| view! {
                <p class="muted">"Available per part: "
                    <span data-field="parts">{parts.iter().map(|a| thousands(*a)).collect::<Vec<_>>().join(" · ")}</span>
                </p>
            })}
            <IfAllowed need=Permission::Operate>
                <ActionForm action=split attr:class="inline">
                    <input type="hidden" name="sku" value=move || sku.get_value()/>
                    <label>"Parts "
                        <input type="number" name="parts" min="1" max="16" required value=count.to_string()/>
                    </label>
                    <button type="submit" disabled=move || split.pending().get()>"Split"</button>
                </ActionForm>
                <p class="muted">"A hot SKU split into parts on several Redis shards takes more reservations a second; it is never sold out while a part has units. Changed between drops only."</p>
                <Outcome value=split.value().into()/>
            </IfAllowed>
        </div>
    }
}

#[component]
fn HoldRow(
    hold: HoldView,
    sku: String,
    skew: i64,
    release: ServerAction<ReleaseHold>,
    reason: RwSignal<String>,
    can_release: bool,
) -> impl IntoView {
    let live = expect_context::<Live>();
    let expires = hold.expires_at_ms;
    let left = move || expires - (live.now_ms.get() + skew);
    let units: i64 = hold
        .lines
        .iter()
        .filter(|l| l.sku == sku)
        .map(|l| l.qty)
        .sum();
    let rid = hold.reservation_id.clone();
    view! {
        <tr data-reservation=rid.clone()>
            <td class="sku">{rid.clone()}</td>
            <td>{hold.buyer.clone().unwrap_or_else(|| "—".into())}</td>
            <td class="num">{units}</td>
            <td class="num" class:bad=move || left() < 60_000>{move || if left() > 0 { duration(left()) } else { "expiring…".into() }}</td>
            {can_release.then(|| {
                let rid = rid.clone();
                view! {
                    <td><button type="button" class="danger"
                        disabled=move || release.pending().get()
                        on:click=move |_| { release.dispatch(ReleaseHold { reservation_id: rid.clone(), reason: reason.get_untracked() }); }>
                        "Release"
                    </button></td>
                }
            })}
        </tr>
    }
}
