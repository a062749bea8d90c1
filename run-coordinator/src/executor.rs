//! Executing one run: take the session's writer fence, append the user turn,
//! stream the runtime (coalescing assistant deltas), append the assistant
//! turn, and hand the decision to the terminal path.
//!
//! Execution is detached from whoever submitted: it runs in its own task and
//! only the run's cancel token (abort, supersede, timeout, drain) stops it.
//! Once the token fires the executor stops reading the runtime at once, so a
//! runtime that ignores cancellation cannot change the outcome.

use std::sync::Arc;

use clawgate_common::clock::now_ms;
use futures::StreamExt;
use session_store_api::StoreError;
use session_store_api::model::{
    AcquireMode, AppendEntries, EntryMetadata, HeldFence, NewEntry, RunUpdate, StartRun,
};
use tokio::time::Instant;
use tracing::Instrument;

use crate::coordinator::Inner;
use crate::entries::{current_writer, runtime_attachments, stale, text_entry, user_entry};
use crate::run::{Decision, Run};
use crate::runtime::{HistoryMessage, RuntimeEvent, RuntimeRequest, Usage};
use run_coordinator_api::events::{EventBody, LifecyclePhase, ToolPhase};
use run_coordinator_api::model::{QueueMode, RunStatus};

/// What the executor holds once it has the fence.
pub(crate) struct Held {
    session_id: uuid::Uuid,
    fence: u64,
}

impl Held {
    fn fence(&self) -> HeldFence {
        HeldFence {
            session_id: self.session_id,
            fence_token: self.fence,
        }
    }
}

/// A run's last write, made with its terminal record in one commit
/// (`SessionStore::finish_run`): the entries to append under its fence,
/// and the slot to release.
pub(crate) struct LastWrite {
    pub(crate) fence: HeldFence,
    pub(crate) entries: Vec<NewEntry>,
    /// The run decided `ok` on the strength of these entries: if the fence
    /// turns out stale they cannot be written, and the run was superseded.
    pub(crate) decided_ok: bool,
}

/// The assistant turn as it builds up.
#[derive(Default)]
pub(crate) struct Turn {
    /// The run's text so far (what its events and snapshot carry).
    pub(crate) text: String,
    /// Where the transcript entry being built starts in `text`: a steered
    /// message splits the turn into an entry before it and one after.
    segment_start: usize,
    /// Tool calls and results of the entry being built, in order, as
    /// transcript content parts.
    parts: Vec<serde_json::Value>,
    usage: Option<Usage>,
}

impl Turn {
    pub(crate) fn content_json(&self) -> String {
        let mut parts = self.parts.clone();
        let text = &self.text[self.segment_start..];
        if !text.is_empty() {
            parts.push(serde_json::json!({ "type": "text", "text": text }));
        }
        serde_json::Value::Array(parts).to_string()
    }

    /// Closes the entry being built (a steered message follows it).
    pub(crate) fn next_segment(&mut self) {
        if self.text.len() > self.segment_start {
            // Answers before and after a steer read apart in the live text.
            self.text.push_str("\n\n");
        }
        self.segment_start = self.text.len();
        self.parts.clear();
    }
}

/// Between paragraphs of one message made of several (collected turns).
const MESSAGE_SEPARATOR: &str = "\n\n";

/// Coalesces assistant deltas to at most one event per interval.
struct Deltas {
    pending: String,
    last_emit: Option<Instant>,
    interval: std::time::Duration,
}

impl Deltas {
    /// When the pending delta must go out (None: nothing pending).
    fn due_at(&self) -> Option<Instant> {
        if self.pending.is_empty() {
            return None;
        }
        Some(
            self.last_emit
                .map_or_else(Instant::now, |t| t + self.interval),
        )
    }
}

/// A deadline that never comes (what an unbounded run timeout ends at).
const FAR_FUTURE: std::time::Duration = std::time::Duration::from_secs(100 * 365 * 86_400);

impl Inner {
    pub(crate) async fn execute(self: Arc<Self>, run: Arc<Run>) {
        let span = run.trace.execute_span(&run.id, run.key.as_str());
        async {
            let last = self.drive(&run).await;
            self.finish_with(&run, last).await;
        }
        .instrument(span)
        .await;
        run.trace.execution_done();
    }

