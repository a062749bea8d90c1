//! The all-in-one's settings: every setting of each of the three services,
//! derived from that service's own clap type, so the two can never drift.
//!
//! Each service's arguments are taken from its `clap::Args` type and added
//! to one command under a help heading of their own. The environment
//! variable and the default stay exactly the service's; the flag gets the
//! service's prefix (`--edge-preauth-per-ip`, `--coordinator-max-executing`;
//! `--store` stays as it is), and keeps its own name as an alias where no
//! other service has that name (`--runtime`, `--token`). Only the wiring
//! between the services is left out: here they reach each other in process
//! or on the addresses they bound.
//!
//! Parsing is two steps: the combined command checks everything the user
//! gave (and reports errors in its own flag names); then each service's own
//! command parses its part again, from the same environment and the flags
//! given on the command line renamed back, so its defaults and environment
//! variables apply exactly as in that service's binary.

use std::ffi::OsString;

use clap::builder::Str;
use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Args, Command, FromArgMatches};
use gateway_edge::EdgeConfig;
use run_coordinator::cli::ServeArgs as CoordinatorServeArgs;
use session_store::config::StoreConfig;

/// One service's part of the command line.
struct Part {
    /// The service's own command: its arguments as its binary has them.
    command: Command,
    /// What its flags are prefixed with.
    prefix: &'static str,
    heading: &'static str,
    /// Arguments (by id) that wire this service to the others; the
    /// all-in-one sets them itself.
    wiring: &'static [&'static str],
}

fn parts() -> [Part; 3] {
    [
        Part {
            command: StoreConfig::augment_args(Command::new("session-store")),
            prefix: "store",
            heading: "Session store (SESSION_STORE_*)",
            wiring: &[],
        },
        Part {
            command: CoordinatorServeArgs::augment_args(Command::new("run-coordinator")),
            prefix: "coordinator",
            heading: "Run coordinator (COORDINATOR_*)",
            // The coordinator calls the store in process.
            wiring: &["store_address"],
        },
        Part {
            command: EdgeConfig::augment_args(Command::new("gateway-edge")),
            prefix: "edge",
            heading: "Gateway edge (EDGE_*)",
            // The edge is given the addresses the other two bound.
            wiring: &["coordinator_address", "store_address"],
        },
    ]
}

impl Part {
    /// The arguments the all-in-one takes from this service.
    fn arguments(&self) -> impl Iterator<Item = &clap::Arg> {
        self.command
            .get_arguments()
            .filter(|arg| !self.wiring.contains(&arg.get_id().as_str()))
    }

    /// The id of `arg` in the combined command (ids must be unique there).
    fn combined_id(&self, arg: &clap::Arg) -> String {
        format!("{}.{}", self.prefix, arg.get_id())
    }

    /// The flag `long` of this service has in the all-in-one.
    fn combined_long(&self, long: &str) -> String {
        if long == self.prefix || long.starts_with(&format!("{}-", self.prefix)) {
            long.to_owned()
        } else {
            format!("{}-{long}", self.prefix)
        }
    }
}

/// The all-in-one's command: every service's settings, grouped by service.
pub fn command() -> Command {
    let parts = parts();
    let all_longs: Vec<String> = parts
        .iter()
        .flat_map(|part| {
            part.arguments()
                .filter_map(|arg| arg.get_long())
                .flat_map(|long| [long.to_owned(), part.combined_long(long)])
        })
        .collect();
    let mut command = Command::new("clawgate")
        .version(env!("CARGO_PKG_VERSION"))
        .about(
            "The whole system in one process: the session store, the run \
             coordinator and the gateway edge (OpenClaw protocol v4).",
        )
        .after_help(
            "Every setting has the environment variable and the default of the \
             service's own binary (session-store, run-coordinator, gateway-edge). \
             Unlike gateway-edge, a token is made up and printed when the auth \
             mode is token and none is set.",
        );
    for part in &parts {
        for arg in part.arguments() {
            let mut combined = arg
                .clone()
                .id(part.combined_id(arg))
                .help_heading(Some(part.heading));
            if let Some(long) = arg.get_long() {
                let renamed = part.combined_long(long);
                let unique = all_longs.iter().filter(|l| *l == long).count() == 1;
                if renamed != long && unique {
                    combined = combined.visible_alias(Str::from(long.to_owned()));
                }
                combined = combined.long(Str::from(renamed));
            }
            command = command.arg(combined);
        }
    }
    command
}

/// What the all-in-one runs with.
#[derive(Debug, Clone)]
pub struct Settings {
    pub store: StoreConfig,
    pub coordinator: CoordinatorServeArgs,
    pub edge: EdgeConfig,
}

impl Settings {
    /// Parses the process's arguments and environment; exits with clap's
    /// message on bad input (and for `--help` / `--version`).
    pub fn parse() -> Self {
        let matches = command().get_matches();
        Self::from_matches(&matches).unwrap_or_else(|e| e.exit())
    }

