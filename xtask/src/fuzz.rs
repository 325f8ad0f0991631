//! `cargo xtask fuzz`: coverage-guided fuzzing (libFuzzer through cargo-fuzz) of what parses
//! sender bytes and operator files. The targets live in `fuzz/`, their seed corpora in
//! `fuzz/corpus/<target>/` (committed). libFuzzer's instrumentation needs nightly flags; with
//! `--sanitizer none` and `RUSTC_BOOTSTRAP=1` the stable toolchain builds it.
//!
//! New inputs a run finds go to a scratch directory, so the committed corpus changes only when
//! someone minimises a run into it. A crash leaves its input in `fuzz/artifacts/<target>/`:
//! make it a regression test, then fix it.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

pub const TARGETS: &[&str] = &["verify", "identify", "config", "template"];

pub struct Options<'a> {
    pub targets: Vec<&'a str>,
    /// Stop each target after this many seconds.
    pub seconds: Option<u64>,
    /// Stop each target after this many executions.
    pub runs: Option<u64>,
    /// libFuzzer jobs per target, run in parallel.
    pub jobs: u32,
    /// Where new inputs go, a directory per target (default: a scratch directory).
    pub keep: Option<std::path::PathBuf>,
}

pub fn run(root: &Path, options: &Options<'_>) -> Result<()> {
    let installed = Command::new("cargo").args(["fuzz", "--version"]).output();
    if !installed.is_ok_and(|o| o.status.success()) {
        println!("installing cargo-fuzz");
        let status = Command::new("cargo")
            .args(["install", "cargo-fuzz", "--locked", "--version", "0.13.2"])
            .status()
            .context("cargo install")?;
        if !status.success() {
            bail!("cannot install cargo-fuzz");
        }
    }
    let fuzz = root.join("fuzz");
    for target in &options.targets {
        let scratch = tempfile::tempdir()?;
        let found = match &options.keep {
            Some(dir) => dir.join(target),
            None => scratch.path().to_owned(),
        };
        std::fs::create_dir_all(&found)?;
        let mut command = Command::new("cargo");
        command
            .args(["fuzz", "run", "--sanitizer", "none", "-O", target])
            .arg(&found)
            .arg(fuzz.join("corpus").join(target))
            .arg("--")
            .args(["-print_final_stats=1", "-max_len=4096"])
            .env("RUSTC_BOOTSTRAP", "1")
            .current_dir(&fuzz);
        if let Some(seconds) = options.seconds {
            command.arg(format!("-max_total_time={seconds}"));
        }
        if let Some(runs) = options.runs {
            command.arg(format!("-runs={runs}"));
        }
        if options.jobs > 1 {
            command
                .arg(format!("-jobs={}", options.jobs))
                .arg(format!("-workers={}", options.jobs));
        }
        println!("== fuzz {target}");
        let output = command.output().context("cargo fuzz")?;
        let log = String::from_utf8_lossy(&output.stderr);
        let stat = |name: &str| {
            log.lines()
                .filter_map(|l| l.strip_prefix(&format!("stat::{name}:")))
                .map(|v| v.trim().parse::<u64>().unwrap_or(0))
                .sum::<u64>()
        };
        if !output.status.success() {
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!("fuzz target `{target}` failed:\n{}", tail.join("\n"));
        }
        println!(
            "   {target}: {} executions, {} per second, no crash",
            stat("number_of_executed_units"),
            stat("average_exec_per_sec")
        );
    }
    Ok(())
}
