//! The admin API over real HTTP: `hookgate serve` as a child process with its admin listener,
//! a SQLite file or PostgreSQL, the mock CRM. Answers are validated against the committed
//! OpenAPI document (`schemas/admin.openapi.json`), so the document cannot drift from them.

// Test helpers panic on a broken setup, which is what a test should do.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::Duration;

use crate::support::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

const TOKEN: &str = "admin-token-for-tests-0123456789";

/// A mock CRM that rejects customer `C-bad`, and an instances file naming it `crm`.
struct Crm {
    dir: tempfile::TempDir,
}

impl Crm {
    fn new() -> Crm {
        let crm = Crm { dir: tempfile::tempdir().unwrap() };
        crm.write_instances(&["C-bad"]);
        crm
    }

    fn mock_path(&self) -> String {
        self.dir.path().join("crm.sqlite").display().to_string()
    }

    fn write_instances(&self, rejected: &[&str]) {
        let settings = json!({"path": self.mock_path(), "idempotency": false,
            "faults": {"reject_external_ids": rejected}});
        std::fs::write(
            self.instances(),
            format!("connectors:\n  - name: crm\n    kind: mock\n    settings: {settings}\n"),
        )
        .unwrap();
    }

    fn instances(&self) -> PathBuf {
        self.dir.path().join("hookgate.yaml")
    }

    async fn effects_for(&self, customer: &str) -> usize {
        let crm = mock_crm(&self.mock_path()).await;
        let effects = crm.effects().await.unwrap();
        crm.close().await;
        effects.iter().filter(|e| e.external_id_value == customer).count()
    }
}

fn server(database: &Database, crm: &Crm) -> ServerBuilder {
    ServerBuilder::new(database.url())
        .pipelines(root().join("tests/delivery/orders.yaml"))
        .instances(crm.instances())
        .workers(4)
}

/// The admin API as a client sees it.
struct Api {
    base: String,
    client: reqwest::Client,
}

