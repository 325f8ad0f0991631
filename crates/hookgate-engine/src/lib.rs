//! The engine: what happens to a delivery, independent of HTTP.
//!
//! # Intake, in this order
//! 1. Find the pipeline.
//! 2. Verify the signature over the raw bytes; nothing is parsed or stored before it holds.
//! 3. Derive the scoped key, fingerprint, type and ordering value, and the targets that apply.
//! 4. One transaction: the event and its outbox items, or a duplicate counted on the original,
//!    or a conflict kept beside it. A delivery whose event cannot be derived is kept as
//!    rejected evidence.
//! 5. Only then is an outcome returned, and only an outcome returned after a commit maps to a
//!    2xx.
//!
//! No CRM work happens here: the sender never waits for a CRM.
//!
//! # Delivery
//! [`Worker`] leases outbox items and applies them through connectors; see `worker`.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use hookgate_pipeline::CompiledPipeline;
use hookgate_pipeline::evaluate::{Delivery, EvalError, printable};
use hookgate_store::{
    DeliveryOutcome, IntakeRecord, NewDelivery, NewOutboxItem, RejectedDelivery, Store, StoreError,
};
use hookgate_verify::{Clock, Rejection, Request, Verifier};
use tracing::Instrument as _;

use crate::seal::{Keyring, Part};

mod batch;
pub mod budget;
mod commit;
mod keys;
mod pause;
mod refusals;
pub mod seal;
pub use refusals::REFUSALS_FLUSH;
mod worker;

pub use commit::{GroupCommit, GroupCommitConfig};
pub use keys::{
    FETCHED_KEY_TTL, FETCHED_KEYS_MAX, FetchError, FetchedKeys, KeyFetcher, KeyProblem,
};
pub use pause::{PAUSE_REFRESH, Pauses};
pub use worker::{
    Budgets, Connectors, IN_HAND_MIN, InHand, LEASE_MARGIN, Sources, Worker, WorkerConfig, backoff,
};

/// A repeated delivery (duplicate or conflict) keeps at most this much of its headers.
pub const HEADERS_EXCERPT_BYTES: usize = 2048;

/// A rejection's reason, as kept and logged, is at most this many characters.
const REASON_CHARS_MAX: usize = 512;

/// Headers never stored, whatever the scheme: they carry credentials.
const CREDENTIAL_HEADERS: &[&str] = &["authorization", "proxy-authorization", "cookie"];

/// A pipeline ready to serve: compiled configuration and a verifier with its secrets.
#[derive(Debug)]
pub struct ServedPipeline {
    pub compiled: CompiledPipeline,
    /// The configured keys; with `fetch_keys` there may be none, and deliveries name theirs.
    pub verifier: Option<Verifier>,
    fetched: Option<FetchedKeys>,
    /// Lowercased header names that are not stored: signature and credential headers.
    unstored_headers: Vec<String>,
}

impl ServedPipeline {
    pub fn new(compiled: CompiledPipeline, verifier: Verifier) -> ServedPipeline {
        ServedPipeline::with_keys(compiled, Some(verifier), None)
    }

    /// A pipeline whose deliveries may name a key to fetch (`fetch_keys`), beside or instead
    /// of configured ones.
    pub fn with_keys(
        compiled: CompiledPipeline,
        verifier: Option<Verifier>,
        fetcher: Option<Arc<dyn KeyFetcher>>,
    ) -> ServedPipeline {
        let mut unstored_headers = compiled.scheme.signature_headers();
        unstored_headers.extend(CREDENTIAL_HEADERS.iter().map(|h| (*h).to_owned()));
        let fetched = compiled
            .key_fetch
            .clone()
            .zip(fetcher)
            .map(|(config, fetcher)| FetchedKeys::new(config, fetcher));
        ServedPipeline { compiled, verifier, fetched, unstored_headers }
    }

