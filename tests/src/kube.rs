//! The Kubernetes tooling the manifest tests use, without a cluster:
//! `kubectl kustomize` renders an overlay, `kubernetes-validate` (pinned,
//! installed from PyPI into the test's cache on first use) validates it
//! against the API schemas offline, and PyYAML (installed with it) turns the
//! rendered YAML into JSON for the checks written in Rust.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use std::io::Write;

pub const VALIDATOR: &str = "kubernetes-validate==1.31.0";
pub const KUBERNETES: &str = "1.31.0";

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
    let dir = cache.join("kubernetes-validate-1.31.0");
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

/// Validates the manifests in `file`; `Err` with the report when refused.
pub fn validate(cache: &Path, file: &Path) -> Result<(), String> {
    let out = Command::new("python3")
        .args([
            "-m",
            "kubernetes_validate",
            "--strict",
            "--quiet",
            "-k",
            KUBERNETES,
        ])
        .arg(file)
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

/// `kubectl kustomize deploy/k8s/overlays/<overlay>`.
pub fn render(overlay: &str) -> String {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(repo().join("deploy/k8s/overlays").join(overlay))
        .output()
        .expect("kubectl runs (kubectl kustomize renders the overlays)");
    assert!(
        out.status.success(),
        "{overlay} does not render: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
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
