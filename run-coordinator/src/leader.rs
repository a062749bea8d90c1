//! Lease ownership (`--ownership lease`): active/standby on one store.
//!
//! A standby tries to take every partition each renew interval (free or
//! expired ones only). Once it holds some, it settles what the earlier owner
//! left (`recovery.rs`) and serves them. The leader renews its leases each
//! renew interval. It fences itself before its leases can expire by its own
//! monotonic clock: a lease granted for `ttl` on a request sent at `t` lasts
//! at least until `t + ttl` on the store's clock, so this instance stops
//! acting at `t + ttl - renew_interval`, without waiting for the store's
//! verdict. Whatever it still sends later is refused by the epoch fence.
//!
//! A planned handover (`hand_over`) drains, then releases the leases so
//! that the standby takes over at its next attempt instead of after the TTL.

use std::sync::Arc;
use std::time::Duration;

use session_store_api::model::{AcquireLeases, LeaseGrant, RenewLeases};
use tokio::time::Instant;

use crate::coordinator::{Coordinator, Inner};
use crate::executor::sleep_until_some;
use crate::placement::Round;

impl Inner {
    fn ttl_ms(&self) -> u64 {
        self.config.ownership.lease_ttl.as_millis() as u64
    }

    /// The local deadline of leases granted on a request sent at `sent`.
    fn fence_deadline(&self, sent: Instant) -> Instant {
        let ownership = &self.config.ownership;
        sent + ownership.lease_ttl.saturating_sub(ownership.renew_interval)
    }

    /// The lease loop: standby until partitions are granted, then leader
    /// until the tenure ends or `stop` fires (a handover).
    ///
    /// The fence deadline races everything the loop waits for, the store
    /// calls of a round included: a renewal hanging on a silent link must
    /// not carry the leader past the moment its leases may expire.
    pub(crate) async fn keep_leases(self: Arc<Self>) {
        let interval = self.config.ownership.renew_interval;
        let lost = self.ownership.lost();
        let stop = self.stop_keeping.clone();
        let mut deadline: Option<Instant> = None;
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut round = 0u64;
        loop {
            tokio::select! {
                biased;
                () = sleep_until_some(deadline) => return self.fence_expired(),
                () = lost.cancelled() => return,
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let sent = Instant::now();
            let step = tokio::select! {
                biased;
                () = sleep_until_some(deadline) => return self.fence_expired(),
                step = self.lease_round(round, interval) => step,
            };
            round += 1;
            match step {
                Round::Renewed if self.ownership.holds_any() => {
                    deadline = Some(self.fence_deadline(sent));
                }
                Round::Renewed => deadline = None,
                Round::NotRenewed => {}
                Round::Lost => return,
            }
        }
    }

    /// One round of the lease loop: balanced placement's, a standby's
    /// attempt to take, or the leader's renewal. `Renewed` means that what
    /// is held now was granted or renewed on a request sent this round.
    async fn lease_round(self: &Arc<Self>, round: u64, interval: Duration) -> Round {
        if self.config.ownership.balanced() {
            let step = self.balance(round, interval).await;
            if round == 1 {
                // Joined, and asked for its first share.
                self.ownership.joined();
            }
            return step;
        }
        if !self.ownership.holds_any() {
            return match self.try_take(interval).await {
                true => Round::Renewed,
                false => Round::NotRenewed,
            };
        }
        match tokio::time::timeout(interval, self.renew()).await {
            Ok(Ok(grant)) if grant.refused.is_empty() => Round::Renewed,
            Ok(Ok(grant)) => {
                let lease = &grant.refused[0];
                self.ownership.set_leader_hint(Some(lease.address.clone()));
                self.ownership.lose(format!(
                    "the lease of partition {} was refused on renewal (now held by {} at epoch {})",
                    lease.partition,
                    lease.owner.as_deref().unwrap_or("nobody"),
                    lease.epoch
                ));
                Round::Lost
            }
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "lease renewal failed; retrying");
                Round::NotRenewed
            }
            Err(_) => {
                tracing::warn!("lease renewal timed out; retrying");
                Round::NotRenewed
            }
        }
    }

    /// A standby's attempt. Returns whether partitions were granted; they
    /// are served once recovery has settled them.
    async fn try_take(self: &Arc<Self>, timeout: Duration) -> bool {
        let request = AcquireLeases {
            member: self.ownership.member().to_owned(),
            address: self.config.ownership.advertise_address.clone(),
            partitions: Vec::new(),
            ttl_ms: self.ttl_ms(),
            steal: false,
        };
        let grant = match tokio::time::timeout(timeout, self.store.acquire_leases(request)).await {
            Ok(Ok(grant)) => grant,
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "taking leases failed; retrying");
                return false;
            }
            Err(_) => return false,
        };
        if let Some(owner) = grant.refused.iter().find(|l| l.owner.is_some()) {
            self.ownership.set_leader_hint(Some(owner.address.clone()));
        }
        if grant.granted.is_empty() {
            return false;
        }
        let taken_at = std::time::Instant::now();
        self.ownership.hold(&grant.granted);
        self.ownership.set_leader_hint(None);
        let epochs: Vec<u64> = grant.granted.iter().map(|l| l.epoch).collect();
        tracing::info!(
            member = %self.ownership.member(),
            partitions = grant.granted.len(),
            max_epoch = epochs.iter().max().copied().unwrap_or_default(),
            "took the leases; recovering before serving"
        );
        // Recovery runs beside the lease loop, which keeps renewing: however
        // long it takes, the leases do not lapse under it. It writes under
        // the new epochs; a failure ends the tenure rather than serving
        // half-settled partitions (the next owner settles them).
        let inner = self.clone();
        tokio::spawn(async move {
            match inner.recover(None).await {
                Ok(()) => {
                    inner.ownership.start_serving();
                    inner.metrics.took_leases(taken_at.elapsed());
                }
                Err(err) => inner
                    .ownership
                    .lose(format!("recovery after taking the leases failed: {err}")),
            }
        });
        true
    }

    async fn renew(&self) -> session_store_api::StoreResult<LeaseGrant> {
        self.store
            .renew_leases(RenewLeases {
                member: self.ownership.member().to_owned(),
                tokens: self.ownership.tokens(),
                ttl_ms: self.ttl_ms(),
            })
            .await
    }

    /// The local deadline passed without a renewal: stop acting now. What
    /// became of the leases is asked once, after the tenure ended
    /// (`Coordinator::settle_loss`), not here.
    fn fence_expired(&self) {
        self.ownership
            .lose("the leases were not renewed before they could expire".to_owned());
    }
}

