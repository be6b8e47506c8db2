//! `POST /ingest/{source}`: signed supplier, ERP and marketplace webhooks.
//!
//! Headers: `X-Holdfast-Timestamp` (Unix seconds) and `X-Holdfast-Signature:
//! sha256=<hex>`, the HMAC-SHA256 of `<timestamp>.<raw body>` with the source's
//! secret. A timestamp more than 5 minutes off is refused, signatures are compared
//! in constant time, and the raw payload is appended to the source's lane: the
//! answer is 202 with the event id, in milliseconds, whatever the lane's backlog.
//!
//! Cheap checks come first: the client address must be within its rate, and
//! the signature's headers present and the timestamp fresh, before the body is
//! read or a MAC computed; bodies being read at once are bounded
//! ([`crate::routes::receiving`]). An unknown source goes through
//! the same steps (a MAC under a placeholder key included) and gets the same
//! 401 as a wrong signature, so neither the answer nor its timing says which
//! sources exist.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Extension;
use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::{FromRef, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use hmac::{Hmac, Mac};
use holdfast_domain::{ErrorCode, Lane};
use holdfast_engine::ingest::{self, Intake};
use holdfast_engine::redis_conn::RedisConn;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use sha2::Sha256;

use holdfast_app::server::guard::ClientIp;

use crate::http::error::ApiError;
use crate::routes::receiving::Receiving;
use holdfast_engine::ratelimit::{Limit, RateLimiter};

/// Oldest (or furthest in the future) timestamp accepted, in seconds.
pub const MAX_SKEW_SECS: i64 = 300;
/// Default largest webhook body (a 10,000-event feed page fits).
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
    /// Most payload bytes waiting per lane.
    pub byte_caps: HashMap<Lane, u64>,
    /// Largest webhook body accepted (413 above).
    pub max_body: usize,
}

impl IngestConfig {
    /// Parses `name=lane:secret` entries. Errors name the entry by its
    /// position and source name, never by its text: it holds the secret.
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        let mut config = Self::default();
        for (n, entry) in entries.iter().filter(|e| !e.trim().is_empty()).enumerate() {
            let which = format!("entry {}", n + 1);
            let (name, rest) = entry
                .trim()
                .split_once('=')
                .ok_or_else(|| format!("{which}: expected name=lane:secret"))?;
            let name = name.trim();
            let which = format!("{which} (source '{name}')");
            if let Err(why) = ingest::check_source_name(name) {
                return Err(format!("{which}: {why}"));
            }
            let (lane, secret) = rest
                .split_once(':')
                .ok_or_else(|| format!("{which}: expected name=lane:secret"))?;
            let lane = Lane::parse(lane).map_err(|e| format!("{which}: {e}"))?;
            if secret.len() < 16 {
                return Err(format!(
                    "{which}: the secret must be at least 16 characters"
                ));
            }
            let earlier = config.sources.insert(
                name.to_owned(),
                Source {
                    lane,
                    secret: secret.to_owned(),
                },
            );
            if earlier.is_some() {
                return Err(format!("{which}: source {name} is named twice"));
            }
        }
        config.max_body = BODY_LIMIT;
        for lane in Lane::ALL {
            let defaults = ingest::LaneConfig::default_for(lane);
            config.caps.insert(lane, defaults.cap);
            config.byte_caps.insert(lane, defaults.cap_bytes);
        }
        Ok(config)
    }
}

impl IngestConfig {
    /// Overrides lane caps with `lane:value` entries (payloads in `caps`,
    /// bytes in `byte_caps`); other lanes keep their defaults.
    pub fn with_caps(mut self, caps: &[String], byte_caps: &[String]) -> Result<Self, String> {
        for (entries, into, flag) in [
            (caps, &mut self.caps, "--lane-cap"),
            (byte_caps, &mut self.byte_caps, "--lane-bytes-cap"),
        ] {
            for entry in entries.iter().filter(|e| !e.trim().is_empty()) {
                let (lane, value) = entry
                    .trim()
                    .split_once(':')
                    .ok_or_else(|| format!("{flag} '{entry}': expected lane:number"))?;
                let lane = Lane::parse(lane).map_err(|e| format!("{flag} '{entry}': {e}"))?;
                let value: u64 =
                    value.parse().ok().filter(|v| *v > 0).ok_or_else(|| {
                        format!("{flag} '{entry}': expected a whole number above 0")
                    })?;
                into.insert(lane, value);
            }
        }
        self.check_body_fits()?;
        Ok(self)
    }

