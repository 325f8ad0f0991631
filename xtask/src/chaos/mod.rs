//! `cargo xtask chaos`: the project's fault-injection harness, a proof of the delivery
//! guarantees under every fault at once, judged from outside.
//!
//! One run per backend. On PostgreSQL, several `hookgate serve` processes share one database
//! (through a TCP proxy that can cut it off); on SQLite, one process. Every process is killed
//! with SIGKILL at random every 1–3 s and restarted on its port. Senders deliver each event
//! 1–5 times, concurrently, in a random order (so versions of an entity arrive shuffled and
//! late), and retry on 5xx and connection errors as real senders do. Every event writes to a
//! fake HubSpot and a fake Salesforce that fail writes, lose answers after applying writes,
//! fail and time out lookups, rate-limit in bursts (with and without `Retry-After`) and add
//! latency. Once during the load the database goes away: the proxy cuts every connection for a
//! few seconds, or (`--postgres-fault restart`) the server itself restarts.
//!
//! The verdict comes from the fakes' own effect logs and the senders' answers, not from
//! hookgate's tables: acknowledged events lost, duplicate effects, stale overwrites (a lower
//! version applied after a higher one), events accepted twice. A JSON report is written, and
//! the exit status is non-zero on any violation.

mod gateways;
mod verdict;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use hookgate_fakes::chaos::Chaos;
use hookgate_fakes::hubspot::FakeHubSpot;
use hookgate_fakes::proxy::Proxy;
use hookgate_fakes::salesforce::FakeSalesforce;
use hookgate_store::{Pause, PauseKind, Replay, ReplayFilter, Store, StoreOptions};
use hookgate_verify::{Algorithm, Encoding, compute_mac};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use gateways::{Gateway, Launch};
use verdict::{CrmVerdict, Effect, IntakeVerdict, SentEvent};

const SECRET: &str = "chaos-secret";
const HUBSPOT_TOKEN: &str = "pat-na1-chaos";
const SALESFORCE_CLIENT_ID: &str = "chaos-client";
const SALESFORCE_CLIENT_SECRET: &str = "chaos-client-secret";

/// Concurrent senders.
const SENDERS: usize = 16;
/// A sender gives a delivery up after this long without an answer other than 5xx.
const DELIVERY_GIVE_UP: Duration = Duration::from_secs(120);
/// How long one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// A sender waits at most this long for a `Retry-After`.
const RETRY_AFTER_MAX: Duration = Duration::from_secs(1);
/// Kills go on this long into the drain after the last delivery was answered.
const KILLS_INTO_DRAIN: Duration = Duration::from_secs(15);
/// How long the database stays cut off.
const OUTAGE: Duration = Duration::from_secs(3);
/// A gateway that cannot restart within this long fails the run.
const RESTART_DEADLINE: Duration = Duration::from_secs(60);

/// The gateways' worker settings: short leases, so that killed workers' entities are taken
/// over within the run.
const GATEWAY_ARGS: &[&str] = &[
    "--workers",
    "8",
    "--lease-ms",
    "3000",
    "--call-timeout-ms",
    "1500",
    "--idle-poll-ms",
    "100",
    "--db-acquire-timeout-ms",
    "1000",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Postgres,
    Sqlite,
}

/// How the database goes away once during a PostgreSQL run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PostgresFault {
    /// A proxy in front of PostgreSQL drops every connection and refuses new ones.
    Cut,
    /// `pg_ctlcluster ... restart`: the real server restarts (needs the right to do so).
    Restart,
}

#[derive(Debug, Clone, Serialize)]
pub struct Options {
    pub backends: Vec<Backend>,
    pub events: usize,
    pub entities: usize,
    /// Gateway processes on PostgreSQL (SQLite runs one).
    pub processes: usize,
    pub deliveries_max: u32,
    /// Deliveries sent per second: arrivals spread over the run, so that versions of an
    /// entity keep arriving (shuffled, late) while earlier ones are being written.
    pub rate: u32,
    pub seed: u64,
    pub postgres_fault: PostgresFault,
    pub drain_timeout_secs: u64,
    pub release: bool,
    pub out: PathBuf,
}

#[derive(Debug, Serialize)]
struct Report {
    options: Options,
    runs: Vec<RunReport>,
    holds: bool,
}

