//! Delivery: leased workers that turn outbox items into CRM writes.
//!
//! # One item, from lease to outcome
//! 1. Lease it: the store leases the *head* of an entity under the entity's lease (see
//!    `hookgate_store` for the rule: an item in doubt is settled before anything else of its
//!    entity is written).
//! 2. Version guard: an item whose version is not newer than the entity's last applied version,
//!    or older than a write dead-lettered in doubt, is `skipped_stale`, never written.
//! 3. If a previous write of the item is in doubt (a timeout, a lost answer, a worker killed
//!    mid-call), look the record up first: if the CRM already shows the write, it is `done`;
//!    if the lookup fails, the item waits and looks again, with backoff, and blocks its entity.
//! 4. Render the target from the stored raw payload and call the connector.
//! 5. Classify: success → `done`; retryable, rate-limited or misconfigured → retry with
//!    exponential backoff and jitter, no earlier than the CRM's retry-after, or dead-letter
//!    when attempts are exhausted; rejected → dead-letter; ambiguous (or a 500, 502 or 504,
//!    which can come after the CRM committed) → look up at once, then `done` or retry.
//! 6. Finish, fenced by the lease: a worker whose lease was taken over cannot overwrite the
//!    work of the one that took it.
//!
//! # Leases outlive calls
//! A CRM call is made only while the lease covers all of it: the call timeout plus
//! [`LEASE_MARGIN`] by the worker's clock. A fresh lease does (the lease is longer than a call
//! by that margin at least); when what is left of it does not, it is renewed to a full lease
//! period first, and a worker that cannot renew makes no call. So no call of a worker is still
//! running when another worker may take its entity over (given clocks that agree within the
//! margin), however many calls an attempt makes. Nothing is written before a call: an item in
//! flight counts as in doubt until its outcome is recorded.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hookgate_connector::{
    Answer, CallLimits, Connector, ConnectorError, LookupOutcome, LookupRequest, Operation, Secret,
    SourceFetcher, SourceOutcome, SourceRequest, UpsertRequest,
};
use hookgate_pipeline::evaluate::{Context, Delivery};
use hookgate_pipeline::model::{DeliveryPolicy, NotFound, RefreshMethod};
use hookgate_store::{
    AppliedVersion, AttemptOutcome, Call, Doubt, EventRecord, Finish, LeasedItem, StoreError,
};
use rand::Rng;
use tokio::task::JoinSet;
use tracing::Instrument as _;

use crate::batch::{StoreBatches, UpsertBatcher};
use crate::budget::{CallBudget, Permit};
use crate::seal::{Part, open_stored, open_stored_text};
use crate::{Gateway, ServedPipeline, now_ms};

/// Connector instances by name, as targets refer to them.
pub type Connectors = HashMap<String, Arc<dyn Connector>>;

/// By connector instance name: the calls each may make (see `budget`).
pub type Budgets = HashMap<String, CallLimits>;

/// A retry-after beyond this is treated as this: a CRM asking for a day's pause should not
/// park an item for a day without an operator noticing.
const RETRY_AFTER_MAX: Duration = Duration::from_secs(3600);

/// How much longer than a CRM call its lease must last: the time to record the call's outcome,
/// and room for clocks that differ between gateway hosts.
pub const LEASE_MARGIN: Duration = Duration::from_secs(1);

/// How many items a process works on at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InHand {
    Exactly(usize),
    /// Enough that every batch call can go full: the largest connector batch times the batch
    /// calls in flight, twice over (one batch out while the next gathers), and at least
    /// [`IN_HAND_MIN`]. Under a rate budget a call's permit is the scarce thing; a call
    /// that carries a full batch makes each one count.
    FullBatches,
}

/// Batch calls in flight to a connector under a rate budget, at least: a window's calls
/// should start within a small part of it (100 calls of 100 ms each, 8 at a time, take about
/// 1.3 s of HubSpot's 10 s), or the calls in flight, not the budget, bound the drain.
pub const BUDGETED_BATCH_CALLS_MIN: usize = 8;

/// Calls in flight to one connector: `--crm-batch-calls` for a batch call, `--crm-calls`
/// otherwise, and for a batch call under a rate budget at least
/// [`BUDGETED_BATCH_CALLS_MIN`] (never more than the window's calls).
fn calls_in_flight(
    connector: &dyn Connector,
    limits: Option<&CallLimits>,
    config: &WorkerConfig,
) -> usize {
    if connector.batch_max() <= 1 {
        return config.crm_calls_max;
    }
    match limits.and_then(|limits| limits.rate) {
        Some(rate) => {
            let window_calls = usize::try_from(rate.calls).unwrap_or(usize::MAX);
            config.crm_batch_calls_max.max(BUDGETED_BATCH_CALLS_MIN.min(window_calls))
        }
        None => config.crm_batch_calls_max,
    }
}

/// The fewest items in hand [`InHand::FullBatches`] gives.
pub const IN_HAND_MIN: usize = 128;

impl InHand {
    /// The items in hand for these connectors.
    pub fn resolve(
        self,
        connectors: &Connectors,
        limits: &Budgets,
        config: &WorkerConfig,
    ) -> usize {
        match self {
            InHand::Exactly(items) => items.max(1),
            InHand::FullBatches => connectors
                .iter()
                .filter(|(_, connector)| connector.batch_max() > 1)
                .map(|(name, connector)| {
                    connector.batch_max()
                        * calls_in_flight(connector.as_ref(), limits.get(name), config)
                        * 2
                })
                .fold(IN_HAND_MIN, usize::max),
        }
    }
}

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Names this process's leases in evidence.
    pub worker_id: String,
    /// Items worked on at once by this process.
    pub in_hand: InHand,
    /// How long a lease lasts from its last renewal; renewed before each CRM call, it must
    /// cover one call plus [`LEASE_MARGIN`]. A dead worker's entities wait this long.
    pub lease: Duration,
    /// How long a CRM call may take before its outcome is treated as unknown.
    pub call_timeout: Duration,
    /// How long to sleep when there is nothing to do.
    pub idle_poll: Duration,
    /// Items whose calls begin, or who finish, in one transaction at most (see `batch`).
    pub store_batch_max: usize,
    /// Batch calls in flight at once per connector that has them; more writes wait for the
    /// next batch.
    pub crm_batch_calls_max: usize,
    /// Write calls in flight at once per connector without a batch call; more writes wait.
    pub crm_calls_max: usize,
}

