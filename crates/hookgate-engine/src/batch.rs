//! Delivery in batches, under an unchanged per-item state machine.
//!
//! Each leased item is still worked by its own task, step by step, exactly as alone (see
//! `worker`). What is shared is the trip to the database and to the CRM: the steps that many
//! tasks reach at about the same time are coalesced.
//! - **Finishing items** (and, when a lease no longer covers a call, **renewing leases**) go
//!   through a [`Batcher`] to [`Store::finish_batch`] (and [`Store::renew_leases`]): one
//!   transaction, a few multi-row statements, one WAL sync for every item that was waiting.
//! - **Writes to a CRM with a batch call** ([`Connector::batch_max`] > 1) go through an
//!   [`UpsertBatcher`]: one call for every write waiting, each answered with its own outcome.
//!
//! As for intake, **the window is zero**: a batch is what queued while the previous one was
//! out, so at low load a batch is one item and nothing waits for company. Under a backlog the
//! batches grow to the number of items in hand (`--workers`), bounded by `batch_max`.
//!
//! A batch that fails for a reason other than the database being down is done again one item
//! at a time, so that one item cannot fail the others. A batch whose task panics drops its
//! replies: each waiting item sees an error and stays leased, to be taken up again when its
//! lease ends, as after a crash.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::budget::{CallBudget, Permit};
use hookgate_connector::{Answer, Connector, ConnectorError, UpsertOutcome, UpsertRequest};
use hookgate_store::{Call, Finish, FinishItem, LeasedItem, Renewal, Store, StoreError};
use tokio::sync::{Mutex, mpsc, oneshot};
use tokio::time::Instant;

/// Coalesces requests that queue while a batch is out into the next batch.
#[derive(Debug)]
pub(crate) struct Batcher<Req, Resp> {
    queue: mpsc::Sender<(Req, oneshot::Sender<Resp>)>,
}

impl<Req, Resp> Clone for Batcher<Req, Resp> {
    fn clone(&self) -> Self {
        Batcher { queue: self.queue.clone() }
    }
}

