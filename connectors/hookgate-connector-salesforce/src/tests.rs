//! Against the fake Salesforce: the conformance suite, then each documented edge.

use std::sync::Arc;
use std::time::Duration;

use hookgate_connector::conformance::{self, Fault, Harness};
use hookgate_fakes::salesforce::{self as fake, FakeSalesforce};

use super::*;

fn credentials(secret: &str) -> Credentials {
    Credentials::from([
        ("client_id".to_owned(), Secret::new(fake::CLIENT_ID)),
        ("client_secret".to_owned(), Secret::new(secret)),
    ])
}

fn connector(fake: &FakeSalesforce, api_version: &str, secret: &str) -> Salesforce {
    let settings = SalesforceSettings {
        login_url: fake.base_url.clone(),
        instance_url: None,
        api_version: api_version.into(),
        auth: Auth::ClientCredentials,
        http: HttpSettings { request_timeout_ms: 1000, ..HttpSettings::default() },
    };
    Salesforce::new(settings, &credentials(secret)).unwrap()
}

fn contact(external_id: &str, last_name: &str) -> UpsertRequest {
    UpsertRequest {
        object: "Contact".into(),
        external_id_field: "Ext_Id__c".into(),
        external_id_value: external_id.into(),
        fields: BTreeMap::from([("LastName".to_owned(), last_name.to_owned())]),
        operation: Operation::Upsert,
        idempotency_key: "k".into(),
    }
}

struct SalesforceHarness {
    fake: FakeSalesforce,
}

impl Harness for SalesforceHarness {
    fn connector(&self, fault: Option<Fault>) -> BoxFuture<'_, Arc<dyn Connector>> {
        Box::pin(async move {
            let mut secret = fake::CLIENT_SECRET;
            {
                let mut state = self.fake.lock();
                state.daily_limit = 1_000_000;
                state.faults.clear();
                match fault {
                    None => {}
                    Some(Fault::Unavailable) => state.faults.push_back(fake::Fault::Json503),
                    Some(Fault::RateLimited) => state.daily_limit = state.calls_today,
                    Some(Fault::Invalid) => state.faults.push_back(fake::Fault::Validation),
                    Some(Fault::LostResponse) => {
                        state.faults.push_back(fake::Fault::LostResponse(Duration::from_secs(3)))
                    }
                    Some(Fault::BadCredentials) => secret = "wrong-secret",
                }
            }
            Arc::new(connector(&self.fake, "60.0", secret)) as Arc<dyn Connector>
        })
    }

    fn object(&self) -> (&str, &str) {
        ("Contact", "Ext_Id__c")
    }

    fn field(&self) -> &str {
        "LastName"
    }
}

#[tokio::test]
async fn salesforce_passes_the_conformance_suite() {
    // Each `connector` call resets the fake's switches before setting its own.
    let harness = SalesforceHarness { fake: FakeSalesforce::start().await };
    conformance::upsert_semantics(&harness).await;
    for fault in Fault::ALL {
        conformance::fault_maps_to_its_class(&harness, fault).await;
        harness.connector(None).await;
    }
    conformance::batch_semantics(&harness).await;
}

#[tokio::test]
async fn an_expired_token_is_refreshed_once_and_the_call_repeated() {
    let fake = FakeSalesforce::start().await;
    let sf = connector(&fake, "60.0", fake::CLIENT_SECRET);
    sf.upsert(&contact("c-1", "Lovelace")).await.unwrap();
    assert_eq!(fake.lock().token_requests, 1, "the token is cached");
    sf.upsert(&contact("c-1", "Byron")).await.unwrap();
    assert_eq!(fake.lock().token_requests, 1);

    fake.expire_tokens();
    let outcome = sf.upsert(&contact("c-1", "King")).await.unwrap();
    assert!(!outcome.created);
    assert_eq!(fake.lock().token_requests, 2, "one refresh");
    assert_eq!(fake.records("Contact")[0].fields["LastName"], "King");
}

#[tokio::test]
async fn api_versions_before_46_answer_204_and_the_id_is_looked_up() {
    let fake = FakeSalesforce::start().await;
    let sf = connector(&fake, "45.0", fake::CLIENT_SECRET);
    let created = sf.upsert(&contact("c-1", "Lovelace")).await.unwrap();
    assert!(created.created, "201 means created, without the `created` flag before v46");
    let updated = sf.upsert(&contact("c-1", "Byron")).await.unwrap();
    assert!(!updated.created);
    assert_eq!(updated.record_id, created.record_id);
    assert_eq!(updated.answer.status, Some(204));
}

