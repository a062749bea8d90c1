//! The Kubernetes tooling the manifest tests use, without a cluster:
//! `kubectl kustomize` renders an overlay (from a copy of `deploy/k8s` with
//! the operator's Secret files filled in), `kube/validate.py` validates it
//! offline with `kubernetes-validate` (pinned, installed from PyPI into the
//! test's cache on first use) and the vendored CRD schemas, and PyYAML
//! (installed with it) turns the rendered YAML into JSON for the checks
//! written in Rust.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use std::io::Write;

pub const VALIDATOR: &str = "kubernetes-validate==1.37.0";
/// The Kubernetes versions every manifest validates against: the oldest the
/// manifests support (`lifecycle.preStop.sleep` is GA in 1.30; docs/deploy.md
/// states it) and the newest the validator ships.
pub const KUBERNETES: &[&str] = &[OLDEST_KUBERNETES, "1.37.0"];
pub const OLDEST_KUBERNETES: &str = "1.30.0";

/// The repository's root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The validator's install directory under `cache` (a test's
/// `CARGO_TARGET_TMPDIR`), installed there when missing, once per process.
pub fn validator(cache: &Path) -> PathBuf {
    static INSTALLED: OnceLock<PathBuf> = OnceLock::new();
    INSTALLED.get_or_init(|| install(cache)).clone()
}

fn install(cache: &Path) -> PathBuf {
    let dir = cache.join(VALIDATOR.replace("==", "-"));
    if !dir.join("kubernetes_validate").is_dir() {
        let staging = dir.with_extension(format!("partial-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&staging);
        let installed = Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(["--no-warn-script-location", "--target"])
            .arg(&staging)
            .arg(VALIDATOR)
            .status()
            .expect("python3 runs (pip installs the validator)");
        assert!(installed.success(), "pip could not install {VALIDATOR}");
        // Renamed into place whole: an interrupted install leaves no half
        // package where the next run would look.
        let _ = std::fs::rename(&staging, &dir);
    }
    dir
}

/// Validates the manifests in `file` (`kube/validate.py`): built-in kinds
/// strictly against the API schemas of each of [`KUBERNETES`], CRD kinds
/// strictly against the CRD schemas vendored in `fixtures/crds`, and a kind
/// with neither refused. `Err` with the report when refused.
pub fn validate(cache: &Path, file: &Path) -> Result<(), String> {
    let out = Command::new("python3")
        .arg(repo().join("tests/src/kube/validate.py"))
        .arg(repo().join("fixtures/crds"))
        .arg(file)
        .args(KUBERNETES)
        .env("PYTHONPATH", validator(cache))
        .output()
        .expect("python3 runs");
    match out.status.success() {
        true => Ok(()),
        false => Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )),
    }
}

/// What the tests render: each overlay as shipped, and each optional
/// component on the overlay it is meant for (name, kustomization it builds
/// on, components added), so that every component is rendered, checked
/// against the binaries and validated.
pub const RENDERINGS: &[(&str, &str, &[&str])] = &[
    ("dev", "overlays/dev", &[]),
    ("prod", "overlays/prod", &[]),
    (
        "prod+monitoring",
        "overlays/prod",
        &["components/monitoring"],
    ),
    ("prod+ingress", "overlays/prod", &["components/ingress"]),
    (
        "prod+gateway-api",
        "overlays/prod",
        &["components/gateway-api"],
    ),
    (
        "prod+ingress+cert-manager",
        "overlays/prod",
        &["components/ingress", "components/cert-manager"],
    ),
    // The external runtime instead of prod's OpenAI-compatible one.
    ("base+runtime-grpc", "base", &["components/runtime-grpc"]),
];

/// A copy of `deploy/k8s` in a temporary directory, with the files an
/// operator writes before applying (the prod overlay's Secret files, which
/// git ignores) filled with placeholders, so that every overlay renders
/// as it would for them.
pub struct Manifests {
    root: tempfile::TempDir,
}

impl Manifests {
    pub fn copy() -> Self {
        let root = tempfile::tempdir().unwrap();
        copy_tree(&repo().join("deploy/k8s"), root.path());
        let manifests = Self { root };
        for overlay in ["dev", "prod"] {
            manifests.fill_secret_files(overlay);
        }
        manifests
    }

    /// The copy's root (the `deploy/k8s` of the copy).
    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// Writes a placeholder for each secretGenerator file `overlay` names
    /// that is not there.
    fn fill_secret_files(&self, overlay: &str) {
        let dir = self.root().join("overlays").join(overlay);
        for file in secret_files(&dir) {
            let path = dir.join(&file);
            if !path.exists() {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, format!("placeholder-{}", file.replace('/', "-"))).unwrap();
            }
        }
    }

    /// `kubectl kustomize` of `path` (relative to `deploy/k8s`).
    pub fn render(&self, path: &str) -> String {
        kustomize(&self.root().join(path))
    }

    /// Renders `base` with `components` added, through a kustomization
    /// written beside the others in the copy.
    pub fn render_with(&self, base: &str, components: &[&str]) -> String {
        if components.is_empty() {
            return self.render(base);
        }
        let dir = self
            .root()
            .join("renderings")
            .join(format!("{base}+{}", components.join("+")).replace('/', "_"));
        std::fs::create_dir_all(&dir).unwrap();
        let list = |paths: &[&str]| {
            paths
                .iter()
                .map(|p| format!("  - ../../{p}\n"))
                .collect::<String>()
        };
        std::fs::write(
            dir.join("kustomization.yaml"),
            format!(
                "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n{}components:\n{}",
                list(&[base]),
                list(components)
            ),
        )
        .unwrap();
        kustomize(&dir)
    }

    /// Every rendering of [`RENDERINGS`], by name.
    pub fn renderings(&self) -> Vec<(&'static str, String)> {
        RENDERINGS
            .iter()
            .map(|(name, base, components)| (*name, self.render_with(base, components)))
            .collect()
    }
}

