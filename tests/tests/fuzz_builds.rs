//! The fuzz crate (`fuzz/`, a workspace of its own that only `cargo +nightly
//! fuzz` builds) keeps compiling: its targets call the crates' `check_*`
//! functions, and a change to one of those must not leave the fuzzer
//! broken until the next fuzzing session. The stable toolchain checks it
//! (type-checks every target against the crates, with the edge's
//! `fuzzing` feature) in a target folder of its own; the sanitizer and
//! coverage flags are `cargo fuzz`'s and change nothing of that.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn the_fuzz_targets_compile() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the workspace")
        .to_path_buf();
    let manifest = root.join("fuzz/Cargo.toml");
    assert!(
        manifest.is_file(),
        "no fuzz crate at {}",
        manifest.display()
    );
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
        .join("fuzz-check");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let checked = Command::new(cargo)
        .args(["check", "--locked", "--bins", "--manifest-path"])
        .arg(&manifest)
        .env("CARGO_TARGET_DIR", &target)
        // The outer build's flags (a coverage or sanitizer run) stay out.
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .expect("cargo runs");
    assert!(
        checked.status.success(),
        "the fuzz crate does not compile:\n{}",
        String::from_utf8_lossy(&checked.stderr)
    );
}
