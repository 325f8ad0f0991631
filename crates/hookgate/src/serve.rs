//! `hookgate serve` and `hookgate work`: load and check the configuration (refusing to start on
//! any error or unset secret), connect to the store, then run the intake server, the delivery
//! workers and the retention sweeper until SIGTERM or Ctrl-C.

use std::collections::BTreeSet;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use base64::Engine as _;
use hookgate_connector::Secret;
use hookgate_connector_http::{HttpSettings, HttpSourceFetcher};
use hookgate_engine::{
    FetchError, Gateway, KeyFetcher, ServedPipeline, Sources, Worker, WorkerConfig, now_ms,
};
use hookgate_pipeline::Instances;
use hookgate_pipeline::model::{RefreshAuth, SecretRef};
use hookgate_server::ServerConfig;
use hookgate_store::{Store, StoreOptions};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::check::{self, Options, SecretPolicy};
use crate::payloads::{SharedViews, Views};
use crate::{connectors, secrets};

/// Beyond the server's shutdown timeout, the time left to close the store before exiting.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// How often retention runs.
const SWEEP_INTERVAL: Duration = Duration::from_secs(60);
/// How often the metrics recorder drains its histograms (nothing else drives it: we serve
/// `/metrics` ourselves instead of the exporter's listener).
const METRICS_UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Seconds: intake latency buckets, from a fast commit to a slow database.
const INTAKE_BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0];

/// The process's metrics recorder, installed on first use.
/// CRM calls take from milliseconds (a mock) to the call timeout (30 s by default).
const CRM_CALL_BUCKETS: &[f64] =
    &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

fn metrics_handle() -> Option<PrometheusHandle> {
    static HANDLE: std::sync::OnceLock<Option<PrometheusHandle>> = std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("hookgate_intake_seconds".into()),
                    INTAKE_BUCKETS,
                )
                .ok()?
                .set_buckets_for_metric(
                    Matcher::Full("hookgate_crm_call_seconds".into()),
                    CRM_CALL_BUCKETS,
                )
                .ok()?
                .install_recorder()
                .ok()
        })
        .clone()
}

#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub database_url: String,
    /// Where intake listens; `None` runs workers only (`hookgate work`).
    pub listen: Option<SocketAddr>,
    pub pipelines: Vec<PathBuf>,
    pub instances: PathBuf,
    pub server: ServerConfig,
    pub store: StoreOptions,
    /// `None` runs intake only (`serve --workers 0`).
    pub workers: Option<WorkerConfig>,
    /// Group commit at intake; `None`: a transaction per delivery.
    pub group_commit: Option<hookgate_engine::GroupCommitConfig>,
    pub resolver: secrets::Resolver,
    /// The admin listener (API and console); `None`: not started.
    pub admin: Option<crate::admin::AdminConfig>,
    /// Reload when a configuration file changes, as on SIGHUP.
    pub watch: bool,
}

/// A running gateway: intake, workers and sweeper, stopped together.
#[derive(Debug)]
pub struct Running {
    pub address: Option<SocketAddr>,
    /// Where the admin listener listens, if it was started.
    pub admin_address: Option<SocketAddr>,
    pub gateway: Gateway,
    pub instances: Instances,
    /// The workers, whose connector instances a reload replaces.
    worker: Option<Worker>,
    /// What the admin listener shows payloads with (keys, `redact`), if it runs.
    views: Option<SharedViews>,
    options: ServeOptions,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// Loads the configuration again and, if it is sound, serves it from now on: pipelines,
    /// connector instances and sources. A configuration with any error is refused whole and
    /// the running one keeps serving. Work in hand finishes on the configuration it began
    /// under; the payload keys, the database and the listeners are not reloaded.
    pub async fn reload(&mut self) -> Result<Vec<String>, ConfigurationRefused> {
        let loaded = load_configuration(&self.options)?;
        let names: Vec<String> = loaded.served.iter().map(|p| p.compiled.name.clone()).collect();
        if let (Some(worker), Some(config)) = (&self.worker, &self.options.workers) {
            let refused = |error: anyhow::Error| ConfigurationRefused {
                summary: format!("{error:#}"),
                diagnostics: Vec::new(),
            };
            let connectors = loaded
                .registry
                .build(&loaded.instances, &self.options.resolver, config.call_timeout)
                .await
                .map_err(refused)?;
            update_only_honoured(loaded.served.iter().map(|p| &p.compiled), &connectors)
                .map_err(refused)?;
            let sources = sources(loaded.served.iter(), &loaded.instances, &self.options.resolver)
                .map_err(refused)?;
            let limits = loaded.registry.limits(&loaded.instances);
            self.gateway.replace_pipelines(loaded.served);
            worker.replace(connectors, limits, sources);
        } else {
            self.gateway.replace_pipelines(loaded.served);
        }
        self.instances = loaded.instances;
        if let Some(views) = &self.views {
            views.replace(views_of(&self.options));
        }
        Ok(names)
    }

