//! The tab's one live connection (`/live`) and the signals pages read from it.
//!
//! [`Live`] is provided at the root; it connects once the user is signed in (in
//! the browser only), keeps the last stream cursor it saw, and reconnects with
//! backoff, passing that cursor back so the server can replay what was missed.
//! Pages read figures, history, operations samples, jobs and events from its
//! signals, so a number changes in place the moment its message arrives.

use std::collections::{HashMap, VecDeque};

use leptos::prelude::*;

use crate::dto::live::{EventView, Sample, ServerMsg, SkuLive};
use crate::dto::ops::{JobView, OpsView};

/// How much history a tab keeps per SKU.
#[cfg_attr(not(feature = "hydrate"), allow(dead_code))]
const HISTORY_MS: i64 = 10 * 60 * 1_000;
/// How many events of the watched SKU a tab keeps.
#[cfg_attr(not(feature = "hydrate"), allow(dead_code))]
const EVENTS_KEPT: usize = 100;

/// The connection's state, shown in the top bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conn {
    /// Not connected yet (also what the server renders).
    Connecting,
    /// Receiving updates.
    Live,
    /// Lost; retrying (attempt number).
    Reconnecting(u32),
}

/// Live data for every page of the tab.
#[derive(Clone, Copy)]
pub struct Live {
    /// Connection state.
    pub conn: RwSignal<Conn>,
    /// Latest figures per SKU.
    pub figures: RwSignal<HashMap<String, SkuLive>>,
    /// Recent `available` samples per SKU, oldest first.
    pub history: RwSignal<HashMap<String, VecDeque<Sample>>>,
    /// Latest locks, lanes and write-behind sample, with the local time it came.
    pub ops: RwSignal<Option<(OpsView, i64)>>,
    /// Running and recent jobs, newest first.
    pub jobs: RwSignal<Vec<JobView>>,
    /// Events of the watched SKU, newest first.
    pub events: RwSignal<Vec<EventView>>,
    /// The local clock, ticking four times a second, for countdowns.
    pub now_ms: RwSignal<i64>,
    watched: RwSignal<Option<String>>,
    #[cfg_attr(not(feature = "hydrate"), allow(dead_code))]
    cursor: StoredValue<Option<String>>,
    #[cfg_attr(not(feature = "hydrate"), allow(dead_code))]
    started: StoredValue<bool>,
    #[cfg(feature = "hydrate")]
    socket: StoredValue<Option<web_sys::WebSocket>, LocalStorage>,
}

impl Default for Live {
    fn default() -> Self {
        Self::new()
    }
}

/// Milliseconds since the Unix epoch on this side's clock.
pub fn now_ms() -> i64 {
    #[cfg(feature = "hydrate")]
    {
        js_sys::Date::now() as i64
    }
    #[cfg(not(feature = "hydrate"))]
    {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64)
    }
}

impl Live {
    /// Empty state, not connected.
    pub fn new() -> Self {
        Self {
            conn: RwSignal::new(Conn::Connecting),
            figures: RwSignal::new(HashMap::new()),
            history: RwSignal::new(HashMap::new()),
            ops: RwSignal::new(None),
            jobs: RwSignal::new(Vec::new()),
            events: RwSignal::new(Vec::new()),
            now_ms: RwSignal::new(now_ms()),
            watched: RwSignal::new(None),
            cursor: StoredValue::new(None),
            started: StoredValue::new(false),
            #[cfg(feature = "hydrate")]
            socket: StoredValue::new_local(None),
        }
    }

    /// The figures of `sku`, tracked.
    pub fn sku(&self, sku: &str) -> Option<SkuLive> {
        self.figures.with(|m| m.get(sku).cloned())
    }

    /// `sku`'s chart samples, oldest first, tracked.
    pub fn samples(&self, sku: &str) -> Signal<Vec<Sample>> {
        let (history, sku) = (self.history, sku.to_owned());
        Signal::derive(move || {
            history.with(|h| {
                h.get(&sku)
                    .map(|d| d.iter().copied().collect())
                    .unwrap_or_default()
            })
        })
    }

    /// Seeds figures rendered by the server, without overwriting newer live ones.
    pub fn seed(&self, figures: &[SkuLive]) {
        self.figures.update(|m| {
            for f in figures {
                m.entry(f.sku.clone()).or_insert_with(|| f.clone());
            }
        });
    }

    /// Asks for the raw events of `sku` (the open SKU page), or of none.
    pub fn watch(&self, sku: Option<String>) {
        if self.watched.get_untracked() == sku {
            return;
        }
        self.events.set(Vec::new());
        self.watched.set(sku);
        self.send_watch();
    }

    /// Net units taken per second from `sku`'s available count over the last 30 s
    /// (0 when flat or rising).
    pub fn take_rate(&self, sku: &str) -> f64 {
        let now = self.now_ms.get();
        self.history.with(|h| {
            let Some(samples) = h.get(sku) else {
                return 0.0;
            };
            let Some(last) = samples.back() else {
                return 0.0;
            };
            let from = samples
                .iter()
                .find(|s| s.at_ms >= now - 30_000)
                .unwrap_or(last);
            let secs = ((now - from.at_ms) as f64 / 1_000.0).max(1.0);
            ((from.available - last.available) as f64 / secs).max(0.0)
        })
    }