    /// Runs the turn. Returns the run's last write if it took the fence.
    /// Every way out leaves a decision on the run (or one was made by a
    /// cancel or supersede).
    async fn drive(&self, run: &Arc<Run>) -> Option<LastWrite> {
        if run.cancel.is_cancelled() {
            return None;
        }
        let (held, history) = match self
            .start(run)
            .instrument(tracing::info_span!(
                "run.start",
                session.id = tracing::field::Empty,
                fence.token = tracing::field::Empty,
            ))
            .await
        {
            Ok(started) => started,
            Err(decision) => {
                run.decide(decision);
                return None;
            }
        };
        let last_write = |entries, decided_ok| LastWrite {
            fence: held.fence(),
            entries,
            decided_ok,
        };
        self.emit(
            run,
            EventBody::Lifecycle {
                phase: LifecyclePhase::Start,
                status: None,
                stop_reason: None,
                error: None,
            },
        );
        // Collected runs: each message its own entry, after the carrier's.
        let collected: Vec<Arc<Run>> = run
            .state()
            .companions
            .iter()
            .filter(|c| c.taken)
            .map(|c| c.run.clone())
            .collect();
        for companion in &collected {
            if let Err(decision) = self.carry(run, &held, companion).await {
                run.decide(decision);
                return Some(last_write(Vec::new(), false));
            }
        }
        let turn = self
            .stream_runtime(run, &held, history)
            .instrument(tracing::info_span!("run.runtime"))
            .await;
        let (entries, decided_ok) = self.last_entries(run, &turn);
        Some(last_write(entries, decided_ok))
    }

    pub(crate) async fn mark_running(&self, run: &Run) -> Result<(), StoreError> {
        let version = {
            let mut state = run.state();
            state.status = RunStatus::Running;
            state.started_at_ms = Some(now_ms());
            state.record_version
        };
        let record = self
            .store
            .update_run(RunUpdate {
                run_id: run.id.clone(),
                expected_version: version,
                status: RunStatus::Running,
                owner: Some(self.epoch.clone()),
                outcome_json: None,
                session_id: None,
                fence_token: None,
                owner_token: self.owner_token(&run.key),
            })
            .await?;
        let mut state = run.state();
        state.record_version = record.version;
        state.started_at_ms = record.started_at_ms;
        drop(state);
        run.trace.status_event(RunStatus::Running);
        Ok(())
    }

    /// The run's start, one commit (`SessionStore::start_run`): running,
    /// the writer fence (by CAS; `interrupt` takes the slot over, and a slot
    /// held by a run that is already over, a crash leftover, is taken over
    /// too) and the user turn. Returns the fence and the history before the
    /// user turn, for the runtime (collected messages, appended after, are
    /// part of the turn, not of its history).
    async fn start(&self, run: &Run) -> Result<(Held, Vec<HistoryMessage>), Decision> {
        let mode = if run.spec.queue_mode == QueueMode::Interrupt {
            AcquireMode::Takeover
        } else {
            AcquireMode::Cas
        };
        let version = run.state().record_version;
        let request = |mode, expected_writer| StartRun {
            run_id: run.id.clone(),
            key: run.key.clone(),
            expected_version: version,
            owner: self.epoch.clone(),
            mode,
            expected_writer,
            label: run.spec.label.clone(),
            entries: vec![user_entry(&run.spec)],
            history_limit: self.config.history_entries.max(1),
            owner_token: self.owner_token(&run.key),
        };
        let store_failure = |err: StoreError| Decision::failed("store", err.to_string());
        let started = match self.store.start_run(request(mode, None)).await {
            Ok(started) => started,
            Err(StoreError::WriterConflict { current, .. }) => {
                let holder = current.and_then(|s| s.active_writer_run_id);
                let holder_over = match &holder {
                    Some(id) => self
                        .store
                        .get_run(id)
                        .await
                        .map(|r| r.is_none_or(|r| r.status.is_terminal()))
                        .unwrap_or(false),
                    None => true,
                };
                if !holder_over {
                    return Err(Decision::failed(
                        "session_busy",
                        format!("the session's writer slot is held by run {holder:?}"),
                    ));
                }
                self.store
                    .start_run(request(AcquireMode::Cas, holder))
                    .await
                    .map_err(store_failure)?
            }
            Err(err) => return Err(store_failure(err)),
        };
        let acquired = &started.acquired;
        run.trace.record_fence(
            &acquired.session.session_id.to_string(),
            acquired.fence_token,
        );
        {
            let mut state = run.state();
            state.status = RunStatus::Running;
            state.record_version = started.record.version;
            state.started_at_ms = started.record.started_at_ms;
            state.session_id = Some(acquired.session.session_id.to_string());
            state.fence_token = Some(acquired.fence_token);
        }
        run.trace.status_event(RunStatus::Running);
        let held = Held {
            session_id: acquired.session.session_id,
            fence: acquired.fence_token,
        };
        let history = started
            .history
            .into_iter()
            .map(|e| HistoryMessage {
                role: e.role,
                content_json: e.content_json,
            })
            .collect();
        Ok((held, history))
    }

