//! The partition → owner map, read off the store's lease table.
//!
//! Every partition's lease names its owner (a coordinator's member id), the
//! owner's advertised gRPC address, the epoch of its tenure and when the
//! lease ends by the store's clock. The map keeps, per partition, who owns
//! it and where it serves. A lease that has expired still names the best
//! guess until the next table says otherwise (its owner may be renewing
//! late; if it died, the next owner's take shows up as a new epoch).

use std::time::Duration;

use clawgate_common::partition::partition_of;
use session_store_api::model::LeaseTable;
use tokio::time::Instant;

/// The owner of one partition, as the last lease table named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// Where it serves (its advertised gRPC address).
    pub address: String,
    /// Its member id (one per coordinator process start).
    pub member: String,
    /// The epoch of its tenure: a new take is a new epoch.
    pub epoch: u64,
    /// When its lease ends, on this process's clock (the store's expiry
    /// moved over by the store's `now` at the time of the table).
    pub expires: Instant,
}

impl Owner {
    /// The same tenure: member, epoch and address (renewals move only the
    /// expiry).
    fn same_tenure(&self, other: &Owner) -> bool {
        self.member == other.member && self.epoch == other.epoch && self.address == other.address
    }

    pub fn is_live(&self, now: Instant) -> bool {
        self.expires > now
    }
}

/// Which coordinator owns each partition. Empty (no partition count) until
/// the first lease table is read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionMap {
    partition_count: u32,
    /// Indexed by partition; `None`: released, never taken, or its owner
    /// advertised no address.
    owners: Vec<Option<Owner>>,
}

impl PartitionMap {
    /// The map of a lease table read at `received`.
    pub fn from_table(table: &LeaseTable, received: Instant) -> Self {
        let count = table.partition_count;
        let mut owners = vec![None; count as usize];
        for lease in &table.leases {
            let (Some(member), Some(slot)) =
                (&lease.owner, owners.get_mut(lease.partition as usize))
            else {
                continue;
            };
            if lease.address.is_empty() {
                continue;
            }
            let left_ms = lease.expires_at_ms.saturating_sub(table.now_ms).max(0);
            *slot = Some(Owner {
                address: lease.address.clone(),
                member: member.clone(),
                epoch: lease.epoch,
                expires: received + Duration::from_millis(left_ms as u64),
            });
        }
        Self {
            partition_count: count,
            owners,
        }
    }

    /// The partition count; 0 before the first table.
    pub fn partition_count(&self) -> u32 {
        self.partition_count
    }

    pub fn is_known(&self) -> bool {
        self.partition_count > 0
    }

    /// The partition of a canonical session key; `None` before the first
    /// table.
    pub fn partition_of(&self, canonical_key: &str) -> Option<u32> {
        self.is_known()
            .then(|| partition_of(canonical_key, self.partition_count))
    }

    pub fn owner(&self, partition: u32) -> Option<&Owner> {
        self.owners.get(partition as usize)?.as_ref()
    }

    /// Every owner's address, each once, in the order of the first partition
    /// it owns; expired leases included.
    pub fn addresses(&self) -> Vec<String> {
        self.distinct(|_| true)
    }

    /// The addresses of owners whose lease has not expired by `now`.
    pub fn live_addresses(&self, now: Instant) -> Vec<String> {
        self.distinct(|owner| owner.is_live(now))
    }

    fn distinct(&self, keep: impl Fn(&Owner) -> bool) -> Vec<String> {
        let mut seen: Vec<String> = Vec::new();
        for owner in self.owners.iter().flatten() {
            if keep(owner) && !seen.contains(&owner.address) {
                seen.push(owner.address.clone());
            }
        }
        seen
    }

    /// Whether the partitions are spread over two or more addresses. When
    /// they are not (one coordinator owns everything, or nobody advertised
    /// an address), a caller has one coordinator to follow, as before
    /// partitioning.
    pub fn is_split(&self) -> bool {
        let mut first: Option<&str> = None;
        for owner in self.owners.iter().flatten() {
            match first {
                None => first = Some(&owner.address),
                Some(address) if address != owner.address => return true,
                Some(_) => {}
            }
        }
        false
    }

    /// The partitions owned by `address`.
    pub fn partitions_of(&self, address: &str) -> Vec<u32> {
        (0..self.partition_count)
            .filter(|p| self.owner(*p).is_some_and(|o| o.address == address))
            .collect()
    }

    /// The owner of most partitions whose lease is live, if any.
    pub fn main_owner(&self, now: Instant) -> Option<String> {
        let mut counts: Vec<(String, usize)> = Vec::new();
        for owner in self.owners.iter().flatten().filter(|o| o.is_live(now)) {
            match counts.iter_mut().find(|(a, _)| *a == owner.address) {
                Some((_, n)) => *n += 1,
                None => counts.push((owner.address.clone(), 1)),
            }
        }
        // The first of equals: the order of the partitions.
        let most = counts.iter().map(|(_, n)| *n).max()?;
        counts.into_iter().find(|(_, n)| *n == most).map(|(a, _)| a)
    }

