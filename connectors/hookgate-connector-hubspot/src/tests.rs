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
    conformance::batch_semantics(&harness).await;
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

/// The fake keeps HubSpot's daily limit too: every answer carries the daily headers, and
/// past the limit a 429 with `policyName: DAILY`, until the day rolls on.
#[tokio::test]
async fn the_daily_limit_is_reported_and_then_refused_until_the_day_rolls_on() {
    let fake = FakeHubSpot::start().await;
    let hs = connector(&fake, fake::TOKEN);
    {
        let mut state = fake.lock();
        state.daily_limit = 2;
        state.day_length = Duration::from_millis(500);
    }
    let first = hs.upsert(&contact("a@example.com", "A")).await.unwrap();
    assert_eq!(first.answer.meta["x-hubspot-ratelimit-daily"], "2");
    assert_eq!(first.answer.meta["x-hubspot-ratelimit-daily-remaining"], "1");
    hs.upsert(&contact("b@example.com", "B")).await.unwrap();
    let error = hs.upsert(&contact("c@example.com", "C")).await.unwrap_err();
    assert_eq!(error.class(), "rate_limited", "{error}");
    assert!(error.answer().excerpt.as_deref().unwrap().contains("DAILY"), "{error}");
    assert_eq!(fake.call_counts().refused_daily, 1);
    tokio::time::sleep(Duration::from_millis(600)).await;
    hs.upsert(&contact("c@example.com", "C")).await.unwrap();
    assert_eq!(fake.records("contacts").len(), 3);
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

/// Each write of a batch, keyed by its own idempotency key so the trace ids differ.
fn batch(emails: &[&str]) -> Vec<UpsertRequest> {
    emails
        .iter()
        .map(|email| UpsertRequest {
            idempotency_key: format!("hookgate-{email}-hubspot"),
            ..contact(email, &format!("name of {email}"))
        })
        .collect()
}

/// The class of each outcome, `ok` for a write.
fn classes(outcomes: &[Result<UpsertOutcome, ConnectorError>]) -> Vec<&'static str> {
    outcomes.iter().map(|o| o.as_ref().map_or_else(ConnectorError::class, |_| "ok")).collect()
}

#[tokio::test]
async fn a_batch_is_one_call_whose_results_are_matched_by_id_not_position() {
    let fake = FakeHubSpot::start().await;
    let hs = connector(&fake, fake::TOKEN);
    let existing = hs.upsert(&contact("b@example.com", "Before")).await.unwrap();
    fake.lock().results_reversed = true;
    let calls_before = fake.write_calls();

    let writes = batch(&["a@example.com", "b@example.com", "c@example.com"]);
    let outcomes: Vec<UpsertOutcome> =
        hs.upsert_batch(&writes).await.into_iter().map(Result::unwrap).collect();

    assert_eq!(fake.write_calls().batch_upsert, calls_before.batch_upsert + 1, "one call");
    let created: Vec<bool> = outcomes.iter().map(|o| o.created).collect();
    assert_eq!(created, [true, false, true]);
    assert_eq!(outcomes[1].record_id, existing.record_id);
    for (outcome, write) in outcomes.iter().zip(&writes) {
        let record = fake
            .records("contacts")
            .into_iter()
            .find(|r| r.id.to_string() == outcome.record_id)
            .unwrap();
        assert_eq!(record.properties["email"], write.external_id_value, "{outcome:?}");
        assert_eq!(record.properties["firstname"], write.fields["firstname"]);
        // Evidence is the input's own result, not the whole answer.
        let excerpt = outcome.answer.excerpt.as_deref().unwrap();
        let others = writes.iter().filter(|w| w.external_id_value != write.external_id_value);
        assert!(excerpt.contains(&write.external_id_value), "{excerpt}");
        assert!(others.into_iter().all(|w| !excerpt.contains(&w.external_id_value)), "{excerpt}");
        assert_eq!(outcome.answer.status, Some(200));
        assert_eq!(outcome.answer.meta["x-hubspot-ratelimit-max"], "100");
    }
    assert_eq!(fake.writes().len(), 4, "one effect per applied input");
}

