//! gRPC server reflection as a client sees it, in both versions: `v1` and
//! `v1alpha` (what Python's grpcio-reflection and older grpcurl speak).

use tonic::transport::{Channel, Endpoint};

/// The services every clawgate gRPC server serves besides its own.
pub const INFRASTRUCTURE: [&str; 3] = [
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V1Alpha,
}

/// One version's two questions: `ListServices`, and whether the file that
/// defines `symbol` is served (what grpcurl asks before a call).
macro_rules! reflection_calls {
    ($module:ident, $list:ident, $describe:ident) => {
        async fn $list(channel: Channel) -> Vec<String> {
            use tonic_reflection::pb::$module::server_reflection_request::MessageRequest;
            use tonic_reflection::pb::$module::server_reflection_response::MessageResponse;
            match ask!($module, channel, MessageRequest::ListServices(String::new())) {
                Some(MessageResponse::ListServicesResponse(list)) => {
                    list.service.into_iter().map(|s| s.name).collect()
                }
                other => panic!("ListServices answered {other:?}"),
            }
        }

        async fn $describe(channel: Channel, symbol: &str) -> bool {
            use tonic_reflection::pb::$module::server_reflection_request::MessageRequest;
            use tonic_reflection::pb::$module::server_reflection_response::MessageResponse;
            let request = MessageRequest::FileContainingSymbol(symbol.to_owned());
            matches!(
                ask!($module, channel, request),
                Some(MessageResponse::FileDescriptorResponse(files)) if !files.file_descriptor_proto.is_empty()
            )
        }
    };
}

/// Sends one reflection request of version `$module`; its one answer.
macro_rules! ask {
    ($module:ident, $channel:expr, $request:expr) => {{
        use tonic_reflection::pb::$module::ServerReflectionRequest;
        use tonic_reflection::pb::$module::server_reflection_client::ServerReflectionClient;
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some($request),
        };
        let mut answers = ServerReflectionClient::new($channel)
            .server_reflection_info(tokio_stream::iter([request]))
            .await
            .expect("reflection answers")
            .into_inner();
        answers
            .message()
            .await
            .expect("an answer")
            .expect("one")
            .message_response
    }};
}

reflection_calls!(v1, list_v1, describe_v1);
reflection_calls!(v1alpha, list_v1alpha, describe_v1alpha);

async fn channel(url: &str) -> Channel {
    Endpoint::from_shared(url.to_owned())
        .expect("a gRPC URL")
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

/// The services `url` lists over reflection `version`, sorted.
pub async fn list_services(url: &str, version: Version) -> Vec<String> {
    let channel = channel(url).await;
    let mut names = match version {
        Version::V1 => list_v1(channel).await,
        Version::V1Alpha => list_v1alpha(channel).await,
    };
    names.sort();
    names
}

/// Whether reflection `version` at `url` serves the file defining `symbol`.
pub async fn describes(url: &str, version: Version, symbol: &str) -> bool {
    let channel = channel(url).await;
    match version {
        Version::V1 => describe_v1(channel, symbol).await,
        Version::V1Alpha => describe_v1alpha(channel, symbol).await,
    }
}

/// Asserts that both reflection versions at `url` list exactly `served`
/// plus [`INFRASTRUCTURE`], and that each listed service can be described.
pub async fn assert_lists_exactly(url: &str, served: &[&str]) {
    let mut expected: Vec<String> = served
        .iter()
        .chain(INFRASTRUCTURE.iter())
        .map(|s| (*s).to_owned())
        .collect();
    expected.sort();
    for version in [Version::V1, Version::V1Alpha] {
        let listed = list_services(url, version).await;
        assert_eq!(listed, expected, "{url} over reflection {version:?}");
        for name in &listed {
            assert!(
                describes(url, version, name).await,
                "{url} over reflection {version:?} cannot describe {name}"
            );
        }
    }
}