    /// Stops accepting, lets requests and CRM calls in flight finish, then closes the store.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
        // The gateway's intake committers hold a connection while they run; they stop once
        // the last gateway handle is gone, and the pool closes when every connection is back.
        let store = self.gateway.store().clone();
        drop(self.gateway);
        store.close().await;
    }
}

async fn stopped(mut receiver: watch::Receiver<bool>) {
    let _ = receiver.wait_for(|stop| *stop).await;
}

/// Builds everything and starts the tasks.
pub async fn start(options: ServeOptions) -> Result<Running> {
    let (gateway, instances, registry) = build_gateway(&options).await?;
    let (stop, receiver) = watch::channel(false);
    let mut tasks = Vec::new();
    let mut address = None;

    let metrics = metrics_handle();
    if let Some(handle) = metrics.clone() {
        let shutdown = stopped(receiver.clone());
        tasks.push(tokio::spawn(async move {
            let mut shutdown = std::pin::pin!(shutdown);
            loop {
                tokio::select! {
                    () = &mut shutdown => return,
                    () = tokio::time::sleep(METRICS_UPKEEP_INTERVAL) => handle.run_upkeep(),
                }
            }
        }));
    }
    let mut admin_address = None;
    let mut shared_views = None;
    {
        // Paused pipelines are refused from the first delivery on, then kept in step with
        // what other gateways on this database change; writes of paused targets are parked
        // as they arrive, and put back once resumed.
        gateway.refresh_pauses().await.context("cannot read the pauses from the store")?;
        let (gateway, shutdown) = (gateway.clone(), stopped(receiver.clone()));
        tasks.push(tokio::spawn(async move {
            let mut shutdown = std::pin::pin!(shutdown);
            let mut after_id: i64 = 0;
            let mut failing = false;
            loop {
                tokio::select! {
                    () = &mut shutdown => return,
                    () = tokio::time::sleep(hookgate_engine::PAUSE_REFRESH) => {}
                }
                let kept = async {
                    let pauses = gateway.refresh_pauses().await?;
                    // A margin below the last id seen: PostgreSQL commits ids out of order.
                    let from = after_id.saturating_sub(PARK_ID_MARGIN);
                    after_id = gateway.store().maintain_pauses(from, &pauses).await?;
                    Ok::<_, hookgate_store::StoreError>(())
                };
                match kept.await {
                    Ok(()) => failing = false,
                    // Once per outage, not once a second.
                    Err(error) if !failing => {
                        failing = true;
                        tracing::warn!(%error, "cannot read the pauses: the last ones read stay in force");
                    }
                    Err(_) => {}
                }
            }
        }));
    }
    if let Some(admin) = &options.admin {
        let listener = tokio::net::TcpListener::bind(admin.listen)
            .await
            .with_context(|| format!("cannot listen on {} (the admin listener)", admin.listen))?;
        admin_address = Some(listener.local_addr()?);
        let views = SharedViews::new(views_of(&options));
        shared_views = Some(views.clone());
        let app = crate::admin::router(gateway.clone(), views, &admin.token);
        let limits = options.server.clone();
        let shutdown = stopped(receiver.clone());
        tasks.push(tokio::spawn(async move {
            if let Err(error) = hookgate_server::serve_app(listener, app, &limits, shutdown).await {
                tracing::error!(%error, "the admin server failed");
            }
        }));
    }
    if let Some(listen) = options.listen {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen}"))?;
        address = Some(listener.local_addr()?);
        let config = ServerConfig { metrics, ..options.server.clone() };
        tasks.push(tokio::spawn(write_refusals(gateway.clone(), stopped(receiver.clone()))));
        let (gateway, shutdown) = (gateway.clone(), stopped(receiver.clone()));
        tasks.push(tokio::spawn(async move {
            if let Err(error) = hookgate_server::serve(listener, gateway, config, shutdown).await {
                tracing::error!(%error, "the intake server failed");
            }
        }));
    }
    let mut worker_handle = None;
    if let Some(config) = options.workers.clone() {
        let connectors = registry.build(&instances, &options.resolver, config.call_timeout).await?;
        let served = gateway.pipelines();
        update_only_honoured(served.iter().map(|p| &p.compiled), &connectors)?;
        let sources = sources(gateway.pipelines(), &instances, &options.resolver)?;
        let limits = registry.limits(&instances);
        let worker = Worker::new(gateway.clone(), connectors, limits, config).with_sources(sources);
        worker_handle = Some(worker.clone());
        tasks.push(tokio::spawn(worker.run(stopped(receiver.clone()))));
        tasks.push(tokio::spawn(sweep(gateway.clone(), stopped(receiver.clone()))));
    }
    let names = gateway.pipeline_names();
    // Plain values, not Debug output: `address=127.0.0.1:8080`, not `address=Some(...)`.
    let listening = address.map_or_else(|| "-".to_owned(), |a| a.to_string());
    tracing::info!(
        address = %listening,
        backend = gateway.store().backend(),
        pipelines = %names.join(","),
        workers = options.workers.is_some(),
        "started"
    );
    Ok(Running {
        address,
        admin_address,
        gateway,
        instances,
        worker: worker_handle,
        views: shared_views,
        options,
        stop,
        tasks,
    })
}

