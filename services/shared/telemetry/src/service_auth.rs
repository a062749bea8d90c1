//! Service-to-service trust: a shared service token, as tower layers.
//!
//! When the services are given tokens (`--service-token`,
//! `CLAWGATE_SERVICE_TOKEN`, comma-separated), every gRPC call between them
//! carries the first in `authorization: Bearer <token>`, and a server
//! answers any call without one of its tokens `UNAUTHENTICATED` before the
//! call reaches a handler. Several tokens let a token be rotated without a
//! pause: servers accept the new and the old one while clients move to the
//! new one. Health checks (`grpc.health.v1`) stay open, since Kubernetes'
//! gRPC probes cannot send a header. Without tokens both layers pass every
//! call through.
//!
//! Tokens are compared in constant time (of digests, so neither where they
//! differ nor their length shows), and never printed: their `Debug` is
//! redacted. A process given a token shorter than [`MIN_SECRET_BYTES`]
//! stops at start ([`ServiceTokens::check`]; not when the flag is parsed,
//! since the parser would print the value it refuses).

use std::str::FromStr;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::{Either, Ready, ready};
use http::HeaderValue;
use sha2::{Digest, Sha256};
use tower::{Layer, Service};

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
     (docs/security.md), require client certificates (CLAWGATE_TLS_CLIENT_CA with \
     CLAWGATE_TLS_CERT and CLAWGATE_TLS_KEY: mutual TLS), listen on loopback, or pass --insecure \
     (CLAWGATE_INSECURE=true) to serve without authentication anyway";

/// The start-up rule of a gRPC server (`service`, listening on `listen`):
/// its tokens must be long enough, and a server reachable beyond loopback
/// must authenticate its callers — by tokens, or by mutual TLS
/// (`mutual_tls`: client certificates required, `--tls-client-ca`) —
/// unless `insecure` says it is to be open.
pub fn check_exposure(
    service: &str,
    listen: std::net::SocketAddr,
    tokens: Option<&ServiceTokens>,
    mutual_tls: bool,
    insecure: bool,
) -> Result<(), String> {
    match tokens {
        Some(tokens) => tokens.check(),
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

    /// Whether `authorization` holds one of the tokens.
    fn accepts(&self, authorization: Option<&HeaderValue>) -> bool {
        let given = authorization
            .and_then(|value| value.as_bytes().strip_prefix(b"Bearer "))
            .unwrap_or_default();
        // Every token is compared, so the time does not tell which matched.
        self.0.iter().fold(false, |found, token| {
            found | constant_time_eq(given, token.as_bytes())
        })
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

/// Refuses calls without one of the tokens, on a tonic server
/// (`Server::builder().layer(…)`); `None`: every call passes.
#[derive(Debug, Clone)]
pub struct ServiceAuthLayer {
    tokens: Option<ServiceTokens>,
}

impl ServiceAuthLayer {
    pub fn new(tokens: Option<ServiceTokens>) -> Self {
        Self { tokens }
    }
}

impl<S> Layer<S> for ServiceAuthLayer {
    type Service = ServiceAuth<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ServiceAuth {
            inner,
            tokens: self.tokens.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct ServiceAuth<S> {
    inner: S,
    tokens: Option<ServiceTokens>,
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

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let open = request.uri().path().starts_with("/grpc.health.");
        match &self.tokens {
            Some(tokens)
                if !open && !tokens.accepts(request.headers().get(http::header::AUTHORIZATION)) =>
            {
                let refusal = tonic::Status::unauthenticated(
                    "this call needs the service token (CLAWGATE_SERVICE_TOKEN)",
                );
                Either::Right(ready(Ok(refusal.into_http())))
            }
            _ => Either::Left(self.inner.call(request)),
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
        assert!(tokens.accepts(Some(&header("Bearer new-token-0123456"))));
        assert!(tokens.accepts(Some(&header("Bearer old-token-0123456"))));
        assert!(!tokens.accepts(Some(&header("Bearer other"))));
        assert!(
            !tokens.accepts(Some(&header("new-token-0123456"))),
            "the scheme is needed"
        );
        assert!(!tokens.accepts(None));
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
        assert_eq!(
            check_exposure("the store", local, None, false, false),
            Ok(())
        );
        assert_eq!(
            check_exposure("the store", any, Some(&tokens), false, false),
            Ok(())
        );
        assert_eq!(
            check_exposure("the store", any, None, true, false),
            Ok(()),
            "mutual TLS authenticates the callers"
        );
        assert_eq!(check_exposure("the store", any, None, false, true), Ok(()));
        let refused = check_exposure("the store", any, None, false, false).unwrap_err();
        assert!(
            refused.starts_with("the store listens on 0.0.0.0:50061, beyond loopback, with no"),
            "{refused}"
        );
        assert!(refused.contains("--insecure"), "{refused}");
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
