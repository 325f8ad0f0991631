//! Connector plugins for real: the example `jsonfile` connector (`examples/connector-plugin`),
//! a crate outside the workspace, is built as a `cdylib` by this test, passes the conformance
//! suite through the C ABI, and receives deliveries end to end through an unmodified
//! `hookgate serve`. A plugin that panics or blocks is classified and the gateway keeps
//! serving. What was written is read from the CRM's own file, not from hookgate.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::*;
use hookgate_connector::conformance::{self, Fault, Harness};
use hookgate_connector::{
    BoxFuture, Connector, Credentials, LookupOutcome, LookupRequest, Operation, Secret,
    UpsertRequest,
};
use hookgate_plugin::host::{Limits, Plugin};
use serde_json::{Value, json};

/// The example plugin, built once per test run with the same cargo that runs the tests.
fn plugin_library() -> PathBuf {
    static BUILT: Mutex<Option<PathBuf>> = Mutex::new(None);
    let mut built = BUILT.lock().unwrap();
    if let Some(path) = built.as_ref() {
        return path.clone();
    }
    let root = root();
    let target = root.join("target/plugin");
    let status = std::process::Command::new(env!("CARGO"))
        .args(["build", "--quiet", "--manifest-path"])
        .arg(root.join("examples/connector-plugin/Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        .status()
        .expect("cargo runs");
    assert!(status.success(), "the example plugin must build: {status}");
    let name = format!(
        "{}hookgate_plugin_jsonfile{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let path = target.join("debug").join(name);
    assert!(path.is_file(), "{} was not built", path.display());
    *built = Some(path.clone());
    path
}

/// The plugin copied into a fresh directory only its owner can write to, as an operator
/// installs it.
fn plugin_directory(dir: &Path) -> PathBuf {
    let plugins = dir.join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    std::fs::set_permissions(&plugins, std::fs::Permissions::from_mode(0o755)).unwrap();
    let library = plugin_library();
    let installed = plugins.join(library.file_name().unwrap());
    std::fs::copy(&library, &installed).unwrap();
    std::fs::set_permissions(&installed, std::fs::Permissions::from_mode(0o755)).unwrap();
    plugins
}

/// The jsonfile CRM's own record of what was applied: one entry per write.
fn effects(path: &Path) -> Vec<Value> {
    match std::fs::read(path) {
        Ok(bytes) => {
            let crm: Value = serde_json::from_slice(&bytes).unwrap();
            crm["effects"].as_array().cloned().unwrap_or_default()
        }
        Err(_) => Vec::new(),
    }
}

fn settings(value: Value) -> BTreeMap<String, Value> {
    serde_json::from_value(value).unwrap()
}

fn token() -> Credentials {
    Credentials::from([("token".to_owned(), Secret::new("t0ken"))])
}

struct JsonFileHarness {
    plugin: Plugin,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Harness for JsonFileHarness {
    fn connector(&self, fault: Option<Fault>) -> BoxFuture<'_, Arc<dyn Connector>> {
        let fault = fault.map(|fault| match fault {
            Fault::Unavailable => "unavailable",
            Fault::RateLimited => "rate_limited",
            Fault::Invalid => "invalid",
            Fault::LostResponse => "lost_response",
            Fault::BadCredentials => "bad_credentials",
        });
        let settings = settings(json!({"path": self.path, "fault": fault}));
        Box::pin(async move {
            let connector =
                self.plugin.create(&settings, &token(), Limits::default()).await.unwrap();
            Arc::new(connector) as Arc<dyn Connector>
        })
    }

    fn object(&self) -> (&str, &str) {
        ("contacts", "email")
    }

    fn field(&self) -> &str {
        "name"
    }
}

fn write(external_id: &str) -> UpsertRequest {
    UpsertRequest {
        object: "contacts".into(),
        external_id_field: "email".into(),
        external_id_value: external_id.into(),
        fields: BTreeMap::from([("name".to_owned(), "Ada".to_owned())]),
        operation: Operation::Upsert,
        idempotency_key: format!("key-{external_id}"),
    }
}

#[tokio::test]
async fn a_cdylib_built_outside_the_workspace_passes_the_conformance_suite() {
    let dir = tempfile::tempdir().unwrap();
    let plugin =
        Plugin::load(&plugin_directory(dir.path()).join(plugin_library().file_name().unwrap()))
            .unwrap();
    let description = plugin.description();
    assert_eq!(description.kind, "jsonfile");
    assert_eq!(description.credentials, ["token"]);
    assert_eq!(description.settings_schema["properties"]["path"]["type"], "string");
    assert_eq!(description.rules.len(), 1, "{:?}", description.rules);
    let path = dir.path().join("crm.json");
    let harness = JsonFileHarness { plugin, path: path.clone(), _dir: dir };
    conformance::upsert_semantics(&harness).await;
    for fault in Fault::ALL {
        conformance::fault_maps_to_its_class(&harness, fault).await;
    }
    // From the CRM's side: the create, the update, the repeat and the lost response applied.
    assert_eq!(effects(&path).len(), 4, "{:#?}", effects(&path));
}

#[tokio::test]
async fn create_errors_are_the_plugins_own_words() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = Plugin::load(&plugin_library()).unwrap();
    let path = dir.path().join("crm.json");
    let missing = plugin
        .create(&settings(json!({"path": path})), &Credentials::new(), Limits::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(missing.contains("connector plugin `jsonfile`"), "{missing}");
    assert!(missing.contains("credentials: `token` is required"), "{missing}");
    let unknown = plugin
        .create(&settings(json!({"path": path, "colour": "red"})), &token(), Limits::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(unknown.contains("unknown field `colour`"), "{unknown}");
}

/// A panic inside the plugin is an error of its class (a write that may have been sent is
/// ambiguous), and the same instance goes on working.
#[tokio::test]
async fn a_panicking_plugin_is_classified_and_the_instance_survives() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = Plugin::load(&plugin_library()).unwrap();
    let path = dir.path().join("crm.json");
    let connector = plugin
        .create(&settings(json!({"path": path, "panic_on": ["boom"]})), &token(), Limits::default())
        .await
        .unwrap();
    let error = connector.upsert(&write("boom")).await.unwrap_err();
    assert_eq!(error.class(), "ambiguous", "{error}");
    assert!(error.to_string().contains("panicked during a write"), "{error}");
    assert!(error.to_string().contains("told to panic on `boom`"), "{error}");
    let written = connector.upsert(&write("fine")).await.unwrap();
    assert!(written.created);
    let lookup = LookupRequest {
        object: "contacts".into(),
        external_id_field: "email".into(),
        external_id_value: "boom".into(),
        fields: vec!["name".into()],
    };
    assert!(matches!(connector.lookup(&lookup).await.unwrap(), LookupOutcome::NotFound { .. }));
    assert_eq!(effects(&path).len(), 1);
}

/// An answer larger than the host reads is not read: a write is then in doubt (it did land, as
/// the CRM's file shows), never taken for a failure that may be retried blindly.
#[tokio::test]
async fn an_answer_over_the_bound_is_not_read_and_a_write_stays_in_doubt() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = Plugin::load(&plugin_library()).unwrap();
    let path = dir.path().join("crm.json");
    let limits = Limits { max_answer_bytes: 16, ..Limits::default() };
    let connector =
        plugin.create(&settings(json!({"path": path})), &token(), limits).await.unwrap();
    let error = connector.upsert(&write("ada")).await.unwrap_err();
    assert_eq!(error.class(), "ambiguous", "{error}");
    assert!(error.to_string().contains("more than the 16 read"), "{error}");
    assert_eq!(effects(&path).len(), 1);
    let lookup = LookupRequest::from(&write("ada"));
    let error = connector.lookup(&lookup).await.unwrap_err();
    assert_eq!(error.class(), "misconfigured", "{error}");
}

/// `check` asks the plugin itself whether it can build an instance (settings its schema
/// accepts, credentials at hand), and locates its refusal at the instance.
#[test]
fn check_reports_a_plugin_that_refuses_an_instance_where_it_is_written() {
    let dir = tempfile::tempdir().unwrap();
    plugin_directory(dir.path());
    let instances = dir.path().join("hookgate.yaml");
    std::fs::write(
        &instances,
        "plugins:\n  directories: [plugins]\n\
         connectors:\n  - name: crm\n    kind: jsonfile\n\
         \x20   settings: { path: /no/such/directory/crm.json }\n\
         \x20   credentials: { token: { env: JSONFILE_TOKEN } }\n",
    )
    .unwrap();
    let check = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
            .args(["check", "--message-format", "short", "--instances"])
            .arg(&instances)
            .arg(root().join("tests/delivery/orders.yaml"))
            .env("ORDERS_SECRET", "x")
            .env("JSONFILE_TOKEN", "t0ken")
            .output()
            .unwrap()
    };
    let checked = check();
    let report = String::from_utf8_lossy(&checked.stderr);
    assert_eq!(checked.status.code(), Some(1), "{report}");
    assert!(
        report.contains(
            "hookgate.yaml:5:11: error[H0603]: connector `crm`: connector plugin `jsonfile`"
        ),
        "{report}"
    );
    assert!(
        report.contains(
            "create: settings.path: /no/such/directory/crm.json is not in a directory that exists"
        ),
        "{report}"
    );
    // A misspelt setting is one error, where it is written, saying what was meant.
    let text = std::fs::read_to_string(&instances).unwrap();
    std::fs::write(&instances, text.replace("{ path: ", "{ pth: ")).unwrap();
    let report = String::from_utf8_lossy(&check().stderr).into_owned();
    let errors: Vec<&str> = report.lines().filter(|l| l.contains("error[")).collect();
    assert_eq!(errors.len(), 1, "{report}");
    assert!(errors[0].contains("hookgate.yaml:6:22: error[H0603]"), "{report}");
    assert!(errors[0].contains("'pth' was unexpected): did you mean `path`?"), "{report}");
}

/// A library that is not a hookgate plugin is named as such.
#[test]
fn a_library_without_the_entry_symbol_is_refused() {
    // The C library: loaded already, it exports everything but hookgate's entry point.
    let error = Plugin::load(Path::new("libc.so.6")).unwrap_err().to_string();
    assert!(error.contains("no `hookgate_connector_plugin` symbol"), "{error}");
}

/// A symbolic link whose target is gone says so, not "No such file or directory" of a file
/// that is plainly listed.
#[test]
fn a_dangling_symlink_is_named_as_one() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("libgone.so");
    std::os::unix::fs::symlink(dir.path().join("build/libgone.so"), &link).unwrap();
    let error = Plugin::load(&link).unwrap_err().to_string();
    assert!(error.contains("a symbolic link to "), "{error}");
    assert!(error.ends_with("build/libgone.so, which does not exist"), "{error}");
    // `check` of a plugin directory holding it, located.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let instances = dir.path().join("hookgate.yaml");
    std::fs::write(&instances, "plugins:\n  directories: [.]\nconnectors: []\n").unwrap();
    let check = std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
        .args(["check", "--message-format", "short", "--allow-unset-secrets", "--instances"])
        .arg(&instances)
        .arg(root().join("tests/delivery/orders.yaml"))
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&check.stderr);
    assert!(report.contains("error[H0605]"), "{report}");
    assert!(report.contains("libgone.so is a symbolic link to "), "{report}");
}

