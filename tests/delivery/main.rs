//! Delivery end to end: `hookgate serve` and `hookgate work` as child processes, a real SQLite
//! file or PostgreSQL database, and the mock CRM with injected faults. Effects are counted in
//! the mock's own effect log; the evidence is read back from the gateway's database.

// Test helpers panic on a broken setup, which is what a test should do.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::support::*;
use hookgate_connector_mock::Effect;
use hookgate_store::{AttemptOutcome, EventState, Store, WriteView};
use reqwest::StatusCode;

/// A mock CRM for one test: its file, and an instances file naming it `crm`.
struct Crm {
    dir: tempfile::TempDir,
}

impl Crm {
    /// `idempotency: false` throughout: the engine's guarantees must hold without the CRM's help.
    fn new(faults: serde_json::Value) -> Crm {
        let crm = Crm { dir: tempfile::tempdir().unwrap() };
        crm.write_instances("hookgate.yaml", faults);
        crm
    }

    fn mock_path(&self) -> String {
        self.dir.path().join("crm.sqlite").display().to_string()
    }

    /// Another instances file on the same mock file, with other faults.
    fn write_instances(&self, name: &str, faults: serde_json::Value) -> PathBuf {
        let settings =
            serde_json::json!({"path": self.mock_path(), "idempotency": false, "faults": faults});
        let path = self.dir.path().join(name);
        std::fs::write(
            &path,
            format!("connectors:\n  - name: crm\n    kind: mock\n    settings: {settings}\n"),
        )
        .unwrap();
        path
    }

    fn instances(&self) -> PathBuf {
        self.dir.path().join("hookgate.yaml")
    }

    async fn effects(&self) -> Vec<Effect> {
        let crm = mock_crm(&self.mock_path()).await;
        let effects = crm.effects().await.unwrap();
        crm.close().await;
        effects
    }
}

fn orders_pipeline() -> PathBuf {
    root().join("tests/delivery/orders.yaml")
}

fn server(database: &Database, crm: &Crm) -> ServerBuilder {
    ServerBuilder::new(database.url())
        .pipelines(orders_pipeline())
        .instances(crm.instances())
        .workers(4)
}

async fn drained(store: &Store) {
    let done = eventually(Duration::from_secs(90), || async {
        store.unfinished_items().await.unwrap() == 0
    })
    .await;
    assert!(done, "writes still pending after 90 s");
}

async fn accept(client: &reqwest::Client, server: &Server, delivery: &Delivery) -> i64 {
    let response = delivery.send(client, server).await;
    assert!(response.status().is_success(), "{}", response.status());
    let body: serde_json::Value = response.json().await.unwrap();
    body["event_id"].as_i64().unwrap()
}

fn outcomes(attempts: &[hookgate_store::AttemptRecord]) -> Vec<String> {
    attempts
        .iter()
        .map(|a| a.outcome.map_or("(unfinished)", AttemptOutcome::as_str).to_owned())
        .collect()
}

fn actions(attempts: &[hookgate_store::AttemptRecord]) -> Vec<String> {
    attempts.iter().map(|a| a.action.clone().unwrap_or_default()).collect()
}

/// GitHub posts `payload=<the JSON, url-encoded>` for a hook created with `content_type: form`
/// (its API's default). The shipped pipeline reads the document out of the form, so such a
/// push is accepted and written like a JSON one, and a retry of it is a duplicate; answering
/// 400 would lose it, since GitHub does not retry a 4xx.
#[tokio::test]
async fn a_github_form_encoded_push_is_accepted_and_written() {
    for database in Database::both().await {
        let backend = database.name();
        let crm = Crm::new(serde_json::json!({}));
        let server = ServerBuilder::new(database.url())
            .pipelines(root().join("pipelines/github.yaml"))
            .instances(crm.instances())
            .workers(2)
            .start();
        let store = database.store().await;
        let client = client();
        let push = github_form("form-1", &push_body("octocat", "c0ffee"));
        let response = push.send(&client, &server).await;
        assert_eq!(response.status(), StatusCode::ACCEPTED, "{backend}");
        let retried = push.send(&client, &server).await;
        assert_eq!(retried.status(), StatusCode::OK, "{backend}: a retry is a duplicate");
        drained(&store).await;
        let effects = crm.effects().await;
        assert_eq!(effects.len(), 1, "{backend}: {effects:?}");
        assert_eq!(effects[0].external_id_value, "octocat", "{backend}");
        assert_eq!(effects[0].fields["last_commit"], "c0ffee", "{backend}");
        assert_eq!(effects[0].fields["email"], "octocat@example.com", "{backend}");
        store.close().await;
    }
}