impl<Req: Send + 'static, Resp: Send + 'static> Batcher<Req, Resp> {
    /// Starts `runners` loops on the current runtime, each running one batch of at most
    /// `batch_max` requests at a time through `run`, which answers each request in order.
    /// At most `capacity` requests wait.
    pub(crate) fn start<F, Fut>(batch_max: usize, runners: usize, capacity: usize, run: F) -> Self
    where
        F: Fn(Vec<Req>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<Resp>> + Send + 'static,
    {
        let (queue, receiver) = mpsc::channel(capacity.max(1));
        let receiver = Arc::new(Mutex::new(receiver));
        let run = Arc::new(run);
        for _ in 0..runners.max(1) {
            let (receiver, run) = (Arc::clone(&receiver), Arc::clone(&run));
            tokio::spawn(async move {
                loop {
                    let mut batch = Vec::new();
                    {
                        let mut receiver = receiver.lock().await;
                        let Some(first) = receiver.recv().await else { return };
                        batch.push(first);
                        while batch.len() < batch_max.max(1) {
                            match receiver.try_recv() {
                                Ok(next) => batch.push(next),
                                Err(_) => break,
                            }
                        }
                    }
                    let (requests, replies): (Vec<Req>, Vec<oneshot::Sender<Resp>>) =
                        batch.into_iter().unzip();
                    // Its own task: a panic drops this batch's replies, not the loop.
                    let answers = tokio::spawn(run(requests)).await;
                    if let Ok(answers) = answers {
                        for (reply, answer) in replies.into_iter().zip(answers) {
                            let _ = reply.send(answer);
                        }
                    }
                }
            });
        }
        Batcher { queue }
    }

    /// `None`: the batch holding the request failed without answering (a panic), or the
    /// batcher is gone.
    pub(crate) async fn call(&self, request: Req) -> Option<Resp> {
        let (reply, answer) = oneshot::channel();
        self.queue.send((request, reply)).await.ok()?;
        answer.await.ok()
    }
}

/// A lease to renew, owned so that it can wait in a queue: the item and its lease's new end.
pub(crate) type Renew = (LeasedItem, i64);

/// The store's batched steps.
#[derive(Debug, Clone)]
pub(crate) struct StoreBatches {
    renew: Batcher<Renew, Result<bool, StoreError>>,
    finish: Batcher<(LeasedItem, Finish, Vec<Call>), Result<bool, StoreError>>,
}

/// The error an item sees when its batch could not answer it.
fn unanswered() -> StoreError {
    StoreError::Busy("the batch holding this step failed".to_owned())
}

impl StoreBatches {
    /// `capacity`: items in hand at most, so that every one may wait at once.
    pub(crate) fn start(store: &Store, batch_max: usize, capacity: usize) -> StoreBatches {
        let for_renew = store.clone();
        let renew = Batcher::start(batch_max, 1, capacity, move |renewals: Vec<Renew>| {
            let store = for_renew.clone();
            async move {
                metrics::histogram!("hookgate_renew_batch_size").record(renewals.len() as f64);
                let refs: Vec<Renewal<'_>> = renewals
                    .iter()
                    .map(|(item, lease_expires_at_ms)| Renewal {
                        item,
                        lease_expires_at_ms: *lease_expires_at_ms,
                    })
                    .collect();
                let renewed = store.renew_leases(&refs).await;
                match renewed {
                    Ok(renewed) => renewed.into_iter().map(Ok).collect(),
                    Err(error) if error.is_unavailable() || refs.len() == 1 => {
                        each_fails(error, refs.len())
                    }
                    Err(error) => {
                        tracing::warn!(%error, leases = refs.len(), "a batch of lease renewals failed; renewing each alone");
                        let mut answers = Vec::with_capacity(refs.len());
                        for renewal in &refs {
                            answers.push(
                                store
                                    .renew_leases(std::slice::from_ref(renewal))
                                    .await
                                    .map(|held| held.first().copied().unwrap_or(false)),
                            );
                        }
                        answers
                    }
                }
            }
        });
        let for_finish = store.clone();
        let finish = Batcher::start(
            batch_max,
            2,
            capacity,
            move |finishes: Vec<(LeasedItem, Finish, Vec<Call>)>| {
                let store = for_finish.clone();
                async move {
                    metrics::histogram!("hookgate_finish_batch_size").record(finishes.len() as f64);
                    let now = crate::now_ms();
                    let refs: Vec<FinishItem<'_>> = finishes
                        .iter()
                        .map(|(item, finish, calls)| FinishItem { item, finish, calls })
                        .collect();
                    let started = std::time::Instant::now();
                    let finished = store.finish_batch(&refs, now).await;
                    metrics::histogram!("hookgate_store_batch_seconds", "step" => "finish")
                        .record(started.elapsed().as_secs_f64());
                    match finished {
                        Ok(finished) => finished.into_iter().map(Ok).collect(),
                        Err(error) if error.is_unavailable() || refs.len() == 1 => {
                            each_fails(error, refs.len())
                        }
                        Err(error) => {
                            tracing::warn!(%error, items = refs.len(), "a batch of finishes failed; finishing each alone");
                            let mut answers = Vec::with_capacity(refs.len());
                            for item in &refs {
                                answers.push(
                                    store.finish(item.item, item.finish, item.calls, now).await,
                                );
                            }
                            answers
                        }
                    }
                }
            },
        );
        StoreBatches { renew, finish }
    }

    /// Whether `item`'s lease still held, and now lasts until `lease_expires_at_ms`.
    pub(crate) async fn renew(
        &self,
        item: LeasedItem,
        lease_expires_at_ms: i64,
    ) -> Result<bool, StoreError> {
        self.renew.call((item, lease_expires_at_ms)).await.unwrap_or_else(|| Err(unanswered()))
    }

