//! The body of the store's fuzz target (`fuzz/`, `cargo fuzz`), shared
//! with the stable smoke test (`tests/fuzz_corpus.rs`) so both run the same
//! code. Not an API.
//!
//! An input is a sequence of requests, each `[kind][length: u16 LE][bytes]`
//! (the last one may stop short: its bytes are the rest). `kind` (modulo
//! the number of request messages) picks the message of the gRPC service
//! that the bytes are decoded as, with prost; each decoded request is then
//!
//! 1. converted into the model types by the adapter's conversions
//!    (`grpc::convert`) and checked by the input limits (`limits::Limits`),
//!    where the request has such a conversion, and
//! 2. served by the real gRPC adapter (`grpc::service`) over the in-memory
//!    backend behind the limits, as the server stacks them; the requests of
//!    one input go to one fresh store, so that a sequence can build state
//!    (a session, its writer, entries, runs, leases, registry members).
//!
//! Oracle: nothing panics; prost re-encodes what it decoded to the same
//! message; a conversion refuses with `InvalidArgument` only, and what it
//! accepts converts back to a request that converts to the same value (the
//! conversion is a projection, its keys canonical); the adapter refuses a
//! request the conversion refused with `InvalidArgument`, and otherwise
//! answers with a message that round-trips or a clean refusal (never
//! `INTERNAL`, `UNKNOWN` or `UNAVAILABLE` from the memory backend).

use std::sync::Arc;

use clawgate_proto::session_store::v1 as pb;
use clawgate_proto::session_store::v1::session_store_server::SessionStore as GrpcSessionStore;
use prost::Message;
use tonic::{Code, Request, Status};

use crate::backend::memory::MemoryStore;
use crate::error::StoreError;
use crate::grpc::convert::*;
use crate::grpc::service::SessionStoreService;
use crate::key::{MAX_SESSION_KEY_CHARS, SessionKey};
use crate::limits::{Checked, Limits};
use crate::rules::ownership;
use crate::store::SessionStore;

/// The request messages, in the order `kind` picks them.
pub const REQUESTS: &[&str] = &[
    "AcquireWriter",
    "ReleaseWriter",
    "Append",
    "History",
    "GetSession",
    "ListSessions",
    "ResetSession",
    "DeleteSession",
    "PatchSession",
    "CreateRun",
    "UpdateRun",
    "StartRun",
    "FinishRun",
    "GetRun",
    "ListActiveRuns",
    "PurgeExpiredRuns",
    "AcquireLeases",
    "RenewLeases",
    "ReleaseLeases",
    "ListLeases",
    "WatchLeases",
    "HeartbeatMember",
    "LeaveMember",
    "ListMembers",
];

/// Appends one request record (`kind` is the index of `method` in
/// [`REQUESTS`]) to an input.
pub fn push_request(input: &mut Vec<u8>, method: &str, message: &impl Message) {
    let kind = REQUESTS
        .iter()
        .position(|m| *m == method)
        .unwrap_or_else(|| panic!("no request {method}"));
    let bytes = message.encode_to_vec();
    let len = u16::try_from(bytes.len()).expect("a seed request under 64 KiB");
    input.push(kind as u8);
    input.extend_from_slice(&len.to_le_bytes());
    input.extend_from_slice(&bytes);
}

/// The requests of an input: `(index in REQUESTS, bytes)`.
fn records(mut data: &[u8]) -> Vec<(usize, &[u8])> {
    let mut out = Vec::new();
    while let Some((&kind, rest)) = data.split_first() {
        let (len, rest) = match rest {
            [a, b, rest @ ..] => (usize::from(u16::from_le_bytes([*a, *b])), rest),
            _ => (rest.len(), &[][..]),
        };
        let len = len.min(rest.len());
        out.push((usize::from(kind) % REQUESTS.len(), &rest[..len]));
        data = &rest[len..];
    }
    out
}

/// Most requests one input serves (the rest are ignored).
const MAX_REQUESTS: usize = 64;

/// One input (see the module doc).
pub fn check_store_request(data: &[u8]) {
    RUNTIME.with(|runtime| {
        runtime.block_on(async {
            let store: Arc<dyn SessionStore> =
                Arc::new(Checked::new(MemoryStore::new(), Limits::default()));
            let service = SessionStoreService::new(store);
            for (kind, bytes) in records(data).into_iter().take(MAX_REQUESTS) {
                check_one(&service, kind, bytes).await;
            }
        })
    });
}

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
}

/// Decodes `bytes` as `T`; `None` when prost refuses them. What prost
/// decoded encodes to bytes that decode to the same message.
fn decode<T: Message + Default + PartialEq>(bytes: &[u8]) -> Option<T> {
    let message = T::decode(bytes).ok()?;
    let again =
        T::decode(message.encode_to_vec().as_slice()).expect("prost re-decodes its encoding");
    assert!(again == message, "prost round trip changed the message");
    Some(message)
}

