//! `runs.resume {runId, fromSeq, epoch}`: this edge's extension (see
//! docs/protocol-extensions.md). Replays the run's events after `fromSeq`
//! to this connection, then follows it live until it ends.
//!
//! The handover from the broadcast: the run is switched to its resume
//! stream under the connection's run lock (`Conn::start_resume`), which the
//! broadcast holds while it delivers, so each event of the run reaches the
//! connection through exactly one of the two. Events the broadcast had
//! delivered before the switch (a reconnected client can receive some
//! before its `runs.resume` is handled) are recognised by their position in
//! their coordinator's all-runs stream and not sent again; everything else
//! after `fromSeq` is. No gap, no duplicate, whichever came first.

use std::sync::Arc;

use run_coordinator_api::EventStream;
use run_coordinator_api::events::{RunEvent, StreamItem};
use serde_json::json;

use super::{Answer, backend_error, fail, trace};
use crate::events::fanout;
use crate::events::translate::RunMemory;
use crate::protocol::frames::ErrorShape;
use crate::protocol::params::Params;
use crate::state::Edge;
use crate::state::connection::{BroadcastSpans, Conn};

/// The params of `runs.resume`.
pub(super) const RUNS_RESUME_KEYS: &[&str] = &["runId", "fromSeq", "epoch"];

pub(super) async fn runs_resume(edge: &Arc<Edge>, conn: &Arc<Conn>, p: &Params<'_>) -> Answer {
    let run_id = p.required_non_empty("runId").map_err(fail)?.to_owned();
    trace::record_run(&run_id);
    let from_seq = p
        .integer("fromSeq", 0, u64::MAX >> 1)
        .map_err(fail)?
        .unwrap_or(0);
    let epoch = p
        .string("epoch")
        .map_err(fail)?
        .unwrap_or_default()
        .to_owned();
    let coordinator = &edge.backends.coordinator;
    let mut stream = coordinator
        .subscribe_run(&run_id, from_seq, &epoch)
        .await
        .map_err(backend_error)?;
    // The coordinator answers a Subscribe at once: `subscribed`, or a reset.
    let first = match stream.next().await.map_err(backend_error)? {
        Some(StreamItem::Reset(reset)) => {
            return Err(fail(
                ErrorShape::invalid(format!("cannot resume run {run_id}: {}", reset.reason))
                    .with_details(json!({ "code": "RESUME_UNAVAILABLE", "epoch": &*reset.epoch })),
            ));
        }
        Some(StreamItem::Event(event)) => Some(event),
        Some(StreamItem::Subscribed { .. }) => None,
        None => {
            return Err(fail(
                ErrorShape::unavailable("the run coordinator ended the stream").retry_after(500),
            ));
        }
    };
    // The switch can wait until the resume is known to work: the replay
    // started at `fromSeq`, and whatever the broadcast delivers until the
    // switch is in the spans taken with it, and left out of the replay (the
    // run's events carry its coordinator's epoch: only that coordinator's
    // span can cover them).
    let started = conn.start_resume(&run_id, edge.config.max_resumes);
    let started = started.map_err(|max| {
        edge.metrics.limit_hit("EDGE_MAX_RESUMES");
        fail(
            ErrorShape::unavailable(format!(
                "this connection follows too many resumed runs (at most {max}, EDGE_MAX_RESUMES); retry when one ends"
            ))
            .retry_after(1000)
            .with_details(json!({ "code": "TOO_MANY_RESUMES", "limit": max })),
        )
    })?;
    let Some(delivered) = started else {
        return Err(fail(ErrorShape::invalid(format!(
            "run {run_id} is already being resumed on this connection"
        ))));
    };
    tokio::spawn(follow(
        conn.clone(),
        run_id.clone(),
        delivered,
        first,
        stream,
    ));
    Ok(json!({ "runId": run_id, "resumedAfterSeq": from_seq }))
}

/// Sends the run's events from the resume stream, starting with `first`,
/// leaving out those the broadcast `delivered` here already, until the run
/// ends (the stream finishes) or the connection closes.
async fn follow(
    conn: Arc<Conn>,
    run_id: String,
    delivered: BroadcastSpans,
    first: Option<RunEvent>,
    mut stream: EventStream,
) {
    // Every event is translated, delivered or not: the final chat event
    // carries the text so far.
    let mut memory = RunMemory::default();
    let mut next = first;
    let completed = loop {
        if let Some(event) = next.take() {
            let outgoing = memory.translate(&event);
            let seen = delivered.covers(&event.epoch, event.stream_seq);
            if !seen {
                fanout::deliver_unfiltered(&conn, &outgoing);
            }
            if conn.outbox.closing.is_cancelled() {
                break true;
            }
        }
        match stream.next().await {
            Ok(Some(StreamItem::Event(event))) => next = Some(event),
            Ok(Some(StreamItem::Subscribed { .. })) => {}
            // The run's log is drained and closed: the run ended.
            Ok(None) => break true,
            // A reset or a broken stream before the end.
            Ok(Some(_)) | Err(_) => break false,
        }
    };
    conn.end_resume(&run_id, completed);
}
