//! `chat.history` and `chat.startup`: pages of a session's transcript with
//! what a chat view needs around them (`sessionInfo`, the run in flight).
//!
//! Paging follows the protocol: `offset` counts messages back from the
//! newest (the answer's `nextOffset` is the next page's), `messageId` reads
//! the page around one message (with `sessionId`: of a transcript a reset
//! replaced), and `cursor` (an answer's `deltaCursor`) asks only for what
//! came after it: `{kind:"delta"}`, or `{kind:"reset"}` when the transcript
//! it points into is no longer the session's. `maxBytes` bounds the
//! messages' JSON; the oldest go first.

use std::sync::Arc;

use serde_json::{Value, json};
use session_store_api::model::{HistoryCursor, HistoryPage, HistoryQuery, SessionId};
use session_store_api::{SessionKey, SessionStore};

use super::sessions::session_info;
use super::{Answer, fail, key_for, store_error};
use crate::protocol::frames::{ErrorShape, without_nulls};
use crate::protocol::params::Params;
use crate::protocol::transcript::{message_id, parse_message_id, transcript_message};
use crate::state::Edge;

/// The keys of `chat.history`, and after them any `$extra`.
macro_rules! history_keys {
    ($($extra:literal),*) => {
        &[
            "sessionKey", "agentId", "cursor", "limit", "maxBytes", "offset",
            "pendingBefore", "inputRunIds", "messageId", "sessionId", "maxChars",
            $($extra),*
        ]
    };
}

pub(super) const HISTORY_KEYS: &[&str] = history_keys!();

/// `chat.startup`'s second shape: a session named by the short id of its
/// key's trailing UUID.
const STARTUP_SHORT_ID_KEYS: &[&str] = &["shortId", "slugHint", "agentId", "limit", "maxBytes"];

/// Both shapes of `chat.startup` (the method table's params list).
pub(super) const STARTUP_KEYS: &[&str] = history_keys!("shortId", "slugHint");

/// Messages per page unless the request says.
const DEFAULT_LIMIT: u64 = 200;
/// The most messages one page holds (the protocol's cap).
const MAX_LIMIT: u64 = 1000;

/// Where a page starts.
enum Anchor {
    /// `offset` messages back from the newest.
    Offset(u64),
    /// Around one message of a transcript.
    Message {
        session_id: Option<SessionId>,
        seq: u64,
    },
    /// After an earlier answer's `deltaCursor`.
    Delta(String),
}

struct PageRequest<'a> {
    raw_key: &'a str,
    key: SessionKey,
    limit: u32,
    max_chars: Option<u32>,
    max_bytes: Option<u64>,
    anchor: Anchor,
}

fn parse_request<'a>(method: &str, p: &Params<'a>) -> Result<PageRequest<'a>, ErrorShape> {
    let raw_key = p.required_non_empty("sessionKey")?;
    let key = key_for(method, raw_key).map_err(|(e, _)| e)?;
    let limit = p.integer("limit", 1, MAX_LIMIT)?.unwrap_or(DEFAULT_LIMIT) as u32;
    let max_chars = p.integer("maxChars", 1, 500_000)?.map(|n| n as u32);
    let max_bytes = p.integer("maxBytes", 1024, u64::MAX)?;
    p.integer("pendingBefore", 1, u64::MAX)?;
    string_ids(p, "inputRunIds")?;
    let offset = p.integer("offset", 0, u64::MAX)?;
    let message_id = p.optional_non_empty("messageId")?;
    let session_id = p.optional_non_empty("sessionId")?;
    let cursor = p.string("cursor")?;
    if offset.is_some() && message_id.is_some() {
        return Err(ErrorShape::invalid(
            "offset and messageId cannot be used together",
        ));
    }
    if cursor.is_some() && (offset.is_some() || message_id.is_some()) {
        return Err(ErrorShape::invalid(
            "cursor cannot be used with offset or messageId",
        ));
    }
    if session_id.is_some() && message_id.is_none() {
        return Err(ErrorShape::invalid("sessionId requires messageId"));
    }
    let anchor = match (cursor, message_id) {
        (Some(cursor), _) => Anchor::Delta(cursor.to_owned()),
        (None, Some(id)) => {
            let (in_session, seq) = parse_message_id(id)
                .ok_or_else(|| p.error("/messageId is not a message id of this gateway"))?;
            let session_id = match session_id {
                Some(raw) => Some(
                    raw.parse()
                        .map_err(|_| p.error("/sessionId must be a UUID"))?,
                ),
                None => in_session,
            };
            Anchor::Message { session_id, seq }
        }
        (None, None) => Anchor::Offset(offset.unwrap_or(0)),
    };
    Ok(PageRequest {
        raw_key,
        key,
        limit,
        max_chars,
        max_bytes,
        anchor,
    })
}

