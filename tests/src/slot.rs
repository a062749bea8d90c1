//! One coordinator place in a multi-process fault test: the coordinator
//! process, the proxy in front of it (what the edges are given and what it
//! advertises, so that a restarted process keeps the address), and its own
//! link to the store (a coordinator's only path to the database: cutting it
//! is cutting its database connection).

use std::net::SocketAddr;

use crate::cluster::start_coordinator;
use crate::fault_proxy::FaultProxy;
use crate::ha;
use crate::process::Process;
use crate::runtime::CountingRuntime;

pub struct CoordinatorSlot {
    pub front: FaultProxy,
    pub store_link: FaultProxy,
    pub process: Process,
    /// Its flags after the common ones (`--placement balanced`, say).
    args: Vec<String>,
}

impl CoordinatorSlot {
    /// A lease-mode coordinator (TTL and renew interval from `ha`) against
    /// the store at `store`, executing through `runtime`, with `args` after
    /// the common flags.
    pub async fn start(store: SocketAddr, runtime: &CountingRuntime, args: &[&str]) -> Self {
        let front = FaultProxy::start("127.0.0.1:9".parse().unwrap()).await;
        let store_link = FaultProxy::start(store).await;
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let process = launch(&front, &store_link, runtime, &args).await;
        Self {
            front,
            store_link,
            process,
            args,
        }
    }

    /// SIGKILLs the process (if it still runs) and starts it again behind
    /// the same proxies.
    pub async fn restart(&mut self, runtime: &CountingRuntime) {
        self.process.kill().await;
        self.process = launch(&self.front, &self.store_link, runtime, &self.args).await;
    }
}

async fn launch(
    front: &FaultProxy,
    store_link: &FaultProxy,
    runtime: &CountingRuntime,
    args: &[String],
) -> Process {
    let front_url = front.url();
    let mut all = ha::lease_args(&runtime.url(), "2s");
    all.extend(["--advertise-address".to_owned(), front_url]);
    all.extend(args.iter().cloned());
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let process = start_coordinator(&store_link.url(), &all).await;
    front.set_upstream(process.address);
    process
}
