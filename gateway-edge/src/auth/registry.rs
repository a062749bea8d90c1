//! OpenClaw's method registry: every core method of the protocol (served
//! here or not) with the scope it needs, from
//! `method-scopes-2026.9.6.tsv` beside this file. Authorization asks it
//! for the methods this edge does not serve, so that a caller holding a
//! method's scope hears "unknown method" and one without it hears about
//! the scope, as from the real gateway; unclassified names need
//! `operator.admin` (default deny).

use std::collections::HashMap;
use std::sync::LazyLock;

use serde_json::Value;

use super::scopes::{ADMIN, Access, PAIRING, READ, WRITE};

/// The table as shipped: `method<TAB>scope` lines, `#` comments.
const TABLE: &str = include_str!("method-scopes-2026.9.6.tsv");

/// How OpenClaw decides a method's scope.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// One operator scope.
    Fixed(&'static str),
    /// Decided by the params ([`dynamic_scope`]).
    Dynamic,
    /// Reserved for clients connected with role `node`.
    Node,
}

static REGISTRY: LazyLock<HashMap<&'static str, Policy>> = LazyLock::new(|| rows().collect());

fn rows() -> impl Iterator<Item = (&'static str, Policy)> {
    TABLE
        .lines()
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let (name, scope) = line
                .split_once('\t')
                .unwrap_or_else(|| panic!("registry row without a scope: {line}"));
            let policy = match scope {
                "dynamic" => Policy::Dynamic,
                "node" => Policy::Node,
                scope => Policy::Fixed(scope),
            };
            (name, policy)
        })
}

/// The registry's policy for `method` (`None`: not a core method).
pub fn policy(method: &str) -> Option<Policy> {
    REGISTRY.get(method).copied()
}

/// What a call of `method` with `params` needs per OpenClaw's registry.
pub fn access(method: &str, params: &Value) -> Access {
    match policy(method) {
        Some(Policy::Fixed(scope)) => Access::Operator(scope),
        Some(Policy::Dynamic) => Access::Operator(dynamic_scope(method, params)),
        Some(Policy::Node) => Access::Node,
        None => Access::Operator(ADMIN),
    }
}

/// The least scope OpenClaw asks of a params-dependent method this edge
/// does not serve (the served ones decide in their table row). Where
/// OpenClaw asks two scopes, the one a caller lacking both hears of first.
fn dynamic_scope(method: &str, params: &Value) -> &'static str {
    let flag = |key: &str| params.get(key) == Some(&Value::Bool(true));
    match method {
        "channels.pairing.approve" if flag("bootstrapCommandOwner") => ADMIN,
        "channels.pairing.approve" => PAIRING,
        "fs.listDir" if params.get("nodeId").is_some() => ADMIN,
        "talk.config" => READ,
        _ => WRITE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::scopes::KNOWN_SCOPES;
    use serde_json::json;

    #[test]
    fn the_table_is_sorted_unique_and_complete() {
        let names: Vec<&str> = rows().map(|(name, _)| name).collect();
        assert_eq!(names.len(), 482, "CORE_GATEWAY_METHOD_SPECS has 482 rows");
        assert!(names.windows(2).all(|pair| pair[0] < pair[1]));
        for (name, policy) in rows() {
            if let Policy::Fixed(scope) = policy {
                assert!(
                    KNOWN_SCOPES.contains(&scope) || scope == "operator.sessions.write",
                    "{name}: {scope}"
                );
            }
        }
    }

    #[test]
    fn lookups() {
        let none = json!({});
        assert_eq!(access("logs.tail", &none), Access::Operator(READ));
        assert_eq!(access("config.set", &none), Access::Operator(ADMIN));
        assert_eq!(access("sessions.send", &none), Access::Operator(WRITE));
        assert_eq!(
            access("channels.pairing.list", &none),
            Access::Operator(PAIRING)
        );
        assert_eq!(access("node.event", &none), Access::Node);
        assert_eq!(access("no.such.method", &none), Access::Operator(ADMIN));
        assert_eq!(access("fs.listDir", &none), Access::Operator(WRITE));
        assert_eq!(
            access("fs.listDir", &json!({ "nodeId": "n" })),
            Access::Operator(ADMIN)
        );
        assert_eq!(access("talk.config", &none), Access::Operator(READ));
    }
}