    pub(crate) async fn finish(
        &self,
        item: LeasedItem,
        finish: Finish,
        calls: Vec<Call>,
    ) -> Result<bool, StoreError> {
        self.finish.call((item, finish, calls)).await.unwrap_or_else(|| Err(unanswered()))
    }
}

/// Every item of a batch fails: the first with the error itself, the rest with its text.
fn each_fails<T>(error: StoreError, count: usize) -> Vec<Result<T, StoreError>> {
    let text = error.to_string();
    let mut answers = vec![Err(error)];
    answers.extend((1..count).map(|_| Err(StoreError::Busy(text.clone()))));
    answers
}

/// How long a call under a budget waits for its batch to fill: a permit spent on a partial
/// batch is a call the window does not give back, and writes a worker has just leased reach
/// the queue within milliseconds.
const BUDGETED_FILL: Duration = Duration::from_millis(100);

/// A write waiting for a batch call, with the time its caller stops waiting.
#[derive(Debug)]
struct QueuedWrite {
    request: UpsertRequest,
    deadline: Instant,
    budget: Duration,
}

type WriteReply = oneshot::Sender<Result<UpsertOutcome, ConnectorError>>;

/// Coalesces one connector's writes into its batch calls.
///
/// - **A batch never outlives a caller.** Each write carries its caller's deadline (the call
///   budget its lease allows); a batch is given the earliest deadline of its writes, and a
///   write whose caller has given up (deadline passed, or stopped waiting) is never sent. So
///   as with a single call, no write is still out when another worker may take the entity
///   over. A write that waited for more than half its budget is not sent either (answered
///   retryable: nothing was written), so that one late write cannot cut a batch short.
/// - **One write per record per batch.** A second write naming a record already in the batch
///   waits for the next one (HubSpot refuses a batch that names a record twice).
/// - **Calls in flight are bounded** by `calls_max`: under a backlog, writes queue into fuller
///   batches instead of more calls (what rate limits count).
#[derive(Debug, Clone)]
pub(crate) struct UpsertBatcher {
    queue: mpsc::Sender<(QueuedWrite, WriteReply)>,
}

impl UpsertBatcher {
    pub(crate) fn start(
        name: &str,
        connector: Arc<dyn Connector>,
        calls_max: usize,
        capacity: usize,
        budget: Option<Arc<CallBudget>>,
    ) -> UpsertBatcher {
        let (queue, receiver) = mpsc::channel(capacity.max(1));
        let receiver = Arc::new(Mutex::new((receiver, Vec::new())));
        let batch_max = connector.batch_max().max(1);
        for _ in 0..calls_max.max(1) {
            let (receiver, connector, name) =
                (Arc::clone(&receiver), Arc::clone(&connector), name.to_owned());
            let budget = budget.clone();
            tokio::spawn(async move {
                loop {
                    // The permit first, the batch after: what queues while the budget holds
                    // calls back fills the call it is waiting for.
                    let permit = match &budget {
                        Some(budget) => Some(budget.permit().await),
                        None => None,
                    };
                    let batch = {
                        let mut guard = receiver.lock().await;
                        let (receiver, held_over) = &mut *guard;
                        // Under a budget a call is worth a full batch: what is queued gets a
                        // moment to fill it.
                        let fill_for = budget.as_ref().map(|_| BUDGETED_FILL);
                        let Some(batch) = gather(receiver, held_over, batch_max, fill_for).await
                        else {
                            return;
                        };
                        batch
                    };
                    if batch.is_empty() {
                        continue;
                    }
                    let connector = Arc::clone(&connector);
                    let name = name.clone();
                    // Its own task: a panicking connector drops this batch's replies (each
                    // write is then ambiguous to its caller), not the loop.
                    let _ = tokio::spawn(send(name, connector, batch, permit)).await;
                }
            });
        }
        UpsertBatcher { queue }
    }

    /// Sends `request` in the next batch; its outcome, or ambiguous when no answer comes by
    /// `deadline` (the request may be in a batch that was sent).
    pub(crate) async fn upsert(
        &self,
        request: UpsertRequest,
        budget: Duration,
    ) -> Result<UpsertOutcome, ConnectorError> {
        let deadline = Instant::now() + budget;
        let (reply, answer) = oneshot::channel();
        let no_answer = |why: &str| ConnectorError::Ambiguous {
            message: why.to_owned(),
            answer: Answer::default(),
        };
        if self.queue.send((QueuedWrite { request, deadline, budget }, reply)).await.is_err() {
            // Never queued, never sent: nothing was written.
            return Err(ConnectorError::Retryable {
                message: "the connector's batcher stopped".to_owned(),
                retry_after: None,
                answer: Answer::default(),
            });
        }
        match tokio::time::timeout_at(deadline, answer).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Err(no_answer("the batch call holding this write failed")),
            Err(_) => Err(no_answer(&format!("no answer within {budget:?}"))),
        }
    }
}

