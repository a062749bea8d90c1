//! Service-to-service trust: service tokens naming caller kinds, as tower
//! layers.
//!
//! When the services are given tokens, every gRPC call between them
//! carries the caller's `CLAWGATE_SERVICE_TOKEN` (the first, if several) in
//! `authorization: Bearer <token>`, and a server answers any call without
//! a token it accepts `UNAUTHENTICATED`, and a call its caller's kind may
//! not make `PERMISSION_DENIED` (naming the kind and the method), before
//! the call reaches a handler. Which tokens a server accepts, and as which
//! [`CallerKind`], is `caller_tokens`; which kind may call which RPC is the
//! service's [`AccessTable`]. Several tokens per setting let a token be
//! rotated without a pause: servers accept the new and the old one while
//! clients move to the new one. Health checks (`grpc.health.v1`) stay
//! open, since Kubernetes' gRPC probes cannot send a header. Without
//! tokens both layers pass every call through.
//!
//! A transport that authenticated the caller itself (mutual TLS) may put a
//! [`CallerIdentity`] or a [`CallerKind`] in the request's extensions: the
//! server layer takes it as the caller, in place of a token.
//!
//! Tokens are compared in constant time (of digests, so neither where they
//! differ nor their length shows), and never printed: their `Debug` is
//! redacted. A process given a token shorter than [`MIN_SECRET_BYTES`]
//! stops at start ([`check_exposure`]; not when the flag is parsed,
//! since the parser would print the value it refuses).

pub mod access;
pub mod caller_tokens;

use std::str::FromStr;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::{Either, Ready, ready};
use http::HeaderValue;
use sha2::{Digest, Sha256};
use tower::{Layer, Service};

use access::AccessTable;
use caller_tokens::{CallerTokenArgs, CallerTokens};

/// Who calls a clawgate gRPC server, by what it is; what each may call is
/// the service's [`AccessTable`] (docs/security.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallerKind {
    /// The gateway edge: sessions, history and runs on behalf of clients.
    Edge,
    /// A run coordinator: the store's leases, transcripts and run records.
    Coordinator,
    /// A service of the user's calling the coordinator through
    /// run-coordinator-api: submit, get, wait, cancel, subscribe.
    Internal,
    /// The shared token of the simple mode (`CLAWGATE_SERVICE_TOKEN` with
    /// no per-kind list): every RPC, as before there were kinds.
    Trusted,
}

impl CallerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Edge => "edge",
            Self::Coordinator => "coordinator",
            Self::Internal => "internal",
            Self::Trusted => "trusted",
        }
    }
}

impl std::fmt::Display for CallerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An authenticated caller: its kind and, for an internal caller bound to
/// some sessions, the canonical session-key prefix it may act on. The
/// server layer puts it in the request's extensions for the handlers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallerIdentity {
    pub kind: CallerKind,
    /// `Some`: only sessions whose canonical key starts with it.
    pub session_prefix: Option<String>,
}

impl CallerIdentity {
    /// A caller of `kind` bound to no session prefix.
    pub fn of(kind: CallerKind) -> Self {
        Self {
            kind,
            session_prefix: None,
        }
    }

    /// Whether the caller may act on the session with this canonical key.
    pub fn may_act_on(&self, canonical_key: &str) -> bool {
        self.session_prefix
            .as_deref()
            .is_none_or(|prefix| canonical_key.starts_with(prefix))
    }

    /// The caller a transport established, from a request's extensions.
    fn from_extensions(extensions: &http::Extensions) -> Option<Self> {
        extensions
            .get::<Self>()
            .cloned()
            .or_else(|| extensions.get::<CallerKind>().copied().map(Self::of))
    }
}

/// The fewest bytes a shared secret may have: a service token here, the
/// edge's token, password and device-token secret (docs/security.md).
/// Not a setting: it is the floor below which a guessed or brute-forced
/// secret is a real risk, and no deployment needs to go under it.
pub const MIN_SECRET_BYTES: usize = 16;

