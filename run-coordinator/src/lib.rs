//! The run coordinator: idempotent admission, session lanes, fenced execution.
//! Built in step 2 (issue 3) on top of the `session-store` service.
