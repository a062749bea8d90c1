//! Which partitions this coordinator owns, and the owner tokens its writes
//! carry.
//!
//! The store fences: every write of a run carries the token of the run's
//! partition, and the store refuses it (`STALE_OWNER`) once another member
//! has taken the partition. The first refusal ends this instance's tenure:
//! `Ownership::lose` records why and fires `lost()`, after which nothing is
//! admitted and the server reports NOT_SERVING and stops (`server.rs`).
//!
//! The held epochs are written only by taking or losing partitions; the
//! write path only reads them. The code keeps a set of partitions, so an
//! owner of some partitions works as one of all.

use std::sync::{Mutex, RwLock};
use std::time::Duration;

use clawgate_common::partition::partition_of;
use session_store_api::model::{Lease, OwnerToken};
use session_store_api::{SessionKey, StoreError};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::error::{CoordinatorError, CoordinatorResult};

/// How this coordinator comes to own partitions (`--ownership`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OwnershipMode {
    /// Take every partition at start, from whoever held them; no renewal.
    /// One coordinator per store; a second one started by mistake takes
    /// over and the first stops at its next write.
    Static,
    /// Active/standby: hold the partitions by renewed leases; a standby
    /// takes them when the leader's lease ends or is released.
    Lease,
}

#[derive(Debug, Clone)]
pub struct OwnershipConfig {
    pub mode: OwnershipMode,
    /// The gRPC address clients should use for this coordinator (the leader
    /// hint others give out).
    pub advertise_address: String,
    /// Lease mode: how long a lease lasts without renewal (store's clock).
    pub lease_ttl: Duration,
    /// Lease mode: how often the leader renews and a standby tries to take.
    pub renew_interval: Duration,
}

impl Default for OwnershipConfig {
    fn default() -> Self {
        Self {
            mode: OwnershipMode::Static,
            advertise_address: String::new(),
            lease_ttl: Duration::from_secs(10),
            renew_interval: Duration::from_secs(2),
        }
    }
}

impl OwnershipConfig {
    /// Static leases never need renewal; they still carry an expiry, so a
    /// lease-mode standby pointed at the same store by mistake waits this long.
    pub const STATIC_TTL: Duration = Duration::from_secs(3600);

    pub fn check(&self) -> Result<(), String> {
        if self.mode == OwnershipMode::Lease {
            if self.renew_interval.is_zero() || self.renew_interval * 2 > self.lease_ttl {
                return Err(format!(
                    "the lease renew interval ({:?}) must be above zero and at most half the lease TTL ({:?})",
                    self.renew_interval, self.lease_ttl
                ));
            }
            if self.lease_ttl > Self::STATIC_TTL {
                return Err(format!(
                    "the lease TTL must be at most {:?}",
                    Self::STATIC_TTL
                ));
            }
        }
        Ok(())
    }
}

pub struct Ownership {
    /// This instance's member id (its epoch string: one per process start).
    member: String,
    partition_count: u32,
    /// The epoch under which each partition is held; `None`: not held.
    held: RwLock<Vec<Option<u64>>>,
    /// The address of the coordinator owning partitions this one does not.
    leader_hint: RwLock<Option<String>>,
    lost: CancellationToken,
    lost_reason: Mutex<Option<String>>,
    /// Whether this instance serves: held partitions, settled. What gRPC
    /// health reports.
    serving: watch::Sender<bool>,
}

impl Ownership {
    pub fn new(member: String, partition_count: u32) -> Self {
        Self {
            member,
            partition_count,
            held: RwLock::new(vec![None; partition_count as usize]),
            leader_hint: RwLock::new(None),
            lost: CancellationToken::new(),
            lost_reason: Mutex::new(None),
            serving: watch::Sender::new(false),
        }
    }

    pub fn member(&self) -> &str {
        &self.member
    }

    pub fn partition_count(&self) -> u32 {
        self.partition_count
    }

    pub fn partition(&self, key: &SessionKey) -> u32 {
        partition_of(key.as_str(), self.partition_count)
    }

    /// Records leases this member was granted.
    pub fn hold(&self, granted: &[Lease]) {
        let mut held = self.held.write().unwrap();
        for lease in granted {
            if lease.owner.as_deref() == Some(self.member.as_str())
                && let Some(slot) = held.get_mut(lease.partition as usize)
            {
                *slot = Some(lease.epoch);
            }
        }
    }

