//! Partition ownership: the lease rules and the owner check every write makes.
//!
//! A lease elects, the epoch fences. Taking a partition bumps its epoch, so
//! an owner token names one tenure exactly; a write whose token is not the
//! partition's current tenure is refused, whatever the clocks say. Expiry
//! (by the store's clock) only decides when another member may take over.
//! Backends run `check_owner` inside the same serializable unit as the write
//! it guards, and the take inside a unit that conflicts with it, so a takeover
//! is ordered after every write of the tenure it ends.

use clawgate_common::partition::partition_of;

use crate::error::StoreError;
use crate::key::SessionKey;
use crate::model::{
    AcquireLeases, Lease, LeaseGrant, Member, MemberHeartbeat, OwnerToken, RenewLeases,
};

/// The longest lease a member may ask for.
pub const MAX_LEASE_TTL_MS: u64 = 3_600_000;
/// Member ids and addresses are names, not payloads.
pub const MAX_MEMBER_CHARS: usize = 256;
pub const MAX_ADDRESS_CHARS: usize = 512;
/// The default of `--max-members`: the most live entries the member registry
/// holds.
pub const DEFAULT_MAX_MEMBERS: usize = 256;

/// The partition a session key belongs to in a store of `partition_count`.
pub fn partition(key: &SessionKey, partition_count: u32) -> u32 {
    partition_of(key.as_str(), partition_count)
}

/// Whether a write to `partition` under `token` may go ahead. `lease` is the
/// partition's current lease (`Lease::unowned` when it has none). A write
/// without a token is allowed only where nobody has ever owned the partition.
pub fn check_owner(
    token: Option<&OwnerToken>,
    partition: u32,
    lease: &Lease,
) -> Result<(), StoreError> {
    let Some(token) = token else {
        if lease.epoch == 0 {
            return Ok(());
        }
        return Err(stale(
            format!(
                "partition {partition} is owned (epoch {}); a write to it must carry the owner's token",
                lease.epoch
            ),
            lease,
        ));
    };
    if token.partition != partition {
        return Err(StoreError::invalid(format!(
            "the owner token is for partition {}, but the session is in partition {partition}",
            token.partition
        )));
    }
    if holds(lease, token) {
        return Ok(());
    }
    Err(stale(
        format!(
            "member {:?} no longer owns partition {partition} under epoch {} (current: {} at epoch {})",
            token.member,
            token.epoch,
            lease.owner.as_deref().unwrap_or("nobody"),
            lease.epoch
        ),
        lease,
    ))
}

fn stale(message: String, lease: &Lease) -> StoreError {
    StoreError::StaleOwner {
        message,
        current: Some(Box::new(lease.clone())),
    }
}

/// Checks an AcquireLeases and returns the partitions it asks for, sorted and
/// without repeats (every partition when it names none).
pub fn acquire_targets(req: &AcquireLeases, partition_count: u32) -> Result<Vec<u32>, StoreError> {
    check_member(&req.member)?;
    check_ttl(req.ttl_ms)?;
    check_address(&req.address)?;
    if req.partitions.is_empty() {
        return Ok((0..partition_count).collect());
    }
    targets(req.partitions.iter().copied(), partition_count)
}

/// Checks a RenewLeases (or the tokens of a ReleaseLeases: `ttl_ms = None`).
pub fn check_tokens(
    tokens: &[OwnerToken],
    ttl_ms: Option<u64>,
    partition_count: u32,
) -> Result<(), StoreError> {
    if let Some(ttl) = ttl_ms {
        check_ttl(ttl)?;
    }
    for token in tokens {
        check_member(&token.member)?;
    }
    let partitions = targets(tokens.iter().map(|t| t.partition), partition_count)?;
    if partitions.len() != tokens.len() {
        return Err(StoreError::invalid("a partition is named twice"));
    }
    Ok(())
}

pub fn check_renew(req: &RenewLeases, partition_count: u32) -> Result<(), StoreError> {
    check_tokens(&req.tokens, Some(req.ttl_ms), partition_count)?;
    if req.tokens.iter().any(|t| t.member != req.member) {
        return Err(StoreError::invalid(
            "every token of a renewal must be the renewing member's",
        ));
    }
    Ok(())
}

