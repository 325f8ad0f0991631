//! OTLP export end to end: `hookgate serve` (built with the `otlp` feature) as a child process,
//! pointed by `OTEL_EXPORTER_OTLP_ENDPOINT` at a local stand-in for a collector that keeps
//! every `POST /v1/traces`. One signed delivery, written to the mock CRM, must arrive as a
//! `delivery` span and an `attempt` span that name its pipeline, event and target.

// Test helpers panic on a broken setup, which is what a test should do.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::*;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::routing::post;
use serde_json::Value;

/// How long spans may take to arrive: the batch delay is 100 ms, the rest is slack for a
/// loaded CI machine.
const SPANS_WITHIN: Duration = Duration::from_secs(30);

/// What the stand-in collector was sent, one decoded request body each.
#[derive(Clone, Default)]
struct Received {
    requests: Arc<Mutex<Vec<Value>>>,
}

impl Received {
    /// Every span received so far, each with its resource's attributes beside it.
    fn spans(&self) -> Vec<ReceivedSpan> {
        let requests = self.requests.lock().unwrap();
        let mut spans = Vec::new();
        for request in requests.iter() {
            for resource_spans in array(&request["resourceSpans"]) {
                let resource = attributes(&resource_spans["resource"]);
                for scope_spans in array(&resource_spans["scopeSpans"]) {
                    for span in array(&scope_spans["spans"]) {
                        spans.push(ReceivedSpan {
                            name: span["name"].as_str().unwrap_or_default().to_owned(),
                            attributes: attributes(span),
                            resource: resource.clone(),
                        });
                    }
                }
            }
        }
        spans
    }
}

#[derive(Debug)]
struct ReceivedSpan {
    name: String,
    /// `key=value`, values as OTLP/JSON writes them (integers may come as strings).
    attributes: Vec<(String, String)>,
    resource: Vec<(String, String)>,
}

impl ReceivedSpan {
    /// The attribute named `key`; a name given twice is a failure, not a choice.
    fn attribute(&self, key: &str) -> Option<&str> {
        let mut named = self.attributes.iter().filter(|(k, _)| k == key);
        let first = named.next();
        assert!(named.next().is_none(), "`{key}` is given twice: {self:#?}");
        first.map(|(_, v)| v.as_str())
    }
}

fn array(value: &Value) -> &[Value] {
    value.as_array().map(Vec::as_slice).unwrap_or_default()
}

/// An OTLP/JSON `attributes` list as pairs; any value kind as its plain text.
fn attributes(owner: &Value) -> Vec<(String, String)> {
    array(&owner["attributes"])
        .iter()
        .map(|attribute| {
            let key = attribute["key"].as_str().unwrap_or_default().to_owned();
            let value = match attribute["value"].as_object().and_then(|v| v.values().next()) {
                Some(Value::String(text)) => text.clone(),
                Some(other) => other.to_string(),
                None => String::new(),
            };
            (key, value)
        })
        .collect()
}

/// A collector on a loopback port that answers every export with success.
async fn collector() -> (String, Received) {
    let received = Received::default();
    let router = axum::Router::new().route("/v1/traces", post(export)).with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    (format!("http://{address}"), received)
}

async fn export(
    State(received): State<Received>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, &'static str) {
    // A body that is not OTLP/JSON fails the test where it is read, with the body shown.
    let decoded = serde_json::from_slice(&body).unwrap_or_else(|error| {
        let kind = headers.get(header::CONTENT_TYPE);
        Value::String(format!("not JSON ({error}, content type {kind:?}): {body:?}"))
    });
    received.requests.lock().unwrap().push(decoded);
    (StatusCode::OK, "{}")
}

/// A mock CRM in a temporary directory, as the `crm` connector instance.
fn mock_crm_instances(dir: &tempfile::TempDir) -> std::path::PathBuf {
    let settings = serde_json::json!({
        "path": dir.path().join("crm.sqlite").display().to_string(),
        "idempotency": false,
        "faults": {},
    });
    let path = dir.path().join("hookgate.yaml");
    std::fs::write(
        &path,
        format!("connectors:\n  - name: crm\n    kind: mock\n    settings: {settings}\n"),
    )
    .unwrap();
    path
}