    /// Starts serving the held partitions: called once what an earlier
    /// owner left in them is settled (recovery), not before, so nobody reads
    /// a run of theirs half-settled.
    pub fn start_serving(&self) {
        let any = self.held.read().unwrap().iter().any(Option::is_some);
        self.serving.send_replace(any && !self.lost.is_cancelled());
    }

    /// Whether this instance serves: it holds partitions and has settled
    /// them.
    pub fn is_serving(&self) -> bool {
        *self.serving.borrow() && !self.lost.is_cancelled()
    }

    /// Forgets every partition after releasing them (a planned handover):
    /// not a loss, nothing was refused.
    pub fn release_all(&self) {
        self.held
            .write()
            .unwrap()
            .iter_mut()
            .for_each(|e| *e = None);
        self.serving.send_replace(false);
    }

    /// Follows whether this instance serves (see `start_serving`).
    pub fn serving(&self) -> watch::Receiver<bool> {
        self.serving.subscribe()
    }

    /// The tokens of every held partition (for renewal and release).
    pub fn tokens(&self) -> Vec<OwnerToken> {
        let held = self.held.read().unwrap();
        held.iter()
            .enumerate()
            .filter_map(|(partition, epoch)| {
                epoch.map(|epoch| OwnerToken {
                    partition: partition as u32,
                    member: self.member.clone(),
                    epoch,
                })
            })
            .collect()
    }

    pub fn holds(&self, partition: u32) -> bool {
        !self.lost.is_cancelled()
            && self
                .held
                .read()
                .unwrap()
                .get(partition as usize)
                .is_some_and(Option::is_some)
    }

    pub fn holds_any(&self) -> bool {
        !self.lost.is_cancelled() && self.held.read().unwrap().iter().any(Option::is_some)
    }

    /// The token a write to `key` carries, or NOT_OWNER when this instance
    /// does not hold the key's partition (anymore).
    pub fn token(&self, key: &SessionKey) -> CoordinatorResult<OwnerToken> {
        let partition = self.partition(key);
        let epoch = match self.lost.is_cancelled() {
            true => None,
            false => self.held.read().unwrap()[partition as usize],
        };
        epoch
            .map(|epoch| OwnerToken {
                partition,
                member: self.member.clone(),
                epoch,
            })
            .ok_or_else(|| self.not_owner(partition))
    }

    pub fn not_owner(&self, partition: u32) -> CoordinatorError {
        let reason = self.lost_reason.lock().unwrap().clone();
        CoordinatorError::NotOwner {
            message: match reason {
                Some(reason) => format!("this coordinator lost its partitions: {reason}"),
                None => format!("this coordinator does not own partition {partition}"),
            },
            leader: self.leader_hint.read().unwrap().clone(),
        }
    }

    /// NOT_OWNER for a call this instance cannot serve at all.
    pub fn not_serving(&self) -> CoordinatorError {
        let leader = self.leader_hint.read().unwrap().clone();
        let message = match (self.lost_reason(), &leader) {
            (Some(reason), _) => format!("this coordinator lost its partitions: {reason}"),
            (None, Some(leader)) => {
                format!("this coordinator is a standby; the leader is {leader}")
            }
            (None, None) => "this coordinator owns no partition (a standby)".to_owned(),
        };
        CoordinatorError::NotOwner { message, leader }
    }

    pub fn set_leader_hint(&self, address: Option<String>) {
        *self.leader_hint.write().unwrap() = address.filter(|a| !a.is_empty());
    }

    /// Looks at a store result: a STALE_OWNER refusal ends the tenure.
    pub fn observe(&self, err: &StoreError) {
        if let StoreError::StaleOwner { message, current } = err {
            if let Some(owner) = current.as_deref() {
                self.set_leader_hint(Some(owner.address.clone()));
            }
            self.lose(format!(
                "the store refused a write (STALE_OWNER): {message}"
            ));
        }
    }

    /// Ends the tenure of every partition (the first reason is kept).
    pub fn lose(&self, reason: String) {
        {
            let mut kept = self.lost_reason.lock().unwrap();
            if kept.is_none() {
                tracing::error!(member = %self.member, %reason, "ownership lost; this coordinator stops");
                *kept = Some(reason);
            }
        }
        self.held
            .write()
            .unwrap()
            .iter_mut()
            .for_each(|e| *e = None);
        self.lost.cancel();
        self.serving.send_replace(false);
    }

    /// Fires once the tenure has ended.
    pub fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }

    pub fn lost_reason(&self) -> Option<String> {
        self.lost_reason.lock().unwrap().clone()
    }
}
