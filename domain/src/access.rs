//! Who may do what: dashboard roles and API token scopes.

use serde::{Deserialize, Serialize};

/// What a dashboard user may do; each role includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Merchandising: reads everything, changes nothing.
    Viewer,
    /// Support staff: may also release holds.
    Support,
    /// Operators: everything, including locks, warm-up, users and tokens.
    Admin,
}

impl Role {
    /// Every role, lowest first.
    pub const ALL: [Role; 3] = [Role::Viewer, Role::Support, Role::Admin];

    /// The name stored in the database and typed on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Viewer => "viewer",
            Self::Support => "support",
            Self::Admin => "admin",
        }
    }

    /// Parses a role name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }

    /// Whether this role may do what `needed` may.
    pub fn can(self, needed: Role) -> bool {
        self >= needed
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
}

impl Scope {
    /// Every scope.
    pub const ALL: [Scope; 3] = [Scope::Checkout, Scope::Ingest, Scope::Read];

    /// The name used in the database and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Checkout => "checkout",
            Self::Ingest => "ingest",
            Self::Read => "read",
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
            let scope = Self::parse(name)
                .ok_or_else(|| format!("unknown scope '{name}': use checkout, ingest or read"))?;
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
    fn roles_order_and_parse() {
        assert!(Role::Admin.can(Role::Support));
        assert!(!Role::Viewer.can(Role::Support));
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
