//! The HTTP edge under attack: real sockets against a real `hookgate serve` process. Slow and
//! idle clients, connection floods, bodies that never end or arrive a byte at a time, lengths
//! that lie, and a shutdown with half-sent requests open. Every limit is pushed past.

// Test helpers panic on a broken setup, which is what a test should do.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use crate::support::*;
use reqwest::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads until the server closes the connection or `within` passes. Returns what was read and
/// when the connection closed, if it did.
async fn until_closed(stream: &mut TcpStream, within: Duration) -> (Vec<u8>, Option<Duration>) {
    let started = Instant::now();
    let mut read = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let left = within.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, stream.read(&mut buffer)).await {
            Err(_) => return (read, None),
            Ok(Ok(0)) | Ok(Err(_)) => return (read, Some(started.elapsed())),
            Ok(Ok(n)) => read.extend_from_slice(&buffer[..n]),
        }
    }
}

async fn connect(server: &Server) -> TcpStream {
    TcpStream::connect(server.address).await.unwrap()
}

/// A valid delivery still gets through.
async fn accepted(client: &reqwest::Client, server: &Server, n: usize) {
    let delivery = github(&format!("valid-{n}"), &push_body("mona", &format!("c{n}")));
    let status = delivery.send(client, server).await.status();
    assert_eq!(status, StatusCode::ACCEPTED, "a valid delivery among the attackers");
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

async fn metrics(client: &reqwest::Client, server: &Server) -> String {
    client.get(server.url("/metrics")).send().await.unwrap().text().await.unwrap()
}

/// Resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_idle_clients_are_closed_in_time_while_valid_deliveries_get_through() {
    let database = Database::sqlite().await;
    let server = ServerBuilder::new(database.url()).arg("--header-timeout-secs").arg("1").start();
    let client = client();

    // Only a request line; headers one byte at a time; nothing at all; a kept-alive
    // connection after one answered request.
    let mut request_line = connect(&server).await;
    request_line.write_all(b"POST /hooks/github HTTP/1.1\r\n").await.unwrap();
    let mut dribble = connect(&server).await;
    let dribbler = tokio::spawn(async move {
        for byte in b"POST /hooks/github HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaa" {
            if dribble.write_all(&[*byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        until_closed(&mut dribble, Duration::from_secs(10)).await
    });
    let mut silent = connect(&server).await;
    let mut kept_alive = connect(&server).await;
    kept_alive.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut answered = [0u8; 1024];
    let n = kept_alive.read(&mut answered).await.unwrap();
    assert!(answered[..n].starts_with(b"HTTP/1.1 200"));

    for n in 0..5 {
        accepted(&client, &server, n).await;
    }
    for (name, stream) in [
        ("request line", &mut request_line),
        ("silent", &mut silent),
        ("kept alive", &mut kept_alive),
    ] {
        let (_, closed) = until_closed(stream, Duration::from_secs(5)).await;
        let closed = closed.unwrap_or_else(|| panic!("{name}: still open after 5 s"));
        assert!(closed < Duration::from_millis(2500), "{name}: closed after {closed:?}");
    }
    let (_, closed) = dribbler.await.unwrap();
    assert!(closed.is_some(), "headers at 5 bytes a second are cut off");
    accepted(&client, &server, 5).await;

    let text = metrics(&client, &server).await;
    let timeouts = metric(&text, r#"hookgate_edge_refusals_total{reason="header_timeout"}"#);
    assert!(timeouts >= 3.0, "header timeouts are counted: {text}");
    drop(server);
    database.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_are_answered_503_at_once_and_slots_come_back() {
    let database = Database::sqlite().await;
    let server = ServerBuilder::new(database.url())
        .arg("--connections-max")
        .arg("20")
        .arg("--header-timeout-secs")
        .arg("2")
        .start();
    let mut idle = Vec::new();
    for _ in 0..20 {
        idle.push(connect(&server).await);
    }
    // Let the server accept all twenty before the next one.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut extra = connect(&server).await;
    let (answer, closed) = until_closed(&mut extra, Duration::from_secs(2)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains(r#"{"status":"over_capacity"}"#), "{answer}");
    assert!(closed.is_some(), "and closed");

    // The idle ones time out, their slots return, and deliveries get through again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let client = client();
    accepted(&client, &server, 0).await;
    let text = metrics(&client, &server).await;
    assert!(metric(&text, r#"hookgate_edge_refusals_total{reason="over_capacity"}"#) >= 1.0);
    drop(idle);
    drop(server);
    database.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announced_length_over_the_limit_is_refused_before_reading_without_100_continue() {
    let database = Database::sqlite().await;
    let server = ServerBuilder::new(database.url()).start();
    let mut stream = connect(&server).await;
    let started = Instant::now();
    stream
        .write_all(
            b"POST /hooks/github HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000000\r\nExpect: 100-continue\r\n\r\n",
        )
        .await
        .unwrap();
    let (answer, _) = until_closed(&mut stream, Duration::from_secs(5)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "no 100 Continue first: {answer}");
    assert!(answer.contains(r#""status":"too_large""#), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(2), "at once, not after the read timeout");
    drop(server);
    database.cleanup().await;
}

/// Chunked bodies a byte per chunk, bodies that stop short of their announced length and
/// hold, and header blocks that never end, on many connections at once: the server's memory
/// stays within its budgets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_bounded_under_chunked_bodies_held_bodies_and_endless_header_blocks() {
    const BODY_BUDGET: usize = 8 * 1024 * 1024;
    let database = Database::sqlite().await;
    let server = ServerBuilder::new(database.url())
        .arg("--body-budget-bytes")
        .arg(&BODY_BUDGET.to_string())
        .arg("--read-timeout-secs")
        .arg("10")
        .start();
    let client = client();
    accepted(&client, &server, 0).await;
    let before = rss_kib(server.child.id());

    // Twenty bodies of 64 KiB, a byte per chunk. Collected chunk by chunk, each would cost
    // about 2 MiB of memory: 40 MiB together.
    let mut floods = Vec::new();
    for _ in 0..20 {
        let address = server.address;
        floods.push(tokio::spawn(async move {
            let mut stream = TcpStream::connect(address).await.unwrap();
            let mut wire =
                b"POST /hooks/github HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                    .to_vec();
            for _ in 0..64 * 1024 {
                wire.extend_from_slice(b"1\r\na\r\n");
            }
            wire.extend_from_slice(b"0\r\n\r\n");
            stream.write_all(&wire).await.unwrap();
            until_closed(&mut stream, Duration::from_secs(30)).await.0
        }));
    }
    for flood in floods {
        let answer = flood.await.unwrap();
        assert!(answer.starts_with(b"HTTP/1.1 401"), "{}", String::from_utf8_lossy(&answer));
    }
    let chunked = rss_kib(server.child.id());

    // Two hundred bodies that announce 1 MiB, send 900 KiB and hold.
    let mut held = Vec::new();
    for _ in 0..200 {
        let mut stream = connect(&server).await;
        let head = b"POST /hooks/github HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n";
        stream.write_all(head).await.unwrap();
        let part = vec![b'a'; 900 * 1024];
        // The server stops reading when the budget is used up: do not wait for the kernel.
        let _ = tokio::time::timeout(Duration::from_millis(50), stream.write_all(&part)).await;
        held.push(stream);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let holding = rss_kib(server.child.id());
    drop(held);
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Freed memory may stay resident (the allocator keeps it): each flood is measured from
    // where the one before left off.
    let before_heads = rss_kib(server.child.id());

    // Three hundred header blocks of 360 KiB that never end: each is cut off at the read
    // buffer (the header limit plus 8 KiB), not held. Held whole, they would take 105 MiB.
    let mut heads = Vec::new();
    for _ in 0..300 {
        let mut stream = connect(&server).await;
        let mut head = b"POST /hooks/github HTTP/1.1\r\nHost: x\r\nX-Pad: ".to_vec();
        head.extend(std::iter::repeat_n(b'p', 360 * 1024));
        let _ = tokio::time::timeout(Duration::from_millis(20), stream.write_all(&head)).await;
        heads.push(stream);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let headers = rss_kib(server.child.id());
    let budget_kib = (BODY_BUDGET / 1024) as u64;
    let growths = [
        // Collected chunk by chunk: 40 MiB. In one buffer within the budget: a few.
        ("chunked", before, chunked, 3 * budget_kib),
        // Held whole: 176 MiB. Within the budget: 8 MiB and the connections' own cost.
        ("held", chunked, holding, 3 * budget_kib),
        // Held whole: 105 MiB. Cut at the read buffer: at most 300 x 40 KiB, 12 MiB.
        ("header blocks", before_heads, headers, 32 * 1024),
    ];
    for (what, from, to, bound) in growths {
        assert!(
            to.saturating_sub(from) < bound,
            "{what}: {to} KiB resident, from {from} KiB; the bound is {bound} KiB more"
        );
    }
    drop(heads);
    drop(server);
    database.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_within_its_deadline_with_half_sent_requests_open() {
    let database = Database::sqlite().await;
    let mut server = ServerBuilder::new(database.url())
        .arg("--header-timeout-secs")
        .arg("60")
        .arg("--read-timeout-secs")
        .arg("60")
        .arg("--shutdown-timeout-secs")
        .arg("2")
        .start();
    let mut half_headers = connect(&server).await;
    half_headers.write_all(b"POST /hooks/github HTTP/1.1\r\nHost: x\r\nX-Par").await.unwrap();
    let mut half_body = connect(&server).await;
    half_body
        .write_all(b"POST /hooks/github HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"a\":")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    server.terminate();
    let exited = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > Duration::from_secs(10) {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exited.is_some(), "still running 10 s after SIGTERM");
    assert!(started.elapsed() < Duration::from_secs(6), "exited after {:?}", started.elapsed());
    drop((half_headers, half_body));
    database.cleanup().await;
}

fn hostile_pipeline() -> std::path::PathBuf {
    root().join("tests/edge/hostile.yaml")
}

/// A delivery for the `hostile` pipeline with this JSON body, signed.
fn hostile(body: &str) -> Delivery {
    let mac = hookgate_verify::compute_mac(
        hookgate_verify::Algorithm::HmacSha256,
        ORDERS_SECRET.as_bytes(),
        &[body.as_bytes()],
    );
    let signature = format!("sha256={}", hookgate_verify::Encoding::Hex.encode(&mac));
    Delivery {
        pipeline: "hostile",
        headers: vec![("X-Signature".into(), signature)],
        body: body.as_bytes().to_vec(),
    }
}

fn body(id: &str, account: &str, customer: &str, at: &str) -> String {
    serde_json::json!({"id": id, "account": account, "customer": customer, "at": at}).to_string()
}

async fn answer(response: reqwest::Response) -> (StatusCode, serde_json::Value) {
    let status = response.status();
    (status, response.json().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_values_with_a_valid_signature_get_400_on_both_backends_and_are_kept() {
    let now = "2026-01-01T00:00:00Z";
    for database in Database::both().await {
        let backend = database.name();
        let github_pipeline = root().join("pipelines/github.yaml");
        let server = ServerBuilder::new(database.url())
            .pipelines(hostile_pipeline())
            .arg(github_pipeline.to_str().unwrap())
            .start();
        let client = client();
        let long_version = "9".repeat(65_000);
        let cases: Vec<(&str, String, &str)> = vec![
            (
                "a NUL in the key",
                body("a\u{0}b", "acct", "C-1", now),
                "key contains a control character",
            ),
            (
                "CR, LF and an escape sequence in the key",
                body("x\r\nINFO forged\u{1b}[31m", "acct", "C-1", now),
                "key contains a control character",
            ),
            (
                "a newline in the scope",
                body("k-1", "a\nb", "C-1", now),
                "scope contains a control character",
            ),
            ("a blank entity", body("k-2", "acct", "   ", now), "ordering.entity is empty"),
            (
                "a far-future version",
                body("k-3", "acct", "C-1", "9999-12-31T00:00:00Z"),
                "ahead of its receipt",
            ),
            (
                "a 65,000-character version",
                body("k-4", "acct", "C-1", &long_version),
                "ordering.version is 65000 bytes",
            ),
        ];
        for (what, body, reason) in &cases {
            let (status, answer) = answer(hostile(body).send(&client, &server).await).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{backend}: {what}: {answer}");
            let text = answer["reason"].as_str().unwrap();
            assert!(text.contains(reason), "{backend}: {what}: {text}");
            assert!(text.len() < 600, "{backend}: {what}: the reason never echoes unbounded input");
            assert!(!text.chars().any(char::is_control), "{backend}: {what}: escaped: {text:?}");
        }
        let store = database.store().await;
        let kept =
            store.deliveries("hostile", hookgate_store::DeliveryOutcome::Rejected).await.unwrap();
        assert_eq!(kept.len(), cases.len(), "{backend}: each kept as rejected evidence");
        assert_eq!(
            kept[0].body.as_deref(),
            Some(cases[0].1.as_bytes()),
            "{backend}: byte for byte"
        );
        assert!(store.events("hostile").await.unwrap().is_empty(), "{backend}: and no event");

        // Numbers as keys keep their literal text: ids beyond 2^64 stay two events.
        for id in ["18446744073709551617", "18446744073709551618"] {
            let body = format!(r#"{{"id":{id},"account":"acct","customer":"C-9","at":"{now}"}}"#);
            let (status, _) = answer(hostile(&body).send(&client, &server).await).await;
            assert_eq!(status, StatusCode::ACCEPTED, "{backend}: {id}");
        }
        let keys: Vec<String> =
            store.events("hostile").await.unwrap().into_iter().map(|e| e.key).collect();
        assert_eq!(keys, ["18446744073709551617", "18446744073709551618"], "{backend}");

        // The key header sent twice (GitHub's delivery id): which one is meant is not ours to pick.
        let twice = github("d-1", &push_body("mona", "c1")).with_header("X-GitHub-Delivery", "d-1");
        let mut request = client.post(server.url("/hooks/github")).body(twice.body.clone());
        for (name, value) in &twice.headers {
            request = request.header(name, value);
        }
        let (status, answer) =
            answer(request.header("X-GitHub-Delivery", "d-2").send().await.unwrap()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{backend}: {answer}");
        assert!(answer["reason"].as_str().unwrap().contains("sent more than once"), "{answer}");
        store.close().await;
        drop(server);
        database.cleanup().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_flood_with_padded_headers_grows_the_store_by_a_bounded_amount() {
    for database in Database::both().await {
        let backend = database.name();
        let server = ServerBuilder::new(database.url()).start();
        let client = client();
        let delivery = github("flood-1", &push_body("mona", "c1"));
        assert_eq!(delivery.send(&client, &server).await.status(), StatusCode::ACCEPTED);
        let padded = delivery.clone().with_header("X-Junk", &"j".repeat(30 * 1024));
        for _ in 0..100 {
            assert_eq!(padded.send(&client, &server).await.status(), StatusCode::OK, "{backend}");
        }
        let store = database.store().await;
        let event = store.event_by_key("github", "4242", "flood-1").await.unwrap().unwrap();
        assert_eq!(event.delivery_count, 101, "{backend}: every duplicate is counted");
        let rows = store.deliveries_for(event.id).await.unwrap();
        assert_eq!(rows.len(), 21, "{backend}: the accepted row and 20 duplicates");
        let largest = rows.iter().skip(1).map(|r| r.headers_json.len()).max().unwrap();
        assert!(
            largest <= 2200,
            "{backend}: a duplicate keeps a header excerpt, not {largest} bytes"
        );
        assert!(rows[1].headers_json.contains("(left out)"), "{backend}: {}", rows[1].headers_json);
        store.close().await;
        drop(server);
        database.cleanup().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_flood_is_counted_in_full_and_logged_a_line_at_a_time() {
    let database = Database::sqlite().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let server = ServerBuilder::new(database.url()).log(log.clone()).start();
    let client = client();
    for n in 0..200 {
        let forged =
            github(&format!("f-{n}"), "{}").with_header("X-Hub-Signature-256", "sha256=00");
        assert_eq!(forged.send(&client, &server).await.status(), StatusCode::UNAUTHORIZED);
    }
    let unknown = client.post(server.url("/hooks/nope%1b%5b31m")).body("{}").send().await.unwrap();
    assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
    let text = metrics(&client, &server).await;
    assert_eq!(metric(&text, r#"hookgate_edge_refusals_total{reason="unauthorized"}"#), 200.0);
    let logged = std::fs::read_to_string(&log).unwrap();
    let lines = logged.lines().filter(|l| l.contains(r#"reason="unauthorized""#)).count();
    assert_eq!(lines, 1, "one line for the flood within 10 s: {logged}");
    assert!(!logged.contains('\u{1b}'), "a pipeline name from the URL is escaped: {logged}");
    // Where operators look: the 200 refusals under their one reason, counted in memory and
    // written in a batch, not one row (or one write) each.
    let refused = || {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
            .args(["events", "refused", "--json", "--database-url", database.url()])
            .current_dir(root())
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
            .collect::<Vec<_>>()
    };
    let counted = eventually(Duration::from_secs(10), || async {
        refused().iter().map(|r| r["refusals"].as_i64().unwrap()).sum::<i64>() == 200
    })
    .await;
    let rows = refused();
    assert!(counted, "{rows:?}");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["pipeline"], "github");
    assert_eq!(rows[0]["code"], "malformed_header");
    assert!(rows[0]["reason"].as_str().unwrap().contains("X-Hub-Signature-256"), "{rows:?}");
    drop(server);
    database.cleanup().await;
}

/// Every answer has a JSON body, the wrong path and the wrong method too, and each is counted:
/// a sender set up with a trailing slash still reaches its pipeline (one event through both
/// paths), and one with a wrong URL shows in the metrics and the log instead of nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trailing_slash_reaches_the_pipeline_and_every_other_path_gets_a_json_answer() {
    let database = Database::sqlite().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let server = ServerBuilder::new(database.url()).log(log.clone()).start();
    let client = client();
    let delivery = github("slash-1", &push_body("mona", "c1"));
    let mut through_slash = client.post(server.url("/hooks/github/")).body(delivery.body.clone());
    for (name, value) in &delivery.headers {
        through_slash = through_slash.header(name, value);
    }
    let (status, body) = answer(through_slash.send().await.unwrap()).await;
    assert_eq!((status, &body["status"]), (StatusCode::ACCEPTED, &"accepted".into()), "{body}");
    let (status, again) = answer(delivery.send(&client, &server).await).await;
    assert_eq!(status, StatusCode::OK, "the same event without the slash: {again}");
    assert_eq!(again["event_id"], body["event_id"]);

    for path in ["/hooks/", "/hooks/github/extra", "/hook/github", "/"] {
        let (status, body) = answer(client.post(server.url(path)).send().await.unwrap()).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(body, serde_json::json!({"status": "not_found"}), "{path}");
    }
    let (status, body) =
        answer(client.get(server.url("/hooks/github")).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(body, serde_json::json!({"status": "method_not_allowed"}));

    let text = metrics(&client, &server).await;
    assert_eq!(metric(&text, r#"hookgate_edge_refusals_total{reason="no_route"}"#), 4.0);
    assert_eq!(metric(&text, r#"hookgate_edge_refusals_total{reason="wrong_method"}"#), 1.0);
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("POST /hooks/"), "the first wrong path is logged: {logged}");
    drop(server);
    database.cleanup().await;
}
