//! The bodies of the edge's fuzz targets (`fuzz/`, `cargo fuzz`), shared
//! with the stable smoke test (`tests/fuzz_corpus.rs`) so both run the same
//! code. Not an API: each `check_*` takes one input, runs it through the
//! edge's own parsing and validation, and panics when the edge panics or
//! when its answer is not well-formed (see each function's oracle).
//!
//! - [`check_frame`]: a text frame through the nesting bound
//!   (`protocol::json_depth`), `protocol::frames::parse_request`, the scope lookup and the
//!   answer/event encoders.
//! - [`check_connect`]: `connect` params through `auth::handshake::parse_connect`
//!   and what follows it without a network: `negotiate`, `check_role`,
//!   `effective_scopes`, the device signature check and device tokens.
//! - [`check_method_params`]: one served method's params through the real
//!   dispatch and handler (`methods::dispatch`), on an edge whose backends
//!   refuse every connection: each handler validates its params and answers
//!   `INVALID_REQUEST`, or passes them and meets `UNAVAILABLE` at its first
//!   backend call (or answers, for the methods that need no backend).
//!
//! Behind the `fuzzing` feature: the fuzz crate and this crate's own tests
//! turn it on; the release binaries do not carry it.

mod connect;
mod frame;
mod params;

use serde_json::Value;

pub use connect::check_connect;
pub use frame::check_frame;
pub use params::{check_method_params, method_input};

/// The error codes an answer of this edge may carry.
pub const ERROR_CODES: &[&str] = &["INVALID_REQUEST", "UNAVAILABLE", "FORBIDDEN"];

/// A key no closed object of the protocol has.
pub(super) const UNKNOWN_KEY: &str = "fuzzUnknownKey";

/// A `res` frame for `id`: ok with a payload, or a well-formed error.
pub(super) fn check_answer(frame: &str, id: &str) -> Value {
    let value: Value = serde_json::from_str(frame).expect("an answer is JSON");
    assert_eq!(value["type"], "res", "{frame}");
    assert_eq!(value["id"], id, "{frame}");
    match value["ok"].as_bool() {
        Some(true) => assert!(
            value.get("payload").is_some(),
            "ok without payload: {frame}"
        ),
        Some(false) => {
            let error = &value["error"];
            let code = error["code"].as_str().unwrap_or_default();
            assert!(ERROR_CODES.contains(&code), "unknown error code: {frame}");
            assert!(
                error["message"].as_str().is_some_and(|m| !m.is_empty()),
                "an error without a message: {frame}"
            );
            if error.get("retryable").is_some() {
                assert_eq!(error["retryable"], true, "{frame}");
                assert!(error["retryAfterMs"].is_u64(), "{frame}");
            }
        }
        None => panic!("an answer without ok: {frame}"),
    }
    value
}