/// With `ordering`, the entity keys the write, yet a delivery whose CRM record cannot be named
/// (its external id does not render) is refused at intake, where the sender sees why and the
/// delivery is kept as rejected evidence, instead of being accepted and dead-lettered. An
/// external id that renders is accepted whatever its length, as the worker would write it.
#[tokio::test]
async fn a_delivery_whose_record_cannot_be_named_is_refused_at_intake() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = dir.path().join("orders.yaml");
    let text = std::fs::read_to_string(orders_pipeline()).unwrap();
    let by_account = text.replace(
        "value: \"{{ payload.customer }}\"",
        "value: \"{% if payload.status == 'none' %}{{ payload.account.id }}{% else %}{{ payload.status }}{% endif %}\"",
    );
    assert_ne!(by_account, text);
    std::fs::write(&pipeline, by_account).unwrap();
    for database in Database::both().await {
        let backend = database.name();
        let crm = Crm::new(serde_json::json!({}));
        let server = server(&database, &crm).pipelines(pipeline.clone()).start();
        let store = database.store().await;
        let response = order("o-1", "C-1", 1, "none").send(&client(), &server).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{backend}");
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body["status"], "rejected");
        let reason = body["reason"].as_str().unwrap();
        assert!(reason.contains("targets[0].external_id.value"), "{backend}: {reason}");
        assert_eq!(
            store
                .deliveries("orders", hookgate_store::DeliveryOutcome::Rejected)
                .await
                .unwrap()
                .len(),
            1,
            "{backend}"
        );
        assert!(store.events("orders").await.unwrap().is_empty(), "{backend}");

        let long = "x".repeat(300);
        let response = order("o-2", "C-1", 2, &long).send(&client(), &server).await;
        assert_eq!(response.status(), StatusCode::ACCEPTED, "{backend}");
    }
}

const HEADER_AND_NO_EVENTS: &str = "      ID  RECEIVED                  PIPELINE            STATE       DELIVERIES  KEY\n0 events\n";

