//! A partition's lease in the model, with expiry by the store's clock.
//!
//! Expiry decides one thing only: whether AcquireLeases may take a lease
//! another member holds without stealing it (`rules::ownership::take`).
//! Writes are fenced by the epoch, whatever the clocks say, and a renewal
//! extends the current tenure even past its expiry. So the model needs the
//! time only where a take is decided; the store's answer says when that was
//! (`LeaseGrant.now_ms`), and the test checks that this lies within the
//! call's wall-clock window (the store runs on the same machine's clock).

use super::{LeaseView, Member, Token};

/// When the current tenure expires, by the store's clock (Unix ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Expiry {
    At(u64),
    /// Set by an indeterminate take or renewal: its call time plus the TTL
    /// at the earliest; exactly when, nobody was told.
    NotBefore(u64),
}

/// When an operation took effect, as far as the model can tell.
#[derive(Debug, Clone, Copy)]
pub(super) enum Time {
    /// The store's clock when it decided, as its answer says; `granted`,
    /// what it answered, settles an expiry known only by a bound.
    Known { now: u64, granted: bool },
    /// An indeterminate operation: at `from` (its call) or later, maybe
    /// much later. `expired`: the branch explored where the expiry known
    /// does not settle whether the lease had expired by then.
    Unknown { from: u64, expired: bool },
}

impl Time {
    /// The decision time an answer shows (none for an indeterminate one).
    pub(super) fn shown(self) -> u64 {
        match self {
            Self::Known { now, .. } => now,
            Self::Unknown { .. } => 0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct LeaseState {
    pub view: LeaseView,
    pub expiry: Expiry,
}

impl LeaseState {
    pub(super) fn new() -> Self {
        Self {
            view: LeaseView {
                owner: None,
                epoch: 0,
            },
            expiry: Expiry::At(0),
        }
    }

    pub(super) fn holds(&self, token: Token) -> bool {
        self.view.epoch == token.epoch && self.view.owner == Some(token.member)
    }

    /// Whether the tenure had expired at `time`.
    fn expired(&self, time: Time) -> bool {
        match (self.expiry, time) {
            (Expiry::At(at), Time::Known { now, .. }) => at <= now,
            (Expiry::NotBefore(at), Time::Known { now, .. }) if now < at => false,
            // Expired or not: the answer tells (a grant over another
            // member's tenure, without stealing, says it had).
            (Expiry::NotBefore(_), Time::Known { granted, .. }) => granted,
            (Expiry::At(at), Time::Unknown { from, .. }) if at <= from => true,
            (_, Time::Unknown { expired, .. }) => expired,
        }
    }

    /// Whether an indeterminate take by `member` could have gone either
    /// way, depending on when it ran: both ways are then explored.
    pub(super) fn take_undecided(&self, member: Member, steal: bool, from: u64) -> bool {
        let other = self.view.owner.is_some_and(|owner| owner != member);
        let surely_expired = matches!(self.expiry, Expiry::At(at) if at <= from);
        other && !steal && !surely_expired
    }

    fn extend(&mut self, time: Time, ttl_ms: u64) {
        self.expiry = match time {
            Time::Known { now, .. } => Expiry::At(now + ttl_ms),
            Time::Unknown { from, .. } => Expiry::NotBefore(from + ttl_ms),
        };
    }

    /// AcquireLeases: a new tenure when the lease is free, expired, the
    /// member's own, or stolen.
    pub(super) fn take(&mut self, member: Member, steal: bool, time: Time, ttl_ms: u64) -> bool {
        let granted = self.view.owner.is_none()
            || self.view.owner == Some(member)
            || steal
            || self.expired(time);
        if granted {
            self.view.epoch += 1;
            self.view.owner = Some(member);
            self.extend(time, ttl_ms);
        }
        granted
    }

    /// RenewLeases: the current tenure only, even past its expiry.
    pub(super) fn renew(&mut self, token: Token, time: Time, ttl_ms: u64) -> bool {
        let renewed = self.holds(token);
        if renewed {
            self.extend(time, ttl_ms);
        }
        renewed
    }

    /// ReleaseLeases: frees the lease; the epoch stays.
    pub(super) fn release(&mut self, token: Token) -> bool {
        let released = self.holds(token);
        if released {
            self.view.owner = None;
        }
        released
    }
}