#[tokio::test]
async fn several_matching_records_are_rejected_with_their_urls() {
    let fake = FakeSalesforce::start().await;
    fake.lock().ext_id_unique = false;
    let sf = connector(&fake, "60.0", fake::CLIENT_SECRET);
    sf.upsert(&contact("dup", "One")).await.unwrap();
    fake.insert_duplicate("Contact", "Ext_Id__c", "dup");
    let error = sf.upsert(&contact("dup", "Two")).await.unwrap_err();
    assert_eq!(error.class(), "rejected");
    assert_eq!(error.answer().status, Some(300));
    assert!(
        error
            .answer()
            .excerpt
            .as_deref()
            .unwrap()
            .contains("/services/data/v60.0/sobjects/Contact/003"),
        "{error:?}"
    );
    assert!(matches!(
        sf.lookup(&(&contact("dup", "")).into()).await.unwrap_err(),
        ConnectorError::Rejected { .. }
    ));
}

#[tokio::test]
async fn documented_failures_map_to_their_classes() {
    let fake = FakeSalesforce::start().await;
    let sf = connector(&fake, "60.0", fake::CLIENT_SECRET);
    let class = |result: Result<UpsertOutcome, ConnectorError>| result.unwrap_err().class();

    fake.push_fault(fake::Fault::Html503);
    assert_eq!(
        class(sf.upsert(&contact("c", "x")).await),
        "retryable",
        "an HTML 503 from the edge"
    );
    fake.push_fault(fake::Fault::LockRow);
    assert_eq!(
        class(sf.upsert(&contact("c", "x")).await),
        "retryable",
        "UNABLE_TO_LOCK_ROW is retried"
    );
    let missing = UpsertRequest { fields: BTreeMap::new(), ..contact("c", "x") };
    let error = sf.upsert(&missing).await.unwrap_err();
    assert_eq!(error.class(), "rejected");
    assert!(error.to_string().contains("REQUIRED_FIELD_MISSING"), "{error}");
    let unknown = UpsertRequest { object: "Nope__c".into(), ..contact("c", "x") };
    assert_eq!(class(sf.upsert(&unknown).await), "misconfigured", "404 for an unknown object");
    let update_only = UpsertRequest { operation: Operation::UpdateOnly, ..contact("absent", "x") };
    assert_eq!(class(sf.upsert(&update_only).await), "rejected", "update-only with no record");

    let limit_before = fake.lock().token_requests;
    let used = fake.lock().calls_today;
    fake.lock().daily_limit = used;
    let error = sf.upsert(&contact("c", "x")).await.unwrap_err();
    assert_eq!(error.class(), "rate_limited");
    assert!(error.answer().meta["sforce-limit-info"].starts_with("api-usage="));
    assert_eq!(
        fake.lock().token_requests,
        limit_before,
        "no re-authentication on REQUEST_LIMIT_EXCEEDED"
    );
}

#[tokio::test]
async fn values_are_url_encoded_and_limit_info_is_kept() {
    let fake = FakeSalesforce::start().await;
    let sf = connector(&fake, "60.0", fake::CLIENT_SECRET);
    let odd = "ada lovelace/ü?#.inc";
    let outcome = sf.upsert(&contact(odd, "Lovelace")).await.unwrap();
    assert_eq!(outcome.answer.meta["sforce-limit-info"], "api-usage=1/15000");
    let lookup = LookupRequest { fields: vec!["Ext_Id__c".into()], ..(&contact(odd, "")).into() };
    let LookupOutcome::Found { fields, .. } = sf.lookup(&lookup).await.unwrap() else {
        panic!("not found")
    };
    assert!(!fields.contains_key("LastName"), "only the fields asked for");
    assert_eq!(fields["Ext_Id__c"], odd, "the value arrived intact");
}

