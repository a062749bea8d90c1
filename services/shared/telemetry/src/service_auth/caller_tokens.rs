//! The tokens a gRPC server accepts, each naming its caller: the settings
//! (`CLAWGATE_EDGE_TOKENS`, `CLAWGATE_COORDINATOR_TOKENS`,
//! `CLAWGATE_INTERNAL_TOKENS`, the same in every server and the all-in-one)
//! and the lookup from an `authorization` header to a [`CallerIdentity`].
//!
//! Two modes (docs/security.md). Scoped: a server given any per-kind list
//! accepts exactly those lists, each token as its kind;
//! `CLAWGATE_SERVICE_TOKEN` is then only what the process itself sends.
//! Simple (legacy): with no per-kind list, the shared
//! `CLAWGATE_SERVICE_TOKEN` is accepted as a trusted caller that may call
//! every RPC, as before there were kinds.

use std::str::FromStr;
use std::sync::Arc;

use http::HeaderValue;

use sha2::{Digest, Sha256};

use crate::service_auth::{CallerIdentity, CallerKind, ServiceTokens, check_secret_length};

/// `CLAWGATE_INTERNAL_TOKENS`: comma-separated entries, each a token (the
/// caller may act on every session) or `prefix=token` (only on sessions
/// whose canonical key starts with `prefix`, e.g. `agent:billing:`). Split
/// at the first `=`: use tokens without `=` (`openssl rand -hex 32`).
#[derive(Clone, PartialEq, Eq)]
pub struct InternalTokens(Arc<[(Option<String>, String)]>);

impl std::fmt::Debug for InternalTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "InternalTokens(<{} redacted>)", self.0.len())
    }
}

impl FromStr for InternalTokens {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let mut entries = Vec::new();
        for entry in raw.split(',').map(str::trim) {
            let (prefix, token) = match entry.split_once('=') {
                Some((prefix, token)) => (Some(prefix.trim()), token.trim()),
                None => (None, entry),
            };
            if prefix.is_some_and(str::is_empty) {
                return Err(
                    "an internal token's session prefix may not be empty (write the \
                            token alone for a caller of every session)"
                        .into(),
                );
            }
            // Parsed as a one-token list: the same rules as every token.
            let token: ServiceTokens = token.parse()?;
            entries.push((prefix.map(str::to_owned), token.first().to_owned()));
        }
        Ok(Self(entries.into()))
    }
}

/// What a server accepts: each token, kept as its SHA-256 digest (a call
/// costs one digest, of the token it carries), and the caller it names.
#[derive(Clone)]
pub struct CallerTokens(Arc<[([u8; 32], CallerIdentity)]>);

impl std::fmt::Debug for CallerTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CallerTokens(<{} redacted>)", self.0.len())
    }
}

impl CallerTokens {
    /// The caller `authorization` (`Bearer <token>`) names, if any.
    pub fn identify(&self, authorization: Option<&HeaderValue>) -> Option<CallerIdentity> {
        let given = authorization
            .and_then(|value| value.as_bytes().strip_prefix(b"Bearer "))
            .unwrap_or_default();
        let given: [u8; 32] = Sha256::digest(given).into();
        // Every digest is compared, in full, so the time tells neither
        // where a token differs nor which one matched.
        self.0.iter().fold(None, |found, (digest, caller)| {
            let differs = digest
                .iter()
                .zip(&given)
                .fold(0u8, |acc, (x, y)| acc | (x ^ y));
            found.or_else(|| (differs == 0).then(|| caller.clone()))
        })
    }
}

