//! Against the fake in-house REST CRM over real HTTP: the conformance suite, then each
//! setting's promise, judged by the fake's effect log and what it received.

use std::sync::Arc;
use std::time::Duration;

use hookgate_connector::conformance::{self, Fault, Harness};
use hookgate_fakes::rest::{self as fake, FakeRest};
use serde_json::{Value, json};

use super::*;

/// Settings for the fake, as `hookgate.yaml` would hold them (the example in docs/guide/connectors.md).
fn settings(fake: &FakeRest) -> Value {
    json!({
        "base_url": fake.base_url,
        "timeout": "1s",
        "auth": {"oauth_client_credentials": {
            "token_url": format!("{}/oauth/token", fake.base_url),
            "client_id": "inhouse_client_id",
            "client_secret": "inhouse_client_secret",
        }},
        "upsert": {
            "method": "PUT",
            "url": "/objects/{{ object }}/by/{{ external_id_field }}/{{ external_id_value }}\
                    {% if operation == 'update_only' %}?mode=update{% endif %}",
            "body": "{\"fields\": {{ fields }}}",
            "idempotency_header": "Idempotency-Key",
            "record_id": "/id",
            "update_only": true,
        },
        "lookup": {
            "url": "/objects/{{ object }}/by/{{ external_id_field }}/{{ external_id_value }}",
            "record_id": "/id",
            "fields": "/fields",
        },
        "healthcheck": {"url": "/health"},
        "evidence_headers": ["X-Request-Id"],
    })
}

fn credentials(client_secret: &str) -> Credentials {
    Credentials::from([
        ("inhouse_client_id".to_owned(), Secret::new(fake::CLIENT_ID)),
        ("inhouse_client_secret".to_owned(), Secret::new(client_secret)),
        ("inhouse_api_key".to_owned(), Secret::new(fake::API_KEY)),
        ("inhouse_token".to_owned(), Secret::new(fake::STATIC_TOKEN)),
        ("tenant".to_owned(), Secret::new("tenant-7")),
    ])
}

fn map(value: Value) -> BTreeMap<String, Value> {
    match value {
        Value::Object(map) => map.into_iter().collect(),
        other => panic!("settings must be an object: {other}"),
    }
}

/// An instance against `fake`, its settings changed by `adjust`.
#[track_caller]
fn rest(fake: &FakeRest, adjust: impl FnOnce(&mut Value)) -> Rest {
    let mut settings = settings(fake);
    adjust(&mut settings);
    Rest::from_config(&map(settings), &credentials(fake::CLIENT_SECRET)).unwrap()
}

fn contact(email: &str, name: &str) -> UpsertRequest {
    UpsertRequest {
        object: "contacts".into(),
        external_id_field: "email".into(),
        external_id_value: email.into(),
        fields: BTreeMap::from([("name".to_owned(), name.to_owned())]),
        operation: Operation::Upsert,
        idempotency_key: format!("hookgate-{email}-{name}"),
    }
}

/// The writes the fake received (whatever it answered).
fn puts(fake: &FakeRest) -> Vec<fake::Seen> {
    fake.requests().into_iter().filter(|r| r.method == "PUT").collect()
}

struct RestHarness {
    fake: FakeRest,
}

impl Harness for RestHarness {
    fn connector(&self, fault: Option<Fault>) -> BoxFuture<'_, Arc<dyn Connector>> {
        Box::pin(async move {
            let mut secret = fake::CLIENT_SECRET;
            {
                let mut state = self.fake.lock();
                state.faults.clear();
                state.lookup_faults.clear();
                match fault {
                    None => {}
                    Some(Fault::Unavailable) => {
                        state.faults.push_back(fake::Fault::ServerError(503));
                    }
                    Some(Fault::RateLimited) => state
                        .faults
                        .push_back(fake::Fault::RateLimited { retry_after: Some("3".into()) }),
                    Some(Fault::Invalid) => state.faults.push_back(fake::Fault::Validation),
                    Some(Fault::LostResponse) => {
                        state.faults.push_back(fake::Fault::LostResponse(Duration::from_secs(3)));
                    }
                    Some(Fault::BadCredentials) => secret = "revoked-client-secret",
                }
            }
            let rest = Rest::from_config(&map(settings(&self.fake)), &credentials(secret)).unwrap();
            Arc::new(rest) as Arc<dyn Connector>
        })
    }

    fn object(&self) -> (&str, &str) {
        ("contacts", "email")
    }

    fn field(&self) -> &str {
        "name"
    }
}

