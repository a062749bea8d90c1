//! No client input may panic or wedge the coordinator (issue 9): every
//! method of `RunCoordinator` and of the `AgentRuntime` adapter
//! (`serve_runtime` over the echo runtime), as the descriptor set lists
//! them, gets generated requests with random and edge values in every field
//! (`clawgate_system_tests::proto_fuzz`). The servers run in this process
//! (the coordinator in front of an embedded store, both over gRPC). Each
//! answer must be OK or a clean refusal, no thread may panic, and afterwards
//! the health check and a real request must succeed: a new run is admitted
//! and its events stream; the runtime executes a turn to its end.
//!
//! Waits and settles are configured short so that a generated Wait or
//! Cancel cannot hold the test up; streams are read for a bounded time.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clawgate_proto::agent_runtime::v1 as rt;
use clawgate_proto::agent_runtime::v1::agent_runtime_client::AgentRuntimeClient;
use clawgate_proto::agent_runtime::v1::agent_runtime_server::AgentRuntimeServer;
use clawgate_proto::run_coordinator::v1 as pb;
use clawgate_proto::run_coordinator::v1::run_coordinator_client::RunCoordinatorClient;
use clawgate_system_tests::proto_fuzz::{CallLimits, Fuzz, Report, Seeds};
use common::*;
use futures::future::BoxFuture;
use run_coordinator::config::CoordinatorConfig;
use run_coordinator::runtime::echo::{EchoConfig, EchoRuntime};
use run_coordinator::runtime::grpc::{RuntimeService, serve_runtime};
use tonic::transport::Channel;

const COORDINATOR: &str = "clawgate.run_coordinator.v1.RunCoordinator";
const RUNTIME: &str = "clawgate.agent_runtime.v1.AgentRuntime";
const SEED: u64 = 0xc00d_1a7e_f022_2026;
const CASES: u32 = 64;
const STEP: Duration = Duration::from_secs(10);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn limits() -> CallLimits {
    CallLimits {
        deadline: Duration::from_secs(5),
        stream_window: Duration::from_millis(100),
        stream_messages: 8,
    }
}

/// Waits and settles short (a generated Wait or Cancel is over in
/// milliseconds), no cap a pile of slow generated runs could exhaust.
fn config() -> CoordinatorConfig {
    CoordinatorConfig {
        max_executing: 10_000,
        default_wait: Duration::from_millis(20),
        max_wait: Duration::from_millis(50),
        cancel_settle: Duration::from_millis(50),
        delta_interval: Duration::from_millis(1),
        ..CoordinatorConfig::default()
    }
}

static PROBES: AtomicU64 = AtomicU64::new(0);

/// A new run on a session of its own is admitted, and its event log is
/// readable from the start.
fn coordinator_probe(channel: Channel) -> BoxFuture<'static, Result<(), String>> {
    Box::pin(async move {
        let n = PROBES.fetch_add(1, Ordering::Relaxed);
        let mut client = RunCoordinatorClient::new(channel);
        let mut submit = submit_req(&format!("probe-{n}"), &format!("probe-{n}"), "ping");
        submit.options_json = r#"{"paceMs": 0}"#.into();
        let admitted = client
            .submit(submit)
            .await
            .map_err(|s| format!("Submit: {s:?}"))?
            .into_inner();
        if admitted.admission != pb::Admission::Accepted as i32 {
            return Err(format!("Submit: {admitted:?}"));
        }
        let mut events = client
            .subscribe(pb::SubscribeRequest {
                filter: Some(pb::subscribe_request::Filter::RunId(format!("probe-{n}"))),
                from_seq: 0,
                epoch: String::new(),
            })
            .await
            .map_err(|s| format!("Subscribe: {s:?}"))?
            .into_inner();
        // First the `subscribed` item, then the run's first event.
        match tokio::time::timeout(STEP, events.message()).await {
            Ok(Ok(Some(pb::SubscribeResponse {
                item: Some(pb::subscribe_response::Item::Subscribed(_)),
            }))) => {}
            other => return Err(format!("Subscribe: {other:?}")),
        }
        match tokio::time::timeout(STEP, events.message()).await {
            Ok(Ok(Some(pb::SubscribeResponse {
                item: Some(pb::subscribe_response::Item::Event(event)),
            }))) if event.seq == 1 => Ok(()),
            other => Err(format!("Subscribe: {other:?}")),
        }
    })
}

