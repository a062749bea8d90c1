//! An OTLP/gRPC trace collector inside the test process. The services
//! export to it like to any collector (`OTEL_EXPORTER_OTLP_ENDPOINT`); it
//! keeps every span with the resource (`service.name`) and the scope it came
//! with, and lets tests wait for, query and print what arrived.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::ops::Deref;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
pub use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;

/// One received span with where it came from.
#[derive(Debug, Clone)]
pub struct ExportedSpan {
    /// The resource's `service.name` (empty when the exporter sent none).
    pub service: String,
    /// Every resource attribute.
    pub resource: Vec<KeyValue>,
    /// The instrumentation scope's name.
    pub scope: String,
    pub span: Span,
}

impl ExportedSpan {
    pub fn name(&self) -> &str {
        &self.span.name
    }

    /// The trace id, lower-case hex (32 digits).
    pub fn trace_id(&self) -> String {
        hex(&self.span.trace_id)
    }

    /// The span id, lower-case hex (16 digits).
    pub fn span_id(&self) -> String {
        hex(&self.span.span_id)
    }

    /// The parent's span id in hex; `None` for a root span.
    pub fn parent_span_id(&self) -> Option<String> {
        (!self.span.parent_span_id.is_empty()).then(|| hex(&self.span.parent_span_id))
    }

    pub fn kind(&self) -> SpanKind {
        SpanKind::try_from(self.span.kind).unwrap_or(SpanKind::Unspecified)
    }

    /// The value of attribute `key`, if the span has it.
    pub fn attribute(&self, key: &str) -> Option<&AnyValue> {
        find_attribute(&self.span.attributes, key)
    }

    /// The value of a string attribute.
    pub fn str_attribute(&self, key: &str) -> Option<&str> {
        match self.attribute(key)? {
            AnyValue::StringValue(value) => Some(value),
            _ => None,
        }
    }

    /// The value of an integer attribute.
    pub fn int_attribute(&self, key: &str) -> Option<i64> {
        match self.attribute(key)? {
            AnyValue::IntValue(value) => Some(*value),
            _ => None,
        }
    }

    /// Whether attribute `key` is present with exactly `expected` (type and
    /// value: the string "1" is not the integer 1).
    pub fn has_attribute(&self, key: &str, expected: impl Into<AttrValue>) -> bool {
        self.attribute(key)
            .is_some_and(|value| expected.into().matches(value))
    }

    /// The (trace id, span id) of every link, in hex.
    pub fn links(&self) -> Vec<(String, String)> {
        self.span
            .links
            .iter()
            .map(|link| (hex(&link.trace_id), hex(&link.span_id)))
            .collect()
    }

    /// Whether one of this span's links points at `other`.
    pub fn links_to(&self, other: &ExportedSpan) -> bool {
        let target = (other.trace_id(), other.span_id());
        self.links().contains(&target)
    }

    /// The names of the span's events, in order.
    pub fn event_names(&self) -> Vec<&str> {
        self.span.events.iter().map(|e| e.name.as_str()).collect()
    }
}

/// An attribute value a test expects.
#[derive(Debug, Clone, PartialEq)]
pub enum AttrValue {
    Str(String),
    Int(i64),
    Bool(bool),
}

impl AttrValue {
    fn matches(&self, value: &AnyValue) -> bool {
        match (self, value) {
            (Self::Str(want), AnyValue::StringValue(got)) => want == got,
            (Self::Int(want), AnyValue::IntValue(got)) => want == got,
            (Self::Bool(want), AnyValue::BoolValue(got)) => want == got,
            _ => false,
        }
    }
}

impl From<&str> for AttrValue {
    fn from(value: &str) -> Self {
        Self::Str(value.to_owned())
    }
}

impl From<String> for AttrValue {
    fn from(value: String) -> Self {
        Self::Str(value)
    }
}

impl From<i64> for AttrValue {
    fn from(value: i64) -> Self {
        Self::Int(value)
    }
}

impl From<bool> for AttrValue {
    fn from(value: bool) -> Self {
        Self::Bool(value)
    }
}

/// A set of received spans (in arrival order) with the queries tests need.
/// Dereferences to a slice for everything else.
#[derive(Debug, Clone, Default)]
pub struct Spans(Vec<ExportedSpan>);

