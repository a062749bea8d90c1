//! Encryption in the manifests (issue 29): the prod overlay's store
//! verifies its database against a CA mounted where docs/deploy.md's DSN
//! names it; and the `service-tls` component gives every hop between the
//! services mutual TLS: a certificate per service from a private CA made by
//! cert-manager, each mounted and passed through `CLAWGATE_TLS_*`, servers
//! requiring client certificates, clients verifying the servers by names
//! their certificates carry, every address `https://`, and no probe the
//! kubelet could not make (its gRPC probes speak plaintext).

use std::collections::BTreeMap;
use std::path::Path;

use clawgate_system_tests::kube::{self, Manifests, repo};
use serde_json::Value;

fn cache() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

/// The prod overlay with the service-tls component (once prod lists the
/// component itself, this is the prod overlay alone).
const PROD_WITH_SERVICE_TLS: (&str, &[&str]) = ("overlays/prod", &[]);

/// Where the store reads the database's CA (docs/deploy.md's DSN).
const POSTGRES_CA: &str = "/etc/clawgate/postgres-ca/ca.crt";

fn render(manifests: &Manifests, (base, components): (&str, &[&str])) -> Vec<Value> {
    kube::documents(cache(), &manifests.render_with(base, components))
}

fn one<'a>(documents: &'a [Value], kind: &str, name: &str) -> &'a Value {
    documents
        .iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// The first container's environment, as the kubelet gives it.
fn env_of(documents: &[Value], workload: &Value) -> BTreeMap<String, String> {
    let config_maps = documents
        .iter()
        .filter(|d| d["kind"] == "ConfigMap")
        .map(|d| (d["metadata"]["name"].as_str().unwrap(), &d["data"]))
        .collect();
    let container = &workload["spec"]["template"]["spec"]["containers"][0];
    kube::container_env(container, workload, &config_maps).expect("every reference resolves")
}

/// The Secret mounted at the folder holding `file`, in `workload`'s pods.
fn secret_holding(workload: &Value, file: &str) -> Option<String> {
    let pod = &workload["spec"]["template"]["spec"];
    let mount = pod["containers"][0]["volumeMounts"]
        .as_array()?
        .iter()
        .find(|m| Path::new(file).parent() == m["mountPath"].as_str().map(Path::new))?;
    let volume = pod["volumes"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == mount["name"])?;
    assert_eq!(mount["readOnly"], true, "{file}");
    volume["secret"]["secretName"].as_str().map(str::to_owned)
}

/// The host of `http(s)://host:port`.
fn host_of(address: &str) -> &str {
    let rest = address.split_once("://").unwrap().1;
    rest.split([':', '/']).next().unwrap()
}

/// Whether a certificate's DNS name covers `host` (`*.x`: one label).
fn covers(name: &str, host: &str) -> bool {
    match name.strip_prefix("*.") {
        Some(parent) => host
            .split_once('.')
            .is_some_and(|(label, rest)| !label.is_empty() && rest == parent),
        None => name == host,
    }
}

#[test]
fn the_store_verifies_its_database_with_the_mounted_ca() {
    let prod = render(&Manifests::copy(), ("overlays/prod", &[]));
    let store = one(&prod, "Deployment", "session-store");
    assert_eq!(
        secret_holding(store, POSTGRES_CA).as_deref(),
        Some("clawgate-postgres-ca")
    );
    let doc = std::fs::read_to_string(repo().join("docs/deploy.md")).unwrap();
    assert!(
        doc.contains(&format!("sslmode=verify-full&sslrootcert={POSTGRES_CA}")),
        "docs/deploy.md's DSN names another CA file"
    );
    assert!(
        doc.contains("create secret generic clawgate-postgres-ca --from-file=ca.crt="),
        "docs/deploy.md does not say how to create the CA's Secret"
    );
}

