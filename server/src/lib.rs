//! The Holdfast server as a library: configuration, start-up, the axum router and
//! the operator commands. `main.rs` only parses arguments and calls [`cli::run`];
//! tests build the same router from an [`state::AppState`] and serve it on port 0.

pub mod cli;
pub mod config;
pub mod progress;
pub mod routes;
pub mod startup;
pub mod state;
pub mod telemetry;
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
    let options = state.leptos.clone();
    Router::new()
        .merge(routes::health::routes())
        .leptos_routes_with_context(
            &state,
            routes,
            move || provide_context(backends.clone()),
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
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}
