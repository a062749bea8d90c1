//! Which partition a session belongs to: the one definition every service
//! uses (the store to check an owner token, the coordinator to pick the token,
//! the edge to find the owner).
//!
//! Sessions map to a fixed number of partitions by a stable hash of the
//! canonical session key. The store records the count at its first start and
//! refuses to start with another, because changing it would move sessions
//! between partitions and so between owners.

/// The default number of partitions.
pub const DEFAULT_PARTITIONS: u32 = 256;

/// The largest partition count a store accepts: one lease row per partition,
/// all listed in one call.
pub const MAX_PARTITIONS: u32 = 65_536;

/// The partition of a canonical session key (`agent:main:main`), in
/// `0..partitions`. FNV-1a over the key's UTF-8 bytes: stable across
/// processes, platforms and releases, which `std`'s hasher does not promise.
pub fn partition_of(canonical_key: &str, partitions: u32) -> u32 {
    assert!(partitions > 0, "a store has at least one partition");
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let hash = canonical_key
        .bytes()
        .fold(OFFSET_BASIS, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME));
    (hash % u64::from(partitions)) as u32
}

/// Checks a configured partition count.
pub fn check_partitions(partitions: u32) -> Result<(), String> {
    if (1..=MAX_PARTITIONS).contains(&partitions) {
        Ok(())
    } else {
        Err(format!(
            "the partition count must be between 1 and {MAX_PARTITIONS}, not {partitions}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_pinned() {
        // These values are part of the contract: every service, of every
        // release, must put a key in the same partition.
        assert_eq!(
            partition_of("", 256),
            (0xcbf2_9ce4_8422_2325u64 % 256) as u32
        );
        assert_eq!(partition_of("agent:main:main", 256), 148);
        assert_eq!(partition_of("agent:main:main", 1), 0);
        let spread: std::collections::HashSet<u32> = (0..2000)
            .map(|i| partition_of(&format!("agent:main:s{i}"), 256))
            .collect();
        assert!(spread.len() > 200, "keys spread over the partitions");
        assert!(spread.iter().all(|p| *p < 256));
    }
}