#[tokio::test]
async fn rest_passes_the_conformance_suite() {
    let harness = RestHarness { fake: FakeRest::start().await };
    conformance::upsert_semantics(&harness).await;
    let writes = harness.fake.writes();
    assert_eq!(writes.len(), 2, "create and update are written; the repeat is not: {writes:?}");
    assert!(writes[0].created && !writes[1].created);
    for fault in Fault::ALL {
        conformance::fault_maps_to_its_class(&harness, fault).await;
        harness.connector(None).await;
    }
    let lost: Vec<_> =
        harness.fake.writes().into_iter().filter(|w| w.value.contains("LostResponse")).collect();
    assert_eq!(lost.len(), 1, "a lost answer is one applied write");
    assert_eq!(harness.fake.writes().len(), 3, "no other fault writes anything");
}

#[tokio::test]
async fn the_status_says_created_or_updated_and_the_key_travels_in_its_header() {
    let fake = FakeRest::start().await;
    let crm = rest(&fake, |_| {});
    let created = crm.upsert(&contact("ada@example.com", "Ada")).await.unwrap();
    let updated = crm.upsert(&contact("ada@example.com", "Augusta")).await.unwrap();
    assert!(created.created && !updated.created);
    assert_eq!(created.record_id, updated.record_id);
    assert_eq!((created.answer.status, updated.answer.status), (Some(201), Some(200)));
    assert_eq!(
        created.answer.meta["request"], "PUT /objects/contacts/by/email/ada%40example.com",
        "the request line is kept as evidence"
    );
    assert!(created.answer.meta["x-request-id"].starts_with("req-"), "{:?}", created.answer);
    let records = fake.records("contacts");
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].value, "ada@example.com", "the value arrives decoded, whole");
    assert_eq!(records[0].fields["name"], "Augusta");
    let writes = fake.writes();
    assert_eq!(writes[0].idempotency_key.as_deref(), Some("hookgate-ada@example.com-Ada"));
    let sent = &puts(&fake)[0];
    assert_eq!(sent.headers["content-type"], "application/json");
    assert_eq!(sent.body, r#"{"fields": {"name":"Ada"}}"#);
}

#[tokio::test]
async fn an_oauth_token_is_fetched_once_then_again_before_expiry_and_after_a_401() {
    let fake = FakeRest::start().await;
    fake.lock().token_lifetime = Duration::from_secs(2);
    let crm = rest(&fake, |_| {});
    crm.healthcheck().await.unwrap();
    crm.upsert(&contact("a@example.com", "A")).await.unwrap();
    crm.upsert(&contact("b@example.com", "B")).await.unwrap();
    assert_eq!(fake.lock().token_requests, 1, "one token serves every call while it lives");

    // Past the refresh margin (a tenth of the lifetime): fetched again before use.
    tokio::time::sleep(Duration::from_secs(2)).await;
    crm.upsert(&contact("c@example.com", "C")).await.unwrap();
    assert_eq!(fake.lock().token_requests, 2);
    assert_eq!(fake.lock().tokens_refused, 0, "the old token was replaced before it died");

    fake.lock().token_lifetime = Duration::from_secs(3600);
    fake.expire_tokens();
    crm.upsert(&contact("d@example.com", "D")).await.unwrap();
    let state = fake.lock();
    assert_eq!((state.tokens_refused, state.token_requests), (1, 3), "one 401, one refresh");
    let written: Vec<&str> = state.writes.iter().map(|w| w.value.as_str()).collect();
    assert_eq!(
        written,
        ["a@example.com", "b@example.com", "c@example.com", "d@example.com"],
        "the refused write was sent again once, and applied once"
    );
    let token_request = state.requests.iter().find(|r| r.uri == "/oauth/token").unwrap();
    assert!(token_request.body.contains("grant_type=client_credentials"));
    assert!(token_request.body.contains(&format!("client_id={}", fake::CLIENT_ID)));
}

