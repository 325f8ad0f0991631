//! Delivery in batches: many items finished in one transaction of a few statements. Each item
//! keeps the meaning [`Store::finish`] gives it alone: its own fence (its lease owner), its own
//! outcome; only the commit (one WAL sync) and the round trips are shared.
//!
//! **Rows travel as one JSON parameter.** A statement reads its rows from a row source `v`
//! built from one JSON array (PostgreSQL: `jsonb_to_recordset`; SQLite: `json_each`), and
//! joins it with `UPDATE ... FROM v`. So a statement's text does not depend on the batch's
//! size: it is prepared once per connection and its plan is reused, there is no bound on
//! parameters to chunk around, and the planner, which expects a hundred rows from a set-
//! returning function, joins through the primary keys instead of scanning a table. The
//! columns of `v` are prefixed `v_` so that no name is ambiguous against the updated table's.

use std::collections::{HashMap, HashSet};

use serde::Serialize;
use sqlx::Row;

use crate::delivery::{LockEvents, RECOMPUTE_EVENT_STATES, alone_in_its_event};
use crate::{Call, EventState, Finish, LeasedItem, Renewal, Result, Store};

/// `WITH v AS (...)`: a row source of the named columns (name, PostgreSQL type) read from the
/// JSON array bound to `$param`.
pub(crate) fn json_rows(postgres: bool, param: usize, columns: &[(&str, &str)]) -> String {
    if postgres {
        let typed: Vec<String> = columns.iter().map(|(name, ty)| format!("{name} {ty}")).collect();
        format!(
            "WITH v AS (SELECT * FROM jsonb_to_recordset(${param}::jsonb) AS r({}))",
            typed.join(", ")
        )
    } else {
        let read: Vec<String> = columns
            .iter()
            .map(|(name, _)| format!("json_extract(value, '$.{name}') AS {name}"))
            .collect();
        format!("WITH v AS (SELECT {} FROM json_each(${param}))", read.join(", "))
    }
}

/// The JSON array of [`json_rows`]: one object per row, its fields named as the columns.
/// Rows are structs of borrowed fields, written straight to the text (no `Value` tree).
fn rows_json<T: Serialize>(rows: impl Iterator<Item = T>) -> String {
    serde_json::to_string(&rows.collect::<Vec<T>>())
        .expect("rows of strings and integers serialise")
}

#[derive(Serialize)]
struct IdRow {
    v_id: i64,
}

#[derive(Serialize)]
struct EventStateRow {
    v_id: i64,
    v_state: &'static str,
}

#[derive(Serialize)]
struct EntityRow<'a> {
    v_pipeline: &'a str,
    v_target: &'a str,
    v_entity: &'a str,
}

#[derive(Serialize)]
struct RenewRow<'a> {
    v_pipeline: &'a str,
    v_target: &'a str,
    v_entity: &'a str,
    v_owner: &'a str,
    v_expires: i64,
}

#[derive(Serialize)]
struct InFlightRow<'a> {
    v_pipeline: &'a str,
    v_target: &'a str,
    v_entity: &'a str,
    v_id: i64,
}

#[derive(Serialize)]
struct ReleaseRow<'a> {
    v_pipeline: &'a str,
    v_target: &'a str,
    v_entity: &'a str,
    v_owner: &'a str,
    v_id: i64,
    v_applied: Option<&'a str>,
    v_applied_text: Option<&'a str>,
    v_doubted: Option<&'a str>,
    v_doubted_text: Option<&'a str>,
}

#[derive(Serialize)]
struct MoveRow<'a> {
    v_id: i64,
    v_attempt: i64,
    v_state: &'a str,
    v_next: i64,
    v_doubt: i64,
    v_record: Option<&'a str>,
    v_error: Option<&'a str>,
    v_finished: Option<i64>,
}

#[derive(Serialize)]
struct CallRow<'a> {
    v_id: i64,
    v_event: i64,
    v_attempt: i64,
    v_owner: &'a str,
    v_started: i64,
    v_finished: i64,
    v_action: &'a str,
    v_outcome: &'a str,
    v_status: Option<i64>,
    v_excerpt: Option<&'a str>,
    v_error: Option<&'a str>,
    v_record: Option<&'a str>,
    v_meta: Option<&'a str>,
    v_sealed: Option<&'a str>,
}

