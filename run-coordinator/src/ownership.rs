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

use run_coordinator_api::error::{CoordinatorError, CoordinatorResult};

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

/// Which partitions a lease-mode coordinator tries to hold (`--placement`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Placement {
    /// Every partition on one coordinator, the others standing by (active/
    /// standby).
    AllOnOne,
    /// The partitions spread over the live coordinators of the member
    /// registry by rendezvous hashing; a join or a leave moves about 1/N of
    /// them, each by a graceful handoff (`placement.rs`).
    Balanced,
}

#[derive(Debug, Clone)]
pub struct OwnershipConfig {
    pub mode: OwnershipMode,
    /// Lease mode: which partitions this coordinator tries to hold.
    pub placement: Placement,
    /// Balanced placement: how long the executing runs of a partition being
    /// handed to another coordinator may take to finish before they are
    /// aborted (kind `handoff`).
    pub handoff_timeout: Duration,
    /// Balanced placement: most partitions this coordinator hands off at
    /// once.
    pub max_moves: usize,
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
            placement: Placement::AllOnOne,
            handoff_timeout: Duration::from_secs(15),
            max_moves: 16,
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

    pub fn balanced(&self) -> bool {
        self.mode == OwnershipMode::Lease && self.placement == Placement::Balanced
    }

    pub fn check(&self) -> Result<(), String> {
        if self.placement == Placement::Balanced && self.mode != OwnershipMode::Lease {
            return Err("--placement balanced needs --ownership lease".to_owned());
        }
        if self.balanced() && self.max_moves == 0 {
            return Err("the most partitions moved at once must be at least 1".to_owned());
        }
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

/// What this instance does with one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Not held.
    Free,
    /// Held under this epoch; what an earlier owner left is being settled.
    /// Writes go ahead, recovered runs start; nothing new is admitted.
    Recovering(u64),
    /// Held and served.
    Serving(u64),
    /// Being handed to another coordinator: nothing new is admitted or
    /// started; executing runs finish (or are aborted), then it is released.
    Draining(u64),
}

impl Slot {
    fn epoch(self) -> Option<u64> {
        match self {
            Slot::Free => None,
            Slot::Recovering(e) | Slot::Serving(e) | Slot::Draining(e) => Some(e),
        }
    }
}

pub struct Ownership {
    /// This instance's member id (its epoch string: one per process start).
    member: String,
    partition_count: u32,
    /// Each partition's slot, by partition.
    held: RwLock<Vec<Slot>>,
    /// The address of the coordinator owning partitions this one does not.
    leader_hint: RwLock<Option<String>>,
    /// Balanced placement: where each partition is served, as last seen
    /// (empty: unknown), for the hint a NOT_OWNER gives.
    owner_hints: RwLock<Vec<String>>,
    /// Serving with no partition held is still serving (balanced placement:
    /// a member may be given none).
    serve_empty: bool,
    lost: CancellationToken,
    lost_reason: Mutex<Option<String>>,
    /// The tokens held when the tenure ended, for the last word with the
    /// store (`Coordinator::settle_loss`).
    lost_tokens: Mutex<Vec<OwnerToken>>,
    /// Whether this instance serves: held partitions, settled. What gRPC
    /// health reports.
    serving: watch::Sender<bool>,
}

impl Ownership {
    pub fn new(member: String, partition_count: u32, serve_empty: bool) -> Self {
        Self {
            member,
            partition_count,
            held: RwLock::new(vec![Slot::Free; partition_count as usize]),
            leader_hint: RwLock::new(None),
            owner_hints: RwLock::new(vec![String::new(); partition_count as usize]),
            serve_empty,
            lost: CancellationToken::new(),
            lost_reason: Mutex::new(None),
            lost_tokens: Mutex::new(Vec::new()),
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

    /// Records leases this member was granted; they are recovering until
    /// `serve` (or `start_serving`).
    pub fn hold(&self, granted: &[Lease]) {
        let mut held = self.held.write().unwrap();
        for lease in granted {
            if lease.owner.as_deref() == Some(self.member.as_str())
                && let Some(slot) = held.get_mut(lease.partition as usize)
            {
                *slot = Slot::Recovering(lease.epoch);
            }
        }
    }

    /// Serves these recovering partitions: called once what an earlier
    /// owner left in them is settled, not before, so that a new run cannot
    /// overtake one of theirs in its lane.
    pub fn serve(&self, partitions: &[u32]) {
        let mut held = self.held.write().unwrap();
        for &partition in partitions {
            if let Some(slot) = held.get_mut(partition as usize)
                && let Slot::Recovering(epoch) = *slot
            {
                *slot = Slot::Serving(epoch);
            }
        }
    }

    /// Starts serving: every recovering partition is served, and the
    /// instance reports SERVING (while it holds any, or always with
    /// balanced placement).
    pub fn start_serving(&self) {
        let mut held = self.held.write().unwrap();
        for slot in held.iter_mut() {
            if let Slot::Recovering(epoch) = *slot {
                *slot = Slot::Serving(epoch);
            }
        }
        let any = held.iter().any(|s| s.epoch().is_some());
        drop(held);
        self.serving
            .send_replace((any || self.serve_empty) && !self.lost.is_cancelled());
    }

    /// Balanced placement: the member has joined and serves the partitions
    /// it has recovered (each as `serve` says); reports SERVING.
    pub fn joined(&self) {
        self.serving.send_replace(!self.lost.is_cancelled());
    }

    /// Stops admitting to these partitions: they are being handed off.
    pub fn drain(&self, partitions: &[u32]) {
        let mut held = self.held.write().unwrap();
        for &partition in partitions {
            if let Some(slot) = held.get_mut(partition as usize)
                && let Some(epoch) = slot.epoch()
            {
                *slot = Slot::Draining(epoch);
            }
        }
    }

    /// Forgets partitions this instance released (or never got back).
    pub fn forget(&self, partitions: &[u32]) {
        let mut held = self.held.write().unwrap();
        for &partition in partitions {
            if let Some(slot) = held.get_mut(partition as usize) {
                *slot = Slot::Free;
            }
        }
    }

    /// The partitions held, with whether each is being handed off.
    pub fn held(&self) -> Vec<(u32, bool)> {
        let held = self.held.read().unwrap();
        held.iter()
            .enumerate()
            .filter(|(_, s)| s.epoch().is_some())
            .map(|(p, s)| (p as u32, matches!(s, Slot::Draining(_))))
            .collect()
    }

    /// Records where each partition is served (balanced placement's lease
    /// table), for NOT_OWNER hints.
    pub fn set_owner_hints(&self, leases: &[Lease], now_ms: i64) {
        let mut hints = self.owner_hints.write().unwrap();
        for lease in leases {
            if let Some(hint) = hints.get_mut(lease.partition as usize) {
                let live = lease.owner.is_some() && lease.expires_at_ms > now_ms;
                hint.clear();
                if live && lease.owner.as_deref() != Some(self.member.as_str()) {
                    hint.push_str(&lease.address);
                }
            }
        }
    }

    /// Points the hint of partitions being handed off at their successor.
    pub fn hint_successor(&self, partition: u32, address: &str) {
        if let Some(hint) = self
            .owner_hints
            .write()
            .unwrap()
            .get_mut(partition as usize)
        {
            hint.clear();
            hint.push_str(address);
        }
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
            .for_each(|e| *e = Slot::Free);
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
            .filter_map(|(partition, slot)| {
                slot.epoch().map(|epoch| OwnerToken {
                    partition: partition as u32,
                    member: self.member.clone(),
                    epoch,
                })
            })
            .collect()
    }

    pub fn holds(&self, partition: u32) -> bool {
        !self.lost.is_cancelled() && self.epoch_of(partition).is_some()
    }

    /// The epoch `partition` is held under, if held.
    pub fn epoch_of(&self, partition: u32) -> Option<u64> {
        self.held
            .read()
            .unwrap()
            .get(partition as usize)
            .and_then(|s| s.epoch())
    }

    /// Whether queued runs of `partition` may start: held and not being
    /// handed off.
    pub fn may_start(&self, partition: u32) -> bool {
        !self.lost.is_cancelled()
            && matches!(
                self.held.read().unwrap().get(partition as usize),
                Some(Slot::Recovering(_) | Slot::Serving(_))
            )
    }

    pub fn holds_any(&self) -> bool {
        !self.lost.is_cancelled()
            && self
                .held
                .read()
                .unwrap()
                .iter()
                .any(|s| s.epoch().is_some())
    }

    /// The token a new run of `key` is admitted under, or NOT_OWNER when
    /// this instance does not serve the key's partition: not held, still
    /// recovering, or being handed off.
    pub fn admission_token(&self, key: &SessionKey) -> CoordinatorResult<OwnerToken> {
        let partition = self.partition(key);
        let slot = match self.lost.is_cancelled() {
            true => Slot::Free,
            false => self.held.read().unwrap()[partition as usize],
        };
        match slot {
            Slot::Serving(epoch) => Ok(OwnerToken {
                partition,
                member: self.member.clone(),
                epoch,
            }),
            _ => Err(self.not_owner(partition)),
        }
    }

    /// The token a write to `key` carries, or NOT_OWNER when this instance
    /// does not hold the key's partition (anymore).
    pub fn token(&self, key: &SessionKey) -> CoordinatorResult<OwnerToken> {
        let partition = self.partition(key);
        let epoch = match self.lost.is_cancelled() {
            true => None,
            false => self.held.read().unwrap()[partition as usize].epoch(),
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
        let hint = self
            .owner_hints
            .read()
            .unwrap()
            .get(partition as usize)
            .filter(|a| !a.is_empty())
            .cloned();
        CoordinatorError::NotOwner {
            message: match reason {
                Some(reason) => format!("this coordinator lost its partitions: {reason}"),
                None => format!("this coordinator does not serve partition {partition}"),
            },
            leader: hint.or_else(|| self.leader_hint.read().unwrap().clone()),
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

    /// Looks at a store result: a STALE_OWNER refusal of a write to a
    /// partition this instance holds ends the tenure (fail-stop: the process
    /// exits and comes back as a new member). A refusal for a partition it
    /// already gave up is the late write of a handoff, and only fails that
    /// write.
    pub fn observe(&self, err: &StoreError) {
        if let StoreError::StaleOwner { message, current } = err {
            if let Some(lease) = current.as_deref() {
                let held = self.epoch_of(lease.partition);
                let ours_now = lease.owner.as_deref() == Some(self.member.as_str())
                    && held == Some(lease.epoch);
                // Not held, or held again under a newer tenure than the
                // refused write's: nothing this instance holds was lost.
                if held.is_none() || ours_now {
                    return;
                }
                self.set_leader_hint(Some(lease.address.clone()));
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
                *self.lost_tokens.lock().unwrap() = self.tokens();
            }
        }
        self.held
            .write()
            .unwrap()
            .iter_mut()
            .for_each(|e| *e = Slot::Free);
        self.lost.cancel();
        self.serving.send_replace(false);
    }

    /// Fires once the tenure has ended.
    pub fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// The tokens held when the tenure ended.
    pub fn lost_tokens(&self) -> Vec<OwnerToken> {
        self.lost_tokens.lock().unwrap().clone()
    }

    pub fn lost_reason(&self) -> Option<String> {
        self.lost_reason.lock().unwrap().clone()
    }
}
