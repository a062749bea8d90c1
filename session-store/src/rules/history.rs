//! Which transcript a History call reads, its page window and the bounds
//! on what a page holds.

use crate::model::*;

/// Which transcript a History call reads: `(sessionId, its entry count when
/// the session row knows it)`. `None`: the key has no session and no
/// sessionId was asked for, so the page is empty.
pub fn history_target(
    current: Option<&Session>,
    query: &HistoryQuery,
) -> Option<(SessionId, Option<u64>)> {
    match (query.session_id, current) {
        (Some(asked), Some(current)) if asked == current.session_id => {
            Some((asked, Some(current.entry_count)))
        }
        (Some(asked), _) => Some((asked, None)),
        (None, Some(current)) => Some((current.session_id, Some(current.entry_count))),
        (None, None) => None,
    }
}

/// Builds the page of `query` over a transcript of `total` entries, fetching
/// the seq range `[lower, upper]` (ascending) with `fetch`.
pub fn history_page<E>(
    session_id: SessionId,
    total: u64,
    query: &HistoryQuery,
    fetch: impl FnOnce(u64, u64) -> Result<Vec<TranscriptEntry>, E>,
) -> Result<HistoryPage, E> {
    let (entries, more) = match history_window(query.cursor, query.limit, total) {
        Some((lower, upper, more)) => (fetch(lower, upper)?, more),
        None => (Vec::new(), false),
    };
    Ok(finish_page(
        session_id,
        query.cursor,
        entries,
        more,
        query.max_chars,
        total,
    ))
}

/// Builds a history page from the entries of the window `history_window`
/// chose (ascending seq). The `max_chars` budget is spent walking from the
/// cursor outwards (newest first for Latest/Before, oldest first for After);
/// at least one entry is kept so paging always progresses. `more_beyond` says
/// whether entries remain past the window.
pub fn finish_page(
    session_id: SessionId,
    cursor: HistoryCursor,
    mut entries: Vec<TranscriptEntry>,
    more_beyond: bool,
    max_chars: Option<u32>,
    total: u64,
) -> HistoryPage {
    let walk_backwards = !matches!(cursor, HistoryCursor::After(_));
    let cut =
        max_chars.is_some_and(|budget| keep_within_chars(&mut entries, budget, walk_backwards));
    HistoryPage {
        session_id: Some(session_id),
        entries,
        has_more: more_beyond || cut,
        total,
    }
}

/// Cuts `entries` (ascending seq) to those whose content fits `budget`
/// characters, spent from the newest backwards (`from_newest`) or from the
/// oldest on; at least one entry stays, so paging always progresses.
/// Returns whether any was cut.
pub fn keep_within_chars(
    entries: &mut Vec<TranscriptEntry>,
    budget: u32,
    from_newest: bool,
) -> bool {
    let mut used = 0usize;
    let mut fits = |e: &&TranscriptEntry| {
        used += e.content_json.chars().count();
        used <= budget as usize
    };
    let fitting = match from_newest {
        true => entries.iter().rev().take_while(&mut fits).count(),
        false => entries.iter().take_while(&mut fits).count(),
    };
    let keep = fitting.max(1).min(entries.len());
    let cut = entries.len() - keep;
    match from_newest {
        true => drop(entries.drain(..cut)),
        false => entries.truncate(keep),
    }
    cut > 0
}

/// The seq range `[lower, upper]` a history page covers and whether entries
/// remain beyond it in the paging direction. `None`: nothing to return.
pub fn history_window(cursor: HistoryCursor, limit: u32, total: u64) -> Option<(u64, u64, bool)> {
    let limit = u64::from(limit.max(1));
    match cursor {
        HistoryCursor::Latest | HistoryCursor::Before(_) => {
            let upper = match cursor {
                HistoryCursor::Before(n) => n.saturating_sub(1).min(total),
                _ => total,
            };
            if upper == 0 {
                return None;
            }
            let lower = upper.saturating_sub(limit - 1).max(1);
            Some((lower, upper, lower > 1))
        }
        HistoryCursor::After(n) => {
            if n >= total {
                return None;
            }
            let lower = n + 1;
            let upper = (n + limit).min(total);
            Some((lower, upper, upper < total))
        }
    }
}

/// The seq range StartRun returns as history: up to `limit` entries before
/// the ones it appended (from `first_seq`; 0: it appended none) of a
/// transcript now `total` entries long. `None`: nothing to return.
pub fn start_history_range(first_seq: u64, total: u64, limit: u32) -> Option<(u64, u64)> {
    if limit == 0 {
        return None;
    }
    let cursor = match first_seq {
        0 => HistoryCursor::Latest,
        first => HistoryCursor::Before(first),
    };
    history_window(cursor, limit, total).map(|(lower, upper, _)| (lower, upper))
}
