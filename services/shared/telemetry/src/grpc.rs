//! gRPC spans and W3C context propagation as tower layers, so no handler and
//! no call site carries tracing code.
//!
//! * [`GrpcServerTraceLayer`] (on `tonic::transport::Server::builder()`):
//!   continues the caller's trace from the request metadata, opens a SERVER
//!   span named by the fully-qualified method and copies the recorded
//!   baggage keys (`run.id`, `session.key`) into its attributes.
//! * [`GrpcClientTraceLayer`] (around a `Channel`): opens a CLIENT span as a
//!   child of the current span and writes its context into the metadata.
//!
//! Both record `rpc.response.status_code` from `grpc-status` — in the
//! response headers for a trailers-only answer, else in the trailers — and
//! keep the span open until the response body ends, so a streaming call's
//! span covers the whole stream. Span fields follow the OpenTelemetry RPC
//! conventions (`rpc.system.name`, `rpc.method`, `rpc.response.status_code`,
//! `server.address`, `error.type`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use opentelemetry::baggage::BaggageExt;
use pin_project_lite::pin_project;
use tower::{Layer, Service};
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::propagation::{self, RECORDED_BAGGAGE};
use crate::service_auth::{ServiceTokens, WithServiceToken};

/// Which end of a call a span stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Client,
    Server,
}

/// Health probes and reflection would bury the traces that matter.
fn untraced(path: &str) -> bool {
    path.starts_with("/grpc.health.") || path.starts_with("/grpc.reflection.")
}

/// `/pkg.Service/Method` → `pkg.Service/Method`, the `rpc.method` value.
fn method_of<B>(request: &http::Request<B>) -> &str {
    request.uri().path().trim_start_matches('/')
}

/// The gRPC status code names, by number (`rpc.response.status_code`).
const CODE_NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// Whether a status code marks the span as failed: every non-OK code for a
/// client; for a server only the codes that mean the server failed (a
/// NOT_FOUND answer is the server doing its job).
fn is_error(side: Side, code: usize) -> bool {
    match side {
        Side::Client => code != 0,
        Side::Server => matches!(code, 2 | 4 | 12 | 13 | 14 | 15),
    }
}

fn record_status(span: &Span, side: Side, status: &http::HeaderValue) {
    let code = status
        .to_str()
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .filter(|code| *code < CODE_NAMES.len())
        .unwrap_or(2);
    let name = CODE_NAMES[code];
    span.record("rpc.response.status_code", name);
    if is_error(side, code) {
        span.record("otel.status_code", "error");
        span.record("error.type", name);
    }
}

/// A call that ended without any gRPC status (connection lost, reset).
fn record_broken(span: &Span) {
    span.record("rpc.response.status_code", "UNAVAILABLE");
    span.record("otel.status_code", "error");
    span.record("error.type", "transport");
}

pin_project! {
    /// The response future: records a trailers-only status, then hands the
    /// span to the body.
    pub struct TracedFuture<F> {
        #[pin]
        inner: F,
        span: Option<Span>,
        side: Side,
    }
}

impl<F, ResBody, E> Future for TracedFuture<F>
where
    F: Future<Output = Result<http::Response<ResBody>, E>>,
{
    type Output = Result<http::Response<TracedBody<ResBody>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let _entered = this.span.as_ref().map(Span::enter);
        let result = std::task::ready!(this.inner.poll(cx));
        drop(_entered);
        let span = this.span.take();
        Poll::Ready(match result {
            Ok(response) => {
                let span = span.and_then(|span| match response.headers().get("grpc-status") {
                    Some(status) => {
                        record_status(&span, *this.side, status);
                        None
                    }
                    None => Some(span),
                });
                let side = *this.side;
                Ok(response.map(|inner| TracedBody { inner, span, side }))
            }
            Err(error) => {
                if let Some(span) = &span {
                    record_broken(span);
                }
                Err(error)
            }
        })
    }
}

pin_project! {
    /// A response body that holds the call's span until its trailers (or its
    /// end) arrive.
    pub struct TracedBody<B> {
        #[pin]
        inner: B,
        span: Option<Span>,
        side: Side,
    }
}

