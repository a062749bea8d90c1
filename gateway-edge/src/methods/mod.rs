//! Request dispatch and the served methods, one file per family: `health`
//! (`health`, `status`), `agent` (`agent`, `agent.wait`, `agents.list`),
//! `chat` (`chat.*`), `sessions` (`sessions.*`) and `runs` (`runs.resume`).
//!
//! The method table below is the one list of what is served: one row per
//! method with its name, the scope it needs, the keys of its closed params
//! schema and its handler. Its names are advertised in
//! `hello-ok.features.methods`, authorization reads the scope from it, and
//! dispatch finds the handler in it; adding a method is one row and its
//! handler. Each request runs in its own task, so answers leave in the
//! order they finish.

mod agent;
mod attachments;
mod catalog;
mod chat;
mod commands;
mod health;
mod history;
mod runs;
mod session_list;
mod session_settings;
mod sessions;
mod surfaces;

pub(crate) use history::transcript_message;
pub use surfaces::UserPrefs;

use std::sync::Arc;
use std::time::Instant;

use clawgate_proto::run_coordinator::v1 as pb;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use session_store_api::SessionKey;
use tracing::Instrument;

use crate::conn::{CloseOrder, Conn};
use crate::edge::Edge;
use crate::frames::{self, ErrorShape, FrameError, Request, parse_request};
use crate::scopes::{self, ADMIN, APPROVALS, QUESTIONS, READ, WRITE};
use crate::trace;

pub use health::{broadcast_health, health_summary};

/// What a handler is given: the edge, the calling connection, the request
/// and when its frame arrived (for the ACK latency).
pub(crate) struct Call<'a> {
    pub edge: &'a Arc<Edge>,
    pub conn: &'a Arc<Conn>,
    pub request: &'a Request,
    pub received: Instant,
    /// Work to do once the answer is queued (events the protocol orders
    /// after the answer, such as `sessions.changed` after a reset's).
    after_reply: std::sync::Mutex<Vec<Box<dyn FnOnce() + Send>>>,
}

impl Call<'_> {
    fn params(&self) -> &Value {
        &self.request.params
    }

    /// Runs `work` right after this call's answer is queued on its connection.
    pub fn after_reply(&self, work: impl FnOnce() + Send + 'static) {
        self.after_reply.lock().unwrap().push(Box::new(work));
    }
}

type Handler = for<'a> fn(&'a Call<'a>) -> BoxFuture<'a, Answer>;

/// The scope a served method needs.
#[derive(Clone, Copy)]
enum Scope {
    /// Any authenticated connection (`health`).
    Exempt,
    /// A fixed scope.
    Fixed(&'static str),
    /// Decided by the params (`sessions.delete` with `archivedOnly`).
    ByParams(fn(&Value) -> &'static str),
}

/// One served method.
struct Method {
    name: &'static str,
    /// Listed in `hello-ok.features.methods`.
    advertised: bool,
    scope: Scope,
    /// The keys of its closed params schema (none: it takes no params and
    /// ignores what it gets).
    params: &'static [&'static str],
    handler: Handler,
}

/// `sessions.catalog.list`'s params.
const CATALOG_KEYS: &[&str] = &[
    "agentId",
    "limitPerHost",
    "progressId",
    "allowPartialResults",
    "catalogId",
    "metadataOnly",
    "cursors",
];

/// The methods `hello-ok.features.methods` lists: the served ones but
/// those marked `(hidden)`: `sessions.resolve` (the protocol serves it
/// unadvertised) and the side panels of `surfaces.rs` (advertising them
/// would turn on UI pages whose other methods this edge does not serve).
pub fn advertised_methods() -> Vec<&'static str> {
    METHODS
        .iter()
        .filter(|m| m.advertised)
        .map(|m| m.name)
        .collect()
}

