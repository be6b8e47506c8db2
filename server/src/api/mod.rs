//! The checkout API under `/api/v1`: authenticated by API token, JSON in and out,
//! one status code per outcome. One file per resource.

pub mod drops;
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

/// What the API's handlers work with: built once, a reference count to clone
/// for each request.
#[derive(Clone)]
pub struct ApiState(Arc<ApiParts>);

impl ApiState {
    /// The API's state over `backends`.
    pub fn new(backends: Backends, sold_out: Arc<SoldOutCache>, deadline: Deadline) -> Self {
        Self(Arc::new(ApiParts {
            backends,
            sold_out,
            deadline,
        }))
    }
}

impl std::ops::Deref for ApiState {
    type Target = ApiParts;

    fn deref(&self) -> &ApiParts {
        &self.0
    }
}

/// What [`ApiState`] holds.
pub struct ApiParts {
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
    tags(
        (name = "reservations", description = "Hold, confirm and release stock"),
        (name = "stock", description = "Live figures"),
        (name = "drops", description = "Drops and their SKUs, pushed by a PIM or ERP"),
    )
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
        .merge(
            // A whole drop is a bigger body than any checkout call.
            OpenApiRouter::<S>::new()
                .routes(routes!(drops::put, drops::get))
                .routes(routes!(drops::report))
                .layer(DefaultBodyLimit::max(drops::BODY_LIMIT)),
        )
        .split_for_parts()
}

/// Whether `path` is one of the bulk routes (a whole drop file): a larger
/// body limit ([`drops::BODY_LIMIT`]) and the bulk deadline apply.
fn is_bulk(path: &str) -> bool {
    path.starts_with("/api/v1/drops/")
}

/// The `/api/v1` routes, with the document served at `/api/v1/openapi.json`;
/// bodies over `max_body` bytes are refused (413) and every request is answered
/// within `deadline`, a bulk route's within `bulk` (see [`Deadline::bulk`]).
pub fn routes<S>(max_body: usize, deadline: Deadline, bulk: Deadline) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    ApiState: FromRef<S>,
    TokenCheck: FromRef<S>,
{
    let (router, doc) = router_and_doc::<S>();
    // Serialised once: anyone may fetch it, as often as they like.
    let doc = axum::body::Bytes::from(serde_json::to_vec(&doc).unwrap_or_default());
    router
        .route(
            "/api/v1/openapi.json",
            get(move || {
                let doc = doc.clone();
                async move {
                    (
                        [(axum::http::header::CONTENT_TYPE, "application/json")],
                        doc,
                    )
                }
            }),
        )
        .layer(DefaultBodyLimit::max(max_body))
        .layer(axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| async move {
                // The limit of the route asked, so a 413 names the one that applies.
                let limit = if is_bulk(request.uri().path()) {
                    drops::BODY_LIMIT
                } else {
                    max_body
                };
                rejection_as_json(next.run(request).await, limit).await
            },
        ))
        .layer(axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| {
                let deadline = if is_bulk(request.uri().path()) {
                    bulk
                } else {
                    deadline
                };
                crate::http::deadline::run_within(deadline, request, next)
            },
        ))
}

/// A refusal the body extractors made (plain text) in the API's JSON error
/// shape: 413 `payload_too_large` (naming `max_body`, the route's limit), 422
/// `invalid`, other 4xx `bad_request`, with the extractor's own explanation.
async fn rejection_as_json(
    response: axum::response::Response,
    max_body: usize,
) -> axum::response::Response {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    use holdfast_domain::ErrorCode;
    let plain = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|t| t.as_bytes().starts_with(b"text/plain"));
    let status = response.status();
    if !plain || !matches!(status.as_u16(), 400 | 413 | 415 | 422) {
        return response;
    }
    let code = match status {
        StatusCode::PAYLOAD_TOO_LARGE => {
            return crate::http::error::ApiError::new(
                ErrorCode::PayloadTooLarge,
                format!("this request's body is at most {max_body} bytes"),
            )
            .into_response();
        }
        StatusCode::UNPROCESSABLE_ENTITY => ErrorCode::Invalid,
        _ => ErrorCode::BadRequest,
    };
    let text = axum::body::to_bytes(response.into_body(), 2_048)
        .await
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    crate::http::error::ApiError::new(code, text).into_response()
}
