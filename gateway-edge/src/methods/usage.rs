//! The Usage page: token counts the runtimes reported, read back from the
//! transcripts in the store (each assistant entry keeps its run's usage),
//! so they outlive restarts and are the same from every edge replica.
//! `sessions.usage` sums them per session and over sessions for a range of
//! days; `sessions.usage.timeseries` and `sessions.usage.logs` show one
//! session's; `usage.status` lists provider quota windows, of which this
//! gateway knows none. Rollups are in `usage_rollup.rs`.
//!
//! Days are UTC, or at `utcOffset` when `mode` is `specific` (an IANA
//! `timeZone` alone is read as UTC: this edge carries no time zone data).
//! A report reads at most `EDGE_USAGE_MAX_SESSIONS` sessions and
//! `EDGE_USAGE_MAX_ENTRIES` transcript entries, newest first.

use clawgate_common::clock::now_ms;
use serde_json::{Value, json};
use session_store_api::model::{HistoryCursor, HistoryQuery, ListQuery, Session, TranscriptEntry};
use session_store_api::{SessionKey, SessionStore, StoreError};

use super::usage_rollup::{Calendar, ModelId, Rollup, SessionUsage, Totals, UNKNOWN_CREATOR};
use super::{Answer, Call, fail, key_for, store_error};
use crate::protocol::frames::ErrorShape;
use crate::protocol::transcript::transcript_message;

pub(super) const SESSIONS_USAGE_KEYS: &[&str] = &[
    "key",
    "agentId",
    "agentScope",
    "creatorKey",
    "startDate",
    "endDate",
    "mode",
    "range",
    "groupBy",
    "includeHistorical",
    "utcOffset",
    "timeZone",
    "limit",
    "includeContextWeight",
];
/// What `sessions.usage.timeseries` and `.logs` read (OpenClaw validates
/// neither against a schema).
pub(super) const USAGE_DETAIL_KEYS: &[&str] = &["key", "agentId", "limit"];

/// Sessions listed by default, as OpenClaw's.
const DEFAULT_ROWS: u64 = 50;
/// Days a report covers when no dates or range are asked.
const DEFAULT_DAYS: i64 = 30;
const DAY_MS: i64 = 86_400_000;
/// Points of a time series at most (consecutive ones are summed).
const MAX_POINTS: usize = 200;
/// Log lines by default and at most, and characters per line.
const DEFAULT_LOGS: u64 = 200;
const MAX_LOGS: u64 = 1000;
const MAX_LOG_CHARS: usize = 2000;
/// Entries asked of the store per page.
const PAGE: u32 = 1000;

pub(super) async fn usage_status() -> Answer {
    Ok(json!({ "updatedAt": now_ms(), "providers": [] }))
}

