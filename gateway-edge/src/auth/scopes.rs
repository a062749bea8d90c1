//! Roles, scopes and the per-method authorization of the gateway protocol.
//!
//! Rules: `health` is exempt; the methods OpenClaw reserves for nodes need
//! role `node`, every other method role `operator`; `operator.admin`
//! satisfies everything; `operator.write` satisfies `operator.read`.
//! Served methods carry their scope in the method table
//! (`methods/table.rs`); the others have OpenClaw's (`registry.rs`), so a
//! caller holding a method's scope hears that it is not served here, and
//! unclassified names need `operator.admin` (default deny).

use serde_json::json;

use crate::protocol::frames::ErrorShape;

pub const READ: &str = "operator.read";
pub const WRITE: &str = "operator.write";
pub const ADMIN: &str = "operator.admin";
pub const APPROVALS: &str = "operator.approvals";
pub const QUESTIONS: &str = "operator.questions";
pub const PAIRING: &str = "operator.pairing";

/// Operator scopes a client may ask for (others are dropped at connect).
pub const KNOWN_SCOPES: &[&str] = &[
    ADMIN,
    READ,
    WRITE,
    APPROVALS,
    PAIRING,
    "operator.talk.secrets",
    "operator.talk",
    QUESTIONS,
];

/// What a call needs before it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Any authenticated connection (`health`).
    Exempt,
    /// Role `operator` holding this scope.
    Operator(&'static str),
    /// Role `node`, which passes without scopes.
    Node,
}

impl Access {
    /// The operator scope it asks for, if any.
    pub fn scope(self) -> Option<&'static str> {
        match self {
            Self::Operator(scope) => Some(scope),
            Self::Exempt | Self::Node => None,
        }
    }
}

/// Whether `scopes` grant `required`.
pub fn grants(scopes: &[String], required: &str) -> bool {
    let has = |s: &str| scopes.iter().any(|held| held == s);
    has(ADMIN) || has(required) || (required == READ && has(WRITE))
}

/// Checks the role and the scope a call needs; the error is the
/// protocol's.
pub fn authorize(required: Access, role: &str, scopes: &[String]) -> Result<(), ErrorShape> {
    let wanted_role = match required {
        Access::Exempt => return Ok(()),
        Access::Node => "node",
        Access::Operator(_) => "operator",
    };
    if role != wanted_role {
        return Err(ErrorShape::invalid(format!("unauthorized role: {role}")));
    }
    match required {
        Access::Operator(scope) if !grants(scopes, scope) => Err(ErrorShape::new(
            "FORBIDDEN",
            format!("missing scope: {scope}"),
        )
        .with_details(json!({
            "code": "MISSING_SCOPE",
            "missingScope": scope,
            "requiredScopes": [scope],
        }))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scopes(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_scope_rules() {
        let (read, write, admin) = (
            Access::Operator(READ),
            Access::Operator(WRITE),
            Access::Operator(ADMIN),
        );
        assert!(authorize(Access::Exempt, "operator", &[]).is_ok());
        assert!(authorize(read, "operator", &scopes(&[READ])).is_ok());
        assert!(authorize(read, "operator", &scopes(&[WRITE])).is_ok());
        assert!(authorize(write, "operator", &scopes(&[READ])).is_err());
        assert!(authorize(admin, "operator", &scopes(&[WRITE])).is_err());
        assert!(authorize(admin, "operator", &scopes(&[ADMIN])).is_ok());
        let err = authorize(read, "operator", &[]).unwrap_err();
        assert_eq!(err.code, "FORBIDDEN");
        assert_eq!(err.message, "missing scope: operator.read");
        assert_eq!(
            authorize(read, "node", &scopes(&[ADMIN]))
                .unwrap_err()
                .message,
            "unauthorized role: node"
        );
        assert!(authorize(Access::Node, "node", &[]).is_ok());
        assert_eq!(
            authorize(Access::Node, "operator", &scopes(&[ADMIN]))
                .unwrap_err()
                .message,
            "unauthorized role: operator"
        );
    }
}