/// The files (relative to `dir`) the secretGenerators of `dir`'s
/// kustomization read: the `files:` entries, `key=path` or `path`.
fn secret_files(dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
    let Some(generators) = text.split("secretGenerator:").nth(1) else {
        return Vec::new();
    };
    let mut files = Vec::new();
    let mut in_files = false;
    for line in generators.lines() {
        let trimmed = line.trim();
        if !line.starts_with(' ') && !trimmed.is_empty() && !trimmed.starts_with('#') {
            break; // the next top-level field
        }
        if trimmed.starts_with("files:") {
            in_files = true;
        } else if let Some(entry) = trimmed.strip_prefix("- ").filter(|_| in_files) {
            files.push(entry.rsplit('=').next().unwrap().to_owned());
        } else if !trimmed.starts_with('#') {
            in_files = false;
        }
    }
    files
}

/// Copies the directory `from` to `to`, recursively.
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// `kubectl kustomize <dir>`; panics with kustomize's report when it fails.
pub fn kustomize(dir: &Path) -> String {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("kubectl runs (kubectl kustomize renders the overlays)");
    assert!(
        out.status.success(),
        "{} does not render: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `kubectl kustomize deploy/k8s/overlays/<overlay>`, in a fresh copy.
pub fn render(overlay: &str) -> String {
    Manifests::copy().render(&format!("overlays/{overlay}"))
}

/// The documents of a multi-document YAML text, as JSON values.
pub fn documents(cache: &Path, yaml: &str) -> Vec<serde_json::Value> {
    let mut child = Command::new("python3")
        .args([
            "-c",
            "import sys, json, yaml; json.dump([d for d in yaml.safe_load_all(sys.stdin) if d], sys.stdout)",
        ])
        .env("PYTHONPATH", validator(cache))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(yaml.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the YAML does not parse");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A container's environment as the kubelet would give it to one pod of
/// `workload`: `envFrom` ConfigMaps first, then `env` in order, each value
/// with the `$(VAR)` references to variables defined before it expanded
/// (others stay as written, as the kubelet leaves them). A Secret's key
/// reads as a stand-in naming the Secret and the key (as long as a real
/// secret must be); `Err` names ConfigMaps or keys that do not exist.
pub fn container_env(
    container: &serde_json::Value,
    workload: &serde_json::Value,
    config_maps: &BTreeMap<&str, &serde_json::Value>,
) -> Result<BTreeMap<String, String>, Vec<String>> {
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    let mut missing = Vec::new();
    for source in container["envFrom"].as_array().into_iter().flatten() {
        let map = source["configMapRef"]["name"].as_str().unwrap();
        match config_maps.get(map) {
            Some(data) => {
                for (key, value) in data.as_object().into_iter().flatten() {
                    env.insert(key.clone(), value.as_str().unwrap_or("").to_owned());
                }
            }
            None => missing.push(format!("no ConfigMap {map}")),
        }
    }
    let pod = format!("{}-0", workload["metadata"]["name"].as_str().unwrap());
    let namespace = workload["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default")
        .to_owned();
    for var in container["env"].as_array().into_iter().flatten() {
        let name = var["name"].as_str().unwrap().to_owned();
        let from = &var["valueFrom"];
        let value = if let Some(value) = var["value"].as_str() {
            expand(value, &env)
        } else if let Some(field) = from["fieldRef"]["fieldPath"].as_str() {
            match field {
                "metadata.name" => pod.clone(),
                "metadata.namespace" => namespace.clone(),
                other => format!("<{other}>"),
            }
        } else if from["configMapKeyRef"].is_object() {
            let map = from["configMapKeyRef"]["name"].as_str().unwrap();
            let key = from["configMapKeyRef"]["key"].as_str().unwrap();
            match config_maps.get(map).and_then(|d| d[key].as_str()) {
                Some(value) => value.to_owned(),
                None => {
                    missing.push(format!("no key {key} in ConfigMap {map}"));
                    continue;
                }
            }
        } else if from["secretKeyRef"].is_object() {
            // One stand-in per Secret key, the same wherever that key is
            // read: settings that must agree across pods (a token one
            // sends, one of the tokens another accepts) can be compared.
            let secret = &from["secretKeyRef"];
            let (name, key) = (secret["name"].as_str(), secret["key"].as_str());
            format!("from-secret-{}-{}", name.unwrap(), key.unwrap())
        } else {
            "<read-from-elsewhere>".to_owned()
        };
        env.insert(name, value);
    }
    match missing.is_empty() {
        true => Ok(env),
        false => Err(missing),
    }
}

/// `$(VAR)` replaced by VAR's value where VAR is defined; `$$` is a `$`.
pub fn expand(value: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        if let Some(after) = rest.strip_prefix("$$") {
            out.push('$');
            rest = after;
        } else if let Some(close) = rest.find(')').filter(|_| rest.starts_with("$("))
            && let Some(defined) = env.get(&rest[2..close])
        {
            out.push_str(defined);
            rest = &rest[close + 1..];
        } else {
            out.push('$');
            rest = &rest[1..];
        }
    }
    out + rest
}
