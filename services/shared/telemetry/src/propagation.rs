//! W3C trace context (`traceparent`, `tracestate`) and baggage, carried in
//! HTTP/2 headers (gRPC metadata) or in an edge `req` frame.

use opentelemetry::baggage::BaggageExt;
use opentelemetry::propagation::{
    Extractor, Injector, TextMapCompositePropagator, TextMapPropagator,
};
use opentelemetry::trace::TraceContextExt;
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};

/// Baggage keys a server span copies into its attributes. A fixed list: a
/// caller's baggage must not be able to add arbitrary attributes.
pub const RECORDED_BAGGAGE: [&str; 2] = ["run.id", "session.key"];

/// Installs the W3C trace-context + baggage propagator process-wide.
pub fn install_propagator() {
    opentelemetry::global::set_text_map_propagator(TextMapCompositePropagator::new(vec![
        Box::new(TraceContextPropagator::new()),
        Box::new(BaggagePropagator::new()),
    ]));
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

struct HeaderInjector<'a>(&'a mut http::HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(mut value)) = (
            http::HeaderName::from_bytes(key.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            // Every call's trace context is new: as "sensitive" HTTP/2 sends
            // it without indexing, instead of churning the HPACK table and
            // pushing out the headers that do repeat.
            value.set_sensitive(true);
            self.0.insert(name, value);
        }
    }
}

/// The caller's context from request headers (empty when there is none).
pub fn extract(headers: &http::HeaderMap) -> Context {
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.extract(&HeaderExtractor(headers))
    })
}

/// Writes `cx` into request headers for the next hop.
pub fn inject(cx: &Context, headers: &mut http::HeaderMap) {
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(cx, &mut HeaderInjector(headers))
    });
}

/// The remote parent named by a `traceparent` (and optional `tracestate`)
/// string, or `None` when it is not a valid W3C trace parent.
pub fn remote_parent(traceparent: &str, tracestate: Option<&str>) -> Option<Context> {
    let mut headers = http::HeaderMap::new();
    headers.insert("traceparent", traceparent.parse().ok()?);
    if let Some(state) = tracestate.and_then(|s| s.parse().ok()) {
        headers.insert("tracestate", state);
    }
    let cx = TraceContextPropagator::new().extract(&HeaderExtractor(&headers));
    cx.span().span_context().is_valid().then_some(cx)
}

/// `cx` with extra baggage entries, so every hop below it carries them.
pub fn with_baggage<'a>(
    cx: &Context,
    entries: impl IntoIterator<Item = (&'static str, &'a str)>,
) -> Context {
    let mut baggage: Vec<KeyValue> = cx
        .baggage()
        .iter()
        .map(|(key, (value, _))| KeyValue::new(key.clone(), value.to_string()))
        .collect();
    for (key, value) in entries {
        baggage.retain(|kv| kv.key.as_str() != key);
        baggage.push(KeyValue::new(key, value.to_owned()));
    }
    cx.with_baggage(baggage)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_traceparent_becomes_a_remote_parent() {
        let cx = remote_parent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            Some("vendor=1"),
        )
        .expect("valid");
        let parent = cx.span().span_context().clone();
        assert_eq!(
            parent.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(parent.span_id().to_string(), "00f067aa0ba902b7");
        assert!(parent.is_remote() && parent.is_sampled());
        assert_eq!(parent.trace_state().get("vendor"), Some("1"));
    }

    #[test]
    fn invalid_traceparents_are_ignored() {
        for bad in [
            "",
            "garbage",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\n",
        ] {
            assert!(remote_parent(bad, None).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn context_and_baggage_survive_a_header_round_trip() {
        install_propagator();
        let parent = remote_parent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            None,
        )
        .unwrap();
        let cx = with_baggage(
            &parent,
            [("run.id", "run-1"), ("session.key", "agent:main:x")],
        );
        let cx = with_baggage(&cx, [("run.id", "run-2")]);
        let mut headers = http::HeaderMap::new();
        inject(&cx, &mut headers);
        let back = extract(&headers);
        assert_eq!(
            back.span().span_context().trace_id(),
            parent.span().span_context().trace_id()
        );
        assert_eq!(
            back.baggage().get("run.id").map(|v| v.as_str()),
            Some("run-2")
        );
        assert_eq!(
            back.baggage().get("session.key").map(|v| v.as_str()),
            Some("agent:main:x")
        );
    }
}
