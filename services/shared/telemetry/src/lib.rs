//! Observability shared by every clawgate service: logs, OpenTelemetry
//! traces exported over OTLP/gRPC, W3C trace-context propagation as tower
//! layers, and Prometheus metrics.
//!
//! [`init`] reads the standard variables: `RUST_LOG` (log filter, default
//! `info`), `LOG_FORMAT` (`text` or `json`), `OTEL_EXPORTER_OTLP_ENDPOINT` /
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (no endpoint: no exporter, no trace
//! layer, no cost), `OTEL_SDK_DISABLED`, `OTEL_TRACES_EXPORTER=none`,
//! `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER(_ARG)`,
//! `OTEL_BSP_*`, plus `CLAWGATE_TRACE_FILTER` (which spans are exported).

pub mod accept;
pub mod export;
pub mod grpc;
pub mod log_limit;
pub mod log_ring;
mod logs;
pub mod metrics;
pub mod propagation;
pub mod service_auth;
pub mod tls;

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanExporter as _};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

pub use export::ExportCounters;
pub use log_ring::recent_logs;
pub use logs::LogFormat;

/// How long a stopping service waits for its last spans to leave.
pub const SHUTDOWN_FLUSH: Duration = Duration::from_secs(5);

/// The OpenTelemetry pieces services use to shape their own spans (parents
/// across tasks, links, baggage), re-exported so the versions stay one.
pub mod otel {
    pub use opentelemetry::Context;
    pub use opentelemetry::trace::{SpanContext, TraceContextExt};
    pub use tracing_opentelemetry::OpenTelemetrySpanExt;
}
pub use grpc::{
    GrpcClientTraceLayer, GrpcServerTraceLayer, TracedChannel, service_channel, traced_channel,
};
pub use service_auth::access::AccessTable;
pub use service_auth::caller_tokens::{CallerTokenArgs, CallerTokens};
pub use service_auth::{CallerIdentity, CallerKind, ServiceAuthLayer, ServiceTokens};

/// Spans exported unless `CLAWGATE_TRACE_FILTER` says otherwise: the
/// trace-only ones (target `otel::…`: gRPC calls, store operations, run
/// state events) and the services' own spans and the events inside them.
/// Everything is at `info`: a `debug` directive anywhere would lift the
/// process-wide level and make every `debug!` in h2, hyper and tonic pay
/// for a filter check.
const DEFAULT_TRACE_FILTER: &str =
    "otel=info,gateway_edge=info,run_coordinator=info,session_store=info,clawgate=info";

/// Targets of spans and events meant for traces only.
const TRACE_ONLY_TARGET: &str = "otel";

/// The environment variables `init` reads, besides the `OTEL_BSP_*` batch
/// settings ([`ENV_PREFIXES`]): what a deployment may set on any service.
pub const ENV_VARS: &[&str] = &[
    "RUST_LOG",
    "LOG_FORMAT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "CLAWGATE_TRACE_FILTER",
];

/// Prefixes of the variable families `init` reads.
pub const ENV_PREFIXES: &[&str] = &["OTEL_BSP_"];

/// Where spans go, decided from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceSettings {
    /// `service.name` unless `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES` name one.
    pub default_service_name: String,
    /// Whether any exporter is configured.
    pub export: bool,
    pub filter: String,
    pub queue: export::QueueSettings,
}

impl TraceSettings {
    pub fn from_lookup(
        default_service_name: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Self {
        let set = |name: &str| lookup(name).is_some_and(|v| !v.trim().is_empty());
        let disabled = lookup("OTEL_SDK_DISABLED")
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
            || lookup("OTEL_TRACES_EXPORTER")
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("none"));
        let endpoint =
            set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
        Self {
            default_service_name: default_service_name.to_owned(),
            export: endpoint && !disabled,
            filter: lookup("CLAWGATE_TRACE_FILTER")
                .filter(|f| !f.trim().is_empty())
                .unwrap_or_else(|| DEFAULT_TRACE_FILTER.to_owned()),
            queue: export::QueueSettings::from_lookup(&lookup),
        }
    }
}

/// The installed telemetry; shut it down at exit so queued spans leave.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
    flush: Option<export::FlushHandle>,
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports what is queued (at most `limit`), then stops the exporter.
    pub async fn shutdown(self, limit: Duration) {
        if let Some(flush) = &self.flush {
            flush.flush(limit).await;
        }
        if let Some(provider) = self.provider {
            let _ = provider.shutdown();
        }
    }
}

