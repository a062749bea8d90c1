//! The edge's metrics, registered under `clawgate_edge` and served at
//! `/metrics` on the edge's own listener. Documented in docs/metrics.md.

use std::time::Instant;

use clawgate_telemetry::metrics::{LatencyFamily, latency_family};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// What became of a frame handed to a connection's outbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    Queued,
    /// Did not fit the connection's send budget.
    OverBudget,
    /// The connection is closing or gone.
    Closed,
}

/// The methods whose accepted answer is an ACK (the run was admitted).
const ACK_METHODS: [&str; 2] = ["chat.send", "agent"];

type Labels<const N: usize> = [(&'static str, &'static str); N];

#[derive(Debug)]
pub struct EdgeMetrics {
    connections_open: Gauge,
    connections_accepted: Counter,
    events_sent: Counter,
    events_dropped: Family<Labels<1>, Counter>,
    /// `events_dropped` for `[over_budget, closed]`, resolved once: events
    /// are the edge's hottest path.
    dropped: [Counter; 2],
    slow_consumer_closes: Counter,
    acks: LatencyFamily<Labels<1>>,
    /// `acks` per `ACK_METHODS`, resolved once.
    ack_latency: [Histogram; 2],
    requests: Family<Labels<2>, Counter>,
    sockets_open: Gauge,
    sockets_refused: Family<Labels<2>, Counter>,
    accept_errors: Counter,
    /// Bounded resources of logged-in clients that refused a request, by
    /// limit (its setting's name).
    limits_hit: Family<Labels<1>, Counter>,
}

impl Default for EdgeMetrics {
    fn default() -> Self {
        let events_dropped = Family::<Labels<1>, Counter>::default();
        let dropped = ["over_budget", "closed"]
            .map(|reason| events_dropped.get_or_create_owned(&[("reason", reason)]));
        let acks = latency_family();
        let ack_latency = ACK_METHODS.map(|method| acks.get_or_create_owned(&[("method", method)]));
        Self {
            connections_open: Gauge::default(),
            connections_accepted: Counter::default(),
            events_sent: Counter::default(),
            events_dropped,
            dropped,
            slow_consumer_closes: Counter::default(),
            acks,
            ack_latency,
            requests: Family::default(),
            sockets_open: Gauge::default(),
            sockets_refused: Family::default(),
            accept_errors: Counter::default(),
            limits_hit: Family::default(),
        }
    }
}

impl EdgeMetrics {
    /// Registers the metrics under `clawgate_edge`.
    pub fn register(&self, registry: &mut Registry) {
        let registry = registry.sub_registry_with_prefix("clawgate_edge");
        registry.register(
            "connections_open",
            "Authenticated WebSocket connections open now",
            self.connections_open.clone(),
        );
        registry.register(
            "connections_accepted",
            "WebSocket upgrades accepted (before the handshake)",
            self.connections_accepted.clone(),
        );
        registry.register(
            "events_sent",
            "Event frames queued to a connection",
            self.events_sent.clone(),
        );
        registry.register(
            "events_dropped",
            "Event frames not delivered, by reason (over_budget: the connection's send buffer was full; closed: the connection was closing)",
            self.events_dropped.clone(),
        );
        registry.register(
            "slow_consumer_closes",
            "Connections closed 1008 because a frame that may not be dropped did not fit their send buffer",
            self.slow_consumer_closes.clone(),
        );
        registry.register(
            "ack_duration_seconds",
            "Time from a chat.send or agent request to the response admitting its new run, by method",
            self.acks.clone(),
        );
        registry.register(
            "requests",
            "Requests after the handshake, by method and outcome (ok or the error code)",
            self.requests.clone(),
        );
        registry.register(
            "sockets_open",
            "TCP sockets open now, from accept to close (EDGE_MAX_SOCKETS, EDGE_SOCKETS_PER_IP)",
            self.sockets_open.clone(),
        );
        registry.register(
            "sockets_refused",
            "Sockets refused 503 for a cap, by stage (accept: any socket; upgrade: an unauthenticated WebSocket) and reason (per_address or total)",
            self.sockets_refused.clone(),
        );
        registry.register(
            "accept_errors",
            "Failed accepts on the edge's listener (each followed by a pause of 5 ms doubling to 1 s)",
            self.accept_errors.clone(),
        );
        registry.register(
            "limits_hit",
            "Requests refused because a bounded resource of logged-in clients was full, by the limit's setting",
            self.limits_hit.clone(),
        );
    }

