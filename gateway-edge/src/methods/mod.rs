//! Request dispatch and the served methods, one file per family: `health`
//! (`health`, `status`), `agent` (`agent`, `agent.wait`, `agents.list`),
//! `chat` (`chat.*`), `sessions` (`sessions.*`), `runs` (`runs.resume`)
//! and the rest.
//!
//! The method table (`table.rs`) is the one list of what is served: one row
//! per method with its name, the scope it needs, its params schema and its
//! handler. Its names are advertised in `hello-ok.features.methods`,
//! authorization reads the scope from it, dispatch checks the params
//! against its schema and finds the handler in it; adding a method is one
//! row and its handler. Each request runs in its own task, so answers leave
//! in the order they finish.

mod absent;
mod agent;
mod attachments;
mod catalog;
mod chat;
mod commands;
mod compact;
mod diagnostics;
mod health;
mod history;
mod logs;
mod preview;
mod runs;
mod session_list;
mod session_settings;
mod sessions;
mod surfaces;
mod table;
pub mod trace;
mod usage;
mod usage_rollup;

use std::sync::Arc;
use std::time::Instant;

use run_coordinator_api::CoordinatorError;
use serde_json::{Value, json};
use session_store_api::SessionKey;
use tracing::Instrument;

pub use health::{broadcast_health, health_summary};
pub use table::{SERVED_METHODS, advertised_methods, param_keys, required_access};

use crate::auth::scopes;
use crate::events::Events;
use crate::protocol::frames::{self, ErrorShape, FrameError, Request, parse_request};
use crate::protocol::json_depth::nests_deeper_than;
use crate::protocol::params::Params;
use crate::state::Edge;
use crate::state::connection::{CloseOrder, Conn};

/// What a handler is given: the edge and its events, the calling
/// connection, the request with its params checked against the method's
/// schema, and when its frame arrived (for the ACK latency).
pub(crate) struct Call<'a> {
    pub edge: &'a Arc<Edge>,
    pub events: &'a Arc<Events>,
    pub conn: &'a Arc<Conn>,
    pub request: &'a Request,
    pub params: Params<'a>,
    pub received: Instant,
    /// Work to do once the answer is queued (events the protocol orders
    /// after the answer, such as `sessions.changed` after a reset's).
    after_reply: std::sync::Mutex<Vec<Box<dyn FnOnce() + Send>>>,
}

impl Call<'_> {
    /// Runs `work` right after this call's answer is queued on its connection.
    pub fn after_reply(&self, work: impl FnOnce() + Send + 'static) {
        self.after_reply.lock().unwrap().push(Box::new(work));
    }
}

/// A method's answer: ok with a payload, or an error (with a payload for
/// the few methods that send both).
pub(crate) type Answer = Result<Value, (ErrorShape, Option<Value>)>;

pub(crate) fn fail(error: ErrorShape) -> (ErrorShape, Option<Value>) {
    (error, None)
}

/// When a request refused for the connection's in-flight limit may be
/// sent again.
const IN_FLIGHT_RETRY_AFTER_MS: u64 = 100;

/// Reads one text frame of an authenticated connection.
pub fn dispatch(edge: &Arc<Edge>, events: &Arc<Events>, conn: &Arc<Conn>, text: &str) {
    let received = Instant::now();
    let max_depth = edge.config.max_json_depth;
    if nests_deeper_than(text, max_depth) {
        let error = ErrorShape::invalid(format!(
            "invalid request frame: nested deeper than {max_depth} levels (EDGE_MAX_JSON_DEPTH)"
        ));
        reply(edge, conn, "invalid", table::OTHER, Err(fail(error)));
        return;
    }
    let request = match parse_request(text) {
        Ok(request) => request,
        // Unparsable JSON after the handshake is ignored.
        Err(FrameError::NotJson) => return,
        Err(FrameError::Invalid { id, reason }) => {
            let error = ErrorShape::invalid(format!("invalid request frame: {reason}"));
            let id = id.as_deref().unwrap_or("invalid");
            reply(edge, conn, id, table::OTHER, Err(fail(error)));
            return;
        }
    };
    let method = table::method(&request.method);
    let label = method.map_or(table::OTHER, |m| m.name);
    let refused = |error| reply(edge, conn, &request.id, label, Err(fail(error)));
    let required = required_access(&request.method, &request.params);
    if let Err(error) = scopes::authorize(required, &conn.role, &conn.scopes) {
        // Not `reply`: this answer must not end the row it counts in.
        send_answer(edge, conn, &request.id, label, Err(fail(error)));
        if conn.requests.unauthorized() > edge.config.unauthorized_flood_limit {
            conn.outbox.close(CloseOrder {
                code: 1008,
                reason: "repeated unauthorized calls".into(),
            });
        }
        return;
    }
    if request.method == "connect" {
        refused(ErrorShape::invalid(
            "connect is only valid as the first request",
        ));
        return;
    }
    let Some(method) = method else {
        refused(ErrorShape::invalid(format!(
            "unknown method: {}",
            request.method
        )));
        return;
    };
    // Counted before the in-flight limit: a request refused there gives its
    // bytes back as it returns.
    let Some(bytes) = edge.request_bytes.try_take(text.len()) else {
        edge.metrics.limit_hit("EDGE_MAX_REQUEST_BYTES");
        let limit = edge.request_bytes.limit();
        refused(
            ErrorShape::unavailable(format!(
                "the gateway is handling too many request bytes (at most {limit}, EDGE_MAX_REQUEST_BYTES); retry later"
            ))
            .retry_after(IN_FLIGHT_RETRY_AFTER_MS)
            .with_details(json!({ "code": "TOO_MANY_REQUEST_BYTES", "limit": limit })),
        );
        return;
    };
    let max_in_flight = edge.config.max_in_flight;
    if !conn.requests.admit(max_in_flight) {
        refused(
            ErrorShape::unavailable(format!(
                "too many requests in flight on this connection (at most {max_in_flight}, EDGE_MAX_IN_FLIGHT)"
            ))
            .retry_after(IN_FLIGHT_RETRY_AFTER_MS)
            .with_details(json!({ "code": "TOO_MANY_IN_FLIGHT", "limit": max_in_flight })),
        );
        return;
    }
    let (edge, events, conn) = (edge.clone(), events.clone(), conn.clone());
    let span = trace::request_span(&request);
    tokio::spawn(
        async move {
            let _in_flight = conn.requests.started();
            let _bytes = bytes;
            let params = method.schema.prepare(&request.params, &conn.client.mode);
            let params = match method.schema.check(method.name, &params) {
                Ok(params) => params,
                Err(error) => {
                    reply(&edge, &conn, &request.id, method.name, Err(fail(error)));
                    return;
                }
            };
            let call = Call {
                edge: &edge,
                events: &events,
                conn: &conn,
                request: &request,
                params,
                received,
                after_reply: Default::default(),
            };
            let answer = (method.handler)(&call).await;
            reply(&edge, &conn, &request.id, method.name, answer);
            for work in call.after_reply.into_inner().unwrap() {
                work();
            }
        }
        .instrument(span),
    );
}