fn coordinator_seeds(epoch: &str) -> Seeds {
    let path = |method: &str| format!("/{COORDINATOR}/{method}");
    let mut submit = submit_req("fuzz-new", "fuzz", "a new run");
    submit.timeout_ms = 1000;
    submit.options_json = r#"{"paceMs": 1, "toolCall": true}"#.into();
    submit.requester = "fuzz-requester".into();
    submit.label = Some("fuzz label".into());
    let by_run = |run_id: &str, from_seq| pb::SubscribeRequest {
        filter: Some(pb::subscribe_request::Filter::RunId(run_id.into())),
        from_seq,
        epoch: epoch.into(),
    };
    Seeds::default()
        .with(&path("Submit"), &submit)
        // The key of the finished run again, with another message.
        .with(
            &path("Submit"),
            &submit_req("fuzz-done", "fuzz", "another question"),
        )
        .with(
            &path("Get"),
            &pb::GetRequest {
                run_id: "fuzz-done".into(),
            },
        )
        .with(
            &path("Wait"),
            &pb::WaitRequest {
                run_id: "fuzz-done".into(),
                timeout_ms: 10,
            },
        )
        .with(
            &path("Cancel"),
            &pb::CancelRequest {
                target: Some(pb::cancel_request::Target::RunId("fuzz-done".into())),
                requester: "fuzz-requester".into(),
            },
        )
        .with(&path("Subscribe"), &by_run("fuzz-live", 0))
        .with(&path("Subscribe"), &by_run("fuzz-done", 1))
        .with(
            &path("Subscribe"),
            &pb::SubscribeRequest {
                filter: Some(pb::subscribe_request::Filter::All(true)),
                from_seq: u64::MAX,
                epoch: epoch.into(),
            },
        )
        .with(
            &path("ListActive"),
            &pb::ListActiveRequest {
                session_key: Some("fuzz".into()),
            },
        )
}

/// Waits (Wait is capped short here) until the run is terminal.
async fn until_done(client: &mut RunCoordinatorClient<Channel>, run_id: &str) {
    wait_for(format!("{run_id} to finish"), DEADLINE, async || {
        wait(client, run_id, 50).await.terminal
    })
    .await;
}

fn fuzz_coordinator(runtime: &tokio::runtime::Runtime) -> Report {
    let (cluster, channel) = runtime.block_on(async {
        let cluster = Sandbox::start(Recording::echo(1, 2), config()).await;
        let mut client = cluster.client();
        // A finished run with a long message and answer (an error about it
        // carries its snapshot), and one that runs for the whole test.
        submit(
            &mut client,
            submit_req("fuzz-done", "fuzz", &"a long question ".repeat(4096)),
        )
        .await;
        until_done(&mut client, "fuzz-done").await;
        let mut live = submit_req("fuzz-live", "fuzz-live", "slow words for a long time");
        live.options_json = r#"{"paceMs": 500, "chunks": 1000}"#.into();
        submit(&mut client, live).await;
        let channel = tonic::transport::Endpoint::from_shared(cluster.coordinator_url().to_owned())
            .unwrap()
            .connect()
            .await
            .unwrap();
        (cluster, channel)
    });
    let epoch = cluster.coordinator().epoch().to_owned();
    let report = Fuzz {
        runtime,
        channel,
        service: COORDINATOR,
        health: COORDINATOR,
        dictionary: vec![
            "fuzz-done".into(),
            "fuzz-live".into(),
            "fuzz".into(),
            "agent:main:fuzz".into(),
            "fuzz-requester".into(),
            "agent".into(),
            epoch.clone(),
        ],
        seeds: coordinator_seeds(&epoch),
        cases: CASES,
        seed: SEED,
        limits: limits(),
    }
    .run(&coordinator_probe);
    runtime.block_on(cluster.finish());
    report
}

