//! Raw gRPC clients of the store and the coordinator, and requests that
//! call as a given caller: `authorization: Bearer <token>`, or no header.

use clawgate_proto::run_coordinator::v1::run_coordinator_client::RunCoordinatorClient;
use clawgate_proto::session_store::v1::AcquireLeasesRequest;
use clawgate_proto::session_store::v1::session_store_client::SessionStoreClient;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

/// A channel to the gRPC server at `url`, connected.
pub async fn channel(url: String) -> Channel {
    Channel::from_shared(url.clone())
        .expect("a gRPC URL")
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

pub async fn store_client(url: String) -> SessionStoreClient<Channel> {
    SessionStoreClient::new(channel(url).await)
}

pub async fn coordinator_client(url: String) -> RunCoordinatorClient<Channel> {
    RunCoordinatorClient::new(channel(url).await)
}

/// `message` with `authorization: Bearer <token>` when a token is given.
pub fn with_token<T>(message: T, token: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = token {
        let value: MetadataValue<_> = format!("Bearer {token}").parse().expect("visible ASCII");
        request.metadata_mut().insert("authorization", value);
    }
    request
}

/// What a caller that is no coordinator would send to seize the work: take
/// partition 0's lease by force, for a member that does not exist.
pub fn lease_grab() -> AcquireLeasesRequest {
    AcquireLeasesRequest {
        member: "intruder".into(),
        address: "http://127.0.0.1:9".into(),
        partitions: vec![0],
        ttl_ms: 60_000,
        steal: true,
    }
}