/// Declares the served methods once: their names and the table.
macro_rules! method_table {
    (@advertised) => { true };
    (@advertised hidden) => { false };
    ($( $name:literal $(($hidden:ident))?, $scope:expr, $params:expr => |$call:ident| $handler:expr; )*) => {
        /// Methods this edge serves.
        pub const SERVED_METHODS: &[&str] = &[$($name),*];

        static METHODS: &[Method] = &[$(Method {
            name: $name,
            advertised: method_table!(@advertised $($hidden)?),
            scope: $scope,
            params: $params,
            handler: |$call| Box::pin($handler),
        }),*];
    };
}

const R: Scope = Scope::Fixed(READ);
const W: Scope = Scope::Fixed(WRITE);
const A: Scope = Scope::Fixed(ADMIN);

method_table! {
    "health", Scope::Exempt, &[] => |call| health::health(call.edge);
    "status", R, &[] => |call| health::status(call.edge);
    "agents.list", R, &[] => |call| agent::agents_list(call.edge);
    "models.list", R, catalog::MODELS_LIST_KEYS => |call| catalog::models_list(call.edge, call.params());
    "commands.list", R, catalog::COMMANDS_LIST_KEYS => |call| catalog::commands_list(call.params());
    "chat.metadata", R, catalog::CHAT_METADATA_KEYS => |call| catalog::chat_metadata(call.edge, call.params());
    "agent", W, agent::AGENT_KEYS => |call| agent::agent(call.edge, call.conn, call.request, call.received);
    "agent.wait", W, agent::AGENT_WAIT_KEYS => |call| agent::agent_wait(call.edge, call.params());
    "chat.send", W, chat::CHAT_SEND_KEYS => |call| chat::chat_send(call);
    "chat.abort", W, chat::CHAT_ABORT_KEYS => |call| chat::chat_abort(call.edge, call.conn, call.params());
    "sessions.abort", W, chat::SESSIONS_ABORT_KEYS => |call| chat::sessions_abort(call.edge, call.conn, call.params());
    "chat.history", R, history::HISTORY_KEYS => |call| history::chat_history(call.edge, call.params());
    "chat.startup", R, history::STARTUP_KEYS => |call| history::chat_startup(call.edge, call.params());
    "sessions.list", R, session_list::SESSIONS_LIST_KEYS => |call| session_list::sessions_list(call.edge, call.params());
    "sessions.describe", R, sessions::SESSIONS_DESCRIBE_KEYS => |call| sessions::sessions_describe(call.edge, call.params());
    "sessions.resolve" (hidden), R, sessions::SESSIONS_RESOLVE_KEYS => |call| sessions::sessions_resolve(call.edge, call.params());
    "sessions.create", W, session_settings::SESSIONS_CREATE_KEYS => |call| session_settings::sessions_create(call);
    "sessions.patch", W, session_settings::SESSIONS_PATCH_KEYS => |call| session_settings::sessions_patch(call);
    "sessions.reset", A, sessions::SESSIONS_RESET_KEYS => |call| sessions::sessions_reset(call);
    "sessions.delete", Scope::ByParams(sessions::delete_scope), sessions::SESSIONS_DELETE_KEYS => |call| sessions::sessions_delete(call);
    "sessions.subscribe", R, &[] => |call| sessions::subscribe(call.conn, true);
    "sessions.messages.subscribe", R, sessions::MESSAGES_SUBSCRIBE_KEYS => |call| sessions::messages_subscribe(call, true);
    "sessions.messages.unsubscribe", R, sessions::MESSAGES_UNSUBSCRIBE_KEYS => |call| sessions::messages_subscribe(call, false);
    "sessions.unsubscribe", R, &[] => |call| sessions::subscribe(call.conn, false);
    "question.list", Scope::Fixed(QUESTIONS), &[] => |call| catalog::question_list(call.params());
    "plugin.approval.list", Scope::Fixed(APPROVALS), &[] => |_call| catalog::approvals_list();
    "exec.approval.list", Scope::Fixed(APPROVALS), &[] => |_call| catalog::approvals_list();
    "taskSuggestions.list", R, catalog::TASK_SUGGESTIONS_KEYS => |call| catalog::task_suggestions_list(call.params());
    // The Control UI's side panels (`surfaces.rs`), not advertised.
    "update.status" (hidden), A, &[] => |call| surfaces::constant(call, &[], json!({
        "sentinel": null, "updateAvailable": null, "effectiveChannel": "stable",
        "schedule": { "channel": "stable", "autoEnabled": false },
    }));
    "plugins.controlUi.list" (hidden), R, &[] => |call| surfaces::constant(call, &[], json!({ "revision": "0", "plugins": [], "diagnostics": [] }));
    "openclaw.approval.list" (hidden), Scope::Fixed(APPROVALS), &[] => |_call| catalog::approvals_list();
    "sessions.observer.visibility" (hidden), R, &["visible"] => |call| surfaces::constant(call, &["visible"], json!({ "ok": true }));
    "agent.identity.get" (hidden), R, &["agentId", "sessionKey"] => |call| surfaces::agent_identity(call);
    "models.authStatus" (hidden), R, &["refresh", "agentId"] => |call| surfaces::models_auth_status(call);
    "controlUi.sessionPullRequests.subscribe" (hidden), R, &["sessionKeys"] => |call| surfaces::constant(call, &["sessionKeys"], json!({ "subscribed": false }));
    "board.get" (hidden), R, &["sessionKey", "agentId"] => |call| surfaces::per_session(call);
    "progressCard.get" (hidden), R, &["sessionKey", "agentId"] => |call| surfaces::per_session(call);
    "sessions.branches.list" (hidden), R, &["sessionKey", "agentId"] => |call| surfaces::per_session(call);
    "session.discussion.info" (hidden), R, &["sessionKey", "agentId"] => |call| surfaces::per_session(call);
    "sessions.companion.state" (hidden), R, &["sessionKey", "agentId"] => |call| surfaces::per_session(call);
    "sessions.github.options" (hidden), R, &["sessionKey", "agentId"] => |call| surfaces::per_session(call);
    "session.members.listEvidence" (hidden), R, &["sessionKey", "agentId"] => |call| surfaces::per_session(call);
    "sessions.viewers.set" (hidden), R, &["sessionKeys"] => |call| surfaces::viewers_set(call);
    "projects.list" (hidden), R, &[] => |call| surfaces::constant(call, &[], json!({ "projects": [], "recents": [] }));
    "talk.catalog" (hidden), R, &["provider", "model"] => |call| surfaces::constant(call, &["provider", "model"], json!({
        "modes": [], "transports": [], "brains": [], "speech": { "providers": [] },
        "transcription": { "ready": false, "providers": [] }, "realtime": { "ready": false, "providers": [] },
    }));
    "sessions.groups.list" (hidden), R, &[] => |call| surfaces::constant(call, &[], json!({ "groups": [], "sectionOrder": [] }));
    "sessions.groups.defaults" (hidden), W, &[] => |call| surfaces::constant(call, &[], json!({ "defaults": [] }));
    "mentions.list" (hidden), R, &[] => |call| surfaces::mentions_list(call);
    "system.info" (hidden), R, &[] => |call| surfaces::system_info(call);
    "tasks.list" (hidden), R, &["status", "agentId", "sessionKey", "limit", "cursor", "sortBy"] => |call| surfaces::tasks_list(call);
    "cron.list" (hidden), R, surfaces::CRON_LIST_KEYS => |call| surfaces::cron_list(call);
    "cron.status" (hidden), R, &[] => |call| surfaces::constant(call, &[], json!({
        "enabled": false, "triggersEnabled": false, "jobs": 0, "nextWakeAtMs": null,
    }));
    "sessions.catalog.list" (hidden), R, CATALOG_KEYS => |call| surfaces::constant(call, CATALOG_KEYS, json!({ "catalogs": [] }));
    "environments.list" (hidden), R, &["runtimeId", "projection", "includeDesktopSetup"] => |call| surfaces::environments_list(call);
    "worktrees.branches" (hidden), W, &["repoRoot", "includeRepositoryStatus"] => |call| surfaces::constant(call, &["repoRoot", "includeRepositoryStatus"], json!({ "branches": [], "repositoryStatus": "unavailable" }));
    // No OpenClaw config file: this gateway is configured by flags and
    // environment (`clawgate --help`), none of which the UI can edit.
    "config.get" (hidden), R, &[] => |call| surfaces::constant(call, &[], json!({
        "path": "clawgate", "exists": false, "raw": "{}", "parsed": {}, "sourceConfig": {},
        "resolved": {}, "runtimeConfig": {}, "config": {}, "valid": true, "includedPaths": [],
        "issues": [], "warnings": [], "legacyIssues": [],
    }));
    "users.prefs.get" (hidden), R, &["keys"] => |call| surfaces::prefs_get(call);
    "users.prefs.set" (hidden), W, &["entries", "expectedEntries"] => |call| surfaces::prefs_set(call);
    "runs.resume", R, runs::RUNS_RESUME_KEYS => |call| runs::runs_resume(call.edge, call.conn, call.params());
}