impl Api {
    fn url(&self, path: &str) -> String {
        format!("{}/api/v1{path}", self.base)
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let response = self.client.get(self.url(path)).bearer_auth(TOKEN).send().await.unwrap();
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn post(&self, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut request = self.client.post(self.url(path)).bearer_auth(TOKEN);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

/// The committed OpenAPI document.
fn openapi() -> Value {
    let text = std::fs::read_to_string(root().join("schemas/admin.openapi.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Fails unless `value` is valid against the document's component `name`.
fn assert_documented(document: &Value, name: &str, value: &Value) {
    let schema = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": format!("#/components/schemas/{name}"),
        "components": document["components"],
    });
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> =
        validator.iter_errors(value).map(|e| format!("{e} at {}", e.instance_path())).collect();
    assert!(errors.is_empty(), "{name} does not match the document: {errors:#?}\n{value:#}");
}

async fn accept(client: &reqwest::Client, server: &Server, delivery: &Delivery) -> i64 {
    let response = delivery.send(client, server).await;
    assert!(response.status().is_success(), "{}", response.status());
    let body: Value = response.json().await.unwrap();
    body["event_id"].as_i64().unwrap()
}

async fn event_state(api: &Api, id: i64) -> String {
    api.get(&format!("/events/{id}")).await.1["state"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn the_api_answers_evidence_as_documented_and_only_with_the_token() {
    let database = Database::sqlite().await;
    let crm = Crm::new();
    let (server, admin) = server(&database, &crm).start_with_admin(TOKEN);
    let client = client();
    let api = Api { base: admin, client: client.clone() };
    let document = openapi();

    let good = accept(&client, &server, &order("o-1", "C-good", 1, "paid")).await;
    let bad = accept(&client, &server, &order("o-2", "C-bad", 1, "paid")).await;
    // The same key with other content: a conflict, kept with its body.
    let conflict = order("o-1", "C-good", 1, "refunded").send(&client, &server).await;
    assert_eq!(conflict.status(), StatusCode::CONFLICT);
    let rejected = order_raw(b"not json").send(&client, &server).await;
    assert_eq!(rejected.status(), StatusCode::BAD_REQUEST);
    // Signed with another secret (a rotated one, say): 401, and counted for operators.
    let forged = order("o-9", "C-good", 1, "paid")
        .with_header("X-Signature", &format!("sha256={}", "0".repeat(64)));
    assert_eq!(forged.send(&client, &server).await.status(), StatusCode::UNAUTHORIZED);
    assert!(
        eventually(Duration::from_secs(30), || async {
            event_state(&api, bad).await == "dead" && event_state(&api, good).await == "done"
        })
        .await,
        "the good order is delivered and the bad one dead-lettered"
    );

    // Without the token, or with another, 401 and nothing else.
    for authorization in [None, Some("Bearer wrong-token-wrong-token"), Some(TOKEN)] {
        let mut request = client.get(api.url("/events"));
        if let Some(value) = authorization {
            request = request.header("authorization", value);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{authorization:?}");
        assert!(response.bytes().await.unwrap().is_empty(), "a 401 says nothing");
    }
    let (status, _) = Api { base: api.base.clone(), client: client.clone() }.get("/events").await;
    assert_eq!(status, StatusCode::OK);
    // Nor does the console's session cookie: the API takes the bearer token only.
    let no_redirects =
        client_builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let signed_in = no_redirects
        .post(format!("{}/console/login", api.base))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={TOKEN}"))
        .send()
        .await
        .unwrap();
    let cookie =
        signed_in.headers()["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_owned();
    let with_cookie = client
        .post(api.url("/pipelines/orders/pause"))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(with_cookie.status(), StatusCode::UNAUTHORIZED);
    // The intake listener does not serve the admin API.
    let on_intake =
        client.get(server.url("/api/v1/events")).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(on_intake.status(), StatusCode::NOT_FOUND);

    let (status, page) = api.get("/events?pipeline=orders&limit=1").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_documented(&document, "EventsPage", &page);
    assert_eq!(page["events"][0]["id"], bad, "newest first");
    let after = page["more"]["after"].as_i64().unwrap();
    let (_, next) = api.get(&format!("/events?limit=1&after={after}")).await;
    assert_eq!(next["events"][0]["id"], good);
    assert_eq!(next["more"], Value::Null, "the last page");
    let (_, dead) = api.get("/events?state=dead").await;
    assert_eq!(dead["events"].as_array().unwrap().len(), 1);

    let (status, story) = api.get(&format!("/events/{good}?body=true")).await;
    assert_eq!(status, StatusCode::OK);
    assert_documented(&document, "EventStory", &story);
    assert_eq!(
        story["body"]["text"],
        r#"{"id":"o-1","customer":"C-good","seq":1,"status":"paid"}"#
    );
    let outcomes: Vec<&str> = story["delivery_list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["accepted", "conflict"]);
    assert!(
        story["attempts"].as_array().unwrap().iter().any(|a| a["outcome"] == "created"),
        "{story:#}"
    );

    let (_, conflicts) = api.get("/conflicts?body=true").await;
    assert_documented(&document, "ConflictsPage", &conflicts);
    let first = &conflicts["conflicts"][0];
    assert_eq!(first["event_id"], good);
    assert_eq!(first["original_fingerprint"], story["fingerprint"]);
    assert_ne!(first["fingerprint"], story["fingerprint"], "both fingerprints, which differ");
    assert!(first["body"]["text"].as_str().unwrap().contains("refunded"));

    let (_, rejected) = api.get("/rejected?body=true").await;
    assert_documented(&document, "RejectedPage", &rejected);
    assert_eq!(rejected["rejected"][0]["body"]["text"], "not json");
    assert!(rejected["rejected"][0]["reason"].as_str().unwrap().contains("not valid JSON"));

    let refused = eventually(Duration::from_secs(10), || async {
        api.get("/refused?pipeline=orders").await.1["refused"]
            .as_array()
            .is_some_and(|r| !r.is_empty())
    })
    .await;
    let (_, page) = api.get("/refused?pipeline=orders").await;
    assert!(refused, "{page}");
    assert_documented(&document, "RefusedPage", &page);
    assert_eq!(page["refused"][0]["code"], "signature_mismatch", "{page}");
    assert_eq!(page["refused"][0]["refusals"], 1, "{page}");

    let (_, letters) = api.get("/dead-letters?pipeline=orders&target=customer").await;
    assert_documented(&document, "DeadLettersPage", &letters);
    let letter = &letters["dead_letters"][0];
    assert_eq!(
        (letter["event_id"].as_i64(), letter["entity"].as_str()),
        (Some(bad), Some("C-bad"))
    );
    assert!(letter["last_error"].as_str().unwrap().contains("rejected"), "{letter}");

    let (_, pipelines) = api.get("/pipelines").await;
    assert_documented(&document, "PipelinesAnswer", &pipelines);
    let target = &pipelines["pipelines"][0]["targets"][0];
    assert_eq!(
        (target["name"].as_str(), target["dead"].as_i64(), target["pending"].as_i64()),
        (Some("customer"), Some(1), Some(0))
    );

    // Bad input: a clear error that says which input and why.
    for (path, expected) in [
        ("/events?limit=0", "limit 0: a page holds 1 to 1000 rows"),
        ("/events?limit=1001", "limit 1001"),
        ("/events?state=finished", "state `finished`: one of accepted, done, dead"),
        ("/events?pipeline=nope", "unknown pipeline `nope`: one of orders"),
        ("/events?since=yesterday", "since `yesterday`"),
        ("/events?colour=red", "unknown field `colour`"),
        ("/dead-letters?after=x", "after"),
    ] {
        let (status, error) = api.get(path).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {error}");
        assert_documented(&document, "ApiError", &error);
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(expected), "{path}: {message}");
    }
    let (status, error) = api.get("/events/999999").await;
    assert_eq!(
        (status, error["message"].as_str()),
        (StatusCode::NOT_FOUND, Some("no event 999999"))
    );
    let (status, error) = api.post("/replay", Some(json!({}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error["message"].as_str().unwrap().contains("no filter"), "{error}");
    let (status, error) =
        api.post("/replay", Some(json!({"pipeline": "orders", "target": "nope"}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("target `nope`: pipeline `orders` has customer"),
        "{error}"
    );
    let (status, _) = api.post("/replay", Some(json!({"limit": 0, "all": true}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, error) = api.post("/pipelines/nope/pause", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(error["message"].as_str().unwrap().contains("one of orders"), "{error}");
    let (status, _) = api.post("/pipelines/orders/targets/nope/pause", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // A body over the admin bound is refused before it is read whole.
    let huge = json!({"reason": "x".repeat(128 * 1024)});
    let (status, _) = api.post("/pipelines/orders/pause", Some(huge)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);

    let (_, served) = api.get("/openapi.json").await;
    assert!(
        served == document,
        "the served document is the committed one: run `cargo xtask codegen`"
    );

    drop(server);
    database.cleanup().await;
}

#[tokio::test]
async fn pauses_hold_intake_and_delivery_and_replays_requeue_dead_letters() {
    let database = Database::sqlite().await;
    let crm = Crm::new();
    let (server, admin) = server(&database, &crm).start_with_admin(TOKEN);
    let client = client();
    let api = Api { base: admin, client: client.clone() };
    let document = openapi();

    // Intake paused: 503 with Retry-After, nothing stored; resumed: accepted.
    let (status, answer) =
        api.post("/pipelines/orders/pause", Some(json!({"reason": "CRM maintenance"}))).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_documented(&document, "PauseAnswer", &answer);
    assert_eq!((answer["paused"].as_bool(), answer["changed"].as_bool()), (Some(true), Some(true)));
    let (_, again) = api.post("/pipelines/orders/pause", None).await;
    assert_eq!(again["changed"], false, "already paused");
    let refused = order("o-1", "C-1", 1, "paid").send(&client, &server).await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(refused.headers().get("retry-after").is_some());
    assert_eq!(refused.json::<Value>().await.unwrap()["status"], "paused");
    let (_, pipelines) = api.get("/pipelines").await;
    assert_eq!(pipelines["pipelines"][0]["intake_paused"], true);
    assert_eq!(pipelines["pipelines"][0]["pause_reason"], "CRM maintenance");
    let (_, events) = api.get("/events").await;
    assert!(
        events["events"].as_array().unwrap().is_empty(),
        "nothing of a refused delivery is kept"
    );
    api.post("/pipelines/orders/resume", None).await;
    let first = accept(&client, &server, &order("o-1", "C-1", 1, "paid")).await;

    assert!(
        eventually(Duration::from_secs(20), || async { event_state(&api, first).await == "done" })
            .await
    );

    // Delivery paused: accepted and held, then delivered once resumed.
    let (status, _) = api.post("/pipelines/orders/targets/customer/pause", None).await;
    assert_eq!(status, StatusCode::OK);
    let held = accept(&client, &server, &order("o-2", "C-2", 1, "paid")).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(event_state(&api, held).await, "accepted", "held while paused");
    assert_eq!(crm.effects_for("C-2").await, 0, "no write reached the CRM");
    let (_, pipelines) = api.get("/pipelines").await;
    let target = &pipelines["pipelines"][0]["targets"][0];
    assert_eq!((target["paused"].as_bool(), target["pending"].as_i64()), (Some(true), Some(1)));
    api.post("/pipelines/orders/targets/customer/resume", None).await;
    assert!(
        eventually(Duration::from_secs(20), || async { event_state(&api, held).await == "done" })
            .await
    );
    assert_eq!(crm.effects_for("C-2").await, 1);

    // A dead letter, replayed after the CRM is fixed: delivered once.
    let dead = accept(&client, &server, &order("o-3", "C-bad", 1, "paid")).await;
    assert!(
        eventually(Duration::from_secs(30), || async { event_state(&api, dead).await == "dead" })
            .await
    );
    drop(server);
    crm.write_instances(&[]);
    let (server, admin) = self::server(&database, &crm).start_with_admin(TOKEN);
    let api = Api { base: admin, client: client.clone() };
    let (status, replayed) = api
        .post("/replay", Some(json!({"pipeline": "orders", "since": "2000-01-01T00:00:00Z"})))
        .await;
    assert_eq!(status, StatusCode::OK, "{replayed}");
    assert_documented(&document, "ReplayAnswer", &replayed);
    assert_eq!(replayed["events"], json!([{"event": dead, "queued": 1, "refused": null}]));
    assert_eq!(replayed["more"], false);
    assert!(
        eventually(Duration::from_secs(30), || async { event_state(&api, dead).await == "done" })
            .await
    );
    assert_eq!(crm.effects_for("C-bad").await, 1);
    let (_, story) = api.get(&format!("/events/{dead}")).await;
    let outcomes: Vec<&str> = story["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["outcome"].as_str())
        .collect();
    assert!(outcomes.contains(&"replay_requested"), "the replay is in the story: {outcomes:?}");
    let (_, nothing) = api.post(&format!("/events/{dead}/replay"), None).await;
    assert_eq!(nothing["queued"], 0, "nothing dead is left to replay");
    drop(server);
    database.cleanup().await;
}

/// Pauses live in the database: one gateway's pause holds the others' intake too.
#[tokio::test]
async fn a_pause_reaches_every_gateway_on_the_database() {
    let database = Database::postgres().await;
    let crm = Crm::new();
    let (first, admin) = server(&database, &crm).start_with_admin(TOKEN);
    let second = server(&database, &crm).start();
    let client = client();
    let api = Api { base: admin, client: client.clone() };
    api.post("/pipelines/orders/pause", None).await;
    assert_eq!(
        order("o-1", "C-1", 1, "paid").send(&client, &first).await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    let refused = || async {
        order("o-1", "C-1", 1, "paid").send(&client, &second).await.status()
            == StatusCode::SERVICE_UNAVAILABLE
    };
    assert!(
        eventually(Duration::from_secs(10), refused).await,
        "the other gateway reads the pause"
    );
    api.post("/pipelines/orders/resume", None).await;
    let accepted = || async {
        order("o-1", "C-1", 1, "paid").send(&client, &second).await.status().is_success()
    };
    assert!(eventually(Duration::from_secs(10), accepted).await, "and the resume");
    drop((first, second));
    database.cleanup().await;
}
