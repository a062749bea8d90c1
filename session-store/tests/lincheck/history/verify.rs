//! What is checked besides linearizability: the transcripts, and that the
//! run met what it should have.

use super::*;

/// A transcript's expected content: its session, and seq → (tag, run).
pub type Expected = (usize, BTreeMap<u64, (String, Run)>);

/// What the transcripts held.
#[derive(Debug, Default)]
pub struct Transcripts {
    pub sessions: usize,
    pub entries: usize,
    /// Entries of writes that never answered.
    pub indeterminate: usize,
}

/// Every transcript must hold the entries of the acknowledged appends
/// (Append, StartRun, FinishRun), at the seqs they were given, by the run
/// that wrote them; besides them only entries of writes that never
/// answered (which may or may not have taken effect), each at most once;
/// nothing a refused write carried.
pub async fn verify_transcripts(
    store: &dyn SessionStore,
    layout: &Layout,
    recorded: &[Recorded],
    seed: u64,
) -> Transcripts {
    let mut expected: HashMap<u128, Expected> = HashMap::new();
    // Tags an indeterminate write carried, with its run.
    let mut maybe: HashMap<String, Run> = HashMap::new();
    for r in recorded {
        if let Output::Unknown { .. } = r.op.output {
            let written = match r.op.input {
                Input::Append { run, count, .. }
                | Input::StartRun { run, count, .. }
                | Input::FinishRun { run, count, .. } => Some((run, count)),
                _ => None,
            };
            if let Some((run, count)) = written {
                maybe.extend((0..count).map(|i| (tag(r.id, i), run)));
            }
        }
        let g_of = |s: u8| global(r.part, s);
        let mut expect = |g: usize, sid: Sid, first: u64, count: u64, run: Run| {
            let (_, entries) = expected
                .entry(sid.0)
                .or_insert_with(|| (g, BTreeMap::new()));
            for i in 0..count {
                entries.insert(first + i, (tag(r.id, i), run));
            }
        };
        match (&r.op.input, &r.op.output) {
            (
                Input::Append {
                    s, sid, run, count, ..
                },
                Output::Appended { first, .. },
            ) => expect(g_of(*s), *sid, *first, *count, *run),
            (
                Input::StartRun { s, run, count, .. },
                Output::Started {
                    acquired,
                    first_seq,
                    ..
                },
            ) => expect(g_of(*s), acquired.session.id, *first_seq, *count, *run),
            (
                Input::FinishRun {
                    s,
                    run,
                    count,
                    writer: Some((sid, _)),
                    ..
                },
                Output::Finished { first_seq, .. },
            ) => expect(g_of(*s), *sid, *first_seq, *count, *run),
            _ => {}
        }
        let g = match &r.op.input {
            Input::Acquire { s, .. }
            | Input::Release { s, .. }
            | Input::Append { s, .. }
            | Input::Reset { s }
            | Input::Delete { s }
            | Input::Read { s }
            | Input::CreateRun { s, .. }
            | Input::StartRun { s, .. }
            | Input::FinishRun { s, .. } => global(r.part, *s),
            _ => continue,
        };
        let mut ids: Vec<Sid> = sessions_in(&r.op.output).iter().map(|v| v.id).collect();
        if let Output::Reset {
            previous: Some(id), ..
        }
        | Output::Deleted {
            previous: Some(id), ..
        } = &r.op.output
        {
            ids.push(*id);
        }
        for id in ids {
            expected.entry(id.0).or_insert_with(|| (g, BTreeMap::new()));
        }
    }
    let mut found_in_all = Transcripts {
        sessions: expected.len(),
        ..Transcripts::default()
    };
    for (sid, (g, wanted)) in &expected {
        let id = uuid::Uuid::from_u128(*sid);
        let found = suite::transcript(store, &layout.keys[*g], Some(id)).await;
        for (index, entry) in found.iter().enumerate() {
            assert_eq!(
                entry.seq,
                index as u64 + 1,
                "seed {seed}: {id}: seqs have a gap"
            );
            let text = suite::text_of(entry);
            let Some((tag, run)) = wanted.get(&entry.seq) else {
                let Some(run) = maybe.remove(&text) else {
                    panic!(
                        "seed {seed}: {id} seq {} holds {text:?} by {}, which no acknowledged \
                         or indeterminate write put there (or one put there twice)",
                        entry.seq, entry.run_id
                    );
                };
                assert_eq!(
                    entry.run_id,
                    run_name(run),
                    "seed {seed}: {id} seq {}",
                    entry.seq
                );
                found_in_all.indeterminate += 1;
                continue;
            };
            assert_eq!(
                (&text, entry.run_id.as_str()),
                (tag, run_name(*run).as_str()),
                "seed {seed}: {id} seq {}",
                entry.seq
            );
            found_in_all.entries += 1;
        }
        // Seqs have no gaps: an acknowledged seq within them was checked.
        assert!(
            wanted.keys().all(|seq| *seq as usize <= found.len()),
            "seed {seed}: {id}: acknowledged entries are missing ({} found)",
            found.len()
        );
    }
    found_in_all
}

