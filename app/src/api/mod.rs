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

/// Every role-checked server function with the least role it needs, as
/// `(endpoint path, role)`. The tests walk this list to prove each refuses
/// callers below that role and cross-site calls.
pub const GUARDED: &[(&str, holdfast_domain::Role)] = {
    use holdfast_domain::Role::{Admin, Support, Viewer};
    &[
        ("/api/drop_overview", Viewer),
        ("/api/sku_detail", Viewer),
        ("/api/search_holds", Viewer),
        ("/api/release_hold", Support),
        ("/api/list_locks", Viewer),
        ("/api/force_release_lock", Admin),
        ("/api/ingestion_status", Viewer),
        ("/api/set_lane_paused", Admin),
        ("/api/replay_dead_letter", Admin),
        ("/api/operations_status", Viewer),
        ("/api/start_reconcile", Admin),
        ("/api/start_warmup", Admin),
        ("/api/verify_now", Admin),
        ("/api/deployment_checks", Admin),
        ("/api/manual_reserve", Admin),
        ("/api/audit_log", Admin),
        ("/api/list_users", Admin),
        ("/api/create_user", Admin),
        ("/api/set_user_role", Admin),
        ("/api/delete_user", Admin),
        ("/api/list_tokens", Admin),
        ("/api/create_token", Admin),
        ("/api/revoke_token", Admin),
    ]
};
