//! The conformance suite every connector must pass: the mock, Salesforce and HubSpot against
//! their fakes, and plugins. A connector's author runs it with one line:
//!
//! ```text
//! hookgate_connector::conformance::run(&MyHarness::new().await).await;
//! ```
//!
//! The [`Harness`] builds a connector against a CRM (real or fake) in a given [`Fault`] mode;
//! the suite checks upsert semantics (create then update gives one record, a repeat creates
//! nothing, lookup finds what upsert wrote), that every documented failure maps to its error
//! class, and, for a connector with a batch call, that a batch means what its writes mean one
//! by one. It panics with a message naming the broken rule.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::{
    BoxFuture, Connector, ConnectorError, LookupOutcome, LookupRequest, Operation, UpsertOutcome,
    UpsertRequest,
};

/// A failure the CRM can be made to produce, and the class it must map to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// A transient server failure (5xx): `retryable`.
    Unavailable,
    /// Too many requests: `rate_limited`.
    RateLimited,
    /// A validation failure for the request: `rejected`.
    Invalid,
    /// The write applied, the answer lost: `ambiguous`.
    LostResponse,
    /// Bad credentials that cannot be refreshed: `misconfigured`.
    BadCredentials,
}

impl Fault {
    pub const ALL: [Fault; 5] = [
        Fault::Unavailable,
        Fault::RateLimited,
        Fault::Invalid,
        Fault::LostResponse,
        Fault::BadCredentials,
    ];

    pub fn expected_class(self) -> &'static str {
        match self {
            Fault::Unavailable => "retryable",
            Fault::RateLimited => "rate_limited",
            Fault::Invalid => "rejected",
            Fault::LostResponse => "ambiguous",
            Fault::BadCredentials => "misconfigured",
        }
    }
}

/// What the suite needs from a connector's test setup.
pub trait Harness: Send + Sync {
    /// A connector against a CRM that behaves normally (`None`) or produces `fault` on the
    /// next write. Each call may return a fresh connector; records persist across calls.
    fn connector(&self, fault: Option<Fault>) -> BoxFuture<'_, Arc<dyn Connector>>;
    /// An object type and external-id field the CRM accepts.
    fn object(&self) -> (&str, &str);
    /// A field name the CRM accepts on that object.
    fn field(&self) -> &str;
}

fn request(harness: &dyn Harness, external_id: &str, value: &str, key: &str) -> UpsertRequest {
    let (object, id_field) = harness.object();
    UpsertRequest {
        object: object.to_owned(),
        external_id_field: id_field.to_owned(),
        external_id_value: external_id.to_owned(),
        fields: BTreeMap::from([(harness.field().to_owned(), value.to_owned())]),
        operation: Operation::Upsert,
        idempotency_key: key.to_owned(),
    }
}

/// Runs every check.
pub async fn run(harness: &dyn Harness) {
    upsert_semantics(harness).await;
    for fault in Fault::ALL {
        fault_maps_to_its_class(harness, fault).await;
    }
    if harness.connector(None).await.batch_max() > 1 {
        batch_semantics(harness).await;
    }
}

async fn lookup(connector: &dyn Connector, request: &UpsertRequest) -> LookupOutcome {
    connector
        .lookup(&LookupRequest::from(request))
        .await
        .unwrap_or_else(|e| panic!("lookup of {} failed: {e}", request.external_id_value))
}

