//! `hookgate`: the webhook gateway's command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::{Args, Parser, Subcommand};
use hookgate::check::{self, Options, SecretPolicy};
use hookgate::demo::{self, DemoOptions};
use hookgate::output::{Bodies, Format};
use hookgate::render::{self, Color, MessageFormat};
use hookgate::serve::{self, ServeOptions};
use hookgate::{connectors, events};
use hookgate_engine::{InHand, WorkerConfig, now_ms};
use hookgate_pipeline::Code;
use hookgate_server::ServerConfig;
use hookgate_store::{Access, EventFilter, Store, StoreOptions};

#[derive(Debug, Parser)]
#[command(
    name = "hookgate",
    version,
    about = "A webhook gateway that turns at-least-once deliveries into exactly one CRM effect per event"
)]
struct Cli {
    /// Log lines as `text` (key=value) or `json` (one object per line, for log collectors).
    #[arg(long, global = true, env = "HOOKGATE_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate pipelines, connector instances and secrets, and run every pipeline's fixtures.
    ///
    /// Reports every problem with file:line:column and exits non-zero on any error. Unset
    /// secrets are warnings here (CI has no production secrets); `serve` refuses them.
    Check {
        #[command(flatten)]
        config: ConfigArgs,
        /// Rewrite the `expect:` of every fixture that fails, or expects nothing beyond a valid
        /// signature, from what its delivery produces (also `UPDATE_EXPECT=1`); review the diff.
        #[arg(long)]
        bless: bool,
        /// How to show problems: `human` (the source line and a caret, on stderr), `short`
        /// (one line each, on stderr) or `json` (one object per line, on stdout).
        #[arg(long, value_enum, default_value = "human")]
        message_format: MessageFormat,
        /// Colour in the human form: `auto` (when stderr is a terminal and NO_COLOR is unset),
        /// `always` or `never`.
        #[arg(long, value_enum, default_value = "auto")]
        color: Color,
        /// Do not warn about secrets whose environment variable or file is not set (CI without
        /// production secrets). `serve` still refuses them.
        #[arg(long)]
        allow_unset_secrets: bool,
        /// The workers' settings (and their environment variables) are checked too, so that a
        /// deployment's CI refuses what `serve` would.
        #[command(flatten)]
        work: WorkArgs,
    },
    /// Explain an error code from `check`: what it means, an example and how to fix it.
    Explain {
        /// The code, e.g. `H0103`.
        code: String,
    },
    /// Serve `POST /hooks/{pipeline}`, `GET /healthz` and `GET /readyz`, and deliver to the CRMs.
    ///
    /// Refuses to start if the configuration has any error or a secret is unset. A delivery
    /// is answered 2xx only after it is committed to the database; workers then apply it to the
    /// CRM. SIGTERM stops accepting, finishes requests and CRM calls in flight, then exits.
    Serve {
        #[command(flatten)]
        config: ConfigArgs,
        #[command(flatten)]
        database: DatabaseArgs,
        #[command(flatten)]
        serve: ServeArgs,
        #[command(flatten)]
        work: WorkArgs,
    },
    /// Deliver to the CRMs without serving HTTP: workers and retention only.
    Work {
        #[command(flatten)]
        config: ConfigArgs,
        #[command(flatten)]
        database: DatabaseArgs,
        #[command(flatten)]
        work: WorkArgs,
    },
    /// What happened to an event: list, show the whole story, replay dead letters.
    Events {
        #[command(flatten)]
        database: DatabaseArgs,
        /// The pipeline files (or directories) the gateway serves: their names are valid
        /// `--pipeline` values even before any event arrives.
        #[arg(
            long,
            global = true,
            env = "HOOKGATE_PIPELINES",
            value_delimiter = ',',
            default_value = "pipelines"
        )]
        pipelines: Vec<PathBuf>,
        /// The connector-instances file: its payload keys open sealed payloads.
        #[arg(long, global = true, env = "HOOKGATE_INSTANCES", default_value = "hookgate.yaml")]
        instances: PathBuf,
        #[command(subcommand)]
        command: EventsCommand,
    },
    /// Payload keys: re-seal stored payloads under the current key.
    Keys {
        #[command(flatten)]
        database: DatabaseArgs,
        /// The connector-instances file, whose `payload_encryption.keys` lists the keys.
        #[arg(long, global = true, env = "HOOKGATE_INSTANCES", default_value = "hookgate.yaml")]
        instances: PathBuf,
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Inspect a mock CRM: its records and its effect log.
    Crm {
        /// The connector-instances file.
        #[arg(long, env = "HOOKGATE_INSTANCES", default_value = "hookgate.yaml", global = true)]
        instances: PathBuf,
        /// The mock connector instance.
        #[arg(long, default_value = "crm", global = true)]
        connector: String,
        #[command(subcommand)]
        command: CrmCommand,
    },
    /// Print the signature headers a sender would send with a body, for writing fixtures.
    ///
    /// Signs with the pipeline's first secret (from its environment variable or file), at
    /// `--timestamp` (default: now) for timestamped schemes.
    Sign {
        /// The pipeline file.
        pipeline: PathBuf,
        /// The body, byte for byte.
        #[arg(long)]
        body: PathBuf,
        /// Take the secret from this fixture's `secrets` instead of the environment.
        #[arg(long)]
        fixture: Option<PathBuf>,
        /// For public-key schemes (SendGrid, AWS SNS): the sender's private key (PEM or base64
        /// DER), which hookgate otherwise never holds; the pipeline's secret is then its
        /// public key or certificate, used to check the result.
        #[arg(long)]
        private_key: Option<PathBuf>,
        /// Unix seconds to sign at.
        #[arg(long)]
        timestamp: Option<i64>,
        /// The message id (Standard Webhooks).
        #[arg(long, default_value = "msg_fixture")]
        message_id: String,
        /// The URL the sender calls (URL-signed schemes).
        #[arg(long, default_value = "https://hookgate.example/hooks")]
        url: String,
        #[arg(long, default_value = "POST")]
        method: String,
    },
    /// Sign a delivery as the pipeline's sender would, post it to a running gateway, print the
    /// answer
    ///
    /// A fixture's body and headers (`--fixture`) or a body (`--body`), signed now with the
    /// secret the pipeline names (or, unset, the fixture's test value).
    Send {
        /// The pipeline file.
        pipeline: PathBuf,
        /// A fixture of the pipeline: its body and headers, the signature made afresh.
        #[arg(long, conflicts_with = "body", required_unless_present = "body")]
        fixture: Option<PathBuf>,
        /// A body, byte for byte.
        #[arg(long)]
        body: Option<PathBuf>,
        /// The gateway (posted to `/hooks/NAME`), or a whole hook URL.
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        to: String,
        /// More headers, `Name: value`, replacing the fixture's of that name.
        #[arg(long = "header")]
        headers: Vec<String>,
        /// The message id (Standard Webhooks; default: a new one).
        #[arg(long)]
        message_id: Option<String>,
        /// For public-key schemes (SendGrid): the sender's private key (PEM or base64 DER).
        #[arg(long)]
        private_key: Option<PathBuf>,
    },
    /// Fixtures: `new` writes a signed one for a body, its expectation taken from what the
    /// delivery produces.
    Fixture {
        #[command(subcommand)]
        command: FixtureCommand,
    },
    /// Print a JSON Schema: `pipeline`, `fixture` or `instances` (for `hookgate.yaml`).
    Schema {
        /// Which schema.
        #[arg(value_parser = ["pipeline", "fixture", "instances"])]
        name: String,
    },
    /// The connector kinds this configuration can use: in-tree ones and the plugins that
    /// `hookgate.yaml` loads, each with its version, origin, credentials and rules.
    Connectors {
        /// The connector-instances file (its `plugins.directories`).
        #[arg(long, env = "HOOKGATE_INSTANCES", default_value = "hookgate.yaml")]
        instances: PathBuf,
        /// Print this kind's settings JSON Schema instead.
        #[arg(long, value_name = "KIND")]
        schema: Option<String>,
        /// One JSON object per kind.
        #[arg(long)]
        json: bool,
    },
    /// Run the whole path on embedded defaults (SQLite, a faulty mock CRM, the shipped
    /// pipelines) and show every delivery becoming exactly one CRM effect, with evidence.
    Demo {
        /// The pipelines to run.
        #[arg(long, default_value = "pipelines")]
        pipelines: PathBuf,
        /// Where to keep the demo's database and mock CRM (default: a new temporary directory).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum EventsCommand {
    /// Events, newest first, a page at a time.
    List {
        /// Only this pipeline's (one the store has events or deliveries of).
        #[arg(long)]
        pipeline: Option<String>,
        /// accepted (writes to do), done, or dead.
        #[arg(long)]
        state: Option<String>,
        /// Only events received in this last period, e.g. `1h` or `7d`.
        #[arg(long, value_parser = humantime_duration)]
        since: Option<Duration>,
        #[command(flatten)]
        page: PageArgs,
    },
    /// The whole story of one event: receipt, identity, deliveries, writes and attempts.
    Show {
        id: i64,
        /// Also the stored body (escaped, at most 64 KiB).
        #[arg(long)]
        body: bool,
        /// One JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Deliveries signed correctly but refused (not JSON, no key, ...), with the reason.
    Rejected {
        #[arg(long)]
        pipeline: Option<String>,
        /// Also each stored body (escaped, at most 64 KiB).
        #[arg(long)]
        body: bool,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Deliveries refused for their signature (401): nothing of them is stored, so they are
    /// counted per pipeline, code and reason, with when each was first and last seen and,
    /// for URL-signing senders, the URL verified against. Newest first.
    Refused {
        #[arg(long)]
        pipeline: Option<String>,
        /// Rows at most, 1 to 1000.
        #[arg(long, default_value_t = 50)]
        limit: i64,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Queue an event's dead writes again; with `--dead`, every dead-lettered event.
    Replay {
        id: Option<i64>,
        #[arg(long, conflicts_with = "id")]
        dead: bool,
        /// With `--dead`: only this pipeline.
        #[arg(long, requires = "dead")]
        pipeline: Option<String>,
        #[arg(long)]
        json: bool,
    },
}

/// A page of a list, newest first.
#[derive(Debug, Args)]
struct PageArgs {
    /// Rows per page, 1 to 1000.
    #[arg(long, default_value_t = 50)]
    limit: i64,
    /// The next page: rows older than this id (the last one shown).
    #[arg(long)]
    after: Option<i64>,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum CrmCommand {
    /// Records, by object and external id.
    Records {
        #[arg(long)]
        object: Option<String>,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Every write the mock applied, in order, with its idempotency key.
    Effects {
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
}

fn humantime_duration(text: &str) -> Result<Duration, String> {
    text.parse::<humantime::Duration>().map(Into::into).map_err(|e| e.to_string())
}

#[derive(Debug, Subcommand)]
enum FixtureCommand {
    /// Write `pipelines/NAME/FIXTURE.yaml` (and the body beside it) for a body, signed with test
    /// secrets (made up unless given), its `expect:` written from what the delivery produces.
    New {
        /// The pipeline file.
        pipeline: PathBuf,
        /// The body, byte for byte.
        #[arg(long)]
        body: PathBuf,
        /// The fixture's name (the file is NAME.yaml beside the pipeline's other fixtures).
        #[arg(long)]
        name: String,
        /// The URL the sender calls (URL-signed schemes).
        #[arg(long)]
        url: Option<String>,
        /// The signing time and the fixture's clock, RFC 3339 (default: now).
        #[arg(long)]
        now: Option<String>,
        /// A header the sender sends besides the signature, `Name: value`; repeatable.
        #[arg(long = "header")]
        headers: Vec<String>,
        /// The message id (Standard Webhooks).
        #[arg(long, default_value = "msg_fixture")]
        message_id: String,
        /// A test value for a secret reference, `NAME=VALUE`; repeatable.
        #[arg(long = "secret")]
        secrets: Vec<String>,
        /// For public-key schemes: the sender's private key.
        #[arg(long)]
        private_key: Option<PathBuf>,
    },
}

/// The connector-instances file, loaded for a command that needs it whole.
fn load_instances_file(path: &std::path::Path) -> Result<hookgate_pipeline::Instances> {
    let source = hookgate::files::read_config(path).map_err(|d| anyhow::anyhow!("{d}"))?;
    let (loaded, diagnostics) =
        hookgate_pipeline::load_instances(&path.display().to_string(), &source);
    match loaded.filter(|_| !diagnostics.iter().any(|d| d.is_error())) {
        Some(loaded) => Ok(loaded),
        None => {
            let text: Vec<String> = diagnostics.iter().map(ToString::to_string).collect();
            anyhow::bail!("{} has errors:\n{}", path.display(), text.join("\n"))
        }
    }
}

#[derive(Debug, Subcommand)]
enum KeysCommand {
    /// Re-seal every stored payload that is not under the first listed key (plaintext rows
    /// too), a batch at a time. Safe beside `serve`, and resumable: run it again after an
    /// interruption. Remove an old key from the file only after a run that re-sealed
    /// everything.
    Rotate {
        /// Rows read per batch.
        #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(i64).range(1..=10_000))]
        batch: i64,
    },
}

#[derive(Debug, Args)]
struct ConfigArgs {
    /// Pipeline files, or directories holding them.
    #[arg(env = "HOOKGATE_PIPELINES", value_delimiter = ',', default_value = "pipelines")]
    pipelines: Vec<PathBuf>,
    /// The connector-instances file.
    #[arg(long, env = "HOOKGATE_INSTANCES", default_value = "hookgate.yaml")]
    instances: PathBuf,
}

#[derive(Debug, Args)]
struct DatabaseArgs {
    /// Where events are stored: `sqlite://PATH` (embedded, the default) or
    /// `postgres://USER@HOST/DB` (production; several gateways may share one).
    #[arg(long, global = true, env = "DATABASE_URL", default_value = "sqlite://hookgate.db")]
    database_url: String,
    /// PostgreSQL connections this process may open.
    #[arg(long, global = true, env = "HOOKGATE_DB_MAX_CONNECTIONS", default_value_t = 16)]
    db_max_connections: u32,
    /// How long a request waits for a database connection before it is answered 503.
    #[arg(long, global = true, env = "HOOKGATE_DB_ACQUIRE_TIMEOUT_MS", default_value_t = 3000)]
    db_acquire_timeout_ms: u64,
}

impl DatabaseArgs {
    fn store_options(&self) -> StoreOptions {
        StoreOptions {
            max_connections: self.db_max_connections,
            acquire_timeout: Duration::from_millis(self.db_acquire_timeout_ms),
        }
    }
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// The address to listen on; port 0 picks a free port (printed at start).
    #[arg(long, env = "HOOKGATE_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Bodies larger than this many bytes are answered 413.
    #[arg(long, env = "HOOKGATE_BODY_LIMIT_BYTES", default_value_t = 1024 * 1024)]
    body_limit_bytes: usize,
    /// Bodies of all requests together may hold this many bytes at once; a request that
    /// would go over waits (within its read timeout). At least the body limit.
    #[arg(long, env = "HOOKGATE_BODY_BUDGET_BYTES", default_value_t = 64 * 1024 * 1024)]
    body_budget_bytes: usize,
    /// All request headers together larger than this many bytes are answered 431.
    #[arg(long, env = "HOOKGATE_HEADER_LIMIT_BYTES", default_value_t = 32 * 1024)]
    header_limit_bytes: usize,
    /// The request line and headers must arrive within this many seconds, and a kept-alive
    /// connection waiting for its next request is closed after it.
    #[arg(long, env = "HOOKGATE_HEADER_TIMEOUT_SECS", default_value_t = 10)]
    header_timeout_secs: u64,
    /// A body not fully received within this many seconds is answered 408.
    #[arg(long, env = "HOOKGATE_READ_TIMEOUT_SECS", default_value_t = 30)]
    read_timeout_secs: u64,
    /// Connections served at once; one more is answered 503 and closed.
    #[arg(long, env = "HOOKGATE_CONNECTIONS_MAX", default_value_t = 1024)]
    connections_max: usize,
    /// On SIGTERM, whatever is still open after this many seconds (connections, CRM calls)
    /// is dropped and the process exits; a write cut off is reconciled by the next worker.
    #[arg(long, env = "HOOKGATE_SHUTDOWN_TIMEOUT_SECS", default_value_t = 15)]
    shutdown_timeout_secs: u64,
    /// The public base URL senders call (e.g. `https://hooks.example.com`); URL-signed schemes
    /// (HubSpot v3) sign it. Without it the URL is rebuilt from the Host header.
    #[arg(long, env = "HOOKGATE_PUBLIC_URL")]
    public_url: Option<String>,
    /// Deliveries committed in one transaction at most (group commit); 1 gives each its own
    /// transaction. Batches never wait to fill: they take what queued during the last commit.
    #[arg(long, env = "HOOKGATE_INTAKE_BATCH_MAX", default_value_t = 64,
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    intake_batch_max: u16,
    /// Deliveries waiting for a commit at most; one more is answered 503 with Retry-After.
    #[arg(long, env = "HOOKGATE_INTAKE_QUEUE_MAX", default_value_t = 1024,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    intake_queue_max: u32,
    /// Intake transactions in flight at once on PostgreSQL (SQLite has one writer: 1). One
    /// gives the largest batches; more overlap round trips to a database far away.
    #[arg(long, env = "HOOKGATE_INTAKE_COMMITTERS", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    intake_committers: u16,
    /// Where the admin API and console listen (loopback by default: keep it off the
    /// senders' network). Started only when an admin token is given.
    #[arg(long, env = "HOOKGATE_ADMIN_LISTEN", default_value = hookgate::admin::DEFAULT_LISTEN)]
    admin_listen: SocketAddr,
    /// A file holding the admin token (at least 16 bytes; surrounding whitespace is ignored).
    /// `HOOKGATE_ADMIN_TOKEN` gives it directly.
    #[arg(long, env = "HOOKGATE_ADMIN_TOKEN_FILE", conflicts_with = "admin_token")]
    admin_token_file: Option<PathBuf>,
    #[arg(long, env = "HOOKGATE_ADMIN_TOKEN", hide = true, hide_env_values = true)]
    admin_token: Option<String>,
    /// Reload pipelines and connector instances when their files change (checked every
    /// second), as SIGHUP does. A configuration with errors is refused, with its diagnostics
    /// in the log, and the running one keeps serving.
    #[arg(long, env = "HOOKGATE_WATCH")]
    watch: bool,
}

impl ServeArgs {
    /// The admin listener's configuration, if a token was given.
    fn admin(&self) -> Result<Option<hookgate::admin::AdminConfig>> {
        let token = match (&self.admin_token, &self.admin_token_file) {
            (Some(token), _) => token.clone(),
            (None, Some(path)) => std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the admin token from {}", path.display()))?,
            (None, None) => return Ok(None),
        };
        Ok(Some(hookgate::admin::AdminConfig::new(self.admin_listen, token)?))
    }

    /// Group commit, unless batches of one were asked for.
    fn group_commit(&self, database_url: &str) -> Option<hookgate_engine::GroupCommitConfig> {
        (self.intake_batch_max > 1).then(|| hookgate_engine::GroupCommitConfig {
            batch_max: usize::from(self.intake_batch_max),
            queue_max: self.intake_queue_max as usize,
            committers: if database_url.starts_with("sqlite:") {
                1
            } else {
                usize::from(self.intake_committers)
            },
            // A delivery waits for its commit no longer than the server reads a body.
            wait_max: Duration::from_secs(self.read_timeout_secs.max(1)),
        })
    }
}

#[derive(Debug, Args)]
struct WorkArgs {
    /// CRM writes worked on at once by this process (each holds its event's payload in
    /// memory); 0 runs no workers (intake only). Calls to a CRM are bounded apart, by
    /// `--crm-calls` and `--crm-batch-calls`: writes in hand beyond them wait, and fill batches.
    /// Default: enough for full batches (the largest connector batch times
    /// `--crm-batch-calls`, twice), at least 128.
    #[arg(long, env = "HOOKGATE_WORKERS")]
    workers: Option<usize>,
    /// How long a worker's lease on an entity lasts; renewed before each CRM call, it must
    /// exceed the call timeout by at least 1000 ms. A dead worker's entities wait this long.
    #[arg(long, env = "HOOKGATE_LEASE_MS", default_value_t = 60_000)]
    lease_ms: u64,
    /// How long a CRM call may take before its outcome is treated as unknown (and reconciled).
    #[arg(long, env = "HOOKGATE_CALL_TIMEOUT_MS", default_value_t = 30_000)]
    call_timeout_ms: u64,
    /// How often idle workers look for work.
    #[arg(long, env = "HOOKGATE_IDLE_POLL_MS", default_value_t = 250)]
    idle_poll_ms: u64,
    /// This process's name in the evidence (default: `worker-PID`).
    #[arg(long, env = "HOOKGATE_WORKER_ID")]
    worker_id: Option<String>,
    /// Items whose CRM calls begin, or whose outcomes are recorded, in one transaction at
    /// most; 1 records each alone.
    #[arg(long, env = "HOOKGATE_STORE_BATCH_MAX", default_value_t = 128,
          value_parser = clap::value_parser!(u16).range(1..=1000))]
    store_batch_max: u16,
    /// Batch calls in flight at once to one connector that has a batch call (HubSpot,
    /// Salesforce, mock); more writes wait and join the next batch. A batch holds at most the
    /// connector's own limit, and at most `--workers` writes.
    #[arg(long, env = "HOOKGATE_CRM_BATCH_CALLS", default_value_t = 2,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    crm_batch_calls: u16,
    /// Write calls in flight at once to one connector without a batch call (`kind: http`,
    /// plugins, Salesforce before API 46.0); more writes wait.
    #[arg(long, env = "HOOKGATE_CRM_CALLS", default_value_t = 8,
          value_parser = clap::value_parser!(u16).range(1..=256))]
    crm_calls: u16,
}

impl WorkArgs {
    /// The workers' configuration, when this process runs any.
    fn config(&self) -> Result<Option<WorkerConfig>> {
        if self.workers == Some(0) {
            return Ok(None);
        }
        self.worker_config().map(Some)
    }

    /// The workers' configuration, refused if the lease cannot cover a CRM call.
    fn worker_config(&self) -> Result<WorkerConfig> {
        let defaults = WorkerConfig::default();
        let config = WorkerConfig {
            worker_id: self.worker_id.clone().unwrap_or(defaults.worker_id),
            in_hand: self.workers.map_or(InHand::FullBatches, InHand::Exactly),
            lease: Duration::from_millis(self.lease_ms),
            call_timeout: Duration::from_millis(self.call_timeout_ms),
            idle_poll: Duration::from_millis(self.idle_poll_ms),
            store_batch_max: usize::from(self.store_batch_max),
            crm_batch_calls_max: usize::from(self.crm_batch_calls),
            crm_calls_max: usize::from(self.crm_calls),
        };
        if let Err(problem) = config.check() {
            anyhow::bail!(
                "--lease-ms ({}) and --call-timeout-ms ({}): {problem}",
                self.lease_ms,
                self.call_timeout_ms
            );
        }
        Ok(config)
    }
}

fn main() -> ExitCode {
    hookgate_connector_http::install_crypto_provider();
    let cli = Cli::parse();
    if let Command::Sign {
        pipeline,
        body,
        fixture,
        private_key,
        timestamp,
        message_id,
        url,
        method,
    } = &cli.command
    {
        let input = hookgate::sign::Input {
            pipeline,
            body,
            fixture: fixture.as_deref(),
            private_key: private_key.as_deref(),
            timestamp: *timestamp,
            message_id,
            url,
            method,
        };
        return printed(hookgate::sign::run(&input));
    }
    if let Command::Fixture {
        command:
            FixtureCommand::New {
                pipeline,
                body,
                name,
                url,
                now,
                headers,
                message_id,
                secrets,
                private_key,
            },
    } = &cli.command
    {
        let input = hookgate::fixture_new::NewFixture {
            pipeline,
            body,
            name,
            url: url.as_deref(),
            now: now.as_deref(),
            headers,
            message_id,
            secrets,
            private_key: private_key.as_deref(),
        };
        return printed(
            hookgate::fixture_new::run(&input).map(|path| format!("wrote {}\n", path.display())),
        );
    }
    if let Command::Schema { name } = &cli.command {
        let Some(text) = hookgate::schemas::named(name) else { return ExitCode::from(2) };
        print!("{text}");
        return ExitCode::SUCCESS;
    }
    if let Command::Connectors { instances, schema, json } = &cli.command {
        return connectors_command(instances, schema.as_deref(), Format::json_if(*json));
    }
    if let Command::Explain { code } = &cli.command {
        return explain(code);
    }
    if let Command::Check { config, bless, message_format, color, allow_unset_secrets, work } =
        cli.command
    {
        let options = Options {
            paths: config.pipelines,
            instances: config.instances,
            secrets: if allow_unset_secrets { SecretPolicy::Allow } else { SecretPolicy::Warn },
            resolver: Default::default(),
        };
        let bless = bless || std::env::var_os("UPDATE_EXPECT").is_some_and(|v| v == "1");
        let mut report = if bless { check::bless(&options) } else { check::check(&options) };
        if let Err(problem) = work.worker_config() {
            report.option_errors.push(format!("{problem:#}"));
        }
        match message_format {
            MessageFormat::Human => eprint!("{}", render::human(&report, color.enabled())),
            MessageFormat::Short => eprint!("{}", render::short(&report)),
            MessageFormat::Json => print!("{}", render::json(&report)),
        }
        return if report.errors() > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS };
    }
    // The demo's output is the point; its logs would drown it.
    let level = if matches!(cli.command, Command::Demo { .. }) { "error" } else { "info" };
    let telemetry = match init_tracing(level, cli.log_format) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(cli.command));
    // A plugin call that never returns holds a blocking thread; dropping the runtime would
    // wait for it forever. Whatever is still running now is abandoned.
    runtime.shutdown_timeout(Duration::from_secs(1));
    // The spans of the last deliveries are still queued for export.
    telemetry.shutdown();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// `hookgate explain CODE`: the code's explanation, or the list of codes.
fn explain(code: &str) -> ExitCode {
    match code.parse::<Code>() {
        Ok(code) => {
            println!("{code}: {}\n\n{}", code.title(), code.explanation());
            ExitCode::SUCCESS
        }
        Err(()) => {
            eprintln!("error: `{code}` is not a hookgate error code; the codes are:");
            for code in Code::ALL {
                eprintln!("  {code}  {}", code.title());
            }
            ExitCode::from(2)
        }
    }
}

async fn run(command: Command) -> Result<()> {
    match command {
        Command::Check { .. }
        | Command::Explain { .. }
        | Command::Sign { .. }
        | Command::Schema { .. }
        | Command::Connectors { .. }
        | Command::Fixture { .. } => {
            unreachable!("handled without a runtime")
        }
        Command::Serve { config, database, serve, work } => {
            if serve.body_budget_bytes < serve.body_limit_bytes {
                anyhow::bail!(
                    "--body-budget-bytes ({}) must be at least --body-limit-bytes ({}): one body must fit",
                    serve.body_budget_bytes,
                    serve.body_limit_bytes
                );
            }
            let group_commit = serve.group_commit(&database.database_url);
            let admin = serve.admin()?;
            serve::run(ServeOptions {
                database_url: database.database_url.clone(),
                listen: Some(serve.listen),
                pipelines: config.pipelines,
                instances: config.instances,
                server: ServerConfig {
                    body_bytes_max: serve.body_limit_bytes,
                    body_bytes_in_flight_max: serve.body_budget_bytes,
                    header_bytes_max: serve.header_limit_bytes,
                    header_timeout: Duration::from_secs(serve.header_timeout_secs),
                    read_timeout: Duration::from_secs(serve.read_timeout_secs),
                    connections_max: serve.connections_max,
                    shutdown_timeout: Duration::from_secs(serve.shutdown_timeout_secs),
                    public_url: serve.public_url,
                    // Installed by `serve::start`, which owns the process's recorder.
                    metrics: None,
                },
                group_commit,
                store: database.store_options(),
                workers: work.config()?,
                resolver: Default::default(),
                admin,
                watch: serve.watch,
            })
            .await
        }
        Command::Work { config, database, work } => {
            let Some(workers) = work.config()? else {
                anyhow::bail!("`work` needs at least one worker")
            };
            serve::run(ServeOptions {
                database_url: database.database_url.clone(),
                listen: None,
                pipelines: config.pipelines,
                instances: config.instances,
                server: ServerConfig::default(),
                store: database.store_options(),
                workers: Some(workers),
                group_commit: None,
                resolver: Default::default(),
                admin: None,
                watch: false,
            })
            .await
        }
        Command::Keys { database, instances, command: KeysCommand::Rotate { batch } } => {
            let loaded = load_instances_file(&instances)?;
            let Some(keyring) = hookgate::payloads::keyring(&loaded, &Default::default())? else {
                anyhow::bail!(
                    "{} configures no `payload_encryption`: there is no key to rotate to",
                    instances.display()
                );
            };
            let store = Store::open_existing(
                &database.database_url,
                &database.store_options(),
                Access::ReadWrite,
            )
            .await
            .with_context(|| {
                format!("cannot open the store at {}", serve::redact_url(&database.database_url))
            })?;
            let rotation = hookgate::payloads::rotate(&store, &keyring, batch, |table, done| {
                eprintln!("{table}: {done} rows re-sealed so far");
            })
            .await;
            store.close().await;
            let rotation = rotation?;
            for (table, done) in &rotation.resealed {
                println!("{table}: {done} rows re-sealed under key `{}`", keyring.current());
            }
            if rotation.skipped > 0 {
                println!(
                    "{} rows changed meanwhile (purged or re-sealed) and were left",
                    rotation.skipped
                );
            }
            if !rotation.failed.is_empty() {
                for failure in &rotation.failed {
                    eprintln!("cannot re-seal {failure}");
                }
                anyhow::bail!(
                    "{} rows could not be opened and keep their key; the rest is sealed under `{}`",
                    rotation.failed.len(),
                    keyring.current()
                );
            }
            println!("every stored payload is sealed under key `{}`", keyring.current());
            Ok(())
        }
        Command::Events { database, pipelines, instances, command } => {
            let configured = check::pipeline_names(&pipelines);
            let views = hookgate::payloads::Views::load(&Options {
                paths: pipelines.clone(),
                instances,
                secrets: SecretPolicy::Allow,
                resolver: Default::default(),
            });
            // Only replay writes; nothing here creates or migrates a database.
            let access = match command {
                EventsCommand::Replay { .. } => Access::ReadWrite,
                _ => Access::ReadOnly,
            };
            let store =
                Store::open_existing(&database.database_url, &database.store_options(), access)
                    .await
                    .with_context(|| {
                        format!(
                            "cannot open the store at {}",
                            serve::redact_url(&database.database_url)
                        )
                    })?;
            let text = match command {
                EventsCommand::List { pipeline, state, since, page } => {
                    let PageArgs { limit, after, json } = page;
                    let state = state.as_deref().map(events::event_state).transpose()?;
                    events::check_filters(&store, &configured, pipeline.as_deref(), limit).await?;
                    let since_ms =
                        since.map(|d| now_ms() - i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
                    let filter = EventFilter { pipeline, state, since_ms, before_id: after, limit };
                    events::list(&store, &filter, Format::json_if(json)).await?
                }
                EventsCommand::Show { id, body, json } => {
                    let (bodies, format) = (Bodies::shown_if(body), Format::json_if(json));
                    events::show(&store, &views, id, bodies, format).await?
                }
                EventsCommand::Rejected { pipeline, body, page } => {
                    let PageArgs { limit, after, json } = page;
                    let pipeline = pipeline.as_deref();
                    events::check_filters(&store, &configured, pipeline, limit).await?;
                    let (bodies, format) = (Bodies::shown_if(body), Format::json_if(json));
                    events::rejected(&store, &views, pipeline, after, limit, bodies, format).await?
                }
                EventsCommand::Refused { pipeline, limit, json } => {
                    let pipeline = pipeline.as_deref();
                    events::check_filters(&store, &configured, pipeline, limit).await?;
                    events::refused(&store, pipeline, limit, Format::json_if(json)).await?
                }
                EventsCommand::Replay { id: Some(id), json, .. } => {
                    events::replay(&store, id, Format::json_if(json)).await?
                }
                EventsCommand::Replay { id: None, dead: true, pipeline, json } => {
                    events::check_filters(&store, &configured, pipeline.as_deref(), 1).await?;
                    events::replay_dead(&store, pipeline.as_deref(), Format::json_if(json)).await?
                }
                EventsCommand::Replay { .. } => anyhow::bail!("name an event id, or `--dead`"),
            };
            store.close().await;
            print!("{text}");
            Ok(())
        }
        Command::Send { pipeline, fixture, body, to, headers, message_id, private_key } => {
            let input = hookgate::send::Input {
                pipeline: &pipeline,
                fixture: fixture.as_deref(),
                body: body.as_deref(),
                to: &to,
                headers: &headers,
                message_id: message_id.as_deref(),
                private_key: private_key.as_deref(),
            };
            print!("{}", hookgate::send::run(&input).await?);
            Ok(())
        }
        Command::Crm { instances, connector, command } => {
            let loaded = load_instances_file(&instances)?;
            let crm = connectors::mock(&loaded, &connector).await?;
            match command {
                CrmCommand::Records { object, json } => {
                    let records = crm.records(object.as_deref()).await?;
                    print!("{}", connectors::records_text(&records, Format::json_if(json))?);
                }
                CrmCommand::Effects { json } => {
                    let effects = crm.effects().await?;
                    print!("{}", connectors::effects_text(&effects, Format::json_if(json))?);
                }
            }
            crm.close().await;
            Ok(())
        }
        Command::Demo { pipelines, dir } => {
            let text = demo::run(DemoOptions { pipelines, dir }).await?;
            print!("{text}");
            Ok(())
        }
    }
}

/// Logs go to stderr as `key=value` lines; `RUST_LOG` filters them. Spans go to an OTLP
/// collector when the build and the environment ask for it (see `hookgate::telemetry`).
fn init_tracing(
    default: &str,
    format: LogFormat,
) -> Result<hookgate::telemetry::Telemetry, hookgate::telemetry::TelemetryError> {
    use hookgate::telemetry;
    let format = match format {
        LogFormat::Text => telemetry::LogFormat::Text,
        LogFormat::Json => telemetry::LogFormat::Json,
    };
    telemetry::init(default, format)
}

/// A command's output on stdout, or its error on stderr with a failing exit code.
fn printed(result: Result<String>) -> ExitCode {
    match result {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// `hookgate connectors`: the registry as this configuration makes it.
fn connectors_command(
    instances: &std::path::Path,
    schema: Option<&str>,
    format: Format,
) -> ExitCode {
    // Without an instances file there are no plugins: the in-tree kinds are still listed.
    let loaded = std::fs::read_to_string(instances).ok().and_then(|source| {
        let (loaded, found) =
            hookgate_pipeline::load_instances(&instances.display().to_string(), &source);
        for diagnostic in found.iter().filter(|d| d.is_error()) {
            eprintln!("{diagnostic}");
        }
        loaded
    });
    let (registry, problems) = connectors::Registry::load(loaded.as_ref());
    for problem in &problems {
        eprintln!("{problem}");
    }
    let text = connectors::kinds_text(&registry, loaded.as_ref(), schema, format);
    match text {
        Ok(text) => {
            print!("{text}");
            if problems.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}
