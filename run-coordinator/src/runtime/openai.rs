//! The OpenAI-compatible runtime: streams one chat-completions turn from any
//! server that speaks the OpenAI wire format (OpenAI itself, Azure-style
//! proxies, vLLM, llama.cpp, Ollama, LiteLLM, ...).
//!
//! # Request
//!
//! Each attempt is one `POST {base_url}/chat/completions` with a JSON body
//! `{"model", "messages", "stream": true, "stream_options":
//! {"include_usage": true}}`, plus `temperature` and `max_tokens` when the
//! run asks for them, and `Authorization: Bearer {api_key}` when a key is
//! configured.
//!
//! `messages` is built from, in order:
//! 1. the run option `system`, when given, as a `system` message;
//! 2. the session history: roles `user`, `assistant` and `system` map to the
//!    chat roles of the same name (`developer` maps to `system`); the text
//!    parts of each entry's `content_json` (`[{"type":"text","text":..}]`)
//!    are concatenated. Entries of other roles (`toolResult`, ...) and
//!    entries without text are skipped;
//! 3. the turn's user `message`.
//!
//! Per-run options (the run's `options` object; unknown keys are ignored):
//! `model` (replaces the configured model; the fallbacks still apply),
//! `temperature`, `maxTokens` (sent as `max_tokens`), `system`.
//!
//! # Stream mapping
//!
//! The response is Server-Sent Events: `data: {chunk}` events, ending with
//! `data: [DONE]`. Lines may be split across network reads and end in `\n`,
//! `\r\n` or `\r`; comment lines (`:`) are ignored; several `data:` lines of
//! one event are joined (and, when the joined text is not one JSON value,
//! read one JSON value per line, for servers that omit the blank line).
//!
//! | chunk field (of `choices[0]`)           | event                                        |
//! |-----------------------------------------|----------------------------------------------|
//! | `delta.content`                         | [`RuntimeEvent::AssistantDelta`]             |
//! | `delta.tool_calls[i]` id + name known   | [`RuntimeEvent::ToolStart`]                  |
//! | `delta.tool_calls[i].function.arguments`| [`RuntimeEvent::ToolUpdate`] (the fragment)  |
//! | top-level `usage`                       | [`RuntimeEvent::Usage`], once, at the end    |
//! | `finish_reason`                         | [`RuntimeEvent::Finished`], once, at the end |
//! | `delta.refusal`                         | error [`ErrorKind::Refusal`]                 |
//! | `finish_reason: "content_filter"`       | error [`ErrorKind::Refusal`]                 |
//! | top-level `error` object                | error, classified as below                   |
//!
//! A tool call's `ToolStart` carries the argument text received before its
//! id and name were both known (normally empty); every later fragment is a
//! `ToolUpdate`, so the full arguments are `arguments_json` followed by all
//! `partial_json` of that `tool_call_id`. A tool call whose id never arrives
//! is started at the end of the turn with a made-up id and all its
//! arguments. The runtime does not execute tools: a turn that ends in tool
//! calls finishes with stop reason `"tool_calls"`.
//!
//! The turn ends at `[DONE]`, at the end of the body, or as soon as both the
//! finish reason and the usage are known; then the runtime emits the usage
//! (the last one seen) and one `Finished` whose stop reason is the finish
//! reason (`"stop"` when none came; `"function_call"` becomes
//! `"tool_calls"`; unknown reasons pass through). A body that ends (or
//! breaks, or stalls past the idle timeout) before any finish reason is a
//! failure.
//!
//! A server that ignores `stream` and answers `application/json` with a
//! whole completion is read the same way, each choice's `message` taken as
//! one delta.
//!
//! # Errors
//!
//! | cause                                              | kind            | retryable |
//! |----------------------------------------------------|-----------------|-----------|
//! | HTTP 429                                           | `RateLimit`     | yes (no for `insufficient_quota`) |
//! | HTTP 408 / 504, request or idle timeout            | `Timeout`       | yes       |
//! | a body mentioning the context length (any status)  | `ContextLength` | no        |
//! | a body mentioning a content filter / policy (4xx)  | `Refusal`       | no        |
//! | refusal delta, `content_filter` finish             | `Refusal`       | no        |
//! | HTTP 5xx, connection failure, broken stream        | `Unknown`       | yes       |
//! | other HTTP 4xx                                     | `Unknown`       | no        |
//! | `error` object inside a 200 stream: by its code, type and message as above, else `Unknown` | | yes, unless it names a 4xx code or `invalid_request_error` |
//!
//! # Retries and fallback
//!
//! A failed attempt is retried only while nothing has been emitted to the
//! caller: once an event went out, a failure ends the run as failed, so
//! output is never duplicated. A retryable failure is retried after
//! `initial_backoff * 2^n` (n = 0, 1, ...), or after the response's
//! `Retry-After` (seconds) / `retry-after-ms` when present, in both cases
//! capped at `max_backoff`; at most `max_retries` times per model. Then the
//! next model of `fallback_models` is tried the same way (at once, without
//! a backoff), and when none is left the last error is returned. A failure
//! that is not retryable ends the run at once, without fallback. (An error
//! after output keeps its classification, `retryable` included, for the
//! caller to judge; the runtime itself does not retry it.)
//!
//! # Timeouts and cancellation
//!
//! `request_timeout` bounds connecting plus the response headers;
//! `idle_timeout` bounds each gap between body chunks (SSE comments count as
//! activity). All waiting uses tokio's timer. The work runs in a spawned
//! task that feeds a bounded channel; when the `CancellationToken` fires or
//! the returned stream is dropped, the task stops at its next await (the
//! HTTP request, a body read, a backoff sleep or a send), drops the
//! response, which closes the connection, and the stream yields nothing
//! more.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{
    AgentRuntime, ErrorKind, HistoryMessage, Inputs, ModelCatalog, ModelInfo, RuntimeError,
    RuntimeEvent, RuntimeRequest, RuntimeStream, SteerInput, Usage,
};

