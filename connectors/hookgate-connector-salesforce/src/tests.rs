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