pub(super) async fn sessions_usage(call: &Call<'_>) -> Answer {
    let p = &call.params;
    let key = p.optional_non_empty("key").map_err(fail)?;
    let all_agents = p.one_of("agentScope", &["all"]).map_err(fail)?.is_some();
    if all_agents && (key.is_some() || p.raw("agentId").is_some()) {
        return Err(fail(ErrorShape::invalid(
            "agentScope=all cannot be combined with key or agentId",
        )));
    }
    super::sessions::check_agent(p)?;
    let creator = p.optional_non_empty("creatorKey").map_err(fail)?;
    let rows = p
        .integer("limit", 1, u64::MAX)
        .map_err(fail)?
        .unwrap_or(DEFAULT_ROWS);
    let calendar = calendar(call)?;
    let (start, end) = range(call, calendar)?;
    let edge = call.edge;
    let sessions = match key {
        Some(raw) => {
            let key = key_for(&call.request.method, raw)?;
            let session = edge.backends.store.get_session(&key).await;
            session.map_err(store_error)?.into_iter().collect()
        }
        None => edge
            .backends
            .store
            .list_sessions(ListQuery {
                limit: edge.config.usage_max_sessions,
                updated_since_ms: Some(start),
                search: None,
            })
            .await
            .map_err(store_error)?,
    };
    let runtime_model = runtime_model(call).await?;
    let mut budget = edge.config.usage_max_entries;
    let mut rollup = Rollup::default();
    let mut listed = Vec::new();
    // No session records its creator: a creator filter other than the
    // unknown one matches none.
    let sessions = sessions
        .into_iter()
        .filter(|_| creator.is_none_or(|c| c == UNKNOWN_CREATOR));
    for session in sessions {
        let entries = entries_between(edge, &session.key, start, end, &mut budget)
            .await
            .map_err(store_error)?;
        let mut usage = SessionUsage::default();
        for entry in &entries {
            usage.add(entry, calendar);
        }
        if usage.is_empty() {
            continue;
        }
        let model = session_model(&session).unwrap_or_else(|| runtime_model.clone());
        rollup.add(&usage, &model);
        if (listed.len() as u64) < rows {
            listed.push(session_row(&session, &usage, &model));
        }
    }
    let creators = if rollup.totals == Totals::default() && listed.is_empty() {
        json!([])
    } else {
        json!([{ "key": UNKNOWN_CREATOR }])
    };
    Ok(json!({
        "updatedAt": now_ms(),
        "startDate": calendar.date(start), "endDate": calendar.date(end),
        "sessions": listed, "totals": rollup.totals.json(),
        "aggregates": rollup.aggregates(), "creatorOptions": creators,
    }))
}

pub(super) async fn sessions_usage_timeseries(call: &Call<'_>) -> Answer {
    let (session, entries) = one_session(call, "timeseries").await?;
    let mut points: Vec<(i64, Totals)> = entries
        .iter()
        .filter_map(|e| Totals::of_entry(e).map(|t| (e.timestamp_ms, t)))
        .collect();
    // Consecutive points summed into at most MAX_POINTS, each at its last.
    let step = points.len().div_ceil(MAX_POINTS).max(1);
    points = points
        .chunks(step)
        .map(|chunk| {
            let at = chunk.last().map_or(0, |(at, _)| *at);
            let sum = chunk.iter().fold(Totals::default(), |mut sum, (_, t)| {
                sum.add(*t);
                sum
            });
            (at, sum)
        })
        .collect();
    let mut cumulative = 0;
    let points: Vec<Value> = points
        .iter()
        .map(|(at, t)| {
            cumulative += t.total;
            json!({
                "timestamp": at, "input": t.input, "output": t.output, "cacheRead": 0,
                "cacheWrite": 0, "totalTokens": t.total, "cost": 0,
                "cumulativeTokens": cumulative, "cumulativeCost": 0,
            })
        })
        .collect();
    Ok(json!({ "sessionId": session.session_id.to_string(), "points": points }))
}

pub(super) async fn sessions_usage_logs(call: &Call<'_>) -> Answer {
    let limit = match call.params.raw("limit").and_then(Value::as_u64) {
        Some(limit) => limit.min(MAX_LOGS),
        None => DEFAULT_LOGS,
    } as usize;
    // As OpenClaw's: a session without a transcript has no lines.
    let (session, entries) = match one_session(call, "logs").await {
        Err((error, _)) if error.message.starts_with("No transcript") => {
            return Ok(json!({ "logs": [] }));
        }
        read => read?,
    };
    let id = session.session_id.to_string();
    let mut logs: Vec<Value> = entries
        .iter()
        .filter_map(|entry| log_line(&id, entry))
        .collect();
    let skip = logs.len().saturating_sub(limit);
    logs.drain(..skip);
    Ok(json!({ "logs": logs }))
}

