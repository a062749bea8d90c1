//! The edge's span for each request frame: a SERVER span named after the
//! gateway method. It continues the `traceparent` the client put in the
//! frame, else it starts a trace of its own; never the connection's, so one
//! long-lived socket does not become one endless trace.

use clawgate_telemetry::otel::OpenTelemetrySpanExt;
use clawgate_telemetry::propagation;
use tracing::Span;
use tracing::field::Empty;

use crate::protocol::frames::{ErrorShape, Request};

pub fn request_span(request: &Request) -> Span {
    let method = request.method.as_str();
    let span = tracing::info_span!(
        parent: None,
        "gateway.request",
        otel.name = method,
        otel.kind = "server",
        otel.status_code = Empty,
        gateway.method = method,
        gateway.request.id = request.id.as_str(),
        gateway.error.code = Empty,
        run.id = Empty,
        session.key = Empty,
    );
    if let Some(parent) = request
        .traceparent
        .as_deref()
        .and_then(|traceparent| propagation::remote_parent(traceparent, None))
    {
        let _ = span.set_parent(parent);
    }
    span
}

/// Names the run the current request is about.
pub fn record_run(run_id: &str) {
    Span::current().record("run.id", run_id);
}

/// Names the session the current request is about.
pub fn record_session(session_key: &str) {
    Span::current().record("session.key", session_key);
}

/// Marks the current request failed with the protocol's error code.
pub fn record_error(error: &ErrorShape) {
    let span = Span::current();
    span.record("otel.status_code", "error");
    span.record("gateway.error.code", error.code);
}
