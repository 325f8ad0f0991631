//! Source refresh end to end: `hookgate serve` as a child process, a real SQLite file or
//! PostgreSQL database, the mock CRM, and a fake Stripe API on loopback that the pipelines'
//! `refresh:` reach through `source_origins`. What was written is read from the CRM's own
//! effect log; what was fetched, from the fake's request log and the attempts' evidence.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::Duration;

use crate::support::*;
use hookgate_connector_mock::Effect;
use hookgate_fakes::stripe::{FakeStripe, SECRET_KEY, SourceFault};
use hookgate_store::{AttemptRecord, ItemState, Store, WriteView};
use hookgate_verify::{Algorithm, Encoding, compute_mac};
use reqwest::StatusCode;
use serde_json::json;

const STRIPE_SECRET: &str = "stripe-e2e-secret";
const PAYLOAD_KEY: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";

struct Setup {
    dir: tempfile::TempDir,
    stripe: FakeStripe,
}

impl Setup {
    async fn new() -> Setup {
        let setup = Setup { dir: tempfile::tempdir().unwrap(), stripe: FakeStripe::start().await };
        let settings = json!({"path": setup.mock_path(), "idempotency": false});
        std::fs::write(
            setup.instances(),
            format!(
                "connectors:\n  - name: crm\n    kind: mock\n    settings: {settings}\n\
                 source_origins:\n  https://api.stripe.com: {}\n\
                 payload_encryption:\n  keys:\n    - id: k1\n      secret: {{ env: TEST_PAYLOAD_KEY }}\n",
                setup.stripe.base_url
            ),
        )
        .unwrap();
        setup
    }

    fn mock_path(&self) -> String {
        self.dir.path().join("crm.sqlite").display().to_string()
    }

    fn instances(&self) -> PathBuf {
        self.dir.path().join("hookgate.yaml")
    }

    fn server(&self, database: &Database) -> ServerBuilder {
        ServerBuilder::new(database.url())
            .pipelines(root().join("tests/sources"))
            .instances(self.instances())
            .workers(2)
            .env("STRIPE_API_KEY", SECRET_KEY)
            .env("TEST_PAYLOAD_KEY", PAYLOAD_KEY)
    }

    async fn effects(&self) -> Vec<Effect> {
        let crm = mock_crm(&self.mock_path()).await;
        let effects = crm.effects().await.unwrap();
        crm.close().await;
        effects
    }
}

/// A Stripe-signed customer event for `pipeline`, carrying `email` as the event saw it.
fn customer_event(
    pipeline: &'static str,
    id: &str,
    created: i64,
    customer: &str,
    email: &str,
) -> Delivery {
    let body = format!(
        r#"{{"id":"{id}","object":"event","created":{created},"type":"customer.updated","data":{{"object":{{"id":"{customer}","email":"{email}"}}}}}}"#
    );
    let t = now_secs();
    let mac = compute_mac(
        Algorithm::HmacSha256,
        STRIPE_SECRET.as_bytes(),
        &[format!("{t}.").as_bytes(), body.as_bytes()],
    );
    Delivery {
        pipeline,
        headers: vec![(
            "Stripe-Signature".into(),
            format!("t={t},v1={}", Encoding::Hex.encode(&mac)),
        )],
        body: body.into_bytes(),
    }
}

async fn accept(client: &reqwest::Client, server: &Server, delivery: &Delivery) -> i64 {
    let response = delivery.send(client, server).await;
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    response.json::<serde_json::Value>().await.unwrap()["event_id"].as_i64().unwrap()
}

/// Waits until the event's one write is finished, and returns its state and attempts.
async fn settled(store: &Store, event_id: i64) -> (ItemState, Vec<AttemptRecord>) {
    let finished = eventually(Duration::from_secs(30), || async {
        let items = store.outbox_for(event_id).await.unwrap();
        items.iter().all(|i| matches!(i.state, WriteView::Item(state) if state.is_finished()))
    })
    .await;
    assert!(finished, "event {event_id} still has work after 30 s");
    let item = store.outbox_for(event_id).await.unwrap().remove(0);
    let WriteView::Item(state) = item.state else { panic!("in flight once finished") };
    (state, store.attempts_for(event_id).await.unwrap())
}

fn steps(attempts: &[AttemptRecord]) -> Vec<String> {
    attempts
        .iter()
        .map(|a| {
            format!(
                "{}:{}",
                a.action.as_deref().unwrap_or("-"),
                a.outcome.map_or("-", hookgate_store::AttemptOutcome::as_str)
            )
        })
        .collect()
}