    /// Sets the largest webhook body; every lane's byte cap must hold one.
    pub fn with_max_body(mut self, max_body: usize) -> Result<Self, String> {
        self.max_body = max_body;
        self.check_body_fits()?;
        Ok(self)
    }

    fn check_body_fits(&self) -> Result<(), String> {
        match self
            .byte_caps
            .iter()
            .find(|(_, cap)| **cap < self.max_body as u64)
        {
            Some((lane, cap)) => Err(format!(
                "the {lane} lane's byte cap ({cap}) is below the largest webhook body ({}): \
                 no payload of that size could ever be queued",
                self.max_body
            )),
            None => Ok(()),
        }
    }
}

/// What the webhook route works with.
#[derive(Clone)]
pub struct IngestState {
    /// Redis, where the lanes are.
    pub redis: RedisConn,
    /// Sources and lane caps.
    pub config: Arc<IngestConfig>,
    /// Webhooks per source.
    pub per_source: Arc<RateLimiter>,
    /// Attempts per client address (any source name), before any verification.
    pub per_caller: Arc<RateLimiter<std::net::IpAddr>>,
    /// Payloads accepted into a lane, by lane.
    pub payloads: Family<LaneLabel, Counter>,
    /// Bytes of the payloads accepted into a lane, by lane.
    pub bytes: Family<LaneLabel, Counter>,
    /// Memory for webhook bodies being read, before any is verified.
    pub receiving: Arc<Receiving>,
}

/// A counter per lane, each exported from the start (at 0).
fn lane_counters() -> Family<LaneLabel, Counter> {
    let family = Family::<LaneLabel, Counter>::default();
    for lane in Lane::ALL {
        drop(family.get_or_create(&LaneLabel {
            lane: lane.as_str(),
        }));
    }
    family
}

/// The label of a lane's figures.
#[derive(Debug, Clone, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct LaneLabel {
    /// The lane's name.
    pub lane: &'static str,
}

impl IngestState {
    /// State over `redis` for `config`, allowing `per_source` webhooks per second per source.
    pub fn new(redis: RedisConn, config: IngestConfig, per_source: u32) -> Self {
        let config_max_body = config.max_body;
        Self {
            redis,
            config: Arc::new(config),
            per_source: Arc::new(RateLimiter::new(Limit::per_second(per_source))),
            // Lifting the per-source limit (0) is for trusted senders; the
            // anonymous per-address limit before verification stays.
            per_caller: Arc::new(RateLimiter::new(Limit::per_second(if per_source == 0 {
                holdfast_engine::ratelimit::DEFAULT_SOURCE_RATE
            } else {
                per_source
            }))),
            receiving: Arc::new(Receiving::new(config_max_body)),
            payloads: lane_counters(),
            bytes: lane_counters(),
        }
    }
}

