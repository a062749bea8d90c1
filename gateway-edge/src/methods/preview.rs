//! Reads of sessions' transcripts from the store: `sessions.preview` (the
//! last user and assistant texts of sessions, for list previews),
//! `sessions.get` (a session's recent messages) and `chat.message.get` (one
//! message by its id, also from a transcript a reset replaced).

use clawgate_common::clock::now_ms;
use serde_json::{Value, json};
use session_store_api::model::{HistoryCursor, HistoryQuery};
use session_store_api::{SessionKey, SessionStore, StoreError};

use super::{Answer, Call, fail, key_for, store_error};
use crate::protocol::transcript::{parse_message_id, transcript_message};

pub(super) const SESSIONS_PREVIEW_KEYS: &[&str] = &["keys", "limit", "maxChars"];
pub(super) const SESSIONS_GET_KEYS: &[&str] = &["key", "sessionKey", "limit", "agentId"];
pub(super) const CHAT_MESSAGE_GET_KEYS: &[&str] =
    &["sessionKey", "agentId", "messageId", "maxChars"];

/// OpenClaw's bounds of `chat.message.get`: the characters of each text
/// part (the most, and by default), and the largest message it answers.
const MAX_MESSAGE_CHARS: u64 = 2_000_000;
const DEFAULT_MESSAGE_CHARS: u64 = 1_000_000;
const MAX_MESSAGE_BYTES: usize = 26_213_376;

/// `sessions.get`'s messages by default, as OpenClaw's.
const DEFAULT_MESSAGES: u64 = 200;

/// OpenClaw's bounds: at most this many keys are read, items and
/// characters per item by default, and the longest item whatever is asked.
const MAX_KEYS: usize = 64;
const DEFAULT_ITEMS: u64 = 12;
const DEFAULT_CHARS: u64 = 240;
const MIN_CHARS: u64 = 20;
const MAX_CHARS: u64 = 800;
/// Transcript entries read per wanted item (tool calls and results are
/// entries that show no text).
const ENTRIES_PER_ITEM: u64 = 4;
const MAX_ENTRIES: u64 = 500;

pub(super) async fn sessions_preview(call: &Call<'_>) -> Answer {
    let params = &call.params;
    let keys = match params.raw("keys") {
        Some(Value::Array(keys)) if !keys.is_empty() => keys,
        Some(Value::Array(_)) => {
            return Err(fail(params.error("/keys must NOT have fewer than 1 items")));
        }
        Some(_) => return Err(fail(params.error("/keys must be array"))),
        None => return Err(fail(params.error("must have required property 'keys'"))),
    };
    let mut raw_keys = Vec::with_capacity(keys.len().min(MAX_KEYS));
    for key in keys {
        match key.as_str() {
            Some(key) if !key.trim().is_empty() => raw_keys.push(key.trim()),
            _ => return Err(fail(params.error("/keys/items must be a non-empty string"))),
        }
    }
    raw_keys.truncate(MAX_KEYS);
    let items = params.integer("limit", 1, u64::MAX).map_err(fail)?;
    let chars = params
        .integer("maxChars", MIN_CHARS, u64::MAX)
        .map_err(fail)?;
    let items = items.unwrap_or(DEFAULT_ITEMS);
    let chars = chars.unwrap_or(DEFAULT_CHARS).min(MAX_CHARS) as usize;
    let mut previews = Vec::with_capacity(raw_keys.len());
    for raw in raw_keys {
        let key = key_for(&call.request.method, raw)?;
        let (status, shown) = match preview_items(call, key, items, chars).await {
            Ok(None) => ("missing", Vec::new()),
            Ok(Some(shown)) if shown.is_empty() => ("empty", shown),
            Ok(Some(shown)) => ("ok", shown),
            Err(_) => ("error", Vec::new()),
        };
        previews.push(json!({ "key": raw, "status": status, "items": shown }));
    }
    Ok(json!({ "ts": now_ms(), "previews": previews }))
}

pub(super) async fn sessions_get(call: &Call<'_>) -> Answer {
    let params = &call.params;
    let raw = [params.raw("key"), params.raw("sessionKey")]
        .into_iter()
        .flatten()
        .find_map(Value::as_str)
        .map(str::trim)
        .filter(|key| !key.is_empty());
    let Some(raw) = raw else {
        return Err(fail(crate::protocol::frames::ErrorShape::invalid(
            "key required",
        )));
    };
    super::sessions::check_agent(params)?;
    let key = key_for(&call.request.method, raw)?;
    let limit = params
        .integer("limit", 1, u64::from(u32::MAX))
        .map_err(fail)?;
    let store = &call.edge.backends.store;
    let page = store
        .history(HistoryQuery {
            key,
            limit: limit.unwrap_or(DEFAULT_MESSAGES) as u32,
            cursor: HistoryCursor::Latest,
            max_chars: None,
            session_id: None,
        })
        .await
        .map_err(store_error)?;
    let id = page.session_id.map(|id| id.to_string()).unwrap_or_default();
    let messages: Vec<Value> = page
        .entries
        .iter()
        .map(|entry| transcript_message(&id, entry))
        .collect();
    Ok(json!({ "messages": messages }))
}

