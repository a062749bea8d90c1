//! Who may call which RPC of the coordinator, by caller kind: the one table
//! the server's auth layer reads (docs/security.md prints it).
//!
//! The edge makes every call a client's protocol needs. An internal caller
//! submits, reads, waits for, cancels and follows runs, and is checked
//! against its session prefix when it has one (`scope.rs`); it may not list
//! every session's active runs. A coordinator calls no coordinator.

use clawgate_telemetry::service_auth::access::Methods;
use clawgate_telemetry::{AccessTable, CallerKind};

/// A run's life: admitted, read, waited for, cancelled, followed.
const RUNS: Methods = &["Submit", "Get", "Wait", "Cancel", "Subscribe"];
/// Every session's active runs, the runtime's models, and the lanes.
const OVERVIEW: Methods = &["ListActive", "DescribeRuntime", "DescribeLanes"];

pub static COORDINATOR_ACCESS: AccessTable = AccessTable {
    service: "clawgate.run_coordinator.v1.RunCoordinator",
    grants: &[
        (CallerKind::Edge, &[RUNS, OVERVIEW]),
        (CallerKind::Internal, &[RUNS]),
    ],
};

#[cfg(test)]
mod tests {
    use super::*;
    use clawgate_telemetry::service_auth::access::rpcs_declared;

    const PROTO: &str =
        include_str!("../../../proto/clawgate/run_coordinator/v1/run_coordinator.proto");

    #[test]
    fn the_table_names_real_rpcs_and_the_edge_has_them_all() {
        let mut rpcs = rpcs_declared(PROTO);
        assert_eq!(COORDINATOR_ACCESS.check_against(&rpcs), Ok(()));
        let mut granted = COORDINATOR_ACCESS.methods_of(CallerKind::Edge);
        granted.sort_unstable();
        rpcs.sort_unstable();
        assert_eq!(granted, rpcs);
        assert!(
            COORDINATOR_ACCESS
                .methods_of(CallerKind::Coordinator)
                .is_empty()
        );
        let list = "/clawgate.run_coordinator.v1.RunCoordinator/ListActive";
        assert!(!COORDINATOR_ACCESS.allows(CallerKind::Internal, list));
    }
}
