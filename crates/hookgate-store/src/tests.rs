//! One suite, run against both backends.

use std::sync::Arc;

use super::*;
use crate::testing::{drop_postgres_database, fresh_postgres_database, sqlite_url};

/// Runs `test` against a SQLite file and against a fresh PostgreSQL database.
async fn on_both_backends<F, Fut>(test: F)
where
    F: Fn(Store) -> Fut,
    Fut: Future<Output = ()>,
{
    let dir = tempfile::tempdir().unwrap();
    let sqlite = Store::connect(&sqlite_url(dir.path()), &StoreOptions::default()).await.unwrap();
    test(sqlite.clone()).await;
    assert_eq!(sqlite.orphaned_attempts().await.unwrap(), 0, "SQLite: evidence of no item");
    sqlite.close().await;

    let url = fresh_postgres_database().await;
    let postgres = Store::connect(&url, &StoreOptions::default()).await.unwrap();
    test(postgres.clone()).await;
    // No foreign key holds this on PostgreSQL (migration 0009): every test checks it.
    assert_eq!(postgres.orphaned_attempts().await.unwrap(), 0, "PostgreSQL: evidence of no item");
    postgres.close().await;
    drop_postgres_database(&url).await;
}

#[tokio::test]
async fn attempts_naming_a_missing_item_or_event_are_counted() {
    // PostgreSQL only: SQLite's foreign keys refuse such rows.
    let url = fresh_postgres_database().await;
    let store = Store::connect(&url, &StoreOptions::default()).await.unwrap();
    let id = item(&store, "a", "A", None, 10).await;
    let Store::Postgres(pool) = &store else { unreachable!("a PostgreSQL store") };
    let attempt = "INSERT INTO attempts (outbox_id, event_id, attempt, worker, started_at_ms) VALUES ($1, $2, 1, 'w', 0)";
    let event_id: i64 = sqlx::query_scalar("SELECT event_id FROM outbox WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap();
    sqlx::query(attempt).bind(id).bind(event_id).execute(pool).await.unwrap();
    assert_eq!(store.orphaned_attempts().await.unwrap(), 0);
    for (outbox_id, event_id) in [(id + 1000, event_id), (id, event_id + 1000)] {
        sqlx::query(attempt).bind(outbox_id).bind(event_id).execute(pool).await.unwrap();
    }
    assert_eq!(store.orphaned_attempts().await.unwrap(), 2);
    store.close().await;
    drop_postgres_database(&url).await;
}

fn delivery<'a>(key: &'a str, fingerprint: &'a str, body: &'a [u8]) -> NewDelivery<'a> {
    NewDelivery {
        pipeline: "p",
        scope: "s",
        key,
        fingerprint,
        event_type: Some("t"),
        received_at_ms: 1_000,
        headers_json: r#"{"x-id":"1"}"#,
        headers_excerpt_json: r#"{"x-id":"1"}"#,
        body,
        sealed_with: None,
        outbox: vec![
            NewOutboxItem {
                target: "a".into(),
                target_index: 0,
                entity: "E".into(),
                version: Some("v1".into()),
                version_text: Some("1".into()),
            },
            NewOutboxItem {
                target: "b".into(),
                target_index: 1,
                entity: "ext-1".into(),
                version: None,
                version_text: None,
            },
        ],
    }
}

#[tokio::test]
async fn new_duplicate_and_conflicting_deliveries() {
    on_both_backends(|store| async move {
        assert!(store.ready().await.unwrap());
        let first = store.record_intake(&delivery("k1", "f1", b"one")).await.unwrap();
        let IntakeRecord::Accepted { event_id } = first else { panic!("{first:?}") };

        let again = store.record_intake(&delivery("k1", "f1", b"one")).await.unwrap();
        assert_eq!(again, IntakeRecord::Duplicate { event_id });
        let changed = store.record_intake(&delivery("k1", "f2", b"two")).await.unwrap();
        assert_eq!(changed, IntakeRecord::Conflict { event_id });

        let event = store.event(event_id).await.unwrap().unwrap();
        assert_eq!((event.delivery_count, event.conflict_count), (2, 1));
        assert_eq!(event.body, b"one", "the original is untouched");
        assert_eq!(event.fingerprint, "f1");
        assert_eq!(
            store.outbox_for(event_id).await.unwrap().len(),
            2,
            "a duplicate schedules nothing"
        );

        let outcomes: Vec<(DeliveryOutcome, Option<Vec<u8>>)> = store
            .deliveries_for(event_id)
            .await
            .unwrap()
            .into_iter()
            .map(|d| (d.outcome, d.body))
            .collect();
        assert_eq!(
            outcomes,
            [
                (DeliveryOutcome::Accepted, None),
                (DeliveryOutcome::Duplicate, None),
                (DeliveryOutcome::Conflict, Some(b"two".to_vec()))
            ]
        );

        // Another scope is another key space; another key is another event.
        let other_scope = NewDelivery { scope: "s2", ..delivery("k1", "f1", b"one") };
        assert!(matches!(
            store.record_intake(&other_scope).await.unwrap(),
            IntakeRecord::Accepted { .. }
        ));
        assert!(matches!(
            store.record_intake(&delivery("k2", "f1", b"one")).await.unwrap(),
            IntakeRecord::Accepted { .. }
        ));
        assert_eq!(store.events("p").await.unwrap().len(), 3);
    })
    .await;
}

#[tokio::test]
async fn outbox_items_are_stored_with_the_event() {
    on_both_backends(|store| async move {
        let IntakeRecord::Accepted { event_id } =
            store.record_intake(&delivery("k", "f", b"{}")).await.unwrap()
        else {
            panic!("not accepted")
        };
        let items = store.outbox_for(event_id).await.unwrap();
        assert_eq!(items[0].target, "a");
        assert_eq!(items[0].entity, "E");
        assert_eq!(items[0].version.as_deref(), Some("v1"));
        assert_eq!(items[0].version_text.as_deref(), Some("1"), "the sender's form, for evidence");
        assert_eq!(items[0].state, WriteView::Item(ItemState::Pending));
        assert_eq!((items[0].attempts, items[0].next_attempt_at_ms), (0, 1_000));
        assert_eq!(items[1].entity, "ext-1");
    })
    .await;
}

#[tokio::test]
async fn rejected_deliveries_keep_their_body() {
    on_both_backends(|store| async move {
        let rejected = RejectedDelivery {
            pipeline: "p",
            received_at_ms: 5,
            reason: "key: the body is not valid JSON",
            headers_json: "{}",
            body: &[0xff, 0x00, 0xfe],
            sealed_with: None,
        };
        store.record_rejection(&rejected).await.unwrap();
        let kept = store.deliveries("p", DeliveryOutcome::Rejected).await.unwrap();
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].body.as_deref(), Some(&[0xff, 0x00, 0xfe][..]));
        assert_eq!(kept[0].reason.as_deref(), Some("key: the body is not valid JSON"));
        assert_eq!(kept[0].event_id, None);
    })
    .await;
}

#[tokio::test]
async fn concurrent_identical_deliveries_make_one_event() {
    on_both_backends(|store| async move {
        let store = Arc::new(store);
        let tasks: Vec<_> = (0..50)
            .map(|_| {
                let store = Arc::clone(&store);
                tokio::spawn(async move {
                    store.record_intake(&delivery("same", "f", b"{}")).await.unwrap()
                })
            })
            .collect();
        let mut accepted = 0;
        let mut duplicates = 0;
        for task in tasks {
            match task.await.unwrap() {
                IntakeRecord::Accepted { .. } => accepted += 1,
                IntakeRecord::Duplicate { .. } => duplicates += 1,
                IntakeRecord::Conflict { .. } => panic!("same fingerprint"),
            }
        }
        assert_eq!((accepted, duplicates), (1, 49));
        let events = store.events("p").await.unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].delivery_count, 50);
        assert_eq!(store.outbox_for(events[0].id).await.unwrap().len(), 2);
    })
    .await;
}

#[tokio::test]
async fn an_unreachable_database_is_unavailable_not_an_internal_error() {
    let options =
        StoreOptions { acquire_timeout: Duration::from_millis(500), ..StoreOptions::default() };
    // Port 9 (discard) has no PostgreSQL: the connection is refused.
    let error = Store::connect("postgres://postgres@127.0.0.1:9/none", &options).await.unwrap_err();
    assert!(error.is_unavailable(), "{error:?}");
    let error = Store::connect("mysql://x", &options).await.unwrap_err();
    assert!(matches!(error, StoreError::UnsupportedUrl(_)));
}

#[test]
fn exhausted_pools_and_lost_connections_are_unavailable() {
    assert!(StoreError::from(sqlx::Error::PoolTimedOut).is_unavailable());
    assert!(StoreError::from(sqlx::Error::PoolClosed).is_unavailable());
    let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
    assert!(StoreError::from(sqlx::Error::Io(io)).is_unavailable());
    assert!(!StoreError::from(sqlx::Error::RowNotFound).is_unavailable());
}

/// An event with one item for `entity` at `version`, received at `at`.
async fn item(store: &Store, key: &str, entity: &str, version: Option<&str>, at: i64) -> i64 {
    let new = NewDelivery {
        received_at_ms: at,
        outbox: vec![NewOutboxItem {
            target: "t".into(),
            target_index: 0,
            entity: entity.into(),
            version: version.map(str::to_owned),
            version_text: version.map(|v| format!("v{v}")),
        }],
        ..delivery(key, key, b"{}")
    };
    match store.record_intake(&new).await.unwrap() {
        IntakeRecord::Accepted { event_id } => event_id,
        other => panic!("{other:?}"),
    }
}

