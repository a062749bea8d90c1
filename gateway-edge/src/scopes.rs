//! Roles, scopes and the per-method authorization of the gateway protocol.
//!
//! Rules: `health` is exempt; every method here needs role `operator`;
//! `operator.admin` satisfies everything; `operator.write` satisfies
//! `operator.read`; unclassified (and unknown) methods need `operator.admin`,
//! so a non-admin calling an unknown method hears about the missing scope
//! before it hears the method does not exist.

use serde_json::json;

use crate::frames::ErrorShape;

pub const READ: &str = "operator.read";
pub const WRITE: &str = "operator.write";
pub const ADMIN: &str = "operator.admin";

/// Operator scopes a client may ask for (others are dropped at connect).
pub const KNOWN_SCOPES: &[&str] = &[
    ADMIN,
    READ,
    WRITE,
    "operator.approvals",
    "operator.pairing",
    "operator.talk.secrets",
    "operator.talk",
    "operator.questions",
];

/// Read-classified methods of the protocol (whether this edge serves them or not).
const READ_METHODS: &[&str] = &[
    "status",
    "agents.list",
    "sessions.list",
    "sessions.get",
    "sessions.preview",
    "sessions.resolve",
    "sessions.subscribe",
    "sessions.unsubscribe",
    "sessions.messages.subscribe",
    "sessions.messages.unsubscribe",
    "chat.history",
    "system-presence",
    "models.list",
    "tools.catalog",
    "commands.list",
    "logs.tail",
    "channels.status",
    "usage.status",
    "usage.cost",
    "config.get",
    "last-heartbeat",
    "node.list",
    "node.describe",
    "agent.identity.get",
    "skills.status",
    "cron.list",
    "cron.status",
    "tts.status",
    "tts.providers",
    "voicewake.get",
    "gateway.identity.get",
    "runs.resume",
];

const WRITE_METHODS: &[&str] = &[
    "agent",
    "agent.wait",
    "chat.send",
    "chat.abort",
    "send",
    "poll",
    "wake",
    "sessions.create",
    "sessions.send",
    "sessions.steer",
    "sessions.abort",
];

/// `None`: exempt (health).
pub fn required_scope(method: &str) -> Option<&'static str> {
    if method == "health" {
        return None;
    }
    if ["config.", "exec.approvals.", "wizard.", "update."]
        .iter()
        .any(|prefix| method.starts_with(prefix))
        && method != "config.get"
    {
        return Some(ADMIN);
    }
    if READ_METHODS.contains(&method) {
        Some(READ)
    } else if WRITE_METHODS.contains(&method) {
        Some(WRITE)
    } else {
        Some(ADMIN)
    }
}

/// Whether `scopes` grant `required`.
pub fn grants(scopes: &[String], required: &str) -> bool {
    let has = |s: &str| scopes.iter().any(|held| held == s);
    has(ADMIN) || has(required) || (required == READ && has(WRITE))
}

/// Checks the role and scope for `method`; the error is the protocol's.
pub fn authorize(method: &str, role: &str, scopes: &[String]) -> Result<(), ErrorShape> {
    let Some(required) = required_scope(method) else {
        return Ok(());
    };
    if role != "operator" {
        return Err(ErrorShape::invalid(format!("unauthorized role: {role}")));
    }
    if grants(scopes, required) {
        return Ok(());
    }
    Err(
        ErrorShape::new("FORBIDDEN", format!("missing scope: {required}")).with_details(json!({
            "code": "MISSING_SCOPE",
            "missingScope": required,
            "requiredScopes": [required],
        })),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scopes(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_scope_rules() {
        assert!(authorize("health", "operator", &[]).is_ok());
        assert!(authorize("status", "operator", &scopes(&[READ])).is_ok());
        assert!(authorize("status", "operator", &scopes(&[WRITE])).is_ok());
        assert!(authorize("chat.send", "operator", &scopes(&[READ])).is_err());
        assert!(authorize("sessions.reset", "operator", &scopes(&[WRITE])).is_err());
        assert!(authorize("sessions.reset", "operator", &scopes(&[ADMIN])).is_ok());
        let err = authorize("status", "operator", &[]).unwrap_err();
        assert_eq!(err.code, "FORBIDDEN");
        assert_eq!(err.message, "missing scope: operator.read");
        let unknown = authorize("no.such.method", "operator", &scopes(&[WRITE])).unwrap_err();
        assert_eq!(unknown.message, "missing scope: operator.admin");
        assert_eq!(
            authorize("config.get", "operator", &[])
                .unwrap_err()
                .message,
            "missing scope: operator.read"
        );
        assert_eq!(
            authorize("config.set", "operator", &scopes(&[WRITE]))
                .unwrap_err()
                .message,
            "missing scope: operator.admin"
        );
        assert_eq!(
            authorize("status", "node", &scopes(&[ADMIN]))
                .unwrap_err()
                .message,
            "unauthorized role: node"
        );
    }
}
