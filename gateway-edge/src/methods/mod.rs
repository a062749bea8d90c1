//! Request dispatch and the served methods, one file per family: `status`
//! (`health`, `status`, `agents.list`), `agent` (`agent`, `agent.wait`),
//! `chat` (`chat.send`, `chat.abort`, `chat.history`), `sessions`
//! (`sessions.*`) and `resume` (`runs.resume`).
//!
//! The method table below is the one list of what is served: its names are
//! advertised in `hello-ok.features.methods`, its params lists are the
//! methods' closed schemas, and dispatch finds the handler in it. Each
//! request runs in its own task, so answers leave in the order they finish;
//! every method is a call to the coordinator or the store.

mod agent;
mod chat;
mod resume;
mod sessions;
mod status;

use std::sync::Arc;
use std::time::Instant;

use clawgate_proto::run_coordinator::v1 as pb;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use session_store_api::SessionKey;
use tracing::Instrument;

use crate::conn::Conn;
use crate::edge::Edge;
use crate::frames::{self, ErrorShape, FrameError, Request, parse_request};
use crate::scopes::authorize;
use crate::trace;

pub use status::{broadcast_health, health_summary};

/// What a handler is given: the edge, the calling connection, the request
/// and when its frame arrived (for the ACK latency).
pub(crate) struct Call<'a> {
    pub edge: &'a Arc<Edge>,
    pub conn: &'a Arc<Conn>,
    pub request: &'a Request,
    pub received: Instant,
}

impl Call<'_> {
    fn params(&self) -> &Value {
        &self.request.params
    }
}

type Handler = for<'a> fn(&'a Call<'a>) -> BoxFuture<'a, Answer>;

/// One served method.
struct Method {
    name: &'static str,
    /// The keys of its closed params schema (none: it takes no params and
    /// ignores what it gets).
    params: &'static [&'static str],
    handler: Handler,
}

/// Declares the served methods once: the advertised names and the table.
macro_rules! method_table {
    ($( $name:literal, $params:expr => |$call:ident| $handler:expr; )*) => {
        /// Methods this edge serves (advertised in `hello-ok.features.methods`).
        pub const SERVED_METHODS: &[&str] = &[$($name),*];

        static METHODS: &[Method] = &[$(Method {
            name: $name,
            params: $params,
            handler: |$call| Box::pin($handler),
        }),*];
    };
}

method_table! {
    "health", &[] => |call| status::health(call.edge);
    "status", &[] => |call| status::status(call.edge);
    "agents.list", &[] => |_call| status::agents_list();
    "agent", agent::AGENT_KEYS => |call| agent::agent(call.edge, call.conn, call.request, call.received);
    "agent.wait", agent::AGENT_WAIT_KEYS => |call| agent::agent_wait(call.edge, call.params());
    "chat.send", chat::CHAT_SEND_KEYS => |call| chat::chat_send(call.edge, call.conn, call.params(), call.received);
    "chat.abort", chat::CHAT_ABORT_KEYS => |call| chat::chat_abort(call.edge, call.conn, call.params());
    "chat.history", chat::HISTORY_KEYS => |call| chat::chat_history(call.edge, call.params());
    "sessions.list", sessions::SESSIONS_LIST_KEYS => |call| sessions::sessions_list(call.edge, call.params());
    "sessions.reset", sessions::SESSIONS_RESET_KEYS => |call| sessions::sessions_reset(call.edge, call.params());
    "sessions.delete", sessions::SESSIONS_DELETE_KEYS => |call| sessions::sessions_delete(call.edge, call.params());
    "sessions.subscribe", &[] => |call| sessions::subscribe(call.conn, true);
    "sessions.unsubscribe", &[] => |call| sessions::subscribe(call.conn, false);
    "runs.resume", resume::RUNS_RESUME_KEYS => |call| resume::runs_resume(call.edge, call.conn, call.params());
}

fn method(name: &str) -> Option<&'static Method> {
    METHODS.iter().find(|m| m.name == name)
}

/// The params each served method accepts: the keys of its closed schema
/// (none for the methods that take no params and ignore what they get).
/// The handlers check against these lists, and the params property test
/// (`tests/params_fuzz.rs`) fails if a listed key is ever refused.
pub fn param_keys(name: &str) -> &'static [&'static str] {
    method(name).map_or(&[], |m| m.params)
}

