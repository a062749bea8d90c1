//! The CI smoke run of the store's fuzz target (issue 14), on the stable
//! toolchain: every committed seed of `fuzz/seeds/store_request/` (request
//! sequences built from the sessions and messages of
//! `fixtures/captures/`, written by `write_store_seeds` below), then a few
//! thousand deterministic mutations of them, through
//! `session_store::fuzzing::check_store_request`, the function the
//! libFuzzer target `store_request` runs (`fuzz/fuzz_targets/`). It panics
//! when the store panics or answers something ill-formed (see
//! `src/fuzzing.rs`); a failure prints the input, to add to the seeds.
//!
//! Mutations: bytes flipped, inserted, deleted and spliced from other seeds,
//! record kinds changed, records dropped, repeated and concatenated from
//! several seeds. `FUZZ_CORPUS_MUTATIONS` and `FUZZ_CORPUS_SEED` override
//! the count and the seed.

use clawgate_proto::session_store::v1 as pb;
use std::path::{Path, PathBuf};

use clawgate_system_tests::fuzz_seeds::{XorShiftStar as Rng, env_or, seeds, seeds_dir};
use serde_json::Value;
use session_store::fuzzing::{REQUESTS, check_store_request, push_request};

const SEED: u64 = 0x5707_0014_c0de_2026;
const TARGET: &str = "store_request";

/// The records of an input: `(kind, bytes)` (as `fuzzing` reads them).
fn records(mut data: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    while let Some((&kind, rest)) = data.split_first() {
        let (len, rest) = match rest {
            [a, b, rest @ ..] => (usize::from(u16::from_le_bytes([*a, *b])), rest),
            _ => (rest.len(), &[][..]),
        };
        let len = len.min(rest.len());
        out.push((kind, rest[..len].to_vec()));
        data = &rest[len..];
    }
    out
}