/// The write applied, as record `R1`, at `version` if any.
fn applied_at(version: Option<&str>) -> Finish {
    Finish::Applied {
        record_id: "R1".into(),
        version: version.map(|v| AppliedVersion { sort_key: v.into(), text: format!("v{v}") }),
    }
}

fn skipped() -> Finish {
    Finish::Skipped { reason: "stale".into(), doubt: Doubt::Clear }
}

fn dead_letter(doubt: Doubt) -> Finish {
    Finish::Dead { error: "rejected: no".into(), doubt }
}

fn retry_at(at_ms: i64) -> Finish {
    Finish::Retry { at_ms, error: "failed".into(), doubt: Doubt::Clear }
}

/// A failed attempt that leaves its item in doubt, to retry at `at`.
fn in_doubt_until(at_ms: i64) -> Finish {
    Finish::Retry { at_ms, error: "no answer".into(), doubt: Doubt::InDoubt }
}

async fn applied(store: &Store, entity: &str) -> Option<String> {
    store.entity_guard("p", "t", entity).await.unwrap().applied.map(|a| a.sort_key)
}

fn events_of(items: &[LeasedItem]) -> Vec<i64> {
    items.iter().map(|i| i.event_id).collect()
}

#[tokio::test]
async fn leasing_takes_one_item_per_entity_in_version_order() {
    on_both_backends(|store| async move {
        // Entity A: versions 3 then 1 arrive (out of order); entity B: no version, two in
        // receipt order.
        let a3 = item(&store, "a3", "A", Some("3"), 10).await;
        let a1 = item(&store, "a1", "A", Some("1"), 11).await;
        let b1 = item(&store, "b1", "B", None, 12).await;
        let _b2 = item(&store, "b2", "B", None, 13).await;

        let leased = store.lease("w1", 100, 1_000, 10).await.unwrap();
        assert_eq!(
            events_of(&leased),
            [a1, b1],
            "the head of each entity only: lowest version, then receipt order"
        );
        assert_eq!(leased[0].attempts, 1);
        assert_eq!(leased[0].version_text.as_deref(), Some("v1"));
        assert_eq!(leased[0].lease_expires_at_ms, 1_000);
        assert!(store.lease("w2", 100, 1_000, 10).await.unwrap().is_empty(), "entities held by w1");

        // A1 applied: A3 becomes the head; its version is newer, so it is applied too.
        assert!(store.finish(&leased[0], &applied_at(Some("1")), &[], 100).await.unwrap());
        let next = store.lease("w2", 101, 1_000, 10).await.unwrap();
        assert_eq!(events_of(&next), [a3], "B is still held by w1");
        assert_eq!(store.event(a1).await.unwrap().unwrap().state, EventState::Done);
        assert_eq!(applied(&store, "A").await.as_deref(), Some("1"));
        assert!(store.finish(&next[0], &applied_at(Some("3")), &[], 101).await.unwrap());
        let guard = store.entity_guard("p", "t", "A").await.unwrap();
        assert_eq!(guard.applied.map(|a| (a.sort_key, a.text)), Some(("3".into(), "v3".into())));
        // The guard never moves backwards.
        let late = item(&store, "a2", "A", Some("2"), 14).await;
        let leased = store.lease("w3", 102, 1_000, 10).await.unwrap();
        let late_item = leased.iter().find(|i| i.event_id == late).unwrap();
        let applied_with_lease = late_item.guard.applied.as_ref().map(|a| a.text.as_str());
        assert_eq!(applied_with_lease, Some("v3"), "the lease reads its entity's guard");
        assert!(store.finish(late_item, &skipped(), &[], 102).await.unwrap());
        assert_eq!(applied(&store, "A").await.as_deref(), Some("3"));
    })
    .await;
}

#[tokio::test]
async fn an_expired_lease_passes_to_another_worker_and_fences_the_first() {
    on_both_backends(|store| async move {
        let event = item(&store, "k", "E", None, 10).await;
        let first = store.lease("w1", 100, 200, 1).await.unwrap().remove(0);
        assert!(!first.in_doubt, "a first lease has nothing to settle");
        assert!(store.lease("w2", 150, 400, 1).await.unwrap().is_empty(), "the lease still holds");
        // Renewing moves the lease's end: at 250 it still holds.
        let renew = |item, until| Renewal { item, lease_expires_at_ms: until };
        assert_eq!(store.renew_leases(&[renew(&first, 300)]).await.unwrap(), [true]);
        assert!(store.lease("w2", 250, 400, 1).await.unwrap().is_empty(), "renewed until 300");

        let second = store.lease("w2", 300, 500, 1).await.unwrap().remove(0);
        assert_eq!(second.event_id, event);
        assert_eq!(second.attempts, 2);
        assert!(second.in_doubt, "the first worker may have written: look up before writing");
        // The first worker wakes up: its lease is gone, its results are refused.
        assert!(!store.finish(&first, &applied_at(None), &[], 310).await.unwrap());
        assert_eq!(store.renew_leases(&[renew(&first, 400)]).await.unwrap(), [false]);
        let calls = [call("lookup", "reconciled", 320)];
        assert!(store.finish(&second, &applied_at(None), &calls, 330).await.unwrap());
        let attempts = store.attempts_for(event).await.unwrap();
        let story: Vec<_> = attempts
            .iter()
            .map(|a| {
                let action = a.action.as_deref().unwrap();
                (
                    a.attempt,
                    action,
                    a.outcome.map(AttemptOutcome::as_str),
                    a.started_at_ms,
                    a.finished_at_ms,
                )
            })
            .collect();
        assert_eq!(
            story,
            [
                (1, "lease", Some("abandoned"), 100, Some(300)),
                (2, "lookup", Some("reconciled"), 320, Some(325))
            ],
            "the abandoned attempt stays visible, from its lease to its takeover"
        );
        assert_eq!(attempts[0].worker, first.lease_owner);
        assert!(attempts[0].error.as_deref().unwrap().contains("a write may have been sent"));
        assert_eq!(attempts[1].worker, second.lease_owner);
    })
    .await;
}

/// A lease marks nothing before a call: the item in flight counts as in doubt, for the head
/// rule at once, and through `in_doubt` once a lease takes it over.
#[tokio::test]
async fn an_item_in_flight_counts_as_in_doubt() {
    on_both_backends(|store| async move {
        let v5 = item(&store, "v5", "E", Some("5"), 10).await;
        store.lease("w1", 100, 200, 10).await.unwrap().remove(0);
        assert!(!store.outbox_for(v5).await.unwrap()[0].in_doubt, "nothing is marked at lease");
        // v3 arrives late, older: w1's write of v5 may be out, so v3 is not the head.
        let v3 = item(&store, "v3", "E", Some("3"), 11).await;
        let taken = store.lease("w2", 300, 1_000, 10).await.unwrap();
        assert_eq!(events_of(&taken), [v5], "the item left in flight, not the older version");
        assert!(taken[0].in_doubt);
        assert!(store.outbox_for(v5).await.unwrap()[0].in_doubt, "the doubt is recorded");
        // The lookup fails: v5 waits in doubt, and v3 waits behind it.
        assert!(store.finish(&taken[0], &in_doubt_until(2_000), &[], 310).await.unwrap());
        assert!(store.lease("w2", 1_000, 3_000, 10).await.unwrap().is_empty());
        // A definitive answer (not applied; then refused with a 503) clears the doubt.
        let again = store.lease("w2", 2_000, 3_000, 10).await.unwrap().remove(0);
        assert_eq!(again.event_id, v5);
        assert!(again.in_doubt);
        assert!(store.finish(&again, &retry_at(0), &[], 2_010).await.unwrap());
        assert!(!store.outbox_for(v5).await.unwrap()[0].in_doubt);
        // Not in doubt and pending, v5 is no longer ahead of the older v3.
        assert_eq!(events_of(&store.lease("w3", 2_020, 4_000, 10).await.unwrap()), [v3]);
    })
    .await;
}

