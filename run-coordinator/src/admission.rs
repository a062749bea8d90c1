//! Admission: one decision per idempotency key. A submit is validated,
//! registered in the run table (a retry of the same key waits for that
//! decision and shares it), made durable (`CreateRun`), and only then put in
//! its lane; the caller's ACK follows the durable record.

use std::sync::Arc;
use std::time::Duration;

use clawgate_common::clock::now_ms;
use session_store_api::model::NewRun;
use session_store_api::{SessionKey, SessionStore};
use sha2::{Digest, Sha256};
use tokio::time::Instant;
use tracing::Instrument;

use crate::coordinator::{Inner, State};
use crate::run::Run;
use crate::trace;
use run_coordinator_api::error::{CoordinatorError, CoordinatorResult};
use run_coordinator_api::model::*;

/// The digest a retry of the same intent must match.
fn fingerprint(key: &SessionKey, spec: &RunSpec) -> String {
    let canonical = serde_json::json!({
        "kind": spec.kind,
        "session": key.as_str(),
        "message": spec.message,
        "options": spec.options,
        "timeoutMs": spec.timeout_ms,
        "attachments": spec.attachments.iter().map(|a| serde_json::json!({
            "mimeType": a.mime_type, "fileName": a.file_name,
            "sha256": format!("{:x}", Sha256::digest(a.data.as_bytes())),
        })).collect::<Vec<_>>(),
    });
    let digest = Sha256::digest(canonical.to_string().as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

impl Inner {
    fn validate(&self, req: &SubmitRequest) -> CoordinatorResult<()> {
        session_store_api::model::validate_run_id(&req.run_id)?;
        let spec = &req.spec;
        if spec.message.trim().is_empty() && spec.attachments.is_empty() {
            return Err(CoordinatorError::invalid(
                "message must not be empty (unless it carries attachments)",
            ));
        }
        self.validate_attachments(&spec.attachments)?;
        if spec.message.len() > self.config.max_message_bytes {
            return Err(CoordinatorError::invalid(format!(
                "message is {} bytes; the maximum is {} (COORDINATOR_MAX_MESSAGE_BYTES)",
                spec.message.len(),
                self.config.max_message_bytes
            )));
        }
        if let Some(label) = &spec.label
            && label.chars().count() > self.config.max_label_chars
        {
            return Err(CoordinatorError::invalid(format!(
                "label is longer than {} characters (COORDINATOR_MAX_LABEL_CHARS)",
                self.config.max_label_chars
            )));
        }
        if spec.requester.chars().count() > self.config.max_requester_chars {
            return Err(CoordinatorError::invalid(format!(
                "requester is longer than {} characters (COORDINATOR_MAX_REQUESTER_CHARS)",
                self.config.max_requester_chars
            )));
        }
        if spec.kind.is_empty() || spec.kind.chars().count() > 64 {
            return Err(CoordinatorError::invalid("kind must be 1..=64 characters"));
        }
        if spec.kind.contains('\0') || spec.label.as_deref().is_some_and(|l| l.contains('\0')) {
            return Err(CoordinatorError::invalid(
                "kind and label must not contain NUL characters",
            ));
        }
        if !spec.options.is_object() {
            return Err(CoordinatorError::invalid("options must be a JSON object"));
        }
        if spec.options.to_string().len() > self.config.max_options_bytes {
            return Err(CoordinatorError::invalid(format!(
                "options are larger than {} bytes (COORDINATOR_MAX_OPTIONS_BYTES)",
                self.config.max_options_bytes
            )));
        }
        if let Some(ms) = spec.timeout_ms
            && Duration::from_millis(ms) > self.config.max_run_timeout
        {
            return Err(CoordinatorError::invalid(format!(
                "timeoutMs must be at most {}",
                self.config.max_run_timeout.as_millis()
            )));
        }
        Ok(())
    }

    /// At most `max_attachments`, `max_attachment_bytes` decoded in all,
    /// each with a `type/subtype` MIME type and valid base64.
    fn validate_attachments(&self, attachments: &[Attachment]) -> CoordinatorResult<()> {
        use base64::Engine as _;
        use clawgate_common::limits::{ATTACHMENT_MAX_MIME_BYTES, ATTACHMENT_MAX_NAME_BYTES};
        if attachments.len() > self.config.max_attachments {
            return Err(CoordinatorError::invalid(format!(
                "{} attachments; the maximum is {} (COORDINATOR_MAX_ATTACHMENTS)",
                attachments.len(),
                self.config.max_attachments
            )));
        }
        let mut total = 0usize;
        for (index, attachment) in attachments.iter().enumerate() {
            let mime = &attachment.mime_type;
            let well_formed = mime.len() <= ATTACHMENT_MAX_MIME_BYTES
                && mime
                    .split_once('/')
                    .is_some_and(|(t, s)| !t.is_empty() && !s.is_empty())
                && mime.bytes().all(|b| b.is_ascii_graphic());
            if !well_formed {
                return Err(CoordinatorError::invalid(format!(
                    "attachment {index}: mime type must be type/subtype, at most {ATTACHMENT_MAX_MIME_BYTES} bytes"
                )));
            }
            if attachment.file_name.len() > ATTACHMENT_MAX_NAME_BYTES
                || attachment.file_name.contains('\0')
            {
                return Err(CoordinatorError::invalid(format!(
                    "attachment {index}: file name must be at most {ATTACHMENT_MAX_NAME_BYTES} bytes, without NUL"
                )));
            }
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(&attachment.data)
                .map_err(|e| {
                    CoordinatorError::invalid(format!(
                        "attachment {index}: data is not base64: {e}"
                    ))
                })?;
            total += decoded.len();
        }
        if total > self.config.max_attachment_bytes {
            return Err(CoordinatorError::invalid(format!(
                "attachments are {total} bytes; the maximum is {} (COORDINATOR_MAX_ATTACHMENT_BYTES)",
                self.config.max_attachment_bytes
            )));
        }
        Ok(())
    }

    pub(crate) async fn submit(
        self: &Arc<Self>,
        req: SubmitRequest,
    ) -> CoordinatorResult<Submitted> {
        let span = trace::admit_span(&req.run_id, req.session_key.as_str());
        let submitted = self.submit_traced(req).instrument(span.clone()).await;
        let outcome = match &submitted {
            Ok(done) => match done.admission {
                Admission::Accepted => "accepted",
                Admission::InFlight => "in_flight",
                Admission::Completed => "completed",
            },
            Err(_) => "rejected",
        };
        trace::record_admission(&span, outcome);
        submitted
    }

    async fn submit_traced(self: &Arc<Self>, req: SubmitRequest) -> CoordinatorResult<Submitted> {
        self.validate(&req)?;
        let fingerprint = fingerprint(&req.session_key, &req.spec);
        let run = loop {
            let existing = {
                let mut state = self.lock();
                if state.draining {
                    return Err(CoordinatorError::Draining);
                }
                self.evict(&mut state);
                match state.runs.get(&req.run_id) {
                    Some(run) => run.clone(),
                    None => {
                        if req.spec.queue_mode == QueueMode::Reject
                            && let Some(blocking) = self.lane_blocker(&state, &req.session_key)
                        {
                            let blocking = self.snapshot_locked(&state, &blocking);
                            return Err(CoordinatorError::SessionBusy {
                                blocking: Box::new(blocking),
                            });
                        }
                        let charge = self.queue.charge(crate::queue::spec_bytes(&req.spec))?;
                        let run = Arc::new(Run::new(
                            req.run_id.clone(),
                            req.session_key.clone(),
                            req.spec.clone(),
                            fingerprint.clone(),
                            now_ms(),
                            self.epoch.clone(),
                        ));
                        run.state().queue_charge = Some(charge);
                        run.trace.admitted_in(&tracing::Span::current());
                        state.runs.insert(req.run_id.clone(), run.clone());
                        break run;
                    }
                }
            };
            // Another submit of this key is being admitted: its decision is ours.
            existing.admission_done().await;
            let still_there = self
                .lock()
                .runs
                .get(&req.run_id)
                .is_some_and(|r| Arc::ptr_eq(r, &existing));
            if still_there {
                return self.answer_existing(&existing, &fingerprint);
            }
        };
        let mut placeholder = Placeholder {
            inner: self,
            run: &run,
            accepted: false,
        };
        let admitted = self.admit(&run, &req).await;
        placeholder.accepted = admitted
            .as_ref()
            .is_ok_and(|s| s.admission == Admission::Accepted);
        admitted
    }

    /// Writes the durable record, then registers the run in its lane.
    async fn admit(
        self: &Arc<Self>,
        run: &Arc<Run>,
        req: &SubmitRequest,
    ) -> CoordinatorResult<Submitted> {
        let request_json = serde_json::to_string(&req.spec)
            .map_err(|e| CoordinatorError::Internal(e.to_string()))?;
        let created = self
            .store
            .create_run(NewRun {
                run_id: req.run_id.clone(),
                session_key: req.session_key.clone(),
                kind: req.spec.kind.clone(),
                fingerprint: run.fingerprint.clone(),
                status: RunStatus::Queued,
                owner: self.epoch.clone(),
                request_json,
                owner_token: Some(self.ownership.admission_token(&req.session_key)?),
                expected_settings: req.expected_settings,
                create_session: req.create_session,
            })
            .await?;
        // This instance's own earlier attempt at this key wrote the record,
        // and its answer was lost (a cut connection, the store restarting):
        // that attempt's caller was refused, so the run was never enqueued.
        // It is ours to run. (A record of another epoch is settled by the
        // recovery of whoever took its partition.)
        let landed_unanswered = !created.created
            && !created.fingerprint_mismatch
            && created.record.owner == self.epoch
            && created.record.status == RunStatus::Queued;
        if !created.created && !landed_unanswered {
            // Known to the store but not to this instance's memory: an
            // evicted or pre-restart run. The record answers.
            let record = created.record;
            let known = self.rebuilt(&record);
            if created.fingerprint_mismatch {
                return Err(CoordinatorError::KeyReused {
                    existing: Box::new(self.snapshot(&known)),
                });
            }
            let admission = if record.status.is_terminal() {
                let mut state = self.lock();
                state.runs.insert(known.id.clone(), known.clone());
                state.finished.push_back((Instant::now(), known.id.clone()));
                Admission::Completed
            } else {
                Admission::InFlight
            };
            return Ok(Submitted {
                admission,
                snapshot: self.snapshot(&known),
                accepted_at_ms: record.created_at_ms,
            });
        }
        run.state().record_version = created.record.version;
        self.hub.open(&run.id, run.key.as_str());
        let to_start = {
            let mut state = self.lock();
            self.enqueue_queued(&mut state, run);
            self.pump(&mut state)
        };
        let snapshot = self.snapshot(run);
        self.spawn_all(to_start);
        Ok(Submitted {
            admission: Admission::Accepted,
            snapshot,
            accepted_at_ms: run.created_at_ms,
        })
    }

    fn answer_existing(&self, run: &Arc<Run>, fingerprint: &str) -> CoordinatorResult<Submitted> {
        let snapshot = self.snapshot(run);
        if run.fingerprint != fingerprint {
            return Err(CoordinatorError::KeyReused {
                existing: Box::new(snapshot),
            });
        }
        let admission = if snapshot.status.is_terminal() && run.terminal_snapshot().is_some() {
            Admission::Completed
        } else {
            Admission::InFlight
        };
        Ok(Submitted {
            admission,
            accepted_at_ms: run.created_at_ms,
            snapshot: run.terminal_snapshot().unwrap_or(snapshot),
        })
    }

    /// The run that makes a `reject` submit busy, if any.
    fn lane_blocker(&self, state: &State, key: &SessionKey) -> Option<Arc<Run>> {
        let lane = state.lanes.get(key)?;
        let id = lane.running.as_ref().or(lane.queued.front())?;
        state.runs.get(id).cloned()
    }
}

/// The run-table entry a first submit of a key puts in place before its
/// durable `CreateRun`; retries of the key and cancels of its session wait on
/// it. However admission ends (an answer, an error, or a panic unwinding),
/// the entry is settled when this guard goes: waiters are released, and an
/// entry that did not become an accepted run leaves the table (a run rebuilt
/// from the record may have replaced it; that one stays).
struct Placeholder<'a> {
    inner: &'a Inner,
    run: &'a Arc<Run>,
    accepted: bool,
}

impl Drop for Placeholder<'_> {
    fn drop(&mut self) {
        // A poisoned table (a panic while it was held) is left as it is: a
        // second panic here, during unwinding, would abort the process.
        if !self.accepted
            && let Ok(mut state) = self.inner.state.lock()
            && state
                .runs
                .get(&self.run.id)
                .is_some_and(|r| Arc::ptr_eq(r, self.run))
        {
            state.runs.remove(&self.run.id);
        }
        self.run.mark_admitted();
    }
}