/// Takes granted by expiry: a take, not stealing, that opened tenure `e`
/// when tenure `e - 1` was another member's and was not released (by a
/// release that answered or one that did not).
pub fn expiries(recorded: &[Recorded]) -> usize {
    let mut owners: HashMap<(usize, u64), Member> = HashMap::new();
    let mut released: std::collections::HashSet<(usize, u64)> = Default::default();
    for r in recorded {
        match (&r.op.input, &r.op.output) {
            (_, Output::Lease { lease, .. } | Output::Leases(lease)) => {
                if let Some(owner) = lease.owner {
                    owners.insert((r.part, lease.epoch), owner);
                }
            }
            (
                Input::ReleaseLease { token },
                Output::LeaseReleased(true) | Output::Unknown { .. },
            ) => {
                released.insert((r.part, token.epoch));
            }
            _ => {}
        }
    }
    recorded
        .iter()
        .filter(|r| match (&r.op.input, &r.op.output) {
            (
                Input::TakeLease {
                    member,
                    steal: false,
                },
                Output::Lease {
                    granted: true,
                    lease,
                    ..
                },
            ) => {
                let before = (r.part, lease.epoch - 1);
                owners.get(&before).is_some_and(|owner| owner != member)
                    && !released.contains(&before)
            }
            _ => false,
        })
        .count()
}

/// Counts by kind, and by kind and answer (`ok` or the refusal's code).
pub fn tally(
    recorded: &[Recorded],
) -> (BTreeMap<&'static str, usize>, BTreeMap<&'static str, usize>) {
    let mut by_kind: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut refusals: BTreeMap<&'static str, usize> = BTreeMap::new();
    for r in recorded {
        *by_kind.entry(r.op.input.kind()).or_default() += 1;
        if let Output::Refused(refusal) = &r.op.output {
            *refusals.entry(refusal.code()).or_default() += 1;
        }
    }
    (by_kind, refusals)
}

pub fn describe_answers(recorded: &[Recorded]) -> String {
    let mut answers: BTreeMap<&'static str, BTreeMap<&'static str, usize>> = BTreeMap::new();
    for r in recorded {
        let answer = match &r.op.output {
            Output::Refused(refusal) => refusal.code(),
            Output::Released {
                released: false, ..
            }
            | Output::Lease { granted: false, .. }
            | Output::LeaseReleased(false)
            | Output::Deleted { deleted: false, .. } => "no-op",
            Output::RunCreated { created: false, .. } => "existing",
            Output::Unknown { .. } => "indeterminate",
            _ => "ok",
        };
        *answers
            .entry(r.op.input.kind())
            .or_default()
            .entry(answer)
            .or_default() += 1;
    }
    let mut out = String::new();
    for (kind, counts) in answers {
        let total: usize = counts.values().sum();
        let detail: Vec<String> = counts.iter().map(|(a, n)| format!("{a} {n}")).collect();
        let _ = writeln!(out, "    {kind:<14} {total:>6}: {}", detail.join(", "));
    }
    out
}

/// Writes a partition's history where a failed run can be studied.
pub fn dump_history(
    name: &str,
    seed: u64,
    partition: u32,
    ops: &[Operation<Input, Output>],
) -> String {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("lincheck");
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join(format!("{name}-seed{seed}-partition{partition}.txt"));
    let mut text = String::new();
    for (i, op) in ops.iter().enumerate() {
        let _ = writeln!(
            text,
            "#{i} client {} [{}, {}] {:?} => {:?}",
            op.client, op.call, op.ret, op.input, op.output
        );
    }
    match std::fs::write(&path, text) {
        Ok(()) => path.display().to_string(),
        Err(e) => format!("(not written: {e})"),
    }
}