impl WorkerConfig {
    /// Refuses a lease that cannot cover one CRM call and the recording of its outcome.
    pub fn check(&self) -> Result<(), String> {
        if self.lease < self.call_timeout + LEASE_MARGIN {
            return Err(format!(
                "a lease of {} ms cannot cover a CRM call of up to {} ms: the lease is renewed before \
                 each call and must outlast it by {} ms",
                self.lease.as_millis(),
                self.call_timeout.as_millis(),
                LEASE_MARGIN.as_millis()
            ));
        }
        Ok(())
    }
}

impl Default for WorkerConfig {
    fn default() -> WorkerConfig {
        WorkerConfig {
            worker_id: format!("worker-{}", std::process::id()),
            in_hand: InHand::FullBatches,
            lease: Duration::from_secs(60),
            call_timeout: Duration::from_secs(30),
            idle_poll: Duration::from_millis(250),
            store_batch_max: 128,
            crm_batch_calls_max: 2,
            crm_calls_max: 8,
        }
    }
}

/// The workers of one process.
#[derive(Debug, Clone)]
pub struct Worker {
    gateway: Gateway,
    /// Items worked on at once, resolved from [`WorkerConfig::in_hand`] at start.
    in_hand: usize,
    config: Arc<WorkerConfig>,
    batches: StoreBatches,
    /// Connector instances and sources, replaced whole by a reload; an item keeps the ones it
    /// started with, so work in hand finishes on the configuration it began under.
    wiring: Arc<RwLock<Arc<Wiring>>>,
}

/// What a reload replaces in the workers.
#[derive(Debug)]
struct Wiring {
    connectors: Connectors,
    limits: Budgets,
    /// By connector instance name, for those with a rate: the calls this process may start.
    /// Kept across a reload that leaves an instance's rate as it was, so that its calls of
    /// the window still count.
    budgets: HashMap<String, Arc<CallBudget>>,
    /// By connector instance name: where writes queue for calls. A replaced queue's tasks end
    /// when the last item holding it finishes.
    upserts: HashMap<String, UpsertBatcher>,
    /// The connector instances that say they can write without creating (their
    /// `capabilities.update_only`), read once: an update-only write goes to no other.
    update_only: std::collections::HashSet<String>,
    sources: Sources,
}

impl Wiring {
    fn new(
        connectors: Connectors,
        limits: Budgets,
        sources: Sources,
        config: &WorkerConfig,
        in_hand: usize,
        previous: Option<&Wiring>,
        shared: bool,
    ) -> Wiring {
        let budgets: HashMap<String, Arc<CallBudget>> = connectors
            .keys()
            .filter_map(|name| {
                let rate = limits.get(name)?.rate?;
                let kept = previous
                    .and_then(|p| p.budgets.get(name))
                    .filter(|budget| budget.rate() == rate)
                    .cloned();
                // Shared, it starts with no calls until the store gives it a slice.
                let limit = if shared { 0 } else { rate.calls };
                let budget = kept.unwrap_or_else(|| CallBudget::new(name, rate, limit));
                Some((name.clone(), budget))
            })
            .collect();
        // Every item in hand may wait on a batch at once.
        let capacity = in_hand;
        // Every connector's writes queue for a bounded number of calls: batches where the CRM
        // has a batch call, one write per call elsewhere.
        let upserts = connectors
            .iter()
            .map(|(name, connector)| {
                let calls = calls_in_flight(connector.as_ref(), limits.get(name), config);
                let budget = budgets.get(name).cloned();
                let batcher =
                    UpsertBatcher::start(name, Arc::clone(connector), calls, capacity, budget);
                (name.clone(), batcher)
            })
            .collect();
        let update_only = connectors
            .iter()
            .filter(|(_, connector)| connector.describe().capabilities.update_only)
            .map(|(name, _)| name.clone())
            .collect();
        Wiring { connectors, limits, budgets, upserts, update_only, sources }
    }
}

impl Worker {
    /// # Panics
    /// When `config` fails [`WorkerConfig::check`]: callers check configuration first.
    pub fn new(
        gateway: Gateway,
        connectors: Connectors,
        limits: Budgets,
        config: WorkerConfig,
    ) -> Worker {
        if let Err(problem) = config.check() {
            panic!("{problem}");
        }
        let in_hand = config.in_hand.resolve(&connectors, &limits, &config);
        let batches = StoreBatches::start(&gateway.store, config.store_batch_max, in_hand);
        let shared = gateway.store.is_shared();
        let wiring =
            Wiring::new(connectors, limits, Sources::default(), &config, in_hand, None, shared);
        Worker {
            gateway,
            in_hand,
            config: Arc::new(config),
            batches,
            wiring: Arc::new(RwLock::new(Arc::new(wiring))),
        }
    }

    /// Fetches sources for targets with `refresh:` through `sources`.
    pub fn with_sources(self, sources: Sources) -> Worker {
        let wiring = self.wiring();
        self.replace(wiring.connectors.clone(), wiring.limits.clone(), sources);
        self
    }

    /// Uses these connector instances and sources for items leased from now on (a reload);
    /// items in hand finish with the ones they started with.
    pub fn replace(&self, connectors: Connectors, limits: Budgets, sources: Sources) {
        let previous = self.wiring();
        let shared = self.gateway.store.is_shared();
        let wiring = Wiring::new(
            connectors,
            limits,
            sources,
            &self.config,
            self.in_hand,
            Some(&previous),
            shared,
        );
        let wiring = Arc::new(wiring);
        let mut held = self.wiring.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        *held = wiring;
    }

    fn wiring(&self) -> Arc<Wiring> {
        let held = self.wiring.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        Arc::clone(&held)
    }

