//! Log lines, human or JSON, that carry the trace id of the span they were
//! written in, so a log line leads to its trace and a trace to its logs.
//! Domain fields such as `run.id` come from the enclosing spans.

use std::fmt;

use opentelemetry::trace::TraceContextExt;
use tracing::{Event, Subscriber};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormattedFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{Layer, Registry};

use crate::LogFormat;

/// The fmt layer for `format`; `with_trace_id` when spans are traced.
pub(crate) fn layer(
    format: LogFormat,
    with_trace_id: bool,
) -> Box<dyn Layer<Registry> + Send + Sync> {
    let base = tracing_subscriber::fmt::layer();
    match format {
        LogFormat::Text => base
            .map_event_format(|inner| TraceIdFormat {
                inner,
                with_trace_id,
                json: false,
            })
            .boxed(),
        LogFormat::Json => base
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .map_event_format(|inner| TraceIdFormat {
                inner,
                with_trace_id,
                json: true,
            })
            .boxed(),
    }
}

/// Adds `trace_id` to every line written inside a traced span.
struct TraceIdFormat<F> {
    inner: F,
    with_trace_id: bool,
    json: bool,
}

fn current_trace_id() -> Option<String> {
    let cx = tracing::Span::current().context();
    let span = cx.span();
    let span_context = span.span_context();
    span_context
        .is_valid()
        .then(|| span_context.trace_id().to_string())
}

impl<S, N, F> FormatEvent<S, N> for TraceIdFormat<F>
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
        let trace_id = if self.with_trace_id {
            current_trace_id()
        } else {
            None
        };
        let Some(trace_id) = trace_id else {
            return self.inner.format_event(ctx, writer, event);
        };
        if !self.json {
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
