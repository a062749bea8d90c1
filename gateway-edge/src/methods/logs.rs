//! `logs.tail`: this edge process's recent log lines, from the bounded ring
//! its log output feeds (`clawgate_telemetry::log_ring`). The `file` names
//! this edge process, so a reader whose cursor came from another replica or
//! an earlier process sees the file change and starts over.

use serde_json::json;

use super::{Answer, Call, fail};

pub(super) const LOGS_TAIL_KEYS: &[&str] = &["cursor", "limit", "maxBytes"];

/// OpenClaw's defaults and bounds for a read.
const DEFAULT_LIMIT: u64 = 500;
const MAX_LIMIT: u64 = 5000;
const DEFAULT_MAX_BYTES: u64 = 250_000;
const MAX_MAX_BYTES: u64 = 1_000_000;

pub(super) async fn logs_tail(call: &Call<'_>) -> Answer {
    let params = &call.params;
    let cursor = params.integer("cursor", 0, u64::MAX).map_err(fail)?;
    let limit = params.integer("limit", 1, MAX_LIMIT).map_err(fail)?;
    let max_bytes = params.integer("maxBytes", 1, MAX_MAX_BYTES).map_err(fail)?;
    let tail = clawgate_telemetry::recent_logs().tail(
        cursor,
        limit.unwrap_or(DEFAULT_LIMIT) as usize,
        max_bytes.unwrap_or(DEFAULT_MAX_BYTES) as usize,
    );
    let mut answer = json!({
        "file": format!("gateway-edge/{}", call.edge.boot_id),
        "cursor": tail.cursor, "size": tail.size, "lines": tail.lines,
    });
    if tail.truncated {
        answer["truncated"] = json!(true);
        answer["skippedBytes"] = json!(tail.skipped_bytes);
    }
    if tail.reset {
        answer["reset"] = json!(true);
    }
    Ok(answer)
}
