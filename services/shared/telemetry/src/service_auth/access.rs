//! Which caller kind may call which RPC of a gRPC service: a table, as data,
//! one per service (the store's and the coordinator's live beside their
//! servers), read by [`ServiceAuthLayer`](crate::ServiceAuthLayer) before
//! any handler runs. docs/security.md prints the tables.

use crate::service_auth::CallerKind;

/// Methods of a service that go together (`["ListLeases", "WatchLeases"]`).
pub type Methods = &'static [&'static str];

/// The RPCs of one gRPC service each caller kind may call. A kind the
/// table does not name may call none of them; [`CallerKind::Trusted`] (the
/// shared token of the simple mode) may call every one.
#[derive(Debug, Clone, Copy)]
pub struct AccessTable {
    /// The service's full name (`clawgate.session_store.v1.SessionStore`).
    pub service: &'static str,
    /// Each kind and the groups of methods (`Append`, `AcquireLeases`) it
    /// may call.
    pub grants: &'static [(CallerKind, &'static [Methods])],
}

/// Services every authenticated caller may call, whatever its kind: the
/// reflection services describe the public schema and nothing else.
const OPEN_TO_EVERY_CALLER: &[&str] = &[
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
];

impl AccessTable {
    /// The methods `kind` may call.
    pub fn methods_of(&self, kind: CallerKind) -> Vec<&'static str> {
        let groups = self.grants.iter().filter(|(granted, _)| *granted == kind);
        groups
            .flat_map(|(_, groups)| groups.iter())
            .flat_map(|methods| methods.iter().copied())
            .collect()
    }

    /// Whether `kind` may call the method at `path` (`/package.Service/Method`).
    pub fn allows(&self, kind: CallerKind, path: &str) -> bool {
        let Some((service, method)) = path.trim_start_matches('/').split_once('/') else {
            return false;
        };
        if kind == CallerKind::Trusted || OPEN_TO_EVERY_CALLER.contains(&service) {
            return true;
        }
        service == self.service && self.methods_of(kind).contains(&method)
    }

    /// Checks the table against the service's RPCs as its `.proto` declares
    /// them (for the services' tests): every method it names exists.
    pub fn check_against(&self, rpcs: &[&str]) -> Result<(), String> {
        for (kind, groups) in self.grants {
            let mut methods = groups.iter().flat_map(|methods| methods.iter());
            if let Some(unknown) = methods.find(|m| !rpcs.contains(m)) {
                return Err(format!(
                    "{} grants the {kind} caller {unknown}, which it does not have",
                    self.service
                ));
            }
        }
        Ok(())
    }
}

/// The RPC names a `.proto` file's text declares (`rpc Name(`), for the
/// tables' tests.
pub fn rpcs_declared(proto: &str) -> Vec<&str> {
    proto
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix("rpc "))
        .filter_map(|rest| rest.split('(').next())
        .map(str::trim)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: AccessTable = AccessTable {
        service: "pkg.Store",
        grants: &[
            (CallerKind::Coordinator, &[&["Append"], &["Read"]]),
            (CallerKind::Edge, &[&["Read"]]),
        ],
    };

    #[test]
    fn a_kind_calls_what_its_row_names_and_nothing_else() {
        assert!(TABLE.allows(CallerKind::Coordinator, "/pkg.Store/Append"));
        assert!(TABLE.allows(CallerKind::Edge, "/pkg.Store/Read"));
        assert!(!TABLE.allows(CallerKind::Edge, "/pkg.Store/Append"));
        assert!(!TABLE.allows(CallerKind::Internal, "/pkg.Store/Read"));
        assert!(
            !TABLE.allows(CallerKind::Coordinator, "/pkg.Other/Append"),
            "another service"
        );
        assert!(!TABLE.allows(CallerKind::Coordinator, "Append"));
        assert!(TABLE.allows(CallerKind::Trusted, "/pkg.Store/Anything"));
        assert!(TABLE.allows(
            CallerKind::Internal,
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
        ));
    }

    #[test]
    fn a_table_naming_an_rpc_the_service_lacks_is_refused() {
        let proto =
            "service Store {\n  rpc Append(A) returns (B);\n  rpc Read (C) returns (stream D);\n}";
        assert_eq!(rpcs_declared(proto), ["Append", "Read"]);
        assert_eq!(TABLE.check_against(&rpcs_declared(proto)), Ok(()));
        assert_eq!(
            TABLE.check_against(&["Append"]).unwrap_err(),
            "pkg.Store grants the coordinator caller Read, which it does not have"
        );
    }
}