#[tokio::test]
async fn an_invalid_input_fails_alone_in_a_207() {
    let fake = FakeHubSpot::start().await;
    let hs = connector(&fake, fake::TOKEN);
    let mut writes = batch(&["a@example.com", "b@example.com", "c@example.com"]);
    writes[1].fields.insert("createdate".into(), "2020-01-01".into());

    let outcomes = hs.upsert_batch(&writes).await;

    assert_eq!(classes(&outcomes), ["ok", "rejected", "ok"]);
    let error = outcomes[1].as_ref().unwrap_err();
    assert_eq!(error.answer().status, Some(207));
    let excerpt = error.answer().excerpt.as_deref().unwrap();
    assert!(excerpt.contains("createdate") && excerpt.contains("b@example.com"), "{excerpt}");
    assert!(!excerpt.contains("c@example.com"), "the input's own error only: {excerpt}");
    assert!(error.to_string().contains("VALIDATION_ERROR"), "{error}");
    let written: Vec<String> = fake.writes().into_iter().map(|w| w.id).collect();
    assert_eq!(written, ["a@example.com", "c@example.com"]);
}

#[tokio::test]
async fn a_whole_call_failure_is_every_inputs_outcome() {
    let fake = FakeHubSpot::start().await;
    let hs = connector(&fake, fake::TOKEN);
    let writes = batch(&["a@example.com", "b@example.com", "c@example.com"]);

    fake.push_fault(fake::Fault::RateLimited { retry_after: Some(Duration::from_secs(7)) });
    let outcomes = hs.upsert_batch(&writes).await;
    assert_eq!(classes(&outcomes), ["rate_limited"; 3]);
    for outcome in &outcomes {
        let error = outcome.as_ref().unwrap_err();
        assert_eq!(error.retry_after(), Some(Duration::from_secs(7)), "{error:?}");
        assert!(error.answer().excerpt.as_deref().unwrap().contains("RATE_LIMITS"));
    }

    fake.push_fault(fake::Fault::ServerError(503));
    assert_eq!(classes(&hs.upsert_batch(&writes).await), ["retryable"; 3]);
    let outcomes = connector(&fake, "pat-na1-revoked").upsert_batch(&writes).await;
    assert_eq!(classes(&outcomes), ["misconfigured"; 3]);
    assert!(fake.writes().is_empty(), "a refused call writes nothing");
    assert_eq!(fake.write_calls().batch_upsert, 3, "one call per batch, none repeated");

    // A batch refused whole for a bad input (400): each write alone gets its own answer,
    // rather than every write of the batch being dead-lettered for one.
    fake.push_fault(fake::Fault::Validation);
    fake.push_fault(fake::Fault::Validation);
    let outcomes = hs.upsert_batch(&writes).await;
    assert_eq!(classes(&outcomes), ["rejected", "ok", "ok"], "{outcomes:?}");
    assert_eq!(fake.writes().len(), 2);
    assert_eq!(fake.write_calls().batch_upsert, 3 + 1 + 3, "the batch, then each alone");
}

#[tokio::test]
async fn a_lost_answer_is_ambiguous_for_every_input_of_a_batch_applied_whole() {
    let fake = FakeHubSpot::start().await;
    let hs = connector(&fake, fake::TOKEN);
    fake.push_fault(fake::Fault::LostResponse(Duration::from_secs(3)));
    let writes = batch(&["a@example.com", "b@example.com", "c@example.com"]);

    let outcomes = hs.upsert_batch(&writes).await;

    assert_eq!(classes(&outcomes), ["ambiguous"; 3]);
    assert_eq!(fake.writes().len(), 3, "the fake applied the batch before losing its answer");
}

