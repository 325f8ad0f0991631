//! `cargo xtask`: project automation in Rust instead of shell scripts.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use hookgate::check::{self, Options, SecretPolicy};

mod bench;
mod chaos;
mod fuzz;
mod scaffold;
mod setup;

#[derive(Debug, Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate pipelines (default: pipelines/, pipelines/senders/ and pipelines/examples/) with their fixtures, and check that schemas/
    /// is up to date.
    Check {
        paths: Vec<PathBuf>,
        #[arg(long, default_value = "hookgate.yaml")]
        instances: PathBuf,
    },
    /// Regenerate the JSON Schemas in schemas/.
    Codegen,
    /// Install and start what the tests need besides Rust, on Debian or Ubuntu: PostgreSQL
    /// (trusting local TCP logins), Python's jsonschema and PyYAML, Chromium and ChromeDriver.
    /// Does nothing for a part already there.
    Setup,
    /// Scaffold a connector that builds and passes the conformance suite as generated: an
    /// in-tree crate under connectors/ registered in the binary, or (`--plugin`) an
    /// out-of-tree plugin crate built as a cdylib.
    NewConnector {
        /// The connector kind: lowercase letters, digits and `_`.
        name: String,
        /// Generate an out-of-tree plugin crate instead of an in-tree connector.
        #[arg(long)]
        plugin: bool,
        /// Where to write the crate (default: connectors/hookgate-connector-NAME, or
        /// ../hookgate-plugin-NAME for a plugin).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Measure verification and intake speed and the server's memory, each against a baseline
    /// measured in the same run. Needs PostgreSQL on 127.0.0.1:5432.
    Bench {
        #[arg(long, default_value_t = 10_000)]
        deliveries: usize,
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// Writes timed per drain run.
        #[arg(long, default_value_t = 50_000)]
        drain_writes: usize,
        /// Pending writes besides the timed ones, one drain run each.
        #[arg(long, value_delimiter = ',', default_values_t = [0, 100_000, 1_000_000])]
        backlogs: Vec<usize>,
        /// Workers of the draining server (`hookgate serve --workers`). The drain grows with
        /// the writes in hand: one process leases one batch at a time, and a lease of more
        /// writes costs less per write (see ARCHITECTURE.md, delivery in batches). 1024 keeps
        /// the draining server near 42 MiB resident (the target is 64 MiB).
        #[arg(long, default_value_t = 1024)]
        drain_workers: usize,
        /// Run only these parts.
        #[arg(long, value_enum, value_delimiter = ',', default_values_t = [bench::Part::Verify, bench::Part::Intake, bench::Part::Drain, bench::Part::Budget])]
        only: Vec<bench::Part>,
    },
    /// Coverage-guided fuzzing of signature verification, identity derivation, operator files
    /// and templates (cargo-fuzz, installed if missing). A crash fails the run and leaves its
    /// input in fuzz/artifacts/.
    Fuzz {
        /// Targets to run (default: all).
        #[arg(value_parser = clap::builder::PossibleValuesParser::new(fuzz::TARGETS))]
        targets: Vec<String>,
        /// Seconds per target.
        #[arg(long)]
        seconds: Option<u64>,
        /// Executions per target.
        #[arg(long)]
        runs: Option<u64>,
        /// Parallel libFuzzer jobs per target.
        #[arg(long, default_value_t = 1)]
        jobs: u32,
        /// Keep the inputs a run finds here (a directory per target), to minimise into
        /// fuzz/corpus/ with `cargo fuzz cmin`.
        #[arg(long)]
        keep: Option<PathBuf>,
    },
    /// Fault injection: gateways SIGKILLed and restarted, senders retrying, CRMs failing, the
    /// database cut off once; judged from the fake CRMs' effect logs. Exits non-zero on any
    /// lost event, duplicate effect, stale overwrite or event accepted twice. Needs
    /// PostgreSQL on 127.0.0.1:5432 (or `HOOKGATE_TEST_POSTGRES`).
    Chaos {
        /// The backends to run, one after the other.
        #[arg(long, value_enum, value_delimiter = ',', default_value = "postgres,sqlite")]
        backend: Vec<chaos::Backend>,
        #[arg(long, default_value_t = 10_000)]
        events: usize,
        #[arg(long, default_value_t = 1_000)]
        entities: usize,
        /// Gateway processes sharing PostgreSQL (SQLite runs one).
        #[arg(long, default_value_t = 2)]
        processes: usize,
        /// Each event is delivered 1 to this many times.
        #[arg(long, default_value_t = 5)]
        deliveries_max: u32,
        /// Deliveries sent per second, spread over the run.
        #[arg(long, default_value_t = 150)]
        rate: u32,
        /// Repeats a run's plan and faults (default: from the clock; the report names it).
        #[arg(long)]
        seed: Option<u64>,
        #[arg(long, value_enum, default_value = "cut")]
        postgres_fault: chaos::PostgresFault,
        /// How long the writes may take to drain once the kills stop.
        #[arg(long, default_value_t = 600)]
        drain_timeout_secs: u64,
        /// Run a release build of hookgate.
        #[arg(long)]
        release: bool,
        /// The CI variant: 400 events over 40 entities at 30 deliveries a second (about two
        /// minutes on two cores for both backends).
        #[arg(long)]
        quick: bool,
        /// Where the report and the gateways' logs go.
        #[arg(long, default_value = "target/chaos")]
        out: PathBuf,
    },
}

