//! Shared-secret authentication at `connect` (auth mode `token` or
//! `password`, or none), a device token standing in for the secret (bound
//! to the secret's generation, valid for `EDGE_DEVICE_TOKEN_TTL`), and the
//! limiter of failed attempts per client address
//! (`EDGE_AUTH_FAILURES_PER_MINUTE`).
//!
//! The limiter's table is bounded (`EDGE_AUTH_FAILURE_ADDRESSES`) in two
//! generations, as the settings cache is: failures go to the young one;
//! when it holds half the bound, or its first entry is a window old, it
//! becomes the old one and the previous old one is dropped. An address is
//! counted by its /64 for IPv6 (`address_key`). Addresses made up by a
//! client (behind a proxy that forwards its word) can push others out
//! early, never grow the table.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use clawgate_common::clock::now_ms;
use clawgate_telemetry::service_auth::constant_time_eq;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use super::device::DeviceTokens;
use super::handshake::{ConnectParams, Rejection, auth_failure};
use crate::config::cidr::address_key;
use crate::config::{AuthMode, EdgeConfig};

/// The window failed attempts are counted in.
const FAILURE_WINDOW: Duration = Duration::from_secs(60);

/// Decides who may connect: the configured secret, the device tokens this
/// edge (or a replica sharing its secrets) issued, and the failures so far.
pub struct Authenticator {
    mode: AuthMode,
    token: Option<String>,
    password: Option<String>,
    failures_per_minute: u32,
    /// Per client address: when its window started and its failures in it.
    failures: Mutex<FailureTable>,
    /// Signs and checks the tokens issued to devices in `hello-ok.auth`.
    pub device_tokens: DeviceTokens,
    /// How long after its issue a device token is taken
    /// (`EDGE_DEVICE_TOKEN_TTL`).
    device_token_ttl_ms: i64,
}

/// The device tokens an edge with `config` issues and accepts.
///
/// The MAC key is derived from the device-token secret (a random one per
/// process when none is set) and the shared secret of the auth mode, so
/// that a token is bound to the shared secret's generation: rotating
/// `EDGE_TOKEN` (or `EDGE_PASSWORD`, or the mode) revokes every device
/// token issued under the old one, as rotating the device-token secret does.
pub fn edge_device_tokens(config: &EdgeConfig) -> DeviceTokens {
    let mut key = Sha256::new();
    key.update(DEVICE_TOKEN_KEY_DOMAIN);
    match &config.device_token_secret {
        Some(secret) => length_prefixed(&mut key, secret.as_bytes()),
        None => {
            let mut random = [0u8; 32];
            getrandom::fill(&mut random).expect("OS random source unavailable");
            length_prefixed(&mut key, &random);
        }
    }
    let (mode, shared) = match config.auth_mode {
        AuthMode::None => ("none", None),
        AuthMode::Token => ("token", config.token.as_deref()),
        AuthMode::Password => ("password", config.password.as_deref()),
    };
    length_prefixed(&mut key, mode.as_bytes());
    length_prefixed(&mut key, shared.unwrap_or_default().as_bytes());
    DeviceTokens::new(key.finalize().into())
}

/// Domain separation for the device-token key derivation.
const DEVICE_TOKEN_KEY_DOMAIN: &[u8] = b"clawgate/device-token-key/v2";

fn length_prefixed(digest: &mut Sha256, bytes: &[u8]) {
    digest.update((bytes.len() as u64).to_be_bytes());
    digest.update(bytes);
}

/// What a connect's device token (if it gave one) says.
enum DeviceTokenCheck {
    /// None given, or one this edge cannot tell from a shared secret (a
    /// token in `auth.token` that is not a device token of this edge).
    Absent,
    /// Issued to this device for at least this role and these scopes.
    Grants,
    /// A device token this edge will not take: the connect is refused with
    /// this unless the shared secret is given too.
    Refused(Rejection),
}

impl Authenticator {
    pub fn new(config: &EdgeConfig) -> Self {
        Self {
            mode: config.auth_mode,
            token: config.token.clone(),
            password: config.password.clone(),
            failures_per_minute: config.auth_failures_per_minute,
            failures: Mutex::new(FailureTable::new(config.auth_failure_addresses)),
            device_tokens: edge_device_tokens(config),
            device_token_ttl_ms: i64::try_from(config.device_token_ttl.as_millis())
                .unwrap_or(i64::MAX),
        }
    }