/// A conversion's refusal is the caller's fault.
fn refused(err: &StoreError) {
    assert!(
        matches!(err, StoreError::InvalidArgument(m) if !m.is_empty()),
        "a conversion refused with {err:?}"
    );
}

/// A canonical key parses to itself (unless the canonical form outgrew the
/// input limit: `agent:main:` before a 512-character key).
fn canonical(key: &SessionKey) {
    if key.as_str().chars().count() <= MAX_SESSION_KEY_CHARS {
        let again = SessionKey::parse(key.as_str()).expect("a canonical key parses");
        assert_eq!(&again, key, "key not canonical");
    }
}

/// `from(to(from(request)))` equals `from(request)`: the model value is a
/// fixpoint of the round trip. Compared by `Debug`, which every model type
/// has. `Err`: the conversion refused the request (and why).
fn round_trip<P: Clone, M: std::fmt::Debug + Clone>(
    request: P,
    from: impl Fn(P) -> Result<M, StoreError>,
    to: impl Fn(M) -> P,
) -> Result<M, StoreError> {
    let model = from(request).inspect_err(refused)?;
    let again = from(to(model.clone())).expect("a converted request converts again");
    assert_eq!(
        format!("{again:?}"),
        format!("{model:?}"),
        "the conversion round trip changed it"
    );
    Ok(model)
}

/// Checks the status of a call the pure conversion refused (`converted` is
/// an `Err`) or accepted, and the response of a successful one.
fn check_answer<T: Message + Default + PartialEq>(
    method: &str,
    converted: Result<(), ()>,
    answer: Result<tonic::Response<T>, Status>,
) {
    if trace() {
        let outcome = answer
            .as_ref()
            .map(|_| ())
            .map_err(|s| (s.code(), s.message().to_owned()));
        eprintln!("{method}: {outcome:?}");
    }
    match answer {
        Ok(response) => {
            assert!(
                converted.is_ok(),
                "{method}: served a request its conversion refused"
            );
            let response = response.into_inner();
            let again = T::decode(response.encode_to_vec().as_slice()).expect("a response decodes");
            assert!(
                again == response,
                "{method}: the response does not round-trip"
            );
        }
        Err(status) => {
            assert!(
                !status.message().is_empty(),
                "{method}: a refusal without a message"
            );
            if converted.is_err() {
                assert_eq!(status.code(), Code::InvalidArgument, "{method}: {status:?}");
            }
            assert!(
                matches!(
                    status.code(),
                    Code::InvalidArgument
                        | Code::FailedPrecondition
                        | Code::Aborted
                        | Code::NotFound
                ),
                "{method}: {status:?}"
            );
        }
    }
}

/// `FUZZING_TRACE=1` prints each request's outcome (to see what a seed
/// reaches).
fn trace() -> bool {
    static TRACE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("FUZZING_TRACE").is_some_and(|v| v == "1"))
}

/// The key of a request, as the adapter parses it.
fn key_of(raw: &str) -> Result<(), ()> {
    match SessionKey::parse(raw) {
        Ok(key) => {
            canonical(&key);
            Ok(())
        }
        Err(err) => {
            refused(&err.into());
            Err(())
        }
    }
}

