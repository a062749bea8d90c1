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
use crate::model::{AcquireLeases, Lease, LeaseGrant, OwnerToken, RenewLeases};

/// The longest lease a member may ask for.
pub const MAX_LEASE_TTL_MS: u64 = 3_600_000;
/// Member ids and addresses are names, not payloads.
pub const MAX_MEMBER_CHARS: usize = 256;
pub const MAX_ADDRESS_CHARS: usize = 512;

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
    if req.address.chars().count() > MAX_ADDRESS_CHARS {
        return Err(StoreError::invalid(format!(
            "the address is longer than {MAX_ADDRESS_CHARS} characters"
        )));
    }
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

fn check_member(member: &str) -> Result<(), StoreError> {
    if member.is_empty() || member.chars().count() > MAX_MEMBER_CHARS {
        return Err(StoreError::invalid(format!(
            "a member id has 1 to {MAX_MEMBER_CHARS} characters"
        )));
    }
    if member.chars().any(char::is_control) {
        return Err(StoreError::invalid(
            "a member id must not contain control characters",
        ));
    }
    Ok(())
}

fn check_ttl(ttl_ms: u64) -> Result<(), StoreError> {
    if (1..=MAX_LEASE_TTL_MS).contains(&ttl_ms) {
        Ok(())
    } else {
        Err(StoreError::invalid(format!(
            "a lease lasts 1 ms to {MAX_LEASE_TTL_MS} ms, not {ttl_ms}"
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
}
