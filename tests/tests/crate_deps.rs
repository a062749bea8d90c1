//! The workspace's layering, checked on its dependency graph: through its
//! normal dependencies (not dev, not build), directly or transitively, each
//! workspace crate reaches only the workspace crates [`MAY_REACH`] gives it.
//! A crate the table does not place fails the test: a new crate is placed
//! in it, on purpose, with its layer.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The ground floor: what every service links, linking no service itself.
/// Every crate under `services/shared/` is one of these.
const GROUND: &[&str] = &[
    "clawgate-proto",
    "clawgate-common",
    "clawgate-telemetry",
    "clawgate-client",
];
/// The services' API crates: their models, errors, traits and clients,
/// without the service behind them.
const APIS: &[&str] = &["session-store-api", "run-coordinator-api"];
/// The services.
const SERVICES: &[&str] = &["session-store", "run-coordinator", "gateway-edge"];
/// The binaries on top. Every crate under `services/bin/` is one of these;
/// nothing links them.
const BINARIES: &[&str] = &["clawgate", "clawgate-cli", "clawgate-bench"];
/// The test kit: beside the binaries, linked only as a dev-dependency.
const TEST_KIT: &str = "clawgate-system-tests";

/// Each workspace crate and the groups of workspace crates it may reach.
/// What a row leaves out is an edge issue 26 forbids, or one that goes up
/// a floor (to a binary or the test kit):
///
/// - the store reaches neither the coordinator nor the edge;
/// - the coordinator (service and API) does not reach the edge;
/// - the edge and the bench reach no store backend (`session-store`), only
///   the store's API;
/// - an API crate does not reach its service;
/// - the ground floor reaches no service, API or binary.
const MAY_REACH: &[(&str, &[&[&str]])] = &[
    ("clawgate-proto", &[GROUND]),
    ("clawgate-common", &[GROUND]),
    ("clawgate-telemetry", &[GROUND]),
    ("clawgate-client", &[GROUND]),
    ("session-store-api", &[GROUND]),
    ("run-coordinator-api", &[GROUND, &["session-store-api"]]),
    ("session-store", &[GROUND, &["session-store-api"]]),
    ("run-coordinator", &[GROUND, APIS, &["session-store"]]),
    ("gateway-edge", &[GROUND, APIS, &["run-coordinator"]]),
    ("clawgate", &[GROUND, APIS, SERVICES]),
    ("clawgate-cli", &[GROUND, APIS, SERVICES]),
    (
        "clawgate-bench",
        &[GROUND, APIS, &["run-coordinator", "gateway-edge"]],
    ),
    (TEST_KIT, &[GROUND, APIS, SERVICES]),
];

/// `MAY_REACH` as crate → the crates it may reach.
fn allowed() -> BTreeMap<&'static str, BTreeSet<&'static str>> {
    MAY_REACH
        .iter()
        .map(|&(name, groups)| {
            (
                name,
                groups.iter().flat_map(|g| g.iter().copied()).collect(),
            )
        })
        .collect()
}

/// A workspace member: its name and its folder relative to the repository.
#[derive(Debug)]
struct Member {
    name: String,
    folder: PathBuf,
}

/// The workspace: its members and, for each, the members it depends on
/// through normal dependencies.
#[derive(Debug)]
struct Workspace {
    members: Vec<Member>,
    normal_deps: BTreeMap<String, BTreeSet<String>>,
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the test kit is a folder of the repository")
}

/// The workspace as `cargo metadata --no-deps` describes it, read once
/// per test binary. The members' own manifests are all it takes: a
/// registry crate never depends on a workspace crate, so every path
/// between two members runs through members.
fn workspace() -> &'static Workspace {
    static WORKSPACE: OnceLock<Workspace> = OnceLock::new();
    WORKSPACE.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = std::process::Command::new(cargo)
            .args([
                "metadata",
                "--format-version",
                "1",
                "--no-deps",
                "--offline",
            ])
            .arg("--manifest-path")
            .arg(repo().join("Cargo.toml"))
            .output()
            .expect("cargo metadata runs");
        assert!(
            out.status.success(),
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        parse_metadata(&serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON"))
    })
}

/// The members and their normal edges among themselves, from the JSON of
/// `cargo metadata --format-version 1 --no-deps`. A dependency is a member
/// when its `path` is a member's folder (so a renamed one counts too); an
/// optional one counts, as it is an edge once its feature is on.
fn parse_metadata(metadata: &serde_json::Value) -> Workspace {
    let root = PathBuf::from(metadata["workspace_root"].as_str().expect("workspace_root"));
    let packages = metadata["packages"].as_array().expect("packages");
    let folder_of = |package: &serde_json::Value| -> PathBuf {
        let manifest = Path::new(package["manifest_path"].as_str().expect("manifest_path"));
        manifest
            .parent()
            .expect("a manifest is in a folder")
            .to_owned()
    };
    let by_folder: BTreeMap<PathBuf, String> = packages
        .iter()
        .map(|p| (folder_of(p), p["name"].as_str().expect("a name").to_owned()))
        .collect();
    let mut members = Vec::new();
    let mut normal_deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for package in packages {
        let name = package["name"].as_str().expect("a package name").to_owned();
        let folder = folder_of(package);
        let deps = normal_deps.entry(name.clone()).or_default();
        for dep in package["dependencies"].as_array().expect("dependencies") {
            // `kind` is null for a normal dependency, "dev" or "build" else.
            let Some(path) = dep["path"].as_str().filter(|_| dep["kind"].is_null()) else {
                continue;
            };
            if let Some(member) = by_folder.get(Path::new(path)) {
                deps.insert(member.clone());
            }
        }
        let folder = folder
            .strip_prefix(&root)
            .expect("a member's manifest is inside the workspace")
            .to_owned();
        members.push(Member { name, folder });
    }
    Workspace {
        members,
        normal_deps,
    }
}

