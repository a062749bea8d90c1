//! The manifests agree with the binaries: every variable and flag a
//! container is given is one its binary reads (from its `--help`, or the
//! telemetry variables every service reads), every value (flags, and
//! variables as the kubelet expands them) parses with the binary's own
//! parser, every port a Service, probe or
//! NetworkPolicy names is one the container listens on with that
//! configuration, and every gRPC probe names a service the binary registers
//! with health.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use clawgate_system_tests::kube;
use clawgate_system_tests::process::binary_path;
use serde_json::Value;

fn cache() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

/// What a binary accepts, from its `--help`.
struct Accepts {
    flags: BTreeSet<String>,
    env: BTreeSet<String>,
}

fn accepts(binary: &str) -> Accepts {
    let out = Command::new(binary_path(binary))
        .arg("--help")
        .env("NO_COLOR", "1")
        .output()
        .expect("the binary runs");
    let help = String::from_utf8_lossy(&out.stdout);
    let flags = help
        .split_whitespace()
        .filter(|w| w.starts_with("--"))
        .map(|w| {
            w.trim_end_matches(|c: char| !c.is_alphanumeric())
                .to_owned()
        })
        .collect();
    let env = help
        .match_indices("[env: ")
        .map(|(at, _)| {
            let rest = &help[at + 6..];
            rest[..rest.find(['=', ']']).unwrap()].to_owned()
        })
        .collect();
    Accepts { flags, env }
}

/// The health service each binary registers (besides the server's "").
fn health_service(binary: &str) -> &'static str {
    use clawgate_proto::run_coordinator::v1::run_coordinator_server;
    use clawgate_proto::session_store::v1::session_store_server;
    match binary {
        "session-store" => session_store_server::SERVICE_NAME,
        "run-coordinator" => run_coordinator_server::SERVICE_NAME,
        _ => "",
    }
}

fn port_of(address: &str) -> Option<u64> {
    address.rsplit(':').next()?.parse().ok()
}

fn rendered(overlay: &str) -> Vec<Value> {
    kube::documents(cache(), &kube::render(overlay))
}

/// Parses a container's settings with its binary's own parser.
fn parse_settings(
    binary: &str,
    args: &[String],
    env: &BTreeMap<String, String>,
) -> Result<(), String> {
    match binary {
        "session-store" => session_store::config::StoreConfig::from_settings(args, env).map(drop),
        "run-coordinator" => run_coordinator::cli::ServeArgs::from_settings(args, env).map(drop),
        "gateway-edge" => gateway_edge::EdgeConfig::from_settings(args, env).map(drop),
        other => Err(format!("no parser known for the binary {other}")),
    }
}

