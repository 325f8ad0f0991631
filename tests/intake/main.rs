//! Intake end to end: `hookgate serve` as a child process, real HTTP over loopback, a real
//! SQLite file and a real PostgreSQL database. Each answer of the README is checked on both
//! backends, and what the server committed is read back from the database.

// Test helpers panic on a broken setup, which is what a test should do.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use hookgate_fakes::proxy::Proxy;
use reqwest::StatusCode;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn json(response: reqwest::Response) -> (StatusCode, Value) {
    let status = response.status();
    let body = response.json::<Value>().await.unwrap_or(Value::Null);
    (status, body)
}

#[tokio::test]
async fn every_answer_on_both_backends() {
    for database in Database::both().await {
        let backend = database.name();
        let server = ServerBuilder::new(database.url()).start();
        let client = client();
        let store = database.store().await;

        // New event: 202 with its id, after the commit.
        let first = github("d-1", &push_body("mona", "c1"));
        let (status, body) = json(first.send(&client, &server).await).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{backend}: {body}");
        assert_eq!(body["status"], "accepted");
        let event_id = body["event_id"].as_i64().unwrap();
        let event = store.event(event_id).await.unwrap().expect("committed before the answer");
        assert_eq!(
            (event.pipeline.as_str(), event.scope.as_str(), event.key.as_str()),
            ("github", "4242", "d-1")
        );
        assert_eq!(event.event_type.as_deref(), Some("push"));
        assert_eq!(event.body, first.body);
        assert!(
            !event.headers_json.contains("x-hub-signature-256"),
            "signature headers are not stored"
        );
        assert!(!event.headers_json.contains("must-not-be-stored"), "authorization is not stored");
        assert!(
            event.headers_json.contains(r#"["x-github-delivery","d-1"]"#),
            "{}",
            event.headers_json
        );
        let outbox = store.outbox_for(event_id).await.unwrap();
        assert_eq!(outbox.len(), 1, "one item per target whose `when` holds");
        assert_eq!((outbox[0].target.as_str(), outbox[0].state.as_str()), ("pusher", "pending"));

        // The same delivery again: 200, counted on the original, nothing scheduled.
        let (status, body) = json(first.send(&client, &server).await).await;
        assert_eq!(
            (status, body["status"].as_str()),
            (StatusCode::OK, Some("duplicate")),
            "{backend}"
        );
        assert_eq!(body["event_id"].as_i64(), Some(event_id));
        assert_eq!(store.event(event_id).await.unwrap().unwrap().delivery_count, 2);
        assert_eq!(store.outbox_for(event_id).await.unwrap().len(), 1);

        // Same key, different content: 409; the original stays, the conflict is kept.
        let changed = github("d-1", &push_body("mona", "c2"));
        let (status, body) = json(changed.send(&client, &server).await).await;
        assert_eq!(
            (status, body["status"].as_str()),
            (StatusCode::CONFLICT, Some("conflict")),
            "{backend}"
        );
        let original = store.event(event_id).await.unwrap().unwrap();
        assert_eq!(original.body, first.body);
        assert_eq!(original.conflict_count, 1);
        let conflicts =
            store.deliveries("github", hookgate_store::DeliveryOutcome::Conflict).await.unwrap();
        assert_eq!(conflicts.len(), 1);
        assert_eq!(conflicts[0].body.as_deref(), Some(changed.body.as_slice()));

        // A retry whose only change is excluded from the fingerprint is a duplicate.
        let t = now_secs();
        let a = standard(
            "msg-1",
            t,
            r#"{"type":"account.updated","attempted_at":"1","data":{"account_id":"a1","plan":"p","seats":1}}"#,
        );
        let b = standard(
            "msg-1",
            t,
            r#"{"type":"account.updated","attempted_at":"2","data":{"account_id":"a1","plan":"p","seats":1}}"#,
        );
        assert_eq!(a.send(&client, &server).await.status(), StatusCode::ACCEPTED);
        assert_eq!(b.send(&client, &server).await.status(), StatusCode::OK, "{backend}");

        // Signed correctly but no key can be derived: 400 with the reason; the body is kept.
        let garbage = partner_raw(b"PatientId=P-1".to_vec());
        let (status, body) = json(garbage.send(&client, &server).await).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{backend}");
        assert_eq!(body["status"], "rejected");
        assert!(body["reason"].as_str().unwrap().contains("the body is not valid JSON"), "{body}");
        let rejected = store
            .deliveries("crm-partner", hookgate_store::DeliveryOutcome::Rejected)
            .await
            .unwrap();
        assert_eq!(rejected.len(), 1);
        assert_eq!(rejected[0].body.as_deref(), Some(&b"PatientId=P-1"[..]));

        // Wrong signature: 401 without detail, and nothing stored.
        let forged = partner("P-9", "2026-01-01T00:00:00Z", "x")
            .with_header("X-Hub-Signature-256", "sha256=00");
        let (status, body) = json(forged.send(&client, &server).await).await;
        assert_eq!(
            (status, body),
            (StatusCode::UNAUTHORIZED, serde_json::json!({"status": "unauthorized"}))
        );
        assert!(store.events("crm-partner").await.unwrap().is_empty());

        // Unknown pipeline: 404.
        let (status, body) =
            json(client.post(server.url("/hooks/nope")).body("x").send().await.unwrap()).await;
        assert_eq!(
            (status, body["status"].as_str()),
            (StatusCode::NOT_FOUND, Some("unknown_pipeline"))
        );

        // Metrics: every answer above, counted by pipeline and outcome.
        let metrics =
            client.get(server.url("/metrics")).send().await.unwrap().text().await.unwrap();
        for line in [
            r#"hookgate_deliveries_total{pipeline="github",outcome="accepted"} 1"#,
            r#"hookgate_deliveries_total{pipeline="github",outcome="duplicate"} 1"#,
            r#"hookgate_deliveries_total{pipeline="github",outcome="conflict"} 1"#,
            r#"hookgate_deliveries_total{pipeline="crm-partner",outcome="rejected"} 1"#,
            r#"hookgate_deliveries_total{pipeline="crm-partner",outcome="unauthorized"} 1"#,
            r#"hookgate_deliveries_total{pipeline="(unknown)",outcome="unknown_pipeline"} 1"#,
            "hookgate_writes_unfinished 2",
            "hookgate_writes_dead 0",
        ] {
            assert!(metrics.contains(line), "{backend}: `{line}` missing from\n{metrics}");
        }
        assert!(
            metrics.contains("hookgate_intake_seconds_bucket{pipeline=\"github\",le=\"0.001\"}"),
            "{metrics}"
        );
        // Two writes wait (no workers here): the oldest has waited since it was received.
        let age = metrics
            .lines()
            .find_map(|l| l.strip_prefix("hookgate_oldest_unfinished_write_age_seconds "))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no backlog age in\n{metrics}"));
        assert!(age > 0.0 && age < 600.0, "{backend}: {age}");

        // Health and readiness.
        assert_eq!(
            client.get(server.url("/healthz")).send().await.unwrap().status(),
            StatusCode::OK
        );
        let (status, body) = json(client.get(server.url("/readyz")).send().await.unwrap()).await;
        assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("ready")));

        store.close().await;
        drop(server);
        database.cleanup().await;
    }
}

