//! `cargo xtask bench`: speed and memory, each reported against a baseline measured in the
//! same run on the same machine, so the ratios mean something where absolute numbers do not.
//!
//! - **verify**: GitHub-signed bodies verified per second, against plain SHA-256 of the same
//!   bytes (the cheapest thing that reads every byte).
//! - **intake**: deliveries accepted per second through a release `hookgate serve` (verify,
//!   identify, one committed transaction, answer), on SQLite and on PostgreSQL, against the
//!   same server answering the same requests on an unknown pipeline (HTTP and routing only).
//! - **memory**: the server's peak resident set after the run.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use hookgate_verify::{
    Algorithm, Clock, Encoding, Preset, Request, SecretBytes, Verifier, compute_mac,
};
use sha2::Digest;

const SECRET: &str = "bench-secret";
const BODY_BYTES: usize = 4096;

pub fn run(root: &Path, deliveries: usize, concurrency: usize) -> Result<()> {
    // Measure optimized code only: a debug xtask runs itself again in release.
    if cfg!(debug_assertions) {
        let status = Command::new("cargo")
            .args(["run", "--release", "--quiet", "-p", "xtask", "--", "bench"])
            .args([
                "--deliveries",
                &deliveries.to_string(),
                "--concurrency",
                &concurrency.to_string(),
            ])
            .current_dir(root)
            .status()
            .context("cargo run --release")?;
        if !status.success() {
            bail!("the benchmark failed");
        }
        return Ok(());
    }
    println!(
        "cargo xtask bench: {deliveries} deliveries at concurrency {concurrency}, bodies of {BODY_BYTES} bytes\n"
    );
    verify_bench();
    let status = Command::new("cargo")
        .args(["build", "--release", "--quiet", "-p", "hookgate"])
        .current_dir(root)
        .status()
        .context("cargo build")?;
    if !status.success() {
        bail!("the release build failed");
    }
    let binary = root.join("target/release/hookgate");
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        hookgate_connector_http::install_crypto_provider();
        let dir = tempfile::tempdir()?;
        let sqlite = format!("sqlite://{}", dir.path().join("bench.db").display());
        intake_bench(&binary, dir.path(), "sqlite", &sqlite, deliveries, concurrency).await?;
        let postgres = hookgate_store::testing::fresh_postgres_database().await;
        let result =
            intake_bench(&binary, dir.path(), "postgres", &postgres, deliveries, concurrency).await;
        hookgate_store::testing::drop_postgres_database(&postgres).await;
        result
    })
}

fn verify_bench() {
    const BODIES: usize = 20_000;
    let body: Vec<u8> = (0..BODY_BYTES).map(|i| (i % 251) as u8).collect();
    let signature = format!(
        "sha256={}",
        Encoding::Hex.encode(&compute_mac(Algorithm::HmacSha256, SECRET.as_bytes(), &[&body]))
    );
    let headers = vec![("X-Hub-Signature-256".to_owned(), signature.into_bytes())];
    let verifier = Verifier::new(Preset::Github.scheme(), &[SecretBytes::new(SECRET)], None)
        .expect("a secret");
    let request = Request { method: "POST", url: "", headers: &headers, body: &body };

    let started = Instant::now();
    for _ in 0..BODIES {
        std::hint::black_box(
            verifier
                .verify(std::hint::black_box(&request), Clock::from_unix_secs(0))
                .expect("valid"),
        );
    }
    let verify = BODIES as f64 / started.elapsed().as_secs_f64();

    let started = Instant::now();
    for _ in 0..BODIES {
        std::hint::black_box(sha2::Sha256::digest(std::hint::black_box(&body)));
    }
    let baseline = BODIES as f64 / started.elapsed().as_secs_f64();
    println!(
        "verify    {verify:>10.0} bodies/s   baseline SHA-256 {baseline:>10.0}/s   ratio {:.2}",
        verify / baseline
    );
}