/// Runs until SIGTERM or Ctrl-C.
pub async fn run(options: ServeOptions) -> Result<()> {
    let shutdown_timeout = options.server.shutdown_timeout;
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("cannot listen for SIGHUP")?;
    let mut running = start(options).await?;
    if let Some(address) = running.address {
        // Tests and scripts read this line to learn the bound port (`--listen 127.0.0.1:0`).
        println!("hookgate listening on http://{address}");
        if let Some(admin) = running.admin_address {
            println!("hookgate admin on http://{admin}");
        }
    } else {
        println!("hookgate working");
    }
    // `--watch`: the files as last seen, and a change seen once, taken when two polls agree
    // (an editor that writes a file in two steps is not reloaded half-way).
    let mut seen = running.options.watch.then(|| config_files(&running.options));
    let mut changed: Option<Vec<FileStamp>> = None;
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = hangup.recv() => {
                reload_logged(&mut running, "SIGHUP").await;
                if seen.is_some() {
                    seen = Some(config_files(&running.options));
                    changed = None;
                }
            }
            () = tokio::time::sleep(WATCH_INTERVAL), if seen.is_some() => {
                let now = config_files(&running.options);
                if changed.as_ref() == Some(&now) {
                    changed = None;
                    seen = Some(now);
                    reload_logged(&mut running, "a configuration file changed").await;
                } else if seen.as_ref() != Some(&now) {
                    changed = Some(now);
                }
            }
        }
    }
    // Connections have this long (the server enforces it); workers get the same, and a CRM
    // call cut off here is in doubt, reconciled by whichever worker takes its entity next.
    let deadline = shutdown_timeout + SHUTDOWN_GRACE;
    if tokio::time::timeout(deadline, running.stop()).await.is_err() {
        tracing::warn!(?deadline, "still busy at the shutdown deadline: exiting anyway");
    }
    tracing::info!("stopped");
    Ok(())
}

