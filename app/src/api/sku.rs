//! One SKU: figures, open holds and recent events; releasing a hold.

use leptos::prelude::*;

use crate::dto::holds::SkuDetail;

/// Everything the SKU page shows.
#[server(endpoint = "sku_detail")]
pub async fn load_sku_detail(sku: String) -> Result<SkuDetail, ServerFnError> {
    use holdfast_domain::Permission;
    use holdfast_engine::{catalog, events};

    use crate::server::{convert, guard};

    let caller = guard::authorize(Permission::View).await?;
    let b = &caller.backends;
    let internal = guard::internal("Reading the SKU");
    let Some(record) = catalog::sku(&b.pg, &sku).await.map_err(&internal)? else {
        return Err(guard::refuse(
            http::StatusCode::NOT_FOUND,
            format!("There is no SKU {sku}."),
        ));
    };
    let figures = convert::figures_of(b, std::slice::from_ref(&sku))
        .await
        .map_err(&internal)?
        .remove(0);
    let holds = b.engine.holds_of(&sku, 200).await.map_err(&internal)?;
    let recent = events::recent_for_sku(&b.engine, &sku, 50, 5_000)
        .await
        .map_err(&internal)?;
    let parts = b.engine.part_figures(&sku).await.map_err(&internal)?;
    Ok(SkuDetail {
        title: record.title,
        product: record.product,
        figures,
        on_hand: record.on_hand,
        per_buyer_limit: record.per_buyer_limit.map_or(0, i64::from),
        holds: holds.into_iter().map(convert::hold_view).collect(),
        events: recent.iter().map(convert::event_view).collect(),
        server_now_ms: chrono::Utc::now().timestamp_millis(),
        part_available: parts.iter().map(|f| f.available).collect(),
    })
}

/// Splits a SKU's stock into `parts` parts on as many Redis shards (admin),
/// between drops; recorded in the audit log.
#[server(endpoint = "split_sku")]
pub async fn split_sku(sku: String, parts: u16) -> Result<String, ServerFnError> {
    use holdfast_domain::Permission;
    use holdfast_engine::SplitOutcome;
    use http::StatusCode;

    use crate::server::guard;

    let caller = guard::authorize(Permission::Operate).await?;
    let b = &caller.backends;
    let outcome = b
        .engine
        .set_parts(&b.pg, &sku, parts)
        .await
        .map_err(guard::internal("Splitting the SKU"))?;
    match outcome {
        SplitOutcome::Changed { from, to } => {
            guard::audit(
                &caller,
                "split_sku",
                &sku,
                serde_json::json!({ "from": from, "to": to }),
            )
            .await;
            Ok(format!("{sku} is now in {to} part(s) (was {from})."))
        }
        SplitOutcome::Unchanged => Ok(format!("{sku} already has {parts} part(s).")),
        SplitOutcome::Refused(why) => Err(guard::refuse(StatusCode::CONFLICT, why)),
        SplitOutcome::NotWarmed => Err(guard::refuse(
            StatusCode::CONFLICT,
            format!("{sku} has no counter in Redis: warm it first."),
        )),
        SplitOutcome::Invalid(why) => Err(guard::refuse(StatusCode::BAD_REQUEST, why)),
    }
}

/// Releases a hold (support role), returning its units to `available`; recorded
/// in the audit log with the reason.
#[server(endpoint = "release_hold")]
pub async fn release_hold(reservation_id: String, reason: String) -> Result<String, ServerFnError> {
    use holdfast_domain::Permission;
    use holdfast_engine::model::ReleaseOutcome;
    use http::StatusCode;

    use crate::server::guard;

    let caller = guard::authorize(Permission::ReleaseHolds).await?;
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(guard::refuse(
            StatusCode::BAD_REQUEST,
            "Give a reason for releasing the hold; it goes into the audit log.",
        ));
    }
    let outcome = caller
        .backends
        .engine
        .release(&reservation_id)
        .await
        .map_err(guard::internal("Releasing the hold"))?;
    let message = match &outcome {
        ReleaseOutcome::Released => {
            format!("Released {reservation_id}; its units are available again.")
        }
        ReleaseOutcome::AlreadyGone { state } => {
            return Err(guard::refuse(
                StatusCode::CONFLICT,
                format!(
                    "{reservation_id} had already ended ({}); nothing was changed.",
                    state.as_str()
                ),
            ));
        }
        ReleaseOutcome::Unknown => {
            return Err(guard::refuse(
                StatusCode::NOT_FOUND,
                format!("There is no hold {reservation_id}."),
            ));
        }
    };
    guard::audit(
        &caller,
        "release_hold",
        &reservation_id,
        serde_json::json!({ "reason": reason }),
    )
    .await;
    Ok(message)
}
