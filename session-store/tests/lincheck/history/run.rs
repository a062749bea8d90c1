//! One checked run: clients against a store (with faults, or without),
//! then the checks.

use super::faults::{FaultLog, StoreProcess};
use super::*;
use crate::suite::harness::TestServer;

/// The store a run talks to.
pub enum Store {
    /// A backend behind an in-process gRPC server; no faults.
    InProcess(Harness),
    /// The `session-store` binary, killed and paused under the clients.
    Process(StoreProcess),
}

/// What the clients recorded, and what else was found on the way.
struct Recording {
    recorded: Vec<Recorded>,
    ran: Duration,
    faults: FaultLog,
    transcripts: Transcripts,
}

async fn record(cfg: &Config, name: &str, store: Store, shared: Arc<Shared>) -> Recording {
    let spawn_clients = || -> Vec<_> {
        (0..cfg.tasks)
            .map(|task| {
                let count = cfg.ops / cfg.tasks + usize::from(task < cfg.ops % cfg.tasks);
                tokio::spawn(client(shared.clone(), task, count))
            })
            .collect()
    };
    let join = async |clients: Vec<tokio::task::JoinHandle<Vec<Recorded>>>| {
        let mut recorded = Vec::with_capacity(cfg.ops);
        for c in clients {
            match c.await {
                Ok(ops) => recorded.extend(ops),
                Err(e) => panic!("{name}: a client failed ({e})"),
            }
        }
        recorded
    };
    let started = Instant::now();
    let (recorded, faults, ran, transcripts) = match store {
        Store::InProcess(harness) => {
            let server = TestServer::start(harness.shared(), Default::default()).await;
            let mut remotes: Vec<Arc<dyn SessionStore>> = Vec::new();
            for _ in 0..CONNECTIONS {
                remotes.push(Arc::new(server.remote().await));
            }
            shared.store.send_replace(Some(Connections {
                generation: 0,
                remotes: remotes.clone(),
            }));
            let recorded = join(spawn_clients()).await;
            let ran = started.elapsed();
            let transcripts =
                verify_transcripts(&*remotes[0], &shared.layout, &recorded, cfg.seed).await;
            shared.store.send_replace(None);
            drop(remotes);
            server.stop().await;
            harness.finish().await;
            (recorded, FaultLog::default(), ran, transcripts)
        }
        Store::Process(mut process) => {
            let connections = process.start().await;
            shared.store.send_replace(Some(connections));
            let clients = spawn_clients();
            let faults =
                faults::inject(&shared, &mut process, cfg.ops, cfg.kills, cfg.pauses).await;
            let recorded = join(clients).await;
            let ran = started.elapsed();
            let remotes = shared
                .store
                .send_replace(None)
                .expect("the store runs")
                .remotes;
            let transcripts =
                verify_transcripts(&*remotes[0], &shared.layout, &recorded, cfg.seed).await;
            drop(remotes);
            process.finish().await;
            (recorded, faults, ran, transcripts)
        }
    };
    Recording {
        recorded,
        ran,
        faults,
        transcripts,
    }
}