/// The rows of a list of ids, as [`json_rows`] with one `v_id bigint` column.
pub(crate) fn ids_json(ids: &[i64]) -> String {
    rows_json(ids.iter().map(|&v_id| IdRow { v_id }))
}

/// The rows of entity keys, as [`json_rows`] with `v_pipeline`, `v_target`, `v_entity`.
pub(crate) fn entities_json(entities: &[(String, String, String)]) -> String {
    rows_json(entities.iter().map(|(pipeline, target, entity)| EntityRow {
        v_pipeline: pipeline,
        v_target: target,
        v_entity: entity,
    }))
}

/// The rows naming leased items on their entities: entity keys and item ids.
pub(crate) fn in_flight_json(items: &[LeasedItem]) -> String {
    rows_json(items.iter().map(|item| InFlightRow {
        v_pipeline: &item.pipeline,
        v_target: &item.target,
        v_entity: &item.entity,
        v_id: item.id,
    }))
}

/// The rows of [`Store::renew_leases`]: entity keys, lease owners and new ends.
pub(crate) fn renewals_json(renewals: &[Renewal<'_>]) -> String {
    rows_json(renewals.iter().map(|Renewal { item, lease_expires_at_ms }| RenewRow {
        v_pipeline: &item.pipeline,
        v_target: &item.target,
        v_entity: &item.entity,
        v_owner: &item.lease_owner,
        v_expires: *lease_expires_at_ms,
    }))
}

/// An item to finish, for [`Store::finish_batch`].
#[derive(Debug, Clone, Copy)]
pub struct FinishItem<'a> {
    pub item: &'a LeasedItem,
    pub finish: &'a Finish,
    /// Every call of the attempt, in order.
    pub calls: &'a [Call],
}

/// (pipeline, target, entity).
pub(crate) type EntityKey = (String, String, String);

pub(crate) fn entity_key(item: &LeasedItem) -> EntityKey {
    (item.pipeline.clone(), item.target.clone(), item.entity.clone())
}

/// Splits `rows` into those alone with their entity in the batch, and the others (with their
/// positions). The batch statements tell a held lease by entity, so two items of one entity
/// (one of them under a lease since taken over) must not share a batch: the others go one by
/// one through the single statements, which check each item's own lease.
fn alone_in_their_entity<T>(rows: &[T], item: impl Fn(&T) -> &LeasedItem) -> (Vec<&T>, Vec<usize>) {
    let mut seen: HashMap<EntityKey, usize> = HashMap::new();
    for row in rows {
        *seen.entry(entity_key(item(row))).or_default() += 1;
    }
    let mut alone = Vec::new();
    let mut shared = Vec::new();
    for (position, row) in rows.iter().enumerate() {
        if seen[&entity_key(item(row))] == 1 {
            alone.push(row);
        } else {
            shared.push(position);
        }
    }
    (alone, shared)
}

/// The row source of entities with their lease owners.
const ENTITY_COLUMNS: [(&str, &str); 4] =
    [("v_pipeline", "text"), ("v_target", "text"), ("v_entity", "text"), ("v_owner", "text")];

