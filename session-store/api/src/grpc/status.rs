//! `StoreError` ↔ `tonic::Status`, in one place.
//!
//! The gRPC code says how a caller should react; the machine-readable
//! `StoreErrorDetail` (code + current values) travels as a google.protobuf.Any
//! inside the standard google.rpc.Status details trailer, so the remote client
//! rebuilds the exact `StoreError`.

use clawgate_proto::session_store::v1 as pb;
use clawgate_proto::status_detail::MAX_DETAIL_BYTES;
use tonic::{Code, Status};

use super::convert::{
    lease_from_pb, lease_to_pb, run_from_pb, run_to_pb, session_from_pb, session_to_pb,
};
use crate::error::StoreError;

const DETAIL_TYPE_URL: &str = "type.googleapis.com/clawgate.session_store.v1.StoreErrorDetail";

fn grpc_code(err: &StoreError) -> Code {
    match err {
        StoreError::InvalidArgument(_) => Code::InvalidArgument,
        // Superseded or stale: retrying the same call cannot succeed.
        StoreError::StaleWriter { .. }
        | StoreError::SessionReplaced { .. }
        | StoreError::StaleOwner { .. }
        | StoreError::RunTerminal { .. } => Code::FailedPrecondition,
        // Lost a compare-and-swap race: re-read and decide again.
        StoreError::WriterConflict { .. }
        | StoreError::RunVersionConflict { .. }
        | StoreError::SettingsChanged(_) => Code::Aborted,
        StoreError::RunNotFound(_) => Code::NotFound,
        StoreError::Unavailable(_) => Code::Unavailable,
        StoreError::Unauthenticated(_) => Code::Unauthenticated,
        StoreError::PermissionDenied(_) => Code::PermissionDenied,
        StoreError::Internal(_) => Code::Internal,
    }
}

fn detail_code(err: &StoreError) -> pb::ErrorCode {
    use pb::ErrorCode as C;
    match err {
        StoreError::InvalidArgument(_) => C::InvalidArgument,
        StoreError::StaleWriter { .. } => C::StaleWriter,
        StoreError::SessionReplaced { .. } => C::SessionReplaced,
        StoreError::WriterConflict { .. } => C::WriterConflict,
        StoreError::StaleOwner { .. } => C::StaleOwner,
        StoreError::SettingsChanged(_) => C::SettingsChanged,
        StoreError::RunNotFound(_) => C::RunNotFound,
        StoreError::RunVersionConflict { .. } => C::RunVersionConflict,
        StoreError::RunTerminal { .. } => C::RunTerminal,
        StoreError::Unavailable(_) => C::Unavailable,
        // Sent without a detail (`to_status`), as the auth layer sends them.
        StoreError::Unauthenticated(_) | StoreError::PermissionDenied(_) => C::Unspecified,
        StoreError::Internal(_) => C::Internal,
    }
}

pub fn to_status(err: StoreError) -> Status {
    let code = grpc_code(&err);
    if let StoreError::Unauthenticated(message) | StoreError::PermissionDenied(message) = &err {
        return Status::new(code, message.clone());
    }
    let message = err.to_string();
    let mut detail = pb::StoreErrorDetail {
        code: detail_code(&err) as i32,
        ..Default::default()
    };
    match err {
        StoreError::StaleWriter { current, .. }
        | StoreError::SessionReplaced { current, .. }
        | StoreError::WriterConflict { current, .. } => {
            detail.current_session = current.map(|s| session_to_pb(*s));
        }
        StoreError::RunVersionConflict { expected, current } => {
            detail.expected_version = Some(expected);
            detail.current_run = Some(run_to_pb(*current));
        }
        StoreError::RunTerminal { current } => detail.current_run = Some(run_to_pb(*current)),
        StoreError::RunNotFound(run_id) => detail.run_id = Some(run_id),
        StoreError::StaleOwner { current, .. } => {
            detail.current_lease = current.map(|l| lease_to_pb(*l));
        }
        _ => {}
    }
    trim(&mut detail);
    clawgate_proto::status_detail::with_detail(code, message, DETAIL_TYPE_URL, &detail)
}