/// A sender without versions: a delivery that arrives late writes the customer as the
/// source has it now, never the older state the late event carried; a customer that is gone
/// (404, or Stripe's `deleted: true`) is skipped with the fetch as evidence.
#[tokio::test]
async fn a_late_delivery_writes_the_freshly_fetched_state_and_a_gone_source_is_skipped() {
    for database in Database::both().await {
        let setup = Setup::new().await;
        let client = client();
        let server = setup.server(&database).start();
        let store = database.store().await;
        setup.stripe.put_customer("cus_1", json!({"email": "new@example.com"}));

        let newer = accept(
            &client,
            &server,
            &customer_event("customers", "evt_2", 200, "cus_1", "new@example.com"),
        )
        .await;
        assert_eq!(settled(&store, newer).await.0, ItemState::Done);
        // The older event, delivered late, carries the old address.
        let late = accept(
            &client,
            &server,
            &customer_event("customers", "evt_1", 100, "cus_1", "old@example.com"),
        )
        .await;
        let (late_state, late_attempts) = settled(&store, late).await;
        assert_eq!(late_state, ItemState::Done);
        assert_eq!(steps(&late_attempts), ["refresh:fetched", "upsert:updated"]);
        // The fetch is kept as evidence, sealed like the payload it came for.
        assert_eq!(late_attempts[0].sealed_with.as_deref(), Some("k1"));
        let sealed = late_attempts[0].excerpt.as_deref().unwrap();
        assert!(!sealed.contains("example.com"), "{sealed}");
        let effects = setup.effects().await;
        assert_eq!(effects.len(), 2, "{effects:?}");
        for effect in &effects {
            assert_eq!(effect.fields["email"], "new@example.com", "{effect:?}");
        }

        // Gone: never existed (404), or deleted (`gone_if`). Skipped, nothing written.
        let missing = accept(
            &client,
            &server,
            &customer_event("customers", "evt_3", 300, "cus_missing", "x@example.com"),
        )
        .await;
        setup.stripe.delete_customer("cus_1");
        let deleted = accept(
            &client,
            &server,
            &customer_event("customers", "evt_4", 400, "cus_1", "new@example.com"),
        )
        .await;
        for (event, status) in [(missing, Some(404)), (deleted, Some(200))] {
            let (state_name, attempts) = settled(&store, event).await;
            assert_eq!(state_name, ItemState::SkippedStale);
            assert_eq!(steps(&attempts), ["refresh:source_gone"]);
            assert_eq!(attempts[0].status, status);
            assert!(attempts[0].error.as_deref().unwrap().contains("gone"), "{attempts:?}");
        }
        assert_eq!(setup.effects().await.len(), 2, "nothing written for a gone customer");
        let show = |id: i64| {
            let output = std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
                .args(["events", "show", &id.to_string(), "--database-url", database.url()])
                .arg("--pipelines")
                .arg(root().join("tests/sources"))
                .arg("--instances")
                .arg(setup.instances())
                .env("TEST_PAYLOAD_KEY", PAYLOAD_KEY)
                .output()
                .unwrap();
            String::from_utf8_lossy(&output.stdout).into_owned()
        };
        let story = show(missing);
        assert!(story.contains("refresh  source_gone  status 404"), "{story}");
        assert!(story.contains("No such customer: 'cus_missing'"), "{story}");
        let story = show(late);
        assert!(story.contains("refresh  fetched  status 200"), "{story}");
        assert!(story.contains(r#"answer: {"email":"[redacted]""#), "{story}");
        assert!(!story.contains("new@example.com"), "masked per `redact.source`: {story}");
        // The source's credentials are nowhere: not in evidence, not in the database.
        assert!(!story.contains(SECRET_KEY), "{story}");
        if let Database::Sqlite { dir, .. } = &database {
            for entry in std::fs::read_dir(dir.path()).unwrap() {
                let bytes = std::fs::read(entry.unwrap().path()).unwrap();
                assert!(!bytes.windows(SECRET_KEY.len()).any(|w| w == SECRET_KEY.as_bytes()));
                assert!(!bytes.windows(15).any(|w| w == b"new@example.com"), "sealed at rest");
            }
        }
        store.close().await;
        drop(server);
        database.cleanup().await;
    }
}

/// Faults of the source are classified like a CRM's: a 429 waits for its `Retry-After`, a
/// fetch that outlives the refresh timeout and an answer that is not JSON are retried, an
/// answer larger than `max_bytes` and a wrong key are kept as evidence; a fetched version
/// orders the write (not newer than what was applied: skipped; newer: applied as written).
#[tokio::test]
async fn source_faults_are_classified_and_the_fetched_version_orders_the_write() {
    let database = Database::sqlite().await;
    let setup = Setup::new().await;
    let client = client();
    let server = setup.server(&database).start();
    let store = database.store().await;
    setup.stripe.put_customer("cus_1", json!({"email": "a@example.com", "updated": 300}));

    // 429 with Retry-After 1, then a fetch slower than the 500 ms timeout, then not JSON.
    setup.stripe.push_fault(SourceFault::Status { status: 429, retry_after: Some(1) });
    setup.stripe.push_fault(SourceFault::Delay(Duration::from_secs(2)));
    setup.stripe.push_fault(SourceFault::NotJson);
    let event = accept(
        &client,
        &server,
        &customer_event("customers", "evt_f1", 100, "cus_1", "a@example.com"),
    )
    .await;
    let (state_name, attempts) = settled(&store, event).await;
    assert_eq!(state_name, ItemState::Done, "{attempts:#?}");
    assert_eq!(
        steps(&attempts),
        [
            "refresh:rate_limited",
            "refresh:retryable",
            "refresh:retryable",
            "refresh:fetched",
            "upsert:created"
        ]
    );
    let waited = attempts[1].started_at_ms - attempts[0].finished_at_ms.unwrap();
    assert!(waited >= 1000, "the retry-after of 1 s was honoured: {waited} ms");
    assert!(attempts[1].error.as_deref().unwrap().contains("no answer"), "{attempts:?}");
    assert!(attempts[2].error.as_deref().unwrap().contains("not a JSON object"), "{attempts:?}");

    // Larger than max_bytes: dead-lettered, with the start of the answer as evidence.
    setup.stripe.push_fault(SourceFault::Huge(8192));
    let huge = accept(
        &client,
        &server,
        &customer_event("customers", "evt_f2", 200, "cus_1", "a@example.com"),
    )
    .await;
    let (state_name, attempts) = settled(&store, huge).await;
    assert_eq!(state_name, ItemState::Dead);
    assert_eq!(steps(&attempts), ["refresh:rejected"]);
    assert!(
        attempts[0].error.as_deref().unwrap().contains("larger than max_bytes (4096)"),
        "{attempts:?}"
    );
    // The start of the answer is kept (sealed, as every answer is here).
    assert!(attempts[0].excerpt.is_some() && attempts[0].sealed_with.as_deref() == Some("k1"));

    // The fetched version orders: v300 written; an event older than it never fetches; a newer
    // event that finds the source unchanged writes nothing; once the source moves on, it does.
    let first = accept(
        &client,
        &server,
        &customer_event("versioned", "evt_v1", 100, "cus_1", "a@example.com"),
    )
    .await;
    assert_eq!(settled(&store, first).await.0, ItemState::Done);
    let asked = setup.stripe.requests().len();
    let older = accept(
        &client,
        &server,
        &customer_event("versioned", "evt_v2", 250, "cus_1", "a@example.com"),
    )
    .await;
    let (state_name, attempts) = settled(&store, older).await;
    assert_eq!(
        (state_name, steps(&attempts)),
        (ItemState::SkippedStale, vec!["version_check:skipped_stale".to_owned()])
    );
    assert_eq!(setup.stripe.requests().len(), asked, "a stale write fetches nothing");
    let unchanged = accept(
        &client,
        &server,
        &customer_event("versioned", "evt_v3", 400, "cus_1", "b@example.com"),
    )
    .await;
    let (state_name, attempts) = settled(&store, unchanged).await;
    assert_eq!(state_name, ItemState::SkippedStale, "{attempts:#?}");
    assert_eq!(steps(&attempts), ["refresh:fetched", "version_check:skipped_stale"]);
    assert!(attempts[1].error.as_deref().unwrap().contains("version 300 is not newer than 300"));
    setup.stripe.put_customer("cus_1", json!({"email": "b@example.com", "updated": 450}));
    let moved = accept(
        &client,
        &server,
        &customer_event("versioned", "evt_v4", 350, "cus_1", "b@example.com"),
    )
    .await;
    let (state_name, attempts) = settled(&store, moved).await;
    assert_eq!(state_name, ItemState::Done, "{attempts:#?}");
    let guard = store.entity_guard("versioned", "contact", "cus_1").await.unwrap();
    assert_eq!(guard.applied.unwrap().text, "450", "the write applied the fetched version");

    // A wrong key: misconfigured, retried (a fixed key lets the work through), evidence kept.
    drop(server);
    let wrong_key = setup.server(&database).env("STRIPE_API_KEY", "sk_test_wrong").start();
    let refused = accept(
        &client,
        &wrong_key,
        &customer_event("customers", "evt_k", 500, "cus_1", "b@example.com"),
    )
    .await;
    let (state_name, attempts) = settled(&store, refused).await;
    assert_eq!(state_name, ItemState::Dead);
    assert!(steps(&attempts).iter().all(|s| s == "refresh:misconfigured"), "{attempts:#?}");
    assert_eq!(attempts[0].status, Some(401));
    let writes: Vec<String> =
        setup.effects().await.iter().map(|e| e.fields["email"].clone()).collect();
    assert_eq!(writes, ["a@example.com", "a@example.com", "b@example.com"]);
    store.close().await;
    database.cleanup().await;
}