/// `hookgate events` as an operator scripts it: every command's `--json` parses back, pages
/// follow their cursor to the end without a gap or a repeat, a wrong filter is an error that
/// names the valid values, bodies are shown on request, and reading never creates or
/// migrates a database.
#[tokio::test]
async fn operators_page_through_evidence_as_json_and_reading_creates_nothing() {
    let hookgate = |url: &str, args: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
            .args(["events", "--database-url", url, "--pipelines"])
            .arg(orders_pipeline())
            .args(args)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        (output.status.code(), stdout, stderr)
    };
    let lines = |text: &str| -> Vec<serde_json::Value> {
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    };
    for database in Database::both().await {
        let backend = database.name();
        // Before `serve` ever ran: no database (SQLite) or no schema (PostgreSQL), and reading
        // twice proves the first read did not create or migrate one.
        for _ in 0..2 {
            let (code, _, stderr) = hookgate(database.url(), &["list"]);
            assert_eq!(code, Some(1), "{backend}: {stderr}");
            let expected =
                if backend == "sqlite" { "no database at" } else { "not a hookgate database" };
            assert!(stderr.contains(expected), "{backend}: {stderr}");
        }

        let crm = Crm::new(serde_json::json!({}));
        let server = server(&database, &crm).start();
        let client = client();
        let mut accepted = Vec::new();
        for i in 0..7 {
            // DEL is allowed raw inside a JSON string, and must not reach a terminal raw.
            let body = format!(
                "{{\"id\":\"o-{i}\",\"customer\":\"C-{i}\",\"seq\":1,\"status\":\"paid\u{7f}\"}}"
            );
            let response = order_raw(body.as_bytes()).send(&client, &server).await;
            assert_eq!(response.status(), StatusCode::ACCEPTED, "{backend}");
            let answer: serde_json::Value = response.json().await.unwrap();
            accepted.push(answer["event_id"].as_i64().unwrap());
        }
        let refused = order_raw(b"not json").send(&client, &server).await;
        assert_eq!(refused.status(), StatusCode::BAD_REQUEST);

        // Pages of 3, newest first, followed to the end through the cursor.
        let mut seen = Vec::new();
        let mut after: Option<i64> = None;
        loop {
            let mut args = vec!["list".to_owned(), "--limit".into(), "3".into(), "--json".into()];
            if let Some(after) = after {
                args.extend(["--after".to_owned(), after.to_string()]);
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let (code, stdout, stderr) = hookgate(database.url(), &args);
            assert_eq!(code, Some(0), "{backend}: {stderr}");
            let page = lines(&stdout);
            after = page.last().and_then(|l| l["more"]["after"].as_i64());
            let events: Vec<&serde_json::Value> =
                page.iter().filter(|l| l.get("more").is_none()).collect();
            for event in &events {
                assert_eq!(event["pipeline"], "orders");
                assert!(event["received_at"].as_str().unwrap().ends_with('Z'), "{event}");
                seen.push(event["id"].as_i64().unwrap());
            }
            assert!(events.len() <= 3);
            if after.is_none() {
                break;
            }
        }
        let mut newest_first = accepted.clone();
        newest_first.reverse();
        assert_eq!(seen, newest_first, "{backend}: every event once, newest first");
        let (_, human, _) = hookgate(database.url(), &["list", "--limit", "3"]);
        assert!(human.contains("more: add `--after "), "{backend}: {human}");

        // Wrong filters name what is valid.
        let (code, _, stderr) = hookgate(database.url(), &["list", "--state", "finished"]);
        assert_eq!(code, Some(1));
        assert!(
            stderr.contains("unknown state `finished`: one of accepted, done, dead"),
            "{stderr}"
        );
        let (code, _, stderr) = hookgate(database.url(), &["list", "--pipeline", "order"]);
        assert_eq!(code, Some(1));
        assert!(stderr.contains("unknown pipeline `order`: one of orders"), "{stderr}");
        // A configured pipeline is valid before its first event.
        let shipped = root().join("pipelines");
        let shipped = shipped.to_str().unwrap();
        let (code, stdout, stderr) =
            hookgate(database.url(), &["--pipelines", shipped, "list", "--pipeline", "github"]);
        assert_eq!((code, stdout.as_str()), (Some(0), HEADER_AND_NO_EVENTS), "{stderr}");
        let (code, _, stderr) = hookgate(database.url(), &["list", "--limit", "0"]);
        assert_eq!(code, Some(1), "{stderr}");

        // Refused deliveries, with their reason.
        let (_, stdout, _) = hookgate(database.url(), &["rejected", "--body", "--json"]);
        let rejected = lines(&stdout);
        assert_eq!(rejected.len(), 1, "{backend}: {stdout}");
        assert!(rejected[0]["reason"].as_str().unwrap().contains("not valid JSON"), "{stdout}");
        assert_eq!(rejected[0]["body_bytes"], 8);
        assert_eq!(rejected[0]["body"]["text"], "not json");
        let (_, stdout, _) = hookgate(database.url(), &["rejected", "--body"]);
        assert!(stdout.contains("  body (8 bytes)\n  not json\n"), "{stdout}");
        assert!(stdout.ends_with("1 rejected delivery\n"), "{stdout}");

        // One event's story with its body: JSON keeps the text, the human form escapes it.
        let id = accepted[0].to_string();
        let (_, stdout, _) = hookgate(database.url(), &["show", &id, "--body", "--json"]);
        let story = &lines(&stdout)[0];
        assert_eq!(story["id"], accepted[0]);
        assert_eq!(story["writes"][0]["target"], "customer");
        assert!(story["body"]["text"].as_str().unwrap().contains("\"o-0\""), "{story}");
        assert_eq!(story["body"]["truncated"], false);
        let (_, stdout, _) = hookgate(database.url(), &["show", &id, "--body"]);
        assert!(stdout.contains("body (") && stdout.contains("\"id\":\"o-0\""), "{stdout}");
        assert!(!stdout.contains('\u{7f}'), "control characters are escaped: {stdout:?}");

        // The mock CRM's effect log, both ways.
        let store = database.store().await;
        drained(&store).await;
        store.close().await;
        let crm_command = |json: bool| {
            let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"));
            command.args(["crm", "--instances"]).arg(crm.instances()).arg("effects");
            if json {
                command.arg("--json");
            }
            String::from_utf8_lossy(&command.output().unwrap().stdout).into_owned()
        };
        let effects = lines(&crm_command(true));
        assert_eq!(effects.len(), 7, "{backend}");
        assert!(effects.iter().all(|e| e["created"] == true && e["object"] == "customers"));
        let human = crm_command(false);
        assert!(
            human.ends_with("7 effects\n") && human.contains("created customers=C-0"),
            "{human}"
        );
        // A relative path is the instances file's neighbour, wherever hookgate runs from; and
        // `crm` takes its options after the subcommand too, as the README writes them.
        let relative = crm.write_instances("relative.yaml", serde_json::json!({}));
        let text = std::fs::read_to_string(&relative).unwrap();
        let name = std::path::Path::new(&crm.mock_path()).file_name().unwrap().to_owned();
        std::fs::write(&relative, text.replace(&crm.mock_path(), name.to_str().unwrap())).unwrap();
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
            .args(["crm", "records", "--connector", "crm", "--json", "--instances"])
            .arg(&relative)
            .current_dir(root())
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        assert_eq!(lines(&String::from_utf8_lossy(&output.stdout)).len(), 7, "{backend}");
        // Inspecting a mock whose path is mistyped creates nothing.
        let typo = crm.write_instances("typo.yaml", serde_json::json!({}));
        let text = std::fs::read_to_string(&typo).unwrap();
        let missing = crm.dir.path().join("nowhere.sqlite");
        std::fs::write(&typo, text.replace(&crm.mock_path(), missing.to_str().unwrap())).unwrap();
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
            .args(["crm", "--instances"])
            .arg(&typo)
            .arg("records")
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&output.stderr).contains("no mock CRM database at"));
        assert!(!missing.exists());
        drop(server);
        database.cleanup().await;
    }
}