impl Deref for Spans {
    type Target = [ExportedSpan];

    fn deref(&self) -> &[ExportedSpan] {
        &self.0
    }
}

impl<'a> IntoIterator for &'a Spans {
    type Item = &'a ExportedSpan;
    type IntoIter = std::slice::Iter<'a, ExportedSpan>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl FromIterator<ExportedSpan> for Spans {
    fn from_iter<I: IntoIterator<Item = ExportedSpan>>(spans: I) -> Self {
        Spans(spans.into_iter().collect())
    }
}

impl Spans {
    /// The spans for which `keep` holds.
    pub fn filter(&self, keep: impl Fn(&ExportedSpan) -> bool) -> Spans {
        self.0.iter().filter(|s| keep(s)).cloned().collect()
    }

    /// The spans of one trace (`trace_id` in hex).
    pub fn of_trace(&self, trace_id: &str) -> Spans {
        self.filter(|s| s.trace_id() == trace_id)
    }

    pub fn named(&self, name: &str) -> Spans {
        self.filter(|s| s.name() == name)
    }

    pub fn of_kind(&self, kind: SpanKind) -> Spans {
        self.filter(|s| s.kind() == kind)
    }

    /// The spans whose resource `service.name` is `service`.
    pub fn of_service(&self, service: &str) -> Spans {
        self.filter(|s| s.service == service)
    }

    pub fn with_attribute(&self, key: &str, value: impl Into<AttrValue>) -> Spans {
        let value = value.into();
        self.filter(|s| s.has_attribute(key, value.clone()))
    }

    /// The span with id `span_id` (hex), if present.
    pub fn by_id(&self, span_id: &str) -> Option<&ExportedSpan> {
        self.0.iter().find(|s| s.span_id() == span_id)
    }

    /// The distinct `service.name`s.
    pub fn services(&self) -> BTreeSet<&str> {
        self.0.iter().map(|s| s.service.as_str()).collect()
    }

    /// The distinct trace ids (hex).
    pub fn trace_ids(&self) -> BTreeSet<String> {
        self.0.iter().map(ExportedSpan::trace_id).collect()
    }

    /// A readable listing for assertion messages: per trace, the spans as a
    /// tree (children indented under their parent, by start time), each with
    /// service, kind, ids, attributes, links and events. A span whose parent
    /// did not arrive is listed as a root, marked `parent missing`.
    pub fn dump(&self) -> String {
        let mut traces: BTreeMap<String, Vec<&ExportedSpan>> = BTreeMap::new();
        for span in &self.0 {
            traces.entry(span.trace_id()).or_default().push(span);
        }
        let mut out = String::new();
        for (trace_id, mut spans) in traces {
            spans.sort_by_key(|s| s.span.start_time_unix_nano);
            let _ = writeln!(out, "trace {trace_id} ({} spans)", spans.len());
            let ids: BTreeSet<String> = spans.iter().map(|s| s.span_id()).collect();
            let mut children: HashMap<String, Vec<&ExportedSpan>> = HashMap::new();
            let mut roots = Vec::new();
            for span in spans {
                match span.parent_span_id() {
                    Some(parent) if ids.contains(&parent) => {
                        children.entry(parent).or_default().push(span)
                    }
                    _ => roots.push(span),
                }
            }
            for root in roots {
                dump_tree(&mut out, root, &children, 1);
            }
        }
        if out.is_empty() {
            out.push_str("(no spans)\n");
        }
        out
    }
}

fn dump_tree(
    out: &mut String,
    span: &ExportedSpan,
    children: &HashMap<String, Vec<&ExportedSpan>>,
    depth: usize,
) {
    let indent = "  ".repeat(depth);
    let parent = match span.parent_span_id() {
        None => "-".to_owned(),
        Some(id) if depth == 1 => format!("{id} (parent missing)"),
        Some(id) => id,
    };
    let _ = writeln!(
        out,
        "{indent}{} [{} {:?}] span={} parent={parent}",
        span.name(),
        span.service,
        span.kind(),
        span.span_id(),
    );
    if !span.span.attributes.is_empty() {
        let _ = writeln!(out, "{indent}    attrs: {}", render(&span.span.attributes));
    }
    for (trace_id, span_id) in span.links() {
        let _ = writeln!(out, "{indent}    link: trace={trace_id} span={span_id}");
    }
    for event in &span.span.events {
        let _ = writeln!(
            out,
            "{indent}    event: {} {{{}}}",
            event.name,
            render(&event.attributes)
        );
    }
    for child in children.get(&span.span_id()).into_iter().flatten() {
        dump_tree(out, child, children, depth + 1);
    }
}