struct Server {
    child: Child,
    base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(binary: &Path, dir: &Path, database_url: &str) -> Result<Server> {
    let instances = dir.join("hookgate.yaml");
    std::fs::write(
        &instances,
        format!(
            "connectors:\n  - name: crm\n    kind: mock\n    settings:\n      path: {}\n",
            dir.join("crm.sqlite").display()
        ),
    )?;
    let pipeline = dir.join("bench.yaml");
    std::fs::write(
        &pipeline,
        "name: bench\nsignature:\n  scheme: github\n  secrets: [{env: BENCH_SECRET}]\nkey:\n  header: X-Id\ntargets:\n  - name: t\n    connector: crm\n    object: o\n    external_id: {field: id, value: \"{{ headers['x-id'] }}\"}\n",
    )?;
    let mut child = Command::new(binary)
        .args([
            "serve",
            "--database-url",
            database_url,
            "--listen",
            "127.0.0.1:0",
            "--workers",
            "0",
            "--instances",
        ])
        .arg(&instances)
        .arg(&pipeline)
        .env("BENCH_SECRET", SECRET)
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .spawn()
        .context("hookgate serve")?;
    let stdout = child.stdout.take().context("stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let line = lines.next().transpose()?.unwrap_or_default();
    let Some(address) = line.strip_prefix("hookgate listening on ") else {
        bail!("hookgate serve did not start: {line}");
    };
    std::thread::spawn(move || for _ in lines {});
    Ok(Server { child, base: address.to_owned() })
}

/// Sends `count` distinct signed deliveries (keys from `first_key`) to `path` with
/// `concurrency` in flight; returns deliveries per second and the sorted latencies.
async fn fire(
    base: &str,
    path: &str,
    first_key: usize,
    count: usize,
    concurrency: usize,
    expect: u16,
) -> Result<(f64, Vec<Duration>)> {
    let client = reqwest::Client::new();
    let body: Arc<Vec<u8>> = Arc::new((0..BODY_BYTES).map(|i| b'a' + (i % 26) as u8).collect());
    let signature = Arc::new(format!(
        "sha256={}",
        Encoding::Hex.encode(&compute_mac(Algorithm::HmacSha256, SECRET.as_bytes(), &[&body]))
    ));
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (client, body, signature, next) =
            (client.clone(), Arc::clone(&body), Arc::clone(&signature), Arc::clone(&next));
        let url = format!("{base}{path}");
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= count {
                    return Ok::<_, anyhow::Error>(latencies);
                }
                let sent = Instant::now();
                let response = client
                    .post(&url)
                    .header("X-Id", format!("delivery-{}", first_key + i))
                    .header("X-Hub-Signature-256", signature.as_str())
                    .body(body.as_ref().clone())
                    .send()
                    .await?;
                if response.status().as_u16() != expect {
                    bail!("expected {expect}, got {}", response.status());
                }
                latencies.push(sent.elapsed());
            }
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await??);
    }
    let rate = count as f64 / started.elapsed().as_secs_f64();
    latencies.sort();
    Ok((rate, latencies))
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(index).map(|d| d.as_secs_f64() * 1000.0).unwrap_or(0.0)
}

fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

async fn intake_bench(
    binary: &Path,
    dir: &Path,
    backend: &str,
    database_url: &str,
    deliveries: usize,
    concurrency: usize,
) -> Result<()> {
    let server = start(binary, dir, database_url)?;
    // Warm up connections and the database file, on keys the measured run does not use: every
    // measured delivery is a new event, so each is a committed insert.
    const WARM_UP: usize = 100;
    fire(&server.base, "/hooks/bench", 0, WARM_UP, concurrency, 202).await?;
    let (baseline, _) = fire(&server.base, "/hooks/none", 0, deliveries, concurrency, 404).await?;
    let (rate, latencies) =
        fire(&server.base, "/hooks/bench", WARM_UP, deliveries, concurrency, 202).await?;
    println!(
        "intake    {rate:>10.0} deliveries/s ({backend}, p50 {:.1} ms, p99 {:.1} ms)   baseline 404 path {baseline:>8.0}/s   ratio {:.2}",
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        rate / baseline
    );
    if let Some(rss) = peak_rss_mib(server.child.id()) {
        println!(
            "memory    {rss:>10.1} MiB peak resident ({backend} server, after {} requests)",
            deliveries * 2 + WARM_UP
        );
    }
    Ok(())
}
