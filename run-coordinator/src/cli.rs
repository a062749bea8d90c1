//! Flags and environment variables (`COORDINATOR_*`) of the coordinator,
//! shared by its own binary and the all-in-one launcher.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, ValueEnum};
use clawgate_common::{limits, parse_duration};

use crate::config::CoordinatorConfig;
use crate::events::HubLimits;
use crate::ownership::{OwnershipConfig, OwnershipMode, Placement};
use crate::runtime::AgentRuntime;
use crate::runtime::echo::{EchoConfig, EchoRuntime};
use crate::runtime::grpc::{GrpcRuntime, GrpcRuntimeConfig};
use crate::runtime::openai::{OpenAiConfig, OpenAiRuntime};
use clawgate_telemetry::tls::ClientTls;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RuntimeKind {
    /// Streams the message back (demos, tests, benchmarks).
    Echo,
    /// An OpenAI-compatible chat-completions server.
    Openai,
    /// An external service implementing clawgate.agent_runtime.v1.AgentRuntime.
    Grpc,
}

#[derive(Debug, Clone, Args)]
pub struct RuntimeArgs {
    /// Which agent runtime executes runs.
    #[arg(long, env = "COORDINATOR_RUNTIME", value_enum, default_value = "echo")]
    pub runtime: RuntimeKind,
    /// echo: pieces the reply is streamed in.
    #[arg(long, env = "COORDINATOR_ECHO_CHUNKS", default_value_t = 4)]
    pub echo_chunks: usize,
    /// echo: pause before each piece.
    #[arg(long, env = "COORDINATOR_ECHO_PACE", default_value = "20ms", value_parser = parse_duration)]
    pub echo_pace: Duration,
    /// openai: base URL of the API (…/v1).
    #[arg(
        long,
        env = "COORDINATOR_OPENAI_BASE_URL",
        default_value = "https://api.openai.com/v1"
    )]
    pub openai_base_url: String,
    /// openai: API key.
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    pub openai_api_key: Option<String>,
    /// openai: model.
    #[arg(long, env = "COORDINATOR_OPENAI_MODEL", default_value = "gpt-4o-mini")]
    pub openai_model: String,
    /// openai: models tried, in order, when the main one keeps failing.
    #[arg(
        long,
        env = "COORDINATOR_OPENAI_FALLBACK_MODELS",
        value_delimiter = ','
    )]
    pub openai_fallback_models: Vec<String>,
    /// openai: retries of a retryable error per model.
    #[arg(long, env = "COORDINATOR_OPENAI_MAX_RETRIES", default_value_t = 2)]
    pub openai_max_retries: u32,
    /// grpc: address of the external runtime (http://host:port).
    #[arg(
        long,
        env = "COORDINATOR_RUNTIME_ADDRESS",
        default_value = "http://127.0.0.1:50070"
    )]
    pub runtime_address: String,
}

impl RuntimeArgs {
    /// The runtime chosen; a `grpc` one reached over TLS with `tls` when
    /// its address is `https://`.
    pub async fn build(&self, tls: Option<&ClientTls>) -> anyhow::Result<Arc<dyn AgentRuntime>> {
        Ok(match self.runtime {
            RuntimeKind::Echo => Arc::new(EchoRuntime::new(EchoConfig {
                chunks: self.echo_chunks,
                pace: self.echo_pace,
            })),
            RuntimeKind::Openai => Arc::new(OpenAiRuntime::new(OpenAiConfig {
                base_url: self.openai_base_url.clone(),
                api_key: self.openai_api_key.clone(),
                model: self.openai_model.clone(),
                fallback_models: self.openai_fallback_models.clone(),
                max_retries: self.openai_max_retries,
                ..OpenAiConfig::default()
            })?),
            RuntimeKind::Grpc => Arc::new(
                GrpcRuntime::connect(
                    &self.runtime_address,
                    GrpcRuntimeConfig {
                        tls: tls.cloned(),
                        ..GrpcRuntimeConfig::default()
                    },
                )
                .await?,
            ),
        })
    }
}