    #[cfg_attr(not(feature = "hydrate"), allow(dead_code))]
    fn apply(&self, msg: ServerMsg) {
        match msg {
            ServerMsg::Snapshot {
                cursor,
                skus,
                history,
                jobs,
                replayed,
            } => {
                self.cursor.set_value(Some(cursor));
                // The snapshot has the drops' SKUs the hub follows (at most a
                // few thousand); the figures a page was rendered with for
                // others stay until their first change arrives.
                self.figures.update(|m| {
                    for f in skus {
                        m.insert(f.sku.clone(), f);
                    }
                });
                self.history.set(
                    history
                        .into_iter()
                        .map(|h| (h.sku, h.samples.into_iter().collect()))
                        .collect(),
                );
                self.jobs.set(jobs);
                if let Some(events) = replayed {
                    self.push_events(events);
                }
            }
            ServerMsg::Figures { cursor, skus, .. } => {
                self.cursor.set_value(Some(cursor));
                let local = now_ms();
                self.history.update(|h| {
                    for s in &skus {
                        let samples = h.entry(s.sku.clone()).or_default();
                        samples.push_back(Sample {
                            at_ms: local,
                            available: s.available,
                        });
                        while samples
                            .front()
                            .is_some_and(|f| f.at_ms < local - HISTORY_MS)
                        {
                            samples.pop_front();
                        }
                    }
                });
                self.figures.update(|m| {
                    for s in skus {
                        m.insert(s.sku.clone(), s);
                    }
                });
            }
            ServerMsg::Events { events } => self.push_events(events),
            ServerMsg::Ops(ops) => self.ops.set(Some((ops, now_ms()))),
            ServerMsg::Job(job) => {
                self.jobs
                    .update(|jobs| match jobs.iter_mut().find(|j| j.id == job.id) {
                        Some(slot) => *slot = job,
                        None => jobs.insert(0, job),
                    })
            }
        }
    }

    fn push_events(&self, events: Vec<EventView>) {
        let watched = self.watched.get_untracked();
        self.events.update(|list| {
            for e in events {
                if watched.as_deref() == Some(e.sku.as_str()) && !list.iter().any(|x| x.id == e.id)
                {
                    list.insert(0, e);
                }
            }
            list.truncate(EVENTS_KEPT);
        });
    }
}

#[cfg(not(feature = "hydrate"))]
impl Live {
    /// Connects (in the browser; the server renders the "connecting" state).
    pub fn start(&self) {}

    fn send_watch(&self) {}
}

#[cfg(feature = "hydrate")]
impl Live {
    /// Connects once per tab; later calls do nothing.
    pub fn start(&self) {
        if self.started.get_value() {
            return;
        }
        self.started.set_value(true);
        let live = *self;
        set_interval(
            move || live.now_ms.set(now_ms()),
            std::time::Duration::from_millis(250),
        );
        self.connect(0);
    }

    fn send_watch(&self) {
        let msg = crate::dto::live::ClientMsg::Watch {
            sku: self.watched.get_untracked(),
        };
        self.socket.with_value(|s| {
            if let (Some(ws), Ok(text)) = (s, serde_json::to_string(&msg))
                && ws.ready_state() == web_sys::WebSocket::OPEN
            {
                let _ = ws.send_with_str(&text);
            }
        });
    }

    fn connect(&self, attempt: u32) {
        use wasm_bindgen::JsCast;
        use wasm_bindgen::closure::Closure;

        let live = *self;
        let location = window().location();
        let scheme = if location.protocol().ok().as_deref() == Some("https:") {
            "wss"
        } else {
            "ws"
        };
        let host = location.host().unwrap_or_default();
        let query = self
            .cursor
            .get_value()
            .map(|c| format!("?cursor={}", js_sys::encode_uri_component(&c)))
            .unwrap_or_default();
        let Ok(ws) = web_sys::WebSocket::new(&format!("{scheme}://{host}/live{query}")) else {
            live.retry(attempt);
            return;
        };

        let on_open = Closure::<dyn FnMut()>::new(move || {
            live.conn.set(Conn::Live);
            live.send_watch();
        });
        ws.set_onopen(Some(on_open.as_ref().unchecked_ref()));
        on_open.forget();

        let on_message =
            Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |ev: web_sys::MessageEvent| {
                if let Some(text) = ev.data().as_string()
                    && let Ok(msg) = serde_json::from_str::<ServerMsg>(&text)
                {
                    live.apply(msg);
                }
            });
        ws.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
        on_message.forget();

        let on_close = Closure::<dyn FnMut()>::new(move || {
            let was_live = live.conn.get_untracked() == Conn::Live;
            live.retry(if was_live { 0 } else { attempt + 1 });
        });
        ws.set_onclose(Some(on_close.as_ref().unchecked_ref()));
        on_close.forget();

        self.socket.set_value(Some(ws));
    }

    fn retry(&self, attempt: u32) {
        let live = *self;
        live.conn.set(Conn::Reconnecting(attempt + 1));
        let delay = 250u64.saturating_mul(1 << attempt.min(5)).min(5_000);
        set_timeout(
            move || live.connect(attempt + 1),
            std::time::Duration::from_millis(delay),
        );
    }
}