#[tokio::test]
async fn transient_failures_are_retried_until_success() {
    for database in Database::both().await {
        let crm = Crm::new(serde_json::json!({"fail_first_calls": 2}));
        let server = server(&database, &crm).start();
        let store = database.store().await;
        let client = client();
        let event = accept(&client, &server, &order("o-1", "C-1", 1, "paid")).await;
        drained(&store).await;

        let item = &store.outbox_for(event).await.unwrap()[0];
        assert_eq!((item.state.as_str(), item.attempts), ("done", 3), "{}", database.name());
        assert_eq!(store.event(event).await.unwrap().unwrap().state, EventState::Done);
        let attempts = store.attempts_for(event).await.unwrap();
        assert_eq!(outcomes(&attempts), ["retryable", "retryable", "created"]);
        assert_eq!(
            attempts.iter().map(|a| a.status).collect::<Vec<_>>(),
            [Some(503), Some(503), Some(201)]
        );
        assert!(
            attempts[0].excerpt.as_deref().unwrap().contains("SERVER_UNAVAILABLE"),
            "the CRM's answer is kept"
        );
        let metrics =
            client.get(server.url("/metrics")).send().await.unwrap().text().await.unwrap();
        for line in [
            r#"hookgate_attempts_total{pipeline="orders",target="customer",outcome="retryable"} 2"#,
            r#"hookgate_attempts_total{pipeline="orders",target="customer",outcome="created"} 1"#,
            r#"hookgate_writes_finished_total{pipeline="orders",target="customer",state="done"} 1"#,
            "hookgate_writes_unfinished 0",
            "hookgate_writes_dead 0",
            "hookgate_oldest_unfinished_write_age_seconds 0",
            r#"hookgate_crm_call_seconds_count{pipeline="orders",target="customer",action="upsert",outcome="retryable"} 2"#,
            r#"hookgate_crm_call_seconds_bucket{pipeline="orders",target="customer",action="upsert",outcome="created",le="30"} 1"#,
            r#"hookgate_db_pool_connections{state="in_use"}"#,
            "hookgate_db_pool_connections_max ",
        ] {
            assert!(metrics.contains(line), "`{line}` missing from\n{metrics}");
        }
        assert_eq!(crm.effects().await.len(), 1);
        store.close().await;
        drop(server);
        database.cleanup().await;
    }
}

