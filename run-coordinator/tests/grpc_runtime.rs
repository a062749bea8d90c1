//! `GrpcRuntime` against real tonic servers on 127.0.0.1:0, serving runtimes
//! written here (through `serve_runtime`) or a raw service implementation.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use clawgate_proto::agent_runtime::v1 as pb;
use clawgate_proto::agent_runtime::v1::agent_runtime_client::AgentRuntimeClient;
use clawgate_proto::agent_runtime::v1::agent_runtime_server::{self, AgentRuntimeServer};
use clawgate_system_tests::wait::wait_until;
use futures::StreamExt;
use futures::stream::BoxStream;
use run_coordinator::runtime::echo::{EchoConfig, EchoRuntime};
use run_coordinator::runtime::grpc::{GrpcRuntime, GrpcRuntimeConfig, serve_runtime};
use run_coordinator::runtime::{
    AgentRuntime, ErrorKind, HistoryMessage, RuntimeError, RuntimeEvent, RuntimeRequest,
    RuntimeStream, Usage,
};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;

/// Generous bound for anything that should happen "promptly".
const PROMPTLY: Duration = Duration::from_secs(5);

struct TestServer {
    address: String,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        self.task.abort();
    }
}

async fn start<T: agent_runtime_server::AgentRuntime>(
    service: AgentRuntimeServer<T>,
) -> TestServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let (shutdown, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    TestServer {
        address,
        shutdown: Some(shutdown),
        task,
    }
}

async fn client_for(server: &TestServer) -> GrpcRuntime {
    GrpcRuntime::connect(&server.address, GrpcRuntimeConfig::default())
        .await
        .unwrap()
}

fn request(run_id: &str, message: &str, options: serde_json::Value) -> RuntimeRequest {
    RuntimeRequest {
        run_id: run_id.into(),
        session_key: "agent:main:main".into(),
        session_id: "session-1".into(),
        message: message.into(),
        history: Vec::new(),
        options,
        deadline_ms: None,
        inputs: Default::default(),
        attachments: Vec::new(),
    }
}

/// Waits (with a deadline) until `check` holds.
async fn next(stream: &mut RuntimeStream) -> Option<Result<RuntimeEvent, RuntimeError>> {
    tokio::time::timeout(PROMPTLY, stream.next())
        .await
        .expect("the stream stalled")
}

async fn collect(stream: RuntimeStream) -> Vec<Result<RuntimeEvent, RuntimeError>> {
    tokio::time::timeout(PROMPTLY, stream.collect())
        .await
        .expect("the stream did not end")
}

/// Plays a fixed script and remembers the request it got.
struct ScriptedRuntime {
    script: Vec<Result<RuntimeEvent, RuntimeError>>,
    refuse: Option<RuntimeError>,
    seen: Mutex<Option<RuntimeRequest>>,
}

impl ScriptedRuntime {
    fn new(script: Vec<Result<RuntimeEvent, RuntimeError>>) -> Self {
        Self {
            script,
            refuse: None,
            seen: Mutex::new(None),
        }
    }
}

#[async_trait]
impl AgentRuntime for ScriptedRuntime {
    fn name(&self) -> &'static str {
        "scripted"
    }

    async fn execute(
        &self,
        request: RuntimeRequest,
        _cancel: CancellationToken,
    ) -> Result<RuntimeStream, RuntimeError> {
        *self.seen.lock().unwrap() = Some(request);
        if let Some(error) = &self.refuse {
            return Err(error.clone());
        }
        Ok(futures::stream::iter(self.script.clone()).boxed())
    }
}

/// Streams a delta every few milliseconds until its token fires, and
/// records that it did.
#[derive(Default)]
struct ForeverRuntime {
    started: AtomicBool,
    saw_cancel: Arc<AtomicBool>,
}