#[derive(Debug, Serialize)]
struct RunReport {
    backend: Backend,
    processes: usize,
    seconds: f64,
    deliveries: usize,
    /// Answers by status code; `connection` counts requests that got none.
    answers: BTreeMap<String, usize>,
    kills: usize,
    /// The operator's actions, by kind.
    operator: BTreeMap<String, usize>,
    database_outage: Option<String>,
    faults_injected: BTreeMap<String, BTreeMap<String, u64>>,
    /// Outbox items by state at the end, from hookgate's tables (for the record only).
    hookgate_items: BTreeMap<String, i64>,
    /// Attempts naming an item or event that is not there (PostgreSQL keeps no foreign key
    /// for them): must be none.
    orphaned_attempts: i64,
    /// The most HubSpot calls the fake saw in any rolling second, against the budget.
    hubspot_calls_in_a_window_max: usize,
    drained: bool,
    intake: IntakeVerdict,
    crms: BTreeMap<String, CrmVerdict>,
    holds: bool,
}

pub fn run(root: &Path, options: Options) -> Result<bool> {
    let profile = if options.release { "release" } else { "debug" };
    let mut build = Command::new("cargo");
    build.args(["build", "--quiet", "-p", "hookgate"]).current_dir(root);
    if options.release {
        build.arg("--release");
    }
    if !build.status().context("cargo build")?.success() {
        bail!("the build failed");
    }
    let binary = root.join("target").join(profile).join("hookgate");
    std::fs::create_dir_all(&options.out)
        .with_context(|| format!("cannot create {}", options.out.display()))?;
    println!(
        "cargo xtask chaos: {} events over {} entities, 1-{} deliveries each, seed {}",
        options.events, options.entities, options.deliveries_max, options.seed
    );

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut runs = Vec::new();
    for backend in &options.backends {
        let report = runtime.block_on(run_backend(&binary, &options, *backend))?;
        print_run(&report);
        runs.push(report);
    }
    let holds = runs.iter().all(|r| r.holds);
    let path = options.out.join("report.json");
    let report = Report { options, runs, holds };
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    println!(
        "verdict: {} (report: {})",
        if holds { "every guarantee held" } else { "VIOLATED" },
        path.display()
    );
    Ok(holds)
}

/// One event: its key, entity, version and body, signed.
#[derive(Debug, Clone)]
struct PlannedEvent {
    key: String,
    entity: String,
    version: i64,
    body: Vec<u8>,
    signature: String,
    copies: u32,
}

fn plan(options: &Options, rng: &mut StdRng) -> Vec<PlannedEvent> {
    let mut events = Vec::with_capacity(options.events);
    for n in 0..options.events {
        let entity = format!("C-{}", n % options.entities);
        let version = i64::try_from(n / options.entities + 1).unwrap_or(i64::MAX);
        let key = format!("evt-{}-{version}", n % options.entities);
        let body = format!(
            r#"{{"id":"{key}","customer":"{entity}","seq":{version},"status":"s{version}"}}"#
        )
        .into_bytes();
        let mac = compute_mac(Algorithm::HmacSha256, SECRET.as_bytes(), &[&body]);
        let signature = format!("sha256={}", Encoding::Hex.encode(&mac));
        let copies = rng.random_range(1..=options.deliveries_max);
        events.push(PlannedEvent { key, entity, version, body, signature, copies });
    }
    events
}

fn pipeline_yaml() -> String {
    let target = |name: &str| {
        format!(
            "  - name: {name}\n    connector: {name}\n    object: customers\n    external_id:\n      field: customer_id\n      value: \"{{{{ payload.customer }}}}\"\n    fields:\n      seq: \"{{{{ payload.seq }}}}\"\n      event: \"{{{{ payload.id }}}}\"\n      status: \"{{{{ payload.status }}}}\"\n"
        )
    };
    format!(
        "name: chaos\nsignature:\n  scheme: hmac\n  header: X-Signature\n  prefix: \"sha256=\"\n  secrets:\n    - env: CHAOS_SECRET\nkey:\n  pointer: /id\nordering:\n  entity: \"{{{{ payload.customer }}}}\"\n  version: \"{{{{ payload.seq }}}}\"\n  version_type: integer\ntargets:\n{}{}delivery:\n  attempts_max: 60\n  backoff_initial: 100ms\n  backoff_max: 2s\n  jitter: 0.5\nretention: 1d\n",
        target("hubspot"),
        target("salesforce")
    )
}

