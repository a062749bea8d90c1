//! Roles, scopes and the per-method authorization of the gateway protocol.
//!
//! Rules: `health` is exempt; every method needs role `operator`;
//! `operator.admin` satisfies everything; `operator.write` satisfies
//! `operator.read`; unclassified (and unknown) methods need `operator.admin`,
//! so a non-admin calling an unknown method hears about the missing scope
//! before it hears the method does not exist. The served methods' scopes are
//! in the method table (`methods/table.rs`).

use serde_json::json;

use crate::protocol::frames::ErrorShape;

pub const READ: &str = "operator.read";
pub const WRITE: &str = "operator.write";
pub const ADMIN: &str = "operator.admin";
pub const APPROVALS: &str = "operator.approvals";
pub const QUESTIONS: &str = "operator.questions";

/// Operator scopes a client may ask for (others are dropped at connect).
pub const KNOWN_SCOPES: &[&str] = &[
    ADMIN,
    READ,
    WRITE,
    APPROVALS,
    "operator.pairing",
    "operator.talk.secrets",
    "operator.talk",
    QUESTIONS,
];

/// Read-classified methods of the protocol that this edge does not serve
/// (the served ones carry their scope in the method table).
const UNSERVED_READ: &[&str] = &[
    "sessions.get",
    "sessions.preview",
    "system-presence",
    "tools.catalog",
    "logs.tail",
    "channels.status",
    "usage.status",
    "usage.cost",
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
];

/// Write-classified methods of the protocol that this edge does not serve.
const UNSERVED_WRITE: &[&str] = &["send", "poll", "wake", "sessions.send", "sessions.steer"];

/// The scope an unserved (or unknown) method needs, so that a caller
/// without it hears about the scope before it hears the method is not
/// served: the protocol's classification, admin when unclassified.
pub fn unserved_scope(method: &str) -> &'static str {
    if ["config.", "exec.approvals.", "wizard.", "update."]
        .iter()
        .any(|prefix| method.starts_with(prefix))
        && method != "config.get"
    {
        return ADMIN;
    }
    if UNSERVED_READ.contains(&method) {
        READ
    } else if UNSERVED_WRITE.contains(&method) {
        WRITE
    } else {
        ADMIN
    }
}

/// Whether `scopes` grant `required`.
pub fn grants(scopes: &[String], required: &str) -> bool {
    let has = |s: &str| scopes.iter().any(|held| held == s);
    has(ADMIN) || has(required) || (required == READ && has(WRITE))
}

/// Checks the role and the scope a call needs (`None`: exempt); the
/// error is the protocol's.
pub fn authorize(required: Option<&str>, role: &str, scopes: &[String]) -> Result<(), ErrorShape> {
    let Some(required) = required else {
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
        assert!(authorize(None, "operator", &[]).is_ok());
        assert!(authorize(Some(READ), "operator", &scopes(&[READ])).is_ok());
        assert!(authorize(Some(READ), "operator", &scopes(&[WRITE])).is_ok());
        assert!(authorize(Some(WRITE), "operator", &scopes(&[READ])).is_err());
        assert!(authorize(Some(ADMIN), "operator", &scopes(&[WRITE])).is_err());
        assert!(authorize(Some(ADMIN), "operator", &scopes(&[ADMIN])).is_ok());
        let err = authorize(Some(READ), "operator", &[]).unwrap_err();
        assert_eq!(err.code, "FORBIDDEN");
        assert_eq!(err.message, "missing scope: operator.read");
        assert_eq!(unserved_scope("no.such.method"), ADMIN);
        assert_eq!(unserved_scope("logs.tail"), READ);
        assert_eq!(unserved_scope("config.set"), ADMIN);
        assert_eq!(unserved_scope("sessions.send"), WRITE);
        assert_eq!(
            authorize(Some(READ), "node", &scopes(&[ADMIN]))
                .unwrap_err()
                .message,
            "unauthorized role: node"
        );
    }
}