/// The next batch: writes held over from the last gather first, then the first write to
/// come, then whatever else is queued, one per record. `None`: the queue is closed.
async fn gather(
    receiver: &mut mpsc::Receiver<(QueuedWrite, WriteReply)>,
    held_over: &mut Vec<(QueuedWrite, WriteReply)>,
    batch_max: usize,
    fill_for: Option<Duration>,
) -> Option<Vec<(QueuedWrite, WriteReply)>> {
    let mut candidates = std::mem::take(held_over);
    if candidates.is_empty() {
        candidates.push(receiver.recv().await?);
    }
    let fill_until = fill_for.map(|wait| Instant::now() + wait);
    while candidates.len() < batch_max {
        match receiver.try_recv() {
            Ok(next) => candidates.push(next),
            Err(_) => match fill_until {
                // Writes still coming (workers rendering what they leased) join this call.
                Some(until) => match tokio::time::timeout_at(until, receiver.recv()).await {
                    Ok(Some(next)) => candidates.push(next),
                    Ok(None) | Err(_) => break,
                },
                None => break,
            },
        }
    }
    let now = Instant::now();
    let mut records = HashSet::new();
    let mut batch = Vec::new();
    for (write, reply) in candidates {
        // Its caller gave up: it must never be sent.
        if reply.is_closed() || write.deadline <= now {
            continue;
        }
        // It waited more than half its time: sent now, it would cut its batch's call short
        // and leave every write of it in doubt. Not sent, it is simply retried.
        if write.deadline - now < write.budget / 2 {
            let _ = reply.send(Err(ConnectorError::Retryable {
                message: "not sent: it waited for a batch call for more than half its time".into(),
                retry_after: None,
                answer: Answer::default(),
            }));
            continue;
        }
        let record = (
            write.request.object.clone(),
            write.request.external_id_field.clone(),
            write.request.external_id_value.clone(),
        );
        if batch.len() < batch_max && records.insert(record) {
            batch.push((write, reply));
        } else {
            held_over.push((write, reply));
        }
    }
    Some(batch)
}