/// Installs logging and, when an OTLP endpoint is configured, tracing for
/// `service` (the default `service.name`). Must run inside a tokio runtime.
/// Panics if a global subscriber is already installed or the exporter
/// configuration is invalid: a service must not start half-observed.
pub fn init(service: &str) -> Telemetry {
    try_init(service).unwrap_or_else(|e| panic!("telemetry set-up failed: {e:#}"))
}

/// [`init`], reporting failures.
pub fn try_init(service: &str) -> anyhow::Result<Telemetry> {
    let settings = TraceSettings::from_lookup(service, |name| std::env::var(name).ok());
    let format = match std::env::var("LOG_FORMAT").as_deref().map(str::trim) {
        Ok("json") => LogFormat::Json,
        Ok("" | "text") | Err(_) => LogFormat::Text,
        Ok(other) => anyhow::bail!("LOG_FORMAT must be text or json, not {other:?}"),
    };
    let log_filter = log_filter(std::env::var("RUST_LOG").ok().as_deref());
    // Colours only for a person at a terminal, never into a log pipeline.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    // Every line also goes to the ring `logs.tail` reads.
    let stdout = log_ring::Teed(std::io::stdout);
    let fmt = logs::layer(format, settings.export, ansi, stdout).with_filter(log_filter);

    propagation::install_propagator();
    let (provider, flush, trace_layer) = if settings.export {
        let filter: Targets = settings
            .filter
            .parse()
            .map_err(|e| anyhow::anyhow!("CLAWGATE_TRACE_FILTER: {e}"))?;
        let (provider, flush) = tracer_provider(&settings)?;
        let layer = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("clawgate"))
            .with_location(false)
            .with_target(false)
            // Nothing here reads `opentelemetry::Context::current()`: spans
            // hand their context on explicitly, so entering a span (every poll
            // of an instrumented future) need not start and attach it.
            .with_context_activation(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_filter(filter);
        (Some(provider), Some(flush), Some(layer))
    } else {
        (None, None, None)
    };
    tracing_subscriber::registry()
        .with(fmt.boxed())
        .with(trace_layer)
        .try_init()?;
    Ok(Telemetry { provider, flush })
}

/// `RUST_LOG` (default `info`), keeping trace-only spans and events out of
/// the logs unless it names them.
fn log_filter(rust_log: Option<&str>) -> EnvFilter {
    let directives = rust_log.filter(|d| !d.trim().is_empty()).unwrap_or("info");
    let filter = EnvFilter::builder().parse_lossy(directives);
    if directives.contains(TRACE_ONLY_TARGET) {
        filter
    } else {
        filter.add_directive(
            format!("{TRACE_ONLY_TARGET}=off")
                .parse()
                .expect("a valid directive"),
        )
    }
}

fn tracer_provider(
    settings: &TraceSettings,
) -> anyhow::Result<(SdkTracerProvider, export::FlushHandle)> {
    let resource = resource(&settings.default_service_name);
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()?;
    exporter.set_resource(&resource);
    let (processor, flush) = export::QueueProcessor::spawn(
        exporter,
        settings.queue.clone(),
        ExportCounters::global().clone(),
    );
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource)
        .build();
    Ok((provider, flush))
}

/// `service.name` from `OTEL_SERVICE_NAME`, else `OTEL_RESOURCE_ATTRIBUTES`,
/// else the service's own name; plus its version and a per-process
/// instance id, so replicas tell apart.
fn resource(default_service_name: &str) -> Resource {
    let named_by_env = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|attrs| {
            attrs
                .split(',')
                .any(|kv| kv.trim().starts_with("service.name="))
        });
    let builder = Resource::builder().with_attributes([
        opentelemetry::KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
        opentelemetry::KeyValue::new(
            "service.instance.id",
            uuid::Uuid::new_v4().simple().to_string(),
        ),
    ]);
    if named_by_env {
        builder.build()
    } else {
        builder
            .with_service_name(default_service_name.to_owned())
            .build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(vars: &[(&str, &str)]) -> TraceSettings {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        TraceSettings::from_lookup("svc", |name| {
            vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn no_endpoint_means_no_exporter() {
        assert!(!settings(&[]).export);
        assert!(!settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]).export);
        assert!(settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")]).export);
        assert!(settings(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4317")]).export);
    }

    #[test]
    fn exporting_can_be_switched_off() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317");
        assert!(!settings(&[endpoint, ("OTEL_SDK_DISABLED", "true")]).export);
        assert!(!settings(&[endpoint, ("OTEL_TRACES_EXPORTER", "none")]).export);
        assert!(settings(&[endpoint, ("OTEL_TRACES_EXPORTER", "otlp")]).export);
    }

    #[test]
    fn the_default_trace_filter_parses() {
        let filter: Result<Targets, _> = settings(&[]).filter.parse();
        assert!(filter.is_ok());
    }
}
