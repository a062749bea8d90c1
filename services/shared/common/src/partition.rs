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

/// The member a partition is placed on: rendezvous (highest random weight)
/// hashing of `(partition, member)` over `members`. Every coordinator that
/// sees the same members computes the same answer, and a member joining or
/// leaving moves only the partitions it wins or held (about 1/N of them).
/// `None` when there are no members.
pub fn rendezvous_owner<'a>(partition: u32, members: &[&'a str]) -> Option<&'a str> {
    members
        .iter()
        .copied()
        .max_by_key(|member| (rendezvous_weight(partition, member), *member))
}

/// The weight of `member` for `partition`: FNV-1a over the member id, then
/// the partition, through a 64-bit finalizer so that nearby inputs spread.
fn rendezvous_weight(partition: u32, member: &str) -> u64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let hash = member
        .bytes()
        .chain(partition.to_le_bytes())
        .fold(OFFSET_BASIS, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME));
    let mut z = hash;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
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

    fn placement(members: &[&str], partitions: u32) -> Vec<String> {
        (0..partitions)
            .map(|p| rendezvous_owner(p, members).unwrap().to_owned())
            .collect()
    }

    #[test]
    fn rendezvous_spreads_and_moves_only_the_share_of_a_joiner_or_leaver() {
        assert_eq!(rendezvous_owner(7, &[]), None);
        let three = ["a1b2", "c3d4", "e5f6"];
        let before = placement(&three, 256);
        for member in three {
            let share = before.iter().filter(|m| *m == member).count();
            assert!((50..=120).contains(&share), "{member} has {share} of 256");
        }
        // The order members are listed in does not matter.
        assert_eq!(before, placement(&["e5f6", "a1b2", "c3d4"], 256));
        // A fourth member takes partitions only for itself.
        let after = placement(&["a1b2", "c3d4", "e5f6", "g7h8"], 256);
        let moved: Vec<usize> = (0..256).filter(|&p| before[p] != after[p]).collect();
        assert!(moved.iter().all(|&p| after[p] == "g7h8"));
        assert!((40..=100).contains(&moved.len()), "{} moved", moved.len());
        // A leaver's partitions go; nobody else's move.
        let left = placement(&["a1b2", "e5f6"], 256);
        assert!((0..256).all(|p| before[p] == "c3d4" || before[p] == left[p]));
    }
}