/// Events buffered between the HTTP task and the reader of the stream.
const CHANNEL_CAPACITY: usize = 64;
/// How much of an error response body is read and kept.
const ERROR_BODY_LIMIT: usize = 16 * 1024;
/// The largest plain JSON completion read (from a server that ignored
/// `"stream": true`).
const WHOLE_BODY_LIMIT: usize = 8 * 1024 * 1024;
/// How much of an error body goes into an error message.
const ERROR_MESSAGE_LIMIT: usize = 500;

/// Where and how to reach the server, and the retry policy.
#[derive(Clone)]
pub struct OpenAiConfig {
    /// The API root, e.g. `https://api.openai.com/v1`; `/chat/completions`
    /// is appended.
    pub base_url: String,
    /// Sent as `Authorization: Bearer {api_key}` when set.
    pub api_key: Option<String>,
    /// The model used unless the run's options name another.
    pub model: String,
    /// Tried in order once the model's retries are used up.
    pub fallback_models: Vec<String>,
    /// Retries per model after the first attempt.
    pub max_retries: u32,
    /// The first backoff; it doubles with each retry.
    pub initial_backoff: Duration,
    /// The cap on any backoff, including a server's `Retry-After`.
    pub max_backoff: Duration,
    /// Connect plus first byte (the response headers).
    pub request_timeout: Duration,
    /// The longest gap allowed between two chunks of the stream.
    pub idle_timeout: Duration,
}

/// Shows everything but the API key.
impl std::fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .field("fallback_models", &self.fallback_models)
            .field("max_retries", &self.max_retries)
            .field("initial_backoff", &self.initial_backoff)
            .field("max_backoff", &self.max_backoff)
            .field("request_timeout", &self.request_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .finish()
    }
}

impl Default for OpenAiConfig {
    fn default() -> Self {
        Self {
            base_url: "https://api.openai.com/v1".into(),
            api_key: None,
            model: "gpt-4o-mini".into(),
            fallback_models: Vec::new(),
            max_retries: 2,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(8),
            request_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// An [`AgentRuntime`] for OpenAI-compatible streaming chat completions.
/// Cheap to share: one HTTP client (and connection pool) serves every run.
pub struct OpenAiRuntime {
    config: Arc<OpenAiConfig>,
    client: reqwest::Client,
    url: String,
    auth: Option<HeaderValue>,
}

impl std::fmt::Debug for OpenAiRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiRuntime")
            .field("url", &self.url)
            .field("model", &self.config.model)
            .field("fallback_models", &self.config.fallback_models)
            .finish_non_exhaustive()
    }
}

impl OpenAiRuntime {
    /// Checks the configuration and builds the HTTP client.
    pub fn new(config: OpenAiConfig) -> Result<Self, RuntimeError> {
        let invalid = |message: String| RuntimeError::new(ErrorKind::Unknown, message, false);
        let url = format!("{}/chat/completions", config.base_url.trim_end_matches('/'));
        let parsed = reqwest::Url::parse(&url).map_err(|e| {
            invalid(format!(
                "invalid openai base_url {:?}: {e}",
                config.base_url
            ))
        })?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(invalid(format!(
                "invalid openai base_url {:?}: scheme must be http or https",
                config.base_url
            )));
        }
        if config.model.trim().is_empty() {
            return Err(invalid("openai model must not be empty".into()));
        }
        let auth = match &config.api_key {
            Some(key) => {
                let mut value = HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| {
                    invalid("openai api_key holds characters not allowed in a header".into())
                })?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        let client = reqwest::Client::builder()
            .user_agent(concat!(
                "clawgate-run-coordinator/",
                env!("CARGO_PKG_VERSION")
            ))
            .tcp_nodelay(true)
            .build()
            .map_err(|e| invalid(format!("cannot build the HTTP client: {}", error_chain(&e))))?;
        Ok(Self {
            config: Arc::new(config),
            client,
            url,
            auth,
        })
    }

    pub fn config(&self) -> &OpenAiConfig {
        &self.config
    }
}

/// The run options this runtime understands.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RunOptions {
    model: Option<String>,
    temperature: Option<f64>,
    max_tokens: Option<u64>,
    system: Option<String>,
}

impl RunOptions {
    fn parse(options: &Value) -> Result<Self, RuntimeError> {
        if options.is_null() {
            return Ok(Self::default());
        }
        serde_json::from_value(options.clone()).map_err(|e| {
            RuntimeError::new(
                ErrorKind::Unknown,
                format!("invalid openai options: {e}"),
                false,
            )
        })
    }
}

#[async_trait]
impl AgentRuntime for OpenAiRuntime {
    fn name(&self) -> &'static str {
        "openai"
    }

    /// The configured model and its fallbacks (the API's own list is not
    /// asked: many compatible servers do not serve it, and the configured
    /// ones are what runs use).
    async fn models(&self) -> Result<ModelCatalog, RuntimeError> {
        let models = std::iter::once(&self.config.model)
            .chain(&self.config.fallback_models)
            .map(|id| ModelInfo {
                id: id.clone(),
                name: id.clone(),
                provider: "openai".into(),
                context_window: None,
                reasoning: false,
                input: vec!["text".into(), "image".into()],
            })
            .collect();
        Ok(ModelCatalog {
            models,
            default_model: Some(self.config.model.clone()),
        })
    }

    async fn execute(
        &self,
        request: RuntimeRequest,
        cancel: CancellationToken,
    ) -> Result<RuntimeStream, RuntimeError> {
        let options = RunOptions::parse(&request.options)?;
        let mut body = Map::new();
        body.insert(
            "messages".into(),
            Value::Array(build_messages(
                options.system.as_deref(),
                &request.history,
                &request.message,
            )),
        );
        body.insert("stream".into(), Value::Bool(true));
        body.insert("stream_options".into(), json!({ "include_usage": true }));
        if let Some(temperature) = options.temperature {
            body.insert("temperature".into(), json!(temperature));
        }
        if let Some(max_tokens) = options.max_tokens {
            body.insert("max_tokens".into(), json!(max_tokens));
        }
        let models = model_chain(options.model.as_deref(), &self.config);

        // `stop` fires when the caller cancels or drops the stream.
        let stop = cancel.child_token();
        let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
        let driver = Driver {
            client: self.client.clone(),
            config: Arc::clone(&self.config),
            url: self.url.clone(),
            auth: self.auth.clone(),
            body,
            run_id: request.run_id,
            tx,
            stop: stop.clone(),
            inputs: request.inputs,
            steer: Default::default(),
        };
        tokio::spawn(driver.run(models));
        Ok(event_stream(rx, stop))
    }
}