#[test]
fn settings_and_credentials_are_checked() {
    let settings = |url: &str| SalesforceSettings {
        login_url: url.into(),
        instance_url: None,
        api_version: "60.0".into(),
        auth: Auth::ClientCredentials,
        http: HttpSettings::default(),
    };
    assert!(
        Salesforce::new(settings("http://login.salesforce.com"), &credentials("s"))
            .unwrap_err()
            .0
            .contains("must use https")
    );
    assert!(
        Salesforce::new(settings("https://login.salesforce.com"), &Credentials::new())
            .unwrap_err()
            .0
            .contains("client_id")
    );
    let bad_version =
        SalesforceSettings { api_version: "v60".into(), ..settings("https://x.my.salesforce.com") };
    assert!(Salesforce::new(bad_version, &credentials("s")).is_err());
    let debug = format!(
        "{:?}",
        Salesforce::new(settings("https://x.my.salesforce.com"), &credentials("hunter2")).unwrap()
    );
    assert!(!debug.contains("hunter2"), "{debug}");
}

fn jwt_connector(
    fake: &FakeSalesforce,
    username: &str,
    key: &str,
) -> Result<Salesforce, ConfigError> {
    let settings = SalesforceSettings {
        login_url: fake.base_url.clone(),
        instance_url: None,
        api_version: "60.0".into(),
        auth: Auth::JwtBearer { username: username.into(), audience: None },
        http: HttpSettings::default(),
    };
    let credentials = Credentials::from([
        ("client_id".to_owned(), Secret::new(fake::CLIENT_ID)),
        ("private_key".to_owned(), Secret::new(key)),
    ]);
    Salesforce::new(settings, &credentials)
}

#[tokio::test]
async fn the_jwt_bearer_flow_gets_a_token_with_a_signed_assertion() {
    let fake = FakeSalesforce::start().await;
    let sf = jwt_connector(&fake, fake::JWT_USERNAME, fake::JWT_TEST_PRIVATE_KEY).unwrap();
    assert!(sf.upsert(&contact("c-1", "Lovelace")).await.unwrap().created);
    // An expired session is refreshed with a new assertion, as with client credentials.
    fake.expire_tokens();
    assert!(!sf.upsert(&contact("c-1", "Byron")).await.unwrap().created);
    assert_eq!(fake.lock().token_requests, 2);

    let stranger = jwt_connector(&fake, "someone@example.com", fake::JWT_TEST_PRIVATE_KEY).unwrap();
    let error = stranger.upsert(&contact("c-2", "X")).await.unwrap_err();
    assert_eq!(error.class(), "misconfigured");
    assert!(error.to_string().contains("invalid_grant"), "{error}");
    assert!(
        jwt_connector(&fake, fake::JWT_USERNAME, "not a key")
            .unwrap_err()
            .0
            .contains("private_key")
    );
}

#[test]
fn required_credentials_follow_the_flow() {
    let jwt =
        BTreeMap::from([("auth".to_owned(), serde_json::json!({"jwt_bearer": {"username": "u"}}))]);
    assert_eq!(required_credentials(&jwt), ["client_id", "private_key"]);
    assert_eq!(required_credentials(&BTreeMap::new()), ["client_id", "client_secret"]);
}

/// Contacts with these external ids, each with its own last name and idempotency key.
fn batch(external_ids: &[&str]) -> Vec<UpsertRequest> {
    external_ids
        .iter()
        .map(|id| UpsertRequest {
            idempotency_key: format!("hookgate-{id}-salesforce"),
            ..contact(id, &format!("Name {id}"))
        })
        .collect()
}

/// The class of each outcome, `ok` for a write.
fn classes(outcomes: &[Result<UpsertOutcome, ConnectorError>]) -> Vec<&'static str> {
    outcomes.iter().map(|o| o.as_ref().map_or_else(ConnectorError::class, |_| "ok")).collect()
}

