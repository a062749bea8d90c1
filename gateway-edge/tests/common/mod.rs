//! What the edge's tests share beyond the test kit (`clawgate-system-tests`,
//! whose sandbox, client and waits are re-exported here): the stub
//! runtimes the edge is exercised with, and the protocol's scope table.
// Each test binary uses a part of this module, the re-exports included.
#![allow(dead_code, unused_imports)]

pub mod captures;
pub mod events;
pub mod split;

use std::sync::Arc;

use async_trait::async_trait;
use run_coordinator::config::CoordinatorConfig;
use run_coordinator::runtime::echo::{EchoConfig, EchoRuntime};
use run_coordinator::runtime::{AgentRuntime, RuntimeError, RuntimeRequest, RuntimeStream};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

pub use clawgate_system_tests::client::{Client, DEADLINE, TOKEN, Ws, connect_params};
pub use clawgate_system_tests::sandbox::Sandbox;
pub use clawgate_system_tests::wait::{Pacer, wait_for, wait_until};

/// Store, coordinator (with the stub runtime) and no edge yet: each test
/// starts its own with [`Sandbox::edge`].
pub async fn system() -> Sandbox {
    system_with(CoordinatorConfig::default()).await
}

/// [`system`] with the coordinator configured by `config`.
pub async fn system_with(config: CoordinatorConfig) -> Sandbox {
    system_with_runtime(config, StubRuntime::new()).await
}

/// [`system`] with the coordinator configured by `config`, executing
/// with `runtime`.
pub async fn system_with_runtime(
    config: CoordinatorConfig,
    runtime: Arc<dyn AgentRuntime>,
) -> Sandbox {
    Sandbox::builder()
        .runtime(runtime)
        .config(config)
        .start()
        .await
}

/// Like the stub model of the captures: messages with `SLOW` stream 20
/// pieces slowly, with `TOOL` call a tool first, others answer at once;
/// the text is the message echoed.
pub struct StubRuntime {
    echo: EchoRuntime,
}

impl StubRuntime {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            echo: EchoRuntime::new(EchoConfig::default()),
        })
    }
}

#[async_trait]
impl AgentRuntime for StubRuntime {
    fn name(&self) -> &'static str {
        "stub"
    }

    async fn execute(
        &self,
        mut request: RuntimeRequest,
        cancel: CancellationToken,
    ) -> Result<RuntimeStream, RuntimeError> {
        request.options = if request.message.contains("SLOW") {
            json!({ "chunks": 20, "paceMs": 300 })
        } else if request.message.contains("FLOOD") {
            json!({ "chunks": 50, "paceMs": 20 })
        } else if request.message.contains("TOOL") {
            json!({ "chunks": 2, "paceMs": 5, "toolCall": true })
        } else {
            json!({ "chunks": 2, "paceMs": 5 })
        };
        self.echo.execute(request, cancel).await
    }
}

/// A runtime the test drives: each execution streams `pieces` deltas
/// (`"piece0 "`, `"piece1 "`, …), each only once the test `release`s it,
/// so a test decides exactly which events exist at each moment.
pub struct GatedRuntime {
    pieces: usize,
    gate: Arc<tokio::sync::Semaphore>,
}

impl GatedRuntime {
    pub fn new(pieces: usize) -> Arc<Self> {
        Arc::new(Self {
            pieces,
            gate: Arc::new(tokio::sync::Semaphore::new(0)),
        })
    }

    /// Lets `n` more pieces through.
    pub fn release(&self, n: usize) {
        self.gate.add_permits(n);
    }
}

#[async_trait]
impl AgentRuntime for GatedRuntime {
    fn name(&self) -> &'static str {
        "gated"
    }

    async fn execute(
        &self,
        _request: RuntimeRequest,
        cancel: CancellationToken,
    ) -> Result<RuntimeStream, RuntimeError> {
        use futures::StreamExt as _;
        use run_coordinator::runtime::RuntimeEvent;
        let gate = self.gate.clone();
        let pieces = futures::stream::iter(0..self.pieces).then(move |n| {
            let (gate, cancel) = (gate.clone(), cancel.clone());
            async move {
                tokio::select! {
                    permit = gate.acquire() => permit.expect("the gate stays open").forget(),
                    () = cancel.cancelled() => return None,
                }
                Some(Ok(RuntimeEvent::AssistantDelta(format!("piece{n} "))))
            }
        });
        Ok(pieces
            .take_while(|item| std::future::ready(item.is_some()))
            .filter_map(std::future::ready)
            .boxed())
    }
}

