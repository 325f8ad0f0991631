//! Group commit against a real PostgreSQL: deliveries that share a transaction are answered
//! as if each had its own, and one that the database refuses fails alone.

#![allow(clippy::unwrap_used)]

use hookgate_engine::{GroupCommit, GroupCommitConfig};
use hookgate_store::testing::{drop_postgres_database, fresh_postgres_database};
use hookgate_store::{IntakeRecord, NewDelivery, NewOutboxItem, Store, StoreOptions};

fn delivery(key: &str) -> NewDelivery<'_> {
    NewDelivery {
        pipeline: "p",
        scope: "",
        key,
        fingerprint: "f",
        event_type: None,
        received_at_ms: 1_000,
        headers_json: "{}",
        headers_excerpt_json: "{}",
        body: b"{}",
        sealed_with: None,
        outbox: vec![NewOutboxItem {
            target: "t".into(),
            target_index: 0,
            entity: key.into(),
            version: None,
            version_text: None,
        }],
    }
}

/// On one runtime thread, the 200 deliveries are all queued before the one committer runs,
/// so batches of 64 form, and every tenth delivery has a key PostgreSQL cannot store (a NUL
/// character): each batch fails as a whole, is recorded again one by one, and only the bad
/// deliveries fail. Redeliveries in the same run are duplicates, never new events.
#[tokio::test]
async fn a_delivery_the_database_refuses_fails_alone() {
    let url = fresh_postgres_database().await;
    let store = Store::connect(&url, &StoreOptions::default()).await.unwrap();
    let config = GroupCommitConfig { committers: 1, ..GroupCommitConfig::default() };
    let group = GroupCommit::start(store.clone(), config);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..200 {
        let group = group.clone();
        tasks.spawn(async move {
            let key = if i % 10 == 0 { format!("bad\u{0}{i}") } else { format!("k{}", i % 150) };
            (key.clone(), group.record_delivery(&delivery(&key)).await)
        });
    }
    let (mut accepted, mut duplicates, mut failed) = (0, 0, 0);
    while let Some(joined) = tasks.join_next().await {
        let (key, result) = joined.unwrap();
        match result {
            Ok(IntakeRecord::Accepted { .. }) => accepted += 1,
            Ok(IntakeRecord::Duplicate { .. }) => duplicates += 1,
            Ok(other) => panic!("{key:?}: {other:?}"),
            Err(error) => {
                assert!(key.starts_with("bad"), "{key:?} failed: {error}");
                assert!(!error.is_unavailable(), "{error}");
                failed += 1;
            }
        }
    }
    // 180 good deliveries of 150 keys (k0..k149, the bad indexes skipped): keys 150..199 map
    // back onto 0..49, minus the bad ones.
    assert_eq!(failed, 20);
    assert_eq!(accepted + duplicates, 180);
    let events = store.events("p").await.unwrap();
    assert_eq!(events.len(), accepted);
    assert_eq!(events.iter().map(|e| e.delivery_count).sum::<i64>(), 180);
    store.close().await;
    drop_postgres_database(&url).await;
}
