//! The ownership cases of the conformance suite: partition leases, and the
//! owner token every coordinator write carries.

use std::time::Duration;

use clawgate_common::partition::{DEFAULT_PARTITIONS, partition_of};
use clawgate_system_tests::wait::wait_for;
use session_store::model::*;
use session_store::{SessionKey, SessionStore, StoreError};

use super::{acquire_req, append_req, key, new_run, transcript, update};

fn take(member: &str, partitions: Vec<u32>, ttl_ms: u64, steal: bool) -> AcquireLeases {
    AcquireLeases {
        member: member.to_owned(),
        address: format!("http://{member}:50062"),
        partitions,
        ttl_ms,
        steal,
    }
}

fn token_for(grant: &LeaseGrant, k: &SessionKey) -> OwnerToken {
    let partition = partition_of(k.as_str(), DEFAULT_PARTITIONS);
    grant
        .granted
        .iter()
        .find(|l| l.partition == partition)
        .and_then(Lease::token)
        .expect("the key's partition was granted")
}

fn assert_stale(err: StoreError, owner: &str, epoch: u64) {
    assert_eq!(err.code(), "STALE_OWNER", "{err:?}");
    let current = err.current_lease().expect("the current lease travels");
    assert_eq!(current.owner.as_deref(), Some(owner));
    assert_eq!(current.epoch, epoch);
}

pub async fn every_partition_has_a_lease(store: &dyn SessionStore) {
    let table = store.list_leases().await.unwrap();
    assert_eq!(table.partition_count, DEFAULT_PARTITIONS);
    assert_eq!(table.leases.len(), DEFAULT_PARTITIONS as usize);
    assert!(
        table
            .leases
            .iter()
            .enumerate()
            .all(|(i, l)| { l.partition == i as u32 && l.owner.is_none() && l.epoch == 0 })
    );
    assert!(table.now_ms > 0, "the store's clock");
}

pub async fn leases_take_renew_release(store: &dyn SessionStore) {
    let a = store
        .acquire_leases(take("a", vec![], 60_000, false))
        .await
        .unwrap();
    assert_eq!(a.granted.len(), DEFAULT_PARTITIONS as usize);
    assert!(a.refused.is_empty());
    assert!(
        a.granted
            .iter()
            .all(|l| l.epoch == 1 && l.owner.as_deref() == Some("a"))
    );
    assert!(
        a.granted
            .iter()
            .all(|l| l.expires_at_ms >= a.now_ms + 60_000)
    );

    // A live lease is not taken without `steal`.
    let b = store
        .acquire_leases(take("b", vec![3, 1, 3], 60_000, false))
        .await
        .unwrap();
    assert!(b.granted.is_empty());
    assert_eq!(
        b.refused.iter().map(|l| l.partition).collect::<Vec<_>>(),
        [1, 3]
    );
    assert_eq!(b.refused[0].owner.as_deref(), Some("a"));
    assert_eq!(b.refused[0].address, "http://a:50062");

    let tokens: Vec<OwnerToken> = a.granted.iter().filter_map(Lease::token).collect();
    let renewed = store
        .renew_leases(RenewLeases {
            member: "a".into(),
            tokens: tokens[..2].to_vec(),
            ttl_ms: 120_000,
        })
        .await
        .unwrap();
    assert_eq!(renewed.granted.len(), 2);
    assert!(
        renewed.granted.iter().all(|l| l.epoch == 1),
        "renewal keeps the epoch"
    );

    let released = store.release_leases(tokens[..2].to_vec()).await.unwrap();
    assert_eq!(released, [0, 1]);
    let again = store.release_leases(tokens[..2].to_vec()).await.unwrap();
    assert!(again.is_empty(), "a released tenure releases nothing");

    // Released partitions are free at once; a take bumps the epoch.
    let b = store
        .acquire_leases(take("b", vec![0, 1, 2], 60_000, false))
        .await
        .unwrap();
    assert_eq!(
        b.granted
            .iter()
            .map(|l| (l.partition, l.epoch))
            .collect::<Vec<_>>(),
        [(0, 2), (1, 2)]
    );
    assert_eq!(
        b.refused.iter().map(|l| l.partition).collect::<Vec<_>>(),
        [2]
    );

    // A renewal of a tenure that ended is refused, and says who holds it.
    let stale = store
        .renew_leases(RenewLeases {
            member: "a".into(),
            tokens: tokens[..3].to_vec(),
            ttl_ms: 60_000,
        })
        .await
        .unwrap();
    assert_eq!(
        stale
            .granted
            .iter()
            .map(|l| l.partition)
            .collect::<Vec<_>>(),
        [2]
    );
    assert_eq!(stale.refused.len(), 2);
    assert!(
        stale
            .refused
            .iter()
            .all(|l| l.owner.as_deref() == Some("b") && l.epoch == 2)
    );

    let listed = store.list_leases().await.unwrap();
    assert_eq!(listed.leases[0].owner.as_deref(), Some("b"));
    assert_eq!(listed.leases[2].owner.as_deref(), Some("a"));
}

