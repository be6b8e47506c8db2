//! The audit log of manual actions, newest first, searchable and paged.

use leptos::prelude::*;

use crate::api::audit::audit_log;
use crate::components::{error_text, short_time};
use crate::dto::people::AuditView;

/// The audit page (`/audit`, admin).
#[component]
pub fn AuditPage() -> impl IntoView {
    let search = RwSignal::new(String::new());
    let before = RwSignal::new(None::<i64>);
    let entries = Resource::new(
        move || (search.get(), before.get()),
        |(s, b)| audit_log(s, b),
    );
    view! {
        <section>
            <h1>"Audit log"</h1>
            <div class="controls">
                <label>"Search "
                    <input type="search" placeholder="user, action or subject"
                        on:change:target=move |ev| { before.set(None); search.set(ev.target().value()); }/>
                </label>
                <button type="button" disabled=move || before.get().is_none() on:click=move |_| before.set(None)>"Newest"</button>
            </div>
            <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
                {move || Suspend::new(async move {
                    match entries.await {
                        Ok(list) if list.is_empty() => view! { <p class="empty">"No entries."</p> }.into_any(),
                        Ok(list) => {
                            let oldest = list.last().map(|e: &AuditView| e.id);
                            let full = list.len() == 100;
                            view! {
                                <div class="table-wrap"><table class="audit">
                                    <thead><tr><th scope="col">"When (UTC)"</th><th scope="col">"Who"</th><th scope="col">"Action"</th><th scope="col">"Subject"</th><th scope="col">"Detail"</th></tr></thead>
                                    <tbody>{list.into_iter().map(|e| view! {
                                        <tr data-action=e.action.clone()><td>{short_time(&e.at)}</td><td>{e.actor}</td><td>{e.action.clone()}</td><td class="sku">{e.subject}</td><td><code>{e.detail}</code></td></tr>
                                    }).collect_view()}</tbody>
                                </table></div>
                                {full.then(|| view! { <button type="button" on:click=move |_| before.set(oldest)>"Older"</button> })}
                            }.into_any()
                        }
                        Err(e) => view! { <p class="notice error" role="alert">{error_text(&e)}</p> }.into_any(),
                    }
                })}
            </Transition>
        </section>
    }
}