/// An item left in flight is settled by the next claim of its entity even when another write
/// (a replay, in doubt) is that lease's head: shown in flight until then, it stays in doubt
/// behind the replay, with its abandoned attempt as evidence.
#[tokio::test]
async fn an_item_left_in_flight_behind_a_replayed_write_stays_in_doubt() {
    on_both_backends(|store| async move {
        // v7 is dead-lettered in doubt; then v5 arrives and w1 leases it.
        let v7 = item(&store, "v7", "E", Some("7"), 10).await;
        let held = store.lease("w0", 20, 30, 10).await.unwrap().remove(0);
        let dead = dead_letter(Doubt::InDoubt);
        assert!(store.finish(&held, &dead, &[], 25).await.unwrap());
        let v5 = item(&store, "v5", "E", Some("5"), 40).await;
        let first = store.lease("w1", 100, 200, 10).await.unwrap();
        assert_eq!(events_of(&first), [v5]);
        let shown = &store.outbox_for(v5).await.unwrap()[0];
        assert_eq!((shown.state.as_str(), shown.attempts), ("in_flight", 1));
        // While w1 may be writing v5, an operator replays v7; then w1 stops.
        assert_eq!(store.replay_event(v7, 150).await.unwrap(), Replay::Queued(1));
        assert!(store.lease("w2", 150, 400, 10).await.unwrap().is_empty(), "w1's lease holds");
        let next = store.lease("w2", 250, 400, 10).await.unwrap();
        assert_eq!(events_of(&next), [v7], "the latest write in doubt");
        let settled = &store.outbox_for(v5).await.unwrap()[0];
        assert!(settled.in_doubt, "w1's write of v5 may be out");
        assert_eq!((settled.state.as_str(), settled.attempts), ("pending", 1));
        let story: Vec<_> = store
            .attempts_for(v5)
            .await
            .unwrap()
            .into_iter()
            .map(|a| (a.attempt, a.outcome, a.worker, a.started_at_ms, a.finished_at_ms))
            .collect();
        assert_eq!(
            story,
            [(1, Some(AttemptOutcome::Abandoned), first[0].lease_owner.clone(), 100, Some(250))]
        );
        // v7 is found applied; v5 is older, but may be out too: it is looked up next.
        assert!(store.finish(&next[0], &applied_at(Some("7")), &[], 260).await.unwrap());
        let last = store.lease("w3", 270, 400, 10).await.unwrap();
        assert_eq!(events_of(&last), [v5]);
        assert!(last[0].in_doubt);
        assert_eq!(last[0].attempts, 2, "the abandoned attempt counts");
    })
    .await;
}

/// The issue's first sequence: v3 is written and applied, its worker dies before recording
/// the answer, and v1 arrives. v1 must not be written before v3 is settled.
#[tokio::test]
async fn a_write_in_doubt_is_settled_before_an_older_version_is_leased() {
    on_both_backends(|store| async move {
        let v3 = item(&store, "v3", "E", Some("3"), 10).await;
        store.lease("w1", 100, 200, 10).await.unwrap().remove(0);
        // w1 writes v3 and is killed before it records the answer. v1 and v2 arrive.
        let v1 = item(&store, "v1", "E", Some("1"), 110).await;
        let v2 = item(&store, "v2", "E", Some("2"), 120).await;
        assert!(store.lease("w2", 150, 500, 10).await.unwrap().is_empty(), "w1's lease holds");

        let next = store.lease("w2", 250, 500, 10).await.unwrap();
        assert_eq!(events_of(&next), [v3], "the write in doubt comes before any older version");
        assert!(next[0].in_doubt);
        // Its lookup fails: it stays in doubt, and the entity waits for it.
        assert!(store.finish(&next[0], &in_doubt_until(400), &[], 260).await.unwrap());
        assert!(
            store.lease("w2", 300, 500, 10).await.unwrap().is_empty(),
            "nothing older is written while v3 is in doubt and backing off"
        );
        let again = store.lease("w3", 400, 800, 10).await.unwrap();
        assert_eq!(events_of(&again), [v3]);
        // The lookup shows v3 applied: v1 and v2 are older, and stale.
        assert!(store.finish(&again[0], &applied_at(Some("3")), &[], 410).await.unwrap());
        let rest = store.lease("w3", 420, 800, 10).await.unwrap();
        assert_eq!(events_of(&rest), [v1], "then the rest in version order");
        assert_eq!(applied(&store, "E").await.as_deref(), Some("3"), "which the guard skips");
        assert!(store.finish(&rest[0], &skipped(), &[], 430).await.unwrap());
        assert_eq!(events_of(&store.lease("w3", 440, 800, 10).await.unwrap()), [v2]);
    })
    .await;
}

/// The issue's second sequence, without a kill: v10's answer is lost and its lookup is
/// rate-limited; v7, v8 and v9 arrive while v10 waits in doubt.
#[tokio::test]
async fn newer_arrivals_wait_behind_a_write_in_doubt_and_older_ones_too() {
    on_both_backends(|store| async move {
        let v10 = item(&store, "v10", "E", Some("10"), 10).await;
        let held = store.lease("w", 100, 1_000, 10).await.unwrap().remove(0);
        // The write's answer is lost and the lookup after it refused.
        assert!(store.finish(&held, &in_doubt_until(500), &[], 120).await.unwrap());
        for (key, version) in [("v7", "07"), ("v8", "08"), ("v9", "09"), ("v11", "11")] {
            item(&store, key, "E", Some(version), 130).await;
        }
        assert!(store.lease("w", 200, 1_000, 10).await.unwrap().is_empty());
        assert_eq!(events_of(&store.lease("w", 500, 1_000, 10).await.unwrap()), [v10]);
    })
    .await;
}

#[tokio::test]
async fn a_write_dead_lettered_in_doubt_counts_as_applied_for_ordering() {
    on_both_backends(|store| async move {
        let v5 = item(&store, "v5", "E", Some("5"), 10).await;
        let held = store.lease("w", 100, 1_000, 10).await.unwrap().remove(0);
        let dead = dead_letter(Doubt::InDoubt);
        assert!(store.finish(&held, &dead, &[], 110).await.unwrap());

        let guard = store.entity_guard("p", "t", "E").await.unwrap();
        assert_eq!(guard.applied, None);
        assert_eq!(
            guard.doubted,
            Some(AppliedVersion { sort_key: "5".into(), text: "v5".into() }),
            "an older version must not be written over what may be in the CRM"
        );
        // Replayed, it is still in doubt: looked up before it is written. The doubted version
        // stays: a replay racing the lease of an older version must not let it through.
        assert_eq!(store.replay_event(v5, 200).await.unwrap(), Replay::Queued(1));
        let replayed = store.lease("w", 200, 1_000, 10).await.unwrap().remove(0);
        assert!(replayed.in_doubt);
        assert!(store.entity_guard("p", "t", "E").await.unwrap().doubted.is_some());
        assert!(store.finish(&replayed, &dead_letter(Doubt::InDoubt), &[], 210).await.unwrap());

        // Retention deletes the dead letter, not what it says about the entity.
        assert_eq!(store.sweep("p", 1_000).await.unwrap(), 1);
        assert!(store.event(v5).await.unwrap().is_none());
        let guard = store.entity_guard("p", "t", "E").await.unwrap();
        assert_eq!(guard.doubted.map(|d| d.sort_key).as_deref(), Some("5"));
    })
    .await;
}

#[tokio::test]
async fn finishing_two_items_of_one_event_at_once_leaves_the_event_done() {
    on_both_backends(|store| async move {
        for round in 0..20 {
            let key = format!("k{round}");
            let new = NewDelivery {
                outbox: ["A", "B"]
                    .iter()
                    .enumerate()
                    .map(|(i, entity)| NewOutboxItem {
                        target: format!("t{i}"),
                        target_index: i as i64,
                        entity: format!("{entity}{round}"),
                        version: None,
                        version_text: None,
                    })
                    .collect(),
                ..delivery(&key, "f", b"{}")
            };
            let IntakeRecord::Accepted { event_id } = store.record_intake(&new).await.unwrap()
            else {
                panic!("not accepted")
            };
            let leased = store.lease(&format!("w{round}"), 2_000, 9_000, 10).await.unwrap();
            assert_eq!(leased.len(), 2);
            let (a, b) = (store.clone(), store.clone());
            let (first, second) = (leased[0].clone(), leased[1].clone());
            let (x, y) = tokio::join!(
                tokio::spawn(async move { a.finish(&first, &applied_at(None), &[], 2_100).await }),
                tokio::spawn(async move { b.finish(&second, &applied_at(None), &[], 2_100).await }),
            );
            assert!(x.unwrap().unwrap() && y.unwrap().unwrap());
            assert_eq!(
                store.event(event_id).await.unwrap().unwrap().state,
                EventState::Done,
                "round {round}"
            );
        }
    })
    .await;
}

#[tokio::test]
async fn an_entity_row_exists_only_after_its_first_lease_and_claims_skip_held_entities() {
    on_both_backends(|store| async move {
        item(&store, "a", "A", Some("1"), 10).await;
        item(&store, "b", "B", Some("1"), 10).await;
        assert_eq!(store.entity_guard("p", "t", "A").await.unwrap(), EntityGuard::default());
        let first = store.lease("w1", 100, 1_000, 1).await.unwrap();
        assert_eq!(first.len(), 1, "the limit is in entities");
        let second = store.lease("w2", 100, 1_000, 10).await.unwrap();
        assert_eq!(second.len(), 1);
        assert_ne!(first[0].entity, second[0].entity);
    })
    .await;
}