/// `key=value` pairs, strings quoted so `"1"` and `1` stay distinct.
fn render(attributes: &[KeyValue]) -> String {
    let pairs: Vec<String> = attributes
        .iter()
        .map(|kv| {
            let value = kv.value.as_ref().and_then(|v| v.value.as_ref());
            let shown = match value {
                Some(AnyValue::StringValue(s)) => format!("{s:?}"),
                Some(AnyValue::IntValue(i)) => i.to_string(),
                Some(AnyValue::BoolValue(b)) => b.to_string(),
                Some(AnyValue::DoubleValue(d)) => d.to_string(),
                Some(other) => format!("{other:?}"),
                None => "<none>".to_owned(),
            };
            format!("{}={shown}", kv.key)
        })
        .collect();
    pairs.join(" ")
}

fn find_attribute<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a AnyValue> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What the gRPC service shares with the receiver handle.
struct Collected {
    spans: Mutex<Vec<ExportedSpan>>,
    /// How many spans were received; waiters watch it instead of sleeping.
    count: watch::Sender<usize>,
}

#[tonic::async_trait]
impl TraceService for Collected {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut received = Vec::new();
        for resource_spans in request.into_inner().resource_spans {
            let resource = resource_spans
                .resource
                .map(|r| r.attributes)
                .unwrap_or_default();
            let service = match find_attribute(&resource, "service.name") {
                Some(AnyValue::StringValue(name)) => name.clone(),
                _ => String::new(),
            };
            for scope_spans in resource_spans.scope_spans {
                let scope = scope_spans.scope.map(|s| s.name).unwrap_or_default();
                received.extend(scope_spans.spans.into_iter().map(|span| ExportedSpan {
                    service: service.clone(),
                    resource: resource.clone(),
                    scope: scope.clone(),
                    span,
                }));
            }
        }
        let total = {
            let mut spans = self.spans.lock().unwrap();
            spans.extend(received);
            spans.len()
        };
        self.count.send_replace(total);
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// The collector: an OTLP/gRPC `TraceService` on 127.0.0.1, port chosen by
/// the system. Stops when dropped.
pub struct TraceReceiver {
    address: SocketAddr,
    collected: Arc<Collected>,
    server: tokio::task::JoinHandle<()>,
}

impl TraceReceiver {
    /// Binds and starts serving; the port accepts connections on return.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the OTLP receiver");
        let address = listener.local_addr().expect("receiver address");
        let collected = Arc::new(Collected {
            spans: Mutex::new(Vec::new()),
            count: watch::Sender::new(0),
        });
        let service = TraceServiceServer::from_arc(collected.clone());
        let server = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await
                .expect("the OTLP receiver failed");
        });
        Self {
            address,
            collected,
            server,
        }
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The value for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Spans {
        Spans(self.collected.spans.lock().unwrap().clone())
    }

    /// The spans of one trace received so far.
    pub fn trace(&self, trace_id: &str) -> Spans {
        self.spans().of_trace(trace_id)
    }

    /// Waits until `ready` holds for the spans received, re-checking on
    /// every export; returns those spans, or `None` once `timeout` passed.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        mut ready: impl FnMut(&Spans) -> bool,
    ) -> Option<Spans> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut count = self.collected.count.subscribe();
        loop {
            // Marked seen before reading, so an export landing between the
            // check and the wait still wakes the wait.
            count.borrow_and_update();
            let spans = self.spans();
            if ready(&spans) {
                return Some(spans);
            }
            match tokio::time::timeout_at(deadline, count.changed()).await {
                Ok(Ok(())) => {}
                // The sender lives in `self`: only the deadline ends the wait.
                Ok(Err(_)) | Err(_) => return None,
            }
        }
    }

    /// Every span received so far, listed for a failure message.
    pub fn dump(&self) -> String {
        self.spans().dump()
    }
}