/// One batch call, and each write's answer.
async fn send(
    name: String,
    connector: Arc<dyn Connector>,
    batch: Vec<(QueuedWrite, WriteReply)>,
    permit: Option<Permit>,
) {
    let deadline = batch.iter().map(|(write, _)| write.deadline).min().unwrap_or_else(Instant::now);
    let (writes, replies): (Vec<QueuedWrite>, Vec<WriteReply>) = batch.into_iter().unzip();
    // What each write is told if the batch call outlives the earliest deadline.
    let late: Vec<String> = writes
        .iter()
        .map(|write| {
            if write.deadline == deadline {
                format!("no answer within {:?}", write.budget)
            } else {
                "no answer before the batch call's deadline (another write's, sooner)".to_owned()
            }
        })
        .collect();
    let requests: Vec<UpsertRequest> = writes.into_iter().map(|write| write.request).collect();
    metrics::histogram!("hookgate_crm_batch_size", "connector" => name.clone())
        .record(requests.len() as f64);
    metrics::counter!("hookgate_crm_write_calls_total", "connector" => name.clone()).increment(1);
    let call = permit.map(Permit::start);
    let started = std::time::Instant::now();
    let ambiguous =
        |message: String| ConnectorError::Ambiguous { message, answer: Answer::default() };
    let outcomes = match tokio::time::timeout_at(deadline, connector.upsert_batch(&requests)).await
    {
        Ok(outcomes) if outcomes.len() == requests.len() => outcomes,
        Ok(outcomes) => {
            let message = format!(
                "the connector answered a batch of {} writes with {} outcomes",
                requests.len(),
                outcomes.len()
            );
            tracing::error!(%message, "a connector's batch answer does not match its request");
            requests.iter().map(|_| Err(ambiguous(message.clone()))).collect()
        }
        Err(_) => late.into_iter().map(|message| Err(ambiguous(message))).collect(),
    };
    metrics::histogram!("hookgate_crm_batch_call_seconds", "connector" => name)
        .record(started.elapsed().as_secs_f64());
    if let Some(call) = &call {
        let refused = outcomes.iter().find_map(|outcome| match outcome {
            Err(ConnectorError::RateLimited { retry_after, .. }) => Some(*retry_after),
            _ => None,
        });
        if let Some(retry_after) = refused {
            call.refused(retry_after);
        }
    }
    drop(call);
    for (reply, outcome) in replies.into_iter().zip(outcomes) {
        let _ = reply.send(outcome);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex as StdMutex;

    use hookgate_connector::{
        BoxFuture, Capabilities, Description, LookupOutcome, LookupRequest, Operation,
    };

    use super::*;

    /// A CRM whose batch call takes `latency` and records each batch's external ids.
    #[derive(Debug)]
    struct SlowCrm {
        latency: Duration,
        batches: StdMutex<Vec<Vec<String>>>,
    }

    impl Connector for SlowCrm {
        fn describe(&self) -> Description {
            Description {
                kind: "slow".into(),
                version: "0".into(),
                capabilities: Capabilities::default(),
                settings_schema: serde_json::Value::Null,
            }
        }
        fn batch_max(&self) -> usize {
            10
        }
        fn upsert<'a>(
            &'a self,
            request: &'a UpsertRequest,
        ) -> BoxFuture<'a, Result<UpsertOutcome, ConnectorError>> {
            Box::pin(
                async move { self.upsert_batch(std::slice::from_ref(request)).await.remove(0) },
            )
        }
        fn upsert_batch<'a>(
            &'a self,
            requests: &'a [UpsertRequest],
        ) -> BoxFuture<'a, Vec<Result<UpsertOutcome, ConnectorError>>> {
            Box::pin(async move {
                let ids = requests.iter().map(|r| r.external_id_value.clone()).collect();
                self.batches.lock().unwrap().push(ids);
                tokio::time::sleep(self.latency).await;
                requests
                    .iter()
                    .map(|r| {
                        Ok(UpsertOutcome {
                            record_id: format!("R-{}", r.external_id_value),
                            created: true,
                            answer: Answer::default(),
                        })
                    })
                    .collect()
            })
        }
        fn lookup<'a>(
            &'a self,
            _request: &'a LookupRequest,
        ) -> BoxFuture<'a, Result<LookupOutcome, ConnectorError>> {
            Box::pin(async { Ok(LookupOutcome::NotFound { answer: Answer::default() }) })
        }
        fn healthcheck(&self) -> BoxFuture<'_, Result<(), ConnectorError>> {
            Box::pin(async { Ok(()) })
        }
    }

    fn write(id: &str) -> UpsertRequest {
        UpsertRequest {
            object: "o".into(),
            external_id_field: "id".into(),
            external_id_value: id.into(),
            fields: BTreeMap::new(),
            operation: Operation::Upsert,
            idempotency_key: format!("k-{id}"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_that_queue_during_a_call_share_the_next_one_record_by_record() {
        let crm = Arc::new(SlowCrm {
            latency: Duration::from_millis(100),
            batches: StdMutex::new(Vec::new()),
        });
        let batcher = UpsertBatcher::start("slow", crm.clone(), 1, 64, None);
        let budget = Duration::from_secs(10);
        // One write goes alone; 25 more (one record twice) queue behind it.
        let first = tokio::spawn({
            let batcher = batcher.clone();
            async move { batcher.upsert(write("first"), budget).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut writes = Vec::new();
        for i in 0..25 {
            let id = if i == 24 { "w0".to_owned() } else { format!("w{i}") };
            let batcher = batcher.clone();
            writes.push(tokio::spawn(async move { batcher.upsert(write(&id), budget).await }));
        }
        assert_eq!(first.await.unwrap().unwrap().record_id, "R-first");
        for (i, write) in writes.into_iter().enumerate() {
            let outcome = write.await.unwrap().unwrap();
            let id = if i == 24 { "w0".to_owned() } else { format!("w{i}") };
            assert_eq!(outcome.record_id, format!("R-{id}"), "each write gets its own outcome");
        }
        let batches = crm.batches.lock().unwrap().clone();
        let sizes: Vec<usize> = batches.iter().map(Vec::len).collect();
        assert_eq!(sizes, [1, 10, 10, 5], "{batches:?}");
        for batch in &batches {
            let distinct: HashSet<&String> = batch.iter().collect();
            assert_eq!(distinct.len(), batch.len(), "a record twice in one batch: {batch:?}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_that_waited_past_half_its_time_is_not_sent_and_one_out_of_time_is_unknown() {
        let crm = Arc::new(SlowCrm {
            latency: Duration::from_millis(300),
            batches: StdMutex::new(Vec::new()),
        });
        let batcher = UpsertBatcher::start("slow", crm.clone(), 1, 64, None);
        let first = tokio::spawn({
            let batcher = batcher.clone();
            async move { batcher.upsert(write("first"), Duration::from_secs(10)).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Queued behind a 300 ms call with 400 ms to live: by its turn, less than half is left.
        let late = batcher.upsert(write("late"), Duration::from_millis(400)).await;
        let error = late.unwrap_err();
        assert_eq!(error.class(), "retryable", "{error}");
        assert!(error.to_string().contains("not sent"), "{error}");
        assert!(first.await.unwrap().is_ok());
        // A call that outlives its writes' time: each write is unknown, as a single call's.
        let short = batcher.upsert(write("short"), Duration::from_millis(100)).await;
        let error = short.unwrap_err();
        assert_eq!(error.class(), "ambiguous", "{error}");
        assert!(error.to_string().contains("no answer within 100ms"), "{error}");
        let batches = crm.batches.lock().unwrap().clone();
        assert_eq!(batches, [vec!["first".to_owned()], vec!["short".to_owned()]]);
    }
}