/// Refuses a secret shorter than [`MIN_SECRET_BYTES`], naming the setting
/// (`what`) and the length given, never the secret.
pub fn check_secret_length(what: &str, secret: &str) -> Result<(), String> {
    match secret.len() {
        n if n < MIN_SECRET_BYTES => Err(format!(
            "{what} is {n} bytes long: a shared secret needs {MIN_SECRET_BYTES} bytes at least \
             (make one with `openssl rand -hex 32`)"
        )),
        _ => Ok(()),
    }
}

/// What a server listening beyond loopback without a service token says
/// when it is not told `--insecure`: the reason, and the three ways out.
const EXPOSED: &str = "anyone who reaches it could call every RPC. Set CLAWGATE_SERVICE_TOKEN \
     or the per-kind CLAWGATE_*_TOKENS (docs/security.md), require client certificates \
     (CLAWGATE_TLS_CLIENT_CA with CLAWGATE_TLS_CERT and CLAWGATE_TLS_KEY: mutual TLS), listen on \
     loopback, or pass --insecure (CLAWGATE_INSECURE=true) to serve without authentication anyway";

/// The start-up rule of a gRPC server (`service`, listening on `listen`):
/// its tokens (`shared`, what it sends, and the per-kind ones it accepts)
/// must be long enough and each of one caller, and a server reachable
/// beyond loopback must authenticate its callers — by accepted tokens, or
/// by mutual TLS (`mutual_tls`: client certificates required,
/// `--tls-client-ca`) — unless `insecure` says it is to be open.
pub fn check_exposure(
    service: &str,
    listen: std::net::SocketAddr,
    shared: Option<&ServiceTokens>,
    callers: &CallerTokenArgs,
    mutual_tls: bool,
    insecure: bool,
) -> Result<(), String> {
    if let Some(shared) = shared {
        shared.check()?;
    }
    callers.check(shared)?;
    match callers.accepted(shared) {
        Some(_) => Ok(()),
        None if mutual_tls || insecure || listen.ip().is_loopback() => Ok(()),
        None => Err(format!(
            "{service} listens on {listen}, beyond loopback, with no service token: {EXPOSED}"
        )),
    }
}

/// Whether the host of `address` (`http://host:port/…`, `host:port`, or a
/// bare host) is this machine only: `localhost` or a loopback IP.
pub fn is_loopback_address(address: &str) -> bool {
    let rest = address.split_once("://").map_or(address, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let authority = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let host = match authority.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
        None if authority.matches(':').count() > 1 => authority,
        None => authority.split(':').next().unwrap_or_default(),
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Whether `a` and `b` are equal, in time that depends on neither.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let (a, b) = (Sha256::digest(a), Sha256::digest(b));
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// The service tokens this process accepts; it sends the first.
#[derive(Clone, PartialEq, Eq)]
pub struct ServiceTokens(Arc<[String]>);

impl std::fmt::Debug for ServiceTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ServiceTokens(<{} redacted>)", self.0.len())
    }
}

impl FromStr for ServiceTokens {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let tokens: Vec<String> = raw.split(',').map(|t| t.trim().to_owned()).collect();
        if tokens.iter().any(String::is_empty) {
            return Err("a service token may not be empty".into());
        }
        if let Some(bad) = tokens.iter().find(|t| HeaderValue::from_str(t).is_err()) {
            return Err(format!(
                "a service token must be visible ASCII ({} characters given)",
                bad.chars().count()
            ));
        }
        Ok(Self(tokens.into()))
    }
}

impl ServiceTokens {
    /// Refuses tokens shorter than [`MIN_SECRET_BYTES`], by their place in
    /// the list (never printed).
    pub fn check(&self) -> Result<(), String> {
        for (n, token) in self.0.iter().enumerate() {
            let what = format!(
                "CLAWGATE_SERVICE_TOKEN (token {} of {})",
                n + 1,
                self.0.len()
            );
            check_secret_length(&what, token)?;
        }
        Ok(())
    }

