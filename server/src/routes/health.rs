//! Liveness and readiness probes.

use std::time::Duration;

use axum::{Json, Router, extract::State, http::StatusCode, routing::get};
use holdfast_engine::{kv, store};
use serde::Serialize;

use crate::state::AppState;

/// How long a readiness probe waits for each dependency.
const PROBE_TIMEOUT: Duration = Duration::from_millis(1_500);

/// `/healthz` and `/readyz`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
}

/// The process is up and serving HTTP.
async fn healthz() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "status": "ok" }))
}

/// One dependency's answer to a readiness probe.
#[derive(Debug, Serialize)]
pub struct Check {
    /// Whether it answered in time.
    pub ok: bool,
    /// Why not, when it did not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl From<Result<(), String>> for Check {
    fn from(r: Result<(), String>) -> Self {
        match r {
            Ok(()) => Self {
                ok: true,
                error: None,
            },
            Err(e) => Self {
                ok: false,
                error: Some(e),
            },
        }
    }
}

/// The body of `/readyz`.
#[derive(Debug, Serialize)]
pub struct Readiness {
    /// `ready` when every check passed, otherwise `degraded`.
    pub status: &'static str,
    /// Redis' check.
    pub redis: Check,
    /// PostgreSQL's check.
    pub postgres: Check,
}

/// Redis and PostgreSQL both answer: 200; otherwise 503 naming what failed.
async fn readyz(State(state): State<AppState>) -> (StatusCode, Json<Readiness>) {
    let (redis, postgres) = tokio::join!(
        kv::ping(&state.backends.redis, PROBE_TIMEOUT),
        store::ping(&state.backends.pg, PROBE_TIMEOUT),
    );
    let (redis, postgres) = (Check::from(redis), Check::from(postgres));
    let ready = redis.ok && postgres.ok;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = Readiness {
        status: if ready { "ready" } else { "degraded" },
        redis,
        postgres,
    };
    (status, Json(body))
}
