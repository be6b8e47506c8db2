//! Finding holds by reservation id or buyer, and late-payment remediations.

use leptos::prelude::*;

use crate::dto::holds::HoldSearch;

/// Holds whose reservation id is `query`, or open holds of buyer `query` on the
/// catalogue's drops; remediations whose reservation id contains it (the newest
/// ones when `query` is empty).
#[server(endpoint = "search_holds")]
pub async fn search_holds(query: String) -> Result<HoldSearch, ServerFnError> {
    use holdfast_engine::users::Role;
    use holdfast_engine::{catalog, remediation};

    use crate::server::{convert, guard};

    let caller = guard::authorize(Role::Viewer).await?;
    let b = &caller.backends;
    let internal = guard::internal("Searching holds");
    let query = query.trim().to_owned();
    let mut holds = Vec::new();
    if !query.is_empty() {
        if let Some(hold) = b.engine.hold(&query).await.map_err(&internal)? {
            holds.push(convert::hold_view(hold));
        } else {
            // Buyers are not indexed across SKUs; the drops' SKUs are few, so
            // their open holds are searched directly.
            let mut seen = std::collections::HashSet::new();
            for sku in catalog::all_drop_skus(&b.pg).await.map_err(&internal)? {
                for hold in b.engine.holds_of(&sku, 5_000).await.map_err(&internal)? {
                    if hold.buyer.as_deref() == Some(query.as_str())
                        && seen.insert(hold.reservation_id.clone())
                    {
                        holds.push(convert::hold_view(hold));
                    }
                }
            }
        }
    }
    let remediations = remediation::list(&b.pg, Some(&query), 50)
        .await
        .map_err(&internal)?
        .into_iter()
        .map(convert::remediation_view)
        .collect();
    Ok(HoldSearch {
        holds,
        remediations,
        server_now_ms: chrono::Utc::now().timestamp_millis(),
    })
}
