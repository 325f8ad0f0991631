//! Intake: recording verified deliveries in the inbox, with their outbox items and evidence.
//!
//! A batch is group commit's unit (the engine's `commit` module): many deliveries, one commit,
//! and each delivery gets the record it would get alone. New keys are the common case; a
//! repeated key (a duplicate or a conflict) is rare and takes statements of its own.
//!
//! **PostgreSQL: one statement for the new events of a batch.** The events insert
//! (`ON CONFLICT DO NOTHING` on the scoped key) and the outbox and evidence inserts that hang
//! off the events it created are data-modifying CTEs of one statement over `unnest`ed arrays,
//! sent outside an explicit transaction: one statement is atomic, and commits on its own. So a
//! batch costs one round trip, not a BEGIN, three inserts and a COMMIT; and its text is the
//! same whatever the batch size, so it is prepared once per connection (multi-row `VALUES`
//! texts differ for every size and would evict each other from the statement cache).
//!
//! **SQLite: one transaction**, multi-row inserts, one fsync per batch (`synchronous=FULL`).
//! A SQLite batch never waits on a round trip, and its one writer connection cannot be held.

use std::collections::HashSet;

use sqlx::pool::PoolConnection;
use sqlx::{Connection, PgConnection, Postgres, Row};

use crate::{
    DeliveryOutcome, EventState, IntakeRecord, ItemState, NewDelivery, NewOutboxItem,
    REPEATED_DELIVERIES_KEPT, Result, Store, StoreError,
};

/// The statement that records the new events of a batch on PostgreSQL, with their outbox items
/// and evidence. `$1`..`$10` are the events (one array element per key, in key order), `$11`..
/// `$17` the outbox items (`$11` is the 1-based position of the item's event in `$1`..`$10`),
/// `$18` the state of a new item. It returns the position and id of every event it created; a
/// key already stored is not returned, and is recorded as a repeat.
///
/// Public so that the bench's pgbench baseline runs this very text.
pub const POSTGRES_INTAKE: &str = concat!(
    "\
WITH v AS MATERIALIZED (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int8[],
                         $7::text[], $8::bytea[], $9::text[], $10::text[]) WITH ORDINALITY
        AS v (pipeline, scope, event_key, fingerprint, event_type, received_at_ms,
              headers, body, state, sealed_with, n)
),
e AS (
    INSERT INTO events (pipeline, scope, event_key, fingerprint, event_type, received_at_ms,
                        headers, body, state, delivery_count, last_delivery_at_ms, sealed_with)
    SELECT pipeline, scope, event_key, fingerprint, event_type, received_at_ms,
           headers, body, state, 1, received_at_ms, sealed_with
    FROM v ORDER BY n
    ON CONFLICT (pipeline, scope, event_key) DO NOTHING
    RETURNING id, pipeline, scope, event_key
),
created AS MATERIALIZED (
    SELECT v.n, e.id, v.pipeline, v.scope, v.event_key, v.fingerprint, v.received_at_ms,
           v.headers, v.sealed_with
    FROM e JOIN v ON (v.pipeline, v.scope, v.event_key) = (e.pipeline, e.scope, e.event_key)
),
items AS (
    SELECT * FROM unnest($11::int8[], $12::text[], $13::int8[], $14::text[], $15::text[],
                         $16::text[], $17::int8[]) WITH ORDINALITY
        AS i (n, target, target_index, entity, version, version_text, siblings, m)
),
o AS (
    INSERT INTO outbox (event_id, pipeline, target, target_index, entity, version, state,
                        next_attempt_at_ms, created_at_ms, version_text, siblings)
    SELECT c.id, c.pipeline, i.target, i.target_index, i.entity, i.version, $18,
           c.received_at_ms, c.received_at_ms, i.version_text, i.siblings
    FROM items i JOIN created c ON c.n = i.n ORDER BY i.m
),
d AS (
    INSERT INTO deliveries (pipeline, event_id, outcome, received_at_ms, scope, event_key,
                            fingerprint, headers, body, sealed_with)
    SELECT c.pipeline, c.id, ",
    sql_literal!(DeliveryOutcome::Accepted),
    ", c.received_at_ms, c.scope, c.event_key,
           c.fingerprint, c.headers, NULL, c.sealed_with
    FROM created c ORDER BY c.n
)
SELECT n, id FROM created"
);

