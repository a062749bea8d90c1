//! The OpenAI-compatible runtime against a local chat-completions server.
//!
//! Every test binds 127.0.0.1:0, waits with deadlines (never asserts on how
//! long something took) and uses millisecond backoffs.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::post;
use clawgate_system_tests::wait::wait_until;
use futures::{Stream, StreamExt};
use run_coordinator::runtime::openai::*;
use run_coordinator::runtime::*;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// Long enough that only a hang reaches it.
const DEADLINE: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------- server

#[derive(Debug, Clone)]
struct Seen {
    headers: HeaderMap,
    body: Value,
}

type Reply = Arc<dyn Fn(usize, &Value) -> Response + Send + Sync>;

#[derive(Clone)]
struct AppState {
    seen: Arc<Mutex<Vec<Seen>>>,
    reply: Reply,
}

struct Server {
    base_url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn models(&self) -> Vec<String> {
        self.seen()
            .iter()
            .map(|s| s.body["model"].as_str().unwrap_or_default().to_owned())
            .collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves `POST /v1/chat/completions`; `reply` gets the request's index
/// (0 for the first) and its JSON body.
async fn serve(reply: impl Fn(usize, &Value) -> Response + Send + Sync + 'static) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let state = AppState {
        seen: Arc::clone(&seen),
        reply: Arc::new(reply),
    };
    let app = Router::new()
        .route("/v1/chat/completions", post(handle))
        .with_state(state);
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Server {
        base_url: format!("http://{addr}/v1"),
        seen,
        task,
    }
}

async fn handle(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let index = {
        let mut seen = state.seen.lock().unwrap();
        seen.push(Seen {
            headers,
            body: body.clone(),
        });
        seen.len() - 1
    };
    (state.reply)(index, &body)
}

// ------------------------------------------------------------- responses

fn data(value: &Value) -> String {
    format!("data: {value}\n\n")
}

fn chunk(delta: Value, finish_reason: Option<&str>) -> Value {
    json!({
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    })
}

fn text(text: &str) -> String {
    data(&chunk(json!({ "content": text }), None))
}

fn finish(reason: &str) -> String {
    data(&chunk(json!({}), Some(reason)))
}

fn usage(prompt: u64, completion: u64) -> String {
    data(&json!({
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }))
}

const DONE: &str = "data: [DONE]\n\n";

fn event_stream(body: Body) -> Response {
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(body)
        .unwrap()
}

/// An SSE response sent as the given pieces, one body chunk each, with a
/// short pause between them so that they tend to arrive separately.
fn sse<P: Into<Bytes> + Send + 'static>(pieces: Vec<P>) -> Response {
    let stream = futures::stream::iter(pieces).then(|piece| async move {
        tokio::time::sleep(Duration::from_millis(2)).await;
        Ok::<_, Infallible>(piece.into())
    });
    event_stream(Body::from_stream(stream))
}

/// The whole text cut into `size`-byte pieces, splitting lines and UTF-8
/// characters anywhere.
fn cut(text: &str, size: usize) -> Vec<Vec<u8>> {
    text.as_bytes().chunks(size).map(<[u8]>::to_vec).collect()
}

fn a_reply(words: &[&str]) -> Response {
    let mut pieces: Vec<String> = words.iter().map(|w| text(w)).collect();
    pieces.push(finish("stop"));
    pieces.push(usage(5, words.len() as u64));
    pieces.push(DONE.into());
    sse(pieces)
}