pub async fn a_steal_fences_every_write_of_the_old_owner(store: &dyn SessionStore) {
    let k = key("fenced");
    let a = store
        .acquire_leases(take("a", vec![], 60_000, false))
        .await
        .unwrap();
    let a_token = token_for(&a, &k);

    // The owner writes with its token.
    let mut run = new_run("r1", &k, "fp");
    run.owner_token = Some(a_token.clone());
    store.create_run(run).await.unwrap();
    let mut acquire = acquire_req(&k, "r1", None, AcquireMode::Cas);
    acquire.owner_token = Some(a_token.clone());
    let held = store.acquire_writer(acquire).await.unwrap();
    let mut append = append_req(&k, &held, "r1", &["before"]);
    append.owner_token = Some(a_token.clone());
    store.append(append).await.unwrap();

    // Without a token, an owned partition takes no write.
    let err = store
        .create_run(new_run("r-untokened", &k, "fp"))
        .await
        .unwrap_err();
    assert_stale(err, "a", 1);

    // Another member takes over by force: every write of the old tenure is
    // refused from now on, whatever it is.
    let b = store
        .acquire_leases(take("b", vec![], 60_000, true))
        .await
        .unwrap();
    assert_eq!(b.granted.len(), DEFAULT_PARTITIONS as usize);
    let b_token = token_for(&b, &k);
    assert_eq!(b_token.epoch, 2);

    let mut run = new_run("r2", &k, "fp");
    run.owner_token = Some(a_token.clone());
    assert_stale(store.create_run(run).await.unwrap_err(), "b", 2);
    let mut upd = update("r1", 1, RunStatus::Running);
    upd.owner_token = Some(a_token.clone());
    assert_stale(store.update_run(upd).await.unwrap_err(), "b", 2);
    let mut acquire = acquire_req(&k, "r3", Some("r1"), AcquireMode::Cas);
    acquire.owner_token = Some(a_token.clone());
    assert_stale(store.acquire_writer(acquire).await.unwrap_err(), "b", 2);
    let mut append = append_req(&k, &held, "r1", &["late"]);
    append.owner_token = Some(a_token.clone());
    assert_stale(store.append(append).await.unwrap_err(), "b", 2);
    let err = store
        .release_writer(&k, "r1", held.fence_token, Some(&a_token))
        .await
        .unwrap_err();
    assert_stale(err, "b", 2);
    let mut start = super::start_req(&k, "r1", 1);
    start.owner_token = Some(a_token.clone());
    assert_stale(store.start_run(start).await.unwrap_err(), "b", 2);
    let finish = FinishRun {
        run_id: "r1".into(),
        key: k.clone(),
        expected_version: 1,
        status: RunStatus::Ok,
        outcome_json: None,
        writer: Some(HeldFence {
            session_id: held.session.session_id,
            fence_token: held.fence_token,
        }),
        entries: vec![super::text_entry("assistant", "late")],
        owner_token: Some(a_token.clone()),
    };
    assert_stale(store.finish_run(finish).await.unwrap_err(), "b", 2);

    // Nothing of the refused writes landed; the new owner writes.
    let texts: Vec<String> = transcript(store, &k, None)
        .await
        .iter()
        .map(super::text_of)
        .collect();
    assert_eq!(texts, ["before"]);
    let record = store.get_run("r1").await.unwrap().unwrap();
    assert_eq!((record.version, record.status), (1, RunStatus::Accepted));
    let mut upd = update("r1", 1, RunStatus::Lost);
    upd.owner_token = Some(b_token.clone());
    store.update_run(upd).await.unwrap();
    assert!(store.get_run("r2").await.unwrap().is_none());
}