    pub fn socket_opened(&self) {
        self.sockets_open.inc();
    }

    pub fn socket_closed(&self) {
        self.sockets_open.dec();
    }

    /// A socket refused 503 at `stage` (`accept`, `upgrade`) for `reason`.
    pub fn socket_refused(&self, stage: &'static str, reason: &'static str) {
        self.sockets_refused
            .get_or_create(&[("stage", stage), ("reason", reason)])
            .inc();
    }

    pub fn accept_failed(&self) {
        self.accept_errors.inc();
    }

    /// A request refused by the limit `setting` (e.g. `EDGE_MAX_WATCHED_SESSIONS`).
    pub fn limit_hit(&self, setting: &'static str) {
        self.limits_hit.get_or_create(&[("limit", setting)]).inc();
    }

    pub fn connection_accepted(&self) {
        self.connections_accepted.inc();
    }

    pub fn connection_opened(&self) {
        self.connections_open.inc();
    }

    pub fn connection_closed(&self) {
        self.connections_open.dec();
    }

    pub fn event(&self, delivery: Delivery) {
        match delivery {
            Delivery::Queued => self.events_sent.inc(),
            Delivery::OverBudget => self.dropped[0].inc(),
            Delivery::Closed => self.dropped[1].inc(),
        };
    }

    pub fn slow_consumer_closed(&self) {
        self.slow_consumer_closes.inc();
    }

    /// The answer admitting a new run to `method`, a request received at
    /// `received`, is being sent.
    pub fn acked(&self, method: &str, received: Instant) {
        if let Some(index) = ACK_METHODS.iter().position(|m| *m == method) {
            self.ack_latency[index].observe(received.elapsed().as_secs_f64());
        }
    }

    /// One answered request of `method`: a served method's name from the
    /// method table, or `other` for any other (so clients cannot grow the
    /// label set: the caller passes only names it serves).
    pub fn request(&self, method: &'static str, outcome: Result<(), &'static str>) {
        let outcome = outcome.err().unwrap_or("ok");
        self.requests
            .get_or_create(&[("method", method), ("outcome", outcome)])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use clawgate_telemetry::metrics::{encode, sample_value};
    use serde_json::json;

    use super::*;
    use crate::protocol::frames;
    use crate::state::connection::Outbox;

    #[test]
    fn the_outbox_counts_sent_dropped_and_slow_consumer_closes() {
        let metrics = Arc::new(EdgeMetrics::default());
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let payload = json!({ "ts": 1 });
        // Room for one of these events, not two.
        let size = frames::event("tick", &payload, Some(1)).len();
        let (outbox, _reader) = Outbox::new(size + size / 2, metrics.clone());

        assert!(outbox.broadcast("tick", &payload, false));
        assert!(
            !outbox.broadcast("tick", &payload, true),
            "over budget, dropped"
        );
        assert!(!outbox.broadcast("tick", &payload, false), "slow consumer");
        assert!(!outbox.targeted("tick", &payload, true), "closing");
        assert_eq!(outbox.close_order().map(|o| o.code), Some(1008));

        let text = encode(&registry).unwrap();
        let value = |name: &str, labels: &str| sample_value(&text, name, labels).unwrap();
        assert_eq!(value("clawgate_edge_events_sent_total", ""), 1.0);
        let dropped = "clawgate_edge_events_dropped_total";
        // The droppable one and the one that closed the connection.
        assert_eq!(value(dropped, "{reason=\"over_budget\"}"), 2.0);
        assert_eq!(value(dropped, "{reason=\"closed\"}"), 1.0);
        assert_eq!(value("clawgate_edge_slow_consumer_closes_total", ""), 1.0);
    }

    #[test]
    fn requests_count_by_method_and_outcome() {
        let metrics = EdgeMetrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        metrics.request("chat.send", Ok(()));
        metrics.request("other", Err("INVALID_REQUEST"));
        metrics.request("other", Err("INVALID_REQUEST"));

        let text = encode(&registry).unwrap();
        let requests = |labels: &str| sample_value(&text, "clawgate_edge_requests_total", labels);
        assert_eq!(requests("{method=\"chat.send\",outcome=\"ok\"}"), Some(1.0));
        assert_eq!(
            requests("{method=\"other\",outcome=\"INVALID_REQUEST\"}"),
            Some(2.0)
        );
    }
}
