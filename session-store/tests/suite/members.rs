//! The member registry cases of the conformance suite: coordinators
//! heartbeat entries that live by the store's clock, and every answer lists
//! the live ones, sorted by member id.

use std::time::Duration;

use clawgate_system_tests::wait::wait_for;
use session_store::SessionStore;
use session_store::model::*;
use session_store::rules::ownership::{DEFAULT_MAX_MEMBERS, MAX_ADDRESS_CHARS, MAX_LEASE_TTL_MS};

fn beat(member: &str, ttl_ms: u64) -> MemberHeartbeat {
    MemberHeartbeat {
        member: member.to_owned(),
        address: format!("http://{member}:50062"),
        ttl_ms,
    }
}

fn names(table: &MemberTable) -> Vec<&str> {
    table.members.iter().map(|m| m.member.as_str()).collect()
}

fn entry<'a>(table: &'a MemberTable, member: &str) -> &'a Member {
    table
        .members
        .iter()
        .find(|m| m.member == member)
        .unwrap_or_else(|| panic!("{member} is listed: {table:?}"))
}

pub async fn members_heartbeat_creates_and_lists(store: &dyn SessionStore) {
    let empty = store.list_members().await.unwrap();
    assert!(empty.members.is_empty());
    assert!(empty.now_ms > 0, "the store's clock");

    let b = store
        .heartbeat_member(beat("coord-b", 60_000))
        .await
        .unwrap();
    assert_eq!(names(&b), ["coord-b"]);
    let mine = entry(&b, "coord-b");
    assert_eq!(mine.address, "http://coord-b:50062");
    assert_eq!(
        mine.expires_at_ms,
        b.now_ms + 60_000,
        "the store's now + TTL"
    );

    let a = store
        .heartbeat_member(beat("coord-a", 30_000))
        .await
        .unwrap();
    assert_eq!(names(&a), ["coord-a", "coord-b"], "sorted by member id");
    assert_eq!(entry(&a, "coord-b"), mine, "the other entry as stored");

    let listed = store.list_members().await.unwrap();
    assert_eq!(listed.members, a.members);
    assert!(listed.now_ms >= a.now_ms);
}

pub async fn a_member_heartbeat_extends_its_entry(store: &dyn SessionStore) {
    let first = store.heartbeat_member(beat("coord", 60_000)).await.unwrap();
    let mut again = beat("coord", 120_000);
    again.address = "http://coord-moved:50062".into();
    let second = store.heartbeat_member(again).await.unwrap();
    assert_eq!(names(&second), ["coord"], "one entry per member");
    let (before, after) = (entry(&first, "coord"), entry(&second, "coord"));
    assert!(
        after.expires_at_ms > before.expires_at_ms,
        "{after:?} after {before:?}"
    );
    assert_eq!(after.expires_at_ms, second.now_ms + 120_000);
    assert_eq!(after.address, "http://coord-moved:50062");
    assert_eq!(store.list_members().await.unwrap().members, second.members);
}

pub async fn a_member_leaves_at_once(store: &dyn SessionStore) {
    store.heartbeat_member(beat("a", 60_000)).await.unwrap();
    store.heartbeat_member(beat("b", 60_000)).await.unwrap();
    assert!(store.leave_member("a").await.unwrap());
    assert_eq!(names(&store.list_members().await.unwrap()), ["b"]);
    assert!(!store.leave_member("a").await.unwrap(), "already gone");
    assert!(!store.leave_member("nobody").await.unwrap());
    // A member that left may come back.
    let back = store.heartbeat_member(beat("a", 60_000)).await.unwrap();
    assert_eq!(names(&back), ["a", "b"]);
}

pub async fn an_expired_member_is_never_listed(store: &dyn SessionStore) {
    store.heartbeat_member(beat("long", 60_000)).await.unwrap();
    let short = store.heartbeat_member(beat("short", 50)).await.unwrap();
    assert_eq!(names(&short), ["long", "short"]);
    // Expiry is by the store's clock: wait until the entry is gone.
    wait_for(
        "the short entry to expire",
        Duration::from_secs(30),
        async || {
            let listed = store.list_members().await.unwrap();
            if names(&listed) == ["long"] {
                return true;
            }
            assert_eq!(names(&listed), ["long", "short"]);
            assert!(
                listed.now_ms < entry(&listed, "short").expires_at_ms,
                "an expired entry was listed: {listed:?}"
            );
            false
        },
    )
    .await;
    // Not in a heartbeat's answer either (it pruned it), and a leave finds
    // no live entry.
    let other = store.heartbeat_member(beat("other", 60_000)).await.unwrap();
    assert_eq!(names(&other), ["long", "other"]);
    assert!(!store.leave_member("short").await.unwrap());
    // The member may join again.
    let again = store.heartbeat_member(beat("short", 60_000)).await.unwrap();
    assert_eq!(names(&again), ["long", "other", "short"]);
}

pub async fn the_member_registry_is_capped(store: &dyn SessionStore) {
    let member = |n: usize| format!("coord-{n:04}");
    let joined = futures::future::join_all(
        (0..DEFAULT_MAX_MEMBERS).map(|n| store.heartbeat_member(beat(&member(n), 60_000))),
    )
    .await;
    for answer in joined {
        answer.unwrap();
    }
    let full = store.list_members().await.unwrap();
    assert_eq!(full.members.len(), DEFAULT_MAX_MEMBERS);

    let err = store
        .heartbeat_member(beat("latecomer", 60_000))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "INVALID_ARGUMENT", "{err:?}");
    assert!(err.to_string().contains("full"), "{err}");
    // A member in the registry keeps heartbeating.
    let renewed = store
        .heartbeat_member(beat(&member(7), 120_000))
        .await
        .unwrap();
    assert_eq!(renewed.members.len(), DEFAULT_MAX_MEMBERS);
    assert!(!names(&renewed).contains(&"latecomer"));
    // Once one leaves there is room.
    assert!(store.leave_member(&member(0)).await.unwrap());
    let joined = store
        .heartbeat_member(beat("latecomer", 60_000))
        .await
        .unwrap();
    assert_eq!(joined.members.len(), DEFAULT_MAX_MEMBERS);
    assert!(names(&joined).contains(&"latecomer"));
}

pub async fn bad_member_requests_are_refused(store: &dyn SessionStore) {
    let long_address = MemberHeartbeat {
        address: format!("http://{}", "a".repeat(MAX_ADDRESS_CHARS)),
        ..beat("coord", 60_000)
    };
    for bad in [
        beat("", 60_000),
        beat("coord", 0),
        beat("coord", MAX_LEASE_TTL_MS + 1),
        beat("co\nord", 60_000),
        beat(&"m".repeat(257), 60_000),
        long_address,
    ] {
        let err = store.heartbeat_member(bad.clone()).await.unwrap_err();
        assert_eq!(err.code(), "INVALID_ARGUMENT", "{bad:?}: {err:?}");
    }
    let err = store.leave_member("").await.unwrap_err();
    assert_eq!(err.code(), "INVALID_ARGUMENT", "{err:?}");
    assert!(
        store.list_members().await.unwrap().members.is_empty(),
        "nothing was written"
    );
    // The bounds themselves are fine.
    let ok = MemberHeartbeat {
        address: "a".repeat(MAX_ADDRESS_CHARS),
        ..beat(&"m".repeat(256), MAX_LEASE_TTL_MS)
    };
    store.heartbeat_member(ok).await.unwrap();
}
