//! Configuration of the session-store service: flags, each with an
//! environment variable (`SESSION_STORE_*`). Documented in docs/session-store.md.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use clawgate_common::parse_duration;

use crate::limits::Limits;

#[derive(Debug, Clone, Args)]
pub struct StoreConfig {
    /// Address the gRPC server listens on.
    #[arg(long, env = "SESSION_STORE_LISTEN", default_value = "127.0.0.1:50061")]
    pub listen: SocketAddr,

    /// Address the Prometheus `/metrics` endpoint listens on.
    #[arg(
        long,
        env = "SESSION_STORE_METRICS_LISTEN",
        default_value = "127.0.0.1:9461"
    )]
    pub metrics_listen: SocketAddr,

    /// The shared service token (comma-separated for rotation), the simple
    /// mode: with no per-kind token list, calls without one are refused
    /// `UNAUTHENTICATED` (health checks excepted) and its holders may call
    /// every RPC (docs/security.md). Unset, and no per-kind list: every
    /// call is served.
    #[arg(long, env = "CLAWGATE_SERVICE_TOKEN", hide_env_values = true)]
    pub service_token: Option<clawgate_telemetry::ServiceTokens>,

    /// The tokens of each caller kind, each allowed what the store's table
    /// grants it (docs/security.md).
    #[command(flatten)]
    pub callers: clawgate_telemetry::CallerTokenArgs,

    /// Serve without a service token on an address beyond loopback: anyone
    /// who reaches the port may call every RPC. Without it such a store
    /// refuses to start (docs/security.md).
    #[arg(long, env = "CLAWGATE_INSECURE")]
    pub insecure: bool,

    /// gRPC over TLS, and mutual TLS (`--tls-cert`, `--tls-key`,
    /// `--tls-client-ca`; docs/session-store.md).
    #[command(flatten)]
    pub tls: clawgate_telemetry::tls::TlsArgs,

    /// Where the data lives: a file path (the embedded store) or a
    /// `postgres://` URL.
    #[arg(
        long,
        env = "SESSION_STORE_URL",
        default_value = "data/session-store.redb"
    )]
    pub store: String,

    /// How long terminal run records are kept (e.g. 90s, 30m, 24h).
    #[arg(long, env = "SESSION_STORE_RUN_RETENTION", default_value = "24h", value_parser = parse_duration)]
    pub run_retention: Duration,

    /// How often expired run records are purged.
    #[arg(long, env = "SESSION_STORE_PURGE_INTERVAL", default_value = "1m", value_parser = parse_duration)]
    pub purge_interval: Duration,

    /// Every operation answers within this (e.g. 10s), or UNAVAILABLE: a
    /// database that stops answering costs a caller this long, not its
    /// wait forever.
    #[arg(long, env = "SESSION_STORE_OPERATION_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub operation_timeout: Duration,

    /// PostgreSQL: connections in the pool.
    #[arg(long, env = "SESSION_STORE_PG_POOL_SIZE", default_value_t = 16)]
    pub pg_pool_size: usize,

    /// PostgreSQL: connections kept for admission (CreateRun) and leases,
    /// beside the pool, so that a run's admission never waits for a
    /// connection behind executing runs' writes; 0: they share the pool.
    #[arg(
        long,
        env = "SESSION_STORE_PG_ADMISSION_POOL_SIZE",
        default_value_t = 4
    )]
    pub pg_admission_pool_size: usize,

    /// PostgreSQL: schema for the tables (created if missing).
    #[arg(long, env = "SESSION_STORE_PG_SCHEMA")]
    pub pg_schema: Option<String>,

    /// Embedded: the most writes committed together in one transaction.
    #[arg(long, env = "SESSION_STORE_GROUP_COMMIT_MAX", default_value_t = 256)]
    pub group_commit_max: usize,

    /// Partitions the sessions are spread over for coordinator ownership.
    /// Written in the store at its first start; a later start with another
    /// count refuses to open the store.
    #[arg(long, env = "SESSION_STORE_PARTITIONS", default_value_t = clawgate_common::partition::DEFAULT_PARTITIONS,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(clawgate_common::partition::MAX_PARTITIONS)))]
    pub partitions: u32,

    /// Largest gRPC message the server accepts or sends, bytes: a transport
    /// ceiling above every input limit (docs/limits.md).
    #[arg(long, env = "SESSION_STORE_GRPC_MAX_MESSAGE_BYTES", default_value_t = clawgate_common::limits::GRPC_MAX_MESSAGE_BYTES)]
    pub grpc_max_message_bytes: usize,

    #[command(flatten)]
    pub limits: LimitArgs,
}

impl StoreConfig {
    /// The settings `args` and `env` give the `session-store` binary, by its
    /// own parser and [`check`](Self::check) (for checking manifests
    /// without running it).
    pub fn from_settings(
        args: &[String],
        env: &std::collections::BTreeMap<String, String>,
    ) -> Result<Self, String> {
        let config: Self = clawgate_common::settings::parse("session-store", args, env)?;
        config.check()?;
        Ok(config)
    }

