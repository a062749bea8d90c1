//! Who may call which RPC of the store, by caller kind: the one table the
//! server's auth layer reads (docs/security.md prints it).
//!
//! Only a coordinator takes leases and writer fences and writes
//! transcripts, run records and membership. The edge reads sessions and
//! their history, changes sessions on its clients' behalf (reset, delete,
//! patch), and reads the lease table and run records to route its calls to
//! the coordinators (run-coordinator-api's router): exactly the calls
//! gateway-edge makes. An internal caller reaches the store only through
//! that router, so it gets the router's reads and nothing else (a caller
//! bound to some sessions reads other sessions' runs as absent: `service.rs`).

use clawgate_telemetry::service_auth::access::Methods;
use clawgate_telemetry::{AccessTable, CallerKind};

/// Sessions and their transcripts, read.
const SESSION_READS: Methods = &["History", "GetSession", "ListSessions"];
/// Sessions changed on a client's behalf.
const SESSION_CHANGES: Methods = &["ResetSession", "DeleteSession", "PatchSession"];
/// What run-coordinator-api's router reads to find a run's owner.
const ROUTING_READS: Methods = &["ListLeases", "WatchLeases", "GetRun"];
/// A run's writer fence and its transcript.
const TRANSCRIPT_WRITES: Methods = &["AcquireWriter", "ReleaseWriter", "Append"];
/// Run records, written and swept.
const RUN_RECORDS: Methods = &[
    "CreateRun",
    "UpdateRun",
    "StartRun",
    "FinishRun",
    "ListActiveRuns",
    "PurgeExpiredRuns",
];
/// Partition leases and the member registry.
const OWNERSHIP: Methods = &[
    "AcquireLeases",
    "RenewLeases",
    "ReleaseLeases",
    "HeartbeatMember",
    "LeaveMember",
    "ListMembers",
];

pub static STORE_ACCESS: AccessTable = AccessTable {
    service: "clawgate.session_store.v1.SessionStore",
    grants: &[
        (
            CallerKind::Coordinator,
            &[
                SESSION_READS,
                SESSION_CHANGES,
                ROUTING_READS,
                TRANSCRIPT_WRITES,
                RUN_RECORDS,
                OWNERSHIP,
            ],
        ),
        (
            CallerKind::Edge,
            &[SESSION_READS, SESSION_CHANGES, ROUTING_READS],
        ),
        (CallerKind::Internal, &[ROUTING_READS]),
    ],
};

#[cfg(test)]
mod tests {
    use super::*;
    use clawgate_telemetry::service_auth::access::rpcs_declared;

    const PROTO: &str =
        include_str!("../../../proto/clawgate/session_store/v1/session_store.proto");

    #[test]
    fn the_table_names_real_rpcs_and_the_coordinator_has_them_all() {
        let mut rpcs = rpcs_declared(PROTO);
        assert_eq!(STORE_ACCESS.check_against(&rpcs), Ok(()));
        let mut granted = STORE_ACCESS.methods_of(CallerKind::Coordinator);
        granted.sort_unstable();
        rpcs.sort_unstable();
        assert_eq!(granted, rpcs);
    }

    #[test]
    fn only_a_coordinator_takes_leases_or_writes_transcripts_and_runs() {
        let writes = [TRANSCRIPT_WRITES, RUN_RECORDS, OWNERSHIP].concat();
        for kind in [CallerKind::Edge, CallerKind::Internal] {
            for method in &writes {
                let path = format!("/clawgate.session_store.v1.SessionStore/{method}");
                assert!(!STORE_ACCESS.allows(kind, &path), "{kind} {method}");
            }
        }
        let history = "/clawgate.session_store.v1.SessionStore/History";
        assert!(STORE_ACCESS.allows(CallerKind::Edge, history));
        assert!(!STORE_ACCESS.allows(CallerKind::Internal, history));
    }
}
