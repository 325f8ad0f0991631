//! The HTTP edge under attack: real sockets against a real `hookgate serve` process. Slow and
//! idle clients, connection floods, bodies that never end or arrive a byte at a time, lengths
//! that lie, and a shutdown with half-sent requests open. Every limit is pushed past.

// Test helpers panic on a broken setup, which is what a test should do.
#![allow(clippy::unwrap_used)]

// Shared by every end-to-end test binary; each uses only a part of it.
#[allow(dead_code)]
#[path = "../support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use support::*;
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

/// A chunked body a byte per chunk, on many connections at once, and bodies that stop short of
/// their announced length and hold: the server's memory stays within its budgets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_bounded_under_chunked_and_held_body_floods() {
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
    let budget_kib = (BODY_BUDGET / 1024) as u64;
    for (what, rss) in [("chunked", chunked), ("held", holding)] {
        assert!(
            rss < before + 3 * budget_kib,
            "{what}: {rss} KiB resident, from {before} KiB, with an {budget_kib} KiB body budget"
        );
    }
    drop(held);
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
