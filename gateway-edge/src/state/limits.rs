//! Limits the edge counts: sockets per client address and in all
//! ([`AddressBudget`]: the raw sockets of `EDGE_SOCKETS_PER_IP` /
//! `EDGE_MAX_SOCKETS`, the unauthenticated ones of `EDGE_PREAUTH_PER_IP` /
//! `EDGE_MAX_PREAUTH`), and one connection's request limits, counted where
//! requests are dispatched: how many it has in flight
//! (`EDGE_MAX_IN_FLIGHT`) and how many calls in a row were refused for its
//! role or scopes (`EDGE_UNAUTHORIZED_FLOOD_LIMIT`, the flood guard).
//!
//! An address is counted by [`address_key`]: an IPv4 address as itself, an
//! IPv6 address by its /64, since one host is routinely given a whole /64
//! and could otherwise open sockets from 2^64 addresses.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

pub use crate::config::cidr::address_key;

/// Why a socket was not given a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its address (or /64) has the most it may have.
    PerAddress,
    /// All addresses together have the most the edge allows.
    Total,
}

impl Refusal {
    /// The `reason` label of the refusal metrics.
    pub fn label(self) -> &'static str {
        match self {
            Self::PerAddress => "per_address",
            Self::Total => "total",
        }
    }
}

#[derive(Default)]
struct Counts {
    by_address: HashMap<IpAddr, usize>,
    total: usize,
}

/// Sockets of one kind per client address ([`address_key`]) and in all.
pub struct AddressBudget {
    per_address: usize,
    total: usize,
    counts: Arc<Mutex<Counts>>,
}

impl AddressBudget {
    pub fn new(per_address: usize, total: usize) -> Self {
        Self {
            per_address,
            total,
            counts: Arc::default(),
        }
    }

    /// Takes a slot for `ip`, held until the returned slot drops.
    pub fn take(&self, ip: IpAddr) -> Result<AddressSlot, Refusal> {
        let key = address_key(ip);
        let mut counts = self.counts.lock().unwrap();
        if counts.total >= self.total {
            return Err(Refusal::Total);
        }
        let count = counts.by_address.entry(key).or_default();
        if *count >= self.per_address {
            return Err(Refusal::PerAddress);
        }
        *count += 1;
        counts.total += 1;
        Ok(AddressSlot {
            counts: self.counts.clone(),
            key,
        })
    }

    /// Slots taken now, all addresses together.
    pub fn taken(&self) -> usize {
        self.counts.lock().unwrap().total
    }

    /// Addresses holding a slot now (the map's size: it holds no others).
    pub fn addresses(&self) -> usize {
        self.counts.lock().unwrap().by_address.len()
    }
}

/// One slot of an [`AddressBudget`], given back when dropped.
pub struct AddressSlot {
    counts: Arc<Mutex<Counts>>,
    key: IpAddr,
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap();
        counts.total -= 1;
        if let Some(count) = counts.by_address.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                counts.by_address.remove(&self.key);
            }
        }
    }
}

/// An unauthenticated socket's slot (`EDGE_PREAUTH_PER_IP`,
/// `EDGE_MAX_PREAUTH`), given back when it authenticates or goes.
pub type PreauthSlot = AddressSlot;

/// The bytes of request frames being handled, every connection together
/// (`EDGE_MAX_REQUEST_BYTES`): a request holds its frame's size from
/// dispatch until it is answered.
pub struct RequestBytes {
    budget: Arc<tokio::sync::Semaphore>,
    limit: usize,
}

impl RequestBytes {
    pub fn new(limit: usize) -> Self {
        let limit = limit.min(tokio::sync::Semaphore::MAX_PERMITS);
        Self {
            budget: Arc::new(tokio::sync::Semaphore::new(limit)),
            limit,
        }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Takes `bytes`, or `None` when they do not fit now.
    pub fn try_take(&self, bytes: usize) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let bytes = u32::try_from(bytes).ok()?;
        self.budget.clone().try_acquire_many_owned(bytes).ok()
    }
}