/// HubSpot's budget in the run, per rolling second: the fake lets everything through and counts
/// the calls of every second, which must never exceed it, across processes, kills and
/// outages.
const HUBSPOT_BUDGET_CALLS: usize = 40;

fn instances_yaml(hubspot: &str, salesforce: &str) -> String {
    format!(
        "connectors:\n  - name: hubspot\n    kind: hubspot\n    settings: {{ base_url: \"{hubspot}\" }}\n    credentials: {{ token: {{ env: HUBSPOT_TOKEN }} }}\n    limits: {{ rate: {{ calls: {HUBSPOT_BUDGET_CALLS}, per: 1s }} }}\n  - name: salesforce\n    kind: salesforce\n    settings: {{ login_url: \"{salesforce}\", api_version: \"60.0\" }}\n    credentials:\n      client_id: {{ env: SALESFORCE_CLIENT_ID }}\n      client_secret: {{ env: SALESFORCE_CLIENT_SECRET }}\n"
    )
}

/// The faults each fake injects; lost answers outlast the gateways' call timeout.
fn chaos(seed: u64) -> Chaos {
    Chaos {
        seed,
        write_failure_rate: 0.08,
        lost_answer_rate: 0.05,
        lost_answer_delay: Duration::from_secs(3),
        lookup_failure_rate: 0.2,
        lookup_timeout_rate: 0.03,
        rate_limit_burst_rate: 0.004,
        rate_limit_burst_length: 8,
        latency_max: Duration::from_millis(20),
    }
}