#[tokio::test]
async fn a_client_can_authenticate_to_the_token_endpoint_with_http_basic() {
    let fake = FakeRest::start().await;
    let crm = rest(&fake, |s| {
        s["auth"]["oauth_client_credentials"]["client_authentication"] =
            json!("client_secret_basic");
        s["auth"]["oauth_client_credentials"]["scope"] = json!("records:write");
    });
    crm.upsert(&contact("a@example.com", "A")).await.unwrap();
    let token_request = fake.requests().into_iter().find(|r| r.uri == "/oauth/token").unwrap();
    assert!(token_request.headers["authorization"].starts_with("Basic "));
    assert!(!token_request.body.contains("client_secret"), "{}", token_request.body);
    assert!(token_request.body.contains("scope=records%3Awrite"));
    assert_eq!(fake.writes().len(), 1);
}

#[tokio::test]
async fn a_wrong_client_secret_is_a_misconfiguration_and_sends_no_write() {
    let fake = FakeRest::start().await;
    let mut settings = settings(&fake);
    settings.as_object_mut().unwrap().remove("healthcheck");
    let crm = Rest::from_config(&map(settings), &credentials("wrong")).unwrap();
    let error = crm.healthcheck().await.unwrap_err();
    assert_eq!(error.class(), "misconfigured", "{error}");
    assert!(error.to_string().contains("invalid_client"), "{error}");
    assert_eq!(error.answer().meta["request"], "POST /oauth/token");
    let error = crm.upsert(&contact("a@example.com", "A")).await.unwrap_err();
    assert_eq!(error.class(), "misconfigured");
    assert!(puts(&fake).is_empty() && fake.writes().is_empty());
}

#[tokio::test]
async fn retry_after_is_read_in_seconds_or_as_an_http_date() {
    let fake = FakeRest::start().await;
    let crm = rest(&fake, |_| {});
    fake.push_fault(fake::Fault::RateLimited { retry_after: Some("7".into()) });
    let error = crm.upsert(&contact("a@example.com", "A")).await.unwrap_err();
    assert_eq!(
        (error.class(), error.retry_after()),
        ("rate_limited", Some(Duration::from_secs(7)))
    );
    assert_eq!(error.answer().meta["retry-after"], "7", "kept as evidence");
    assert!(error.answer().meta.contains_key("x-request-id"));
    assert_eq!(error.answer().status, Some(429));

    let format = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    let date =
        (time::OffsetDateTime::now_utc() + time::Duration::seconds(30)).format(format).unwrap();
    fake.push_fault(fake::Fault::RateLimited { retry_after: Some(date) });
    let wait = crm.upsert(&contact("a@example.com", "A")).await.unwrap_err().retry_after().unwrap();
    assert!(wait > Duration::from_secs(25) && wait <= Duration::from_secs(30), "{wait:?}");

    fake.push_fault(fake::Fault::RateLimited { retry_after: Some("soon".into()) });
    let error = crm.upsert(&contact("a@example.com", "A")).await.unwrap_err();
    assert_eq!((error.class(), error.retry_after()), ("rate_limited", None));
    assert!(fake.writes().is_empty(), "a 429 writes nothing");
}

