//! `sessions.list`: the session rows, filtered and paged as the protocol
//! asks, with derived titles and last-message previews on request.

use std::sync::Arc;

use clawgate_common::clock::now_ms;
use serde_json::{Value, json};
use session_store_api::SessionStore;
use session_store_api::model::{HistoryCursor, HistoryQuery, ListQuery, Session};

use super::sessions::{AGENT_ID, session_row};
use super::{Answer, backend_error, fail, store_error};
use crate::protocol::frames::ErrorShape;
use crate::protocol::params::Params;
use crate::state::Edge;

/// `sessions.list`'s boolean params.
macro_rules! list_flags {
    ($($more:literal),*) => {
        &[
            "activeOnly", "requireLastInteraction", "includeGlobal", "includeUnknown",
            "excludeSubagents", "excludeCron", "excludeSystem", "configuredAgentsOnly",
            "includeDerivedTitles", "includeLastMessage", "includeActivitySummary", "pinned",
            "hasBoard", "ownerFirst", "involvingMe", "includePeople",
            $($more),*
        ]
    };
}

const LIST_FLAGS: &[&str] = list_flags!();

pub(super) const SESSIONS_LIST_KEYS: &[&str] = list_flags!(
    "limit",
    "offset",
    "activeMinutes",
    "sortBy",
    "label",
    "projectId",
    "workspaceDir",
    "group",
    "boardFace",
    "creatorId",
    "ownerId",
    "profileRelation",
    "involvingProfileId",
    "spawnedBy",
    "agentId",
    "search",
    "archived"
);

/// Rows per `sessions.list` page unless the request says.
const DEFAULT_LIST_LIMIT: u64 = 100;
/// The most rows one page holds.
const MAX_LIST_LIMIT: u64 = 1000;
/// The deepest `offset` a list may page to.
const MAX_LIST_OFFSET: u64 = 100_000;

/// Filters that select properties no session here has (projects, pins,
/// boards, owners, people, subagents): asking for them matches nothing.
const SELECTS_ABSENT: &[&str] = &[
    "projectId",
    "workspaceDir",
    "creatorId",
    "ownerId",
    "involvingProfileId",
    "profileRelation",
    "spawnedBy",
    "boardFace",
];

pub(super) async fn sessions_list(edge: &Arc<Edge>, p: &Params<'_>) -> Answer {
    // Any limit is valid; a page holds at most MAX_LIST_LIMIT rows.
    let limit = p
        .integer("limit", 1, u64::MAX)
        .map_err(fail)?
        .unwrap_or(DEFAULT_LIST_LIMIT)
        .min(MAX_LIST_LIMIT);
    let offset = p
        .integer("offset", 0, MAX_LIST_OFFSET)
        .map_err(fail)?
        .unwrap_or(0);
    let active_minutes = p.integer("activeMinutes", 1, 10_000_000).map_err(fail)?;
    p.one_of("sortBy", &["updatedAt", "lastInteractionAt", "activity"])
        .map_err(fail)?;
    for flag in LIST_FLAGS {
        p.boolean(flag).map_err(fail)?;
    }
    let archived = match p.value("archived") {
        None => Some(false),
        Some(Value::Bool(b)) => Some(*b),
        Some(Value::String(s)) if s == "all" => None,
        Some(_) => return Err(fail(p.error("/archived must be boolean or \"all\""))),
    };
    let agent_ok = p
        .optional_non_empty("agentId")
        .map_err(fail)?
        .is_none_or(|a| a == AGENT_ID);
    let pinned = p.boolean("pinned").map_err(fail)?;
    let selects_absent = SELECTS_ABSENT.iter().any(|k| p.value(k).is_some())
        || p.boolean("hasBoard").map_err(fail)? == Some(true)
        || p.string("group")
            .map_err(fail)?
            .is_some_and(|g| !g.is_empty())
        || !agent_ok;
    // Archive and pin state are settings, filtered here: a page is the
    // store's rows `offset..offset+limit` (newest first) less those the
    // filters leave out, so it may hold fewer than `limit`, and `offset`
    // counts the store's rows.
    let search = p
        .string("search")
        .map_err(fail)?
        .or(p.string("label").map_err(fail)?);
    let include_titles = p.boolean("includeDerivedTitles").map_err(fail)? == Some(true);
    let include_last = p.boolean("includeLastMessage").map_err(fail)? == Some(true);
    let active_only = p.boolean("activeOnly").map_err(fail)? == Some(true);
    let sessions = if selects_absent {
        Vec::new()
    } else {
        edge.backends
            .store
            .list_sessions(ListQuery {
                limit: u32::try_from(offset + limit).unwrap_or(u32::MAX),
                updated_since_ms: active_minutes.map(|m| now_ms() - m as i64 * 60_000),
                search: search.map(str::to_owned),
            })
            .await
            .map_err(store_error)?
    };
    // A full read may be followed by more.
    let has_more = sessions.len() as u64 == offset + limit;
    let active = active_runs(edge).await?;
    let page: Vec<&Session> = sessions
        .iter()
        .skip(offset as usize)
        .filter(|s| !active_only || active.iter().any(|(k, _)| k == s.key.as_str()))
        .filter(|s| {
            let settings = super::session_settings::settings_of(s);
            let flag = |key: &str| settings.get(key).and_then(Value::as_bool).unwrap_or(false);
            archived.is_none_or(|want| flag("archived") == want)
                && pinned.is_none_or(|want| flag("pinned") == want)
        })
        .collect();
    let mut rows = Vec::with_capacity(page.len());
    for s in page {
        let runs: Vec<String> = active
            .iter()
            .filter(|(k, _)| k == s.key.as_str())
            .map(|(_, r)| r.clone())
            .collect();
        let mut row = session_row(s, &runs);
        if include_titles || include_last {
            add_previews(edge, s, &mut row, include_titles, include_last).await?;
        }
        rows.push(row);
    }
    // `defaults` members are nullable in the schema, so nulls stay there.
    let mut answer = json!({
        "ts": now_ms(), "path": "session-store", "count": rows.len(),
        "totalCount": offset as usize + rows.len() + usize::from(has_more),
        "limitApplied": limit, "offset": offset, "hasMore": has_more,
        "defaults": super::catalog::session_defaults(edge).await?,
        "sessions": rows,
    });
    if has_more {
        answer["nextOffset"] = json!(offset + limit);
    }
    Ok(answer)
}

