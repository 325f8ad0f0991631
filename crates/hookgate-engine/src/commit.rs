//! Group commit for intake: concurrent deliveries share one transaction and one commit (one
//! WAL sync), each answered only after the commit that holds it.
//!
//! **The batching window is zero.** A committer takes the first delivery waiting, then only
//! those already queued behind it, and commits at once: it never waits for a batch to fill.
//! At low load every batch is one delivery and nothing is added to its latency; under load,
//! deliveries queue while the previous commit syncs, and the next commit takes them all. The
//! batch grows with the load, bounded by `batch_max`.
//!
//! **One bad delivery does not fail its batch-mates.** Duplicates and conflicts are per-item
//! outcomes inside the transaction already. If the transaction itself fails for a reason other
//! than the database being unavailable, each delivery of the batch is recorded again in a
//! transaction of its own, so only the one at fault fails.
//!
//! **Bounds.** The queue holds `queue_max` deliveries: one more is refused at once as
//! unavailable (503 with Retry-After), never acknowledged. A delivery waits at most `wait_max`
//! for its commit; past it the sender gets 503. If its commit happens later anyway, the
//! sender's retry is a duplicate, which is what at-least-once senders expect.
//!
//! **A held connection.** On PostgreSQL a committer keeps its pool connection while deliveries
//! keep coming (see `hookgate_store::IntakeWriter`) and gives it back after `HOLD_IDLE` without
//! one, so an idle gateway holds no connection and its pool can close.

use std::sync::Arc;
use std::time::Duration;

use hookgate_store::{IntakeRecord, IntakeWriter, NewDelivery, NewOutboxItem, Store, StoreError};
use tokio::sync::{Mutex, mpsc, oneshot};

/// Group commit's bounds.
#[derive(Debug, Clone, Copy)]
pub struct GroupCommitConfig {
    /// Deliveries in one transaction at most.
    pub batch_max: usize,
    /// Deliveries waiting for a committer at most.
    pub queue_max: usize,
    /// Transactions in flight at once: 1 for SQLite (one writer). On PostgreSQL one gives the
    /// largest batches (measured best on two cores next to the database); more overlap one
    /// batch's round trips with another's when the database is far away.
    pub committers: usize,
    /// How long a delivery waits for its commit.
    pub wait_max: Duration,
}

impl Default for GroupCommitConfig {
    fn default() -> GroupCommitConfig {
        GroupCommitConfig {
            batch_max: 64,
            queue_max: 1024,
            committers: 1,
            wait_max: Duration::from_secs(10),
        }
    }
}

/// A delivery moved to a committer, with the channel its record goes back on.
#[derive(Debug)]
pub(crate) struct Queued {
    pub pipeline: String,
    pub scope: String,
    pub key: String,
    pub fingerprint: String,
    pub event_type: Option<String>,
    pub received_at_ms: i64,
    pub headers_json: String,
    pub headers_excerpt_json: String,
    pub body: Vec<u8>,
    pub sealed_with: Option<String>,
    pub outbox: Vec<NewOutboxItem>,
}

impl Queued {
    pub(crate) fn from_new(new: &NewDelivery<'_>) -> Queued {
        Queued {
            pipeline: new.pipeline.to_owned(),
            scope: new.scope.to_owned(),
            key: new.key.to_owned(),
            fingerprint: new.fingerprint.to_owned(),
            event_type: new.event_type.map(str::to_owned),
            received_at_ms: new.received_at_ms,
            headers_json: new.headers_json.to_owned(),
            headers_excerpt_json: new.headers_excerpt_json.to_owned(),
            body: new.body.to_vec(),
            sealed_with: new.sealed_with.map(str::to_owned),
            outbox: new.outbox.clone(),
        }
    }

    fn as_new(&self) -> NewDelivery<'_> {
        NewDelivery {
            pipeline: &self.pipeline,
            scope: &self.scope,
            key: &self.key,
            fingerprint: &self.fingerprint,
            event_type: self.event_type.as_deref(),
            received_at_ms: self.received_at_ms,
            headers_json: &self.headers_json,
            headers_excerpt_json: &self.headers_excerpt_json,
            body: &self.body,
            sealed_with: self.sealed_with.as_deref(),
            outbox: self.outbox.clone(),
        }
    }
}

/// How long a committer keeps its connection with no delivery to commit.
const HOLD_IDLE: Duration = Duration::from_secs(1);

type Reply = oneshot::Sender<Result<IntakeRecord, StoreError>>;

/// The committers and the queue to them. Cloned handles share them; the committers stop when
/// the last handle is dropped.
#[derive(Debug, Clone)]
pub struct GroupCommit {
    queue: mpsc::Sender<(Queued, Reply)>,
    wait_max: Duration,
}

/// The error of a delivery that never reached the database, or whose batch could not.
fn unavailable(why: &str) -> StoreError {
    StoreError::Busy(why.to_owned())
}

impl GroupCommit {
    /// Starts the committers on the current runtime.
    pub fn start(store: Store, config: GroupCommitConfig) -> GroupCommit {
        let (queue, receiver) = mpsc::channel(config.queue_max.max(1));
        let receiver = Arc::new(Mutex::new(receiver));
        for _ in 0..config.committers.max(1) {
            let (store, receiver) = (store.clone(), Arc::clone(&receiver));
            tokio::spawn(supervised(store, receiver, config.batch_max.max(1)));
        }
        GroupCommit { queue, wait_max: config.wait_max }
    }

