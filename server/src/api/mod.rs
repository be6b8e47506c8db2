//! The checkout API under `/api/v1`: authenticated by API token, JSON in and out,
//! one status code per outcome. One file per resource.

pub mod auth;
pub mod error;
pub mod idempotency;
pub mod ratelimit;
pub mod reservations;
pub mod soldout;
pub mod stock;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::get;

use crate::state::AppState;

/// Largest request body the API accepts (a 20-line cart is well under 2 KiB).
pub const BODY_LIMIT: usize = 16 * 1024;

/// State the API keeps per process.
#[derive(Debug)]
pub struct ApiState {
    /// Verified tokens.
    pub tokens: auth::TokenCache,
    /// SKUs that just sold out.
    pub sold_out: soldout::SoldOutCache,
    /// Requests per API token.
    pub per_token: ratelimit::RateLimiter,
    /// Webhooks per source.
    pub per_source: ratelimit::RateLimiter,
}

impl ApiState {
    /// State with these limits (requests per second per token, webhooks per second per source).
    pub fn with_limits(per_token: u32, per_source: u32) -> Self {
        Self {
            tokens: auth::TokenCache::default(),
            sold_out: soldout::SoldOutCache::default(),
            per_token: ratelimit::RateLimiter::new(ratelimit::Limit::per_second(per_token)),
            per_source: ratelimit::RateLimiter::new(ratelimit::Limit::per_second(per_source)),
        }
    }
}

impl Default for ApiState {
    fn default() -> Self {
        Self::with_limits(DEFAULT_TOKEN_RATE, DEFAULT_SOURCE_RATE)
    }
}

/// Default requests per second per API token.
pub const DEFAULT_TOKEN_RATE: u32 = 20_000;
/// Default webhooks per second per source.
pub const DEFAULT_SOURCE_RATE: u32 = 200;

/// 429 with `Retry-After`.
pub fn too_many(secs: u64) -> error::ApiError {
    error::ApiError::new(
        axum::http::StatusCode::TOO_MANY_REQUESTS,
        "rate_limited",
        format!("too many requests; retry in {secs} s"),
    )
    .retry_after(secs)
}

/// The OpenAPI document's frame; the paths come from the handlers' annotations.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(title = "Holdfast API", description = "Reservations and live stock for flash sales."),
    modifiers(&BearerToken),
    tags((name = "reservations", description = "Hold, confirm and release stock"), (name = "stock", description = "Live figures"))
)]
struct ApiDoc;

/// Declares the bearer-token scheme every operation uses.
struct BearerToken;

impl utoipa::Modify for BearerToken {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "token",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("hf_…")
                    .build(),
            ),
        );
    }
}

/// The `/api/v1` routes and their OpenAPI document, built together from the same
/// handler list so they cannot disagree.
pub fn router_and_doc() -> (Router<AppState>, utoipa::openapi::OpenApi) {
    use utoipa::OpenApi;
    use utoipa_axum::{router::OpenApiRouter, routes};
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(reservations::create))
        .routes(routes!(reservations::get))
        .routes(routes!(reservations::confirm))
        .routes(routes!(reservations::release))
        .routes(routes!(stock::many))
        .routes(routes!(stock::get))
        .split_for_parts()
}

/// The `/api/v1` routes, with the document served at `/api/v1/openapi.json`.
pub fn routes() -> Router<AppState> {
    let (router, doc) = router_and_doc();
    let doc = std::sync::Arc::new(doc);
    router
        .route(
            "/api/v1/openapi.json",
            get(move || {
                let doc = doc.clone();
                async move { axum::Json((*doc).clone()) }
            }),
        )
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
}