pub const READ: &str = "operator.read";
pub const WRITE: &str = "operator.write";
pub const ADMIN: &str = "operator.admin";

pub const QUESTIONS: &str = "operator.questions";
pub const APPROVALS: &str = "operator.approvals";
pub const PAIRING: &str = "operator.pairing";

/// The scope a method needs per the protocol's table (§7, the real
/// gateway's method scopes, plus this edge's `runs.resume` extension,
/// read); `None` is exempt. Written from the spec, not from the edge's
/// code, so tests check the edge against it.
pub fn required_scope(method: &str) -> Option<&'static str> {
    required_scope_with(method, &serde_json::json!({}))
}

/// As [`required_scope`], for the methods whose scope depends on params.
pub fn required_scope_with(method: &str, params: &Value) -> Option<&'static str> {
    match method {
        "health" => None,
        "status"
        | "agents.list"
        | "chat.history"
        | "chat.startup"
        | "chat.metadata"
        | "sessions.list"
        | "sessions.describe"
        | "sessions.resolve"
        | "sessions.subscribe"
        | "sessions.unsubscribe"
        | "sessions.messages.subscribe"
        | "sessions.messages.unsubscribe"
        | "models.list"
        | "commands.list"
        | "taskSuggestions.list"
        | "runs.resume"
        | "system-presence"
        | "logs.tail"
        | "config.get"
        | "plugins.controlUi.list"
        | "sessions.observer.visibility"
        | "agent.identity.get"
        | "models.authStatus"
        | "controlUi.sessionPullRequests.subscribe"
        | "board.get"
        | "sessions.viewers.set"
        | "projects.list"
        | "talk.catalog"
        | "progressCard.get"
        | "sessions.groups.list"
        | "mentions.list"
        | "system.info"
        | "sessions.branches.list"
        | "session.discussion.info"
        | "sessions.companion.state"
        | "tasks.list"
        | "users.prefs.get"
        | "cron.list"
        | "cron.status"
        | "sessions.catalog.list"
        | "sessions.github.options"
        | "session.members.listEvidence"
        | "environments.list"
        | "cron.runs"
        | "channels.status"
        | "node.list"
        | "worktrees.list"
        | "plugins.list"
        | "skills.search"
        | "transcripts.list"
        | "skills.status"
        | "skills.library.list"
        | "doctor.memory.status"
        | "tools.github.status"
        | "webSearch.status"
        | "last-heartbeat"
        | "sessions.preview"
        | "sessions.get"
        | "chat.message.get"
        | "config.schema.lookup"
        | "themes.list"
        | "diagnostics.lanes"
        | "usage.status"
        | "skills.proposals.list"
        | "artifacts.list"
        | "sessions.usage"
        | "sessions.usage.timeseries"
        | "sessions.usage.logs"
        | "plugins.catalog.browse" => Some(READ),
        "channels.pairing.list" | "device.pair.list" => Some(PAIRING),
        "users.prefs.set" | "sessions.groups.defaults" | "worktrees.branches" => Some(WRITE),
        "agent" | "agent.wait" | "chat.send" | "chat.abort" | "sessions.abort"
        | "sessions.send" | "sessions.create" | "sessions.patch" | "sessions.patchMany" => {
            Some(WRITE)
        }
        "sessions.delete" if params.get("archivedOnly") == Some(&Value::Bool(true)) => Some(WRITE),
        "question.list" => Some(QUESTIONS),
        "plugin.approval.list"
        | "exec.approval.list"
        | "openclaw.approval.list"
        | "approval.history"
        | "exec.approval.grants.list" => Some(APPROVALS),
        _ => Some(ADMIN),
    }
}

/// Whether a connection holding the one scope `held` may call a method that
/// needs `required` (admin covers all, write covers read).
pub fn grants(held: Option<&str>, required: Option<&str>) -> bool {
    match (held, required) {
        (_, None) | (Some(ADMIN), _) => true,
        (Some(held), Some(required)) => held == required || (required == READ && held == WRITE),
        (None, Some(_)) => false,
    }
}
