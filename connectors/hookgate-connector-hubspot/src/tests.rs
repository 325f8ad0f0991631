//! Against the fake HubSpot: the conformance suite, then each documented edge.

use std::sync::Arc;
use std::time::Duration;

use hookgate_connector::conformance::{self, Fault, Harness};
use hookgate_fakes::hubspot::{self as fake, FakeHubSpot};

use super::*;

fn connector(fake: &FakeHubSpot, token: &str) -> HubSpot {
    let settings = HubSpotSettings {
        base_url: fake.base_url.clone(),
        http: HttpSettings { request_timeout_ms: 1000, ..HttpSettings::default() },
    };
    HubSpot::new(settings, &Credentials::from([("token".to_owned(), Secret::new(token))])).unwrap()
}

fn contact(email: &str, name: &str) -> UpsertRequest {
    UpsertRequest {
        object: "contacts".into(),
        external_id_field: "email".into(),
        external_id_value: email.into(),
        fields: BTreeMap::from([("firstname".to_owned(), name.to_owned())]),
        operation: Operation::Upsert,
        idempotency_key: "hookgate-1-contact".into(),
    }
}

struct HubSpotHarness {
    fake: FakeHubSpot,
}

impl Harness for HubSpotHarness {
    fn connector(&self, fault: Option<Fault>) -> BoxFuture<'_, Arc<dyn Connector>> {
        Box::pin(async move {
            let mut token = fake::TOKEN;
            {
                let mut state = self.fake.lock();
                state.faults.clear();
                state.max_per_window = 1000;
                match fault {
                    None => {}
                    Some(Fault::Unavailable) => {
                        state.faults.push_back(fake::Fault::ServerError(502))
                    }
                    Some(Fault::RateLimited) => state.max_per_window = 0,
                    Some(Fault::Invalid) => state.faults.push_back(fake::Fault::Validation),
                    Some(Fault::LostResponse) => {
                        state.faults.push_back(fake::Fault::LostResponse(Duration::from_secs(3)))
                    }
                    Some(Fault::BadCredentials) => token = "pat-na1-revoked",
                }
            }
            Arc::new(connector(&self.fake, token)) as Arc<dyn Connector>
        })
    }

    fn object(&self) -> (&str, &str) {
        ("contacts", "external_id")
    }

    fn field(&self) -> &str {
        "firstname"
    }
}

#[tokio::test]
async fn hubspot_passes_the_conformance_suite() {
    let harness = HubSpotHarness { fake: FakeHubSpot::start().await };
    conformance::upsert_semantics(&harness).await;
    for fault in Fault::ALL {
        conformance::fault_maps_to_its_class(&harness, fault).await;
        harness.connector(None).await;
    }
}

#[tokio::test]
async fn the_new_flag_says_created_or_updated() {
    let fake = FakeHubSpot::start().await;
    let hs = connector(&fake, fake::TOKEN);
    let created = hs.upsert(&contact("ada@example.com", "Ada")).await.unwrap();
    let updated = hs.upsert(&contact("ada@example.com", "Augusta")).await.unwrap();
    assert!(created.created && !updated.created);
    assert_eq!(created.record_id, updated.record_id);
    assert_eq!(fake.records("contacts").len(), 1);
    assert_eq!(fake.records("contacts")[0].properties["firstname"], "Augusta");
    assert_eq!(updated.answer.meta["x-hubspot-ratelimit-interval-milliseconds"], "10000");
}

#[tokio::test]
async fn a_429_waits_for_retry_after_or_else_the_window() {
    let fake = FakeHubSpot::start().await;
    let hs = connector(&fake, fake::TOKEN);
    fake.lock().max_per_window = 2;
    hs.upsert(&contact("a@example.com", "A")).await.unwrap();
    hs.upsert(&contact("b@example.com", "B")).await.unwrap();
    let error = hs.upsert(&contact("c@example.com", "C")).await.unwrap_err();
    assert_eq!(error.class(), "rate_limited");
    assert_eq!(
        error.retry_after(),
        Some(Duration::from_secs(10)),
        "no Retry-After: the whole window"
    );
    assert!(error.answer().excerpt.as_deref().unwrap().contains("RATE_LIMITS"));

    fake.lock().retry_after_on_429 = true;
    let error = hs.upsert(&contact("c@example.com", "C")).await.unwrap_err();
    let wait = error.retry_after().unwrap();
    assert!(
        wait >= Duration::from_secs(1) && wait <= Duration::from_secs(10),
        "Retry-After wins: {wait:?}"
    );
    assert_eq!(fake.records("contacts").len(), 2, "a 429 writes nothing");
}