impl Store {
    /// [`Store::finish`] for many items at once, in one transaction: each item's answer is what
    /// `finish` would give it alone (`false` where its lease was lost, and then nothing of it
    /// is recorded). Items must be of distinct entities, as leased items are.
    ///
    /// An entity is released only by its lease's owner and for the item that lease named in
    /// flight. Should an item so released not be moved (its row gone), the batch is rolled back
    /// and each item is finished alone instead.
    pub async fn finish_batch(&self, items: &[FinishItem<'_>], now_ms: i64) -> Result<Vec<bool>> {
        let (alone, shared) = alone_in_their_entity(items, |i| i.item);
        let batched = match self.try_finish_batch(&alone, now_ms).await? {
            Some(finished) => finished,
            None => {
                let mut finished = Vec::with_capacity(alone.len());
                for item in &alone {
                    finished.push(self.finish(item.item, item.finish, item.calls, now_ms).await?);
                }
                finished
            }
        };
        let mut answers = Vec::with_capacity(items.len());
        let mut batched = batched.into_iter();
        for (position, item) in items.iter().enumerate() {
            if shared.contains(&position) {
                answers.push(self.finish(item.item, item.finish, item.calls, now_ms).await?);
            } else {
                answers.push(batched.next().unwrap_or(false));
            }
        }
        Ok(answers)
    }

    /// `None`: rolled back, see [`Store::finish_batch`].
    async fn try_finish_batch(
        &self,
        items: &[&FinishItem<'_>],
        now_ms: i64,
    ) -> Result<Option<Vec<bool>>> {
        if items.is_empty() {
            return Ok(Some(Vec::new()));
        }
        let postgres = matches!(self, Store::Postgres(_));
        let mut columns = ENTITY_COLUMNS.to_vec();
        columns.extend([
            ("v_id", "bigint"),
            ("v_applied", "text"),
            ("v_applied_text", "text"),
            ("v_doubted", "text"),
            ("v_doubted_text", "text"),
        ]);
        // The guard never moves backwards: every assignment reads the row before the update.
        let release = format!(
            "{} UPDATE entities SET lease_owner = NULL, lease_expires_at_ms = NULL, in_flight_item = NULL, \
             in_flight_owner = NULL, in_flight_since_ms = NULL, \
             applied_version = CASE WHEN v_applied IS NOT NULL AND (applied_version IS NULL OR applied_version < v_applied) \
               THEN v_applied ELSE applied_version END, \
             applied_version_text = CASE WHEN v_applied IS NOT NULL AND (applied_version IS NULL OR applied_version < v_applied) \
               THEN v_applied_text ELSE applied_version_text END, \
             doubted_version = CASE WHEN v_doubted IS NOT NULL AND (doubted_version IS NULL OR doubted_version < v_doubted) \
               THEN v_doubted ELSE doubted_version END, \
             doubted_version_text = CASE WHEN v_doubted IS NOT NULL AND (doubted_version IS NULL OR doubted_version < v_doubted) \
               THEN v_doubted_text ELSE doubted_version_text END \
             FROM v WHERE pipeline = v_pipeline AND target = v_target AND entity = v_entity \
               AND lease_owner = v_owner AND in_flight_item = v_id \
             RETURNING pipeline, target, entity",
            json_rows(postgres, 1, &columns)
        );
        let release_rows = rows_json(items.iter().map(|FinishItem { item, finish, .. }| {
            let [v_applied, v_applied_text, v_doubted, v_doubted_text] = finish.guard_values(item);
            ReleaseRow {
                v_pipeline: &item.pipeline,
                v_target: &item.target,
                v_entity: &item.entity,
                v_owner: &item.lease_owner,
                v_id: item.id,
                v_applied,
                v_applied_text,
                v_doubted,
                v_doubted_text,
            }
        }));
        let move_items = format!(
            "{} UPDATE outbox SET state = v_state, next_attempt_at_ms = v_next, in_doubt = v_doubt, \
               record_id = COALESCE(v_record, record_id), last_error = v_error, finished_at_ms = v_finished, \
               attempts = v_attempt \
             FROM v WHERE id = v_id \
             RETURNING id",
            json_rows(
                postgres,
                1,
                &[
                    ("v_id", "bigint"),
                    ("v_attempt", "bigint"),
                    ("v_state", "text"),
                    ("v_next", "bigint"),
                    ("v_doubt", "bigint"),
                    ("v_record", "text"),
                    ("v_error", "text"),
                    ("v_finished", "bigint"),
                ]
            )
        );
        let call_columns = [
            ("v_id", "bigint"),
            ("v_event", "bigint"),
            ("v_attempt", "bigint"),
            ("v_owner", "text"),
            ("v_started", "bigint"),
            ("v_finished", "bigint"),
            ("v_action", "text"),
            ("v_outcome", "text"),
            ("v_status", "bigint"),
            ("v_excerpt", "text"),
            ("v_error", "text"),
            ("v_record", "text"),
            ("v_meta", "text"),
            ("v_sealed", "text"),
        ];
        let insert_calls = format!(
            "{} INSERT INTO attempts (outbox_id, finished_at_ms, action, outcome, status, excerpt, error, \
               record_id, meta, sealed_with, event_id, attempt, worker, started_at_ms) \
             SELECT v_id, v_finished, v_action, v_outcome, v_status, v_excerpt, v_error, v_record, v_meta, \
               v_sealed, v_event, v_attempt, v_owner, v_started FROM v",
            json_rows(postgres, 1, &call_columns)
        );
        let alone_states = format!(
            "{} UPDATE events SET state = v_state FROM v WHERE id = v_id AND state <> v_state",
            json_rows(postgres, 1, &[("v_id", "bigint"), ("v_state", "text")])
        );
        let event_states = format!(
            "{} {RECOMPUTE_EVENT_STATES} (SELECT v_id FROM v)",
            json_rows(postgres, 1, &[("v_id", "bigint")])
        );
        on_both!(self, pool => {
            let mut tx = pool.begin().await?;
            // In the order `finish` takes its locks: the entity, the event, the item.
            let mut released: HashSet<EntityKey> = HashSet::new();
            for row in
                sqlx::query(&release).bind(&release_rows).persistent(false).fetch_all(&mut *tx).await?
            {
                released.insert((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?));
            }
            let mine: Vec<&FinishItem<'_>> = items
                .iter()
                .copied()
                .filter(|i| released.contains(&entity_key(i.item)))
                .collect();
            // Events of several items are locked (in id order) and their state read from their
            // items; an event of one item has the state its item's outcome gives it.
            let mut events: Vec<i64> = mine
                .iter()
                .filter(|i| !alone_in_its_event(i.item))
                .map(|i| i.item.event_id)
                .collect();
            events.sort_unstable();
            events.dedup();
            if !events.is_empty() {
                tx.lock_events(&events).await?;
            }

            let move_rows = rows_json(mine.iter().map(|FinishItem { item, finish, .. }| MoveRow {
                v_id: item.id,
                v_attempt: finish.attempts_after(item.attempts),
                v_state: finish.item_state().as_str(),
                v_next: finish.next_attempt_at_ms(),
                v_doubt: i64::from(finish.doubt().is_in_doubt()),
                v_record: finish.record_id(),
                v_error: finish.error(),
                v_finished: finish.finished_at_ms(now_ms),
            }));
            let mut moved: HashSet<i64> = HashSet::new();
            for row in sqlx::query(&move_items).bind(&move_rows).fetch_all(&mut *tx).await? {
                moved.insert(row.try_get(0)?);
            }
            if moved.len() != mine.len() {
                // An entity released whose item is not there to move: `finish` alone would
                // have recorded nothing of it. Undo, and let each go alone.
                tx.rollback().await?;
                return Ok(None);
            }

            let calls = rows_json(
                mine.iter()
                    .flat_map(|i| i.calls.iter().map(move |call| (i.item, call)))
                    .map(|(item, call)| CallRow {
                        v_id: item.id,
                        v_event: item.event_id,
                        v_attempt: item.attempts,
                        v_owner: &item.lease_owner,
                        v_started: call.started_at_ms,
                        v_finished: call.finished_at_ms,
                        v_action: call.action,
                        v_outcome: call.outcome.as_str(),
                        v_status: call.status,
                        v_excerpt: call.excerpt.as_deref(),
                        v_error: call.error.as_deref(),
                        v_record: call.record_id.as_deref(),
                        v_meta: call.meta.as_deref(),
                        v_sealed: call.sealed_with.as_deref(),
                    }),
            );
            if calls != "[]" {
                sqlx::query(&insert_calls).bind(&calls).execute(&mut *tx).await?;
            }
            if !events.is_empty() {
                sqlx::query(&event_states).bind(ids_json(&events)).execute(&mut *tx).await?;
            }
            let alone = rows_json(mine.iter().filter(|i| alone_in_its_event(i.item)).map(
                |FinishItem { item, finish, .. }| EventStateRow {
                    v_id: item.event_id,
                    v_state: EventState::of_only_item(finish.item_state()).as_str(),
                },
            ));
            if alone != "[]" {
                sqlx::query(&alone_states).bind(&alone).execute(&mut *tx).await?;
            }
            tx.commit().await?;
            Ok(Some(items.iter().map(|i| moved.contains(&i.item.id)).collect()))
        })
    }
}