/// One entry as a usage log line: its text (tool calls named), and on an
/// assistant entry its tokens and cost.
fn log_line(session_id: &str, entry: &TranscriptEntry) -> Option<Value> {
    let message = transcript_message(session_id, entry);
    let texts: Vec<String> = match &message["content"] {
        Value::String(text) => vec![text.clone()],
        Value::Array(parts) => parts
            .iter()
            .filter_map(|part| match part["type"].as_str() {
                Some("text") => part["text"].as_str().map(str::to_owned),
                Some("toolCall") => Some(format!(
                    "[Tool: {}]",
                    part["name"].as_str().unwrap_or("tool")
                )),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    let text = texts.join("\n");
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let content: String = match text.char_indices().nth(MAX_LOG_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    };
    let mut line =
        json!({ "timestamp": entry.timestamp_ms, "role": entry.role, "content": content });
    if let Some(totals) = Totals::of_entry(entry).filter(|_| entry.role == "assistant") {
        line["tokens"] = json!(totals.total);
        line["cost"] = json!(0);
    }
    Some(line)
}

/// The session `key` of a detail read, and its whole transcript (within
/// the entry budget), oldest first.
async fn one_session(
    call: &Call<'_>,
    detail: &str,
) -> Result<(Session, Vec<TranscriptEntry>), (ErrorShape, Option<Value>)> {
    let raw = call
        .params
        .raw("key")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|key| !key.is_empty())
        .ok_or_else(|| fail(ErrorShape::invalid(format!("key is required for {detail}"))))?;
    let key = key_for(&call.request.method, raw)?;
    let store = &call.edge.backends.store;
    let Some(session) = store.get_session(&key).await.map_err(store_error)? else {
        return Err(fail(ErrorShape::invalid(format!(
            "No transcript found for session: {raw}"
        ))));
    };
    let mut budget = call.edge.config.usage_max_entries;
    let entries = entries_between(call.edge, &key, i64::MIN, i64::MAX, &mut budget)
        .await
        .map_err(store_error)?;
    Ok((session, entries))
}

/// The entries of `key`'s transcript from `start` to `end` (inclusive),
/// oldest first: read newest first, a page at a time, until one is older
/// than `start` or the `budget` of entries is spent.
async fn entries_between(
    edge: &crate::state::Edge,
    key: &SessionKey,
    start: i64,
    end: i64,
    budget: &mut u32,
) -> Result<Vec<TranscriptEntry>, StoreError> {
    let mut kept = Vec::new();
    let mut cursor = HistoryCursor::Latest;
    while *budget > 0 {
        let page = edge
            .backends
            .store
            .history(HistoryQuery {
                key: key.clone(),
                limit: PAGE.min(*budget),
                cursor,
                max_chars: None,
                session_id: None,
            })
            .await?;
        *budget -= (page.entries.len() as u32).min(*budget);
        let Some(oldest) = page.entries.first() else {
            break;
        };
        let (oldest_seq, reached_start) = (oldest.seq, oldest.timestamp_ms < start);
        kept.extend(
            page.entries
                .into_iter()
                .rev()
                .filter(|e| (start..=end).contains(&e.timestamp_ms)),
        );
        if reached_start || !page.has_more {
            break;
        }
        cursor = HistoryCursor::Before(oldest_seq);
    }
    kept.reverse();
    Ok(kept)
}

/// A session's row of the report.
fn session_row(session: &Session, usage: &SessionUsage, model: &ModelId) -> Value {
    let id = session.session_id.to_string();
    json!({
        "key": session.key.as_str(), "label": session.label, "sessionId": id,
        "scope": "instance", "updatedAt": session.updated_at_ms, "agentId": "main",
        "creatorKey": UNKNOWN_CREATOR, "modelProvider": model.provider, "model": model.model,
        "usage": usage.json(&id, model), "hasContextWeight": false,
    })
}

/// The model a session chose for itself (`provider/model`), if any.
fn session_model(session: &Session) -> Option<ModelId> {
    let settings = super::session_settings::settings_of(session);
    let chosen = settings.get("model")?.as_str()?;
    let (provider, model) = chosen.split_once('/')?;
    Some(ModelId {
        provider: provider.to_owned(),
        model: model.to_owned(),
    })
}

/// The model runs without a choice use: the runtime's default, else the
/// runtime itself (one that lists no models runs its own).
async fn runtime_model(call: &Call<'_>) -> Result<ModelId, (ErrorShape, Option<Value>)> {
    let runtime = super::catalog::runtime_info(call.edge).await?;
    Ok(match super::catalog::default_model(&runtime.catalog) {
        Some(model) => ModelId {
            provider: model.provider.clone(),
            model: model.id.clone(),
        },
        None => ModelId {
            provider: runtime.name.clone(),
            model: runtime.name,
        },
    })
}

/// The days the call asks about: UTC, or at `utcOffset` in `specific` mode.
fn calendar(call: &Call<'_>) -> Result<Calendar, (ErrorShape, Option<Value>)> {
    let p = &call.params;
    let mode = p
        .one_of("mode", &["utc", "gateway", "specific"])
        .map_err(fail)?;
    let offset = match (mode, p.raw("utcOffset").and_then(Value::as_str)) {
        (Some("specific"), Some(offset)) => parse_offset(offset).ok_or_else(|| {
            fail(p.error("/utcOffset must match pattern \"^UTC[+-]\\d{1,2}(?::[0-5]\\d)?$\""))
        })?,
        _ => 0,
    };
    Ok(Calendar { offset_ms: offset })
}

/// `UTC+5:30` → milliseconds east of UTC.
fn parse_offset(raw: &str) -> Option<i64> {
    let rest = raw.strip_prefix("UTC")?;
    let sign = match rest.chars().next()? {
        '+' => 1,
        '-' => -1,
        _ => return None,
    };
    let (hours, minutes) = rest[1..].split_once(':').unwrap_or((&rest[1..], "0"));
    let valid = (1..=2).contains(&hours.len()) && minutes.len() <= 2;
    let (hours, minutes) = (hours.parse::<i64>().ok()?, minutes.parse::<i64>().ok()?);
    (valid && hours <= 14 && minutes < 60).then_some(sign * (hours * 60 + minutes) * 60_000)
}

/// The first and last instants of the days asked: `startDate`/`endDate`,
/// else the `range` preset up to today, else the last 30 days.
fn range(call: &Call<'_>, calendar: Calendar) -> Result<(i64, i64), (ErrorShape, Option<Value>)> {
    let p = &call.params;
    let date = |name: &str| -> Result<Option<i64>, (ErrorShape, Option<Value>)> {
        match p.raw(name) {
            None => Ok(None),
            Some(raw) => raw
                .as_str()
                .and_then(|d| (d.len() == 10).then(|| calendar.start_of(d)).flatten())
                .map(Some)
                .ok_or_else(|| {
                    fail(p.error(&format!(
                        "/{name} must match pattern \"^\\d{{4}}-\\d{{2}}-\\d{{2}}$\""
                    )))
                }),
        }
    };
    let today = calendar.today_start(now_ms());
    let end = date("endDate")?.unwrap_or(today);
    let preset = p
        .one_of("range", &["7d", "30d", "90d", "1y", "all"])
        .map_err(fail)?;
    let start = match (date("startDate")?, preset) {
        (Some(start), _) => start,
        (None, Some("all")) => 0,
        (None, preset) => {
            let days = match preset {
                Some("7d") => 7,
                Some("90d") => 90,
                Some("1y") => 365,
                _ => DEFAULT_DAYS,
            };
            end - (days - 1) * DAY_MS
        }
    };
    if start > end {
        return Err(fail(ErrorShape::invalid(
            "startDate must not be after endDate",
        )));
    }
    Ok((start, end + DAY_MS - 1))
}

#[cfg(test)]
mod tests {
    use super::parse_offset;

    #[test]
    fn utc_offsets_parse_as_the_protocol_writes_them() {
        assert_eq!(parse_offset("UTC+5:30"), Some(330 * 60_000));
        assert_eq!(parse_offset("UTC-4"), Some(-4 * 3_600_000));
        assert_eq!(parse_offset("UTC+0"), Some(0));
        for bad in [
            "UTC", "UTC+", "UTC5", "GMT+1", "UTC+123", "UTC+1:60", "UTC+15",
        ] {
            assert_eq!(parse_offset(bad), None, "{bad}");
        }
    }
}