/// 1..=50 distinct non-empty strings of at most 256 characters.
fn string_ids(p: &Params, key: &str) -> Result<(), ErrorShape> {
    let Some(value) = p.value(key) else {
        return Ok(());
    };
    let items = value
        .as_array()
        .filter(|items| (1..=50).contains(&items.len()))
        .ok_or_else(|| p.error(&format!("/{key} must be an array of 1 to 50 items")))?;
    let mut seen = std::collections::HashSet::new();
    for item in items {
        match item.as_str() {
            Some(s) if !s.is_empty() && s.chars().count() <= 256 && seen.insert(s) => {}
            _ => {
                return Err(p.error(&format!(
                    "/{key} must hold distinct strings of 1 to 256 characters"
                )));
            }
        }
    }
    Ok(())
}

pub(super) async fn chat_history(edge: &Arc<Edge>, p: &Params<'_>) -> Answer {
    let request = parse_request("chat.history", p).map_err(fail)?;
    history_page(edge, request).await
}

/// `chat.history` under the name the Control UI opens a chat with, or the
/// same for a session named by its short id.
pub(super) async fn chat_startup(edge: &Arc<Edge>, union: &Params<'_>) -> Answer {
    if union.value("shortId").is_none() {
        if let Some(other) = union
            .keys()
            .find(|k| !HISTORY_KEYS.contains(k) && STARTUP_KEYS.contains(k))
        {
            return Err(fail(ErrorShape::invalid(format!(
                "invalid chat.startup params: {other} requires shortId"
            ))));
        }
        let p = union.closed_to(HISTORY_KEYS).map_err(fail)?;
        let request = parse_request("chat.startup", &p).map_err(fail)?;
        return history_page(edge, request).await;
    }
    // The two shapes are one union: a key of the other shape is a mismatch
    // of the union, not an unknown key.
    if let Some(other) = union
        .keys()
        .find(|k| HISTORY_KEYS.contains(k) && !STARTUP_SHORT_ID_KEYS.contains(k))
    {
        return Err(fail(ErrorShape::invalid(format!(
            "invalid chat.startup params: shortId cannot be used with {other}"
        ))));
    }
    let p = union.closed_to(STARTUP_SHORT_ID_KEYS).map_err(fail)?;
    let short_id = p.required_non_empty("shortId").map_err(fail)?;
    p.required_non_empty("agentId").map_err(fail)?;
    let key = super::sessions::resolve_short_id(edge, short_id).await?;
    let raw_key = key.as_str().to_owned();
    let request = PageRequest {
        raw_key: &raw_key,
        limit: p
            .integer("limit", 1, MAX_LIMIT)
            .map_err(fail)?
            .unwrap_or(DEFAULT_LIMIT) as u32,
        max_chars: None,
        max_bytes: p.integer("maxBytes", 1024, u64::MAX).map_err(fail)?,
        key,
        anchor: Anchor::Offset(0),
    };
    history_page(edge, request).await
}