/// The views of the configuration `options` name: payload keys and each pipeline's `redact`.
fn views_of(options: &ServeOptions) -> Views {
    Views::load(&Options {
        paths: options.pipelines.clone(),
        instances: options.instances.clone(),
        secrets: SecretPolicy::Allow,
        resolver: options.resolver.clone(),
    })
}

/// Writes created up to this many ids below the last one seen are looked at again for
/// parking: a transaction that took its ids earlier may commit later.
const PARK_ID_MARGIN: i64 = 10_000;

/// How often `--watch` looks at the configuration files.
const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// A configuration file as `--watch` compares it: path, modification time and length (none
/// when it cannot be read).
type FileStamp = (PathBuf, Option<(std::time::SystemTime, u64)>);

/// The instances file, each pipeline path, and the files of each pipeline directory.
fn config_files(options: &ServeOptions) -> Vec<FileStamp> {
    let stamp = |path: &std::path::Path| {
        std::fs::metadata(path)
            .ok()
            .map(|m| (m.modified().unwrap_or(std::time::UNIX_EPOCH), m.len()))
    };
    let mut files = vec![(options.instances.clone(), stamp(&options.instances))];
    for path in &options.pipelines {
        files.push((path.clone(), stamp(path)));
        if let Ok(entries) = std::fs::read_dir(path) {
            for entry in entries.flatten() {
                let path = entry.path();
                files.push((path.clone(), stamp(&path)));
            }
        }
    }
    files.sort();
    files
}

/// Reloads, and says what came of it in the log and in `hookgate_config_reloads_total`.
async fn reload_logged(running: &mut Running, trigger: &'static str) {
    match running.reload().await {
        Ok(names) => {
            metrics::counter!("hookgate_config_reloads_total", "outcome" => "applied").increment(1);
            tracing::info!(trigger, pipelines = %names.join(","), "configuration reloaded");
        }
        Err(refused) => {
            metrics::counter!("hookgate_config_reloads_total", "outcome" => "refused").increment(1);
            for diagnostic in &refused.diagnostics {
                tracing::error!(trigger, %diagnostic, "reload refused");
            }
            tracing::error!(
                trigger,
                reason = %refused.summary,
                "reload refused: still serving the previous configuration"
            );
        }
    }
}

/// Deletes what is past each pipeline's retention.
/// Writes the signature refusals intake counted, every [`REFUSALS_FLUSH`] and once more at
/// shutdown. (A 401 answered after that last write, while requests in flight drain, is
/// counted in the metrics only.)
async fn write_refusals(gateway: Gateway, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    let mut failing = false;
    loop {
        let stopping = tokio::select! {
            () = &mut shutdown => true,
            () = tokio::time::sleep(hookgate_engine::REFUSALS_FLUSH) => false,
        };
        match gateway.flush_refusals().await {
            Ok(()) => failing = false,
            Err(error) => {
                if !failing {
                    tracing::warn!(%error, "cannot write the signature refusals counted; kept for the next try");
                }
                failing = true;
            }
        }
        if stopping {
            return;
        }
    }
}

async fn sweep(gateway: Gateway, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    loop {
        let now = now_ms();
        for pipeline in gateway.pipelines() {
            let retention =
                i64::try_from(pipeline.compiled.retention.as_millis()).unwrap_or(i64::MAX);
            // Batch after batch, while they come full. A shutdown stops it, mid-batch if need
            // be: a batch cut short rolls back, and the next start sweeps it.
            loop {
                let swept = tokio::select! {
                    () = &mut shutdown => return,
                    swept = gateway.store().sweep(&pipeline.compiled.name, now.saturating_sub(retention)) => swept,
                };
                match swept {
                    Ok(0) => break,
                    Ok(deleted) => {
                        tracing::info!(pipeline = %pipeline.compiled.name, deleted, "retention sweep");
                        if i64::try_from(deleted).unwrap_or(0) < hookgate_store::SWEEP_BATCH {
                            break;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, "retention sweep failed");
                        break;
                    }
                }
            }
            if let Some(payload_retention) = pipeline.compiled.payload_retention {
                purge_payloads(&gateway, &pipeline.compiled.name, now, payload_retention).await;
            }
        }
        tokio::select! {
            () = &mut shutdown => return,
            () = tokio::time::sleep(SWEEP_INTERVAL) => {}
        }
    }
}