/// Sends the (final) answer to a request and counts it under `label` (the
/// method's name in the table, or [`table::OTHER`]). The flood guard
/// counts refused authorizations in a row: any other answer ends the row.
fn reply(edge: &Edge, conn: &Conn, id: &str, label: &'static str, answer: Answer) {
    conn.requests.answered();
    send_answer(edge, conn, id, label, answer);
}

fn send_answer(edge: &Edge, conn: &Conn, id: &str, label: &'static str, answer: Answer) {
    let frame = match answer {
        Ok(payload) => {
            edge.metrics.request(label, Ok(()));
            frames::ok_response(id, payload)
        }
        Err((error, payload)) => {
            edge.metrics.request(label, Err(error.code));
            trace::record_error(&error);
            frames::error_response(id, &error, payload)
        }
    };
    conn.outbox.send_frame(frame);
}

/// A coordinator's refusal, or its absence, in the protocol's words.
pub(crate) fn backend_error(err: CoordinatorError) -> (ErrorShape, Option<Value>) {
    let message = err.to_string();
    let error = match err {
        CoordinatorError::KeyReused { existing } => {
            ErrorShape::invalid("idempotencyKey was already used with a different request")
                .with_details(json!({
                    "code": "IDEMPOTENCY_KEY_REUSED",
                    "runId": existing.run_id,
                }))
        }
        CoordinatorError::InvalidArgument(_) => ErrorShape::invalid(message),
        // A request over a backend's gRPC message limit (a deployment whose
        // limits disagree, docs/limits.md): the request is at fault.
        CoordinatorError::TooLarge(_) => ErrorShape::invalid(format!(
            "the request is too large for the run coordinator: {message}"
        )),
        // The transport's own words, as every client of it has them.
        CoordinatorError::Unavailable(transport) => {
            ErrorShape::unavailable(transport).retry_after(500)
        }
        // Nothing was decided: the same request may succeed in a moment.
        err if err.is_retryable() => ErrorShape::unavailable(message).retry_after(500),
        // A busy session (queue mode reject), settings that changed, a
        // coordinator's fault: not the same answer again at once.
        _ => ErrorShape::unavailable(message),
    };
    (error, None)
}

pub(crate) fn store_error(err: session_store_api::StoreError) -> (ErrorShape, Option<Value>) {
    use session_store_api::StoreError;
    let error = match err {
        StoreError::InvalidArgument(message) => ErrorShape::invalid(message),
        // The store refused the edge's token or its kind: a deployment's
        // mistake (docs/security.md), which a retry does not mend.
        StoreError::Unauthenticated(message) | StoreError::PermissionDenied(message) => {
            ErrorShape::unavailable(format!("session store: {message}"))
        }
        other => ErrorShape::unavailable(other.to_string()).retry_after(500),
    };
    (error, None)
}

pub(crate) fn key_for(method: &str, raw: &str) -> Result<SessionKey, (ErrorShape, Option<Value>)> {
    let key = SessionKey::parse(raw)
        .map_err(|e| fail(ErrorShape::invalid(format!("invalid {method} params: {e}"))))?;
    trace::record_session(key.as_str());
    Ok(key)
}