#[tokio::test]
async fn a_rate_limit_retry_after_is_honoured() {
    for database in Database::both().await {
        let crm =
            Crm::new(serde_json::json!({"rate_limit_first_calls": 1, "retry_after_ms": 1500}));
        let server = server(&database, &crm).start();
        let store = database.store().await;
        let event = accept(&client(), &server, &order("o-1", "C-1", 1, "paid")).await;
        drained(&store).await;
        let attempts = store.attempts_for(event).await.unwrap();
        assert_eq!(outcomes(&attempts), ["rate_limited", "created"], "{}", database.name());
        let waited = attempts[1].started_at_ms - attempts[0].finished_at_ms.unwrap();
        // The pipeline's backoff alone would retry after about 100 ms.
        assert!(waited >= 1500, "retried {waited} ms after a 1500 ms retry-after");
        store.close().await;
        drop(server);
        database.cleanup().await;
    }
}

/// A CRM that keeps saying "later" is waited for, not given up on: rate-limited calls stay in
/// the evidence but do not count toward `attempts_max` (4 in this pipeline), so six 429s in a
/// row still end in one write, not a dead letter.
#[tokio::test]
async fn rate_limits_do_not_use_up_attempts() {
    for database in Database::both().await {
        let crm = Crm::new(serde_json::json!({"rate_limit_first_calls": 6, "retry_after_ms": 50}));
        let server = server(&database, &crm).start();
        let store = database.store().await;
        let event = accept(&client(), &server, &order("o-1", "C-1", 1, "paid")).await;
        drained(&store).await;
        let attempts = store.attempts_for(event).await.unwrap();
        let expected = ["rate_limited"; 6].into_iter().chain(["created"]).collect::<Vec<_>>();
        assert_eq!(outcomes(&attempts), expected, "{}", database.name());
        let writes = store.outbox_for(event).await.unwrap();
        assert_eq!(writes[0].state.as_str(), "done", "{}", database.name());
        assert_eq!(writes[0].attempts, 1, "only the write that succeeded counts");
        assert!(store.dead_events(Some("orders")).await.unwrap().is_empty());
        store.close().await;
        drop(server);
        database.cleanup().await;
    }
}

#[tokio::test]
async fn rejections_and_exhausted_attempts_are_dead_lettered_and_can_be_replayed() {
    for database in Database::both().await {
        let backend = database.name();
        let crm = Crm::new(serde_json::json!({"reject_external_ids": ["C-bad"]}));
        let mut server = server(&database, &crm).start();
        let store = database.store().await;
        let client = client();
        let rejected = accept(&client, &server, &order("o-1", "C-bad", 1, "paid")).await;
        let fine = accept(&client, &server, &order("o-2", "C-good", 1, "paid")).await;
        drained(&store).await;

        let item = &store.outbox_for(rejected).await.unwrap()[0];
        assert_eq!(
            (item.state.as_str(), item.attempts),
            ("dead", 1),
            "{backend}: a rejection is not retried"
        );
        assert!(
            item.last_error.as_deref().unwrap().starts_with("rejected: validation rule"),
            "{:?}",
            item.last_error
        );
        assert_eq!(store.event(rejected).await.unwrap().unwrap().state, EventState::Dead);
        assert_eq!(store.event(fine).await.unwrap().unwrap().state, EventState::Done);
        server.kill();

        // A CRM that fails every call: attempts run out.
        let failing = crm.write_instances("failing.yaml", serde_json::json!({"failure_rate": 1.0}));
        let server = ServerBuilder::new(database.url())
            .pipelines(orders_pipeline())
            .instances(failing.clone())
            .workers(4)
            .start();
        let exhausted = accept(&client, &server, &order("o-3", "C-3", 1, "paid")).await;
        drained(&store).await;
        let item = &store.outbox_for(exhausted).await.unwrap()[0];
        assert_eq!(
            (item.state.as_str(), item.attempts),
            ("dead", 4),
            "{backend}: attempts_max is 4"
        );
        assert!(
            item.last_error.as_deref().unwrap().starts_with("attempts exhausted (4): retryable"),
            "{:?}",
            item.last_error
        );
        drop(server);

        // Replay from the command line, against a CRM that works again.
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
            .args(["events", "--database-url", database.url(), "replay", "--dead"])
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        assert!(String::from_utf8_lossy(&output.stdout).contains("2 dead writes queued again"));
        let healthy = crm.write_instances("healthy.yaml", serde_json::json!({}));
        let worker = ServerBuilder::new(database.url())
            .pipelines(orders_pipeline())
            .instances(healthy)
            .workers(2)
            .start_workers();
        drained(&store).await;
        assert_eq!(
            store.outbox_for(exhausted).await.unwrap()[0].state.as_str(),
            "done",
            "{backend}"
        );
        assert_eq!(
            store.event(rejected).await.unwrap().unwrap().state,
            EventState::Done,
            "the rule is gone from this CRM"
        );

        // Listing, filtered by pipeline and state.
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
            .args([
                "events",
                "--database-url",
                database.url(),
                "list",
                "--pipeline",
                "orders",
                "--state",
                "done",
                "--since",
                "1h",
            ])
            .output()
            .unwrap();
        let listing = String::from_utf8_lossy(&output.stdout);
        assert!(listing.ends_with("3 events\n"), "{backend}: {listing}");
        assert!(
            listing.contains("  orders              done                 1  o-3\n"),
            "{backend}: {listing}"
        );

        // The whole story, as an operator reads it.
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
            .args(["events", "--database-url", database.url(), "show", &exhausted.to_string()])
            .output()
            .unwrap();
        let story = String::from_utf8_lossy(&output.stdout);
        for expected in [
            "state done",
            "attempts exhausted (4)",
            "replay_requested",
            "status 503",
            "by operator",
            "created",
        ] {
            assert!(story.contains(expected), "{backend}: `{expected}` missing from\n{story}");
        }
        let mut worker = worker;
        let _ = worker.kill();
        let _ = worker.wait();
        store.close().await;
        database.cleanup().await;
    }
}