/// The caller's side of the channel. It ends as soon as `stop` fires, even
/// with events still buffered, and dropping it fires `stop`.
fn event_stream(
    rx: mpsc::Receiver<Result<RuntimeEvent, RuntimeError>>,
    stop: CancellationToken,
) -> RuntimeStream {
    let guard = stop.clone().drop_guard();
    futures::stream::unfold((rx, stop, guard), |(mut rx, stop, guard)| async move {
        tokio::select! {
            biased;
            () = stop.cancelled() => None,
            item = rx.recv() => item.map(|item| (item, (rx, stop, guard))),
        }
    })
    .boxed()
}

/// The model to use first, then the fallbacks, without repeats.
fn model_chain(requested: Option<&str>, config: &OpenAiConfig) -> Vec<String> {
    let primary = requested
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .unwrap_or(&config.model);
    let mut models = vec![primary.to_owned()];
    for model in &config.fallback_models {
        if !model.trim().is_empty() && !models.contains(model) {
            models.push(model.clone());
        }
    }
    models
}

/// Chat messages: the system prompt, the history, then the user's message.
fn build_messages(system: Option<&str>, history: &[HistoryMessage], message: &str) -> Vec<Value> {
    let mut messages = Vec::with_capacity(history.len() + 2);
    if let Some(system) = system.filter(|s| !s.is_empty()) {
        messages.push(json!({ "role": "system", "content": system }));
    }
    for entry in history {
        let role = match entry.role.as_str() {
            "user" => "user",
            "assistant" => "assistant",
            "system" | "developer" => "system",
            _ => continue,
        };
        let text = history_text(&entry.content_json);
        if text.is_empty() {
            continue;
        }
        messages.push(json!({ "role": role, "content": text }));
    }
    messages.push(json!({ "role": "user", "content": message }));
    messages
}

