//! Delivery: leased workers that turn outbox items into CRM writes.
//!
//! # One item, from lease to outcome
//! 1. Lease it (an expiry bounds how long a dead worker can hold it).
//! 2. Version guard: an item whose version is not newer than the entity's last applied version
//!    is `skipped_stale`, never written.
//! 3. Record the attempt's start; the item is *in doubt* until the attempt ends.
//! 4. If a previous attempt ended in doubt (a timeout, a lost answer, a worker killed mid-call),
//!    look the record up first: if the CRM already shows the write, it is `done`.
//! 5. Render the target from the stored raw payload and call the connector, under a timeout.
//! 6. Classify: success → `done`; retryable, rate-limited or misconfigured → retry with
//!    exponential backoff and jitter, no earlier than the CRM's retry-after, or dead-letter
//!    when attempts are exhausted; rejected → dead-letter; ambiguous → look up at once, then
//!    `done` or retry.
//! 7. Finish, fenced by the lease: a worker whose lease expired cannot overwrite the work of
//!    the one that took over.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hookgate_connector::{
    Answer, Connector, ConnectorError, LookupOutcome, LookupRequest, Operation, UpsertRequest,
};
use hookgate_pipeline::evaluate::{Delivery, Upsert};
use hookgate_pipeline::model::DeliveryPolicy;
use hookgate_store::{Finish, LeasedItem, StoreError, state};
use rand::Rng;
use tokio::task::JoinSet;

use crate::{Gateway, ServedPipeline, now_ms};

/// Connector instances by name, as targets refer to them.
pub type Connectors = HashMap<String, Arc<dyn Connector>>;

/// A retry-after beyond this is treated as this: a CRM asking for a day's pause should not
/// park an item for a day without an operator noticing.
const RETRY_AFTER_MAX: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Names this process's leases in evidence.
    pub worker_id: String,
    /// Items worked on at once by this process.
    pub concurrency: usize,
    /// How long a lease lasts; must exceed `call_timeout` so a live call never loses its lease.
    pub lease: Duration,
    /// How long a CRM call may take before its outcome is treated as unknown.
    pub call_timeout: Duration,
    /// How long to sleep when there is nothing to do.
    pub idle_poll: Duration,
}

impl Default for WorkerConfig {
    fn default() -> WorkerConfig {
        WorkerConfig {
            worker_id: format!("worker-{}", std::process::id()),
            concurrency: 8,
            lease: Duration::from_secs(60),
            call_timeout: Duration::from_secs(30),
            idle_poll: Duration::from_millis(250),
        }
    }
}

/// The workers of one process.
#[derive(Debug, Clone)]
pub struct Worker {
    gateway: Gateway,
    connectors: Arc<Connectors>,
    config: Arc<WorkerConfig>,
}

impl Worker {
    pub fn new(gateway: Gateway, connectors: Connectors, config: WorkerConfig) -> Worker {
        assert!(config.lease > config.call_timeout, "a lease must outlive the call it covers");
        Worker { gateway, connectors: Arc::new(connectors), config: Arc::new(config) }
    }