#[tokio::test]
async fn a_lost_response_is_reconciled_without_a_second_write() {
    for database in Database::both().await {
        let crm = Crm::new(serde_json::json!({"lost_response_rate": 1.0}));
        let server = server(&database, &crm).start();
        let store = database.store().await;
        let event = accept(&client(), &server, &order("o-1", "C-1", 1, "paid")).await;
        drained(&store).await;
        let item = &store.outbox_for(event).await.unwrap()[0];
        assert_eq!((item.state.as_str(), item.attempts), ("done", 1), "{}", database.name());
        let attempts = store.attempts_for(event).await.unwrap();
        assert_eq!(outcomes(&attempts), ["ambiguous", "reconciled"], "every call is evidence");
        assert_eq!(actions(&attempts), ["upsert", "lookup"]);
        assert_eq!(attempts[1].attempt, 1, "both calls belong to the first attempt");
        assert_eq!(crm.effects().await.len(), 1, "the lookup saw the write; it was not repeated");
        store.close().await;
        drop(server);
        database.cleanup().await;
    }
}

#[tokio::test]
async fn a_call_that_times_out_is_treated_as_unknown_and_reconciled() {
    for database in Database::both().await {
        // The CRM applies the write and answers after 3 s; the worker gives up after 1 s.
        let crm = Crm::new(serde_json::json!({"latency_after_write_ms": 3000}));
        let server = server(&database, &crm).arg("--call-timeout-ms").arg("1000").start();
        let store = database.store().await;
        let event = accept(&client(), &server, &order("o-1", "C-1", 1, "paid")).await;
        drained(&store).await;
        let attempts = store.attempts_for(event).await.unwrap();
        assert_eq!(outcomes(&attempts), ["ambiguous", "reconciled"], "{}", database.name());
        assert_eq!(actions(&attempts), ["upsert", "lookup"]);
        assert!(
            attempts[0].error.as_deref().unwrap().contains("no answer within 1s"),
            "{:?}",
            attempts[0].error
        );
        assert_eq!(crm.effects().await.len(), 1);
        store.close().await;
        drop(server);
        database.cleanup().await;
    }
}

#[tokio::test]
async fn the_newer_version_wins_and_the_older_is_skipped_stale() {
    for database in Database::both().await {
        let crm = Crm::new(serde_json::json!({}));
        let server = server(&database, &crm).start();
        let store = database.store().await;
        let client = client();
        let newer = accept(&client, &server, &order("o-2", "C-1", 2, "shipped")).await;
        drained(&store).await;
        let older = accept(&client, &server, &order("o-1", "C-1", 1, "paid")).await;
        drained(&store).await;

        assert_eq!(store.outbox_for(newer).await.unwrap()[0].state.as_str(), "done");
        let stale = &store.outbox_for(older).await.unwrap()[0];
        assert_eq!(stale.state.as_str(), "skipped_stale", "{}", database.name());
        assert!(
            stale.last_error.as_deref().unwrap().contains("is not newer than"),
            "evidence: {:?}",
            stale.last_error
        );
        let effects = crm.effects().await;
        assert_eq!(effects.len(), 1, "the older version is never written");
        assert_eq!(effects[0].fields["status"], "shipped");
        store.close().await;
        drop(server);
        database.cleanup().await;
    }
}

