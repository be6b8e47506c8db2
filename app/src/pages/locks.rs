//! Locks: holder, remaining lease and fencing token, live; force release (admin,
//! confirmed by typing the lock's name, and audited).

use leptos::prelude::*;

use crate::api::locks::{ForceReleaseLock, list_locks};
use crate::components::{IfAllowed, Outcome, duration, error_text};
use crate::dto::ops::LockView;
use crate::live::Live;
use holdfast_domain::Permission;

/// The locks page (`/locks`).
#[component]
pub fn LocksPage() -> impl IntoView {
    let live = expect_context::<Live>();
    let force = ServerAction::<ForceReleaseLock>::new();
    let initial = Resource::new(move || force.version().get(), |_| list_locks());
    view! {
        <section>
            <h1>"Locks"</h1>
            <p class="muted">"Leases with fencing tokens. A write carrying an older token than the newest issued is refused by PostgreSQL."</p>
            <Outcome value=force.value().into()/>
            <Transition fallback=|| view! { <p class="muted">"Loading locks…"</p> }>
                {move || Suspend::new(async move {
                    match initial.await {
                        Ok(first) => {
                            // Live samples replace the first read once they arrive.
                            let locks = Signal::derive(move || {
                                live.ops.with(|o| o.as_ref().map(|(ops, at)| (ops.locks.clone(), *at)))
                                    .unwrap_or_else(|| (first.clone(), crate::live::now_ms()))
                            });
                            view! { <LockTable locks force/> }.into_any()
                        }
                        Err(e) => view! { <p class="notice error" role="alert">{error_text(&e)}</p> }.into_any(),
                    }
                })}
            </Transition>
        </section>
    }
}

/// The table of held locks. Rows are keyed by lock and fencing token, so a live
/// sample updates the lease countdown without rebuilding a row: an admin halfway
/// through typing a lock's name to force it keeps the form and what was typed.
#[component]
fn LockTable(
    locks: Signal<(Vec<LockView>, i64)>,
    force: ServerAction<ForceReleaseLock>,
) -> impl IntoView {
    let live = expect_context::<Live>();
    let empty = Memo::new(move |_| locks.with(|(list, _)| list.is_empty()));
    // Lease left of one lock, from the newest sample and the clock since it.
    let remaining = move |name: &str| {
        locks.with(|(list, sampled_at)| {
            list.iter()
                .find(|l| l.name == name)
                .map(|l| duration(l.remaining_ms - (live.now_ms.get() - sampled_at)))
                .unwrap_or_default()
        })
    };
    move || {
        if empty.get() {
            return view! { <p class="empty">"No lock is held."</p> }.into_any();
        }
        view! {
            <div class="table-wrap"><table class="locks">
                <thead><tr><th scope="col">"Lock"</th><th scope="col">"Holder"</th><th scope="col" class="num">"Lease left"</th><th scope="col" class="num">"Fencing token"</th>
                <th scope="col"><span class="sr-only">"Actions"</span></th></tr></thead>
                <tbody>
                <For each=move || locks.with(|(list, _)| list.clone()) key=|l| (l.name.clone(), l.fence, l.holder.clone()) let(l)>
                    <LockRow lock=l remaining force/>
                </For>
                </tbody>
            </table></div>
        }.into_any()
    }
}

/// One held lock, with its force-release form (asked for, then confirmed by
/// typing the lock's name).
#[component]
fn LockRow(
    lock: LockView,
    remaining: impl Fn(&str) -> String + Copy + Send + Sync + 'static,
    force: ServerAction<ForceReleaseLock>,
) -> impl IntoView {
    let confirm = RwSignal::new(String::new());
    let asking = RwSignal::new(false);
    let name = lock.name.clone();
    let left = {
        let name = name.clone();
        move || remaining(&name)
    };
    view! {
        <tr data-lock=lock.name.clone()>
            <td class="sku">{lock.name.clone()}</td>
            <td>{lock.holder.clone()}</td>
            <td class="num">{left}</td>
            <td class="num">{lock.fence}</td>
            <td><IfAllowed need=Permission::Operate>
                {
                    let name = name.clone();
                    move || if asking.get() {
                        let name = name.clone();
                        view! {
                            <form class="inline" on:submit=move |ev| {
                                ev.prevent_default();
                                force.dispatch(ForceReleaseLock { name: name.clone(), confirm: confirm.get_untracked() });
                                asking.set(false);
                            }>
                                <input type="text" required aria-label="Type the lock name to confirm" placeholder="type the lock name"
                                    prop:value=move || confirm.get()
                                    on:input:target=move |ev| confirm.set(ev.target().value())/>
                                <button type="submit" class="danger">"Confirm force release"</button>
                                <button type="button" on:click=move |_| asking.set(false)>"Cancel"</button>
                            </form>
                        }.into_any()
                    } else {
                        view! { <button type="button" class="danger" on:click=move |_| asking.set(true)>"Force release…"</button> }.into_any()
                    }
                }
            </IfAllowed></td>
        </tr>
    }
}
