//! What every clawgate binary and service shares: a run's status, the
//! clock, the shutdown signal, duration flags, limits, partitions and gRPC
//! server reflection (logging and tracing are
//! in `clawgate-telemetry`).

use std::time::Duration;

pub mod allocator;
pub mod clock;
pub mod limits;
pub mod partition;
pub mod process;
pub mod run;
pub mod settings;

pub use run::RunStatus;

/// Resolves on SIGTERM (Kubernetes) or ctrl-c.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}

/// The longest duration a setting may have: a hundred years, which is
/// "never" for a timeout or a retention and still leaves `now + duration`
/// far from overflowing a clock.
pub const MAX_SETTING_DURATION: Duration = Duration::from_secs(100 * 365 * 86_400);

/// Parses `500ms`, `90s`, `30m`, `24h`, `7d`, or plain seconds, at most
/// [`MAX_SETTING_DURATION`].
pub fn parse_duration(raw: &str) -> Result<Duration, String> {
    let duration = parse_any_duration(raw)?;
    if duration > MAX_SETTING_DURATION {
        return Err(format!(
            "{raw:?} is longer than the longest setting, 100 years"
        ));
    }
    Ok(duration)
}

fn parse_any_duration(raw: &str) -> Result<Duration, String> {
    let raw = raw.trim();
    let split = raw.find(|c: char| !c.is_ascii_digit()).unwrap_or(raw.len());
    let (digits, unit) = raw.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{raw:?} is not a duration like 90s, 30m or 24h"))?;
    let seconds = |factor: u64| Duration::from_secs(n.saturating_mul(factor));
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "" | "s" => Ok(seconds(1)),
        "m" => Ok(seconds(60)),
        "h" => Ok(seconds(3600)),
        "d" => Ok(seconds(86_400)),
        _ => Err(format!(
            "unknown duration unit in {raw:?} (use ms, s, m, h or d)"
        )),
    }
}

/// The name of gRPC health (`grpc.health.v1.Health`), served by every server.
pub const HEALTH_SERVICE: &str = "grpc.health.v1.Health";
/// The reflection services, both served by every server: `v1`, and
/// `v1alpha` for the tools that only speak that (Python's grpcio-reflection,
/// older grpcurl, several GUI clients).
pub const REFLECTION_SERVICES: [&str; 2] = [
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
];

/// Server reflection for a server that serves `served` (fully-qualified
/// service names, e.g. `RunCoordinatorServer::<S>::NAME`), in both versions.
/// Each lists exactly what the server answers: `served`, health and the two
/// reflection services, never another clawgate service whose descriptor
/// happens to share the descriptor set. Every descriptor stays resolvable, so
/// a listed service's messages (and what they import) can be described.
#[allow(clippy::type_complexity)]
pub fn reflection_services(
    served: &[&str],
) -> Result<
    (
        tonic_reflection::server::v1::ServerReflectionServer<
            impl tonic_reflection::server::v1::ServerReflection,
        >,
        tonic_reflection::server::v1alpha::ServerReflectionServer<
            impl tonic_reflection::server::v1alpha::ServerReflection,
        >,
    ),
    tonic_reflection::server::Error,
> {
    let builder = || {
        let builder = tonic_reflection::server::Builder::configure()
            .include_reflection_service(false)
            .register_encoded_file_descriptor_set(clawgate_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(
                tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
            );
        served
            .iter()
            .copied()
            .chain([HEALTH_SERVICE])
            .chain(REFLECTION_SERVICES)
            .fold(builder, |builder, name| builder.with_service_name(name))
    };
    Ok((builder().build_v1()?, builder().build_v1alpha()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        assert!(parse_duration("h").is_err());
        assert!(parse_duration("5 weeks").is_err());
        assert_eq!(parse_duration("36500d"), Ok(MAX_SETTING_DURATION));
        assert!(parse_duration("36501d").is_err());
        assert!(parse_duration("18446744073709551615s").is_err());
    }
}
