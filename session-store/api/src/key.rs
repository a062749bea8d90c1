//! Session keys in canonical form.
//!
//! Rules (documented in docs/session-store.md):
//! * `main` is the default agent's main session: `agent:main:main`.
//! * `global` is kept as is.
//! * `agent:<agentId>:<rest>` is kept when well formed: `agentId` is 1..64 of
//!   `[a-z0-9_-]` starting with a letter or digit (upper case is folded), and
//!   `rest` is non-empty.
//! * Any other key `x` belongs to the default agent: `agent:main:x`.
//! * Input is 1..=512 characters, no control characters, no surrounding spaces.

use std::fmt;

use crate::invalid::Invalid;

pub const MAX_SESSION_KEY_CHARS: usize = 512;
const DEFAULT_AGENT_ID: &str = "main";
const MAX_AGENT_ID_CHARS: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionKey(String);

impl SessionKey {
    pub fn parse(raw: &str) -> Result<Self, Invalid> {
        if raw.is_empty() {
            return Err(Invalid::new("sessionKey must not be empty"));
        }
        let chars = raw.chars().count();
        if chars > MAX_SESSION_KEY_CHARS {
            return Err(Invalid::new(format!(
                "sessionKey is {chars} characters; the maximum is {MAX_SESSION_KEY_CHARS}"
            )));
        }
        if raw.trim() != raw {
            return Err(Invalid::new(
                "sessionKey must not start or end with whitespace",
            ));
        }
        if raw.chars().any(char::is_control) {
            return Err(Invalid::new(
                "sessionKey must not contain control characters",
            ));
        }
        if raw == "global" {
            return Ok(Self(raw.to_owned()));
        }
        if raw == DEFAULT_AGENT_ID {
            return Ok(Self(format!("agent:{DEFAULT_AGENT_ID}:{DEFAULT_AGENT_ID}")));
        }
        match strip_prefix_ignore_case(raw, "agent:") {
            Some(rest) => parse_agent_scoped(rest).map(Self),
            None => Ok(Self(format!("agent:{DEFAULT_AGENT_ID}:{raw}"))),
        }
    }

    /// A key read back from storage. Only parsed keys are ever stored, so it
    /// is canonical already (and may be longer than the 512-character input
    /// limit: `agent:main:` + a 512-character key).
    pub fn from_stored(canonical: String) -> Self {
        Self(canonical)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn strip_prefix_ignore_case<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

fn parse_agent_scoped(after_prefix: &str) -> Result<String, Invalid> {
    let malformed = |why: &str| {
        Invalid::new(format!(
            "malformed sessionKey \"agent:{after_prefix}\": {why} (expected agent:<agentId>:<key>)"
        ))
    };
    let (agent_id, rest) = after_prefix
        .split_once(':')
        .ok_or_else(|| malformed("missing the key after the agent id"))?;
    if rest.is_empty() {
        return Err(malformed("empty key after the agent id"));
    }
    let agent_id = agent_id.to_ascii_lowercase();
    let well_formed_id = (1..=MAX_AGENT_ID_CHARS).contains(&agent_id.len())
        && agent_id.starts_with(|c: char| c.is_ascii_alphanumeric())
        && agent_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !well_formed_id {
        return Err(malformed(
            "the agent id must be 1..64 of [a-z0-9_-], starting with a letter or digit",
        ));
    }
    Ok(format!("agent:{agent_id}:{rest}"))
}

impl fmt::Display for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(raw: &str) -> String {
        SessionKey::parse(raw).unwrap().as_str().to_owned()
    }

    #[test]
    fn canonical_forms() {
        assert_eq!(canon("main"), "agent:main:main");
        assert_eq!(canon("x"), "agent:main:x");
        assert_eq!(canon("global"), "global");
        assert_eq!(canon("agent:ops:main"), "agent:ops:main");
        assert_eq!(canon("Agent:OPS:thread:42"), "agent:ops:thread:42");
        assert_eq!(canon("cron:nightly"), "agent:main:cron:nightly");
    }

    #[test]
    fn rejects_bad_keys() {
        for bad in [
            "",
            " main",
            "main\n",
            "agent:",
            "agent:main",
            "agent:main:",
            "agent::x",
            "agent:-x:y",
            "agent:a b:c",
        ] {
            let err = SessionKey::parse(bad).unwrap_err();
            assert!(matches!(err, Invalid(_)), "{bad:?}: {err:?}");
        }
        assert!(SessionKey::parse(&"k".repeat(MAX_SESSION_KEY_CHARS)).is_ok());
        let long = SessionKey::parse(&"k".repeat(MAX_SESSION_KEY_CHARS + 1)).unwrap_err();
        assert!(long.to_string().contains("maximum is 512"), "{long}");
    }
}