#[test]
fn service_tls_gives_every_hop_mutual_tls() {
    let manifests = Manifests::copy();
    let rendered = render(&manifests, PROD_WITH_SERVICE_TLS);
    let file = cache().join("prod+service-tls.yaml");
    std::fs::write(
        &file,
        manifests.render_with(PROD_WITH_SERVICE_TLS.0, PROD_WITH_SERVICE_TLS.1),
    )
    .unwrap();
    if let Err(report) = kube::validate(cache(), &file) {
        panic!("prod+service-tls does not validate:\n{report}");
    }
    let certificates: Vec<&Value> = rendered
        .iter()
        .filter(|d| d["kind"] == "Certificate")
        .collect();
    // The certificate that writes `secret`, checked to come from the CA.
    let certificate_of = |secret: &str| -> &Value {
        let certificate = certificates
            .iter()
            .find(|c| c["spec"]["secretName"] == secret)
            .unwrap_or_else(|| panic!("no Certificate writes {secret}"));
        let issuer = one(
            &rendered,
            "Issuer",
            certificate["spec"]["issuerRef"]["name"].as_str().unwrap(),
        );
        let ca_secret = issuer["spec"]["ca"]["secretName"].as_str().unwrap();
        let ca = certificates
            .iter()
            .find(|c| c["spec"]["secretName"] == ca_secret)
            .expect("a Certificate makes the CA");
        assert_eq!(ca["spec"]["isCA"], true);
        certificate
    };
    let usages = |certificate: &Value| -> Vec<String> {
        serde_json::from_value(certificate["spec"]["usages"].clone()).unwrap()
    };
    let names = |certificate: &Value| -> Vec<String> {
        serde_json::from_value(certificate["spec"]["dnsNames"].clone()).unwrap()
    };

    // Which workload serves, which calls, and the addresses it calls.
    let workloads = [
        ("Deployment", "session-store", true, vec![]),
        (
            "StatefulSet",
            "run-coordinator",
            true,
            vec!["COORDINATOR_STORE_ADDRESS"],
        ),
        (
            "Deployment",
            "gateway-edge",
            false,
            vec!["EDGE_STORE_ADDRESS", "EDGE_COORDINATOR_ADDRESS"],
        ),
    ];
    let mut served: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut dialed: Vec<String> = Vec::new();
    for (kind, name, serves, addresses) in &workloads {
        let workload = one(&rendered, kind, name);
        let env = env_of(&rendered, workload);
        let cert = env.get("CLAWGATE_TLS_CERT").expect("a certificate");
        let secret = secret_holding(workload, cert)
            .unwrap_or_else(|| panic!("{name}: {cert} is not in a mounted Secret"));
        for key in [
            "CLAWGATE_TLS_KEY",
            "CLAWGATE_TLS_CLIENT_CA",
            "CLAWGATE_TLS_CA",
        ] {
            if let Some(path) = env.get(key) {
                assert_eq!(
                    secret_holding(workload, path).as_deref(),
                    Some(secret.as_str()),
                    "{name}: {key}"
                );
            }
        }
        let certificate = certificate_of(&secret);
        let usages = usages(certificate);
        if *serves {
            assert!(env.contains_key("CLAWGATE_TLS_CLIENT_CA"), "{name}: mTLS");
            assert!(usages.contains(&"server auth".into()), "{name}");
            served.insert(name, names(certificate));
            let probes = &workload["spec"]["template"]["spec"]["containers"][0];
            for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
                assert!(probes[probe]["grpc"].is_null(), "{name}: a gRPC {probe}");
                assert!(probes[probe].is_object(), "{name}: no {probe}");
            }
        }
        if !addresses.is_empty() {
            assert!(env.contains_key("CLAWGATE_TLS_CA"), "{name}: verifies");
            assert!(usages.contains(&"client auth".into()), "{name}");
        }
        for address in addresses.iter().flat_map(|key| env[*key].split(',')) {
            assert!(address.starts_with("https://"), "{name}: {address}");
            dialed.push(address.to_owned());
        }
        if *name == "run-coordinator" {
            dialed.push(env["COORDINATOR_ADVERTISE_ADDRESS"].clone());
        }
    }
    // Every address dialed, the seeds and the advertised one (which routers
    // in other namespaces dial) included, is named by its server's
    // certificate.
    for address in &dialed {
        assert!(address.starts_with("https://"), "{address}");
        let host = host_of(address);
        let server = match host.split('.').next().unwrap() {
            "session-store" => "session-store",
            _ => "run-coordinator",
        };
        assert!(
            served[server].iter().any(|name| covers(name, host)),
            "{address}: not in {server}'s certificate {:?}",
            served[server]
        );
    }
    assert!(covers(
        "*.run-coordinator",
        "run-coordinator-0.run-coordinator"
    ));
    assert!(!covers("*.run-coordinator", "a.b.run-coordinator"));
}
