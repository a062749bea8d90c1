//! The edge's settings: flags with `EDGE_*` environment variables.

pub mod cidr;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use cidr::Cidr;
use clap::{Args, FromArgMatches, ValueEnum};
use clawgate_common::{limits, parse_duration};
use clawgate_telemetry::service_auth::{check_secret_length, is_loopback_address};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AuthMode {
    /// No secret. Refused unless the edge listens on loopback only, or is
    /// told `--insecure`.
    None,
    /// A shared token (`connect.params.auth.token`).
    Token,
    /// A shared password (`connect.params.auth.password`).
    Password,
}

/// The one header a trusted proxy names the client in
/// (`--forwarded-header`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, …` (most load balancers and
    /// ingress controllers).
    #[value(name = "x-forwarded-for")]
    XForwardedFor,
    /// `Forwarded: for=client, for=proxy1` (RFC 7239).
    #[value(name = "forwarded")]
    Forwarded,
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
    /// Address Prometheus `/metrics` is served on, apart from the public
    /// port (as the store's and the coordinator's are).
    #[arg(long, env = "EDGE_METRICS_LISTEN", default_value = "127.0.0.1:9463")]
    pub metrics_listen: SocketAddr,
    /// Serve `/metrics` on the public port too, instead of on
    /// `--metrics-listen` (anyone who reaches the port reads the edge's
    /// counters then).
    #[arg(long, env = "EDGE_METRICS_ON_PUBLIC_PORT")]
    pub metrics_on_public_port: bool,
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
    #[arg(long, env = "EDGE_COORDINATOR_RUN_ROUTES", default_value_t = run_coordinator_api::RouterConfig::DEFAULT_RUN_ROUTES)]
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
    /// process. A token is also bound to the shared secret (EDGE_TOKEN or
    /// EDGE_PASSWORD): rotating either secret revokes every device token.
    #[arg(long, env = "EDGE_DEVICE_TOKEN_SECRET", hide_env_values = true)]
    pub device_token_secret: Option<String>,
    /// How long a device token is taken after it was issued; a device
    /// reconnecting with it is issued a fresh one, so only a device away
    /// for longer must give the shared secret again.
    #[arg(long, env = "EDGE_DEVICE_TOKEN_TTL", default_value = "30d", value_parser = parse_duration)]
    pub device_token_ttl: Duration,
    /// Time a socket has to complete `connect`.
    #[arg(long, env = "EDGE_HANDSHAKE_TIMEOUT", default_value = "15s", value_parser = parse_duration)]
    pub handshake_timeout: Duration,
    /// Largest frame before the handshake, bytes.
    #[arg(long, env = "EDGE_PREAUTH_MAX_BYTES", default_value_t = limits::EDGE_PREAUTH_MAX_BYTES)]
    pub preauth_max_bytes: usize,
    /// Unauthenticated sockets allowed per client IP.
    #[arg(long, env = "EDGE_PREAUTH_PER_IP", default_value_t = 32)]
    pub preauth_per_ip: usize,
    /// Unauthenticated WebSocket sockets allowed in all, every address
    /// together; one more is refused 503 before it is upgraded.
    #[arg(long, env = "EDGE_MAX_PREAUTH", default_value_t = 4096)]
    pub max_preauth: usize,
    /// Open TCP sockets (plain HTTP or WebSocket, authenticated or not)
    /// from one client address (an IPv6 address by its /64), counted from
    /// accept to close; one more is answered 503 and closed at once. A
    /// trusted proxy's own address (`--trusted-proxies`) is not limited.
    #[arg(long, env = "EDGE_SOCKETS_PER_IP", default_value_t = 256,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub sockets_per_ip: usize,
    /// Open TCP sockets in all, counted from accept to close; one more is
    /// answered 503 and closed at once. 0: the process's file descriptor
    /// limit (RLIMIT_NOFILE) less a reserve of an eighth (at least 64) for
    /// the edge's own files and gRPC channels, so that the edge never runs
    /// out of descriptors because of its clients.
    #[arg(long, env = "EDGE_MAX_SOCKETS", default_value_t = 0)]
    pub max_sockets: usize,
    /// Time a client has to send a whole HTTP request head (the WebSocket
    /// upgrade included), counted from the socket's accept or from its
    /// previous response; a socket that has not sent one by then is closed.
    /// Also how long an idle keep-alive connection stays open.
    #[arg(long, env = "EDGE_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub header_read_timeout: Duration,
    /// A plain HTTP connection (not upgraded) on which no byte moves
    /// either way for this long is closed: a request body or a response
    /// (a Control UI file) that stalls does not hold the socket.
    #[arg(long, env = "EDGE_HTTP_IDLE_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub http_idle_timeout: Duration,
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
    /// Bytes of request frames being handled at once, every connection
    /// together (each request counts its frame's size until it is
    /// answered); one that does not fit is refused `UNAVAILABLE`,
    /// retryable, without running. Bounds what in-flight requests hold
    /// whatever `EDGE_MAX_IN_FLIGHT × EDGE_MAX_PAYLOAD × connections` is.
    #[arg(long, env = "EDGE_MAX_REQUEST_BYTES", default_value_t = 256 * 1024 * 1024)]
    pub max_request_bytes: usize,
    /// Sessions one connection may watch (`sessions.messages.subscribe`);
    /// one more is refused `INVALID_REQUEST`.
    #[arg(long, env = "EDGE_MAX_WATCHED_SESSIONS", default_value_t = 1000)]
    pub max_watched_sessions: usize,
    /// Runs one connection may follow through `runs.resume` at once (each
    /// follow outlives its request); one more is refused `UNAVAILABLE`,
    /// retryable.
    #[arg(long, env = "EDGE_MAX_RESUMES", default_value_t = 16)]
    pub max_resumes: usize,
    /// Sessions one usage report (`sessions.usage`) reads, the most
    /// recently updated first; the report says so when it stopped there.
    #[arg(long, env = "EDGE_USAGE_MAX_SESSIONS", default_value_t = 1000)]
    pub usage_max_sessions: u32,
    /// Transcript entries one usage report reads, over all its sessions.
    #[arg(long, env = "EDGE_USAGE_MAX_ENTRIES", default_value_t = 100_000)]
    pub usage_max_entries: u32,
    /// Users whose Control UI preferences (`users.prefs.*`) the edge keeps
    /// in memory; a new user's first preference past it is refused
    /// `UNAVAILABLE`. A connection without a device is its own user and
    /// its preferences go with it.
    #[arg(long, env = "EDGE_USER_PREFS_MAX_USERS", default_value_t = 10_000)]
    pub user_prefs_max_users: usize,
    /// Bytes (keys and JSON values) of all users' preferences together; a
    /// change that would go over is refused `UNAVAILABLE`.
    #[arg(long, env = "EDGE_USER_PREFS_MAX_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub user_prefs_max_bytes: usize,
    /// Deepest nesting of arrays and objects in a frame (at most 127, the
    /// JSON parser's own bound); deeper is an invalid request frame.
    #[arg(long, env = "EDGE_MAX_JSON_DEPTH", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..=crate::protocol::json_depth::MAX_SETTING as i64))]
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
    /// calls to the store and the coordinator carry it. Those services
    /// accept it as the shared token (the simple mode) or, with per-kind
    /// tokens, as one of their CLAWGATE_EDGE_TOKENS (docs/security.md).
    /// Unset: no token.
    #[arg(long, env = "CLAWGATE_SERVICE_TOKEN", hide_env_values = true)]
    pub service_token: Option<clawgate_telemetry::ServiceTokens>,
    /// Start where the edge would otherwise refuse to, as open as that is:
    /// auth mode `none` on an address beyond loopback, or an edge beyond
    /// loopback calling a store or coordinator beyond loopback without a
    /// service token (so those must serve anyone; docs/security.md).
    #[arg(long, env = "CLAWGATE_INSECURE")]
    pub insecure: bool,
    /// gRPC to the store and the coordinators over TLS (their addresses
    /// written `https://…`), presenting `--tls-cert` to servers that
    /// require client certificates (docs/gateway-edge.md).
    #[command(flatten)]
    pub tls: clawgate_telemetry::tls::TlsArgs,
    /// Most WebSocket connections at once, each counted from its upgrade
    /// until its socket is gone, authenticated or not; one more is refused
    /// 503 before it is upgraded.
    #[arg(long, env = "EDGE_MAX_CONNECTIONS", default_value_t = 20_000)]
    pub max_connections: usize,
    /// Proxies (CIDRs, comma-separated) whose `Forwarded` / `X-Forwarded-For`
    /// headers name the client for the per-IP limits; empty: headers are
    /// ignored and the socket's peer is the client.
    #[arg(long, env = "EDGE_TRUSTED_PROXIES", value_delimiter = ',')]
    pub trusted_proxies: Vec<Cidr>,
    /// The header the trusted proxies set to name the client; only that
    /// one is read (a proxy passes the other through as the client sent
    /// it), walking from the right past trusted hops.
    #[arg(
        long,
        env = "EDGE_FORWARDED_HEADER",
        value_enum,
        default_value = "x-forwarded-for"
    )]
    pub forwarded_header: ForwardedHeader,
    /// Host names (with or without a port, comma-separated) a request may
    /// name besides loopback ones when the edge listens on loopback or has
    /// auth mode `none`: other names are refused 403, so that a web page
    /// cannot reach a local gateway through DNS rebinding.
    #[arg(long, env = "EDGE_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,
    /// Client addresses whose failed authentications are remembered
    /// (`EDGE_AUTH_FAILURES_PER_MINUTE`); past it the oldest are forgotten,
    /// so that addresses a client makes up cannot grow the table.
    #[arg(long, env = "EDGE_AUTH_FAILURE_ADDRESSES", default_value_t = 100_000,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(2..))]
    pub auth_failure_addresses: usize,
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
    /// The settings `args` and `env` give the `gateway-edge` binary, by its
    /// own parser and [`check`](Self::check) (for checking manifests
    /// without running it).
    pub fn from_settings(
        args: &[String],
        env: &std::collections::BTreeMap<String, String>,
    ) -> Result<Self, String> {
        let config: Self = clawgate_common::settings::parse("gateway-edge", args, env)?;
        config.check().map_err(|e| format!("{e:#}"))?;
        Ok(config)
    }

    /// Refuses settings that would be unsafe to run with.
    pub fn check(&self) -> anyhow::Result<()> {
        self.control_ui_root()?;
        anyhow::ensure!(
            !self.header_read_timeout.is_zero() && !self.http_idle_timeout.is_zero(),
            "EDGE_HEADER_READ_TIMEOUT and EDGE_HTTP_IDLE_TIMEOUT must be above 0"
        );
        anyhow::ensure!(
            self.max_payload <= self.max_request_bytes,
            "EDGE_MAX_REQUEST_BYTES ({}) must hold a frame of EDGE_MAX_PAYLOAD ({})",
            self.max_request_bytes,
            self.max_payload
        );
        anyhow::ensure!(
            self.preauth_max_bytes <= self.max_payload,
            "EDGE_PREAUTH_MAX_BYTES ({}) must be at most EDGE_MAX_PAYLOAD ({})",
            self.preauth_max_bytes,
            self.max_payload
        );
        anyhow::ensure!(
            !self.device_token_ttl.is_zero(),
            "EDGE_DEVICE_TOKEN_TTL must be above 0"
        );
        for (what, secret) in [
            ("EDGE_TOKEN", &self.token),
            ("EDGE_PASSWORD", &self.password),
            ("EDGE_DEVICE_TOKEN_SECRET", &self.device_token_secret),
        ] {
            if let Some(secret) = secret.as_deref().filter(|s| !s.is_empty()) {
                check_secret_length(what, secret).map_err(anyhow::Error::msg)?;
            }
        }
        if let Some(tokens) = &self.service_token {
            tokens.check().map_err(anyhow::Error::msg)?;
        }
        let exposed = !self.listen.ip().is_loopback() && !self.insecure;
        let remote_backend = std::iter::once(self.store_address.as_str())
            .chain(self.coordinator_address.split(','))
            .find(|address| !is_loopback_address(address.trim()));
        // A client certificate authenticates the edge to backends that
        // require one (mutual TLS), as a token would.
        let authenticated = self.service_token.is_some() || self.tls.tls_cert.is_some();
        if let (true, false, Some(backend)) = (exposed, authenticated, remote_backend) {
            anyhow::bail!(
                "the edge listens on {}, beyond loopback, and calls {} with no service token: \
                 that service must then serve anyone. Set CLAWGATE_SERVICE_TOKEN (docs/security.md), \
                 or pass --insecure (CLAWGATE_INSECURE=true) to run so anyway",
                self.listen,
                backend.trim()
            );
        }
        match self.auth_mode {
            AuthMode::None if exposed => {
                anyhow::bail!(
                    "auth mode `none` on {}, beyond loopback, lets anyone who reaches it in: \
                     use auth mode token or password, listen on loopback, or pass --insecure \
                     (CLAWGATE_INSECURE=true) to run so anyway",
                    self.listen
                )
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

    /// The Control UI directory (`--control-ui-dir`) made absolute, checked
    /// to hold the app's `index.html`; `None` when none is configured.
    pub fn control_ui_root(&self) -> anyhow::Result<Option<PathBuf>> {
        let Some(dir) = &self.control_ui_dir else {
            return Ok(None);
        };
        let root = dir
            .canonicalize()
            .map_err(|e| anyhow::anyhow!("control UI directory {}: {e}", dir.display()))?;
        anyhow::ensure!(
            root.join("index.html").is_file(),
            "control UI directory {} has no index.html (point it at the dist/control-ui folder of an openclaw package)",
            root.display()
        );
        Ok(Some(root))
    }

    /// The cap on open sockets (`--max-sockets`), resolved: given, or
    /// the descriptor limit less its reserve.
    pub fn socket_cap(&self) -> usize {
        if self.max_sockets > 0 {
            return self.max_sockets;
        }
        let limit = clawgate_common::process::procfs::open_files_limit(None)
            .map(|(soft, _)| soft)
            .unwrap_or(1024);
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        limit.saturating_sub((limit / 8).max(64)).max(1)
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
                "--metrics-listen=127.0.0.1:0".to_owned(),
                format!("--coordinator-address={coordinator_address}"),
                format!("--store-address={store_address}"),
                "--auth-mode=token".to_owned(),
                format!("--token={token}"),
            ])
            .expect("the defaults and these flags parse");
        Self::from_arg_matches(&matches).expect("every field is set")
    }
}