    /// The `authorization` value this process sends.
    fn header(&self) -> HeaderValue {
        let mut value =
            HeaderValue::from_str(&format!("Bearer {}", self.0[0])).expect("checked when parsed");
        value.set_sensitive(true);
        value
    }

    /// The token this process sends.
    pub fn first(&self) -> &str {
        &self.0[0]
    }

    /// Every token, the sent one first.
    pub fn all(&self) -> &[String] {
        &self.0
    }
}

/// Adds the service token to every call of a client channel.
#[derive(Debug, Clone)]
pub struct WithServiceToken<S> {
    inner: S,
    authorization: Option<HeaderValue>,
}

impl<S> WithServiceToken<S> {
    pub fn new(inner: S, tokens: Option<&ServiceTokens>) -> Self {
        Self {
            inner,
            authorization: tokens.map(ServiceTokens::header),
        }
    }
}

impl<S, B> Service<http::Request<B>> for WithServiceToken<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        if let Some(value) = &self.authorization {
            request
                .headers_mut()
                .insert(http::header::AUTHORIZATION, value.clone());
        }
        self.inner.call(request)
    }
}

/// On a tonic server (`Server::builder().layer(…)`): refuses calls
/// without a caller `UNAUTHENTICATED`, and calls the caller's kind may not
/// make by the service's table `PERMISSION_DENIED`; passes the others on
/// with the caller's [`CallerIdentity`] in the request's extensions. With
/// no tokens, a call whose transport named no caller passes as it is.
#[derive(Debug, Clone)]
pub struct ServiceAuthLayer {
    tokens: Option<CallerTokens>,
    table: &'static AccessTable,
}

impl ServiceAuthLayer {
    pub fn new(tokens: Option<CallerTokens>, table: &'static AccessTable) -> Self {
        Self { tokens, table }
    }
}

