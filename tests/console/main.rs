//! The console in a real browser: Debian's chromium, headless, driven through chromedriver
//! (WebDriver), against `hookgate serve` as a child process. Tests load the pages, act on them
//! (sign in, filter, replay, pause, resume) and assert on the rendered DOM; each page's
//! screenshot is written to `target/tmp/console-screenshots/`.
//!
//! `.ci/run` installs `chromium` and `chromium-driver` when they are missing; without them
//! these tests fail, they do not skip.

// Test helpers panic on a broken setup, which is what a test should do.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::*;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use reqwest::StatusCode;
use serde_json::{Value, json};

const TOKEN: &str = "console-token-for-tests-0123456789";

/// chromedriver and a browser session on it; both end with the test.
struct Browser {
    driver: Child,
    client: Option<Client>,
}

impl Browser {
    async fn start() -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver runs (Debian's chromium-driver; .ci/run installs it)");
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            json!({"args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                "--disable-dev-shm-usage", "--window-size=1280,900"]}),
        );
        let mut browser = Browser { driver, client: None };
        let url = format!("http://127.0.0.1:{port}");
        for _ in 0..100 {
            match ClientBuilder::new(HttpConnector::new())
                .capabilities(capabilities.clone())
                .connect(&url)
                .await
            {
                Ok(client) => {
                    browser.client = Some(client);
                    return browser;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        panic!("no browser session on chromedriver at {url} within 10 s");
    }

    fn page(&self) -> &Client {
        self.client.as_ref().unwrap()
    }

    /// The element's text, waiting (within 10 s) for it to appear: after a click, the page
    /// that answers the form may still be loading, and WebDriver answers a lookup made while
    /// the page navigates with an error ("aborted by navigation"), not with "no such element".
    async fn text(&self, css: &str) -> String {
        let mut last_error = String::new();
        for _ in 0..100 {
            match self.page().find(Locator::Css(css)).await {
                Ok(element) => match element.text().await {
                    Ok(text) => return text,
                    Err(e) => last_error = e.to_string(),
                },
                Err(e) => last_error = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{css}: not found within 10 s: {last_error}");
    }

    /// Waits (within 10 s) until the element's text contains `expected`: after a click, the
    /// page that answers the form replaces the one clicked on.
    async fn wait_text(&self, css: &str, expected: &str) {
        let mut seen = String::new();
        for _ in 0..100 {
            if let Ok(element) = self.page().find(Locator::Css(css)).await
                && let Ok(text) = element.text().await
            {
                if text.contains(expected) {
                    return;
                }
                seen = text;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{css}: expected {expected:?}, the page shows {seen:?}");
    }

    /// Waits (within 10 s) until `css` matches `n` elements.
    async fn wait_count(&self, css: &str, n: usize) {
        let mut seen = 0;
        for _ in 0..100 {
            // A lookup during a navigation fails; the next one sees the new page.
            if let Ok(elements) = self.page().find_all(Locator::Css(css)).await {
                seen = elements.len();
                if seen == n {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{css}: expected {n} elements, the page shows {seen}");
    }

    async fn count(&self, css: &str) -> usize {
        self.page().find_all(Locator::Css(css)).await.unwrap().len()
    }

    async fn click(&self, css: &str) {
        self.page()
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"))
            .click()
            .await
            .unwrap();
    }

    /// Writes the page's screenshot as `NAME.png`.
    async fn screenshot(&self, name: &str) {
        let png = self.page().screenshot().await.unwrap();
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
    }

    async fn stop(mut self) {
        if let Some(client) = self.client.take() {
            let _ = client.close().await;
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn instances(dir: &std::path::Path) -> PathBuf {
    let settings = json!({"path": dir.join("crm.sqlite").display().to_string(), "idempotency": false,
        "faults": {"reject_external_ids": ["C-bad"]}});
    let path = dir.join("hookgate.yaml");
    std::fs::write(
        &path,
        format!("connectors:\n  - name: crm\n    kind: mock\n    settings: {settings}\n"),
    )
    .unwrap();
    path
}

/// One event's story, from the admin API.
async fn story(client: &reqwest::Client, admin: &str, id: i64) -> Value {
    let response = client.get(format!("{admin}/api/v1/events/{id}")).bearer_auth(TOKEN).send();
    response.await.unwrap().json().await.unwrap()
}

async fn state(client: &reqwest::Client, admin: &str, id: i64) -> String {
    story(client, admin, id).await["state"].as_str().unwrap_or_default().to_owned()
}

/// HMAC-SHA256 in hex, as the console derives its session values.
fn hex_hmac(key: &[u8], data: &[u8]) -> String {
    use hmac::Mac as _;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).unwrap();
    mac.update(data);
    hex::encode(mac.finalize().into_bytes())
}

/// A URL-encoded form body.
fn form(pairs: &[(&str, &str)]) -> String {
    form_urlencoded::Serializer::new(String::new()).extend_pairs(pairs).finish()
}

async fn accept(client: &reqwest::Client, server: &Server, delivery: &Delivery) -> i64 {
    let response = delivery.send(client, server).await;
    assert!(response.status().is_success(), "{}", response.status());
    response.json::<Value>().await.unwrap()["event_id"].as_i64().unwrap()
}

#[tokio::test]
async fn an_operator_reads_the_evidence_replays_and_pauses_in_the_console() {
    let database = Database::sqlite().await;
    let dir = tempfile::tempdir().unwrap();
    let (server, admin) = ServerBuilder::new(database.url())
        .pipelines(root().join("tests/delivery/orders.yaml"))
        .instances(instances(dir.path()))
        .workers(2)
        .start_with_admin(TOKEN);
    let client = client();
    let good = accept(&client, &server, &order("o-1", "C-good", 1, "paid")).await;
    // A sender's key that is markup: shown as text, never run.
    let hostile_key = "<script>document.title='owned'</script><img src=x onerror=alert(1)>";
    let hostile = accept(&client, &server, &order(hostile_key, "C-other", 1, "paid")).await;
    let bad = accept(&client, &server, &order("o-2", "C-bad", 1, "paid")).await;
    let conflict = order("o-1", "C-good", 1, "refunded").send(&client, &server).await;
    assert_eq!(conflict.status(), StatusCode::CONFLICT);
    let settled = || async {
        state(&client, &admin, good).await == "done"
            && state(&client, &admin, hostile).await == "done"
            && state(&client, &admin, bad).await == "dead"
    };
    assert!(eventually(Duration::from_secs(30), settled).await);

    let browser = Browser::start().await;
    let page = browser.page();

    // Signed out: the login form, and nothing else.
    page.goto(&format!("{admin}/console/events")).await.unwrap();
    assert_eq!(browser.count("table#events").await, 0);
    page.find(Locator::Css("#token"))
        .await
        .unwrap()
        .send_keys("not-the-token-at-all")
        .await
        .unwrap();
    browser.click("#sign-in").await;
    assert_eq!(browser.text("#failed").await, "That token is not valid.");
    page.find(Locator::Css("#token")).await.unwrap().send_keys(TOKEN).await.unwrap();
    browser.click("#sign-in").await;

    // The event list, with a filter.
    browser.wait_count("tr.event", 3).await;
    assert_eq!(page.current_url().await.unwrap().path(), "/console/events");
    let first_id =
        page.find(Locator::Css("tr.event")).await.unwrap().attr("data-id").await.unwrap();
    assert_eq!(first_id, Some(bad.to_string()), "newest first");
    let keys: Vec<String> = {
        let mut keys = Vec::new();
        for cell in page.find_all(Locator::Css("tr.event td code")).await.unwrap() {
            keys.push(cell.text().await.unwrap());
        }
        keys
    };
    assert!(keys.contains(&hostile_key.to_owned()), "the key is shown as text: {keys:?}");
    assert_eq!(
        browser.count("table#events script, table#events img").await,
        0,
        "no markup from a sender"
    );
    let title = page.execute("return document.title", Vec::new()).await.unwrap();
    assert_eq!(title, json!("Events · hookgate"), "no script from a sender ran");
    browser.screenshot("events").await;
    page.find(Locator::Css("#filter-state")).await.unwrap().select_by_value("dead").await.unwrap();
    browser.click("#filter").await;
    browser.wait_count("tr.event", 1).await;
    assert_eq!(browser.text("tr.event td.state-dead").await, "dead");

    // One event's story: deliveries with the conflict and both fingerprints, every attempt.
    page.goto(&format!("{admin}/console/events/{good}")).await.unwrap();
    assert_eq!(browser.text("#state").await, "done");
    assert_eq!(browser.count("tr.delivery").await, 2);
    let conflict_row = browser.text("tr.outcome-conflict").await;
    assert!(conflict_row.contains("original"), "{conflict_row}");
    assert!(browser.text("pre.conflict-body").await.contains("refunded"));
    assert!(browser.count("tr.attempt").await >= 1);
    assert!(browser.text("#body").await.contains(r#""status":"paid""#));
    browser.screenshot("event").await;

    // Conflicts.
    page.goto(&format!("{admin}/console/conflicts")).await.unwrap();
    assert_eq!(browser.count("tr.conflict").await, 1);
    browser.screenshot("conflicts").await;

    // Refused for its signature: nothing stored, the count on its page.
    let forged = order("o-forged", "C-good", 1, "paid")
        .with_header("X-Signature", &format!("sha256={}", "0".repeat(64)));
    assert_eq!(forged.send(&client, &server).await.status(), 401);
    let mut shown = false;
    for _ in 0..50 {
        page.goto(&format!("{admin}/console/refused")).await.unwrap();
        if browser.count("tr.refusal").await == 1 {
            shown = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(shown, "the refusal is on the Refused page");
    assert!(browser.text("tr.refusal").await.contains("signature_mismatch"));
    browser.screenshot("refused").await;

    // Dead letters, replayed from the page: the replay is in the event's story.
    page.goto(&format!("{admin}/console/dead-letters")).await.unwrap();
    assert_eq!(browser.count("tr.dead-letter").await, 1);
    browser.screenshot("dead-letters").await;
    browser.click("tr.dead-letter button.replay").await;
    assert_eq!(browser.text("#notice").await, "Queued 1 write(s) of 1 event(s) again.");
    let replayed = || async {
        let story = story(&client, &admin, bad).await;
        let attempts = story["attempts"].as_array().cloned().unwrap_or_default();
        attempts.iter().any(|a| a["outcome"] == "replay_requested") && story["state"] == "dead"
    };
    assert!(eventually(Duration::from_secs(30), replayed).await, "replayed, and rejected again");

    // Pipelines: a target paused holds new writes; resumed, they are delivered.
    page.goto(&format!("{admin}/console/pipelines")).await.unwrap();
    assert_eq!(browser.text("tr.target .delivery-state").await, "running");
    browser.click("tr.target button.pause-target").await;
    assert_eq!(browser.text("#notice").await, "Paused delivery to orders/customer.");
    assert_eq!(browser.text("tr.target .delivery-state").await, "paused");
    let held = accept(&client, &server, &order("o-3", "C-held", 1, "paid")).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    page.goto(&format!("{admin}/console/pipelines")).await.unwrap();
    assert_eq!(browser.text("tr.target td.pending").await, "1", "held, not dropped");
    browser.screenshot("pipelines").await;
    browser.click("tr.target button.resume-target").await;
    browser.wait_text("#notice", "Resumed delivery to orders/customer.").await;
    assert_eq!(browser.text("tr.target .delivery-state").await, "running");
    assert!(
        eventually(Duration::from_secs(20), || async {
            state(&client, &admin, held).await == "done"
        })
        .await
    );

    // Intake paused from the page: the sender is told to come back later.
    page.find(Locator::Css("input[name=reason]"))
        .await
        .unwrap()
        .send_keys("CRM maintenance")
        .await
        .unwrap();
    browser.click("button.pause-intake").await;
    browser.wait_text("#notice", "Paused intake of orders.").await;
    assert!(browser.text(".pipeline .intake").await.contains("CRM maintenance"));
    let refused = order("o-4", "C-4", 1, "paid").send(&client, &server).await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    browser.click("button.resume-intake").await;
    browser.wait_text("#notice", "Resumed intake of orders.").await;
    assert_eq!(browser.text(".intake-state").await, "running");
    accept(&client, &server, &order("o-4", "C-4", 1, "paid")).await;

    // Signed out, the pages are closed again.
    browser.click("header button").await;
    browser.wait_count("#token", 1).await;
    page.goto(&format!("{admin}/console/dead-letters")).await.unwrap();
    assert_eq!(browser.count("table#dead-letters").await, 0);
    assert_eq!(browser.count("#token").await, 1);
    browser.stop().await;
    drop(server);
    database.cleanup().await;
}

/// Forms need the session and their CSRF field; the login answers 401 to a wrong token.
#[tokio::test]
async fn console_actions_need_the_session_and_the_form_field() {
    let database = Database::sqlite().await;
    let dir = tempfile::tempdir().unwrap();
    let (server, admin) = ServerBuilder::new(database.url())
        .pipelines(root().join("tests/delivery/orders.yaml"))
        .instances(instances(dir.path()))
        .start_with_admin(TOKEN);
    let client = client_builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let page = client.get(format!("{admin}/console/pipelines")).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::UNAUTHORIZED);
    let wrong = client
        .post(format!("{admin}/console/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("token", "wrong")]))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    assert!(wrong.headers().get("set-cookie").is_none());
    let signed_in = client
        .post(format!("{admin}/console/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("token", TOKEN)]))
        .send()
        .await
        .unwrap();
    assert_eq!(signed_in.status(), StatusCode::SEE_OTHER);
    let cookie = signed_in.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"), "{cookie}");
    assert!(!cookie.contains(TOKEN), "the cookie is not the token");
    let session = cookie.split(';').next().unwrap().to_owned();
    let forged = client
        .post(format!("{admin}/console/pause"))
        .header("cookie", &session)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("csrf", "guessed"), ("pipeline", "orders"), ("action", "pause")]))
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), StatusCode::FORBIDDEN);
    let without_session = client
        .post(format!("{admin}/console/pause"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("csrf", "guessed"), ("pipeline", "orders"), ("action", "pause")]))
        .send()
        .await
        .unwrap();
    assert_eq!(without_session.status(), StatusCode::UNAUTHORIZED);
    // The session's time is bound by its MAC: moved, or past its end, it opens nothing.
    let page_with = |cookie: String| {
        let request = client.get(format!("{admin}/console/pipelines")).header("cookie", cookie);
        async move { request.send().await.unwrap().status() }
    };
    assert_eq!(page_with(session.clone()).await, StatusCode::OK);
    let (name, value) = session.split_once('=').unwrap();
    let (issued, mac) = value.split_once('.').unwrap();
    let moved = issued.parse::<u64>().unwrap() + 1;
    assert_eq!(page_with(format!("{name}={moved}.{mac}")).await, StatusCode::UNAUTHORIZED);
    let expired = now_secs() as u64 - 13 * 3600;
    let key = hex_hmac(TOKEN.as_bytes(), b"hookgate console session");
    let old =
        format!("{name}={expired}.{}", hex_hmac(key.as_bytes(), expired.to_string().as_bytes()));
    assert_eq!(page_with(old).await, StatusCode::UNAUTHORIZED, "12 hours at most");
    let accepted = order("o-1", "C-1", 1, "paid").send(&client, &server).await;
    assert!(accepted.status().is_success(), "nothing was paused");
    drop(server);
    database.cleanup().await;
}
