//! Test support: `hookgate serve` as a child process over a real database, signed deliveries,
//! and a TCP proxy that can cut the database off.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use hookgate_store::testing::{drop_postgres_database, fresh_postgres_database, sqlite_url};
use hookgate_store::{Store, StoreOptions};
use hookgate_verify::{Algorithm, Encoding, compute_mac};

pub const GITHUB_SECRET: &str = "github-e2e-secret";
pub const PARTNER_SECRET: &str = "partner-e2e-secret";
pub const STANDARD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
pub const ORDERS_SECRET: &str = "orders-e2e-secret";

/// An HTTP client for tests (reqwest needs the process's crypto provider installed first).
pub fn client() -> reqwest::Client {
    client_builder().build().expect("a client")
}

pub fn client_builder() -> reqwest::ClientBuilder {
    hookgate_connector_http::install_crypto_provider();
    reqwest::Client::builder()
}

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repository root")
}

/// A database for one test: a SQLite file in a temporary directory, or a fresh PostgreSQL
/// database dropped at the end.
pub enum Database {
    Sqlite { dir: tempfile::TempDir, url: String },
    Postgres { url: String },
}

impl Database {
    pub async fn sqlite() -> Database {
        let dir = tempfile::tempdir().expect("temporary directory");
        let url = sqlite_url(dir.path());
        Database::Sqlite { dir, url }
    }

    pub async fn postgres() -> Database {
        Database::Postgres { url: fresh_postgres_database().await }
    }

    /// Both backends, SQLite first.
    pub async fn both() -> [Database; 2] {
        [Database::sqlite().await, Database::postgres().await]
    }

    pub fn url(&self) -> &str {
        match self {
            Database::Sqlite { url, .. } | Database::Postgres { url } => url,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Database::Sqlite { .. } => "sqlite",
            Database::Postgres { .. } => "postgres",
        }
    }

    /// A store on the same database, to inspect what the server committed.
    pub async fn store(&self) -> Store {
        Store::connect(self.url(), &StoreOptions::default())
            .await
            .expect("the test can open the store")
    }

    pub async fn cleanup(self) {
        match self {
            Database::Sqlite { dir, .. } => drop(dir),
            Database::Postgres { url } => drop_postgres_database(&url).await,
        }
    }
}

/// A running `hookgate serve`. Killed when dropped.
pub struct Server {
    pub child: Child,
    pub address: SocketAddr,
    pub base: String,
}

#[derive(Clone)]
pub struct ServerBuilder {
    database_url: String,
    extra_args: Vec<String>,
    unset_env: Vec<&'static str>,
    extra_env: Vec<(String, String)>,
    pipelines: Option<PathBuf>,
    instances: Option<PathBuf>,
    workers: usize,
    /// Where the server's log goes (default: the test's stderr).
    log: Option<PathBuf>,
}

impl ServerBuilder {
    pub fn new(database_url: &str) -> ServerBuilder {
        ServerBuilder {
            database_url: database_url.to_owned(),
            extra_args: Vec::new(),
            unset_env: Vec::new(),
            extra_env: Vec::new(),
            pipelines: None,
            instances: None,
            // Intake alone by default: the intake tests read items as intake left them.
            workers: 0,
            log: None,
        }
    }

    pub fn arg(mut self, arg: &str) -> ServerBuilder {
        self.extra_args.push(arg.to_owned());
        self
    }

    /// Pipeline files instead of the shipped `pipelines/`.
    pub fn pipelines(mut self, path: PathBuf) -> ServerBuilder {
        self.pipelines = Some(path);
        self
    }

    pub fn instances(mut self, path: PathBuf) -> ServerBuilder {
        self.instances = Some(path);
        self
    }

    pub fn workers(mut self, workers: usize) -> ServerBuilder {
        self.workers = workers;
        self
    }

    /// Sends the server's log to a file, for tests that read it.
    pub fn log(mut self, path: PathBuf) -> ServerBuilder {
        self.log = Some(path);
        self
    }

