//! `POST /ingest/{source}`: signed supplier, ERP and marketplace webhooks.
//!
//! Headers: `X-Holdfast-Timestamp` (Unix seconds) and `X-Holdfast-Signature:
//! sha256=<hex>`, the HMAC-SHA256 of `<timestamp>.<raw body>` with the source's
//! secret. A timestamp more than 5 minutes off is refused, signatures are compared
//! in constant time, and the raw payload is appended to the source's lane: the
//! answer is 202 with the event id, in milliseconds, whatever the lane's backlog.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRef, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use hmac::{Hmac, Mac};
use holdfast_domain::{ErrorCode, Lane};
use holdfast_engine::ingest::{self, Intake};
use redis::aio::ConnectionManager;
use sha2::Sha256;

use crate::http::error::ApiError;
use crate::http::ratelimit::{Limit, RateLimiter};

/// Oldest (or furthest in the future) timestamp accepted, in seconds.
pub const MAX_SKEW_SECS: i64 = 300;
/// Largest webhook body (a 10,000-event feed page fits).
pub const BODY_LIMIT: usize = 2 * 1024 * 1024;

/// One configured webhook source.
#[derive(Debug, Clone)]
pub struct Source {
    /// The lane its payloads go to.
    pub lane: Lane,
    /// The shared HMAC secret.
    pub secret: String,
}

/// Webhook sources and lane caps.
#[derive(Debug, Clone, Default)]
pub struct IngestConfig {
    /// Sources by name (the `{source}` in the URL).
    pub sources: HashMap<String, Source>,
    /// Most payloads waiting per lane.
    pub caps: HashMap<Lane, u64>,
}

impl IngestConfig {
    /// Parses `name=lane:secret` entries.
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        let mut config = Self::default();
        for entry in entries.iter().filter(|e| !e.trim().is_empty()) {
            let (name, rest) = entry
                .trim()
                .split_once('=')
                .ok_or_else(|| format!("'{entry}': expected name=lane:secret"))?;
            let (lane, secret) = rest
                .split_once(':')
                .ok_or_else(|| format!("'{entry}': expected name=lane:secret"))?;
            let lane = Lane::parse(lane).map_err(|e| format!("'{entry}': {e}"))?;
            if secret.len() < 16 {
                return Err(format!(
                    "source '{name}': the secret must be at least 16 characters"
                ));
            }
            config.sources.insert(
                name.to_owned(),
                Source {
                    lane,
                    secret: secret.to_owned(),
                },
            );
        }
        for lane in Lane::ALL {
            config
                .caps
                .insert(lane, ingest::LaneConfig::default_for(lane).cap);
        }
        Ok(config)
    }
}

/// What the webhook route works with.
#[derive(Clone)]
pub struct IngestState {
    /// Redis, where the lanes are.
    pub redis: ConnectionManager,
    /// Sources and lane caps.
    pub config: Arc<IngestConfig>,
    /// Webhooks per source.
    pub per_source: Arc<RateLimiter>,
}

impl IngestState {
    /// State over `redis` for `config`, allowing `per_source` webhooks per second per source.
    pub fn new(redis: ConnectionManager, config: IngestConfig, per_source: u32) -> Self {
        Self {
            redis,
            config: Arc::new(config),
            per_source: Arc::new(RateLimiter::new(Limit::per_second(per_source))),
        }
    }
}

/// The ingestion route.
pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    IngestState: FromRef<S>,
{
    Router::new()
        .route("/ingest/{source}", post(receive))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(axum::middleware::from_fn(
            crate::http::deadline::within_deadline,
        ))
}

/// The HMAC-SHA256 of `timestamp.body` under `secret`, ready to finish.
fn mac(secret: &str, timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// The signature a sender computes: `sha256=` and the hex HMAC of `timestamp.body`.
pub fn sign(secret: &str, timestamp: i64, body: &[u8]) -> String {
    format!(
        "sha256={}",
        hex::encode(mac(secret, timestamp, body).finalize().into_bytes())
    )
}

fn refuse(code: ErrorCode, message: &str) -> ApiError {
    ApiError::new(code, message)
}

fn verify(secret: &str, headers: &HeaderMap, body: &[u8]) -> Result<(), ApiError> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let timestamp: i64 = header("x-holdfast-timestamp")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| {
            refuse(
                ErrorCode::MissingSignature,
                "send X-Holdfast-Timestamp (Unix seconds) and X-Holdfast-Signature",
            )
        })?;
    let signature = header("x-holdfast-signature")
        .and_then(|v| v.strip_prefix("sha256="))
        .and_then(|v| hex::decode(v).ok())
        .ok_or_else(|| {
            refuse(
                ErrorCode::MissingSignature,
                "X-Holdfast-Signature must be sha256=<hex HMAC>",
            )
        })?;
    // abs_diff: a hostile timestamp (i64::MIN) must not overflow the subtraction.
    if chrono::Utc::now().timestamp().abs_diff(timestamp) > MAX_SKEW_SECS.unsigned_abs() {
        return Err(refuse(
            ErrorCode::StaleTimestamp,
            "X-Holdfast-Timestamp is more than 5 minutes from now",
        ));
    }
    // verify_slice compares in constant time.
    mac(secret, timestamp, body)
        .verify_slice(&signature)
        .map_err(|_| {
            refuse(
                ErrorCode::BadSignature,
                "the signature does not match the body",
            )
        })
}

async fn receive(
    State(state): State<IngestState>,
    Path(source): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(src) = state.config.sources.get(&source) else {
        return ApiError::not_found(format!("no webhook source '{source}'")).into_response();
    };
    if let Err(e) = verify(&src.secret, &headers, &body) {
        return e.into_response();
    }
    if let Err(secs) = state.per_source.check(&source) {
        return ApiError::too_many(secs).into_response();
    }
    let cap = state
        .config
        .caps
        .get(&src.lane)
        .copied()
        .unwrap_or(u64::MAX);
    match ingest::enqueue(&mut state.redis.clone(), src.lane, &source, &body, cap).await {
        Ok(Intake::Accepted(id)) => (
            StatusCode::ACCEPTED,
            Json(serde_json::json!({ "event_id": id, "lane": src.lane })),
        )
            .into_response(),
        Ok(Intake::Full { backlog }) => ApiError::new(
            ErrorCode::LaneFull,
            format!(
                "the {} lane holds {backlog} payloads; retry later",
                src.lane
            ),
        )
        .into_response(),
        Err(e) => ApiError::internal(&e).into_response(),
    }
}
