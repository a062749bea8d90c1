//! Balanced placement (`--placement balanced`): the partitions spread over
//! the live coordinators.
//!
//! Every round (each renew interval) a coordinator renews what it holds,
//! heartbeats into the store's member registry, and reads the lease table.
//! Rendezvous hashing of (partition, member) over the live members names
//! the one member each partition belongs on; every member computes the same
//! answer from the same registry, and a join or a leave moves only about
//! 1/N of the partitions. A member then
//!
//! * takes the partitions it wins that are free or expired (the store
//!   decides: a take bumps the epoch, and fences the old tenure), settles
//!   what the earlier owner left in them (`recovery.rs`), and serves them;
//! * hands off the partitions it holds and no longer wins, at most
//!   `max_moves` at once: it stops admitting to them (NOT_OWNER, with the
//!   successor's address), lets their executing runs finish for up to the
//!   handoff timeout (then aborts them, kind `handoff`), leaves their queued
//!   runs queued in the store, and releases the leases. The successor takes
//!   them at its next round and runs the queued runs, in their order.
//!
//! Nothing here is needed for safety: the store's epoch check is what keeps
//! two members from acting on one partition. Placement decides only who
//! should hold what.
//!
//! A member that loses a partition it did not give up (a renewal refused,
//! a write refused with STALE_OWNER, its leases about to expire unrenewed)
//! stops, as with all-on-one placement: the process exits, is restarted,
//! and joins again as a new member.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use clawgate_common::partition::rendezvous_owner;
use session_store_api::model::{AcquireLeases, LeaseTable, MemberHeartbeat, RenewLeases};
use tokio::time::Instant;

use crate::coordinator::{Inner, State};
use crate::run::{Phase, Run};

/// What one round found about the held leases.
pub(crate) enum Round {
    /// Everything held was renewed (or nothing was held) as of the round's
    /// start.
    Renewed,
    /// The store did not answer; the leases keep their earlier deadline.
    NotRenewed,
    /// A lease this member did not give up was refused: the tenure ended.
    Lost,
}

/// The partitions a member should take and give away, from the lease table
/// and the live members.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Partitions this member wins that nobody holds (free or expired).
    pub take: Vec<u32>,
    /// Partitions this member holds (not already being handed off) that
    /// another member wins, with that member's address.
    pub give: Vec<(u32, String)>,
}

/// Plans one round for `me`. `held`: the partitions held, with whether each
/// is being handed off. `members`: the live members, `(id, address)`.
pub(crate) fn plan(
    me: &str,
    members: &[(String, String)],
    table: &LeaseTable,
    held: &HashMap<u32, bool>,
) -> Plan {
    let ids: Vec<&str> = members.iter().map(|(id, _)| id.as_str()).collect();
    if !ids.contains(&me) {
        return Plan::default();
    }
    let address_of: HashMap<&str, &str> = members
        .iter()
        .map(|(id, address)| (id.as_str(), address.as_str()))
        .collect();
    let mut plan = Plan::default();
    for lease in &table.leases {
        let partition = lease.partition;
        let Some(winner) = rendezvous_owner(partition, &ids) else {
            continue;
        };
        match held.get(&partition) {
            None if winner == me => {
                let free = lease.owner.is_none()
                    || lease.expires_at_ms <= table.now_ms
                    || lease.owner.as_deref() == Some(me);
                if free {
                    plan.take.push(partition);
                }
            }
            Some(false) if winner != me => {
                plan.give.push((partition, address_of[winner].to_owned()));
            }
            _ => {}
        }
    }
    plan
}