fn method(name: &str) -> Option<&'static Method> {
    METHODS.iter().find(|m| m.name == name)
}

/// The scope `name` needs with these params (`None`: exempt): the table's
/// for a served method, the protocol's classification for the others.
pub fn required_scope(name: &str, params: &Value) -> Option<&'static str> {
    match method(name).map(|m| m.scope) {
        Some(Scope::Exempt) => None,
        Some(Scope::Fixed(scope)) => Some(scope),
        Some(Scope::ByParams(decide)) => Some(decide(params)),
        None => Some(scopes::unserved_scope(name)),
    }
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
    let max_depth = edge.config.max_json_depth;
    if crate::json_depth::nests_deeper_than(text, max_depth) {
        let error = ErrorShape::invalid(format!(
            "invalid request frame: nested deeper than {max_depth} levels (EDGE_MAX_JSON_DEPTH)"
        ));
        reply(edge, conn, "invalid", "", Err(fail(error)));
        return;
    }
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
    let required = required_scope(&request.method, &request.params);
    if let Err(error) = scopes::authorize(required, &conn.role, &conn.scopes) {
        // Not `reply`: this answer must not end the row it counts in.
        send_answer(edge, conn, &request.id, &request.method, Err(fail(error)));
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
    let Some(method) = method(&request.method) else {
        refused(ErrorShape::invalid(format!(
            "unknown method: {}",
            request.method
        )));
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
    let (edge, conn) = (edge.clone(), conn.clone());
    let span = trace::request_span(&request);
    tokio::spawn(
        async move {
            let _in_flight = conn.requests.started();
            let call = Call {
                edge: &edge,
                conn: &conn,
                request: &request,
                received,
                after_reply: Default::default(),
            };
            let answer = (method.handler)(&call).await;
            reply(&edge, &conn, &request.id, &request.method, answer);
            for work in call.after_reply.into_inner().unwrap() {
                work();
            }
        }
        .instrument(span),
    );
}

/// When a request refused for the connection's in-flight limit may be
/// sent again.
const IN_FLIGHT_RETRY_AFTER_MS: u64 = 100;

/// Sends the (final) answer to a request and counts it. The flood guard
/// counts refused authorizations in a row: any other answer ends the row.
fn reply(edge: &Edge, conn: &Conn, id: &str, method: &str, answer: Answer) {
    conn.requests.answered();
    send_answer(edge, conn, id, method, answer);
}

fn send_answer(edge: &Edge, conn: &Conn, id: &str, method: &str, answer: Answer) {
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
    let detail = crate::coordinators::error_detail(&status);
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
