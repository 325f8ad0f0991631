//! Reloading a running gateway (SIGHUP and `--watch`) under load: `hookgate serve` as a child
//! process over a SQLite file and the mock CRM, deliveries sent throughout. A good change is
//! served from then on; a bad one is refused with its diagnostics while the running
//! configuration keeps serving; nothing accepted is lost or written twice.

// Test helpers panic on a broken setup, which is what a test should do.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::*;
use hookgate_connector_mock::Effect;
use serde_json::json;

/// A pipeline directory and an instances file the test rewrites.
struct Config {
    dir: tempfile::TempDir,
}

impl Config {
    fn new() -> Config {
        let config = Config { dir: tempfile::tempdir().unwrap() };
        std::fs::create_dir(config.pipelines()).unwrap();
        config.write_pipeline("");
        config.write_instances(&[]);
        config
    }

    fn pipelines(&self) -> PathBuf {
        self.dir.path().join("pipelines")
    }

    fn instances(&self) -> PathBuf {
        self.dir.path().join("hookgate.yaml")
    }

    fn mock_path(&self) -> String {
        self.dir.path().join("crm.sqlite").display().to_string()
    }

    /// The delivery tests' `orders` pipeline, with `extra` appended to its target's fields.
    fn write_pipeline(&self, extra: &str) {
        self.write_pipeline_with(extra, "");
    }

    /// The same, with `top` added at the end, at the top level.
    fn write_pipeline_with(&self, extra: &str, top: &str) {
        let original = std::fs::read_to_string(root().join("tests/delivery/orders.yaml")).unwrap();
        let anchor = "      status: \"{{ payload.status }}\"\n";
        assert!(original.contains(anchor));
        let text = original.replace(anchor, &format!("{anchor}{extra}")) + top;
        write_atomically(&self.pipelines().join("orders.yaml"), &text);
    }

    fn write_instances(&self, rejected: &[&str]) {
        let settings = json!({"path": self.mock_path(), "idempotency": false,
            "faults": {"reject_external_ids": rejected}});
        let text =
            format!("connectors:\n  - name: crm\n    kind: mock\n    settings: {settings}\n");
        write_atomically(&self.instances(), &text);
    }

    async fn effects(&self) -> Vec<Effect> {
        let crm = mock_crm(&self.mock_path()).await;
        let effects = crm.effects().await.unwrap();
        crm.close().await;
        effects
    }
}

/// As editors and deployment tools do: a new file renamed over the old one.
fn write_atomically(path: &Path, text: &str) {
    let temporary = path.with_extension("tmp");
    std::fs::write(&temporary, text).unwrap();
    std::fs::rename(&temporary, path).unwrap();
}

