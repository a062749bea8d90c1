//! Which sessions a caller may act on. An internal caller bound to a
//! session-key prefix (`CLAWGATE_INTERNAL_TOKENS` entry `prefix=token`, or
//! an identity its transport established) may submit to, cancel, wait
//! for, read and follow only runs of sessions whose canonical key starts
//! with the prefix; it may not follow every run at once. Checked here,
//! before the coordinator acts, because the auth layer sees no session: a
//! run id's session is the coordinator's to know. A run of another session
//! and an unknown run are refused alike, so the refusal tells nothing of
//! runs the caller may not see; nor does a Submit whose run id another
//! session took (its `KEY_REUSED` would carry that run). Callers bound to no
//! prefix are not checked.

use run_coordinator_api::error::{CoordinatorError, CoordinatorResult};
use run_coordinator_api::grpc::status::to_status;
use run_coordinator_api::model::Submitted;
use session_store_api::SessionKey;
use tonic::{Request, Status};

use clawgate_telemetry::CallerIdentity;

use crate::coordinator::Coordinator;

/// The session prefix the caller of a request is bound to, if any.
#[derive(Debug, Clone)]
pub struct Bound(String);

impl Bound {
    /// The binding of `request`'s caller (put there by the auth layer).
    pub fn of<T>(request: &Request<T>) -> Option<Self> {
        let caller = request.extensions().get::<CallerIdentity>()?;
        caller.session_prefix.clone().map(Self)
    }

    fn denied(&self, what: &str) -> Status {
        Status::permission_denied(format!(
            "{what}: this internal caller may act only on sessions whose key starts with \
             \"{}\" (docs/security.md)",
            self.0
        ))
    }

    /// Refuses a session outside the prefix.
    pub fn check_session(&self, key: &SessionKey) -> Result<(), Status> {
        match key.as_str().starts_with(&self.0) {
            true => Ok(()),
            false => Err(self.denied(&format!("session \"{key}\" is not one of them"))),
        }
    }

    /// Refuses a run of a session outside the prefix, or one unknown.
    pub async fn check_run(&self, coordinator: &Coordinator, run_id: &str) -> Result<(), Status> {
        let run = coordinator.get(run_id).await.map_err(to_status)?;
        match run {
            Some(run) if run.session_key.as_str().starts_with(&self.0) => Ok(()),
            _ => Err(self.denied(&format!(
                "run \"{run_id}\" is unknown or of a session this caller may not act on"
            ))),
        }
    }

    /// A Submit's answer, unless it would show a run of another session:
    /// a run id taken there answers `KEY_REUSED` with that run, which is
    /// refused here as any run of another session is.
    pub fn screen_submit(
        &self,
        answer: CoordinatorResult<Submitted>,
        run_id: &str,
    ) -> Result<Submitted, Status> {
        let session = match &answer {
            Ok(submitted) => &submitted.snapshot.session_key,
            Err(CoordinatorError::KeyReused { existing }) => &existing.session_key,
            Err(_) => return answer.map_err(to_status),
        };
        match session.starts_with(&self.0) {
            true => answer.map_err(to_status),
            false => Err(self.denied(&format!(
                "run \"{run_id}\" is unknown or of a session this caller may not act on"
            ))),
        }
    }

    /// Following every run at once is every session's.
    pub fn refuse_all(&self) -> Status {
        self.denied("subscribing to all runs is refused")
    }
}

/// Checks `run_id` when the request's caller is bound to a prefix.
pub async fn check_run<T>(
    request: &Request<T>,
    coordinator: &Coordinator,
    run_id: &str,
) -> Result<(), Status> {
    match Bound::of(request) {
        Some(bound) => bound.check_run(coordinator, run_id).await,
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clawgate_telemetry::CallerKind;

    fn request_from(caller: Option<CallerIdentity>) -> Request<()> {
        let mut request = Request::new(());
        if let Some(caller) = caller {
            request.extensions_mut().insert(caller);
        }
        request
    }

    #[test]
    fn only_a_caller_with_a_prefix_is_bound_and_only_to_it() {
        assert!(Bound::of(&request_from(None)).is_none());
        let edge = CallerIdentity::of(CallerKind::Edge);
        assert!(Bound::of(&request_from(Some(edge))).is_none());
        let billing = CallerIdentity {
            kind: CallerKind::Internal,
            session_prefix: Some("agent:billing:".into()),
        };
        let bound = Bound::of(&request_from(Some(billing))).unwrap();
        let own = SessionKey::parse("agent:billing:invoice-7").unwrap();
        assert!(bound.check_session(&own).is_ok());
        let other = SessionKey::parse("main").unwrap();
        let refused = bound.check_session(&other).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::PermissionDenied);
        assert!(
            refused.message().starts_with(
                "session \"agent:main:main\" is not one of them: this internal caller may act \
                 only on sessions whose key starts with \"agent:billing:\""
            ),
            "{}",
            refused.message()
        );
        assert_eq!(bound.refuse_all().code(), tonic::Code::PermissionDenied);
    }
}