/// Every crate `from` reaches, each with the path that first reaches it
/// (breadth first: a shortest one), `from` first.
fn reached(
    normal_deps: &BTreeMap<String, BTreeSet<String>>,
    from: &str,
) -> BTreeMap<String, Vec<String>> {
    let mut paths = BTreeMap::new();
    let mut queue = VecDeque::from([vec![from.to_owned()]]);
    while let Some(path) = queue.pop_front() {
        let last = path.last().expect("a path is never empty");
        for next in normal_deps.get(last).into_iter().flatten() {
            if next != from && !paths.contains_key(next) {
                let mut longer = path.clone();
                longer.push(next.clone());
                paths.insert(next.clone(), longer.clone());
                queue.push_back(longer);
            }
        }
    }
    paths
}

/// One line per crate a crate reaches and may not: the offending edge (the
/// path's last hop) and the whole path.
fn violations(
    normal_deps: &BTreeMap<String, BTreeSet<String>>,
    allowed: &BTreeMap<&str, BTreeSet<&str>>,
) -> Vec<String> {
    let mut found = Vec::new();
    for (&from, may) in allowed {
        for (to, path) in reached(normal_deps, from) {
            if !may.contains(to.as_str()) {
                let hop = &path[path.len() - 2..];
                found.push(format!(
                    "{from} may not reach {to}: the edge {} → {}, on the path {}",
                    hop[0],
                    hop[1],
                    path.join(" → ")
                ));
            }
        }
    }
    found
}

#[test]
fn every_crate_reaches_only_what_its_layer_allows() {
    let found = violations(&workspace().normal_deps, &allowed());
    assert!(
        found.is_empty(),
        "dependency edges the layering forbids (tests/tests/crate_deps.rs):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_table_places_every_workspace_member_and_only_them() {
    let members: BTreeSet<&str> = workspace()
        .members
        .iter()
        .map(|m| m.name.as_str())
        .collect();
    let placed: BTreeSet<&str> = MAY_REACH.iter().map(|&(name, _)| name).collect();
    let unplaced: Vec<&&str> = members.difference(&placed).collect();
    let gone: Vec<&&str> = placed.difference(&members).collect();
    assert!(
        unplaced.is_empty(),
        "workspace members with no row in MAY_REACH (give each its layer): {unplaced:?}"
    );
    assert!(
        gone.is_empty(),
        "rows of MAY_REACH for crates that are not workspace members: {gone:?}"
    );
    assert_eq!(placed.len(), MAY_REACH.len(), "one row per crate");
    for &(name, groups) in MAY_REACH {
        for reachable in groups.iter().flat_map(|g| g.iter()) {
            assert!(
                members.contains(reachable),
                "{name}'s row names {reachable}, which is not a workspace member"
            );
        }
    }
}

#[test]
fn the_folders_agree_with_the_layers() {
    for member in &workspace().members {
        let name = member.name.as_str();
        if member.folder.starts_with("services/shared") {
            assert!(
                GROUND.contains(&name),
                "{name} is under services/shared/ but not in GROUND"
            );
        }
        if member.folder.starts_with("services/bin") {
            assert!(
                BINARIES.contains(&name),
                "{name} is under services/bin/ but not in BINARIES"
            );
        }
    }
    let all: Vec<&str> = [GROUND, APIS, SERVICES, BINARIES, &[TEST_KIT]].concat();
    let distinct: BTreeSet<&str> = all.iter().copied().collect();
    assert_eq!(distinct.len(), all.len(), "each crate is in one layer");
}

/// The checker itself, on a made-up graph: a forbidden crate reached two
/// hops away is found, with its last hop and the shortest path.
#[test]
fn a_forbidden_crate_is_found_through_the_path_that_reaches_it() {
    let edges = |pairs: &[(&str, &str)]| {
        let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for &(from, to) in pairs {
            deps.entry(from.into()).or_default().insert(to.into());
        }
        deps
    };
    let graph = edges(&[
        ("top", "middle"),
        ("top", "base"),
        ("middle", "base"),
        ("middle", "backend"),
        ("backend", "base"),
    ]);
    let allowed: BTreeMap<&str, BTreeSet<&str>> = [
        ("top", BTreeSet::from(["middle", "base"])),
        ("middle", BTreeSet::from(["base", "backend"])),
        ("backend", BTreeSet::from(["base"])),
        ("base", BTreeSet::new()),
    ]
    .into();
    assert_eq!(
        violations(&graph, &allowed),
        [
            "top may not reach backend: the edge middle → backend, on the path top → middle → backend"
        ]
    );
    let fine = edges(&[("top", "middle"), ("middle", "base")]);
    assert!(violations(&fine, &allowed).is_empty());
    assert_eq!(
        reached(&graph, "base"),
        BTreeMap::new(),
        "a leaf reaches nothing"
    );
}
