//! `hookgate`: the webhook gateway's command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use hookgate::check::{self, Options, SecretPolicy};
use hookgate::serve::{self, ServeOptions};
use hookgate_server::ServerConfig;
use hookgate_store::StoreOptions;

#[derive(Debug, Parser)]
#[command(
    name = "hookgate",
    version,
    about = "A webhook gateway that turns at-least-once deliveries into exactly one CRM effect per event"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
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
    },
    /// Serve `POST /hooks/{pipeline}`, `GET /healthz` and `GET /readyz`.
    ///
    /// Refuses to start if the configuration has any error or a secret is unset. A delivery
    /// is answered 2xx only after it is committed to the database; SIGTERM stops accepting,
    /// finishes in-flight requests, then exits.
    Serve {
        #[command(flatten)]
        config: ConfigArgs,
        #[command(flatten)]
        serve: ServeArgs,
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
struct ServeArgs {
    /// Where events are stored: `sqlite://PATH` (embedded, the default) or
    /// `postgres://USER@HOST/DB` (production; several gateways may share one).
    #[arg(long, env = "DATABASE_URL", default_value = "sqlite://hookgate.db")]
    database_url: String,
    /// The address to listen on; port 0 picks a free port (printed at start).
    #[arg(long, env = "HOOKGATE_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Bodies larger than this many bytes are answered 413.
    #[arg(long, env = "HOOKGATE_BODY_LIMIT_BYTES", default_value_t = 1024 * 1024)]
    body_limit_bytes: usize,
    /// All request headers together larger than this many bytes are answered 431.
    #[arg(long, env = "HOOKGATE_HEADER_LIMIT_BYTES", default_value_t = 32 * 1024)]
    header_limit_bytes: usize,
    /// A body not fully received within this many seconds is answered 408.
    #[arg(long, env = "HOOKGATE_READ_TIMEOUT_SECS", default_value_t = 30)]
    read_timeout_secs: u64,
    /// The public base URL senders call (e.g. `https://hooks.example.com`); URL-signed schemes
    /// (HubSpot v3) sign it. Without it the URL is rebuilt from the Host header.
    #[arg(long, env = "HOOKGATE_PUBLIC_URL")]
    public_url: Option<String>,
    /// PostgreSQL connections this process may open.
    #[arg(long, env = "HOOKGATE_DB_MAX_CONNECTIONS", default_value_t = 16)]
    db_max_connections: u32,
    /// How long a request waits for a database connection before it is answered 503.
    #[arg(long, env = "HOOKGATE_DB_ACQUIRE_TIMEOUT_MS", default_value_t = 3000)]
    db_acquire_timeout_ms: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { config } => {
            let options = Options {
                paths: config.pipelines,
                instances: config.instances,
                secrets: SecretPolicy::Warn,
            };
            let report = check::check(&options);
            print!("{}", report.render());
            if report.errors() > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS }
        }
        Command::Serve { config, serve } => {
            init_tracing();
            let options = ServeOptions {
                database_url: serve.database_url,
                listen: serve.listen,
                pipelines: config.pipelines,
                instances: config.instances,
                server: ServerConfig {
                    body_bytes_max: serve.body_limit_bytes,
                    header_bytes_max: serve.header_limit_bytes,
                    read_timeout: Duration::from_secs(serve.read_timeout_secs),
                    public_url: serve.public_url,
                },
                store: StoreOptions {
                    max_connections: serve.db_max_connections,
                    acquire_timeout: Duration::from_millis(serve.db_acquire_timeout_ms),
                },
            };
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(runtime) => runtime,
                Err(error) => {
                    eprintln!("error: cannot start the runtime: {error}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(serve::run(options)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("error: {error:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Logs go to stderr as `key=value` lines; `RUST_LOG` filters them (default `info`).
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
}