#[tokio::test]
async fn a_batch_is_one_collection_call_with_results_in_order() {
    let fake = FakeSalesforce::start().await;
    let sf = connector(&fake, "60.0", fake::CLIENT_SECRET);
    assert_eq!(sf.batch_max(), COLLECTION_RECORDS_MAX);
    let existing = sf.upsert(&contact("c-2", "Before")).await.unwrap();

    let writes = batch(&["c-1", "c-2", "c-3"]);
    let outcomes: Vec<UpsertOutcome> =
        sf.upsert_batch(&writes).await.into_iter().map(Result::unwrap).collect();

    assert_eq!(fake.write_calls(), fake::WriteCalls { upsert: 1, collection_upsert: 1 });
    let created: Vec<bool> = outcomes.iter().map(|o| o.created).collect();
    assert_eq!(created, [true, false, true]);
    assert_eq!(outcomes[1].record_id, existing.record_id);
    for (outcome, write) in outcomes.iter().zip(&writes) {
        let record =
            fake.records("Contact").into_iter().find(|r| r.id == outcome.record_id).unwrap();
        assert_eq!(record.fields["Ext_Id__c"], write.external_id_value.as_str());
        assert_eq!(record.fields["LastName"], write.fields["LastName"].as_str());
        // Evidence is the record's own result, not the whole answer.
        let excerpt = outcome.answer.excerpt.as_deref().unwrap();
        let others = outcomes.iter().filter(|o| o.record_id != outcome.record_id);
        assert!(excerpt.contains(&outcome.record_id), "{excerpt}");
        assert!(others.into_iter().all(|o| !excerpt.contains(&o.record_id)), "{excerpt}");
        assert!(outcome.answer.meta["sforce-limit-info"].starts_with("api-usage="));
    }
    let effects: Vec<(String, String)> =
        fake.writes().into_iter().map(|w| (w.id, w.fields["LastName"].clone())).collect();
    assert_eq!(
        effects,
        [
            ("c-2".to_owned(), "Before".to_owned()),
            ("c-1".to_owned(), "Name c-1".to_owned()),
            ("c-2".to_owned(), "Name c-2".to_owned()),
            ("c-3".to_owned(), "Name c-3".to_owned()),
        ],
        "one effect per applied record, with the fields a single upsert would log"
    );
}

#[tokio::test]
async fn record_errors_are_classified_as_a_single_upserts_error_codes() {
    let fake = FakeSalesforce::start().await;
    let sf = connector(&fake, "60.0", fake::CLIENT_SECRET);
    let mut writes = batch(&["c-1", "c-2", "c-3"]);
    writes[1].fields.clear();

    let outcomes = sf.upsert_batch(&writes).await;

    assert_eq!(classes(&outcomes), ["ok", "rejected", "ok"]);
    let error = outcomes[1].as_ref().unwrap_err();
    assert!(error.to_string().contains("REQUIRED_FIELD_MISSING"), "{error}");
    assert_eq!(error.answer().status, Some(200), "a collection answers 200 with record errors");
    assert!(error.answer().excerpt.as_deref().unwrap().contains("LastName"));
    let written: Vec<String> = fake.writes().into_iter().map(|w| w.id).collect();
    assert_eq!(written, ["c-1", "c-3"]);

    // A locked row is retried, alone or in a collection.
    fake.push_fault(fake::Fault::LockRow);
    let outcomes = sf.upsert_batch(&batch(&["c-1", "c-3"])).await;
    assert_eq!(classes(&outcomes), ["retryable"; 2]);
    assert!(outcomes[0].as_ref().unwrap_err().to_string().contains("UNABLE_TO_LOCK_ROW"));
    fake.push_fault(fake::Fault::Validation);
    assert_eq!(classes(&sf.upsert_batch(&batch(&["c-1", "c-3"])).await), ["rejected"; 2]);
    assert_eq!(fake.writes().len(), 2, "failed records write nothing");
}

#[tokio::test]
async fn a_whole_call_failure_is_every_records_outcome() {
    let fake = FakeSalesforce::start().await;
    let sf = connector(&fake, "60.0", fake::CLIENT_SECRET);
    let writes = batch(&["c-1", "c-2", "c-3"]);

    // Salesforce's rate limit is the daily one: 403 REQUEST_LIMIT_EXCEEDED, not a 429, and
    // with no Retry-After.
    assert_eq!(classes(&sf.upsert_batch(&writes[..1]).await), ["ok"]);
    let used = fake.lock().calls_today;
    fake.lock().daily_limit = used;
    let outcomes = sf.upsert_batch(&writes).await;
    assert_eq!(classes(&outcomes), ["rate_limited"; 3]);
    let error = outcomes[2].as_ref().unwrap_err();
    assert_eq!(error.retry_after(), None);
    assert!(error.answer().meta["sforce-limit-info"].starts_with("api-usage="));
    fake.lock().daily_limit = 1_000_000;

    fake.push_fault(fake::Fault::Html503);
    assert_eq!(classes(&sf.upsert_batch(&writes).await), ["retryable"; 3]);
    let unknown: Vec<UpsertRequest> =
        writes.iter().map(|w| UpsertRequest { object: "Nope__c".into(), ..w.clone() }).collect();
    assert_eq!(classes(&sf.upsert_batch(&unknown).await), ["misconfigured"; 3]);
    let outcomes = connector(&fake, "60.0", "wrong-secret").upsert_batch(&writes).await;
    assert_eq!(classes(&outcomes), ["misconfigured"; 3]);
    assert_eq!(fake.writes().len(), 1, "only the first call wrote");
}