/// Fires `copies` identical deliveries at once, spread over `servers`, and counts answers.
async fn fire_concurrently(
    servers: &[&Server],
    delivery: &Delivery,
    copies: usize,
) -> (usize, usize) {
    let client = client();
    let tasks: Vec<_> = (0..copies)
        .map(|i| {
            let (client, delivery) = (client.clone(), delivery.clone());
            let url = servers[i % servers.len()].url(&format!("/hooks/{}", delivery.pipeline));
            tokio::spawn(async move {
                let mut request = client.post(url).body(delivery.body.clone());
                for (name, value) in &delivery.headers {
                    request = request.header(name, value);
                }
                request.send().await.unwrap().status()
            })
        })
        .collect();
    let (mut accepted, mut duplicates) = (0, 0);
    for task in tasks {
        match task.await.unwrap() {
            StatusCode::ACCEPTED => accepted += 1,
            StatusCode::OK => duplicates += 1,
            other => panic!("unexpected answer {other}"),
        }
    }
    (accepted, duplicates)
}

#[tokio::test]
async fn fifty_identical_deliveries_at_once_make_one_event() {
    for database in Database::both().await {
        let server = ServerBuilder::new(database.url()).start();
        let delivery = partner("P-50", "2026-03-01T10:00:00Z", "active");
        let (accepted, duplicates) = fire_concurrently(&[&server], &delivery, 50).await;
        assert_eq!((accepted, duplicates), (1, 49), "{}", database.name());
        let store = database.store().await;
        let events = store.events("crm-partner").await.unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].delivery_count, 50);
        let outbox = store.outbox_for(events[0].id).await.unwrap();
        assert_eq!(outbox.len(), 1);
        assert_eq!(outbox[0].entity, "P-50");
        assert_eq!(outbox[0].version.as_deref(), Some("2026-03-01T10:00:00.000000000Z"));
        store.close().await;
        drop(server);
        database.cleanup().await;
    }
}

#[tokio::test]
async fn two_server_processes_on_one_postgres_accept_an_event_once() {
    let database = Database::postgres().await;
    let a = ServerBuilder::new(database.url()).start();
    let b = ServerBuilder::new(database.url()).start();
    for round in 0..5 {
        let delivery = partner(&format!("P-{round}"), "2026-03-01T10:00:00Z", "active");
        let (accepted, duplicates) = fire_concurrently(&[&a, &b], &delivery, 50).await;
        assert_eq!((accepted, duplicates), (1, 49), "round {round}");
    }
    let store = database.store().await;
    let events = store.events("crm-partner").await.unwrap();
    assert_eq!(events.len(), 5);
    for event in &events {
        assert_eq!(event.delivery_count, 50);
        assert_eq!(store.outbox_for(event.id).await.unwrap().len(), 1);
    }
    store.close().await;
    drop((a, b));
    database.cleanup().await;
}