#[tokio::test]
async fn a_value_cannot_leave_the_path_the_settings_describe() {
    let fake = FakeRest::start().await;
    let crm = rest(&fake, |_| {});
    for value in ["../../health", "..", ".", "a/../../b", "x/y", ""] {
        let error = crm.upsert(&contact(value, "A")).await.unwrap_err();
        assert_eq!(error.class(), "rejected", "{value:?}: {error}");
        assert!(error.to_string().contains("settings.upsert.url"), "{error}");
        let error = crm.lookup(&(&contact(value, "")).into()).await.unwrap_err();
        assert_eq!(error.class(), "rejected", "{value:?}: {error}");
    }
    // `| safe` does not turn encoding off in a URL (only `urlencode`'s output is printed as
    // it is), and the rendered path is checked as well.
    let unsafe_url = rest(&fake, |s| {
        s["upsert"]["url"] = json!("/objects/{{ object }}/by/email/{{ external_id_value | safe }}");
    });
    for value in ["../../health", "%2e%2e/x", "a/%2E%2E/b"] {
        let error = unsafe_url.upsert(&contact(value, "A")).await.unwrap_err();
        assert_eq!(error.class(), "rejected", "{value:?}: {error}");
    }
    assert!(fake.requests().iter().all(|r| r.method != "PUT" && r.method != "GET"), "nothing sent");
    // Odd but harmless values arrive whole, as one segment.
    for value in ["%2e%2e", "ada lovelace+1@example.com", "..a", "a?b=c#d"] {
        crm.upsert(&contact(value, "A")).await.unwrap();
    }
    let values: Vec<String> = fake.writes().into_iter().map(|w| w.value).collect();
    assert_eq!(values, ["%2e%2e", "ada lovelace+1@example.com", "..a", "a?b=c#d"]);
    // A value marked safe cannot add a query either: it is one segment, whole.
    unsafe_url.upsert(&contact("q?mode=update&x=1", "A")).await.unwrap();
    assert_eq!(fake.writes().last().unwrap().value, "q?mode=update&x=1");
    assert!(fake.requests().iter().all(|r| !r.uri.contains("?mode=")), "{:#?}", fake.requests());
}

#[tokio::test]
async fn a_body_that_renders_invalid_json_is_rejected_and_not_sent() {
    let fake = FakeRest::start().await;
    let raw = rest(&fake, |s| {
        s["upsert"]["body"] = json!("{\"fields\": {\"name\": {{ fields.name | safe }}}}");
    });
    let error = raw.upsert(&contact("a@example.com", "Ada")).await.unwrap_err();
    assert_eq!(error.class(), "rejected");
    assert!(error.to_string().contains("settings.upsert.body"), "{error}");
    assert!(error.to_string().contains("not JSON"), "{error}");
    assert!(puts(&fake).is_empty() && fake.writes().is_empty(), "nothing was sent");

    // Printed values are JSON, so a quote or a brace in a value cannot break the body.
    let named = rest(&fake, |s| {
        s["upsert"]["body"] = json!("{\"fields\": {\"name\": {{ fields.name }}}}");
    });
    let tricky = "Ada \"the\" Countess\"}, \"admin\": \"yes";
    named.upsert(&contact("a@example.com", tricky)).await.unwrap();
    assert_eq!(fake.writes()[0].fields, BTreeMap::from([("name".to_owned(), tricky.to_owned())]));

    // A field the request does not have fails the render (strict undefined), and is not sent.
    let error = named
        .upsert(&UpsertRequest { fields: BTreeMap::new(), ..contact("b@example.com", "") })
        .await
        .unwrap_err();
    assert_eq!(error.class(), "rejected", "{error}");
    assert_eq!(fake.writes().len(), 1);
}

#[tokio::test]
async fn an_answer_over_max_answer_bytes_is_ambiguous_for_a_write_and_rejected_for_a_lookup() {
    let fake = FakeRest::start().await;
    let crm = rest(&fake, |s| s["max_answer_bytes"] = json!(1024));
    let long = "x".repeat(2000);
    let error = crm.upsert(&contact("a@example.com", &long)).await.unwrap_err();
    assert_eq!(error.class(), "ambiguous", "{error}");
    assert!(error.to_string().contains("max_answer_bytes"), "{error}");
    assert_eq!(fake.writes().len(), 1, "the write was applied: only its answer was too long");
    let error = crm.lookup(&(&contact("a@example.com", "")).into()).await.unwrap_err();
    assert_eq!(error.class(), "rejected", "{error}");
    // A short answer under the same bound is read.
    crm.upsert(&contact("b@example.com", "B")).await.unwrap();
}

