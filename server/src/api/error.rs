//! API errors: each maps to one status code and a JSON body `{code, message, field?}`.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use holdfast_app::dto::api::ErrorBody;
use holdfast_engine::EngineError;

/// A failed API call.
#[derive(Debug)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The body (boxed: errors travel through every `Result` of the hot path).
    pub body: Box<ErrorBody>,
    /// Seconds for `Retry-After`, when retrying later will help.
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// An error with `status`, `code` and `message`.
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            body: Box::new(ErrorBody {
                code: code.into(),
                message: message.into(),
                field: None,
                sku: None,
                available: None,
            }),
            retry_after: None,
        }
    }

    /// Names the request field at fault.
    pub fn field(mut self, field: impl Into<String>) -> Self {
        self.body.field = Some(field.into());
        self
    }

    /// Names the SKU concerned.
    pub fn sku(mut self, sku: impl Into<String>) -> Self {
        self.body.sku = Some(sku.into());
        self
    }

    /// Asks the client to retry after `secs`.
    pub fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }

    /// 401: no valid token.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "send a valid API token as `Authorization: Bearer hf_…` (create one with `holdfast token create`)",
        )
    }

    /// 403: the token lacks `scope`.
    pub fn forbidden(scope: &str) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("this token lacks the '{scope}' scope"),
        )
    }

    /// 422: a field is invalid.
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", message).field(field)
    }

    /// 404: no such thing.
    pub fn not_found(what: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", what)
    }

    /// 409: not enough stock; says how many are left.
    pub fn sold_out(sku: &str, available: i64) -> Self {
        let mut e = Self::new(
            StatusCode::CONFLICT,
            "sold_out",
            format!("{sku} has {available} unit(s) available, fewer than requested"),
        )
        .sku(sku);
        e.body.available = Some(available);
        e
    }

    /// 503: the SKU's counter is not in Redis yet (never a 409).
    pub fn not_warmed(sku: &str) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_warmed",
            format!(
                "stock for {sku} is not loaded yet; retry shortly (operators: run `holdfast warm`)"
            ),
        )
        .sku(sku)
        .retry_after(5)
    }

    /// 500: logged once here, shown opaquely.
    pub fn internal(e: &EngineError) -> Self {
        tracing::error!(error = %e, "API request failed");
        match e {
            EngineError::Redis(_) | EngineError::Postgres(_) => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "a backing service is unavailable; retry shortly",
            )
            .retry_after(2),
            _ => Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "something went wrong on our side",
            ),
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        Self::internal(&e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body)).into_response();
        if let Some(secs) = self.retry_after
            && let Ok(v) = HeaderValue::from_str(&secs.to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, v);
        }
        response
    }
}
