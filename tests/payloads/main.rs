//! Protected payloads end to end: `hookgate serve`, `hookgate events` and `hookgate keys` as
//! child processes over a real SQLite file and a real PostgreSQL database. Payloads sealed at
//! rest (nothing of a marker on disk), opened for the worker and for operators, masked where
//! operators see them, keys rotated while serving, and payloads deleted before their events
//! with dedupe intact.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use crate::support::*;
use hookgate_store::{PayloadTable, Store};
use reqwest::StatusCode;
use serde_json::Value;

const MARKER: &str = "MARKER-7c1e9f@example.com";
const KEY_1: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
const KEY_2: &str = "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=";

struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        Setup { dir: tempfile::tempdir().unwrap() }
    }

    fn mock_path(&self) -> String {
        self.dir.path().join("crm.sqlite").display().to_string()
    }

    /// An instances file with the mock CRM and these payload key ids, in order (`None`: no
    /// encryption). Key `k1` is read from `TEST_PAYLOAD_KEY_1`, `k2` from `TEST_PAYLOAD_KEY_2`.
    fn instances(&self, name: &str, keys: Option<&[&str]>) -> PathBuf {
        // Every answer to a write is lost, so each write is reconciled by a lookup whose
        // answer echoes the fields written, personal data included.
        let faults = serde_json::json!({"lost_response_rate": 1.0});
        let settings =
            serde_json::json!({"path": self.mock_path(), "idempotency": false, "faults": faults});
        let mut text =
            format!("connectors:\n  - name: crm\n    kind: mock\n    settings: {settings}\n");
        if let Some(keys) = keys {
            text.push_str("payload_encryption:\n  keys:\n");
            for id in keys {
                let n = id.trim_start_matches('k');
                text.push_str(&format!(
                    "    - id: {id}\n      secret: {{ env: TEST_PAYLOAD_KEY_{n} }}\n"
                ));
            }
        }
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    async fn crm_fields(&self) -> Vec<Value> {
        let crm = mock_crm(&self.mock_path()).await;
        let records = crm.records(None).await.unwrap();
        crm.close().await;
        records.into_iter().map(|r| serde_json::to_value(&r.fields).unwrap()).collect()
    }
}

fn pipeline() -> PathBuf {
    root().join("tests/payloads/orders.yaml")
}

fn server(database: &Database, instances: &Path) -> ServerBuilder {
    ServerBuilder::new(database.url())
        .pipelines(pipeline())
        .instances(instances.to_owned())
        .workers(2)
        .env("TEST_PAYLOAD_KEY_1", KEY_1)
        .env("TEST_PAYLOAD_KEY_2", KEY_2)
}

/// Runs `hookgate ARGS` against the database, with both keys in the environment.
fn hookgate(database: &Database, instances: &Path, args: &[&str]) -> Output {
    command(database, instances, args).output().unwrap()
}

fn command(database: &Database, instances: &Path, args: &[&str]) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"));
    command
        .args(args)
        .arg("--database-url")
        .arg(database.url())
        .arg("--instances")
        .arg(instances)
        .args(if args[0] == "events" { vec!["--pipelines".into(), pipeline()] } else { Vec::new() })
        .current_dir(root())
        .env("TEST_PAYLOAD_KEY_1", KEY_1)
        .env("TEST_PAYLOAD_KEY_2", KEY_2)
        .env_remove("DATABASE_URL")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    command
}

fn stdout(output: &Output) -> String {
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout.clone()).unwrap()
}

/// An order whose payload and headers carry personal data.
fn private_order(id: &str, customer: &str, seq: u64, card: &str) -> Delivery {
    let body = format!(
        r#"{{"id":"{id}","customer":"{customer}","seq":{seq},"status":"paid","email":"{MARKER}","cards":[{{"number":"{card}","brand":"visa"}}]}}"#
    );
    order_raw(body.as_bytes()).with_header("X-Customer-Email", MARKER)
}

async fn drained(store: &Store) {
    let done = eventually(Duration::from_secs(60), || async {
        store.unfinished_items().await.unwrap() == 0
    })
    .await;
    assert!(done, "writes still pending after 60 s");
}

/// Every byte of the database's files, for SQLite: the marker must be in none of them.
fn sqlite_files_contain(database: &Database, needle: &str) -> Option<PathBuf> {
    let Database::Sqlite { dir, .. } = database else { return None };
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
            return Some(path);
        }
    }
    None
}

