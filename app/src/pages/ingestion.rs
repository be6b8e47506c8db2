//! Webhook ingestion: each lane's backlog, rate, pending and paused state (live),
//! pausing and resuming lanes, and inspecting and replaying dead letters.

use leptos::prelude::*;

use crate::api::ingestion::{ReplayDeadLetter, SetLanePaused, ingestion_status};
use crate::components::{IfAllowed, Outcome, error_text, thousands};
use crate::dto::ops::LaneView;
use crate::live::Live;
use holdfast_domain::{Lane, Permission};

/// The ingestion page (`/ingestion`).
#[component]
pub fn IngestionPage() -> impl IntoView {
    let live = expect_context::<Live>();
    let pause = ServerAction::<SetLanePaused>::new();
    let replay = ServerAction::<ReplayDeadLetter>::new();
    let status = Resource::new(
        move || (pause.version().get(), replay.version().get()),
        |_| ingestion_status(),
    );
    view! {
        <section>
            <h1>"Ingestion"</h1>
            <Outcome value=pause.value().into()/>
            <Outcome value=replay.value().into()/>
            <Transition fallback=|| view! { <p class="muted">"Loading lanes…"</p> }>
                {move || Suspend::new(async move {
                    match status.await {
                        Ok(s) => {
                            let first = s.lanes.clone();
                            let lanes = Signal::derive(move || {
                                live.ops.with(|o| o.as_ref().map(|(ops, _)| ops.lanes.clone()))
                                    .filter(|l| !l.is_empty())
                                    .unwrap_or_else(|| first.clone())
                            });
                            view! {
                                <div class="table-wrap"><table class="lanes">
                                    <thead><tr><th scope="col">"Lane"</th><th scope="col" class="num">"Backlog"</th><th scope="col" class="num">"Pending"</th>
                                        <th scope="col" class="num">"Applied/s"</th><th scope="col">"State"</th><th scope="col"><span class="sr-only">"Actions"</span></th></tr></thead>
                                    <tbody>
                                        <For each=move || lanes.get() key=|l| l.lane let(lane)>
                                            <LaneRow lane=lane.lane lanes pause/>
                                        </For>
                                    </tbody>
                                </table></div>
                                <h2>{format!("Dead letters ({})", s.dead_letters.len())}</h2>
                                {if s.dead_letters.is_empty() {
                                    view! { <p class="empty">"No dead letters."</p> }.into_any()
                                } else {
                                    view! {
                                        <ul class="dead-letters">
                                        {s.dead_letters.into_iter().map(|d| {
                                            let id = d.id.clone();
                                            view! {
                                                <li data-dead=d.id.clone()>
                                                    <details>
                                                        <summary>{format!("{} · {} from {}: {}", d.id, d.lane, d.source, d.reason)}</summary>
                                                        <pre>{d.body.clone()}</pre>
                                                    </details>
                                                    <IfAllowed need=Permission::Operate>
                                                        {let id = id.clone(); view! {
                                                            <button type="button" on:click=move |_| { replay.dispatch(ReplayDeadLetter { id: id.clone() }); }>"Replay"</button>
                                                        }}
                                                    </IfAllowed>
                                                </li>
                                            }
                                        }).collect_view()}
                                        </ul>
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

#[component]
fn LaneRow(
    lane: Lane,
    lanes: Signal<Vec<LaneView>>,
    pause: ServerAction<SetLanePaused>,
) -> impl IntoView {
    let l = Memo::new(move |_| lanes.with(|all| all.iter().find(|l| l.lane == lane).cloned()));
    let get = move |f: fn(&LaneView) -> String| move || l.get().map(|l| f(&l)).unwrap_or_default();
    let paused = move || l.get().is_some_and(|l| l.paused);
    let (row_key, label) = (lane.as_str(), lane.as_str());
    view! {
        <tr data-lane=row_key>
            <td class="sku">{label}</td>
            <td class="num">{get(|l| thousands(l.backlog as i64))}</td>
            <td class="num">{get(|l| thousands(l.pending as i64))}</td>
            <td class="num">{get(|l| format!("{:.0}", l.rate))}</td>
            <td class:bad=paused>{move || if paused() { "paused" } else { "running" }}</td>
            <td><IfAllowed need=Permission::Operate>
                {view! {
                    <button type="button" on:click=move |_| {
                        pause.dispatch(SetLanePaused { lane: lane.as_str().to_owned(), paused: !paused() });
                    }>{move || if paused() { "Resume" } else { "Pause" }}</button>
                }}
            </IfAllowed></td>
        </tr>
    }
}