fn main() -> Result<ExitCode> {
    let cli = Cli::parse();
    let root = workspace_root();
    std::env::set_current_dir(&root).with_context(|| format!("cannot enter {}", root.display()))?;
    match cli.command {
        Command::Setup => {
            setup::setup()?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Check { mut paths, instances } => {
            if paths.is_empty() {
                paths.push(PathBuf::from("pipelines"));
                paths.push(PathBuf::from("pipelines/senders"));
                paths.push(PathBuf::from("pipelines/examples"));
            }
            let report = check::check(&Options {
                paths,
                instances,
                secrets: SecretPolicy::Warn,
                resolver: Default::default(),
            });
            print!("{}", hookgate::render::short(&report));
            let stale = stale_generated(&root)?;
            for name in &stale {
                println!("{name}: error: stale; run `cargo xtask codegen` and commit the result");
            }
            Ok(if report.errors() > 0 || !stale.is_empty() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
        Command::Bench { deliveries, concurrency, drain_writes, backlogs, drain_workers, only } => {
            let options = bench::Options {
                deliveries,
                concurrency,
                drain_writes,
                backlogs,
                drain_workers,
                parts: only,
            };
            bench::run(&root, &options)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Chaos {
            backend,
            events,
            entities,
            processes,
            deliveries_max,
            rate,
            seed,
            postgres_fault,
            drain_timeout_secs,
            release,
            quick,
            out,
        } => {
            let (events, entities, rate) =
                if quick { (400, 40, 30) } else { (events, entities, rate) };
            if entities == 0 || processes == 0 || deliveries_max == 0 {
                anyhow::bail!("--entities, --processes and --deliveries-max must be at least 1");
            }
            let seed = seed.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0)
            });
            let options = chaos::Options {
                backends: backend,
                events,
                entities,
                processes,
                deliveries_max,
                rate,
                seed,
                postgres_fault,
                drain_timeout_secs,
                release,
                out: root.join(out),
            };
            Ok(if chaos::run(&root, options)? { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Command::Fuzz { targets, seconds, runs, jobs, keep } => {
            let targets: Vec<&str> = if targets.is_empty() {
                fuzz::TARGETS.to_vec()
            } else {
                targets.iter().map(String::as_str).collect()
            };
            if seconds.is_none() && runs.is_none() {
                anyhow::bail!("give --seconds or --runs: a fuzz run needs an end");
            }
            let keep = keep.map(|dir| root.join(dir));
            fuzz::run(&root, &fuzz::Options { targets, seconds, runs, jobs, keep })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::NewConnector { name, plugin, dir } => {
            let generated = scaffold::new_connector(&root, &name, plugin, dir)?;
            println!("wrote {}", generated.dir.display());
            for file in &generated.touched {
                println!("registered in {}", file.display());
            }
            if plugin {
                println!(
                    "next: cd {} && cargo test && cargo build --release, then put the library in a directory under `plugins.directories`",
                    generated.dir.display()
                );
            } else {
                println!(
                    "next: cargo test -p hookgate-connector-{} && cargo xtask codegen; `hookgate connectors` lists kind `{name}`",
                    name.replace('_', "-")
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Codegen => {
            for (name, text) in generated() {
                let path = root.join(name);
                std::fs::write(&path, text)
                    .with_context(|| format!("cannot write {}", path.display()))?;
                println!("wrote {}", path.display());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Generated files whose committed text differs from what the code generates.
fn stale_generated(root: &Path) -> Result<Vec<String>> {
    let mut stale = Vec::new();
    for (name, text) in generated() {
        let committed = std::fs::read_to_string(root.join(&name)).unwrap_or_default();
        if committed != text {
            stale.push(name);
        }
    }
    Ok(stale)
}

/// Every generated file, by its path from the workspace root: the schemas under `schemas/`
/// and the guide's references.
fn generated() -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = hookgate::schemas::all()
        .into_iter()
        .map(|(name, text)| (format!("schemas/{name}"), text))
        .collect();
    files.push(("docs/guide/diagnostics.md".to_owned(), hookgate::schemas::diagnostics_page()));
    files
}

fn workspace_root() -> PathBuf {
    // xtask lives one level below the workspace root.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask has a parent directory")
        .to_path_buf()
}