/// Every active run's `(session key, run id)`.
pub(super) async fn active_runs(
    edge: &Arc<Edge>,
) -> Result<Vec<(String, String)>, (ErrorShape, Option<Value>)> {
    Ok(edge
        .backends
        .coordinator
        .list_active(None)
        .await
        .map_err(backend_error)?
        .into_iter()
        .map(|r| (r.session_key, r.run_id))
        .collect())
}

/// Longest derived title or preview, characters.
const PREVIEW_CHARS: usize = 120;

/// `derivedTitle` (the first user message) and `lastMessagePreview` (the
/// newest user or assistant text), each from a bounded read.
pub(super) async fn add_previews(
    edge: &Arc<Edge>,
    session: &Session,
    row: &mut Value,
    titles: bool,
    last: bool,
) -> Result<(), (ErrorShape, Option<Value>)> {
    let store = &edge.backends.store;
    let read = |cursor| HistoryQuery {
        key: session.key.clone(),
        limit: 8,
        cursor,
        max_chars: Some(4 * PREVIEW_CHARS as u32),
        session_id: None,
    };
    if titles {
        let head = store
            .history(read(HistoryCursor::After(0)))
            .await
            .map_err(store_error)?;
        if let Some(text) = head
            .entries
            .iter()
            .find(|e| e.role == "user")
            .map(|e| text_of(&e.content_json))
        {
            row["derivedTitle"] = json!(preview(&text));
        }
    }
    if last {
        let tail = store
            .history(read(HistoryCursor::Latest))
            .await
            .map_err(store_error)?;
        let newest = tail
            .entries
            .iter()
            .rev()
            .find(|e| e.role == "user" || e.role == "assistant")
            .map(|e| text_of(&e.content_json));
        if let Some(text) = newest.filter(|t| !t.is_empty()) {
            row["lastMessagePreview"] = json!(preview(&text));
        }
    }
    Ok(())
}

/// The text of a transcript entry's content (a string, or text parts).
pub(super) fn text_of(content_json: &str) -> String {
    match serde_json::from_str::<Value>(content_json) {
        Ok(Value::String(text)) => text,
        Ok(Value::Array(parts)) => parts
            .iter()
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    }
}

fn preview(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(PREVIEW_CHARS) {
        Some((end, _)) => format!("{}…", &line[..end]),
        None => line,
    }
}
