//! The operators' reserve tool: a hold made by hand through the same Lua-backed
//! core as checkout.

use leptos::prelude::*;

/// Reserves `qty` units of `sku` (admin) for an optional buyer and TTL, and says
/// what the engine decided. The reservation id is generated and returned in the
/// message so the hold can be found and released.
#[server(endpoint = "manual_reserve")]
pub async fn manual_reserve(
    sku: String,
    qty: i64,
    buyer: Option<String>,
    ttl_secs: Option<u64>,
) -> Result<String, ServerFnError> {
    use holdfast_domain::Permission;
    use holdfast_engine::model::{ReserveOutcome, ReserveRequest};
    use http::StatusCode;

    use crate::server::guard;

    let caller = guard::authorize(Permission::Operate).await?;
    let sku = sku.trim().to_owned();
    let rid = format!("manual-{}", uuid_like());
    let mut req = ReserveRequest::single(&rid, &sku, qty);
    if let Some(buyer) = buyer.map(|b| b.trim().to_owned()).filter(|b| !b.is_empty()) {
        req = req.for_buyer(buyer);
    }
    if let Some(ttl) = ttl_secs.filter(|t| *t > 0) {
        req = req.with_ttl_ms(ttl.saturating_mul(1_000));
    }
    let outcome = caller
        .backends
        .engine
        .reserve(&req)
        .await
        .map_err(guard::internal("Reserving"))?;
    let refused = |status, message: String| Err(guard::refuse(status, message));
    let message = match outcome {
        ReserveOutcome::Reserved { expires_at_ms, .. }
        | ReserveOutcome::AlreadyReserved { expires_at_ms, .. } => {
            let secs = (expires_at_ms - chrono::Utc::now().timestamp_millis()).max(0) / 1_000;
            format!(
                "Held {qty} of {sku} as {rid}; it expires in {secs} s unless confirmed or released."
            )
        }
        ReserveOutcome::SoldOut { sku, available, .. } => {
            return refused(
                StatusCode::CONFLICT,
                format!("Not enough stock: {sku} has {available} available."),
            );
        }
        ReserveOutcome::NotWarmed { sku } => {
            return refused(
                StatusCode::CONFLICT,
                format!("{sku} has no Redis counter yet; run a warm-up first."),
            );
        }
        ReserveOutcome::NotStarted { sku, starts_at_ms } => {
            return refused(
                StatusCode::CONFLICT,
                format!("The drop selling {sku} starts at {}.", utc(starts_at_ms)),
            );
        }
        ReserveOutcome::Ended { sku, ended_at_ms } => {
            return refused(
                StatusCode::CONFLICT,
                format!("The drop selling {sku} ended at {}.", utc(ended_at_ms)),
            );
        }
        ReserveOutcome::LimitExceeded { sku, limit, .. } => {
            return refused(
                StatusCode::CONFLICT,
                format!("This buyer reached the limit of {limit} for {sku}."),
            );
        }
        ReserveOutcome::BuyerRequired { sku, limit } => {
            return refused(
                StatusCode::BAD_REQUEST,
                format!("{sku} is limited to {limit} per buyer: name the buyer."),
            );
        }
        ReserveOutcome::Invalid(i) => {
            return refused(
                StatusCode::BAD_REQUEST,
                format!("{}: {}", i.field, i.message),
            );
        }
        ReserveOutcome::Conflict { reservation_id } => {
            return refused(
                StatusCode::CONFLICT,
                format!("{reservation_id} was already used for another request."),
            );
        }
    };
    guard::audit(
        &caller,
        "manual_reserve",
        &rid,
        serde_json::json!({ "sku": sku, "qty": qty }),
    )
    .await;
    Ok(message)
}

#[cfg(feature = "ssr")]
fn uuid_like() -> String {
    let secret = holdfast_engine::users::random_secret();
    secret[..12].to_owned()
}

/// Unix milliseconds as a person reads them: `2026-12-01 09:00:00 UTC`.
#[cfg(feature = "ssr")]
fn utc(ms: i64) -> String {
    let at = chrono::DateTime::from_timestamp_millis(ms).unwrap_or_default();
    at.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}