#[async_trait]
impl AgentRuntime for ForeverRuntime {
    fn name(&self) -> &'static str {
        "forever"
    }

    async fn execute(
        &self,
        _request: RuntimeRequest,
        cancel: CancellationToken,
    ) -> Result<RuntimeStream, RuntimeError> {
        self.started.store(true, Ordering::SeqCst);
        let saw_cancel = self.saw_cancel.clone();
        let watched = cancel.clone();
        tokio::spawn(async move {
            watched.cancelled().await;
            saw_cancel.store(true, Ordering::SeqCst);
        });
        let stream = futures::stream::unfold((0u64, cancel), |(n, cancel)| async move {
            tokio::select! {
                () = cancel.cancelled() => None,
                () = tokio::time::sleep(Duration::from_millis(2)) => {
                    Some((Ok(RuntimeEvent::AssistantDelta(format!("d{n} "))), (n + 1, cancel)))
                }
            }
        });
        Ok(stream.boxed())
    }
}

#[tokio::test]
async fn streams_every_event_in_order() {
    let script = vec![
        Ok(RuntimeEvent::AssistantDelta("Let me look. ".into())),
        Ok(RuntimeEvent::ToolStart {
            tool_call_id: "call-1".into(),
            name: "search".into(),
            arguments_json: r#"{"q":"rust"}"#.into(),
        }),
        Ok(RuntimeEvent::ToolUpdate {
            tool_call_id: "call-1".into(),
            partial_json: r#"{"hits":"#.into(),
        }),
        Ok(RuntimeEvent::ToolResult {
            tool_call_id: "call-1".into(),
            result_json: r#"{"hits":3}"#.into(),
            is_error: false,
        }),
        Ok(RuntimeEvent::ToolResult {
            tool_call_id: "call-2".into(),
            result_json: r#""nope""#.into(),
            is_error: true,
        }),
        Ok(RuntimeEvent::AssistantDelta("Found ".into())),
        Ok(RuntimeEvent::AssistantDelta("3 hits.".into())),
        Ok(RuntimeEvent::Usage(Usage {
            input_tokens: 11,
            output_tokens: 7,
            total_tokens: 18,
        })),
        Ok(RuntimeEvent::Finished {
            stop_reason: "tool_calls".into(),
        }),
    ];
    // Anything after `finished` is not part of the turn and is not sent.
    let mut played = script.clone();
    played.push(Ok(RuntimeEvent::AssistantDelta("after the end".into())));
    let runtime = Arc::new(ScriptedRuntime::new(played));
    let server = start(serve_runtime(runtime.clone())).await;
    let client = client_for(&server).await;
    assert_eq!(client.name(), "grpc");

    let mut sent = request(
        "run-1",
        "find rust",
        serde_json::json!({"model": "m", "n": [1, 2]}),
    );
    sent.history = vec![
        HistoryMessage {
            role: "user".into(),
            content_json: r#"[{"type":"text","text":"hi"}]"#.into(),
        },
        HistoryMessage {
            role: "assistant".into(),
            content_json: r#"[{"type":"text","text":"hello"}]"#.into(),
        },
    ];
    sent.deadline_ms = Some(1_900_000_000_000);
    let stream = client
        .execute(sent.clone(), CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(collect(stream).await, script);

    let seen = runtime.seen.lock().unwrap().clone().unwrap();
    assert_eq!(seen.run_id, sent.run_id);
    assert_eq!(seen.session_key, sent.session_key);
    assert_eq!(seen.session_id, sent.session_id);
    assert_eq!(seen.message, sent.message);
    assert_eq!(seen.history, sent.history);
    assert_eq!(seen.options, sent.options);
    assert_eq!(seen.deadline_ms, sent.deadline_ms);

    // No deadline and no options travel as 0 and "{}".
    let mut bare = request("run-2", "x", serde_json::Value::Null);
    bare.deadline_ms = None;
    let stream = client
        .execute(bare, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(collect(stream).await.len(), script.len());
    let seen = runtime.seen.lock().unwrap().clone().unwrap();
    assert_eq!(seen.deadline_ms, None);
    assert_eq!(seen.options, serde_json::json!({}));
}

#[tokio::test]
async fn cancelling_ends_the_stream_and_reaches_the_runtime() {
    let runtime = Arc::new(ForeverRuntime::default());
    let server = start(serve_runtime(runtime.clone())).await;
    let client = client_for(&server).await;

    let cancel = CancellationToken::new();
    let mut stream = client
        .execute(
            request("run-c", "go", serde_json::json!({})),
            cancel.clone(),
        )
        .await
        .unwrap();
    let first = next(&mut stream).await;
    assert!(
        matches!(first, Some(Ok(RuntimeEvent::AssistantDelta(_)))),
        "{first:?}"
    );
    assert!(!runtime.saw_cancel.load(Ordering::SeqCst));

    cancel.cancel();
    // The server keeps sending until it notices; the stream ends at once.
    assert!(next(&mut stream).await.is_none());
    wait_until("the runtime to observe cancellation", PROMPTLY, || {
        runtime.saw_cancel.load(Ordering::SeqCst)
    })
    .await;
}

#[tokio::test]
async fn dropping_the_stream_cancels_the_runtime() {
    let runtime = Arc::new(ForeverRuntime::default());
    let server = start(serve_runtime(runtime.clone())).await;
    let client = client_for(&server).await;

    let mut stream = client
        .execute(
            request("run-d", "go", serde_json::json!({})),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert!(matches!(next(&mut stream).await, Some(Ok(_))));
    // No token, no Cancel call: only the reset of the HTTP/2 stream.
    drop(stream);
    wait_until(
        "the runtime to observe the client leaving",
        PROMPTLY,
        || runtime.saw_cancel.load(Ordering::SeqCst),
    )
    .await;
}

#[tokio::test]
async fn already_cancelled_runs_do_not_start() {
    let runtime = Arc::new(ForeverRuntime::default());
    let server = start(serve_runtime(runtime.clone())).await;
    let client = client_for(&server).await;
    let cancel = CancellationToken::new();
    cancel.cancel();
    let stream = client
        .execute(request("run-e", "go", serde_json::json!({})), cancel)
        .await
        .unwrap();
    assert!(collect(stream).await.is_empty());
    assert!(!runtime.started.load(Ordering::SeqCst));
}

#[tokio::test]
async fn runtime_failures_keep_their_kind() {
    let failure = RuntimeError::new(ErrorKind::ContextLength, "prompt too long", false);
    let runtime = Arc::new(ScriptedRuntime::new(vec![
        Ok(RuntimeEvent::AssistantDelta("par".into())),
        Err(failure.clone()),
        Ok(RuntimeEvent::AssistantDelta("never sent".into())),
    ]));
    let server = start(serve_runtime(runtime)).await;
    let client = client_for(&server).await;
    let stream = client
        .execute(
            request("run-f", "x", serde_json::json!({})),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(
        collect(stream).await,
        vec![Ok(RuntimeEvent::AssistantDelta("par".into())), Err(failure)]
    );

    // A runtime that refuses to start fails the same way, retryability kept.
    let refusal = RuntimeError::new(ErrorKind::RateLimit, "slow down", true);
    let mut runtime = ScriptedRuntime::new(Vec::new());
    runtime.refuse = Some(refusal.clone());
    let server = start(serve_runtime(Arc::new(runtime))).await;
    let client = client_for(&server).await;
    let stream = client
        .execute(
            request("run-g", "x", serde_json::json!({})),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(collect(stream).await, vec![Err(refusal)]);
}

#[tokio::test]
async fn an_unreachable_runtime_is_a_retryable_error() {
    // A port that nothing listens on any more.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);

    let config = GrpcRuntimeConfig {
        connect_timeout: Duration::from_secs(2),
        ..GrpcRuntimeConfig::default()
    };
    // Connecting is lazy: the coordinator may start before the runtime.
    let client = GrpcRuntime::connect(&address, config).await.unwrap();
    let outcome = tokio::time::timeout(
        PROMPTLY,
        client.execute(
            request("run-h", "x", serde_json::json!({})),
            CancellationToken::new(),
        ),
    )
    .await
    .expect("execute hung against a closed port");
    let error = match outcome {
        Err(error) => error,
        Ok(stream) => match collect(stream).await.into_iter().next() {
            Some(Err(error)) => error,
            other => panic!("expected an error, got {other:?}"),
        },
    };
    assert!(error.retryable, "{error:?}");
    assert_eq!(error.kind, ErrorKind::Unknown);
    assert!(error.message.contains(&address), "{}", error.message);
    assert!(error.message.contains("Unavailable"), "{}", error.message);

    let bad = GrpcRuntime::connect("http://bad address", GrpcRuntimeConfig::default()).await;
    assert!(!bad.unwrap_err().retryable);
}

#[tokio::test]
async fn the_echo_runtime_works_as_an_external_service() {
    let echo = Arc::new(EchoRuntime::new(EchoConfig {
        chunks: 3,
        pace: Duration::from_millis(1),
    }));
    let server = start(serve_runtime(echo)).await;
    let client = client_for(&server).await;

    let stream = client
        .execute(
            request(
                "run-i",
                "hello over grpc",
                serde_json::json!({"toolCall": true}),
            ),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    let events: Vec<RuntimeEvent> = collect(stream)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert!(
        matches!(&events[0], RuntimeEvent::ToolStart { name, .. } if name == "echo"),
        "{events:?}"
    );
    assert!(matches!(
        &events[1],
        RuntimeEvent::ToolResult {
            is_error: false,
            ..
        }
    ));
    let text: String = events
        .iter()
        .filter_map(|e| match e {
            RuntimeEvent::AssistantDelta(d) => Some(d.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(text, "hello over grpc");
    assert_eq!(
        events[events.len() - 2],
        RuntimeEvent::Usage(Usage {
            input_tokens: 3,
            output_tokens: 3,
            total_tokens: 6
        })
    );
    assert_eq!(
        events.last(),
        Some(&RuntimeEvent::Finished {
            stop_reason: "stop".into()
        })
    );

    let stream = client
        .execute(
            request(
                "run-j",
                "abc",
                serde_json::json!({"fail": "boom", "failKind": "refusal"}),
            ),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    let events = collect(stream).await;
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(
        events[1],
        Err(RuntimeError::new(ErrorKind::Refusal, "boom", false))
    );

    // Options the echo runtime rejects come back as a failure too.
    let stream = client
        .execute(
            request("run-k", "abc", serde_json::json!({"chunks": "many"})),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    let events = collect(stream).await;
    assert!(matches!(&events[..], [Err(e)] if e.message.contains("invalid echo options")));
}

#[tokio::test]
async fn a_steered_message_crosses_the_wire_and_is_answered_in_the_same_turn() {
    let echo = Arc::new(EchoRuntime::new(EchoConfig {
        chunks: 4,
        pace: Duration::from_millis(20),
    }));
    let server = start(serve_runtime(echo)).await;
    let client = client_for(&server).await;
    let request = request("run-steer", "first", serde_json::json!({}));
    let inputs = request.inputs.clone();
    let mut stream = client
        .execute(request, CancellationToken::new())
        .await
        .unwrap();
    // Offered while the first reply streams: taken at its end.
    let Some(Ok(RuntimeEvent::AssistantDelta(first))) = next(&mut stream).await else {
        panic!("the reply starts with text");
    };
    assert!(inputs.push(run_coordinator::runtime::SteerInput {
        id: "steer-1".into(),
        message: "second".into(),
    }));
    let mut text = first;
    let mut taken_at = None;
    while let Some(item) = next(&mut stream).await {
        match item.unwrap() {
            RuntimeEvent::AssistantDelta(delta) => text.push_str(&delta),
            RuntimeEvent::InputTaken { id } => {
                assert_eq!(id, "steer-1");
                taken_at = Some(text.clone());
            }
            RuntimeEvent::Finished { .. } => break,
            _ => {}
        }
    }
    assert_eq!(
        taken_at.as_deref(),
        Some("first"),
        "taken at the reply's end"
    );
    assert_eq!(text, "firstsecond");
}

#[tokio::test]
async fn a_runtime_without_steer_takes_nothing() {
    let server = start(AgentRuntimeServer::new(StubbornService::default())).await;
    let client = client_for(&server).await;
    let request = request("run-old", "x", serde_json::json!({}));
    let inputs = request.inputs.clone();
    let mut stream = client
        .execute(request, CancellationToken::new())
        .await
        .unwrap();
    assert!(inputs.push(run_coordinator::runtime::SteerInput {
        id: "steer-old".into(),
        message: "never taken".into(),
    }));
    for _ in 0..20 {
        let event = next(&mut stream).await.unwrap().unwrap();
        assert!(
            !matches!(event, RuntimeEvent::InputTaken { .. }),
            "{event:?}"
        );
    }
}

#[tokio::test]
async fn models_cross_the_wire_and_an_old_runtime_offers_none() {
    let echo = Arc::new(EchoRuntime::new(EchoConfig::default()));
    let server = start(serve_runtime(echo.clone())).await;
    let client = client_for(&server).await;
    let catalog = client.models().await.unwrap();
    assert_eq!(catalog, echo.models().await.unwrap());
    assert_eq!(catalog.default_model.as_deref(), Some("echo"));
    assert_eq!(catalog.models[0].provider, "clawgate");

    // A runtime written before ListModels answers UNIMPLEMENTED.
    let old = start(AgentRuntimeServer::new(StubbornService::default())).await;
    let catalog = client_for(&old).await.models().await.unwrap();
    assert!(catalog.models.is_empty() && catalog.default_model.is_none());
}

#[tokio::test]
async fn the_cancel_rpc_stops_a_running_execution() {
    let runtime = Arc::new(ForeverRuntime::default());
    let server = start(serve_runtime(runtime.clone())).await;
    let mut raw = AgentRuntimeClient::connect(server.address.clone())
        .await
        .unwrap();

    let mut events = raw
        .execute(pb::ExecuteRequest {
            run_id: "run-l".into(),
            options_json: "{}".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(events.message().await.unwrap().is_some());

    let unknown = raw
        .cancel(pb::CancelRequest {
            run_id: "no-such-run".into(),
        })
        .await
        .unwrap();
    assert!(!unknown.into_inner().cancelled);
    let cancelled = raw
        .cancel(pb::CancelRequest {
            run_id: "run-l".into(),
        })
        .await
        .unwrap();
    assert!(cancelled.into_inner().cancelled);
    wait_until("the runtime to observe cancellation", PROMPTLY, || {
        runtime.saw_cancel.load(Ordering::SeqCst)
    })
    .await;
    // The forever runtime stops when cancelled, so the call ends.
    tokio::time::timeout(PROMPTLY, async {
        while events.message().await.unwrap().is_some() {}
    })
    .await
    .expect("the execution kept going after Cancel");
    let again = raw
        .cancel(pb::CancelRequest {
            run_id: "run-l".into(),
        })
        .await
        .unwrap();
    assert!(!again.into_inner().cancelled);

    // A request the adapter cannot decode is rejected up front.
    let status = raw
        .execute(pb::ExecuteRequest {
            run_id: "run-m".into(),
            options_json: "{not json".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
}

/// A raw service that streams every millisecond, ignoring everything, and
/// records the `Cancel` calls it gets.
#[derive(Clone, Default)]
struct StubbornService {
    cancels: Arc<Mutex<Vec<String>>>,
}

#[async_trait]
impl agent_runtime_server::AgentRuntime for StubbornService {
    async fn steer(
        &self,
        _request: tonic::Request<pb::SteerRequest>,
    ) -> Result<tonic::Response<pb::SteerResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("Steer"))
    }

    async fn list_models(
        &self,
        _request: tonic::Request<pb::ListModelsRequest>,
    ) -> Result<tonic::Response<pb::ListModelsResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("ListModels"))
    }

    type ExecuteStream = BoxStream<'static, Result<pb::RuntimeEvent, tonic::Status>>;

    async fn execute(
        &self,
        _request: tonic::Request<pb::ExecuteRequest>,
    ) -> Result<tonic::Response<Self::ExecuteStream>, tonic::Status> {
        let stream = futures::stream::repeat_with(|| {
            Ok(pb::RuntimeEvent {
                event: Some(pb::runtime_event::Event::AssistantDelta(
                    pb::AssistantDelta {
                        text: "more ".into(),
                    },
                )),
            })
        })
        .then(|event| async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            event
        });
        Ok(tonic::Response::new(stream.boxed()))
    }

    async fn cancel(
        &self,
        request: tonic::Request<pb::CancelRequest>,
    ) -> Result<tonic::Response<pb::CancelResponse>, tonic::Status> {
        self.cancels
            .lock()
            .unwrap()
            .push(request.into_inner().run_id);
        Ok(tonic::Response::new(pb::CancelResponse { cancelled: true }))
    }
}

#[tokio::test]
async fn cancelling_calls_cancel_and_ignores_a_server_that_keeps_sending() {
    let service = StubbornService::default();
    let server = start(AgentRuntimeServer::new(service.clone())).await;
    let client = client_for(&server).await;

    let cancel = CancellationToken::new();
    let mut stream = client
        .execute(
            request("run-n", "go", serde_json::json!({})),
            cancel.clone(),
        )
        .await
        .unwrap();
    for _ in 0..3 {
        assert!(matches!(next(&mut stream).await, Some(Ok(_))));
    }
    cancel.cancel();
    assert!(next(&mut stream).await.is_none());
    assert!(next(&mut stream).await.is_none());
    wait_until("the Cancel call", PROMPTLY, || {
        service.cancels.lock().unwrap().as_slice() == ["run-n"]
    })
    .await;
}

#[tokio::test]
async fn cancel_is_called_even_when_the_stream_is_dropped_at_once() {
    let service = StubbornService::default();
    let server = start(AgentRuntimeServer::new(service.clone())).await;
    let client = client_for(&server).await;

    let cancel = CancellationToken::new();
    let stream = client
        .execute(
            request("run-o", "go", serde_json::json!({})),
            cancel.clone(),
        )
        .await
        .unwrap();
    // The coordinator may stop reading without polling the stream again.
    cancel.cancel();
    drop(stream);
    wait_until("the Cancel call", PROMPTLY, || {
        service.cancels.lock().unwrap().as_slice() == ["run-o"]
    })
    .await;
}

#[tokio::test]
async fn the_request_timeout_bounds_the_whole_call() {
    let service = StubbornService::default();
    let server = start(AgentRuntimeServer::new(service.clone())).await;
    let config = GrpcRuntimeConfig {
        request_timeout: Some(Duration::from_millis(200)),
        ..GrpcRuntimeConfig::default()
    };
    let client = GrpcRuntime::connect(&server.address, config).await.unwrap();
    let stream = client
        .execute(
            request("run-p", "go", serde_json::json!({})),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    let events = collect(stream).await;
    let Some(Err(error)) = events.last() else {
        panic!("expected a timeout, got {} events", events.len())
    };
    assert_eq!(error.kind, ErrorKind::Timeout);
    assert!(error.retryable);
    assert!(events[..events.len() - 1].iter().all(Result::is_ok));
    // The runtime is told to stop.
    wait_until("the Cancel call", PROMPTLY, || {
        service.cancels.lock().unwrap().as_slice() == ["run-p"]
    })
    .await;
}

/// A raw service that sends a fixed list of events and then hangs.
#[derive(Clone)]
struct HangingService {
    events: Vec<pb::RuntimeEvent>,
}

#[async_trait]
impl agent_runtime_server::AgentRuntime for HangingService {
    async fn steer(
        &self,
        _request: tonic::Request<pb::SteerRequest>,
    ) -> Result<tonic::Response<pb::SteerResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("Steer"))
    }

    async fn list_models(
        &self,
        _request: tonic::Request<pb::ListModelsRequest>,
    ) -> Result<tonic::Response<pb::ListModelsResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("ListModels"))
    }

    type ExecuteStream = BoxStream<'static, Result<pb::RuntimeEvent, tonic::Status>>;

    async fn execute(
        &self,
        _request: tonic::Request<pb::ExecuteRequest>,
    ) -> Result<tonic::Response<Self::ExecuteStream>, tonic::Status> {
        let events = futures::stream::iter(self.events.clone().into_iter().map(Ok));
        Ok(tonic::Response::new(
            events.chain(futures::stream::pending()).boxed(),
        ))
    }

    async fn cancel(
        &self,
        _request: tonic::Request<pb::CancelRequest>,
    ) -> Result<tonic::Response<pb::CancelResponse>, tonic::Status> {
        Ok(tonic::Response::new(pb::CancelResponse {
            cancelled: false,
        }))
    }
}

#[tokio::test]
async fn the_stream_ends_at_finished_or_failed_whatever_the_server_does() {
    use pb::runtime_event::Event;
    let delta = |text: &str| pb::RuntimeEvent {
        event: Some(Event::AssistantDelta(pb::AssistantDelta {
            text: text.into(),
        })),
    };
    let terminals = [
        (
            Event::Finished(pb::Finished {
                stop_reason: "length".into(),
            }),
            Ok(RuntimeEvent::Finished {
                stop_reason: "length".into(),
            }),
        ),
        (
            Event::Failed(pb::Failed {
                kind: pb::ErrorKind::Timeout as i32,
                message: "too slow".into(),
                retryable: true,
            }),
            Err(RuntimeError::new(ErrorKind::Timeout, "too slow", true)),
        ),
        (
            // An unspecified kind reads as unknown.
            Event::Failed(pb::Failed {
                kind: pb::ErrorKind::Unspecified as i32,
                message: "?".into(),
                retryable: false,
            }),
            Err(RuntimeError::new(ErrorKind::Unknown, "?", false)),
        ),
    ];
    for (terminal, expected) in terminals {
        let service = HangingService {
            events: vec![
                delta("a"),
                // An event from a newer contract is skipped.
                pb::RuntimeEvent { event: None },
                pb::RuntimeEvent {
                    event: Some(terminal),
                },
                delta("after the end"),
            ],
        };
        let server = start(AgentRuntimeServer::new(service)).await;
        let client = client_for(&server).await;
        let stream = client
            .execute(
                request("run-q", "x", serde_json::json!({})),
                CancellationToken::new(),
            )
            .await
            .unwrap();
        assert_eq!(
            collect(stream).await,
            vec![Ok(RuntimeEvent::AssistantDelta("a".into())), expected]
        );
    }
}

#[tokio::test]
async fn attachments_cross_the_wire_as_bytes() {
    let echo = Arc::new(EchoRuntime::new(EchoConfig {
        chunks: 1,
        pace: Duration::from_millis(1),
    }));
    let server = start(serve_runtime(echo)).await;
    let client = client_for(&server).await;
    let mut request = request("run-files", "see", serde_json::json!({}));
    request.attachments = vec![run_coordinator::runtime::Attachment {
        mime_type: "image/png".into(),
        file_name: "a.png".into(),
        data: vec![0, 1, 2, 255],
    }];
    let stream = client
        .execute(request, CancellationToken::new())
        .await
        .unwrap();
    let text: String = collect(stream)
        .await
        .into_iter()
        .filter_map(|e| match e {
            Ok(RuntimeEvent::AssistantDelta(d)) => Some(d),
            _ => None,
        })
        .collect();
    assert_eq!(text, "see\n[a.png: image/png, 4 bytes]");
}
