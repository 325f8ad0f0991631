//! Deliveries through the gateway into the fake Salesforce and the fake HubSpot: the shipped
//! `shopify` and `signups` pipelines, `hookgate serve` as a child process with workers, and the
//! fakes in this process. One record per external id with the expected values, including
//! after a token expiry, a 429 burst and a lost response.

// Test helpers panic on a broken setup, which is what a test should do.
#![allow(clippy::unwrap_used)]

// Shared by every end-to-end test binary; each uses only a part of it.
#[allow(dead_code)]
#[path = "../support/mod.rs"]
mod support;

use std::time::Duration;

use hookgate_fakes::hubspot::{self, FakeHubSpot};
use hookgate_fakes::salesforce::{self, FakeSalesforce};
use hookgate_store::Store;
use support::*;

/// An instances file pointing `salesforce` and `hubspot` at the fakes; the credentials are
/// the ones the test server's environment carries.
fn instances(dir: &std::path::Path, sf: &FakeSalesforce, hs: &FakeHubSpot) -> std::path::PathBuf {
    let path = dir.join("hookgate.yaml");
    let text = format!(
        "connectors:\n  - name: salesforce\n    kind: salesforce\n    settings:\n      login_url: {}\n      api_version: \"60.0\"\n    credentials:\n      client_id: {{ env: SALESFORCE_CLIENT_ID }}\n      client_secret: {{ env: SALESFORCE_CLIENT_SECRET }}\n  - name: hubspot\n    kind: hubspot\n    settings:\n      base_url: {}\n    credentials:\n      token: {{ env: HUBSPOT_TOKEN }}\n",
        sf.base_url, hs.base_url
    );
    std::fs::write(&path, text).unwrap();
    path
}

async fn drained(store: &Store) {
    let done = eventually(Duration::from_secs(90), || async {
        store.unfinished_items().await.unwrap() == 0
    })
    .await;
    assert!(done, "writes still pending after 90 s");
}

async fn send_all(server: &Server, deliveries: &[Delivery]) {
    let client = client();
    for delivery in deliveries {
        let status = delivery.send(&client, server).await.status();
        assert!(status.is_success(), "{status}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_reach_salesforce_and_hubspot_once_each_through_faults() {
    let sf = FakeSalesforce::start().await;
    let hs = FakeHubSpot::start().await;
    {
        let mut state = sf.lock();
        state.client_id = "e2e-client".into();
        state.client_secret = "e2e-secret".into();
    }
    hs.lock().token = "pat-na1-e2e".into();
    let dir = tempfile::tempdir().unwrap();
    let pipelines = dir.path().join("pipelines");
    std::fs::create_dir(&pipelines).unwrap();
    for name in ["shopify.yaml", "signups.yaml"] {
        std::fs::copy(root().join("pipelines").join(name), pipelines.join(name)).unwrap();
    }
    let database = Database::sqlite().await;
    let server = ServerBuilder::new(database.url())
        .pipelines(pipelines)
        .instances(instances(dir.path(), &sf, &hs))
        .workers(4)
        .arg("--call-timeout-ms")
        .arg("1500")
        .start();
    let store = database.store().await;

    // Salesforce: five customers, then an expired token, then updates; one answer lost.
    let first: Vec<Delivery> = (1..=5)
        .map(|i| {
            shopify_customer(
                &format!("w-{i}"),
                1000 + i,
                "2026-03-01T10:00:00Z",
                &format!("First{i}"),
                &format!("c{i}@example.com"),
            )
        })
        .collect();
    send_all(&server, &first).await;
    drained(&store).await;
    assert_eq!(sf.lock().token_requests, 1);
    sf.expire_tokens();
    sf.push_fault(salesforce::Fault::LostResponse(Duration::from_secs(3)));
    let updates: Vec<Delivery> = (1..=5)
        .map(|i| {
            shopify_customer(
                &format!("w-u{i}"),
                1000 + i,
                "2026-03-01T11:00:00Z",
                &format!("Renamed{i}"),
                &format!("c{i}@example.com"),
            )
        })
        .collect();
    send_all(&server, &updates).await;
    drained(&store).await;

    let contacts = sf.records("Contact");
    assert_eq!(contacts.len(), 5, "one record per Shopify customer id");
    for i in 1..=5u64 {
        let id = (1000 + i).to_string();
        let contact =
            contacts.iter().find(|c| c.fields["Shopify_Customer_Id__c"] == id.as_str()).unwrap();
        assert_eq!(contact.fields["FirstName"], format!("Renamed{i}"));
        assert_eq!(contact.fields["Email"], format!("c{i}@example.com"));
        assert_eq!(contact.fields["Shopify_Shop__c"], "e2e-shop.myshopify.com");
    }
    assert_eq!(
        sf.writes().len(),
        10,
        "ten writes for ten events: the lost answer was reconciled, not rewritten"
    );
    assert_eq!(sf.lock().token_requests, 2, "the expired token was refreshed once");

    // HubSpot: a burst of twelve sign-ups against three requests per second; one answer lost.
    {
        let mut state = hs.lock();
        state.max_per_window = 3;
        state.window_length = Duration::from_secs(1);
        state.retry_after_on_429 = true;
    }
    hs.push_fault(hubspot::Fault::LostResponse(Duration::from_secs(3)));
    let signups: Vec<Delivery> = (1..=12)
        .map(|i| {
            signup(
                &format!("evt-{i}"),
                &format!("User{i}@Example.com"),
                &format!("User{i}"),
                "team",
            )
        })
        .collect();
    send_all(&server, &signups).await;
    drained(&store).await;

    let contacts = hs.records("contacts");
    assert_eq!(contacts.len(), 12, "one record per email");
    for i in 1..=12 {
        let email = format!("user{i}@example.com");
        let contact = contacts.iter().find(|c| c.properties["email"] == email).unwrap();
        assert_eq!(contact.properties["firstname"], format!("User{i}"));
        assert_eq!(contact.properties["plan"], "team");
    }
    assert_eq!(hs.writes().len(), 12, "twelve writes: no event written twice");
    let mut limited = 0;
    for event in store.events("signups").await.unwrap() {
        limited += store
            .attempts_for(event.id)
            .await
            .unwrap()
            .iter()
            .filter(|a| a.outcome.as_deref() == Some("rate_limited"))
            .count();
    }
    assert!(limited > 0, "the burst met the rate limit");
    for event in store
        .events("signups")
        .await
        .unwrap()
        .iter()
        .chain(store.events("shopify").await.unwrap().iter())
    {
        assert_eq!(event.state, "done", "event {} is {}", event.id, event.state);
    }
    store.close().await;
    drop(server);
    database.cleanup().await;
}
