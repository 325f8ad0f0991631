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
    sqlite.close().await;

    let url = fresh_postgres_database().await;
    let postgres = Store::connect(&url, &StoreOptions::default()).await.unwrap();
    test(postgres.clone()).await;
    postgres.close().await;
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
        body,
        outbox: vec![
            NewOutboxItem {
                target: "a".into(),
                target_index: 0,
                entity: "E".into(),
                version: Some("v1".into()),
            },
            NewOutboxItem {
                target: "b".into(),
                target_index: 1,
                entity: "ext-1".into(),
                version: None,
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

        let outcomes: Vec<(String, Option<Vec<u8>>)> = store
            .deliveries_for(event_id)
            .await
            .unwrap()
            .into_iter()
            .map(|d| (d.outcome, d.body))
            .collect();
        assert_eq!(
            outcomes,
            [
                ("accepted".into(), None),
                ("duplicate".into(), None),
                ("conflict".into(), Some(b"two".to_vec()))
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
        assert_eq!(items[0].state, state::PENDING);
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
        };
        store.record_rejection(&rejected).await.unwrap();
        let kept = store.deliveries("p", "rejected").await.unwrap();
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
        }],
        ..delivery(key, key, b"{}")
    };
    match store.record_intake(&new).await.unwrap() {
        IntakeRecord::Accepted { event_id } => event_id,
        other => panic!("{other:?}"),
    }
}

fn finish(state: &'static str, applied_version: Option<String>) -> Finish {
    Finish {
        state,
        next_attempt_at_ms: 0,
        in_doubt: false,
        record_id: Some("R1".into()),
        error: None,
        action: "upsert",
        outcome: "success".into(),
        status: Some(200),
        excerpt: None,
        meta: None,
        applied_version,
    }
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
        let events: Vec<i64> = leased.iter().map(|i| i.event_id).collect();
        assert_eq!(
            events,
            [a1, b1],
            "the head of each entity only: lowest version, then receipt order"
        );
        assert_eq!(leased[0].attempts, 1);
        assert!(store.lease("w2", 100, 1_000, 10).await.unwrap().is_empty(), "entities held by w1");

        // A1 applied: A3 becomes the head; its version is newer, so it is applied too.
        let a1_item = &leased[0];
        assert!(
            store.finish(a1_item, None, &finish(state::DONE, Some("1".into())), 100).await.unwrap()
        );
        let next = store.lease("w2", 101, 1_000, 10).await.unwrap();
        assert_eq!(next.iter().map(|i| i.event_id).collect::<Vec<_>>(), [a3]);
        assert_eq!(store.event(a1).await.unwrap().unwrap().state, "done");
        assert_eq!(store.entity_version("p", "t", "A").await.unwrap().as_deref(), Some("1"));
        assert!(
            store
                .finish(&next[0], None, &finish(state::DONE, Some("3".into())), 101)
                .await
                .unwrap()
        );
        assert_eq!(store.entity_version("p", "t", "A").await.unwrap().as_deref(), Some("3"));
        // The guard never moves backwards.
        let late = item(&store, "a2", "A", Some("2"), 14).await;
        let leased = store.lease("w3", 102, 1_000, 10).await.unwrap();
        let late_item = leased.iter().find(|i| i.event_id == late).unwrap();
        assert!(
            store
                .finish(late_item, None, &finish(state::SKIPPED_STALE, Some("2".into())), 102)
                .await
                .unwrap()
        );
        assert_eq!(store.entity_version("p", "t", "A").await.unwrap().as_deref(), Some("3"));
    })
    .await;
}

#[tokio::test]
async fn an_expired_lease_passes_to_another_worker_and_fences_the_first() {
    on_both_backends(|store| async move {
        let event = item(&store, "k", "E", None, 10).await;
        let first = store.lease("w1", 100, 200, 1).await.unwrap().remove(0);
        let attempt = store.start_attempt(&first, "upsert", 100).await.unwrap();
        assert!(attempt.is_some());
        assert!(store.lease("w2", 150, 400, 1).await.unwrap().is_empty(), "the lease still holds");

        let second = store.lease("w2", 250, 400, 1).await.unwrap().remove(0);
        assert_eq!(second.event_id, event);
        assert_eq!(second.attempts, 2);
        assert!(second.in_doubt, "the first attempt never finished: look up before writing");
        // The first worker wakes up: its lease is gone, its results are refused.
        assert!(!store.finish(&first, attempt, &finish(state::DONE, None), 260).await.unwrap());
        assert_eq!(store.start_attempt(&first, "upsert", 260).await.unwrap(), None);
        assert!(store.finish(&second, None, &finish(state::DONE, None), 270).await.unwrap());
        let attempts = store.attempts_for(event).await.unwrap();
        assert_eq!(attempts.len(), 1);
        assert_eq!(
            attempts[0].finished_at_ms, None,
            "the crashed attempt stays visible as unfinished"
        );
    })
    .await;
}

#[tokio::test]
async fn dead_letters_do_not_block_their_entity_and_can_be_replayed() {
    on_both_backends(|store| async move {
        let first = item(&store, "k1", "E", Some("1"), 10).await;
        let second = item(&store, "k2", "E", Some("2"), 11).await;
        let leased = store.lease("w", 100, 1_000, 10).await.unwrap().remove(0);
        let dead = Finish { error: Some("rejected: bad".into()), ..finish(state::DEAD, None) };
        assert!(store.finish(&leased, None, &dead, 100).await.unwrap());
        assert_eq!(store.event(first).await.unwrap().unwrap().state, "dead");
        let next = store.lease("w", 101, 1_000, 10).await.unwrap();
        assert_eq!(next[0].event_id, second, "the dead item does not block the entity");
        assert!(
            store
                .finish(&next[0], None, &finish(state::DONE, Some("2".into())), 101)
                .await
                .unwrap()
        );

        assert_eq!(store.dead_events(Some("p")).await.unwrap(), [first]);
        assert_eq!(store.replay_event(first, 200).await.unwrap(), 1);
        assert_eq!(store.event(first).await.unwrap().unwrap().state, "accepted");
        let replayed = store.lease("w", 201, 1_000, 10).await.unwrap().remove(0);
        assert_eq!((replayed.event_id, replayed.attempts), (first, 1));
        let story = store.attempts_for(first).await.unwrap();
        assert_eq!(story.last().unwrap().outcome.as_deref(), Some("replay_requested"));
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
        assert!(store.finish(done, None, &finish(state::DONE, None), 100).await.unwrap());
        store
            .record_rejection(&RejectedDelivery {
                pipeline: "p",
                received_at_ms: 5,
                reason: "x",
                headers_json: "[]",
                body: b"x",
            })
            .await
            .unwrap();

        assert_eq!(store.sweep("p", 500).await.unwrap(), 1);
        assert!(store.event(finished).await.unwrap().is_none());
        assert!(store.event(pending).await.unwrap().is_some(), "never while an item is to do");
        assert!(store.event(recent).await.unwrap().is_some());
        assert!(store.deliveries("p", "rejected").await.unwrap().is_empty());
        // `old-pending` was leased by `w` until 1 000 (`new` was not yet due at 100).
        assert_eq!(store.release_stale_leases(2_000).await.unwrap(), 1);
        assert!(store.outbox_for(pending).await.unwrap()[0].in_doubt);
    })
    .await;
}
