//! The method table: one row per served method with its name, the scope it
//! needs, its params schema and its handler. Everything else reads it:
//! `hello-ok.features.methods` (the advertised rows), authorization (the
//! scope), dispatch (the schema, then the handler), the request metric's
//! labels (the names), and the params property test (`tests/params_fuzz.rs`
//! fails if a listed key is ever refused).

use std::borrow::Cow;

use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::session_settings;
use super::{Answer, Call};
use super::{absent, agent, catalog, chat, compact, health, history, runs, session_list};
use super::{diagnostics, logs, preview, sessions, surfaces, usage};
use crate::auth::registry;
use crate::auth::scopes::{ADMIN, APPROVALS, Access, PAIRING, QUESTIONS, READ, WRITE};
use crate::events::presence;
use crate::protocol::frames::ErrorShape;
use crate::protocol::params::Params;

type Handler = for<'a> fn(&'a Call<'a>) -> BoxFuture<'a, Answer>;

/// The label a request of a method this edge does not serve counts under
/// (`clawgate_edge_requests_total{method="other"}`), so clients cannot grow
/// the label set.
pub const OTHER: &str = "other";

/// The scope a served method needs.
#[derive(Clone, Copy)]
pub(super) enum Scope {
    /// Any authenticated connection (`health`).
    Exempt,
    /// A fixed scope.
    Fixed(&'static str),
    /// Decided by the params (`sessions.delete` with `archivedOnly`).
    ByParams(fn(&Value) -> &'static str),
}

/// What a method's params must be; dispatch checks it before the handler
/// runs, with the protocol's messages.
#[derive(Clone, Copy)]
pub(super) enum Schema {
    /// It takes no params and ignores what it gets.
    Ignored,
    /// An object of these keys at most (a closed schema).
    Closed(&'static [&'static str]),
    /// `Closed`, from which the Control UI's reconnect marker is dropped
    /// first when the caller is a UI client (`chat.send`: the protocol
    /// strips it from operator UI clients' sends before validating them).
    ClosedForUi(&'static [&'static str]),
    /// An object whose keys are a union of shapes over these, which the
    /// handler tells apart (`chat.startup`).
    Union(&'static [&'static str]),
}

/// The marker the Control UI puts on its first send after a reconnect; not
/// part of any schema.
const RECONNECT_MARKER: &str = "__controlUiReconnectResume";

/// Client modes whose sends may carry the reconnect marker.
const UI_MODES: &[&str] = &["webchat", "ui"];

impl Schema {
    /// The params as the check sees them (the reconnect marker dropped
    /// where the protocol drops it).
    pub(super) fn prepare<'v>(self, params: &'v Value, client_mode: &str) -> Cow<'v, Value> {
        match (self, params) {
            (Self::ClosedForUi(_), Value::Object(object))
                if object.contains_key(RECONNECT_MARKER) && UI_MODES.contains(&client_mode) =>
            {
                let mut object = object.clone();
                object.remove(RECONNECT_MARKER);
                Cow::Owned(Value::Object(object))
            }
            _ => Cow::Borrowed(params),
        }
    }

    pub(super) fn check<'a>(
        self,
        method: &'a str,
        params: &'a Value,
    ) -> Result<Params<'a>, ErrorShape> {
        match self {
            Self::Ignored => Ok(Params::ignored(method, params)),
            Self::Closed(keys) | Self::ClosedForUi(keys) => Params::new(method, params, keys),
            Self::Union(_) => Params::object(method, params),
        }
    }

    fn keys(self) -> &'static [&'static str] {
        match self {
            Self::Ignored => &[],
            Self::Closed(keys) | Self::ClosedForUi(keys) | Self::Union(keys) => keys,
        }
    }
}

/// One served method.
pub(super) struct Method {
    pub name: &'static str,
    /// Listed in `hello-ok.features.methods`.
    advertised: bool,
    scope: Scope,
    pub schema: Schema,
    pub handler: Handler,
}

/// Declares the served methods once: their names and the table.
macro_rules! method_table {
    (@advertised) => { true };
    (@advertised hidden) => { false };
    ($( $name:literal $(($hidden:ident))?, $scope:expr, $schema:expr => |$call:ident| $handler:expr; )*) => {
        /// Methods this edge serves.
        pub const SERVED_METHODS: &[&str] = &[$($name),*];

        static METHODS: &[Method] = &[$(Method {
            name: $name,
            advertised: method_table!(@advertised $($hidden)?),
            scope: $scope,
            schema: $schema,
            handler: |$call| Box::pin($handler),
        }),*];
    };
}

