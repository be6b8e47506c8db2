//! Who may do what: dashboard roles and API token scopes.

use serde::{Deserialize, Serialize};

/// What a dashboard user may do: each server function and page needs one
/// [`Permission`], and each role has a fixed set of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Looks at everything, changes nothing.
    Viewer,
    /// Support staff: may also release holds.
    Support,
    /// Merchandising: may also set up drops and their stock (import and export
    /// drop files); not holds, locks, users or tokens.
    Merchandiser,
    /// Operators: everything, including locks, warm-up, users and tokens.
    Admin,
}

/// One thing a dashboard user may be allowed to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Permission {
    /// See every page: drops, SKUs, holds, locks, lanes, operations.
    View,
    /// Release a shopper's hold.
    ReleaseHolds,
    /// Set up drops and their stock: import and export drop files.
    EditDrops,
    /// Run the machinery: locks, lanes, warm-up, reconciliation, verification,
    /// deployment checks, manual reservations, the audit log.
    Operate,
    /// Users and API tokens.
    ManageAccess,
}

impl Permission {
    /// Every permission.
    pub const ALL: [Permission; 5] = [
        Permission::View,
        Permission::ReleaseHolds,
        Permission::EditDrops,
        Permission::Operate,
        Permission::ManageAccess,
    ];

    /// What it allows, as a refusal names it.
    pub fn describe(self) -> &'static str {
        match self {
            Self::View => "viewing the dashboard",
            Self::ReleaseHolds => "releasing holds",
            Self::EditDrops => "setting up drops",
            Self::Operate => "operating Holdfast",
            Self::ManageAccess => "managing users and tokens",
        }
    }
}

impl Role {
    /// Every role.
    pub const ALL: [Role; 4] = [Role::Viewer, Role::Support, Role::Merchandiser, Role::Admin];

    /// The name stored in the database and typed on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Viewer => "viewer",
            Self::Support => "support",
            Self::Merchandiser => "merchandiser",
            Self::Admin => "admin",
        }
    }

    /// Parses a role name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }

    /// What this role may do. The one place roles are given permissions.
    pub fn permissions(self) -> &'static [Permission] {
        use Permission::*;
        match self {
            Self::Viewer => &[View],
            Self::Support => &[View, ReleaseHolds],
            Self::Merchandiser => &[View, EditDrops],
            Self::Admin => &Permission::ALL,
        }
    }

    /// Whether this role may do `what`.
    pub fn may(self, what: Permission) -> bool {
        self.permissions().contains(&what)
    }
}

/// What an API token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Reserve, confirm and release (the checkout service).
    Checkout,
    /// Push supplier and ERP webhooks.
    Ingest,
    /// Read stock and reservations.
    Read,
    /// Create and update drops and their SKUs (`PUT /api/v1/drops/{code}`), for
    /// a PIM or ERP.
    Catalog,
}

impl Scope {
    /// Every scope.
    pub const ALL: [Scope; 4] = [Scope::Checkout, Scope::Ingest, Scope::Read, Scope::Catalog];

    /// The name used in the database and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Checkout => "checkout",
            Self::Ingest => "ingest",
            Self::Read => "read",
            Self::Catalog => "catalog",
        }
    }

    /// Parses a scope name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|sc| sc.as_str() == s)
    }

    /// Parses a comma-separated or listed set of scope names (blanks ignored),
    /// naming the first unknown one in the error.
    pub fn parse_list<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<Vec<Self>, String> {
        let mut scopes = Vec::new();
        for name in names.into_iter().flat_map(|n| n.split(',')) {
            let name = name.trim();
            if name.is_empty() {
                continue;
            }
            let scope = Self::parse(name).ok_or_else(|| {
                format!("unknown scope '{name}': use checkout, ingest, read or catalog")
            })?;
            if !scopes.contains(&scope) {
                scopes.push(scope);
            }
        }
        Ok(scopes)
    }

    /// `scopes` as the comma-separated list people type.
    pub fn join(scopes: &[Scope]) -> String {
        scopes
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_permissions_and_parse() {
        assert!(Permission::ALL.iter().all(|p| Role::Admin.may(*p)));
        assert!(Role::Support.may(Permission::ReleaseHolds));
        assert!(!Role::Support.may(Permission::EditDrops));
        assert!(Role::Merchandiser.may(Permission::EditDrops));
        assert!(!Role::Merchandiser.may(Permission::ReleaseHolds));
        assert!(!Role::Merchandiser.may(Permission::ManageAccess));
        assert!(Role::ALL.iter().all(|r| r.may(Permission::View)));
        for r in Role::ALL {
            assert_eq!(Role::parse(r.as_str()), Some(r));
        }
        assert_eq!(Role::parse("root"), None);
    }

    #[test]
    fn scope_lists() {
        assert_eq!(
            Scope::parse_list(["checkout, read", "read"]),
            Ok(vec![Scope::Checkout, Scope::Read])
        );
        assert!(
            Scope::parse_list(["write"])
                .unwrap_err()
                .contains("'write'")
        );
        assert_eq!(Scope::join(&[Scope::Ingest, Scope::Read]), "ingest,read");
    }
}
