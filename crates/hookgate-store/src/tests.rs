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
                entity: Some("E".into()),
                version: Some("v1".into()),
            },
            NewOutboxItem { target: "b".into(), target_index: 1, entity: None, version: None },
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
        assert_eq!(items[0].entity.as_deref(), Some("E"));
        assert_eq!(items[0].version.as_deref(), Some("v1"));
        assert_eq!(items[0].state, OUTBOX_STATE_PENDING);
        assert_eq!((items[0].attempts, items[0].next_attempt_at_ms), (0, 1_000));
        assert_eq!(items[1].entity, None);
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
