//! The audit log of manual actions.

use leptos::prelude::*;

use crate::dto::people::AuditView;

/// Up to 100 entries older than `before` (newest when `None`), newest first,
/// filtered by `search` on actor, action or subject (admin).
#[server(endpoint = "audit_log")]
pub async fn audit_log(
    search: String,
    before: Option<i64>,
) -> Result<Vec<AuditView>, ServerFnError> {
    use holdfast_domain::Permission;

    use crate::server::{convert, guard};

    let caller = guard::authorize(Permission::Operate).await?;
    Ok(
        holdfast_engine::audit::recent(&caller.backends.pg, Some(&search), before, 100)
            .await
            .map_err(guard::internal("Reading the audit log"))?
            .into_iter()
            .map(convert::audit_view)
            .collect(),
    )
}