#[tokio::test]
async fn a_server_killed_mid_stream_loses_nothing_it_acknowledged() {
    // Far more than are answered before the kill, so the kill always lands mid-stream.
    const DELIVERIES: usize = 600;
    const KILL_AFTER: usize = 120;
    for database in Database::both().await {
        let backend = database.name();
        let mut server = ServerBuilder::new(database.url()).start();
        let deliveries: Vec<Delivery> = (0..DELIVERIES)
            .map(|i| partner(&format!("P-{i}"), "2026-03-01T10:00:00Z", "active"))
            .collect();
        let client = client_builder().timeout(Duration::from_secs(10)).build().unwrap();

        // Four streams of distinct deliveries; the server is killed with SIGKILL while they run.
        let acknowledged = Arc::new(std::sync::Mutex::new(HashSet::new()));
        let answered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let url = server.url("/hooks/crm-partner");
        let streams: Vec<_> = (0..4)
            .map(|stream| {
                let (client, url) = (client.clone(), url.clone());
                let (acknowledged, answered) = (Arc::clone(&acknowledged), Arc::clone(&answered));
                let mine: Vec<(usize, Delivery)> = deliveries
                    .iter()
                    .cloned()
                    .enumerate()
                    .filter(|(i, _)| i % 4 == stream)
                    .collect();
                tokio::spawn(async move {
                    for (i, delivery) in mine {
                        let mut request = client.post(&url).body(delivery.body.clone());
                        for (name, value) in &delivery.headers {
                            request = request.header(name, value);
                        }
                        match request.send().await {
                            Ok(response) if response.status().is_success() => {
                                acknowledged.lock().unwrap().insert(i);
                                answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            }
                            // Killed: the rest of this stream goes unanswered.
                            _ => return,
                        }
                    }
                })
            })
            .collect();
        let killed = async {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            while answered.load(std::sync::atomic::Ordering::SeqCst) < KILL_AFTER {
                if tokio::time::Instant::now() > deadline {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            true
        }
        .await;
        assert!(killed, "{backend}: the stream never reached {KILL_AFTER} answers");
        server.kill();
        for stream in streams {
            stream.await.unwrap();
        }
        let acknowledged = acknowledged.lock().unwrap().clone();
        assert!(
            acknowledged.len() >= KILL_AFTER && acknowledged.len() < DELIVERIES,
            "{backend}: {}",
            acknowledged.len()
        );

        // After a restart, every acknowledged delivery is in the inbox.
        let server = ServerBuilder::new(database.url()).start();
        let store = database.store().await;
        let stored: HashSet<String> =
            store.events("crm-partner").await.unwrap().into_iter().map(|e| e.key).collect();
        for i in &acknowledged {
            let key = hex_sha256(&deliveries[*i].body);
            assert!(
                stored.contains(&key),
                "{backend}: delivery {i} was acknowledged but is not stored"
            );
        }

        // Re-sending everything: what was stored is a duplicate, the rest is accepted, and each
        // event exists exactly once.
        let mut accepted_now = 0;
        for (i, delivery) in deliveries.iter().enumerate() {
            let status = delivery.send(&client, &server).await.status();
            let key = hex_sha256(&delivery.body);
            if stored.contains(&key) {
                assert_eq!(
                    status,
                    StatusCode::OK,
                    "{backend}: delivery {i} was stored before the kill"
                );
            } else {
                assert_eq!(status, StatusCode::ACCEPTED, "{backend}: delivery {i}");
                accepted_now += 1;
            }
        }
        assert_eq!(stored.len() + accepted_now, DELIVERIES);
        let events = store.events("crm-partner").await.unwrap();
        assert_eq!(events.len(), DELIVERIES, "{backend}: one event per distinct delivery");
        for event in &events {
            assert_eq!(
                store.outbox_for(event.id).await.unwrap().len(),
                1,
                "{backend}: outbox committed with its event"
            );
        }
        store.close().await;
        drop(server);
        database.cleanup().await;
    }
}

/// The key of a CRM-partner event: the pipeline's `body_sha256` rule.
fn hex_sha256(body: &[u8]) -> String {
    hookgate_pipeline::evaluate::body_sha256(body)
}

// The proxy runs on this test's runtime while `start()` blocks on the child's first line, so
// the runtime needs a second thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_unreachable_answers_503_then_recovers_by_itself() {
    let database = Database::postgres().await;
    let upstream: std::net::SocketAddr = "127.0.0.1:5432".parse().unwrap();
    let proxy = Proxy::start(upstream).await;
    let proxied_url = database.url().replace("127.0.0.1:5432", &proxy.address.to_string());
    assert_ne!(proxied_url, database.url(), "the test database must be on 127.0.0.1:5432");
    let server = ServerBuilder::new(&proxied_url).start();
    let client = client();

    assert_eq!(
        partner("P-1", "2026-03-01T10:00:00Z", "a").send(&client, &server).await.status(),
        StatusCode::ACCEPTED
    );

    proxy.cut().await;
    // Readiness stores nothing: wait on it until the server has noticed the cut, so that the
    // delivery below meets the outage (and nothing it answers 2xx meanwhile is miscounted).
    let noticed = eventually(Duration::from_secs(10), || async {
        client.get(server.url("/readyz")).send().await.unwrap().status()
            == StatusCode::SERVICE_UNAVAILABLE
    })
    .await;
    assert!(noticed, "readiness still passes 10 s after the database was cut off");
    let response = partner("P-2", "2026-03-01T10:00:00Z", "a").send(&client, &server).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "5");
    let (_, body) = json(response).await;
    assert_eq!(body["status"], "unavailable");
    assert_eq!(
        client.get(server.url("/readyz")).send().await.unwrap().status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        client.get(server.url("/healthz")).send().await.unwrap().status(),
        StatusCode::OK,
        "the process is up"
    );

    proxy.restore();
    let recovered = eventually(Duration::from_secs(20), || {
        let (client, delivery) = (client.clone(), partner("P-2", "2026-03-01T10:00:00Z", "a"));
        let server = &server;
        async move { delivery.send(&client, server).await.status() == StatusCode::ACCEPTED }
    })
    .await;
    assert!(recovered, "the server did not recover once the database was back");
    let store = database.store().await;
    assert_eq!(
        store.events("crm-partner").await.unwrap().len(),
        2,
        "nothing answered 503 was stored"
    );
    store.close().await;
    drop(server);
    database.cleanup().await;
}