/// Deliveries sent one after another until stopped; the event ids accepted.
struct Load {
    accepted: Arc<Mutex<Vec<i64>>>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Load {
    fn start(server: &Server, prefix: &'static str) -> Load {
        let accepted = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let (client, base, ids) = (client(), server.base.clone(), Arc::clone(&accepted));
        let address = server.address;
        let task = tokio::spawn(async move {
            let target = Server {
                child: std::process::Command::new("true").spawn().unwrap(),
                address,
                base,
            };
            let mut n = 0u64;
            while !*stopped.borrow() {
                n += 1;
                let delivery = order(&format!("{prefix}-{n}"), &format!("C-{}", n % 5), n, "paid");
                let response = delivery.send(&client, &target).await;
                // Every delivery is answered: a reload never makes intake refuse one.
                assert!(response.status().is_success(), "delivery {n}: {}", response.status());
                let body: serde_json::Value = response.json().await.unwrap();
                ids.lock().unwrap().push(body["event_id"].as_i64().unwrap());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        Load { accepted, stop, task }
    }

    fn count(&self) -> usize {
        self.accepted.lock().unwrap().len()
    }

    async fn stop(self) -> Vec<i64> {
        self.stop.send(true).unwrap();
        self.task.await.unwrap();
        Arc::try_unwrap(self.accepted).unwrap().into_inner().unwrap()
    }
}

fn hangup(server: &Server) {
    let status = std::process::Command::new("kill")
        .args(["-HUP", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Every accepted event is written exactly once (one effect per event's idempotency key),
/// and nothing is left to do.
async fn assert_each_written_once(config: &Config, database: &Database, accepted: &[i64]) {
    let store = database.store().await;
    let drained = || async { store.unfinished_items().await.unwrap() == 0 };
    assert!(eventually(Duration::from_secs(60), drained).await, "every write finishes");
    let effects = config.effects().await;
    let mut per_event: BTreeMap<i64, usize> = BTreeMap::new();
    for effect in &effects {
        let event: i64 = effect.idempotency_key.split('-').nth(1).unwrap().parse().unwrap();
        *per_event.entry(event).or_default() += 1;
    }
    for id in accepted {
        let event = store.event(*id).await.unwrap().unwrap();
        assert_eq!(event.state, hookgate_store::EventState::Done, "event {id}");
        assert_eq!(per_event.get(id), Some(&1), "event {id}: one effect");
    }
    store.close().await;
}

fn log_text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[tokio::test]
async fn sighup_serves_a_good_change_and_refuses_a_bad_one_under_load() {
    let database = Database::sqlite().await;
    let config = Config::new();
    let log = config.dir.path().join("serve.log");
    let server = ServerBuilder::new(database.url())
        .pipelines(config.pipelines())
        .instances(config.instances())
        .workers(4)
        .log(log.clone())
        .start();
    let load = Load::start(&server, "sighup");
    assert!(eventually(Duration::from_secs(10), || async { load.count() >= 20 }).await);

    // A good change: a new field, written from the next write on.
    config.write_pipeline("      channel: \"v2\"\n");
    hangup(&server);
    let v2 = || async {
        config
            .effects()
            .await
            .iter()
            .any(|e| e.fields.get("channel").map(String::as_str) == Some("v2"))
    };
    assert!(
        eventually(Duration::from_secs(20), v2).await,
        "the reloaded pipeline writes `channel`"
    );

    // A bad change: refused with its diagnostic, and the good one keeps serving.
    // A misspelt filter: minijinja finds it only at render, `check` before.
    config.write_pipeline("      broken: \"{{ payload.status | no_such_filter }}\"\n");
    hangup(&server);
    let refused = || async {
        log_text(&log).contains("reload refused: still serving the previous configuration")
    };
    assert!(eventually(Duration::from_secs(20), refused).await, "{}", log_text(&log));
    let text = log_text(&log);
    assert!(text.contains("orders.yaml"), "the diagnostic names the file: {text}");
    assert!(text.contains("H0503") && text.contains("no_such_filter"), "and what is wrong: {text}");
    let before = load.count();
    assert!(
        eventually(Duration::from_secs(10), || async { load.count() >= before + 20 }).await,
        "intake goes on"
    );
    let accepted = load.stop().await;
    assert_each_written_once(&config, &database, &accepted).await;
    let effects = config.effects().await;
    let last = effects.iter().max_by_key(|e| e.id).unwrap();
    assert_eq!(
        last.fields.get("channel").map(String::as_str),
        Some("v2"),
        "the good change still serves"
    );
    assert!(effects.iter().all(|e| !e.fields.contains_key("broken")), "the bad one never did");
    drop(server);
    database.cleanup().await;
}

#[tokio::test]
async fn watch_reloads_pipelines_and_connector_instances_when_their_files_change() {
    let database = Database::sqlite().await;
    let config = Config::new();
    let server = ServerBuilder::new(database.url())
        .pipelines(config.pipelines())
        .instances(config.instances())
        .workers(4)
        .arg("--watch")
        .env("RUST_LOG", "info")
        .log(config.dir.path().join("serve.log"))
        .start();
    let load = Load::start(&server, "watch");
    assert!(eventually(Duration::from_secs(10), || async { load.count() >= 20 }).await);

    config.write_pipeline("      channel: \"watched\"\n");
    let watched = || async {
        config
            .effects()
            .await
            .iter()
            .any(|e| e.fields.get("channel").map(String::as_str) == Some("watched"))
    };
    assert!(
        eventually(Duration::from_secs(20), watched).await,
        "a changed pipeline file is reloaded"
    );
    let accepted = load.stop().await;
    assert_each_written_once(&config, &database, &accepted).await;

    // The connector instance is rebuilt too: its new settings reject a customer.
    config.write_instances(&["C-rejected"]);
    let client = client();
    let rejected_now = || async {
        // A newer version each time: an older one would be skipped as stale.
        let seq = now_secs() as u64;
        let delivery = order(&format!("probe-{seq}"), "C-rejected", seq, "paid");
        let response = delivery.send(&client, &server).await;
        let id = response.json::<serde_json::Value>().await.unwrap()["event_id"].as_i64().unwrap();
        let store = database.store().await;
        let dead = || async {
            store.event(id).await.unwrap().unwrap().state == hookgate_store::EventState::Dead
        };
        let done = eventually(Duration::from_secs(5), dead).await;
        store.close().await;
        done
    };
    assert!(
        eventually(Duration::from_secs(30), rejected_now).await,
        "the new instance settings apply: {}",
        log_text(&config.dir.path().join("serve.log"))
    );
    drop(server);
    database.cleanup().await;
}

/// A `redact` added by a reload masks what the admin API shows from then on.
#[tokio::test]
async fn a_reloaded_redaction_masks_what_operators_see() {
    const TOKEN: &str = "reload-admin-token-0123456789";
    let database = Database::sqlite().await;
    let config = Config::new();
    let (server, admin) = ServerBuilder::new(database.url())
        .pipelines(config.pipelines())
        .instances(config.instances())
        .start_with_admin(TOKEN);
    let client = client();
    let response = order("o-1", "C-1", 1, "paid").send(&client, &server).await;
    let id = response.json::<serde_json::Value>().await.unwrap()["event_id"].as_i64().unwrap();
    let body = || async {
        let story: serde_json::Value = client
            .get(format!("{admin}/api/v1/events/{id}?body=true"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        story["body"]["text"].as_str().unwrap_or_default().to_owned()
    };
    assert!(body().await.contains(r#""status":"paid""#));
    config.write_pipeline_with("", "redact:\n  body: [/status]\n");
    hangup(&server);
    let masked = || async { !body().await.contains("paid") };
    assert!(eventually(Duration::from_secs(20), masked).await, "{}", body().await);
    drop(server);
    database.cleanup().await;
}
