//! Shared-secret authentication at `connect` (auth mode `token` or
//! `password`, or none), a device token standing in for the secret, and the
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
/// edge (or a replica sharing its secret) issued, and the failures so far.
pub struct Authenticator {
    mode: AuthMode,
    token: Option<String>,
    password: Option<String>,
    failures_per_minute: u32,
    /// Per client address: when its window started and its failures in it.
    failures: Mutex<FailureTable>,
    /// Signs and checks the tokens issued to devices in `hello-ok.auth`.
    pub device_tokens: DeviceTokens,
}

impl Authenticator {
    pub fn new(config: &EdgeConfig) -> Self {
        let device_tokens = match &config.device_token_secret {
            Some(secret) => DeviceTokens::new(Sha256::digest(secret.as_bytes()).into()),
            None => DeviceTokens::random(),
        };
        Self {
            mode: config.auth_mode,
            token: config.token.clone(),
            password: config.password.clone(),
            failures_per_minute: config.auth_failures_per_minute,
            failures: Mutex::new(FailureTable::new(config.auth_failure_addresses)),
            device_tokens,
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

    /// A device token issued to the connecting device, asked for the role
    /// and scopes it was issued for. The device's signature is checked after
    /// this, as for any device.
    fn device_token_grants(&self, params: &ConnectParams) -> bool {
        let Some(device) = &params.device else {
            return false;
        };
        let Some(token) = params.auth_str("deviceToken").or(params.auth_str("token")) else {
            return false;
        };
        let Some(issued) = self.device_tokens.verify(token, &device.id) else {
            return false;
        };
        issued.role == params.role && params.scopes.iter().all(|s| issued.scopes.contains(s))
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
        if self.device_token_grants(params) {
            return Ok("device-token");
        }
        let outcome = match given {
            None | Some("") => Err(missing(kind)),
            Some(given) if constant_time_eq(given.as_bytes(), expected.as_bytes()) => Ok(kind),
            Some(_) => Err(mismatch(kind)),
        };
        if outcome.is_err() {
            self.note_failure(ip);
        }
        outcome
    }
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
