//! The checkout API under `/api/v1`: authenticated by API token, JSON in and out,
//! one status code per outcome. One file per resource.

pub mod auth;
pub mod error;
pub mod idempotency;
pub mod reservations;
pub mod soldout;
pub mod stock;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

use crate::state::AppState;

/// Largest request body the API accepts (a 20-line cart is well under 2 KiB).
pub const BODY_LIMIT: usize = 16 * 1024;

/// State the API keeps per process.
#[derive(Debug, Default)]
pub struct ApiState {
    /// Verified tokens.
    pub tokens: auth::TokenCache,
    /// SKUs that just sold out.
    pub sold_out: soldout::SoldOutCache,
}

/// The `/api/v1` routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/v1/reservations", post(reservations::create))
        .route("/api/v1/reservations/{id}", get(reservations::get))
        .route(
            "/api/v1/reservations/{id}/confirm",
            post(reservations::confirm),
        )
        .route(
            "/api/v1/reservations/{id}/release",
            post(reservations::release),
        )
        .route("/api/v1/stock", get(stock::many))
        .route("/api/v1/stock/{sku}", get(stock::get))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
}
