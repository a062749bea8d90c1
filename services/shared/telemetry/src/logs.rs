//! Log lines, human or JSON, that carry the trace id of the span they were
//! written in, so a log line leads to its trace and a trace to its logs.
//! Domain fields such as `run.id` come from the enclosing spans.

use std::fmt;
use std::sync::{Arc, OnceLock};

use opentelemetry::trace::TraceContextExt;
use tracing::dispatcher::WeakDispatch;
use tracing::{Dispatch, Event, Subscriber};
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormattedFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{Layer, Registry};

/// Log output format (`LOG_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// The fmt layer for `format` writing to `writer`; `with_trace_id` when
/// spans are traced, `ansi` for colours (text only).
pub(crate) fn layer<W>(
    format: LogFormat,
    with_trace_id: bool,
    ansi: bool,
    writer: W,
) -> Box<dyn Layer<Registry> + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let dispatch = Arc::new(OnceLock::new());
    let capture = DispatchCapture(dispatch.clone());
    let trace_ids = move |json| TraceIds {
        dispatch: with_trace_id.then(|| dispatch.clone()),
        json,
    };
    let base = tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .with_ansi(ansi && format == LogFormat::Text);
    match format {
        LogFormat::Text => base
            .map_event_format(|inner| WithTraceId {
                inner,
                trace_ids: trace_ids(false),
            })
            .and_then(capture)
            .boxed(),
        LogFormat::Json => base
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .map_event_format(|inner| WithTraceId {
                inner,
                trace_ids: trace_ids(true),
            })
            .and_then(capture)
            .boxed(),
    }
}

/// Remembers the dispatcher the layers are registered with: the trace id
/// of a span is found through it. (`Span::current()` cannot be used while
/// an event is being written: a scoped dispatcher is not re-entered then.)
struct DispatchCapture(Arc<OnceLock<WeakDispatch>>);

impl<S: Subscriber> Layer<S> for DispatchCapture {
    fn on_register_dispatch(&self, dispatch: &Dispatch) {
        let _ = self.0.set(dispatch.downgrade());
    }
}

struct TraceIds {
    /// `None` when traces are off.
    dispatch: Option<Arc<OnceLock<WeakDispatch>>>,
    json: bool,
}

impl TraceIds {
    fn of(&self, span: &tracing::span::Id) -> Option<String> {
        let dispatch = self.dispatch.as_ref()?.get()?.upgrade()?;
        let cx = tracing_opentelemetry::get_otel_context(span, &dispatch)?;
        let otel_span = cx.span();
        let span_context = otel_span.span_context();
        span_context
            .is_valid()
            .then(|| span_context.trace_id().to_string())
    }
}

/// Adds `trace_id` to every line written inside a traced span.
struct WithTraceId<F> {
    inner: F,
    trace_ids: TraceIds,
}

impl<S, N, F> FormatEvent<S, N> for WithTraceId<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
    FormattedFields<N>: 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let trace_id = ctx
            .lookup_current()
            .and_then(|span| self.trace_ids.of(&span.id()));
        let Some(trace_id) = trace_id else {
            return self.inner.format_event(ctx, writer, event);
        };
        if !self.trace_ids.json {
            write!(writer, "trace_id={trace_id} ")?;
            return self.inner.format_event(ctx, writer, event);
        }
        // The JSON object is complete once written: format it aside and
        // open it with the trace id.
        let mut line = String::new();
        self.inner
            .format_event(ctx, Writer::new(&mut line), event)?;
        match line.strip_prefix('{') {
            Some(rest) => write!(writer, "{{\"trace_id\":\"{trace_id}\",{rest}"),
            None => writer.write_str(&line),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TracerProvider as _;
    use std::sync::{Arc, Mutex};
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    use tracing_subscriber::layer::SubscriberExt;

    /// Log output captured in memory.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Logs one line inside a traced span and one outside; returns the
    /// output and the span's trace id.
    fn log_lines(json: bool) -> (String, String) {
        let captured = Captured::default();
        let writer = captured.clone();
        let format = if json {
            LogFormat::Json
        } else {
            LogFormat::Text
        };
        let fmt = layer(format, true, false, move || writer.clone());
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(fmt)
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        let trace_id = tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("run.execute", run.id = "r-1");
            let trace_id = span.context().span().span_context().trace_id().to_string();
            span.in_scope(|| tracing::info!("inside"));
            tracing::info!("outside");
            trace_id
        });
        let output = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        (output, trace_id)
    }

    #[test]
    fn text_lines_in_a_span_start_with_its_trace_id() {
        let (output, trace_id) = log_lines(false);
        let lines: Vec<&str> = output.lines().collect();
        assert_eq!(lines.len(), 2, "{output}");
        assert!(
            lines[0].starts_with(&format!("trace_id={trace_id} ")),
            "{output}"
        );
        assert!(lines[0].contains("run.id=\"r-1\""), "{output}");
        assert!(!lines[1].contains("trace_id"), "{output}");
    }

    #[test]
    fn json_lines_in_a_span_carry_its_trace_id() {
        let (output, trace_id) = log_lines(true);
        let lines: Vec<serde_json::Value> = output
            .lines()
            .map(|line| serde_json::from_str(line).expect("one JSON object per line"))
            .collect();
        assert_eq!(lines.len(), 2, "{output}");
        assert_eq!(lines[0]["trace_id"], trace_id.as_str(), "{output}");
        assert_eq!(lines[0]["span"]["run.id"], "r-1", "{output}");
        assert!(lines[1].get("trace_id").is_none(), "{output}");
    }
}