fn status(code: u16, body: Value) -> Response {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

/// Sets its flag when dropped: tells that the server stopped streaming.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A delta every 10 ms, forever; `closed` is set once hyper drops it.
fn endless(closed: Arc<AtomicBool>) -> impl Stream<Item = Result<Bytes, Infallible>> + Send {
    futures::stream::unfold((0u64, DropFlag(closed)), |(n, flag)| async move {
        tokio::time::sleep(Duration::from_millis(10)).await;
        Some((Ok(Bytes::from(text(&format!("tick{n} ")))), (n + 1, flag)))
    })
}

// ---------------------------------------------------------------- client

fn config(base_url: &str) -> OpenAiConfig {
    OpenAiConfig {
        base_url: base_url.to_owned(),
        api_key: Some("sk-test-key".into()),
        model: "primary-model".into(),
        fallback_models: Vec::new(),
        max_retries: 2,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(20),
        request_timeout: DEADLINE,
        idle_timeout: DEADLINE,
    }
}

fn request(message: &str, history: Vec<HistoryMessage>, options: Value) -> RuntimeRequest {
    RuntimeRequest {
        run_id: "run-1".into(),
        session_key: "agent:main:main".into(),
        session_id: "s1".into(),
        message: message.into(),
        history,
        options,
        deadline_ms: None,
        inputs: Default::default(),
        attachments: Vec::new(),
    }
}

fn entry(role: &str, text: &str) -> HistoryMessage {
    HistoryMessage {
        role: role.into(),
        content_json: json!([{ "type": "text", "text": text }]).to_string(),
    }
}

async fn run(
    config: OpenAiConfig,
    request: RuntimeRequest,
) -> Vec<Result<RuntimeEvent, RuntimeError>> {
    let runtime = OpenAiRuntime::new(config).unwrap();
    let stream = runtime
        .execute(request, CancellationToken::new())
        .await
        .unwrap();
    tokio::time::timeout(DEADLINE, stream.collect())
        .await
        .expect("the stream did not end")
}

fn deltas(events: &[Result<RuntimeEvent, RuntimeError>]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            Ok(RuntimeEvent::AssistantDelta(d)) => Some(d.as_str()),
            _ => None,
        })
        .collect()
}

fn finished(reason: &str) -> Result<RuntimeEvent, RuntimeError> {
    Ok(RuntimeEvent::Finished {
        stop_reason: reason.into(),
    })
}

fn only_error(events: &[Result<RuntimeEvent, RuntimeError>]) -> &RuntimeError {
    match events {
        [Err(error)] => error,
        other => panic!("expected one error, got {other:?}"),
    }
}

/// Polls `check` until it holds or the deadline passes.
// ----------------------------------------------------------------- tests

#[tokio::test]
async fn streams_deltas_usage_and_finish() {
    let server = serve(|_, _| {
        let body = [
            ": keep-alive\r\n\r\n".to_owned(),
            data(&chunk(json!({"role": "assistant", "content": ""}), None)),
            text("Hel"),
            text("lo"),
            // CRLF line endings and a comment between events.
            text(" wörld").replace('\n', "\r\n"),
            ": still here\n".into(),
            finish("stop"),
            usage(11, 3),
            DONE.into(),
        ]
        .concat();
        // Pieces of 7 bytes: lines and UTF-8 characters split anywhere.
        sse(cut(&body, 7))
    })
    .await;
    let history = vec![
        entry("user", "earlier question"),
        entry("toolResult", "ignored"),
        entry("assistant", "earlier answer"),
    ];
    let options =
        json!({"system": "Be brief.", "temperature": 0.5, "maxTokens": 64, "unrelated": true});
    let events = run(
        config(&server.base_url),
        request("and now?", history, options),
    )
    .await;

    assert_eq!(
        events,
        vec![
            Ok(RuntimeEvent::AssistantDelta("Hel".into())),
            Ok(RuntimeEvent::AssistantDelta("lo".into())),
            Ok(RuntimeEvent::AssistantDelta(" wörld".into())),
            Ok(RuntimeEvent::Usage(Usage {
                input_tokens: 11,
                output_tokens: 3,
                total_tokens: 14,
            })),
            finished("stop"),
        ]
    );

    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    let body = &seen[0].body;
    assert_eq!(body["model"], "primary-model");
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"], json!({"include_usage": true}));
    assert_eq!(body["temperature"], 0.5);
    assert_eq!(body["max_tokens"], 64);
    assert_eq!(
        body["messages"],
        json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "earlier question"},
            {"role": "assistant", "content": "earlier answer"},
            {"role": "user", "content": "and now?"},
        ])
    );
    assert_eq!(
        seen[0].headers.get("authorization").unwrap(),
        "Bearer sk-test-key"
    );
}