#[tokio::test]
async fn lost_answers_are_ambiguous_for_writes_and_retryable_for_lookups() {
    let fake = FakeRest::start().await;
    let crm = rest(&fake, |_| {});
    fake.push_fault(fake::Fault::ConnectionDropped);
    let error = crm.upsert(&contact("a@example.com", "A")).await.unwrap_err();
    assert_eq!(error.class(), "ambiguous", "{error}");
    assert_eq!(error.answer().meta["request"], "PUT /objects/contacts/by/email/a%40example.com");
    assert_eq!(fake.writes().len(), 1, "the connection closed after the write was applied");

    fake.push_lookup_fault(fake::Fault::ConnectionDropped);
    let lookup = LookupRequest::from(&contact("a@example.com", ""));
    assert_eq!(crm.lookup(&lookup).await.unwrap_err().class(), "retryable");
    fake.push_lookup_fault(fake::Fault::LostResponse(Duration::from_secs(3)));
    assert_eq!(crm.lookup(&lookup).await.unwrap_err().class(), "retryable", "a read timed out");
    fake.push_lookup_fault(fake::Fault::ServerError(500));
    assert_eq!(crm.lookup(&lookup).await.unwrap_err().class(), "retryable");
    let LookupOutcome::Found { fields, .. } = crm.lookup(&lookup).await.unwrap() else {
        panic!("the write is there");
    };
    assert_eq!(fields["name"], "A");
    assert_eq!(fields["email"], "a@example.com");
}

#[tokio::test]
async fn a_connection_never_made_is_retryable() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closed = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let fake = FakeRest::start().await;
    let crm = rest(&fake, |s| {
        s["base_url"] = json!(closed);
        s["auth"] = json!("none");
    });
    let error = crm.upsert(&contact("a@example.com", "A")).await.unwrap_err();
    assert_eq!(error.class(), "retryable", "{error}");
}

#[tokio::test]
async fn update_only_writes_never_create() {
    let fake = FakeRest::start().await;
    let crm = rest(&fake, |_| {});
    let update =
        UpsertRequest { operation: Operation::UpdateOnly, ..contact("a@example.com", "A") };
    let error = crm.upsert(&update).await.unwrap_err();
    assert_eq!((error.class(), error.answer().status), ("rejected", Some(404)));
    assert!(fake.writes().is_empty());
    crm.upsert(&contact("a@example.com", "A")).await.unwrap();
    let updated = crm.upsert(&UpsertRequest { idempotency_key: "u2".into(), ..update }).await;
    assert!(!updated.unwrap().created);
    assert_eq!(
        puts(&fake).last().unwrap().uri,
        "/objects/contacts/by/email/a%40example.com?mode=update"
    );

    // Templates not known to honour `operation`: refused before anything is sent.
    let plain = rest(&fake, |s| s["upsert"]["update_only"] = json!(false));
    let sent = puts(&fake).len();
    let error = plain
        .upsert(&UpsertRequest {
            operation: Operation::UpdateOnly,
            ..contact("b@example.com", "B")
        })
        .await
        .unwrap_err();
    assert_eq!(error.class(), "rejected");
    assert_eq!(puts(&fake).len(), sent);
    assert!(!plain.describe().capabilities.update_only && crm.describe().capabilities.update_only);
}

#[tokio::test]
async fn static_auth_and_headers_are_sent_and_never_shown() {
    let fake = FakeRest::start().await;
    let crm = rest(&fake, |s| {
        s["auth"] = json!({"api_key": {"header": "X-Api-Key", "credential": "inhouse_api_key"}});
        s["headers"] = json!({"X-Client": "hookgate"});
        s["secret_headers"] = json!({"X-Tenant": "tenant"});
    });
    crm.upsert(&contact("a@example.com", "A")).await.unwrap();
    let sent = &puts(&fake)[0];
    assert_eq!(sent.headers["x-api-key"], fake::API_KEY);
    assert_eq!(sent.headers["x-client"], "hookgate");
    assert_eq!(sent.headers["x-tenant"], "tenant-7");
    let shown = format!("{crm:?}");
    assert!(!shown.contains(fake::API_KEY) && !shown.contains("tenant-7"), "{shown}");

    let bearer = rest(&fake, |s| s["auth"] = json!({"bearer": {"credential": "inhouse_token"}}));
    bearer.upsert(&contact("b@example.com", "B")).await.unwrap();
    assert_eq!(puts(&fake)[1].headers["authorization"], format!("Bearer {}", fake::STATIC_TOKEN));
    assert!(!format!("{bearer:?}").contains(fake::STATIC_TOKEN));

    // The fake takes no Basic credentials: a 401, a misconfiguration, after the header was
    // sent as RFC 7617 spells it.
    let basic = rest(&fake, |s| {
        s["auth"] = json!({"basic": {"username": "inhouse_client_id", "password": "tenant"}});
    });
    let error = basic.upsert(&contact("c@example.com", "C")).await.unwrap_err();
    assert_eq!((error.class(), error.answer().status), ("misconfigured", Some(401)));
    let expected =
        base64::engine::general_purpose::STANDARD.encode(format!("{}:tenant-7", fake::CLIENT_ID));
    assert_eq!(puts(&fake)[2].headers["authorization"], format!("Basic {expected}"));
    assert_eq!(fake.writes().len(), 2);

    let wrong_key = rest(&fake, |s| {
        s["auth"] = json!({"api_key": {"header": "X-Api-Key", "credential": "tenant"}});
    });
    assert_eq!(wrong_key.healthcheck().await.unwrap_err().class(), "misconfigured");
}

