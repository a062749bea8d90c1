//! `CoordinatorError` → `tonic::Status`, in one place. The machine-readable
//! `CoordinatorErrorDetail` travels inside the standard details trailer.

use clawgate_proto::run_coordinator::v1 as pb;
use clawgate_proto::status_detail::MAX_DETAIL_BYTES;
use tonic::{Code, Status};

use super::convert::snapshot_to_pb;
use crate::error::CoordinatorError;

pub const DETAIL_TYPE_URL: &str =
    "type.googleapis.com/clawgate.run_coordinator.v1.CoordinatorErrorDetail";

pub fn to_status(err: CoordinatorError) -> Status {
    let (code, detail_code) = match &err {
        CoordinatorError::InvalidArgument(_) => {
            (Code::InvalidArgument, pb::ErrorCode::InvalidArgument)
        }
        CoordinatorError::KeyReused { .. } => (Code::AlreadyExists, pb::ErrorCode::KeyReused),
        CoordinatorError::SessionBusy { .. } => {
            (Code::FailedPrecondition, pb::ErrorCode::SessionBusy)
        }
        CoordinatorError::Draining => (Code::Unavailable, pb::ErrorCode::Draining),
        CoordinatorError::NotOwner { .. } => (Code::Unavailable, pb::ErrorCode::NotOwner),
        // Nothing was admitted: re-read the session, submit again.
        CoordinatorError::SettingsChanged(_) => (Code::Aborted, pb::ErrorCode::SettingsChanged),
        CoordinatorError::StoreUnavailable(_) => {
            (Code::Unavailable, pb::ErrorCode::StoreUnavailable)
        }
        CoordinatorError::Internal(_) => (Code::Internal, pb::ErrorCode::Internal),
    };
    let message = err.to_string();
    let leader_address = match &err {
        CoordinatorError::NotOwner { leader, .. } => leader.clone(),
        _ => None,
    };
    let run = match err {
        CoordinatorError::KeyReused { existing } => Some(snapshot_to_pb(*existing)),
        CoordinatorError::SessionBusy { blocking } => Some(snapshot_to_pb(*blocking)),
        _ => None,
    };
    let mut detail = pb::CoordinatorErrorDetail {
        code: detail_code as i32,
        run,
        trimmed: false,
        leader_address,
    };
    trim(&mut detail);
    clawgate_proto::status_detail::with_detail(code, message, DETAIL_TYPE_URL, &detail)
}

/// Keeps the encoded detail within `MAX_DETAIL_BYTES` (it travels in the
/// trailers, see `clawgate_proto::status_detail`): past it the snapshot
/// keeps only the fields that identify the run and its state. The text (as
/// long as the runtime's answer), the error, the stop reason, the usage and
/// the requester go; what stays is bounded by the limits on run ids (256
/// characters), session keys (523) and kinds (64 bytes).
fn trim(detail: &mut pb::CoordinatorErrorDetail) {
    use prost::Message;
    if detail.encoded_len() <= MAX_DETAIL_BYTES {
        return;
    }
    if let Some(run) = &mut detail.run {
        detail.trimmed = true;
        run.text.clear();
        run.error = None;
        run.stop_reason = None;
        run.usage_json = None;
        run.requester.clear();
    }
}

/// The detail a coordinator error carries, for clients.
pub fn detail_of(status: &Status) -> Option<pb::CoordinatorErrorDetail> {
    clawgate_proto::status_detail::detail_of(status, DETAIL_TYPE_URL)
}
