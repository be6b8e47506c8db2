//! `POST /ingest/{source}`: signed supplier, ERP and marketplace webhooks.
//!
//! Headers: `X-Holdfast-Timestamp` (Unix seconds) and `X-Holdfast-Signature:
//! sha256=<hex>`, the HMAC-SHA256 of `<timestamp>.<raw body>` with the source's
//! secret. A timestamp more than 5 minutes off is refused, signatures are compared
//! in constant time, and the raw payload is appended to the source's lane: the
//! answer is 202 with the event id, in milliseconds, whatever the lane's backlog.

use std::collections::HashMap;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use hmac::{Hmac, Mac};
use holdfast_engine::ingest::{self, Intake};
use sha2::Sha256;

use crate::api::error::ApiError;
use crate::state::AppState;

/// Oldest (or furthest in the future) timestamp accepted, in seconds.
pub const MAX_SKEW_SECS: i64 = 300;
/// Largest webhook body (a 10,000-event feed page fits).
pub const BODY_LIMIT: usize = 2 * 1024 * 1024;

/// One configured webhook source.
#[derive(Debug, Clone)]
pub struct Source {
    /// The lane its payloads go to.
    pub lane: String,
    /// The shared HMAC secret.
    pub secret: String,
}

/// Webhook sources and lane caps.
#[derive(Debug, Clone, Default)]
pub struct IngestConfig {
    /// Sources by name (the `{source}` in the URL).
    pub sources: HashMap<String, Source>,
    /// Most payloads waiting per lane.
    pub caps: HashMap<String, u64>,
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
            if !ingest::LANES.contains(&lane) {
                return Err(format!(
                    "'{entry}': lane must be one of {}",
                    ingest::LANES.join(", ")
                ));
            }
            if secret.len() < 16 {
                return Err(format!(
                    "source '{name}': the secret must be at least 16 characters"
                ));
            }
            config.sources.insert(
                name.to_owned(),
                Source {
                    lane: lane.to_owned(),
                    secret: secret.to_owned(),
                },
            );
        }
        for lane in ingest::LANES {
            config
                .caps
                .insert(lane.to_owned(), ingest::LaneConfig::default_for(lane).cap);
        }
        Ok(config)
    }
}

/// The ingestion route.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/ingest/{source}", post(receive))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
}

/// The signature a sender computes: `sha256=` and the hex HMAC of `timestamp.body`.
pub fn sign(secret: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

fn refuse(code: &str, message: &str) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, code, message)
}

fn verify(secret: &str, headers: &HeaderMap, body: &[u8]) -> Result<(), ApiError> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let timestamp: i64 = header("x-holdfast-timestamp")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| {
            refuse(
                "missing_signature",
                "send X-Holdfast-Timestamp (Unix seconds) and X-Holdfast-Signature",
            )
        })?;
    let signature = header("x-holdfast-signature")
        .and_then(|v| v.strip_prefix("sha256="))
        .and_then(|v| hex::decode(v).ok())
        .ok_or_else(|| {
            refuse(
                "missing_signature",
                "X-Holdfast-Signature must be sha256=<hex HMAC>",
            )
        })?;
    if (chrono::Utc::now().timestamp() - timestamp).abs() > MAX_SKEW_SECS {
        return Err(refuse(
            "stale_timestamp",
            "X-Holdfast-Timestamp is more than 5 minutes from now",
        ));
    }
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    // verify_slice compares in constant time.
    mac.verify_slice(&signature)
        .map_err(|_| refuse("bad_signature", "the signature does not match the body"))
}

async fn receive(
    State(state): State<AppState>,
    Path(source): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(src) = state.ingest.sources.get(&source) else {
        return ApiError::not_found(format!("no webhook source '{source}'")).into_response();
    };
    if let Err(e) = verify(&src.secret, &headers, &body) {
        return e.into_response();
    }
    if let Err(secs) = state.api.per_source.check(&source) {
        return crate::api::too_many(secs).into_response();
    }
    let cap = state
        .ingest
        .caps
        .get(&src.lane)
        .copied()
        .unwrap_or(u64::MAX);
    match ingest::enqueue(
        &mut state.backends.redis.clone(),
        &src.lane,
        &source,
        &body,
        cap,
    )
    .await
    {
        Ok(Intake::Accepted(id)) => (
            StatusCode::ACCEPTED,
            Json(serde_json::json!({ "event_id": id, "lane": src.lane })),
        )
            .into_response(),
        Ok(Intake::Full { backlog }) => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "lane_full",
            format!(
                "the {} lane holds {backlog} payloads; retry later",
                src.lane
            ),
        )
        .retry_after(5)
        .into_response(),
        Err(e) => ApiError::internal(&e).into_response(),
    }
}