/// A healthy CRM passes the healthcheck; create then update one external id gives one record;
/// a repeat creates nothing new; lookup finds what upsert wrote, and nothing for an unknown id.
pub async fn upsert_semantics(harness: &dyn Harness) {
    let connector = harness.connector(None).await;
    connector
        .healthcheck()
        .await
        .unwrap_or_else(|e| panic!("the healthcheck of a healthy CRM failed: {e}"));
    let external_id = format!("conformance-{:08x}", std::process::id() ^ 0x5eed);
    let create = request(harness, &external_id, "first", "conformance-1");
    let created = connector.upsert(&create).await.unwrap_or_else(|e| panic!("create failed: {e}"));
    assert!(created.created, "the first upsert of an external id must create a record");
    assert!(!created.record_id.is_empty(), "an upsert must return the CRM's record id");

    let update = request(harness, &external_id, "second", "conformance-2");
    let updated = connector.upsert(&update).await.unwrap_or_else(|e| panic!("update failed: {e}"));
    assert!(!updated.created, "a second upsert of the same external id must update, not create");
    assert_eq!(updated.record_id, created.record_id, "create then update must be one record");

    let repeated = connector.upsert(&update).await.unwrap_or_else(|e| panic!("repeat failed: {e}"));
    assert!(!repeated.created, "repeating an upsert must not create a record");
    assert_eq!(
        repeated.record_id, created.record_id,
        "repeating an upsert must not create a record"
    );

    match lookup(connector.as_ref(), &update).await {
        LookupOutcome::Found { record_id, fields, .. } => {
            assert_eq!(record_id, created.record_id, "lookup must find the record upsert wrote");
            assert_eq!(
                fields.get(harness.field()).map(String::as_str),
                Some("second"),
                "lookup must return the written value"
            );
        }
        LookupOutcome::NotFound { .. } => panic!("lookup must find what upsert wrote"),
    }
    let unknown = request(harness, &format!("{external_id}-unknown"), "x", "conformance-3");
    assert!(
        matches!(lookup(connector.as_ref(), &unknown).await, LookupOutcome::NotFound { .. }),
        "lookup of an unknown external id must find nothing"
    );
}

/// The fault produces the documented error class, and (except a lost response) writes nothing.
pub async fn fault_maps_to_its_class(harness: &dyn Harness, fault: Fault) {
    let connector = harness.connector(Some(fault)).await;
    let external_id = format!("conformance-fault-{fault:?}-{:08x}", std::process::id());
    let write = request(harness, &external_id, "value", &format!("conformance-{fault:?}"));
    let error: ConnectorError = match connector.upsert(&write).await {
        Ok(outcome) => panic!("{fault:?} must fail, but the upsert succeeded: {outcome:?}"),
        Err(error) => error,
    };
    assert_eq!(
        error.class(),
        fault.expected_class(),
        "{fault:?} must map to `{}`: {error}",
        fault.expected_class()
    );
    let healthy = harness.connector(None).await;
    let found = lookup(healthy.as_ref(), &write).await;
    match fault {
        Fault::LostResponse => {
            assert!(
                matches!(found, LookupOutcome::Found { .. }),
                "a lost response is a write that was applied"
            )
        }
        _ => assert!(matches!(found, LookupOutcome::NotFound { .. }), "{fault:?} must not write"),
    }
}

/// Faults a batch call must pass on to every write of the call: the CRM refused the call
/// before applying anything.
pub const BATCH_FAULTS: [Fault; 2] = [Fault::Unavailable, Fault::RateLimited];