pub(super) async fn chat_message_get(call: &Call<'_>) -> Answer {
    let params = &call.params;
    let raw = params.required_non_empty("sessionKey").map_err(fail)?;
    super::sessions::check_agent(params)?;
    let message_id = params.required_non_empty("messageId").map_err(fail)?;
    let chars = params
        .integer("maxChars", 1, MAX_MESSAGE_CHARS)
        .map_err(fail)?
        .unwrap_or(DEFAULT_MESSAGE_CHARS) as usize;
    let key = key_for(&call.request.method, raw)?;
    let unavailable = |reason: &str| Ok(json!({ "ok": false, "unavailableReason": reason }));
    let store = &call.edge.backends.store;
    let (Some(session), Some((transcript, seq))) = (
        store.get_session(&key).await.map_err(store_error)?,
        parse_message_id(message_id),
    ) else {
        return unavailable("not_found");
    };
    let page = store
        .history(HistoryQuery {
            key,
            limit: 1,
            cursor: HistoryCursor::After(seq - 1),
            max_chars: None,
            session_id: transcript.or(Some(session.session_id)),
        })
        .await
        .map_err(store_error)?;
    let id = page.session_id.map(|id| id.to_string()).unwrap_or_default();
    match page.entries.first() {
        Some(entry) if entry.seq == seq => {
            let mut message = transcript_message(&id, entry);
            cut_texts(&mut message, chars);
            if message.to_string().len() > MAX_MESSAGE_BYTES {
                return unavailable("oversized");
            }
            Ok(json!({ "ok": true, "message": message }))
        }
        // The entry is there but over a page's budget.
        None if page.has_more => unavailable("oversized"),
        _ => unavailable("not_found"),
    }
}

/// Cuts every text part of `message` to `chars` characters.
fn cut_texts(message: &mut Value, chars: usize) {
    let cut = |text: &mut Value| {
        if let Some(t) = text.as_str()
            && let Some((at, _)) = t.char_indices().nth(chars)
        {
            *text = json!(t[..at].to_owned());
        }
    };
    match &mut message["content"] {
        Value::Array(parts) => parts
            .iter_mut()
            .filter_map(|part| part.get_mut("text"))
            .for_each(cut),
        text @ Value::String(_) => cut(text),
        _ => {}
    }
}

/// The session's last `items` texts, oldest first (`None`: no session).
async fn preview_items(
    call: &Call<'_>,
    key: SessionKey,
    items: u64,
    chars: usize,
) -> Result<Option<Vec<Value>>, StoreError> {
    let store = &call.edge.backends.store;
    if store.get_session(&key).await?.is_none() {
        return Ok(None);
    }
    let entries = items.saturating_mul(ENTRIES_PER_ITEM).min(MAX_ENTRIES) as u32;
    let page = store
        .history(HistoryQuery {
            key,
            limit: entries,
            cursor: HistoryCursor::Latest,
            max_chars: None,
            session_id: None,
        })
        .await?;
    let id = page.session_id.map(|id| id.to_string()).unwrap_or_default();
    let mut shown: Vec<Value> = page
        .entries
        .iter()
        .rev()
        .filter_map(|entry| shown_text(&transcript_message(&id, entry), chars))
        .take(items as usize)
        .collect();
    shown.reverse();
    Ok(Some(shown))
}

/// A user or assistant message's text as a preview item, cut to `chars`
/// characters (its last three `...` when cut); `None` for other messages
/// and ones without text.
fn shown_text(message: &Value, chars: usize) -> Option<Value> {
    let role = message["role"].as_str()?;
    if role != "user" && role != "assistant" {
        return None;
    }
    let text = match &message["content"] {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter(|part| matches!(part["type"].as_str(), Some("text" | "input_text")))
            .filter_map(|part| part["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => return None,
    };
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let text = if text.chars().count() <= chars {
        text.to_owned()
    } else {
        let cut: String = text.chars().take(chars - 3).collect();
        format!("{cut}...")
    };
    Some(json!({ "role": role, "text": text }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_of_user_and_assistant_messages_only() {
        let user = json!({ "role": "user", "content": [{ "type": "text", "text": " hi " }] });
        assert_eq!(
            shown_text(&user, 240),
            Some(json!({ "role": "user", "text": "hi" }))
        );
        let tool = json!({ "role": "toolResult", "content": [{ "type": "text", "text": "x" }] });
        assert_eq!(shown_text(&tool, 240), None);
        let call_only = json!({ "role": "assistant", "content": [{ "type": "toolCall" }] });
        assert_eq!(shown_text(&call_only, 240), None);
        let long = json!({ "role": "assistant", "content": "é".repeat(30) });
        assert_eq!(
            shown_text(&long, 20),
            Some(json!({ "role": "assistant", "text": format!("{}...", "é".repeat(17)) }))
        );
    }
}