/// Deliveries in one batch at most; a longer slice is recorded in batches of this size. On
/// SQLite, 12 values a row stays far below the bound values it allows (32,766).
pub(crate) const INTAKE_BATCH_MAX: usize = 1024;

/// Rows of one SQLite outbox or evidence insert at most (11 values a row).
const SQLITE_ROWS_PER_STATEMENT_MAX: usize = 1000;

/// The order a batch is written in, and which deliveries may be new events.
struct Plan {
    /// Every delivery, in key order: two batches that share keys lock them in one order and
    /// cannot deadlock.
    order: Vec<usize>,
    /// The first delivery of each key, in key order: the others of the key repeat it.
    firsts: Vec<usize>,
}

impl Plan {
    fn new(deliveries: &[NewDelivery<'_>]) -> Plan {
        let key = |i: usize| (deliveries[i].pipeline, deliveries[i].scope, deliveries[i].key);
        let mut order: Vec<usize> = (0..deliveries.len()).collect();
        order.sort_by_key(|&i| key(i));
        let mut seen = HashSet::new();
        let firsts = order.iter().copied().filter(|&i| seen.insert(key(i))).collect();
        Plan { order, firsts }
    }
}

fn new_event_state(delivery: &NewDelivery<'_>) -> EventState {
    if delivery.outbox.is_empty() { EventState::Done } else { EventState::Accepted }
}

fn siblings(delivery: &NewDelivery<'_>) -> i64 {
    i64::try_from(delivery.outbox.len()).unwrap_or(i64::MAX)
}

/// Records every delivery of `$order` that has no record yet as a repeat of its stored key: a
/// duplicate counted on the original, or a conflict kept beside it. The row exists and is
/// visible: on PostgreSQL the new events' insert waited for a concurrent inserter of the key to
/// commit and has committed itself; on SQLite writes are serial and the transaction sees its
/// own. A macro, not a function: the body is the same text for both connection types.
macro_rules! record_repeats {
    ($conn:expr, $deliveries:expr, $order:expr, $records:expr) => {
        for &i in $order {
            if $records[i].is_some() {
                continue;
            }
            let delivery = &$deliveries[i];
            let row = sqlx::query(
                "SELECT id, fingerprint FROM events WHERE pipeline = $1 AND scope = $2 AND event_key = $3",
            )
            .bind(delivery.pipeline)
            .bind(delivery.scope)
            .bind(delivery.key)
            .fetch_one(&mut *$conn)
            .await?;
            let event_id: i64 = row.try_get("id")?;
            let original: String = row.try_get("fingerprint")?;
            let (record, outcome, body) = if original == delivery.fingerprint {
                sqlx::query(
                    "UPDATE events SET delivery_count = delivery_count + 1, \
                     last_delivery_at_ms = $2 WHERE id = $1",
                )
                .bind(event_id)
                .bind(delivery.received_at_ms)
                .execute(&mut *$conn)
                .await?;
                (IntakeRecord::Duplicate { event_id }, DeliveryOutcome::Duplicate, None)
            } else {
                sqlx::query("UPDATE events SET conflict_count = conflict_count + 1 WHERE id = $1")
                    .bind(event_id)
                    .execute(&mut *$conn)
                    .await?;
                (IntakeRecord::Conflict { event_id }, DeliveryOutcome::Conflict, Some(delivery.body))
            };
            // Evidence is bounded: past the first few duplicates and conflicts of an event,
            // only their counts on the event grow.
            sqlx::query(
                "INSERT INTO deliveries (pipeline, event_id, outcome, received_at_ms, scope, event_key, \
                 fingerprint, headers, body, sealed_with) SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $11 \
                 WHERE (SELECT COUNT(*) FROM deliveries WHERE event_id = $2 AND outcome = $3) < $10",
            )
            .bind(delivery.pipeline)
            .bind(event_id)
            .bind(outcome)
            .bind(delivery.received_at_ms)
            .bind(delivery.scope)
            .bind(delivery.key)
            .bind(delivery.fingerprint)
            .bind(delivery.headers_excerpt_json)
            .bind(body)
            .bind(REPEATED_DELIVERIES_KEPT)
            .bind(delivery.sealed_with)
            .execute(&mut *$conn)
            .await?;
            $records[i] = Some(record);
        }
    };
}

impl Store {
    /// Records one verified delivery: a new event with its outbox items, or a duplicate
    /// counted on the original, or a conflict kept beside it.
    pub async fn record_intake(&self, delivery: &NewDelivery<'_>) -> Result<IntakeRecord> {
        let mut records = self.record_intake_batch(std::slice::from_ref(delivery)).await?;
        Ok(records.pop().expect("one record per delivery"))
    }