    fn note_failure(&self, ip: IpAddr) {
        self.failures
            .lock()
            .unwrap()
            .note(address_key(ip), Instant::now());
    }

    fn rate_limited(&self, ip: IpAddr) -> bool {
        let failures = self.failures.lock().unwrap();
        failures
            .count(address_key(ip), Instant::now())
            .is_some_and(|count| count >= self.failures_per_minute)
    }

    /// Addresses the failure table holds now.
    pub fn failure_addresses(&self) -> usize {
        self.failures.lock().unwrap().len()
    }

    /// The device token the connecting device gave (`auth.deviceToken`,
    /// else `auth.token`), checked: issued to this device by this edge's
    /// secrets (their current generation), not older than the TTL, and for
    /// the role and scopes asked. The device's signature is checked after
    /// this, as for any device.
    fn check_device_token(&self, params: &ConnectParams) -> DeviceTokenCheck {
        let Some(device) = &params.device else {
            return DeviceTokenCheck::Absent;
        };
        let explicit = params.auth_str("deviceToken").filter(|t| !t.is_empty());
        let Some(token) = explicit.or(params.auth_str("token")) else {
            return DeviceTokenCheck::Absent;
        };
        let Some(issued) = self.device_tokens.verify(token, &device.id) else {
            // Another device's, another secret's (or an earlier shared
            // secret's), or made up. In `auth.token` it may be a wrong
            // shared secret, which the caller reports as such.
            return match explicit {
                Some(_) => DeviceTokenCheck::Refused(device_token_refused(false)),
                None => DeviceTokenCheck::Absent,
            };
        };
        if now_ms().saturating_sub(issued.issued_at_ms) > self.device_token_ttl_ms {
            return DeviceTokenCheck::Refused(device_token_refused(true));
        }
        match issued.role == params.role && params.scopes.iter().all(|s| issued.scopes.contains(s))
        {
            true => DeviceTokenCheck::Grants,
            false => DeviceTokenCheck::Absent,
        }
    }

    /// Checks the secret (or a device token) a client connecting from `ip`
    /// gave. Returns the `hello-ok.auth.method`.
    pub fn authenticate(
        &self,
        params: &ConnectParams,
        ip: IpAddr,
    ) -> Result<&'static str, Rejection> {
        if self.rate_limited(ip) {
            // Counted too: an address that keeps trying stays in the
            // bounded table (see the module's comment).
            self.note_failure(ip);
            return Err(auth_failure(
                "AUTH_RATE_LIMITED",
                "rate_limited",
                "unauthorized: too many failed authentication attempts (retry later)",
                "wait_then_retry",
            ));
        }
        let (expected, given, kind) = match self.mode {
            AuthMode::None => return Ok("none"),
            AuthMode::Token => (self.token.as_deref(), params.auth_str("token"), "token"),
            AuthMode::Password => (
                self.password.as_deref(),
                params.auth_str("password"),
                "password",
            ),
        };
        let expected = expected.unwrap_or_default();
        let device_token = self.check_device_token(params);
        if let DeviceTokenCheck::Grants = device_token {
            return Ok("device-token");
        }
        let outcome = match (given, device_token) {
            (Some(given), _) if constant_time_eq(given.as_bytes(), expected.as_bytes()) => Ok(kind),
            (_, DeviceTokenCheck::Refused(refusal)) => Err(refusal),
            (None | Some(""), _) => Err(missing(kind)),
            (Some(_), _) => Err(mismatch(kind)),
        };
        if outcome.is_err() {
            self.note_failure(ip);
        }
        outcome
    }
}