impl Inner {
    /// One round of balanced placement (see the module). `round` counts
    /// from 0; the first round only joins, so that members starting
    /// together see each other before anyone takes partitions.
    pub(crate) async fn balance(self: &Arc<Self>, round: u64, timeout: Duration) -> Round {
        let renewed = match tokio::time::timeout(timeout, self.renew_held()).await {
            Ok(Ok(true)) => Round::Renewed,
            Ok(Ok(false)) => return Round::Lost,
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "lease renewal failed; retrying");
                Round::NotRenewed
            }
            Err(_) => {
                tracing::warn!("lease renewal timed out; retrying");
                Round::NotRenewed
            }
        };
        if self.leaving.load(std::sync::atomic::Ordering::Relaxed) {
            return renewed;
        }
        match tokio::time::timeout(timeout, self.place(round)).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::warn!(error = %err, "placement round failed; retrying"),
            Err(_) => tracing::warn!("placement round timed out; retrying"),
        }
        renewed
    }

    /// Renews every held lease. `Ok(false)`: one this member did not give
    /// up was refused, and the tenure is over.
    async fn renew_held(&self) -> session_store_api::StoreResult<bool> {
        let tokens = self.ownership.tokens();
        if tokens.is_empty() {
            return Ok(true);
        }
        let sent: HashMap<u32, u64> = tokens.iter().map(|t| (t.partition, t.epoch)).collect();
        let grant = self
            .store
            .renew_leases(RenewLeases {
                member: self.ownership.member().to_owned(),
                tokens,
                ttl_ms: self.config.ownership.lease_ttl.as_millis() as u64,
            })
            .await?;
        let held: HashMap<u32, bool> = self.ownership.held().into_iter().collect();
        let mut gone = Vec::new();
        for lease in &grant.refused {
            let partition = lease.partition;
            // Released by its handoff while the renewal was on its way, or
            // held again under a newer tenure: nothing was lost.
            let same_tenure = self.ownership.epoch_of(partition) == sent.get(&partition).copied();
            match held.get(&partition) {
                None => {}
                Some(_) if !same_tenure => {}
                // Being handed off: refused, it is simply gone.
                Some(true) => gone.push(partition),
                Some(false) => {
                    self.ownership.lose(format!(
                        "the lease of partition {partition} was refused on renewal (now held by {} at epoch {})",
                        lease.owner.as_deref().unwrap_or("nobody"),
                        lease.epoch
                    ));
                    return Ok(false);
                }
            }
        }
        self.ownership.forget(&gone);
        Ok(true)
    }

    async fn place(self: &Arc<Self>, round: u64) -> session_store_api::StoreResult<()> {
        let ownership = &self.config.ownership;
        let members = self
            .store
            .heartbeat_member(MemberHeartbeat {
                member: self.ownership.member().to_owned(),
                address: ownership.advertise_address.clone(),
                ttl_ms: ownership.lease_ttl.as_millis() as u64,
            })
            .await?;
        let table = self.store.list_leases().await?;
        self.ownership.set_owner_hints(&table.leases, table.now_ms);
        if round == 0 {
            return Ok(());
        }
        let members: Vec<(String, String)> = members
            .members
            .into_iter()
            .map(|m| (m.member, m.address))
            .collect();
        let held: HashMap<u32, bool> = self.ownership.held().into_iter().collect();
        let mut plan = plan(self.ownership.member(), &members, &table, &held);
        let moving = held.values().filter(|draining| **draining).count();
        plan.give
            .truncate(ownership.max_moves.saturating_sub(moving));
        if !plan.give.is_empty() {
            let partitions: Vec<u32> = plan.give.iter().map(|(p, _)| *p).collect();
            self.ownership.drain(&partitions);
            for (partition, successor) in &plan.give {
                self.ownership.hint_successor(*partition, successor);
            }
            tracing::info!(partitions = ?partitions, "handing partitions off");
            tokio::spawn(self.clone().hand_off(partitions));
        }
        if !plan.take.is_empty() {
            self.take(plan.take).await?;
        }
        Ok(())
    }

    /// Takes the partitions the store grants, then recovers and serves
    /// them (beside the placement loop, which keeps renewing meanwhile).
    async fn take(self: &Arc<Self>, partitions: Vec<u32>) -> session_store_api::StoreResult<()> {
        let grant = self
            .store
            .acquire_leases(AcquireLeases {
                member: self.ownership.member().to_owned(),
                address: self.config.ownership.advertise_address.clone(),
                partitions,
                ttl_ms: self.config.ownership.lease_ttl.as_millis() as u64,
                steal: false,
            })
            .await?;
        if grant.granted.is_empty() {
            return Ok(());
        }
        let taken_at = std::time::Instant::now();
        self.ownership.hold(&grant.granted);
        let taken: Vec<u32> = grant.granted.iter().map(|l| l.partition).collect();
        self.metrics.partitions_moved("acquired", taken.len());
        tracing::info!(partitions = ?taken, "took partitions; recovering before serving them");
        let inner = self.clone();
        tokio::spawn(async move {
            match inner.recover(Some(&taken)).await {
                Ok(()) => {
                    inner.ownership.serve(&taken);
                    inner.metrics.took_leases(taken_at.elapsed());
                }
                Err(err) => inner
                    .ownership
                    .lose(format!("recovery of partitions {taken:?} failed: {err}")),
            }
        });
        Ok(())
    }

    /// Hands `partitions` (already draining) to their successor: in-flight
    /// admissions end, executing runs finish or are aborted, queued runs
    /// leave this instance's memory (they stay queued in the store), and
    /// the leases are released.
    async fn hand_off(self: Arc<Self>, partitions: Vec<u32>) {
        let set: HashSet<u32> = partitions.iter().copied().collect();
        let admitting = self.runs_in(&self.lock(), &set, |phase| phase == Phase::Admitting);
        for run in admitting {
            run.admission_done().await;
        }
        let until = Instant::now() + self.config.ownership.handoff_timeout;
        self.settles_by(until, |state| self.executing_in(state, &set).is_empty())
            .await;
        let running = self.executing_in(&self.lock(), &set);
        if !running.is_empty() {
            tracing::warn!(
                runs = running.len(),
                "handoff timeout reached; aborting the partitions' executing runs"
            );
        }
        self.abort_all(
            running,
            "handoff",
            "the run's partition moved to another coordinator",
        )
        .await;
        self.let_queued_go(&set);
        let tokens: Vec<_> = self
            .ownership
            .tokens()
            .into_iter()
            .filter(|t| set.contains(&t.partition))
            .collect();
        match self.store.release_leases(tokens).await {
            Ok(released) => tracing::info!(partitions = ?released, "handed partitions off"),
            Err(err) => {
                tracing::warn!(error = %err, "releasing handed-off partitions failed; they expire")
            }
        }
        self.ownership.forget(&partitions);
        self.metrics
            .partitions_moved("handed_off", partitions.len());
    }

    /// The runs of `set` in a phase `phase` accepts.
    fn runs_in(
        &self,
        state: &State,
        set: &HashSet<u32>,
        phase: impl Fn(Phase) -> bool,
    ) -> Vec<Arc<Run>> {
        state
            .runs
            .values()
            .filter(|run| set.contains(&self.ownership.partition(&run.key)))
            .filter(|run| phase(run.state().phase))
            .cloned()
            .collect()
    }

    /// The runs of `set` holding a lane's turn (companions end with them).
    fn executing_in(&self, state: &State, set: &HashSet<u32>) -> Vec<Arc<Run>> {
        self.runs_in(state, set, |phase| {
            matches!(phase, Phase::Running | Phase::Finishing)
        })
        .into_iter()
        .filter(|run| run.state().carried_by.is_none())
        .collect()
    }

    /// Drops the queued runs of `set` from memory: the next owner of their
    /// partitions finds them queued in the store and runs them. Waiters on
    /// them go on from the record.
    fn let_queued_go(&self, set: &HashSet<u32>) {
        let gone: Vec<Arc<Run>> = {
            let mut state = self.lock();
            let gone = self.runs_in(&state, set, |phase| phase == Phase::Queued);
            let ids: HashSet<&str> = gone.iter().map(|run| run.id.as_str()).collect();
            state.waiting.retain(|id| !ids.contains(id.as_str()));
            state.lanes.retain(|_, lane| {
                lane.queued.retain(|id| !ids.contains(id.as_str()));
                lane.running.is_some() || !lane.queued.is_empty()
            });
            for run in &gone {
                state.runs.remove(&run.id);
            }
            gone
        };
        for run in &gone {
            self.moved_away(run);
        }
    }

    /// Leaves the member registry (a planned stop): the other members stop
    /// counting this one at their next round. Renewal goes on until the
    /// leases are released.
    pub(crate) async fn leave(&self) {
        self.leaving
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let timeout = self.config.ownership.renew_interval;
        let member = self.ownership.member();
        match tokio::time::timeout(timeout, self.store.leave_member(member)).await {
            Ok(Ok(_)) => tracing::info!(%member, "left the member registry"),
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "leaving the member registry failed; the entry expires")
            }
            Err(_) => tracing::warn!("leaving the member registry timed out; the entry expires"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use session_store_api::model::Lease;

    fn table(owners: &[Option<(&str, i64)>], now_ms: i64) -> LeaseTable {
        LeaseTable {
            partition_count: owners.len() as u32,
            leases: owners
                .iter()
                .enumerate()
                .map(|(p, owner)| Lease {
                    partition: p as u32,
                    owner: owner.map(|(m, _)| m.to_owned()),
                    address: owner
                        .map(|(m, _)| format!("http://{m}"))
                        .unwrap_or_default(),
                    epoch: u64::from(owner.is_some()),
                    expires_at_ms: owner.map_or(0, |(_, e)| e),
                })
                .collect(),
            now_ms,
        }
    }

    fn members(ids: &[&str]) -> Vec<(String, String)> {
        ids.iter()
            .map(|id| (id.to_string(), format!("http://{id}")))
            .collect()
    }

    #[test]
    fn members_split_the_free_partitions_without_overlap() {
        let free = table(&[None; 64], 1_000);
        let all = members(&["a", "b", "c"]);
        let plans: Vec<Plan> = ["a", "b", "c"]
            .iter()
            .map(|me| plan(me, &all, &free, &HashMap::new()))
            .collect();
        let mut taken: Vec<u32> = plans.iter().flat_map(|p| p.take.clone()).collect();
        taken.sort_unstable();
        assert_eq!(
            taken,
            (0..64).collect::<Vec<_>>(),
            "each partition exactly once"
        );
        assert!(plans.iter().all(|p| p.give.is_empty() && p.take.len() > 10));
    }

    #[test]
    fn a_live_lease_is_waited_for_and_an_expired_one_taken() {
        let me = "b";
        let all = members(&["a", "b"]);
        let mine: Vec<u32> = (0..16)
            .filter(|&p| rendezvous_owner(p, &["a", "b"]) == Some(me))
            .collect();
        let live = table(&[Some(("a", 5_000)); 16], 1_000);
        assert!(plan(me, &all, &live, &HashMap::new()).take.is_empty());
        let expired = table(&[Some(("a", 900)); 16], 1_000);
        assert_eq!(plan(me, &all, &expired, &HashMap::new()).take, mine);
    }

    #[test]
    fn a_joiner_is_given_its_share_and_nothing_else_moves() {
        let held: HashMap<u32, bool> = (0..32).map(|p| (p, false)).collect();
        let owned = table(&[Some(("a", 5_000)); 32], 1_000);
        let alone = plan("a", &members(&["a"]), &owned, &held);
        assert_eq!(alone, Plan::default());
        let joined = plan("a", &members(&["a", "z"]), &owned, &held);
        assert!(!joined.give.is_empty());
        for (partition, successor) in &joined.give {
            assert_eq!(rendezvous_owner(*partition, &["a", "z"]), Some("z"));
            assert_eq!(successor, "http://z");
        }
        // Partitions already being handed off are not planned again.
        let draining: HashMap<u32, bool> = (0..32).map(|p| (p, true)).collect();
        assert!(
            plan("a", &members(&["a", "z"]), &owned, &draining)
                .give
                .is_empty()
        );
        // A member that does not see itself in the registry plans nothing.
        assert_eq!(
            plan("q", &members(&["a"]), &owned, &HashMap::new()),
            Plan::default()
        );
    }
}
