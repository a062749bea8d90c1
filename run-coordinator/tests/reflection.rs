//! The coordinator's gRPC server reflection, in both versions (`v1` and
//! `v1alpha`), as a tool like grpcurl uses it: `list` names exactly the
//! services the server answers, and `describe` of the coordinator's service
//! gives a file descriptor that declares it with every method, whose
//! imports all resolve. The reflection messages are decoded here by hand
//! (a few prost structs), so what is checked is the bytes on the wire.

mod common;

use clawgate_system_tests::proto_fuzz::{RawCodec, methods};
use clawgate_system_tests::reflection::INFRASTRUCTURE;
use common::*;
use prost::Message;
use prost::bytes::Bytes;
use run_coordinator::config::CoordinatorConfig;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};

const SERVICE: &str = "clawgate.run_coordinator.v1.RunCoordinator";

/// `grpc.reflection.v1(alpha).ServerReflectionRequest` (both versions have
/// the same fields).
#[derive(Clone, PartialEq, Message)]
struct ReflectionRequest {
    #[prost(string, tag = "1")]
    host: String,
    #[prost(oneof = "Ask", tags = "3, 4, 7")]
    ask: Option<Ask>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Ask {
    #[prost(string, tag = "3")]
    FileByFilename(String),
    #[prost(string, tag = "4")]
    FileContainingSymbol(String),
    #[prost(string, tag = "7")]
    ListServices(String),
}

#[derive(Clone, PartialEq, Message)]
struct ReflectionResponse {
    #[prost(oneof = "Answer", tags = "4, 6, 7")]
    answer: Option<Answer>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Answer {
    #[prost(message, tag = "4")]
    Files(FileDescriptorResponse),
    #[prost(message, tag = "6")]
    Services(ListServiceResponse),
    #[prost(message, tag = "7")]
    Error(ErrorResponse),
}

#[derive(Clone, PartialEq, Message)]
struct FileDescriptorResponse {
    #[prost(bytes = "vec", repeated, tag = "1")]
    file_descriptor_proto: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
struct ListServiceResponse {
    #[prost(message, repeated, tag = "1")]
    service: Vec<ServiceResponse>,
}

#[derive(Clone, PartialEq, Message)]
struct ServiceResponse {
    #[prost(string, tag = "1")]
    name: String,
}

#[derive(Clone, PartialEq, Message)]
struct ErrorResponse {
    #[prost(int32, tag = "1")]
    error_code: i32,
    #[prost(string, tag = "2")]
    error_message: String,
}

/// What is read of `google.protobuf.FileDescriptorProto`.
#[derive(Clone, PartialEq, Message)]
struct FileDescriptor {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    package: String,
    #[prost(string, repeated, tag = "3")]
    dependency: Vec<String>,
    #[prost(message, repeated, tag = "4")]
    message_type: Vec<Named>,
    #[prost(message, repeated, tag = "6")]
    service: Vec<ServiceDescriptor>,
}

#[derive(Clone, PartialEq, Message)]
struct Named {
    #[prost(string, tag = "1")]
    name: String,
}

#[derive(Clone, PartialEq, Message)]
struct ServiceDescriptor {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(message, repeated, tag = "2")]
    method: Vec<MethodDescriptor>,
}

#[derive(Clone, PartialEq, Message)]
struct MethodDescriptor {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    input_type: String,
    #[prost(string, tag = "3")]
    output_type: String,
    #[prost(bool, tag = "5")]
    client_streaming: bool,
    #[prost(bool, tag = "6")]
    server_streaming: bool,
}

/// (name, input, output, client streaming, server streaming), types fully
/// qualified with a leading dot, as descriptors write them.
type Method = (String, String, String, bool, bool);

const VERSIONS: [&str; 2] = ["grpc.reflection.v1", "grpc.reflection.v1alpha"];

/// One reflection request of `version`; its one answer.
async fn ask(channel: &Channel, version: &str, ask: Ask) -> Answer {
    try_ask(channel, version, ask)
        .await
        .unwrap_or_else(|status| panic!("{version}: {status:?}"))
}

/// `ask`, or the status the answer stream ended with instead.
async fn try_ask(channel: &Channel, version: &str, ask: Ask) -> Result<Answer, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.expect("the channel is ready");
    let path = PathAndQuery::try_from(format!("/{version}.ServerReflection/ServerReflectionInfo"))
        .unwrap();
    let request = ReflectionRequest {
        host: String::new(),
        ask: Some(ask),
    };
    let requests = futures::stream::iter([Bytes::from(request.encode_to_vec())]);
    let mut answers = grpc
        .streaming(tonic::Request::new(requests), path, RawCodec)
        .await?
        .into_inner();
    let answer = answers.message().await?.expect("one answer");
    Ok(ReflectionResponse::decode(answer)
        .unwrap_or_else(|e| panic!("{version}: an answer that does not decode: {e}"))
        .answer
        .unwrap_or_else(|| panic!("{version}: an empty answer")))
}

fn files(version: &str, what: &str, answer: Answer) -> Vec<FileDescriptor> {
    match answer {
        Answer::Files(files) => files
            .file_descriptor_proto
            .iter()
            .map(|bytes| FileDescriptor::decode(bytes.as_slice()).unwrap())
            .collect(),
        other => panic!("{version}: {what} answered {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lists_exactly_the_coordinator_s_services_and_describes_it() {
    let cluster = Sandbox::start(Recording::echo(1, 1), CoordinatorConfig::default()).await;
    let channel = Endpoint::from_shared(cluster.coordinator_url().to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap();
    // The methods the coordinator is built with, from the compiled protos.
    let compiled: Vec<Method> = methods(SERVICE)
        .iter()
        .map(|m| {
            (
                m.name().to_owned(),
                format!(".{}", m.input().full_name()),
                format!(".{}", m.output().full_name()),
                m.is_client_streaming(),
                m.is_server_streaming(),
            )
        })
        .collect();
    let mut expected: Vec<&str> = INFRASTRUCTURE.to_vec();
    expected.push(SERVICE);
    expected.sort_unstable();
    for version in VERSIONS {
        // list: exactly what this server answers; not the store or the
        // runtime, whose descriptors the server has too (its imports).
        let Answer::Services(listed) =
            ask(&channel, version, Ask::ListServices(String::new())).await
        else {
            panic!("{version}: list answered otherwise");
        };
        let mut listed: Vec<String> = listed.service.into_iter().map(|s| s.name).collect();
        listed.sort();
        assert_eq!(listed, expected, "{version}: list");

        // describe: the file that declares the service, with every method.
        let answer = ask(&channel, version, Ask::FileContainingSymbol(SERVICE.into())).await;
        let mut known = files(version, "describe", answer);
        let file = known
            .iter()
            .find(|f| f.service.iter().any(|s| s.name == "RunCoordinator"))
            .unwrap_or_else(|| panic!("{version}: no file declares RunCoordinator"))
            .clone();
        assert_eq!(
            file.name,
            "clawgate/run_coordinator/v1/run_coordinator.proto"
        );
        assert_eq!(file.package, "clawgate.run_coordinator.v1");
        let service = file.service.iter().find(|s| s.name == "RunCoordinator");
        let described: Vec<Method> = service
            .unwrap()
            .method
            .iter()
            .map(|m| {
                (
                    m.name.clone(),
                    m.input_type.clone(),
                    m.output_type.clone(),
                    m.client_streaming,
                    m.server_streaming,
                )
            })
            .collect();
        assert_eq!(described, compiled, "{version}: the methods described");
        let method = |name: &str| described.iter().find(|m| m.0 == name).cloned();
        let pkg = ".clawgate.run_coordinator.v1";
        assert_eq!(
            method("Submit"),
            Some((
                "Submit".into(),
                format!("{pkg}.SubmitRequest"),
                format!("{pkg}.SubmitResponse"),
                false,
                false
            ))
        );
        assert_eq!(
            method("Subscribe").map(|m| (m.3, m.4)),
            Some((false, true)),
            "{version}: Subscribe streams its answers"
        );
        let messages: Vec<&str> = file.message_type.iter().map(|m| m.name.as_str()).collect();
        for name in ["SubmitRequest", "RunSnapshot", "RunEvent", "StreamReset"] {
            assert!(
                messages.contains(&name),
                "{version}: {name} in {messages:?}"
            );
        }

        // Every import resolves, transitively, by file name: what a tool
        // needs to build the messages.
        let mut pending: Vec<String> = known.iter().flat_map(|f| f.dependency.clone()).collect();
        while let Some(name) = pending.pop() {
            if known.iter().any(|f| f.name == name) {
                continue;
            }
            let answer = ask(&channel, version, Ask::FileByFilename(name.clone())).await;
            let got = files(version, &format!("file {name}"), answer);
            assert!(got.iter().any(|f| f.name == name), "{version}: {name}");
            pending.extend(got.iter().flat_map(|f| f.dependency.clone()));
            known.extend(got);
        }
        for dependency in &file.dependency {
            assert!(known.iter().any(|f| &f.name == dependency));
        }
        // A method and a message resolve as symbols too.
        for symbol in [
            format!("{SERVICE}.Submit"),
            "clawgate.run_coordinator.v1.SubmitRequest".to_owned(),
        ] {
            let answer = ask(&channel, version, Ask::FileContainingSymbol(symbol.clone())).await;
            let got = files(version, &symbol, answer);
            assert!(
                got.iter().any(|f| f.name == file.name),
                "{version}: {symbol}"
            );
        }
        // What no descriptor defines is NOT_FOUND (an error answer or the
        // stream's status), never a descriptor.
        let unknown = Ask::FileContainingSymbol("no.such.Service".into());
        match try_ask(&channel, version, unknown).await {
            Ok(Answer::Error(error)) => {
                assert_eq!(error.error_code, tonic::Code::NotFound as i32, "{error:?}")
            }
            Err(status) => assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}"),
            Ok(other) => panic!("{version}: an unknown symbol answered {other:?}"),
        }
    }
    cluster.finish().await;
}