/// Keeps the encoded detail within `MAX_DETAIL_BYTES` (it travels in the
/// trailers, see `clawgate_proto::status_detail`): a run record's payloads
/// (each up to `max_run_payload_bytes`) go first, then the session's
/// settings (up to `max_settings_bytes`), then its label. What is left is
/// bounded by the fixed limits on keys and ids (≈ 4 KiB at most, all
/// characters 4 bytes wide).
fn trim(detail: &mut pb::StoreErrorDetail) {
    use prost::Message;
    let fits = |d: &pb::StoreErrorDetail| d.encoded_len() <= MAX_DETAIL_BYTES;
    if fits(detail) {
        return;
    }
    detail.trimmed = true;
    if let Some(run) = &mut detail.current_run {
        run.request_json.clear();
        run.outcome_json = None;
    }
    if !fits(detail)
        && let Some(session) = &mut detail.current_session
    {
        // Empty reads as "{}" on the client; `trimmed` says it was cut.
        session.settings_json.clear();
    }
    if !fits(detail)
        && let Some(session) = &mut detail.current_session
    {
        session.label = None;
    }
}

/// Whether a status's detail says it left payload fields out (see `trim`).
pub fn is_trimmed(status: &Status) -> bool {
    clawgate_proto::status_detail::detail_of::<pb::StoreErrorDetail>(status, DETAIL_TYPE_URL)
        .is_some_and(|d| d.trimmed)
}

/// Rebuilds the `StoreError` a server sent. A status without our detail (a
/// transport failure, a proxy) maps by its gRPC code.
pub fn from_status(status: Status) -> StoreError {
    let message = status.message().to_owned();
    let detail: Option<pb::StoreErrorDetail> =
        clawgate_proto::status_detail::detail_of(&status, DETAIL_TYPE_URL);
    let Some(detail) = detail else {
        return match status.code() {
            Code::InvalidArgument => StoreError::InvalidArgument(message),
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => {
                StoreError::Unavailable(format!("session store: {message}"))
            }
            Code::Unauthenticated => StoreError::Unauthenticated(message),
            Code::PermissionDenied => StoreError::PermissionDenied(message),
            code => StoreError::Internal(format!("session store: {code:?}: {message}")),
        };
    };
    let session = || {
        detail
            .current_session
            .clone()
            .and_then(|s| session_from_pb(s).ok())
            .map(Box::new)
    };
    let run = || {
        detail
            .current_run
            .clone()
            .and_then(|r| run_from_pb(r).ok())
            .map(Box::new)
    };
    use pb::ErrorCode as C;
    match C::try_from(detail.code).unwrap_or(C::Unspecified) {
        C::InvalidArgument => StoreError::InvalidArgument(message),
        C::StaleWriter => StoreError::StaleWriter {
            message,
            current: session(),
        },
        C::SessionReplaced => StoreError::SessionReplaced {
            message,
            current: session(),
        },
        C::WriterConflict => StoreError::WriterConflict {
            message,
            current: session(),
        },
        C::StaleOwner => StoreError::StaleOwner {
            message,
            current: detail
                .current_lease
                .clone()
                .map(|l| Box::new(lease_from_pb(l))),
        },
        C::SettingsChanged => StoreError::SettingsChanged(message),
        C::RunNotFound => StoreError::RunNotFound(detail.run_id.clone().unwrap_or_default()),
        C::RunVersionConflict => match run() {
            Some(current) => StoreError::RunVersionConflict {
                expected: detail.expected_version.unwrap_or_default(),
                current,
            },
            None => StoreError::Internal(message),
        },
        C::RunTerminal => match run() {
            Some(current) => StoreError::RunTerminal { current },
            None => StoreError::Internal(message),
        },
        C::Unavailable => StoreError::Unavailable(message),
        C::Internal | C::Unspecified => StoreError::Internal(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_auth_layers_refusals_map_to_their_own_errors_and_back() {
        for (status, code) in [
            (Status::unauthenticated("who are you"), "UNAUTHENTICATED"),
            (
                Status::permission_denied("the edge caller may not call /x/Append"),
                "PERMISSION_DENIED",
            ),
        ] {
            let error = from_status(status.clone());
            assert_eq!(error.code(), code);
            assert_eq!(error.to_string(), status.message());
            let back = to_status(error);
            assert_eq!(
                (back.code(), back.message()),
                (status.code(), status.message())
            );
        }
    }
}
