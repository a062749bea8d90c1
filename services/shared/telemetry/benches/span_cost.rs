//! What one span costs the thread that makes it: a span with a few fields,
//! entered, a child's context injected into headers (what the gRPC client
//! layer does), and closed — with no trace layer, and with the trace layer
//! feeding the export queue of a collector that is down. Numbers for
//! docs/benchmarks.md. Run: `cargo bench -p clawgate-telemetry --bench span_cost`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use clawgate_telemetry::export::{ExportCounters, QueueProcessor, QueueSettings};
use clawgate_telemetry::otel::OpenTelemetrySpanExt;
use clawgate_telemetry::propagation;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use tracing_subscriber::layer::SubscriberExt;

#[derive(Debug)]
struct DeadCollector;

impl SpanExporter for DeadCollector {
    async fn export(&self, _batch: Vec<SpanData>) -> OTelSdkResult {
        Err(OTelSdkError::InternalFailure("connection refused".into()))
    }
}

fn one_request() {
    let span = tracing::info_span!("run.admit", run.id = "r-1", session.key = "agent:main:x");
    let _entered = span.enter();
    let child = tracing::info_span!(target: "otel::grpc", "grpc.client",
        otel.kind = "client", rpc.system.name = "grpc", rpc.method = "a.B/C");
    let mut headers = http::HeaderMap::new();
    if !child.is_disabled() {
        propagation::inject(&child.context(), &mut headers);
    }
    black_box(headers);
}

/// One call through the server trace layer: context extracted from the
/// headers, a SERVER span, a body that ends with `grpc-status` trailers.
fn one_server_call(runtime: &tokio::runtime::Runtime, headers: &http::HeaderMap) {
    use http_body_util::BodyExt;
    use tower::{Layer, Service};
    let inner = tower::service_fn(|_request: http::Request<()>| async {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        let body = http_body_util::StreamBody::new(futures::stream::iter([
            Ok::<_, std::convert::Infallible>(http_body::Frame::data(bytes::Bytes::from_static(
                b"x",
            ))),
            Ok(http_body::Frame::trailers(trailers)),
        ]));
        Ok::<_, std::convert::Infallible>(http::Response::new(body))
    });
    let mut service = clawgate_telemetry::GrpcServerTraceLayer.layer(inner);
    let mut request = http::Request::new(());
    *request.uri_mut() = "/clawgate.session_store.v1.SessionStore/Append"
        .parse()
        .unwrap();
    *request.headers_mut() = headers.clone();
    runtime.block_on(async {
        let response = service.call(request).await.unwrap();
        black_box(response.into_body().collect().await.unwrap());
    });
}

fn per_server_call(runtime: &tokio::runtime::Runtime, rounds: u32) -> Duration {
    let mut headers = http::HeaderMap::new();
    headers.insert(
        "traceparent",
        http::HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    );
    headers.insert(
        "baggage",
        http::HeaderValue::from_static("run.id=r-1,session.key=agent%3Amain%3Ax"),
    );
    let started = Instant::now();
    for _ in 0..rounds {
        one_server_call(runtime, &headers);
    }
    started.elapsed() / rounds
}

fn per_span(rounds: u32) -> Duration {
    let started = Instant::now();
    for _ in 0..rounds {
        one_request();
    }
    started.elapsed() / (rounds * 2)
}

/// Logs as the services filter them: `info`, trace-only targets off.
fn logs<S>() -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::Layer;
    tracing_subscriber::fmt::layer()
        .with_writer(std::io::sink)
        .with_filter(tracing_subscriber::EnvFilter::new("info,otel=off"))
}

fn main() {
    let rounds = if std::env::args().any(|a| a == "--bench") {
        200_000
    } else {
        1_000
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let _guard = runtime.enter();
    propagation::install_propagator();

    let off = tracing_subscriber::registry().with(logs());
    let (off_cost, off_call) = tracing::subscriber::with_default(off, || {
        (per_span(rounds), per_server_call(&runtime, rounds / 4))
    });

    let (processor, _flush) = QueueProcessor::spawn(
        DeadCollector,
        QueueSettings::default(),
        ExportCounters::default(),
    );
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .build();
    let on = tracing_subscriber::registry().with(logs()).with(
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("bench"))
            .with_context_activation(false),
    );
    let (on_cost, on_call) = tracing::subscriber::with_default(on, || {
        (per_span(rounds), per_server_call(&runtime, rounds / 4))
    });
    println!("| tracing | per span | per call through the server layer |\n|---|---|---|");
    println!("| off (logs only) | {off_cost:?} | {off_call:?} |");
    println!("| on, collector down | {on_cost:?} | {on_call:?} |");
}