    /// Records a delivery; returns once the transaction holding it has committed (or failed).
    pub async fn record_delivery(
        &self,
        delivery: &NewDelivery<'_>,
    ) -> Result<IntakeRecord, StoreError> {
        self.record(Queued::from_new(delivery)).await
    }

    pub(crate) async fn record(&self, queued: Queued) -> Result<IntakeRecord, StoreError> {
        let (reply, answer) = oneshot::channel();
        if let Err(error) = self.queue.try_send((queued, reply)) {
            let why = match error {
                mpsc::error::TrySendError::Full(_) => "intake queue full",
                mpsc::error::TrySendError::Closed(_) => "intake committers stopped",
            };
            metrics::counter!("hookgate_intake_queue_refusals_total").increment(1);
            return Err(unavailable(why));
        }
        match tokio::time::timeout(self.wait_max, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(unavailable("the intake committer stopped")),
            Err(_) => Err(unavailable("no commit within the intake wait")),
        }
    }
}

/// Runs a committer, and starts it again if it panics: the queue must outlive a bug, or every
/// later delivery would be refused. The batch it held is answered 503 (its replies dropped).
async fn supervised(
    store: Store,
    receiver: Arc<Mutex<mpsc::Receiver<(Queued, Reply)>>>,
    batch_max: usize,
) {
    loop {
        let task = tokio::spawn(committer(store.clone(), Arc::clone(&receiver), batch_max));
        match task.await {
            Err(error) if error.is_panic() => {
                tracing::error!("an intake committer panicked; starting it again");
                metrics::counter!("hookgate_intake_committer_panics_total").increment(1);
            }
            // The queue closed (every handle dropped), or the runtime is shutting down.
            _ => return,
        }
    }
}

async fn committer(
    store: Store,
    receiver: Arc<Mutex<mpsc::Receiver<(Queued, Reply)>>>,
    batch_max: usize,
) {
    let mut writer = store.intake_writer();
    loop {
        let mut batch = Vec::new();
        {
            let mut receiver = receiver.lock().await;
            let first = match tokio::time::timeout(HOLD_IDLE, receiver.recv()).await {
                Ok(first) => first,
                Err(_) => {
                    writer.release();
                    receiver.recv().await
                }
            };
            let Some(first) = first else { return };
            batch.push(first);
            // What queued while the last commit synced: no waiting for more.
            while batch.len() < batch_max {
                match receiver.try_recv() {
                    Ok(next) => batch.push(next),
                    Err(_) => break,
                }
            }
        }
        // A sender that stopped waiting (its wait ran out, or it hung up) never got a 202:
        // its delivery is not worth a commit, and its retry is on its way.
        batch.retain(|(_, reply)| !reply.is_closed());
        if batch.is_empty() {
            continue;
        }
        if let Err(why) = commit(&mut writer, batch).await {
            // The database is down: what queued meanwhile would wait for the same refusal,
            // one acquire timeout after another. Answer it now.
            let mut receiver = receiver.lock().await;
            while let Ok((_, reply)) = receiver.try_recv() {
                let _ = reply.send(Err(unavailable(&why)));
            }
        }
    }
}

/// Commits a batch and answers each delivery; `Err` with the reason when the database was
/// unavailable.
async fn commit(writer: &mut IntakeWriter, batch: Vec<(Queued, Reply)>) -> Result<(), String> {
    metrics::histogram!("hookgate_intake_batch_size").record(batch.len() as f64);
    let news: Vec<NewDelivery<'_>> = batch.iter().map(|(queued, _)| queued.as_new()).collect();
    match writer.record_batch(&news).await {
        Ok(records) => {
            drop(news);
            for ((_, reply), record) in batch.into_iter().zip(records) {
                let _ = reply.send(Ok(record));
            }
            Ok(())
        }
        Err(error) if error.is_unavailable() || batch.len() == 1 => {
            let text = error.to_string();
            let down = error.is_unavailable();
            drop(news);
            let mut batch = batch.into_iter();
            if let Some((_, reply)) = batch.next() {
                let _ = reply.send(Err(error));
            }
            for (_, reply) in batch {
                let _ = reply.send(Err(unavailable(&text)));
            }
            if down { Err(text) } else { Ok(()) }
        }
        Err(error) => {
            // Something in the batch failed it: each alone, so that only that one fails.
            tracing::warn!(%error, deliveries = batch.len(), "an intake batch failed; recording each alone");
            drop(news);
            let mut down: Option<String> = None;
            for (queued, reply) in batch {
                // Once the database is gone, the rest would each wait out an acquire timeout.
                if let Some(why) = &down {
                    let _ = reply.send(Err(unavailable(why)));
                    continue;
                }
                let record = writer
                    .record_batch(std::slice::from_ref(&queued.as_new()))
                    .await
                    .map(|mut records| records.pop().expect("one record per delivery"));
                if let Err(error) = &record
                    && error.is_unavailable()
                {
                    down = Some(error.to_string());
                }
                let _ = reply.send(record);
            }
            down.map_or(Ok(()), Err)
        }
    }
}
