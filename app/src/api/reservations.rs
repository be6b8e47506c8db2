//! Finding holds by reservation id or buyer, and late-payment remediations.

use leptos::prelude::*;

use crate::dto::holds::HoldSearch;

/// Holds whose reservation id is `query`, or open holds of buyer `query` on the
/// catalogue's drops; remediations whose reservation id contains it (the newest
/// ones when `query` is empty).
#[server(endpoint = "search_holds")]
pub async fn search_holds(query: String) -> Result<HoldSearch, ServerFnError> {
    use holdfast_domain::Permission;
    use holdfast_engine::{checkout, remediation};

    use crate::server::{convert, guard};

    let caller = guard::authorize(Permission::View).await?;
    let b = &caller.backends;
    let internal = guard::internal("Searching holds");
    let query = query.trim().to_owned();
    let holds = checkout::find_holds(b, &query)
        .await
        .map_err(&internal)?
        .into_iter()
        .map(convert::hold_view)
        .collect();
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
