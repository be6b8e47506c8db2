//! The error every HTTP area answers with: a typed [`ErrorCode`] (which fixes the
//! status and any `Retry-After`) and a JSON body `{code, message, field?, sku?,
//! available?}`. Engine errors are mapped here, once: logged, shown opaquely.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use holdfast_app::dto::api::ErrorBody;
use holdfast_domain::ErrorCode;
use holdfast_engine::EngineError;

/// A failed API call.
#[derive(Debug)]
pub struct ApiError {
    /// Why; fixes the HTTP status.
    pub code: ErrorCode,
    /// The body (boxed: errors travel through every `Result` of the hot path).
    pub body: Box<ErrorBody>,
    /// Seconds for `Retry-After`, when retrying later will help.
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// An error with `code` and `message`, and the code's own retry hint.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            body: Box::new(ErrorBody {
                code: code.as_str().into(),
                message: message.into(),
                field: None,
                sku: None,
                available: None,
                starts_at: None,
                ended_at: None,
                problems: Vec::new(),
            }),
            retry_after: code.retry_after(),
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
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

    /// 401: no valid token.
    pub fn unauthorized() -> Self {
        Self::new(
            ErrorCode::Unauthorized,
            "send a valid API token as `Authorization: Bearer hf_…` (create one with `holdfast token create`)",
        )
    }

    /// 403: the token lacks `scope`.
    pub fn forbidden(scope: &str) -> Self {
        Self::new(
            ErrorCode::Forbidden,
            format!("this token lacks the '{scope}' scope"),
        )
    }

    /// 422: a field is invalid.
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Invalid, message).field(field)
    }

    /// 404: no such thing.
    pub fn not_found(what: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, what)
    }

    /// 409: not enough stock; says how many are left.
    pub fn sold_out(sku: &str, available: i64) -> Self {
        let mut e = Self::new(
            ErrorCode::SoldOut,
            format!("{sku} has {available} unit(s) available, fewer than requested"),
        )
        .sku(sku);
        e.body.available = Some(available);
        e
    }

    /// 409: the SKU's drop has not started; says when it does.
    pub fn not_started(sku: &str, starts_at_ms: i64) -> Self {
        let at = crate::http::rfc3339(starts_at_ms).unwrap_or_default();
        let mut e = Self::new(
            ErrorCode::NotStarted,
            format!("the drop selling {sku} starts at {at}; try again then"),
        )
        .sku(sku);
        e.body.starts_at = Some(at);
        e
    }

    /// 409: the SKU's drop has ended.
    pub fn ended(sku: &str, ended_at_ms: i64) -> Self {
        let at = crate::http::rfc3339(ended_at_ms).unwrap_or_default();
        let mut e = Self::new(
            ErrorCode::Ended,
            format!("the drop selling {sku} ended at {at}"),
        )
        .sku(sku);
        e.body.ended_at = Some(at);
        e
    }

    /// 503: the SKU's counter is not in Redis yet (never a 409).
    pub fn not_warmed(sku: &str) -> Self {
        Self::new(
            ErrorCode::NotWarmed,
            format!(
                "stock for {sku} is not loaded yet; retry shortly (operators: run `holdfast warm`)"
            ),
        )
        .sku(sku)
    }

    /// 429 with `Retry-After: secs`.
    pub fn too_many(secs: u64) -> Self {
        let mut e = Self::new(
            ErrorCode::RateLimited,
            format!("too many requests; retry in {secs} s"),
        );
        e.retry_after = Some(secs);
        e
    }

    /// The answer for an engine failure: logged once here, shown opaquely.
    pub fn internal(e: &EngineError) -> Self {
        let code = e.code();
        // A moment's contention is the caller's to retry, not our failure.
        if matches!(
            code,
            ErrorCode::Busy | ErrorCode::RateLimited | ErrorCode::IdempotencyKeyReused
        ) {
            tracing::debug!(error = %e, "API request refused for the caller to change or retry");
        } else {
            tracing::error!(error = %e, "API request failed");
        }
        let message = match code {
            ErrorCode::Unavailable if matches!(e, EngineError::ReplicasBehind { .. }) => {
                e.to_string()
            }
            ErrorCode::Unavailable => "a backing service is unavailable; retry shortly".to_owned(),
            ErrorCode::Busy | ErrorCode::RateLimited | ErrorCode::IdempotencyKeyReused => {
                e.to_string()
            }
            _ => "something went wrong on our side".to_owned(),
        };
        let mut err = Self::new(code, message);
        if code == ErrorCode::IdempotencyKeyReused {
            err = err.field("Idempotency-Key");
        }
        err.retry_after = e.retry_after();
        err
    }

    /// The body as JSON text, as answered (and stored under an `Idempotency-Key`).
    pub fn body_json(&self) -> JsonText {
        json_text(&*self.body)
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        Self::internal(&e)
    }
}

/// An answer's JSON body, serialised once: straight from the handler's own
/// types to text, never through a `serde_json::Value` tree (a map and a
/// string per field, on every checkout call).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonText(String);

impl JsonText {
    /// The JSON text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// An answer's text as the idempotency store kept it (written by
    /// [`json_text`] when first sent).
    pub fn stored(text: String) -> Self {
        Self(text)
    }
}

/// `body` as [`JsonText`].
pub fn json_text(body: &(impl serde::Serialize + ?Sized)) -> JsonText {
    JsonText(serde_json::to_string(body).unwrap_or_else(|e| {
        // Only a map with non-string keys fails, and no answer has one.
        tracing::error!(error = %e, "an answer could not be serialised");
        "null".to_owned()
    }))
}

/// `status` with JSON `body` and, when given, `Retry-After`.
pub fn respond(status: StatusCode, body: JsonText, retry_after: Option<u64>) -> Response {
    let json = HeaderValue::from_static("application/json");
    let mut response = (status, [(header::CONTENT_TYPE, json)], body.0).into_response();
    if let Some(secs) = retry_after
        && let Ok(v) = HeaderValue::from_str(&secs.to_string())
    {
        response.headers_mut().insert(header::RETRY_AFTER, v);
    }
    response
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        respond(self.status(), self.body_json(), self.retry_after)
    }
}