    /// Works until `shutdown` completes, then finishes the items in hand and returns.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        // Budgets shared through the store: this process's slices, renewed until it stops.
        let (stop_slices, slices_stopped) = tokio::sync::oneshot::channel::<()>();
        if self.gateway.store.is_shared() {
            let owner = format!("{}-{:08x}", self.config.worker_id, rand::random::<u32>());
            let wiring = Arc::clone(&self.wiring);
            let budgets = move || {
                let held = wiring.read().unwrap_or_else(|poisoned| poisoned.into_inner());
                held.budgets.values().cloned().collect()
            };
            let stopped = async {
                let _ = slices_stopped.await;
            };
            tokio::spawn(crate::budget::keep_slices(
                self.gateway.store.clone(),
                owner,
                budgets,
                stopped,
            ));
        }
        let mut in_hand = JoinSet::new();
        loop {
            while in_hand.try_join_next().is_some() {}
            let free = self.in_hand.saturating_sub(in_hand.len());
            // Lease in batches: a lease searches the backlog, so one per freed slot would cost a
            // search per write. Wait for half the slots, unless nothing is in hand.
            let batch = in_hand.is_empty() || free * 2 >= self.in_hand;
            let leased = if free > 0 && batch { self.lease(free).await } else { Vec::new() };
            let idle = leased.is_empty();
            for (item, event) in leased {
                let worker = self.clone();
                in_hand.spawn(async move { worker.process(item, event).await });
            }
            if idle || !batch {
                tokio::select! {
                    () = &mut shutdown => break,
                    _ = in_hand.join_next(), if !in_hand.is_empty() => {}
                    () = tokio::time::sleep(self.config.idle_poll) => {}
                }
            }
        }
        tracing::info!(worker = %self.config.worker_id, in_hand = in_hand.len(), "workers stopping");
        while in_hand.join_next().await.is_some() {}
        let _ = stop_slices.send(());
    }

    fn lease_ms(&self) -> i64 {
        i64::try_from(self.config.lease.as_millis()).unwrap_or(i64::MAX)
    }

    /// Leases up to `free` items, with their events read in one query (an item whose event
    /// could not be read reads it itself).
    async fn lease(&self, free: usize) -> Vec<(LeasedItem, Option<EventRecord>)> {
        let started = std::time::Instant::now();
        let items = self.lease_items(free).await;
        metrics::histogram!("hookgate_lease_seconds").record(started.elapsed().as_secs_f64());
        metrics::histogram!("hookgate_lease_size").record(items.len() as f64);
        if items.is_empty() {
            return Vec::new();
        }
        let ids: Vec<i64> = items.iter().map(|item| item.event_id).collect();
        let events: HashMap<i64, EventRecord> = match self.gateway.store.events_by_id(&ids).await {
            Ok(events) => events.into_iter().map(|event| (event.id, event)).collect(),
            Err(error) => {
                tracing::warn!(error = %error, "reading the leased items' events failed; each reads its own");
                HashMap::new()
            }
        };
        items
            .into_iter()
            .map(|item| {
                // Two items of one event (two targets) each get a copy.
                let event = events.get(&item.event_id).cloned();
                (item, event)
            })
            .collect()
    }

    async fn lease_items(&self, free: usize) -> Vec<LeasedItem> {
        let now = now_ms();
        // Unique per lease call: it is the fence, so it must not repeat (a pid does, in
        // containers).
        let owner = format!("{}/{:032x}", self.config.worker_id, rand::random::<u128>());
        let limit = i64::try_from(free).unwrap_or(1);
        match self
            .gateway
            .store
            .lease(&owner, now, now.saturating_add(self.lease_ms()), limit)
            .await
        {
            Ok(items) => items,
            Err(error) => {
                tracing::warn!(error = %error, "leasing failed; retrying after the idle poll");
                Vec::new()
            }
        }
    }

    /// Works one item to its next state. Database failures leave the item leased: when the
    /// lease expires it is picked up again (in doubt: a write may have gone out) and reconciled.
    /// `event`: the item's event if read already; otherwise it is read here.
    pub async fn process(&self, item: LeasedItem, event: Option<EventRecord>) {
        // The outcome is recorded where the attempt ends: in `finish`, or where the lease is
        // lost.
        let span = tracing::info_span!(
            "attempt",
            pipeline = item.pipeline.as_str(),
            target = item.target.as_str(),
            event_id = item.event_id,
            outbox_id = item.id,
            attempt = item.attempts,
            outcome = tracing::field::Empty,
        );
        async {
            if let Err(error) = self.try_process(&item, event).await {
                tracing::Span::current().record("outcome", "store_failed");
                tracing::warn!(item = item.id, event_id = item.event_id, error = %error, "could not record an outcome");
            }
        }
        .instrument(span)
        .await;
    }

    async fn try_process(
        &self,
        item: &LeasedItem,
        event: Option<EventRecord>,
    ) -> Result<(), StoreError> {
        let mut attempt = Attempt::new(item);
        let (pipeline, index, mut ctx) = match self.prepare(item, event).await? {
            Ok(prepared) => prepared,
            Err(reason) => return self.dead_before_any_call(attempt, reason).await,
        };

        // After the pipeline: a reload replaces the pipelines first, then the connectors, so
        // the pipeline read is never newer than these, and one brief miss is read again.
        let mut wiring = self.wiring();
        let connector = &pipeline.compiled.targets[index].connector;
        if !wiring.connectors.contains_key(connector) {
            tokio::time::sleep(Duration::from_millis(50)).await;
            wiring = self.wiring();
        }

        if let Some(reason) = Self::stale(item) {
            return self.skip_stale(attempt, reason).await;
        }

        // A target that refreshes writes the source's current state, and its version.
        let mut fetched_version = None;
        if pipeline.compiled.targets[index].refresh.is_some() {
            match self.refresh(&mut attempt, &wiring.sources, &pipeline, index, &ctx).await? {
                Refreshed::Stop => return Ok(()),
                Refreshed::Finish(finish) => return self.finish(attempt, finish).await,
                Refreshed::Source { object, version } => {
                    // The fetched version is checked by the same guard. It is not compared
                    // with the delivery's own version, which may be on another clock (an
                    // event's creation time, an object's update time).
                    if let (Some(version), Some(_)) = (&version, &item.version) {
                        if let Some(reason) = Self::stale_at(item, &version.sort_key, &version.text)
                        {
                            return self.skip_stale(attempt, reason).await;
                        }
                        fetched_version = Some(version.clone());
                    }
                    ctx.set_source(Some(object));
                }
            }
        }
        let upsert = match pipeline.compiled.render_target(index, &ctx) {
            Ok(upsert) => upsert,
            Err(error) => {
                let reason = format!("cannot render the write: {error}");
                return self.dead_before_any_call(attempt, reason).await;
            }
        };
        // With a fetched version, the write applies that version, not the delivery's.
        let applied = |item: &LeasedItem, record_id: String| match applied(item, record_id) {
            Finish::Applied { record_id, version: Some(_) } if fetched_version.is_some() => {
                Finish::Applied { record_id, version: fetched_version.clone() }
            }
            finish => finish,
        };

        let Some(connector) = wiring.connectors.get(&upsert.connector).cloned() else {
            let reason = format!("connector instance `{}` is not configured", upsert.connector);
            return self.dead_before_any_call(attempt, reason).await;
        };
        let request = UpsertRequest {
            object: upsert.object.clone(),
            external_id_field: upsert.external_id_field.clone(),
            external_id_value: upsert.external_id_value.clone(),
            fields: upsert.fields.clone(),
            operation: match upsert.operation {
                hookgate_pipeline::model::Operation::Upsert => Operation::Upsert,
                hookgate_pipeline::model::Operation::UpdateOnly => Operation::UpdateOnly,
            },
            idempotency_key: format!("hookgate-{}-{}", item.event_id, item.target),
        };
        if request.operation == Operation::UpdateOnly
            && !wiring.update_only.contains(&upsert.connector)
        {
            // A connector that cannot honour it would create the record the target says must
            // already exist.
            let reason = format!(
                "the target is update-only, and connector instance `{}` does not declare that it can \
                 write without creating (capabilities.update_only): sent, the write could create a record",
                upsert.connector
            );
            return self.dead_before_any_call(attempt, reason).await;
        }
        let policy = &pipeline.compiled.delivery;
        let calls = wiring.budgets.get(&upsert.connector);

        if item.in_doubt {
            match self.reconcile(&mut attempt, connector.as_ref(), calls, &request).await? {
                None => return Ok(()),
                Some(Reconciled::Applied { record_id }) => {
                    tracing::info!(item = item.id, event_id = item.event_id, %record_id, "reconciled: the CRM already shows the write");
                    return self.finish(attempt, applied(item, record_id)).await;
                }
                Some(Reconciled::NotApplied) => {}
                Some(Reconciled::Unknown(error)) => {
                    let finish = self.retry_or_dead(item, policy, &error, Doubt::InDoubt);
                    return self.finish(attempt, finish).await;
                }
            }
        }

        let Some(budget) = attempt.begin(self, "upsert").await? else {
            return Ok(());
        };
        let written = match wiring.upserts.get(&upsert.connector) {
            Some(batcher) => batcher.upsert(request.clone(), budget).await,
            None => {
                metrics::counter!("hookgate_crm_write_calls_total", "connector" => upsert.connector.clone()).increment(1);
                let calls = wiring.budgets.get(&upsert.connector);
                let call = crate::budget::start_call(calls).await;
                let written = within(budget, connector.upsert(&request)).await;
                crate::budget::end_call(call, &written);
                written
            }
        };
        let finish = match written {
            Ok(written) => {
                tracing::info!(item = item.id, event_id = item.event_id, record_id = %written.record_id, created = written.created, "delivered");
                let outcome =
                    if written.created { AttemptOutcome::Created } else { AttemptOutcome::Updated };
                attempt.record(
                    "upsert",
                    outcome,
                    &written.answer,
                    None,
                    Some(written.record_id.clone()),
                );
                applied(item, written.record_id)
            }
            Err(ConnectorError::Rejected { message, answer }) => {
                tracing::warn!(item = item.id, event_id = item.event_id, %message, "rejected by the CRM: dead-lettered");
                let error = format!("rejected: {message}");
                attempt.record(
                    "upsert",
                    AttemptOutcome::Rejected,
                    &answer,
                    Some(error.clone()),
                    None,
                );
                // A definite refusal: this write is not in the CRM.
                Finish::Dead { error, doubt: Doubt::Clear }
            }
            Err(error) if written_perhaps(&error) => {
                let ambiguous = error;
                attempt.record_error("upsert", &ambiguous);
                // The write may have happened: look before writing again.
                match self.reconcile(&mut attempt, connector.as_ref(), calls, &request).await? {
                    None => return Ok(()),
                    Some(Reconciled::Applied { record_id }) => {
                        tracing::info!(
                            item = item.id,
                            event_id = item.event_id,
                            "ambiguous answer reconciled: the write was applied"
                        );
                        applied(item, record_id)
                    }
                    Some(Reconciled::NotApplied) => {
                        self.retry_or_dead(item, policy, &ambiguous, Doubt::Clear)
                    }
                    Some(Reconciled::Unknown(error)) => {
                        self.retry_or_dead(item, policy, &error, Doubt::InDoubt)
                    }
                }
            }
            Err(error) => {
                attempt.record_error("upsert", &error);
                self.retry_or_dead(item, policy, &error, Doubt::Clear)
            }
        };
        self.finish(attempt, finish).await
    }

    /// Dead-letters the item for `reason` before any call: nothing to render it from, or
    /// nothing to write it with.
    async fn dead_before_any_call(
        &self,
        mut attempt: Attempt<'_>,
        reason: String,
    ) -> Result<(), StoreError> {
        let item = attempt.item;
        tracing::error!(item = item.id, event_id = item.event_id, %reason, "dead-lettered before any call");
        let error = Some(reason.clone());
        attempt.record("prepare", AttemptOutcome::Dead, &Answer::default(), error, None);
        self.finish(attempt, dead_as_it_was(item, reason)).await
    }

    async fn skip_stale(&self, mut attempt: Attempt<'_>, reason: String) -> Result<(), StoreError> {
        let item = attempt.item;
        tracing::info!(item = item.id, event_id = item.event_id, %reason, "skipped stale");
        attempt.record(
            "version_check",
            AttemptOutcome::SkippedStale,
            &Answer::default(),
            Some(reason.clone()),
            None,
        );
        // An earlier write that may have reached the CRM still may have: the evidence keeps
        // saying so (only a dead letter's doubt counts for ordering).
        self.finish(attempt, Finish::Skipped { reason, doubt: Doubt::of(item) }).await
    }

    /// Why an item must not be written because of its version, if so.
    fn stale(item: &LeasedItem) -> Option<String> {
        let version = item.version.as_ref()?;
        let text = item.version_text.as_deref().unwrap_or(version);
        Self::stale_at(item, version, text)
    }

    /// Why a write of `version` (a sort key, shown as `text`) to the item's entity must not
    /// happen, if so, by the guard read with the lease (only the lease holder moves it).
    fn stale_at(item: &LeasedItem, version: &str, text: &str) -> Option<String> {
        let guard = &item.guard;
        if let Some(applied) = guard.applied.as_ref().filter(|a| a.sort_key.as_str() >= version) {
            return Some(format!(
                "version {text} is not newer than {}, already applied to {}",
                applied.text, item.entity
            ));
        }
        if let Some(doubted) = guard.doubted.as_ref().filter(|d| d.sort_key.as_str() > version) {
            return Some(format!(
                "version {text} is older than {}, which may have been applied to {} (dead-lettered in doubt)",
                doubted.text, item.entity
            ));
        }
        None
    }

    /// Records an attempt's end through the store, and counts its calls.
    async fn finish(&self, attempt: Attempt<'_>, finish: Finish) -> Result<(), StoreError> {
        let item = attempt.item;
        let mut calls = attempt.calls;
        // Answers can echo the payload (a record's fields, a fetched object): sealed like it.
        if let Some(keyring) = self.gateway.keyring() {
            for call in &mut calls {
                if let Some(excerpt) = &call.excerpt {
                    call.excerpt = Some(keyring.seal_text(Part::Answer, &item.pipeline, excerpt));
                    call.sealed_with = Some(keyring.current().to_owned());
                }
            }
        }
        // A dead letter's reason ("attempts exhausted (4): ...") stays in the evidence after a
        // replay clears the item's last error.
        if let Finish::Dead { error, .. } = &finish
            && let Some(last) = calls.last_mut()
        {
            last.error = Some(error.clone());
        }
        let measured: Vec<(&'static str, AttemptOutcome, f64)> = calls
            .iter()
            .map(|call| {
                let seconds = (call.finished_at_ms - call.started_at_ms).max(0) as f64 / 1000.0;
                (call.action, call.outcome, seconds)
            })
            .collect();
        let state = finish.item_state();
        let finished = self.batches.finish(item.clone(), finish, calls).await?;
        if !finished {
            tracing::Span::current().record("outcome", "lease_lost");
            tracing::warn!(
                item = item.id,
                "lease lost during the attempt; the next holder reconciles"
            );
            return Ok(());
        }
        tracing::Span::current().record("outcome", state.as_str());
        for (action, outcome, seconds) in measured {
            metrics::counter!("hookgate_attempts_total", "pipeline" => item.pipeline.clone(), "target" => item.target.clone(), "outcome" => outcome.as_str()).increment(1);
            metrics::histogram!("hookgate_crm_call_seconds", "pipeline" => item.pipeline.clone(), "target" => item.target.clone(), "action" => action, "outcome" => outcome.as_str()).record(seconds);
        }
        if state.is_finished() {
            metrics::counter!("hookgate_writes_finished_total", "pipeline" => item.pipeline.clone(), "target" => item.target.clone(), "state" => state.as_str()).increment(1);
        }
        Ok(())
    }

    /// Loads the event, opens its payload and builds the template context of its target. The
    /// inner error is a reason to dead-letter.
    async fn prepare(
        &self,
        item: &LeasedItem,
        event: Option<EventRecord>,
    ) -> Result<Result<(Arc<ServedPipeline>, usize, Context), String>, StoreError> {
        let Some(pipeline) = self.gateway.pipeline(&item.pipeline) else {
            return Ok(Err(format!("pipeline `{}` is no longer configured", item.pipeline)));
        };
        // By name: a reload may have moved the target in the list.
        let index = usize::try_from(item.target_index).unwrap_or(usize::MAX);
        let index = match pipeline.compiled.targets.get(index) {
            Some(target) if target.name == item.target => index,
            _ => match pipeline.compiled.targets.iter().position(|t| t.name == item.target) {
                Some(index) => index,
                None => {
                    return Ok(Err(format!("target `{}` is no longer configured", item.target)));
                }
            },
        };
        let event = match event {
            Some(event) => Some(event),
            None => self.gateway.store.event(item.event_id).await?,
        };
        let Some(event) = event else {
            return Ok(Err("the event is gone".to_owned()));
        };
        if let Some(purged_at_ms) = event.payload_purged_at_ms {
            return Ok(Err(format!(
                "the payload was deleted by payload_retention at {purged_at_ms} (Unix ms): nothing to render the write from"
            )));
        }
        // Opened in memory only, for this render.
        let keyring = self.gateway.keyring();
        let sealed_with = event.sealed_with.as_deref();
        let opened = open_stored(keyring, sealed_with, Part::Body, &event.pipeline, &event.body)
            .and_then(|body| {
                let headers = open_stored_text(
                    keyring,
                    sealed_with,
                    Part::Headers,
                    &event.pipeline,
                    &event.headers_json,
                )?;
                Ok((body.into_owned(), headers.into_owned()))
            });
        let (body, headers_json) = match opened {
            Ok(opened) => opened,
            Err(error) => return Ok(Err(format!("event {}: the payload {error}", event.id))),
        };
        let pairs: Vec<[String; 2]> = serde_json::from_str(&headers_json).unwrap_or_default();
        let headers: Vec<(String, Vec<u8>)> =
            pairs.into_iter().map(|[n, v]| (n, v.into_bytes())).collect();
        let delivery = Delivery { headers: &headers, body: &body };
        let identified = pipeline
            .compiled
            .identify(&delivery)
            .map_err(|e| format!("cannot render the write: {e}"));
        Ok(identified.map(|(_, ctx)| (pipeline, index, ctx)))
    }

    /// Fetches the current source object of a refreshing target, recording the fetch as a
    /// step of the attempt.
    async fn refresh(
        &self,
        attempt: &mut Attempt<'_>,
        sources: &Sources,
        pipeline: &ServedPipeline,
        index: usize,
        ctx: &Context,
    ) -> Result<Refreshed, StoreError> {
        let item = attempt.item;
        let target = &pipeline.compiled.targets[index];
        let refresh = target.refresh.as_ref().expect("called for targets that refresh");
        let dead = |attempt: &mut Attempt<'_>,
                    outcome: AttemptOutcome,
                    answer: &Answer,
                    reason: String| {
            tracing::warn!(item = item.id, event_id = item.event_id, %reason, "dead-lettered at refresh");
            attempt.record("refresh", outcome, answer, Some(reason.clone()), None);
            Refreshed::Finish(dead_as_it_was(item, reason))
        };
        let url = match pipeline.compiled.render_refresh_url(index, ctx) {
            Ok(url) => match sources.origins.get(&refresh.origin) {
                Some(to) => format!("{to}{}", &url[refresh.origin.len()..]),
                None => url,
            },
            Err(error) => {
                let reason = format!("cannot render the refresh: {error}");
                return Ok(dead(attempt, AttemptOutcome::Dead, &Answer::default(), reason));
            }
        };
        let Some(fetcher) = sources.fetcher.clone() else {
            return Ok(dead(
                attempt,
                AttemptOutcome::Dead,
                &Answer::default(),
                "no source fetcher is configured".into(),
            ));
        };
        let mut headers: Vec<(String, Secret)> =
            refresh.headers.iter().map(|(n, v)| (n.clone(), Secret::new(v.clone()))).collect();
        if refresh.auth.is_some() || !refresh.secret_headers.is_empty() {
            let key = (pipeline.compiled.name.clone(), target.name.clone());
            match sources.auth.get(&key) {
                Some(auth) => headers.extend(auth.iter().cloned()),
                None => {
                    let reason = format!(
                        "the credentials of target `{}`'s refresh are not loaded",
                        target.name
                    );
                    return Ok(dead(attempt, AttemptOutcome::Dead, &Answer::default(), reason));
                }
            }
        }
        let Some(budget) = attempt.begin(self, "refresh").await? else {
            return Ok(Refreshed::Stop);
        };
        let request = SourceRequest {
            method: match refresh.method {
                RefreshMethod::Get => "GET",
                RefreshMethod::Post => "POST",
            },
            url,
            headers,
            timeout: refresh.timeout.min(budget),
            max_bytes: refresh.max_bytes,
            allow_plain_http: refresh.allow_plain_http,
        };
        let policy = &pipeline.compiled.delivery;
        let fetched = match within_read(budget, fetcher.fetch(&request)).await {
            // An object that says it is gone (`gone_if`) is as good as a 404.
            Ok(SourceOutcome::Found { object, answer }) => {
                let mut with_source = ctx.clone();
                with_source.set_source(Some(object.clone()));
                match pipeline.compiled.source_gone(index, &with_source) {
                    Ok(true) => Ok(SourceOutcome::Gone { answer }),
                    Ok(false) => Ok(SourceOutcome::Found { object, answer }),
                    Err(error) => {
                        let reason = format!("the fetched object: {error}");
                        return Ok(dead(attempt, AttemptOutcome::Rejected, &answer, reason));
                    }
                }
            }
            other => other,
        };
        Ok(match fetched {
            Ok(SourceOutcome::Found { object, answer }) => match pipeline
                .compiled
                .source_version(index, &object)
            {
                Ok(version) => {
                    attempt.record("refresh", AttemptOutcome::Fetched, &answer, None, None);
                    let version = version
                        .map(|v| AppliedVersion { sort_key: v.sort_key(), text: v.to_string() });
                    Refreshed::Source { object, version }
                }
                Err(error) => {
                    let reason = format!("the fetched object: {error}");
                    dead(attempt, AttemptOutcome::Rejected, &answer, reason)
                }
            },
            Ok(SourceOutcome::Gone { answer }) => {
                let reason = match answer.status {
                    Some(status @ (404 | 410)) => {
                        format!("the source object is gone ({status}): nothing to write")
                    }
                    _ => {
                        "the source object says it is gone (`gone_if`): nothing to write".to_owned()
                    }
                };
                match refresh.not_found {
                    NotFound::Skip => {
                        tracing::info!(item = item.id, event_id = item.event_id, %reason, "skipped: source gone");
                        attempt.record(
                            "refresh",
                            AttemptOutcome::SourceGone,
                            &answer,
                            Some(reason.clone()),
                            None,
                        );
                        Refreshed::Finish(Finish::Skipped { reason, doubt: Doubt::of(item) })
                    }
                    NotFound::Dead => dead(attempt, AttemptOutcome::SourceGone, &answer, reason),
                }
            }
            Err(ConnectorError::Rejected { message, answer }) => {
                let reason = format!("refresh rejected: {message}");
                dead(attempt, AttemptOutcome::Rejected, &answer, reason)
            }
            Err(error) => {
                attempt.record_error("refresh", &error);
                Refreshed::Finish(self.retry_or_dead(item, policy, &error, Doubt::of(item)))
            }
        })
    }

    /// Looks the record up to learn whether a write in doubt was applied. `None`: the lease was
    /// lost, or cannot cover the lookup; stop.
    async fn reconcile(
        &self,
        attempt: &mut Attempt<'_>,
        connector: &dyn Connector,
        calls: Option<&Arc<CallBudget>>,
        request: &UpsertRequest,
    ) -> Result<Option<Reconciled>, StoreError> {
        // A lookup is a call like a write: it waits for its permit before the lease is made
        // to cover it.
        let permit = match calls {
            Some(calls) => Some(calls.permit().await),
            None => None,
        };
        let Some(budget) = attempt.begin(self, "lookup").await? else {
            return Ok(None);
        };
        let call = permit.map(Permit::start);
        let lookup = LookupRequest::from(request);
        let looked_up = within(budget, connector.lookup(&lookup)).await;
        crate::budget::end_call(call, &looked_up);
        let reconciled = match looked_up {
            Ok(LookupOutcome::Found { record_id, fields, answer }) => {
                let shows_write =
                    request.fields.iter().all(|(name, value)| fields.get(name) == Some(value));
                if shows_write {
                    let record = Some(record_id.clone());
                    attempt.record("lookup", AttemptOutcome::Reconciled, &answer, None, record);
                    Reconciled::Applied { record_id }
                } else {
                    let note = "the record does not show this write".to_owned();
                    let (note, record) = (Some(note), Some(record_id));
                    attempt.record("lookup", AttemptOutcome::NotApplied, &answer, note, record);
                    Reconciled::NotApplied
                }
            }
            Ok(LookupOutcome::NotFound { answer }) => {
                attempt.record("lookup", AttemptOutcome::NotFound, &answer, None, None);
                Reconciled::NotApplied
            }
            Err(error) => {
                attempt.record_error("lookup", &error);
                Reconciled::Unknown(error)
            }
        };
        Ok(Some(reconciled))
    }

    fn retry_or_dead(
        &self,
        item: &LeasedItem,
        policy: &DeliveryPolicy,
        error: &ConnectorError,
        doubt: Doubt,
    ) -> Finish {
        // The CRM asked to wait: not a failure, so it neither counts toward `attempts_max`
        // nor dead-letters the write, however long the CRM's window or day.
        if let ConnectorError::RateLimited { .. } = error {
            let delay = backoff(policy, item.attempts, error.retry_after());
            tracing::info!(item = item.id, event_id = item.event_id, delay_ms = delay.as_millis() as u64, %error, "deferred by the CRM's rate limit");
            return Finish::Deferred {
                at_ms: now_ms() + i64::try_from(delay.as_millis()).unwrap_or(i64::MAX),
                error: error.to_string(),
                doubt,
            };
        }
        let exhausted = item.attempts >= i64::from(policy.attempts_max);
        if exhausted {
            tracing::warn!(item = item.id, event_id = item.event_id, attempts = item.attempts, %error, "attempts exhausted: dead-lettered");
            let error = format!("attempts exhausted ({}): {error}", item.attempts);
            return Finish::Dead { error, doubt };
        }
        let delay = backoff(policy, item.attempts, error.retry_after());
        let in_doubt = doubt.is_in_doubt();
        tracing::info!(item = item.id, event_id = item.event_id, attempt = item.attempts, delay_ms = delay.as_millis() as u64, in_doubt, %error, "will retry");
        Finish::Retry {
            at_ms: now_ms() + i64::try_from(delay.as_millis()).unwrap_or(i64::MAX),
            error: error.to_string(),
            doubt,
        }
    }
}

