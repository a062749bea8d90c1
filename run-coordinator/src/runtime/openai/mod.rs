//! The OpenAI-compatible runtime: streams one chat-completions turn from any
//! server that speaks the OpenAI wire format (OpenAI itself, Azure-style
//! proxies, vLLM, llama.cpp, Ollama, LiteLLM, ...).
//!
//! Here: the configuration, the request and the runtime; `stream.rs` reads
//! the response (# Stream mapping), `errors.rs` classifies failures
//! (# Errors), `driver.rs` runs the attempts (# Retries and fallback).
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
//! 3. the turn's user `message`, with its attachments as content parts when
//!    it has any (`image_url` for images, `file` for other files, each a
//!    `data:` URL).
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
    AgentRuntime, Attachment, ErrorKind, HistoryMessage, Inputs, ModelCatalog, ModelInfo,
    RuntimeError, RuntimeEvent, RuntimeRequest, RuntimeStream, SteerInput, Usage,
};

mod driver;
mod errors;
mod stream;
#[cfg(test)]
mod tests;

use driver::Driver;
use errors::*;
use stream::*;

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
                &user_content(&request.message, &request.attachments),
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
/// The turn's user content: its text alone, or with its attachments, as
/// content parts (`image_url` for images, `file` for other files, each as a
/// data URL).
fn user_content(message: &str, attachments: &[Attachment]) -> Value {
    use base64::Engine as _;
    if attachments.is_empty() {
        return json!(message);
    }
    let mut parts = Vec::new();
    if !message.is_empty() {
        parts.push(json!({ "type": "text", "text": message }));
    }
    for attachment in attachments {
        let data = base64::engine::general_purpose::STANDARD.encode(&attachment.data);
        let url = format!("data:{};base64,{data}", attachment.mime_type);
        parts.push(if attachment.mime_type.starts_with("image/") {
            json!({ "type": "image_url", "image_url": { "url": url } })
        } else {
            json!({ "type": "file", "file": { "filename": attachment.file_name, "file_data": url } })
        });
    }
    Value::Array(parts)
}

fn build_messages(system: Option<&str>, history: &[HistoryMessage], message: &Value) -> Vec<Value> {
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