async fn run_backend(binary: &Path, options: &Options, backend: Backend) -> Result<RunReport> {
    hookgate_connector_http::install_crypto_provider();
    let name = match backend {
        Backend::Postgres => "postgres",
        Backend::Sqlite => "sqlite",
    };
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(options.seed);
    let dir = tempfile::tempdir()?;
    let logs = gateways::logs_dir(&options.out, name)?;

    let hubspot = FakeHubSpot::start().await;
    {
        let mut state = hubspot.lock();
        state.token = HUBSPOT_TOKEN.into();
        state.unique_properties.insert("customers".into(), ["customer_id".to_owned()].into());
        state.max_per_window = usize::MAX;
        state.window_length = Duration::from_secs(1);
    }
    hubspot.set_chaos(chaos(options.seed ^ 0x4855_4253));
    let salesforce = FakeSalesforce::start().await;
    {
        let mut state = salesforce.lock();
        state.client_id = SALESFORCE_CLIENT_ID.into();
        state.client_secret = SALESFORCE_CLIENT_SECRET.into();
        state.objects.insert("customers".into());
        state.daily_limit = u64::MAX;
    }
    salesforce.set_chaos(chaos(options.seed ^ 0x5346_4443));

    let pipelines = dir.path().join("chaos.yaml");
    std::fs::write(&pipelines, pipeline_yaml())?;
    let instances = dir.path().join("hookgate.yaml");
    std::fs::write(&instances, instances_yaml(&hubspot.base_url, &salesforce.base_url))?;

    let (direct_url, proxy, processes) = match backend {
        Backend::Postgres => {
            let url = hookgate_store::testing::fresh_postgres_database().await;
            let proxy = match options.postgres_fault {
                PostgresFault::Cut => {
                    let server = server_address(&url).context("the database URL's server")?;
                    let upstream = tokio::net::lookup_host(server)
                        .await?
                        .next()
                        .context("the database server's address")?;
                    Some(Proxy::start(upstream).await)
                }
                PostgresFault::Restart => None,
            };
            (url, proxy, options.processes)
        }
        Backend::Sqlite => (hookgate_store::testing::sqlite_url(dir.path()), None, 1),
    };
    // The gateways reach the database through the proxy, the harness directly.
    let gateway_url = match (&proxy, server_address(&direct_url)) {
        (Some(proxy), Some(server)) => direct_url.replacen(server, &proxy.address.to_string(), 1),
        _ => direct_url.clone(),
    };
    let launch = Launch {
        binary: binary.to_owned(),
        database_url: gateway_url,
        pipelines,
        instances,
        env: [
            ("CHAOS_SECRET", SECRET),
            ("HUBSPOT_TOKEN", HUBSPOT_TOKEN),
            ("SALESFORCE_CLIENT_ID", SALESFORCE_CLIENT_ID),
            ("SALESFORCE_CLIENT_SECRET", SALESFORCE_CLIENT_SECRET),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect(),
        args: GATEWAY_ARGS.iter().map(|a| (*a).to_owned()).collect(),
        logs,
    };
    let mut slots: Vec<Gateway> = gateways::free_ports(processes)?
        .into_iter()
        .enumerate()
        .map(|(index, port)| Gateway::new(index, port))
        .collect();
    for gateway in &mut slots {
        gateway.start(&launch)?;
    }
    let urls: Vec<String> = slots.iter().map(|g| format!("{}/hooks/chaos", g.url())).collect();
    let slots = Arc::new(Mutex::new(slots));

    let events = plan(options, &mut rng);
    let mut deliveries: Vec<usize> =
        events.iter().enumerate().flat_map(|(i, e)| (0..e.copies).map(move |_| i)).collect();
    deliveries.shuffle(&mut rng);
    println!(
        "\n{name}: {} events, {} deliveries, {processes} gateway process{}",
        events.len(),
        deliveries.len(),
        if processes == 1 { "" } else { "es" }
    );

    // Kills, from now until told to stop.
    let stop_kills = Arc::new(AtomicBool::new(false));
    let killer = {
        let (slots, launch, stop) = (Arc::clone(&slots), launch.clone(), Arc::clone(&stop_kills));
        let seed = options.seed;
        tokio::task::spawn_blocking(move || kill_at_random(&slots, &launch, &stop, seed))
    };

    // The operator: pauses and resumes intake and targets, and replays dead letters, from now
    // until the kills stop.
    let operator = {
        let (url, stop, seed) = (direct_url.clone(), Arc::clone(&stop_kills), options.seed);
        tokio::spawn(async move { operate(&url, &stop, seed).await })
    };

    // The senders, and the database outage once a third of the deliveries are answered.
    let progress = Arc::new(AtomicUsize::new(0));
    let outage = tokio::spawn(database_outage(
        backend,
        options.postgres_fault,
        proxy,
        Arc::clone(&progress),
        deliveries.len() / 3,
    ));
    let answers = send(&events, &deliveries, &urls, &progress, options).await;
    let outage = outage.await.context("the outage task")??;
    println!("  {name}: every delivery answered after {:.0} s", started.elapsed().as_secs_f64());

    // Drain: kills go on for a while, then stop; the rest must drain without them.
    let store = Store::connect(&direct_url, &StoreOptions::default()).await?;
    let drained_with_kills = drained(&store, KILLS_INTO_DRAIN).await;
    stop_kills.store(true, Ordering::SeqCst);
    let kills = killer.await.context("the killer")??;
    let operator = operator.await.context("the operator")??;
    let drained = drained_with_kills
        || drained(&store, Duration::from_secs(options.drain_timeout_secs)).await;
    println!(
        "  {name}: {} after {:.0} s, {kills} kills",
        if drained { "drained" } else { "NOT drained" },
        started.elapsed().as_secs_f64()
    );
    tokio::task::spawn_blocking(move || {
        for gateway in slots.lock().expect("gateways").iter_mut() {
            gateway.stop();
        }
    })
    .await?;
    let hookgate_items =
        store.item_states().await?.into_iter().map(|(state, n)| (state.to_string(), n)).collect();
    let orphaned_attempts = store.orphaned_attempts().await?;
    store.close().await;
    if backend == Backend::Postgres {
        hookgate_store::testing::drop_postgres_database(&direct_url).await;
    }

    let sent: Vec<SentEvent> = events
        .iter()
        .zip(&answers.per_event)
        .map(|(event, answered)| SentEvent {
            key: event.key.clone(),
            entity: event.entity.clone(),
            version: event.version,
            accepted: answered.accepted,
            acknowledged: answered.acknowledged,
        })
        .collect();
    let intake = verdict::judge_intake(&sent);
    let effects = |writes: Vec<(String, BTreeMap<String, String>)>| -> Vec<Effect> {
        writes
            .into_iter()
            .map(|(entity, fields)| Effect {
                entity,
                key: fields.get("event").cloned().unwrap_or_default(),
                version: fields.get("seq").and_then(|s| s.parse().ok()).unwrap_or(i64::MIN),
            })
            .collect()
    };
    let hubspot_log = effects(hubspot.writes().into_iter().map(|w| (w.id, w.properties)).collect());
    let salesforce_log =
        effects(salesforce.writes().into_iter().map(|w| (w.id, w.fields)).collect());
    let crms = BTreeMap::from([
        ("hubspot".to_owned(), verdict::judge_crm(&sent, &hubspot_log)),
        ("salesforce".to_owned(), verdict::judge_crm(&sent, &salesforce_log)),
    ]);
    let hubspot_calls_in_a_window_max = hubspot.call_counts().max_in_any_window;
    let holds = drained
        && orphaned_attempts == 0
        && hubspot_calls_in_a_window_max <= HUBSPOT_BUDGET_CALLS
        && intake.holds()
        && crms.values().all(CrmVerdict::holds);
    Ok(RunReport {
        backend,
        processes,
        seconds: started.elapsed().as_secs_f64(),
        deliveries: deliveries.len(),
        answers: answers.by_status,
        kills,
        operator,
        database_outage: outage,
        faults_injected: BTreeMap::from([
            ("hubspot".to_owned(), hubspot.injected()),
            ("salesforce".to_owned(), salesforce.injected()),
        ]),
        hookgate_items,
        orphaned_attempts,
        hubspot_calls_in_a_window_max,
        drained,
        intake,
        crms,
        holds,
    })
}

/// `host:port` of a `postgres://user@host:port/db` URL.
fn server_address(url: &str) -> Option<&str> {
    let rest = &url[url.find("://")? + 3..];
    let rest = rest.split('/').next()?;
    Some(rest.rsplit_once('@').map_or(rest, |(_, server)| server))
}

/// Kills a random gateway every 1–3 s and restarts it at once, until `stop`. Returns the
/// number of kills.
fn kill_at_random(
    slots: &Mutex<Vec<Gateway>>,
    launch: &Launch,
    stop: &AtomicBool,
    seed: u64,
) -> Result<usize> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x4b49_4c4c);
    let mut kills = 0;
    loop {
        let pause = Duration::from_millis(rng.random_range(1_000..=3_000));
        let until = Instant::now() + pause;
        while Instant::now() < until {
            if stop.load(Ordering::SeqCst) {
                return Ok(kills);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut slots = slots.lock().expect("gateways");
        let index = rng.random_range(0..slots.len());
        slots[index].kill();
        kills += 1;
        slots[index].start_until(launch, Instant::now() + RESTART_DEADLINE)?;
    }
}

/// Once `threshold` deliveries are answered, takes the database away for [`OUTAGE`] (on
/// PostgreSQL). Says what it did.
async fn database_outage(
    backend: Backend,
    fault: PostgresFault,
    proxy: Option<Proxy>,
    progress: Arc<AtomicUsize>,
    threshold: usize,
) -> Result<Option<String>> {
    if backend != Backend::Postgres {
        return Ok(None);
    }
    while progress.load(Ordering::SeqCst) < threshold {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let at = progress.load(Ordering::SeqCst);
    match (fault, proxy) {
        (PostgresFault::Cut, Some(proxy)) => {
            proxy.cut().await;
            tokio::time::sleep(OUTAGE).await;
            proxy.restore();
            // Keep the proxy up for the rest of the run.
            tokio::spawn(async move {
                let _proxy = proxy;
                std::future::pending::<()>().await;
            });
            Ok(Some(format!(
                "every connection cut for {} s after {at} deliveries",
                OUTAGE.as_secs()
            )))
        }
        (PostgresFault::Restart, _) => {
            let version = std::fs::read_dir("/etc/postgresql")
                .context("PostgreSQL's configuration directory")?
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .next()
                .context("a PostgreSQL cluster")?;
            let started = Instant::now();
            let status = tokio::process::Command::new("pg_ctlcluster")
                .args(["--skip-systemctl-redirect", &version, "main", "restart"])
                .status()
                .await
                .context("pg_ctlcluster")?;
            if !status.success() {
                bail!("the PostgreSQL restart failed: {status}");
            }
            Ok(Some(format!(
                "PostgreSQL {version} restarted after {at} deliveries ({:.1} s)",
                started.elapsed().as_secs_f64()
            )))
        }
        (PostgresFault::Cut, None) => bail!("no proxy to cut"),
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Answered {
    accepted: u32,
    acknowledged: bool,
}

struct Answers {
    per_event: Vec<Answered>,
    by_status: BTreeMap<String, usize>,
}

/// Sends every delivery at `options.rate` per second, [`SENDERS`] at a time, each to a random
/// gateway, retrying 5xx answers and connection errors with backoff, as a real sender would.
async fn send(
    events: &[PlannedEvent],
    deliveries: &[usize],
    urls: &[String],
    progress: &Arc<AtomicUsize>,
    options: &Options,
) -> Answers {
    let seed = options.seed;
    let interval = Duration::from_secs(1) / options.rate.max(1);
    let start = tokio::time::Instant::now();
    let deliveries: Vec<(usize, tokio::time::Instant)> = deliveries
        .iter()
        .enumerate()
        .map(|(n, event)| (*event, start + interval * u32::try_from(n).unwrap_or(u32::MAX)))
        .collect();
    let client = reqwest::Client::builder().timeout(REQUEST_TIMEOUT).build().expect("a client");
    let events = Arc::new(events.to_vec());
    let queue = Arc::new(Mutex::new(deliveries.iter().rev().copied().collect::<Vec<_>>()));
    let answers = Arc::new(Mutex::new(Answers {
        per_event: vec![Answered::default(); events.len()],
        by_status: BTreeMap::new(),
    }));
    let senders: Vec<_> = (0..SENDERS)
        .map(|n| {
            let (client, events, queue, answers, progress, urls) = (
                client.clone(),
                Arc::clone(&events),
                Arc::clone(&queue),
                Arc::clone(&answers),
                Arc::clone(progress),
                urls.to_vec(),
            );
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(seed ^ (n as u64) << 32);
                loop {
                    let Some((index, due)) = queue.lock().expect("queue").pop() else { return };
                    tokio::time::sleep_until(due).await;
                    deliver(&client, &events[index], index, &urls, &answers, &mut rng).await;
                    progress.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for sender in senders {
        let _ = sender.await;
    }
    let answers = answers.lock().expect("answers");
    Answers { per_event: answers.per_event.clone(), by_status: answers.by_status.clone() }
}

async fn deliver(
    client: &reqwest::Client,
    event: &PlannedEvent,
    index: usize,
    urls: &[String],
    answers: &Mutex<Answers>,
    rng: &mut StdRng,
) {
    let give_up = Instant::now() + DELIVERY_GIVE_UP;
    let mut backoff = Duration::from_millis(50);
    while Instant::now() < give_up {
        let url = &urls[rng.random_range(0..urls.len())];
        let result = client
            .post(url)
            .header("X-Signature", &event.signature)
            .header("Content-Type", "application/json")
            .body(event.body.clone())
            .send()
            .await;
        let (label, retry_after) = match &result {
            Ok(response) => {
                let retry_after = response
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok())
                    .map(Duration::from_secs);
                (response.status().as_u16().to_string(), retry_after)
            }
            Err(_) => ("connection".to_owned(), None),
        };
        let status = result.as_ref().map(|r| r.status().as_u16()).unwrap_or(0);
        {
            let mut answers = answers.lock().expect("answers");
            *answers.by_status.entry(label).or_default() += 1;
            let answered = &mut answers.per_event[index];
            if status == 202 {
                answered.accepted += 1;
            }
            if (200..300).contains(&status) {
                answered.acknowledged = true;
            }
        }
        if status != 0 && status < 500 {
            return;
        }
        let jitter = rng.random_range(0.5..1.0);
        let wait = retry_after.map(|r| r.min(RETRY_AFTER_MAX)).unwrap_or(backoff.mul_f64(jitter));
        tokio::time::sleep(wait).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

/// Waits until no write is left to do, or `timeout` passes.
/// An operator at work during the faults, through the store as the admin API does: every
/// 1–3 s a target's delivery is paused for 0.5–2 s, or the pipeline's intake for 0.5–1 s
/// (senders get 503 and retry), or every dead letter is replayed. Everything is resumed
/// when `stop` is set. Returns how many of each action were taken.
async fn operate(url: &str, stop: &AtomicBool, seed: u64) -> Result<BTreeMap<String, usize>> {
    let store = Store::connect(url, &StoreOptions::default()).await?;
    let mut rng = StdRng::seed_from_u64(seed ^ 0x4f50_4552);
    let mut actions: BTreeMap<String, usize> = BTreeMap::new();
    let now = || {
        i64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis(),
        )
        .unwrap_or(i64::MAX)
    };
    while !stop.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(rng.random_range(1000..3000))).await;
        let roll: f64 = rng.random();
        // Each action is taken through a database that may be cut off: a failed one is
        // skipped, as an operator would retry it.
        let pause = |kind: PauseKind, target: &str| Pause {
            pipeline: "chaos".into(),
            kind,
            target: target.into(),
            paused_at_ms: now(),
            reason: Some("chaos operator".into()),
        };
        if roll < 0.4 {
            let target = if rng.random_bool(0.5) { "hubspot" } else { "salesforce" };
            if store.pause(&pause(PauseKind::Delivery, target)).await.is_ok() {
                *actions.entry(format!("pause delivery to {target}")).or_default() += 1;
            }
            tokio::time::sleep(Duration::from_millis(rng.random_range(500..2000))).await;
            let _ = store.resume("chaos", PauseKind::Delivery, target).await;
        } else if roll < 0.6 {
            if store.pause(&pause(PauseKind::Intake, "")).await.is_ok() {
                *actions.entry("pause intake".into()).or_default() += 1;
            }
            tokio::time::sleep(Duration::from_millis(rng.random_range(500..1000))).await;
            let _ = store.resume("chaos", PauseKind::Intake, "").await;
        } else {
            let filter = ReplayFilter { limit: 1000, ..ReplayFilter::default() };
            let Ok(dead) = store.dead_events_matching(&filter).await else { continue };
            for event in dead {
                if let Ok(Replay::Queued(n)) = store.replay_event_writes(event, None, now()).await {
                    *actions.entry("writes replayed".into()).or_default() += n as usize;
                }
            }
            *actions.entry("replay passes".into()).or_default() += 1;
        }
    }
    // Nothing stays paused: the drain must finish on its own. Retried, since the database
    // may just be coming back.
    for _ in 0..60 {
        let resumed = async {
            for pause in store.pauses().await? {
                store.resume(&pause.pipeline, pause.kind, &pause.target).await?;
            }
            anyhow::Ok(store.pauses().await?.is_empty())
        };
        if matches!(resumed.await, Ok(true)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    store.close().await;
    Ok(actions)
}

async fn drained(store: &Store, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(0) = store.unfinished_items().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn print_run(run: &RunReport) {
    let answers: Vec<String> = run.answers.iter().map(|(s, n)| format!("{s}: {n}")).collect();
    println!(
        "  answers {}; outage: {}",
        answers.join(", "),
        run.database_outage.as_deref().unwrap_or("none")
    );
    let operator: Vec<String> = run.operator.iter().map(|(a, n)| format!("{a}: {n}")).collect();
    println!("  operator: {}", operator.join(", "));
    let items: Vec<String> = run.hookgate_items.iter().map(|(s, n)| format!("{s} {n}")).collect();
    println!(
        "  hookgate's writes: {}; attempts naming no item: {}",
        items.join(", "),
        run.orphaned_attempts
    );
    for (crm, verdict) in &run.crms {
        let faults: u64 = run.faults_injected.get(crm).map(|f| f.values().sum()).unwrap_or(0);
        println!(
            "  {crm:<11} {} effects on {} records ({faults} faults injected): lost {}, duplicate effects {}, stale overwrites {}, unacknowledged {}",
            verdict.effects,
            verdict.records,
            verdict.lost,
            verdict.duplicate_effects,
            verdict.stale_overwrites,
            verdict.unacknowledged_effects
        );
    }
    println!(
        "  budget      hubspot: at most {} calls in any rolling second (budget {HUBSPOT_BUDGET_CALLS})",
        run.hubspot_calls_in_a_window_max
    );
    println!(
        "  intake      {} events, {} acknowledged: accepted twice {}, never acknowledged {}",
        run.intake.events,
        run.intake.acknowledged,
        run.intake.accepted_twice,
        run.intake.never_acknowledged
    );
    println!(
        "  {:?}: {} in {:.0} s",
        run.backend,
        if run.holds { "held" } else { "VIOLATED" },
        run.seconds
    );
}