/// For a connector with a batch call ([`Connector::batch_max`] above 1): a batch of a new
/// record, an existing record and another new record gives one outcome per write, in order,
/// with the right `created` flags and record ids; lookups find the written values; repeating
/// the batch creates nothing; and a batch the CRM refuses whole ([`BATCH_FAULTS`]) gives
/// every write that fault's class and writes nothing.
///
/// A connector whose `batch_max` is 1 has no batch call: the engine never calls
/// `upsert_batch` for it, so there is nothing of its own to check, and this returns at once.
/// That is a capability check, not a skipped test: the default `upsert_batch` is
/// [`Connector::upsert`] once per write, which [`upsert_semantics`] checks.
pub async fn batch_semantics(harness: &dyn Harness) {
    let connector = harness.connector(None).await;
    if connector.batch_max() <= 1 {
        return;
    }
    let run = format!("{:08x}", std::process::id() ^ 0xba7c);
    let existing = request(harness, &format!("conformance-batch-old-{run}"), "before", "b-0");
    let before = connector
        .upsert(&existing)
        .await
        .unwrap_or_else(|e| panic!("creating the batch's existing record failed: {e}"));

    let batch = vec![
        request(harness, &format!("conformance-batch-new-a-{run}"), "a", "b-1"),
        request(harness, &existing.external_id_value, "updated", "b-2"),
        request(harness, &format!("conformance-batch-new-b-{run}"), "b", "b-3"),
    ];
    let outcomes = upsert_in_batches(connector.as_ref(), &batch).await;
    let written: Vec<_> = outcomes
        .into_iter()
        .zip(&batch)
        .map(|(outcome, write)| {
            outcome.unwrap_or_else(|e| {
                panic!("the batch write of {} failed: {e}", write.external_id_value)
            })
        })
        .collect();
    let created: Vec<bool> = written.iter().map(|outcome| outcome.created).collect();
    assert_eq!(
        created,
        [true, false, true],
        "batch outcomes must be in request order: new, existing, new"
    );
    assert_eq!(
        written[1].record_id, before.record_id,
        "a batch write of an existing external id must update that record"
    );
    assert!(
        written.iter().all(|outcome| !outcome.record_id.is_empty()),
        "each batch outcome must carry the CRM's record id"
    );
    assert!(
        written[0].record_id != written[2].record_id
            && written[0].record_id != written[1].record_id
            && written[2].record_id != written[1].record_id,
        "three external ids in a batch must be three records: {written:?}"
    );
    for (write, outcome) in batch.iter().zip(&written) {
        match lookup(connector.as_ref(), write).await {
            LookupOutcome::Found { record_id, fields, .. } => {
                assert_eq!(
                    record_id, outcome.record_id,
                    "lookup must find the record a batch wrote"
                );
                assert_eq!(
                    fields.get(harness.field()),
                    write.fields.get(harness.field()),
                    "lookup must return the value a batch wrote"
                );
            }
            LookupOutcome::NotFound { .. } => {
                panic!("lookup must find what a batch wrote: {}", write.external_id_value)
            }
        }
    }

    let repeated = upsert_in_batches(connector.as_ref(), &batch).await;
    for ((outcome, first), write) in repeated.into_iter().zip(&written).zip(&batch) {
        let outcome = outcome.unwrap_or_else(|e| {
            panic!("the repeated batch write of {} failed: {e}", write.external_id_value)
        });
        assert!(!outcome.created, "repeating a batch must not create a record");
        assert_eq!(
            outcome.record_id, first.record_id,
            "repeating a batch must write the same records"
        );
    }

    for fault in BATCH_FAULTS {
        batch_fault_maps_to_its_class(harness, fault, &run).await;
    }
}

/// Writes `batch` in calls of at most [`Connector::batch_max`] writes, as the engine does, and
/// checks that each call gives one outcome per write.
async fn upsert_in_batches(
    connector: &dyn Connector,
    batch: &[UpsertRequest],
) -> Vec<Result<UpsertOutcome, ConnectorError>> {
    let mut outcomes = Vec::with_capacity(batch.len());
    for call in batch.chunks(connector.batch_max()) {
        let answered = connector.upsert_batch(call).await;
        assert_eq!(answered.len(), call.len(), "a batch must give one outcome per write");
        outcomes.extend(answered);
    }
    outcomes
}

/// A batch meeting `fault` gives each write its class and writes none of them.
async fn batch_fault_maps_to_its_class(harness: &dyn Harness, fault: Fault, run: &str) {
    let connector = harness.connector(Some(fault)).await;
    // One call: the fault is the CRM's answer to the next call.
    let batch: Vec<UpsertRequest> = (0..connector.batch_max().min(3))
        .map(|n| {
            let id = format!("conformance-batch-fault-{fault:?}-{n}-{run}");
            request(harness, &id, "value", &format!("conformance-batch-{fault:?}-{n}"))
        })
        .collect();
    let outcomes = connector.upsert_batch(&batch).await;
    assert_eq!(outcomes.len(), batch.len(), "a batch must give one outcome per write");
    for (outcome, write) in outcomes.iter().zip(&batch) {
        match outcome {
            Ok(written) => panic!(
                "{fault:?} on a batch must fail every write, but {} succeeded: {written:?}",
                write.external_id_value
            ),
            Err(error) => assert_eq!(
                error.class(),
                fault.expected_class(),
                "{fault:?} on a batch must map to `{}` for every write: {error}",
                fault.expected_class()
            ),
        }
    }
    let healthy = harness.connector(None).await;
    for write in &batch {
        assert!(
            matches!(lookup(healthy.as_ref(), write).await, LookupOutcome::NotFound { .. }),
            "{fault:?} on a batch must not write {}",
            write.external_id_value
        );
    }
}
