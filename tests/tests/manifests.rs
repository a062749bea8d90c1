//! Every kustomize overlay in `deploy/k8s` renders with `kubectl kustomize`
//! and validates, offline, against the Kubernetes 1.31 API schemas (with
//! `kubernetes-validate`, installed from PyPI into the test's cache on first
//! use, pinned); a deliberately broken manifest is refused by the same check.

use std::path::Path;

use clawgate_system_tests::kube::{self, Manifests, repo};

fn cache() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

fn validate(file: &Path) -> Result<(), String> {
    kube::validate(cache(), file)
}

#[test]
fn every_overlay_and_component_renders_and_validates() {
    for (overlay, rendered) in Manifests::copy().renderings() {
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