    /// Parses `args` (the first one being the program name) and the
    /// process's environment.
    pub fn try_parse_from<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        Self::from_matches(&command().try_get_matches_from(args)?)
    }

    /// With per-kind service tokens, the edge (the only gRPC caller here:
    /// the coordinator calls the store in process) must call as the edge,
    /// or every call it makes would be refused.
    fn check_edge_token(&self) -> anyhow::Result<()> {
        let Some(sent) = &self.edge.service_token else {
            return Ok(());
        };
        let servers = [
            ("store", &self.store.callers, &self.store.service_token),
            (
                "coordinator",
                &self.coordinator.callers,
                &self.coordinator.service_token,
            ),
        ];
        for (server, callers, shared) in servers {
            let kind = callers.kind_of(shared.as_ref(), sent.first());
            anyhow::ensure!(
                !callers.scoped() || kind == Some(clawgate_telemetry::CallerKind::Edge),
                "with per-kind service tokens, the edge's CLAWGATE_SERVICE_TOKEN must be one of \
                 the {server}'s CLAWGATE_EDGE_TOKENS (docs/security.md)"
            );
        }
        Ok(())
    }

    /// Checks each service's own start-up rules (its secrets, its
    /// transport), and that the limits of the three services agree along the
    /// request path (docs/limits.md): each hop accepts at least what the
    /// one before it lets through, so a request is refused by the limit
    /// meant for it, never by a transport limit further in.
    pub fn check_limits(&self) -> anyhow::Result<()> {
        use clawgate_common::limits::{
            ENVELOPE_BYTES, attachments_bytes_needed, entry_bytes_needed, run_payload_bytes_needed,
        };
        // Each service's own start-up checks, then the chain between them.
        self.store.check().map_err(anyhow::Error::msg)?;
        self.coordinator.check().map_err(anyhow::Error::msg)?;
        self.check_edge_token()?;
        session_store::server::check_transport(&(&self.store).into())?;
        run_coordinator::server::check_transport(&self.coordinator)?;
        let run = &self.coordinator.coordinator;
        let store = &self.store.limits;
        let frame = self.edge.max_payload.saturating_add(ENVELOPE_BYTES);
        anyhow::ensure!(
            frame <= self.coordinator.grpc_max_message_bytes,
            "COORDINATOR_GRPC_MAX_MESSAGE_BYTES ({}) must hold EDGE_MAX_PAYLOAD ({}) and \
             {ENVELOPE_BYTES} bytes of envelope",
            self.coordinator.grpc_max_message_bytes,
            self.edge.max_payload
        );
        let entry = entry_bytes_needed(
            run.max_message_bytes,
            run.max_attachment_bytes,
            run.max_attachments,
        );
        anyhow::ensure!(
            store.max_entry_bytes >= entry,
            "SESSION_STORE_MAX_ENTRY_BYTES ({}) must hold a user turn of \
             COORDINATOR_MAX_MESSAGE_BYTES ({}) and its attachments at their worst-case \
             encoding ({entry})",
            store.max_entry_bytes,
            run.max_message_bytes
        );
        let payload = run_payload_bytes_needed(
            run.max_message_bytes,
            run.max_options_bytes,
            run.max_label_chars,
            run.max_requester_chars,
        ) + attachments_bytes_needed(run.max_attachment_bytes, run.max_attachments);
        anyhow::ensure!(
            store.max_run_payload_bytes >= payload,
            "SESSION_STORE_MAX_RUN_PAYLOAD_BYTES ({}) must hold a run request the coordinator \
             accepts at its worst-case JSON encoding ({payload})",
            store.max_run_payload_bytes
        );
        Ok(())
    }

    fn from_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let [store, coordinator, edge] = parts();
        Ok(Self {
            store: reparse(&store, matches)?,
            coordinator: reparse(&coordinator, matches)?,
            edge: reparse(&edge, matches)?,
        })
    }
}

