//! How long every HTTP request takes, by route and status class, for
//! `/metrics`. The route is the matched route's pattern (`/api/v1/stock/{sku}`,
//! never the SKU itself), `unmatched` for static files and unknown paths, so
//! the label set stays as small as the route table.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use holdfast_engine::telemetry::{Latencies, latency_histogram};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;

/// The labels of an HTTP request.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    /// The matched route's pattern, or `unmatched`.
    pub route: String,
    /// `1xx` (a WebSocket upgrade), `2xx`, `3xx`, `4xx` or `5xx`.
    pub status: &'static str,
}

/// Request durations, shared by every clone.
#[derive(Debug, Clone)]
pub struct HttpMetrics {
    /// Seconds from a request's headers to its answer's headers.
    pub duration: Latencies<HttpLabels>,
}

impl Default for HttpMetrics {
    fn default() -> Self {
        Self {
            duration: Family::new_with_constructor(latency_histogram),
        }
    }
}

/// The matched route, carried from the routed request to its response so the
/// outer layer (which runs before routing) can read it.
#[derive(Debug, Clone)]
struct Route(Arc<str>);

/// Inner layer on every route: notes the matched pattern on the response.
pub async fn note_route(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|m| Route(Arc::from(m.as_str())));
    let mut response = next.run(request).await;
    if let Some(route) = route {
        response.extensions_mut().insert(route);
    }
    response
}

/// Outer layer: times the request and counts it under its route and status
/// class.
pub async fn observe(State(metrics): State<HttpMetrics>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let response = next.run(request).await;
    let route = response
        .extensions()
        .get::<Route>()
        .map_or_else(|| "unmatched".to_owned(), |r| r.0.to_string());
    let status = match response.status().as_u16() {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    };
    metrics
        .duration
        .get_or_create(&HttpLabels { route, status })
        .observe(started.elapsed().as_secs_f64());
    response
}
