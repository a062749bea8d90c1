//! `CoordinatorError` ↔ `tonic::Status`, in one place, for both sides of the
//! wire. The gRPC code says how a caller should react; the machine-readable
//! `CoordinatorErrorDetail` (its code, the run it is about, the owner's
//! address) travels inside the standard `google.rpc.Status` details
//! trailer, so the client rebuilds the exact error.

use clawgate_proto::run_coordinator::v1 as pb;
use clawgate_proto::status_detail::MAX_DETAIL_BYTES;
use tonic::{Code, Status};

use super::convert::{snapshot_from_pb, snapshot_to_pb};
use crate::error::CoordinatorError;

/// The detail's type, the one name both sides read it by.
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
        // Not UNAVAILABLE: another coordinator owns other sessions, so
        // failing over would not help; the caller retries later.
        CoordinatorError::QueueFull(_) => (Code::ResourceExhausted, pb::ErrorCode::QueueFull),
        // What a caller makes of a transport failure: no detail, as the
        // transport sends none.
        CoordinatorError::Unavailable(message) => return Status::unavailable(message.clone()),
        CoordinatorError::TooLarge(message) => {
            return Status::resource_exhausted(message.clone());
        }
        // The auth layer's refusals, as it sends them: no detail.
        CoordinatorError::Unauthenticated(message) => {
            return Status::unauthenticated(message.clone());
        }
        CoordinatorError::PermissionDenied(message) => {
            return Status::permission_denied(message.clone());
        }
        CoordinatorError::Internal(_) => (Code::Internal, pb::ErrorCode::Internal),
    };
    let message = err.to_string();
    let leader_address = err.leader_hint().map(str::to_owned);
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

/// The detail a coordinator's error carries, if it has one.
pub fn detail_of(status: &Status) -> Option<pb::CoordinatorErrorDetail> {
    clawgate_proto::status_detail::detail_of(status, DETAIL_TYPE_URL)
}

/// The owner's address a coordinator's error names, if any (what a router
/// follows).
pub fn leader_hint(status: &Status) -> Option<String> {
    detail_of(status)
        .and_then(|d| d.leader_address)
        .filter(|a| !a.is_empty())
}

/// Whether another coordinator may answer where this one did not
/// (UNAVAILABLE, which NOT_OWNER and DRAINING are).
pub fn should_fail_over(status: &Status) -> bool {
    status.code() == Code::Unavailable
}

/// What `CoordinatorError::StoreUnavailable`'s message starts with on the
/// wire (its `Display`).
const STORE_UNAVAILABLE_PREFIX: &str = "session store unavailable: ";

/// Rebuilds the `CoordinatorError` a server sent. A status without the
/// detail (a transport failure, a proxy, a message limit) maps by its code.
pub fn from_status(status: Status) -> CoordinatorError {
    let message = status.message().to_owned();
    let Some(detail) = detail_of(&status) else {
        return match status.code() {
            Code::InvalidArgument => CoordinatorError::InvalidArgument(message),
            Code::ResourceExhausted | Code::OutOfRange => CoordinatorError::TooLarge(message),
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => {
                CoordinatorError::Unavailable(message)
            }
            Code::Unauthenticated => CoordinatorError::Unauthenticated(message),
            Code::PermissionDenied => CoordinatorError::PermissionDenied(message),
            code => CoordinatorError::Internal(format!("run coordinator: {code:?}: {message}")),
        };
    };
    let run = || {
        detail
            .run
            .clone()
            .and_then(|r| snapshot_from_pb(r).ok())
            .map(Box::new)
    };
    use pb::ErrorCode as C;
    match C::try_from(detail.code).unwrap_or(C::Unspecified) {
        C::InvalidArgument => CoordinatorError::InvalidArgument(message),
        C::KeyReused => match run() {
            Some(existing) => CoordinatorError::KeyReused { existing },
            None => CoordinatorError::Internal(message),
        },
        C::SessionBusy => match run() {
            Some(blocking) => CoordinatorError::SessionBusy { blocking },
            None => CoordinatorError::Internal(message),
        },
        C::Draining => CoordinatorError::Draining,
        C::NotOwner => CoordinatorError::NotOwner {
            message,
            leader: detail.leader_address.clone().filter(|a| !a.is_empty()),
        },
        C::SettingsChanged => CoordinatorError::SettingsChanged(message),
        C::StoreUnavailable => CoordinatorError::StoreUnavailable(
            message
                .strip_prefix(STORE_UNAVAILABLE_PREFIX)
                .map_or(message.clone(), str::to_owned),
        ),
        C::QueueFull => CoordinatorError::QueueFull(message),
        C::Internal | C::Unspecified => CoordinatorError::Internal(message),
    }
}