    /// The partitions whose tenure differs between `self` and `newer`
    /// (another owner, a new epoch, taken or released); renewals are not
    /// changes. Every partition when the partition count differs.
    pub fn changed_partitions(&self, newer: &PartitionMap) -> Vec<u32> {
        if self.partition_count != newer.partition_count {
            return (0..newer.partition_count).collect();
        }
        (0..newer.partition_count)
            .filter(|p| match (self.owner(*p), newer.owner(*p)) {
                (None, None) => false,
                (Some(a), Some(b)) => !a.same_tenure(b),
                _ => true,
            })
            .collect()
    }

    /// Whether the two maps differ in more than expiries.
    pub fn same_tenures(&self, other: &PartitionMap) -> bool {
        self.partition_count == other.partition_count && self.changed_partitions(other).is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use session_store_api::model::Lease;

    fn lease(
        partition: u32,
        owner: Option<&str>,
        address: &str,
        epoch: u64,
        expires: i64,
    ) -> Lease {
        Lease {
            partition,
            owner: owner.map(str::to_owned),
            address: address.to_owned(),
            epoch,
            expires_at_ms: expires,
        }
    }

    fn table(leases: Vec<Lease>) -> LeaseTable {
        LeaseTable {
            partition_count: leases.len() as u32,
            leases,
            now_ms: 1_000,
        }
    }

    #[tokio::test]
    async fn a_table_maps_each_partition_to_its_owners_address() {
        let now = Instant::now();
        let map = PartitionMap::from_table(
            &table(vec![
                lease(0, Some("a"), "http://a", 3, 5_000),
                lease(1, Some("b"), "http://b", 7, 5_000),
                lease(2, None, "", 2, 0),
                lease(3, Some("a"), "http://a", 3, 500),
                // An owner that advertised nothing cannot be routed to.
                lease(4, Some("c"), "", 1, 5_000),
            ]),
            now,
        );
        assert_eq!(map.partition_count(), 5);
        assert_eq!(map.owner(0).unwrap().address, "http://a");
        assert_eq!(map.owner(1).unwrap().epoch, 7);
        assert_eq!(map.owner(2), None);
        assert_eq!(map.owner(4), None);
        assert_eq!(map.owner(9), None);
        assert_eq!(map.owner(0).unwrap().expires, now + Duration::from_secs(4));
        // An expired lease is still the best guess, but not live.
        assert_eq!(map.owner(3).unwrap().address, "http://a");
        assert!(!map.owner(3).unwrap().is_live(now));
        assert_eq!(map.addresses(), ["http://a", "http://b"]);
        assert_eq!(map.live_addresses(now), ["http://a", "http://b"]);
        assert_eq!(
            map.live_addresses(now + Duration::from_secs(5)),
            Vec::<String>::new()
        );
        assert!(map.is_split());
        assert_eq!(map.partitions_of("http://a"), [0, 3]);
        assert_eq!(map.main_owner(now).as_deref(), Some("http://a"));
        assert_eq!(
            map.partition_of("agent:main:main"),
            Some(partition_of("agent:main:main", 5))
        );
    }

    #[tokio::test]
    async fn one_owner_or_none_is_not_split() {
        let now = Instant::now();
        let all_on_one = PartitionMap::from_table(
            &table(
                (0..4)
                    .map(|p| lease(p, Some("a"), "http://a", 1, 5_000))
                    .collect(),
            ),
            now,
        );
        assert!(!all_on_one.is_split());
        assert_eq!(all_on_one.addresses(), ["http://a"]);
        let nobody = PartitionMap::from_table(
            &table((0..4).map(|p| lease(p, None, "", 0, 0)).collect()),
            now,
        );
        assert!(!nobody.is_split());
        assert!(nobody.addresses().is_empty());
        assert_eq!(nobody.main_owner(now), None);
        assert!(!PartitionMap::default().is_known());
        assert_eq!(
            PartitionMap::default().partition_of("agent:main:main"),
            None
        );
    }

    #[tokio::test]
    async fn renewals_are_not_changes_takes_and_releases_are() {
        let now = Instant::now();
        let before = PartitionMap::from_table(
            &table(vec![
                lease(0, Some("a"), "http://a", 1, 5_000),
                lease(1, Some("b"), "http://b", 1, 5_000),
                lease(2, Some("b"), "http://b", 1, 5_000),
                lease(3, None, "", 0, 0),
            ]),
            now,
        );
        let renewed = PartitionMap::from_table(
            &table(vec![
                lease(0, Some("a"), "http://a", 1, 9_000),
                lease(1, Some("b"), "http://b", 1, 9_000),
                lease(2, Some("b"), "http://b", 1, 9_000),
                lease(3, None, "", 0, 0),
            ]),
            now,
        );
        assert!(before.same_tenures(&renewed));
        assert_ne!(before, renewed);
        let moved = PartitionMap::from_table(
            &table(vec![
                lease(0, Some("a"), "http://a", 1, 9_000),
                // Taken over by c.
                lease(1, Some("c"), "http://c", 2, 9_000),
                // Released.
                lease(2, None, "http://b", 1, 0),
                // Taken.
                lease(3, Some("a"), "http://a", 1, 9_000),
            ]),
            now,
        );
        assert_eq!(before.changed_partitions(&moved), [1, 2, 3]);
        assert_eq!(
            PartitionMap::default().changed_partitions(&before),
            [0, 1, 2, 3]
        );
    }
}