impl Coordinator {
    /// After the tenure ended unplanned: asks the store what became of the
    /// partitions held then, until it answers or `until` passes (a
    /// coordinator cut off from the store hears back once the link is
    /// healed). Leases still held are released at once, so that the next
    /// owner need not wait for them to expire; those another member took
    /// are refused (STALE_OWNER, which the store counts). Balanced
    /// placement also leaves the member registry. Every call is bounded by
    /// the renew interval and by `until`. Returns the verdict, for the exit
    /// message.
    pub async fn settle_loss(&self, until: Instant) -> String {
        let inner = &self.inner;
        let tokens = inner.ownership.lost_tokens();
        let member = inner.ownership.member().to_owned();
        let interval = inner.config.ownership.renew_interval;
        // One call's time: the renew interval, cut at `until`.
        let bounded = || interval.min(until.saturating_duration_since(Instant::now()));
        let ask = RenewLeases {
            member: member.clone(),
            tokens: tokens.clone(),
            ttl_ms: inner.ttl_ms(),
        };
        let mut verdict = match tokens.is_empty() {
            true => "it held no partition".to_owned(),
            false => "the store did not answer in time".to_owned(),
        };
        while !tokens.is_empty() && Instant::now() < until {
            match tokio::time::timeout(bounded(), inner.store.renew_leases(ask.clone())).await {
                Ok(Ok(grant)) => {
                    let still: Vec<_> = grant.granted.iter().filter_map(|l| l.token()).collect();
                    verdict = match grant.refused.first() {
                        Some(lease) => format!(
                            "{} of {} partitions taken (partition {} by {} at epoch {}), {} released",
                            grant.refused.len(),
                            tokens.len(),
                            lease.partition,
                            lease.owner.as_deref().unwrap_or("nobody"),
                            lease.epoch,
                            still.len()
                        ),
                        None => format!("none taken yet, {} released", still.len()),
                    };
                    tracing::warn!(%verdict, "the store's verdict on the partitions this coordinator held");
                    if !still.is_empty() {
                        let _ = tokio::time::timeout(bounded(), inner.store.release_leases(still))
                            .await;
                    }
                    break;
                }
                Ok(Err(_)) | Err(_) => tokio::time::sleep(bounded()).await,
            }
        }
        if inner.config.ownership.balanced() {
            let _ = tokio::time::timeout(bounded(), inner.store.leave_member(&member)).await;
        }
        verdict
    }

    /// A planned handover: stops admitting, lets executing runs finish for
    /// up to `drain_timeout`, then releases the leases so that another
    /// coordinator takes the partitions at once. Queued runs stay queued in
    /// the store and run on the next owner.
    pub async fn hand_over(&self, drain_timeout: Duration) {
        let inner = &self.inner;
        if inner.config.ownership.balanced() {
            inner.leave().await;
        }
        inner.drain(drain_timeout).await;
        inner.stop_keeping.cancel();
        let tokens = inner.ownership.tokens();
        if tokens.is_empty() {
            return;
        }
        let count = tokens.len();
        // Past the TTL the leases have expired anyway: no longer to wait.
        let ttl = inner.config.ownership.lease_ttl;
        match tokio::time::timeout(ttl, inner.store.release_leases(tokens)).await {
            Ok(Ok(released)) => {
                tracing::info!(released = released.len(), of = count, "released the leases")
            }
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "releasing the leases failed; they expire")
            }
            Err(_) => tracing::warn!("releasing the leases did not answer in time; they expire"),
        }
        inner.ownership.release_all();
    }
}