    /// Records several deliveries with one commit (one WAL sync) for their new events: group
    /// commit. Each gets its own record, as if recorded alone. Takes a connection from the pool
    /// for the call; a committer that records batch after batch uses [`Store::intake_writer`].
    pub async fn record_intake_batch(
        &self,
        deliveries: &[NewDelivery<'_>],
    ) -> Result<Vec<IntakeRecord>> {
        self.intake_writer().record_batch(deliveries).await
    }

    /// A writer for one committer: on PostgreSQL it keeps its connection between batches.
    pub fn intake_writer(&self) -> IntakeWriter {
        IntakeWriter { store: self.clone(), held: None }
    }
}

/// Records batch after batch for one committer. On PostgreSQL it holds one pool connection
/// while batches keep coming, so a batch pays neither the pool's ping on acquire nor the one on
/// release. It gives the connection up after any error (the next batch acquires a fresh, tested
/// one; after an "unavailable" error the old one is closed), when the committer calls
/// [`IntakeWriter::release`] (it does once intake is idle), and when it is dropped, so an idle
/// gateway holds nothing and the pool can close.
#[derive(Debug)]
pub struct IntakeWriter {
    store: Store,
    held: Option<PoolConnection<Postgres>>,
}

impl IntakeWriter {
    /// Records several deliveries, each as if alone (see [`Store::record_intake_batch`]): on
    /// PostgreSQL on the held connection, on SQLite in a transaction of the writer pool.
    pub async fn record_batch(
        &mut self,
        deliveries: &[NewDelivery<'_>],
    ) -> Result<Vec<IntakeRecord>> {
        let mut records = Vec::with_capacity(deliveries.len());
        let pool = match &self.store {
            Store::Sqlite { writer, .. } => {
                for chunk in deliveries.chunks(INTAKE_BATCH_MAX) {
                    records.extend(sqlite_batch(writer, chunk).await?);
                }
                return Ok(records);
            }
            Store::Postgres(pool) => pool,
        };
        for chunk in deliveries.chunks(INTAKE_BATCH_MAX) {
            let connection = match &mut self.held {
                Some(connection) => connection,
                held => held.insert(pool.acquire().await?),
            };
            match postgres_batch(connection, chunk).await {
                Ok(chunk_records) => records.extend(chunk_records),
                Err(error) => {
                    // Any error gives the connection up: one the database refused a statement
                    // on is fine (back to the pool, whose release ping tests it), but an error
                    // that is not "unavailable" may still come from a broken one, and a
                    // committer that kept it would fail every batch after.
                    if let Some(connection) = self.held.take()
                        && error.is_unavailable()
                    {
                        // Not back to the pool: closed, whatever state it is in.
                        drop(connection.detach());
                    }
                    return Err(error);
                }
            }
        }
        Ok(records)
    }

    /// Gives the held connection back to the pool.
    pub fn release(&mut self) {
        self.held = None;
    }

    /// Whether a connection is held now.
    pub fn holds_connection(&self) -> bool {
        self.held.is_some()
    }
}

async fn postgres_batch(
    connection: &mut PgConnection,
    deliveries: &[NewDelivery<'_>],
) -> Result<Vec<IntakeRecord>> {
    let plan = Plan::new(deliveries);
    let firsts: Vec<&NewDelivery<'_>> = plan.firsts.iter().map(|&i| &deliveries[i]).collect();
    let mut item_event: Vec<i64> = Vec::new();
    let mut items: Vec<(&NewDelivery<'_>, &NewOutboxItem)> = Vec::new();
    for (position, delivery) in (1_i64..).zip(&firsts) {
        for item in &delivery.outbox {
            item_event.push(position);
            items.push((delivery, item));
        }
    }
    let rows = sqlx::query(POSTGRES_INTAKE)
        .bind(firsts.iter().map(|d| d.pipeline).collect::<Vec<_>>())
        .bind(firsts.iter().map(|d| d.scope).collect::<Vec<_>>())
        .bind(firsts.iter().map(|d| d.key).collect::<Vec<_>>())
        .bind(firsts.iter().map(|d| d.fingerprint).collect::<Vec<_>>())
        .bind(firsts.iter().map(|d| d.event_type).collect::<Vec<_>>())
        .bind(firsts.iter().map(|d| d.received_at_ms).collect::<Vec<_>>())
        .bind(firsts.iter().map(|d| d.headers_json).collect::<Vec<_>>())
        .bind(firsts.iter().map(|d| d.body).collect::<Vec<_>>())
        .bind(firsts.iter().map(|d| new_event_state(d).as_str()).collect::<Vec<_>>())
        .bind(firsts.iter().map(|d| d.sealed_with).collect::<Vec<_>>())
        .bind(item_event)
        .bind(items.iter().map(|(_, item)| item.target.as_str()).collect::<Vec<_>>())
        .bind(items.iter().map(|(_, item)| item.target_index).collect::<Vec<_>>())
        .bind(items.iter().map(|(_, item)| item.entity.as_str()).collect::<Vec<_>>())
        .bind(items.iter().map(|(_, item)| item.version.as_deref()).collect::<Vec<_>>())
        .bind(items.iter().map(|(_, item)| item.version_text.as_deref()).collect::<Vec<_>>())
        .bind(items.iter().map(|(d, _)| siblings(d)).collect::<Vec<_>>())
        .bind(ItemState::Pending)
        .fetch_all(&mut *connection)
        .await?;
    let mut records: Vec<Option<IntakeRecord>> = vec![None; deliveries.len()];
    for row in rows {
        let position: i64 = row.try_get("n")?;
        let event_id: i64 = row.try_get("id")?;
        let index = usize::try_from(position - 1)
            .ok()
            .and_then(|p| plan.firsts.get(p))
            .ok_or_else(|| StoreError::Schema(format!("intake returned position {position}")))?;
        records[*index] = Some(IntakeRecord::Accepted { event_id });
    }
    if records.iter().any(Option::is_none) {
        let mut tx = connection.begin().await?;
        record_repeats!(tx, deliveries, &plan.order, records);
        // A commit that fails may have landed or not: unavailable, so that the senders retry
        // (a duplicate if it landed) and nothing is recorded again here.
        tx.commit().await.map_err(StoreError::Unavailable)?;
    }
    Ok(records.into_iter().map(|r| r.expect("every delivery recorded")).collect())
}

async fn sqlite_batch(
    pool: &sqlx::SqlitePool,
    deliveries: &[NewDelivery<'_>],
) -> Result<Vec<IntakeRecord>> {
    let plan = Plan::new(deliveries);
    let mut records: Vec<Option<IntakeRecord>> = vec![None; deliveries.len()];
    let mut tx = pool.begin().await?;
    let mut insert = sqlx::QueryBuilder::new(
        "INSERT INTO events (pipeline, scope, event_key, fingerprint, event_type, received_at_ms, \
         headers, body, state, delivery_count, last_delivery_at_ms, sealed_with) ",
    );
    insert.push_values(&plan.firsts, |mut row, &i| {
        let d = &deliveries[i];
        row.push_bind(d.pipeline)
            .push_bind(d.scope)
            .push_bind(d.key)
            .push_bind(d.fingerprint)
            .push_bind(d.event_type)
            .push_bind(d.received_at_ms)
            .push_bind(d.headers_json)
            .push_bind(d.body)
            .push_bind(new_event_state(d))
            .push_bind(1_i64)
            .push_bind(d.received_at_ms)
            .push_bind(d.sealed_with);
    });
    insert.push(
        " ON CONFLICT (pipeline, scope, event_key) DO NOTHING \
         RETURNING id, pipeline, scope, event_key",
    );
    let mut created = std::collections::HashMap::new();
    for row in insert.build().fetch_all(&mut *tx).await? {
        let key: (String, String, String) =
            (row.try_get("pipeline")?, row.try_get("scope")?, row.try_get("event_key")?);
        created.insert(key, row.try_get::<i64, _>("id")?);
    }
    let mut accepted = Vec::new();
    for &i in &plan.firsts {
        let d = &deliveries[i];
        let key = (d.pipeline.to_owned(), d.scope.to_owned(), d.key.to_owned());
        if let Some(&event_id) = created.get(&key) {
            records[i] = Some(IntakeRecord::Accepted { event_id });
            accepted.push((i, event_id));
        }
    }
    let items: Vec<(i64, &NewDelivery<'_>, &NewOutboxItem)> = accepted
        .iter()
        .flat_map(|&(i, event_id)| {
            deliveries[i].outbox.iter().map(move |item| (event_id, &deliveries[i], item))
        })
        .collect();
    for items in items.chunks(SQLITE_ROWS_PER_STATEMENT_MAX) {
        let mut outbox = sqlx::QueryBuilder::new(
            "INSERT INTO outbox (event_id, pipeline, target, target_index, entity, version, state, \
             next_attempt_at_ms, created_at_ms, version_text, siblings) ",
        );
        outbox.push_values(items, |mut row, (event_id, d, item)| {
            row.push_bind(*event_id)
                .push_bind(d.pipeline)
                .push_bind(item.target.as_str())
                .push_bind(item.target_index)
                .push_bind(item.entity.as_str())
                .push_bind(item.version.as_deref())
                .push_bind(ItemState::Pending)
                .push_bind(d.received_at_ms)
                .push_bind(d.received_at_ms)
                .push_bind(item.version_text.as_deref())
                .push_bind(siblings(d));
        });
        outbox.build().execute(&mut *tx).await?;
    }
    for accepted in accepted.chunks(SQLITE_ROWS_PER_STATEMENT_MAX) {
        let mut evidence = sqlx::QueryBuilder::new(
            "INSERT INTO deliveries (pipeline, event_id, outcome, received_at_ms, scope, event_key, \
             fingerprint, headers, body, sealed_with) ",
        );
        evidence.push_values(accepted, |mut row, &(i, event_id)| {
            let d = &deliveries[i];
            row.push_bind(d.pipeline)
                .push_bind(event_id)
                .push_bind(DeliveryOutcome::Accepted)
                .push_bind(d.received_at_ms)
                .push_bind(d.scope)
                .push_bind(d.key)
                .push_bind(d.fingerprint)
                .push_bind(d.headers_json)
                .push_bind(None::<&[u8]>)
                .push_bind(d.sealed_with);
        });
        evidence.build().execute(&mut *tx).await?;
    }
    record_repeats!(tx, deliveries, &plan.order, records);
    // A commit that fails may have landed or not: unavailable, so that the senders retry (a
    // duplicate if it landed) and nothing is recorded again here.
    tx.commit().await.map_err(StoreError::Unavailable)?;
    Ok(records.into_iter().map(|r| r.expect("every delivery recorded")).collect())
}