    /// Works until `shutdown` completes, then finishes the items in hand and returns.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut in_hand = JoinSet::new();
        loop {
            while in_hand.try_join_next().is_some() {}
            let free = self.config.concurrency.saturating_sub(in_hand.len());
            let leased = if free > 0 { self.lease(free).await } else { Vec::new() };
            let idle = leased.is_empty();
            for item in leased {
                let worker = self.clone();
                in_hand.spawn(async move { worker.process(item).await });
            }
            if idle || free == 0 {
                tokio::select! {
                    () = &mut shutdown => break,
                    _ = in_hand.join_next(), if !in_hand.is_empty() => {}
                    () = tokio::time::sleep(self.config.idle_poll) => {}
                }
            }
        }
        tracing::info!(worker = %self.config.worker_id, in_hand = in_hand.len(), "workers stopping");
        while in_hand.join_next().await.is_some() {}
    }

    async fn lease(&self, free: usize) -> Vec<LeasedItem> {
        let now = now_ms();
        let expires = now + i64::try_from(self.config.lease.as_millis()).unwrap_or(i64::MAX);
        let owner = format!("{}/{:08x}", self.config.worker_id, rand::random::<u32>());
        let limit = i64::try_from(free).unwrap_or(1);
        match self.gateway.store.lease(&owner, now, expires, limit).await {
            Ok(items) => items,
            Err(error) => {
                tracing::warn!(error = %error, "leasing failed; retrying after the idle poll");
                Vec::new()
            }
        }
    }

    /// Works one item to its next state. Database failures leave the item leased: when the
    /// lease expires it is picked up again, in doubt, and reconciled.
    pub async fn process(&self, item: LeasedItem) {
        if let Err(error) = self.try_process(&item).await {
            tracing::warn!(item = item.id, event_id = item.event_id, error = %error, "could not record an outcome");
        }
    }

    async fn try_process(&self, item: &LeasedItem) -> Result<(), StoreError> {
        let store = &self.gateway.store;
        let (pipeline, upsert) = match self.prepare(item).await? {
            Ok(prepared) => prepared,
            Err(reason) => {
                tracing::error!(item = item.id, event_id = item.event_id, %reason, "dead-lettered before any call");
                let finish = Finish {
                    error: Some(reason.clone()),
                    ..finish(state::DEAD, "prepare", "dead", &Answer::default())
                };
                self.finish(item, None, &finish, now_ms()).await?;
                return Ok(());
            }
        };

        if let Some(version) = &item.version
            && let Some(applied) =
                store.entity_version(&item.pipeline, &item.target, &item.entity).await?
            && applied >= *version
        {
            let reason = format!(
                "version {version} is not newer than {applied}, already applied to {}",
                item.entity
            );
            tracing::info!(item = item.id, event_id = item.event_id, %reason, "skipped stale");
            let attempt = store.start_attempt(item, "version_check", now_ms()).await?;
            let finish = Finish {
                error: Some(reason),
                ..finish(state::SKIPPED_STALE, "version_check", "skipped_stale", &Answer::default())
            };
            self.finish(item, attempt, &finish, now_ms()).await?;
            return Ok(());
        }

        let Some(connector) = self.connectors.get(&upsert.connector).cloned() else {
            let reason = format!("connector instance `{}` is not configured", upsert.connector);
            let finish = Finish {
                error: Some(reason),
                ..finish(state::DEAD, "prepare", "dead", &Answer::default())
            };
            self.finish(item, None, &finish, now_ms()).await?;
            return Ok(());
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
        let action = if item.in_doubt { "lookup+upsert" } else { "upsert" };
        let Some(attempt) = store.start_attempt(item, action, now_ms()).await? else {
            tracing::info!(item = item.id, "lease lost before the call");
            return Ok(());
        };

        if item.in_doubt {
            match self.reconcile(connector.as_ref(), &request).await {
                Reconciled::Applied { record_id, answer } => {
                    tracing::info!(item = item.id, event_id = item.event_id, %record_id, "reconciled: the CRM already shows the write");
                    let finish = Finish {
                        record_id: Some(record_id),
                        applied_version: item.version.clone(),
                        ..finish(state::DONE, "lookup", "reconciled", &answer)
                    };
                    self.finish(item, Some(attempt), &finish, now_ms()).await?;
                    return Ok(());
                }
                Reconciled::NotApplied => {}
                Reconciled::Unknown(error) => {
                    let finish = self.retry_or_dead(
                        item,
                        &pipeline.compiled.delivery,
                        &error,
                        true,
                        "lookup",
                    );
                    self.finish(item, Some(attempt), &finish, now_ms()).await?;
                    return Ok(());
                }
            }
        }

        let result = match tokio::time::timeout(
            self.config.call_timeout,
            connector.upsert(&request),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => Err(ConnectorError::Ambiguous {
                message: format!("no answer within {:?}", self.config.call_timeout),
                answer: Answer::default(),
            }),
        };
        let finish = match result {
            Ok(outcome) => {
                tracing::info!(item = item.id, event_id = item.event_id, record_id = %outcome.record_id, created = outcome.created, "delivered");
                Finish {
                    record_id: Some(outcome.record_id.clone()),
                    applied_version: item.version.clone(),
                    ..finish(
                        state::DONE,
                        action,
                        if outcome.created { "created" } else { "updated" },
                        &outcome.answer,
                    )
                }
            }
            Err(ConnectorError::Rejected { message, answer }) => {
                tracing::warn!(item = item.id, event_id = item.event_id, %message, "rejected by the CRM: dead-lettered");
                Finish {
                    error: Some(format!("rejected: {message}")),
                    ..finish(state::DEAD, action, "rejected", &answer)
                }
            }
            Err(ambiguous @ ConnectorError::Ambiguous { .. }) => {
                // The write may have happened: look before writing again.
                match self.reconcile(connector.as_ref(), &request).await {
                    Reconciled::Applied { record_id, .. } => {
                        tracing::info!(
                            item = item.id,
                            event_id = item.event_id,
                            "ambiguous answer reconciled: the write was applied"
                        );
                        Finish {
                            record_id: Some(record_id),
                            applied_version: item.version.clone(),
                            error: Some(ambiguous.to_string()),
                            ..finish(state::DONE, "upsert+lookup", "reconciled", ambiguous.answer())
                        }
                    }
                    Reconciled::NotApplied => self.retry_or_dead(
                        item,
                        &pipeline.compiled.delivery,
                        &ambiguous,
                        false,
                        "upsert+lookup",
                    ),
                    Reconciled::Unknown(_) => self.retry_or_dead(
                        item,
                        &pipeline.compiled.delivery,
                        &ambiguous,
                        true,
                        "upsert+lookup",
                    ),
                }
            }
            Err(error) => {
                self.retry_or_dead(item, &pipeline.compiled.delivery, &error, false, action)
            }
        };
        if !self.finish(item, Some(attempt), &finish, now_ms()).await? {
            tracing::warn!(
                item = item.id,
                "lease lost during the call; the next holder reconciles"
            );
        }
        Ok(())
    }

    /// Records an attempt's end through the store, and counts it.
    async fn finish(
        &self,
        item: &LeasedItem,
        attempt: Option<i64>,
        finish: &Finish,
        now: i64,
    ) -> Result<bool, StoreError> {
        let recorded = self.gateway.store.finish(item, attempt, finish, now).await?;
        if recorded {
            metrics::counter!("hookgate_attempts_total", "pipeline" => item.pipeline.clone(), "target" => item.target.clone(), "outcome" => finish.outcome.clone()).increment(1);
            if finish.state != state::PENDING {
                metrics::counter!("hookgate_writes_finished_total", "pipeline" => item.pipeline.clone(), "target" => item.target.clone(), "state" => finish.state).increment(1);
            }
        }
        Ok(recorded)
    }

    /// Loads the event and renders its target. The inner error is a reason to dead-letter.
    async fn prepare(
        &self,
        item: &LeasedItem,
    ) -> Result<Result<(&ServedPipeline, Upsert), String>, StoreError> {
        let Some(pipeline) = self.gateway.pipelines.get(&item.pipeline) else {
            return Ok(Err(format!("pipeline `{}` is no longer configured", item.pipeline)));
        };
        let index = usize::try_from(item.target_index).unwrap_or(usize::MAX);
        match pipeline.compiled.targets.get(index) {
            Some(target) if target.name == item.target => {}
            _ => {
                return Ok(Err(format!(
                    "target `{}` is no longer configured at position {index}",
                    item.target
                )));
            }
        }
        let Some(event) = self.gateway.store.event(item.event_id).await? else {
            return Ok(Err("the event is gone".to_owned()));
        };
        let pairs: Vec<[String; 2]> = serde_json::from_str(&event.headers_json).unwrap_or_default();
        let headers: Vec<(String, Vec<u8>)> =
            pairs.into_iter().map(|[n, v]| (n, v.into_bytes())).collect();
        let delivery = Delivery { headers: &headers, body: &event.body };
        let rendered = pipeline
            .compiled
            .identify(&delivery)
            .and_then(|(_, ctx)| pipeline.compiled.render_target(index, &ctx))
            .map_err(|e| format!("cannot render the write: {e}"));
        Ok(rendered.map(|upsert| (pipeline, upsert)))
    }

    async fn reconcile(&self, connector: &dyn Connector, request: &UpsertRequest) -> Reconciled {
        let lookup = LookupRequest::from(request);
        match tokio::time::timeout(self.config.call_timeout, connector.lookup(&lookup)).await {
            Ok(Ok(LookupOutcome::Found { record_id, fields, answer })) => {
                let shows_write =
                    request.fields.iter().all(|(name, value)| fields.get(name) == Some(value));
                if shows_write {
                    Reconciled::Applied { record_id, answer }
                } else {
                    Reconciled::NotApplied
                }
            }
            Ok(Ok(LookupOutcome::NotFound { .. })) => Reconciled::NotApplied,
            Ok(Err(error)) => Reconciled::Unknown(error),
            Err(_) => Reconciled::Unknown(ConnectorError::Ambiguous {
                message: "the lookup timed out".into(),
                answer: Answer::default(),
            }),
        }
    }

    fn retry_or_dead(
        &self,
        item: &LeasedItem,
        policy: &DeliveryPolicy,
        error: &ConnectorError,
        in_doubt: bool,
        action: &'static str,
    ) -> Finish {
        let exhausted = item.attempts >= i64::from(policy.attempts_max);
        if exhausted {
            tracing::warn!(item = item.id, event_id = item.event_id, attempts = item.attempts, %error, "attempts exhausted: dead-lettered");
            return Finish {
                error: Some(format!("attempts exhausted ({}): {error}", item.attempts)),
                in_doubt,
                ..finish(state::DEAD, action, error.class(), error.answer())
            };
        }
        let delay = backoff(policy, item.attempts, error.retry_after());
        tracing::info!(item = item.id, event_id = item.event_id, attempt = item.attempts, delay_ms = delay.as_millis() as u64, %error, "will retry");
        Finish {
            next_attempt_at_ms: now_ms() + i64::try_from(delay.as_millis()).unwrap_or(i64::MAX),
            in_doubt,
            error: Some(error.to_string()),
            ..finish(state::PENDING, action, error.class(), error.answer())
        }
    }
}

enum Reconciled {
    Applied { record_id: String, answer: Answer },
    NotApplied,
    Unknown(ConnectorError),
}

fn finish(state: &'static str, action: &'static str, outcome: &str, answer: &Answer) -> Finish {
    Finish {
        state,
        next_attempt_at_ms: 0,
        in_doubt: false,
        record_id: None,
        error: None,
        action,
        outcome: outcome.to_owned(),
        status: answer.status.map(i64::from),
        excerpt: answer.excerpt.clone(),
        meta: (!answer.meta.is_empty())
            .then(|| serde_json::to_string(&answer.meta).unwrap_or_default()),
        applied_version: None,
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
