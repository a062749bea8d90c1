//! The edge's settings: flags with `EDGE_*` environment variables.

use std::net::SocketAddr;
use std::time::Duration;

use crate::peer::Cidr;
use clap::{Args, FromArgMatches, ValueEnum};
use clawgate_common::{limits, parse_duration};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AuthMode {
    /// No secret. Refused unless the edge listens on loopback only.
    None,
    /// A shared token (`connect.params.auth.token`).
    Token,
    /// A shared password (`connect.params.auth.password`).
    Password,
}

/// What a message sent while its session has a run does (the protocol's
/// queue modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum QueueMode {
    /// Into the active run at its next model boundary (a new turn when idle).
    Steer,
    /// A new turn after the active one.
    Followup,
    /// Messages queued during a run fold into one next turn.
    Collect,
    /// Supersede the active run.
    Interrupt,
}

impl QueueMode {
    pub const NAMES: &[&str] = &["steer", "followup", "collect", "interrupt"];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Steer => "steer",
            Self::Followup => "followup",
            Self::Collect => "collect",
            Self::Interrupt => "interrupt",
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct EdgeConfig {
    /// Address the WebSocket (and /healthz, /readyz) server listens on.
    #[arg(long, env = "EDGE_LISTEN", default_value = "127.0.0.1:18789")]
    pub listen: SocketAddr,
    /// The run coordinator's gRPC address; several, comma-separated: a
    /// leader and its standbys, or coordinators sharing the partitions. The
    /// edge routes each call to its session's owner by the store's leases;
    /// these are where it starts and what it falls back on.
    #[arg(
        long,
        env = "EDGE_COORDINATOR_ADDRESS",
        default_value = "http://127.0.0.1:50062"
    )]
    pub coordinator_address: String,
    /// How long a call keeps following its coordinator through a failover
    /// (retrying on UNAVAILABLE) before it fails.
    #[arg(long, env = "EDGE_COORDINATOR_FAILOVER_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub coordinator_failover_timeout: Duration,
    /// Most runs whose session the edge remembers, so that calls naming only
    /// a run (agent.wait, runs.resume, chat.abort of a run) go to the
    /// coordinator owning that session; a run not remembered is looked up in
    /// the store. 0: always looked up.
    #[arg(long, env = "EDGE_COORDINATOR_RUN_ROUTES", default_value_t = clawgate_coordinator_client::RouterConfig::DEFAULT_RUN_ROUTES)]
    pub coordinator_run_routes: usize,
    /// How often the store looks for changes of the partition leases for the
    /// edge's map of which coordinator owns which sessions (WatchLeases; the
    /// store makes it 100 ms at least).
    #[arg(long, env = "EDGE_COORDINATOR_LEASE_WATCH_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    pub coordinator_lease_watch_interval: Duration,
    /// HTTP/2 keepalive interval (and timeout) on coordinator connections: a
    /// coordinator that stops answering is given up after about twice this.
    #[arg(long, env = "EDGE_COORDINATOR_KEEPALIVE", default_value = "2s", value_parser = parse_duration)]
    pub coordinator_keepalive: Duration,
    /// The session store's gRPC address.
    #[arg(
        long,
        env = "EDGE_STORE_ADDRESS",
        default_value = "http://127.0.0.1:50061"
    )]
    pub store_address: String,
    /// How clients authenticate.
    #[arg(long, env = "EDGE_AUTH_MODE", value_enum, default_value = "token")]
    pub auth_mode: AuthMode,
    /// The shared token (auth mode `token`).
    #[arg(long, env = "EDGE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The shared password (auth mode `password`).
    #[arg(long, env = "EDGE_PASSWORD", hide_env_values = true)]
    pub password: Option<String>,
    /// Secret that signs device tokens; replicas sharing it accept each
    /// other's tokens and tokens survive restarts. Unset: a random one per
    /// process.
    #[arg(long, env = "EDGE_DEVICE_TOKEN_SECRET", hide_env_values = true)]
    pub device_token_secret: Option<String>,
    /// Time a socket has to complete `connect`.
    #[arg(long, env = "EDGE_HANDSHAKE_TIMEOUT", default_value = "15s", value_parser = parse_duration)]
    pub handshake_timeout: Duration,
    /// Largest frame before the handshake, bytes.
    #[arg(long, env = "EDGE_PREAUTH_MAX_BYTES", default_value_t = limits::EDGE_PREAUTH_MAX_BYTES)]
    pub preauth_max_bytes: usize,
    /// Unauthenticated sockets allowed per client IP.
    #[arg(long, env = "EDGE_PREAUTH_PER_IP", default_value_t = 32)]
    pub preauth_per_ip: usize,
    /// Largest frame after the handshake, bytes (advertised as policy.maxPayload).
    #[arg(long, env = "EDGE_MAX_PAYLOAD", default_value_t = limits::EDGE_MAX_PAYLOAD)]
    pub max_payload: usize,
    /// Most attachment bytes (decoded, all attachments of one message
    /// together) a `chat.send`, `agent` or `sessions.create` may carry
    /// (advertised as policy.attachments; the coordinator's
    /// COORDINATOR_MAX_ATTACHMENT_BYTES must allow as much).
    #[arg(long, env = "EDGE_ATTACHMENT_MAX_BYTES", default_value_t = limits::RUN_MAX_ATTACHMENT_BYTES)]
    pub attachment_max_bytes: usize,
    /// Most connections the presence list shows (the newest).
    #[arg(long, env = "EDGE_PRESENCE_MAX_ENTRIES", default_value_t = 100)]
    pub presence_max_entries: usize,
    /// The bytes per second `presence` events may take, all connections
    /// together: after a broadcast the next waits until its bytes are paid
    /// for (a connect burst of thousands sends a few lists, not one per
    /// 200 ms to each).
    #[arg(long, env = "EDGE_PRESENCE_BYTES_PER_SECOND", default_value_t = 16 * 1024 * 1024)]
    pub presence_bytes_per_second: u64,
    /// The queue mode of a message whose send and session name none (the
    /// protocol's default: steer).
    #[arg(
        long,
        env = "EDGE_DEFAULT_QUEUE_MODE",
        value_enum,
        default_value = "steer"
    )]
    pub default_queue_mode: QueueMode,
    /// Per-connection send buffer, bytes (advertised as policy.maxBufferedBytes).
    #[arg(long, env = "EDGE_MAX_BUFFERED_BYTES", default_value_t = limits::EDGE_MAX_BUFFERED_BYTES)]
    pub max_buffered_bytes: usize,
    /// The largest WebSocket frame the edge writes, payload bytes: a longer
    /// message goes out as continuation frames, so that no connection's
    /// write buffer keeps more than this (it keeps its largest frame).
    #[arg(long, env = "EDGE_SOCKET_FRAME_BYTES", default_value_t = 1024, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(512..))]
    pub socket_frame_bytes: usize,
    /// A connection's writes are gathered into one system call per batch
    /// of frames, up to this many bytes (then they go out unasked). The
    /// buffer is freed after each batch, so an idle connection holds none.
    #[arg(long, env = "EDGE_SOCKET_WRITE_COALESCE_BYTES", default_value_t = 64 * 1024, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub socket_write_coalesce_bytes: usize,
    /// Sessions whose settings (model, queue mode) the edge keeps, so a send
    /// need not read them before its Submit; the store refuses a run made
    /// from settings that changed, and the edge reads them again then.
    /// 0: every send reads them.
    #[arg(long, env = "EDGE_SESSION_SETTINGS_CACHE", default_value_t = 10_000)]
    pub session_settings_cache: usize,
    /// Kernel send buffer per socket, bytes. Kept modest so that a client
    /// that stops reading backs up into the outbox, where the slow-consumer
    /// policy applies, rather than into kernel memory.
    #[arg(long, env = "EDGE_SOCKET_SEND_BUFFER", default_value_t = 256 * 1024)]
    pub socket_send_buffer: usize,
    /// After a connection's writer wrote events, how long it lets more
    /// queue before the next write, so that a busy fan-out goes out in
    /// fewer, larger writes (each one is a system call for the edge and a
    /// wakeup for the client). An answer to a request ends the wait at once,
    /// and an event after a quiet spell goes out at once; 0: no wait.
    #[arg(long, env = "EDGE_EVENT_LINGER", default_value = "5ms", value_parser = parse_duration)]
    pub event_linger: Duration,
    /// Interval of `tick` events (advertised as policy.tickIntervalMs).
    #[arg(long, env = "EDGE_TICK_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub tick_interval: Duration,
    /// Interval of the `health` event.
    #[arg(long, env = "EDGE_HEALTH_INTERVAL", default_value = "60s", value_parser = parse_duration)]
    pub health_interval: Duration,
    /// Failed authentications per client IP per minute before refusing.
    #[arg(long, env = "EDGE_AUTH_FAILURES_PER_MINUTE", default_value_t = 10)]
    pub auth_failures_per_minute: u32,
    /// Requests one connection may have in flight (answered or not yet);
    /// one more is refused `UNAVAILABLE`, retryable, without running.
    #[arg(long, env = "EDGE_MAX_IN_FLIGHT", default_value_t = 64)]
    pub max_in_flight: usize,
    /// Deepest nesting of arrays and objects in a frame (at most 127, the
    /// JSON parser's own bound); deeper is an invalid request frame.
    #[arg(long, env = "EDGE_MAX_JSON_DEPTH", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..=crate::json_depth::MAX_SETTING as i64))]
    pub max_json_depth: u32,
    /// How long one incoming message may take from its first byte to its
    /// last; a message still unfinished then closes the socket
    /// (1008 "frame timeout"). Before `connect`, the handshake timeout
    /// applies instead.
    #[arg(long, env = "EDGE_FRAME_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub frame_timeout: Duration,
    /// Calls refused in a row for the connection's role or scopes
    /// (`unauthorized role`, `missing scope`) before the socket is closed
    /// (1008 "repeated unauthorized calls"); any other answer starts the
    /// count again.
    #[arg(long, env = "EDGE_UNAUTHORIZED_FLOOD_LIMIT", default_value_t = 10)]
    pub unauthorized_flood_limit: u32,
    /// Service tokens (comma-separated; the first is sent): the edge's
    /// calls to the store and the coordinator carry it, as those services
    /// require when they are given the same (docs/security.md). Unset: no
    /// token.
    #[arg(long, env = "CLAWGATE_SERVICE_TOKEN", hide_env_values = true)]
    pub service_token: Option<clawgate_telemetry::ServiceTokens>,
    /// Most open WebSocket connections.
    #[arg(long, env = "EDGE_MAX_CONNECTIONS", default_value_t = 20_000)]
    pub max_connections: usize,
    /// Proxies (CIDRs, comma-separated) whose `Forwarded` / `X-Forwarded-For`
    /// headers name the client for the per-IP limits; empty: headers are
    /// ignored and the socket's peer is the client.
    #[arg(long, env = "EDGE_TRUSTED_PROXIES", value_delimiter = ',')]
    pub trusted_proxies: Vec<Cidr>,
    /// A directory of built Control UI files (the `dist/control-ui` folder
    /// of an `openclaw` package) to serve at `/`, same origin as the
    /// WebSocket; unset: no web UI.
    #[arg(long, env = "EDGE_CONTROL_UI_DIR")]
    pub control_ui_dir: Option<std::path::PathBuf>,
    /// Browser origins (`scheme://host[:port]`, comma-separated, or `*`)
    /// allowed to open a socket besides the edge's own origin; a socket
    /// without an Origin header (CLI, TUI, services) is always allowed.
    #[arg(long, env = "EDGE_ALLOWED_ORIGINS", value_delimiter = ',')]
    pub allowed_origins: Vec<String>,
}

