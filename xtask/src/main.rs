//! `cargo xtask`: project automation in Rust instead of shell scripts.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use hookgate::check::{self, Options, SecretPolicy};

mod bench;

#[derive(Debug, Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate pipelines (default: pipelines/) with their fixtures, and check that schemas/
    /// is up to date.
    Check {
        paths: Vec<PathBuf>,
        #[arg(long, default_value = "hookgate.yaml")]
        instances: PathBuf,
    },
    /// Regenerate the JSON Schemas in schemas/.
    Codegen,
    /// Measure verification and intake speed and the server's memory, each against a baseline
    /// measured in the same run. Needs PostgreSQL on 127.0.0.1:5432.
    Bench {
        #[arg(long, default_value_t = 3000)]
        deliveries: usize,
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
    },
}

fn main() -> Result<ExitCode> {
    let cli = Cli::parse();
    let root = workspace_root();
    std::env::set_current_dir(&root).with_context(|| format!("cannot enter {}", root.display()))?;
    match cli.command {
        Command::Check { mut paths, instances } => {
            if paths.is_empty() {
                paths.push(PathBuf::from("pipelines"));
            }
            let report = check::check(&Options {
                paths,
                instances,
                secrets: SecretPolicy::Warn,
                resolver: Default::default(),
            });
            print!("{}", report.render());
            let stale = stale_schemas(&root)?;
            for name in &stale {
                println!(
                    "schemas/{name}: error: stale; run `cargo xtask codegen` and commit the result"
                );
            }
            Ok(if report.errors() > 0 || !stale.is_empty() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
        Command::Bench { deliveries, concurrency } => {
            bench::run(&root, deliveries, concurrency)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Codegen => {
            for (name, text) in schemas() {
                let path = root.join("schemas").join(name);
                std::fs::write(&path, text)
                    .with_context(|| format!("cannot write {}", path.display()))?;
                println!("wrote {}", path.display());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Schema files whose committed text differs from what the code generates.
fn stale_schemas(root: &Path) -> Result<Vec<String>> {
    let mut stale = Vec::new();
    for (name, text) in schemas() {
        let committed =
            std::fs::read_to_string(root.join("schemas").join(&name)).unwrap_or_default();
        if committed != text {
            stale.push(name);
        }
    }
    Ok(stale)
}

/// Every generated schema, by its path under `schemas/`.
fn schemas() -> Vec<(String, String)> {
    let pipeline =
        hookgate_pipeline::schemas().into_iter().map(|(name, text)| (name.to_owned(), text));
    let connectors = hookgate::connectors::settings_schemas()
        .into_iter()
        .map(|(name, text)| (format!("connectors/{name}"), text));
    pipeline.chain(connectors).collect()
}

fn workspace_root() -> PathBuf {
    // xtask lives one level below the workspace root.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask has a parent directory")
        .to_path_buf()
}