fn targets(partitions: impl Iterator<Item = u32>, count: u32) -> Result<Vec<u32>, StoreError> {
    let mut out: Vec<u32> = partitions.collect();
    if let Some(bad) = out.iter().find(|p| **p >= count) {
        return Err(StoreError::invalid(format!(
            "partition {bad} does not exist (the store has {count})"
        )));
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// A member id: 1 to `MAX_MEMBER_CHARS` characters, no control characters.
pub fn check_member(member: &str) -> Result<(), StoreError> {
    check_name("a member id", member, 1, MAX_MEMBER_CHARS)
}

/// An advertised address: at most `MAX_ADDRESS_CHARS` characters, no control
/// characters (NUL cannot be stored by every backend). Empty is allowed.
fn check_address(address: &str) -> Result<(), StoreError> {
    check_name("an address", address, 0, MAX_ADDRESS_CHARS)
}

/// `min..=max` characters, none a control character.
fn check_name(what: &str, value: &str, min: usize, max: usize) -> Result<(), StoreError> {
    if !(min..=max).contains(&value.chars().count()) {
        return Err(StoreError::invalid(format!(
            "{what} has {min} to {max} characters"
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(StoreError::invalid(format!(
            "{what} must not contain control characters"
        )));
    }
    Ok(())
}

fn check_ttl(ttl_ms: u64) -> Result<(), StoreError> {
    if (1..=MAX_LEASE_TTL_MS).contains(&ttl_ms) {
        Ok(())
    } else {
        Err(StoreError::invalid(format!(
            "a lease or a member entry lasts 1 ms to {MAX_LEASE_TTL_MS} ms, not {ttl_ms}"
        )))
    }
}

/// AcquireLeases for one partition: takes it (a new epoch) when it is free,
/// expired, already the member's, or `steal` is set. Returns whether it did.
pub fn take(lease: &mut Lease, req: &AcquireLeases, now_ms: i64) -> bool {
    let free = lease.owner.is_none() || lease.expires_at_ms <= now_ms;
    let own = lease.owner.as_deref() == Some(req.member.as_str());
    if !(free || own || req.steal) {
        return false;
    }
    lease.epoch += 1;
    lease.owner = Some(req.member.clone());
    lease.address = req.address.clone();
    lease.expires_at_ms = expiry(now_ms, req.ttl_ms);
    true
}

/// RenewLeases for one partition: extends it when the token is still the
/// current tenure, even past its expiry (nobody has taken it meanwhile).
pub fn renew(lease: &mut Lease, token: &OwnerToken, ttl_ms: u64, now_ms: i64) -> bool {
    if !holds(lease, token) {
        return false;
    }
    lease.expires_at_ms = expiry(now_ms, ttl_ms);
    true
}

/// ReleaseLeases for one partition: frees it at once when the token is still
/// the current tenure. The epoch stays; the next take bumps it.
pub fn release(lease: &mut Lease, token: &OwnerToken, now_ms: i64) -> bool {
    if !holds(lease, token) {
        return false;
    }
    lease.owner = None;
    lease.address.clear();
    lease.expires_at_ms = now_ms;
    true
}

fn holds(lease: &Lease, token: &OwnerToken) -> bool {
    lease.epoch == token.epoch && lease.owner.as_deref() == Some(token.member.as_str())
}

fn expiry(now_ms: i64, ttl_ms: u64) -> i64 {
    now_ms.saturating_add(ttl_ms as i64)
}

/// Sorts the outcome of one lease call into the answer.
pub fn grant(outcomes: Vec<(Lease, bool)>, now_ms: i64) -> LeaseGrant {
    let (granted, refused): (Vec<_>, Vec<_>) = outcomes.into_iter().partition(|(_, ok)| *ok);
    LeaseGrant {
        granted: granted.into_iter().map(|(l, _)| l).collect(),
        refused: refused.into_iter().map(|(l, _)| l).collect(),
        now_ms,
    }
}

// The member registry: which coordinators are alive (placement). An entry
// lives until `expires_at_ms` by the store's clock; past it, it is no member,
// is never answered, and the next heartbeat prunes it. Liveness only: the
// leases own, the epoch fences.

/// Checks a HeartbeatMember: a member id and an address as a lease's, a TTL
/// as a lease's (1 ms to `MAX_LEASE_TTL_MS`).
pub fn check_heartbeat(req: &MemberHeartbeat) -> Result<(), StoreError> {
    check_member(&req.member)?;
    check_ttl(req.ttl_ms)?;
    check_address(&req.address)
}

/// Whether a registry entry is live at `now_ms` (the store's clock).
pub fn is_live(member: &Member, now_ms: i64) -> bool {
    member.expires_at_ms > now_ms
}

/// Splits the registry's entries into the live ones, sorted by member id
/// (bytewise: the answer's order on every backend), and the expired ones
/// (to prune).
pub fn split_members(
    entries: impl IntoIterator<Item = Member>,
    now_ms: i64,
) -> (Vec<Member>, Vec<Member>) {
    let (mut live, expired): (Vec<_>, Vec<_>) =
        entries.into_iter().partition(|m| is_live(m, now_ms));
    live.sort_unstable_by(|a, b| a.member.cmp(&b.member));
    (live, expired)
}

/// HeartbeatMember on the live entries (`live`, as `split_members` sorts
/// them): creates or extends the member's entry, to `now_ms + ttl_ms`. A
/// member not yet in the registry is refused when `max_members` are live;
/// one already in it always renews. Returns the entry to store; `live` is
/// then the answer's members.
pub fn heartbeat(
    live: &mut Vec<Member>,
    req: &MemberHeartbeat,
    now_ms: i64,
    max_members: usize,
) -> Result<Member, StoreError> {
    let entry = Member {
        member: req.member.clone(),
        address: req.address.clone(),
        expires_at_ms: expiry(now_ms, req.ttl_ms),
    };
    match live.binary_search_by(|m| m.member.as_str().cmp(req.member.as_str())) {
        Ok(at) => live[at] = entry.clone(),
        Err(_) if live.len() >= max_members => {
            return Err(StoreError::invalid(format!(
                "the member registry is full ({} live members, the most --max-members allows): \
                 member {:?} may join when one leaves or expires",
                live.len(),
                req.member
            )));
        }
        Err(at) => live.insert(at, entry.clone()),
    }
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acquire(member: &str, steal: bool) -> AcquireLeases {
        AcquireLeases {
            member: member.into(),
            address: format!("http://{member}"),
            partitions: vec![],
            ttl_ms: 1000,
            steal,
        }
    }

    #[test]
    fn a_take_ends_the_previous_tenure() {
        let mut lease = Lease::unowned(3);
        assert!(take(&mut lease, &acquire("a", false), 0));
        let a = lease.token().unwrap();
        check_owner(Some(&a), 3, &lease).unwrap();
        assert!(!take(&mut lease, &acquire("b", false), 999), "live lease");
        assert!(take(&mut lease, &acquire("b", false), 1000), "expired");
        let err = check_owner(Some(&a), 3, &lease).unwrap_err();
        assert_eq!(err.code(), "STALE_OWNER");
        assert_eq!(err.current_lease().unwrap().owner.as_deref(), Some("b"));
        assert!(!renew(&mut lease, &a, 1000, 1001));
        assert!(!release(&mut lease, &a, 1001));
        assert!(take(&mut lease, &acquire("a", true), 1001), "steal");
        assert_eq!(lease.epoch, 3);
    }

    #[test]
    fn writes_without_a_token_only_where_nobody_ever_owned() {
        let mut lease = Lease::unowned(0);
        check_owner(None, 0, &lease).unwrap();
        assert!(take(&mut lease, &acquire("a", false), 0));
        let token = lease.token().unwrap();
        assert!(release(&mut lease, &token, 5));
        assert_eq!(
            check_owner(None, 0, &lease).unwrap_err().code(),
            "STALE_OWNER"
        );
        assert_eq!(
            check_owner(Some(&token), 0, &lease).unwrap_err().code(),
            "STALE_OWNER",
            "a released tenure writes no more"
        );
    }

    fn beat(member: &str, ttl_ms: u64) -> MemberHeartbeat {
        MemberHeartbeat {
            member: member.into(),
            address: format!("http://{member}"),
            ttl_ms,
        }
    }

    #[test]
    fn the_registry_caps_new_members_not_renewals() {
        let (mut live, expired) = split_members(
            [
                Member {
                    member: "c".into(),
                    address: String::new(),
                    expires_at_ms: 100,
                },
                Member {
                    member: "b".into(),
                    address: String::new(),
                    expires_at_ms: 10,
                },
                Member {
                    member: "a".into(),
                    address: String::new(),
                    expires_at_ms: 101,
                },
            ],
            100,
        );
        let names = |live: &[Member]| live.iter().map(|m| m.member.clone()).collect::<Vec<_>>();
        assert_eq!(names(&live), ["a"], "live only: expires_at_ms > now");
        assert_eq!(expired.len(), 2);
        let entry = heartbeat(&mut live, &beat("b", 50), 100, 2).unwrap();
        assert_eq!(entry.expires_at_ms, 150);
        assert_eq!(names(&live), ["a", "b"], "sorted by member id");
        let full = heartbeat(&mut live, &beat("0", 50), 100, 2).unwrap_err();
        assert_eq!(full.code(), "INVALID_ARGUMENT");
        assert_eq!(names(&live), ["a", "b"], "a refusal changes nothing");
        heartbeat(&mut live, &beat("a", 500), 120, 2).unwrap();
        assert_eq!(live[0].expires_at_ms, 620, "a member in it renews");
    }

    #[test]
    fn heartbeats_are_checked() {
        check_heartbeat(&beat("a", 1)).unwrap();
        check_heartbeat(&beat("a", MAX_LEASE_TTL_MS)).unwrap();
        for bad in [
            beat("", 1000),
            beat("a", 0),
            beat("a", MAX_LEASE_TTL_MS + 1),
            beat("a\n", 1000),
            MemberHeartbeat {
                address: "x".repeat(MAX_ADDRESS_CHARS + 1),
                ..beat("a", 1000)
            },
            MemberHeartbeat {
                address: "http://a\0".into(),
                ..beat("a", 1000)
            },
        ] {
            let err = check_heartbeat(&bad).unwrap_err();
            assert_eq!(err.code(), "INVALID_ARGUMENT", "{bad:?}");
        }
    }
}