impl EdgeConfig {
    /// Refuses settings that would be unsafe to run with.
    pub fn check(&self) -> anyhow::Result<()> {
        if let Some(dir) = &self.control_ui_dir {
            crate::control_ui::ControlUi::open(dir)?;
        }
        anyhow::ensure!(
            self.preauth_max_bytes <= self.max_payload,
            "EDGE_PREAUTH_MAX_BYTES ({}) must be at most EDGE_MAX_PAYLOAD ({})",
            self.preauth_max_bytes,
            self.max_payload
        );
        match self.auth_mode {
            AuthMode::None if !self.listen.ip().is_loopback() => {
                anyhow::bail!("auth mode `none` is only allowed on a loopback listen address")
            }
            AuthMode::Token if self.token.as_deref().is_none_or(str::is_empty) => {
                anyhow::bail!("auth mode `token` needs --token (EDGE_TOKEN)")
            }
            AuthMode::Password if self.password.as_deref().is_none_or(str::is_empty) => {
                anyhow::bail!("auth mode `password` needs --password (EDGE_PASSWORD)")
            }
            _ => Ok(()),
        }
    }

    /// Token auth on loopback port 0 with every other setting at its
    /// default (tests, benchmarks). The defaults are the flags' own, read
    /// without the environment, so this cannot drift from them.
    pub fn with_token(coordinator_address: String, store_address: String, token: &str) -> Self {
        let command =
            Self::augment_args(clap::Command::new("gateway-edge")).mut_args(|arg| arg.env(None));
        let matches = command
            .try_get_matches_from([
                "gateway-edge".to_owned(),
                "--listen=127.0.0.1:0".to_owned(),
                format!("--coordinator-address={coordinator_address}"),
                format!("--store-address={store_address}"),
                "--auth-mode=token".to_owned(),
                format!("--token={token}"),
            ])
            .expect("the defaults and these flags parse");
        Self::from_arg_matches(&matches).expect("every field is set")
    }
}
