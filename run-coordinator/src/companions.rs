//! The executor's part in `steer` and `collect` (see `lanes.rs`): writing a
//! companion's message into the turn of the run that carries it.

use std::sync::Arc;

use session_store_api::model::EntryMetadata;

use crate::coordinator::Inner;
use crate::entries::{text_entry, user_entry};
use crate::executor::{Held, Turn};
use crate::run::{Decision, Run};
use run_coordinator_api::events::{EventBody, LifecyclePhase};

impl Inner {
    /// Writes a companion's message into the carrier's turn: the companion
    /// is running from now on (durably, so a restart reports it lost rather
    /// than running it again), and its message is the next user entry.
    pub(crate) async fn carry(
        &self,
        run: &Run,
        held: &Held,
        companion: &Arc<Run>,
    ) -> Result<(), Decision> {
        if let Err(err) = self.mark_running(companion).await {
            return Err(Decision::failed("store", err.to_string()));
        }
        self.emit(
            companion,
            EventBody::Lifecycle {
                phase: LifecyclePhase::Start,
                status: None,
                stop_reason: None,
                error: None,
            },
        );
        self.append(run, held, user_entry(&companion.spec))
            .await
            .map(|_| ())
    }

    /// The runtime took the steered message `id`: the answer so far is
    /// one entry, the message the next, and what follows answers it.
    pub(crate) async fn steered(
        &self,
        run: &Run,
        held: &Held,
        turn: &mut Turn,
        id: &str,
    ) -> Result<(), Decision> {
        let companion = {
            let mut state = run.state();
            let found = state.companions.iter_mut().find(|c| c.run.id == id);
            found.map(|c| {
                c.taken = true;
                c.run.clone()
            })
        };
        let Some(companion) = companion else {
            clawgate_telemetry::limited!(warn, run.id = %run.id, input = %id, "the runtime took an input it was not given");
            return Ok(());
        };
        if turn.content_json() != "[]" {
            let metadata = EntryMetadata {
                stop_reason: Some("steered".into()),
                usage_json: None,
                aborted: false,
            };
            self.append(
                run,
                held,
                text_entry("assistant", turn.content_json(), metadata),
            )
            .await?;
        }
        turn.next_segment();
        run.state().outcome.text = turn.text.clone();
        self.carry(run, held, &companion).await
    }
}