#[tokio::test]
async fn statuses_map_to_the_classes_the_settings_name() {
    let fake = FakeRest::start().await;
    let crm = rest(&fake, |s| {
        // This CRM's 422 means "try again later".
        s["classify"] = json!({"retryable": [422, 503], "rejected": [400]});
    });
    fake.push_fault(fake::Fault::Validation);
    assert_eq!(crm.upsert(&contact("a@example.com", "A")).await.unwrap_err().class(), "retryable");
    // 502 is in no list: a 5xx is retryable.
    fake.push_fault(fake::Fault::ServerError(502));
    assert_eq!(crm.upsert(&contact("a@example.com", "A")).await.unwrap_err().class(), "retryable");
    // 401 is no longer listed either: a 4xx is rejected.
    let static_token = rest(&fake, |s| {
        s["auth"] = json!({"bearer": {"credential": "tenant"}});
        s["classify"] = json!({"misconfigured": [403]});
    });
    assert_eq!(
        static_token.upsert(&contact("a@example.com", "A")).await.unwrap_err().class(),
        "rejected"
    );
    // A success the settings do not name for a write: it may have been applied.
    let strict = rest(&fake, |s| s["upsert"]["updated"] = json!([204]));
    strict.upsert(&contact("b@example.com", "B")).await.unwrap();
    let error = strict.upsert(&contact("b@example.com", "B2")).await.unwrap_err();
    assert_eq!(error.class(), "ambiguous", "{error}");
    assert_eq!(fake.writes().len(), 2);
}

#[tokio::test]
async fn a_write_answer_without_the_record_id_is_ambiguous() {
    let fake = FakeRest::start().await;
    let crm = rest(&fake, |s| s["upsert"]["record_id"] = json!("/record/id"));
    let error = crm.upsert(&contact("a@example.com", "A")).await.unwrap_err();
    assert_eq!(error.class(), "ambiguous");
    assert!(error.to_string().contains("settings.upsert.record_id"), "{error}");
    assert_eq!(fake.writes().len(), 1);
    let crm = rest(&fake, |s| s["lookup"]["record_id"] = json!("/record/id"));
    let error = crm.lookup(&(&contact("a@example.com", "")).into()).await.unwrap_err();
    assert_eq!(error.class(), "retryable", "an unreadable record is never taken for none");
}

/// `adjust`ed settings fail to build, with every `expected` fragment in the message.
#[track_caller]
fn check_refused(adjust: impl FnOnce(&mut Value), expected: &[&str]) {
    let mut settings = settings_at("http://127.0.0.1:9");
    adjust(&mut settings);
    let error = Rest::from_config(&map(settings), &credentials("s")).unwrap_err().0;
    for fragment in expected {
        assert!(error.contains(fragment), "`{fragment}` not in: {error}");
    }
}

fn settings_at(base_url: &str) -> Value {
    json!({
        "base_url": base_url,
        "auth": {"oauth_client_credentials": {
            "token_url": format!("{base_url}/oauth/token"),
            "client_id": "inhouse_client_id",
            "client_secret": "inhouse_client_secret",
        }},
        "upsert": {
            "method": "PUT",
            "url": "/objects/{{ object }}/by/{{ external_id_field }}/{{ external_id_value }}",
            "body": "{\"fields\": {{ fields }}}",
            "record_id": "/id",
        },
        "lookup": {
            "url": "/objects/{{ object }}/by/{{ external_id_field }}/{{ external_id_value }}",
            "record_id": "/id",
            "fields": "/fields",
        },
    })
}