    pub fn env(mut self, name: &str, value: &str) -> ServerBuilder {
        self.extra_env.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn without_env(mut self, name: &'static str) -> ServerBuilder {
        self.unset_env.push(name);
        self
    }

    fn base_command(&self, subcommand: &str) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_hookgate"));
        command
            .arg(subcommand)
            .arg("--database-url")
            .arg(&self.database_url)
            .args(["--db-acquire-timeout-ms", "1000", "--idle-poll-ms", "50"])
            .arg("--workers")
            .arg(self.workers.to_string())
            .current_dir(root())
            .env("GITHUB_WEBHOOK_SECRET", GITHUB_SECRET)
            .env("STRIPE_WEBHOOK_SECRET", "stripe-e2e-secret")
            .env("STRIPE_API_KEY", "sk_test_e2e")
            .env("STANDARD_WEBHOOKS_SECRET", STANDARD_SECRET)
            .env("CRM_PARTNER_SECRET", PARTNER_SECRET)
            .env("ORDERS_SECRET", ORDERS_SECRET)
            .env("SHOPIFY_WEBHOOK_SECRET", "shopify-e2e-secret")
            .env("SIGNUPS_SECRET", "signups-e2e-secret")
            .env("SALESFORCE_CLIENT_ID", "e2e-client")
            .env("SALESFORCE_CLIENT_SECRET", "e2e-secret")
            .env("HUBSPOT_TOKEN", "pat-na1-e2e")
            .env("RUST_LOG", "warn")
            .env_remove("DATABASE_URL");
        if let Some(instances) = &self.instances {
            command.arg("--instances").arg(instances);
        }
        if let Some(pipelines) = &self.pipelines {
            command.arg(pipelines);
        }
        command.args(&self.extra_args);
        for name in &self.unset_env {
            command.env_remove(name);
        }
        for (name, value) in &self.extra_env {
            command.env(name, value);
        }
        command
    }

    pub fn command(&self) -> Command {
        let mut command = self.base_command("serve");
        command.args(["--listen", "127.0.0.1:0"]);
        command
    }

    /// Starts the server and waits for the line that gives its address.
    pub fn start(&self) -> Server {
        let mut command = self.command();
        if let Some(log) = &self.log {
            command.stderr(std::fs::File::create(log).expect("a log file"));
        }
        let (child, line) = spawn_and_read_first_line(command);
        let address: SocketAddr = line
            .strip_prefix("hookgate listening on http://")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line: {line}"));
        Server { child, address, base: format!("http://{address}") }
    }

    /// Starts the server with its admin listener on a free loopback port, `token` its admin
    /// token; returns the server and the admin listener's base URL.
    pub fn start_with_admin(&self, token: &str) -> (Server, String) {
        let mut command = self.command();
        command.args(["--admin-listen", "127.0.0.1:0"]).env("HOOKGATE_ADMIN_TOKEN", token);
        if let Some(log) = &self.log {
            command.stderr(std::fs::File::create(log).expect("a log file"));
        }
        let (child, lines) = spawn_and_read_lines(command, 2);
        let address: SocketAddr = lines[0]
            .strip_prefix("hookgate listening on http://")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line: {lines:?}"));
        let admin = lines[1]
            .strip_prefix("hookgate admin on ")
            .unwrap_or_else(|| panic!("unexpected second line: {lines:?}"))
            .to_owned();
        (Server { child, address, base: format!("http://{address}") }, admin)
    }

    /// Starts `hookgate work`: workers only, no HTTP.
    pub fn start_workers(&self) -> Child {
        let (child, line) = spawn_and_read_first_line(self.base_command("work"));
        assert_eq!(line, "hookgate working");
        child
    }
}

fn spawn_and_read_first_line(command: Command) -> (Child, String) {
    let (child, mut lines) = spawn_and_read_lines(command, 1);
    (child, lines.remove(0))
}

