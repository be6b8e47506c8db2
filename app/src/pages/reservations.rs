//! Finding a hold by reservation id or buyer, releasing it with a reason, and
//! late-payment remediations.

use leptos::prelude::*;
use leptos_router::hooks::use_query_map;

use crate::api::reservations::search_holds;
use crate::api::sku::ReleaseHold;
use crate::components::{Outcome, duration, error_text, me, short_time};
use crate::dto::holds::HoldSearch;
use crate::live::Live;
use holdfast_domain::Permission;

/// The reservations page (`/reservations?q=`).
#[component]
pub fn ReservationsPage() -> impl IntoView {
    let query = use_query_map();
    let q = move || query.with(|q| q.get("q").unwrap_or_default());
    let release = ServerAction::<ReleaseHold>::new();
    let found = Resource::new(
        move || (q(), release.version().get()),
        |(q, _)| search_holds(q),
    );
    view! {
        <section>
            <h1>"Reservations"</h1>
            <form class="controls" method="get" action="/reservations">
                <label>"Reservation id or buyer "
                    <input type="search" name="q" value=q placeholder="e.g. order-1042 or buyer-7"/>
                </label>
                <button type="submit">"Find"</button>
            </form>
            <Outcome value=release.value().into()/>
            <Transition fallback=|| view! { <p class="muted">"Searching…"</p> }>
                {move || Suspend::new(async move {
                    match found.await {
                        Ok(r) => view! { <Results found=r query=q() release/> }.into_any(),
                        Err(e) => view! { <p class="notice error" role="alert">{error_text(&e)}</p> }.into_any(),
                    }
                })}
            </Transition>
        </section>
    }
}

#[component]
fn Results(found: HoldSearch, query: String, release: ServerAction<ReleaseHold>) -> impl IntoView {
    let live = expect_context::<Live>();
    let skew = found.server_now_ms - crate::live::now_ms();
    let can_release = me().may(Permission::ReleaseHolds);
    let holds = if query.is_empty() {
        view! { <p class="muted">"Search by reservation id or buyer to see holds."</p> }.into_any()
    } else if found.holds.is_empty() {
        view! { <p class="empty">{format!("No hold matches {query}.")}</p> }.into_any()
    } else {
        view! {
            <div class="table-wrap"><table class="holds">
                <thead><tr><th scope="col">"Reservation"</th><th scope="col">"State"</th><th scope="col">"Lines"</th>
                    <th scope="col">"Buyer"</th><th scope="col" class="num">"Expires in"</th>
                    {can_release.then(|| view! { <th scope="col">"Release (with reason)"</th> })}</tr></thead>
                <tbody>
                {found.holds.into_iter().map(|h| {
                    let expires = h.expires_at_ms;
                    let open = h.state == "held";
                    let rid = h.reservation_id.clone();
                    let (row_key, label) = (rid.clone(), rid.clone());
                    let reason = RwSignal::new(String::new());
                    view! {
                        <tr data-reservation=row_key>
                            <td class="sku">{label}</td>
                            <td>{h.state.clone()}</td>
                            <td>{h.lines.iter().map(|l| format!("{} × {}", l.qty, l.sku)).collect::<Vec<_>>().join(", ")}</td>
                            <td>{h.buyer.clone().unwrap_or_else(|| "—".into())}</td>
                            <td class="num">{move || if open { duration(expires - live.now_ms.get() - skew) } else { "—".into() }}</td>
                            {(can_release && open).then(|| view! {
                                <td><form class="inline" on:submit=move |ev| {
                                    ev.prevent_default();
                                    release.dispatch(ReleaseHold { reservation_id: rid.clone(), reason: reason.get_untracked() });
                                }>
                                    <input type="text" required placeholder="reason" aria-label="Reason"
                                        on:input:target=move |ev| reason.set(ev.target().value())/>
                                    <button type="submit" class="danger">"Release"</button>
                                </form></td>
                            })}
                        </tr>
                    }
                }).collect_view()}
                </tbody>
            </table></div>
        }.into_any()
    };
    view! {
        {holds}
        <h2>"Payments to remediate"</h2>
        {if found.remediations.is_empty() {
            view! { <p class="empty">"No payments to remediate."</p> }.into_any()
        } else {
            view! {
                <div class="table-wrap"><table>
                    <thead><tr><th scope="col">"Reservation"</th><th scope="col">"Kind"</th><th scope="col">"Hold had"</th><th scope="col">"Status"</th><th scope="col">"Reason"</th><th scope="col">"When (UTC)"</th></tr></thead>
                    <tbody>{found.remediations.into_iter().map(|r| view! {
                        <tr><td class="sku">{r.reservation_id}</td><td>{r.kind.replace('_', " ")}</td><td>{r.hold_state}</td><td>{r.status}</td><td>{r.reason}</td><td>{short_time(&r.created_at)}</td></tr>
                    }).collect_view()}</tbody>
                </table></div>
            }.into_any()
        }}
    }
}