/// A method's answer: ok with a payload, or an error (with a payload for
/// the few methods that send both).
pub(crate) type Answer = Result<Value, (ErrorShape, Option<Value>)>;

pub(crate) fn fail(error: ErrorShape) -> (ErrorShape, Option<Value>) {
    (error, None)
}

/// Reads one text frame of an authenticated connection.
pub fn dispatch(edge: &Arc<Edge>, conn: &Arc<Conn>, text: &str) {
    let received = Instant::now();
    let request = match parse_request(text) {
        Ok(request) => request,
        // Unparsable JSON after the handshake is ignored.
        Err(FrameError::NotJson) => return,
        Err(FrameError::Invalid { id, reason }) => {
            let error = ErrorShape::invalid(format!("invalid request frame: {reason}"));
            let id = id.as_deref().unwrap_or("invalid");
            reply(edge, conn, id, "", Err(fail(error)));
            return;
        }
    };
    let refused = |error| reply(edge, conn, &request.id, &request.method, Err(fail(error)));
    if let Err(error) = authorize(&request.method, &conn.role, &conn.scopes) {
        refused(error);
        return;
    }
    if request.method == "connect" {
        refused(ErrorShape::invalid(
            "connect is only valid as the first request",
        ));
        return;
    }
    let Some(method) = method(&request.method) else {
        refused(ErrorShape::invalid(format!(
            "unknown method: {}",
            request.method
        )));
        return;
    };
    let (edge, conn) = (edge.clone(), conn.clone());
    let span = trace::request_span(&request);
    tokio::spawn(
        async move {
            let call = Call {
                edge: &edge,
                conn: &conn,
                request: &request,
                received,
            };
            let answer = (method.handler)(&call).await;
            reply(&edge, &conn, &request.id, &request.method, answer);
        }
        .instrument(span),
    );
}

/// Sends the (final) answer to a request and counts it.
fn reply(edge: &Edge, conn: &Conn, id: &str, method: &str, answer: Answer) {
    let frame = match answer {
        Ok(payload) => {
            edge.metrics.request(method, Ok(()));
            frames::ok_response(id, payload)
        }
        Err((error, payload)) => {
            edge.metrics.request(method, Err(error.code));
            trace::record_error(&error);
            frames::error_response(id, &error, payload)
        }
    };
    conn.outbox.send_frame(frame);
}

/// A backend failure in the protocol's words.
pub(crate) fn backend_error(status: tonic::Status) -> (ErrorShape, Option<Value>) {
    use tonic::Code;
    let detail = clawgate_proto::status_detail::detail_of::<pb::CoordinatorErrorDetail>(
        &status,
        "type.googleapis.com/clawgate.run_coordinator.v1.CoordinatorErrorDetail",
    );
    let code = detail.as_ref().map(|d| d.code);
    let error = match status.code() {
        _ if code == Some(pb::ErrorCode::KeyReused as i32) => {
            ErrorShape::invalid("idempotencyKey was already used with a different request")
                .with_details(json!({
                    "code": "IDEMPOTENCY_KEY_REUSED",
                    "runId": detail.and_then(|d| d.run).map(|r| r.run_id),
                }))
        }
        Code::InvalidArgument => ErrorShape::invalid(status.message()),
        // A request over a backend's gRPC message limit (a deployment whose
        // limits disagree, docs/limits.md): the request is at fault.
        Code::ResourceExhausted | Code::OutOfRange => ErrorShape::invalid(format!(
            "the request is too large for the run coordinator: {}",
            status.message()
        )),
        Code::FailedPrecondition => ErrorShape::unavailable(status.message()),
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => {
            ErrorShape::unavailable(status.message()).retry_after(500)
        }
        _ => ErrorShape::unavailable(status.message()),
    };
    (error, None)
}

pub(crate) fn store_error(err: session_store_api::StoreError) -> (ErrorShape, Option<Value>) {
    let error = match err {
        session_store_api::StoreError::InvalidArgument(message) => ErrorShape::invalid(message),
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
