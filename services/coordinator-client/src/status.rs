//! What a coordinator's error says: its machine-readable detail, the owner
//! it names, and whether another coordinator may answer instead.

use clawgate_proto::run_coordinator::v1 as pb;
use tonic::{Code, Status};

const DETAIL_TYPE_URL: &str =
    "type.googleapis.com/clawgate.run_coordinator.v1.CoordinatorErrorDetail";

/// The machine-readable detail of a coordinator's error, if it has one.
pub fn error_detail(status: &Status) -> Option<pb::CoordinatorErrorDetail> {
    clawgate_proto::status_detail::detail_of(status, DETAIL_TYPE_URL)
}

/// The owner's address a coordinator's error names, if any.
pub fn leader_hint(status: &Status) -> Option<String> {
    error_detail(status)
        .and_then(|d| d.leader_address)
        .filter(|a| !a.is_empty())
}

/// Whether the coordinator refused a Submit because the session's settings
/// are not those it was made from (nothing was admitted).
pub fn settings_changed(status: &Status) -> bool {
    error_detail(status).is_some_and(|d| d.code == pb::ErrorCode::SettingsChanged as i32)
}

/// Whether another coordinator may answer where this one did not
/// (UNAVAILABLE, which NOT_OWNER is).
pub fn should_fail_over(status: &Status) -> bool {
    status.code() == Code::Unavailable
}
