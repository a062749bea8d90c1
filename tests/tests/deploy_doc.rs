//! docs/deploy.md gives a newcomer commands that work, in an order that
//! works. Without a cluster, what can be checked is checked: the prod
//! Secret's block runs for real and prod renders from the files it wrote;
//! every overlay the doc applies renders, and the doc applies every overlay
//! there is; every component it names exists, and it names every one; no
//! `kubectl -n <namespace>` comes before the apply that creates that
//! namespace, and each object such a command names is in it (a port-forward's
//! port on its Service); every namespace label it sets is one a
//! NetworkPolicy selects; no secret goes on a command line; the minimum
//! Kubernetes version it states is the oldest the manifests validate against.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use clawgate_system_tests::kube::{self, Manifests, repo};
use serde_json::Value;

fn cache() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

fn doc() -> String {
    std::fs::read_to_string(repo().join("docs/deploy.md")).unwrap()
}

/// The doc's `sh` blocks, in order.
fn shell_blocks(doc: &str) -> Vec<String> {
    doc.split("```sh\n")
        .skip(1)
        .map(|rest| rest.split("```").next().unwrap().to_owned())
        .collect()
}

/// A block's commands: continuation lines joined, comments dropped.
fn commands(block: &str) -> Vec<String> {
    block
        .replace("\\\n", " ")
        .lines()
        .map(|line| line.split("   #").next().unwrap().trim().to_owned())
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .collect()
}

/// The subdirectories of `deploy/k8s/<dir>`.
fn entries(dir: &str) -> BTreeSet<String> {
    std::fs::read_dir(repo().join("deploy/k8s").join(dir))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect()
}

#[test]
fn the_minimum_kubernetes_is_the_oldest_validated() {
    let (major_minor, _) = kube::OLDEST_KUBERNETES.rsplit_once('.').unwrap();
    assert!(
        doc().contains(&format!("**Kubernetes {major_minor} or later.**")),
        "docs/deploy.md does not state Kubernetes {major_minor} as the minimum"
    );
}

#[test]
fn no_secret_is_typed_on_a_command_line() {
    for file in [
        "docs/deploy.md",
        "deploy/README.md",
        "deploy/k8s/overlays/prod/kustomization.yaml",
        "deploy/k8s/overlays/prod/secrets/README.md",
    ] {
        let text = std::fs::read_to_string(repo().join(file)).unwrap();
        assert!(!text.contains("--from-literal"), "{file} types a secret");
    }
}