#[derive(Debug, Clone, Args)]
pub struct CoordinatorArgs {
    /// Runs executing at once, across all sessions.
    #[arg(long, env = "COORDINATOR_MAX_EXECUTING", default_value_t = 16)]
    pub max_executing: usize,
    /// Execution timeout of a run that asks for none.
    #[arg(long, env = "COORDINATOR_DEFAULT_RUN_TIMEOUT", default_value = "10m", value_parser = parse_duration)]
    pub default_run_timeout: Duration,
    /// The longest timeout a run may ask for.
    #[arg(long, env = "COORDINATOR_MAX_RUN_TIMEOUT", default_value = "48h", value_parser = parse_duration)]
    pub max_run_timeout: Duration,
    /// How long a finished run stays in the in-memory dedupe cache.
    #[arg(long, env = "COORDINATOR_DEDUPE_TTL", default_value = "5m", value_parser = parse_duration)]
    pub dedupe_ttl: Duration,
    /// Most finished runs in the dedupe cache.
    #[arg(long, env = "COORDINATOR_DEDUPE_CAPACITY", default_value_t = 1000)]
    pub dedupe_capacity: usize,
    /// At most one assistant delta event per run per this interval.
    #[arg(long, env = "COORDINATOR_DELTA_INTERVAL", default_value = "150ms", value_parser = parse_duration)]
    pub delta_interval: Duration,
    /// How long a finished run's events stay replayable.
    #[arg(long, env = "COORDINATOR_EVENT_RETENTION", default_value = "10m", value_parser = parse_duration)]
    pub event_retention: Duration,
    /// Most finished runs whose events are kept.
    #[arg(long, env = "COORDINATOR_MAX_RETAINED_RUNS", default_value_t = 10_000)]
    pub max_retained_runs: usize,
    /// Most events kept per run.
    #[arg(long, env = "COORDINATOR_MAX_EVENTS_PER_RUN", default_value_t = 10_000)]
    pub max_events_per_run: usize,
    /// Most events kept in the all-runs stream.
    #[arg(long, env = "COORDINATOR_MAX_STREAM_EVENTS", default_value_t = 100_000)]
    pub max_stream_events: usize,
    /// Earlier transcript entries handed to the runtime.
    #[arg(long, env = "COORDINATOR_HISTORY_ENTRIES", default_value_t = 50)]
    pub history_entries: u32,
    /// Largest user message, bytes (UTF-8).
    #[arg(long, env = "COORDINATOR_MAX_MESSAGE_BYTES", default_value_t = limits::RUN_MAX_MESSAGE_BYTES)]
    pub max_message_bytes: usize,
    /// Largest runtime options object, bytes (as JSON).
    #[arg(long, env = "COORDINATOR_MAX_OPTIONS_BYTES", default_value_t = limits::RUN_MAX_OPTIONS_BYTES)]
    pub max_options_bytes: usize,
    /// Most attachment bytes (decoded) one run may carry, all together.
    #[arg(long, env = "COORDINATOR_MAX_ATTACHMENT_BYTES", default_value_t = limits::RUN_MAX_ATTACHMENT_BYTES)]
    pub max_attachment_bytes: usize,
    /// Most attachments one run may carry.
    #[arg(long, env = "COORDINATOR_MAX_ATTACHMENTS", default_value_t = limits::RUN_MAX_ATTACHMENTS)]
    pub max_attachments: usize,
    /// Longest run label, characters.
    #[arg(long, env = "COORDINATOR_MAX_LABEL_CHARS", default_value_t = limits::RUN_MAX_LABEL_CHARS)]
    pub max_label_chars: usize,
    /// Longest requester of a run, characters.
    #[arg(long, env = "COORDINATOR_MAX_REQUESTER_CHARS", default_value_t = limits::RUN_MAX_REQUESTER_CHARS)]
    pub max_requester_chars: usize,
    /// How long a Cancel waits for a running run to record its terminal.
    #[arg(long, env = "COORDINATOR_CANCEL_SETTLE", default_value = "10s", value_parser = parse_duration)]
    pub cancel_settle: Duration,
    /// Wait timeout when the caller gives none.
    #[arg(long, env = "COORDINATOR_DEFAULT_WAIT", default_value = "30s", value_parser = parse_duration)]
    pub default_wait: Duration,
    /// The longest Wait.
    #[arg(long, env = "COORDINATOR_MAX_WAIT", default_value = "1h", value_parser = parse_duration)]
    pub max_wait: Duration,
    /// On shutdown: how long executing runs may take to finish before they are aborted.
    #[arg(long, env = "COORDINATOR_DRAIN_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub drain_timeout: Duration,
    /// How this coordinator owns the store's partitions: `static` takes them
    /// all at start (one coordinator per store); `lease` is active/standby
    /// (docs/high-availability.md).
    #[arg(
        long,
        env = "COORDINATOR_OWNERSHIP",
        value_enum,
        default_value = "static"
    )]
    pub ownership: OwnershipMode,
    /// The gRPC address other services should use for this coordinator
    /// (the leader hint); default `http://<listen address>`.
    #[arg(long, env = "COORDINATOR_ADVERTISE_ADDRESS", value_parser = parse_advertise_address)]
    pub advertise_address: Option<String>,
    /// Lease ownership: how long a lease lasts without renewal.
    #[arg(long, env = "COORDINATOR_LEASE_TTL", default_value = "10s", value_parser = parse_duration)]
    pub lease_ttl: Duration,
    /// Lease ownership: how often the leader renews and a standby tries to
    /// take over (at most half the TTL).
    #[arg(long, env = "COORDINATOR_LEASE_RENEW_INTERVAL", default_value = "2s", value_parser = parse_duration)]
    pub lease_renew_interval: Duration,
    /// Lease ownership: which partitions this coordinator holds.
    /// `all-on-one`: all of them on one leader, the others standing by;
    /// `balanced`: spread over the live coordinators (docs/high-availability.md).
    #[arg(
        long,
        env = "COORDINATOR_PLACEMENT",
        value_enum,
        default_value = "all-on-one"
    )]
    pub placement: Placement,
    /// Balanced placement: how long the executing runs of a partition moving
    /// to another coordinator may take to finish before they are aborted.
    #[arg(long, env = "COORDINATOR_HANDOFF_TIMEOUT", default_value = "15s", value_parser = parse_duration)]
    pub handoff_timeout: Duration,
    /// Most runs admitted and not yet started, all sessions together; one
    /// more is refused QUEUE_FULL (retryable) before anything is written.
    #[arg(long, env = "COORDINATOR_MAX_QUEUED_RUNS", default_value_t = 10_000)]
    pub max_queued_runs: usize,
    /// Most bytes (messages, attachments, options) those runs hold
    /// together in memory; a run that would go over is refused QUEUE_FULL.
    #[arg(long, env = "COORDINATOR_MAX_QUEUED_BYTES", default_value_t = 512 * 1024 * 1024)]
    pub max_queued_bytes: usize,
    /// Balanced placement: most partitions this coordinator hands off at once.
    #[arg(long, env = "COORDINATOR_MAX_PARTITION_MOVES", default_value_t = 16)]
    pub max_partition_moves: usize,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
}

