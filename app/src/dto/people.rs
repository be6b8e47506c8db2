//! Users, sessions, API tokens and the audit log, as the dashboard shows them.

use holdfast_domain::{Permission, Role};
use serde::{Deserialize, Serialize};

/// The signed-in user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Me {
    /// Login name.
    pub username: String,
    /// Role.
    pub role: Role,
    /// The password is a one-time password that must be replaced first.
    pub must_change_password: bool,
}

impl Me {
    /// Whether this user's role may do `what`.
    pub fn may(&self, what: Permission) -> bool {
        self.role.may(what)
    }
}

/// A user in the admin list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserView {
    /// Login name.
    pub username: String,
    /// Role.
    pub role: Role,
    /// Still on a one-time password.
    pub must_change_password: bool,
    /// RFC 3339.
    pub created_at: String,
}

/// An API token (never its secret, except once at creation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenView {
    /// Token id.
    pub id: i64,
    /// Name given at creation.
    pub name: String,
    /// Scopes (`checkout`, `ingest`, `read`).
    pub scopes: Vec<String>,
    /// RFC 3339.
    pub created_at: String,
    /// Whether it was revoked.
    pub revoked: bool,
}

/// A token just created, with its secret shown this once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewTokenView {
    /// The token.
    pub token: TokenView,
    /// The bearer secret; Holdfast keeps only its hash.
    pub secret: String,
}

/// One audit entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditView {
    /// Entry id.
    pub id: i64,
    /// Who.
    pub actor: String,
    /// What.
    pub action: String,
    /// To what.
    pub subject: String,
    /// Details as compact JSON.
    pub detail: String,
    /// RFC 3339.
    pub at: String,
}