/// Every disagreement between rendered manifests and the binaries.
fn disagreements(documents: &[Value]) -> Vec<String> {
    let config_maps: BTreeMap<&str, &Value> = documents
        .iter()
        .filter(|d| d["kind"] == "ConfigMap")
        .map(|d| (d["metadata"]["name"].as_str().unwrap(), &d["data"]))
        .collect();
    let mut problems = Vec::new();
    // The ports each workload's pods listen on, by pod label, for the
    // Services and NetworkPolicies.
    let mut listening: Vec<(BTreeMap<String, String>, BTreeMap<String, u64>)> = Vec::new();
    for workload in documents
        .iter()
        .filter(|d| matches!(d["kind"].as_str(), Some("Deployment" | "StatefulSet")))
    {
        let name = workload["metadata"]["name"].as_str().unwrap();
        let template = &workload["spec"]["template"];
        let labels: BTreeMap<String, String> =
            serde_json::from_value(template["metadata"]["labels"].clone()).unwrap();
        for container in template["spec"]["containers"].as_array().unwrap() {
            let Some(command) = container["command"].as_array() else {
                continue; // not a clawgate binary (PostgreSQL, Jaeger)
            };
            let binary = command[0].as_str().unwrap().rsplit('/').next().unwrap();
            let accepts = accepts(binary);
            let env = match kube::container_env(container, workload, &config_maps) {
                Ok(env) => env,
                Err(missing) => {
                    problems.extend(missing.into_iter().map(|m| format!("{name}: {m}")));
                    continue;
                }
            };
            // Variables only there to be expanded into others ($(POD_NAME)).
            let expanded: BTreeSet<String> = container["env"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|var| var["value"].as_str())
                .flat_map(|v| v.split("$(").skip(1))
                .filter_map(|v| v.split(')').next())
                .map(str::to_owned)
                .collect();
            for key in env.keys() {
                let known = accepts.env.contains(key)
                    || clawgate_telemetry::ENV_VARS.contains(&key.as_str())
                    || clawgate_telemetry::ENV_PREFIXES
                        .iter()
                        .any(|p| key.starts_with(p))
                    || expanded.contains(key);
                if !known {
                    problems.push(format!("{name}: {binary} reads no variable {key}"));
                }
            }
            let args: Vec<String> = container["args"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|a| a.as_str().unwrap().to_owned())
                .collect();
            for arg in &args {
                let flag = arg.split('=').next().unwrap();
                if flag.starts_with("--") && !accepts.flags.contains(flag) {
                    problems.push(format!("{name}: {binary} has no flag {flag}"));
                }
            }
            // The values, by the binary's own parser: a misspelt enum, a
            // duration without a unit, an address that does not parse.
            if let Err(refused) = parse_settings(binary, &args, &env) {
                problems.push(format!("{name}: {binary} refuses its settings: {refused}"));
            }
            // The ports the binary listens on with this configuration.
            let bound: BTreeSet<u64> = env
                .iter()
                .filter(|(k, _)| k.ends_with("LISTEN"))
                .filter_map(|(_, v)| port_of(v))
                .collect();
            let mut ports = BTreeMap::new();
            for port in container["ports"].as_array().into_iter().flatten() {
                let number = port["containerPort"].as_u64().unwrap();
                if !bound.contains(&number) {
                    problems.push(format!(
                        "{name}: port {number} is not one {binary} listens on ({bound:?})"
                    ));
                }
                if let Some(port_name) = port["name"].as_str() {
                    ports.insert(port_name.to_owned(), number);
                }
            }
            for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
                let probe = &container[probe];
                if probe.is_null() {
                    continue;
                }
                let port = ["grpc", "httpGet", "tcpSocket"]
                    .iter()
                    .map(|action| &probe[action]["port"])
                    .find(|port| !port.is_null())
                    .unwrap_or(&Value::Null);
                let number = port
                    .as_u64()
                    .or_else(|| port.as_str().and_then(|n| ports.get(n).copied()));
                if !number.is_some_and(|n| bound.contains(&n)) {
                    problems.push(format!(
                        "{name}: a probe on {port}, where {binary} does not listen"
                    ));
                }
                if let Some(service) = probe["grpc"]["service"].as_str()
                    && service != health_service(binary)
                {
                    problems.push(format!(
                        "{name}: {binary} registers no health service {service}"
                    ));
                }
            }
            listening.push((labels.clone(), ports));
        }
    }
    let selected = |selector: &Value| -> Vec<&BTreeMap<String, u64>> {
        let selector: BTreeMap<String, String> =
            serde_json::from_value(selector.clone()).unwrap_or_default();
        listening
            .iter()
            .filter(|(labels, _)| selector.iter().all(|(k, v)| labels.get(k) == Some(v)))
            .map(|(_, ports)| ports)
            .collect()
    };
    for service in documents.iter().filter(|d| d["kind"] == "Service") {
        let name = service["metadata"]["name"].as_str().unwrap();
        let pods = selected(&service["spec"]["selector"]);
        if pods.is_empty() {
            continue; // PostgreSQL and Jaeger: not clawgate binaries
        }
        for port in service["spec"]["ports"].as_array().unwrap() {
            let target = &port["targetPort"];
            let ok = pods.iter().all(|ports| match target {
                Value::String(n) => ports.contains_key(n),
                Value::Number(n) => ports.values().any(|p| Some(*p) == n.as_u64()),
                _ => false,
            });
            if !ok {
                problems.push(format!("Service {name}: no container listens on {target}"));
            }
        }
    }
    for policy in documents.iter().filter(|d| d["kind"] == "NetworkPolicy") {
        let name = policy["metadata"]["name"].as_str().unwrap();
        let pods = selected(&policy["spec"]["podSelector"]["matchLabels"]);
        for rule in policy["spec"]["ingress"].as_array().into_iter().flatten() {
            for port in rule["ports"].as_array().into_iter().flatten() {
                let number = port["port"].as_u64();
                if !pods.is_empty()
                    && !pods
                        .iter()
                        .all(|ports| ports.values().any(|p| Some(*p) == number))
                {
                    problems.push(format!(
                        "NetworkPolicy {name}: port {number:?} is not listened on"
                    ));
                }
            }
        }
    }
    problems
}