/// A plugin that blocks past its timeout: the write is ambiguous (it may still land), the
/// blocked call keeps its slot, and with every slot taken a new call is refused as retryable
/// (nothing was sent) instead of piling up threads.
#[tokio::test]
async fn a_blocking_plugin_is_bounded_by_its_timeout_and_its_slots() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = Plugin::load(&plugin_library()).unwrap();
    let path = dir.path().join("crm.json");
    let limits = Limits {
        call_timeout: Duration::from_millis(300),
        grace: Duration::from_millis(200),
        max_calls_in_flight: 1,
        ..Limits::default()
    };
    let connector = plugin
        .create(
            &settings(json!({"path": path, "block_on": ["slow"], "block_ms": 3000})),
            &token(),
            limits,
        )
        .await
        .unwrap();
    let error = connector.upsert(&write("slow")).await.unwrap_err();
    assert_eq!(error.class(), "ambiguous", "{error}");
    assert!(error.to_string().contains("did not return"), "{error}");
    // The blocked write may still land: a lookup of its record cannot be trusted yet.
    let doubt = connector.lookup(&LookupRequest::from(&write("slow"))).await.unwrap_err();
    assert_eq!(doubt.class(), "retryable", "{doubt}");
    assert!(doubt.to_string().contains("has not returned yet"), "{doubt}");
    let busy = connector.upsert(&write("other")).await.unwrap_err();
    assert_eq!(busy.class(), "retryable", "{busy}");
    assert!(busy.to_string().contains("call slots are held"), "{busy}");
    // Once the blocked call returns, its write lands and the slot is free again.
    assert!(
        eventually(Duration::from_secs(10), || async { effects(&path).len() == 1 }).await,
        "the blocked write never landed"
    );
    let fine = connector.upsert(&write("other")).await.unwrap();
    assert!(fine.created);
    let LookupOutcome::Found { .. } =
        connector.lookup(&LookupRequest::from(&write("slow"))).await.unwrap()
    else {
        panic!("the write that was in doubt landed")
    };
}