#[tokio::test]
async fn a_lost_answer_is_ambiguous_for_every_record_of_a_collection_applied_whole() {
    let fake = FakeSalesforce::start().await;
    let sf = connector(&fake, "60.0", fake::CLIENT_SECRET);
    fake.push_fault(fake::Fault::LostResponse(Duration::from_secs(3)));

    let outcomes = sf.upsert_batch(&batch(&["c-1", "c-2", "c-3"])).await;

    assert_eq!(classes(&outcomes), ["ambiguous"; 3]);
    assert_eq!(fake.writes().len(), 3, "the fake applied the collection before losing its answer");
}

#[tokio::test]
async fn an_expired_token_is_refreshed_once_for_a_collection() {
    let fake = FakeSalesforce::start().await;
    let sf = connector(&fake, "60.0", fake::CLIENT_SECRET);
    sf.upsert(&contact("c-1", "Lovelace")).await.unwrap();
    fake.expire_tokens();

    let outcomes = sf.upsert_batch(&batch(&["c-1", "c-2"])).await;

    assert_eq!(classes(&outcomes), ["ok"; 2]);
    assert_eq!(fake.lock().token_requests, 2, "one refresh");
    assert_eq!(fake.write_calls().collection_upsert, 2, "the call repeated once");
}

#[tokio::test]
async fn writes_to_different_objects_or_id_fields_go_in_separate_calls() {
    let fake = FakeSalesforce::start().await;
    let sf = connector(&fake, "60.0", fake::CLIENT_SECRET);
    let mut writes = batch(&["c-1", "a-1", "c-2", "c-3", "a-2"]);
    for n in [1, 4] {
        writes[n].object = "Account".into();
        writes[n].fields = BTreeMap::from([("Name".to_owned(), "Acme".to_owned())]);
    }
    writes[3].external_id_field = "Other_Id__c".into();

    let outcomes = sf.upsert_batch(&writes).await;

    assert_eq!(classes(&outcomes), ["ok"; 5], "{outcomes:?}");
    assert_eq!(
        fake.write_calls().collection_upsert,
        3,
        "Contact by Ext_Id__c, Account, by Other_Id__c"
    );
    let prefixes: Vec<&str> =
        outcomes.iter().map(|o| &o.as_ref().unwrap().record_id[..3]).collect();
    assert_eq!(prefixes, ["003", "001", "003", "003", "001"], "outcomes in request order");
    assert_eq!(fake.records("Account").len(), 2);
    assert_eq!(fake.records("Contact").len(), 3);
}

#[tokio::test]
async fn update_only_writes_of_a_batch_go_alone_and_never_create() {
    let fake = FakeSalesforce::start().await;
    let sf = connector(&fake, "60.0", fake::CLIENT_SECRET);
    let existing = sf.upsert(&contact("c-2", "Before")).await.unwrap();
    let mut writes = batch(&["c-1", "c-2", "c-3", "c-4"]);
    writes[1].operation = Operation::UpdateOnly;
    writes[2].operation = Operation::UpdateOnly;

    let outcomes = sf.upsert_batch(&writes).await;

    assert_eq!(classes(&outcomes), ["ok", "ok", "rejected", "ok"], "no record c-3 to update");
    assert_eq!(outcomes[1].as_ref().unwrap().record_id, existing.record_id);
    assert_eq!(
        fake.write_calls(),
        fake::WriteCalls { upsert: 3, collection_upsert: 1 },
        "c-1 and c-4 in one collection, c-2 and c-3 alone"
    );
    assert_eq!(fake.records("Contact").len(), 3);
}

