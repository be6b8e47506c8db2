//! `/api/v1/drops/{code}`: a PIM or ERP pushes a whole drop (`PUT`, scope
//! `catalog`) and reads it back (`GET`). The body is the drop file's JSON form,
//! or its CSV form with `Content-Type: text/csv`; `?dry_run=true` answers
//! what would change and changes nothing.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use holdfast_app::dto::api::ErrorBody;
use holdfast_domain::report::DropReport;
use holdfast_domain::sheet::{DropSheet, ImportReport, Problem};
use holdfast_domain::{ErrorCode, Scope};
use holdfast_engine::drop_file::{self, Format, ImportOutcome};
use serde::Deserialize;

use super::ApiState;
use crate::http::auth::Caller;
use crate::http::error::ApiError;

/// Largest drop file `PUT` takes: the engine's bound on a drop file.
pub const BODY_LIMIT: usize = drop_file::MAX_FILE_BYTES;

/// Query of `PUT /api/v1/drops/{code}`.
#[derive(Debug, Deserialize)]
pub struct PutQuery {
    /// Answer what would change, change nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// Why, for the audit log and each stock change.
    pub reason: Option<String>,
}

/// 422 naming every problem of the file.
fn refused(problems: Vec<Problem>) -> ApiError {
    let mut e = ApiError::new(
        ErrorCode::Invalid,
        format!(
            "the drop file was refused ({} problem(s)); nothing changed",
            problems.len()
        ),
    );
    e.body.problems = problems;
    e
}

/// `PUT /api/v1/drops/{code}`: creates or updates the drop as the body says.
#[utoipa::path(
    put, path = "/api/v1/drops/{code}", tag = "drops",
    params(
        ("code" = String, Path, description = "The drop's code"),
        ("dry_run" = Option<bool>, Query, description = "Answer what would change; change nothing"),
        ("reason" = Option<String>, Query, description = "Why, for the audit log"),
    ),
    request_body(content = DropSheet, description = "The drop (JSON), or its CSV form as text/csv"),
    responses(
        (status = 200, description = "Imported (or previewed): every change", body = ImportReport),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "The token lacks the catalog scope", body = ErrorBody),
        (status = 413, description = "Over 4 MiB", body = ErrorBody),
        (status = 422, description = "Refused, nothing changed: `problems` names each by line and column", body = ErrorBody),
        (status = 503, description = "Recorded, but the live counters could not all be set: send it again", body = ErrorBody),
    ),
    security(("token" = []))
)]
pub async fn put(
    State(state): State<ApiState>,
    caller: Caller,
    Path(code): Path<String>,
    Query(q): Query<PutQuery>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<ImportReport>, ApiError> {
    caller.require(Scope::Catalog)?;
    let csv = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|t| t.to_ascii_lowercase())
        .is_some_and(|t| t.starts_with("text/csv") || t.starts_with("application/csv"));
    let text = std::str::from_utf8(&body)
        .map_err(|_| ApiError::new(ErrorCode::BadRequest, "the body is not UTF-8 text"))?;
    let format = if csv { Format::Csv } else { Format::Json };
    let (mut sheet, lines) = drop_file::parse(text, format).map_err(refused)?;
    if sheet.code.is_empty() {
        sheet.code = code.clone();
    } else if sheet.code != code {
        return Err(ApiError::invalid(
            "code",
            format!("the body is drop '{}', the path names '{code}'", sheet.code),
        ));
    }
    if q.reason.as_deref().is_some_and(|r| r.contains('\0')) {
        return Err(ApiError::invalid("reason", "holds a NUL character"));
    }
    let reason = q.reason.unwrap_or_else(|| "PUT /api/v1/drops".to_owned());
    // Runs to its end even if the answer's deadline passes first: a sent file
    // is then wholly imported (or refused), and sending it again changes nothing.
    match drop_file::import_to_the_end(
        state.backends.clone(),
        sheet,
        lines,
        format!("token:{}", caller.0.name),
        reason,
        q.dry_run,
    )
    .await?
    {
        ImportOutcome::Done(report) => Ok(Json(report)),
        ImportOutcome::Refused(problems) => Err(refused(problems)),
    }
}

/// Query of `GET /api/v1/drops/{code}/report`.
#[derive(Debug, Deserialize)]
pub struct ReportQuery {
    /// `csv` for CSV, `json` (the default) for JSON.
    pub format: Option<String>,
}

/// `GET /api/v1/drops/{code}/report`: per SKU, what sold and how every hold ended.
#[utoipa::path(
    get, path = "/api/v1/drops/{code}/report", tag = "drops",
    params(
        ("code" = String, Path, description = "The drop's code"),
        ("format" = Option<String>, Query, description = "`csv` for CSV (text/csv), `json` (the default) for JSON; anything else is 400"),
    ),
    responses(
        (status = 200, description = "The report", body = DropReport),
        (status = 400, description = "A format other than csv or json", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "The token has neither the catalog nor the read scope", body = ErrorBody),
        (status = 404, description = "No such drop", body = ErrorBody),
    ),
    security(("token" = []))
)]
pub async fn report(
    State(state): State<ApiState>,
    caller: Caller,
    Path(code): Path<String>,
    Query(q): Query<ReportQuery>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    if !caller.0.allows(Scope::Read) {
        caller.require(Scope::Catalog)?;
    }
    let csv = match q.format.as_deref() {
        None | Some("json") => false,
        Some("csv") => true,
        Some(other) => {
            return Err(ApiError::new(
                ErrorCode::BadRequest,
                format!("format '{other}' is not one of csv, json"),
            ));
        }
    };
    let report = holdfast_engine::report::drop_report(&state.backends.pg, &code)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no drop has the code '{code}'")))?;
    Ok(if csv {
        (
            [(axum::http::header::CONTENT_TYPE, "text/csv; charset=utf-8")],
            report.to_csv(),
        )
            .into_response()
    } else {
        Json(report).into_response()
    })
}

/// `GET /api/v1/drops/{code}`: the drop as `PUT` takes it back unchanged.
#[utoipa::path(
    get, path = "/api/v1/drops/{code}", tag = "drops",
    params(("code" = String, Path, description = "The drop's code")),
    responses(
        (status = 200, description = "The drop", body = DropSheet),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "The token has neither the catalog nor the read scope", body = ErrorBody),
        (status = 404, description = "No such drop", body = ErrorBody),
    ),
    security(("token" = []))
)]
pub async fn get(
    State(state): State<ApiState>,
    caller: Caller,
    Path(code): Path<String>,
) -> Result<Json<DropSheet>, ApiError> {
    if !caller.0.allows(Scope::Read) {
        caller.require(Scope::Catalog)?;
    }
    drop_file::export(&state.backends.pg, &code)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("no drop has the code '{code}'")))
}