/// The concatenated text parts of a history entry. A bare JSON string is
/// taken as the text; content that is not JSON is taken verbatim.
fn history_text(content_json: &str) -> String {
    match serde_json::from_str::<Value>(content_json) {
        Ok(Value::Array(parts)) => parts
            .iter()
            .filter(|part| part.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect(),
        Ok(Value::String(text)) => text,
        Ok(_) => String::new(),
        Err(_) => content_json.to_owned(),
    }
}

/// The delay before retry number `retry + 1` (so `retry` 0 is the first).
fn backoff_delay(config: &OpenAiConfig, retry: u32, retry_after: Option<Duration>) -> Duration {
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
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
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
fn error_chain(error: &dyn std::error::Error) -> String {
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

fn truncate(text: &str, limit: usize) -> String {
    let text = text.trim();
    match text.char_indices().nth(limit) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_owned(),
    }
}

/// What an error body or an in-stream `error` object says.
#[derive(Debug, Default)]
struct ErrorDetail {
    message: String,
    code: String,
    kind: String,
    /// Lowercase text to search for hints.
    haystack: String,
}

impl ErrorDetail {
    fn from_body(body: &str) -> Self {
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

    fn from_value(value: &Value) -> Self {
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

    fn summary(&self) -> String {
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

    fn mentions_context_length(&self) -> bool {
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

    fn mentions_content_filter(&self) -> bool {
        const HINTS: [&str; 5] = [
            "content_filter",
            "content filter",
            "content_policy",
            "content policy",
            "content management policy",
        ];
        HINTS.iter().any(|hint| self.haystack.contains(hint))
    }

    fn mentions_rate_limit(&self) -> bool {
        self.code == "429"
            || self.haystack.contains("rate_limit")
            || self.haystack.contains("rate limit")
    }

    fn mentions_timeout(&self) -> bool {
        self.haystack.contains("timeout") || self.haystack.contains("timed out")
    }

    fn is_quota(&self) -> bool {
        self.haystack.contains("insufficient_quota")
    }
}

/// Classifies a non-success HTTP response.
fn classify_http(status: StatusCode, body: &str, model: &str) -> RuntimeError {
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
fn classify_stream_error(error: &Value, model: &str) -> RuntimeError {
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

/// Splits a byte stream into SSE events and returns their `data`.
#[derive(Debug, Default)]
struct SseParser {
    line: Vec<u8>,
    data: String,
    has_data: bool,
    /// The last byte was `\r`: a `\n` right after it ends no new line.
    after_cr: bool,
}

impl SseParser {
    fn feed(&mut self, bytes: &[u8], out: &mut Vec<String>) {
        for &byte in bytes {
            if self.after_cr {
                self.after_cr = false;
                if byte == b'\n' {
                    continue;
                }
            }
            match byte {
                b'\n' => self.end_line(out),
                b'\r' => {
                    self.after_cr = true;
                    self.end_line(out);
                }
                _ => self.line.push(byte),
            }
        }
    }

    /// The body ended: a last event without its blank line still counts.
    fn finish(&mut self, out: &mut Vec<String>) {
        if !self.line.is_empty() {
            self.end_line(out);
        }
        self.dispatch(out);
    }

    fn end_line(&mut self, out: &mut Vec<String>) {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        let line = String::from_utf8_lossy(&line);
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line.as_ref(), ""),
        };
        if field == "data" {
            if self.has_data {
                self.data.push('\n');
            }
            self.data.push_str(value);
            self.has_data = true;
        }
    }

    fn dispatch(&mut self, out: &mut Vec<String>) {
        if self.has_data {
            out.push(std::mem::take(&mut self.data));
            self.has_data = false;
        }
    }
}

/// What to do after a payload.
#[derive(Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    /// The turn is complete; stop reading.
    Done,
}

#[derive(Debug, Default)]
struct ToolCall {
    id: Option<String>,
    name: Option<String>,
    /// Arguments received before the call was started.
    pending_arguments: String,
    started: bool,
}

/// One attempt's view of the turn, fed chunk by chunk.
#[derive(Debug)]
struct Turn {
    model: String,
    run_id: String,
    tools: BTreeMap<u64, ToolCall>,
    finish_reason: Option<String>,
    usage: Option<Usage>,
    refusal: String,
}

impl Turn {
    fn new(model: &str, run_id: &str) -> Self {
        Self {
            model: model.to_owned(),
            run_id: run_id.to_owned(),
            tools: BTreeMap::new(),
            finish_reason: None,
            usage: None,
            refusal: String::new(),
        }
    }

    /// Handles one SSE `data` payload.
    fn on_payload(
        &mut self,
        payload: &str,
        out: &mut Vec<RuntimeEvent>,
    ) -> Result<Flow, RuntimeError> {
        let payload = payload.trim();
        if payload.is_empty() {
            return Ok(Flow::Continue);
        }
        if payload == "[DONE]" {
            return Ok(Flow::Done);
        }
        match serde_json::from_str::<Value>(payload) {
            Ok(chunk) => self.on_chunk(&chunk, out),
            Err(_) if payload.contains('\n') => {
                for line in payload.lines() {
                    if self.on_payload(line, out)? == Flow::Done {
                        return Ok(Flow::Done);
                    }
                }
                Ok(Flow::Continue)
            }
            Err(e) => {
                tracing::warn!(
                    run_id = %self.run_id,
                    model = %self.model,
                    error = %e,
                    payload = %truncate(payload, 200),
                    "ignoring an SSE payload that is not JSON"
                );
                Ok(Flow::Continue)
            }
        }
    }

    /// Handles a whole (non-streamed) completion: each choice's `message`
    /// is read as if it were one delta.
    fn on_completion(
        &mut self,
        completion: &Value,
        out: &mut Vec<RuntimeEvent>,
    ) -> Result<(), RuntimeError> {
        let mut chunk = completion.clone();
        if let Some(choices) = chunk.get_mut("choices").and_then(Value::as_array_mut) {
            for choice in choices {
                if let Some(choice) = choice.as_object_mut()
                    && let Some(message) = choice.remove("message")
                {
                    choice.insert("delta".into(), message);
                }
            }
        }
        self.on_chunk(&chunk, out).map(drop)
    }

    fn on_chunk(
        &mut self,
        chunk: &Value,
        out: &mut Vec<RuntimeEvent>,
    ) -> Result<Flow, RuntimeError> {
        if let Some(error) = chunk.get("error").filter(|e| !e.is_null()) {
            return Err(classify_stream_error(error, &self.model));
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(parse_usage(usage));
        }
        let choice = chunk
            .get("choices")
            .and_then(Value::as_array)
            .and_then(|choices| {
                choices
                    .iter()
                    .find(|c| c.get("index").and_then(Value::as_u64) == Some(0))
                    .or_else(|| choices.first())
            });
        if let Some(choice) = choice {
            if let Some(delta) = choice.get("delta").filter(|d| d.is_object()) {
                if let Some(text) = delta.get("content").and_then(Value::as_str)
                    && !text.is_empty()
                {
                    out.push(RuntimeEvent::AssistantDelta(text.to_owned()));
                }
                if let Some(refusal) = delta.get("refusal").and_then(Value::as_str) {
                    self.refusal.push_str(refusal);
                }
                if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
                    for (position, call) in calls.iter().enumerate() {
                        self.on_tool_call(position, call, out);
                    }
                }
            }
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str)
                && !reason.is_empty()
            {
                self.finish_reason = Some(reason.to_owned());
            }
        }
        if self.finish_reason.is_some() && self.usage.is_some() {
            return Ok(Flow::Done);
        }
        Ok(Flow::Continue)
    }

    /// One entry of `delta.tool_calls`; `position` stands in for a
    /// missing `index`.
    fn on_tool_call(&mut self, position: usize, call: &Value, out: &mut Vec<RuntimeEvent>) {
        fn text(v: Option<&Value>) -> Option<&str> {
            v.and_then(Value::as_str).filter(|s| !s.is_empty())
        }
        let index = call
            .get("index")
            .and_then(Value::as_u64)
            .unwrap_or(position as u64);
        let function = call.get("function");
        let tool = self.tools.entry(index).or_default();
        if tool.id.is_none() {
            tool.id = text(call.get("id")).map(str::to_owned);
        }
        if tool.name.is_none() {
            tool.name = text(function.and_then(|f| f.get("name"))).map(str::to_owned);
        }
        let fragment = text(function.and_then(|f| f.get("arguments")));
        if tool.started {
            if let (Some(fragment), Some(id)) = (fragment, &tool.id) {
                out.push(RuntimeEvent::ToolUpdate {
                    tool_call_id: id.clone(),
                    partial_json: fragment.to_owned(),
                });
            }
            return;
        }
        if let Some(fragment) = fragment {
            tool.pending_arguments.push_str(fragment);
        }
        if let (Some(id), Some(name)) = (&tool.id, &tool.name) {
            tool.started = true;
            out.push(RuntimeEvent::ToolStart {
                tool_call_id: id.clone(),
                name: name.clone(),
                arguments_json: std::mem::take(&mut tool.pending_arguments),
            });
        }
    }

    /// The turn is over: the closing events, or why it failed.
    fn finish(&mut self, out: &mut Vec<RuntimeEvent>) -> Result<(), RuntimeError> {
        if !self.refusal.is_empty() {
            return Err(RuntimeError::new(
                ErrorKind::Refusal,
                format!(
                    "{}: the model refused: {}",
                    self.model,
                    truncate(&self.refusal, ERROR_MESSAGE_LIMIT)
                ),
                false,
            ));
        }
        if self.finish_reason.as_deref() == Some("content_filter") {
            return Err(RuntimeError::new(
                ErrorKind::Refusal,
                format!(
                    "{}: the response was stopped by the content filter",
                    self.model
                ),
                false,
            ));
        }
        for (index, tool) in &mut self.tools {
            if tool.started {
                continue;
            }
            let Some(name) = tool.name.clone() else {
                tracing::warn!(run_id = %self.run_id, index, "dropping a tool call that has no name");
                continue;
            };
            let id = tool
                .id
                .clone()
                .unwrap_or_else(|| format!("{}-call-{index}", self.run_id));
            tool.started = true;
            out.push(RuntimeEvent::ToolStart {
                tool_call_id: id,
                name,
                arguments_json: std::mem::take(&mut tool.pending_arguments),
            });
        }
        if let Some(usage) = self.usage.take() {
            out.push(RuntimeEvent::Usage(usage));
        }
        let stop_reason = match self.finish_reason.as_deref() {
            None => "stop",
            Some("function_call") => "tool_calls",
            Some(other) => other,
        };
        out.push(RuntimeEvent::Finished {
            stop_reason: stop_reason.to_owned(),
        });
        Ok(())
    }
}

fn parse_usage(usage: &Value) -> Usage {
    let count = |key: &str| usage.get(key).and_then(Value::as_u64);
    let input_tokens = count("prompt_tokens")
        .or_else(|| count("input_tokens"))
        .unwrap_or(0);
    let output_tokens = count("completion_tokens")
        .or_else(|| count("output_tokens"))
        .unwrap_or(0);
    let total_tokens = count("total_tokens").unwrap_or(input_tokens + output_tokens);
    Usage {
        input_tokens,
        output_tokens,
        total_tokens,
    }
}

/// How one attempt ended.
enum Outcome {
    /// The turn finished (successfully or with an error already sent).
    Done,
    /// Cancelled, or the stream was dropped.
    Stopped,
    Failed(Failure),
}

struct Failure {
    error: RuntimeError,
    /// Whether any event of this attempt reached the caller.
    emitted: bool,
    retry_after: Option<Duration>,
}

impl Outcome {
    fn failed(error: RuntimeError, emitted: bool) -> Self {
        Self::Failed(Failure {
            error,
            emitted,
            retry_after: None,
        })
    }
}

/// The spawned task of one run.
struct Driver {
    client: reqwest::Client,
    config: Arc<OpenAiConfig>,
    url: String,
    auth: Option<HeaderValue>,
    /// The request body without `model`.
    body: Map<String, Value>,
    run_id: String,
    tx: mpsc::Sender<Result<RuntimeEvent, RuntimeError>>,
    stop: CancellationToken,
    /// Messages steered into the run.
    inputs: Inputs,
    /// The turn's text so far, and a steered message taken at its end.
    steer: std::sync::Mutex<Steer>,
}

#[derive(Default)]
struct Steer {
    text: String,
    taken: Option<SteerInput>,
}

/// How the model chain ended.
enum ChainEnd {
    /// Finished, failed or stopped: nothing more to do.
    Over,
    /// A completion ended where a steered message was waiting: it is taken,
    /// and the next completion answers it.
    Steered(SteerInput),
}

impl Driver {
    /// Completions until the turn ends: one, and one more for each message
    /// steered in, taken when a completion finishes with `stop` (the model
    /// boundary; a turn that ends in tool calls hands them to the caller).
    async fn run(mut self, models: Vec<String>) {
        while let ChainEnd::Steered(input) = self.run_chain(&models).await {
            if !self
                .send(Ok(RuntimeEvent::InputTaken { id: input.id }))
                .await
            {
                return;
            }
            let answer = std::mem::take(&mut self.steer.lock().unwrap().text);
            if let Some(Value::Array(messages)) = self.body.get_mut("messages") {
                messages.push(json!({ "role": "assistant", "content": answer }));
                messages.push(json!({ "role": "user", "content": input.message }));
            }
        }
    }

    async fn run_chain(&self, models: &[String]) -> ChainEnd {
        let mut last_error = None;
        let mut attempts = 0u32;
        for model in models {
            let mut retry = 0u32;
            loop {
                attempts += 1;
                let failure = match self.attempt(model).await {
                    Outcome::Done => {
                        return match self.steer.lock().unwrap().taken.take() {
                            Some(input) => ChainEnd::Steered(input),
                            None => ChainEnd::Over,
                        };
                    }
                    Outcome::Stopped => return ChainEnd::Over,
                    Outcome::Failed(failure) => failure,
                };
                if failure.emitted || !failure.error.retryable {
                    self.send(Err(failure.error)).await;
                    return ChainEnd::Over;
                }
                if retry >= self.config.max_retries {
                    tracing::warn!(
                        run_id = %self.run_id,
                        model = %model,
                        error = %failure.error,
                        "giving up on the model"
                    );
                    last_error = Some(failure.error);
                    break;
                }
                let delay = backoff_delay(&self.config, retry, failure.retry_after);
                tracing::warn!(
                    run_id = %self.run_id,
                    model = %model,
                    retry = retry + 1,
                    delay_ms = delay.as_millis() as u64,
                    error = %failure.error,
                    "retrying"
                );
                retry += 1;
                tokio::select! {
                    biased;
                    () = self.stop.cancelled() => return ChainEnd::Over,
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
        if let Some(mut error) = last_error {
            let _ = write!(
                error.message,
                " (gave up after {attempts} attempts with {} model{})",
                models.len(),
                if models.len() == 1 { "" } else { "s" }
            );
            self.send(Err(error)).await;
        }
        ChainEnd::Over
    }

    /// Sends one item; false when the caller is gone or cancelled.
    async fn send(&self, item: Result<RuntimeEvent, RuntimeError>) -> bool {
        tokio::select! {
            biased;
            () = self.stop.cancelled() => false,
            sent = self.tx.send(item) => sent.is_ok(),
        }
    }

    async fn attempt(&self, model: &str) -> Outcome {
        let mut body = self.body.clone();
        body.insert("model".into(), Value::String(model.to_owned()));
        let mut request = self
            .client
            .post(&self.url)
            .header(ACCEPT, "text/event-stream")
            .json(&body);
        if let Some(auth) = &self.auth {
            request = request.header(AUTHORIZATION, auth.clone());
        }
        let timeout = self.config.request_timeout;
        let response = tokio::select! {
            biased;
            () = self.stop.cancelled() => return Outcome::Stopped,
            response = tokio::time::timeout(timeout, request.send()) => response,
        };
        let response = match response {
            Err(_) => {
                let message = format!("{model}: no response within {timeout:?}");
                return Outcome::failed(
                    RuntimeError::new(ErrorKind::Timeout, message, true),
                    false,
                );
            }
            Ok(Err(e)) => {
                let kind = if e.is_timeout() {
                    ErrorKind::Timeout
                } else {
                    ErrorKind::Unknown
                };
                let message = format!("{model}: request failed: {}", error_chain(&e));
                return Outcome::failed(RuntimeError::new(kind, message, true), false);
            }
            Ok(Ok(response)) => response,
        };

        let status = response.status();
        if !status.is_success() {
            let retry_after = retry_after(response.headers());
            let Some((body, _)) = self.read_body(response, ERROR_BODY_LIMIT).await else {
                return Outcome::Stopped;
            };
            let body = String::from_utf8_lossy(&body);
            return Outcome::Failed(Failure {
                error: classify_http(status, &body, model),
                emitted: false,
                retry_after,
            });
        }

        let is_json = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("application/json"));
        if is_json {
            self.read_whole(model, response).await
        } else {
            self.read_stream(model, response).await
        }
    }

    /// Reads an SSE body, sending events as they come.
    async fn read_stream(&self, model: &str, mut response: reqwest::Response) -> Outcome {
        let idle = self.config.idle_timeout;
        let mut parser = SseParser::default();
        let mut turn = Turn::new(model, &self.run_id);
        let mut payloads = Vec::new();
        let mut events = Vec::new();
        let mut emitted = false;
        loop {
            let read = tokio::select! {
                biased;
                () = self.stop.cancelled() => return Outcome::Stopped,
                read = tokio::time::timeout(idle, response.chunk()) => read,
            };
            let mut ended = false;
            match read {
                Ok(Ok(Some(bytes))) => parser.feed(&bytes, &mut payloads),
                Ok(Ok(None)) => {
                    parser.finish(&mut payloads);
                    ended = true;
                }
                // After the finish reason the turn is complete; a server
                // that then stalls or drops the connection changes nothing.
                _ if turn.finish_reason.is_some() => ended = true,
                Err(_) => {
                    let message = format!("{model}: the stream was idle for {idle:?}");
                    let error = RuntimeError::new(ErrorKind::Timeout, message, true);
                    return Outcome::failed(error, emitted);
                }
                Ok(Err(e)) => {
                    let message = format!("{model}: the stream broke: {}", error_chain(&e));
                    let error = RuntimeError::new(ErrorKind::Unknown, message, true);
                    return Outcome::failed(error, emitted);
                }
            }

            let mut done = false;
            let mut failure = None;
            for payload in payloads.drain(..) {
                match turn.on_payload(&payload, &mut events) {
                    Ok(Flow::Continue) => {}
                    Ok(Flow::Done) => {
                        done = true;
                        break;
                    }
                    Err(error) => {
                        failure = Some(error);
                        break;
                    }
                }
            }
            if failure.is_none() && (done || ended) {
                if done || turn.finish_reason.is_some() || !turn.refusal.is_empty() {
                    failure = turn.finish(&mut events).err();
                } else {
                    failure = Some(RuntimeError::new(
                        ErrorKind::Unknown,
                        format!("{model}: the stream ended before the turn finished"),
                        true,
                    ));
                }
            }
            if !self.deliver(&mut events, &mut emitted).await {
                return Outcome::Stopped;
            }
            if let Some(error) = failure {
                return Outcome::failed(error, emitted);
            }
            if done || ended {
                return Outcome::Done;
            }
        }
    }

    /// Reads a plain JSON completion, from a server that ignored `stream`.
    async fn read_whole(&self, model: &str, response: reqwest::Response) -> Outcome {
        let Some((body, problem)) = self.read_body(response, WHOLE_BODY_LIMIT).await else {
            return Outcome::Stopped;
        };
        let completion = match serde_json::from_slice::<Value>(&body) {
            Ok(completion) => completion,
            Err(e) => {
                let why = problem.unwrap_or_else(|| e.to_string());
                let message = format!("{model}: unreadable JSON response: {why}");
                let error = RuntimeError::new(ErrorKind::Unknown, message, true);
                return Outcome::failed(error, false);
            }
        };
        let mut turn = Turn::new(model, &self.run_id);
        let mut events = Vec::new();
        let result = turn
            .on_completion(&completion, &mut events)
            .and_then(|()| turn.finish(&mut events));
        let mut emitted = false;
        if !self.deliver(&mut events, &mut emitted).await {
            return Outcome::Stopped;
        }
        match result {
            Ok(()) => Outcome::Done,
            Err(error) => Outcome::failed(error, emitted),
        }
    }

    /// Sends `events` in order; false when stopped.
    async fn deliver(&self, events: &mut Vec<RuntimeEvent>, emitted: &mut bool) -> bool {
        for event in events.drain(..) {
            match &event {
                // The model boundary: a steered message waiting there is
                // answered by one more completion instead of the turn ending.
                RuntimeEvent::Finished { stop_reason } if stop_reason == "stop" => {
                    if let Some(input) = self.inputs.try_take() {
                        self.steer.lock().unwrap().taken = Some(input);
                        continue;
                    }
                }
                RuntimeEvent::AssistantDelta(text) => {
                    self.steer.lock().unwrap().text.push_str(text);
                }
                _ => {}
            }
            if !self.send(Ok(event)).await {
                return false;
            }
            *emitted = true;
        }
        true
    }

    /// Reads up to `limit` bytes of a body, within the request timeout, and
    /// says what stopped the read early, if anything; `None` when stopped.
    async fn read_body(
        &self,
        mut response: reqwest::Response,
        limit: usize,
    ) -> Option<(Vec<u8>, Option<String>)> {
        let mut body = Vec::new();
        let mut problem = None;
        let read = async {
            while body.len() < limit {
                match response.chunk().await {
                    Ok(Some(bytes)) => body.extend_from_slice(&bytes),
                    Ok(None) => return,
                    Err(e) => {
                        problem = Some(error_chain(&e));
                        return;
                    }
                }
            }
            problem = Some(format!("the body is larger than {limit} bytes"));
        };
        let timeout = self.config.request_timeout;
        tokio::select! {
            biased;
            () = self.stop.cancelled() => return None,
            read = tokio::time::timeout(timeout, read) => {
                if read.is_err() {
                    problem = Some(format!("the body took longer than {timeout:?}"));
                }
            }
        }
        body.truncate(limit);
        Some((body, problem))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(chunks: &[&[u8]]) -> Vec<String> {
        let mut parser = SseParser::default();
        let mut out = Vec::new();
        for chunk in chunks {
            parser.feed(chunk, &mut out);
        }
        parser.finish(&mut out);
        out
    }

    #[test]
    fn sse_survives_any_split() {
        let body = ": keep-alive\r\ndata: {\"a\":\"h\u{e9}llo\"}\r\n\r\nevent: x\ndata: one\ndata: two\n\nid: 3\rdata:[DONE]\r\r";
        let expected = vec![
            "{\"a\":\"h\u{e9}llo\"}".to_owned(),
            "one\ntwo".to_owned(),
            "[DONE]".to_owned(),
        ];
        let bytes = body.as_bytes();
        assert_eq!(parse_all(&[bytes]), expected);
        for split in 0..=bytes.len() {
            let (a, b) = bytes.split_at(split);
            assert_eq!(parse_all(&[a, b]), expected, "split at {split}");
        }
        let singles: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(parse_all(&singles), expected);
    }

    #[test]
    fn sse_keeps_a_last_event_without_blank_line() {
        assert_eq!(parse_all(&[b"data: x\n\ndata: y"]), vec!["x", "y"]);
        assert!(parse_all(&[b": only a comment\n\n\n"]).is_empty());
    }

    fn history(role: &str, content_json: &str) -> HistoryMessage {
        HistoryMessage {
            role: role.into(),
            content_json: content_json.into(),
        }
    }

    #[test]
    fn messages_from_history() {
        let messages = build_messages(
            Some("be brief"),
            &[
                history(
                    "user",
                    r#"[{"type":"text","text":"hi "},{"type":"image","url":"x"},{"type":"text","text":"there"}]"#,
                ),
                history("toolResult", r#"[{"type":"text","text":"42"}]"#),
                history("assistant", r#"[{"type":"text","text":"hello"}]"#),
                history("assistant", r#"[{"type":"toolCall","id":"c"}]"#),
                history("system", r#""plain""#),
            ],
            "again",
        );
        assert_eq!(
            Value::Array(messages),
            json!([
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi there"},
                {"role": "assistant", "content": "hello"},
                {"role": "system", "content": "plain"},
                {"role": "user", "content": "again"},
            ])
        );
    }

    #[test]
    fn models_and_backoff() {
        let config = OpenAiConfig {
            fallback_models: vec!["b".into(), "a".into(), "".into(), "c".into()],
            model: "a".into(),
            ..OpenAiConfig::default()
        };
        assert_eq!(model_chain(None, &config), vec!["a", "b", "c"]);
        assert_eq!(model_chain(Some("z"), &config), vec!["z", "b", "a", "c"]);
        assert_eq!(backoff_delay(&config, 0, None), Duration::from_millis(500));
        assert_eq!(backoff_delay(&config, 2, None), Duration::from_secs(2));
        assert_eq!(backoff_delay(&config, 40, None), Duration::from_secs(8));
        assert_eq!(
            backoff_delay(&config, 0, Some(Duration::from_secs(3))),
            Duration::from_secs(3)
        );
        assert_eq!(
            backoff_delay(&config, 0, Some(Duration::from_secs(300))),
            Duration::from_secs(8)
        );
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_static("2"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
        headers.insert("retry-after-ms", HeaderValue::from_static("250"));
        assert_eq!(retry_after(&headers), Some(Duration::from_millis(250)));
        headers.clear();
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&headers), None);
    }

    #[test]
    fn http_errors_are_classified() {
        let kind = |status: u16, body: &str| {
            let e = classify_http(StatusCode::from_u16(status).unwrap(), body, "m");
            (e.kind, e.retryable)
        };
        assert_eq!(kind(429, "{}"), (ErrorKind::RateLimit, true));
        assert_eq!(
            kind(
                429,
                r#"{"error":{"code":"insufficient_quota","message":"quota"}}"#
            ),
            (ErrorKind::RateLimit, false)
        );
        assert_eq!(
            kind(
                400,
                r#"{"error":{"code":"context_length_exceeded","message":"too long"}}"#
            ),
            (ErrorKind::ContextLength, false)
        );
        assert_eq!(
            kind(400, "This model's maximum context length is 8192 tokens"),
            (ErrorKind::ContextLength, false)
        );
        assert_eq!(
            kind(
                400,
                r#"{"error":{"code":"content_filter","message":"filtered"}}"#
            ),
            (ErrorKind::Refusal, false)
        );
        assert_eq!(
            kind(400, r#"{"error":{"message":"bad"}}"#),
            (ErrorKind::Unknown, false)
        );
        assert_eq!(kind(401, ""), (ErrorKind::Unknown, false));
        assert_eq!(kind(408, ""), (ErrorKind::Timeout, true));
        assert_eq!(kind(504, ""), (ErrorKind::Timeout, true));
        assert_eq!(kind(500, "oops"), (ErrorKind::Unknown, true));
        assert_eq!(kind(503, ""), (ErrorKind::Unknown, true));
        let e = classify_http(
            StatusCode::BAD_REQUEST,
            r#"{"error":{"message":"bad thing","type":"invalid_request_error"}}"#,
            "m",
        );
        assert!(
            e.message.contains("bad thing") && e.message.contains("400"),
            "{}",
            e.message
        );
    }

    #[test]
    fn stream_errors_are_classified() {
        let kind = |error: Value| {
            let e = classify_stream_error(&error, "m");
            (e.kind, e.retryable)
        };
        assert_eq!(
            kind(json!({"message": "Rate limit reached", "type": "requests"})),
            (ErrorKind::RateLimit, true)
        );
        assert_eq!(
            kind(json!({"code": "context_length_exceeded"})),
            (ErrorKind::ContextLength, false)
        );
        assert_eq!(
            kind(json!({"code": "content_filter"})),
            (ErrorKind::Refusal, false)
        );
        assert_eq!(
            kind(json!({"message": "upstream timed out"})),
            (ErrorKind::Timeout, true)
        );
        assert_eq!(
            kind(json!({"message": "boom", "type": "server_error"})),
            (ErrorKind::Unknown, true)
        );
        assert_eq!(
            kind(json!({"message": "bad", "code": 400})),
            (ErrorKind::Unknown, false)
        );
        assert_eq!(kind(json!("plain text")), (ErrorKind::Unknown, true));
    }

    fn run_turn(payloads: &[Value]) -> (Vec<RuntimeEvent>, Result<(), RuntimeError>) {
        let mut turn = Turn::new("m", "r1");
        let mut out = Vec::new();
        for payload in payloads {
            if let Err(e) = turn.on_payload(&payload.to_string(), &mut out) {
                return (out, Err(e));
            }
        }
        let result = turn.finish(&mut out);
        (out, result)
    }

    #[test]
    fn tool_calls_start_then_update() {
        let (events, result) = run_turn(&[
            json!({"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"function":{"arguments":"{\"a"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"f"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\":1}"}},{"index":1,"function":{"name":"g","arguments":"{}"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{},"finish_reason":"function_call"}]}),
        ]);
        result.unwrap();
        assert_eq!(
            events,
            vec![
                RuntimeEvent::ToolStart {
                    tool_call_id: "c1".into(),
                    name: "f".into(),
                    arguments_json: "{\"a".into()
                },
                RuntimeEvent::ToolUpdate {
                    tool_call_id: "c1".into(),
                    partial_json: "\":1}".into()
                },
                RuntimeEvent::ToolStart {
                    tool_call_id: "r1-call-1".into(),
                    name: "g".into(),
                    arguments_json: "{}".into()
                },
                RuntimeEvent::Finished {
                    stop_reason: "tool_calls".into()
                },
            ]
        );
    }

    #[test]
    fn usage_comes_before_finished_and_refusals_fail() {
        let (events, result) = run_turn(&[
            json!({"choices":[{"index":0,"delta":{"content":"a","refusal":null}}]}),
            json!({"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}),
            json!({"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}),
        ]);
        result.unwrap();
        assert_eq!(
            events,
            vec![
                RuntimeEvent::AssistantDelta("a".into()),
                RuntimeEvent::Usage(Usage {
                    input_tokens: 3,
                    output_tokens: 1,
                    total_tokens: 4
                }),
                RuntimeEvent::Finished {
                    stop_reason: "length".into()
                },
            ]
        );
        let (_, result) = run_turn(&[
            json!({"choices":[{"index":0,"delta":{"refusal":"I can't "}}]}),
            json!({"choices":[{"index":0,"delta":{"refusal":"help."},"finish_reason":"stop"}]}),
        ]);
        let error = result.unwrap_err();
        assert_eq!(error.kind, ErrorKind::Refusal);
        assert!(error.message.contains("I can't help."), "{}", error.message);
    }

    #[test]
    fn joined_data_lines_fall_back_to_one_value_per_line() {
        let mut turn = Turn::new("m", "r");
        let mut out = Vec::new();
        let payload = format!(
            "{}\n{}\n[DONE]",
            json!({"choices":[{"delta":{"content":"x"}}]}),
            json!({"choices":[{"delta":{"content":"y"}}]})
        );
        assert_eq!(turn.on_payload(&payload, &mut out).unwrap(), Flow::Done);
        assert_eq!(
            out,
            vec![
                RuntimeEvent::AssistantDelta("x".into()),
                RuntimeEvent::AssistantDelta("y".into())
            ]
        );
    }

    #[test]
    fn invalid_options_and_config_are_rejected() {
        assert!(RunOptions::parse(&json!({"temperature": "hot"})).is_err());
        let options = RunOptions::parse(&json!({"maxTokens": 5, "other": 1})).unwrap();
        assert_eq!(options.max_tokens, Some(5));
        assert!(
            OpenAiRuntime::new(OpenAiConfig {
                base_url: "not a url".into(),
                ..OpenAiConfig::default()
            })
            .is_err()
        );
        assert!(
            OpenAiRuntime::new(OpenAiConfig {
                model: " ".into(),
                ..OpenAiConfig::default()
            })
            .is_err()
        );
        assert!(
            OpenAiRuntime::new(OpenAiConfig {
                api_key: Some("a\nb".into()),
                ..OpenAiConfig::default()
            })
            .is_err()
        );
        assert!(OpenAiRuntime::new(OpenAiConfig::default()).is_ok());
        let config = OpenAiConfig {
            api_key: Some("sk-secret".into()),
            ..OpenAiConfig::default()
        };
        assert!(!format!("{config:?}").contains("sk-secret"));
    }
}
