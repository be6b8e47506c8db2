//! `/api/v1/stock`: live figures for one SKU or many.

use axum::Json;
use axum::extract::{Path, Query, State};
use holdfast_app::dto::api::{ErrorBody, StockView};
use holdfast_domain::Scope;
use serde::Deserialize;

use super::ApiState;
use crate::http::auth::Caller;
use crate::http::error::ApiError;

/// Most SKUs one `GET /api/v1/stock?skus=` may ask for.
pub const MAX_SKUS: usize = 100;

fn readable(caller: &Caller) -> Result<(), ApiError> {
    if caller.0.allows(Scope::Read) {
        Ok(())
    } else {
        caller.require(Scope::Checkout)
    }
}

async fn one(state: &ApiState, sku: &str) -> Result<StockView, ApiError> {
    if !holdfast_engine::engine::valid_sku(sku) {
        return Err(ApiError::invalid(
            "sku",
            format!("'{sku}' is not a valid SKU code"),
        ));
    }
    let f = state
        .backends
        .engine
        .figures(sku)
        .await?
        .ok_or_else(|| ApiError::not_warmed(sku))?;
    Ok(StockView {
        sku: sku.to_owned(),
        available: f.available,
        reserved: f.reserved,
        sold_pending: f.sold_pending,
    })
}

/// `GET /api/v1/stock/{sku}`.
#[utoipa::path(
    get, path = "/api/v1/stock/{sku}", tag = "stock",
    params(("sku" = String, Path, description = "The SKU code")),
    responses(
        (status = 200, description = "Live figures", body = StockView),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "The token lacks the scope", body = ErrorBody),
        (status = 422, description = "Not a valid SKU code", body = ErrorBody),
        (status = 503, description = "Counter not warmed", body = ErrorBody),
    ),
    security(("token" = []))
)]
pub async fn get(
    State(state): State<ApiState>,
    caller: Caller,
    Path(sku): Path<String>,
) -> Result<Json<StockView>, ApiError> {
    readable(&caller)?;
    Ok(Json(one(&state, &sku).await?))
}

/// Query of `GET /api/v1/stock`.
#[derive(Debug, Deserialize)]
pub struct ManyQuery {
    /// Comma-separated SKU codes.
    pub skus: String,
}

/// `GET /api/v1/stock?skus=A,B`: every listed SKU that is warmed.
#[utoipa::path(
    get, path = "/api/v1/stock", tag = "stock",
    params(("skus" = String, Query, description = "Comma-separated SKU codes (1 to 100)")),
    responses(
        (status = 200, description = "Live figures of the warmed ones", body = Vec<StockView>),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "The token lacks the scope", body = ErrorBody),
        (status = 422, description = "No SKUs, too many, or an invalid code", body = ErrorBody),
    ),
    security(("token" = []))
)]
pub async fn many(
    State(state): State<ApiState>,
    caller: Caller,
    Query(q): Query<ManyQuery>,
) -> Result<Json<Vec<StockView>>, ApiError> {
    readable(&caller)?;
    let skus: Vec<&str> = q
        .skus
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if skus.is_empty() || skus.len() > MAX_SKUS {
        return Err(ApiError::invalid(
            "skus",
            format!("give 1 to {MAX_SKUS} comma-separated SKU codes"),
        ));
    }
    if let Some(bad) = skus.iter().find(|s| !holdfast_engine::engine::valid_sku(s)) {
        return Err(ApiError::invalid(
            "skus",
            format!("'{bad}' is not a valid SKU code"),
        ));
    }
    // Every SKU in one Redis round trip.
    let figures = state.backends.engine.figures_many(&skus).await?;
    let out = skus
        .iter()
        .zip(figures)
        .filter_map(|(sku, f)| {
            f.map(|f| StockView {
                sku: (*sku).to_owned(),
                available: f.available,
                reserved: f.reserved,
                sold_pending: f.sold_pending,
            })
        })
        .collect();
    Ok(Json(out))
}
