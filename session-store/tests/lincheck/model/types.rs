//! What the model speaks: operations, their answers, and the views of
//! sessions, run records and leases the answers carry.

use std::fmt;

use session_store::model::RunStatus;

/// A run id `r<n>`.
pub type Run = u32;
/// A member id `m<n>`.
pub type Member = u8;

/// A sessionId (a UUID), shown by its first 8 hex digits; or, in the
/// model's state, a placeholder for the sessionId an indeterminate
/// operation made, which nobody has seen yet.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sid(pub u128);

/// Placeholders have all of the top 64 bits set: UUID version 15, which
/// no generator makes (the store's are version 4 or 7).
const PENDING: u128 = (u64::MAX as u128) << 64;

impl Sid {
    /// The placeholder for the sessionId operation `op` may have made.
    pub fn pending(op: u64) -> Self {
        Self(PENDING | u128::from(op))
    }

    pub fn is_pending(self) -> bool {
        self.0 & PENDING == PENDING
    }
}

impl fmt::Debug for Sid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.is_pending() {
            true => write!(f, "?{}", self.0 as u64),
            false => write!(f, "{:08x}", (self.0 >> 96) as u32),
        }
    }
}

/// An owner token of this partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token {
    pub member: Member,
    pub epoch: u64,
}

/// A session as the store shows it (the fields the model decides; times,
/// labels and settings are not modelled).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionView {
    pub id: Sid,
    pub writer: Option<Run>,
    /// The key's last fence issued.
    pub fence: u64,
    pub entries: u64,
    pub last_run: Option<Run>,
    pub last_status: Option<RunStatus>,
}

/// A run record as the store shows it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RunView {
    pub status: RunStatus,
    pub version: u64,
    pub owner: Member,
    pub sid: Option<Sid>,
    pub fence: Option<u64>,
}

/// A lease as the store shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseView {
    pub owner: Option<Member>,
    pub epoch: u64,
}

/// A refusal, with the current state it carries in its detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    StaleWriter(Option<SessionView>),
    SessionReplaced(Option<SessionView>),
    WriterConflict(Option<SessionView>),
    StaleOwner(Option<LeaseView>),
    RunNotFound,
    RunVersionConflict(RunView),
    RunTerminal(RunView),
    /// INVALID_ARGUMENT: the tests send none, so the model never answers it.
    Invalid,
}

impl Refusal {
    pub fn code(&self) -> &'static str {
        match self {
            Self::StaleWriter(_) => "STALE_WRITER",
            Self::SessionReplaced(_) => "SESSION_REPLACED",
            Self::WriterConflict(_) => "WRITER_CONFLICT",
            Self::StaleOwner(_) => "STALE_OWNER",
            Self::RunNotFound => "RUN_NOT_FOUND",
            Self::RunVersionConflict(_) => "RUN_VERSION_CONFLICT",
            Self::RunTerminal(_) => "RUN_TERMINAL",
            Self::Invalid => "INVALID_ARGUMENT",
        }
    }
}

/// An operation on the partition. `s` is a session of the partition (0..).
/// `uses` (record operations) is how many operations of the whole history
/// name that run's record: once all of them are placed, the model forgets
/// the record (nothing can read it any more), which keeps its state small.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// AcquireWriter; `expect`: `None` = the current sessionId.
    Acquire {
        s: u8,
        expect: Option<Sid>,
        expected_writer: Option<Run>,
        run: Run,
        takeover: bool,
        token: Option<Token>,
    },
    Release {
        s: u8,
        run: Run,
        fence: u64,
        token: Option<Token>,
    },
    Append {
        s: u8,
        sid: Sid,
        run: Run,
        fence: u64,
        count: u64,
        token: Option<Token>,
    },
    Reset {
        s: u8,
    },
    /// DeleteSession, keeping the transcript.
    Delete {
        s: u8,
    },
    /// GetSession.
    Read {
        s: u8,
    },
    CreateRun {
        s: u8,
        run: Run,
        owner: Member,
        token: Option<Token>,
        uses: u32,
    },
    StartRun {
        s: u8,
        run: Run,
        version: u64,
        owner: Member,
        takeover: bool,
        expected_writer: Option<Run>,
        count: u64,
        history: u32,
        token: Option<Token>,
        uses: u32,
    },
    FinishRun {
        s: u8,
        run: Run,
        version: u64,
        status: RunStatus,
        writer: Option<(Sid, u64)>,
        count: u64,
        token: Option<Token>,
        uses: u32,
    },
    /// AcquireLeases of this partition.
    TakeLease {
        member: Member,
        steal: bool,
    },
    RenewLease {
        token: Token,
    },
    ReleaseLease {
        token: Token,
    },
    /// ListLeases, this partition's row.
    ReadLease,
}