#[tokio::test]
async fn an_id_property_without_unique_values_is_rejected() {
    let fake = FakeHubSpot::start().await;
    let hs = connector(&fake, fake::TOKEN);
    let request = UpsertRequest { external_id_field: "hs_object_id".into(), ..contact("1", "A") };
    let error = hs.upsert(&request).await.unwrap_err();
    assert_eq!(error.class(), "rejected");
    assert!(error.to_string().contains("non-unique"), "{error}");
    let read_only = UpsertRequest {
        fields: BTreeMap::from([("createdate".into(), "x".into())]),
        ..contact("a@example.com", "A")
    };
    assert_eq!(hs.upsert(&read_only).await.unwrap_err().class(), "rejected");
}

#[tokio::test]
async fn lookup_sees_a_write_at_once_although_search_lags() {
    let fake = FakeHubSpot::start().await;
    fake.lock().search_lag = Duration::from_secs(10);
    let hs = connector(&fake, fake::TOKEN);
    hs.upsert(&contact("ada@example.com", "Ada")).await.unwrap();
    // Search would miss it for ten seconds, so reconciliation must not use search.
    hookgate_connector_http::install_crypto_provider();
    let client = reqwest::Client::new();
    let searched: serde_json::Value = client
        .post(format!("{}/crm/v3/objects/contacts/search", fake.base_url))
        .bearer_auth(fake::TOKEN)
        .json(&json!({"filterGroups": [{"filters": [{"propertyName": "email", "operator": "EQ", "value": "ada@example.com"}]}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(searched["total"], 0, "search lags");
    let found = hs.lookup(&(&contact("ada@example.com", "")).into()).await.unwrap();
    let LookupOutcome::Found { fields, .. } = found else { panic!("lookup must see the write") };
    assert_eq!(fields["firstname"], "Ada");
}

#[tokio::test]
async fn update_only_never_creates() {
    let fake = FakeHubSpot::start().await;
    let hs = connector(&fake, fake::TOKEN);
    let update =
        UpsertRequest { operation: Operation::UpdateOnly, ..contact("ada@example.com", "Ada") };
    assert_eq!(hs.upsert(&update).await.unwrap_err().class(), "rejected");
    hs.upsert(&contact("ada@example.com", "Ada")).await.unwrap();
    let outcome = hs
        .upsert(&UpsertRequest {
            fields: BTreeMap::from([("firstname".into(), "A.".into())]),
            ..update
        })
        .await
        .unwrap();
    assert!(!outcome.created);
    assert_eq!(fake.records("contacts")[0].properties["firstname"], "A.");
}

#[tokio::test]
async fn auth_failures_are_misconfigurations_and_server_errors_are_retried() {
    let fake = FakeHubSpot::start().await;
    let error =
        connector(&fake, "pat-na1-wrong").upsert(&contact("a@example.com", "A")).await.unwrap_err();
    assert_eq!((error.class(), error.answer().status), ("misconfigured", Some(401)));
    fake.lock().scopes_granted = false;
    let error =
        connector(&fake, fake::TOKEN).upsert(&contact("a@example.com", "A")).await.unwrap_err();
    assert_eq!((error.class(), error.answer().status), ("misconfigured", Some(403)));
    fake.lock().scopes_granted = true;
    fake.push_fault(fake::Fault::ServerError(503));
    assert_eq!(
        connector(&fake, fake::TOKEN)
            .upsert(&contact("a@example.com", "A"))
            .await
            .unwrap_err()
            .class(),
        "retryable"
    );
}

#[test]
fn plain_http_is_refused_for_real_endpoints() {
    let settings =
        HubSpotSettings { base_url: "http://api.hubapi.com".into(), http: HttpSettings::default() };
    let credentials = Credentials::from([("token".to_owned(), Secret::new("t"))]);
    assert!(HubSpot::new(settings, &credentials).unwrap_err().0.contains("must use https"));
}