#[test]
fn bad_settings_are_refused_naming_the_setting() {
    Rest::from_config(&map(settings_at("http://127.0.0.1:9")), &credentials("s")).unwrap();
    check_refused(|s| s["bse_url"] = json!("x"), &["settings: unknown field `bse_url`"]);
    check_refused(|s| s["upsert"]["methd"] = json!("PUT"), &["settings.upsert:", "`methd`"]);
    check_refused(|s| s["auth"] = json!({"token": {}}), &["settings.auth:", "`token`"]);
    check_refused(
        |s| s["upsert"]["body"] = json!("{\"fields\": {{ fields }"),
        &["settings.upsert.body:", "syntax error"],
    );
    check_refused(
        |s| s["lookup"]["url"] = json!("/objects/{{ externalid }}"),
        &["settings.lookup.url: unknown variable `externalid`"],
    );
    check_refused(
        |s| s["upsert"]["url"] = json!("https://elsewhere.example/{{ object }}"),
        &["settings.upsert.url:", "must be a path"],
    );
    check_refused(
        |s| s["upsert"]["url"] = json!("//elsewhere.example/x"),
        &["settings.upsert.url:"],
    );
    check_refused(
        |s| {
            s["base_url"] = json!("http://crm.example.com");
            s["auth"] = json!("none");
        },
        &["settings.base_url:", "must use https"],
    );
    check_refused(
        |s| s["auth"]["oauth_client_credentials"]["token_url"] = json!("http://crm.example.com/t"),
        &["settings.auth.oauth_client_credentials.token_url:", "must use https"],
    );
    check_refused(|s| s["timeout"] = json!("1h"), &["settings.timeout:", "from 100ms to 5m"]);
    check_refused(|s| s["timeout"] = json!("soon"), &["settings.timeout:", "not a duration"]);
    check_refused(|s| s["max_answer_bytes"] = json!(10), &["settings.max_answer_bytes:"]);
    check_refused(
        |s| s["classify"] = json!({"rejected": [201, 409]}),
        &["settings.upsert.created: 201 is also in settings.classify.rejected"],
    );
    check_refused(|s| s["upsert"]["updated"] = json!([302]), &["settings.upsert.updated: 302"]);
    check_refused(|s| s["lookup"]["record_id"] = json!("id"), &["settings.lookup.record_id:"]);
    check_refused(
        |s| s["lookup"].as_object_mut().unwrap().remove("fields").map(drop).unwrap(),
        &["settings.lookup.fields: is required", "it would be written again"],
    );
    check_refused(
        |s| s["lookup"]["body"] = json!("{}"),
        &["settings.lookup.body: a body needs `method: POST`"],
    );
    check_refused(
        |s| s["secret_headers"] = json!({"Authorization": "tenant"}),
        &["settings.secret_headers: `Authorization` is already set by settings.auth"],
    );
    check_refused(|s| s["headers"] = json!({"Host": "x"}), &["settings.headers: `Host`"]);
    check_refused(
        |s| s["secret_headers"] = json!({"X-Tenant": "nowhere"}),
        &["credentials: `nowhere` is required (settings.secret_headers.X-Tenant)"],
    );
    check_refused(
        |s| s["healthcheck"] = json!({"url": "/a/../b"}),
        &["settings.healthcheck.url:", "`..`"],
    );
    // Every problem at once, like a compiler.
    check_refused(
        |s| {
            s["timeout"] = json!("1h");
            s["upsert"]["record_id"] = json!("id");
            s["lookup"]["url"] = json!("objects");
        },
        &["settings.timeout:", "settings.upsert.record_id:", "settings.lookup.url:"],
    );
}

#[test]
fn a_missing_credential_names_the_setting_that_needs_it() {
    let settings = map(settings_at("http://127.0.0.1:9"));
    let error = Rest::from_config(&settings, &Credentials::new()).unwrap_err().0;
    assert!(
        error.contains(
            "credentials: `inhouse_client_secret` is required \
             (settings.auth.oauth_client_credentials.client_secret)"
        ),
        "{error}"
    );
    assert!(error.contains("`inhouse_client_id`"), "{error}");
}