#[tokio::test]
async fn bad_input_gets_its_documented_answer_and_the_server_stays_up() {
    for database in Database::both().await {
        let backend = database.name();
        let server =
            ServerBuilder::new(database.url()).arg("--body-limit-bytes").arg("65536").start();
        let client = client();

        // Oversized body: 413.
        let big = partner_raw(vec![b'x'; 70_000]);
        let (status, body) = json(big.send(&client, &server).await).await;
        assert_eq!(
            (status, body["status"].as_str()),
            (StatusCode::PAYLOAD_TOO_LARGE, Some("too_large")),
            "{backend}"
        );

        // Empty body, correctly signed: verified, then not JSON: 400.
        let (status, body) = json(partner_raw(Vec::new()).send(&client, &server).await).await;
        assert_eq!(
            (status, body["status"].as_str()),
            (StatusCode::BAD_REQUEST, Some("rejected")),
            "{backend}"
        );

        // Invalid UTF-8, correctly signed: 400, kept as evidence byte for byte.
        let invalid = vec![0xff, 0xfe, b'{', 0x80];
        assert_eq!(
            partner_raw(invalid.clone()).send(&client, &server).await.status(),
            StatusCode::BAD_REQUEST
        );

        // Headers over the 32 KiB limit: 431 with the limit.
        let big = "a".repeat(36 * 1024);
        let delivery = partner("P-1", "2026-03-01T10:00:00Z", "a").with_header("X-Padding", &big);
        let (status, body) = json(delivery.send(&client, &server).await).await;
        assert_eq!(
            (status, body["status"].as_str(), body["limit_bytes"].as_u64()),
            (StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, Some("headers_too_large"), Some(32768)),
            "{backend}"
        );
        // A header block that does not even fit the read buffer (the limit plus 8 KiB): 431
        // from the HTTP layer, and the connection closed. The server closes with the rest of
        // the block unread, so the client may see a reset instead of the answer.
        let mut stream = tokio::net::TcpStream::connect(server.address).await.unwrap();
        let head = format!(
            "POST /hooks/crm-partner HTTP/1.1\r\nHost: x\r\nX-Padding: {}\r\n\r\n",
            "a".repeat(100 * 1024)
        );
        let _ = stream.write_all(head.as_bytes()).await;
        let mut answer = Vec::new();
        let read =
            tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
        let read = read.expect("closed at once");
        assert!(
            read.is_err() || answer.starts_with(b"HTTP/1.1 431"),
            "{backend}: {}",
            String::from_utf8_lossy(&answer)
        );
        assert_eq!(
            client.get(server.url("/healthz")).send().await.unwrap().status(),
            StatusCode::OK
        );

        // A wrong content type does not matter: the signature and the pipeline decide.
        let plain =
            partner("P-2", "2026-03-01T10:00:00Z", "a").with_header("Content-Type", "text/plain");
        assert_eq!(plain.send(&client, &server).await.status(), StatusCode::ACCEPTED, "{backend}");

        // A replayed delivery with an old timestamp: 401.
        let old = standard("msg-old", now_secs() - 3600, r#"{"type":"account.updated"}"#);
        assert_eq!(
            old.send(&client, &server).await.status(),
            StatusCode::UNAUTHORIZED,
            "{backend}"
        );

        // Other methods: 405.
        assert_eq!(
            client.get(server.url("/hooks/crm-partner")).send().await.unwrap().status(),
            StatusCode::METHOD_NOT_ALLOWED
        );

        // Still up, and still accepting.
        assert_eq!(
            client.get(server.url("/healthz")).send().await.unwrap().status(),
            StatusCode::OK
        );
        assert_eq!(
            partner("P-3", "2026-03-01T10:00:00Z", "a").send(&client, &server).await.status(),
            StatusCode::ACCEPTED
        );
        let store = database.store().await;
        let rejected = store
            .deliveries("crm-partner", hookgate_store::DeliveryOutcome::Rejected)
            .await
            .unwrap();
        assert_eq!(rejected.len(), 2, "{backend}");
        assert_eq!(rejected[1].body.as_deref(), Some(invalid.as_slice()));
        store.close().await;
        drop(server);
        database.cleanup().await;
    }
}

#[tokio::test]
async fn sigterm_finishes_the_request_in_flight_then_exits() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let database = Database::sqlite().await;
    let mut server = ServerBuilder::new(database.url()).start();
    let delivery = partner("P-term", "2026-03-01T10:00:00Z", "a");

    // Half a request: headers and the first part of the body.
    let mut stream = tokio::net::TcpStream::connect(server.address).await.unwrap();
    let mut head = format!(
        "POST /hooks/crm-partner HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n",
        server.address,
        delivery.body.len()
    );
    for (name, value) in &delivery.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("Connection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let (first, rest) = delivery.body.split_at(10);
    stream.write_all(first).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    server.terminate();
    // New connections are refused while the one in flight completes.
    let refusing = eventually(Duration::from_secs(10), || async {
        client().get(server.url("/healthz")).send().await.is_err()
    })
    .await;
    assert!(refusing, "still accepting 10 s after SIGTERM");
    stream.write_all(rest).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 202"), "{answer}");

    let status = server.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let store = database.store().await;
    assert_eq!(store.events("crm-partner").await.unwrap().len(), 1);
    store.close().await;
    database.cleanup().await;
}

#[tokio::test]
async fn refuses_to_start_with_an_unset_secret_or_a_broken_pipeline() {
    let database = Database::sqlite().await;
    let output = ServerBuilder::new(database.url())
        .without_env("CRM_PARTNER_SECRET")
        .command()
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("pipelines/crm-partner.yaml:17:7: error[H0801]: environment variable `CRM_PARTNER_SECRET` is not set"), "{stderr}");

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("broken.yaml"), "name: broken\nsingature: {}\n").unwrap();
    let output = ServerBuilder::new(database.url())
        .pipelines(dir.path().join("broken.yaml"))
        .command()
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("broken.yaml:2:1: error[H0101]: unknown field `singature`"),
        "{stderr}"
    );
    database.cleanup().await;
}