impl<S> Layer<S> for ServiceAuthLayer {
    type Service = ServiceAuth<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ServiceAuth {
            inner,
            tokens: self.tokens.clone(),
            table: self.table,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ServiceAuth<S> {
    inner: S,
    tokens: Option<CallerTokens>,
    table: &'static AccessTable,
}

impl<S> ServiceAuth<S> {
    /// The caller of `request`, or the refusal it gets; `Ok(None)`: an
    /// open server and a caller no transport named.
    fn admit<B>(
        &self,
        request: &http::Request<B>,
    ) -> Result<Option<CallerIdentity>, tonic::Status> {
        let path = request.uri().path();
        let caller = CallerIdentity::from_extensions(request.extensions()).or_else(|| {
            let authorization = request.headers().get(http::header::AUTHORIZATION);
            self.tokens.as_ref()?.identify(authorization)
        });
        match caller {
            _ if path.starts_with("/grpc.health.") => Ok(None),
            None if self.tokens.is_none() => Ok(None),
            None => Err(tonic::Status::unauthenticated(
                "this call needs a service token (CLAWGATE_SERVICE_TOKEN) this server accepts",
            )),
            Some(caller) if self.table.allows(caller.kind, path) => Ok(Some(caller)),
            Some(caller) => Err(tonic::Status::permission_denied(format!(
                "the {} caller may not call {path} (docs/security.md)",
                caller.kind
            ))),
        }
    }
}

impl<S, B> Service<http::Request<B>> for ServiceAuth<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<S::Future, Ready<Result<S::Response, S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        match self.admit(&request) {
            Ok(caller) => {
                if let Some(caller) = caller {
                    request.extensions_mut().insert(caller);
                }
                Either::Left(self.inner.call(request))
            }
            Err(refusal) => Either::Right(ready(Ok(refusal.into_http()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(value: &str) -> HeaderValue {
        HeaderValue::from_str(value).unwrap()
    }

    #[test]
    fn tokens_parse_accept_and_stay_unprinted() {
        let tokens: ServiceTokens = "new-token-0123456, old-token-0123456".parse().unwrap();
        let accepted = CallerTokenArgs::default().accepted(Some(&tokens)).unwrap();
        let accepts = |value: Option<&HeaderValue>| accepted.identify(value).is_some();
        assert!(accepts(Some(&header("Bearer new-token-0123456"))));
        assert!(accepts(Some(&header("Bearer old-token-0123456"))));
        assert!(!accepts(Some(&header("Bearer other"))));
        assert!(
            !accepts(Some(&header("new-token-0123456"))),
            "the scheme is needed"
        );
        assert!(!accepts(None));
        assert_eq!(
            tokens.header(),
            header("Bearer new-token-0123456"),
            "the first is sent"
        );
        assert!(tokens.header().is_sensitive());
        assert!(!format!("{tokens:?}").contains("token"));
        assert!("a,,b".parse::<ServiceTokens>().is_err());
        assert!("".parse::<ServiceTokens>().is_err());
        assert!("bad\ntoken-0123456789".parse::<ServiceTokens>().is_err());
        assert_eq!(tokens.check(), Ok(()));
        let short: ServiceTokens = "long-enough-token-1,short".parse().unwrap();
        assert_eq!(
            short.check().unwrap_err(),
            "CLAWGATE_SERVICE_TOKEN (token 2 of 2) is 5 bytes long: a shared secret needs \
             16 bytes at least (make one with `openssl rand -hex 32`)"
        );
    }

    #[test]
    fn a_server_beyond_loopback_needs_tokens_unless_told_insecure() {
        let any: std::net::SocketAddr = "0.0.0.0:50061".parse().unwrap();
        let local: std::net::SocketAddr = "127.0.0.1:50061".parse().unwrap();
        let tokens: ServiceTokens = "a-long-enough-token".parse().unwrap();
        let none = CallerTokenArgs::default();
        let scoped = CallerTokenArgs {
            internal_tokens: Some("an-internal-token-0123".parse().unwrap()),
            ..CallerTokenArgs::default()
        };
        assert_eq!(
            check_exposure("the store", local, None, &none, false, false),
            Ok(())
        );
        assert_eq!(
            check_exposure("the store", any, Some(&tokens), &none, false, false),
            Ok(())
        );
        assert_eq!(
            check_exposure("the store", any, None, &scoped, false, false),
            Ok(())
        );
        assert_eq!(
            check_exposure("the store", any, None, &none, true, false),
            Ok(()),
            "mutual TLS authenticates the callers"
        );
        assert_eq!(
            check_exposure("the store", any, None, &none, false, true),
            Ok(())
        );
        let short: ServiceTokens = "short".parse().unwrap();
        assert!(check_exposure("the store", local, Some(&short), &scoped, false, false).is_err());
        let refused = check_exposure("the store", any, None, &none, false, false).unwrap_err();
        assert!(
            refused.starts_with("the store listens on 0.0.0.0:50061, beyond loopback, with no"),
            "{refused}"
        );
        assert!(refused.contains("--insecure"), "{refused}");
    }

    const TABLE: AccessTable = AccessTable {
        service: "pkg.Store",
        grants: &[
            (CallerKind::Coordinator, &[&["Append"]]),
            (CallerKind::Edge, &[&["Read"]]),
        ],
    };

    /// What the layer answers `request` (its grpc-status, `None` when it
    /// passed it on), and the caller the inner service saw.
    fn through_layer(
        tokens: Option<CallerTokens>,
        request: http::Request<()>,
    ) -> (Option<String>, Option<CallerIdentity>) {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(None));
        let inner = {
            let seen = seen.clone();
            tower::service_fn(move |request: http::Request<()>| {
                *seen.lock().unwrap() = Some(request.extensions().get::<CallerIdentity>().cloned());
                ready(Ok::<_, std::convert::Infallible>(http::Response::new(
                    tonic::body::Body::empty(),
                )))
            })
        };
        let mut service = ServiceAuthLayer::new(tokens, &TABLE).layer(inner);
        let response = futures::executor::block_on(service.call(request)).unwrap();
        let status = tonic::Status::from_header_map(response.headers())
            .map(|status| format!("{} {}", status.code() as i32, status.message()));
        let passed = seen.lock().unwrap().take();
        assert_eq!(passed.is_some(), status.is_none(), "{status:?}");
        (status, passed.flatten())
    }

    fn call(path: &str, token: Option<&str>) -> http::Request<()> {
        let mut request = http::Request::builder().uri(path);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        request.body(()).unwrap()
    }

    #[test]
    fn the_layer_refuses_unknown_callers_and_calls_outside_their_kind() {
        let args = CallerTokenArgs {
            edge_tokens: Some("edge-token-0123456789".parse().unwrap()),
            coordinator_tokens: Some("coordinator-token-0123456789".parse().unwrap()),
            internal_tokens: None,
        };
        let tokens = || args.accepted(None);
        let (refused, _) = through_layer(
            tokens(),
            call("/pkg.Store/Append", Some("edge-token-0123456789")),
        );
        assert_eq!(
            refused.as_deref(),
            Some("7 the edge caller may not call /pkg.Store/Append (docs/security.md)")
        );
        let (passed, caller) = through_layer(
            tokens(),
            call("/pkg.Store/Append", Some("coordinator-token-0123456789")),
        );
        assert_eq!(passed, None);
        assert_eq!(caller, Some(CallerIdentity::of(CallerKind::Coordinator)));
        let (refused, _) =
            through_layer(tokens(), call("/pkg.Store/Read", Some("wrong-token-0123")));
        assert!(refused.unwrap().starts_with("16 "));
        let (refused, _) = through_layer(tokens(), call("/pkg.Store/Read", None));
        assert!(refused.unwrap().starts_with("16 "));
        let (passed, _) = through_layer(tokens(), call("/grpc.health.v1.Health/Check", None));
        assert_eq!(passed, None, "health stays open");
        let (passed, caller) = through_layer(None, call("/pkg.Store/Append", None));
        assert_eq!((passed, caller), (None, None), "no tokens: open");
    }

    #[test]
    fn a_caller_named_by_the_transport_is_the_caller() {
        let mut request = call("/pkg.Store/Append", None);
        request.extensions_mut().insert(CallerKind::Edge);
        let (refused, _) = through_layer(None, request);
        assert!(refused.unwrap().starts_with("7 the edge caller"));
        let mut request = call("/pkg.Store/Read", Some("not-a-token-at-all"));
        let scoped = CallerIdentity {
            kind: CallerKind::Edge,
            session_prefix: Some("agent:x:".into()),
        };
        request.extensions_mut().insert(scoped.clone());
        let tokens =
            CallerTokenArgs::default().accepted(Some(&"shared-token-0123456789".parse().unwrap()));
        assert_eq!(through_layer(tokens, request), (None, Some(scoped)));
    }

    #[test]
    fn loopback_addresses_are_told_apart() {
        for local in [
            "http://127.0.0.1:50061",
            "http://localhost:50062/",
            "127.0.0.2:1",
            "http://[::1]:50061",
            "::1",
            "LOCALHOST",
        ] {
            assert!(is_loopback_address(local), "{local}");
        }
        for remote in [
            "http://session-store:50061",
            "http://10.0.0.1:50061",
            "http://[fd00::1]:1",
            "http://localhost.example.com:1",
            "",
        ] {
            assert!(!is_loopback_address(remote), "{remote}");
        }
    }

    #[test]
    fn equality_in_constant_time_is_equality() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret-longer"));
        assert!(!constant_time_eq(b"", b"x"));
    }
}
