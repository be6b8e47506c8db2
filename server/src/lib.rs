//! The Holdfast server as a library: configuration, start-up, the axum router and
//! the operator commands. `main.rs` only parses arguments and calls [`cli::run`];
//! tests build the same router from an [`state::AppState`] and serve it on port 0.

pub mod api;
pub mod badge;
pub mod cli;
pub mod config;
pub mod feed;
pub mod live;
pub mod progress;
pub mod routes;
pub mod simulate;
pub mod startup;
pub mod state;
pub mod telemetry;
pub mod users;
pub mod workers;

use axum::Router;
use holdfast_app::{App, shell};
use leptos::prelude::provide_context;
use leptos_axum::{LeptosRoutes, generate_route_list};
use tokio::net::TcpListener;
use tower_http::trace::TraceLayer;

use crate::state::AppState;

/// Builds the whole HTTP surface: health probes, the Leptos pages and server
/// functions, and the static site (WASM, JS, CSS, assets).
pub fn router(state: AppState) -> Router {
    let routes = generate_route_list(App);
    let backends = state.backends.clone();
    let jobs = state.jobs.clone();
    let options = state.leptos.clone();
    Router::new()
        .route("/live", axum::routing::get(live::ws::live))
        .merge(routes::health::routes())
        .merge(api::routes())
        .merge(routes::ingest::routes())
        .merge(routes::metrics::routes())
        .merge(badge::routes::routes())
        .merge(routes::demo::routes())
        .leptos_routes_with_context(
            &state,
            routes,
            move || {
                provide_context(backends.clone());
                provide_context(jobs.clone());
            },
            move || shell(options.clone()),
        )
        .fallback(leptos_axum::file_and_error_handler::<AppState, _>(shell))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

/// Serves `router` on `listener` until `shutdown` completes, then drains in-flight
/// requests.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Connect info gives handlers the client's address (per-client badge limits).
    let service = router.into_make_service_with_connect_info::<std::net::SocketAddr>();
    axum::serve(listener, service)
        .with_graceful_shutdown(shutdown)
        .await
}

/// Starts the live side of a server over `state`: the event feed (one stream
/// reader for the process), the listener that clears the sold-out cache when
/// stock comes back, the badge hub and the dashboards' live hub. Both stop when `stop` turns `true`.
pub fn start_live(
    state: &AppState,
    redis_url: &str,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let feed = state.feed.clone();
    let keys = state.backends.engine.keyspace();
    let events = feed.subscribe();
    let badge_events = feed.subscribe();
    let live_events = feed.subscribe();
    vec![
        tokio::spawn(feed.run(redis_url.to_owned(), keys, stopped(stop.clone()))),
        tokio::spawn(clear_sold_out(
            events,
            state.api.clone(),
            stopped(stop.clone()),
        )),
        tokio::spawn(
            state
                .badges
                .clone()
                .run(badge_events, stopped(stop.clone())),
        ),
        tokio::spawn(
            state
                .live
                .clone()
                .run(redis_url.to_owned(), live_events, stopped(stop)),
        ),
    ]
}

async fn clear_sold_out(
    mut events: tokio::sync::broadcast::Receiver<std::sync::Arc<holdfast_engine::events::Event>>,
    api: std::sync::Arc<api::ApiState>,
    shutdown: impl Future<Output = ()>,
) {
    use tokio::sync::broadcast::error::RecvError;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            event = events.recv() => match event {
                Ok(e) if e.available.is_some_and(|a| a > 0) => api.sold_out.clear(&e.sku),
                Ok(_) => {}
                // Missed events: any entry may be stale, so forget them all.
                Err(RecvError::Lagged(_)) => api.sold_out.clear_all(),
                Err(RecvError::Closed) => return,
            }
        }
    }
}