    /// Refuses settings that would leave the store open: service tokens
    /// shorter than the shortest secret allowed or given to two caller
    /// kinds, or neither tokens nor mutual TLS on an address beyond loopback
    /// without `--insecure`.
    pub fn check(&self) -> Result<(), String> {
        clawgate_telemetry::service_auth::check_exposure(
            "the session store",
            self.listen,
            self.service_token.as_ref(),
            &self.callers,
            self.tls.mutual(),
            self.insecure,
        )
    }
}

/// Every input limit, as flags. Defaults come from `Limits::default()`.
#[derive(Debug, Clone, Args)]
pub struct LimitArgs {
    /// Largest transcript entry (role + content + metadata), bytes.
    #[arg(long, env = "SESSION_STORE_MAX_ENTRY_BYTES", default_value_t = Limits::default().max_entry_bytes)]
    pub max_entry_bytes: usize,
    /// Most entries in one Append.
    #[arg(long, env = "SESSION_STORE_MAX_ENTRIES_PER_APPEND", default_value_t = Limits::default().max_entries_per_append)]
    pub max_entries_per_append: usize,
    /// Largest Append (all entries), bytes.
    #[arg(long, env = "SESSION_STORE_MAX_APPEND_BYTES", default_value_t = Limits::default().max_append_bytes)]
    pub max_append_bytes: usize,
    /// History page size when the caller gives none.
    #[arg(long, env = "SESSION_STORE_DEFAULT_HISTORY_LIMIT", default_value_t = Limits::default().default_history_limit)]
    pub default_history_limit: u32,
    /// Largest History page.
    #[arg(long, env = "SESSION_STORE_MAX_HISTORY_LIMIT", default_value_t = Limits::default().max_history_limit)]
    pub max_history_limit: u32,
    /// Largest maxChars of a History call, and the budget when none is given.
    #[arg(long, env = "SESSION_STORE_MAX_HISTORY_CHARS", default_value_t = Limits::default().max_history_chars)]
    pub max_history_chars: u32,
    /// ListSessions page size when the caller gives none.
    #[arg(long, env = "SESSION_STORE_DEFAULT_LIST_LIMIT", default_value_t = Limits::default().default_list_limit)]
    pub default_list_limit: u32,
    /// Largest ListSessions page.
    #[arg(long, env = "SESSION_STORE_MAX_LIST_LIMIT", default_value_t = Limits::default().max_list_limit)]
    pub max_list_limit: u32,
    /// Longest session label, characters.
    #[arg(long, env = "SESSION_STORE_MAX_LABEL_CHARS", default_value_t = Limits::default().max_label_chars)]
    pub max_label_chars: usize,
    /// Longest role, kind, fingerprint or owner, characters.
    #[arg(long, env = "SESSION_STORE_MAX_NAME_CHARS", default_value_t = Limits::default().max_name_chars)]
    pub max_name_chars: usize,
    /// Largest request_json / outcome_json of a run record, bytes.
    #[arg(long, env = "SESSION_STORE_MAX_RUN_PAYLOAD_BYTES", default_value_t = Limits::default().max_run_payload_bytes)]
    pub max_run_payload_bytes: usize,
    /// Largest settings object of a session after a PatchSession (compact
    /// JSON), bytes.
    #[arg(long, env = "SESSION_STORE_MAX_SETTINGS_BYTES", default_value_t = Limits::default().max_settings_bytes)]
    pub max_settings_bytes: usize,
    /// Most live entries of the coordinator member registry (1..4096, so that
    /// an answer listing them all fits a gRPC message); a heartbeat of a new
    /// member past it is refused.
    #[arg(long, env = "SESSION_STORE_MAX_MEMBERS", default_value_t = Limits::default().max_members,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=4096))]
    pub max_members: usize,
}

impl From<&LimitArgs> for Limits {
    fn from(a: &LimitArgs) -> Self {
        Limits {
            max_entry_bytes: a.max_entry_bytes,
            max_entries_per_append: a.max_entries_per_append,
            max_append_bytes: a.max_append_bytes,
            default_history_limit: a.default_history_limit,
            max_history_limit: a.max_history_limit,
            max_history_chars: a.max_history_chars,
            default_list_limit: a.default_list_limit,
            max_list_limit: a.max_list_limit,
            max_label_chars: a.max_label_chars,
            max_name_chars: a.max_name_chars,
            max_run_payload_bytes: a.max_run_payload_bytes,
            max_settings_bytes: a.max_settings_bytes,
            max_members: a.max_members,
        }
    }
}

/// Which backend a `--store` value selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendLocation {
    Embedded(PathBuf),
    Postgres(String),
}

impl BackendLocation {
    pub fn parse(raw: &str) -> Self {
        if raw.starts_with("postgres://") || raw.starts_with("postgresql://") {
            Self::Postgres(raw.to_owned())
        } else {
            Self::Embedded(PathBuf::from(raw))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_location() {
        assert_eq!(
            BackendLocation::parse("postgres://u@h/db"),
            BackendLocation::Postgres("postgres://u@h/db".into())
        );
        assert_eq!(
            BackendLocation::parse("data/x.redb"),
            BackendLocation::Embedded("data/x.redb".into())
        );
    }
}