    /// The headers kept as evidence, as a JSON array of `[name, value]` pairs in the order
    /// received (a name may repeat), without signature and credential headers: all of them,
    /// and an excerpt of at most [`HEADERS_EXCERPT_BYTES`] for repeated deliveries, whose
    /// headers are a sender's to pad.
    fn stored_headers(&self, headers: &[(String, Vec<u8>)]) -> (String, String) {
        let kept: Vec<[String; 2]> = headers
            .iter()
            .filter(|(name, _)| !self.unstored_headers.iter().any(|h| name.eq_ignore_ascii_case(h)))
            .map(|(name, value)| {
                [name.to_ascii_lowercase(), String::from_utf8_lossy(value).into_owned()]
            })
            .collect();
        let all = serde_json::to_string(&kept).expect("strings always serialise");
        if all.len() <= HEADERS_EXCERPT_BYTES {
            return (all.clone(), all);
        }
        let mut excerpt = Vec::new();
        let mut bytes = 0;
        for pair in &kept {
            bytes += pair[0].len() + pair[1].len() + 6;
            if bytes > HEADERS_EXCERPT_BYTES {
                break;
            }
            excerpt.push(pair.clone());
        }
        let left_out = kept.len() - excerpt.len();
        excerpt.push([
            "(left out)".to_owned(),
            format!("{left_out} headers, {} bytes in all", all.len()),
        ]);
        let excerpt = serde_json::to_string(&excerpt).expect("strings always serialise");
        (all, excerpt)
    }
}

/// One request as received at the edge.
#[derive(Debug, Clone, Copy)]
pub struct IncomingDelivery<'a> {
    pub pipeline: &'a str,
    pub method: &'a str,
    /// The public URL the sender called (URL-signed schemes sign it).
    pub url: &'a str,
    pub headers: &'a [(String, Vec<u8>)],
    pub body: &'a [u8],
    pub received_at_ms: i64,
}

/// What intake made of a delivery. The HTTP edge maps each to a status code.
#[derive(Debug)]
pub enum IntakeOutcome {
    /// New event, committed with its outbox items.
    Accepted {
        event_id: i64,
    },
    /// Same key, same content: counted on the original, nothing scheduled.
    Duplicate {
        event_id: i64,
    },
    /// Same key, different content: the original kept, this delivery recorded as a conflict.
    Conflict {
        event_id: i64,
        status: u16,
    },
    /// Signed correctly, but no event can be derived; kept as rejected evidence.
    Rejected {
        reason: EvalError,
    },
    /// The signature does not hold. Nothing was stored.
    Unauthorized(Rejection),
    UnknownPipeline,
    /// The database cannot take the delivery now; the sender should retry.
    Unavailable(StoreError),
    /// The database failed in a way a retry will not fix by itself.
    Failed(StoreError),
    /// The signing key the delivery names could not be fetched now; the sender should retry.
    KeyUnavailable(String),
}

impl IntakeOutcome {
    /// A stable name, for metrics.
    pub fn name(&self) -> &'static str {
        match self {
            IntakeOutcome::Accepted { .. } => DeliveryOutcome::Accepted.as_str(),
            IntakeOutcome::Duplicate { .. } => DeliveryOutcome::Duplicate.as_str(),
            IntakeOutcome::Conflict { .. } => DeliveryOutcome::Conflict.as_str(),
            IntakeOutcome::Rejected { .. } => DeliveryOutcome::Rejected.as_str(),
            IntakeOutcome::Unauthorized(_) => "unauthorized",
            IntakeOutcome::UnknownPipeline => "unknown_pipeline",
            IntakeOutcome::Unavailable(_) => "unavailable",
            IntakeOutcome::KeyUnavailable(_) => "key_unavailable",
            IntakeOutcome::Failed(_) => "failed",
        }
    }
}

/// Served pipelines by name (sorted, so that lists of them are stable).
type ServedPipelines = BTreeMap<String, Arc<ServedPipeline>>;

fn served(pipelines: Vec<ServedPipeline>) -> ServedPipelines {
    pipelines.into_iter().map(|p| (p.compiled.name.clone(), Arc::new(p))).collect()
}

/// Intake for every served pipeline over one store.
#[derive(Debug, Clone)]
pub struct Gateway {
    /// The served pipelines, replaced whole by a reload; a delivery or a write keeps the ones
    /// it started with.
    pipelines: Arc<RwLock<Arc<ServedPipelines>>>,
    store: Store,
    /// Seals payloads at intake and opens them for the worker; `None`: plaintext.
    keyring: Option<Arc<Keyring>>,
    /// Shares commits between concurrent deliveries; `None`: one transaction each.
    group_commit: Option<GroupCommit>,
    /// Operators' pauses, as last read from the store.
    pauses: Arc<Pauses>,
    /// Signature refusals counted since they were last written.
    refusals: Arc<refusals::RefusalLog>,
}

