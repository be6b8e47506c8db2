//! Server functions, one file per area. Each runs on the server, where it first
//! checks the caller's role (`crate::server::guard`), and is called over HTTP
//! from the browser. Errors carry a message the page shows as it is.

// `#[server]` generates a public struct per function whose fields are the
// function's arguments; Rust gives no way to document those fields.
#[allow(missing_docs)]
pub mod admin;
#[allow(missing_docs)]
pub mod audit;
#[allow(missing_docs)]
pub mod auth;
#[allow(missing_docs)]
pub mod drops;
#[allow(missing_docs)]
pub mod ingestion;
#[allow(missing_docs)]
pub mod locks;
#[allow(missing_docs)]
pub mod operations;
#[allow(missing_docs)]
pub mod overview;
#[allow(missing_docs)]
pub mod reservations;
#[allow(missing_docs)]
pub mod reserve;
#[allow(missing_docs)]
pub mod sku;

/// Every guarded server function with the permission it needs, as
/// `(endpoint path, permission)`. The tests walk this list to prove each refuses
/// every role without that permission, and cross-site calls.
pub const GUARDED: &[(&str, holdfast_domain::Permission)] = {
    use holdfast_domain::Permission::{EditDrops, ManageAccess, Operate, ReleaseHolds, View};
    &[
        ("/api/drop_overview", View),
        ("/api/sku_detail", View),
        ("/api/search_holds", View),
        ("/api/release_hold", ReleaseHolds),
        ("/api/split_sku", Operate),
        ("/api/list_locks", View),
        ("/api/force_release_lock", Operate),
        ("/api/ingestion_status", View),
        ("/api/set_lane_paused", Operate),
        ("/api/replay_dead_letter", Operate),
        ("/api/operations_status", View),
        ("/api/start_reconcile", Operate),
        ("/api/start_warmup", Operate),
        ("/api/verify_now", Operate),
        ("/api/deployment_checks", Operate),
        ("/api/manual_reserve", Operate),
        ("/api/audit_log", Operate),
        ("/api/import_drop", EditDrops),
        ("/api/export_drop", EditDrops),
        ("/api/drop_readiness", View),
        ("/api/arm_drop", EditDrops),
        ("/api/drop_report", View),
        ("/api/list_users", ManageAccess),
        ("/api/create_user", ManageAccess),
        ("/api/set_user_role", ManageAccess),
        ("/api/delete_user", ManageAccess),
        ("/api/list_tokens", ManageAccess),
        ("/api/create_token", ManageAccess),
        ("/api/revoke_token", ManageAccess),
    ]
};
