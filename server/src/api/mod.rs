//! The checkout API under `/api/v1`: authenticated by API token, JSON in and out,
//! one status code per outcome. One file per resource.

pub mod idempotent;
pub mod reservations;
pub mod soldout;
pub mod stock;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRef};
use axum::routing::get;
use holdfast_engine::Backends;

use crate::http::auth::TokenCheck;
use crate::http::deadline::Deadline;
use soldout::SoldOutCache;

/// Default largest request body the API accepts (a 20-line cart is well
/// under 2 KiB); `HOLDFAST_API_MAX_BODY_BYTES` changes it.
pub const DEFAULT_BODY_LIMIT: usize = 16 * 1024;

/// What the API's handlers work with.
#[derive(Clone)]
pub struct ApiState {
    /// PostgreSQL and Redis, through the engine.
    pub backends: Backends,
    /// SKUs that just sold out.
    pub sold_out: Arc<SoldOutCache>,
    /// Every request's deadline (the work under an `Idempotency-Key` gets
    /// slightly less).
    pub deadline: Deadline,
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
pub fn router_and_doc<S>() -> (Router<S>, utoipa::openapi::OpenApi)
where
    S: Clone + Send + Sync + 'static,
    ApiState: FromRef<S>,
    TokenCheck: FromRef<S>,
{
    use utoipa::OpenApi;
    use utoipa_axum::{router::OpenApiRouter, routes};
    OpenApiRouter::<S>::with_openapi(ApiDoc::openapi())
        .routes(routes!(reservations::create))
        .routes(routes!(reservations::get))
        .routes(routes!(reservations::confirm))
        .routes(routes!(reservations::release))
        .routes(routes!(stock::many))
        .routes(routes!(stock::get))
        .split_for_parts()
}

/// The `/api/v1` routes, with the document served at `/api/v1/openapi.json`;
/// bodies over `max_body` bytes are refused (413) and every request is answered
/// within `deadline`.
pub fn routes<S>(max_body: usize, deadline: Deadline) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    ApiState: FromRef<S>,
    TokenCheck: FromRef<S>,
{
    let (router, doc) = router_and_doc::<S>();
    let doc = Arc::new(doc);
    router
        .route(
            "/api/v1/openapi.json",
            get(move || {
                let doc = doc.clone();
                async move { axum::Json((*doc).clone()) }
            }),
        )
        .layer(DefaultBodyLimit::max(max_body))
        .layer(axum::middleware::map_response(
            move |response: axum::response::Response| async move {
                too_large_as_json(response, max_body)
            },
        ))
        .layer(axum::middleware::from_fn_with_state(
            deadline,
            crate::http::deadline::within_deadline,
        ))
}

/// The body-size refusal in the API's JSON error shape (the extractor's own is
/// plain text).
fn too_large_as_json(
    response: axum::response::Response,
    max_body: usize,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let plain = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_none_or(|t| !t.as_bytes().starts_with(b"application/json"));
    if response.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE && plain {
        return crate::http::error::ApiError::new(
            holdfast_domain::ErrorCode::PayloadTooLarge,
            format!("a request body is at most {max_body} bytes"),
        )
        .into_response();
    }
    response
}