/// The per-kind token lists a server accepts (clap arguments, flattened
/// into each server's settings).
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct CallerTokenArgs {
    /// Tokens the gateway edge calls with (comma-separated, for rotation):
    /// it may call what docs/security.md lists for the edge. Setting any
    /// per-kind list switches this server to scoped tokens:
    /// CLAWGATE_SERVICE_TOKEN is then only what it sends.
    #[arg(long, env = "CLAWGATE_EDGE_TOKENS", hide_env_values = true)]
    pub edge_tokens: Option<ServiceTokens>,
    /// Tokens run coordinators call with (comma-separated): on the store,
    /// the only caller that may take leases or write transcripts and runs.
    #[arg(long, env = "CLAWGATE_COORDINATOR_TOKENS", hide_env_values = true)]
    pub coordinator_tokens: Option<ServiceTokens>,
    /// Tokens of internal services calling the coordinator through
    /// run-coordinator-api (comma-separated): submit, get, wait, cancel,
    /// subscribe. An entry `prefix=token` may act only on sessions whose
    /// canonical key starts with `prefix` (docs/security.md).
    #[arg(long, env = "CLAWGATE_INTERNAL_TOKENS", hide_env_values = true)]
    pub internal_tokens: Option<InternalTokens>,
}

impl CallerTokenArgs {
    /// Whether any per-kind list is set (the scoped mode).
    pub fn scoped(&self) -> bool {
        self.edge_tokens.is_some()
            || self.coordinator_tokens.is_some()
            || self.internal_tokens.is_some()
    }

    /// Every accepted token with the setting it came from and its caller.
    fn entries(&self, shared: Option<&ServiceTokens>) -> Vec<(String, String, CallerIdentity)> {
        let mut entries = Vec::new();
        let mut add_list = |setting: &str, tokens: Option<&ServiceTokens>, kind| {
            let tokens = tokens.map_or(&[][..], ServiceTokens::all);
            for (n, token) in tokens.iter().enumerate() {
                let what = format!("{setting} (token {} of {})", n + 1, tokens.len());
                entries.push((what, token.clone(), CallerIdentity::of(kind)));
            }
        };
        if !self.scoped() {
            add_list("CLAWGATE_SERVICE_TOKEN", shared, CallerKind::Trusted);
            return entries;
        }
        add_list(
            "CLAWGATE_EDGE_TOKENS",
            self.edge_tokens.as_ref(),
            CallerKind::Edge,
        );
        add_list(
            "CLAWGATE_COORDINATOR_TOKENS",
            self.coordinator_tokens.as_ref(),
            CallerKind::Coordinator,
        );
        let internal = self.internal_tokens.as_ref().map_or(&[][..], |t| &t.0[..]);
        for (n, (prefix, token)) in internal.iter().enumerate() {
            let what = format!(
                "CLAWGATE_INTERNAL_TOKENS (token {} of {})",
                n + 1,
                internal.len()
            );
            let caller = CallerIdentity {
                kind: CallerKind::Internal,
                session_prefix: prefix.clone(),
            };
            entries.push((what, token.clone(), caller));
        }
        entries
    }

    /// Refuses a token shorter than the shortest secret allowed, or one
    /// token given to two settings (it would name two callers), by place,
    /// never by value.
    pub fn check(&self, shared: Option<&ServiceTokens>) -> Result<(), String> {
        let entries = self.entries(shared);
        for (n, (what, token, _)) in entries.iter().enumerate() {
            check_secret_length(what, token)?;
            if let Some((other, ..)) = entries[..n].iter().find(|(_, t, _)| t == token) {
                return Err(format!(
                    "{what} is also {other}: each caller needs a token of its own"
                ));
            }
        }
        Ok(())
    }

    /// The kind of caller `token` is to this server, if it accepts it.
    pub fn kind_of(&self, shared: Option<&ServiceTokens>, token: &str) -> Option<CallerKind> {
        let entries = self.entries(shared);
        let mut found = entries.into_iter().filter(|(_, t, _)| t == token);
        found.next().map(|(_, _, caller)| caller.kind)
    }