/// One turn to its end through the adapter.
fn runtime_probe(channel: Channel) -> BoxFuture<'static, Result<(), String>> {
    Box::pin(async move {
        let n = PROBES.fetch_add(1, Ordering::Relaxed);
        let mut client = AgentRuntimeClient::new(channel);
        let mut events = client
            .execute(rt::ExecuteRequest {
                run_id: format!("probe-{n}"),
                message: "ping".into(),
                options_json: r#"{"paceMs": 0}"#.into(),
                ..Default::default()
            })
            .await
            .map_err(|s| format!("Execute: {s:?}"))?
            .into_inner();
        loop {
            match tokio::time::timeout(STEP, events.message()).await {
                Ok(Ok(Some(rt::RuntimeEvent {
                    event: Some(rt::runtime_event::Event::Finished(_)),
                }))) => return Ok(()),
                Ok(Ok(Some(_))) => {}
                other => return Err(format!("Execute: {other:?}")),
            }
        }
    })
}

fn fuzz_agent_runtime(runtime: &tokio::runtime::Runtime) -> Report {
    let channel = runtime.block_on(async {
        let echo = Arc::new(EchoRuntime::new(EchoConfig {
            chunks: 2,
            pace: Duration::from_millis(1),
        }));
        let (health, health_service) = tonic_health::server::health_reporter();
        health
            .set_serving::<AgentRuntimeServer<RuntimeService<EchoRuntime>>>()
            .await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(health_service)
                .add_service(serve_runtime(echo))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        tonic::transport::Endpoint::from_shared(url)
            .unwrap()
            .connect()
            .await
            .unwrap()
    });
    let path = |method: &str| format!("/{RUNTIME}/{method}");
    let seeds = Seeds::default()
        .with(
            &path("Execute"),
            &rt::ExecuteRequest {
                run_id: "fuzz-run".into(),
                session_key: "agent:main:fuzz".into(),
                session_id: "6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9".into(),
                message: "hello there".into(),
                history: vec![rt::HistoryMessage {
                    role: "user".into(),
                    content_json: r#"[{"type":"text","text":"before"}]"#.into(),
                }],
                options_json: r#"{"paceMs": 1, "toolCall": true}"#.into(),
                deadline_ms: 1_700_000_000_000,
                attachments: vec![rt::Attachment {
                    mime_type: "image/png".into(),
                    file_name: "dot.png".into(),
                    data: vec![0x89, b'P', b'N', b'G'],
                }],
            },
        )
        .with(
            &path("Steer"),
            &rt::SteerRequest {
                run_id: "fuzz-run".into(),
                input_id: "fuzz-steer".into(),
                message: "and this".into(),
            },
        )
        .with(
            &path("Cancel"),
            &rt::CancelRequest {
                run_id: "fuzz-run".into(),
            },
        );
    Fuzz {
        runtime,
        channel,
        service: RUNTIME,
        health: RUNTIME,
        dictionary: vec!["fuzz-run".into(), "agent:main:fuzz".into()],
        seeds,
        cases: CASES,
        seed: SEED,
        limits: limits(),
    }
    .run(&runtime_probe)
}

/// One test for both services, one after another: the panic hook that
/// watches the servers is process-wide.
#[test]
fn every_method_answers_any_input_cleanly() {
    let runtime = runtime();
    let mut report = Report::default();
    let started = Instant::now();
    report.merge("coordinator", fuzz_coordinator(&runtime));
    eprintln!("coordinator: {:?}", started.elapsed());
    let started = Instant::now();
    report.merge("agent runtime", fuzz_agent_runtime(&runtime));
    eprintln!("agent runtime: {:?}", started.elapsed());
    eprintln!("{report}");
    report.assert_clean();
}
