//! Prometheus metrics: the `/metrics` endpoint and shared helpers.
//!
//! Each service builds its own [`Registry`] with [`service_registry`] (which
//! holds the process's span-export counters), registers its one metrics
//! struct under its prefix (`clawgate_store`, `clawgate_coordinator`,
//! `clawgate_edge`) and serves it with [`serve_metrics`] (or, the edge, on
//! its own HTTP listener with [`response`]).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{ALLOW, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// The content type of the OpenMetrics text exposition.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A service's registry, holding the process-wide span-export counters
/// (`clawgate_trace_spans_{exported,dropped,failed}_total`).
pub fn service_registry() -> Registry {
    let mut registry = Registry::default();
    crate::ExportCounters::global().register(&mut registry);
    registry
}

/// Latency buckets in seconds shared by every service, so that latencies are
/// comparable across them: 50µs doubling up to ~6.6s (18 buckets, then +Inf).
pub fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(50e-6, 2.0, 18)
}

pub fn latency_histogram() -> Histogram {
    Histogram::new(latency_buckets())
}

/// A family of latency histograms labelled by `L`.
pub type LatencyFamily<L> = Family<L, Histogram, fn() -> Histogram>;

pub fn latency_family<L>() -> LatencyFamily<L>
where
    L: Clone + std::hash::Hash + Eq,
{
    Family::new_with_constructor(latency_histogram)
}

/// The registry in the OpenMetrics text format (with the final `# EOF`).
pub fn encode(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry)?;
    Ok(text)
}

/// The HTTP answer to a scrape of `registry`.
pub fn response(registry: &Registry) -> Response<Full<Bytes>> {
    match encode(registry) {
        Ok(text) => {
            let mut response = Response::new(Full::new(Bytes::from(text)));
            response.headers_mut().insert(
                CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(OPENMETRICS_CONTENT_TYPE),
            );
            response
        }
        // Only a failing collector gets here; the scrape fails visibly.
        Err(_) => plain(StatusCode::INTERNAL_SERVER_ERROR, "encoding failed\n"),
    }
}

fn plain(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response
}

fn route(registry: &Registry, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if req.uri().path() != "/metrics" {
        return plain(StatusCode::NOT_FOUND, "not found\n");
    }
    if req.method() != Method::GET {
        let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
        response
            .headers_mut()
            .insert(ALLOW, hyper::header::HeaderValue::from_static("GET"));
        return response;
    }
    response(registry)
}

/// Serves `GET /metrics` on `listener` until `shutdown` resolves; then open
/// connections are dropped (a scrape is cheap to retry).
pub async fn serve_metrics(
    listener: TcpListener,
    registry: Arc<Registry>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let address = listener.local_addr()?;
    tracing::info!(%address, "serving /metrics");
    // Connection tasks live in the set, so returning aborts them all.
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    let mut backoff = crate::accept::AcceptBackoff::default();
    loop {
        let (stream, _) = tokio::select! {
            () = &mut shutdown => return Ok(()),
            Some(_) = connections.join_next() => continue,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    let pause = backoff.failed("metrics", &err);
                    tokio::select! {
                        () = &mut shutdown => return Ok(()),
                        () = tokio::time::sleep(pause) => continue,
                    }
                }
            },
        };
        backoff.accepted();
        let registry = registry.clone();
        connections.spawn(async move {
            let service = service_fn(move |req| {
                let response = route(&registry, &req);
                async move { Ok::<_, Infallible>(response) }
            });
            // A client that never sends a request does not hold a task.
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(30))
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// [`serve_metrics`] in its own task, stopped when this is dropped.
#[must_use = "the server stops when this is dropped"]
pub struct MetricsServer(JoinHandle<anyhow::Result<()>>);

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub fn spawn_metrics_server(listener: TcpListener, registry: Arc<Registry>) -> MetricsServer {
    MetricsServer(tokio::spawn(serve_metrics(
        listener,
        registry,
        std::future::pending(),
    )))
}

/// One HTTP/1.1 answer as read by [`http_request`].
#[derive(Debug)]
pub struct HttpReply {
    pub status: u16,
    pub content_type: Option<String>,
    pub body: String,
}

/// A minimal HTTP/1.1 client for checks and tests: one request with
/// `Connection: close`, the answer read to the end (no chunked encoding).
pub async fn http_request(
    address: SocketAddr,
    method: &str,
    path: &str,
) -> anyhow::Result<HttpReply> {
    let mut stream = TcpStream::connect(address).await?;
    let request =
        format!("{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await?;
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .context("the answer has no header end")?;
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .context("the answer has no status line")?;
    let content_type = lines
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("content-type"))
        .map(|(_, value)| value.trim().to_owned());
    Ok(HttpReply {
        status,
        content_type,
        body: body.to_owned(),
    })
}

/// The value of the sample `name` with exactly `labels` (as written in the
/// exposition, e.g. `{outcome="accepted"}`, or empty) in `text`.
pub fn sample_value(text: &str, name: &str, labels: &str) -> Option<f64> {
    let series = format!("{name}{labels} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&series))
        .and_then(|value| value.split(' ').next()?.parse().ok())
}

#[cfg(test)]
mod tests {
    use prometheus_client::metrics::counter::Counter;

    use super::*;

    async fn server() -> (SocketAddr, Counter, MetricsServer) {
        let counter = Counter::<u64>::default();
        let mut registry = Registry::default();
        registry.sub_registry_with_prefix("clawgate_test").register(
            "things",
            "Things seen",
            counter.clone(),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        (
            address,
            counter,
            spawn_metrics_server(listener, Arc::new(registry)),
        )
    }

    #[tokio::test]
    async fn get_metrics_answers_openmetrics_text() {
        let (address, counter, _server) = server().await;
        counter.inc_by(3);
        let reply = http_request(address, "GET", "/metrics").await.unwrap();
        assert_eq!(reply.status, 200);
        assert_eq!(
            reply.content_type.as_deref(),
            Some(OPENMETRICS_CONTENT_TYPE)
        );
        assert!(reply.body.contains("# TYPE clawgate_test_things counter"));
        assert_eq!(
            sample_value(&reply.body, "clawgate_test_things_total", ""),
            Some(3.0)
        );
        assert!(reply.body.ends_with("# EOF\n"));
    }

    #[tokio::test]
    async fn other_paths_are_not_found() {
        let (address, _, _server) = server().await;
        for path in ["/", "/metric", "/metrics/x", "/healthz"] {
            let reply = http_request(address, "GET", path).await.unwrap();
            assert_eq!(reply.status, 404, "{path}");
        }
    }

    #[tokio::test]
    async fn other_methods_are_not_allowed() {
        let (address, _, _server) = server().await;
        for method in ["POST", "PUT", "DELETE"] {
            let reply = http_request(address, method, "/metrics").await.unwrap();
            assert_eq!(reply.status, 405, "{method}");
        }
    }

    #[tokio::test]
    async fn dropping_the_server_stops_it() {
        let (address, _, server) = server().await;
        drop(server);
        // The listener goes with the aborted task; connecting soon fails.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while http_request(address, "GET", "/metrics").await.is_ok() {
            assert!(tokio::time::Instant::now() < deadline, "still serving");
            tokio::task::yield_now().await;
        }
    }

    #[test]
    fn buckets_span_50us_to_seconds() {
        let buckets: Vec<f64> = latency_buckets().collect();
        assert_eq!(buckets.first(), Some(&50e-6));
        assert!(buckets.last().is_some_and(|b| (5.0..15.0).contains(b)));
        assert!(buckets.windows(2).all(|w| w[0] < w[1]));
    }
}