/// The whole path through an unmodified `hookgate serve`: `check` and `connectors` see the
/// plugin's kind, signed deliveries become one write each in the plugin's CRM, and a delivery
/// that makes the plugin panic is retried, reconciled and dead-lettered while the gateway
/// keeps serving the others.
#[tokio::test]
async fn hookgate_serve_delivers_through_a_plugin_and_survives_its_panics() {
    let dir = tempfile::tempdir().unwrap();
    plugin_directory(dir.path());
    let crm = dir.path().join("crm.json");
    let instances = dir.path().join("hookgate.yaml");
    std::fs::write(
        &instances,
        "plugins:\n  directories: [plugins]\n\
         connectors:\n  - name: crm\n    kind: jsonfile\n\
         \x20   settings: { path: { env: JSONFILE_CRM }, panic_on: [boom] }\n\
         \x20   credentials: { token: { env: JSONFILE_TOKEN } }\n",
    )
    .unwrap();

    let kinds = std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
        .args(["connectors", "--json", "--instances"])
        .arg(&instances)
        .output()
        .unwrap();
    // `check` sees the plugin's kind and its schema, and a setting given by reference is
    // a secret like a credential: reported where it is written while it is unset.
    let check = std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
        .args(["check", "--message-format", "short", "--instances"])
        .arg(&instances)
        .arg(root().join("tests/delivery/orders.yaml"))
        .env("ORDERS_SECRET", "x")
        .env("JSONFILE_TOKEN", "t0ken")
        .env_remove("JSONFILE_CRM")
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&check.stderr);
    assert!(check.status.success(), "{report}");
    assert!(
        report.contains(
            "hookgate.yaml:6:23: warning[H0801]: environment variable `JSONFILE_CRM` is not set"
        ),
        "{report}"
    );
    assert!(kinds.status.success(), "{}", String::from_utf8_lossy(&kinds.stderr));
    let listed: Vec<Value> = String::from_utf8(kinds.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let jsonfile = listed.iter().find(|kind| kind["kind"] == "jsonfile").unwrap();
    assert!(jsonfile["origin"].as_str().unwrap().ends_with(".so"), "{jsonfile}");
    let (listed_instances, kinds): (Vec<&Value>, Vec<&Value>) =
        listed.iter().partition(|line| line.get("instance").is_some());
    let names: Vec<&str> = kinds.iter().map(|kind| kind["kind"].as_str().unwrap()).collect();
    assert_eq!(names, ["http", "hubspot", "jsonfile", "mock", "salesforce"]);
    let hubspot = kinds.iter().find(|kind| kind["kind"] == "hubspot").unwrap();
    assert_eq!(hubspot["limits"], serde_json::json!({"rate": {"calls": 100, "per_ms": 10_000}}));
    // Each instance with the budget it runs under: a plugin that publishes none has none.
    assert_eq!(
        listed_instances,
        [
            &serde_json::json!({"instance": "crm", "kind": "jsonfile", "limits": {"rate": null}, "limits_from": "kind"})
        ]
    );

    let database = Database::sqlite().await;
    let log = dir.path().join("server.log");
    let server = ServerBuilder::new(database.url())
        .pipelines(root().join("tests/delivery/orders.yaml"))
        .instances(instances.clone())
        .workers(2)
        .env("JSONFILE_TOKEN", "t0ken")
        .env("JSONFILE_CRM", crm.to_str().unwrap())
        // A panic's backtrace is many lines of text: none of it may reach a JSON log.
        .env("RUST_BACKTRACE", "1")
        .arg("--log-format")
        .arg("json")
        .log(log.clone())
        .start();
    // An upgrade by `cp` over the installed library, in place, while it is loaded: the
    // gateway runs a private copy, so it is not touched.
    let installed =
        std::fs::read_dir(dir.path().join("plugins")).unwrap().next().unwrap().unwrap().path();
    std::fs::write(&installed, b"not a library any more").unwrap();
    let client = client();
    for (id, customer) in [("o-1", "ada"), ("o-2", "boom"), ("o-3", "grace")] {
        let response = order(id, customer, 1, "paid").send(&client, &server).await;
        assert_eq!(response.status(), 202, "{id}");
    }
    // The panicking event keeps failing; the others land once each.
    assert!(
        eventually(Duration::from_secs(30), || async {
            let written: Vec<String> = effects(&crm)
                .iter()
                .map(|e| e["external_id"].as_str().unwrap().to_owned())
                .collect();
            written.len() == 2
                && written.contains(&"ada".into())
                && written.contains(&"grace".into())
        })
        .await,
        "{:#?}",
        effects(&crm)
    );
    let store = database.store().await;
    assert!(
        eventually(Duration::from_secs(60), || async {
            store.dead_events(Some("orders")).await.unwrap().len() == 1
        })
        .await,
        "the panicking write was not dead-lettered"
    );
    let dead = store.dead_events(Some("orders")).await.unwrap()[0];
    let attempts = store.attempts_for(dead).await.unwrap();
    let reasons: Vec<String> = attempts.iter().filter_map(|a| a.error.clone()).collect();
    assert!(
        reasons.iter().any(|error| error.contains("panicked during a write")),
        "the evidence must say the plugin panicked: {reasons:#?}"
    );
    // Each panic was an unknown outcome: the engine looked the record up before retrying.
    assert!(attempts.iter().any(|a| a.action.as_deref() == Some("lookup")), "{attempts:#?}");
    // Still serving after the plugin's panics.
    let response = order("o-4", "linus", 1, "paid").send(&client, &server).await;
    assert_eq!(response.status(), 202);
    assert!(
        eventually(Duration::from_secs(30), || async { effects(&crm).len() == 3 }).await,
        "{:#?}",
        effects(&crm)
    );
    // Every line of the log is JSON, the plugin's panics included, which say where they were.
    let logged = std::fs::read_to_string(&log).unwrap();
    for line in logged.lines().filter(|line| !line.trim().is_empty()) {
        assert!(serde_json::from_str::<Value>(line).is_ok(), "not JSON: {line}");
    }
    assert!(
        logged.contains("told to panic on `boom` (at src/lib.rs:"),
        "a panic is logged with its place: {logged}"
    );
    drop(server);
    database.cleanup().await;
}