/// Whether a status's detail says its snapshot left fields out (see `trim`).
pub fn is_trimmed(status: &Status) -> bool {
    detail_of(status).is_some_and(|d| d.trimmed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Outcome, RunSnapshot, RunStatus};

    fn run(text: &str) -> Box<RunSnapshot> {
        Box::new(RunSnapshot {
            run_id: "r1".into(),
            session_key: "agent:main:s".into(),
            kind: "chat".into(),
            status: RunStatus::Running,
            queue_position: 0,
            last_seq: 3,
            created_at_ms: 1,
            started_at_ms: Some(2),
            ended_at_ms: None,
            outcome: Outcome {
                text: text.into(),
                ..Outcome::default()
            },
            session_id: None,
            fence_token: Some(4),
            epoch: "e".into(),
            requester: String::new(),
        })
    }

    /// Every error a server sends, and every one a caller makes of a
    /// transport failure, comes back from the wire as it went.
    #[test]
    fn every_error_round_trips_through_a_status() {
        let errors = [
            CoordinatorError::InvalidArgument("bad".into()),
            CoordinatorError::KeyReused { existing: run("a") },
            CoordinatorError::SessionBusy { blocking: run("b") },
            CoordinatorError::Draining,
            CoordinatorError::NotOwner {
                message: "not mine".into(),
                leader: Some("http://other:50062".into()),
            },
            CoordinatorError::NotOwner {
                message: "not mine, owner unknown".into(),
                leader: None,
            },
            CoordinatorError::SettingsChanged("changed".into()),
            CoordinatorError::StoreUnavailable("down".into()),
            CoordinatorError::QueueFull("full".into()),
            CoordinatorError::Unavailable("connection refused".into()),
            CoordinatorError::TooLarge("message too large".into()),
            CoordinatorError::Internal("oops".into()),
        ];
        for err in errors {
            let back = from_status(to_status(err.clone()));
            assert_eq!(back, err, "{}", err.code());
            assert_eq!(back.to_string(), err.to_string());
        }
    }

    #[test]
    fn a_snapshot_too_large_for_the_trailers_is_trimmed_and_still_names_its_run() {
        let huge = "x".repeat(2 * MAX_DETAIL_BYTES);
        let status = to_status(CoordinatorError::KeyReused {
            existing: run(&huge),
        });
        assert!(is_trimmed(&status));
        let CoordinatorError::KeyReused { existing } = from_status(status) else {
            panic!("not a KeyReused");
        };
        assert_eq!(
            (existing.run_id.as_str(), existing.outcome.text.as_str()),
            ("r1", "")
        );
    }

    #[test]
    fn statuses_without_the_detail_map_by_their_code() {
        let cases = [
            (Status::deadline_exceeded("slow"), "UNAVAILABLE"),
            (Status::cancelled("gone"), "UNAVAILABLE"),
            (Status::out_of_range("big"), "TOO_LARGE"),
            (Status::invalid_argument("bad"), "INVALID_ARGUMENT"),
            (Status::permission_denied("no"), "PERMISSION_DENIED"),
            (Status::unauthenticated("who"), "UNAUTHENTICATED"),
            (Status::data_loss("?"), "INTERNAL"),
        ];
        for (status, code) in cases {
            let error = from_status(status.clone());
            assert_eq!(error.code(), code);
            // The auth layer's refusals go back as they came (an edge
            // passing one on says what the server said).
            if matches!(code, "PERMISSION_DENIED" | "UNAUTHENTICATED") {
                let back = to_status(error);
                assert_eq!(
                    (back.code(), back.message()),
                    (status.code(), status.message())
                );
            }
        }
        assert_eq!(
            leader_hint(&to_status(CoordinatorError::NotOwner {
                message: "m".into(),
                leader: Some("a".into())
            })),
            Some("a".into())
        );
    }
}