    /// What the server accepts; `None` when no token is set at all (every
    /// call is served, the loopback default).
    pub fn accepted(&self, shared: Option<&ServiceTokens>) -> Option<CallerTokens> {
        let entries = self.entries(shared);
        (!entries.is_empty()).then(|| {
            CallerTokens(
                entries
                    .into_iter()
                    .map(|(_, token, caller)| (Sha256::digest(token).into(), caller))
                    .collect(),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EDGE: &str = "edge-token-0123456789";
    const COORDINATOR: &str = "coordinator-token-0123456789";
    const INTERNAL: &str = "internal-token-0123456789";
    const BILLING: &str = "billing-token-0123456789";

    fn bearer(token: &str) -> HeaderValue {
        HeaderValue::from_str(&format!("Bearer {token}")).unwrap()
    }

    fn scoped() -> CallerTokenArgs {
        CallerTokenArgs {
            edge_tokens: Some(EDGE.parse().unwrap()),
            coordinator_tokens: Some(COORDINATOR.parse().unwrap()),
            internal_tokens: Some(
                format!("{INTERNAL}, agent:billing:={BILLING}")
                    .parse()
                    .unwrap(),
            ),
        }
    }

    #[test]
    fn each_token_names_its_kind_and_the_shared_one_is_only_sent() {
        let shared: ServiceTokens = "shared-token-0123456789".parse().unwrap();
        let args = scoped();
        assert_eq!(args.check(Some(&shared)), Ok(()));
        let accepted = args.accepted(Some(&shared)).unwrap();
        let kind = |token| accepted.identify(Some(&bearer(token))).map(|c| c.kind);
        assert_eq!(kind(EDGE), Some(CallerKind::Edge));
        assert_eq!(kind(COORDINATOR), Some(CallerKind::Coordinator));
        assert_eq!(kind(INTERNAL), Some(CallerKind::Internal));
        assert_eq!(kind("shared-token-0123456789"), None, "scoped mode");
        assert_eq!(args.kind_of(Some(&shared), EDGE), Some(CallerKind::Edge));
        assert_eq!(args.kind_of(Some(&shared), "shared-token-0123456789"), None);
        assert_eq!(kind("other-token-0123456789"), None);
        assert_eq!(accepted.identify(None), None);
        let billing = accepted.identify(Some(&bearer(BILLING))).unwrap();
        assert_eq!(billing.session_prefix.as_deref(), Some("agent:billing:"));
        assert!(billing.may_act_on("agent:billing:invoice-7"));
        assert!(!billing.may_act_on("agent:main:main"));
        assert!(!format!("{accepted:?} {args:?}").contains("token-"));
    }

    #[test]
    fn without_per_kind_lists_the_shared_token_is_trusted_as_before() {
        let shared: ServiceTokens = "shared-token-0123456789".parse().unwrap();
        let args = CallerTokenArgs::default();
        let accepted = args.accepted(Some(&shared)).unwrap();
        let caller = accepted.identify(Some(&bearer("shared-token-0123456789")));
        assert_eq!(caller, Some(CallerIdentity::of(CallerKind::Trusted)));
        assert!(args.accepted(None).is_none(), "no token at all: open");
    }

    #[test]
    fn short_reused_or_malformed_tokens_are_refused_by_place() {
        let mut args = scoped();
        args.internal_tokens = Some(format!("agent:x:={EDGE}").parse().unwrap());
        assert_eq!(
            args.check(None).unwrap_err(),
            "CLAWGATE_INTERNAL_TOKENS (token 1 of 1) is also CLAWGATE_EDGE_TOKENS (token 1 of \
             1): each caller needs a token of its own"
        );
        args.coordinator_tokens = Some(format!("{COORDINATOR},short").parse().unwrap());
        let refused = args.check(None).unwrap_err();
        assert!(
            refused.starts_with("CLAWGATE_COORDINATOR_TOKENS (token 2 of 2) is 5 bytes long"),
            "{refused}"
        );
        assert!("=token-0123456789".parse::<InternalTokens>().is_err());
        assert!("agent:x:=".parse::<InternalTokens>().is_err());
        assert!("a,,b".parse::<InternalTokens>().is_err());
    }
}
