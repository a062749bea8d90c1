//! Which run coordinator a call goes to: the owner of its session's
//! partition, by the store's leases (`clawgate-coordinator-client`).

pub use clawgate_coordinator_client::{
    CoordinatorClient, Router, RouterConfig, error_detail, leader_hint, settings_changed,
    should_fail_over,
};