    /// Appends one entry with the fence; a stale fence means superseded.
    pub(crate) async fn append(
        &self,
        run: &Run,
        held: &Held,
        entry: NewEntry,
    ) -> Result<u64, Decision> {
        self.store
            .append(AppendEntries {
                key: run.key.clone(),
                session_id: held.session_id,
                run_id: run.id.clone(),
                fence_token: held.fence,
                entries: vec![entry],
                owner_token: self.owner_token(&run.key),
            })
            .await
            .map(|done| done.first_seq)
            .map_err(|err| {
                if stale(&err) {
                    Decision::superseded(current_writer(&err))
                } else {
                    Decision::failed("store", err.to_string())
                }
            })
    }

    /// Streams the runtime until it finishes, fails, times out or the run is
    /// cancelled. Leaves a decision on the run unless it finished normally.
    async fn stream_runtime(
        &self,
        run: &Arc<Run>,
        held: &Held,
        history: Vec<HistoryMessage>,
    ) -> Turn {
        let timeout = run.spec.timeout_ms.map_or(
            self.config.default_run_timeout,
            std::time::Duration::from_millis,
        );
        // The client's timeout is bounded only by `max_run_timeout`, which
        // may allow anything: neither deadline may overflow (the executor
        // would die with the run left running and its lane held).
        let deadline = Instant::now()
            .checked_add(timeout)
            .unwrap_or_else(|| Instant::now() + FAR_FUTURE);
        let deadline_ms =
            i64::try_from(timeout.as_millis()).map_or(i64::MAX, |ms| now_ms().saturating_add(ms));
        let mut turn = Turn::default();
        let (message, attachments) = {
            let state = run.state();
            let collected: Vec<&Arc<Run>> = state
                .companions
                .iter()
                .filter(|c| c.taken)
                .map(|c| &c.run)
                .collect();
            let mut message = run.spec.message.clone();
            for companion in &collected {
                message.push_str(MESSAGE_SEPARATOR);
                message.push_str(&companion.spec.message);
            }
            let specs = std::iter::once(&run.spec).chain(collected.iter().map(|c| &c.spec));
            (message, runtime_attachments(specs))
        };
        let request = RuntimeRequest {
            run_id: run.id.clone(),
            session_key: run.key.as_str().to_owned(),
            session_id: held.session_id.to_string(),
            message,
            history,
            options: run.spec.options.clone(),
            deadline_ms: Some(deadline_ms),
            inputs: run.inputs.clone(),
            attachments,
        };
        let started = tokio::select! {
            biased;
            () = run.cancel.cancelled() => return turn,
            () = tokio::time::sleep_until(deadline) => {
                run.decide(Decision::timed_out());
                return turn;
            }
            started = self.runtime.execute(request, run.cancel.clone()) => started,
        };
        let mut stream = match started {
            Ok(stream) => stream,
            Err(err) => {
                run.decide(Decision::failed(err.kind.as_str(), err.message));
                return turn;
            }
        };
        let mut deltas = Deltas {
            pending: String::new(),
            last_emit: None,
            interval: self.config.delta_interval,
        };
        loop {
            let flush_at = deltas.due_at();
            tokio::select! {
                biased;
                () = run.cancel.cancelled() => break,
                () = tokio::time::sleep_until(deadline) => {
                    run.decide(Decision::timed_out());
                    break;
                }
                () = sleep_until_some(flush_at) => self.flush(run, &turn, &mut deltas),
                item = stream.next() => match item {
                    Some(Ok(RuntimeEvent::AssistantDelta(delta))) => {
                        turn.text.push_str(&delta);
                        deltas.pending.push_str(&delta);
                        run.state().outcome.text.push_str(&delta);
                        if deltas.due_at().is_some_and(|due| due <= Instant::now()) {
                            self.flush(run, &turn, &mut deltas);
                        }
                    }
                    Some(Ok(RuntimeEvent::InputTaken { id })) => {
                        self.flush(run, &turn, &mut deltas);
                        if let Err(decision) = self.steered(run, held, &mut turn, &id).await {
                            run.decide(decision);
                            break;
                        }
                    }
                    Some(Ok(event)) => {
                        if let Some(finished) = self.on_runtime_event(run, &mut turn, &mut deltas, event) {
                            run.state().outcome.stop_reason = Some(finished);
                            break;
                        }
                    }
                    Some(Err(err)) => {
                        run.decide(Decision::failed(err.kind.as_str(), err.message));
                        break;
                    }
                    None => {
                        run.state().outcome.stop_reason = Some("stop".into());
                        break;
                    }
                },
            }
        }
        // Dropping the stream stops the runtime's side of it; a message
        // steered from now on is a turn of its own.
        drop(stream);
        run.inputs.close();
        self.flush(run, &turn, &mut deltas);
        turn
    }