const R: Scope = Scope::Fixed(READ);
const W: Scope = Scope::Fixed(WRITE);
const A: Scope = Scope::Fixed(ADMIN);
const P: Scope = Scope::Fixed(PAIRING);
use Schema::{Closed, ClosedForUi, Ignored, Union};

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

/// The params of the side panels that answer for one session.
const PER_SESSION_KEYS: &[&str] = &["sessionKey", "agentId"];

method_table! {
    "health", Scope::Exempt, Ignored => |call| health::health(call.edge);
    "status", R, Ignored => |call| health::status(call.edge);
    "agents.list", R, Ignored => |call| agent::agents_list(call.edge);
    "models.list", R, Closed(catalog::MODELS_LIST_KEYS) => |call| catalog::models_list(call.edge, &call.params);
    "commands.list", R, Closed(catalog::COMMANDS_LIST_KEYS) => |call| catalog::commands_list(&call.params);
    "chat.metadata", R, Closed(catalog::CHAT_METADATA_KEYS) => |call| catalog::chat_metadata(call.edge, &call.params);
    "agent", W, Closed(agent::AGENT_KEYS) => |call| agent::agent(call);
    "agent.wait", W, Closed(agent::AGENT_WAIT_KEYS) => |call| agent::agent_wait(call.edge, &call.params);
    "chat.send", W, ClosedForUi(chat::CHAT_SEND_KEYS) => |call| chat::chat_send(call);
    "chat.abort", W, Closed(chat::CHAT_ABORT_KEYS) => |call| chat::chat_abort(call.edge, call.conn, &call.params);
    "sessions.abort", W, Closed(chat::SESSIONS_ABORT_KEYS) => |call| chat::sessions_abort(call.edge, call.conn, &call.params);
    "chat.history", R, Closed(history::HISTORY_KEYS) => |call| history::chat_history(call.edge, &call.params);
    "chat.startup", R, Union(history::STARTUP_KEYS) => |call| history::chat_startup(call.edge, &call.params);
    "sessions.list", R, Closed(session_list::SESSIONS_LIST_KEYS) => |call| session_list::sessions_list(call.edge, &call.params);
    "sessions.describe", R, Closed(sessions::SESSIONS_DESCRIBE_KEYS) => |call| sessions::sessions_describe(call.edge, &call.params);
    "sessions.resolve" (hidden), R, Closed(sessions::SESSIONS_RESOLVE_KEYS) => |call| sessions::sessions_resolve(call.edge, &call.params);
    "sessions.create", W, Closed(session_settings::SESSIONS_CREATE_KEYS) => |call| session_settings::sessions_create(call);
    "sessions.patch", W, Closed(session_settings::SESSIONS_PATCH_KEYS) => |call| session_settings::sessions_patch(call);
    "sessions.patchMany" (hidden), W, Closed(session_settings::SESSIONS_PATCH_MANY_KEYS) => |call| session_settings::sessions_patch_many(call);
    "sessions.compact" (hidden), A, Closed(compact::SESSIONS_COMPACT_KEYS) => |call| compact::sessions_compact(call);
    "sessions.reset", A, Closed(sessions::SESSIONS_RESET_KEYS) => |call| sessions::sessions_reset(call);
    "sessions.delete", Scope::ByParams(sessions::delete_scope), Closed(sessions::SESSIONS_DELETE_KEYS) => |call| sessions::sessions_delete(call);
    "sessions.subscribe", R, Ignored => |call| sessions::subscribe(call.conn, true);
    "sessions.messages.subscribe", R, Closed(sessions::MESSAGES_SUBSCRIBE_KEYS) => |call| sessions::messages_subscribe(call, true);
    "sessions.messages.unsubscribe", R, Closed(sessions::MESSAGES_UNSUBSCRIBE_KEYS) => |call| sessions::messages_subscribe(call, false);
    "sessions.unsubscribe", R, Ignored => |call| sessions::subscribe(call.conn, false);
    "question.list", Scope::Fixed(QUESTIONS), Closed(&[]) => |_call| surfaces::constant(json!({ "questions": [] }));
    // The pending requests, a bare list.
    "plugin.approval.list", Scope::Fixed(APPROVALS), Ignored => |_call| surfaces::constant(json!([]));
    "exec.approval.list", Scope::Fixed(APPROVALS), Ignored => |_call| surfaces::constant(json!([]));
    "taskSuggestions.list", R, Closed(catalog::TASK_SUGGESTIONS_KEYS) => |call| catalog::task_suggestions_list(&call.params);
    // The Control UI's side panels (`surfaces.rs`), not advertised.
    "update.status" (hidden), A, Closed(&[]) => |_call| surfaces::constant(json!({
        "sentinel": null, "updateAvailable": null, "effectiveChannel": "stable",
        "schedule": { "channel": "stable", "autoEnabled": false },
    }));
    "plugins.controlUi.list" (hidden), R, Closed(&[]) => |_call| surfaces::constant(json!({ "revision": "0", "plugins": [], "diagnostics": [] }));
    "openclaw.approval.list" (hidden), Scope::Fixed(APPROVALS), Ignored => |_call| surfaces::constant(json!([]));
    "sessions.observer.visibility" (hidden), R, Closed(&["visible"]) => |_call| surfaces::constant(json!({ "ok": true }));
    "agent.identity.get" (hidden), R, Closed(&["agentId", "sessionKey"]) => |_call| surfaces::constant(json!({
        "agentId": "main", "name": "Assistant", "nameSource": "default", "avatar": "A",
    }));
    "models.authStatus" (hidden), R, Closed(&["refresh", "agentId"]) => |call| surfaces::models_auth_status(call);
    "controlUi.sessionPullRequests.subscribe" (hidden), R, Closed(&["sessionKeys"]) => |_call| surfaces::constant(json!({ "subscribed": false }));
    "board.get" (hidden), R, Closed(PER_SESSION_KEYS) => |call| surfaces::per_session(call);
    "progressCard.get" (hidden), R, Closed(PER_SESSION_KEYS) => |call| surfaces::per_session(call);
    "sessions.branches.list" (hidden), R, Closed(PER_SESSION_KEYS) => |call| surfaces::per_session(call);
    "session.discussion.info" (hidden), R, Closed(PER_SESSION_KEYS) => |call| surfaces::per_session(call);
    "sessions.companion.state" (hidden), R, Closed(PER_SESSION_KEYS) => |call| surfaces::per_session(call);
    "sessions.github.options" (hidden), R, Closed(PER_SESSION_KEYS) => |call| surfaces::per_session(call);
    "session.members.listEvidence" (hidden), R, Closed(PER_SESSION_KEYS) => |call| surfaces::per_session(call);
    "sessions.viewers.set" (hidden), R, Closed(&["sessionKeys"]) => |call| surfaces::viewers_set(call);
    "projects.list" (hidden), R, Closed(&[]) => |_call| surfaces::constant(json!({ "projects": [], "recents": [] }));
    "talk.catalog" (hidden), R, Closed(&["provider", "model"]) => |_call| surfaces::constant(json!({
        "modes": [], "transports": [], "brains": [], "speech": { "providers": [] },
        "transcription": { "ready": false, "providers": [] }, "realtime": { "ready": false, "providers": [] },
    }));
    "sessions.groups.list" (hidden), R, Closed(&[]) => |_call| surfaces::constant(json!({ "groups": [], "sectionOrder": [] }));
    "sessions.groups.defaults" (hidden), W, Closed(&[]) => |_call| surfaces::constant(json!({ "defaults": [] }));
    "mentions.list" (hidden), R, Closed(&[]) => |call| surfaces::mentions_list(call);
    "system.info" (hidden), R, Closed(&[]) => |call| surfaces::system_info(call);
    "tasks.list" (hidden), R, Closed(&["status", "agentId", "sessionKey", "limit", "cursor", "sortBy"]) => |_call| surfaces::constant(json!({ "tasks": [] }));
    "cron.list" (hidden), R, Closed(surfaces::CRON_LIST_KEYS) => |call| absent::empty_page(call, "jobs");
    "cron.status" (hidden), R, Closed(&[]) => |_call| surfaces::constant(json!({
        "enabled": false, "triggersEnabled": false, "jobs": 0, "nextWakeAtMs": null,
    }));
    "sessions.catalog.list" (hidden), R, Closed(CATALOG_KEYS) => |_call| surfaces::constant(json!({ "catalogs": [] }));
    "environments.list" (hidden), R, Closed(&["runtimeId", "projection", "includeDesktopSetup"]) => |_call| surfaces::environments_list();
    "worktrees.branches" (hidden), W, Closed(&["repoRoot", "includeRepositoryStatus"]) => |_call| surfaces::constant(json!({ "branches": [], "repositoryStatus": "unavailable" }));
    // No OpenClaw config file: this gateway is configured by flags and
    // environment (`clawgate --help`), none of which the UI can edit.
    "config.get" (hidden), R, Closed(&[]) => |_call| surfaces::constant(json!({
        "path": "clawgate", "exists": false, "raw": "{}", "parsed": {}, "sourceConfig": {},
        "resolved": {}, "runtimeConfig": {}, "config": {}, "valid": true, "includedPaths": [],
        "issues": [], "warnings": [], "legacyIssues": [],
    }));
    "users.prefs.get" (hidden), R, Closed(&["keys"]) => |call| surfaces::prefs_get(call);
    "users.prefs.set" (hidden), W, Closed(&["entries", "expectedEntries"]) => |call| surfaces::prefs_set(call);
    // Features this gateway does not have (`absent.rs`): empty, not advertised.
    "cron.runs" (hidden), R, Closed(absent::CRON_RUNS_KEYS) => |call| absent::empty_page(call, "entries");
    "channels.status" (hidden), R, Closed(absent::CHANNELS_STATUS_KEYS) => |_call| absent::channels_status();
    "channels.pairing.list" (hidden), P, Closed(absent::CHANNELS_PAIRING_LIST_KEYS) => |_call| absent::channels_pairing_list();
    "device.pair.list" (hidden), P, Closed(&[]) => |_call| surfaces::constant(json!({ "pending": [], "paired": [] }));
    "node.list" (hidden), R, Closed(&[]) => |_call| absent::node_list();
    "worktrees.list" (hidden), R, Closed(&[]) => |_call| surfaces::constant(json!({ "worktrees": [] }));
    "plugins.list" (hidden), R, Closed(&[]) => |_call| surfaces::constant(json!({
        "plugins": [], "diagnostics": [], "mutationAllowed": false,
    }));
    "plugins.catalog.browse" (hidden), R, Closed(absent::PLUGINS_CATALOG_BROWSE_KEYS) => |_call| surfaces::constant(json!({ "items": [] }));
    "skills.search" (hidden), R, Closed(absent::SKILLS_SEARCH_KEYS) => |_call| surfaces::constant(json!({ "results": [] }));
    "transcripts.list" (hidden), R, Closed(absent::TRANSCRIPTS_LIST_KEYS) => |_call| surfaces::constant(json!({ "sessions": [], "nextCursor": null }));
    "approval.history" (hidden), Scope::Fixed(APPROVALS), Closed(absent::APPROVAL_HISTORY_KEYS) => |_call| surfaces::constant(json!({ "items": [] }));
    "skills.status" (hidden), R, Closed(absent::SKILLS_STATUS_KEYS) => |_call| absent::skills_status();
    "skills.library.list" (hidden), R, Closed(absent::SKILLS_LIBRARY_LIST_KEYS) => |call| absent::skills_library_list(call);
    "doctor.memory.status" (hidden), R, Closed(absent::DOCTOR_MEMORY_STATUS_KEYS) => |_call| absent::doctor_memory_status();
    "tools.github.status" (hidden), R, Closed(absent::TOOLS_GITHUB_STATUS_KEYS) => |call| absent::tools_github_status(call);
    "webSearch.status" (hidden), R, Closed(absent::WEB_SEARCH_STATUS_KEYS) => |call| absent::web_search_status(call);
    // No heartbeat runs here (no periodic agent wake-ups): none was last.
    "last-heartbeat" (hidden), R, Ignored => |_call| surfaces::constant(Value::Null);
    "logs.tail" (hidden), R, Closed(logs::LOGS_TAIL_KEYS) => |call| logs::logs_tail(call);
    // The presence list of `hello-ok.snapshot.presence`, as it is now.
    "system-presence" (hidden), R, Ignored => |call| surfaces::constant(json!(presence::list_for(call.edge, call.conn)));
    // No cron job has standing exec grants: there are no cron jobs.
    "exec.approval.grants.list" (hidden), Scope::Fixed(APPROVALS), Closed(&["limit"]) => |_call| surfaces::constant(json!({ "grants": [] }));
    "sessions.preview" (hidden), R, Closed(preview::SESSIONS_PREVIEW_KEYS) => |call| preview::sessions_preview(call);
    "chat.message.get" (hidden), R, Closed(preview::CHAT_MESSAGE_GET_KEYS) => |call| preview::chat_message_get(call);
    "sessions.get" (hidden), R, Closed(preview::SESSIONS_GET_KEYS) => |call| preview::sessions_get(call);
    // Attachments stay in the transcripts (the chat shows them); no artifact
    // index is kept, so none is listed.
    "artifacts.list" (hidden), R, Closed(&["sessionKey", "runId", "taskId", "agentId", "messageRole", "type", "limit", "cursor"]) => |_call| surfaces::constant(json!({ "artifacts": [] }));
    "skills.proposals.list" (hidden), R, Closed(&["agentId"]) => |_call| absent::skills_proposals_list();
    "migrations.memory.plan" (hidden), A, Closed(&["agentId", "overwrite"]) => |call| absent::migrations_memory_plan(call);
    "usage.status" (hidden), R, Ignored => |_call| usage::usage_status();
    "sessions.usage" (hidden), R, Closed(usage::SESSIONS_USAGE_KEYS) => |call| usage::sessions_usage(call);
    "sessions.usage.timeseries" (hidden), R, Closed(usage::USAGE_DETAIL_KEYS) => |call| usage::sessions_usage_timeseries(call);
    "sessions.usage.logs" (hidden), R, Closed(usage::USAGE_DETAIL_KEYS) => |call| usage::sessions_usage_logs(call);
    "diagnostics.lanes" (hidden), R, Ignored => |call| diagnostics::diagnostics_lanes(call);
    "exec.approvals.get" (hidden), A, Closed(&[]) => |_call| absent::exec_approvals_get();
    "themes.list" (hidden), R, Closed(&[]) => |_call| absent::themes_list();
    "config.schema.lookup" (hidden), R, Closed(&["path"]) => |call| absent::config_schema_lookup(call);
    "runs.resume", R, Closed(runs::RUNS_RESUME_KEYS) => |call| runs::runs_resume(call.edge, call.conn, &call.params);
}