impl Gateway {
    pub fn new(store: Store, pipelines: Vec<ServedPipeline>) -> Gateway {
        let pipelines = served(pipelines);
        Gateway {
            pipelines: Arc::new(RwLock::new(Arc::new(pipelines))),
            store,
            keyring: None,
            group_commit: None,
            pauses: Arc::default(),
            refusals: Arc::default(),
        }
    }

    /// Writes the signature refusals counted since the last call (see [`REFUSALS_FLUSH`]):
    /// `serve` calls it on a timer and at shutdown.
    pub async fn flush_refusals(&self) -> Result<(), StoreError> {
        self.refusals.flush(&self.store).await
    }

    /// Whether an operator paused this pipeline's intake (as of the last refresh).
    pub fn intake_paused(&self, pipeline: &str) -> bool {
        self.pauses.intake_paused(pipeline)
    }

    /// Reads the pauses from the store again; called every [`PAUSE_REFRESH`] and after this
    /// process changes one.
    pub async fn refresh_pauses(&self) -> Result<Vec<hookgate_store::Pause>, StoreError> {
        let pauses = self.store.pauses().await?;
        self.pauses.set(&pauses);
        Ok(pauses)
    }

    /// Records deliveries through group commit (see `commit`); starts its committers on the
    /// current runtime.
    pub fn with_group_commit(mut self, config: GroupCommitConfig) -> Gateway {
        self.group_commit = Some(GroupCommit::start(self.store.clone(), config));
        self
    }

    /// Seals every payload stored from now on under `keyring`'s current key.
    pub fn with_keyring(mut self, keyring: Keyring) -> Gateway {
        self.keyring = Some(Arc::new(keyring));
        self
    }

    pub fn keyring(&self) -> Option<&Keyring> {
        self.keyring.as_deref()
    }

