//! Load scenarios against an OpenClaw-protocol gateway, with latency
//! percentiles and rates, and the floor each figure is to be read against.
//!
//! # Scenarios
//!
//! The looping scenarios run at every `--connections` count, each
//! connection on a task of its own, opened 16 handshakes at a time (a
//! gateway limits the sockets one address may have mid-handshake):
//!
//! - `connect`: socket open → `hello-ok`, one sample per connection;
//! - `health`: `health` round trips, each connection in a loop of
//!   `--requests`;
//! - `ack`: `chat.send` → its ACK, each connection on its own session, runs
//!   executing meanwhile (each send a followup turn of the connection's
//!   session); the sends queue runs faster than they execute, so each
//!   connection's last send also waits, uncounted, for its run's end: the
//!   row's backlog has drained before the next row starts;
//! - `run`: `chat.send` → the run's `chat` final (a complete run), each
//!   connection's next send after its last run ended; its ACKs are a row
//!   of their own, `chat.send ack, runs executing`: the sync phase while
//!   up to one run per connection executes and fans out (the load of a
//!   user who waits for the reply, where `ack`'s sends queue runs faster
//!   than they can execute).
//!
//! The others run once:
//!
//! - `fanout`: `--watchers` connections with `operator.read` only, and one
//!   sender with read and write, which sends `--requests` runs one after
//!   the other. Every connection (the sender too) notes when each of those
//!   runs' `chat` `delta` events arrives, keyed by runId and seq (the
//!   `agent` assistant event that accompanies each is not counted again).
//!   A delivery's latency is its arrival minus the earliest arrival of the
//!   same event at any of the connections: the spread the fan-out adds from
//!   the first socket to the last, not the time from the coordinator (no
//!   clock in the protocol is finer than a millisecond). The earliest
//!   arrival itself is not a sample, so `count` is watchers × deltas when
//!   nothing was dropped (a shortfall is noted).
//! - `idle`: `--idle` authenticated connections (`operator.read`) that only
//!   read; the gateway process's `VmRSS` (`/proc/<pid>/status`, the pid from
//!   `--edge-pid` or the suite) before opening them and once the burst is
//!   over (each has seen the presence list that names the last one opened,
//!   or no presence list came for a second: a gateway may send none on a
//!   connect), divided by the connections: the marginal resident memory per
//!   idle connection, including what the allocator kept from the burst. To
//!   a loopback gateway the sockets come from 127.0.0.2–127.0.0.9 in turn,
//!   so ephemeral ports do not run out; a socket limit (`RLIMIT_NOFILE`, in
//!   the bench or in the gateway) that stops it is an error row that says
//!   how far it got.
//! - `startup`: the all-in-one `clawgate` started on a fresh store (a temp
//!   dir, or a fresh PostgreSQL database) with every listener on port 0;
//!   spawn → the address line → its `/readyz` answers 200 (polled every
//!   2 ms), `--startup-runs` times.
//!
//! # Floors
//!
//! Measured in the same run, in process on a tokio runtime of their own
//! (two workers, like a service on this machine), with the same client and
//! the same crates as the real path (tokio, tokio-tungstenite, tonic, the
//! generated `clawgate-proto` messages, the embedded store):
//!
//! - (a) `ws echo`: a bare WebSocket server speaking the same frames: the
//!   challenge, `hello-ok`, a `res` for every `req`, and for `chat.send` the
//!   run played back to every connection, as the edge broadcasts: lifecycle,
//!   the echo's chunks (`--echo-chunks`, one every `--echo-pace`) as
//!   `agent` assistant + `chat` delta pairs, coalesced to one pair per
//!   150 ms as the coordinator does by default (so a run has as many events
//!   as on the real path), then the end and the `chat` final; what is
//!   queued for a socket goes out in one flush, as the edge writes. The
//!   floor of `connect`, `health` and `fanout`. (The edge's
//!   `health` also reads the store; the floor does not.)
//! - (b) `ws+2 gRPC`: (a) whose `chat.send` first calls service A's
//!   `RunCoordinator/Submit` over loopback, whose handler calls service B's
//!   `SessionStore/CreateRun` over loopback, with the messages the edge and
//!   the coordinator send (an owner token, the run spec as JSON) and
//!   handlers that only answer (every other method is UNIMPLEMENTED). Its
//!   runs are played to their sender only: it is the request path's floor,
//!   not the broadcast's.
//! - (c) `ws+2 gRPC+commit`: (b) where B commits the run record in the
//!   embedded store (`session-store`'s redb backend, fsync'd, its default
//!   group commit, the partitions leased as a static coordinator leases
//!   them) before answering, as admission does. The floor of
//!   `chat.send ack` and of `complete run` (whose floor is thus admission
//!   plus the echo's pacing, with none of execution's commits and no
//!   broadcast). The all-in-one's coordinator calls its store in process,
//!   so its admission makes one gRPC hop fewer than (c): a ratio below 1
//!   there is that hop.
//!
//! `idle` and `startup` have no floor.
//!
//! # Modes
//!
//! `--url`/`--token` point the scenarios at any gateway that speaks the
//! protocol (nothing there knows clawgate). `suite` starts the real
//! topologies itself (see [`suite`]) and prints one table with the floors.
//! `scale` starts one store and 1, 2, 3, … coordinators sharing its
//! partitions (balanced placement) and reports complete runs per second
//! for each count, with the scaling factor (see [`scale`]).

