//! A run's durable record and the lease table, as the multi-process tests
//! read them back after their faults.

use std::collections::HashMap;

use clawgate_proto::session_store::v1 as store_pb;
use clawgate_proto::session_store::v1::session_store_client::SessionStoreClient;
use tonic::transport::Channel;

/// `run_id`'s record in the store, if it has one.
pub async fn run_record(
    store: &mut SessionStoreClient<Channel>,
    run_id: &str,
) -> Option<store_pb::RunRecord> {
    try_run_record(store, run_id)
        .await
        .expect("the store answers GetRun")
}

/// [`run_record`], or the store's refusal (while it recovers from a fault).
pub async fn try_run_record(
    store: &mut SessionStoreClient<Channel>,
    run_id: &str,
) -> Result<Option<store_pb::RunRecord>, tonic::Status> {
    let request = store_pb::GetRunRequest {
        run_id: run_id.to_owned(),
    };
    Ok(store.get_run(request).await?.into_inner().record)
}

/// Whether a run with this status has ended.
pub fn is_terminal(status: store_pb::RunStatus) -> bool {
    use store_pb::RunStatus as S;
    matches!(
        status,
        S::Ok | S::Error | S::Aborted | S::Superseded | S::Lost | S::Timeout
    )
}

/// The store's lease table (with the store's clock, `now_ms`).
pub async fn lease_table(store: &mut SessionStoreClient<Channel>) -> store_pb::ListLeasesResponse {
    store
        .list_leases(store_pb::ListLeasesRequest {})
        .await
        .expect("the store answers ListLeases")
        .into_inner()
}

/// How many live leases (held, not expired on the store's clock) each
/// holder has, by its advertised address.
pub fn live_leases_by_address(table: &store_pb::ListLeasesResponse) -> HashMap<String, usize> {
    let mut holders = HashMap::new();
    for lease in &table.leases {
        if lease.owner.is_some() && lease.expires_at_ms > table.now_ms {
            *holders.entry(lease.address.clone()).or_default() += 1;
        }
    }
    holders
}