impl Input {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Acquire {
                takeover: false, ..
            } => "acquire",
            Self::Acquire { takeover: true, .. } => "takeover",
            Self::Release { .. } => "release",
            Self::Append { .. } => "append",
            Self::Reset { .. } => "reset",
            Self::Delete { .. } => "delete",
            Self::Read { .. } => "get_session",
            Self::CreateRun { .. } => "create_run",
            Self::StartRun { .. } => "start_run",
            Self::FinishRun { .. } => "finish_run",
            Self::TakeLease { .. } => "take_lease",
            Self::RenewLease { .. } => "renew_lease",
            Self::ReleaseLease { .. } => "release_lease",
            Self::ReadLease => "list_leases",
        }
    }

    /// The run whose record this operation reads or writes, with `uses`.
    pub(super) fn record_use(&self) -> Option<(Run, u32)> {
        match self {
            Self::CreateRun { run, uses, .. }
            | Self::StartRun { run, uses, .. }
            | Self::FinishRun { run, uses, .. } => Some((*run, *uses)),
            _ => None,
        }
    }

    /// Sets `uses` of a record operation.
    pub fn set_uses(&mut self, count: u32) {
        match self {
            Self::CreateRun { uses, .. }
            | Self::StartRun { uses, .. }
            | Self::FinishRun { uses, .. } => *uses = count,
            _ => {}
        }
    }

    pub fn run_of_record(&self) -> Option<Run> {
        self.record_use().map(|(run, _)| run)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquired {
    pub fence: u64,
    pub session: SessionView,
    pub superseded: Option<Run>,
    pub created: bool,
}

/// What an operation answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    Refused(Refusal),
    Acquired(Acquired),
    Released {
        released: bool,
        session: Option<SessionView>,
    },
    Appended {
        first: u64,
        last: u64,
        session: SessionView,
    },
    Reset {
        session: SessionView,
        previous: Option<Sid>,
        superseded: Option<Run>,
    },
    Deleted {
        deleted: bool,
        previous: Option<Sid>,
        superseded: Option<Run>,
    },
    Read(Option<SessionView>),
    RunCreated {
        created: bool,
        record: RunView,
    },
    Started {
        record: RunView,
        acquired: Acquired,
        first_seq: u64,
        /// The seqs of the history returned.
        history: Vec<u64>,
    },
    Finished {
        record: RunView,
        first_seq: u64,
        released: bool,
    },
    /// AcquireLeases / RenewLeases: granted or refused, the lease, and the
    /// store's clock (Unix ms) when it decided.
    Lease {
        granted: bool,
        lease: LeaseView,
        now: u64,
    },
    LeaseReleased(bool),
    Leases(LeaseView),
    /// No answer: the call timed out or its connection failed (the server
    /// was killed, paused or cut off). The operation may have taken effect
    /// at any time after its call, or never: its return time is when the
    /// server it was sent to had surely stopped acting (its successor was
    /// serving), or never (as Porcupine and Knossos take one). `op` names
    /// the placeholder of a sessionId it may have made; `called_ms` is the
    /// wall clock (Unix ms) at its call, the earliest it can have happened.
    Unknown {
        op: u64,
        called_ms: u64,
    },
}

impl Output {
    /// A sessionId the answer reports for a session it may have made (the
    /// store picks sessionIds; the model takes them from the answer).
    pub(super) fn fresh_id(&self) -> Option<Sid> {
        match self {
            Self::Acquired(a) | Self::Started { acquired: a, .. } => Some(a.session.id),
            Self::Reset { session, .. } => Some(session.id),
            Self::Unknown { op, .. } => Some(Sid::pending(*op)),
            _ => None,
        }
    }

    /// Every sessionId the answer carries, in a fixed order.
    pub(super) fn sids_mut(&mut self) -> Vec<&mut Sid> {
        let mut out = Vec::new();
        match self {
            Self::Refused(refusal) => match refusal {
                Refusal::StaleWriter(Some(v))
                | Refusal::SessionReplaced(Some(v))
                | Refusal::WriterConflict(Some(v)) => out.push(&mut v.id),
                Refusal::RunVersionConflict(r) | Refusal::RunTerminal(r) => out.extend(&mut r.sid),
                _ => {}
            },
            Self::Acquired(a) => out.push(&mut a.session.id),
            Self::Released { session, .. } => out.extend(session.as_mut().map(|v| &mut v.id)),
            Self::Appended { session, .. } => out.push(&mut session.id),
            Self::Reset {
                session, previous, ..
            } => {
                out.push(&mut session.id);
                out.extend(previous);
            }
            Self::Deleted { previous, .. } => out.extend(previous),
            Self::Read(view) => out.extend(view.as_mut().map(|v| &mut v.id)),
            Self::RunCreated { record, .. } | Self::Finished { record, .. } => {
                out.extend(&mut record.sid)
            }
            Self::Started {
                record, acquired, ..
            } => {
                out.extend(&mut record.sid);
                out.push(&mut acquired.session.id);
            }
            Self::Lease { .. }
            | Self::LeaseReleased(_)
            | Self::Leases(_)
            | Self::Unknown { .. } => {}
        }
        out
    }
}
