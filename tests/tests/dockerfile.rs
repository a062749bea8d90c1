//! The image definition agrees with the workspace, checked statically (no
//! container engine runs here): every binary the Dockerfile builds or copies
//! is a workspace binary, every service binary is in the image, the final
//! stage is a runtime image without build tools that runs as non-root and
//! has no HEALTHCHECK (Kubernetes probes check health), and the build
//! context leaves `target/` out.

use std::collections::BTreeSet;

use clawgate_system_tests::kube::repo;

/// The binaries of the workspace, from `cargo metadata`.
fn workspace_binaries() -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(repo())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter())
        .filter(|t| t["kind"].as_array().unwrap().iter().any(|k| k == "bin"))
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

/// A Dockerfile as (instruction, arguments), continuation lines joined and
/// comments dropped.
fn instructions(text: &str) -> Vec<(String, String)> {
    let mut joined = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => current.push_str(part),
            None => {
                current.push_str(line);
                joined.push(std::mem::take(&mut current));
            }
        }
    }
    joined
        .into_iter()
        .map(|l| {
            let (name, rest) = l.split_once(char::is_whitespace).unwrap_or((&l, ""));
            (name.to_ascii_uppercase(), rest.trim().to_owned())
        })
        .collect()
}

/// Every problem found with `dockerfile` against `binaries`.
fn problems(dockerfile: &str, binaries: &BTreeSet<String>) -> Vec<String> {
    let steps = instructions(dockerfile);
    let mut problems = Vec::new();
    let mut built = BTreeSet::new();
    for (name, args) in &steps {
        if name == "RUN" && args.contains("cargo build") {
            let words: Vec<&str> = args.split_whitespace().collect();
            for pair in words.windows(2).filter(|w| w[0] == "--bin") {
                built.insert(pair[1].to_owned());
            }
        }
    }
    for bin in &built {
        if !binaries.contains(bin) {
            problems.push(format!("builds {bin}, which is not a workspace binary"));
        }
    }
    let last_from = steps
        .iter()
        .rposition(|(n, _)| n == "FROM")
        .expect("a FROM");
    let base = &steps[last_from].1;
    if base.starts_with("rust:") || base.contains("AS builder") {
        problems.push(format!("the final stage runs on a build image: {base}"));
    }
    let final_stage = &steps[last_from..];
    let mut copied = BTreeSet::new();
    for (name, args) in final_stage {
        if name == "COPY" && args.starts_with("--from=") {
            let source = args.split_whitespace().nth(1).unwrap_or_default();
            let file = source.rsplit('/').next().unwrap_or_default().to_owned();
            if !built.contains(&file) {
                problems.push(format!("copies {file}, which the build does not build"));
            }
            copied.insert(file);
        }
        if name == "HEALTHCHECK" {
            problems.push("a HEALTHCHECK (probes check health)".into());
        }
    }
    for service in ["session-store", "run-coordinator", "gateway-edge"] {
        if !copied.contains(service) {
            problems.push(format!("the image lacks {service}"));
        }
    }
    match final_stage.iter().rev().find(|(n, _)| n == "USER") {
        None => problems.push("the final stage sets no USER (it would run as root)".into()),
        Some((_, user)) => {
            let name = user.split(':').next().unwrap_or_default();
            if name == "root" || name == "0" {
                problems.push(format!("the final stage runs as {user}"));
            }
        }
    }
    problems
}

#[test]
fn the_dockerfile_agrees_with_the_workspace() {
    let binaries = workspace_binaries();
    for service in [
        "session-store",
        "run-coordinator",
        "gateway-edge",
        "clawgate",
    ] {
        assert!(binaries.contains(service), "{service} in {binaries:?}");
    }
    let path = repo().join("deploy/docker/Dockerfile");
    let dockerfile = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{} must exist: {e}", path.display()));
    assert_eq!(problems(&dockerfile, &binaries), Vec::<String>::new());

    let ignore = std::fs::read_to_string(repo().join(".dockerignore")).expect(".dockerignore");
    assert!(
        ignore
            .lines()
            .any(|l| l.trim().trim_end_matches('/') == "target"),
        ".dockerignore keeps target/ out of the build context"
    );
}

#[test]
fn a_broken_dockerfile_is_caught() {
    let binaries = workspace_binaries();
    let broken = "FROM rust:1.95 AS builder\n\
        RUN cargo build --release --bin session-store --bin no-such-binary\n\
        FROM rust:1.95\n\
        COPY --from=builder /build/target/release/session-store /usr/local/bin/\n\
        COPY --from=builder /build/target/release/gateway-edge /usr/local/bin/\n\
        HEALTHCHECK CMD true\n\
        USER root\n";
    let found = problems(broken, &binaries);
    for expected in [
        "builds no-such-binary",
        "final stage runs on a build image",
        "copies gateway-edge, which the build does not build",
        "a HEALTHCHECK",
        "lacks run-coordinator",
        "runs as root",
    ] {
        assert!(
            found.iter().any(|p| p.contains(expected)),
            "{expected:?} not caught: {found:?}"
        );
    }
}