#[test]
fn required_credentials_are_the_ones_the_settings_name() {
    let mut settings = settings_at("http://127.0.0.1:9");
    settings["secret_headers"] = json!({"X-Tenant": "tenant"});
    assert_eq!(
        required_credentials(&map(settings.clone())),
        ["inhouse_client_id", "inhouse_client_secret", "tenant"]
    );
    settings["auth"] = json!({"basic": {"username": "user", "password": "pass"}});
    assert_eq!(required_credentials(&map(settings.clone())), ["pass", "tenant", "user"]);
    settings["auth"] = json!("none");
    settings.as_object_mut().unwrap().remove("secret_headers");
    assert!(required_credentials(&map(settings)).is_empty());
}

#[test]
fn the_description_publishes_the_settings_schema() {
    let crm =
        Rest::from_config(&map(settings_at("http://127.0.0.1:9")), &credentials("s")).unwrap();
    let description = crm.describe();
    assert_eq!(description.kind, "http");
    assert!(!description.capabilities.idempotency_keys);
    let properties = &description.settings_schema["properties"];
    for setting in ["base_url", "timeout", "auth", "upsert", "lookup", "classify"] {
        assert!(
            properties[setting]["description"].is_string()
                || properties[setting]["$ref"].is_string()
                || properties[setting]["allOf"].is_array(),
            "`{setting}` is documented in the schema: {}",
            properties[setting]
        );
    }
    assert_eq!(description.settings_schema["additionalProperties"], json!(false));
    // The schema's bounds are written as literals in the attribute; they must be the code's.
    let bytes = &properties["max_answer_bytes"];
    assert_eq!(
        (&bytes["minimum"], &bytes["maximum"]),
        (&json!(ANSWER_BYTES_MIN), &json!(ANSWER_BYTES_MAX))
    );
}

/// The fake's documented API, asked directly: what the connector tests rely on.
#[tokio::test]
async fn the_fake_keeps_its_documented_api() {
    let fake = FakeRest::start().await;
    http::install_crypto_provider();
    let client = reqwest::Client::new();
    let url = format!("{}/objects/contacts/by/email/ada%40example.com", fake.base_url);
    let put = |body: Value, key: &str| {
        client
            .put(&url)
            .header("x-api-key", fake::API_KEY)
            .header("idempotency-key", key)
            .json(&body)
            .send()
    };
    for bad in [json!({}), json!({"fields": {"age": 36}}), json!([1])] {
        let answer = put(bad, "k0").await.unwrap();
        assert_eq!(answer.status(), 422);
        assert_eq!(answer.json::<Value>().await.unwrap()["error"], "validation");
    }
    let first = put(json!({"fields": {"name": "Ada"}}), "k1").await.unwrap();
    assert_eq!(first.status(), 201);
    let first: Value = first.json().await.unwrap();
    let again = put(json!({"fields": {"name": "Other"}}), "k1").await.unwrap();
    assert_eq!(again.status(), 201, "a repeated key gets the first answer");
    assert_eq!(again.json::<Value>().await.unwrap(), first);
    assert_eq!(fake.writes().len(), 1, "and writes nothing");
    assert_eq!(fake.records("contacts")[0].fields["name"], "Ada");

    let read = client.get(&url).bearer_auth(fake::STATIC_TOKEN).send().await.unwrap();
    assert_eq!(read.json::<Value>().await.unwrap()["fields"]["email"], "ada@example.com");
    let missing = format!("{}/objects/contacts/by/email/nobody", fake.base_url);
    let read = client.get(&missing).bearer_auth(fake::STATIC_TOKEN).send().await.unwrap();
    assert_eq!(read.status(), 404);
    let anonymous = client.get(&url).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
    assert!(anonymous.headers().contains_key("www-authenticate"));

    let token_url = format!("{}/oauth/token", fake.base_url);
    let grant = |form: &'static str| {
        client
            .post(&token_url)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form)
            .send()
    };
    assert_eq!(grant("grant_type=password").await.unwrap().status(), 400);
    let refused = grant("grant_type=client_credentials&client_id=x&client_secret=y").await;
    assert_eq!(refused.unwrap().json::<Value>().await.unwrap()["error"], "invalid_client");
    assert_eq!(fake.lock().token_requests, 0);
}