/// What a refresh came to.
enum Refreshed {
    /// The lease was lost: stop, the next holder goes on.
    Stop,
    /// The attempt ends here (skipped, retried later, dead-lettered).
    Finish(Finish),
    /// The fetched object, and its own version if the refresh names one.
    Source { object: serde_json::Value, version: Option<AppliedVersion> },
}

/// Where sources are fetched from, and each refreshing target's auth headers.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    pub fetcher: Option<Arc<dyn SourceFetcher>>,
    /// By (pipeline, target): the headers that carry the refresh's credentials, resolved at
    /// start.
    pub auth: HashMap<(String, String), Vec<(String, Secret)>>,
    /// Origins this deployment sends elsewhere (`source_origins`): written origin to origin.
    pub origins: HashMap<String, String>,
}

/// One attempt at an item: its calls so far, as evidence.
struct Attempt<'a> {
    item: &'a LeasedItem,
    calls: Vec<Call>,
    /// When the call begun and not yet recorded started.
    open: Option<i64>,
    /// When the lease ends, by this worker's clock: as leased, or as last renewed.
    lease_expires_at_ms: i64,
}

impl<'a> Attempt<'a> {
    fn new(item: &'a LeasedItem) -> Attempt<'a> {
        Attempt {
            item,
            calls: Vec::new(),
            open: None,
            lease_expires_at_ms: item.lease_expires_at_ms,
        }
    }

    /// Makes sure the lease covers a call, renewing it when what is left would not, and
    /// notes the call's start. Returns how long the call may take: the call timeout, or less
    /// if the lease ends sooner. `None`: the lease was lost, or it cannot cover a call; make
    /// none.
    async fn begin(
        &mut self,
        worker: &Worker,
        action: &'static str,
    ) -> Result<Option<Duration>, StoreError> {
        let margin = i64::try_from(LEASE_MARGIN.as_millis()).unwrap_or(i64::MAX);
        let call_ms = i64::try_from(worker.config.call_timeout.as_millis()).unwrap_or(i64::MAX);
        let now = now_ms();
        if self.lease_expires_at_ms - margin - now < call_ms {
            let expires = now.saturating_add(worker.lease_ms());
            if !worker.batches.renew(self.item.clone(), expires).await? {
                tracing::Span::current().record("outcome", "lease_lost");
                tracing::info!(item = self.item.id, action, "lease lost before the call");
                return Ok(None);
            }
            self.lease_expires_at_ms = expires;
        }
        let now = now_ms();
        self.open = Some(now);
        let left_ms = self.lease_expires_at_ms - margin - now;
        let Ok(left) = u64::try_from(left_ms) else {
            tracing::Span::current().record("outcome", "lease_too_short");
            tracing::warn!(
                item = self.item.id,
                action,
                "the lease cannot cover the call: none made"
            );
            return Ok(None);
        };
        Ok(Some(worker.config.call_timeout.min(Duration::from_millis(left))))
    }

    /// Records a call that failed.
    fn record_error(&mut self, action: &'static str, error: &ConnectorError) {
        self.record(action, outcome_of(error), error.answer(), Some(error.to_string()), None);
    }

    /// Records how the open call (or a decision taken without a call) ended.
    fn record(
        &mut self,
        action: &'static str,
        outcome: AttemptOutcome,
        answer: &Answer,
        error: Option<String>,
        record_id: Option<String>,
    ) {
        let now = now_ms();
        let started_at_ms = self.open.take().unwrap_or(now);
        self.calls.push(Call {
            action,
            started_at_ms,
            finished_at_ms: now,
            outcome,
            status: answer.status.map(i64::from),
            excerpt: answer.excerpt.clone(),
            error,
            record_id,
            meta: (!answer.meta.is_empty())
                .then(|| serde_json::to_string(&answer.meta).unwrap_or_default()),
            sealed_with: None,
        });
    }
}

/// Whether a failed write may have been applied: an ambiguous answer, or a server error that
/// can come after the CRM committed (500, a gateway that gave up waiting: 502, 504, or a
/// proxy's own codes such as Cloudflare's 524). Only a 503 (not processed) and answers before
/// the CRM looked at the write prove it did not happen.
fn written_perhaps(error: &ConnectorError) -> bool {
    match error {
        ConnectorError::Ambiguous { .. } => true,
        ConnectorError::Retryable { answer, .. } => {
            answer.status.is_some_and(|status| (500..=599).contains(&status) && status != 503)
        }
        _ => false,
    }
}

/// A connector call given `budget`: no answer in time is an unknown outcome.
async fn within<T>(
    budget: Duration,
    call: impl Future<Output = Result<T, ConnectorError>>,
) -> Result<T, ConnectorError> {
    tokio::time::timeout(budget, call).await.unwrap_or_else(|_| {
        Err(ConnectorError::Ambiguous {
            message: format!("no answer within {budget:?}"),
            answer: Answer::default(),
        })
    })
}

/// [`within`] for a read that changes nothing: no answer in time is retryable.
async fn within_read<T>(
    budget: Duration,
    call: impl Future<Output = Result<T, ConnectorError>>,
) -> Result<T, ConnectorError> {
    match within(budget, call).await {
        Err(ConnectorError::Ambiguous { message, answer }) => {
            Err(ConnectorError::Retryable { message, retry_after: None, answer })
        }
        other => other,
    }
}

enum Reconciled {
    Applied { record_id: String },
    NotApplied,
    Unknown(ConnectorError),
}

/// How a failed call is recorded: the connector's class of the failure.
fn outcome_of(error: &ConnectorError) -> AttemptOutcome {
    match error {
        ConnectorError::Retryable { .. } => AttemptOutcome::Retryable,
        ConnectorError::RateLimited { .. } => AttemptOutcome::RateLimited,
        ConnectorError::Rejected { .. } => AttemptOutcome::Rejected,
        ConnectorError::Ambiguous { .. } => AttemptOutcome::Ambiguous,
        ConnectorError::Misconfigured { .. } => AttemptOutcome::Misconfigured,
        // A class newer than this engine is retried, as `retry_or_dead` treats it.
        _ => AttemptOutcome::Retryable,
    }
}

/// Dead-lettered before any call: an earlier write that may have reached the CRM still may
/// have, and keeps counting for ordering.
fn dead_as_it_was(item: &LeasedItem, reason: String) -> Finish {
    Finish::Dead { error: reason, doubt: Doubt::of(item) }
}

/// The write is in the CRM: `done`, and the entity's version moves forward.
fn applied(item: &LeasedItem, record_id: String) -> Finish {
    Finish::Applied {
        record_id,
        version: item.version.as_ref().map(|sort_key| AppliedVersion {
            sort_key: sort_key.clone(),
            text: item.version_text.clone().unwrap_or_else(|| sort_key.clone()),
        }),
    }
}

/// Exponential backoff from `backoff_initial`, capped at `backoff_max`, with the last
/// `jitter` fraction randomised so that retries of many items spread out; never earlier than
/// the CRM's retry-after.
pub fn backoff(policy: &DeliveryPolicy, attempt: i64, retry_after: Option<Duration>) -> Duration {
    let exponent = u32::try_from(attempt.saturating_sub(1).clamp(0, 30)).unwrap_or(30);
    let base = policy
        .backoff_initial
        .0
        .saturating_mul(2u32.saturating_pow(exponent))
        .min(policy.backoff_max.0);
    let jitter: f64 = rand::rng().random::<f64>() * policy.jitter;
    let delay = base.mul_f64(1.0 - jitter);
    match retry_after {
        Some(after) => delay.max(after.min(RETRY_AFTER_MAX)),
        None => delay,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookgate_pipeline::model::HumanDuration;

    fn policy(jitter: f64) -> DeliveryPolicy {
        DeliveryPolicy {
            attempts_max: 10,
            backoff_initial: HumanDuration(Duration::from_secs(1)),
            backoff_max: HumanDuration(Duration::from_secs(60)),
            jitter,
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let secs: Vec<u64> =
            (1..=8).map(|attempt| backoff(&policy(0.0), attempt, None).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60]);
    }

    #[test]
    fn jitter_spreads_delays_within_its_fraction() {
        let delays: Vec<Duration> = (0..200).map(|_| backoff(&policy(0.5), 3, None)).collect();
        assert!(delays.iter().all(|d| *d > Duration::from_secs(2) && *d <= Duration::from_secs(4)));
        let distinct: std::collections::HashSet<_> = delays.iter().collect();
        assert!(distinct.len() > 50, "jitter varies the delay");
    }

    #[test]
    fn retry_after_is_a_floor() {
        assert_eq!(
            backoff(&policy(0.0), 1, Some(Duration::from_secs(30))),
            Duration::from_secs(30)
        );
        assert_eq!(backoff(&policy(0.0), 7, Some(Duration::from_secs(2))), Duration::from_secs(60));
        assert_eq!(backoff(&policy(0.0), 1, Some(Duration::from_secs(86_400))), RETRY_AFTER_MAX);
    }
}
