//! Where a run sits in the distributed trace.
//!
//! A run is admitted inside the `Submit` call (`run.admit`), waits in its
//! lane (`run.queued`) and executes in a task detached from any request
//! (`run.execute`). The execution continues the admission's context — same
//! trace, with the run's baggage (`run.id`, `session.key`) so every store
//! call below it names the run — although the `Submit` answered long ago.
//! Requests that act on a run from elsewhere (cancel, wait, resume, a
//! supersede) link to its *anchor*: its execution span once started, its
//! admission span before.
//!
//! Without a trace exporter these spans are plain `tracing` spans: log lines
//! inside them still carry `run.id`.

use std::sync::Mutex;

use clawgate_telemetry::otel::{Context, OpenTelemetrySpanExt, SpanContext, TraceContextExt};
use clawgate_telemetry::propagation;
use tracing::Span;
use tracing::field::Empty;

use run_coordinator_api::model::RunStatus;

#[derive(Default)]
pub struct RunTrace {
    /// The context execution continues (admission's, with baggage).
    parent: Mutex<Option<Context>>,
    /// What other spans link to.
    anchor: Mutex<Option<SpanContext>>,
    /// The lane wait, open from enqueue until the run starts.
    queued: Mutex<Option<Span>>,
    /// The execution span, for state events written from other tasks.
    execution: Mutex<Option<Span>>,
    /// The run this one superseded.
    superseded: Mutex<Option<SpanContext>>,
}

fn span_context(span: &Span) -> Option<SpanContext> {
    let context = span.context().span().span_context().clone();
    context.is_valid().then_some(context)
}

/// The span of a `Submit`'s admission work, child of the current span,
/// carrying the run's baggage to every call below it.
pub fn admit_span(run_id: &str, session_key: &str) -> Span {
    let span = tracing::info_span!(
        "run.admit",
        run.id = run_id,
        session.key = session_key,
        run.admission = Empty,
    );
    if !span.is_disabled() {
        let cx = propagation::with_baggage(
            &Span::current().context(),
            [("run.id", run_id), ("session.key", session_key)],
        );
        let _ = span.set_parent(cx);
    }
    span
}

/// Records on `admit` (a [`admit_span`]) how the admission ended
/// (`accepted`, `in_flight`, `completed`, or `rejected`).
pub fn record_admission(admit: &Span, outcome: &str) {
    admit.record("run.admission", outcome);
}

/// A state transition, as an event on the run's execution span when there
/// is one (else on the current span). Its target is under `otel`: in the
/// trace, not three log lines per run.
impl RunTrace {
    pub fn status_event(&self, status: RunStatus) {
        let execution = self.execution.lock().unwrap().clone();
        // Recorded once: a field recorded twice becomes two attributes.
        if let Some(span) = &execution
            && status.is_terminal()
        {
            span.record("run.status", status.as_str());
        }
        let span = execution.unwrap_or_else(Span::current);
        tracing::event!(
            target: "otel::run",
            parent: &span,
            tracing::Level::INFO,
            { run.status = status.as_str() },
            "run {}",
            status.as_str()
        );
    }

    /// Links the current span (a cancel, a wait, a resume) to this run.
    pub fn link_current(&self) {
        if let Some(anchor) = self.anchor.lock().unwrap().clone() {
            Span::current().add_link(anchor);
        }
    }

    /// Called inside `run.admit`: execution will continue this context.
    pub fn admitted_in(&self, span: &Span) {
        *self.parent.lock().unwrap() = Some(span.context());
        *self.anchor.lock().unwrap() = span_context(span);
    }

    /// The run waits in its lane from now until [`RunTrace::dequeued`].
    pub fn queue(&self, run_id: &str, position: u32) {
        let span =
            tracing::info_span!("run.queued", run.id = run_id, run.queue_position = position);
        *self.queued.lock().unwrap() = Some(span);
    }

    /// The run left its lane's queue (started or cancelled).
    pub fn dequeued(&self) {
        self.queued.lock().unwrap().take();
    }

    /// `new` supersedes this run: it links here.
    pub fn superseded_by(&self, new: &RunTrace) {
        let anchor = self.anchor.lock().unwrap().clone();
        if let Some(anchor) = anchor {
            Span::current().add_link(anchor.clone());
            *new.superseded.lock().unwrap() = Some(anchor);
        }
    }

    /// The execution span of run `run_id` (of session `session_key`): continues
    /// its admission (a recovered run starts a trace of its own) and links to
    /// the run it superseded.
    pub fn execute_span(&self, run_id: &str, session_key: &str) -> Span {
        let span = tracing::info_span!(
            parent: None,
            "run.execute",
            run.id = run_id,
            session.key = session_key,
            session.id = Empty,
            fence.token = Empty,
            run.status = Empty,
        );
        if !span.is_disabled() {
            let parent = self.parent.lock().unwrap().clone().unwrap_or_else(|| {
                propagation::with_baggage(
                    &Context::new(),
                    [("run.id", run_id), ("session.key", session_key)],
                )
            });
            let _ = span.set_parent(parent);
            if let Some(old) = self.superseded.lock().unwrap().clone() {
                span.add_link(old);
            }
            if let Some(anchor) = span_context(&span) {
                *self.anchor.lock().unwrap() = Some(anchor);
            }
        }
        self.dequeued();
        *self.execution.lock().unwrap() = Some(span.clone());
        span
    }

    /// The run's execution is over: its span may close.
    pub fn execution_done(&self) {
        self.execution.lock().unwrap().take();
    }

    /// The writer fence the run took, on the current span (its acquisition)
    /// and on its execution span.
    pub fn record_fence(&self, session_id: &str, fence_token: u64) {
        let execution = self.execution.lock().unwrap().clone();
        for span in [Some(Span::current()), execution].into_iter().flatten() {
            span.record("session.id", session_id);
            span.record("fence.token", fence_token);
        }
    }
}
