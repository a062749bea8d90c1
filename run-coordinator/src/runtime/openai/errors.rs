//! Backoff, and errors classified by kind and retryability (the table in
//! the module's doc).

use super::*;

/// The delay before retry number `retry + 1` (so `retry` 0 is the first).
pub(super) fn backoff_delay(
    config: &OpenAiConfig,
    retry: u32,
    retry_after: Option<Duration>,
) -> Duration {
    let exponential = || {
        let factor = 1u32.checked_shl(retry).unwrap_or(u32::MAX);
        config.initial_backoff.saturating_mul(factor)
    };
    retry_after
        .unwrap_or_else(exponential)
        .min(config.max_backoff)
}

/// The server's requested delay: `retry-after-ms`, else `Retry-After` in
/// (possibly fractional) seconds. HTTP dates are ignored.
pub(super) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let number = |name: &str| -> Option<f64> {
        let value: f64 = headers.get(name)?.to_str().ok()?.trim().parse().ok()?;
        (value.is_finite() && value >= 0.0).then_some(value)
    };
    if let Some(ms) = number("retry-after-ms") {
        return Duration::try_from_secs_f64(ms / 1000.0).ok();
    }
    number(RETRY_AFTER.as_str()).and_then(|secs| Duration::try_from_secs_f64(secs).ok())
}

/// An error and its causes, on one line.
pub(super) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            let _ = write!(text, ": {cause_text}");
        }
        source = cause.source();
    }
    text
}

pub(super) fn truncate(text: &str, limit: usize) -> String {
    let text = text.trim();
    match text.char_indices().nth(limit) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_owned(),
    }
}

/// What an error body or an in-stream `error` object says.
#[derive(Debug, Default)]
pub(super) struct ErrorDetail {
    pub(super) message: String,
    pub(super) code: String,
    pub(super) kind: String,
    /// Lowercase text to search for hints.
    pub(super) haystack: String,
}

impl ErrorDetail {
    pub(super) fn from_body(body: &str) -> Self {
        match serde_json::from_str::<Value>(body) {
            Ok(value) => {
                let mut detail = Self::from_value(&value);
                if detail.message.is_empty() && detail.code.is_empty() && detail.kind.is_empty() {
                    detail.message = truncate(body, ERROR_MESSAGE_LIMIT);
                }
                detail.haystack = format!("{} {}", detail.haystack, body.to_lowercase());
                detail
            }
            Err(_) => Self {
                message: truncate(body, ERROR_MESSAGE_LIMIT),
                haystack: body.to_lowercase(),
                ..Self::default()
            },
        }
    }

    pub(super) fn from_value(value: &Value) -> Self {
        let scalar = |v: Option<&Value>| match v {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            _ => String::new(),
        };
        match value {
            Value::Array(items) => items.first().map(Self::from_value).unwrap_or_default(),
            Value::String(message) => Self {
                message: message.clone(),
                haystack: message.to_lowercase(),
                ..Self::default()
            },
            Value::Object(object) => {
                if let Some(inner) = object.get("error").filter(|e| !e.is_null()) {
                    return Self::from_value(inner);
                }
                let message = scalar(object.get("message"));
                let code = scalar(object.get("code"));
                let kind = scalar(object.get("type"));
                let haystack = format!("{message} {code} {kind}").to_lowercase();
                Self {
                    message,
                    code,
                    kind,
                    haystack,
                }
            }
            _ => Self::default(),
        }
    }

    pub(super) fn summary(&self) -> String {
        let mut text = truncate(&self.message, ERROR_MESSAGE_LIMIT);
        let tags: Vec<&str> = [self.code.as_str(), self.kind.as_str()]
            .into_iter()
            .filter(|t| !t.is_empty())
            .collect();
        if !tags.is_empty() {
            if !text.is_empty() {
                text.push(' ');
            }
            let _ = write!(text, "[{}]", tags.join(", "));
        }
        text
    }

    pub(super) fn mentions_context_length(&self) -> bool {
        const HINTS: [&str; 7] = [
            "context_length",
            "context length",
            "maximum context",
            "context window",
            "context_window",
            "context size",
            "prompt is too long",
        ];
        HINTS.iter().any(|hint| self.haystack.contains(hint))
    }

    pub(super) fn mentions_content_filter(&self) -> bool {
        const HINTS: [&str; 5] = [
            "content_filter",
            "content filter",
            "content_policy",
            "content policy",
            "content management policy",
        ];
        HINTS.iter().any(|hint| self.haystack.contains(hint))
    }

    pub(super) fn mentions_rate_limit(&self) -> bool {
        self.code == "429"
            || self.haystack.contains("rate_limit")
            || self.haystack.contains("rate limit")
    }

    pub(super) fn mentions_timeout(&self) -> bool {
        self.haystack.contains("timeout") || self.haystack.contains("timed out")
    }

    pub(super) fn is_quota(&self) -> bool {
        self.haystack.contains("insufficient_quota")
    }
}

/// Classifies a non-success HTTP response.
pub(super) fn classify_http(status: StatusCode, body: &str, model: &str) -> RuntimeError {
    let detail = ErrorDetail::from_body(body);
    let reason = status.canonical_reason().unwrap_or("");
    let message = format!(
        "{model}: HTTP {} {reason}: {}",
        status.as_u16(),
        detail.summary()
    );
    let (kind, retryable) = match status.as_u16() {
        429 => (ErrorKind::RateLimit, !detail.is_quota()),
        408 | 504 => (ErrorKind::Timeout, true),
        _ if detail.mentions_context_length() => (ErrorKind::ContextLength, false),
        400..=499 if detail.mentions_content_filter() => (ErrorKind::Refusal, false),
        500..=599 => (ErrorKind::Unknown, true),
        _ => (ErrorKind::Unknown, false),
    };
    RuntimeError::new(kind, message, retryable)
}

/// Classifies an `error` object that arrived inside a 200 stream. The
/// request was accepted, so a failure nothing points at is taken as the
/// server's and may be retried.
pub(super) fn classify_stream_error(error: &Value, model: &str) -> RuntimeError {
    let detail = ErrorDetail::from_value(error);
    let message = format!("{model}: error in stream: {}", detail.summary());
    let status: Option<u16> = detail.code.parse().ok();
    let (kind, retryable) = if detail.mentions_rate_limit() {
        (ErrorKind::RateLimit, !detail.is_quota())
    } else if detail.mentions_context_length() {
        (ErrorKind::ContextLength, false)
    } else if detail.mentions_content_filter() {
        (ErrorKind::Refusal, false)
    } else if detail.mentions_timeout() || matches!(status, Some(408 | 504)) {
        (ErrorKind::Timeout, true)
    } else if matches!(status, Some(400..=499)) || detail.kind == "invalid_request_error" {
        (ErrorKind::Unknown, false)
    } else {
        (ErrorKind::Unknown, true)
    };
    RuntimeError::new(kind, message, retryable)
}
