//! `cargo xtask bench`: speed and memory, each reported against a baseline measured in the
//! same run on the same machine, so the ratios mean something where absolute numbers do not.
//!
//! - **verify**: GitHub-signed bodies verified per second, against plain SHA-256 of the same
//!   bytes (the cheapest thing that reads every byte).
//! - **intake, PostgreSQL**: deliveries accepted per second through a release `hookgate serve`
//!   (verify, identify, commit, answer) at 1, 8 and 32 clients, closed loop, with p50/p99,
//!   against **pgbench running hookgate's own intake SQL** (`POSTGRES_INTAKE`, the one
//!   statement of a batch's new events: the inbox insert `ON CONFLICT DO NOTHING`, its outbox
//!   item, its delivery evidence; with a batch of one, bodies of the same size, prepared, one
//!   commit per delivery) at the same client
//!   count. At 32 clients the two take turns three times and their medians are reported; also
//!   with group commit off (`--intake-batch-max 1`), the average
//!   batch (from `/metrics`); and open loop at
//!   0.8× the measured peak, p99 against pgbench's at the same rate (`-R`), latency counted
//!   from each request's scheduled time.
//! - **intake, SQLite**: at 1 and 16 clients, group commit on against off.
//!   On PostgreSQL, deliveries per WAL sync (`pg_stat_wal`), against pgbench's.
//! - **drain**: writes per second from a backlog into the mock CRM (in process, no latency) by
//!   a server with `--drain-workers` workers, with 0, 100k and 1M other writes pending (copied
//!   in SQL from one delivery taken through intake), against the rate with none and against the
//!   intake peak; writes per WAL sync; then into the fake HubSpot answering in 100 ms, records
//!   per call.
//! - **memory**: each server's peak resident set.
//!
//! Besides the table on stdout, every figure goes to `target/bench/bench.json`. `--only`
//! runs some parts (`verify,intake,drain`).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use hookgate_store::{EventState, ItemState};
use hookgate_verify::{
    Algorithm, Clock, Encoding, Preset, Request, SecretBytes, Verifier, compute_mac,
};
use http_body_util::{BodyExt as _, Full};
use sha2::Digest;

const SECRET: &str = "bench-secret";
const BODY_BYTES: usize = 4096;

/// What to measure, from `cargo xtask bench`'s flags.
#[derive(Debug, Clone)]
pub struct Options {
    pub deliveries: usize,
    pub concurrency: usize,
    pub drain_writes: usize,
    pub backlogs: Vec<usize>,
    pub drain_workers: usize,
    pub parts: Vec<Part>,
}

/// The parts of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    Verify,
    Intake,
    Drain,
    /// A backlog drained into the fake HubSpot at its published window, by 1, 2 and 4
    /// processes sharing one budget.
    Budget,
}

impl Options {
    fn args(&self) -> Vec<String> {
        let list = |values: &mut dyn Iterator<Item = String>| values.collect::<Vec<_>>().join(",");
        vec![
            "--deliveries".into(),
            self.deliveries.to_string(),
            "--concurrency".into(),
            self.concurrency.to_string(),
            "--drain-writes".into(),
            self.drain_writes.to_string(),
            "--backlogs".into(),
            list(&mut self.backlogs.iter().map(usize::to_string)),
            "--drain-workers".into(),
            self.drain_workers.to_string(),
            "--only".into(),
            list(&mut self.parts.iter().map(|part| format!("{part:?}").to_lowercase())),
        ]
    }
}

pub fn run(root: &Path, options: &Options) -> Result<()> {
    // Measure optimized code only: a debug xtask runs itself again in release.
    if cfg!(debug_assertions) {
        let status = Command::new("cargo")
            .args(["run", "--release", "--quiet", "-p", "xtask", "--", "bench"])
            .args(options.args())
            .current_dir(root)
            .status()
            .context("cargo run --release")?;
        if !status.success() {
            bail!("the benchmark failed");
        }
        return Ok(());
    }
    let Options { deliveries, concurrency, .. } = *options;
    println!(
        "cargo xtask bench: {deliveries} deliveries at concurrency {concurrency}, bodies of {BODY_BYTES} bytes\n"
    );
    if options.parts.contains(&Part::Verify) {
        verify_bench();
    }
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
    let mut report = Report::default();
    runtime.block_on(async {
        hookgate_connector_http::install_crypto_provider();
        let dir = tempfile::tempdir()?;
        let mut intake_peak = None;
        if options.parts.contains(&Part::Intake) {
            let postgres = hookgate_store::testing::fresh_postgres_database().await;
            let result =
                postgres_bench(&binary, dir.path(), &postgres, deliveries, &mut report).await;
            hookgate_store::testing::drop_postgres_database(&postgres).await;
            intake_peak = Some(result?);
            sqlite_bench(&binary, dir.path(), deliveries, concurrency, &mut report).await?;
        }
        if options.parts.contains(&Part::Budget) {
            budget_bench(&binary, dir.path(), &mut report).await?;
        }
        if options.parts.contains(&Part::Drain) {
            drain_bench(
                &binary,
                dir.path(),
                options.drain_writes,
                &options.backlogs,
                options.drain_workers,
                intake_peak,
                &mut report,
            )
            .await?;
        }
        anyhow::Ok(())
    })?;
    let out = root.join("target/bench");
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("bench.json"), serde_json::to_string_pretty(&report.rows)? + "\n")?;
    println!("\nwrote {}", out.join("bench.json").display());
    Ok(())
}

/// Every figure of a run, for `target/bench/bench.json`.
#[derive(Debug, Default)]
struct Report {
    rows: Vec<serde_json::Value>,
}