    /// The body and header texts as stored, sealed if a keyring is configured, and the key.
    fn stored<'a>(
        &'a self,
        pipeline: &str,
        body: &'a [u8],
        headers: &'a str,
        excerpt: &'a str,
    ) -> StoredPayload<'a> {
        match &self.keyring {
            None => StoredPayload {
                body: Cow::Borrowed(body),
                headers: Cow::Borrowed(headers),
                excerpt: Cow::Borrowed(excerpt),
                sealed_with: None,
            },
            Some(keyring) => StoredPayload {
                body: Cow::Owned(keyring.seal(Part::Body, pipeline, body)),
                headers: Cow::Owned(keyring.seal_text(Part::Headers, pipeline, headers)),
                excerpt: Cow::Owned(keyring.seal_text(Part::Headers, pipeline, excerpt)),
                sealed_with: Some(keyring.current()),
            },
        }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    fn served(&self) -> Arc<ServedPipelines> {
        let held = self.pipelines.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        Arc::clone(&held)
    }

    /// The served pipeline of that name, as configured now.
    pub fn pipeline(&self, name: &str) -> Option<Arc<ServedPipeline>> {
        self.served().get(name).cloned()
    }

    /// The served pipelines, by name.
    pub fn pipelines(&self) -> Vec<Arc<ServedPipeline>> {
        self.served().values().cloned().collect()
    }

    /// Serves `pipelines` from now on, in place of the ones served until now (a reload).
    /// Deliveries and writes already under way finish with the pipeline they started with.
    pub fn replace_pipelines(&self, pipelines: Vec<ServedPipeline>) {
        let pipelines = Arc::new(served(pipelines));
        let mut held = self.pipelines.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        *held = pipelines;
    }

    /// The served pipelines' names, sorted.
    pub fn pipeline_names(&self) -> Vec<String> {
        self.served().keys().cloned().collect()
    }

    pub async fn intake(&self, incoming: &IncomingDelivery<'_>) -> IntakeOutcome {
        let started = std::time::Instant::now();
        // The event id and the outcome are recorded once the store has answered.
        let span = tracing::info_span!(
            "delivery",
            pipeline = incoming.pipeline,
            event_id = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let outcome = self.intake_inner(incoming).instrument(span.clone()).await;
        if let IntakeOutcome::Accepted { event_id }
        | IntakeOutcome::Duplicate { event_id }
        | IntakeOutcome::Conflict { event_id, .. } = &outcome
        {
            span.record("event_id", *event_id);
        }
        span.record("outcome", outcome.name());
        // An unknown pipeline name comes from the URL: not a label, or anyone could grow the
        // metric without bound.
        let pipeline = if matches!(outcome, IntakeOutcome::UnknownPipeline) {
            "(unknown)"
        } else {
            incoming.pipeline
        };
        metrics::counter!("hookgate_deliveries_total", "pipeline" => pipeline.to_owned(), "outcome" => outcome.name())
            .increment(1);
        metrics::histogram!("hookgate_intake_seconds", "pipeline" => pipeline.to_owned())
            .record(started.elapsed().as_secs_f64());
        outcome
    }

    async fn intake_inner(&self, incoming: &IncomingDelivery<'_>) -> IntakeOutcome {
        let Some(pipeline) = self.pipeline(incoming.pipeline) else {
            return IntakeOutcome::UnknownPipeline;
        };
        let url = pipeline.compiled.signed_url(incoming.url);
        let request = Request {
            method: incoming.method,
            url: &url,
            headers: incoming.headers,
            body: incoming.body,
        };
        let now = Clock { unix_ms: incoming.received_at_ms };
        let verdict = match (&pipeline.fetched, &pipeline.verifier) {
            (Some(fetched), configured) => {
                // Configured keys first (no fetch for the common case); then the key the
                // delivery names.
                match configured.as_ref().map(|c| c.verify(&request, now)) {
                    Some(Ok(verified)) => Ok(verified),
                    _ => match fetched.verify(&pipeline.compiled, &request, now).await {
                        Ok(verified) => Ok(verified),
                        Err(KeyProblem::Refused(rejection)) => Err(rejection),
                        Err(KeyProblem::Unavailable(problem)) => {
                            // At debug, like every refusal: a forged flood must not flood the
                            // log; the counter below says how often.
                            tracing::debug!(pipeline = incoming.pipeline, %problem, "signing key unavailable");
                            metrics::counter!("hookgate_signing_key_unavailable_total", "pipeline" => incoming.pipeline.to_owned())
                                .increment(1);
                            return IntakeOutcome::KeyUnavailable(problem);
                        }
                    },
                }
            }
            (None, Some(configured)) => configured.verify(&request, now),
            (None, None) => Err(Rejection::NoMatch),
        };
        if let Err(rejection) = verdict {
            // Per request only at debug: a forged flood must not flood the log. The edge logs
            // refusals at a bounded rate.
            tracing::debug!(pipeline = incoming.pipeline, reason = %rejection, "signature rejected");
            // Nothing of a refused delivery is stored; its stable code is counted, per pipeline.
            metrics::counter!(
                "hookgate_signature_rejections_total",
                "pipeline" => incoming.pipeline.to_owned(),
                "code" => rejection.code()
            )
            .increment(1);
            // For operators, where they look; for URL-signing senders, with the URL verified
            // against (a proxy that rewrites it is the usual cause).
            let signed_url = pipeline.compiled.scheme.signs_url().then_some(url.as_str());
            self.refusals.note(
                incoming.pipeline,
                rejection.code(),
                &rejection.to_string(),
                signed_url,
                incoming.received_at_ms,
            );
            return IntakeOutcome::Unauthorized(rejection);
        }

        let delivery = Delivery { headers: incoming.headers, body: incoming.body };
        let (headers_json, headers_excerpt_json) = pipeline.stored_headers(incoming.headers);
        // Each due target's entity: the ordering entity, or else the target's external id, so
        // that writes to one CRM record never race, and follow versions or receipt order.
        let derived = pipeline.compiled.identify(&delivery).and_then(|(identity, ctx)| {
            pipeline.compiled.check_future(&identity, incoming.received_at_ms)?;
            let mut due = Vec::new();
            for index in pipeline.compiled.due_targets(&ctx)? {
                let entity = match &identity.ordering {
                    Some(ordering) => {
                        // The ordering entity keys the write, but a delivery whose record
                        // cannot be named is refused now, where the sender sees why, instead
                        // of being accepted and dead-lettered: the worker's rule, checked early.
                        pipeline.compiled.render_record_id(index, &ctx)?;
                        ordering.entity.clone()
                    }
                    None => pipeline.compiled.render_external_id(index, &ctx)?,
                };
                due.push((index, entity));
            }
            Ok((identity, due))
        });
        let (identity, due) = match derived {
            Ok(derived) => derived,
            Err(reason) => {
                // Bounded and escaped already where it quotes the sender; escaped again here,
                // since it goes to logs and evidence.
                let text = printable(&reason.to_string(), REASON_CHARS_MAX);
                let stored = self.stored(incoming.pipeline, incoming.body, &headers_json, "");
                let rejected = RejectedDelivery {
                    pipeline: incoming.pipeline,
                    received_at_ms: incoming.received_at_ms,
                    reason: &text,
                    headers_json: &stored.headers,
                    body: &stored.body,
                    sealed_with: stored.sealed_with,
                };
                return match self.store.record_rejection(&rejected).await {
                    Ok(id) => {
                        tracing::info!(pipeline = incoming.pipeline, delivery_id = id, reason = %text, "delivery rejected");
                        IntakeOutcome::Rejected { reason }
                    }
                    Err(error) => store_failure(incoming.pipeline, error),
                };
            }
        };

        let version = identity.ordering.as_ref().map(|o| o.version.sort_key());
        let version_text = identity.ordering.as_ref().map(|o| o.version.to_string());
        let outbox = due
            .into_iter()
            .map(|(index, entity)| NewOutboxItem {
                target: pipeline.compiled.targets[index].name.clone(),
                target_index: i64::try_from(index).unwrap_or(i64::MAX),
                entity,
                version: version.clone(),
                version_text: version_text.clone(),
            })
            .collect();
        let stored =
            self.stored(incoming.pipeline, incoming.body, &headers_json, &headers_excerpt_json);
        let new = NewDelivery {
            pipeline: incoming.pipeline,
            scope: &identity.scope,
            key: &identity.key,
            fingerprint: &identity.fingerprint,
            event_type: identity.event_type.as_deref(),
            received_at_ms: incoming.received_at_ms,
            headers_json: &stored.headers,
            headers_excerpt_json: &stored.excerpt,
            body: &stored.body,
            sealed_with: stored.sealed_with,
            outbox,
        };
        let recorded = match &self.group_commit {
            Some(group) => group.record(commit::Queued::from_new(&new)).await,
            None => self.store.record_intake(&new).await,
        };
        match recorded {
            Ok(IntakeRecord::Accepted { event_id }) => {
                tracing::info!(pipeline = incoming.pipeline, event_id, key = %identity.key, "event accepted");
                IntakeOutcome::Accepted { event_id }
            }
            Ok(IntakeRecord::Duplicate { event_id }) => {
                tracing::info!(pipeline = incoming.pipeline, event_id, key = %identity.key, "duplicate delivery");
                IntakeOutcome::Duplicate { event_id }
            }
            Ok(IntakeRecord::Conflict { event_id }) => {
                tracing::warn!(pipeline = incoming.pipeline, event_id, key = %identity.key, "conflicting delivery: same key, different content");
                IntakeOutcome::Conflict { event_id, status: pipeline.compiled.conflict_status }
            }
            Err(error) => store_failure(incoming.pipeline, error),
        }
    }
}

fn store_failure(pipeline: &str, error: StoreError) -> IntakeOutcome {
    if error.is_unavailable() {
        tracing::warn!(pipeline, error = %error, "database unavailable");
        IntakeOutcome::Unavailable(error)
    } else {
        tracing::error!(pipeline, error = %error, "database failure");
        IntakeOutcome::Failed(error)
    }
}

/// A payload as the store keeps it.
struct StoredPayload<'a> {
    body: Cow<'a, [u8]>,
    headers: Cow<'a, str>,
    excerpt: Cow<'a, str>,
    sealed_with: Option<&'a str>,
}

/// Milliseconds since the Unix epoch, the engine's clock.
pub fn now_ms() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}