#[tokio::test]
async fn concurrent_leasers_never_hold_one_entity_twice() {
    on_both_backends(|store| async move {
        // Many versions of few entities, leased and finished by racing workers: at no time may
        // two live leases cover one entity.
        for n in 0..60 {
            item(&store, &format!("k{n}"), &format!("E{}", n % 4), Some(&format!("{n:03}")), 10)
                .await;
        }
        let held = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
        let workers: Vec<_> = (0..6)
            .map(|w| {
                let (store, held) = (store.clone(), Arc::clone(&held));
                tokio::spawn(async move {
                    for _ in 0..40 {
                        let owner = format!("w{w}-{:x}", rand::random::<u32>());
                        for leased in store.lease(&owner, 100, 1_000_000, 2).await.unwrap() {
                            assert!(
                                held.lock().unwrap().insert(leased.entity.clone()),
                                "{} leased twice",
                                leased.entity
                            );
                            tokio::task::yield_now().await;
                            held.lock().unwrap().remove(&leased.entity);
                            let done = applied_at(leased.version.as_deref());
                            assert!(store.finish(&leased, &done, &[], 100).await.unwrap());
                        }
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.await.unwrap();
        }
        assert_eq!(store.unfinished_items().await.unwrap(), 0);
        assert_eq!(store.item_states().await.unwrap(), [(ItemState::Done, 60)]);
    })
    .await;
}

#[tokio::test]
async fn dead_letters_do_not_block_their_entity_and_can_be_replayed() {
    on_both_backends(|store| async move {
        let first = item(&store, "k1", "E", Some("1"), 10).await;
        let second = item(&store, "k2", "E", Some("2"), 11).await;
        let leased = store.lease("w", 100, 1_000, 10).await.unwrap().remove(0);
        let dead = Finish::Dead { error: "rejected: bad".into(), doubt: Doubt::Clear };
        assert!(store.finish(&leased, &dead, &[], 100).await.unwrap());
        assert_eq!(store.event(first).await.unwrap().unwrap().state, EventState::Dead);
        assert_eq!(store.entity_guard("p", "t", "E").await.unwrap().doubted, None, "not in doubt");
        let next = store.lease("w", 101, 1_000, 10).await.unwrap();
        assert_eq!(next[0].event_id, second, "the dead item does not block the entity");
        assert!(store.finish(&next[0], &applied_at(Some("2")), &[], 101).await.unwrap());

        assert_eq!(store.dead_events(Some("p")).await.unwrap(), [first]);
        assert_eq!(store.replay_event(first, 200).await.unwrap(), Replay::Queued(1));
        assert_eq!(store.event(first).await.unwrap().unwrap().state, EventState::Accepted);
        let replayed = store.lease("w", 201, 1_000, 10).await.unwrap().remove(0);
        assert_eq!((replayed.event_id, replayed.attempts), (first, 1));
        let story = store.attempts_for(first).await.unwrap();
        assert_eq!(
            story.last().unwrap().outcome.map(AttemptOutcome::as_str),
            Some("replay_requested")
        );
    })
    .await;
}

#[tokio::test]
async fn retention_sweeps_finished_events_only() {
    on_both_backends(|store| async move {
        let finished = item(&store, "old-done", "E1", None, 10).await;
        let pending = item(&store, "old-pending", "E2", None, 10).await;
        let recent = item(&store, "new", "E3", None, 1_000).await;
        let leased = store.lease("w", 100, 1_000, 10).await.unwrap();
        let done = leased.iter().find(|i| i.event_id == finished).unwrap();
        assert!(store.finish(done, &applied_at(None), &[], 100).await.unwrap());
        store
            .record_rejection(&RejectedDelivery {
                pipeline: "p",
                received_at_ms: 5,
                reason: "x",
                headers_json: "[]",
                body: b"x",
                sealed_with: None,
            })
            .await
            .unwrap();

        assert_eq!(store.sweep("p", 500).await.unwrap(), 1);
        assert!(store.event(finished).await.unwrap().is_none());
        assert!(store.event(pending).await.unwrap().is_some(), "never while an item is to do");
        assert!(store.event(recent).await.unwrap().is_some());
        assert!(store.deliveries("p", DeliveryOutcome::Rejected).await.unwrap().is_empty());
    })
    .await;
}

/// Retention deletes at most a batch of events a transaction, each with its items, attempts and
/// deliveries: nothing of a deleted event is left behind.
#[tokio::test]
async fn retention_sweeps_in_batches_and_leaves_no_evidence_behind() {
    on_both_backends(|store| async move {
        let events = usize::try_from(SWEEP_BATCH).unwrap() + 20;
        for n in 0..events {
            item(&store, &format!("k{n}"), &format!("E{n}"), None, 10).await;
        }
        let leased = store.lease("w", 100, 1_000, 10_000).await.unwrap();
        assert_eq!(leased.len(), events);
        let (done, calls) = (applied_at(None), [call("upsert", "created", 100)]);
        let items: Vec<FinishItem<'_>> =
            leased.iter().map(|item| FinishItem { item, finish: &done, calls: &calls }).collect();
        assert!(store.finish_batch(&items, 200).await.unwrap().into_iter().all(|held| held));
        let last = leased.iter().map(|item| item.event_id).max().unwrap();
        assert_eq!(store.attempts_for(last).await.unwrap().len(), 1);

        assert_eq!(store.sweep("p", 500).await.unwrap(), u64::try_from(SWEEP_BATCH).unwrap());
        assert_eq!(store.sweep("p", 500).await.unwrap(), 20);
        assert_eq!(store.sweep("p", 500).await.unwrap(), 0);
        assert!(store.event(last).await.unwrap().is_none());
        assert!(store.attempts_for(last).await.unwrap().is_empty());
        assert_eq!(store.item_states().await.unwrap(), []);
    })
    .await;
}

/// `payload_retention` empties bodies and headers of finished events only (the worker renders
/// pending writes from theirs), and of every old delivery; the event, its key and fingerprint
/// stay, so a redelivery is still a duplicate; replay is refused; the sweep works in batches.
#[tokio::test]
async fn payload_retention_keeps_events_and_dedupe_and_spares_pending_work() {
    on_both_backends(|store| async move {
        let finished = item(&store, "old-done", "E1", None, 10).await;
        let pending = item(&store, "old-pending", "E2", None, 10).await;
        let recent = item(&store, "new", "E3", None, 1_000).await;
        let leased = store.lease("w", 100, 1_000, 10).await.unwrap();
        let done = leased.iter().find(|i| i.event_id == finished).unwrap();
        assert!(store.finish(done, &applied_at(None), &[], 100).await.unwrap());
        let rejected = store
            .record_rejection(&RejectedDelivery {
                pipeline: "p",
                received_at_ms: 5,
                reason: "x",
                headers_json: r#"[["x-a","1"]]"#,
                body: b"personal",
                sealed_with: Some("k1"),
            })
            .await
            .unwrap();

        assert_eq!(store.purge_payloads("p", 500, 600).await.unwrap().events, 1);
        assert_eq!(store.purge_payloads("p", 500, 600).await.unwrap().events, 0, "done once");
        let purged = store.event(finished).await.unwrap().unwrap();
        assert_eq!((purged.body.len(), purged.headers_json.as_str()), (0, "[]"));
        assert_eq!((purged.payload_purged_at_ms, purged.sealed_with), (Some(600), None));
        for kept in [pending, recent] {
            let event = store.event(kept).await.unwrap().unwrap();
            assert!(!event.body.is_empty() && event.payload_purged_at_ms.is_none(), "{event:?}");
        }
        let rows = store.deliveries("p", DeliveryOutcome::Rejected).await.unwrap();
        assert_eq!(rows[0].id, rejected);
        assert_eq!((rows[0].body.as_deref(), rows[0].payload_purged_at_ms), (None, Some(600)));
        // Rotation has nothing left to do with a purged row.
        let left = store.payloads_not_under(PayloadTable::Deliveries, "k2", 0, 10).await.unwrap();
        assert!(left.iter().all(|r| r.id != rejected), "{left:?}");

        let again = delivery("old-done", "old-done", b"{}");
        assert_eq!(
            store.record_intake(&again).await.unwrap(),
            IntakeRecord::Duplicate { event_id: finished }
        );
        assert_eq!(
            store.replay_event(finished, 700).await.unwrap(),
            Replay::PayloadGone { purged_at_ms: 600 }
        );
    })
    .await;
}

/// Old deliveries are purged in batches of their own: a sweep that finds a full batch comes
/// back, whatever the number of events.
#[tokio::test]
async fn payload_retention_catches_up_with_more_deliveries_than_a_batch() {
    on_both_backends(|store| async move {
        for _ in 0..=PURGE_BATCH {
            let rejected = RejectedDelivery {
                pipeline: "p",
                received_at_ms: 5,
                reason: "x",
                headers_json: "[]",
                body: b"personal",
                sealed_with: None,
            };
            store.record_rejection(&rejected).await.unwrap();
        }
        let first = store.purge_payloads("p", 500, 600).await.unwrap();
        assert_eq!((first.events, first.deliveries, first.full()), (0, 500, true));
        let second = store.purge_payloads("p", 500, 600).await.unwrap();
        assert_eq!((second.deliveries, second.full()), (1, false));
        let kept = store.deliveries("p", DeliveryOutcome::Rejected).await.unwrap();
        assert!(kept.iter().all(|d| d.body.is_none()), "every body is gone");
    })
    .await;
}

/// A database as the first release left it, with work in every state, keeps all of it when
/// the entity-lease migration runs: the guard's versions move over, and a write that was in
/// flight when its worker died is still settled before older versions.
#[tokio::test]
async fn a_first_release_database_migrates_forward_without_losing_work() {
    async fn upgrade(url: &str, first: &sqlx::migrate::Migrator) {
        // The migrator's fields are public for `migrate!`; a test may build one that stops
        // after the first release's migration.
        let wave1 = sqlx::migrate::Migrator {
            migrations: std::borrow::Cow::Owned(first.migrations[..1].to_vec()),
            ..sqlx::migrate::Migrator::DEFAULT
        };
        if url.starts_with("sqlite") {
            let options = SqliteConnectOptions::from_str(url).unwrap().create_if_missing(true);
            let pool = SqlitePool::connect_with(options).await.unwrap();
            wave1.run(&pool).await.unwrap();
            for statement in seed() {
                sqlx::query(&statement).execute(&pool).await.unwrap();
            }
            pool.close().await;
        } else {
            let pool = PgPool::connect(url).await.unwrap();
            wave1.run(&pool).await.unwrap();
            for statement in seed() {
                // Hex blob literals are SQLite's; PostgreSQL reads the text as bytes.
                sqlx::query(&statement.replace("x'7b7d'", "'{}'")).execute(&pool).await.unwrap();
            }
            pool.close().await;
        }
    }
    /// The first release's rows: v2 applied, v3 in flight and in doubt under an expired
    /// lease, v1 pending; on another entity, v7 dead in doubt.
    fn seed() -> [String; 3] {
        [
            "INSERT INTO events (pipeline, scope, event_key, fingerprint, received_at_ms, headers, body, state, \
             delivery_count, last_delivery_at_ms) VALUES \
             ('p', '', 'k2', 'f', 1, '[]', x'7b7d', 'done', 1, 1), \
             ('p', '', 'k3', 'f', 2, '[]', x'7b7d', 'accepted', 1, 2), \
             ('p', '', 'k1', 'f', 3, '[]', x'7b7d', 'accepted', 1, 3), \
             ('p', '', 'k7', 'f', 1, '[]', x'7b7d', 'dead', 1, 1)"
                .into(),
            "INSERT INTO outbox (event_id, pipeline, target, target_index, entity, version, state, attempts, \
             next_attempt_at_ms, created_at_ms, lease_owner, lease_expires_at_ms, in_doubt) VALUES \
             (1, 'p', 't', 0, 'E', '2', 'done', 1, 0, 1, NULL, NULL, 0), \
             (2, 'p', 't', 0, 'E', '3', 'in_flight', 1, 0, 2, 'old-worker', 50, 1), \
             (3, 'p', 't', 0, 'E', '1', 'pending', 0, 0, 3, NULL, NULL, 0), \
             (4, 'p', 't', 0, 'F', '7', 'dead', 4, 0, 1, NULL, NULL, 1)"
                .into(),
            "INSERT INTO entity_versions (pipeline, target, entity, version) VALUES ('p', 't', 'E', '2')"
                .into(),
        ]
    }

    let dir = tempfile::tempdir().unwrap();
    let sqlite = sqlite_url(dir.path());
    let postgres = fresh_postgres_database().await;
    for (url, migrator) in [(&sqlite, &SQLITE_MIGRATIONS), (&postgres, &POSTGRES_MIGRATIONS)] {
        upgrade(url, migrator).await;
        let store = Store::connect(url, &StoreOptions::default()).await.unwrap();
        assert!(store.ready().await.unwrap());
        assert_eq!(applied(&store, "E").await.as_deref(), Some("2"), "{url}");
        let doubted = store.entity_guard("p", "t", "F").await.unwrap().doubted;
        assert_eq!(doubted.map(|d| d.sort_key).as_deref(), Some("7"), "{url}: dead in doubt");
        let leased = store.lease("new", 100, 1_000, 10).await.unwrap();
        assert_eq!(events_of(&leased), [2], "{url}: the write in doubt first");
        assert!(leased[0].in_doubt);
        assert_eq!(store.unfinished_items().await.unwrap(), 2);
        if let Store::Postgres(pool) = &store {
            // Versions compare byte by byte as in Rust, whatever the database's locale.
            let collations: Vec<(String, Option<String>)> = sqlx::query_as(
                "SELECT table_name::text || '.' || column_name::text, collation_name::text \
                 FROM information_schema.columns WHERE table_name IN ('outbox', 'entities') \
                 AND column_name IN ('version', 'applied_version', 'doubted_version') \
                 ORDER BY 1",
            )
            .fetch_all(pool)
            .await
            .unwrap();
            assert!(collations.iter().all(|(_, c)| c.as_deref() == Some("C")), "{collations:?}");
            assert_eq!(collations.len(), 3);
        }
        store.close().await;
    }
    drop_postgres_database(&postgres).await;
}

/// One transaction for several deliveries gives each the record it would get alone: new
/// events, a duplicate and a conflict of a key first seen in the same batch, and a key seen
/// in an earlier batch.
#[tokio::test]
async fn a_batch_records_each_delivery_as_if_alone() {
    on_both_backends(|store| async move {
        let IntakeRecord::Accepted { event_id: earlier } =
            store.record_intake(&delivery("k0", "f0", b"zero")).await.unwrap()
        else {
            panic!("k0 is new")
        };
        let batch = [
            delivery("k2", "f2", b"two"),
            delivery("k1", "f1", b"one"),
            delivery("k2", "f2", b"two"),
            delivery("k1", "fX", b"other"),
            delivery("k0", "f0", b"zero"),
        ];
        let records = store.record_intake_batch(&batch).await.unwrap();
        let IntakeRecord::Accepted { event_id: k2 } = records[0] else { panic!("{records:?}") };
        let IntakeRecord::Accepted { event_id: k1 } = records[1] else { panic!("{records:?}") };
        assert_eq!(
            records[2..],
            [
                IntakeRecord::Duplicate { event_id: k2 },
                IntakeRecord::Conflict { event_id: k1 },
                IntakeRecord::Duplicate { event_id: earlier },
            ]
        );
        assert_eq!(store.outbox_for(k1).await.unwrap().len(), 2);
        assert_eq!(store.outbox_for(k2).await.unwrap().len(), 2);
        let event = store.event(k1).await.unwrap().unwrap();
        assert_eq!(
            (event.delivery_count, event.conflict_count, event.body),
            (1, 1, b"one".to_vec())
        );
        assert_eq!(store.event(earlier).await.unwrap().unwrap().delivery_count, 2);
    })
    .await;
}

fn call(action: &'static str, outcome: &str, at: i64) -> Call {
    Call {
        action,
        started_at_ms: at,
        finished_at_ms: at + 5,
        outcome: AttemptOutcome::parse(outcome).expect("an attempt outcome"),
        status: Some(200),
        excerpt: Some(format!("{{\"{outcome}\":true}}")),
        error: None,
        record_id: Some("R".into()),
        meta: None,
        sealed_with: None,
    }
}

/// Batches give every item what it would get alone: its own fence, its own outcome.
#[tokio::test]
async fn batches_renew_and_finish_each_item_as_if_alone() {
    on_both_backends(|store| async move {
        let a = item(&store, "a", "A", Some("1"), 10).await;
        let b = item(&store, "b", "B", None, 11).await;
        let c = item(&store, "c", "C", None, 12).await;
        // One event, two items (entities E and ext-1): finished in one batch, it is done.
        let pair_delivery = NewDelivery { received_at_ms: 13, ..delivery("pair", "f", b"{}") };
        let IntakeRecord::Accepted { event_id: pair } =
            store.record_intake(&pair_delivery).await.unwrap()
        else {
            panic!("not accepted")
        };
        let leased = store.lease("w1", 100, 200, 10).await.unwrap();
        assert_eq!(leased.len(), 5);
        let of = |event: i64| leased.iter().find(|i| i.event_id == event).unwrap();
        let (ia, ib, ic) = (of(a), of(b), of(c));
        let pair_items: Vec<&LeasedItem> = leased.iter().filter(|i| i.event_id == pair).collect();

        // Every lease but C's is renewed to 1,000.
        let renew = |item| Renewal { item, lease_expires_at_ms: 1_000 };
        let mut renewals = vec![renew(ia), renew(ib)];
        renewals.extend(pair_items.iter().map(|i| renew(i)));
        let renewed = store.renew_leases(&renewals).await.unwrap();
        assert!(renewed.iter().all(|held| *held), "{renewed:?}");

        // C's lease ends; w2 takes C over. w1's renewal of C is refused, A's is not.
        let taken = store.lease("w2", 300, 2_000, 10).await.unwrap();
        assert_eq!(events_of(&taken), [c]);
        assert!(taken[0].in_doubt, "w1 may have written C");
        let again = store.renew_leases(&[renew(ia), renew(ic)]).await.unwrap();
        assert_eq!(again, [true, false], "the lease on C was lost");

        let applied_a = applied_at(Some("1"));
        let calls_a = [call("upsert", "created", 100)];
        let retry_b = retry_at(5_000);
        let calls_b = [call("lookup", "not_found", 100), call("upsert", "retryable", 110)];
        let done = applied_at(None);
        let mut items = vec![
            FinishItem { item: ia, finish: &applied_a, calls: &calls_a },
            FinishItem { item: ib, finish: &retry_b, calls: &calls_b },
            FinishItem { item: ic, finish: &done, calls: &[] },
        ];
        items.extend(pair_items.iter().map(|item| FinishItem { item, finish: &done, calls: &[] }));
        let finished = store.finish_batch(&items, 400).await.unwrap();
        assert_eq!(finished, [true, true, false, true, true], "C belongs to w2 now");

        assert_eq!(store.event(a).await.unwrap().unwrap().state, EventState::Done);
        assert_eq!(applied(&store, "A").await.as_deref(), Some("1"));
        let story = store.attempts_for(a).await.unwrap();
        assert_eq!(story.len(), 1, "{story:?}");
        assert_eq!(story[0].outcome.map(AttemptOutcome::as_str), Some("created"));
        assert_eq!((story[0].started_at_ms, story[0].finished_at_ms), (100, Some(105)));
        assert_eq!(story[0].excerpt.as_deref(), Some("{\"created\":true}"));

        let b_item = &store.outbox_for(b).await.unwrap()[0];
        assert_eq!((b_item.state.as_str(), b_item.next_attempt_at_ms), ("pending", 5_000));
        let b_story = store.attempts_for(b).await.unwrap();
        assert_eq!(
            b_story.iter().map(|s| s.action.as_deref()).collect::<Vec<_>>(),
            [Some("lookup"), Some("upsert")],
            "every call of the attempt, in order"
        );
        assert_eq!(b_story[1].worker, ib.lease_owner);

        let c_item = &store.outbox_for(c).await.unwrap()[0];
        assert_eq!(c_item.state, WriteView::InFlight, "w1 changed nothing of C");
        let c_story = store.attempts_for(c).await.unwrap();
        assert_eq!(
            c_story.iter().map(|s| s.outcome.map(AttemptOutcome::as_str)).collect::<Vec<_>>(),
            [Some("abandoned")],
            "only w2's takeover: w1 recorded nothing"
        );
        assert!(store.lease("w3", 400, 3_000, 10).await.unwrap().iter().all(|i| i.event_id != c));
        assert_eq!(store.event(pair).await.unwrap().unwrap().state, EventState::Done);

        // w2 finishes C; B is leased again when due.
        let finished = store
            .finish_batch(&[FinishItem { item: &taken[0], finish: &done, calls: &[] }], 500)
            .await
            .unwrap();
        assert_eq!(finished, [true]);
        assert_eq!(store.event(c).await.unwrap().unwrap().state, EventState::Done);
        assert_eq!(events_of(&store.lease("w4", 5_000, 9_000, 10).await.unwrap()), [b]);
    })
    .await;
}

/// One item twice in one batch, under a lease since taken over and under the one that took it:
/// each is fenced by its own lease, as alone.
#[tokio::test]
async fn a_batch_fences_two_leases_of_one_entity_by_their_own_owners() {
    on_both_backends(|store| async move {
        let v5 = item(&store, "v5", "E", Some("5"), 10).await;
        let stale = store.lease("w1", 100, 200, 10).await.unwrap().remove(0);
        assert_eq!(stale.event_id, v5);
        let fresh = store.lease("w2", 300, 1_000, 10).await.unwrap().remove(0);
        assert_eq!((fresh.event_id, fresh.in_doubt), (v5, true));

        let renew = |item| Renewal { item, lease_expires_at_ms: 1_500 };
        let renewed = store.renew_leases(&[renew(&stale), renew(&fresh)]).await.unwrap();
        assert_eq!(renewed, [false, true], "w1's lease is gone");

        let dead = dead_letter(Doubt::InDoubt);
        let applied_v5 = applied_at(Some("5"));
        let finished = store
            .finish_batch(
                &[
                    FinishItem { item: &stale, finish: &dead, calls: &[] },
                    FinishItem { item: &fresh, finish: &applied_v5, calls: &[] },
                ],
                320,
            )
            .await
            .unwrap();
        assert_eq!(finished, [false, true]);
        assert_eq!(store.outbox_for(v5).await.unwrap()[0].state, WriteView::Item(ItemState::Done));
        let guard = store.entity_guard("p", "t", "E").await.unwrap();
        assert_eq!(guard.applied.map(|a| a.sort_key).as_deref(), Some("5"));
        assert_eq!(guard.doubted, None, "w1's outcome is refused");
    })
    .await;
}

#[tokio::test]
async fn a_delivery_pause_holds_its_target_and_resume_releases_it() {
    on_both_backends(|store| async move {
        let held = item(&store, "k1", "E1", None, 10).await;
        let pause = Pause {
            pipeline: "p".into(),
            kind: PauseKind::Delivery,
            target: "t".into(),
            paused_at_ms: 50,
            reason: Some("CRM down".into()),
        };
        assert!(store.pause(&pause).await.unwrap());
        assert!(!store.pause(&Pause { paused_at_ms: 60, ..pause.clone() }).await.unwrap());
        assert_eq!(
            store.pauses().await.unwrap(),
            std::slice::from_ref(&pause),
            "the first pause stays"
        );
        // Another pipeline's target of the same name is not held.
        let other = NewDelivery {
            pipeline: "q",
            received_at_ms: 10,
            outbox: vec![NewOutboxItem {
                target: "t".into(),
                target_index: 0,
                entity: "E9".into(),
                version: None,
                version_text: None,
            }],
            ..delivery("k9", "k9", b"{}")
        };
        store.record_intake(&other).await.unwrap();
        let leased = store.lease("w", 100, 1_000, 10).await.unwrap();
        assert_eq!(leased.iter().map(|i| i.pipeline.as_str()).collect::<Vec<_>>(), ["q"]);
        assert_eq!(
            store.event(held).await.unwrap().unwrap().state,
            EventState::Accepted,
            "held, not dropped"
        );

        assert!(store.resume("p", PauseKind::Delivery, "t").await.unwrap());
        assert!(!store.resume("p", PauseKind::Delivery, "t").await.unwrap());
        assert!(store.pauses().await.unwrap().is_empty());
        let leased = store.lease("w2", 101, 1_000, 10).await.unwrap();
        assert_eq!(events_of(&leased), [held]);
    })
    .await;
}

#[tokio::test]
async fn replays_go_to_their_own_lane_and_leases_take_the_lanes_in_turn() {
    on_both_backends(|store| async move {
        // Four dead events, replayed by filter (one of them is left out by time).
        let mut dead = Vec::new();
        for n in 0..4 {
            let id = item(&store, &format!("d{n}"), &format!("D{n}"), None, 10 + n).await;
            dead.push(id);
        }
        let leased = store.lease("w", 100, 1_000, 10).await.unwrap();
        for leased in &leased {
            let failed = dead_letter(Doubt::Clear);
            assert!(store.finish(leased, &failed, &[], 100).await.unwrap());
        }
        let filter = ReplayFilter {
            pipeline: Some("p".into()),
            until_ms: Some(13),
            limit: 10,
            ..ReplayFilter::default()
        };
        assert_eq!(store.dead_events_matching(&filter).await.unwrap(), dead[..3]);
        let only = ReplayFilter {
            event_ids: Some(vec![dead[3], dead[1]]),
            limit: 10,
            ..ReplayFilter::default()
        };
        assert_eq!(store.dead_events_matching(&only).await.unwrap(), [dead[1], dead[3]]);
        let wrong_target =
            ReplayFilter { target: Some("x".into()), limit: 10, ..ReplayFilter::default() };
        assert!(store.dead_events_matching(&wrong_target).await.unwrap().is_empty());
        let letters = store.dead_letters(Some("p"), Some("t"), None, 2).await.unwrap();
        assert_eq!(letters.iter().map(|l| l.event_id).collect::<Vec<_>>(), [dead[3], dead[2]]);
        assert_eq!(letters[0].last_error.as_deref(), Some("rejected: no"));
        assert_eq!(letters[0].event_key, "d3");
        let older = store.dead_letters(None, None, Some(letters[1].write_id), 10).await.unwrap();
        assert_eq!(older.iter().map(|l| l.event_id).collect::<Vec<_>>(), [dead[1], dead[0]]);

        for id in &dead[..3] {
            assert_eq!(
                store.replay_event_writes(*id, Some("t"), 200).await.unwrap(),
                Replay::Queued(1)
            );
        }
        // Fresh work arrives after the replays, due later: each lease still takes from both.
        let mut fresh = Vec::new();
        for n in 0..3 {
            fresh.push(item(&store, &format!("f{n}"), &format!("F{n}"), None, 300 + n).await);
        }
        let first = store.lease("w1", 400, 1_000, 2).await.unwrap();
        let mut taken = events_of(&first);
        taken.sort();
        assert_eq!(taken, [dead[0], fresh[0]], "one from each lane, oldest first in each");
        let rest = store.lease("w2", 400, 1_000, 10).await.unwrap();
        assert_eq!(rest.len(), 4, "everything else: {rest:?}");
        let backlog = store.target_backlog().await.unwrap();
        assert_eq!(backlog.len(), 1);
        assert_eq!((backlog[0].in_flight, backlog[0].dead, backlog[0].pending), (6, 1, 0));
    })
    .await;
}

#[tokio::test]
async fn conflicts_are_listed_newest_first_with_their_bodies() {
    on_both_backends(|store| async move {
        store.record_intake(&delivery("k1", "f1", b"one")).await.unwrap();
        store.record_intake(&delivery("k1", "f2", b"two")).await.unwrap();
        store.record_intake(&delivery("k1", "f3", b"three")).await.unwrap();
        store.record_intake(&delivery("k1", "f1", b"one")).await.unwrap();
        let conflicts =
            store.deliveries_page(DeliveryOutcome::Conflict, Some("p"), None, 10).await.unwrap();
        let bodies: Vec<_> = conflicts.iter().map(|c| c.body.clone().unwrap()).collect();
        assert_eq!(bodies, [b"three".to_vec(), b"two".to_vec()]);
        let next = store
            .deliveries_page(DeliveryOutcome::Conflict, None, Some(conflicts[0].id), 10)
            .await
            .unwrap();
        assert_eq!(next.len(), 1);
        assert!(
            store
                .deliveries_page(DeliveryOutcome::Conflict, Some("other"), None, 10)
                .await
                .unwrap()
                .is_empty()
        );
    })
    .await;
}

async fn lanes(store: &Store) -> Vec<(i64, i64)> {
    let sql = "SELECT event_id, lane FROM outbox ORDER BY event_id";
    match store {
        Store::Sqlite { writer, .. } => sqlx::query_as(sql).fetch_all(writer).await.unwrap(),
        Store::Postgres(pool) => sqlx::query_as(sql).fetch_all(pool).await.unwrap(),
    }
}

#[tokio::test]
async fn a_paused_targets_writes_are_parked_out_of_the_lease_walks_and_put_back() {
    on_both_backends(|store| async move {
        let before = item(&store, "k1", "E1", None, 10).await;
        let pause = Pause {
            pipeline: "p".into(),
            kind: PauseKind::Delivery,
            target: "t".into(),
            paused_at_ms: 20,
            reason: None,
        };
        assert!(store.pause(&pause).await.unwrap());
        assert_eq!(lanes(&store).await, [(before, LANE_PARKED)], "parked by the pause itself");
        // Intake does not know the pause: what arrives after it is parked by the upkeep.
        let after = item(&store, "k2", "E2", None, 30).await;
        assert_eq!(lanes(&store).await[1], (after, LANE_FRESH));
        assert!(store.lease("w", 100, 1_000, 10).await.unwrap().is_empty(), "held, both");
        let last = store.maintain_pauses(0, std::slice::from_ref(&pause)).await.unwrap();
        assert_eq!(last, after);
        assert_eq!(lanes(&store).await, [(before, LANE_PARKED), (after, LANE_PARKED)]);
        // A replay into a paused target is parked at once, in the replay lane.
        assert!(store.resume("p", PauseKind::Delivery, "t").await.unwrap());
        assert_eq!(lanes(&store).await, [(before, LANE_FRESH), (after, LANE_FRESH)], "put back");
        let leased = store.lease("w", 101, 1_000, 10).await.unwrap();
        assert_eq!(events_of(&leased), [before, after]);
        let dead = dead_letter(Doubt::Clear);
        assert!(store.finish(&leased[0], &dead, &[], 101).await.unwrap());
        assert!(store.pause(&Pause { paused_at_ms: 102, ..pause.clone() }).await.unwrap());
        assert_eq!(store.replay_event(before, 103).await.unwrap(), Replay::Queued(1));
        assert_eq!(lanes(&store).await[0], (before, LANE_REPLAY + LANE_PARKED));
        // A pause lifted elsewhere (another gateway's resume raced a park): the upkeep puts
        // the write back.
        sqlx_delete_pauses(&store).await;
        store.maintain_pauses(last, &[]).await.unwrap();
        assert_eq!(lanes(&store).await[0], (before, LANE_REPLAY));
        let replayed = store.lease("w2", 104, 1_000, 10).await.unwrap();
        assert_eq!(events_of(&replayed), [before]);
    })
    .await;
}

async fn sqlx_delete_pauses(store: &Store) {
    match store {
        Store::Sqlite { writer, .. } => {
            sqlx::query("DELETE FROM pauses").execute(writer).await.unwrap();
        }
        Store::Postgres(pool) => {
            sqlx::query("DELETE FROM pauses").execute(pool).await.unwrap();
        }
    }
}

#[tokio::test]
async fn lists_read_no_payload() {
    on_both_backends(|store| async move {
        let IntakeRecord::Accepted { event_id } =
            store.record_intake(&delivery("k1", "f1", b"a body")).await.unwrap()
        else {
            panic!("accepted")
        };
        let filter = EventFilter { limit: 10, ..EventFilter::default() };
        let listed = store.list_events(&filter).await.unwrap();
        assert_eq!(listed.len(), 1);
        assert!(listed[0].body.is_empty() && listed[0].headers_json.is_empty());
        assert_eq!(listed[0].body_bytes, 6, "the size is read without the body");
        assert_eq!(listed[0].fingerprint, "f1");
        assert_eq!(store.event(event_id).await.unwrap().unwrap().body, b"a body", "read whole");
        assert_eq!(store.fingerprints(&[event_id, 999]).await.unwrap(), [(event_id, "f1".into())]);
    })
    .await;
}

/// Every row a batch writes, as text, ids replaced by the keys they stand for: the same on
/// both backends if the PostgreSQL statement and the SQLite inserts agree.
async fn intake_rows(store: &Store) -> Vec<String> {
    let events = "SELECT pipeline || '|' || scope || '|' || event_key || '|' || fingerprint || '|' || \
         COALESCE(event_type, '-') || '|' || received_at_ms || '|' || headers || '|' || \
         state || '|' || delivery_count || '|' || conflict_count || '|' || last_delivery_at_ms || '|' || \
         COALESCE(sealed_with, '-') AS row, body FROM events ORDER BY event_key";
    let outbox = "SELECT e.event_key || '|' || o.pipeline || '|' || o.target || '|' || o.target_index || '|' || \
         o.entity || '|' || COALESCE(o.version, '-') || '|' || o.state || '|' || o.next_attempt_at_ms || '|' || \
         o.created_at_ms || '|' || COALESCE(o.version_text, '-') || '|' || o.siblings || '|' || o.attempts AS row, \
         NULL AS body FROM outbox o JOIN events e ON e.id = o.event_id ORDER BY e.event_key, o.target";
    let evidence = "SELECT d.outcome || '|' || e.event_key || '|' || d.pipeline || '|' || d.received_at_ms || '|' || \
         COALESCE(d.scope, '-') || '|' || COALESCE(d.event_key, '-') || '|' || COALESCE(d.fingerprint, '-') || '|' || \
         d.headers || '|' || COALESCE(d.sealed_with, '-') AS row, d.body FROM deliveries d \
         JOIN events e ON e.id = d.event_id ORDER BY e.event_key, d.outcome, d.fingerprint";
    let mut rows = Vec::new();
    for query in [events, outbox, evidence] {
        let fetched: Vec<(String, Option<Vec<u8>>)> =
            on_both!(store, pool => sqlx::query_as(query).fetch_all(pool).await.unwrap());
        rows.extend(fetched.into_iter().map(|(row, body)| format!("{row}|{body:?}")));
    }
    rows
}

/// The PostgreSQL one-statement intake and the SQLite transaction store the same rows and give
/// the same records, for new events with zero, one or two items, absent optional fields, a
/// binary body, and repeats in the batch and across batches. A held PostgreSQL connection that
/// is cut costs one batch, answered unavailable; the next batch connects again.
#[tokio::test]
async fn the_intake_writer_stores_the_same_rows_on_both_backends() {
    let body = [0_u8, 159, 146, 150, 255];
    let mut none = delivery("k3", "f3", &body);
    (none.event_type, none.sealed_with, none.outbox) = (None, Some("key-1"), Vec::new());
    let mut one = delivery("k1", "f1", b"one");
    one.outbox.truncate(1);
    one.received_at_ms = 2_000;
    let first = [
        delivery("k2", "f2", b"two"),
        one.clone(),
        none.clone(),
        delivery("k2", "f2", b"two"),
        delivery("k2", "fX", b"other"),
    ];
    let second = [none, delivery("k4", "f4", b"four"), one];

    let dir = tempfile::tempdir().unwrap();
    let sqlite = Store::connect(&sqlite_url(dir.path()), &StoreOptions::default()).await.unwrap();
    let url = fresh_postgres_database().await;
    let postgres = Store::connect(&url, &StoreOptions::default()).await.unwrap();
    let mut seen = Vec::new();
    for store in [&sqlite, &postgres] {
        let mut writer = store.intake_writer();
        let mut records = writer.record_batch(&first).await.unwrap();
        records.extend(writer.record_batch(&second).await.unwrap());
        let kinds: Vec<&str> = records
            .iter()
            .map(|r| match r {
                IntakeRecord::Accepted { .. } => "accepted",
                IntakeRecord::Duplicate { .. } => "duplicate",
                IntakeRecord::Conflict { .. } => "conflict",
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "accepted",
                "accepted",
                "accepted",
                "duplicate",
                "conflict",
                "duplicate",
                "accepted",
                "duplicate"
            ],
            "{}",
            store.backend()
        );
        seen.push(intake_rows(store).await);
    }
    assert!(seen[0].len() > 10, "{:#?}", seen[0]);
    assert_eq!(seen[0], seen[1]);

    let mut writer = postgres.intake_writer();
    writer.record_batch(&[delivery("k5", "f5", b"five")]).await.unwrap();
    assert!(writer.holds_connection());
    let admin = PgPool::connect(&url).await.unwrap();
    let cut: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .fetch_all(&admin)
    .await
    .unwrap();
    assert!(!cut.is_empty());
    admin.close().await;
    let error = writer.record_batch(&[delivery("k6", "f6", b"six")]).await.unwrap_err();
    assert!(error.is_unavailable(), "{error}");
    assert!(!writer.holds_connection());
    let again = writer.record_batch(&[delivery("k6", "f6", b"six")]).await.unwrap();
    assert!(matches!(again[..], [IntakeRecord::Accepted { .. }]), "{again:?}");

    // A statement the database refuses (two items of one event with one target break
    // `UNIQUE (event_id, target)`) leaves nothing behind: the event, its items and evidence are
    // one statement. The writer gives that connection up too.
    let mut twice = delivery("k7", "f7", b"seven");
    twice.outbox[1].target = "a".into();
    let error = writer.record_batch(&[twice]).await.unwrap_err();
    assert!(!error.is_unavailable(), "{error}");
    assert!(!writer.holds_connection());
    let keys: Vec<String> =
        postgres.events("p").await.unwrap().into_iter().map(|e| e.key).collect();
    assert!(!keys.contains(&"k7".to_owned()) && keys.contains(&"k6".to_owned()), "{keys:?}");
    let evidence: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM deliveries WHERE event_key = 'k7'")
            .fetch_one(match &postgres {
                Store::Postgres(pool) => pool,
                Store::Sqlite { .. } => unreachable!("the PostgreSQL store"),
            })
            .await
            .unwrap();
    assert_eq!(evidence, 0);

    sqlite.close().await;
    postgres.close().await;
    drop_postgres_database(&url).await;
}

/// On PostgreSQL the outbox's state indexes hold unfinished (or dead) writes only (migration
/// 0006), and a query uses one only if the planner can prove its predicate from the query's
/// own `state` condition. Each query that ranges over the outbox by state must be planned as
/// a range of the index meant for it, never as a scan of a table that is mostly finished
/// writes: a query rewritten so that the predicate no longer follows would fail here.
#[tokio::test]
async fn postgres_ranges_over_the_outbox_by_state_through_its_partial_indexes() {
    let url = fresh_postgres_database().await;
    let store = Store::connect(&url, &StoreOptions::default()).await.unwrap();
    let Store::Postgres(pool) = &store else { unreachable!("a PostgreSQL URL") };
    // 50,000 writes: 48,000 done, 1,000 dead, 1,000 pending (half of them due), of which 100
    // are in flight (named by their entities).
    for statement in [
        "INSERT INTO events (pipeline, scope, event_key, fingerprint, received_at_ms, headers, body, state, \
           delivery_count, last_delivery_at_ms) \
         SELECT 'p', '', 'k' || g, 'f', g, '[]', '{}', 'done', 1, g FROM generate_series(1, 50000) AS g",
        "INSERT INTO outbox (event_id, pipeline, target, target_index, entity, state, next_attempt_at_ms, \
           created_at_ms, siblings) \
         SELECT g, 'p', 't', 0, 'E' || (g % 5000), CASE WHEN g <= 48000 THEN 'done' WHEN g <= 49000 THEN 'dead' \
           ELSE 'pending' END, g, g, 1 FROM generate_series(1, 50000) AS g",
        "INSERT INTO entities (pipeline, target, entity, lease_owner, lease_expires_at_ms, in_flight_item, \
           in_flight_owner, in_flight_since_ms) \
         SELECT 'p', 't', 'E' || (g % 5000), 'w', 60000, g, 'w', g FROM generate_series(49901, 50000) AS g",
        "ANALYZE",
    ] {
        sqlx::query(statement).execute(pool).await.unwrap();
    }
    let explain = |sql: &str| format!("EXPLAIN (COSTS OFF) {sql}");
    // The lease's walks take the time and a limit; the gauges take nothing, so they are
    // wrapped to take the same two parameters and the same binding serves every statement.
    let plan = |sql: String| async move {
        let lines: Vec<String> = sqlx::query_scalar(&explain(&sql))
            .bind(49_450_i64)
            .bind(100_i64)
            .fetch_all(pool)
            .await
            .unwrap();
        lines.join("\n")
    };
    fn wrap(sql: &str) -> String {
        format!("SELECT * FROM ({sql}) AS q WHERE $1 > 0 AND $2 > 0")
    }
    // The unfinished rows are in two indexes with one predicate: either serves a count.
    let unfinished: &[&str] = &["outbox_due", "outbox_entity"];
    let mut plans = Vec::new();
    for (what, sql, indexes) in [
        ("the lease's walks", delivery::lease_candidates_sql(), &["outbox_due"][..]),
        ("writes to do", wrap(delivery::UNFINISHED_COUNT), unfinished),
        ("dead writes", wrap(delivery::DEAD_COUNT), &["outbox_dead"]),
        ("the oldest write to do", wrap(delivery::OLDEST_UNFINISHED), unfinished),
        ("each target's backlog", wrap(operate::TARGET_BACKLOG), &["outbox_dead"]),
    ] {
        plans.push((what, plan(sql).await, indexes));
    }
    // A page of dead letters, as an operator's first page asks for it: every pipeline.
    let page: Vec<String> = sqlx::query_scalar(&explain(operate::DEAD_LETTERS))
        .bind(None::<String>)
        .bind(None::<String>)
        .bind(i64::MAX)
        .bind(50_i64)
        .fetch_all(pool)
        .await
        .unwrap();
    plans.push(("a page of dead letters", page.join("\n"), &["outbox_dead"]));
    for (what, plan, indexes) in &plans {
        assert!(!plan.contains("Seq Scan on outbox"), "{what} scans the outbox:\n{plan}");
        assert!(
            indexes.iter().any(|index| plan.contains(&format!(" on {index}"))
                || plan.contains(&format!(" using {index}"))),
            "{what} uses none of {indexes:?}:\n{plan}"
        );
    }
    // The head rule (an entity's other unfinished writes) probes the entity index.
    let (_, walks, _) = &plans[0];
    assert!(walks.contains("outbox_entity"), "the head rule probes the entity index:\n{walks}");
    store.close().await;
    drop_postgres_database(&url).await;
}

/// Slices of one budget across processes: an even share each, a shrink freeing calls only
/// once its holder's log says they left the window, and an expired slice counting for one
/// window past its end. On SQLite the one process holds the whole budget.
#[tokio::test]
async fn budget_slices_never_sum_past_the_budget() {
    on_both_backends(|store| async move {
        let postgres = matches!(store, Store::Postgres(_));
        let slice = |owner: &'static str, in_window_ms: Vec<i64>| SliceRequest {
            connector: "hubspot",
            owner,
            budget_calls: 100,
            window_ms: 400,
            lease_ms: 500,
            in_window_ms,
        };
        let a = store.lease_budget_slice(&slice("a", vec![])).await.unwrap();
        assert_eq!(a, 100, "alone, the whole budget");
        if !postgres {
            return;
        }
        let b = store.lease_budget_slice(&slice("b", vec![])).await.unwrap();
        assert_eq!(b, 0, "a's calls may all be in the window");
        // a shrinks to half; 70 of its 100 calls stay in the window 300 ms more, so the 50 it
        // gives up are free only then.
        let a_log: Vec<i64> = (0..100).map(|i| if i < 30 { 0 } else { 300 }).collect();
        assert_eq!(store.lease_budget_slice(&slice("a", a_log)).await.unwrap(), 50);
        assert_eq!(store.lease_budget_slice(&slice("b", vec![])).await.unwrap(), 0);
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert_eq!(store.lease_budget_slice(&slice("a", vec![])).await.unwrap(), 50);
        assert_eq!(store.lease_budget_slice(&slice("b", vec![])).await.unwrap(), 50);
        // b stops renewing: its slice counts until a window past its lease, then a may grow.
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(
            store.lease_budget_slice(&slice("a", vec![])).await.unwrap(),
            50,
            "b's calls may be out"
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(store.lease_budget_slice(&slice("a", vec![])).await.unwrap(), 100);
    })
    .await;
}

/// Signature refusals add up per (pipeline, code, reason), keep their first and last time and
/// the last URL, and each pipeline keeps its newest `REFUSALS_PER_PIPELINE_MAX` reasons.
#[tokio::test]
async fn signature_refusals_add_up_and_stay_bounded() {
    on_both_backends(|store| async move {
        let count = |reason: &str, at: i64, refusals: i64| RefusalCount {
            pipeline: "github".into(),
            code: "signature_mismatch".into(),
            reason: reason.into(),
            url: None,
            first_at_ms: at,
            last_at_ms: at,
            refusals,
        };
        store.record_refusals(&[count("wrong secret", 2_000, 3)]).await.unwrap();
        let mut later = count("wrong secret", 5_000, 2);
        later.url = Some("https://hooks.example/hooks/github".into());
        store.record_refusals(&[later, count("wrong secret", 1_000, 1)]).await.unwrap();
        let rows = store.signature_refusals(Some("github"), 10).await.unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!((rows[0].first_at_ms, rows[0].last_at_ms, rows[0].refusals), (1_000, 5_000, 6));
        assert_eq!(rows[0].url.as_deref(), Some("https://hooks.example/hooks/github"));

        let max = REFUSALS_PER_PIPELINE_MAX;
        let flood: Vec<_> =
            (0..max + 5).map(|i| count(&format!("forged {i}"), 10_000 + i, 1)).collect();
        store.record_refusals(&flood).await.unwrap();
        let rows = store.signature_refusals(Some("github"), 1_000).await.unwrap();
        assert_eq!(rows.len() as i64, max, "bounded per pipeline");
        assert_eq!(rows[0].reason, format!("forged {}", max + 4), "newest first");
        assert!(rows.iter().all(|r| r.reason != "wrong secret"), "the oldest went first");
        assert!(store.signature_refusals(Some("stripe"), 10).await.unwrap().is_empty());
        // A reason not seen for longer than rows are kept goes at the next write.
        let mut month_later = count("new reason", 10_000 + max + 5 + REFUSALS_KEPT_MS + 1, 1);
        month_later.pipeline = "stripe".into();
        store.record_refusals(&[month_later]).await.unwrap();
        assert!(store.signature_refusals(Some("github"), 1_000).await.unwrap().is_empty());
        assert_eq!(store.signature_refusals(Some("stripe"), 10).await.unwrap().len(), 1);
    })
    .await;
}