/// `serve` needs the credentials of the connectors its pipelines write to, and only those: an
/// instance kept in `hookgate.yaml` for another deployment asks for nothing.
#[tokio::test]
async fn only_the_connectors_served_pipelines_use_need_credentials() {
    let database = Database::sqlite().await;
    let unset = ["SALESFORCE_CLIENT_ID", "SALESFORCE_CLIENT_SECRET", "HUBSPOT_TOKEN"];
    let mut github_only =
        ServerBuilder::new(database.url()).pipelines(root().join("pipelines/github.yaml"));
    for name in unset {
        github_only = github_only.without_env(name);
    }
    let server = github_only.start();
    let response = github("d-1", r#"{"after":"1","repository":{"full_name":"o/r"},"pusher":{"name":"m","email":"m@x.io"},"sender":{"login":"m"}}"#)
        .send(&client(), &server)
        .await;
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    drop(server);

    let mut with_salesforce =
        ServerBuilder::new(database.url()).pipelines(root().join("pipelines/shopify.yaml"));
    for name in unset {
        with_salesforce = with_salesforce.without_env(name);
    }
    let output = with_salesforce.command().output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("environment variable `SALESFORCE_CLIENT_ID` is not set"), "{stderr}");
    assert!(!stderr.contains("HUBSPOT_TOKEN"), "{stderr}");
    database.cleanup().await;
}

/// `--log-format json`: every log line is one JSON object with plain field values (no Rust
/// Debug output such as `Some(...)`), so log collectors can index them.
#[tokio::test]
async fn json_logs_are_one_object_per_line_with_plain_values() {
    let database = Database::sqlite().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let server = ServerBuilder::new(database.url())
        .arg("--log-format")
        .arg("json")
        .env("RUST_LOG", "info")
        .log(log.clone())
        .start();
    let refused = partner_raw(b"{}".to_vec()).with_header("X-Hub-Signature-256", "sha256=00");
    assert_eq!(refused.send(&client(), &server).await.status(), StatusCode::UNAUTHORIZED);
    drop(server);
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let started = lines.iter().find(|l| l["message"] == "started");
    let started = started.unwrap_or_else(|| panic!("no `started` line in\n{text}"));
    assert_eq!(started["level"], "INFO");
    let address = started["address"].as_str().unwrap();
    assert!(address.starts_with("127.0.0.1:"), "{started}");
    assert!(started["pipelines"].as_str().unwrap().contains("crm-partner"), "{started}");
    assert!(!text.contains("Some("), "{text}");
    assert!(lines.iter().any(|l| l["reason"] == "unauthorized"), "{text}");
    database.cleanup().await;
}

#[tokio::test]
async fn a_body_that_never_finishes_is_answered_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let database = Database::sqlite().await;
    let server = ServerBuilder::new(database.url()).arg("--read-timeout-secs").arg("1").start();
    let mut stream = tokio::net::TcpStream::connect(server.address).await.unwrap();
    let head = format!(
        "POST /hooks/crm-partner HTTP/1.1\r\nHost: {}\r\nContent-Length: 100\r\n\r\n{{\"Pat",
        server.address
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = vec![0; 1024];
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..read]);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains(r#"{"status":"read_timeout"}"#), "{answer}");
    drop(server);
    database.cleanup().await;
}

#[tokio::test]
async fn a_pipeline_may_answer_conflicts_with_a_2xx() {
    let database = Database::sqlite().await;
    let dir = tempfile::tempdir().unwrap();
    let shipped = std::fs::read_to_string(root().join("pipelines/github.yaml")).unwrap();
    std::fs::write(dir.path().join("github.yaml"), format!("{shipped}conflict_status: 200\n"))
        .unwrap();
    let server =
        ServerBuilder::new(database.url()).pipelines(dir.path().join("github.yaml")).start();
    let client = client();
    assert_eq!(
        github("d-9", &push_body("a", "1")).send(&client, &server).await.status(),
        StatusCode::ACCEPTED
    );
    let (status, body) =
        json(github("d-9", &push_body("a", "2")).send(&client, &server).await).await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("conflict")));
    let store = database.store().await;
    assert_eq!(
        store.deliveries("github", hookgate_store::DeliveryOutcome::Conflict).await.unwrap().len(),
        1,
        "recorded all the same"
    );
    store.close().await;
    drop(server);
    database.cleanup().await;
}