impl CoordinatorArgs {
    pub fn config(&self) -> CoordinatorConfig {
        CoordinatorConfig {
            max_executing: self.max_executing.max(1),
            max_queued_runs: self.max_queued_runs,
            max_queued_bytes: self.max_queued_bytes,
            default_run_timeout: self.default_run_timeout,
            max_run_timeout: self.max_run_timeout,
            dedupe_ttl: self.dedupe_ttl,
            dedupe_capacity: self.dedupe_capacity,
            delta_interval: self.delta_interval,
            events: HubLimits {
                retention: self.event_retention,
                max_retained_runs: self.max_retained_runs,
                max_events_per_run: self.max_events_per_run.max(1),
                max_stream_events: self.max_stream_events.max(1),
            },
            history_entries: self.history_entries,
            max_message_bytes: self.max_message_bytes,
            max_options_bytes: self.max_options_bytes,
            max_attachment_bytes: self.max_attachment_bytes,
            max_attachments: self.max_attachments,
            max_label_chars: self.max_label_chars,
            max_requester_chars: self.max_requester_chars,
            cancel_settle: self.cancel_settle,
            default_wait: self.default_wait,
            max_wait: self.max_wait,
            ownership: OwnershipConfig {
                mode: self.ownership,
                placement: self.placement,
                handoff_timeout: self.handoff_timeout,
                max_moves: self.max_partition_moves,
                advertise_address: self.advertise_address.clone().unwrap_or_default(),
                lease_ttl: self.lease_ttl,
                renew_interval: self.lease_renew_interval,
            },
        }
    }
}

/// An advertised address is one another service dials: `http(s)://host:port`.
/// A `$(VAR)` left in it is a Kubernetes variable the pod never defined
/// (Kubernetes leaves those as written), so no caller could resolve it.
fn parse_advertise_address(raw: &str) -> Result<String, String> {
    if raw.contains("$(") {
        return Err(format!(
            "{raw:?} holds an unexpanded variable (define it before this one in the pod's env)"
        ));
    }
    let uri: tonic::transport::Uri = raw
        .parse()
        .map_err(|e| format!("{raw:?} is not an address: {e}"))?;
    let scheme_ok = matches!(uri.scheme_str(), Some("http" | "https"));
    let port_ok = uri.authority().is_some_and(|a| a.port_u16().is_some());
    if !scheme_ok || !port_ok {
        return Err(format!("{raw:?} is not http(s)://host:port"));
    }
    Ok(raw.to_owned())
}

