//! Presence: who is connected to this edge. `hello-ok.snapshot.presence`
//! holds the gateway itself and its operator connections; a `presence`
//! event with the whole list goes to every connection that may read when
//! one leaves (a connect only bumps the version: the newcomer has the list
//! in its `hello-ok`, as with the protocol's own gateway). Presence is per
//! edge replica: each lists its own connections. The list holds at most `--presence-max-entries` connections
//! (the newest), changes within `COALESCE` go out as one event, and the
//! events together take at most `--presence-bytes-per-second`, so a burst of
//! connects costs a few broadcasts, not one per connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde_json::{Value, json};

use super::Events;
use crate::protocol::frames::without_nulls;
use crate::state::Edge;
use crate::state::connection::Conn;

/// Presence's shared state (in [`Events`]).
pub struct Presence {
    /// Bumped at each change (`snapshot.stateVersion.presence`).
    version: AtomicU64,
    /// A `presence` event is scheduled.
    pending: AtomicBool,
}

impl Default for Presence {
    fn default() -> Self {
        Self {
            version: AtomicU64::new(1),
            pending: AtomicBool::new(false),
        }
    }
}

impl Presence {
    /// The presence version now (`hello-ok.snapshot.stateVersion.presence`).
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Relaxed)
    }

    /// A connection joined: the version moves, nothing is sent (the
    /// newcomer reads the list in its `hello-ok`, the others at the next
    /// change).
    pub fn connected(&self) {
        self.version.fetch_add(1, Ordering::AcqRel);
    }
}

/// The presence list `conn` may see: the whole [`list`] with
/// `operator.read`, else only the gateway's own entry (the others' client
/// names, addresses and scopes are for readers).
pub fn list_for(edge: &Arc<Edge>, conn: &Conn) -> Vec<Value> {
    if conn.can_read() {
        list(edge)
    } else {
        vec![own_entry(edge)]
    }
}

fn own_entry(edge: &Edge) -> Value {
    let host = &edge.hostname;
    json!({
        "host": host, "ip": host, "version": edge.version,
        "platform": std::env::consts::OS, "mode": "gateway", "reason": "self",
        "instanceId": edge.boot_id, "ts": edge.started_at_ms,
        "text": format!("Gateway: {host} · clawgate {} · mode gateway · reason self", edge.version),
    })
}

/// The presence list: the gateway first, then connections oldest first.
pub fn list(edge: &Arc<Edge>) -> Vec<Value> {
    let mut entries = vec![own_entry(edge)];
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
    without_nulls(json!({
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

/// Tells every connection that may read the new list, soon. One task at a
/// time sends: it gathers changes for `COALESCE`, sends the list, waits
/// until `--presence-bytes-per-second` has paid for what it sent, and goes
/// round again while changes arrived meanwhile.
pub fn broadcast(edge: &Arc<Edge>, events: &Arc<Events>) {
    let presence = &events.presence;
    presence.version.fetch_add(1, Ordering::AcqRel);
    if presence.pending.swap(true, Ordering::AcqRel) {
        return;
    }
    let (edge, events) = (edge.clone(), events.clone());
    tokio::spawn(async move {
        let presence = &events.presence;
        loop {
            tokio::time::sleep(COALESCE).await;
            let version = presence.version.load(Ordering::Acquire);
            // Encoded once: the list goes to every connection.
            let payload: Arc<str> = json!({ "presence": list(&edge) }).to_string().into();
            let mut sent = 0u64;
            for conn in edge.connections().iter().filter(|c| c.can_read()) {
                conn.outbox.broadcast_encoded("presence", &payload, true);
                sent += payload.len() as u64;
            }
            let budget = edge.config.presence_bytes_per_second.max(1);
            let paid = std::time::Duration::from_secs_f64(sent as f64 / budget as f64);
            tokio::time::sleep(paid.saturating_sub(COALESCE)).await;
            if presence.version.load(Ordering::Acquire) != version {
                continue;
            }
            presence.pending.store(false, Ordering::Release);
            // A change between the check and the store found the task
            // still pending and left it to this one: take it back, unless
            // a new task already has.
            if presence.version.load(Ordering::Acquire) == version
                || presence.pending.swap(true, Ordering::AcqRel)
            {
                return;
            }
        }
    });
}
