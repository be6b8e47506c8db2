//! Liveness and readiness probes. All are public: they say which dependency
//! failed in fixed words, and the failure's own text (addresses, driver
//! messages) goes to the log only.
//!
//! Two kinds of ready: `/readyz` (everything works, recording included) is for
//! people and alerts; `/readyz/checkout` (this server can sell: Redis answers)
//! is for load balancers. PostgreSQL is shared by every server, so its outage
//! must not take them all out of rotation while checkout still works and the
//! write-behind queues in Redis.

use std::time::Duration;

use axum::{Json, Router, extract::State, http::StatusCode, routing::get};
use holdfast_engine::{postgres, redis_conn};
use serde::Serialize;

use std::sync::Arc;

use axum::extract::FromRef;
use holdfast_engine::Backends;

use crate::workers::WorkerStats;

/// How long a readiness probe waits for each dependency.
const PROBE_TIMEOUT: Duration = Duration::from_millis(1_500);

/// `/healthz`, `/readyz` and `/readyz/checkout`.
pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Backends: FromRef<S>,
    Arc<WorkerStats>: FromRef<S>,
{
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/readyz/checkout", get(checkout_ready))
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

impl Check {
    /// The public check for `what`'s probe result; a failure's detail is logged.
    fn of(what: &'static str, r: Result<(), String>) -> Self {
        match r {
            Ok(()) => Self {
                ok: true,
                error: None,
            },
            Err(detail) => {
                tracing::warn!(dependency = what, error = %detail, "readiness probe failed");
                Self {
                    ok: false,
                    error: Some(format!(
                        "{what} is not answering (details in the server log)"
                    )),
                }
            }
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
    /// The write-behind to PostgreSQL: failing while PostgreSQL is down (events
    /// wait in Redis, nothing is lost), with how far behind it is.
    pub write_behind: WriteBehindCheck,
}

/// The write-behind's health in `/readyz`.
#[derive(Debug, Serialize)]
pub struct WriteBehindCheck {
    /// Whether its last batch succeeded.
    pub ok: bool,
    /// Its last failure, while failing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Events not yet in PostgreSQL, when Redis could say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lag: Option<holdfast_engine::record::Lag>,
}

/// The body of `/readyz/checkout`.
#[derive(Debug, Serialize)]
pub struct CheckoutReadiness {
    /// `ready` when this server can take reservations and payments, otherwise
    /// `unavailable`.
    pub status: &'static str,
    /// Redis' check: checkout needs Redis and nothing else.
    pub redis: Check,
}

/// Redis answers: 200, whatever PostgreSQL does; otherwise 503.
async fn checkout_ready(State(backends): State<Backends>) -> (StatusCode, Json<CheckoutReadiness>) {
    let redis = Check::of(
        "Redis",
        redis_conn::ping(&backends.redis, PROBE_TIMEOUT).await,
    );
    let (code, status) = if redis.ok {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
    };
    (code, Json(CheckoutReadiness { status, redis }))
}

/// Redis and PostgreSQL both answer: 200; otherwise 503 naming what failed.
async fn readyz(
    State(backends): State<Backends>,
    State(workers): State<Arc<WorkerStats>>,
) -> (StatusCode, Json<Readiness>) {
    let (redis, postgres) = tokio::join!(
        redis_conn::ping(&backends.redis, PROBE_TIMEOUT),
        postgres::ping(&backends.pg, PROBE_TIMEOUT),
    );
    let (redis, postgres) = (Check::of("Redis", redis), Check::of("PostgreSQL", postgres));
    // The write-behind logs its own failures; the probe only says that it fails.
    let error = workers.write_behind.last_error().map(|_| {
        "recording to PostgreSQL is failing; events wait in Redis (details in the server log)"
            .to_owned()
    });
    let lag = if redis.ok {
        let lag = backends.engine.write_behind_lag();
        tokio::time::timeout(PROBE_TIMEOUT, lag)
            .await
            .ok()
            .and_then(Result::ok)
    } else {
        None
    };
    let write_behind = WriteBehindCheck {
        ok: error.is_none(),
        error,
        lag,
    };
    let ready = redis.ok && postgres.ok && write_behind.ok;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = Readiness {
        status: if ready { "ready" } else { "degraded" },
        redis,
        postgres,
        write_behind,
    };
    (status, Json(body))
}