#[test]
fn the_doc_names_every_overlay_and_component_and_no_other() {
    let doc = doc();
    let applied: BTreeSet<String> = shell_blocks(&doc)
        .iter()
        .flat_map(|b| commands(b))
        .filter_map(|c| {
            c.strip_prefix("kubectl apply -k deploy/k8s/overlays/")
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(applied, entries("overlays"));
    let named: BTreeSet<String> = doc
        .split("components/")
        .skip(1)
        .map(|rest| {
            rest.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .next()
                .unwrap()
                .to_owned()
        })
        .filter(|name| !name.is_empty())
        .collect();
    assert_eq!(named, entries("components"));
}

/// What one `kubectl apply -k` created: its namespace's objects, by kind
/// and name.
struct Applied {
    objects: BTreeMap<String, Vec<Value>>,
}

impl Applied {
    fn find(&self, namespace: &str, kind: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(namespace)?
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
    }
}

/// `deploy`, `svc/…`: the kinds as kubectl's short names give them.
fn kind_of(short: &str) -> &'static str {
    match short {
        "deploy" | "deployment" => "Deployment",
        "statefulset" | "sts" => "StatefulSet",
        "svc" | "service" => "Service",
        "hpa" => "HorizontalPodAutoscaler",
        other => panic!("a kind the test does not know: {other}"),
    }
}

#[test]
fn each_cluster_command_follows_the_apply_that_creates_what_it_names() {
    let manifests = Manifests::copy();
    let all: Vec<Value> = manifests
        .renderings()
        .iter()
        .flat_map(|(_, yaml)| kube::documents(cache(), yaml))
        .collect();
    let mut applied = Applied {
        objects: BTreeMap::new(),
    };
    let mut checked = 0;
    for command in shell_blocks(&doc()).iter().flat_map(|b| commands(b)) {
        let words: Vec<&str> = command.split_whitespace().collect();
        if words.first() != Some(&"kubectl") {
            continue;
        }
        if let Some(path) = command.strip_prefix("kubectl apply -k deploy/k8s/") {
            for document in kube::documents(cache(), &manifests.render(path)) {
                if let Some(namespace) = document["metadata"]["namespace"].as_str() {
                    applied
                        .objects
                        .entry(namespace.to_owned())
                        .or_default()
                        .push(document.clone());
                }
            }
            continue;
        }
        if let Some(path) = command.strip_prefix("kubectl kustomize deploy/k8s/") {
            manifests.render(path);
            continue;
        }
        if let ["kubectl", "label", "namespace", _, label] = words[..] {
            let (key, value) = label.split_once('=').unwrap();
            let selected = all
                .iter()
                .filter(|d| d["kind"] == "NetworkPolicy")
                .any(|p| {
                    p["spec"]["ingress"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .flat_map(|rule| rule["from"].as_array().into_iter().flatten())
                        .any(|peer| peer["namespaceSelector"]["matchLabels"][key] == value)
                });
            assert!(selected, "{command}: no NetworkPolicy selects {label}");
            checked += 1;
            continue;
        }
        let ["kubectl", "-n", namespace, verb, ref rest @ ..] = words[..] else {
            panic!("a kubectl command the test cannot check: {command}");
        };
        assert!(
            applied.objects.contains_key(namespace),
            "{command}: the namespace {namespace} is not created by an apply before it"
        );
        // `rollout status|restart <target>`: the target follows the subcommand.
        let rest = if verb == "rollout" { &rest[1..] } else { rest };
        let (kind, name, more) = match (verb, rest) {
            ("create", ["secret", _, name, ..]) => {
                let referenced = all
                    .iter()
                    .any(|d| serde_json::to_string(d).unwrap().contains(name));
                assert!(referenced, "{command}: no manifest reads the Secret {name}");
                checked += 1;
                continue;
            }
            (_, [kind, name, more @ ..]) if !kind.contains('/') => (kind_of(kind), *name, more),
            (_, [target, more @ ..]) => {
                let (kind, name) = target.split_once('/').unwrap();
                (kind_of(kind), name, more)
            }
            _ => panic!("{command}: names nothing"),
        };
        let object = applied
            .find(namespace, kind, name)
            .unwrap_or_else(|| panic!("{command}: no {kind} {name} in {namespace}"));
        if verb == "port-forward" {
            let port: u64 = more[0].parse().unwrap();
            assert!(
                object["spec"]["ports"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|p| p["port"] == port),
                "{command}: {name} has no port {port}"
            );
        }
        checked += 1;
    }
    assert!(checked >= 15, "only {checked} commands checked");
}

#[test]
fn the_secret_block_writes_files_prod_renders_from() {
    let block = shell_blocks(&doc())
        .into_iter()
        .find(|b| b.contains("openssl rand"))
        .expect("the doc writes the prod secrets");
    let checkout = tempfile::tempdir().unwrap();
    kube::copy_tree(&repo().join("deploy"), &checkout.path().join("deploy"));
    let secrets = checkout.path().join("deploy/k8s/overlays/prod/secrets");
    for entry in std::fs::read_dir(&secrets).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        if name != "README.md" && name != ".gitignore" {
            std::fs::remove_file(path).unwrap(); // a developer's own files
        }
    }
    let dsn = "postgres://clawgate:pw@db.example:5432/clawgate?sslmode=require";
    let mut shell = Command::new("bash")
        .arg("-e")
        .arg("-c")
        .arg(&block)
        .current_dir(checkout.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    write!(shell.stdin.take().unwrap(), "{dsn}\nsk-test-key\n").unwrap();
    let out = shell.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the block fails: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered = kube::documents(
        cache(),
        &kube::kustomize(&checkout.path().join("deploy/k8s/overlays/prod")),
    );
    let kinds: Vec<&str> = rendered
        .iter()
        .map(|d| d["kind"].as_str().unwrap())
        .collect();
    let at = |kind: &str| kinds.iter().position(|k| *k == kind).unwrap();
    assert!(at("Namespace") < at("Secret"), "{kinds:?}");
    let secret = rendered.iter().find(|d| d["kind"] == "Secret").unwrap();
    let data = secret["data"].as_object().unwrap();
    let decoded = |key: &str| -> String {
        let mut base64 = Command::new("base64")
            .arg("-d")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        write!(
            base64.stdin.take().unwrap(),
            "{}",
            data[key].as_str().unwrap()
        )
        .unwrap();
        String::from_utf8(base64.wait_with_output().unwrap().stdout).unwrap()
    };
    assert_eq!(decoded("store-url"), dsn);
    assert_eq!(decoded("openai-api-key"), "sk-test-key");
    for key in [
        "edge-token",
        "device-token-secret",
        "edge-service-token",
        "coordinator-service-token",
        "internal-service-tokens",
    ] {
        assert_eq!(decoded(key).trim().len(), 64, "{key}");
    }
    // Written for the owner only (umask 077).
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(secrets.join("edge-token"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "{mode:o}");
}