#[test]
fn every_overlay_and_component_agrees_with_the_binaries() {
    for (overlay, yaml) in kube::Manifests::copy().renderings() {
        assert_eq!(
            disagreements(&kube::documents(cache(), &yaml)),
            Vec::<String>::new(),
            "{overlay}"
        );
    }
}

/// The same checks catch a manifest that drifted from the binaries.
#[test]
fn a_drifted_manifest_is_caught() {
    let mut documents = rendered("dev");
    let workload = |documents: &mut Vec<Value>, name: &str| -> usize {
        documents
            .iter()
            .position(|d| {
                d["metadata"]["name"] == name
                    && d["kind"] != "Service"
                    && d["spec"]["template"].is_object()
            })
            .unwrap()
    };
    let edge = workload(&mut documents, "gateway-edge");
    let container = &mut documents[edge]["spec"]["template"]["spec"]["containers"][0];
    container["env"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({ "name": "EDGE_NO_SUCH_SETTING", "value": "1" }));
    container["args"] = serde_json::json!(["--no-such-flag"]);
    container["ports"][0]["containerPort"] = serde_json::json!(12345);
    let coordinator = workload(&mut documents, "run-coordinator");
    let container = &mut documents[coordinator]["spec"]["template"]["spec"]["containers"][0];
    container["readinessProbe"]["grpc"]["service"] =
        serde_json::json!("clawgate.nothing.v1.Nothing");
    container["args"] = serde_json::json!(["--ownership=leese"]);
    let store = workload(&mut documents, "session-store");
    documents[store]["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({ "name": "SESSION_STORE_RUN_RETENTION", "value": "1 day" }));
    let found = disagreements(&documents);
    for expected in [
        "reads no variable EDGE_NO_SUCH_SETTING",
        "has no flag --no-such-flag",
        "port 12345 is not one gateway-edge listens on",
        "a probe on \"ws\", where gateway-edge does not listen",
        "NetworkPolicy gateway-edge-ingress: port Some(18789) is not listened on",
        "registers no health service clawgate.nothing.v1.Nothing",
        "run-coordinator refuses its settings: error: invalid value 'leese' for '--ownership",
        "session-store refuses its settings: error: invalid value '1 day' for '--run-retention",
    ] {
        assert!(
            found.iter().any(|p| p.contains(expected)),
            "{expected:?} not caught: {found:?}"
        );
    }
}

/// An advertised address naming a variable the pod does not define is left
/// as written by the kubelet, and refused by the coordinator's parser.
#[test]
fn an_unexpanded_variable_is_caught() {
    let mut documents = rendered("dev");
    let coordinator = documents
        .iter()
        .position(|d| d["kind"] == "StatefulSet" && d["metadata"]["name"] == "run-coordinator")
        .unwrap();
    documents[coordinator]["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
            "name": "COORDINATOR_ADVERTISE_ADDRESS",
            "value": "http://$(POD_NAME).run-coordinator.$(NO_SUCH_VARIABLE):50062"
        }));
    let found = disagreements(&documents);
    assert!(
        found
            .iter()
            .any(|p| p.contains("$(NO_SUCH_VARIABLE)") && p.contains("unexpanded variable")),
        "{found:?}"
    );
}
