//! Observability shared by every clawgate service: logs, OpenTelemetry
//! traces exported over OTLP/gRPC, W3C trace-context propagation as tower
//! layers, and Prometheus metrics.

pub mod metrics;