/// The source fetcher and each refreshing target's credentials, resolved now: a missing
/// secret stops the start, not the first write.
fn sources(
    pipelines: impl IntoIterator<Item = impl std::ops::Deref<Target = ServedPipeline>>,
    instances: &Instances,
    resolver: &secrets::Resolver,
) -> Result<Sources> {
    let mut sources = Sources {
        origins: instances.source_origins.clone().into_iter().collect(),
        ..Sources::default()
    };
    for pipeline in pipelines {
        for target in &pipeline.compiled.targets {
            let Some(refresh) = &target.refresh else { continue };
            if sources.fetcher.is_none() {
                sources.fetcher = Some(Arc::new(HttpSourceFetcher::new()?));
            }
            let context = || {
                format!(
                    "pipeline `{}`, target `{}`: refresh auth",
                    pipeline.compiled.name, target.name
                )
            };
            let text = |reference: &SecretRef| -> Result<String> {
                let secret = resolver.resolve(reference).with_context(context)?;
                String::from_utf8(secret.expose().to_vec())
                    .map_err(|_| anyhow::anyhow!("{reference} is not UTF-8 text"))
                    .with_context(context)
            };
            let mut headers = Vec::new();
            for (name, reference) in &refresh.secret_headers {
                headers.push((name.clone(), text(reference)?));
            }
            headers.extend(match &refresh.auth {
                None => Vec::new(),
                Some(RefreshAuth::Bearer(token)) => {
                    vec![("authorization".to_owned(), format!("Bearer {}", text(token)?))]
                }
                Some(RefreshAuth::Basic { username, password }) => {
                    let username = username.as_ref().map(&text).transpose()?.unwrap_or_default();
                    let password = password.as_ref().map(&text).transpose()?.unwrap_or_default();
                    let pair = base64::engine::general_purpose::STANDARD
                        .encode(format!("{username}:{password}"));
                    vec![("authorization".to_owned(), format!("Basic {pair}"))]
                }
                Some(RefreshAuth::ApiKey { header, secret }) => {
                    vec![(header.clone(), text(secret)?)]
                }
            });
            if headers.is_empty() {
                continue;
            }
            let headers = headers.into_iter().map(|(n, v)| (n, Secret::new(v))).collect();
            sources.auth.insert((pipeline.compiled.name.clone(), target.name.clone()), headers);
        }
    }
    Ok(sources)
}

/// Deletes the payloads of `pipeline` older than `payload_retention`, a batch at a time.
async fn purge_payloads(gateway: &Gateway, pipeline: &str, now: i64, payload_retention: Duration) {
    let age = i64::try_from(payload_retention.as_millis()).unwrap_or(i64::MAX);
    let (mut events, mut deliveries) = (0, 0);
    loop {
        match gateway.store().purge_payloads(pipeline, now.saturating_sub(age), now).await {
            Ok(purged) => {
                events += purged.events;
                deliveries += purged.deliveries;
                if !purged.full() {
                    break;
                }
            }
            Err(error) => {
                tracing::warn!(%error, pipeline, "payload retention sweep failed");
                break;
            }
        }
    }
    if events + deliveries > 0 {
        tracing::info!(
            pipeline,
            events,
            deliveries,
            "payload retention sweep: bodies and headers deleted"
        );
    }
}

/// The configuration as `serve` runs it: pipelines ready to serve, connector instances (only
/// those the pipelines write to) and the registry that builds them. Any error refuses it,
/// with every diagnostic.
struct Loaded {
    served: Vec<ServedPipeline>,
    instances: Instances,
    registry: connectors::Registry,
}