/// Runs `cfg.ops` operations against `store`, checks the histories, and
/// asserts that the run met what it should have; with `faults`, also that
/// it had faults in it.
pub async fn lincheck(name: &str, store: Store) {
    let cfg = config();
    let faulty = matches!(store, Store::Process(_));
    let layout = Layout::new();
    eprintln!(
        "lincheck {name}: seed {} ({:#x}), {} operations, {} clients over {CONNECTIONS} connections, \
         partitions {:?} with {SESSIONS_PER_PARTITION} sessions each, leases of {} ms{}",
        cfg.seed,
        cfg.seed,
        cfg.ops,
        cfg.tasks,
        layout.partitions,
        cfg.lease_ttl_ms,
        match faulty {
            true => format!(
                ", {} kills and {} pauses of the store",
                cfg.kills, cfg.pauses
            ),
            false => String::new(),
        }
    );
    let reproduce = format!(
        "LINCHECK_SEED={} LINCHECK_OPS={} LINCHECK_TASKS={} LINCHECK_LEASE_TTL_MS={} \
         LINCHECK_KILLS={} LINCHECK_PAUSES={} cargo test -p session-store --test linearizability {name} -- --nocapture",
        cfg.seed, cfg.ops, cfg.tasks, cfg.lease_ttl_ms, cfg.kills, cfg.pauses
    );
    let shared = Arc::new(Shared {
        board: Mutex::new(Board::new(layout.sessions())),
        layout,
        clock: AtomicU64::new(0),
        seed: cfg.seed,
        lease_ttl_ms: cfg.lease_ttl_ms,
        store: tokio::sync::watch::Sender::new(None),
        faulty,
        done: AtomicU64::new(0),
        timeouts: AtomicU64::new(0),
        ended: Mutex::new(HashMap::new()),
    });
    let Recording {
        mut recorded,
        ran,
        faults,
        transcripts,
    } = record(&cfg, name, store, shared.clone()).await;
    // An operation without an answer took effect, if at all, before the
    // store it was sent to was gone.
    let ended = shared.ended.lock().unwrap().clone();
    for r in &mut recorded {
        if let (Output::Unknown { .. }, Some(ended)) = (&r.op.output, ended.get(&r.generation)) {
            r.op.ret = *ended;
        }
    }

    // One history per partition; record operations learn how many
    // operations name their run.
    let mut uses: HashMap<(usize, Run), u32> = HashMap::new();
    for r in &recorded {
        if let Some(run) = r.op.input.run_of_record() {
            *uses.entry((r.part, run)).or_default() += 1;
        }
    }
    let mut histories: Vec<Vec<Operation<Input, Output>>> = vec![Vec::new(); PARTITIONS];
    for r in &recorded {
        let mut op = r.op.clone();
        if let Some(run) = op.input.run_of_record() {
            op.input.set_uses(uses[&(r.part, run)]);
        }
        histories[r.part].push(op);
    }
    let model = Partition {
        sessions: SESSIONS_PER_PARTITION,
        lease_ttl_ms: cfg.lease_ttl_ms,
    };
    let check_started = Instant::now();
    let outcomes: Vec<(Result<Stats, _>, Duration)> = std::thread::scope(|scope| {
        let handles: Vec<_> = histories
            .iter()
            .map(|history| {
                let model = &model;
                scope.spawn(move || {
                    let t = Instant::now();
                    (lincheck::check(model, history), t.elapsed())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let checked = check_started.elapsed();

    let (by_kind, refusals) = tally(&recorded);
    let mut report = String::new();
    let _ = writeln!(
        report,
        "lincheck {name}: seed {}: {} operations in {:.2?} ({:.0} ops/s); answers by kind:",
        cfg.seed,
        recorded.len(),
        ran,
        recorded.len() as f64 / ran.as_secs_f64()
    );
    report.push_str(&describe_answers(&recorded));
    let refusal_list: Vec<String> = refusals.iter().map(|(c, n)| format!("{c} {n}")).collect();
    let _ = writeln!(report, "  refusals: {}", refusal_list.join(", "));
    let _ = writeln!(
        report,
        "  transcripts: {} sessionIds, {} entries, each where its acknowledged write put it; \
         {} entries of indeterminate writes found in them",
        transcripts.sessions, transcripts.entries, transcripts.indeterminate
    );
    let unknown = recorded
        .iter()
        .filter(|r| matches!(r.op.output, Output::Unknown { .. }))
        .count();
    let expiries = expiries(&recorded);
    let _ = writeln!(
        report,
        "  faults: {} kills (and restarts), {} pauses; {unknown} indeterminate operations \
         ({} calls timed out); {expiries} takes granted by expiry",
        faults.kills,
        faults.pauses,
        shared.timeouts.load(Ordering::SeqCst)
    );
    let shared_layout = &shared.layout;
    for ((partition, history), (outcome, took)) in shared_layout
        .partitions
        .iter()
        .zip(&histories)
        .zip(&outcomes)
    {
        match outcome {
            Ok(stats) => {
                let _ = writeln!(
                    report,
                    "  partition {partition}: {} operations linearizable, checked in {took:.2?} \
                     ({} steps, {} backtracks, {} configurations)",
                    history.len(),
                    stats.steps,
                    stats.backtracks,
                    stats.cached
                );
            }
            Err(failure) => {
                let _ = writeln!(
                    report,
                    "  partition {partition}: NOT LINEARIZABLE ({} operations, checked in {took:.2?})",
                    history.len()
                );
                let _ = writeln!(report, "{}", lincheck::explain(&model, history, failure));
                let path = dump_history(name, cfg.seed, *partition, history);
                let _ = writeln!(report, "  the partition's whole history: {path}");
            }
        }
    }
    let _ = writeln!(report, "  check: {checked:.2?} for both partitions");
    eprint!("{report}");
    if outcomes.iter().any(|(o, _)| o.is_err()) {
        panic!("{name}: the history is not linearizable; reproduce with {reproduce}");
    }
    for kind in KINDS {
        assert!(
            by_kind.get(kind).is_some_and(|n| *n > 0),
            "{name}: no {kind} happened; reproduce with {reproduce}"
        );
    }
    for code in REFUSALS_EXPECTED {
        assert!(
            refusals.get(code).is_some_and(|n| *n > 0),
            "{name}: no {code} refusal happened, so the run proves little; reproduce with {reproduce}"
        );
    }
    let ok = |kind: &str| {
        recorded
            .iter()
            .filter(|r| r.op.input.kind() == kind && !matches!(r.op.output, Output::Refused(_)))
            .count()
    };
    for kind in ["append", "takeover", "start_run", "finish_run"] {
        assert!(
            ok(kind) > 0,
            "{name}: no {kind} succeeded; reproduce with {reproduce}"
        );
    }
    let epochs = recorded
        .iter()
        .filter(|r| matches!(r.op.output, Output::Lease { granted: true, .. }))
        .filter(|r| matches!(r.op.input, Input::TakeLease { .. }))
        .count();
    assert!(
        epochs > 1,
        "{name}: the epoch hardly changed; reproduce with {reproduce}"
    );
    assert!(
        expiries > 0,
        "{name}: no lease was taken by expiry; reproduce with {reproduce}"
    );
    if faulty {
        assert_eq!(
            (faults.kills, faults.pauses),
            (cfg.kills, cfg.pauses),
            "{name}: the faults planned were not all injected"
        );
        assert!(
            cfg.kills + cfg.pauses == 0 || unknown > 0,
            "{name}: faults were injected, yet no operation is indeterminate; reproduce with {reproduce}"
        );
    }
}
