//! Every kustomize overlay in `deploy/k8s`, and every component on the
//! overlay it is for, renders with `kubectl kustomize` and validates,
//! offline and strictly, against the API schemas of the oldest Kubernetes
//! the manifests support and the newest `kubernetes-validate` ships
//! (installed from PyPI into the test's cache on first use, pinned), and its
//! custom resources against the CRD schemas vendored in `fixtures/crds`;
//! deliberately broken manifests are refused by the same check.

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
fn broken_custom_resources_are_refused_by_their_crd_schemas() {
    let report = validate(&repo().join("tests/fixtures/broken-crd-objects.yaml"))
        .expect_err("the broken fixture must not validate");
    for expected in [
        "ServiceMonitor/broken (CRD schema): spec.endpoints.0: Additional properties are not allowed ('scrapeEvery'",
        "HTTPRoute/broken (CRD schema): spec.rules.0.backendRefs.0.port: 'ws' is not of type 'integer'",
        "HTTPRoute/broken (CRD schema): spec.rules.0.timeouts.request: 'forever' does not match",
        "Certificate/broken (CRD schema): spec: Additional properties are not allowed ('dnsName'",
        "Unheard/broken (1.37.0): no schema for example.com/v1",
    ] {
        assert!(report.contains(expected), "{expected:?} not in:\n{report}");
    }
}

#[test]
fn a_broken_manifest_is_refused() {
    let report = validate(&repo().join("tests/fixtures/broken-deployment.yaml"))
        .expect_err("the broken fixture must not validate");
    assert!(report.contains("replicas"), "{report}");
}