fn load_configuration(options: &ServeOptions) -> Result<Loaded, ConfigurationRefused> {
    let project = check::load(&Options {
        paths: options.pipelines.clone(),
        instances: options.instances.clone(),
        secrets: SecretPolicy::Require,
        resolver: options.resolver.clone(),
    });
    let refused =
        |summary: String, diagnostics: Vec<String>| ConfigurationRefused { summary, diagnostics };
    if project.has_errors() {
        let diagnostics = project.diagnostics.iter().map(ToString::to_string).collect();
        return Err(refused(
            "the configuration has errors; `hookgate check` reports the same".into(),
            diagnostics,
        ));
    }
    let Some(instances) = project.instances else {
        return Err(refused("no connector instances".into(), Vec::new()));
    };
    let registry = project.registry;
    if project.pipelines.is_empty() {
        return Err(refused(format!("no pipelines found in {:?}", options.pipelines), Vec::new()));
    }
    let mut served = Vec::new();
    // Only these connector instances are built: the others' credentials are not needed.
    let used: BTreeSet<String> = project
        .pipelines
        .iter()
        .flat_map(|p| p.compiled.targets.iter().map(|t| t.connector.clone()))
        .collect();
    let mut instances = instances;
    instances.connectors.retain(|name, _| used.contains(name));
    for loaded in project.pipelines {
        let compiled = loaded.compiled;
        let name = compiled.name.clone();
        let unusable =
            |error: anyhow::Error| refused(format!("pipeline `{name}`: {error:#}"), Vec::new());
        let secrets = compiled
            .secrets
            .iter()
            .map(|(reference, _)| options.resolver.resolve(reference))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| unusable(e.into()))?;
        // With `fetch_keys`, deliveries name their key and configured secrets are optional.
        let verifier = if secrets.is_empty() && compiled.key_fetch.is_some() {
            None
        } else {
            Some(
                compiled
                    .verifier(&secrets)
                    .map_err(|e| unusable(anyhow::anyhow!("unusable secret: {e}")))?,
            )
        };
        let fetcher = match compiled.key_fetch {
            Some(_) => {
                Some(Arc::new(HttpKeyFetcher::new().map_err(unusable)?) as Arc<dyn KeyFetcher>)
            }
            None => None,
        };
        served.push(ServedPipeline::with_keys(compiled, verifier, fetcher));
    }
    Ok(Loaded { served, instances, registry })
}

/// Refuses a target that is update-only whose connector instance does not say it can write
/// without creating (`capabilities.update_only`): its writes could create the records the
/// target says must already exist. (The workers dead-letter such a write too, unsent.)
fn update_only_honoured<'a>(
    pipelines: impl Iterator<Item = &'a hookgate_pipeline::CompiledPipeline>,
    connectors: &hookgate_engine::Connectors,
) -> Result<()> {
    for pipeline in pipelines {
        for target in &pipeline.targets {
            let Some(connector) = connectors.get(&target.connector) else { continue };
            if target.operation == hookgate_pipeline::model::Operation::UpdateOnly
                && !connector.describe().capabilities.update_only
            {
                anyhow::bail!(
                    "{}: target `{}` is `operation: update_only`, and connector instance `{}` ({}) does not declare \
                     that it can write without creating (capabilities.update_only): its writes could create records",
                    pipeline.file,
                    target.name,
                    target.connector,
                    connector.describe().kind
                );
            }
        }
    }
    Ok(())
}

/// Why a configuration was not taken: a summary and each diagnostic, rendered.
#[derive(Debug, thiserror::Error)]
#[error("{summary}")]
pub struct ConfigurationRefused {
    pub summary: String,
    pub diagnostics: Vec<String>,
}

