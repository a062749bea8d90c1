//! `CoordinatorError` → `tonic::Status`, in one place. The machine-readable
//! `CoordinatorErrorDetail` travels inside the standard details trailer.

use clawgate_proto::run_coordinator::v1 as pb;
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
        CoordinatorError::StoreUnavailable(_) => {
            (Code::Unavailable, pb::ErrorCode::StoreUnavailable)
        }
        CoordinatorError::Internal(_) => (Code::Internal, pb::ErrorCode::Internal),
    };
    let message = err.to_string();
    let run = match err {
        CoordinatorError::KeyReused { existing } => Some(snapshot_to_pb(*existing)),
        CoordinatorError::SessionBusy { blocking } => Some(snapshot_to_pb(*blocking)),
        _ => None,
    };
    let detail = pb::CoordinatorErrorDetail {
        code: detail_code as i32,
        run,
    };
    clawgate_proto::status_detail::with_detail(code, message, DETAIL_TYPE_URL, &detail)
}

/// The detail a coordinator error carries, for clients.
pub fn detail_of(status: &Status) -> Option<pb::CoordinatorErrorDetail> {
    clawgate_proto::status_detail::detail_of(status, DETAIL_TYPE_URL)
}