/// URL-signed senders over real HTTP: Twilio's published vectors verify against the pipeline's
/// `public_url` with the query string as sent, Square's against `--public-url` plus the path;
/// a form body becomes the payload; a body that is not the one `bodySHA256` names is refused
/// with its code counted, and nothing of it stored.
#[tokio::test]
async fn url_signed_senders_verify_against_the_public_url() {
    let database = Database::sqlite().await;
    let dir = tempfile::tempdir().unwrap();
    let twilio = std::fs::read_to_string(root().join("pipelines/senders/twilio.yaml")).unwrap();
    let twilio = twilio.replace(
        "# public_url: https://hooks.example.com/hooks/twilio",
        "public_url: https://mycompany.com/myapp.php",
    );
    assert!(twilio.contains("\npublic_url:"));
    std::fs::write(dir.path().join("twilio.yaml"), &twilio).unwrap();
    // The same pipeline without `public_url`, under another name: it sees the URL the
    // gateway rebuilds from `--public-url`, which Twilio did not sign.
    let unset = twilio
        .replace("\npublic_url:", "\n# public_url:")
        .replace("name: twilio", "name: twilio-unset");
    std::fs::write(dir.path().join("twilio-unset.yaml"), unset).unwrap();
    std::fs::copy(root().join("pipelines/senders/square.yaml"), dir.path().join("square.yaml"))
        .unwrap();
    let twilio_json =
        std::fs::read_to_string(root().join("pipelines/senders/twilio-json.yaml")).unwrap();
    std::fs::write(
        dir.path().join("twilio-json.yaml"),
        twilio_json.replace(
            "# public_url: https://hooks.example.com/hooks/twilio-json",
            "public_url: https://mycompany.com/myapp.php",
        ),
    )
    .unwrap();
    let server = ServerBuilder::new(database.url())
        .pipelines(dir.path().to_path_buf())
        .arg("--public-url")
        .arg("https://hooks.example.com")
        .env("TWILIO_AUTH_TOKEN", "12345")
        .env("SQUARE_SIGNATURE_KEY", "square-e2e-key")
        .start();
    let client = client();
    let post =
        |path: &str, content_type: &str, signature_header: &str, signature: &str, body: &[u8]| {
            client
                .post(server.url(path))
                .header("Content-Type", content_type)
                .header("I-Twilio-Idempotency-Token", format!("token-{}", body.len()))
                .header(signature_header, signature)
                .body(body.to_vec())
                .send()
        };
    // twilio-python test_request_validator.py: the documented form example.
    let form = b"CallSid=CA1234567890ABCDE&Caller=%2B14158675309&Digits=1234&From=%2B14158675309&To=%2B18005551212";
    let form_type = "application/x-www-form-urlencoded";
    let signature = "RSOYDt4T1cUTdK1PDd93/VVr8B8=";
    let response =
        post("/hooks/twilio?foo=1&bar=2", form_type, "X-Twilio-Signature", signature, form)
            .await
            .unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let response =
        post("/hooks/twilio-unset?foo=1&bar=2", form_type, "X-Twilio-Signature", signature, form)
            .await
            .unwrap();
    assert_eq!(
        response.status(),
        StatusCode::UNAUTHORIZED,
        "the URL Twilio signed is not this one"
    );
    let response =
        post("/hooks/twilio?foo=1&bar=3", form_type, "X-Twilio-Signature", signature, form)
            .await
            .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "the query string is signed");

    // JSON bodies: the URL carries the body's SHA-256 (twilio-python test_validate_body).
    let json_body = br#"{"property": "value", "boolean": true}"#;
    let digest = "0a1ff7634d9ab3b95db5c9a2dfe9416e41502b283a80c7cf19632632f96e6620";
    let json_path = format!("/hooks/twilio-json?foo=1&bar=2&bodySHA256={digest}");
    let response = post(
        &json_path,
        "application/json",
        "X-Twilio-Signature",
        "a9nBmqA0ju/hNViExpshrM61xv4=",
        json_body,
    )
    .await
    .unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let tampered = br#"{"property": "value", "boolean": false}"#;
    let response = post(
        &json_path,
        "application/json",
        "X-Twilio-Signature",
        "a9nBmqA0ju/hNViExpshrM61xv4=",
        tampered,
    )
    .await
    .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);

    // Square signs `--public-url` + path + body.
    let square_body =
        br#"{"merchant_id":"M1","type":"customer.created","event_id":"sq-1","data":{}}"#;
    let mac = hookgate_verify::compute_mac(
        hookgate_verify::Algorithm::HmacSha256,
        b"square-e2e-key",
        &[b"https://hooks.example.com/hooks/square", square_body],
    );
    let square_signature = hookgate_verify::Encoding::Base64.encode(&mac);
    let response = post(
        "/hooks/square",
        "application/json",
        "X-Square-HmacSha256-Signature",
        &square_signature,
        square_body,
    )
    .await
    .unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);

    // What was stored: the form's decoded values made the payload; the refused bodies left
    // nothing behind but their codes.
    let store = database.store().await;
    let events = store.events("twilio").await.unwrap();
    assert_eq!(events.len(), 1, "the form delivery");
    assert_eq!(store.events("twilio-json").await.unwrap().len(), 1, "the JSON delivery");
    let form_event = events.iter().find(|e| e.body == form).expect("the form event");
    let outbox = store.outbox_for(form_event.id).await.unwrap();
    assert_eq!(outbox.len(), 1);
    assert_eq!(outbox[0].entity, "+14158675309", "`%2B` decoded in the form payload");
    assert!(store.events("twilio-unset").await.unwrap().is_empty());
    assert_eq!(store.events("square").await.unwrap().len(), 1);
    let metrics = client.get(server.url("/metrics")).send().await.unwrap().text().await.unwrap();
    for line in [
        r#"hookgate_signature_rejections_total{pipeline="twilio",code="signature_mismatch"} 1"#,
        r#"hookgate_signature_rejections_total{pipeline="twilio-json",code="body_digest_mismatch"} 1"#,
        r#"hookgate_signature_rejections_total{pipeline="twilio-unset",code="signature_mismatch"} 1"#,
    ] {
        assert!(metrics.contains(line), "`{line}` missing from\n{metrics}");
    }
    store.close().await;
    drop(server);
    database.cleanup().await;
}