#[tokio::test]
async fn before_v46_there_are_no_collections_and_writes_go_one_by_one() {
    let fake = FakeSalesforce::start().await;
    let sf = connector(&fake, "45.0", fake::CLIENT_SECRET);
    assert_eq!(sf.batch_max(), 1);
    let outcomes = sf.upsert_batch(&batch(&["c-1", "c-2"])).await;
    assert_eq!(classes(&outcomes), ["ok"; 2]);
    assert_eq!(fake.write_calls(), fake::WriteCalls { upsert: 2, collection_upsert: 0 });
}

/// A token from the fake, for raw calls.
async fn raw_token(client: &reqwest::Client, fake: &FakeSalesforce) -> String {
    let token: serde_json::Value = client
        .post(format!("{}/services/oauth2/token", fake.base_url))
        .header(reqwest::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(format!(
            "grant_type=client_credentials&client_id={}&client_secret={}",
            fake::CLIENT_ID,
            fake::CLIENT_SECRET
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    token["access_token"].as_str().unwrap().to_owned()
}

/// Sends a raw collection upsert of Contacts by `Ext_Id__c` to the fake.
async fn raw_collection(
    fake: &FakeSalesforce,
    all_or_none: bool,
    records: Vec<serde_json::Value>,
) -> (u16, serde_json::Value) {
    hookgate_connector_http::install_crypto_provider();
    let client = reqwest::Client::new();
    let token = raw_token(&client, fake).await;
    let response = client
        .patch(format!(
            "{}/services/data/v60.0/composite/sobjects/Contact/Ext_Id__c",
            fake.base_url
        ))
        .bearer_auth(token)
        .json(&serde_json::json!({"allOrNone": all_or_none, "records": records}))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

fn raw_contact(external_id: &str) -> serde_json::Value {
    serde_json::json!({"attributes": {"type": "Contact"}, "Ext_Id__c": external_id, "LastName": "X"})
}

#[tokio::test]
async fn the_fake_caps_collections_at_200_records() {
    let fake = FakeSalesforce::start().await;
    let records = |n: usize| (0..n).map(|i| raw_contact(&format!("c-{i}"))).collect::<Vec<_>>();

    let (status, body) = raw_collection(&fake, false, records(201)).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body[0]["errorCode"], "EXCEEDED_ID_LIMIT", "{body}");
    assert!(body[0]["message"].as_str().unwrap().contains("200"), "{body}");
    assert!(fake.writes().is_empty());

    let (status, body) = raw_collection(&fake, false, records(200)).await;
    assert_eq!((status, body.as_array().unwrap().len()), (200, 200));
    assert_eq!(fake.writes().len(), 200);

    // The connector never sends more than the cap: 201 writes are two calls.
    let sf = connector(&fake, "60.0", fake::CLIENT_SECRET);
    let ids: Vec<String> = (0..201).map(|i| format!("d-{i}")).collect();
    let outcomes =
        sf.upsert_batch(&batch(&ids.iter().map(String::as_str).collect::<Vec<_>>())).await;
    assert!(outcomes.iter().all(Result::is_ok));
    assert_eq!(fake.write_calls().collection_upsert, 4);
}

#[tokio::test]
async fn the_fake_rolls_an_all_or_none_collection_back() {
    let fake = FakeSalesforce::start().await;
    let missing_name = serde_json::json!({"attributes": {"type": "Contact"}, "Ext_Id__c": "c-2"});

    let (status, body) =
        raw_collection(&fake, true, vec![raw_contact("c-1"), missing_name.clone()]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body[0]["errors"][0]["statusCode"], "ALL_OR_NONE_OPERATION_ROLLED_BACK");
    assert_eq!(body[1]["errors"][0]["statusCode"], "REQUIRED_FIELD_MISSING");
    assert!(fake.writes().is_empty(), "nothing committed");

    let (_, body) = raw_collection(&fake, false, vec![raw_contact("c-1"), missing_name]).await;
    assert_eq!(
        (body[0]["success"].as_bool(), body[1]["success"].as_bool()),
        (Some(true), Some(false))
    );
    assert_eq!(body[0]["created"], true);
    assert_eq!(fake.writes().len(), 1);
}