fn join(records: &[(u8, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (kind, bytes) in records {
        out.push(*kind);
        out.extend_from_slice(&(bytes.len().min(u16::MAX as usize) as u16).to_le_bytes());
        out.extend_from_slice(&bytes[..bytes.len().min(u16::MAX as usize)]);
    }
    out
}

fn mutate(seed: &[u8], seeds: &[(String, Vec<u8>)], rng: &mut Rng) -> Vec<u8> {
    let mut records = records(seed);
    for _ in 0..1 + rng.below(3) {
        if records.is_empty() {
            records.push((rng.next_u64() as u8, Vec::new()));
        }
        let at = rng.below(records.len());
        match rng.below(8) {
            0 => records[at].0 = rng.below(REQUESTS.len()) as u8,
            1 => {
                records.remove(at);
            }
            2 => {
                let copy = records[at].clone();
                records.insert(at, copy);
            }
            3 => {
                let other = records_of(rng.pick(seeds).1.as_slice());
                records.extend(other);
            }
            _ => {
                let bytes = &mut records[at].1;
                let i = rng.below(bytes.len() + 1);
                match rng.below(5) {
                    0 if !bytes.is_empty() => {
                        let i = i.min(bytes.len() - 1);
                        bytes[i] ^= 1 << rng.below(8);
                    }
                    1 if !bytes.is_empty() => {
                        let i = i.min(bytes.len() - 1);
                        bytes[i] = *rng.pick(&[0, 1, 0x7f, 0x80, 0xff, 0x0a, 0x12, 0x22]);
                    }
                    2 => bytes.insert(i, rng.next_u64() as u8),
                    3 if !bytes.is_empty() => {
                        let end = (i + 1 + rng.below(8)).min(bytes.len());
                        bytes.drain(i.min(end)..end);
                    }
                    _ => {
                        let (_, other) = rng.pick(seeds);
                        let from = rng.below(other.len());
                        let len = rng.below(other.len() - from + 1).min(32);
                        bytes.splice(i..i, other[from..from + len].iter().copied());
                    }
                }
            }
        }
    }
    let mut out = join(&records);
    if rng.below(10) == 0 {
        // A last record that stops short.
        out.truncate(rng.below(out.len() + 1));
    }
    out
}

fn records_of(data: &[u8]) -> Vec<(u8, Vec<u8>)> {
    records(data)
}

fn checked(data: &[u8], what: &str) {
    if let Err(panic) = std::panic::catch_unwind(|| check_store_request(data)) {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        panic!("{what} failed: {message}\ninput: {data:?}");
    }
}

#[test]
fn store_request_seeds_and_mutations() {
    let seeds = seeds(TARGET);
    for (name, data) in &seeds {
        checked(data, &format!("seed store_request/{name}"));
    }
    let count = env_or("FUZZ_CORPUS_MUTATIONS", 3000);
    let mut rng = Rng(env_or("FUZZ_CORPUS_SEED", SEED) | 1);
    for case in 0..count {
        let (name, seed) = rng.pick(&seeds);
        let data = mutate(seed, &seeds, &mut rng);
        checked(&data, &format!("mutation {case} of store_request/{name}"));
    }
}

/// Arbitrary bytes, every kind: nothing panics on what prost refuses.
#[test]
fn store_request_random_bytes() {
    let mut rng = Rng(SEED ^ 0xb17e5 | 1);
    for case in 0..env_or("FUZZ_CORPUS_MUTATIONS", 3000) {
        let len = rng.below(96);
        let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        checked(&data, &format!("random input {case}"));
    }
}

// ---------------------------------------------------------------------------
// The seeds, from the captures
// ---------------------------------------------------------------------------

/// A turn seen in the captures: its session, its text, its run id.
struct Turn {
    key: String,
    message: String,
    run_id: String,
}

fn captures() -> (Vec<Turn>, Vec<(String, String)>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/captures");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    paths.sort();
    let (mut turns, mut entries) = (Vec::new(), Vec::new());
    for path in paths {
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            let record: Value = serde_json::from_str(line).unwrap();
            let frame = &record["json"];
            if record["dir"] == "c2s" && frame["type"] == "req" {
                let params = &frame["params"];
                if let (Some(message), Some(run_id)) = (
                    params["message"].as_str(),
                    params["idempotencyKey"].as_str(),
                ) {
                    let key = params["sessionKey"].as_str().unwrap_or("main").to_owned();
                    turns.push(Turn {
                        key,
                        message: message.to_owned(),
                        run_id: run_id.to_owned(),
                    });
                }
            }
            // Transcript messages of chat.history answers.
            if record["dir"] == "s2c" && frame["type"] == "res" {
                for message in frame["payload"]["messages"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    if let Some(role) = message["role"].as_str() {
                        entries.push((role.to_owned(), message["content"].to_string()));
                    }
                }
            }
        }
    }
    (turns, entries)
}

fn entry(role: &str, content_json: String) -> pb::NewEntry {
    pb::NewEntry {
        role: role.into(),
        content_json,
        timestamp_ms: 1_795_973_904_915,
        metadata: Some(pb::EntryMetadata {
            stop_reason: (role == "assistant").then(|| "stop".into()),
            usage_json: (role == "assistant").then(|| r#"{"input":3,"output":5}"#.into()),
            aborted: false,
        }),
    }
}

/// Writes `fuzz/seeds/store_request/`: for a dozen turns of the captures,
/// the turn's life in the store (patch, create, start with the user entry,
/// finish with a recorded assistant message, history, reads, reset,
/// delete), and each request kind alone with the captures' values.
#[test]
#[ignore = "writes fuzz/seeds/store_request/; run by fuzz/seeds.py"]
fn write_store_seeds() {
    let (turns, entries) = captures();
    assert!(!turns.is_empty() && !entries.is_empty());
    let dir = seeds_dir(TARGET);
    // Regression inputs (`regress-*`, added by hand for a fixed crash) stay.
    std::fs::create_dir_all(&dir).unwrap();
    for old in std::fs::read_dir(&dir).unwrap() {
        let path = old.unwrap().path();
        if !path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("regress-")
        {
            std::fs::remove_file(path).unwrap();
        }
    }
    let write = |name: &str, data: Vec<u8>| std::fs::write(dir.join(name), data).unwrap();
    let assistant: Vec<&(String, String)> =
        entries.iter().filter(|(r, _)| r == "assistant").collect();
    for (n, turn) in turns
        .iter()
        .step_by((turns.len() / 12).max(1))
        .take(12)
        .enumerate()
    {
        let user = entry("user", serde_json::to_string(&turn.message).unwrap());
        let reply = assistant[n % assistant.len()];
        let mut input = Vec::new();
        push_request(
            &mut input,
            "PatchSession",
            &pb::PatchSessionRequest {
                session_key: turn.key.clone(),
                patch_json: format!(r#"{{"label":"capture {n}","queueMode":"steer"}}"#),
                create: true,
            },
        );
        push_request(
            &mut input,
            "CreateRun",
            &pb::CreateRunRequest {
                run_id: turn.run_id.clone(),
                session_key: turn.key.clone(),
                kind: "chat".into(),
                fingerprint: format!("fp-{n}"),
                status: pb::RunStatus::Accepted as i32,
                owner: "coordinator-1".into(),
                request_json: serde_json::json!({ "message": turn.message }).to_string(),
                owner_token: None,
                expected_settings_digest: None,
                create_session: false,
            },
        );
        push_request(
            &mut input,
            "StartRun",
            &pb::StartRunRequest {
                run_id: turn.run_id.clone(),
                session_key: turn.key.clone(),
                expected_version: 1,
                owner: "coordinator-1".into(),
                mode: pb::AcquireMode::Cas as i32,
                expected_writer_run_id: None,
                label: None,
                entries: vec![user],
                history_limit: 20,
                owner_token: None,
            },
        );
        push_request(
            &mut input,
            "FinishRun",
            &pb::FinishRunRequest {
                run_id: turn.run_id.clone(),
                session_key: turn.key.clone(),
                expected_version: 2,
                status: pb::RunStatus::Ok as i32,
                outcome_json: Some(r#"{"text":"done"}"#.into()),
                session_id: None,
                fence_token: None,
                // Entries need the writer's fence (the session id is the
                // store's random one): odd turns show the refusal.
                entries: match n % 2 {
                    1 => vec![entry(&reply.0, reply.1.clone())],
                    _ => Vec::new(),
                },
                owner_token: None,
            },
        );
        push_request(
            &mut input,
            "History",
            &pb::HistoryRequest {
                session_key: turn.key.clone(),
                limit: 50,
                before_seq: None,
                after_seq: Some(0),
                max_chars: Some(4000),
                session_id: None,
            },
        );
        push_request(
            &mut input,
            "GetRun",
            &pb::GetRunRequest {
                run_id: turn.run_id.clone(),
            },
        );
        push_request(
            &mut input,
            "ListSessions",
            &pb::ListSessionsRequest {
                limit: 10,
                active_minutes: Some(60),
                search: Some("capture".into()),
                updated_since_ms: None,
            },
        );
        if n % 3 == 0 {
            push_request(
                &mut input,
                "ResetSession",
                &pb::ResetSessionRequest {
                    session_key: turn.key.clone(),
                },
            );
        }
        if n % 4 == 1 {
            push_request(
                &mut input,
                "DeleteSession",
                &pb::DeleteSessionRequest {
                    session_key: turn.key.clone(),
                    delete_transcript: true,
                },
            );
        }
        write(&format!("turn-{n:02}"), input);
    }
    let turn = &turns[0];
    let token = pb::OwnerToken {
        partition: 3,
        member: "coordinator-1".into(),
        epoch: 1,
    };
    let mut singles: Vec<Vec<u8>> = Vec::new();
    let mut one = |method: &str, message: &dyn Fn(&mut Vec<u8>, &str)| {
        let mut input = Vec::new();
        message(&mut input, method);
        singles.push(input);
    };
    one("AcquireWriter", &|i, m| {
        push_request(
            i,
            m,
            &pb::AcquireWriterRequest {
                session_key: turn.key.clone(),
                expected_session_id: "current".into(),
                expected_writer_run_id: None,
                run_id: turn.run_id.clone(),
                mode: pb::AcquireMode::Takeover as i32,
                label: Some("capture".into()),
                owner_token: None,
            },
        )
    });
    one("ReleaseWriter", &|i, m| {
        push_request(
            i,
            m,
            &pb::ReleaseWriterRequest {
                session_key: turn.key.clone(),
                run_id: turn.run_id.clone(),
                fence_token: 1,
                owner_token: None,
            },
        )
    });
    one("Append", &|i, m| {
        push_request(
            i,
            m,
            &pb::AppendRequest {
                session_key: turn.key.clone(),
                session_id: "6f1c2d9e-5b4a-4c3d-9e8f-7a6b5c4d3e2f".into(),
                run_id: turn.run_id.clone(),
                fence_token: 1,
                entries: entries
                    .iter()
                    .take(4)
                    .map(|(r, c)| entry(r, c.clone()))
                    .collect(),
                owner_token: Some(token.clone()),
            },
        )
    });
    one("GetSession", &|i, m| {
        push_request(
            i,
            m,
            &pb::GetSessionRequest {
                session_key: "main".into(),
            },
        )
    });
    one("UpdateRun", &|i, m| {
        push_request(
            i,
            m,
            &pb::UpdateRunRequest {
                run_id: turn.run_id.clone(),
                expected_version: 1,
                status: pb::RunStatus::Running as i32,
                owner: Some("coordinator-2".into()),
                outcome_json: None,
                session_id: Some("6f1c2d9e-5b4a-4c3d-9e8f-7a6b5c4d3e2f".into()),
                fence_token: Some(2),
                owner_token: None,
            },
        )
    });
    one("ListActiveRuns", &|i, m| {
        push_request(
            i,
            m,
            &pb::ListActiveRunsRequest {
                owner: Some("coordinator-1".into()),
            },
        )
    });
    one("PurgeExpiredRuns", &|i, m| {
        push_request(
            i,
            m,
            &pb::PurgeExpiredRunsRequest {
                ended_before_ms: 1_795_973_904_915,
            },
        )
    });
    one("AcquireLeases", &|i, m| {
        push_request(
            i,
            m,
            &pb::AcquireLeasesRequest {
                member: "coordinator-1".into(),
                address: "http://127.0.0.1:50062".into(),
                partitions: vec![0, 3, 255],
                ttl_ms: 10_000,
                steal: false,
            },
        );
        push_request(
            i,
            "RenewLeases",
            &pb::RenewLeasesRequest {
                member: "coordinator-1".into(),
                tokens: vec![token.clone()],
                ttl_ms: 10_000,
            },
        );
        push_request(i, "ListLeases", &pb::ListLeasesRequest {});
        push_request(
            i,
            "ReleaseLeases",
            &pb::ReleaseLeasesRequest {
                tokens: vec![token.clone()],
            },
        );
        push_request(
            i,
            "WatchLeases",
            &pb::WatchLeasesRequest { interval_ms: 250 },
        );
    });
    one("HeartbeatMember", &|i, m| {
        push_request(
            i,
            m,
            &pb::HeartbeatMemberRequest {
                member: "coordinator-1".into(),
                address: "http://127.0.0.1:50062".into(),
                ttl_ms: 10_000,
            },
        );
        push_request(
            i,
            m,
            &pb::HeartbeatMemberRequest {
                member: "coordinator-2".into(),
                address: "http://127.0.0.1:50063".into(),
                ttl_ms: 1,
            },
        );
        push_request(i, "ListMembers", &pb::ListMembersRequest {});
        push_request(
            i,
            "LeaveMember",
            &pb::LeaveMemberRequest {
                member: "coordinator-1".into(),
            },
        );
    });
    for (n, input) in singles.into_iter().enumerate() {
        write(&format!("single-{n:02}"), input);
    }
}
