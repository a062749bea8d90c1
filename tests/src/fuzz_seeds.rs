//! What the stable smoke runs of the fuzz targets share
//! (`gateway-edge/tests/fuzz_corpus.rs`, `session-store/tests/fuzz_corpus.rs`):
//! the committed seeds of a target, the overrides from the environment,
//! and the deterministic generator of their mutations.

use std::path::{Path, PathBuf};

/// `fuzz/seeds/<target>/` of the repository.
pub fn seeds_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/seeds")
        .join(target)
}

/// The committed seeds of `target`, by name (there must be some).
pub fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = seeds_dir(target);
    let mut seeds: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect();
    seeds.sort();
    assert!(seeds.len() >= 10, "{}: too few seeds", dir.display());
    seeds
}

/// The environment variable `name` parsed, or `default`.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// xorshift64*: deterministic, no dependencies (the seed must not be 0).
pub struct XorShiftStar(pub u64);

impl XorShiftStar {
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}