/// The refusal of a device token this edge does not take, in the protocol's
/// shape (`AUTH_DEVICE_TOKEN_MISMATCH`, whose message a client recognises
/// to drop its stored token): `expired` when it was issued here but longer
/// ago than `EDGE_DEVICE_TOKEN_TTL`.
fn device_token_refused(expired: bool) -> Rejection {
    let (reason, message) = match expired {
        true => (
            "device_token_expired",
            "unauthorized: device token mismatch (expired; rotate/reissue device token)",
        ),
        false => (
            "device_token_mismatch",
            "unauthorized: device token mismatch (rotate/reissue device token)",
        ),
    };
    auth_failure(
        "AUTH_DEVICE_TOKEN_MISMATCH",
        reason,
        message,
        "update_auth_credentials",
    )
}

/// Failed attempts per address: `(window start, failures in it)`, in two
/// generations of at most half the bound each (see the module's comment).
struct FailureTable {
    half: usize,
    young: HashMap<IpAddr, (Instant, u32)>,
    /// When the young generation's first entry came.
    young_since: Option<Instant>,
    old: HashMap<IpAddr, (Instant, u32)>,
}

impl FailureTable {
    fn new(bound: usize) -> Self {
        Self {
            half: (bound / 2).max(1),
            young: HashMap::new(),
            young_since: None,
            old: HashMap::new(),
        }
    }

    fn len(&self) -> usize {
        self.young.len() + self.old.len()
    }

    /// The failures of `key` in its window still open at `now`.
    fn count(&self, key: IpAddr, now: Instant) -> Option<u32> {
        let (since, count) = self.young.get(&key).or_else(|| self.old.get(&key))?;
        (now.duration_since(*since) <= FAILURE_WINDOW).then_some(*count)
    }

    fn note(&mut self, key: IpAddr, now: Instant) {
        let entry = self.old.remove(&key).or_else(|| self.young.remove(&key));
        let (since, count) = match entry {
            Some((since, count)) if now.duration_since(since) <= FAILURE_WINDOW => (since, count),
            _ => (now, 0),
        };
        let aged = self
            .young_since
            .is_some_and(|first| now.duration_since(first) > FAILURE_WINDOW);
        if self.young.len() >= self.half || aged {
            self.old = std::mem::take(&mut self.young);
            self.young_since = None;
        }
        self.young_since.get_or_insert(now);
        self.young.insert(key, (since, count + 1));
    }
}

/// The refusal of a connect that gave no secret of `kind`.
fn missing(kind: &str) -> Rejection {
    let (code, reason) = match kind {
        "token" => ("AUTH_TOKEN_MISSING", "token_missing"),
        _ => ("AUTH_PASSWORD_MISSING", "password_missing"),
    };
    auth_failure(
        code,
        reason,
        &format!("unauthorized: gateway {kind} missing (provide gateway auth {kind})"),
        "update_auth_configuration",
    )
}

/// The refusal of a connect whose secret of `kind` is not this edge's.
fn mismatch(kind: &str) -> Rejection {
    let (code, reason) = match kind {
        "token" => ("AUTH_TOKEN_MISMATCH", "token_mismatch"),
        _ => ("AUTH_PASSWORD_MISMATCH", "password_mismatch"),
    };
    auth_failure(
        code,
        reason,
        &format!(
            "unauthorized: gateway {kind} mismatch (use this gateway's gateway.auth.{kind} or pair the device)"
        ),
        "update_auth_credentials",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u32) -> IpAddr {
        IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + n))
    }

    #[test]
    fn the_failure_table_is_bounded_and_keeps_counting_the_busy_address() {
        let mut table = FailureTable::new(100);
        let start = Instant::now();
        for n in 0..10_000 {
            table.note(ip(n), start);
            // A brute-forcer keeps failing among made-up addresses: its
            // count is carried across the generations.
            table.note(ip(0), start);
            assert!(table.len() <= 100, "{} entries", table.len());
        }
        assert_eq!(table.count(ip(0), start), Some(10_001));
        assert_eq!(
            table.count(ip(5), start),
            None,
            "an old made-up one is gone"
        );
        // A window later the count starts again, and the old entries go.
        let later = start + FAILURE_WINDOW + std::time::Duration::from_secs(1);
        assert_eq!(table.count(ip(0), later), None);
        table.note(ip(0), later);
        assert_eq!(table.count(ip(0), later), Some(1));
        table.note(ip(1), later + FAILURE_WINDOW * 2);
        assert!(table.len() <= 2, "{} entries", table.len());
    }
}