    /// Tool and usage events. Returns the stop reason when the turn finished.
    fn on_runtime_event(
        &self,
        run: &Run,
        turn: &mut Turn,
        deltas: &mut Deltas,
        event: RuntimeEvent,
    ) -> Option<String> {
        let tool = |phase, tool_call_id: String, name: String, data_json: String, is_error| {
            EventBody::Tool {
                phase,
                tool_call_id,
                name,
                data_json,
                is_error,
            }
        };
        match event {
            RuntimeEvent::AssistantDelta(_) | RuntimeEvent::InputTaken { .. } => {
                unreachable!("handled by the caller")
            }
            RuntimeEvent::ToolStart {
                tool_call_id,
                name,
                arguments_json,
            } => {
                // Text before a tool call goes out before it.
                self.flush(run, turn, deltas);
                turn.parts.push(serde_json::json!({
                    "type": "toolCall", "id": tool_call_id, "name": name, "arguments": arguments_json,
                }));
                self.emit(
                    run,
                    tool(ToolPhase::Start, tool_call_id, name, arguments_json, false),
                );
            }
            RuntimeEvent::ToolUpdate {
                tool_call_id,
                partial_json,
            } => self.emit(
                run,
                tool(
                    ToolPhase::Update,
                    tool_call_id,
                    String::new(),
                    partial_json,
                    false,
                ),
            ),
            RuntimeEvent::ToolResult {
                tool_call_id,
                result_json,
                is_error,
            } => {
                turn.parts.push(serde_json::json!({
                    "type": "toolResult", "id": tool_call_id, "result": result_json, "isError": is_error,
                }));
                self.emit(
                    run,
                    tool(
                        ToolPhase::Result,
                        tool_call_id,
                        String::new(),
                        result_json,
                        is_error,
                    ),
                );
            }
            RuntimeEvent::Usage(usage) => {
                run.state().outcome.usage = Some(usage.clone());
                turn.usage = Some(usage);
            }
            RuntimeEvent::Finished { stop_reason } => return Some(stop_reason),
        }
        None
    }

    fn flush(&self, run: &Run, turn: &Turn, deltas: &mut Deltas) {
        if deltas.pending.is_empty() {
            return;
        }
        let delta = std::mem::take(&mut deltas.pending);
        deltas.last_emit = Some(Instant::now());
        self.emit(
            run,
            EventBody::Assistant {
                text: turn.text.clone(),
                delta,
            },
        );
    }

    /// The assistant turn to write with the terminal record: complete when
    /// the runtime finished (which decides `ok`), or the partial text marked
    /// aborted when the run was stopped. Returns the entries and whether
    /// this decided `ok`.
    fn last_entries(&self, run: &Run, turn: &Turn) -> (Vec<NewEntry>, bool) {
        let usage_json = turn
            .usage
            .as_ref()
            .and_then(|u| serde_json::to_string(u).ok());
        if run.decided().is_none() {
            let stop_reason = run
                .state()
                .outcome
                .stop_reason
                .clone()
                .unwrap_or_else(|| "stop".into());
            let decided_ok = run.decide(Decision {
                stop_reason: Some(stop_reason.clone()),
                ..Decision::status(RunStatus::Ok)
            });
            if decided_ok {
                let metadata = EntryMetadata {
                    stop_reason: Some(stop_reason),
                    usage_json,
                    aborted: false,
                };
                let entry = text_entry("assistant", turn.content_json(), metadata);
                return (vec![entry], true);
            }
        }
        match run.decided() {
            Some(decision)
                if decision.status != RunStatus::Superseded && turn.content_json() != "[]" =>
            {
                let metadata = EntryMetadata {
                    stop_reason: Some(decision.stop_reason.unwrap_or_else(|| "error".into())),
                    usage_json,
                    aborted: true,
                };
                let entry = text_entry("assistant", turn.content_json(), metadata);
                (vec![entry], false)
            }
            _ => (Vec::new(), false),
        }
    }
}

pub(crate) async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