/// Every stored body and header text, as the database returns it.
async fn stored_payloads(store: &Store) -> Vec<(String, Option<String>, Vec<u8>)> {
    let mut rows = Vec::new();
    for table in [PayloadTable::Events, PayloadTable::Deliveries] {
        for row in store.payloads_not_under(table, "(none)", 0, 10_000).await.unwrap() {
            let mut bytes = row.headers.into_bytes();
            bytes.extend(row.body.unwrap_or_default());
            rows.push((format!("{} {}", table.name(), row.id), row.sealed_with, bytes));
        }
    }
    rows
}

fn contains(bytes: &[u8], needle: &str) -> bool {
    bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// With a key configured, no body, header or rejected body is stored in plaintext: not in the
/// rows (both backends), not anywhere in the SQLite files. The worker still writes from them,
/// operators still read them (masked where the pipeline says), and a key rotation done while
/// the gateway serves leaves every event readable under the new key alone.
#[tokio::test]
async fn payloads_are_sealed_at_rest_opened_for_work_masked_for_operators_and_rotated() {
    for database in Database::both().await {
        let setup = Setup::new();
        let only_k1 = setup.instances("k1.yaml", Some(&["k1"]));
        let client = client();

        let mut first = server(&database, &only_k1).start();
        let accepted =
            private_order("o-1", "c-1", 1, "4242424242424242").send(&client, &first).await;
        assert_eq!(accepted.status(), StatusCode::ACCEPTED, "{}", database.name());
        let event_id = accepted.json::<Value>().await.unwrap()["event_id"].as_i64().unwrap();
        // A conflict (same key, other content) and a rejected delivery keep bodies too.
        let conflict =
            private_order("o-1", "c-1", 1, "5555555555554444").send(&client, &first).await;
        assert_eq!(conflict.status(), StatusCode::CONFLICT);
        let no_key = order_raw(format!(r#"{{"customer":"c-9","email":"{MARKER}"}}"#).as_bytes());
        assert_eq!(no_key.send(&client, &first).await.status(), StatusCode::BAD_REQUEST);
        let store = database.store().await;
        drained(&store).await;
        first.terminate();
        let _ = first.child.wait();

        // The worker opened the payload in memory and wrote from it.
        let fields = setup.crm_fields().await;
        assert_eq!(fields.len(), 1, "{fields:?}");
        assert_eq!(fields[0]["status"], "paid");
        assert_eq!(fields[0]["email"], MARKER, "written to the CRM, so its answers echo it");

        // At rest: sealed under k1, no marker in any row nor in any file of the database.
        let rows = stored_payloads(&store).await;
        let payload_rows = rows.iter().filter(|(row, ..)| !row.starts_with("attempt")).count();
        assert_eq!(
            payload_rows, 4,
            "the event, its accepted and conflicting deliveries, the rejected one"
        );
        // The mock CRM's answers carry no body; `tests/sources` shows answers sealed too.
        for (row, sealed_with, bytes) in &rows {
            assert_eq!(sealed_with.as_deref(), Some("k1"), "{row}");
            assert!(!contains(bytes, MARKER) && !contains(bytes, "4242"), "{row} holds plaintext");
        }
        assert_eq!(sqlite_files_contain(&database, MARKER), None);

        // Operators read the body, masked: the email, card numbers and the email header.
        let shown = stdout(&hookgate(
            &database,
            &only_k1,
            &["events", "show", &event_id.to_string(), "--body", "--json"],
        ));
        let story: Value = serde_json::from_str(shown.trim()).unwrap();
        let body: Value = serde_json::from_str(story["body"]["text"].as_str().unwrap()).unwrap();
        assert_eq!(body["email"], "[redacted]");
        assert_eq!(body["cards"][0]["number"], "[redacted]");
        assert_eq!(body["cards"][0]["brand"], "visa");
        assert_eq!(body["status"], "paid");
        assert_eq!(story["body"]["redaction"], "redacted");
        assert!(
            story["headers"].to_string().contains(r#"["x-customer-email","[redacted]"]"#),
            "{story}"
        );
        assert_eq!(story["payload"]["sealed_with"], "k1");
        assert_eq!(story["payload"]["payload_retention_secs"], 3600);
        let deliveries = story["delivery_list"].as_array().unwrap();
        let conflict = deliveries.iter().find(|d| d["outcome"] == "conflict").unwrap();
        let conflict_body = conflict["body"]["text"].as_str().unwrap();
        assert!(
            conflict_body.contains("[redacted]") && !conflict_body.contains("5555"),
            "{conflict_body}"
        );
        assert!(!shown.contains(MARKER), "{shown}");
        // The lookup that reconciled the lost answer echoes the email written: masked too.
        let lookup = story["attempts"].as_array().unwrap().iter().find(|a| a["action"] == "lookup");
        let answer = lookup.unwrap()["answer"].as_str().unwrap();
        assert!(answer.contains(r#""email":"[redacted]""#), "{answer}");
        let human = stdout(&hookgate(
            &database,
            &only_k1,
            &["events", "show", &event_id.to_string(), "--body"],
        ));
        // The real size of the body, not its sealed one: a format byte, nonce and tag more.
        let sent = private_order("o-1", "c-1", 1, "4242424242424242").body.len();
        let sizes = format!("{sent} bytes sealed under key `k1` ({} stored)", sent + 29);
        assert!(human.contains(&format!("{sizes}; payload_retention 1h")), "{human}");
        assert!(human.contains("body [redacted]") && !human.contains(MARKER), "{human}");
        let rejected = stdout(&hookgate(&database, &only_k1, &["events", "rejected", "--body"]));
        assert!(rejected.contains("[redacted]") && rejected.contains("c-9"), "{rejected}");
        assert!(!rejected.contains(MARKER), "{rejected}");

        // Without the key, a sealed row is an error naming the row and its key, not garbage.
        let plain = setup.instances("plain.yaml", None);
        let refused =
            hookgate(&database, &plain, &["events", "show", &event_id.to_string(), "--body"]);
        assert!(!refused.status.success());
        let error = String::from_utf8_lossy(&refused.stderr);
        assert!(error.contains(&format!("event {event_id}: the payload sealed under key `k1`, and no payload keys are configured")), "{error}");

        // Rotation while serving: new rows go under k2 at once; `keys rotate` re-seals the old.
        let rotating = setup.instances("k2-k1.yaml", Some(&["k2", "k1"]));
        let second = server(&database, &rotating).start();
        let rotate =
            command(&database, &rotating, &["keys", "rotate", "--batch", "1"]).spawn().unwrap();
        let newer = private_order("o-2", "c-2", 1, "4000056655665556").send(&client, &second).await;
        assert_eq!(newer.status(), StatusCode::ACCEPTED);
        let newer_id = newer.json::<Value>().await.unwrap()["event_id"].as_i64().unwrap();
        let report = stdout(&rotate.wait_with_output().unwrap());
        assert!(report.contains("events: 1 rows re-sealed under key `k2`"), "{report}");
        assert!(report.contains("deliveries: 3 rows re-sealed under key `k2`"), "{report}");
        assert!(report.contains("attempts: "), "{report}");
        drained(&store).await;
        // Run again: nothing left, which is how an interrupted rotation resumes.
        let again = stdout(&hookgate(&database, &rotating, &["keys", "rotate"]));
        assert!(
            again.contains("events: 0 rows")
                && again.contains("deliveries: 0 rows")
                && again.contains("attempts: 0 rows"),
            "{again}"
        );
        drop(second);
        for (row, sealed_with, bytes) in stored_payloads(&store).await {
            assert_eq!(sealed_with.as_deref(), Some("k2"), "{row}");
            assert!(!contains(&bytes, MARKER), "{row}");
        }
        assert_eq!(setup.crm_fields().await.len(), 2);

        // k1 can go: every event reads under k2 alone.
        let only_k2 = setup.instances("k2.yaml", Some(&["k2"]));
        for id in [event_id, newer_id] {
            let shown = stdout(&hookgate(
                &database,
                &only_k2,
                &["events", "show", &id.to_string(), "--body"],
            ));
            assert!(shown.contains(r#""status":"paid""#), "{shown}");
        }
        // A wrong key or a tampered row: refused, naming the row and the key.
        let wrong =
            hookgate(&database, &only_k1, &["events", "show", &event_id.to_string(), "--body"]);
        let error = String::from_utf8_lossy(&wrong.stderr);
        assert!(
            error.contains(&format!(
                "event {event_id}: the payload sealed under key `k2`, which is not configured"
            )),
            "{error}"
        );
        let row = store
            .payloads_not_under(PayloadTable::Events, "(none)", event_id - 1, 1)
            .await
            .unwrap();
        let mut tampered = row[0].body.clone().unwrap();
        let last = tampered.len() - 1;
        tampered[last] ^= 1;
        assert!(
            store
                .reseal_payload(
                    PayloadTable::Events,
                    event_id,
                    Some("k2"),
                    "k2",
                    &row[0].headers,
                    Some(&tampered)
                )
                .await
                .unwrap()
        );
        let broken =
            hookgate(&database, &only_k2, &["events", "show", &event_id.to_string(), "--body"]);
        let error = String::from_utf8_lossy(&broken.stderr);
        assert!(!broken.status.success());
        assert!(
            error.contains(&format!(
                "event {event_id}: the payload does not open under key `k2`: tampered with"
            )),
            "{error}"
        );
        // Rotating past a row that cannot be opened: it is named and left, the rest moves on.
        let back_to_k1 = setup.instances("k1-k2.yaml", Some(&["k1", "k2"]));
        let rotated = hookgate(&database, &back_to_k1, &["keys", "rotate"]);
        assert!(!rotated.status.success());
        let error = String::from_utf8_lossy(&rotated.stderr);
        assert!(
            error.contains(&format!(
                "cannot re-seal events row {event_id}: the body does not open under key `k2`"
            )),
            "{error}"
        );
        assert!(error.contains("1 rows could not be opened"), "{error}");
        let newer = store.event(newer_id).await.unwrap().unwrap();
        assert_eq!(newer.sealed_with.as_deref(), Some("k1"), "the rows after it moved on");
        let rejected =
            stdout(&hookgate(&database, &back_to_k1, &["events", "rejected", "--body", "--json"]));
        assert!(rejected.contains("[redacted]"), "other rows are shown: {rejected}");
        store.close().await;
        database.cleanup().await;
    }
}

/// After `payload_retention` the body and headers are gone while the event stays: a
/// redelivery is still a duplicate (and other content still a conflict), the evidence says
/// what happened, and a replay is refused with its reason.
#[tokio::test]
async fn after_payload_retention_the_payload_is_gone_but_dedupe_and_evidence_stay() {
    for database in Database::both().await {
        let setup = Setup::new();
        let plain = setup.instances("hookgate.yaml", None);
        let client = client();
        let server = server(&database, &plain).start();
        let delivery = private_order("o-1", "c-1", 1, "4242424242424242");
        let accepted = delivery.send(&client, &server).await;
        assert_eq!(accepted.status(), StatusCode::ACCEPTED);
        let event_id = accepted.json::<Value>().await.unwrap()["event_id"].as_i64().unwrap();
        let store = database.store().await;
        drained(&store).await;

        // What the sweeper runs once an hour has passed.
        let now = hookgate_engine::now_ms();
        assert_eq!(store.purge_payloads("orders", now + 1, now).await.unwrap().events, 1);
        assert_eq!(store.purge_payloads("orders", now + 1, now).await.unwrap().events, 0);
        let event = store.event(event_id).await.unwrap().unwrap();
        assert!(event.body.is_empty() && event.headers_json == "[]", "{event:?}");
        assert_eq!(event.payload_purged_at_ms, Some(now));
        for delivery in store.deliveries_for(event_id).await.unwrap() {
            assert_eq!((delivery.body, delivery.headers_json.as_str()), (None, "[]"));
        }

        // Dedupe holds on the key and fingerprint that stayed.
        let again = delivery.send(&client, &server).await;
        assert_eq!(again.status(), StatusCode::OK);
        assert_eq!(again.json::<Value>().await.unwrap()["status"], "duplicate");
        let other = private_order("o-1", "c-1", 2, "4242424242424242").send(&client, &server).await;
        assert_eq!(other.status(), StatusCode::CONFLICT);

        let shown = stdout(&hookgate(
            &database,
            &plain,
            &["events", "show", &event_id.to_string(), "--body"],
        ));
        assert!(
            shown.contains("payload      deleted at") && shown.contains("by payload_retention"),
            "{shown}"
        );
        assert!(shown.contains("deliveries (2 received, 1 conflicting)"), "{shown}");
        let replay = hookgate(&database, &plain, &["events", "replay", &event_id.to_string()]);
        assert!(!replay.status.success());
        let error = String::from_utf8_lossy(&replay.stderr);
        assert!(
            error.contains(&format!(
                "event {event_id} cannot be replayed: its payload was deleted at"
            )),
            "{error}"
        );
        store.close().await;
        drop(server);
        database.cleanup().await;
    }
}