/// Starts `command` and reads its first `count` lines of stdout.
fn spawn_and_read_lines(mut command: Command, count: usize) -> (Child, Vec<String>) {
    let mut child = command.stdout(Stdio::piped()).spawn().expect("hookgate starts");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut read = Vec::new();
    for _ in 0..count {
        let line = lines.next().and_then(Result::ok).unwrap_or_else(|| {
            let status = child.wait();
            panic!("hookgate exited before it was ready: {status:?}")
        });
        read.push(line);
    }
    // Keep draining stdout so the child never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (child, read)
}

impl Server {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// SIGKILL: no chance to flush or finish anything.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM: the graceful path.
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .expect("kill runs");
        assert!(status.success());
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A delivery to send: headers and body, exactly.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub pipeline: &'static str,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Delivery {
    pub async fn send(&self, client: &reqwest::Client, server: &Server) -> reqwest::Response {
        let mut request =
            client.post(server.url(&format!("/hooks/{}", self.pipeline))).body(self.body.clone());
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        request.send().await.expect("the server answers")
    }

    pub fn with_header(mut self, name: &str, value: &str) -> Delivery {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }
}

fn hex_hmac(secret: &str, body: &[u8]) -> String {
    Encoding::Hex.encode(&compute_mac(Algorithm::HmacSha256, secret.as_bytes(), &[body]))
}