async fn check_one(service: &SessionStoreService, kind: usize, bytes: &[u8]) {
    let limits = Limits::default();
    let method = REQUESTS[kind];
    macro_rules! serve {
        ($ty:ty, $call:ident, |$req:ident| $convert:expr) => {{
            let Some($req) = decode::<$ty>(bytes) else {
                return;
            };
            let converted: Result<(), ()> = $convert;
            check_answer(method, converted, service.$call(Request::new($req)).await);
        }};
    }
    match method {
        "AcquireWriter" => serve!(pb::AcquireWriterRequest, acquire_writer, |req| {
            round_trip(req.clone(), acquire_from_pb, acquire_to_pb)
                .map(|m| canonical(&m.key))
                .map_err(drop)
        }),
        "ReleaseWriter" => serve!(pb::ReleaseWriterRequest, release_writer, |req| key_of(
            &req.session_key
        )),
        "Append" => serve!(pb::AppendRequest, append, |req| {
            let entries: Vec<_> = req.entries.iter().cloned().map(new_entry_from_pb).collect();
            for (entry, sent) in entries.iter().zip(&req.entries) {
                let again = new_entry_from_pb(new_entry_to_pb(entry.clone()));
                assert_eq!(format!("{again:?}"), format!("{entry:?}"));
                assert_eq!(entry.timestamp_ms.is_none(), sent.timestamp_ms == 0);
            }
            if let Err(err) = limits.check_entries(&entries) {
                refused(&err);
            }
            key_of(&req.session_key).and_then(|()| {
                crate::model::parse_session_id(&req.session_id)
                    .map(drop)
                    .map_err(|e| refused(&e.into()))
            })
        }),
        "History" => serve!(pb::HistoryRequest, history, |req| {
            round_trip(req.clone(), history_from_pb, history_to_pb)
                .map(|query| {
                    canonical(&query.key);
                    match limits.history_query(query.clone()) {
                        Ok(checked) => {
                            assert!((1..=limits.max_history_limit).contains(&checked.limit));
                            let chars = checked.max_chars.expect("a budget is always set");
                            assert!((1..=limits.max_history_chars).contains(&chars));
                        }
                        Err(err) => refused(&err),
                    }
                })
                .map_err(drop)
        }),
        "GetSession" => serve!(pb::GetSessionRequest, get_session, |req| key_of(
            &req.session_key
        )),
        "ListSessions" => serve!(pb::ListSessionsRequest, list_sessions, |req| {
            let query = crate::model::ListQuery {
                limit: req.limit,
                updated_since_ms: req.updated_since_ms,
                search: req.search.clone().filter(|s| !s.is_empty()),
            };
            match limits.list_query(query) {
                Ok(checked) => assert!((1..=limits.max_list_limit).contains(&checked.limit)),
                Err(err) => refused(&err),
            }
            if req.active_minutes == Some(0) {
                Err(())
            } else {
                Ok(())
            }
        }),
        "ResetSession" => serve!(pb::ResetSessionRequest, reset_session, |req| key_of(
            &req.session_key
        )),
        "DeleteSession" => serve!(pb::DeleteSessionRequest, delete_session, |req| key_of(
            &req.session_key
        )),
        "PatchSession" => serve!(pb::PatchSessionRequest, patch_session, |req| {
            round_trip(req.clone(), patch_from_pb, patch_to_pb)
                .map(|patch| {
                    canonical(&patch.key);
                    if let Err(err) = limits.check_patch(&patch) {
                        refused(&err);
                    }
                })
                .map_err(drop)
        }),
        "CreateRun" => serve!(pb::CreateRunRequest, create_run, |req| {
            round_trip(req.clone(), new_run_from_pb, new_run_to_pb)
                .map(|run| canonical(&run.session_key))
                .map_err(drop)
        }),
        "UpdateRun" => serve!(pb::UpdateRunRequest, update_run, |req| {
            round_trip(req.clone(), run_update_from_pb, run_update_to_pb)
                .map(drop)
                .map_err(drop)
        }),
        "StartRun" => serve!(pb::StartRunRequest, start_run, |req| {
            round_trip(req.clone(), start_run_from_pb, start_run_to_pb)
                .map(|start| canonical(&start.key))
                .map_err(drop)
        }),
        "FinishRun" => serve!(pb::FinishRunRequest, finish_run, |req| {
            round_trip(req.clone(), finish_run_from_pb, finish_run_to_pb)
                .map(|finish| canonical(&finish.key))
                .map_err(drop)
        }),
        "GetRun" => serve!(pb::GetRunRequest, get_run, |_req| Ok(())),
        "ListActiveRuns" => serve!(pb::ListActiveRunsRequest, list_active_runs, |_req| Ok(())),
        "PurgeExpiredRuns" => serve!(pb::PurgeExpiredRunsRequest, purge_expired_runs, |_req| Ok(
            ()
        )),
        "AcquireLeases" => serve!(pb::AcquireLeasesRequest, acquire_leases, |_req| Ok(())),
        "RenewLeases" => serve!(pb::RenewLeasesRequest, renew_leases, |req| {
            for token in &req.tokens {
                let model = owner_token_from_pb(token.clone());
                assert!(owner_token_to_pb(model) == *token);
            }
            Ok(())
        }),
        "ReleaseLeases" => serve!(pb::ReleaseLeasesRequest, release_leases, |_req| Ok(())),
        "ListLeases" => serve!(pb::ListLeasesRequest, list_leases, |_req| Ok(())),
        "WatchLeases" => {
            let Some(req) = decode::<pb::WatchLeasesRequest>(bytes) else {
                return;
            };
            // The stream's first item is the table; the stream ends when dropped.
            let answer = service.watch_leases(Request::new(req)).await;
            let mut stream = answer
                .expect("the memory store lists its leases")
                .into_inner();
            let first = tokio_stream::StreamExt::next(&mut stream).await;
            let table = first.expect("a first item").expect("the lease table");
            assert!(table.leases.len() as u32 == table.partition_count);
        }
        // The store checks a heartbeat's shape before anything else: a
        // request the rule refuses must be refused INVALID_ARGUMENT.
        "HeartbeatMember" => serve!(pb::HeartbeatMemberRequest, heartbeat_member, |req| {
            let beat = round_trip(req.clone(), |r| Ok(heartbeat_from_pb(r)), heartbeat_to_pb)
                .expect("the conversion takes any heartbeat");
            ownership::check_heartbeat(&beat).map_err(|e| refused(&e))
        }),
        "LeaveMember" => serve!(pb::LeaveMemberRequest, leave_member, |req| {
            ownership::check_member(&req.member).map_err(|e| refused(&e))
        }),
        "ListMembers" => serve!(pb::ListMembersRequest, list_members, |_req| Ok(())),
        other => unreachable!("no request {other}"),
    }
}
