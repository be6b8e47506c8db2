//! Locks: who holds them, for how long, with which fencing token; force release.

use leptos::prelude::*;

use crate::dto::ops::LockView;

/// Every held lock.
#[server(endpoint = "list_locks")]
pub async fn list_locks() -> Result<Vec<LockView>, ServerFnError> {
    use holdfast_domain::Permission;

    use crate::server::{convert, guard};

    let caller = guard::authorize(Permission::View).await?;
    Ok(caller
        .backends
        .engine
        .list_locks()
        .await
        .map_err(guard::internal("Listing locks"))?
        .into_iter()
        .map(convert::lock_view)
        .collect())
}

/// Deletes a lock whatever its holder (admin). `confirm` must repeat the lock's
/// name. The next holder gets a higher fencing token, so writes of the old holder
/// are refused by PostgreSQL.
#[server(endpoint = "force_release_lock")]
pub async fn force_release_lock(name: String, confirm: String) -> Result<String, ServerFnError> {
    use holdfast_domain::Permission;
    use http::StatusCode;

    use crate::server::guard;

    let caller = guard::authorize(Permission::Operate).await?;
    if confirm.trim() != name {
        return Err(guard::refuse(
            StatusCode::BAD_REQUEST,
            format!("Type the lock's name ({name}) to confirm the force release."),
        ));
    }
    let holder = caller
        .backends
        .engine
        .list_locks()
        .await
        .map_err(guard::internal("Reading the lock"))?
        .into_iter()
        .find(|l| l.name == name);
    let released = caller
        .backends
        .engine
        .force_release_lock(&name)
        .await
        .map_err(guard::internal("Releasing the lock"))?;
    if !released {
        return Err(guard::refuse(
            StatusCode::NOT_FOUND,
            format!("Lock {name} is not held (it may have just lapsed)."),
        ));
    }
    guard::audit(
        &caller,
        "force_release_lock",
        &name,
        serde_json::json!({
            "holder": holder.as_ref().map(|h| h.holder.clone()),
            "fence": holder.as_ref().map(|h| h.fence),
        }),
    )
    .await;
    Ok(format!(
        "Lock {name} released; its holder's fencing token is now stale."
    ))
}