/// A loopback server for SNS signing certificates: `/SimpleNotificationService-0123abcd.pem`
/// is AWS's certificate of the
/// published vectors, anything else is a 404. Counts the requests it answers.
async fn certificate_server() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    let certificate =
        std::fs::read_to_string(root().join("pipelines/senders/aws-sns/sns-us-east-2.pem"))
            .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = Arc::clone(&served);
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else { return };
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let certificate = certificate.clone();
            tokio::spawn(async move {
                let mut request = vec![0u8; 4096];
                let read = socket.read(&mut request).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&request[..read]).into_owned();
                let answer = if head.starts_with("GET /SimpleNotificationService-0123abcd.pem ") {
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{certificate}",
                        certificate.len()
                    )
                } else if head.starts_with("GET /SimpleNotificationService-0500.pem ") {
                    "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_owned()
                } else {
                    "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        .to_owned()
                };
                let _ = socket.write_all(answer.as_bytes()).await;
            });
        }
    });
    (base, served)
}

/// AWS SNS with `fetch_keys`: the certificate a message names is fetched once from an allowed
/// host and kept; a message naming another host is refused without a fetch; a certificate that
/// cannot be fetched is a 503 (SNS retries), never a 2xx or a silent pass.
#[tokio::test]
async fn sns_certificates_are_fetched_from_allowed_hosts_only_and_kept() {
    let (base, served) = certificate_server().await;
    let database = Database::sqlite().await;
    let dir = tempfile::tempdir().unwrap();
    let shipped = std::fs::read_to_string(root().join("pipelines/senders/aws-sns.yaml")).unwrap();
    let fetching = shipped.replace(
        "  secrets:\n    - file: /etc/hookgate/sns-us-east-2.pem\n",
        "  secrets: []\n  fetch_keys:\n    hosts: [\"127.0.0.1\"]\n",
    );
    assert_ne!(fetching, shipped);
    std::fs::write(dir.path().join("aws-sns.yaml"), fetching).unwrap();
    let server =
        ServerBuilder::new(database.url()).pipelines(dir.path().join("aws-sns.yaml")).start();
    let client = client();
    let message = |file: &str, certificate_url: &str| {
        let body =
            std::fs::read_to_string(root().join("pipelines/senders/aws-sns").join(file)).unwrap();
        // SigningCertURL is not signed: SNS's canonical message leaves it out.
        body.replace(
            "https://sns.us-east-2.amazonaws.com/SimpleNotificationService-7ff5318490ec183fbaddaa2a969abfda.pem",
            certificate_url,
        )
    };
    let send = |body: String| {
        client
            .post(server.url("/hooks/aws-sns"))
            .header("Content-Type", "text/plain; charset=UTF-8")
            .header("x-amz-sns-message-type", "Notification")
            .body(body)
            .send()
    };
    let good = format!("{base}/SimpleNotificationService-0123abcd.pem");
    let fetches = || served.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(send(message("sha1.json", &good)).await.unwrap().status(), StatusCode::ACCEPTED);
    assert_eq!(fetches(), 1);
    assert_eq!(send(message("sha256.json", &good)).await.unwrap().status(), StatusCode::ACCEPTED);
    assert_eq!(fetches(), 1, "the certificate is kept, not fetched per message");
    assert_eq!(
        send(message("sha1-tampered.json", &good)).await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    let other_host = good.replace("127.0.0.1", "localhost");
    assert_eq!(
        send(message("sha1.json", &other_host)).await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    for not_a_certificate in [
        "good.txt",
        "SimpleNotificationService-evil.pem",
        "x/SimpleNotificationService-0123abcd.pem",
    ] {
        let url = format!("{base}/{not_a_certificate}");
        let status = send(message("sha1.json", &url)).await.unwrap().status();
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{not_a_certificate}");
    }
    assert_eq!(fetches(), 1, "a host or file the pipeline does not allow is never fetched");
    // A message from a topic the pipeline does not trust: refused before anything is fetched.
    let untrusted = message("with-subject-v1.json", &good);
    assert_eq!(send(untrusted).await.unwrap().status(), StatusCode::UNAUTHORIZED);
    assert_eq!(fetches(), 1);
    // A certificate the host does not have: the message is not genuine (401), and the answer
    // is remembered, so repeating it costs no fetch.
    let missing = format!("{base}/SimpleNotificationService-0404.pem");
    for _ in 0..2 {
        let response = send(message("sha1.json", &missing)).await.unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    }
    assert_eq!(fetches(), 2);
    // A host that fails: 503, so SNS retries.
    let failing = format!("{base}/SimpleNotificationService-0500.pem");
    let response = send(message("sha1.json", &failing)).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(fetches(), 3);

    let store = database.store().await;
    assert_eq!(store.events("aws-sns").await.unwrap().len(), 2);
    let metrics = client.get(server.url("/metrics")).send().await.unwrap().text().await.unwrap();
    for line in [
        r#"hookgate_signature_rejections_total{pipeline="aws-sns",code="untrusted_key"} 6"#,
        r#"hookgate_signature_rejections_total{pipeline="aws-sns",code="untrusted_sender"} 1"#,
        r#"hookgate_signing_key_unavailable_total{pipeline="aws-sns"} 1"#,
        r#"hookgate_signature_rejections_total{pipeline="aws-sns",code="signature_mismatch"} 1"#,
        r#"hookgate_deliveries_total{pipeline="aws-sns",outcome="key_unavailable"} 1"#,
    ] {
        assert!(metrics.contains(line), "`{line}` missing from\n{metrics}");
    }
    store.close().await;
    drop(server);
    database.cleanup().await;
}

/// `hookgate send` signs a fixture's delivery now, as its sender would, and posts it to a
/// running `serve`: for every shipped pipeline with a shared-secret scheme, one fixture whose
/// signature is valid is accepted (202). Public-key schemes need the sender's private key,
/// which hookgate never holds: without `--private-key`, `send` says so and sends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hookgate_send_delivers_a_fixture_of_every_shipped_pipeline() {
    use std::collections::BTreeMap;
    let mut chosen: Vec<(PathBuf, PathBuf)> = Vec::new();
    let mut secrets: BTreeMap<String, String> = BTreeMap::new();
    let mut uncovered = Vec::new();
    for dir in [root().join("pipelines"), root().join("pipelines/senders")] {
        let mut pipelines: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        pipelines.sort();
        for pipeline in pipelines {
            let fixtures = pipeline.with_extension("");
            let mut candidates: Vec<PathBuf> = std::fs::read_dir(&fixtures)
                .map(|entries| entries.map(|e| e.unwrap().path()).collect())
                .unwrap_or_default();
            candidates.retain(|p| p.extension().is_some_and(|e| e == "yaml"));
            candidates.sort();
            let found = candidates.into_iter().find_map(|path| {
                let text = std::fs::read_to_string(&path).unwrap();
                let (loaded, _) =
                    hookgate_pipeline::load_fixture(&path.display().to_string(), &text);
                let fixture = loaded?.fixture;
                let valid =
                    fixture.expect.signature == hookgate_pipeline::fixture::SignatureVerdict::Valid;
                let agrees =
                    fixture.secrets.iter().all(|(k, v)| secrets.get(k).is_none_or(|s| s == v));
                (valid && fixture.expect.error.is_none() && agrees)
                    .then_some((path, fixture.secrets))
            });
            match found {
                Some((fixture, fixture_secrets)) => {
                    secrets.extend(fixture_secrets);
                    chosen.push((pipeline, fixture));
                }
                None => uncovered.push(pipeline.display().to_string()),
            }
        }
    }
    assert!(uncovered.is_empty(), "no fixture to send for {uncovered:?}");
    // Served: every pipeline whose secrets are environment variables (a `file:` secret names
    // a path such as /etc/hookgate/..., which a test does not write).
    let file_secret = |pipeline: &PathBuf| {
        let text = std::fs::read_to_string(pipeline).unwrap();
        text.contains("- file:") || text.contains("{ file:")
    };
    let database = Database::sqlite().await;
    let mut builder = ServerBuilder::new(database.url()).pipelines(chosen[0].0.clone());
    for (pipeline, _) in chosen.iter().skip(1).filter(|(p, _)| !file_secret(p)) {
        builder = builder.arg(pipeline.to_str().unwrap());
    }
    for (name, value) in secrets.iter().filter(|(name, _)| !name.contains('/')) {
        builder = builder.env(name, value);
    }
    let server = builder.start();
    let mut public_key_schemes = Vec::new();
    for (pipeline, fixture) in &chosen {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
            .arg("send")
            .arg(pipeline)
            .arg("--fixture")
            .arg(fixture)
            .args(["--to", &server.base])
            .envs(&secrets)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        if stderr.contains("private key") {
            assert!(!output.status.success(), "{}: {stderr}", pipeline.display());
            public_key_schemes.push(pipeline.file_stem().unwrap().to_string_lossy().into_owned());
            continue;
        }
        assert!(
            output.status.success(),
            "{} with {}: {stdout}{stderr}",
            pipeline.display(),
            fixture.display()
        );
        assert!(
            stdout.contains("-> 202") && stdout.contains("\"accepted\""),
            "{}: {stdout}",
            pipeline.display()
        );
    }
    public_key_schemes.sort();
    assert_eq!(
        public_key_schemes,
        ["aws-sns", "sendgrid"],
        "only public-key schemes need a private key"
    );
    drop(server);
    database.cleanup().await;
}
