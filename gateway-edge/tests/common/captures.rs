//! The recorded OpenClaw sessions in `fixtures/captures/` (see its README).
//! They are part of the repository: a missing or unreadable capture fails
//! the test, it never skips it.

use std::path::PathBuf;

use serde_json::Value;

/// `fixtures/captures/` of this repository.
pub fn dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/captures");
    assert!(
        dir.is_dir(),
        "the capture fixtures are missing: {} is not a directory",
        dir.display()
    );
    dir
}

/// Every record of `file`, in order.
pub fn records(file: &str) -> Vec<Value> {
    let path = dir().join(file);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let records: Vec<Value> = text
        .lines()
        .filter(|line| !line.trim().is_empty())
        .enumerate()
        .map(|(n, line)| {
            serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{}:{}: not JSON: {e}", path.display(), n + 1))
        })
        .collect();
    assert!(!records.is_empty(), "{} holds no records", path.display());
    records
}