#[tokio::test]
async fn a_worker_killed_mid_call_is_taken_over_after_its_lease_and_the_effect_happens_once() {
    for database in Database::both().await {
        let backend = database.name();
        // The CRM applies the write, then takes 20 s to answer: the worker dies in between.
        let crm = Crm::new(serde_json::json!({"latency_after_write_ms": 20_000}));
        let mut first = server(&database, &crm)
            .workers(1)
            .arg("--lease-ms")
            .arg("3000")
            .arg("--call-timeout-ms")
            .arg("2000")
            .start();
        let store = database.store().await;
        let event = accept(&client(), &first, &order("o-1", "C-1", 1, "paid")).await;
        let applied =
            eventually(Duration::from_secs(20), || async { crm.effects().await.len() == 1 }).await;
        assert!(applied, "{backend}: the write never reached the CRM");
        first.kill();
        assert_eq!(
            store.outbox_for(event).await.unwrap()[0].state,
            WriteView::InFlight,
            "{backend}: killed mid-call"
        );

        // Another worker process, on a CRM that answers at once, takes over when the lease ends.
        let fast = crm.write_instances("fast.yaml", serde_json::json!({}));
        let mut second = ServerBuilder::new(database.url())
            .pipelines(orders_pipeline())
            .instances(fast)
            .workers(1)
            .arg("--lease-ms")
            .arg("3000")
            .arg("--call-timeout-ms")
            .arg("2000")
            .start_workers();
        drained(&store).await;
        let item = &store.outbox_for(event).await.unwrap()[0];
        assert_eq!((item.state.as_str(), item.attempts), ("done", 2), "{backend}");
        let attempts = store.attempts_for(event).await.unwrap();
        assert_eq!(outcomes(&attempts), ["abandoned", "reconciled"], "{backend}");
        assert_eq!(actions(&attempts), ["lease", "lookup"], "{backend}: looked up before writing");
        assert_ne!(attempts[0].worker, attempts[1].worker, "another worker completed it");
        assert_eq!(crm.effects().await.len(), 1, "{backend}: exactly one effect");
        let _ = second.kill();
        let _ = second.wait();
        store.close().await;
        database.cleanup().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_a_thousand_events_a_flaky_crm_one_effect_each_in_version_order() {
    const ENTITIES: usize = 100;
    const VERSIONS: u64 = 10;
    let database = Database::postgres().await;
    let crm = Crm::new(serde_json::json!({"failure_rate": 0.2, "seed": 11}));
    // With 4 attempts, 0.2^4 of the items (about 1.6 in 1000) would be dead-lettered; this test
    // is about one effect per event, so give each item 12 attempts (0.2^12 * 1000 = 4e-6).
    let shipped = std::fs::read_to_string(orders_pipeline()).unwrap();
    let pipeline = crm.dir.path().join("orders.yaml");
    std::fs::write(&pipeline, shipped.replace("attempts_max: 4", "attempts_max: 12")).unwrap();
    let a = server(&database, &crm).pipelines(pipeline.clone()).workers(8).start();
    let b = server(&database, &crm).pipelines(pipeline).workers(8).start();
    let store = database.store().await;
    let client = client();

    // One stream per entity sends its versions in order, each event 1 to 3 times, alternating
    // between the two processes; the streams run concurrently.
    let urls = [a.url("/hooks/orders"), b.url("/hooks/orders")];
    let streams: Vec<_> = (0..ENTITIES)
        .map(|entity| {
            let (client, urls) = (client.clone(), urls.clone());
            tokio::spawn(async move {
                let mut answers = BTreeMap::new();
                for seq in 1..=VERSIONS {
                    let delivery = order(
                        &format!("o-{entity}-{seq}"),
                        &format!("C-{entity}"),
                        seq,
                        &format!("s{seq}"),
                    );
                    let copies = 1 + (entity + seq as usize) % 3;
                    for copy in 0..copies {
                        let mut request =
                            client.post(&urls[(entity + copy) % 2]).body(delivery.body.clone());
                        for (name, value) in &delivery.headers {
                            request = request.header(name, value);
                        }
                        let status = request.send().await.unwrap().status();
                        *answers.entry(status.as_u16()).or_insert(0usize) += 1;
                    }
                }
                answers
            })
        })
        .collect();
    let mut answers: BTreeMap<u16, usize> = BTreeMap::new();
    for stream in streams {
        for (status, count) in stream.await.unwrap() {
            *answers.entry(status).or_default() += count;
        }
    }
    assert_eq!(
        answers.get(&StatusCode::ACCEPTED.as_u16()),
        Some(&(ENTITIES * VERSIONS as usize)),
        "{answers:?}"
    );
    drained(&store).await;

    let events = store.events("orders").await.unwrap();
    assert_eq!(events.len(), 1000);
    assert!(events.iter().all(|e| e.state == EventState::Done), "every event done");
    let effects = crm.effects().await;
    let mut per_key: BTreeMap<&str, usize> = BTreeMap::new();
    for effect in &effects {
        *per_key.entry(&effect.idempotency_key).or_default() += 1;
    }
    assert_eq!(per_key.len(), 1000, "every event had an effect");
    assert!(per_key.values().all(|n| *n == 1), "no event had two effects");
    let mut last: BTreeMap<&str, u64> = BTreeMap::new();
    for effect in &effects {
        let seq: u64 = effect.fields["seq"].parse().unwrap();
        let previous = last.insert(&effect.external_id_value, seq).unwrap_or(0);
        assert!(
            seq > previous,
            "{}: version {seq} written after {previous}",
            effect.external_id_value
        );
    }
    // The CRM did fail about a fifth of the calls, and each failure was retried.
    let mut failed = 0;
    for event in &events {
        failed += store
            .attempts_for(event.id)
            .await
            .unwrap()
            .iter()
            .filter(|a| a.outcome == Some(AttemptOutcome::Retryable))
            .count();
    }
    assert!((100..600).contains(&failed), "{failed} failed calls out of about 1250");
    store.close().await;
    drop((a, b));
    database.cleanup().await;
}

#[test]
fn the_demo_shows_one_effect_per_write() {
    let dir = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
        .args(["demo", "--dir"])
        .arg(dir.path())
        .current_dir(root())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}\n{}", String::from_utf8_lossy(&output.stderr));
    for expected in [
        "the same delivery, retried         -> 200 duplicate (event 1)",
        "the same id with other content     -> 409 conflict (event 1)",
        "a forged signature                 -> 401 unauthorized",
        "skipped_stale",
        "Every write that was done had exactly one CRM effect",
    ] {
        assert!(text.contains(expected), "`{expected}` missing from\n{text}");
    }
    // The stories are told from listed events, which do not read the bodies: their sizes are
    // read beside them.
    let payloads: Vec<&str> = text.lines().filter(|line| line.contains("  payload  ")).collect();
    assert_eq!(payloads.len(), 3, "{text}");
    assert!(payloads.iter().all(|line| !line.contains(" 0 bytes")), "{payloads:?}");
}

#[test]
fn a_lease_that_cannot_cover_a_call_is_refused_naming_the_flags() {
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}", dir.path().join("never.db").display());
    for subcommand in ["serve", "work"] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
            .args([subcommand, "--database-url", &database, "--call-timeout-ms", "2500"])
            .env("HOOKGATE_LEASE_MS", "3000")
            .current_dir(root())
            .output()
            .unwrap();
        assert!(!output.status.success(), "{subcommand} started");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("--lease-ms (3000) and --call-timeout-ms (2500): a lease of 3000 ms cannot cover a CRM call of up to 2500 ms"),
            "{subcommand}: {stderr}"
        );
        assert!(!dir.path().join("never.db").exists(), "refused before anything was opened");
    }
    // `check` refuses it too, so that a deployment's CI catches what `serve` would refuse.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
        .args(["check", "--lease-ms", "3000", "--call-timeout-ms", "2500"])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let report = String::from_utf8_lossy(&output.stderr);
    assert!(
        report.starts_with(
            "error: --lease-ms (3000) and --call-timeout-ms (2500): a lease of 3000 ms"
        ),
        "{report}"
    );
    assert!(report.contains(": 1 error,"), "counted in the summary: {report}");
}
