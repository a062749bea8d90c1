//! Presence: who is connected to this edge. `hello-ok.snapshot.presence`
//! holds the gateway itself and its operator connections; a `presence`
//! event with the whole list goes to every connection that may read when
//! one connects or leaves. Presence is per edge replica: each lists its own
//! connections. The list holds at most `--presence-max-entries` connections
//! (the newest), and changes within `COALESCE` go out as one event, so a
//! burst of connects costs one broadcast, not one per connection.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::{Value, json};

use crate::conn::Conn;
use crate::edge::Edge;

/// The presence list: the gateway first, then connections oldest first.
pub fn list(edge: &Arc<Edge>) -> Vec<Value> {
    let host = &edge.hostname;
    let started = edge.started_at_ms;
    let mut entries = vec![json!({
        "host": host, "ip": host, "version": edge.version,
        "platform": std::env::consts::OS, "mode": "gateway", "reason": "self",
        "instanceId": edge.boot_id, "ts": started,
        "text": format!("Gateway: {host} · clawgate {} · mode gateway · reason self", edge.version),
    })];
    let mut conns = edge.connections();
    conns.retain(|c| c.role == "operator");
    conns.sort_by_key(|c| c.id);
    let skip = conns.len().saturating_sub(edge.config.presence_max_entries);
    entries.extend(conns[skip..].iter().map(|c| entry(c)));
    entries
}

fn entry(conn: &Conn) -> Value {
    let client = &conn.client;
    let name = client.display_name.as_deref().unwrap_or(&client.id);
    crate::frames::without_nulls(json!({
        "clientId": client.id, "host": name, "ip": client.ip, "version": client.version,
        "platform": client.platform, "deviceFamily": client.device_family,
        "mode": client.mode, "reason": "connect", "instanceId": client.instance_id,
        "roles": [conn.role], "scopes": conn.scopes,
        "onlineSince": client.connected_at_ms, "ts": client.connected_at_ms,
        "text": format!("{name} · mode {}", client.mode),
    }))
}

/// How long changes are gathered into one `presence` event.
const COALESCE: std::time::Duration = std::time::Duration::from_millis(200);

/// Tells every connection that may read the new list, soon.
pub fn broadcast(edge: &Arc<Edge>) {
    edge.presence_version.fetch_add(1, Ordering::Relaxed);
    if edge.presence_pending.swap(true, Ordering::AcqRel) {
        return;
    }
    let edge = edge.clone();
    tokio::spawn(async move {
        tokio::time::sleep(COALESCE).await;
        edge.presence_pending.store(false, Ordering::Release);
        // Encoded once: the list goes to every connection.
        let payload: Arc<str> = json!({ "presence": list(&edge) }).to_string().into();
        for conn in edge.connections().iter().filter(|c| c.can_read()) {
            conn.outbox.broadcast_encoded("presence", &payload, true);
        }
    });
}