pub mod client;
pub mod floor;
pub mod http;
pub mod procs;
pub mod scale;
pub mod scenarios;
pub mod stats;
pub mod stores;
pub mod suite;
pub mod table;

use std::time::Duration;

pub use scenarios::run;
pub use stats::Stats;
pub use table::{Outcome, Row, table};

/// Handshakes in progress at once.
pub const CONNECT_CONCURRENCY: usize = 16;

/// The echo runtime's pacing: a reply in `chunks` pieces, `pace` before
/// each (the coordinator's `--echo-chunks`, `--echo-pace`).
#[derive(Debug, Clone, Copy)]
pub struct Echo {
    pub chunks: usize,
    pub pace: Duration,
}

impl Default for Echo {
    fn default() -> Self {
        Self {
            chunks: 4,
            pace: Duration::from_millis(20),
        }
    }
}

/// What to run against one gateway.
#[derive(Debug, Clone)]
pub struct Plan {
    pub url: String,
    pub token: String,
    pub scenarios: Vec<Scenario>,
    pub connections: Vec<usize>,
    /// Operations per connection in the looping scenarios; runs in `fanout`.
    pub requests: usize,
    /// Operations per connection made before those counted, in the
    /// looping scenarios but `connect`.
    pub warmup: usize,
    /// Prefix of the session keys (one session per connection).
    pub session_prefix: String,
    /// Read-only connections in `fanout`.
    pub watchers: usize,
    /// Connections `idle` opens.
    pub idle: usize,
    /// The gateway's process, for `idle`.
    pub edge_pid: Option<u32>,
    /// Open loop: each connection starts a request of `health`, `ack` and
    /// `run` this long after the start of its last one (or at once when
    /// the last answer came later), so the offered load is `connections /
    /// pace` per second whatever the answers take. `None`: closed loop,
    /// each request at once after the last answer (latency is then the
    /// connections over the throughput).
    pub pace: Option<std::time::Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    Connect,
    Health,
    Ack,
    /// The ACKs of `run` (not selectable: `run` measures them).
    BusyAck,
    Run,
    Fanout,
    Idle,
    Startup,
}

impl Scenario {
    pub const ALL: [Scenario; 7] = [
        Self::Connect,
        Self::Health,
        Self::Ack,
        Self::Run,
        Self::Fanout,
        Self::Idle,
        Self::Startup,
    ];

    /// How it is written in `--scenarios`.
    pub fn key(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Health => "health",
            Self::Ack => "ack",
            Self::BusyAck => "run",
            Self::Run => "run",
            Self::Fanout => "fanout",
            Self::Idle => "idle",
            Self::Startup => "startup",
        }
    }

    /// How it is named in the table.
    pub fn name(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Health => "health",
            Self::Ack => "chat.send ack",
            Self::BusyAck => "chat.send ack, runs executing",
            Self::Run => "complete run",
            Self::Fanout => "fanout delivery",
            Self::Idle => "idle memory",
            Self::Startup => "startup",
        }
    }

    pub fn parse(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.key() == key)
    }

    /// Whether it runs at every connection count.
    pub fn per_connection_count(self) -> bool {
        matches!(self, Self::Connect | Self::Health | Self::Ack | Self::Run)
    }

    /// The floor its figures are read against.
    pub fn floor(self) -> Option<floor::FloorKind> {
        use floor::FloorKind;
        match self {
            Self::Connect | Self::Health | Self::Fanout => Some(FloorKind::Echo),
            Self::Ack | Self::BusyAck | Self::Run => Some(FloorKind::Commit),
            Self::Idle | Self::Startup => None,
        }
    }
}

/// Parses a comma-separated `--scenarios` list.
pub fn parse_scenarios(keys: &[String]) -> anyhow::Result<Vec<Scenario>> {
    keys.iter()
        .map(|key| {
            Scenario::parse(key).ok_or_else(|| {
                let known: Vec<_> = Scenario::ALL.iter().map(|s| s.key()).collect();
                anyhow::anyhow!("unknown scenario {key:?} ({})", known.join(", "))
            })
        })
        .collect()
}