impl Drop for TraceReceiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Spans made up by hand, for the crate's own tests.
#[cfg(test)]
pub(crate) mod fake {
    use opentelemetry_proto::tonic::common::v1::AnyValue as Value;

    use super::*;

    pub fn attribute(key: &str, value: AnyValue) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(Value { value: Some(value) }),
            ..KeyValue::default()
        }
    }

    /// A span of trace `ab…ab` with id `id` repeated 8 times, started at
    /// `id` ns.
    pub fn span(name: &str, id: u8, parent: Option<u8>, kind: SpanKind) -> Span {
        Span {
            trace_id: vec![0xab; 16],
            span_id: vec![id; 8],
            parent_span_id: parent.map(|p| vec![p; 8]).unwrap_or_default(),
            name: name.into(),
            kind: kind as i32,
            start_time_unix_nano: u64::from(id),
            ..Span::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
    use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::span::Link;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};

    use super::fake::{attribute, span};
    use super::*;

    fn export(service: &str, spans: Vec<Span>) -> ResourceSpans {
        ResourceSpans {
            resource: Some(Resource {
                attributes: vec![attribute(
                    "service.name",
                    AnyValue::StringValue(service.into()),
                )],
                ..Resource::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "test-scope".into(),
                    ..InstrumentationScope::default()
                }),
                spans,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }
    }

    #[tokio::test]
    async fn keeps_exported_spans_with_their_service_and_answers_queries() {
        let receiver = TraceReceiver::start().await;
        let mut root = span("chat.send", 1, None, SpanKind::Server);
        root.attributes = vec![
            attribute("run.id", AnyValue::StringValue("r1".into())),
            attribute("attempt", AnyValue::IntValue(1)),
        ];
        let mut child = span("run.execute", 2, Some(1), SpanKind::Internal);
        child.links = vec![Link {
            trace_id: vec![0xcd; 16],
            span_id: vec![9; 8],
            ..Link::default()
        }];
        let mut client = TraceServiceClient::connect(receiver.endpoint())
            .await
            .unwrap();
        client
            .export(ExportTraceServiceRequest {
                resource_spans: vec![
                    export("edge", vec![root]),
                    export("coordinator", vec![child]),
                ],
            })
            .await
            .unwrap();

        let spans = receiver
            .wait_for(Duration::from_secs(10), |s| s.len() == 2)
            .await
            .expect("both spans arrive");
        assert_eq!(spans.services(), BTreeSet::from(["coordinator", "edge"]));
        let trace_id = "ab".repeat(16);
        assert_eq!(spans.trace_ids(), BTreeSet::from([trace_id.clone()]));
        assert_eq!(receiver.trace(&trace_id).len(), 2);

        let root = &spans.with_attribute("run.id", "r1")[0];
        assert_eq!(root.name(), "chat.send");
        assert_eq!(root.scope, "test-scope");
        assert_eq!(root.kind(), SpanKind::Server);
        assert_eq!(root.parent_span_id(), None);
        assert_eq!(root.int_attribute("attempt"), Some(1));
        assert!(!root.has_attribute("attempt", "1"), "types are compared");
        assert!(spans.with_attribute("attempt", 2).is_empty());

        let child = &spans.named("run.execute")[0];
        assert_eq!(child.service, "coordinator");
        assert_eq!(child.parent_span_id(), Some("01".repeat(8)));
        assert_eq!(child.links(), vec![("cd".repeat(16), "09".repeat(8))]);
        assert!(spans.by_id(&"01".repeat(8)).is_some());

        let dump = spans.dump();
        assert!(
            dump.contains("run.execute [coordinator Internal]"),
            "{dump}"
        );
        assert!(dump.contains(r#"run.id="r1""#), "{dump}");
        assert!(
            dump.contains(&format!("link: trace={}", "cd".repeat(16))),
            "{dump}"
        );
    }

    #[tokio::test]
    async fn wait_for_gives_up_at_the_deadline() {
        let receiver = TraceReceiver::start().await;
        let waited = receiver
            .wait_for(Duration::from_millis(50), |s| !s.is_empty())
            .await;
        assert!(waited.is_none());
        assert_eq!(receiver.dump(), "(no spans)\n");
    }
}
