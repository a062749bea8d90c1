//! `sessions.compact`: this gateway keeps every transcript whole. Its
//! runtimes get a session's history as it is and have no summarising step,
//! and the store has no way to replace a transcript's head with a summary;
//! so the answer is OpenClaw's honest no-op, `compacted: false`, with why.

use serde_json::json;
use session_store_api::SessionStore;

use super::{Answer, Call, fail, key_for, store_error};

pub(super) const SESSIONS_COMPACT_KEYS: &[&str] = &["key", "agentId", "maxLines"];

/// Why a transcript with entries is not compacted.
const UNSUPPORTED: &str = "compaction is not supported: this gateway keeps transcripts whole";

pub(super) async fn sessions_compact(call: &Call<'_>) -> Answer {
    let p = &call.params;
    let key = key_for(
        &call.request.method,
        p.required_non_empty("key").map_err(fail)?,
    )?;
    super::sessions::check_agent(p)?;
    p.integer("maxLines", 1, u64::MAX).map_err(fail)?;
    let session = call
        .edge
        .backends
        .store
        .get_session(&key)
        .await
        .map_err(store_error)?;
    let reason = match session {
        None => "no sessionId",
        Some(session) if session.entry_count == 0 => "no transcript",
        Some(_) => UNSUPPORTED,
    };
    Ok(json!({ "ok": true, "key": key.as_str(), "compacted": false, "reason": reason }))
}
