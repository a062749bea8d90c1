//! Assistant deltas are coalesced to one event per `--delta-interval` (150 ms
//! by default) and flushed before a tool starts and before the end. In
//! paused tokio time, with the coordinator in process: each event's virtual
//! moment is exact, so which deltas went out together, and when, is
//! deterministic.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::*;
use futures::StreamExt;
use run_coordinator::config::CoordinatorConfig;
use run_coordinator::runtime::{
    AgentRuntime, RuntimeError, RuntimeEvent, RuntimeRequest, RuntimeStream,
};
use run_coordinator_api::events::{EventBody, LifecyclePhase, ToolPhase};
use run_coordinator_api::model::RunStatus;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const INTERVAL: Duration = Duration::from_millis(150);

/// A runtime that plays a script: each event after its delay (ms since the
/// one before), and notes when it started.
struct Scripted {
    script: Vec<(u64, RuntimeEvent)>,
    started: Arc<Mutex<Option<Instant>>>,
}

#[async_trait]
impl AgentRuntime for Scripted {
    fn name(&self) -> &'static str {
        "scripted"
    }

    async fn execute(
        &self,
        _request: RuntimeRequest,
        _cancel: CancellationToken,
    ) -> Result<RuntimeStream, RuntimeError> {
        *self.started.lock().unwrap() = Some(Instant::now());
        let steps = self.script.clone().into_iter();
        Ok(futures::stream::unfold(steps, |mut steps| async move {
            let (delay, event) = steps.next()?;
            tokio::time::sleep(Duration::from_millis(delay)).await;
            Some((Ok(event), steps))
        })
        .boxed())
    }
}

fn delta(text: &str) -> RuntimeEvent {
    RuntimeEvent::AssistantDelta(text.into())
}

/// One event as a test reads it: what, and how long after `origin` it was
/// emitted.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Queued,
    Start,
    /// The delta, and the text so far.
    Assistant(String, String),
    ToolStart(String),
    ToolResult(String),
    End(RunStatus),
}

/// Follows the run's log live until it closes; each event with the virtual
/// moment it arrived (the moment it was emitted: paused time does not move
/// while a task can run).
async fn follow(local: &Local, run_id: &str) -> Vec<(Instant, Seen)> {
    let mut subscription = local
        .coordinator
        .subscribe_run(run_id, 0, None)
        .expect("the run's log is open");
    let mut seen = Vec::new();
    while let Some(event) = subscription.next().await {
        let event = event.expect("no reset");
        let what = match &event.body {
            EventBody::Status { status, .. } => {
                assert_eq!(*status, RunStatus::Queued);
                Seen::Queued
            }
            EventBody::Lifecycle {
                phase: LifecyclePhase::Start,
                ..
            } => Seen::Start,
            EventBody::Lifecycle { status, .. } => Seen::End(status.expect("a terminal status")),
            EventBody::Assistant { text, delta } => Seen::Assistant(delta.clone(), text.clone()),
            EventBody::Tool {
                phase: ToolPhase::Start,
                tool_call_id,
                ..
            } => Seen::ToolStart(tool_call_id.clone()),
            EventBody::Tool {
                phase: ToolPhase::Result,
                tool_call_id,
                ..
            } => Seen::ToolResult(tool_call_id.clone()),
            other => panic!("unexpected event {other:?}"),
        };
        seen.push((Instant::now(), what));
    }
    seen
}

fn assistant(delta: &str, text: &str) -> Seen {
    Seen::Assistant(delta.into(), text.into())
}

#[tokio::test(start_paused = true)]
async fn deltas_within_an_interval_are_one_event_and_a_tool_start_flushes_first() {
    let tool = |phase: ToolPhase| match phase {
        ToolPhase::Start => RuntimeEvent::ToolStart {
            tool_call_id: "t1".into(),
            name: "search".into(),
            arguments_json: "{}".into(),
        },
        _ => RuntimeEvent::ToolResult {
            tool_call_id: "t1".into(),
            result_json: "{}".into(),
            is_error: false,
        },
    };
    // Times are ms after the runtime started (the delays add up to them).
    let script = vec![
        (0, delta("a")),               // 0: the first delta goes out at once
        (10, delta("b")),              // 10
        (10, delta("c")),              // 20
        (80, delta("d")),              // 100: b, c, d go out together at 150
        (60, delta("e")),              // 160
        (20, delta("f")),              // 180: due at 300, but ...
        (20, tool(ToolPhase::Start)),  // 200: ... e and f go out before it
        (50, tool(ToolPhase::Result)), // 250
        (150, delta("g")),             // 400: an interval after the last: at once
        (10, delta("h")),              // 410: due at 550, but ...
        (
            10,
            RuntimeEvent::Finished {
                stop_reason: "stop".into(),
            },
        ), // 420: ... the end flushes it first
    ];
    let started = Arc::new(Mutex::new(None));
    let runtime = Arc::new(Scripted {
        script,
        started: started.clone(),
    });
    let config = CoordinatorConfig::default();
    assert_eq!(config.delta_interval, INTERVAL, "the documented default");
    let local = Local::start(runtime, config).await;
    local.submit("coalesced", "main", "go").await;
    let seen = follow(&local, "coalesced").await;
    let origin = started.lock().unwrap().expect("the runtime ran");
    let at: Vec<(u64, Seen)> = seen
        .into_iter()
        .map(|(t, what)| {
            let ms = t
                .checked_duration_since(origin)
                .map_or(0, |d| d.as_millis());
            (ms as u64, what)
        })
        .collect();
    assert_eq!(
        at,
        [
            (0, Seen::Queued),
            (0, Seen::Start),
            (0, assistant("a", "a")),
            (150, assistant("bcd", "abcd")),
            (200, assistant("ef", "abcdef")),
            (200, Seen::ToolStart("t1".into())),
            (250, Seen::ToolResult("t1".into())),
            (400, assistant("g", "abcdefg")),
            (420, assistant("h", "abcdefgh")),
            (420, Seen::End(RunStatus::Ok)),
        ],
        "(ms after the runtime started, event)"
    );
    let done = local.finished("coalesced").await;
    assert_eq!(done.outcome.text, "abcdefgh");
}

/// The echo runtime's own tool call (before its text), then its text in ten
/// pieces 10 ms apart: the first piece at once, the other nine inside the
/// next interval, flushed as one event at the end.
#[tokio::test(start_paused = true)]
async fn the_echo_runtime_s_pieces_within_an_interval_are_one_event() {
    let runtime = Recording::echo(10, 10);
    let local = Local::start(runtime.clone(), CoordinatorConfig::default()).await;
    let options = serde_json::json!({"toolCall": true});
    local
        .submit_with("echoed", "main", "0123456789", options)
        .await;
    let seen = follow(&local, "echoed").await;
    let origin = runtime.executions()[0].started;
    let at: Vec<(u64, Seen)> = seen
        .into_iter()
        .map(|(t, what)| {
            let ms = t
                .checked_duration_since(origin)
                .map_or(0, |d| d.as_millis());
            (ms as u64, what)
        })
        .collect();
    let tool = "echo-tool-echoed".to_owned();
    assert_eq!(
        at,
        [
            (0, Seen::Queued),
            (0, Seen::Start),
            (10, Seen::ToolStart(tool.clone())),
            (20, Seen::ToolResult(tool)),
            (30, assistant("0", "0")),
            (120, assistant("123456789", "0123456789")),
            (120, Seen::End(RunStatus::Ok)),
        ],
        "(ms after the runtime started, event)"
    );
}