/// `hookgate serve` exporting to `endpoint`, with the standard variables the test does not
/// set removed, so that a developer's own OTLP setup cannot redirect or rename the spans.
fn exporting_server(database: &Database, crm: &tempfile::TempDir, endpoint: &str) -> ServerBuilder {
    ServerBuilder::new(database.url())
        .pipelines(root().join("tests/delivery/orders.yaml"))
        .instances(mock_crm_instances(crm))
        .workers(1)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        .without_env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .without_env("OTEL_EXPORTER_OTLP_PROTOCOL")
        .without_env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .without_env("OTEL_EXPORTER_OTLP_HEADERS")
        .without_env("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
        .without_env("OTEL_SERVICE_NAME")
        .without_env("OTEL_RESOURCE_ATTRIBUTES")
        .without_env("OTEL_TRACES_SAMPLER")
        .without_env("OTEL_SDK_DISABLED")
}

/// Sends one order and returns the event id intake answered with.
async fn accepted_order(server: &Server) -> i64 {
    let response = order("o-1", "C-1", 1, "paid").send(&client(), server).await;
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let answer: Value = response.json().await.unwrap();
    answer["event_id"].as_i64().unwrap_or_else(|| panic!("no event id in {answer}"))
}

async fn delivered(database: &Database) {
    let store = database.store().await;
    let done = eventually(Duration::from_secs(30), || async {
        store.unfinished_items().await.unwrap() == 0
    })
    .await;
    store.close().await;
    assert!(done, "the write was not delivered to the mock CRM within 30 s");
}

/// The spans named `delivery` and `attempt` for `event_id`, once both have arrived.
async fn spans_of_event(received: &Received, event_id: i64) -> (ReceivedSpan, ReceivedSpan) {
    let event_id = event_id.to_string();
    let is = |name: &str, span: &ReceivedSpan| {
        span.name == name && span.attribute("event_id") == Some(event_id.as_str())
    };
    let arrived = eventually(SPANS_WITHIN, || async {
        let spans = received.spans();
        spans.iter().any(|s| is("delivery", s)) && spans.iter().any(|s| is("attempt", s))
    })
    .await;
    let mut spans = received.spans();
    assert!(
        arrived,
        "no `delivery` and `attempt` spans for event {event_id} within {SPANS_WITHIN:?}; \
         received these spans:\n{spans:#?}\nin these requests: {:?}",
        received.requests.lock().unwrap(),
    );
    let delivery = spans.remove(spans.iter().position(|s| is("delivery", s)).unwrap());
    let attempt = spans.remove(spans.iter().position(|s| is("attempt", s)).unwrap());
    (delivery, attempt)
}

/// One delivery, written once: its intake span and its write's attempt span both name the
/// pipeline and the event id intake answered with; the attempt also names the target, the
/// outbox item, the attempt number and how it ended.
#[tokio::test]
async fn a_delivery_and_its_attempt_are_exported_as_spans() {
    let (endpoint, received) = collector().await;
    let database = Database::sqlite().await;
    let crm = tempfile::tempdir().unwrap();
    let server =
        exporting_server(&database, &crm, &endpoint).env("OTEL_BSP_SCHEDULE_DELAY", "100").start();

    let event_id = accepted_order(&server).await;
    delivered(&database).await;
    let (delivery, attempt) = spans_of_event(&received, event_id).await;

    assert_eq!(delivery.attribute("pipeline"), Some("orders"), "{delivery:#?}");
    assert_eq!(delivery.attribute("outcome"), Some("accepted"), "{delivery:#?}");
    assert_eq!(attempt.attribute("pipeline"), Some("orders"), "{attempt:#?}");
    assert_eq!(attempt.attribute("target"), Some("customer"), "{attempt:#?}");
    assert_eq!(attempt.attribute("attempt"), Some("1"), "{attempt:#?}");
    assert_eq!(attempt.attribute("outcome"), Some("done"), "{attempt:#?}");
    assert!(
        attempt.attribute("outbox_id").is_some_and(|id| id.parse::<i64>().is_ok()),
        "{attempt:#?}"
    );
    let service = |span: &ReceivedSpan| {
        span.resource.iter().find(|(k, _)| k == "service.name").map(|(_, v)| v.clone())
    };
    assert_eq!(service(&delivery).as_deref(), Some("hookgate"), "{delivery:#?}");
    assert_eq!(service(&attempt).as_deref(), Some("hookgate"), "{attempt:#?}");

    drop(server);
    database.cleanup().await;
}

/// Spans still queued when `serve` is stopped are exported on the way out: with a batch delay
/// far longer than the test, only the shutdown flush can send them.
#[tokio::test]
async fn spans_queued_at_shutdown_are_exported_when_serve_stops() {
    let (endpoint, received) = collector().await;
    let database = Database::sqlite().await;
    let crm = tempfile::tempdir().unwrap();
    let mut server = exporting_server(&database, &crm, &endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "600000")
        .start();

    let event_id = accepted_order(&server).await;
    delivered(&database).await;
    assert!(
        received.spans().is_empty(),
        "exported before the batch delay: {:#?}",
        received.spans()
    );

    server.terminate();
    let exited = eventually(Duration::from_secs(30), || {
        let exited = server.child.try_wait().unwrap().is_some();
        async move { exited }
    })
    .await;
    assert!(exited, "serve did not stop within 30 s of SIGTERM");
    let (delivery, attempt) = spans_of_event(&received, event_id).await;
    assert_eq!(delivery.attribute("pipeline"), Some("orders"), "{delivery:#?}");
    assert_eq!(attempt.attribute("target"), Some("customer"), "{attempt:#?}");

    drop(server);
    database.cleanup().await;
}
