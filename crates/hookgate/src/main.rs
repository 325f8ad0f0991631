//! `hookgate`: the webhook gateway's command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use hookgate::check::{self, Options, SecretPolicy};

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
        /// Pipeline files, or directories holding them.
        #[arg(default_value = "pipelines")]
        paths: Vec<PathBuf>,
        /// The connector-instances file.
        #[arg(long, env = "HOOKGATE_INSTANCES", default_value = "hookgate.yaml")]
        instances: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { paths, instances } => {
            let report = check::check(&Options { paths, instances, secrets: SecretPolicy::Warn });
            print!("{}", report.render());
            if report.errors() > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS }
        }
    }
}