/// An order for the delivery tests' `orders` pipeline: keyed by `id`, ordered by `seq` per
/// customer.
pub fn order(id: &str, customer: &str, seq: u64, status: &str) -> Delivery {
    let body =
        format!(r#"{{"id":"{id}","customer":"{customer}","seq":{seq},"status":"{status}"}}"#);
    let signature = format!("sha256={}", hex_hmac(ORDERS_SECRET, body.as_bytes()));
    Delivery {
        pipeline: "orders",
        headers: vec![("X-Signature".into(), signature)],
        body: body.into_bytes(),
    }
}

/// Any body, signed for the `orders` pipeline of the delivery tests.
pub fn order_raw(body: &[u8]) -> Delivery {
    let signature = format!("sha256={}", hex_hmac(ORDERS_SECRET, body));
    Delivery {
        pipeline: "orders",
        headers: vec![("X-Signature".into(), signature)],
        body: body.to_vec(),
    }
}

/// A Shopify customer webhook for the shipped `shopify` pipeline.
pub fn shopify_customer(
    webhook_id: &str,
    customer_id: u64,
    updated_at: &str,
    first: &str,
    email: &str,
) -> Delivery {
    let body = format!(
        r#"{{"id":{customer_id},"email":"{email}","first_name":"{first}","last_name":"Norman","updated_at":"{updated_at}"}}"#
    );
    let mac = compute_mac(Algorithm::HmacSha256, b"shopify-e2e-secret", &[body.as_bytes()]);
    Delivery {
        pipeline: "shopify",
        headers: vec![
            ("X-Shopify-Topic".into(), "customers/update".into()),
            ("X-Shopify-Shop-Domain".into(), "e2e-shop.myshopify.com".into()),
            ("X-Shopify-Webhook-Id".into(), webhook_id.into()),
            ("X-Shopify-Hmac-Sha256".into(), Encoding::Base64.encode(&mac)),
        ],
        body: body.into_bytes(),
    }
}

/// A sign-up for the shipped `signups` pipeline, signed now.
pub fn signup(event_id: &str, email: &str, first: &str, plan: &str) -> Delivery {
    let body = format!(
        r#"{{"event_id":"{event_id}","type":"user.signed_up","plan":"{plan}","user":{{"email":"{email}","first_name":"{first}","last_name":"Hopper"}}}}"#
    );
    let ts = now_secs().to_string();
    let mac = compute_mac(
        Algorithm::HmacSha256,
        b"signups-e2e-secret",
        &[ts.as_bytes(), b".", body.as_bytes()],
    );
    Delivery {
        pipeline: "signups",
        headers: vec![
            ("X-Timestamp".into(), ts),
            ("X-Signature".into(), format!("v1={}", Encoding::Base64.encode(&mac))),
        ],
        body: body.into_bytes(),
    }
}

/// A patient update for the CRM-partner pipeline (key: SHA-256 of the body).
pub fn partner(patient: &str, command_time: &str, status: &str) -> Delivery {
    let body = format!(
        r#"{{"PracticeId":"practice-7","Command":"PatientUpdated","PatientId":"{patient}","CommandTime":"{command_time}","FirstName":"Ada","LastName":"Lovelace","Status":"{status}"}}"#
    );
    partner_raw(body.into_bytes())
}

/// Any body, signed for the CRM-partner pipeline.
pub fn partner_raw(body: Vec<u8>) -> Delivery {
    let signature = format!("sha256={}", hex_hmac(PARTNER_SECRET, &body));
    Delivery {
        pipeline: "crm-partner",
        headers: vec![
            ("Content-Type".into(), "application/json".into()),
            ("X-Hub-Signature-256".into(), signature),
        ],
        body,
    }
}

/// A GitHub push with the given delivery id (the key) and body.
pub fn github(delivery_id: &str, body: &str) -> Delivery {
    let signature = format!("sha256={}", hex_hmac(GITHUB_SECRET, body.as_bytes()));
    Delivery {
        pipeline: "github",
        headers: vec![
            ("X-GitHub-Delivery".into(), delivery_id.into()),
            ("X-GitHub-Event".into(), "push".into()),
            ("X-GitHub-Hook-ID".into(), "4242".into()),
            ("X-Hub-Signature-256".into(), signature),
            ("Authorization".into(), "Bearer must-not-be-stored".into()),
        ],
        body: body.as_bytes().to_vec(),
    }
}

/// A GitHub delivery from a hook created with `content_type: form`: the JSON document as the
/// url-encoded `payload` parameter, signed over the form's raw bytes as GitHub signs it.
pub fn github_form(delivery_id: &str, document: &str) -> Delivery {
    let body =
        form_urlencoded::Serializer::new(String::new()).append_pair("payload", document).finish();
    github(delivery_id, &body).with_header("Content-Type", "application/x-www-form-urlencoded")
}

pub fn push_body(login: &str, commit: &str) -> String {
    format!(
        r#"{{"after":"{commit}","repository":{{"full_name":"octo/repo"}},"pusher":{{"name":"{login}","email":"{login}@example.com"}},"sender":{{"login":"{login}"}}}}"#
    )
}

/// A Standard Webhooks delivery signed at `timestamp` (Unix seconds).
pub fn standard(message_id: &str, timestamp: i64, body: &str) -> Delivery {
    let key = base64::engine::general_purpose::STANDARD
        .decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
        .expect("base64");
    let ts = timestamp.to_string();
    let mac = compute_mac(
        Algorithm::HmacSha256,
        &key,
        &[message_id.as_bytes(), b".", ts.as_bytes(), b".", body.as_bytes()],
    );
    Delivery {
        pipeline: "standard-webhooks",
        headers: vec![
            ("webhook-id".into(), message_id.into()),
            ("webhook-timestamp".into(), ts),
            ("webhook-signature".into(), format!("v1,{}", Encoding::Base64.encode(&mac))),
        ],
        body: body.as_bytes().to_vec(),
    }
}

pub fn now_secs() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_secs() as i64
}

/// Polls `check` until it holds or `timeout` passes.
pub async fn eventually<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The mock CRM at `path`, opened to read what it holds (no faults, no idempotency).
pub async fn mock_crm(path: &str) -> hookgate_connector_mock::MockCrm {
    hookgate_connector_mock::MockCrm::open(hookgate_connector_mock::MockSettings {
        path: path.to_owned(),
        idempotency: false,
        faults: Default::default(),
        batch_max: 1,
    })
    .await
    .expect("the mock CRM opens")
}