#[tokio::test]
async fn a_run_may_choose_the_model_and_no_key_sends_no_header() {
    let server = serve(|_, _| a_reply(&["ok"])).await;
    let config = OpenAiConfig {
        api_key: None,
        ..config(&server.base_url)
    };
    let events = run(
        config,
        request("hi", Vec::new(), json!({"model": "chosen-model"})),
    )
    .await;
    assert_eq!(deltas(&events), "ok");
    assert_eq!(server.models(), vec!["chosen-model"]);
    let seen = server.seen();
    assert!(seen[0].headers.get("authorization").is_none());
    assert!(seen[0].body.get("temperature").is_none());
    assert_eq!(
        seen[0].body["messages"],
        json!([{"role": "user", "content": "hi"}])
    );
}

#[tokio::test]
async fn tool_calls_stream_as_start_then_fragments() {
    let server = serve(|_, _| {
        let call = |index: u64, id: Option<&str>, name: Option<&str>, args: &str| {
            let mut function = json!({ "arguments": args });
            let mut call = json!({ "index": index });
            if let Some(name) = name {
                function["name"] = json!(name);
            }
            if let Some(id) = id {
                call["id"] = json!(id);
                call["type"] = json!("function");
            }
            call["function"] = function;
            data(&chunk(json!({ "tool_calls": [call] }), None))
        };
        sse(vec![
            data(&chunk(json!({"role": "assistant", "content": null}), None)),
            call(0, Some("call_1"), Some("get_weather"), ""),
            call(0, None, None, "{\"ci"),
            call(0, None, None, "ty\": \"Pa"),
            call(0, None, None, "ris\"}"),
            call(1, Some("call_2"), Some("get_time"), ""),
            call(1, None, None, "{"),
            call(1, None, None, "}"),
            finish("tool_calls"),
            usage(20, 9),
            DONE.into(),
        ])
    })
    .await;
    let events = run(
        config(&server.base_url),
        request("weather?", Vec::new(), json!({})),
    )
    .await;

    let update = |id: &str, fragment: &str| {
        Ok(RuntimeEvent::ToolUpdate {
            tool_call_id: id.into(),
            partial_json: fragment.into(),
        })
    };
    assert_eq!(
        events,
        vec![
            Ok(RuntimeEvent::ToolStart {
                tool_call_id: "call_1".into(),
                name: "get_weather".into(),
                arguments_json: String::new(),
            }),
            update("call_1", "{\"ci"),
            update("call_1", "ty\": \"Pa"),
            update("call_1", "ris\"}"),
            Ok(RuntimeEvent::ToolStart {
                tool_call_id: "call_2".into(),
                name: "get_time".into(),
                arguments_json: String::new(),
            }),
            update("call_2", "{"),
            update("call_2", "}"),
            Ok(RuntimeEvent::Usage(Usage {
                input_tokens: 20,
                output_tokens: 9,
                total_tokens: 29,
            })),
            finished("tool_calls"),
        ]
    );
    // The fragments of call_1 add up to its arguments.
    let arguments: String = events
        .iter()
        .filter_map(|e| match e {
            Ok(RuntimeEvent::ToolUpdate {
                tool_call_id,
                partial_json,
            }) if tool_call_id == "call_1" => Some(partial_json.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&arguments).unwrap(),
        json!({"city": "Paris"})
    );
}

#[tokio::test]
async fn rate_limits_are_retried_until_success() {
    let server = serve(|index, _| match index {
        0 => {
            let mut response = status(429, json!({"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}));
            response
                .headers_mut()
                .insert("retry-after", "0".parse().unwrap());
            response
        }
        1 => status(429, json!({"error": {"message": "slow down"}})),
        _ => a_reply(&["third ", "time"]),
    })
    .await;
    let events = run(
        config(&server.base_url),
        request("hi", Vec::new(), json!({})),
    )
    .await;
    assert_eq!(deltas(&events), "third time");
    assert_eq!(events.last(), Some(&finished("stop")));
    assert!(events.iter().all(Result::is_ok), "{events:?}");
    assert_eq!(server.seen().len(), 3);
}

#[tokio::test]
async fn the_last_rate_limit_is_returned_when_retries_run_out() {
    let server =
        serve(|_, _| status(429, json!({"error": {"message": "Rate limit reached"}}))).await;
    let config = OpenAiConfig {
        max_retries: 1,
        ..config(&server.base_url)
    };
    let events = run(config, request("hi", Vec::new(), json!({}))).await;
    let error = only_error(&events);
    assert_eq!(error.kind, ErrorKind::RateLimit);
    assert!(error.retryable);
    assert!(
        error.message.contains("Rate limit reached"),
        "{}",
        error.message
    );
    assert_eq!(server.seen().len(), 2);
}

#[tokio::test]
async fn falls_back_to_the_next_model() {
    let server = serve(|_, body| {
        if body["model"] == "primary-model" {
            status(
                503,
                json!({"error": {"message": "overloaded", "type": "server_error"}}),
            )
        } else {
            a_reply(&["from ", "fallback"])
        }
    })
    .await;
    let config = OpenAiConfig {
        max_retries: 1,
        fallback_models: vec!["fallback-model".into()],
        ..config(&server.base_url)
    };
    let events = run(config, request("hi", Vec::new(), json!({}))).await;
    assert_eq!(deltas(&events), "from fallback");
    assert_eq!(events.last(), Some(&finished("stop")));
    assert_eq!(
        server.models(),
        vec!["primary-model", "primary-model", "fallback-model"]
    );
}

#[tokio::test]
async fn when_every_model_fails_the_last_error_is_returned() {
    let server = serve(|_, body| {
        status(
            503,
            json!({"error": {"message": format!("{} is down", body["model"].as_str().unwrap())}}),
        )
    })
    .await;
    let config = OpenAiConfig {
        max_retries: 0,
        fallback_models: vec!["second".into(), "third".into()],
        ..config(&server.base_url)
    };
    let events = run(config, request("hi", Vec::new(), json!({}))).await;
    let error = only_error(&events);
    assert_eq!(error.kind, ErrorKind::Unknown);
    assert!(error.message.contains("third is down"), "{}", error.message);
    assert_eq!(server.models(), vec!["primary-model", "second", "third"]);
}

#[tokio::test]
async fn context_length_is_not_retried() {
    let server = serve(|_, _| {
        status(
            400,
            json!({"error": {
                "message": "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }}),
        )
    })
    .await;
    let config = OpenAiConfig {
        fallback_models: vec!["fallback-model".into()],
        ..config(&server.base_url)
    };
    let events = run(config, request("a very long prompt", Vec::new(), json!({}))).await;
    let error = only_error(&events);
    assert_eq!(error.kind, ErrorKind::ContextLength);
    assert!(!error.retryable);
    assert!(
        error.message.contains("maximum context length"),
        "{}",
        error.message
    );
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn other_client_errors_are_not_retried() {
    let server = serve(|_, _| {
        status(
            401,
            json!({"error": {"message": "Incorrect API key provided"}}),
        )
    })
    .await;
    let events = run(
        config(&server.base_url),
        request("hi", Vec::new(), json!({})),
    )
    .await;
    let error = only_error(&events);
    assert_eq!(error.kind, ErrorKind::Unknown);
    assert!(!error.retryable);
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn cancelling_stops_the_stream_and_closes_the_connection() {
    let closed = Arc::new(AtomicBool::new(false));
    let server_closed = Arc::clone(&closed);
    let server =
        serve(move |_, _| event_stream(Body::from_stream(endless(Arc::clone(&server_closed)))))
            .await;
    let runtime = OpenAiRuntime::new(config(&server.base_url)).unwrap();
    let cancel = CancellationToken::new();
    let mut stream = runtime
        .execute(request("count", Vec::new(), json!({})), cancel.clone())
        .await
        .unwrap();

    let first = tokio::time::timeout(DEADLINE, stream.next()).await.unwrap();
    assert_eq!(
        first,
        Some(Ok(RuntimeEvent::AssistantDelta("tick0 ".into())))
    );
    cancel.cancel();
    let next = tokio::time::timeout(DEADLINE, stream.next())
        .await
        .expect("the stream did not end after the cancel");
    assert_eq!(next, None);
    wait_until("the server sees the connection closed", DEADLINE, || {
        closed.load(Ordering::SeqCst)
    })
    .await;
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn dropping_the_stream_closes_the_connection() {
    let closed = Arc::new(AtomicBool::new(false));
    let server_closed = Arc::clone(&closed);
    let server =
        serve(move |_, _| event_stream(Body::from_stream(endless(Arc::clone(&server_closed)))))
            .await;
    let runtime = OpenAiRuntime::new(config(&server.base_url)).unwrap();
    let cancel = CancellationToken::new();
    let mut stream = runtime
        .execute(request("count", Vec::new(), json!({})), cancel.clone())
        .await
        .unwrap();
    let first = tokio::time::timeout(DEADLINE, stream.next()).await.unwrap();
    assert!(matches!(first, Some(Ok(RuntimeEvent::AssistantDelta(_)))));
    drop(stream);
    wait_until("the server sees the connection closed", DEADLINE, || {
        closed.load(Ordering::SeqCst)
    })
    .await;
    assert!(
        !cancel.is_cancelled(),
        "dropping must not cancel the caller's token"
    );
}

#[tokio::test]
async fn cancelling_aborts_a_backoff() {
    let server = serve(|_, _| {
        let mut response = status(429, json!({"error": {"message": "come back in an hour"}}));
        response
            .headers_mut()
            .insert("retry-after", "3600".parse().unwrap());
        response
    })
    .await;
    let config = OpenAiConfig {
        max_backoff: Duration::from_secs(3600),
        ..config(&server.base_url)
    };
    let runtime = OpenAiRuntime::new(config).unwrap();
    let cancel = CancellationToken::new();
    let mut stream = runtime
        .execute(request("hi", Vec::new(), json!({})), cancel.clone())
        .await
        .unwrap();
    wait_until("the first request arrives", DEADLINE, || {
        server.seen().len() == 1
    })
    .await;
    cancel.cancel();
    let next = tokio::time::timeout(DEADLINE, stream.next())
        .await
        .expect("the stream did not end after the cancel");
    assert_eq!(next, None);
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn content_filter_is_a_refusal() {
    let server = serve(|_, _| {
        sse(vec![
            text("Sure, here"),
            finish("content_filter"),
            DONE.into(),
        ])
    })
    .await;
    let events = run(
        config(&server.base_url),
        request("hi", Vec::new(), json!({})),
    )
    .await;
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(
        events[0],
        Ok(RuntimeEvent::AssistantDelta("Sure, here".into()))
    );
    let Err(error) = &events[1] else {
        panic!("{events:?}")
    };
    assert_eq!(error.kind, ErrorKind::Refusal);
    assert!(!error.retryable);
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn a_refusal_delta_is_a_refusal() {
    let server = serve(|_, _| {
        sse(vec![
            data(&chunk(
                json!({"role": "assistant", "content": null, "refusal": ""}),
                None,
            )),
            data(&chunk(json!({"refusal": "I'm sorry, "}), None)),
            data(&chunk(json!({"refusal": "I can't help with that."}), None)),
            finish("stop"),
            usage(4, 8),
            DONE.into(),
        ])
    })
    .await;
    let events = run(
        config(&server.base_url),
        request("hi", Vec::new(), json!({})),
    )
    .await;
    let error = only_error(&events);
    assert_eq!(error.kind, ErrorKind::Refusal);
    assert!(!error.retryable);
    assert!(
        error.message.contains("I'm sorry, I can't help with that."),
        "{}",
        error.message
    );
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn a_stream_that_breaks_after_output_fails_without_retry() {
    let server = serve(|_, _| {
        let pieces: Vec<Result<Bytes, std::io::Error>> = vec![
            Ok(Bytes::from(text("partial "))),
            Err(std::io::Error::other("upstream went away")),
        ];
        let stream = futures::stream::iter(pieces).then(|piece| async move {
            tokio::time::sleep(Duration::from_millis(2)).await;
            piece
        });
        event_stream(Body::from_stream(stream))
    })
    .await;
    let events = run(
        config(&server.base_url),
        request("hi", Vec::new(), json!({})),
    )
    .await;
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(
        events[0],
        Ok(RuntimeEvent::AssistantDelta("partial ".into()))
    );
    let Err(error) = &events[1] else {
        panic!("{events:?}")
    };
    assert_eq!(error.kind, ErrorKind::Unknown);
    assert_eq!(server.seen().len(), 1, "output went out: no retry");
}

#[tokio::test]
async fn a_stream_that_ends_early_before_output_is_retried() {
    let server = serve(|index, _| match index {
        // A role-only delta emits nothing, then the body just ends.
        0 => sse(vec![data(&chunk(json!({"role": "assistant"}), None))]),
        _ => a_reply(&["whole"]),
    })
    .await;
    let events = run(
        config(&server.base_url),
        request("hi", Vec::new(), json!({})),
    )
    .await;
    assert_eq!(deltas(&events), "whole");
    assert_eq!(events.last(), Some(&finished("stop")));
    assert_eq!(server.seen().len(), 2);
}

#[tokio::test]
async fn errors_inside_the_stream_are_classified() {
    let server = serve(|index, _| match index {
        0 => sse(vec![data(&json!({"error": {"message": "The server had an error while processing your request.", "type": "server_error"}}))]),
        _ => sse(vec![
            text("before "),
            data(&json!({"error": {"message": "Rate limit reached for tokens", "type": "tokens", "code": "rate_limit_exceeded"}})),
        ]),
    })
    .await;
    let events = run(
        config(&server.base_url),
        request("hi", Vec::new(), json!({})),
    )
    .await;
    // The first error came before any output and was retried; the second
    // came after output, so it ends the run.
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(
        events[0],
        Ok(RuntimeEvent::AssistantDelta("before ".into()))
    );
    let Err(error) = &events[1] else {
        panic!("{events:?}")
    };
    assert_eq!(error.kind, ErrorKind::RateLimit);
    assert_eq!(server.seen().len(), 2);
}

#[tokio::test]
async fn an_idle_stream_times_out() {
    let server = serve(|_, _| {
        let stream =
            futures::stream::once(async { Ok::<_, Infallible>(Bytes::from(text("then silence"))) })
                .chain(futures::stream::pending());
        event_stream(Body::from_stream(stream))
    })
    .await;
    let config = OpenAiConfig {
        // No retry: on a starved machine the first chunk itself might come
        // late, and then the run must still end in the same timeout.
        max_retries: 0,
        idle_timeout: Duration::from_millis(200),
        ..config(&server.base_url)
    };
    let events = run(config, request("hi", Vec::new(), json!({}))).await;
    let (last, before) = events.split_last().unwrap();
    let Err(error) = last else {
        panic!("{events:?}")
    };
    assert_eq!(error.kind, ErrorKind::Timeout);
    assert!(error.retryable);
    assert!(
        before
            .iter()
            .all(|e| e == &Ok(RuntimeEvent::AssistantDelta("then silence".into()))),
        "{events:?}"
    );
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn a_whole_json_completion_is_accepted() {
    let server = serve(|_, _| {
        status(
            200,
            json!({
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "choices": [{
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": "not streamed",
                        "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\":1}"}}],
                    },
                    "finish_reason": "tool_calls",
                }],
                "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5},
            }),
        )
    })
    .await;
    let events = run(
        config(&server.base_url),
        request("hi", Vec::new(), json!({})),
    )
    .await;
    assert_eq!(
        events,
        vec![
            Ok(RuntimeEvent::AssistantDelta("not streamed".into())),
            Ok(RuntimeEvent::ToolStart {
                tool_call_id: "call_9".into(),
                name: "lookup".into(),
                arguments_json: "{\"q\":1}".into(),
            }),
            Ok(RuntimeEvent::Usage(Usage {
                input_tokens: 2,
                output_tokens: 3,
                total_tokens: 5,
            })),
            finished("tool_calls"),
        ]
    );
}

#[tokio::test]
async fn a_server_that_never_answers_times_out_after_retries() {
    // Accepts connections and never writes a byte.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&accepted);
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            held.push(socket);
        }
    });
    let config = OpenAiConfig {
        max_retries: 1,
        request_timeout: Duration::from_millis(100),
        ..config(&format!("http://{addr}/v1"))
    };
    let events = run(config, request("hi", Vec::new(), json!({}))).await;
    let error = only_error(&events);
    assert_eq!(error.kind, ErrorKind::Timeout);
    assert!(error.retryable);
    wait_until("both attempts connected", DEADLINE, || {
        accepted.load(Ordering::SeqCst) == 2
    })
    .await;
    task.abort();
}

#[tokio::test]
async fn invalid_options_fail_at_once() {
    let runtime = OpenAiRuntime::new(config("http://127.0.0.1:9/v1")).unwrap();
    let error = runtime
        .execute(
            request("hi", Vec::new(), json!({"maxTokens": "many"})),
            CancellationToken::new(),
        )
        .await
        .err()
        .expect("bad options must be rejected");
    assert_eq!(error.kind, ErrorKind::Unknown);
    assert!(!error.retryable);
    assert_eq!(runtime.name(), "openai");
}

#[tokio::test]
async fn a_steered_message_is_answered_by_one_more_completion() {
    let server = serve(|index, _| {
        if index == 0 {
            a_reply(&["first ", "answer"])
        } else {
            a_reply(&["second"])
        }
    })
    .await;
    let request = request("question", Vec::new(), json!({}));
    // Waiting when the first completion finishes: taken there.
    assert!(request.inputs.push(SteerInput {
        id: "steer-1".into(),
        message: "and also this".into(),
    }));
    let events = run(config(&server.base_url), request).await;
    let taken = events
        .iter()
        .position(|e| matches!(e, Ok(RuntimeEvent::InputTaken { id }) if id == "steer-1"))
        .expect("the input is taken");
    assert_eq!(deltas(&events[..taken]), "first answer");
    assert_eq!(deltas(&events[taken..]), "second");
    let finishes: Vec<_> = events
        .iter()
        .filter(|e| matches!(e, Ok(RuntimeEvent::Finished { .. })))
        .collect();
    assert_eq!(finishes, [&finished("stop")], "one turn, one end");
    // The second completion sees the first answer and the steered message.
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    let messages = seen[1].body["messages"].as_array().unwrap();
    let tail: Vec<(&str, &str)> = messages
        .iter()
        .rev()
        .take(3)
        .rev()
        .map(|m| (m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect();
    assert_eq!(
        tail,
        [
            ("user", "question"),
            ("assistant", "first answer"),
            ("user", "and also this")
        ]
    );
}

#[tokio::test]
async fn attachments_are_sent_as_content_parts() {
    let server = serve(|_, _| a_reply(&["a cat"])).await;
    let mut request = request("what is this?", Vec::new(), json!({}));
    request.attachments = vec![Attachment {
        mime_type: "image/jpeg".into(),
        file_name: "cat.jpg".into(),
        data: vec![0xff, 0xd8, 0xff],
    }];
    let events = run(config(&server.base_url), request).await;
    assert_eq!(deltas(&events), "a cat");
    let sent = &server.seen()[0].body["messages"];
    assert_eq!(
        sent.as_array().unwrap().last().unwrap()["content"],
        json!([
            { "type": "text", "text": "what is this?" },
            { "type": "image_url", "image_url": { "url": "data:image/jpeg;base64,/9j/" } },
        ])
    );
}