pub(super) fn method(name: &str) -> Option<&'static Method> {
    METHODS.iter().find(|m| m.name == name)
}

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

/// What a call of `name` with these params needs: the table's row for a
/// served method, OpenClaw's registry for the others.
pub fn required_access(name: &str, params: &Value) -> Access {
    match method(name).map(|m| m.scope) {
        Some(Scope::Exempt) => Access::Exempt,
        Some(Scope::Fixed(scope)) => Access::Operator(scope),
        Some(Scope::ByParams(decide)) => Access::Operator(decide(params)),
        None => registry::access(name, params),
    }
}

/// The params each served method accepts: the keys of its schema (none for
/// the methods that take no params and ignore what they get).
pub fn param_keys(name: &str) -> &'static [&'static str] {
    method(name).map_or(&[], |m| m.schema.keys())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_served_once_and_other_is_none_of_them() {
        for (at, name) in SERVED_METHODS.iter().enumerate() {
            assert!(
                !SERVED_METHODS[at + 1..].contains(name),
                "{name} has two rows"
            );
            assert_eq!(method(name).map(|m| m.name), Some(*name));
        }
        assert!(method(OTHER).is_none());
        assert!(method("no.such.method").is_none());
    }

    #[test]
    fn served_scopes_are_openclaws() {
        for row in METHODS {
            if let (Scope::Fixed(ours), Some(registry::Policy::Fixed(theirs))) =
                (row.scope, registry::policy(row.name))
            {
                assert_eq!(ours, theirs, "{}", row.name);
            }
        }
    }

    #[test]
    fn dispatch_holds_params_to_the_rows_schema() {
        let closed = Closed(&["a"]);
        assert!(closed.check("m", &json!({ "a": 1 })).is_ok());
        let extra = closed.check("m", &json!({ "b": 1 })).err().unwrap();
        assert_eq!(
            extra.message,
            "invalid m params: must NOT have additional properties (b)"
        );
        let not_object = closed.check("m", &json!([1])).err().unwrap();
        assert_eq!(not_object.message, "invalid m params: must be object");
        assert!(
            Ignored.check("m", &json!([1])).is_ok(),
            "ignored, whatever it is"
        );
        assert!(
            Union(&["a"]).check("m", &json!({ "z": 1 })).is_ok(),
            "the handler's to tell"
        );
        assert!(Union(&["a"]).check("m", &json!(1)).is_err());
    }

    #[test]
    fn the_reconnect_marker_is_dropped_only_from_ui_sends() {
        let sent = json!({ "a": 1, RECONNECT_MARKER: true });
        let send = ClosedForUi(&["a"]);
        let from_ui = send.prepare(&sent, "ui");
        assert!(send.check("m", &from_ui).is_ok());
        let from_cli = send.prepare(&sent, "cli");
        assert!(
            send.check("m", &from_cli).is_err(),
            "only a UI client's is dropped"
        );
        let other = Closed(&["a"]);
        assert!(
            other.check("m", &other.prepare(&sent, "ui")).is_err(),
            "only from sends"
        );
    }
}
