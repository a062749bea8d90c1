//! StartRun and FinishRun: a record update, a writer fence and an append
//! in one, all or nothing.

use super::*;

impl Partition {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start_run(
        &self,
        state: &mut State,
        s: u8,
        run: Run,
        version: u64,
        owner: Member,
        takeover: bool,
        expected_writer: Option<Run>,
        count: u64,
        history: u32,
        token: Option<Token>,
        fresh: Option<Sid>,
    ) -> Option<Output> {
        let refused = |refusal| Some(Output::Refused(refusal));
        if let Err(refusal) = state.owner_check(token) {
            return refused(refusal);
        }
        let Some(mut record) = state.record(run) else {
            return refused(Refusal::RunNotFound);
        };
        if let Err(refusal) = record.check_update(version) {
            return refused(refusal);
        }
        let mut slot = state.slots[s as usize].clone();
        // Only a session made here needs the reported sessionId.
        let id = fresh.unwrap_or(Sid(0));
        let mut acquired = match slot.acquire(None, expected_writer, run, takeover, id) {
            Ok(acquired) => acquired,
            Err(refusal) => return refused(refusal),
        };
        if acquired.created && fresh.is_none() {
            return None;
        }
        let first_seq = match count {
            0 => 0,
            count => slot
                .reserve(acquired.session.id, run, acquired.fence, count)
                .expect("the new fence holds"),
        };
        acquired.session = slot.view().expect("a session exists here");
        record.status = RunStatus::Running;
        record.version += 1;
        record.owner = owner;
        record.sid = Some(acquired.session.id);
        record.fence = Some(acquired.fence);
        let view = record.view();
        let total = acquired.session.entries;
        state.slots[s as usize] = slot;
        state.live(run).record = Some(record);
        Some(Output::Started {
            record: view,
            acquired,
            first_seq,
            history: start_history(first_seq, total, history),
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn finish_run(
        state: &mut State,
        s: u8,
        run: Run,
        version: u64,
        status: RunStatus,
        writer: Option<(Sid, u64)>,
        count: u64,
        token: Option<Token>,
    ) -> Output {
        if let Err(refusal) = state.owner_check(token) {
            return Output::Refused(refusal);
        }
        let Some(mut record) = state.record(run) else {
            return Output::Refused(Refusal::RunNotFound);
        };
        assert!(
            status.is_terminal(),
            "the tests finish runs with a terminal status"
        );
        let mut slot = state.slots[s as usize].clone();
        let first_seq = match (count, writer) {
            (0, _) => 0,
            (count, Some((sid, fence))) => match slot.reserve(sid, run, fence, count) {
                Ok(first) => first,
                Err(refusal) => return Output::Refused(refusal),
            },
            (_, None) => return Output::Refused(Refusal::Invalid),
        };
        if let Err(refusal) = record.check_update(version) {
            return Output::Refused(refusal);
        }
        record.status = status;
        record.version += 1;
        if let Some((sid, fence)) = writer {
            record.sid = Some(sid);
            record.fence = Some(fence);
        }
        let released = writer.is_some_and(|(_, fence)| slot.release(run, fence));
        if let Some(c) = slot.current.as_mut()
            && c.last_run == Some(run)
        {
            c.last_status = Some(status);
        }
        let view = record.view();
        state.slots[s as usize] = slot;
        state.live(run).record = Some(record);
        Output::Finished {
            record: view,
            first_seq,
            released,
        }
    }
}