async fn history_page(edge: &Arc<Edge>, request: PageRequest<'_>) -> Answer {
    let store = &edge.backends.store;
    let session = store.get_session(&request.key).await.map_err(store_error)?;
    let info = session_info(edge, &request.key, session.as_ref()).await?;
    let current_id = session.as_ref().map(|s| s.session_id);
    let query = |cursor, session_id| HistoryQuery {
        key: request.key.clone(),
        limit: request.limit,
        cursor,
        max_chars: request.max_chars,
        session_id,
    };
    let (query, offset) = match &request.anchor {
        Anchor::Delta(cursor) => {
            let after = parse_message_id(cursor)
                .filter(|(id, _)| id.is_some() && *id == current_id)
                .map(|(_, seq)| seq);
            let Some(after) = after else {
                return Ok(json!({ "kind": "reset" }));
            };
            let page = store
                .history(query(HistoryCursor::After(after), None))
                .await
                .map_err(store_error)?;
            let id = page.session_id.map(|id| id.to_string()).unwrap_or_default();
            let last = page.entries.last().map_or(after, |e| e.seq);
            let messages = capped(messages_of(&page), request.max_bytes).0;
            return Ok(with_in_flight(
                json!({
                    "kind": "delta", "messages": messages,
                    "deltaCursor": message_id(&id, last),
                    "pendingInputs": { "items": [], "total": 0 },
                    "sessionInfo": info.info,
                }),
                info.in_flight,
            ));
        }
        Anchor::Message { session_id, seq } => {
            // The page around the message: it and up to half a page after.
            let upper = seq + u64::from(request.limit / 2) + 1;
            (query(HistoryCursor::Before(upper), *session_id), None)
        }
        Anchor::Offset(0) => (query(HistoryCursor::Latest, None), Some(0)),
        Anchor::Offset(offset) => {
            let total = session.as_ref().map_or(0, |s| s.entry_count);
            if *offset >= total {
                let id = current_id.map(|id| id.to_string());
                return Ok(without_nulls(json!({
                    "sessionKey": request.raw_key, "sessionId": id, "messages": [],
                    "hasMore": false, "totalMessages": total, "offset": offset,
                    "sessionInfo": info.info,
                })));
            }
            (
                query(HistoryCursor::Before(total + 1 - offset), None),
                Some(*offset),
            )
        }
    };
    let page = store.history(query).await.map_err(store_error)?;
    let id = page.session_id.map(|id| id.to_string());
    // The reset that started this transcript, shown before its first entry.
    let reset = session
        .as_ref()
        .filter(|s| page.session_id == Some(s.session_id))
        .and_then(super::sessions::reset_of);
    let mut messages = messages_of(&page);
    if let (Some((at, _)), Some(id), false) = (&reset, &id, page.has_more) {
        messages.insert(0, reset_marker(id, *at));
    }
    let (messages, trimmed) = capped(messages, request.max_bytes);
    let has_more = page.has_more || trimmed;
    let next_offset = offset
        .filter(|_| has_more)
        .map(|offset| offset + messages.len() as u64);
    let last = page.entries.last().map(|e| e.seq).unwrap_or(0);
    let delta_cursor = id
        .as_deref()
        .filter(|_| offset == Some(0))
        .map(|id| message_id(id, last));
    Ok(with_in_flight(
        without_nulls(json!({
            "sessionKey": request.raw_key, "sessionId": id, "messages": messages,
            "hasMore": has_more, "totalMessages": page.total + u64::from(reset.is_some()),
            "offset": offset.filter(|&o| o > 0), "nextOffset": next_offset,
            "deltaCursor": delta_cursor,
            "pendingInputs": { "items": [], "total": 0 },
            "defaults": super::catalog::session_defaults(edge).await?,
            "sessionInfo": info.info,
            "thinkingLevel": info.thinking_level,
        })),
        info.in_flight,
    ))
}

fn with_in_flight(mut page: Value, in_flight: Option<Value>) -> Value {
    if let Some(run) = in_flight {
        page["inFlightRun"] = run;
    }
    page
}

/// The transcript entries as protocol messages, oldest first.
fn messages_of(page: &HistoryPage) -> Vec<Value> {
    let id = page.session_id.map(|id| id.to_string()).unwrap_or_default();
    page.entries
        .iter()
        .map(|e| transcript_message(&id, e))
        .collect()
}

/// The marker a transcript that a reset started opens with (as the
/// protocol shows a reset boundary): a `system` message "Reset" with
/// `__openclaw.kind:"reset"`, at the time of the reset. It is no entry of
/// the transcript: its id names no message to page from, and it has no
/// `seq`.
fn reset_marker(session_id: &str, at: i64) -> Value {
    json!({
        "role": "system",
        "content": [{ "type": "text", "text": "Reset" }],
        "timestamp": at,
        "__openclaw": { "kind": "reset", "id": format!("{session_id}:reset") },
    })
}

/// The newest messages whose JSON fits in `max_bytes` (all without a
/// bound), and whether any were left out.
fn capped(mut messages: Vec<Value>, max_bytes: Option<u64>) -> (Vec<Value>, bool) {
    let Some(max_bytes) = max_bytes else {
        return (messages, false);
    };
    // `[` `]` and a comma between messages.
    let mut used = 2u64;
    let mut keep = 0;
    for message in messages.iter().rev() {
        let size = message.to_string().len() as u64 + 1;
        if used + size > max_bytes {
            break;
        }
        used += size;
        keep += 1;
    }
    let dropped = messages.len() - keep;
    messages.drain(..dropped);
    (messages, dropped > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_messages_go_first() {
        let messages: Vec<Value> = (0..10)
            .map(|i| json!({ "n": i, "pad": "x".repeat(100) }))
            .collect();
        let one = messages[0].to_string().len() as u64 + 1;
        let (kept, trimmed) = capped(messages.clone(), Some(2 + 3 * one));
        assert!(trimmed);
        assert_eq!(kept.len(), 3);
        assert_eq!(kept[0]["n"], 7);
        assert_eq!(capped(messages.clone(), None), (messages, false));
    }
}
