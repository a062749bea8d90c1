//! The prod overlay, rendered as shipped (and with each optional
//! component), serves what the deployment promises: a real runtime, callers
//! in other namespaces, a way in from outside, autoscaled edges that an
//! apply does not reset, coordinator rolls that wait for each new pod to
//! hold its partitions, no API token in any pod, startup probes, Pod
//! Security labels, spread constraints, content-hashed configuration,
//! metrics and alerts for all three services (issue 30), a service token
//! per caller kind (issue 29).

use std::collections::BTreeMap;
use std::path::Path;

use clawgate_system_tests::kube::{self, Manifests, repo};
use gateway_edge::EdgeConfig;
use run_coordinator::cli::{RuntimeKind, ServeArgs};
use run_coordinator::ownership::Placement;
use serde_json::Value;
use session_store::config::StoreConfig;

fn cache() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

/// One rendering's documents.
struct Rendered(Vec<Value>);

impl Rendered {
    fn of(manifests: &Manifests, base: &str, components: &[&str]) -> Self {
        Self(kube::documents(
            cache(),
            &manifests.render_with(base, components),
        ))
    }

    fn all<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.0.iter().filter(move |d| d["kind"] == kind)
    }

    fn one<'a>(&'a self, kind: &'a str, name: &str) -> &'a Value {
        self.all(kind)
            .find(|d| d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
    }

    fn workloads(&self) -> impl Iterator<Item = &Value> {
        self.0
            .iter()
            .filter(|d| matches!(d["kind"].as_str(), Some("Deployment" | "StatefulSet")))
    }

    /// The environment the first container of `workload` gets.
    fn env(&self, workload: &Value) -> BTreeMap<String, String> {
        let config_maps = self
            .all("ConfigMap")
            .map(|d| (d["metadata"]["name"].as_str().unwrap(), &d["data"]))
            .collect();
        let container = &workload["spec"]["template"]["spec"]["containers"][0];
        kube::container_env(container, workload, &config_maps).expect("every reference resolves")
    }

    fn coordinator(&self) -> ServeArgs {
        let env = self.env(self.one("StatefulSet", "run-coordinator"));
        ServeArgs::from_settings(&[], &env).unwrap()
    }

    fn store(&self) -> StoreConfig {
        let env = self.env(self.one("Deployment", "session-store"));
        StoreConfig::from_settings(&[], &env).unwrap()
    }

    fn edge(&self) -> EdgeConfig {
        let env = self.env(self.one("Deployment", "gateway-edge"));
        EdgeConfig::from_settings(&[], &env).unwrap()
    }

    /// The ingress rules of the NetworkPolicies selecting pods named `app`
    /// that open `port`.
    fn rules_opening(&self, app: &str, port: u64) -> Vec<&Value> {
        self.all("NetworkPolicy")
            .filter(|p| p["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == app)
            .flat_map(|p| p["spec"]["ingress"].as_array().unwrap())
            .filter(|rule| {
                rule["ports"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|p| p["port"] == port)
            })
            .collect()
    }
}

fn is_clawgate(workload: &Value) -> bool {
    workload["spec"]["template"]["spec"]["containers"][0]["command"][0]
        .as_str()
        .is_some_and(|c| c.starts_with("/usr/local/bin/"))
}

#[test]
fn prod_runs_a_real_runtime_with_its_key_from_the_secret() {
    let manifests = Manifests::copy();
    let prod = Rendered::of(&manifests, "overlays/prod", &[]);
    let runtime = prod.coordinator().coordinator.runtime;
    assert_eq!(runtime.runtime, RuntimeKind::Openai);
    // Base URL and model from the coordinator's ConfigMap.
    let config = prod
        .all("ConfigMap")
        .find(|d| d["data"]["COORDINATOR_RUNTIME"] == "openai")
        .expect("the runtime is chosen in a ConfigMap");
    assert_eq!(
        config["data"]["COORDINATOR_OPENAI_BASE_URL"],
        runtime.openai_base_url.as_str()
    );
    assert_eq!(
        config["data"]["COORDINATOR_OPENAI_MODEL"],
        runtime.openai_model.as_str()
    );
    // The key from a key of the overlay's Secret.
    let container =
        &prod.one("StatefulSet", "run-coordinator")["spec"]["template"]["spec"]["containers"][0];
    let key = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "OPENAI_API_KEY")
        .expect("OPENAI_API_KEY is set");
    let reference = &key["valueFrom"]["secretKeyRef"];
    let secret = prod.one("Secret", reference["name"].as_str().unwrap());
    assert!(secret["data"][reference["key"].as_str().unwrap()].is_string());

    // The component for an external runtime Service.
    let external = Rendered::of(&manifests, "base", &["components/runtime-grpc"]);
    let runtime = external.coordinator().coordinator.runtime;
    assert_eq!(runtime.runtime, RuntimeKind::Grpc);
    assert!(
        runtime.runtime_address.contains(".svc.cluster.local:"),
        "{}",
        runtime.runtime_address
    );
}

#[test]
fn internal_callers_in_other_namespaces_can_route() {
    let prod = Rendered::of(&Manifests::copy(), "overlays/prod", &[]);
    let coordinator = prod.coordinator();
    // A full name, resolvable from any namespace, over TLS (service-tls).
    assert_eq!(
        coordinator.coordinator.advertise_address.as_deref(),
        Some("https://run-coordinator-0.run-coordinator.clawgate.svc.cluster.local:50062")
    );
    let set = prod.one("StatefulSet", "run-coordinator");
    let headless = prod.one("Service", set["spec"]["serviceName"].as_str().unwrap());
    assert_eq!(headless["spec"]["clusterIP"], "None");
    // The coordinator and the store (the routing client reads the leases
    // and run records there) admit the internal-callers namespace label.
    for (app, port) in [("run-coordinator", 50062), ("session-store", 50061)] {
        let admitted = prod.rules_opening(app, port).iter().any(|rule| {
            rule["from"].as_array().unwrap().iter().any(|peer| {
                peer["namespaceSelector"]["matchLabels"]["clawgate.io/internal-callers"] == "true"
            })
        });
        assert!(admitted, "{app}:{port} shuts out internal callers");
    }
}

#[test]
fn autoscaled_edges_keep_their_count_and_leave_slowly() {
    let prod = Rendered::of(&Manifests::copy(), "overlays/prod", &[]);
    for hpa in prod.all("HorizontalPodAutoscaler") {
        let target = &hpa["spec"]["scaleTargetRef"];
        let workload = prod.one(
            target["kind"].as_str().unwrap(),
            target["name"].as_str().unwrap(),
        );
        assert!(
            workload["spec"]["replicas"].is_null(),
            "{} sets spec.replicas beside its HPA",
            target["name"]
        );
        let down = &hpa["spec"]["behavior"]["scaleDown"];
        assert!(down["stabilizationWindowSeconds"].as_u64() >= Some(300));
        assert!(
            down["policies"]
                .as_array()
                .unwrap()
                .iter()
                .all(|p| p["type"] == "Pods" && p["value"] == 1),
            "{down}"
        );
    }
    let pdb = prod.one("PodDisruptionBudget", "gateway-edge");
    assert!(pdb["spec"]["minAvailable"].is_null());
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
}

#[test]
fn a_coordinator_roll_waits_for_each_new_pod_to_hold_its_share() {
    let prod = Rendered::of(&Manifests::copy(), "overlays/prod", &[]);
    let coordinator = prod.coordinator().coordinator;
    // all-on-one would stall a roll (a standby is never Ready).
    assert_eq!(coordinator.placement, Placement::Balanced);
    let set = prod.one("StatefulSet", "run-coordinator");
    let min_ready = set["spec"]["minReadySeconds"].as_u64().unwrap();
    // A joining pod gets its share by graceful moves: one handoff (its
    // executing runs finishing) and the renew rounds around it.
    let share_arrives = coordinator.handoff_timeout + 2 * coordinator.lease_renew_interval;
    assert!(
        min_ready >= share_arrives.as_secs(),
        "minReadySeconds {min_ready} < {share_arrives:?}"
    );
    assert_eq!(set["spec"]["updateStrategy"]["type"], "RollingUpdate");
    // Nor does any other rendering use all-on-one in the StatefulSet.
    let manifests = Manifests::copy();
    for (name, base, components) in kube::RENDERINGS {
        let rendered = Rendered::of(&manifests, base, components);
        let placement = rendered.coordinator().coordinator.placement;
        assert_eq!(placement, Placement::Balanced, "{name}");
    }
}

#[test]
fn each_service_calls_with_a_token_of_its_own_kind() {
    use clawgate_telemetry::CallerKind;
    let manifests = Manifests::copy();
    for overlay in ["overlays/prod", "overlays/dev"] {
        let rendered = Rendered::of(&manifests, overlay, &[]);
        let (store, coordinator, edge) =
            (rendered.store(), rendered.coordinator(), rendered.edge());
        // The store sends nothing and serves only per-kind tokens.
        assert!(store.service_token.is_none(), "{overlay}");
        assert!(store.callers.scoped() && coordinator.callers.scoped());
        let sent_by_edge = edge.service_token.as_ref().expect("the edge sends a token");
        let sent_by_coordinator = coordinator.service_token.as_ref().unwrap();
        let kind_at = |callers: &clawgate_telemetry::CallerTokenArgs, token: &str| {
            callers.kind_of(None, token)
        };
        for (server, callers) in [
            ("store", &store.callers),
            ("coordinator", &coordinator.callers),
        ] {
            let kind = kind_at(callers, sent_by_edge.first());
            assert_eq!(
                kind,
                Some(CallerKind::Edge),
                "{overlay}: the edge at the {server}"
            );
            assert_eq!(
                callers.internal_tokens, store.callers.internal_tokens,
                "{overlay}: internal callers are known alike"
            );
            assert!(callers.internal_tokens.is_some(), "{overlay}: {server}");
        }
        assert_eq!(
            kind_at(&store.callers, sent_by_coordinator.first()),
            Some(CallerKind::Coordinator),
            "{overlay}: the coordinator at the store"
        );
        assert_ne!(sent_by_edge, sent_by_coordinator, "{overlay}");
    }
}

#[test]
fn pods_are_hardened_probed_and_spread() {
    let prod = Rendered::of(&Manifests::copy(), "overlays/prod", &[]);
    let namespace = prod.all("Namespace").next().unwrap();
    assert_eq!(
        namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
    let mut seen = 0;
    for workload in prod.workloads().filter(|w| is_clawgate(w)) {
        seen += 1;
        let name = workload["metadata"]["name"].as_str().unwrap();
        let pod = &workload["spec"]["template"]["spec"];
        assert_eq!(pod["automountServiceAccountToken"], false, "{name}");
        let account = prod.one(
            "ServiceAccount",
            pod["serviceAccountName"].as_str().unwrap(),
        );
        assert_eq!(account["automountServiceAccountToken"], false, "{name}");
        let keys: Vec<&str> = pod["topologySpreadConstraints"]
            .as_array()
            .unwrap_or_else(|| panic!("{name} is not spread"))
            .iter()
            .map(|c| c["topologyKey"].as_str().unwrap())
            .collect();
        assert!(keys.contains(&"kubernetes.io/hostname"), "{name}");
        assert!(keys.contains(&"topology.kubernetes.io/zone"), "{name}");
        let container = &pod["containers"][0];
        assert!(container["startupProbe"].is_object(), "{name}");
        // A name with a content hash: a changed setting or secret rolls it.
        for source in container["envFrom"].as_array().unwrap() {
            let map = source["configMapRef"]["name"].as_str().unwrap();
            assert!(
                map.rsplit_once('-')
                    .is_some_and(|(_, hash)| hash.len() == 10),
                "{name}: ConfigMap {map} has no content hash"
            );
        }
    }
    assert_eq!(seen, 3);
    let secret = prod
        .all("Secret")
        .next()
        .expect("prod generates its Secret");
    let name = secret["metadata"]["name"].as_str().unwrap();
    assert!(name.starts_with("clawgate-secrets-"), "{name}");
}

#[test]
fn the_edge_trusts_only_the_proxy_it_sits_behind() {
    let manifests = Manifests::copy();
    let whole_ten = |edge: &EdgeConfig| {
        edge.trusted_proxies.iter().any(|c| {
            c.contains("10.0.0.1".parse().unwrap()) && c.contains("10.255.255.254".parse().unwrap())
        })
    };
    let prod = Rendered::of(&manifests, "overlays/prod", &[]);
    assert!(prod.edge().trusted_proxies.is_empty());
    for component in ["components/ingress", "components/gateway-api"] {
        let behind = Rendered::of(&manifests, "overlays/prod", &[component]);
        let edge = behind.edge();
        assert!(!edge.trusted_proxies.is_empty(), "{component}");
        assert!(!whole_ten(&edge), "{component} trusts all of 10/8");
        // Only the proxy's namespace reaches the public port, so no other
        // pod can name a client.
        for rule in behind.rules_opening("gateway-edge", 18789) {
            let from = rule["from"].as_array().expect("a restricted rule");
            assert!(
                from.iter().all(
                    |p| p["namespaceSelector"]["matchLabels"]["clawgate.io/edge-proxy"] == "true"
                ),
                "{component}: {rule}"
            );
        }
    }
}

#[test]
fn a_route_in_with_tls_and_websocket_timeouts() {
    let manifests = Manifests::copy();
    let prod = Rendered::of(
        &manifests,
        "overlays/prod",
        &["components/ingress", "components/cert-manager"],
    );
    let tick = prod.edge().tick_interval.as_secs();
    let ingress = prod.one("Ingress", "gateway-edge");
    let annotations = &ingress["metadata"]["annotations"];
    for timeout in ["proxy-read-timeout", "proxy-send-timeout"] {
        let seconds: u64 = annotations[format!("nginx.ingress.kubernetes.io/{timeout}")]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            seconds > 2 * tick,
            "{timeout} {seconds}s against ticks every {tick}s"
        );
    }
    // TLS from the Secret cert-manager writes, for the host routed.
    let tls = &ingress["spec"]["tls"][0];
    let certificate = prod.one("Certificate", "clawgate-edge-tls");
    assert_eq!(tls["secretName"], certificate["spec"]["secretName"]);
    let host = &ingress["spec"]["rules"][0]["host"];
    assert_eq!(&tls["hosts"][0], host);
    assert_eq!(&certificate["spec"]["dnsNames"][0], host);
    let backend = &ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"];
    assert_eq!(backend["name"], "gateway-edge");
    let service = prod.one("Service", "gateway-edge");
    assert!(
        service["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == backend["port"]["name"]),
        "{backend}"
    );

    let gateway_api = Rendered::of(&manifests, "overlays/prod", &["components/gateway-api"]);
    let route = gateway_api.one("HTTPRoute", "gateway-edge");
    let parent = &route["spec"]["parentRefs"][0];
    let gateway = gateway_api.one("Gateway", parent["name"].as_str().unwrap());
    let listener = gateway["spec"]["listeners"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == parent["sectionName"])
        .unwrap();
    assert_eq!(listener["protocol"], "HTTPS");
    let certificate = &listener["tls"]["certificateRefs"][0];
    assert_eq!(certificate["kind"], "Secret");
    assert_eq!(certificate["name"], tls["secretName"]);
    let rule = &route["spec"]["rules"][0];
    assert_eq!(rule["backendRefs"][0]["name"], "gateway-edge");
    assert_eq!(rule["backendRefs"][0]["port"], 18789);
    assert_eq!(rule["timeouts"]["request"], "0s");
}

#[test]
fn every_service_is_scraped_and_alerted_on_with_real_metric_names() {
    let monitored = Rendered::of(
        &Manifests::copy(),
        "overlays/prod",
        &["components/monitoring"],
    );
    for service in ["gateway-edge", "run-coordinator", "session-store"] {
        let ports = &monitored.one("Service", service)["spec"]["ports"];
        assert!(
            ports
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "metrics"),
            "{service} has no metrics port"
        );
        let monitor = monitored.one("ServiceMonitor", service);
        assert_eq!(
            monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
            service
        );
        assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics");
    }
    let documented = std::fs::read_to_string(repo().join("docs/metrics.md")).unwrap();
    let rules = monitored.all("PrometheusRule").next().expect("alerts");
    let alerts: Vec<&Value> = rules["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .collect();
    for needed in [
        "clawgate_coordinator_partitions_held",
        "clawgate_store_operation_duration_seconds",
        "clawgate_edge_slow_consumer_closes_total",
    ] {
        assert!(
            alerts
                .iter()
                .any(|a| a["expr"].as_str().unwrap().contains(needed)),
            "no alert on {needed}"
        );
    }
    for alert in alerts {
        let expr = alert["expr"].as_str().unwrap();
        for metric in expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("clawgate_"))
        {
            let family = ["_count", "_bucket", "_sum"]
                .iter()
                .find_map(|s| metric.strip_suffix(s))
                .filter(|f| f.ends_with("_seconds"))
                .unwrap_or(metric);
            assert!(
                documented.contains(&format!("`{family}`")),
                "{} uses {metric}, not in docs/metrics.md",
                alert["alert"]
            );
        }
    }
}
