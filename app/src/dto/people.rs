//! Users, sessions, API tokens and the audit log, as the dashboard shows them.

use serde::{Deserialize, Serialize};

/// What a user may do; each includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoleView {
    /// Read-only.
    Viewer,
    /// May release holds.
    Support,
    /// Everything.
    Admin,
}

impl RoleView {
    /// The role's name as typed and stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Viewer => "viewer",
            Self::Support => "support",
            Self::Admin => "admin",
        }
    }

    /// Parses a role name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "viewer" => Some(Self::Viewer),
            "support" => Some(Self::Support),
            "admin" => Some(Self::Admin),
            _ => None,
        }
    }
}

/// The signed-in user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Me {
    /// Login name.
    pub username: String,
    /// Role.
    pub role: RoleView,
    /// The password is a one-time password that must be replaced first.
    pub must_change_password: bool,
}

impl Me {
    /// Whether this user has at least `role`.
    pub fn can(&self, role: RoleView) -> bool {
        self.role >= role
    }
}

/// A user in the admin list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserView {
    /// Login name.
    pub username: String,
    /// Role.
    pub role: RoleView,
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
