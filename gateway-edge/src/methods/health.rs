//! `health`, `status`, and the periodic `health` event.

use std::sync::Arc;
use std::time::Duration;

use clawgate_common::clock::now_ms;
use serde_json::{Value, json};
use session_store_api::SessionStore;
use session_store_api::model::ListQuery;

use super::{Answer, fail, store_error};
use crate::protocol::frames::ErrorShape;
use crate::state::Edge;

pub(super) async fn health(edge: &Arc<Edge>) -> Answer {
    health_summary(edge).await.map_err(fail)
}

/// The `health` payload (also broadcast as the `health` event).
pub async fn health_summary(edge: &Arc<Edge>) -> Result<Value, ErrorShape> {
    let started = now_ms();
    let sessions = edge
        .backends
        .store
        .list_sessions(ListQuery {
            limit: 5,
            ..ListQuery::default()
        })
        .await
        .map_err(|e| ErrorShape::unavailable(e.to_string()))?;
    let recent: Vec<Value> = sessions
        .iter()
        .map(|s| json!({ "key": s.key.as_str(), "updatedAt": s.updated_at_ms, "age": now_ms() - s.updated_at_ms }))
        .collect();
    Ok(json!({
        "ok": true, "ts": now_ms(), "durationMs": now_ms() - started,
        "channels": {}, "channelOrder": [], "channelLabels": {},
        "heartbeatSeconds": 0, "defaultAgentId": "main",
        "agents": [{ "agentId": "main", "isDefault": true }],
        "sessions": { "path": "session-store", "count": recent.len(), "recent": recent },
    }))
}

/// Broadcasts the `health` event to every connection that may read, every
/// `interval`, for as long as the edge runs.
pub async fn broadcast_health(edge: Arc<Edge>, interval: Duration) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        if let Ok(summary) = health_summary(&edge).await {
            let summary: Arc<str> = summary.to_string().into();
            for conn in edge.connections().iter().filter(|c| c.can_read()) {
                conn.outbox.broadcast_encoded("health", &summary, false);
            }
        }
    }
}

pub(super) async fn status(edge: &Arc<Edge>) -> Answer {
    let sessions = edge
        .backends
        .store
        .list_sessions(ListQuery {
            limit: 10,
            ..ListQuery::default()
        })
        .await
        .map_err(store_error)?;
    let recent: Vec<Value> = sessions
        .iter()
        .map(|s| json!({ "key": s.key.as_str(), "updatedAt": s.updated_at_ms, "sessionId": s.session_id.to_string() }))
        .collect();
    Ok(json!({
        "runtimeVersion": edge.version,
        "heartbeat": { "defaultAgentId": "main", "agents": [] },
        "channelSummary": [],
        "queuedSystemEvents": [],
        "sessions": {
            "paths": [], "count": recent.len(),
            "defaults": { "model": null, "contextTokens": null },
            "recent": recent, "byAgent": [],
        },
    }))
}
