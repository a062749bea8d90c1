//! Every kustomize overlay in `deploy/k8s` renders with `kubectl kustomize`
//! and validates, offline, against the Kubernetes 1.31 API schemas (with
//! `kubernetes-validate`, installed from PyPI into the test's cache on first
//! use, pinned); a deliberately broken manifest is refused by the same check.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const VALIDATOR: &str = "kubernetes-validate==1.31.0";
const KUBERNETES: &str = "1.31.0";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The validator's install directory, installed there when missing (once
/// per test process).
fn validator() -> PathBuf {
    static INSTALLED: OnceLock<PathBuf> = OnceLock::new();
    INSTALLED.get_or_init(install).clone()
}

fn install() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kubernetes-validate-1.31.0");
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
        // Renamed into place whole, so a concurrent or interrupted install
        // never leaves half a package behind.
        let _ = std::fs::rename(&staging, &dir);
    }
    dir
}

/// Validates `file`; `Err` with the validator's report when it refuses.
fn validate(file: &Path) -> Result<(), String> {
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
        .env("PYTHONPATH", validator())
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

fn render(overlay: &str) -> String {
    let out = Command::new("kubectl")
        .args(["kustomize"])
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

#[test]
fn every_overlay_renders_and_validates() {
    for overlay in ["dev", "prod"] {
        let rendered = render(overlay);
        let file = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{overlay}.yaml"));
        std::fs::write(&file, &rendered).unwrap();
        if let Err(report) = validate(&file) {
            panic!("{overlay} does not validate:\n{report}");
        }
        for kind in [
            "Deployment",
            "StatefulSet",
            "Service",
            "NetworkPolicy",
            "PodDisruptionBudget",
        ] {
            assert!(
                rendered.contains(&format!("kind: {kind}\n")),
                "{overlay} has no {kind}"
            );
        }
    }
}

#[test]
fn a_broken_manifest_is_refused() {
    let report = validate(&repo().join("tests/fixtures/broken-deployment.yaml"))
        .expect_err("the broken fixture must not validate");
    assert!(report.contains("replicas"), "{report}");
}