async fn build_gateway(
    options: &ServeOptions,
) -> Result<(Gateway, Instances, connectors::Registry)> {
    let loaded = match load_configuration(options) {
        Ok(loaded) => loaded,
        Err(refused) => {
            for diagnostic in &refused.diagnostics {
                eprintln!("{diagnostic}");
            }
            return Err(refused.into());
        }
    };
    let Loaded { served, instances, registry } = loaded;
    let keyring = crate::payloads::keyring(&instances, &options.resolver)?;
    let store = open_store(&options.database_url, &options.store).await?;
    let gateway = Gateway::new(store, served);
    let gateway = match keyring {
        Some(keyring) => gateway.with_keyring(keyring),
        None => gateway,
    };
    let gateway = match options.group_commit {
        Some(config) if options.listen.is_some() => gateway.with_group_commit(config),
        _ => gateway,
    };
    Ok((gateway, instances, registry))
}

pub async fn open_store(url: &str, options: &StoreOptions) -> Result<Store> {
    Store::connect(url, options)
        .await
        .with_context(|| format!("cannot open the store at {}", redact_url(url)))
}

/// A database URL without its password, for messages: the `user:password@` form and a
/// `password=` query parameter are both masked.
pub fn redact_url(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let mut out = match (base.find("://"), base.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let credentials = &base[scheme_end + 3..at];
            match credentials.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &base[..scheme_end + 3], &base[at..]),
                None => base.to_owned(),
            }
        }
        _ => base.to_owned(),
    };
    if let Some(query) = query {
        let parameters: Vec<String> = query
            .split('&')
            .map(|parameter| match parameter.split_once('=') {
                Some((name, _)) if name.eq_ignore_ascii_case("password") => format!("{name}=***"),
                _ => parameter.to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&parameters.join("&"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_are_masked_wherever_the_url_carries_them() {
        assert_eq!(redact_url("postgres://u:s3cret@h/db"), "postgres://u:***@h/db");
        assert_eq!(
            redact_url("postgres://u@h/db?sslmode=require&password=s3cret"),
            "postgres://u@h/db?sslmode=require&password=***"
        );
        assert_eq!(redact_url("mysql://root:s3cret@h/db"), "mysql://root:***@h/db");
        assert_eq!(redact_url("sqlite://hookgate.db"), "sqlite://hookgate.db");
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutdown requested: finishing requests and calls in flight");
}

/// Signing keys fetched over the shared outbound HTTP client: short timeouts and a small
/// bound, since a key is a few kilobytes and the sender waits for the answer.
#[derive(Debug)]
struct HttpKeyFetcher {
    client: reqwest::Client,
    settings: HttpSettings,
}

impl HttpKeyFetcher {
    fn new() -> Result<HttpKeyFetcher> {
        let settings = HttpSettings {
            connect_timeout_ms: 2_000,
            request_timeout_ms: 5_000,
            response_bytes_max: KEY_BYTES_MAX,
        };
        hookgate_connector_http::install_crypto_provider();
        // No redirects: the URL was checked against the allowed hosts, where it leads was not.
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(settings.connect_timeout_ms))
            .timeout(Duration::from_millis(settings.request_timeout_ms))
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(HttpKeyFetcher { client, settings })
    }
}

/// A certificate is a few kilobytes; anything larger is not one.
const KEY_BYTES_MAX: usize = 64 * 1024;

impl KeyFetcher for HttpKeyFetcher {
    fn fetch<'a>(
        &'a self,
        url: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<u8>, FetchError>> + Send + 'a>> {
        Box::pin(async move {
            let response = hookgate_connector_http::send(self.client.get(url), &self.settings)
                .await
                .map_err(|e| FetchError::Unavailable(format!("cannot fetch {url}: {e}")))?;
            match response.status {
                200 if !response.truncated => Ok(response.body.into_bytes()),
                200 => Err(FetchError::NoSuchKey(format!("{url} is larger than a key"))),
                // The host says there is no such key (or will not serve it): the delivery
                // names a key that does not exist. A redirect is not followed.
                status @ 300..=499 => {
                    Err(FetchError::NoSuchKey(format!("{url} answered {status}")))
                }
                status => Err(FetchError::Unavailable(format!("{url} answered {status}"))),
            }
        })
    }
}