pub async fn owner_tokens_are_checked(store: &dyn SessionStore) {
    let k = key("checked");
    let a = store
        .acquire_leases(take("a", vec![], 60_000, false))
        .await
        .unwrap();
    let mut wrong = token_for(&a, &k);
    wrong.partition = (wrong.partition + 1) % DEFAULT_PARTITIONS;
    let mut run = new_run("r1", &k, "fp");
    run.owner_token = Some(wrong);
    let err = store.create_run(run).await.unwrap_err();
    assert_eq!(err.code(), "INVALID_ARGUMENT", "{err:?}");

    let invalid = [
        take("a", vec![DEFAULT_PARTITIONS], 1000, false),
        take("a", vec![], 0, false),
        take("", vec![], 1000, false),
        take("a", vec![], 3_600_001, false),
    ];
    for request in invalid {
        let err = store.acquire_leases(request.clone()).await.unwrap_err();
        assert_eq!(err.code(), "INVALID_ARGUMENT", "{request:?}: {err:?}");
    }
    let token = token_for(&a, &k);
    let err = store
        .renew_leases(RenewLeases {
            member: "someone-else".into(),
            tokens: vec![token.clone()],
            ttl_ms: 1000,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), "INVALID_ARGUMENT");
    let err = store
        .release_leases(vec![token.clone(), token])
        .await
        .unwrap_err();
    assert_eq!(err.code(), "INVALID_ARGUMENT", "a partition named twice");
}

pub async fn an_expired_lease_is_taken_and_its_epoch_fenced(store: &dyn SessionStore) {
    let a = store
        .acquire_leases(take("a", vec![7], 50, false))
        .await
        .unwrap();
    let a_token = a.granted[0].token().unwrap();
    // Expiry is by the store's clock: wait until another member may take it.
    let b = wait_for("the lease to expire", Duration::from_secs(30), async || {
        let b = store
            .acquire_leases(take("b", vec![7], 60_000, false))
            .await
            .unwrap();
        (!b.granted.is_empty()).then_some(b)
    })
    .await;
    assert_eq!(b.granted[0].epoch, 2);
    let renewed = store
        .renew_leases(RenewLeases {
            member: "a".into(),
            tokens: vec![a_token],
            ttl_ms: 60_000,
        })
        .await
        .unwrap();
    assert!(
        renewed.granted.is_empty(),
        "the old tenure cannot come back"
    );
    assert_eq!(renewed.refused[0].owner.as_deref(), Some("b"));
}

/// A take is ordered after every write of the tenure it ends: once it has
/// returned, every write the old owner was told succeeded is visible, and
/// no write of the old owner succeeds any more.
pub async fn a_take_is_ordered_after_the_old_tenures_writes(store: &dyn SessionStore) {
    let a = store
        .acquire_leases(take("a", vec![], 60_000, false))
        .await
        .unwrap();
    let keys: Vec<SessionKey> = (0..4).map(|i| key(&format!("race-{i}"))).collect();
    let mut writers = Vec::new();
    for k in &keys {
        let token = token_for(&a, k);
        let mut acquire = acquire_req(k, "writer", None, AcquireMode::Cas);
        acquire.owner_token = Some(token.clone());
        let held = store.acquire_writer(acquire).await.unwrap();
        writers.push((k.clone(), token, held));
    }
    let writes = futures::future::join_all(writers.iter().map(|(k, token, held)| async move {
        let mut acknowledged = 0u64;
        for i in 0.. {
            let mut append = append_req(k, held, "writer", &[&format!("w{i}")]);
            append.owner_token = Some(token.clone());
            match store.append(append).await {
                Ok(_) => acknowledged += 1,
                Err(err) => {
                    assert_eq!(err.code(), "STALE_OWNER", "{err:?}");
                    return acknowledged;
                }
            }
            if i % 8 == 0 {
                tokio::task::yield_now().await;
            }
        }
        unreachable!()
    }));
    let steal = async {
        tokio::task::yield_now().await;
        store
            .acquire_leases(take("b", vec![], 60_000, true))
            .await
            .unwrap();
        // The moment the take has returned: what is visible now is final.
        let mut visible = Vec::new();
        for k in &keys {
            visible.push(transcript(store, k, None).await.len() as u64);
        }
        visible
    };
    let (acknowledged, visible) = tokio::join!(writes, steal);
    assert_eq!(
        acknowledged, visible,
        "acknowledged writes vs visible after the take"
    );
}