#[tokio::test]
async fn update_only_writes_of_a_batch_go_alone_and_never_create() {
    let fake = FakeHubSpot::start().await;
    let hs = connector(&fake, fake::TOKEN);
    let existing = hs.upsert(&contact("b@example.com", "Before")).await.unwrap();
    let calls_before = fake.write_calls();
    let mut writes = batch(&["a@example.com", "b@example.com", "c@example.com", "d@example.com"]);
    writes[1].operation = Operation::UpdateOnly;
    writes[2].operation = Operation::UpdateOnly;

    let outcomes = hs.upsert_batch(&writes).await;

    assert_eq!(classes(&outcomes), ["ok", "ok", "rejected", "ok"], "no record c to update");
    let updated = outcomes[1].as_ref().unwrap();
    assert!(!updated.created);
    assert_eq!(updated.record_id, existing.record_id);
    let calls = fake.write_calls();
    assert_eq!(calls.batch_upsert - calls_before.batch_upsert, 1, "a and d in one batch");
    assert_eq!(calls.update - calls_before.update, 2, "b and c alone");
    let emails: Vec<String> =
        fake.records("contacts").into_iter().map(|r| r.properties["email"].clone()).collect();
    assert_eq!(emails, ["b@example.com", "a@example.com", "d@example.com"]);
}

#[tokio::test]
async fn batches_are_split_by_object_type_and_at_100_inputs() {
    let fake = FakeHubSpot::start().await;
    let hs = connector(&fake, fake::TOKEN);
    let emails: Vec<String> = (0..102).map(|n| format!("c{n}@example.com")).collect();
    let mut writes = batch(&emails.iter().map(String::as_str).collect::<Vec<_>>());
    writes[50] = UpsertRequest {
        object: "companies".into(),
        external_id_field: "external_id".into(),
        ..writes[50].clone()
    };

    let outcomes = hs.upsert_batch(&writes).await;

    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    // 100 contacts in one call, the 101st contact in another, the company in its own.
    assert_eq!(fake.write_calls().batch_upsert, 3);
    assert_eq!(fake.records("contacts").len(), 101);
    assert_eq!(fake.records("companies").len(), 1);
}

/// Sends a raw batch upsert of `inputs` to the fake.
async fn raw_batch(fake: &FakeHubSpot, inputs: Vec<serde_json::Value>) -> (u16, serde_json::Value) {
    hookgate_connector_http::install_crypto_provider();
    let response = reqwest::Client::new()
        .post(format!("{}/crm/v3/objects/contacts/batch/upsert", fake.base_url))
        .bearer_auth(fake::TOKEN)
        .json(&json!({"inputs": inputs}))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

#[tokio::test]
async fn the_fake_caps_batches_at_100_and_refuses_duplicate_ids_whole() {
    let fake = FakeHubSpot::start().await;
    let input = |n: usize| json!({"idProperty": "email", "id": format!("c{n}@example.com"), "properties": {"firstname": "x"}});

    let (status, body) = raw_batch(&fake, (0..101).map(input).collect()).await;
    assert_eq!((status, body["category"].as_str()), (400, Some("VALIDATION_ERROR")), "{body}");
    assert!(body["message"].as_str().unwrap().contains("100"), "{body}");
    assert!(fake.writes().is_empty());

    let (status, body) = raw_batch(&fake, vec![input(1), input(2), input(1)]).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["message"].as_str().unwrap().contains("Duplicate"), "{body}");
    assert!(fake.writes().is_empty(), "a duplicate id refuses the whole batch");

    let (status, body) = raw_batch(&fake, (0..100).map(input).collect()).await;
    assert_eq!((status, body["results"].as_array().unwrap().len()), (200, 100));
    assert_eq!(fake.writes().len(), 100);
}

#[tokio::test]
async fn without_trace_ids_an_invalid_input_refuses_the_whole_batch() {
    let fake = FakeHubSpot::start().await;
    let input = |email: &str, property: &str| json!({"idProperty": "email", "id": email, "properties": {property: "x"}});
    let (status, body) = raw_batch(
        &fake,
        vec![input("a@example.com", "firstname"), input("b@example.com", "createdate")],
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(fake.writes().is_empty());
}