impl<B: Body> Body for TracedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(status) = frame.trailers_ref().and_then(|t| t.get("grpc-status"))
                    && let Some(span) = this.span.take()
                {
                    record_status(&span, *this.side, status);
                }
            }
            Poll::Ready(Some(Err(_))) | Poll::Ready(None) => {
                if let Some(span) = this.span.take() {
                    record_broken(&span);
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// How one side of a call opens its span (and, for a client, hands the
/// span's context on in the request).
pub trait CallSide: Clone {
    fn open<B>(&self, request: &mut http::Request<B>) -> (Span, Side);
}

/// A service whose calls are traced the way `K` says.
#[derive(Debug, Clone)]
pub struct GrpcTrace<S, K> {
    inner: S,
    side: K,
}

impl<S, K, ReqBody, ResBody> Service<http::Request<ReqBody>> for GrpcTrace<S, K>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    K: CallSide,
{
    type Response = http::Response<TracedBody<ResBody>>;
    type Error = S::Error;
    type Future = TracedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<ReqBody>) -> Self::Future {
        let (span, side) = if untraced(request.uri().path()) {
            (Span::none(), Side::Server)
        } else {
            self.side.open(&mut request)
        };
        let inner = span.in_scope(|| self.inner.call(request));
        TracedFuture {
            inner,
            span: Some(span),
            side,
        }
    }
}

/// Traces the calls a tonic server receives.
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcServerTraceLayer;

impl<S> Layer<S> for GrpcServerTraceLayer {
    type Service = GrpcTrace<S, GrpcServerTraceLayer>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcTrace { inner, side: *self }
    }
}

impl CallSide for GrpcServerTraceLayer {
    fn open<B>(&self, request: &mut http::Request<B>) -> (Span, Side) {
        let method = method_of(request);
        let span = tracing::info_span!(
            target: "otel::grpc",
            parent: None,
            "grpc.server",
            otel.name = method,
            otel.kind = "server",
            otel.status_code = Empty,
            rpc.system.name = "grpc",
            rpc.method = method,
            rpc.response.status_code = Empty,
            error.type = Empty,
            run.id = Empty,
            session.key = Empty,
        );
        if !span.is_disabled() {
            let parent = propagation::extract(request.headers());
            for key in RECORDED_BAGGAGE {
                if let Some(value) = parent.baggage().get(key) {
                    span.record(key, value.as_str());
                }
            }
            let _ = span.set_parent(parent);
        }
        (span, Side::Server)
    }
}

/// Where a client's calls go (`server.address`, `server.port`).
#[derive(Debug)]
struct Peer {
    address: String,
    port: Option<u16>,
}

/// Traces the calls a tonic client makes and propagates their context.
#[derive(Debug, Clone)]
pub struct GrpcClientTraceLayer {
    peer: Arc<Peer>,
}

impl GrpcClientTraceLayer {
    /// `endpoint` is the address the channel connects to.
    pub fn new(endpoint: &http::Uri) -> Self {
        Self {
            peer: Arc::new(Peer {
                address: endpoint.host().unwrap_or_default().to_owned(),
                port: endpoint.port_u16(),
            }),
        }
    }
}

impl<S> Layer<S> for GrpcClientTraceLayer {
    type Service = GrpcTrace<S, GrpcClientTraceLayer>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcTrace {
            inner,
            side: self.clone(),
        }
    }
}

impl CallSide for GrpcClientTraceLayer {
    fn open<B>(&self, request: &mut http::Request<B>) -> (Span, Side) {
        let method = method_of(request);
        let span = tracing::info_span!(
            target: "otel::grpc",
            "grpc.client",
            otel.name = method,
            otel.kind = "client",
            otel.status_code = Empty,
            rpc.system.name = "grpc",
            rpc.method = method,
            rpc.response.status_code = Empty,
            error.type = Empty,
            server.address = self.peer.address.as_str(),
            server.port = self.peer.port,
        );
        if !span.is_disabled() {
            propagation::inject(&span.context(), request.headers_mut());
        }
        (span, Side::Client)
    }
}

/// A tonic channel to another clawgate service: its calls are traced and
/// carry the service token when there is one.
pub type TracedChannel =
    GrpcTrace<WithServiceToken<tonic::transport::Channel>, GrpcClientTraceLayer>;

/// Wraps a channel to `endpoint` in the client trace layer (no token).
pub fn traced_channel(channel: tonic::transport::Channel, endpoint: &http::Uri) -> TracedChannel {
    service_channel(channel, endpoint, None)
}

/// Wraps a channel to another clawgate service `endpoint` in the client
/// trace layer, its calls carrying `tokens`' first token.
pub fn service_channel(
    channel: tonic::transport::Channel,
    endpoint: &http::Uri,
    tokens: Option<&ServiceTokens>,
) -> TracedChannel {
    GrpcClientTraceLayer::new(endpoint).layer(WithServiceToken::new(channel, tokens))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_classify_by_side() {
        assert!(!is_error(Side::Server, 5), "NOT_FOUND is an answer");
        assert!(is_error(Side::Client, 5));
        assert!(is_error(Side::Server, 13));
        assert!(!is_error(Side::Client, 0));
        assert_eq!(CODE_NAMES[14], "UNAVAILABLE");
        assert_eq!(CODE_NAMES[16], "UNAUTHENTICATED");
    }

    #[test]
    fn probes_are_not_traced() {
        assert!(untraced("/grpc.health.v1.Health/Check"));
        assert!(untraced(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
        ));
        assert!(!untraced("/clawgate.session_store.v1.SessionStore/Append"));
    }
}