/// The ingestion route; every webhook is answered within `deadline`.
pub fn routes<S>(deadline: crate::http::deadline::Deadline) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    IngestState: FromRef<S>,
{
    Router::new()
        .route("/ingest/{source}", post(receive))
        .layer(axum::middleware::from_fn_with_state(
            deadline,
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

/// The signature headers: the timestamp (checked against the clock) and the
/// MAC bytes. The same checks for every source name, known or not.
fn signed_headers(headers: &HeaderMap) -> Result<(i64, Vec<u8>), ApiError> {
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
    Ok((timestamp, signature))
}

/// The key an unknown source's MAC is computed with (its result is never
/// accepted): the same work as for a known source.
const UNKNOWN_SOURCE_KEY: &str = "holdfast: no such webhook source";

/// The one answer for an unknown source and a wrong signature.
fn not_verified() -> ApiError {
    refuse(
        ErrorCode::BadSignature,
        "the signature does not match the body (or there is no such source)",
    )
}

async fn receive(
    State(state): State<IngestState>,
    Path(source): Path<String>,
    client: Option<Extension<ClientIp>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    // Every step up to the MAC is the same for a source that does not exist,
    // so no answer (status, code, limit) tells which sources exist.
    let src = state.config.sources.get(&source);
    // Limits before work: a flood of 2 MiB bodies with bad signatures from one
    // address is refused before it is read or hashed, and does not use up the
    // real sender's budget (a different address).
    // Keyed by the client address alone: a key per source name as given would
    // let invented names dodge the limit and grow the limiter without bound.
    let address = client.map_or(
        std::net::IpAddr::from([0, 0, 0, 0]),
        |Extension(ClientIp(ip))| ip,
    );
    if let Err(secs) = state.per_caller.check(&address) {
        return ApiError::too_many(secs).into_response();
    }
    let max_body = state.config.max_body;
    let too_large = || {
        ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!("a webhook body is at most {max_body} bytes"),
        )
        .into_response()
    };
    // A declared length over the limit is refused before waiting for the body.
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_body as u64) {
        return too_large();
    }
    // The signature's headers before the body: the same checks whatever the
    // source, so a sender without them is refused without being read.
    let (timestamp, signature) = match signed_headers(&headers) {
        Ok(signed) => signed,
        Err(e) => return e.into_response(),
    };
    // Memory for the body, from what this sender and every sender together
    // are sending at once.
    let need = declared.map_or(max_body, |n| n as usize);
    let Some(_reading) = state.receiving.admit(address, need) else {
        tracing::debug!(%address, need, "webhook bodies in flight at their bound; answered 429");
        return ApiError::too_many(1).into_response();
    };
    let body = match axum::body::to_bytes(body, max_body).await {
        Ok(b) => b,
        Err(e)
            if std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>()) =>
        {
            return too_large();
        }
        // The connection broke or the body was malformed on the wire.
        Err(_) => {
            return ApiError::new(ErrorCode::BadRequest, "the body could not be read whole")
                .into_response();
        }
    };
    // An unknown source costs the same MAC as a known one, so timing does not
    // tell them apart either. verify_slice compares in constant time.
    let secret = src.map_or(UNKNOWN_SOURCE_KEY, |s| s.secret.as_str());
    let verified = mac(secret, timestamp, &body)
        .verify_slice(&signature)
        .is_ok();
    let Some(src) = src.filter(|_| verified) else {
        return not_verified().into_response();
    };
    state.receiving.verified(address);
    if let Err(secs) = state.per_source.check(&source) {
        return ApiError::too_many(secs).into_response();
    }
    let caps = ingest::Caps {
        payloads: state
            .config
            .caps
            .get(&src.lane)
            .copied()
            .unwrap_or(u64::MAX),
        bytes: state
            .config
            .byte_caps
            .get(&src.lane)
            .copied()
            .unwrap_or(u64::MAX),
    };
    match ingest::enqueue(&mut state.redis.clone(), src.lane, &source, &body, caps).await {
        Ok(Intake::Accepted(id)) => {
            let lane = LaneLabel {
                lane: src.lane.as_str(),
            };
            state.payloads.get_or_create(&lane).inc();
            state.bytes.get_or_create(&lane).inc_by(body.len() as u64);
            (
                StatusCode::ACCEPTED,
                Json(serde_json::json!({ "event_id": id, "lane": src.lane })),
            )
                .into_response()
        }
        Ok(Intake::Full { backlog, bytes }) => ApiError::new(
            ErrorCode::LaneFull,
            format!(
                "the {} lane holds {backlog} payloads ({bytes} bytes); retry later",
                src.lane
            ),
        )
        .into_response(),
        Err(e) => ApiError::internal(&e).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lane_must_hold_the_largest_body() {
        let c = IngestConfig::parse(&[]).unwrap();
        assert!(c.clone().with_max_body(1024).is_ok());
        let err = c.with_caps(&[], &["feeds:1000".into()]).unwrap_err();
        assert!(err.contains("feeds"), "{err}");
        let err = IngestConfig::parse(&[])
            .unwrap()
            .with_max_body(100 * 1024 * 1024)
            .unwrap_err();
        assert!(err.contains("byte cap"), "{err}");
    }

    #[test]
    fn lane_caps_are_overridden_by_name_and_checked() {
        let c = IngestConfig::parse(&[])
            .unwrap()
            .with_caps(&["feeds:5".into()], &["orders:4194304".into()])
            .unwrap();
        assert_eq!(c.caps[&Lane::Feeds], 5);
        assert_eq!(c.caps[&Lane::Orders], 100_000, "others keep their default");
        assert_eq!(c.byte_caps[&Lane::Orders], 4_194_304);
        for bad in ["feeds", "nowhere:5", "feeds:0", "feeds:-1", "feeds:many"] {
            assert!(
                IngestConfig::parse(&[])
                    .unwrap()
                    .with_caps(&[bad.into()], &[])
                    .is_err(),
                "{bad}"
            );
        }
    }
}