#[derive(Default)]
pub struct RequestCounters {
    in_flight: AtomicUsize,
    unauthorized_in_a_row: AtomicU32,
}

impl RequestCounters {
    /// Counts a request in when fewer than `max` are in flight; it is
    /// counted out when the [`InFlight`] of [`Self::started`] drops.
    pub fn admit(&self, max: usize) -> bool {
        let before = self.in_flight.fetch_add(1, Ordering::AcqRel);
        if before >= max {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        true
    }

    /// The admitted request's handler runs: counted out when it drops,
    /// answered or not (a panicking handler too).
    pub fn started(&self) -> InFlight<'_> {
        InFlight(&self.in_flight)
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Notes a call refused for the connection's role or scopes; the
    /// refusals in a row.
    pub fn unauthorized(&self) -> u32 {
        self.unauthorized_in_a_row.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Any other answer ends a row of refusals.
    pub fn answered(&self) {
        if self.unauthorized_in_a_row.load(Ordering::Relaxed) != 0 {
            self.unauthorized_in_a_row.store(0, Ordering::Relaxed);
        }
    }
}

/// An admitted request whose handler has not finished.
pub struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_counted_per_address_and_in_all_and_given_back() {
        let budget = AddressBudget::new(2, 3);
        let ip = |raw: &str| -> IpAddr { raw.parse().unwrap() };
        let first = budget.take(ip("10.0.0.1")).unwrap();
        let _second = budget.take(ip("::ffff:10.0.0.1")).unwrap();
        assert_eq!(
            budget.take(ip("10.0.0.1")).err(),
            Some(Refusal::PerAddress),
            "a third of one address (mapped or not)"
        );
        let other = budget.take(ip("10.0.0.2")).unwrap();
        assert_eq!(budget.take(ip("10.0.0.3")).err(), Some(Refusal::Total));
        drop(first);
        assert!(
            budget.take(ip("10.0.0.1")).is_ok(),
            "a slot given back is free again"
        );
        drop(other);
        assert_eq!(budget.taken(), 1);
        assert_eq!(
            budget.addresses(),
            1,
            "an address with no slot is forgotten"
        );
    }

    #[test]
    fn ipv6_addresses_count_by_their_64() {
        let budget = AddressBudget::new(1, 10);
        let ip = |raw: &str| -> IpAddr { raw.parse().unwrap() };
        let _held = budget.take(ip("2001:db8:1:2::1")).unwrap();
        assert_eq!(
            budget.take(ip("2001:db8:1:2:ffff:ffff:ffff:ffff")).err(),
            Some(Refusal::PerAddress),
            "another address of the same /64"
        );
        assert!(budget.take(ip("2001:db8:1:3::1")).is_ok(), "the next /64");
        assert_eq!(
            address_key(ip("2001:db8:1:2:aaaa::9")),
            ip("2001:db8:1:2::")
        );
        assert_eq!(address_key(ip("::ffff:192.0.2.1")), ip("192.0.2.1"));
    }

    #[test]
    fn admits_up_to_the_limit_and_counts_out_on_drop() {
        let counters = RequestCounters::default();
        assert!(counters.admit(2));
        let first = counters.started();
        assert!(counters.admit(2));
        let second = counters.started();
        assert!(!counters.admit(2), "a third is over the limit");
        assert_eq!(counters.in_flight(), 2, "the refused one is not counted");
        drop(first);
        assert!(counters.admit(2), "room again once one finished");
        drop((second, counters.started()));
        assert_eq!(counters.in_flight(), 0);
    }

    #[test]
    fn unauthorized_in_a_row_count_in_a_row() {
        let counters = RequestCounters::default();
        assert_eq!(counters.unauthorized(), 1);
        assert_eq!(counters.unauthorized(), 2);
        counters.answered();
        assert_eq!(counters.unauthorized(), 1);
    }
}