impl Report {
    fn add(&mut self, row: serde_json::Value) {
        self.rows.push(row);
    }
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

/// The CRM a benchmark's server writes to.
#[derive(Debug, Clone, Copy)]
enum Crm<'a> {
    /// The mock CRM, in process, no latency.
    Mock,
    /// The fake HubSpot at this base URL.
    HubSpot(&'a str),
}

const HUBSPOT_TOKEN: &str = "pat-na1-bench";

fn start(binary: &Path, dir: &Path, database_url: &str, extra: &[&str]) -> Result<Server> {
    start_with(binary, dir, database_url, extra, Crm::Mock)
}

fn start_with(
    binary: &Path,
    dir: &Path,
    database_url: &str,
    extra: &[&str],
    crm: Crm<'_>,
) -> Result<Server> {
    let instances = dir.join("hookgate.yaml");
    let (connector, object, field) = match crm {
        Crm::Mock => (
            format!(
                "kind: mock\n    settings:\n      path: {}\n",
                dir.join("crm.sqlite").display()
            ),
            "o",
            "id",
        ),
        Crm::HubSpot(base_url) => (
            format!(
                "kind: hubspot\n    settings: {{ base_url: \"{base_url}\" }}\n    credentials: {{ token: {{ env: HUBSPOT_TOKEN }} }}\n"
            ),
            "customers",
            "customer_id",
        ),
    };
    std::fs::write(&instances, format!("connectors:\n  - name: crm\n    {connector}"))?;
    let pipeline = dir.join("bench.yaml");
    std::fs::write(
        &pipeline,
        format!(
            "name: bench\nsignature:\n  scheme: github\n  secrets: [{{env: BENCH_SECRET}}]\nkey:\n  header: X-Id\ntargets:\n  - name: t\n    connector: crm\n    object: {object}\n    external_id: {{field: {field}, value: \"{{{{ event.key }}}}\"}}\n"
        ),
    )?;
    let mut child = Command::new(binary)
        .args(["serve", "--database-url", database_url, "--listen", "127.0.0.1:0", "--instances"])
        .arg(&instances)
        // Intake only, unless the caller asks for workers (`--workers` with no number: the
        // default, sized for full batches).
        .args(match extra.iter().position(|&arg| arg == "--workers") {
            None => &["--workers", "0"][..],
            Some(_) => &[][..],
        })
        .args(without_default_workers(extra))
        .arg(&pipeline)
        .env("BENCH_SECRET", SECRET)
        .env("HUBSPOT_TOKEN", HUBSPOT_TOKEN)
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

/// The body every delivery carries, and its GitHub signature.
fn signed_body() -> (Bytes, Arc<String>) {
    let body: Vec<u8> = (0..BODY_BYTES).map(|i| b'a' + (i % 26) as u8).collect();
    let signature = format!(
        "sha256={}",
        Encoding::Hex.encode(&compute_mac(Algorithm::HmacSha256, SECRET.as_bytes(), &[&body]))
    );
    (Bytes::from(body), Arc::new(signature))
}

/// One client of the load generator: an HTTP/1.1 connection, one request at a time, the body
/// shared. The generator runs on the two cores it measures, so it is kept light: reqwest's
/// client (a pool lookup, a URL parse and a body copy per request) cost about 110 µs of CPU
/// per delivery, as much as the gateway and PostgreSQL together (2026-12-06: 8,200
/// deliveries/s at 32 clients with the machine 95% busy; wrk drove the same server to 10,400–
/// 11,500/s with 29% idle), so the intake it reported was in part its own.
struct Connection {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    host: String,
}

impl Connection {
    async fn open(base: &str) -> Result<Connection> {
        let host = base.strip_prefix("http://").context("an http:// address")?.to_owned();
        let stream = tokio::net::TcpStream::connect(&host).await?;
        stream.set_nodelay(true)?;
        let (sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        // Ends when the sender is dropped.
        tokio::spawn(connection);
        Ok(Connection { sender, host })
    }

    /// Posts a signed delivery with key `key`; the answer's status, its body read whole.
    async fn deliver(
        &mut self,
        path: &str,
        key: &str,
        signature: &str,
        body: &Bytes,
    ) -> Result<u16> {
        let request = hyper::Request::post(path)
            .header(hyper::header::HOST, &self.host)
            .header("X-Id", key)
            .header("X-Hub-Signature-256", signature)
            .body(Full::new(body.clone()))?;
        self.sender.ready().await?;
        let response = self.sender.send_request(request).await?;
        let status = response.status().as_u16();
        response.into_body().collect().await?;
        Ok(status)
    }
}

/// Closed loop: `concurrency` clients, each sending its next delivery when the last is
/// answered, until `count` are sent; the rate and each delivery's latency.
async fn fire(
    base: &str,
    path: &str,
    first_key: usize,
    count: usize,
    concurrency: usize,
    expect: u16,
) -> Result<(f64, Vec<Duration>)> {
    let (elapsed, latencies) =
        drive(base, path, first_key, count, concurrency, expect, None).await?;
    Ok((count as f64 / elapsed.as_secs_f64(), latencies))
}

/// Sends `count` signed deliveries from `clients` connections, each sending its next when the
/// last is answered: at once (closed loop, `rate` `None`, latency from sending), or not before
/// its slot at `rate` a second (open loop, latency from the slot, so that a server that falls
/// behind is charged for the wait). The time taken, and the latencies sorted.
async fn drive(
    base: &str,
    path: &str,
    first_key: usize,
    count: usize,
    clients: usize,
    expect: u16,
    rate: Option<f64>,
) -> Result<(Duration, Vec<Duration>)> {
    let (body, signature) = signed_body();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut connections = Vec::with_capacity(clients);
    for _ in 0..clients {
        connections.push(Connection::open(base).await?);
    }
    let started = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for mut connection in connections {
        let (body, signature, next) = (body.clone(), Arc::clone(&signature), Arc::clone(&next));
        let path = path.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= count {
                    return Ok::<_, anyhow::Error>(latencies);
                }
                let sent = match rate {
                    Some(rate) => {
                        let slot = started + Duration::from_secs_f64(i as f64 / rate);
                        tokio::time::sleep_until(slot).await;
                        slot
                    }
                    None => tokio::time::Instant::now(),
                };
                let key = format!("delivery-{}", first_key + i);
                let status = connection.deliver(&path, &key, &signature, &body).await?;
                if status != expect {
                    bail!("expected {expect}, got {status}");
                }
                latencies.push(sent.elapsed());
            }
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await??);
    }
    let elapsed = started.elapsed();
    latencies.sort();
    Ok((elapsed, latencies))
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

/// Warms a server up on keys the measured runs do not use: every measured delivery is a new
/// event, so each is a committed insert.
const WARM_UP: usize = 100;

/// Average deliveries per intake transaction so far, from the server's `/metrics`.
async fn average_batch(base: &str) -> Option<f64> {
    average(base, "hookgate_intake_batch_size").await
}

/// The average of a histogram of the server's `/metrics`, over all its labels.
async fn average(base: &str, histogram: &str) -> Option<f64> {
    let text = reqwest::get(format!("{base}/metrics")).await.ok()?.text().await.ok()?;
    let total = |suffix: &str| -> f64 {
        let name = format!("{histogram}_{suffix}");
        text.lines()
            .filter(|line| line.starts_with(&name))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let count = total("count");
    (count > 0.0).then(|| total("sum") / count)
}

/// The sum of a counter's series in the server's `/metrics` whose labels contain `label`.
async fn counter(base: &str, name: &str, label: &str) -> f64 {
    let Ok(response) = reqwest::get(format!("{base}/metrics")).await else { return 0.0 };
    let Ok(text) = response.text().await else { return 0.0 };
    text.lines()
        .filter(|line| line.starts_with(name) && line.contains(label))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// pgbench's result: transactions per second and per-transaction latencies.
struct Pgbench {
    rate: f64,
    latencies: Vec<Duration>,
}

/// pgbench running hookgate's intake SQL for a new event with `clients` clients for
/// `seconds`, or throttled to `rate` transactions per second.
fn pgbench(
    url: &str,
    dir: &Path,
    clients: usize,
    seconds: u64,
    rate: Option<f64>,
) -> Result<Pgbench> {
    let body: Vec<u8> = (0..BODY_BYTES).map(|i| b'a' + (i % 26) as u8).collect();
    let body_hex = Encoding::Hex.encode(&body);
    let script = dir.join("intake.sql");
    // The statement hookgate sends for the new events of a batch (`POSTGRES_INTAKE`), with a
    // batch of one: one delivery per commit, one outbox item, values of the same sizes. `k` is
    // random over a range wide enough that keys do not repeat.
    let key = "('key-' || :client_id::text || '-' || :k::text)";
    let values = [
        "ARRAY['pgbench']".to_owned(),
        "ARRAY['']".to_owned(),
        format!("ARRAY[{key}]"),
        "ARRAY['fingerprint-0123456789abcdef0123456789abcdef']".to_owned(),
        "ARRAY[NULL::text]".to_owned(),
        "ARRAY[1::int8]".to_owned(),
        "ARRAY['{}']".to_owned(),
        format!("ARRAY['\\x{body_hex}'::bytea]"),
        format!("ARRAY['{}']", EventState::Accepted),
        "ARRAY[NULL::text]".to_owned(),
        "ARRAY[1::int8]".to_owned(),
        "ARRAY['t']".to_owned(),
        "ARRAY[0::int8]".to_owned(),
        format!("ARRAY[{key}]"),
        "ARRAY[NULL::text]".to_owned(),
        "ARRAY[NULL::text]".to_owned(),
        "ARRAY[1::int8]".to_owned(),
        format!("'{}'", ItemState::Pending),
    ];
    let mut statement = hookgate_store::POSTGRES_INTAKE.to_owned();
    // From the highest number down, so that `$1` does not match the start of `$10`.
    for (number, value) in values.iter().enumerate().rev() {
        statement = statement.replace(&format!("${}", number + 1), value);
    }
    if statement.contains('$') {
        bail!("the intake statement takes more parameters than the pgbench script fills in");
    }
    std::fs::write(&script, format!("\\set k random(1, 1000000000000)\n{statement};\n"))?;
    // A directory of this run's logs alone: every run writes files of its own process id, and
    // a directory shared with an earlier run would count that run's transactions again.
    let logs = tempfile::Builder::new().prefix("pgbench-").tempdir_in(dir)?;
    let mut command = Command::new("pgbench");
    command
        .args(["-n", "-M", "prepared", "--log", "--log-prefix"])
        .arg(logs.path().join("tx"))
        .args(["-c", &clients.to_string(), "-j", &clients.min(2).to_string()])
        .args(["-T", &seconds.to_string(), "-f"])
        .arg(&script);
    if let Some(rate) = rate {
        command.args(["-R", &format!("{rate:.0}")]);
    }
    let output = command.arg(url).output().context("pgbench (Debian's postgresql-client)")?;
    if !output.status.success() {
        bail!("pgbench failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    let mut latencies = Vec::new();
    for entry in std::fs::read_dir(logs.path())? {
        for line in std::fs::read_to_string(entry?.path())?.lines() {
            // client transaction time_us script epoch epoch_us [schedule_lag_us]
            let fields: Vec<&str> = line.split_whitespace().collect();
            let time: u64 = fields.get(2).and_then(|v| v.parse().ok()).unwrap_or(0);
            let lag: u64 = fields.get(6).and_then(|v| v.parse().ok()).unwrap_or(0);
            latencies.push(Duration::from_micros(time + lag));
        }
    }
    // The logs must hold what pgbench says it ran, no more and no fewer.
    let stdout = String::from_utf8_lossy(&output.stdout);
    let processed = stdout
        .lines()
        .find_map(|line| line.strip_prefix("number of transactions actually processed: "))
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next()?.parse::<usize>().ok())
        .context("pgbench printed no count of transactions processed")?;
    if processed != latencies.len() {
        bail!("pgbench processed {processed} transactions but logged {}", latencies.len());
    }
    latencies.sort();
    let rate = latencies.len() as f64 / seconds as f64;
    Ok(Pgbench { rate, latencies })
}

/// Open loop: deliveries scheduled at `rate` a second for `seconds` (evenly; pgbench `-R`
/// draws its gaps at random around the same mean), sent by `OPEN_LOOP_CLIENTS` connections as
/// pgbench `-R` sends transactions by its clients; latencies from the scheduled times.
async fn fire_open(base: &str, first_key: usize, rate: f64, seconds: u64) -> Result<Vec<Duration>> {
    let count = (rate * seconds as f64) as usize;
    let (_, latencies) =
        drive(base, "/hooks/bench", first_key, count, OPEN_LOOP_CLIENTS, 202, Some(rate)).await?;
    Ok(latencies)
}

/// Connections of the open-loop run, as many as pgbench `-R` gets clients.
const OPEN_LOOP_CLIENTS: usize = 32;

// One printed line and one JSON row: the arguments are the row's columns.
#[allow(clippy::too_many_arguments)]
fn row(
    report: &mut Report,
    name: &str,
    backend: &str,
    clients: usize,
    rate: f64,
    latencies: &[Duration],
    baseline_name: &str,
    baseline: f64,
) {
    let (p50, p99) = (percentile(latencies, 0.5), percentile(latencies, 0.99));
    println!(
        "{name:<28} {backend:<8} {clients:>3} clients {rate:>8.0}/s  p50 {p50:>6.1} ms  p99 {p99:>6.1} ms   {baseline_name:<22} {baseline:>8.0}/s   ratio {:.2}",
        rate / baseline
    );
    report.add(serde_json::json!({
        "measure": name, "backend": backend, "clients": clients, "per_second": rate,
        "p50_ms": p50, "p99_ms": p99, "baseline": baseline_name, "baseline_per_second": baseline,
        "ratio": rate / baseline,
    }));
}

async fn postgres_bench(
    binary: &Path,
    dir: &Path,
    url: &str,
    deliveries: usize,
    report: &mut Report,
) -> Result<f64> {
    println!("intake on PostgreSQL, closed loop, {BODY_BYTES}-byte bodies:");
    let batched = start(binary, dir, url, &["--db-max-connections", "16"])?;
    let unbatched =
        start(binary, dir, url, &["--db-max-connections", "16", "--intake-batch-max", "1"])?;
    fire(&batched.base, "/hooks/bench", 0, WARM_UP, 8, 202).await?;
    fire(&unbatched.base, "/hooks/bench", WARM_UP, WARM_UP, 8, 202).await?;
    let mut next_key = 2 * WARM_UP;
    let mut peak = 0.0;
    for clients in [1, 8, 32] {
        let count = if clients == 1 { deliveries / 3 } else { deliveries };
        // At 32 clients, the figure the target is about, hookgate and pgbench take turns
        // `INTAKE_ROUNDS` times and each reports its median: the machine's speed (its disk's
        // fsync above all) drifts over a minute, and one run of each would report the drift.
        let rounds = if clients == 32 { INTAKE_ROUNDS } else { 1 };
        let (mut rates, mut latencies, mut wal) = (Vec::new(), Vec::new(), WalCounters::default());
        let (mut baseline_rates, mut baseline_latencies) = (Vec::new(), Vec::new());
        let mut baseline_wal = WalCounters::default();
        let mut counters = wal_counters(url).await?;
        for _ in 0..rounds {
            let (rate, round_latencies) =
                fire(&batched.base, "/hooks/bench", next_key, count, clients, 202).await?;
            next_key += count;
            let after = wal_counters(url).await?;
            wal = wal.plus(after.since(counters));
            let baseline = pgbench(url, dir, clients, 8, None)?;
            counters = wal_counters(url).await?;
            baseline_wal = baseline_wal.plus(counters.since(after));
            rates.push(rate);
            latencies.extend(round_latencies);
            baseline_rates.push(baseline.rate);
            baseline_latencies.extend(baseline.latencies);
        }
        latencies.sort();
        baseline_latencies.sort();
        let rate = median(&rates);
        let baseline = Pgbench { rate: median(&baseline_rates), latencies: baseline_latencies };
        let per_sync = (count * rounds) as f64 / wal.syncs.max(1) as f64;
        let baseline_per_sync = baseline.latencies.len() as f64 / baseline_wal.syncs.max(1) as f64;
        if rounds > 1 {
            println!(
                "    {rounds} rounds in turn, medians reported: hookgate {}/s, pgbench {}/s",
                rates.iter().map(|r| format!("{r:.0}")).collect::<Vec<_>>().join(", "),
                baseline_rates.iter().map(|r| format!("{r:.0}")).collect::<Vec<_>>().join(", ")
            );
            report.add(serde_json::json!({
                "measure": "intake rounds", "backend": "postgres", "clients": clients,
                "runs_per_second": rates, "baseline_runs_per_second": baseline_rates,
            }));
        }
        println!(
            "    deliveries per WAL sync: {per_sync:.1} ({} commits, {} syncs); pgbench {baseline_per_sync:.1}",
            wal.commits, wal.syncs
        );
        report.add(serde_json::json!({
            "measure": "deliveries per WAL sync", "backend": "postgres", "clients": clients,
            "value": per_sync, "commits": wal.commits, "syncs": wal.syncs,
            "baseline": "pgbench, hookgate SQL", "baseline_value": baseline_per_sync,
        }));
        row(
            report,
            "intake (group commit)",
            "postgres",
            clients,
            rate,
            &latencies,
            "pgbench, hookgate SQL",
            baseline.rate,
        );
        row(
            report,
            "  pgbench: hookgate SQL",
            "postgres",
            clients,
            baseline.rate,
            &baseline.latencies,
            "(itself)",
            baseline.rate,
        );
        if clients == 32 {
            peak = rate;
            let (single, latencies) =
                fire(&unbatched.base, "/hooks/bench", next_key, count, clients, 202).await?;
            next_key += count;
            row(
                report,
                "intake (one per commit)",
                "postgres",
                clients,
                single,
                &latencies,
                "pgbench, hookgate SQL",
                baseline.rate,
            );
        }
    }
    if let Some(batch) = average_batch(&batched.base).await {
        println!("    average intake batch {batch:.1} deliveries");
        report.add(serde_json::json!({"measure": "average intake batch", "backend": "postgres", "value": batch}));
    }
    let rate = (peak * 0.8).max(1.0);
    let latencies = fire_open(&batched.base, next_key, rate, 6).await?;
    let baseline = pgbench(url, dir, OPEN_LOOP_CLIENTS, 6, Some(rate))?;
    let (p99, base_p99) = (percentile(&latencies, 0.99), percentile(&baseline.latencies, 0.99));
    println!(
        "open loop at 0.8x peak ({rate:.0}/s)        p99 {p99:.1} ms   pgbench -R at the same rate: p99 {base_p99:.1} ms   ratio {:.2}",
        p99 / base_p99
    );
    report.add(serde_json::json!({"measure": "open-loop p99 at 0.8x peak", "backend": "postgres", "per_second": rate, "p99_ms": p99, "baseline": "pgbench -R", "baseline_p99_ms": base_p99, "ratio": p99 / base_p99}));
    memory(report, &batched, "postgres");
    Ok(peak)
}

async fn sqlite_bench(
    binary: &Path,
    dir: &Path,
    deliveries: usize,
    concurrency: usize,
    report: &mut Report,
) -> Result<()> {
    println!("\nintake on SQLite (WAL, synchronous=FULL), closed loop:");
    for (name, extra) in
        [("group commit", &[][..]), ("one per commit", &["--intake-batch-max", "1"][..])]
    {
        let url = format!("sqlite://{}", dir.join(format!("bench-{}.db", extra.len())).display());
        let server = start(binary, dir, &url, extra)?;
        fire(&server.base, "/hooks/bench", 0, WARM_UP, 8, 202).await?;
        let (baseline, _) =
            fire(&server.base, "/hooks/none", 0, deliveries, concurrency, 404).await?;
        let mut next_key = WARM_UP;
        for clients in [1, concurrency] {
            let count = if clients == 1 { deliveries / 3 } else { deliveries };
            let (rate, latencies) =
                fire(&server.base, "/hooks/bench", next_key, count, clients, 202).await?;
            next_key += count;
            row(
                report,
                &format!("intake ({name})"),
                "sqlite",
                clients,
                rate,
                &latencies,
                "404 path (HTTP only)",
                baseline,
            );
        }
        if let Some(batch) = average_batch(&server.base).await {
            println!("    average intake batch {batch:.1} deliveries");
            report.add(serde_json::json!({"measure": format!("average intake batch ({name})"), "backend": "sqlite", "value": batch}));
        }
        memory(report, &server, "sqlite");
    }
    Ok(())
}

fn memory(report: &mut Report, server: &Server, backend: &str) {
    if let Some(rss) = peak_rss_mib(server.child.id()) {
        println!("memory    {rss:>10.1} MiB peak resident ({backend} server)");
        report
            .add(serde_json::json!({"measure": "peak RSS MiB", "backend": backend, "value": rss}));
    }
}

/// Commits in one database and WAL syncs in the whole server, counted by PostgreSQL.
#[derive(Debug, Clone, Copy, Default)]
struct WalCounters {
    commits: i64,
    syncs: i64,
}

impl WalCounters {
    fn plus(self, other: WalCounters) -> WalCounters {
        WalCounters { commits: self.commits + other.commits, syncs: self.syncs + other.syncs }
    }

    fn since(self, before: WalCounters) -> WalCounters {
        WalCounters { commits: self.commits - before.commits, syncs: self.syncs - before.syncs }
    }
}

/// [`WalCounters`] now. A backend that stays connected publishes its counts up to ten seconds
/// after its transactions (PostgreSQL's idle statistics interval), so this waits that long.
async fn wal_counters(url: &str) -> Result<WalCounters> {
    tokio::time::sleep(Duration::from_secs(11)).await;
    let line = psql(
        url,
        "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()) \
         || ' ' || (SELECT wal_sync FROM pg_stat_wal)",
    )?;
    let mut numbers = line.split_whitespace().map(str::parse::<i64>);
    match (numbers.next(), numbers.next()) {
        (Some(Ok(commits)), Some(Ok(syncs))) => Ok(WalCounters { commits, syncs }),
        _ => bail!("unexpected WAL counters from PostgreSQL: {line}"),
    }
}

/// Runs SQL through `psql` and returns its unaligned output.
fn psql(url: &str, sql: &str) -> Result<String> {
    let output = Command::new("psql")
        .args(["-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", sql])
        .output()
        .context("psql (Debian's postgresql-client)")?;
    if !output.status.success() {
        bail!("psql failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// Drain: writes per second from the outbox into a zero-latency mock CRM, by a release
/// `hookgate serve` with `workers` workers, on PostgreSQL. For each backlog size, a fresh
/// database holds `backlog + writes` pending writes (one entity each, copied in SQL from one
/// delivery taken through intake), plus a warm-up; the rate is `writes` over the time until
/// that many more are done. The backlog's extra writes are as due as the measured ones: the
/// lease query must find work without walking them.
///
/// Each backlog is run `DRAIN_ROUNDS` times, the sizes in turn (0, 100k, 1M, 0, ...), and its
/// median is reported: this machine's speed drifts by a fifth over minutes, and one run of
/// each, in order, would report the drift as the backlog's cost.
async fn drain_bench(
    binary: &Path,
    dir: &Path,
    writes: usize,
    backlogs: &[usize],
    workers: usize,
    intake_peak: Option<f64>,
    report: &mut Report,
) -> Result<()> {
    println!("\ndrain on PostgreSQL into a zero-latency mock CRM, {workers} workers:");
    let mut runs: Vec<Vec<(f64, Option<f64>)>> = vec![Vec::new(); backlogs.len()];
    for round in 1..=DRAIN_ROUNDS {
        for (i, &backlog) in backlogs.iter().enumerate() {
            let url = hookgate_store::testing::fresh_postgres_database().await;
            let result = drain_once(binary, dir, &url, writes, backlog, workers, Crm::Mock).await;
            hookgate_store::testing::drop_postgres_database(&url).await;
            let (rate, per_call) = result?;
            println!("    round {round}, backlog {backlog}: {rate:.0} writes/s");
            runs[i].push((rate, per_call));
        }
    }
    let mut first_rate = None;
    for (&backlog, runs) in backlogs.iter().zip(&mut runs) {
        runs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (rate, per_call) = runs[runs.len() / 2];
        let baseline = first_rate.unwrap_or(rate);
        first_rate.get_or_insert(rate);
        println!(
            "drain     backlog {backlog:>8}  {rate:>8.0} writes/s   vs empty backlog {:.2}{}{}",
            rate / baseline,
            intake_peak
                .map(|peak| format!("   vs intake peak {:.2}", rate / peak))
                .unwrap_or_default(),
            per_call.map(|n| format!("   {n:.1} records per CRM call")).unwrap_or_default(),
        );
        let all: Vec<f64> = runs.iter().map(|run| run.0).collect();
        report.add(serde_json::json!({
            "measure": "drain", "backend": "postgres", "backlog": backlog, "workers": workers,
            "per_second": rate, "runs_per_second": all, "ratio_to_empty_backlog": rate / baseline,
            "intake_peak_per_second": intake_peak, "ratio_to_intake_peak": intake_peak.map(|p| rate / p),
            "records_per_crm_call": per_call,
        }));
    }

    // Records per call under a backlog, where calls cost what a real CRM's do.
    let latency = Duration::from_millis(100);
    let hubspot = hookgate_fakes::hubspot::FakeHubSpot::start().await;
    {
        let mut state = hubspot.lock();
        state.token = HUBSPOT_TOKEN.into();
        state.unique_properties.insert("customers".into(), ["customer_id".to_owned()].into());
        state.max_per_window = usize::MAX;
        state.latency = latency;
    }
    let url = hookgate_store::testing::fresh_postgres_database().await;
    let result = drain_once(
        binary,
        dir,
        &url,
        writes.min(HUBSPOT_WRITES),
        0,
        workers,
        Crm::HubSpot(&hubspot.base_url),
    )
    .await;
    hookgate_store::testing::drop_postgres_database(&url).await;
    let (rate, _) = result?;
    let calls = hubspot.write_calls();
    let records = hubspot.writes().len();
    let per_call = records as f64 / (calls.batch_upsert + calls.update).max(1) as f64;
    println!(
        "drain into the fake HubSpot answering in {} ms: {rate:>6.0} writes/s   {per_call:.1} records per HubSpot call ({} calls)",
        latency.as_millis(),
        calls.batch_upsert + calls.update
    );
    report.add(serde_json::json!({
        "measure": "drain into HubSpot", "backend": "postgres", "crm_latency_ms": latency.as_millis(),
        "workers": workers, "writes": records, "per_second": rate,
        "records_per_crm_call": per_call,
    }));
    Ok(())
}

/// In `start_with`'s extra arguments after `--workers`: the default number of workers.
const DEFAULT_WORKERS: &str = "(default)";

/// `extra` without a `--workers` [`DEFAULT_WORKERS`] pair: the server's own default applies.
fn without_default_workers<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut kept = Vec::new();
    let mut args = extra.iter().copied().peekable();
    while let Some(arg) = args.next() {
        if arg == "--workers" && args.peek() == Some(&DEFAULT_WORKERS) {
            args.next();
            continue;
        }
        kept.push(arg);
    }
    kept
}

/// Writes the budget bench drains: three windows' worth of full HubSpot calls.
const BUDGET_WRITES: usize = 30_000;

/// HubSpot's published window for a private app, which the fake enforces.
const HUBSPOT_WINDOW_CALLS: usize = 100;
const HUBSPOT_WINDOW: Duration = Duration::from_secs(10);

/// A backlog of [`BUDGET_WRITES`] drained into a fake HubSpot that enforces its published
/// window (100 calls per rolling 10 s, answers in 100 ms) by 1, 2 and 4 gateway processes on
/// one PostgreSQL, with their default settings. The ceiling is what the window allows: full
/// calls of 100 records, 100 calls at once and 100 more each window after, so the fastest
/// drain takes `(calls / 100 - 1)` windows and one answer.
async fn budget_bench(binary: &Path, dir: &Path, report: &mut Report) -> Result<()> {
    let latency = Duration::from_millis(100);
    let calls_needed = BUDGET_WRITES.div_ceil(HUBSPOT_MAX_BATCH);
    let windows = calls_needed.div_ceil(HUBSPOT_WINDOW_CALLS).saturating_sub(1);
    let fastest = HUBSPOT_WINDOW * u32::try_from(windows)? + latency;
    let ceiling = BUDGET_WRITES as f64 / fastest.as_secs_f64();
    println!(
        "\ndrain of {BUDGET_WRITES} writes into the fake HubSpot at its window ({HUBSPOT_WINDOW_CALLS} calls per {} s, answers in {} ms); ceiling {ceiling:.0} records/s:",
        HUBSPOT_WINDOW.as_secs(),
        latency.as_millis()
    );
    for processes in [1usize, 2, 4] {
        let hubspot = hookgate_fakes::hubspot::FakeHubSpot::start().await;
        {
            let mut state = hubspot.lock();
            state.token = HUBSPOT_TOKEN.into();
            state.unique_properties.insert("customers".into(), ["customer_id".to_owned()].into());
            state.max_per_window = HUBSPOT_WINDOW_CALLS;
            state.window_length = HUBSPOT_WINDOW;
            state.latency = latency;
        }
        let crm = Crm::HubSpot(&hubspot.base_url);
        let url = hookgate_store::testing::fresh_postgres_database().await;
        let result = async {
            template(binary, dir, &url, crm).await?;
            // The template's own write is one of them.
            seed(&url, BUDGET_WRITES - 1)?;
            let started = Instant::now();
            let gateways: Vec<Server> = (0..processes)
                .map(|_| start_with(binary, dir, &url, &["--workers", DEFAULT_WORKERS], crm))
                .collect::<Result<_>>()?;
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if hubspot.writes().len() >= BUDGET_WRITES {
                    break;
                }
                if started.elapsed() > Duration::from_secs(600) {
                    bail!("{processes} processes did not drain {BUDGET_WRITES} writes in 600 s");
                }
            }
            let elapsed = started.elapsed();
            drop(gateways);
            anyhow::Ok((started, elapsed))
        }
        .await;
        hookgate_store::testing::drop_postgres_database(&url).await;
        let (started_at, elapsed) = result?;
        let rate = BUDGET_WRITES as f64 / elapsed.as_secs_f64();
        let counts = hubspot.call_counts();
        let calls = counts.admitted + counts.refused_window;
        let refused = counts.refused_window as f64 / calls.max(1) as f64;
        let writes = hubspot.write_calls();
        let per_call = hubspot.writes().len() as f64 / writes.batch_upsert.max(1) as f64;
        // When the calls came, by second from the start: a budget's bursts and gaps.
        let timeline: Vec<usize> = {
            let admitted = hubspot.lock().admitted_at.clone();
            let seconds = elapsed.as_secs() as usize + 1;
            let mut buckets = vec![0usize; seconds];
            for at in admitted {
                let second = at.saturating_duration_since(started_at).as_secs() as usize;
                if let Some(bucket) = buckets.get_mut(second) {
                    *bucket += 1;
                }
            }
            buckets
        };
        println!(
            "budget    {processes} process{}  {rate:>6.0} records/s   vs the window's ceiling {:.2} (target >= 0.90)   {:.1}% of {calls} calls refused (target <= 1%)   {per_call:.1} records per call",
            if processes == 1 { "  " } else { "es" },
            rate / ceiling,
            refused * 100.0,
        );
        println!(
            "          calls per second from the start: {}",
            timeline.iter().map(ToString::to_string).collect::<Vec<_>>().join(" ")
        );
        report.add(serde_json::json!({
            "measure": "drain within HubSpot's window", "backend": "postgres", "processes": processes,
            "writes": BUDGET_WRITES, "crm_latency_ms": latency.as_millis(),
            "window_calls": HUBSPOT_WINDOW_CALLS, "window_ms": HUBSPOT_WINDOW.as_millis(),
            "per_second": rate, "ceiling_per_second": ceiling, "ratio_to_ceiling": rate / ceiling,
            "calls": calls, "calls_refused": counts.refused_window, "share_refused": refused,
            "max_calls_in_any_window": counts.max_in_any_window, "records_per_crm_call": per_call,
        }));
    }
    Ok(())
}

/// Records one HubSpot batch upsert takes.
const HUBSPOT_MAX_BATCH: usize = 100;

/// Runs of each drain backlog; the median is reported.
const DRAIN_ROUNDS: usize = 3;

/// Turns of hookgate and pgbench at 32 clients, whose medians are reported.
const INTAKE_ROUNDS: usize = 3;

/// The middle value (the upper one of an even count).
fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

/// Writes seeded beyond the timed ones for the server to drain before timing starts.
const DRAIN_WARM_UP: usize = 20_000;

/// Writes timed into the fake HubSpot at most: it finds records by a linear search (it is a
/// fake), so beyond this its own time would grow into the figure; records per call is what
/// that run is for.
const HUBSPOT_WRITES: usize = 20_000;

/// One drain run; returns writes per second and, when the server counts them, records per CRM
/// call.
async fn drain_once(
    binary: &Path,
    dir: &Path,
    url: &str,
    writes: usize,
    backlog: usize,
    workers: usize,
    crm: Crm<'_>,
) -> Result<(f64, Option<f64>)> {
    let mock_file = dir.join("crm.sqlite");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", mock_file.display()));
    }
    template(binary, dir, url, crm).await?;
    // Writes the server drains before timing starts (see below) come from these.
    let total = backlog + writes + DRAIN_WARM_UP;
    seed(url, total)?;
    let done = || -> Result<usize> {
        let done = format!("SELECT count(*) FROM outbox WHERE state = '{}'", ItemState::Done);
        Ok(psql(url, &done)?.parse()?)
    };
    let before = done()?;
    let wal_before = wal_counters(url).await?;
    let server = start_with(binary, dir, url, &["--workers", &workers.to_string()], crm)?;
    // The server's own count of writes finished done, read often and cheaply: a count of the
    // table's done rows would cost the database work of its own while it is measured. Timing
    // starts once the first answer came: its backlog gauges are read then (a count of every
    // write to do, not repeated for a hundred times its duration), and the workers are up.
    let delivered = || counter(&server.base, "hookgate_writes_finished_total{", "state=\"done\"");
    let warmed = delivered().await;
    let started = Instant::now();
    if warmed > DRAIN_WARM_UP as f64 {
        bail!(
            "{warmed} writes were done before timing started, more than the {DRAIN_WARM_UP} seeded for it"
        );
    }
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if delivered().await >= warmed + writes as f64 {
            break;
        }
        if started.elapsed() > Duration::from_secs(600) {
            bail!("the drain did not finish {writes} writes in 600 s");
        }
    }
    let rate = writes as f64 / started.elapsed().as_secs_f64();
    // Records per call, from the server's own histogram of batch sizes.
    let per_call = average(&server.base, "hookgate_crm_batch_size").await;
    if let Some(rss) = peak_rss_mib(server.child.id()) {
        println!("    {rss:.1} MiB peak resident (draining server)");
    }
    for histogram in [
        "hookgate_lease_seconds",
        "hookgate_lease_size",
        "hookgate_finish_batch_size",
        "hookgate_store_batch_seconds",
        "hookgate_crm_batch_size",
        "hookgate_crm_batch_call_seconds",
    ] {
        if let Some(value) = average(&server.base, histogram).await {
            match histogram.strip_suffix("_seconds") {
                Some(name) => println!("    average {name}: {:.2} ms", value * 1000.0),
                None => println!("    average {histogram}: {value:.1}"),
            }
        }
    }
    drop(server);
    let wal = wal_counters(url).await?.since(wal_before);
    // Updates that stayed on their page without touching an index (HOT), per table: the
    // cheap kind, and where a finish's row work goes when they are not.
    let hot = psql(
        url,
        "SELECT string_agg(relname || ' ' || n_tup_hot_upd || '/' || n_tup_upd, ', ' ORDER BY relname) \
         FROM pg_stat_user_tables WHERE relname IN ('entities', 'events', 'outbox')",
    )?;
    println!("    HOT updates of all updates: {hot}");
    let finished = done()? - before;
    println!(
        "    writes per WAL sync {:.1} ({} commits, {} syncs, {finished} writes)",
        finished as f64 / wal.syncs.max(1) as f64,
        wal.commits,
        wal.syncs
    );
    Ok((rate, per_call))
}

/// Migrates a fresh database with an intake-only server and posts the one delivery that
/// [`seed`] copies.
async fn template(binary: &Path, dir: &Path, url: &str, crm: Crm<'_>) -> Result<()> {
    // Intake only: migrates, and takes the one delivery the backlog is copied from.
    let intake = start_with(binary, dir, url, &["--workers", "0"], crm)?;
    let client = reqwest::Client::new();
    let body = br#"{"id":"template","name":"A customer","email":"a@example.com"}"#.to_vec();
    let signature = format!(
        "sha256={}",
        Encoding::Hex.encode(&compute_mac(Algorithm::HmacSha256, SECRET.as_bytes(), &[&body]))
    );
    let response = client
        .post(format!("{}/hooks/bench", intake.base))
        .header("X-Id", "template")
        .header("X-Hub-Signature-256", signature)
        .body(body)
        .send()
        .await?;
    if response.status().as_u16() != 202 {
        bail!("the template delivery was answered {}", response.status());
    }
    Ok(())
}

/// Seeds `total` pending writes, copies of the template delivery's event.
fn seed(url: &str, total: usize) -> Result<()> {
    let seeding = Instant::now();
    psql(
        url,
        &format!(
            "INSERT INTO events (pipeline, scope, event_key, fingerprint, event_type, received_at_ms, headers, body, \
               state, delivery_count, last_delivery_at_ms, sealed_with) \
             SELECT pipeline, scope, 'seed-' || g, fingerprint, event_type, received_at_ms - 10000000 + g, \
               replace(headers, '\"template\"', '\"seed-' || g || '\"'), body, \
               '{accepted}', 1, last_delivery_at_ms, sealed_with \
             FROM events, generate_series(1, {total}) AS g WHERE event_key = 'template'; \
             INSERT INTO outbox (event_id, pipeline, target, target_index, entity, state, next_attempt_at_ms, created_at_ms, siblings) \
             SELECT id, pipeline, 't', 0, event_key, '{pending}', received_at_ms, received_at_ms, 1 \
             FROM events WHERE event_key LIKE 'seed-%';",
            accepted = EventState::Accepted,
            pending = ItemState::Pending,
        ),
    )?;
    // After the seeding's commit (one `psql -c` is one transaction), a checkpoint writes its
    // pages back now: otherwise a million seeded rows leave about a gigabyte of WAL, whose
    // checkpoint runs during the timed drain and makes the first change of every page after
    // it log a full-page image, a cost of the seeding that only the large backlogs would pay.
    psql(url, "ANALYZE")?;
    psql(url, "CHECKPOINT")?;
    println!("    seeded {total} pending writes in {:.1} s", seeding.elapsed().as_secs_f64());
    Ok(())
}