/// Parses `part` with its own command: the flags the user gave for it on
/// the command line, renamed back; its environment and defaults by itself.
fn reparse<T: FromArgMatches>(part: &Part, matches: &ArgMatches) -> Result<T, clap::Error> {
    let mut argv: Vec<OsString> = vec![part.command.get_name().into()];
    for arg in part.arguments() {
        let id = part.combined_id(arg);
        if matches.value_source(&id) != Some(ValueSource::CommandLine) {
            continue;
        }
        let Some(long) = arg.get_long() else { continue };
        match arg.get_action() {
            ArgAction::SetTrue | ArgAction::SetFalse => argv.push(format!("--{long}").into()),
            ArgAction::Count => {
                let times = matches.get_count(&id);
                argv.extend((0..times).map(|_| OsString::from(format!("--{long}"))));
            }
            _ => {
                for value in matches.get_raw(&id).into_iter().flatten() {
                    let mut flag = OsString::from(format!("--{long}="));
                    flag.push(value);
                    argv.push(flag);
                }
            }
        }
    }
    let own = part.command.clone().try_get_matches_from(argv)?;
    T::from_arg_matches(&own)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_is_well_formed() {
        command().debug_assert();
    }

    #[test]
    fn flags_are_prefixed_and_keep_their_unique_names_as_aliases() {
        let settings = Settings::try_parse_from([
            "clawgate",
            "--edge-preauth-per-ip",
            "77",
            "--runtime",
            "echo",
            "--echo-chunks",
            "3",
            "--store-group-commit-max",
            "9",
            "--store",
            "elsewhere.redb",
        ])
        .unwrap();
        assert_eq!(settings.edge.preauth_per_ip, 77);
        assert_eq!(settings.coordinator.coordinator.runtime.echo_chunks, 3);
        assert_eq!(settings.store.group_commit_max, 9);
        assert_eq!(settings.store.store, "elsewhere.redb");
        // `--listen` belongs to all three: only the prefixed names exist.
        assert!(Settings::try_parse_from(["clawgate", "--listen", "127.0.0.1:1"]).is_err());
        let listens = Settings::try_parse_from([
            "clawgate",
            "--store-listen",
            "127.0.0.1:1",
            "--coordinator-listen",
            "127.0.0.1:2",
            "--edge-listen",
            "127.0.0.1:3",
        ])
        .unwrap();
        assert_eq!(listens.store.listen.port(), 1);
        assert_eq!(listens.coordinator.listen.port(), 2);
        assert_eq!(listens.edge.listen.port(), 3);
    }

    /// What the start-up checks say of `args`, refused.
    fn refusal(args: &[&str]) -> String {
        let args = std::iter::once("clawgate").chain(args.iter().copied());
        Settings::try_parse_from(args)
            .unwrap()
            .check_limits()
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_store_or_coordinator_beyond_loopback_needs_a_token_or_insecure() {
        for (service, named) in [
            ("store", "the session store listens on 0.0.0.0:0"),
            ("coordinator", "the run coordinator listens on 0.0.0.0:0"),
        ] {
            let listen = format!("--{service}-listen=0.0.0.0:0");
            let error = refusal(&[&listen]);
            assert!(error.starts_with(named), "{listen}: {error}");
            for allowed in [
                format!("--{service}-insecure"),
                format!("--{service}-service-token=a-long-service-token"),
            ] {
                Settings::try_parse_from(["clawgate", &listen, &allowed])
                    .unwrap()
                    .check_limits()
                    .unwrap_or_else(|e| panic!("{listen} {allowed}: {e}"));
            }
        }
    }

    #[test]
    fn with_per_kind_tokens_the_edge_must_call_as_the_edge() {
        let edge = "--edge-service-token=an-edge-token-0123456789";
        let lists = [
            "--store-edge-tokens=an-edge-token-0123456789",
            "--coordinator-edge-tokens=an-edge-token-0123456789",
            "--coordinator-internal-tokens=an-internal-token-0123456789",
        ];
        let args = [&["clawgate", edge][..], &lists].concat();
        Settings::try_parse_from(args)
            .unwrap()
            .check_limits()
            .unwrap();
        let error = refusal(&[
            "--edge-service-token=an-internal-token-0123456789",
            lists[0],
            lists[1],
            lists[2],
        ]);
        assert_eq!(
            error,
            "with per-kind service tokens, the edge's CLAWGATE_SERVICE_TOKEN must be one of the \
             store's CLAWGATE_EDGE_TOKENS (docs/security.md)"
        );
        let error = refusal(&[edge, "--store-edge-tokens=an-edge-token-0123456789,short"]);
        assert!(
            error.starts_with("CLAWGATE_EDGE_TOKENS (token 2 of 2) is 5 bytes long"),
            "{error}"
        );
    }

    #[test]
    fn device_tokens_last_30_days_unless_the_edge_is_told_otherwise() {
        let day = std::time::Duration::from_secs(86_400);
        let default = Settings::try_parse_from(["clawgate"]).unwrap();
        assert_eq!(default.edge.device_token_ttl, 30 * day);
        let set = Settings::try_parse_from(["clawgate", "--edge-device-token-ttl", "7d"]).unwrap();
        assert_eq!(set.edge.device_token_ttl, 7 * day);
    }

    #[test]
    fn values_that_look_like_flags_survive_the_second_parse() {
        let settings = Settings::try_parse_from(["clawgate", "--edge-token=--not-a-flag"]).unwrap();
        assert_eq!(settings.edge.token.as_deref(), Some("--not-a-flag"));
    }

    #[test]
    fn the_default_limits_agree_and_disagreeing_ones_are_refused_by_name() {
        Settings::try_parse_from(["clawgate"])
            .unwrap()
            .check_limits()
            .unwrap();
        for (flag, named) in [
            (
                "--coordinator-max-message-bytes=2000000",
                "SESSION_STORE_MAX_ENTRY_BYTES",
            ),
            (
                "--store-max-run-payload-bytes=1000",
                "SESSION_STORE_MAX_RUN_PAYLOAD_BYTES",
            ),
            (
                "--edge-max-payload=70000000",
                "COORDINATOR_GRPC_MAX_MESSAGE_BYTES",
            ),
        ] {
            let error = refusal(&[flag]);
            assert!(error.starts_with(named), "{flag}: {error}");
        }
    }

    #[test]
    fn bad_values_are_reported_with_the_all_in_one_flag() {
        let error = Settings::try_parse_from(["clawgate", "--edge-preauth-per-ip", "many"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("--edge-preauth-per-ip"), "{error}");
    }
}
