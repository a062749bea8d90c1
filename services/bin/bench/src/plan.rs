//! What a run of the load generator is asked to do: the scenarios, the
//! plan (connections, requests, pacing), the echo runtime's pacing of the
//! systems it starts.

use std::time::Duration;

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
    /// How long one scenario (a looping one at one connection count, or
    /// `idle`, `fanout`, `startup`) may take: then its row says what it
    /// measured until then and how far it got.
    pub scenario_timeout: Duration,
    /// The share of sends, in percent, that open a new session (people
    /// opening chats) instead of a followup turn of the connection's own
    /// (`health` aside, the looping scenarios): 0 every send on the
    /// connection's session, 100 every send on a new one.
    pub new_sessions: u8,
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
    HalfOpen,
    Startup,
}

impl Scenario {
    pub const ALL: [Scenario; 8] = [
        Self::Connect,
        Self::Health,
        Self::Ack,
        Self::Run,
        Self::Fanout,
        Self::Idle,
        Self::HalfOpen,
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
            Self::HalfOpen => "half-open",
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
            Self::HalfOpen => "half-open memory",
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
    pub fn floor(self) -> Option<FloorKind> {
        match self {
            Self::Connect | Self::Health | Self::Fanout => Some(FloorKind::Echo),
            Self::Ack | Self::BusyAck | Self::Run => Some(FloorKind::Commit),
            Self::Idle | Self::HalfOpen | Self::Startup => None,
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

/// One of the floors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloorKind {
    /// (a) a bare WebSocket server.
    Echo,
    /// (b) WebSocket → gRPC A → gRPC B, empty handlers.
    Grpc,
    /// (c) (b) with a durable commit in B: redb, fsync'd, grouped as the
    /// embedded store groups its commits (`commit`).
    Commit,
    /// (d) (c) whose runs are played to every connection, as the edge
    /// broadcasts them: what a complete run cannot go below in this
    /// protocol, where every operator connection receives every run's
    /// events. Measured for `run` beside (c), which plays a run to its
    /// sender only.
    Broadcast,
}

impl FloorKind {
    pub const ALL: [FloorKind; 4] = [Self::Echo, Self::Grpc, Self::Commit, Self::Broadcast];

    /// Its topology column.
    pub fn topology(self) -> &'static str {
        match self {
            Self::Echo => "floor (a) ws echo",
            Self::Grpc => "floor (b) ws+2 gRPC",
            Self::Commit => "floor (c) ws+2 gRPC+commit",
            Self::Broadcast => "floor (d) (c)+broadcast",
        }
    }

    /// How a row names the floor it is read against.
    pub fn mark(self) -> &'static str {
        match self {
            Self::Echo => "(a)",
            Self::Grpc => "(b)",
            Self::Commit => "(c)",
            Self::Broadcast => "(d)",
        }
    }

    pub fn backend(self) -> &'static str {
        match self {
            Self::Commit | Self::Broadcast => "embedded",
            _ => "—",
        }
    }

    /// The scenarios measured on it: those it is the floor of, `ack` on
    /// (b) beside (c), and `run` on (d) beside (c).
    pub fn measures(self, scenario: Scenario) -> bool {
        scenario.floor() == Some(self)
            || (self == Self::Grpc && scenario == Scenario::Ack)
            || (self == Self::Broadcast && scenario == Scenario::Run)
    }
}