/// The standalone coordinator: where it listens and which store it uses.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address the gRPC server listens on.
    #[arg(long, env = "COORDINATOR_LISTEN", default_value = "127.0.0.1:50062")]
    pub listen: SocketAddr,
    /// Address the Prometheus `/metrics` endpoint listens on.
    #[arg(
        long,
        env = "COORDINATOR_METRICS_LISTEN",
        default_value = "127.0.0.1:9462"
    )]
    pub metrics_listen: SocketAddr,
    /// Largest gRPC message the server accepts or sends, bytes: a transport
    /// ceiling above every input limit (docs/limits.md).
    #[arg(long, env = "COORDINATOR_GRPC_MAX_MESSAGE_BYTES", default_value_t = limits::GRPC_MAX_MESSAGE_BYTES)]
    pub grpc_max_message_bytes: usize,
    /// The session store's gRPC address.
    #[arg(
        long,
        env = "COORDINATOR_STORE_ADDRESS",
        default_value = "http://127.0.0.1:50061"
    )]
    pub store_address: String,
    /// Service tokens (comma-separated; the first is sent): this
    /// coordinator's calls to the store carry the first. With no per-kind
    /// token list (the simple mode), calls to this coordinator without one
    /// are refused `UNAUTHENTICATED` (health checks excepted) and its
    /// holders may call every RPC (docs/security.md). Unset, and no
    /// per-kind list: no token asked or sent.
    #[arg(long, env = "CLAWGATE_SERVICE_TOKEN", hide_env_values = true)]
    pub service_token: Option<clawgate_telemetry::ServiceTokens>,
    /// The tokens of each caller kind, each allowed what the coordinator's
    /// table grants it (docs/security.md).
    #[command(flatten)]
    pub callers: clawgate_telemetry::CallerTokenArgs,
    /// Serve without a service token on an address beyond loopback: anyone
    /// who reaches the port may submit, cancel or read any run. Without it
    /// such a coordinator refuses to start (docs/security.md).
    #[arg(long, env = "CLAWGATE_INSECURE")]
    pub insecure: bool,
    /// gRPC over TLS and mutual TLS: served, and used to call the store
    /// and an external runtime at `https://` addresses
    /// (docs/run-coordinator.md).
    #[command(flatten)]
    pub tls: clawgate_telemetry::tls::TlsArgs,
    #[command(flatten)]
    pub coordinator: CoordinatorArgs,
}

impl ServeArgs {
    /// The settings `args` and `env` give the `run-coordinator` binary, by
    /// its own parser and [`check`](Self::check) (for checking manifests
    /// without running it).
    pub fn from_settings(
        args: &[String],
        env: &std::collections::BTreeMap<String, String>,
    ) -> Result<Self, String> {
        let args: Self = clawgate_common::settings::parse("run-coordinator", args, env)?;
        args.check()?;
        Ok(args)
    }

    /// Refuses settings that would leave the coordinator open: service
    /// tokens shorter than the shortest secret allowed, or neither tokens
    /// nor mutual TLS on an address beyond loopback without `--insecure`.
    pub fn check(&self) -> Result<(), String> {
        clawgate_telemetry::service_auth::check_exposure(
            "the run coordinator",
            self.listen,
            self.service_token.as_ref(),
            &self.callers,
            self.tls.mutual(),
            self.insecure,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::parse_advertise_address;

    #[test]
    fn an_advertise_address_is_one_a_caller_can_dial() {
        for good in [
            "http://run-coordinator-0.run-coordinator.clawgate.svc.cluster.local:50062",
            "https://coord-a:443",
            "http://127.0.0.1:50062",
        ] {
            assert_eq!(parse_advertise_address(good).as_deref(), Ok(good));
        }
        for (bad, why) in [
            (
                "http://$(POD_NAME).run-coordinator:50062",
                "unexpanded variable",
            ),
            ("run-coordinator-0:50062", "not http(s)://host:port"),
            ("http://run-coordinator-0", "not http(s)://host:port"),
            ("grpc://run-coordinator-0:50062", "not http(s)://host:port"),
            ("http://a b:1", "is not an address"),
        ] {
            let refused = parse_advertise_address(bad).unwrap_err();
            assert!(refused.contains(why), "{bad}: {refused}");
        }
    }
}
