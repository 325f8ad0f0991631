//! Delivery: entity leases, leasing outbox items, renewing leases, finishing items, replay
//! and retention.
//!
//! # Entities and their leases
//! Every item belongs to an entity: (pipeline, target, entity). A worker works on an item only
//! while it holds its entity's lease (`entities.lease_owner`), so one entity is worked on by one
//! worker at a time, across processes. The lease owner is a token unique to one lease call, and
//! it is the fence: renewing a lease and finishing an item both require it, so a worker whose
//! lease was taken over cannot write anything more. A worker makes a CRM call only while its
//! lease, by its own clock, covers the whole call ([`Store::renew_leases`] when it does not).
//!
//! # In flight
//! A lease names the item it took on its entity's row (`entities.in_flight_item`, with the
//! lease that took it and when), and writes nothing to the item: in `outbox` an item in flight
//! is still `pending`. The item's row changes once per attempt, at its finish, which also
//! clears the name; so a lease updates entity rows only, in place, and an outbox row is not
//! copied into every outbox index twice per attempt.
//!
//! # In doubt
//! An item is *in doubt* when a write of it may have reached the CRM without its outcome
//! reaching us: it is in flight (its worker may be calling right now, or may have died
//! mid-call), or `in_doubt` is set (an outcome left it unknown: a timeout, a lost answer). A
//! lease that claims an entity whose lease ended with an item still named in flight *settles*
//! it first: the abandoned attempt is recorded as evidence, the item gets `in_doubt` (and the
//! attempt counted), and the name is cleared. Only then is the head chosen, so the new holder
//! looks the record up before writing, and the doubt outlives a retry.
//!
//! # The head of an entity
//! Of an entity's unfinished items, exactly one may be leased, its head:
//! - if any unfinished item is in doubt, the latest one in doubt (by version, then id): it must
//!   be settled, by looking the record up, before anything else is written to that record;
//! - otherwise the earliest item (by version, then id; by id alone without versions).
//!
//! An item is in flight only under its entity's lease, which needs it to be the head, and the
//! rule is applied under a lease, after the settling (or, for an entity whose first lease this
//! is, in the snapshot that lease creates the entity's row after: see [`Store::lease`]):
//! nothing else of the entity is leased while an item is in flight, and an abandoned one
//! counts as in doubt from then on. So while
//! an item is in doubt nothing else of its entity is written, and lookups compare against a
//! record only that write could have changed.

use sqlx::Row;

use crate::batch::EntityKey;
use crate::{AttemptOutcome, EventState, ItemState, Result, Store};

/// What [`Store::replay_event`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// This many dead writes are pending again.
    Queued(u64),
    /// Refused: `payload_retention` deleted the payload at this time, so there is nothing to
    /// render the writes from.
    PayloadGone { purged_at_ms: i64 },
}

/// See [`Store::backlog`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backlog {
    pub unfinished: i64,
    pub dead: i64,
    pub oldest_received_at_ms: Option<i64>,
}

/// See [`Store::pool_usage`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolUsage {
    pub in_use: u32,
    pub idle: u32,
    pub max: u32,
}

/// An item a worker holds under its entity's lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeasedItem {
    pub id: i64,
    pub event_id: i64,
    pub pipeline: String,
    pub target: String,
    pub target_index: i64,
    pub entity: String,
    /// The version's sort key.
    pub version: Option<String>,
    /// The version as the sender wrote it.
    pub version_text: Option<String>,
    /// Leases of this item so far, counting this one.
    pub attempts: i64,
    /// A previous write may have reached the CRM without its answer reaching us: look up first.
    pub in_doubt: bool,
    /// The lease token: the fence for every write about this item.
    pub lease_owner: String,
    /// When the entity's lease ends unless renewed, by the leasing worker's clock.
    pub lease_expires_at_ms: i64,
    /// The entity's version guard, read under the lease: only the lease holder changes it,
    /// so it holds for the whole attempt. Read only for items with a version.
    pub guard: EntityGuard,
    /// How many items its event has (`None`: not recorded, an item older than that).
    pub siblings: Option<i64>,
}

/// A lease to renew, for [`Store::renew_leases`].
#[derive(Debug, Clone, Copy)]
pub struct Renewal<'a> {
    pub item: &'a LeasedItem,
    /// The lease's new end, by the renewing worker's clock.
    pub lease_expires_at_ms: i64,
}

/// A version confirmed applied to an entity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedVersion {
    pub sort_key: String,
    pub text: String,
}

/// What the version guard needs to know about an entity.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EntityGuard {
    /// The last version confirmed applied.
    pub applied: Option<AppliedVersion>,
    /// The highest version of a write that was dead-lettered while in doubt: it may have been
    /// applied, so for ordering it counts as if it had.
    pub doubted: Option<AppliedVersion>,
}

/// One CRM call of an attempt, or a decision taken without a call, as evidence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub action: &'static str,
    pub started_at_ms: i64,
    pub finished_at_ms: i64,
    pub outcome: AttemptOutcome,
    pub status: Option<i64>,
    /// The start of the answer, or its sealed form (see `sealed_with`).
    pub excerpt: Option<String>,
    pub error: Option<String>,
    pub record_id: Option<String>,
    pub meta: Option<String>,
    /// The payload key the excerpt is sealed under; `None`: plaintext.
    pub sealed_with: Option<String>,
}

/// Whether a write of an item may have reached the CRM without its outcome reaching us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Doubt {
    /// No write of it can be out unconfirmed.
    Clear,
    /// One may be: the record is looked up before anything else of its entity is written,
    /// and a dead letter in doubt counts for ordering as if applied.
    InDoubt,
}

impl Doubt {
    /// The doubt an item was leased with.
    pub fn of(item: &LeasedItem) -> Doubt {
        if item.in_doubt { Doubt::InDoubt } else { Doubt::Clear }
    }

    pub fn is_in_doubt(self) -> bool {
        self == Doubt::InDoubt
    }
}

/// How an attempt ended: what becomes of its item, and of its entity's version guard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    /// The write is in the CRM: `done`. `version`, if any, is recorded as the entity's last
    /// applied one (the guard only moves forward).
    Applied { record_id: String, version: Option<AppliedVersion> },
    /// Not written, for `reason`: a newer version was (or may have been) applied, or the
    /// source is gone. `skipped_stale`.
    Skipped { reason: String, doubt: Doubt },
    /// Pending again, due at `at_ms`, after `error`.
    Retry { at_ms: i64, error: String, doubt: Doubt },
    /// Pending again, due at `at_ms`: the CRM asked to wait (its rate limit). The attempt
    /// stays in the evidence but does not count toward `attempts_max`: a write that waits for
    /// a CRM's window or day is not failing, and must not be dead-lettered for it.
    Deferred { at_ms: i64, error: String, doubt: Doubt },
    /// Dead-lettered for `error`: `dead`. In doubt, its version counts as possibly applied.
    Dead { error: String, doubt: Doubt },
}

impl Finish {
    /// The item's state after it.
    pub fn item_state(&self) -> ItemState {
        match self {
            Finish::Applied { .. } => ItemState::Done,
            Finish::Skipped { .. } => ItemState::SkippedStale,
            Finish::Retry { .. } | Finish::Deferred { .. } => ItemState::Pending,
            Finish::Dead { .. } => ItemState::Dead,
        }
    }

    /// Whether a write of the item may still be in the CRM unconfirmed.
    pub fn doubt(&self) -> Doubt {
        match self {
            Finish::Applied { .. } => Doubt::Clear,
            Finish::Skipped { doubt, .. }
            | Finish::Retry { doubt, .. }
            | Finish::Deferred { doubt, .. }
            | Finish::Dead { doubt, .. } => *doubt,
        }
    }

    /// The item's last error, kept on it.
    pub fn error(&self) -> Option<&str> {
        match self {
            Finish::Applied { .. } => None,
            Finish::Skipped { reason: error, .. }
            | Finish::Retry { error, .. }
            | Finish::Deferred { error, .. }
            | Finish::Dead { error, .. } => Some(error),
        }
    }

    pub fn record_id(&self) -> Option<&str> {
        match self {
            Finish::Applied { record_id, .. } => Some(record_id),
            _ => None,
        }
    }

    /// The item's `next_attempt_at_ms` column: when a retry is due; 0 for an item that is
    /// finished, which no walk reads.
    pub(crate) fn next_attempt_at_ms(&self) -> i64 {
        match self {
            Finish::Retry { at_ms, .. } | Finish::Deferred { at_ms, .. } => *at_ms,
            _ => 0,
        }
    }

    /// The item's attempts after it, from the leased count (which includes this attempt):
    /// a deferred attempt is given back.
    pub(crate) fn attempts_after(&self, leased: i64) -> i64 {
        match self {
            Finish::Deferred { .. } => leased.saturating_sub(1).max(0),
            _ => leased,
        }
    }

    /// When the item finished, if this ends it.
    pub(crate) fn finished_at_ms(&self, now_ms: i64) -> Option<i64> {
        self.item_state().is_finished().then_some(now_ms)
    }

    /// The version guard's new values for the item's entity (applied, its text, doubted, its
    /// text), each `None` where it does not move: a write dead-lettered in doubt may be in the
    /// CRM, so it raises the doubted version.
    pub(crate) fn guard_values<'a>(&'a self, item: &'a LeasedItem) -> [Option<&'a str>; 4] {
        let (applied, applied_text) = match self {
            Finish::Applied { version: Some(v), .. } => {
                (Some(v.sort_key.as_str()), Some(v.text.as_str()))
            }
            _ => (None, None),
        };
        let (doubted, doubted_text) = match (self, &item.version) {
            (Finish::Dead { doubt: Doubt::InDoubt, .. }, Some(version)) => {
                (Some(version.as_str()), Some(item.version_text.as_deref().unwrap_or(version)))
            }
            _ => (None, None),
        };
        [applied, applied_text, doubted, doubted_text]
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptRecord {
    pub id: i64,
    pub outbox_id: i64,
    pub attempt: i64,
    pub worker: String,
    pub started_at_ms: i64,
    pub finished_at_ms: Option<i64>,
    pub action: Option<String>,
    pub outcome: Option<AttemptOutcome>,
    pub status: Option<i64>,
    pub excerpt: Option<String>,
    pub error: Option<String>,
    pub record_id: Option<String>,
    pub meta: Option<String>,
    /// The payload key `excerpt` is sealed under; `None`: plaintext.
    pub sealed_with: Option<String>,
}

/// `o` is the head of its entity (see the module documentation), for an entity whose item in
/// flight, if any, has been settled. Versions compare as sort keys; an item without a version
/// sorts by id alone.
const HEAD: &str = concat!(
    "NOT EXISTS (SELECT 1 FROM outbox b \
    WHERE b.pipeline = o.pipeline AND b.target = o.target AND b.entity = o.entity AND b.id <> o.id \
      AND b.state = ",
    sql_literal!(ItemState::Pending),
    " AND ((b.in_doubt = 1 AND (COALESCE(b.version, ''), b.id) > (COALESCE(o.version, ''), o.id)) \
        OR (o.in_doubt = 0 AND (COALESCE(b.version, ''), b.id) < (COALESCE(o.version, ''), o.id))))"
);

/// Unfinished and due. An item in flight is pending and was due when it was leased, so an item
/// left in flight by a worker that died is due too, and found by the same walk.
const DUE: &str =
    concat!("(o.state = ", sql_literal!(ItemState::Pending), " AND o.next_attempt_at_ms <= $1)");

/// The lease's candidates: the free entity heads, as [`ITEM_COLUMNS`], their lane (`walk`) and
/// whether their entity has no row yet (`new_entity`, 1 or 0), `$1` the time, `$2` the most per
/// lane. Each lane is its own range of `outbox_due (state,
/// lane, next_attempt_at_ms)`, walked in due order and stopped at the limit. Items in flight
/// are pending and at the front of the range (they were due first): the walk passes them by
/// one probe of their entity's row each, which tells both whether the entity is free and
/// whether it has a row. An item left in flight by a worker that died is met in the same walk
/// once its lease has ended. For an entity that has a row, this snapshot's head is a guess (an
/// item in flight is not yet settled): the lease chooses again under the claim. For an entity
/// without one it is the head (see [`Store::lease`]).
pub(crate) fn lease_candidates_sql() -> String {
    // The row's existence comes from the same join that tells the lease: a separate `EXISTS`
    // in the select list was planned as a hash of all of `entities`, built at every walk, and
    // doubled the walk's time.
    let due = |lane: i64| {
        format!(
            "SELECT * FROM (SELECT {ITEM_COLUMNS}, CAST({lane} AS BIGINT) AS walk, \
               CAST(CASE WHEN e.pipeline IS NULL THEN 1 ELSE 0 END AS BIGINT) AS new_entity \
             FROM outbox o LEFT JOIN entities e \
               ON e.pipeline = o.pipeline AND e.target = o.target AND e.entity = o.entity \
             WHERE o.state = {pending} AND o.lane = {lane} AND o.next_attempt_at_ms <= $1 \
               AND (e.lease_expires_at_ms IS NULL OR e.lease_expires_at_ms <= $1) \
               AND NOT EXISTS (SELECT 1 FROM pauses p WHERE p.pipeline = o.pipeline \
                 AND p.kind = 'delivery' AND p.target = o.target) \
               AND {HEAD} ORDER BY o.next_attempt_at_ms LIMIT $2) AS lane{lane}",
            pending = sql_literal!(ItemState::Pending),
        )
    };
    format!("{} UNION ALL {}", due(LANE_FRESH), due(LANE_REPLAY))
}

/// An item as a lease takes it: `attempts` counts the lease being taken.
const ITEM_COLUMNS: &str = "o.id, o.event_id, o.pipeline, o.target, o.target_index, o.entity, o.version, \
    o.version_text, o.attempts + 1 AS attempts, o.in_doubt, o.siblings";

/// Writes to do (pending, in flight among them), across pipelines.
pub(crate) const UNFINISHED_COUNT: &str =
    concat!("SELECT COUNT(*) FROM outbox WHERE state = ", sql_literal!(ItemState::Pending));

/// Writes dead-lettered, across pipelines.
pub(crate) const DEAD_COUNT: &str =
    concat!("SELECT COUNT(*) FROM outbox WHERE state = ", sql_literal!(ItemState::Dead));

/// When the oldest write to do was received: an item is created with its event's receipt
/// time, so there is no join to `events`.
pub(crate) const OLDEST_UNFINISHED: &str = concat!(
    "SELECT MIN(created_at_ms) FROM outbox WHERE state = ",
    sql_literal!(ItemState::Pending)
);

/// The `CASE` that derives the state of the event `$event` (an SQL expression) from its
/// items: pending work, a dead letter, or done. See [`EventState`](crate::EventState).
macro_rules! event_state_of {
    ($event:literal) => {
        concat!(
            "CASE WHEN EXISTS (SELECT 1 FROM outbox o WHERE o.event_id = ",
            $event,
            " AND o.state = ",
            sql_literal!(ItemState::Pending),
            ") THEN ",
            sql_literal!(EventState::Accepted),
            " WHEN EXISTS (SELECT 1 FROM outbox o WHERE o.event_id = ",
            $event,
            " AND o.state = ",
            sql_literal!(ItemState::Dead),
            ") THEN ",
            sql_literal!(EventState::Dead),
            " ELSE ",
            sql_literal!(EventState::Done),
            " END"
        )
    };
}

/// Recomputes an event's state from its items.
const EVENT_STATE: &str =
    concat!("UPDATE events SET state = ", event_state_of!("$1"), " WHERE id = $1");

/// Whether `item` is the only item of its event.
pub(crate) fn alone_in_its_event(item: &LeasedItem) -> bool {
    item.siblings == Some(1)
}

/// [`EVENT_STATE`] for many events: followed by the parenthesised list of their ids.
pub(crate) const RECOMPUTE_EVENT_STATES: &str =
    concat!("UPDATE events SET state = ", event_state_of!("events.id"), " WHERE id IN");

/// [`LockEvent`] for many events, taken in id order (the order every batch takes them, so two
/// batches wait for each other rather than deadlock). `events` must be sorted.
pub(crate) trait LockEvents {
    async fn lock_events(&mut self, events: &[i64]) -> sqlx::Result<()>;
}

impl LockEvents for sqlx::Transaction<'_, sqlx::Postgres> {
    async fn lock_events(&mut self, events: &[i64]) -> sqlx::Result<()> {
        sqlx::query(
            "SELECT id FROM events WHERE id IN (SELECT v_id FROM jsonb_to_recordset($1::jsonb) AS r(v_id bigint)) \
             ORDER BY id FOR NO KEY UPDATE",
        )
        .bind(crate::batch::ids_json(events))
        .fetch_all(&mut **self)
        .await?;
        Ok(())
    }
}

impl LockEvents for sqlx::Transaction<'_, sqlx::Sqlite> {
    async fn lock_events(&mut self, _events: &[i64]) -> sqlx::Result<()> {
        Ok(())
    }
}

/// Takes an event's row lock before its items change, so that two finishes of one event's
/// items (in two entities, at once) recompute its state one after the other: each in its own
/// snapshot would see the other's item still in flight, and the event would stay `accepted`.
/// SQLite's one writer serializes them already.
///
/// `FOR NO KEY UPDATE`, the lock the state update takes anyway: two finishes wait for each
/// other, but a `KEY SHARE` lock (a foreign key check of a row that references the event) does
/// not wait on it, so leases and finish batches cannot deadlock on events.
trait LockEvent {
    async fn lock_event(&mut self, event_id: i64) -> sqlx::Result<()>;
}

impl LockEvent for sqlx::Transaction<'_, sqlx::Postgres> {
    async fn lock_event(&mut self, event_id: i64) -> sqlx::Result<()> {
        sqlx::query("SELECT id FROM events WHERE id = $1 FOR NO KEY UPDATE")
            .bind(event_id)
            .fetch_optional(&mut **self)
            .await
            .map(|_| ())
    }
}

impl LockEvent for sqlx::Transaction<'_, sqlx::Sqlite> {
    async fn lock_event(&mut self, _event_id: i64) -> sqlx::Result<()> {
        Ok(())
    }
}

async fn lock_event<T: LockEvent>(tx: &mut T, event_id: i64) -> sqlx::Result<()> {
    tx.lock_event(event_id).await
}

impl Store {
    /// Leases the heads of up to `limit` entities for `owner` until `lease_expires_at_ms`.
    ///
    /// Candidates (free entity heads in one snapshot, and whether their entity has a row) are
    /// read first; then, in one transaction, entity rows are created for candidates whose
    /// entity had none (unless their target was paused since), held by `owner` and naming the
    /// snapshot's head in flight; the existing rows nobody holds are claimed (PostgreSQL: `FOR
    /// UPDATE SKIP LOCKED`, so concurrent leasers skip each other), an item a claimed entity's
    /// last lease left in flight is settled (see the module documentation), and the head of
    /// each claimed entity is chosen, checked again under the claim so that a head chosen from
    /// an older snapshot is never used, and named on its entity's row. Claimed entities whose
    /// head is not due after all are released.
    ///
    /// A created row needs no second look at its head: entity rows are never deleted, so an
    /// entity whose row this lease creates was never leased, and no lease changed its items
    /// between the snapshot and now. The snapshot applied the head rule to the items' own
    /// columns (`in_doubt` included), and what the claim adds to it, settling an item named in
    /// flight on the entity's row, has nothing to settle without a row. Intake may have added
    /// an item since, even an older version: the lease is then as if it had come just before
    /// that delivery, whose older version the version guard skips.
    ///
    /// A leased item may be written at once, within its lease: nothing else is recorded before
    /// its call.
    pub async fn lease(
        &self,
        owner: &str,
        now_ms: i64,
        lease_expires_at_ms: i64,
        limit: i64,
    ) -> Result<Vec<LeasedItem>> {
        let postgres = matches!(self, Store::Postgres(_));
        let keys = [("v_pipeline", "text"), ("v_target", "text"), ("v_entity", "text")];
        let rows = |param: usize| crate::batch::json_rows(postgres, param, &keys);
        let not_paused = "NOT EXISTS (SELECT 1 FROM pauses p \
            WHERE p.pipeline = o.pipeline AND p.kind = 'delivery' AND p.target = o.target)";
        let in_flight_rows = |param: usize| {
            crate::batch::json_rows(
                postgres,
                param,
                &[
                    ("v_pipeline", "text"),
                    ("v_target", "text"),
                    ("v_entity", "text"),
                    ("v_id", "bigint"),
                ],
            )
        };
        // New entity rows, held and naming the snapshot's heads in flight, unless their target
        // was paused since the walk; a row made meanwhile by another leaser is left alone (its
        // entity goes to the claim). (A `WHERE` is needed anyway: SQLite reads `ON CONFLICT`
        // after a bare `FROM` as a join constraint.)
        let insert = in_flight_rows(1)
            + " INSERT INTO entities (pipeline, target, entity, lease_owner, lease_expires_at_ms, in_flight_item, \
                in_flight_owner, in_flight_since_ms) \
              SELECT v_pipeline, v_target, v_entity, $2, $3, v_id, $2, $4 FROM v \
              WHERE NOT EXISTS (SELECT 1 FROM pauses p WHERE p.pipeline = v_pipeline AND p.kind = 'delivery' \
                AND p.target = v_target) \
              ON CONFLICT DO NOTHING RETURNING pipeline, target, entity";
        // PostgreSQL: the rows are locked first, skipping those another leaser holds, and
        // updated by their physical address, so that the update joins nothing (a join of
        // the locked rows back to `entities` by key was planned as a scan of the table).
        // SQLite has one writer: nothing to skip. A claim leaves the name of an item in
        // flight as it was: it is settled next.
        let claim = if postgres {
            format!(
                "{} UPDATE entities SET lease_owner = $2, lease_expires_at_ms = $3 \
                 WHERE ctid = ANY(ARRAY(SELECT e.ctid FROM entities e JOIN v \
                   ON e.pipeline = v_pipeline AND e.target = v_target AND e.entity = v_entity \
                   WHERE (e.lease_expires_at_ms IS NULL OR e.lease_expires_at_ms <= $1) \
                   FOR UPDATE OF e SKIP LOCKED)) \
                 RETURNING pipeline, target, entity, in_flight_item",
                rows(4)
            )
        } else {
            format!(
                "{} UPDATE entities SET lease_owner = $2, lease_expires_at_ms = $3 FROM v \
                 WHERE pipeline = v_pipeline AND target = v_target AND entity = v_entity \
                   AND (lease_expires_at_ms IS NULL OR lease_expires_at_ms <= $1) \
                 RETURNING pipeline, target, entity, in_flight_item",
                rows(4)
            )
        };
        // Settling items left in flight (rare: their worker stopped without an outcome), in
        // this order: the evidence, while the entity still names the worker that left the
        // item; the doubt, with the abandoned attempt counted; then the name cleared.
        let ids = |param: usize| crate::batch::json_rows(postgres, param, &[("v_id", "bigint")]);
        let abandoned_evidence = format!(
            "{} INSERT INTO attempts (outbox_id, event_id, attempt, worker, started_at_ms, finished_at_ms, \
               action, outcome, error) \
             SELECT o.id, o.event_id, o.attempts + 1, COALESCE(e.in_flight_owner, ''), \
               COALESCE(e.in_flight_since_ms, $1), $1, 'lease', {abandoned}, $2 \
             FROM v JOIN outbox o ON o.id = v_id JOIN entities e ON e.pipeline = o.pipeline \
               AND e.target = o.target AND e.entity = o.entity AND e.in_flight_item = o.id",
            ids(3),
            abandoned = sql_literal!(AttemptOutcome::Abandoned),
        );
        let abandoned_doubt = format!(
            "{} UPDATE outbox SET in_doubt = 1, attempts = attempts + 1 WHERE id IN (SELECT v_id FROM v)",
            ids(1)
        );
        let abandoned_cleared = format!(
            "{} UPDATE entities SET in_flight_item = NULL, in_flight_owner = NULL, in_flight_since_ms = NULL \
             FROM v WHERE pipeline = v_pipeline AND target = v_target AND entity = v_entity AND lease_owner = $1",
            rows(2)
        );
        // The items this lease takes of the entities it claimed (settled by then): the head
        // of each entity in `v`, due at `$1`, not paused.
        let claimed_heads = format!(
            "{} SELECT {ITEM_COLUMNS} FROM v JOIN outbox o ON o.pipeline = v_pipeline AND o.target = v_target \
               AND o.entity = v_entity \
             WHERE {DUE} AND {HEAD} AND {not_paused}",
            rows(2)
        );
        let named = format!(
            "{} UPDATE entities SET in_flight_item = v_id, in_flight_owner = $2, in_flight_since_ms = $3 FROM v \
             WHERE pipeline = v_pipeline AND target = v_target AND entity = v_entity AND lease_owner = $2",
            in_flight_rows(1)
        );
        let release = format!(
            "{} UPDATE entities SET lease_owner = NULL, lease_expires_at_ms = NULL FROM v \
             WHERE pipeline = v_pipeline AND target = v_target AND entity = v_entity AND lease_owner = $1",
            rows(2)
        );
        let guards = format!(
            "{} SELECT pipeline, target, entity, applied_version, applied_version_text, doubted_version, \
               doubted_version_text FROM entities JOIN v \
               ON pipeline = v_pipeline AND target = v_target AND entity = v_entity",
            rows(1)
        );
        // A snapshot read: on SQLite it goes to a reader, so that the one writer is not held
        // while the backlog is searched; the claim below checks again.
        let found: Vec<((LeasedItem, bool), i64)> = read_on_both!(self, pool => {
            sqlx::query(&lease_candidates_sql())
                .bind(now_ms)
                .bind(limit)
                .persistent(false)
                .fetch_all(pool)
                .await?
                .iter()
                .map(|row| {
                    let item = leased_from_row(row, owner, lease_expires_at_ms)?;
                    let new_entity = row.try_get::<i64, _>("new_entity")? != 0;
                    Ok(((item, new_entity), row.try_get("walk")?))
                })
                .collect::<Result<Vec<_>>>()?
        });
        let mut heads = take_in_turn(found, usize::try_from(limit).unwrap_or(0));
        on_both!(self, pool => {
            if heads.is_empty() {
                return Ok(Vec::new());
            }
            // One order for every leaser, so concurrent inserts of new entity rows cannot
            // wait on each other in a cycle. (A snapshot has one head per entity.)
            heads.sort_by_cached_key(|(item, _)| crate::batch::entity_key(item));
            heads.dedup_by(|(a, _), (b, _)| crate::batch::entity_key(a) == crate::batch::entity_key(b));
            // Entities with a row go to the claim, which skips rows another leaser holds:
            // an insert over an existing row would wait for whoever is changing it.
            let (new, existing): (Vec<_>, Vec<_>) = heads.into_iter().partition(|(_, new)| *new);
            let new: Vec<LeasedItem> = new.into_iter().map(|(item, _)| item).collect();
            let mut candidates: Vec<EntityKey> =
                existing.iter().map(|(item, _)| crate::batch::entity_key(item)).collect();
            let mut tx = pool.begin().await?;
            let mut created: std::collections::HashSet<EntityKey> = std::collections::HashSet::new();
            if !new.is_empty() {
                for row in sqlx::query(&insert)
                    .bind(crate::batch::in_flight_json(&new))
                    .bind(owner)
                    .bind(lease_expires_at_ms)
                    .bind(now_ms)
                    .fetch_all(&mut *tx)
                    .await?
                {
                    created.insert((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?));
                }
            }
            // A row made by another leaser since the snapshot: this lease may still claim it.
            let (mut items, made_meanwhile): (Vec<LeasedItem>, Vec<LeasedItem>) = new
                .into_iter()
                .partition(|item| created.contains(&crate::batch::entity_key(item)));
            candidates.extend(made_meanwhile.iter().map(crate::batch::entity_key));
            candidates.sort();
            let mut held: Vec<EntityKey> = Vec::with_capacity(candidates.len());
            let mut left_in_flight: Vec<i64> = Vec::new();
            if !candidates.is_empty() {
                for row in sqlx::query(&claim)
                    .bind(now_ms)
                    .bind(owner)
                    .bind(lease_expires_at_ms)
                    .bind(crate::batch::entities_json(&candidates))
                    .persistent(false)
                    .fetch_all(&mut *tx)
                    .await?
                {
                    held.push((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?));
                    left_in_flight.extend(row.try_get::<Option<i64>, _>(3)?);
                }
            }
            if !held.is_empty() {
                held.sort();
                let held_json = crate::batch::entities_json(&held);
                if !left_in_flight.is_empty() {
                    left_in_flight.sort_unstable();
                    let left = crate::batch::ids_json(&left_in_flight);
                    sqlx::query(&abandoned_evidence)
                        .bind(now_ms)
                        .bind(ABANDONED)
                        .bind(&left)
                        .persistent(false)
                        .execute(&mut *tx)
                        .await?;
                    sqlx::query(&abandoned_doubt).bind(&left).execute(&mut *tx).await?;
                    sqlx::query(&abandoned_cleared)
                        .bind(owner)
                        .bind(&held_json)
                        .persistent(false)
                        .execute(&mut *tx)
                        .await?;
                }
                let claimed_items = sqlx::query(&claimed_heads)
                    .bind(now_ms)
                    .bind(&held_json)
                    .persistent(false)
                    .fetch_all(&mut *tx)
                    .await?
                    .iter()
                    .map(|row| leased_from_row(row, owner, lease_expires_at_ms))
                    .collect::<Result<Vec<LeasedItem>>>()?;
                if !claimed_items.is_empty() {
                    sqlx::query(&named)
                        .bind(crate::batch::in_flight_json(&claimed_items))
                        .bind(owner)
                        .bind(now_ms)
                        .persistent(false)
                        .execute(&mut *tx)
                        .await?;
                }
                // An entity has one head; the entities claimed whose head was not due after
                // all (an older snapshot's candidates) are let go.
                if claimed_items.len() < held.len() {
                    let leased: std::collections::HashSet<EntityKey> =
                        claimed_items.iter().map(crate::batch::entity_key).collect();
                    held.retain(|key| !leased.contains(key));
                    sqlx::query(&release)
                        .bind(owner)
                        .bind(crate::batch::entities_json(&held))
                        .persistent(false)
                        .execute(&mut *tx)
                        .await?;
                }
                items.extend(claimed_items);
            }
            if items.is_empty() {
                return Ok(Vec::new());
            }
            let versioned: Vec<EntityKey> = items
                .iter()
                .filter(|item| item.version.is_some())
                .map(crate::batch::entity_key)
                .collect();
            if !versioned.is_empty() {
                let mut read: std::collections::HashMap<EntityKey, EntityGuard> =
                    std::collections::HashMap::new();
                for row in sqlx::query(&guards)
                    .bind(crate::batch::entities_json(&versioned))
                    .persistent(false)
                    .fetch_all(&mut *tx)
                    .await?
                {
                    let key = (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
                    let versions = (row.try_get(3)?, row.try_get(4)?, row.try_get(5)?, row.try_get(6)?);
                    read.insert(key, guard_from_row(versions));
                }
                for item in &mut items {
                    if let Some(guard) = read.remove(&crate::batch::entity_key(item)) {
                        item.guard = guard;
                    }
                }
            }
            tx.commit().await?;
            Ok(items)
        })
    }

    /// Renews each item's lease to its new end, if the item's lease owner still holds its
    /// entity; one transaction for all. Returns, per renewal, whether it held.
    pub async fn renew_leases(&self, renewals: &[Renewal<'_>]) -> Result<Vec<bool>> {
        if renewals.is_empty() {
            return Ok(Vec::new());
        }
        let postgres = matches!(self, Store::Postgres(_));
        let renew = format!(
            "{} UPDATE entities SET lease_expires_at_ms = v_expires FROM v \
             WHERE pipeline = v_pipeline AND target = v_target AND entity = v_entity \
               AND lease_owner = v_owner \
             RETURNING pipeline, target, entity, lease_owner",
            crate::batch::json_rows(
                postgres,
                1,
                &[
                    ("v_pipeline", "text"),
                    ("v_target", "text"),
                    ("v_entity", "text"),
                    ("v_owner", "text"),
                    ("v_expires", "bigint"),
                ]
            )
        );
        let rows = crate::batch::renewals_json(renewals);
        on_both!(self, pool => {
            let mut tx = pool.begin().await?;
            let mut held: std::collections::HashSet<(String, String, String, String)> =
                std::collections::HashSet::new();
            for row in sqlx::query(&renew).bind(&rows).persistent(false).fetch_all(&mut *tx).await? {
                held.insert((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?, row.try_get(3)?));
            }
            tx.commit().await?;
            Ok(renewals
                .iter()
                .map(|Renewal { item, .. }| {
                    held.contains(&(
                        item.pipeline.clone(),
                        item.target.clone(),
                        item.entity.clone(),
                        item.lease_owner.clone(),
                    ))
                })
                .collect())
        })
    }

    /// The version guard's view of an item's entity.
    pub async fn entity_guard(
        &self,
        pipeline: &str,
        target: &str,
        entity: &str,
    ) -> Result<EntityGuard> {
        on_both!(self, pool => {
            let row: Option<GuardRow> = sqlx::query_as(
                "SELECT applied_version, applied_version_text, doubted_version, doubted_version_text \
                 FROM entities WHERE pipeline = $1 AND target = $2 AND entity = $3",
            )
            .bind(pipeline)
            .bind(target)
            .bind(entity)
            .persistent(false)
            .fetch_optional(pool)
            .await?;
            Ok(row.map(guard_from_row).unwrap_or_default())
        })
    }

    /// Ends an attempt: records its calls, moves the item on, updates the version guard and
    /// releases the entity, if `item` still holds the lease (a worker whose lease was taken
    /// over cannot overwrite the work of the one that took it). Returns whether it did.
    pub async fn finish(
        &self,
        item: &LeasedItem,
        finish: &Finish,
        calls: &[Call],
        now_ms: i64,
    ) -> Result<bool> {
        on_both!(self, pool => {
            let mut tx = pool.begin().await?;
            let [applied, applied_text, doubted, doubted_text] = finish.guard_values(item);
            // The guard never moves backwards. Every assignment reads the row before the update.
            let released = sqlx::query(
                "UPDATE entities SET lease_owner = NULL, lease_expires_at_ms = NULL, in_flight_item = NULL, \
                 in_flight_owner = NULL, in_flight_since_ms = NULL, \
                 applied_version = CASE WHEN $5 IS NOT NULL AND (applied_version IS NULL OR applied_version < $5) \
                   THEN $5 ELSE applied_version END, \
                 applied_version_text = CASE WHEN $5 IS NOT NULL AND (applied_version IS NULL OR applied_version < $5) \
                   THEN $6 ELSE applied_version_text END, \
                 doubted_version = CASE WHEN $7 IS NOT NULL AND (doubted_version IS NULL OR doubted_version < $7) \
                   THEN $7 ELSE doubted_version END, \
                 doubted_version_text = CASE WHEN $7 IS NOT NULL AND (doubted_version IS NULL OR doubted_version < $7) \
                   THEN $8 ELSE doubted_version_text END \
                 WHERE pipeline = $1 AND target = $2 AND entity = $3 AND lease_owner = $4 AND in_flight_item = $9",
            )
            .bind(&item.pipeline)
            .bind(&item.target)
            .bind(&item.entity)
            .bind(&item.lease_owner)
            .bind(applied)
            .bind(applied_text)
            .bind(doubted)
            .bind(doubted_text)
            .bind(item.id)
            .persistent(false)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if released == 0 {
                return Ok(false);
            }
            let alone = alone_in_its_event(item);
            if !alone {
                lock_event(&mut tx, item.event_id).await?;
            }
            let moved = sqlx::query(
                "UPDATE outbox SET state = $3, next_attempt_at_ms = $4, in_doubt = $5, record_id = COALESCE($6, record_id), \
                 last_error = $7, finished_at_ms = $8, attempts = $2 WHERE id = $1",
            )
            .bind(item.id)
            .bind(finish.attempts_after(item.attempts))
            .bind(finish.item_state())
            .bind(finish.next_attempt_at_ms())
            .bind(i64::from(finish.doubt().is_in_doubt()))
            .bind(finish.record_id())
            .bind(finish.error())
            .bind(finish.finished_at_ms(now_ms))
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if moved == 0 {
                return Ok(false);
            }
            for call in calls {
                sqlx::query(
                    "INSERT INTO attempts (outbox_id, event_id, attempt, worker, started_at_ms, finished_at_ms, \
                     action, outcome, status, excerpt, error, record_id, meta, sealed_with) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
                )
                .bind(item.id)
                .bind(item.event_id)
                .bind(item.attempts)
                .bind(&item.lease_owner)
                .bind(call.started_at_ms)
                .bind(call.finished_at_ms)
                .bind(call.action)
                .bind(call.outcome)
                .bind(call.status)
                .bind(&call.excerpt)
                .bind(&call.error)
                .bind(&call.record_id)
                .bind(&call.meta)
                .bind(&call.sealed_with)
                .execute(&mut *tx)
                .await?;
            }
            if alone {
                sqlx::query("UPDATE events SET state = $2 WHERE id = $1 AND state <> $2")
                    .bind(item.event_id)
                    .bind(EventState::of_only_item(finish.item_state()))
                    .execute(&mut *tx)
                    .await?;
            } else {
                sqlx::query(EVENT_STATE).bind(item.event_id).execute(&mut *tx).await?;
            }
            tx.commit().await?;
            Ok(true)
        })
    }

    pub async fn attempts_for(&self, event_id: i64) -> Result<Vec<AttemptRecord>> {
        read_on_both!(self, pool => {
            let rows = sqlx::query(
                "SELECT id, outbox_id, attempt, worker, started_at_ms, finished_at_ms, action, outcome, status, excerpt, \
                 error, record_id, meta, sealed_with FROM attempts WHERE event_id = $1 ORDER BY id",
            )
            .bind(event_id)
            .fetch_all(pool)
            .await?;
            rows.iter()
                .map(|r| {
                    Ok(AttemptRecord {
                        id: r.try_get("id")?,
                        outbox_id: r.try_get("outbox_id")?,
                        attempt: r.try_get("attempt")?,
                        worker: r.try_get("worker")?,
                        started_at_ms: r.try_get("started_at_ms")?,
                        finished_at_ms: r.try_get("finished_at_ms")?,
                        action: r.try_get("action")?,
                        outcome: r.try_get("outcome")?,
                        status: r.try_get("status")?,
                        excerpt: r.try_get("excerpt")?,
                        error: r.try_get("error")?,
                        record_id: r.try_get("record_id")?,
                        meta: r.try_get("meta")?,
                        sealed_with: r.try_get("sealed_with")?,
                    })
                })
                .collect()
        })
    }

    /// Puts an event's dead items back to work, with their attempts reset. Returns how many.
    /// An item dead-lettered in doubt stays in doubt: it is looked up before it is written.
    pub async fn replay_event(&self, event_id: i64, now_ms: i64) -> Result<Replay> {
        self.replay_event_writes(event_id, None, now_ms).await
    }

    /// [`Store::replay_event`], for the dead writes of one target only when `target` is
    /// given. Replayed writes go to the replay lane (see [`LANE_REPLAY`]).
    pub async fn replay_event_writes(
        &self,
        event_id: i64,
        target: Option<&str>,
        now_ms: i64,
    ) -> Result<Replay> {
        on_both!(self, pool => {
            let mut tx = pool.begin().await?;
            lock_event(&mut tx, event_id).await?;
            // Nothing to write from: `payload_retention` deleted the body the writes render.
            let purged: Option<Option<i64>> =
                sqlx::query_scalar("SELECT payload_purged_at_ms FROM events WHERE id = $1")
                    .bind(event_id)
                    .fetch_optional(&mut *tx)
                    .await?;
            if let Some(Some(purged_at_ms)) = purged {
                return Ok(Replay::PayloadGone { purged_at_ms });
            }
            // Evidence first: the operator's replay is part of the item's story.
            sqlx::query(concat!(
                "INSERT INTO attempts (outbox_id, event_id, attempt, worker, started_at_ms, finished_at_ms, action, outcome) \
                 SELECT id, event_id, attempts, 'operator', $2, $2, 'replay', ",
                sql_literal!(AttemptOutcome::ReplayRequested),
                " FROM outbox WHERE event_id = $1 AND state = ",
                sql_literal!(ItemState::Dead),
                " AND ($3 IS NULL OR target = $3)",
            ))
            .bind(event_id)
            .bind(now_ms)
            .bind(target)
            .execute(&mut *tx)
            .await?;
            let replayed = sqlx::query(concat!(
                "UPDATE outbox SET state = ",
                sql_literal!(ItemState::Pending),
                ", attempts = 0, next_attempt_at_ms = $2, last_error = NULL, \
                 finished_at_ms = NULL, lane = $4 + CASE WHEN EXISTS (SELECT 1 FROM pauses p WHERE p.kind = 'delivery' \
                   AND p.pipeline = outbox.pipeline AND p.target = outbox.target) THEN $5 ELSE 0 END \
                 WHERE event_id = $1 AND state = ",
                sql_literal!(ItemState::Dead),
                " AND ($3 IS NULL OR target = $3)",
            ))
            .bind(event_id)
            .bind(now_ms)
            .bind(target)
            .bind(LANE_REPLAY)
            .bind(LANE_PARKED)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            sqlx::query(EVENT_STATE).bind(event_id).execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(Replay::Queued(replayed))
        })
    }

    /// Ids of events with a dead item, optionally of one pipeline.
    pub async fn dead_events(&self, pipeline: Option<&str>) -> Result<Vec<i64>> {
        read_on_both!(self, pool => {
            Ok(sqlx::query_scalar(concat!(
                "SELECT DISTINCT event_id FROM outbox WHERE state = ",
                sql_literal!(ItemState::Dead),
                " AND ($1 IS NULL OR pipeline = $1) ORDER BY event_id",
            ))
            .bind(pipeline)
            .fetch_all(pool)
            .await?)
        })
    }

    /// Deletes up to [`SWEEP_BATCH`] of a pipeline's finished events received before
    /// `cutoff_ms` (never one with an item still to do), with their items, attempts and
    /// deliveries, and rejected deliveries as old. Returns the number of events deleted: call
    /// again while it is [`SWEEP_BATCH`] (an event chosen but found unfinished on the second
    /// look is left for the next sweep).
    ///
    /// The events are chosen once, and everything is deleted by their ids: a statement that
    /// chose again would see events finished since the first choice, and delete their items
    /// and the events without the attempts deleted before (PostgreSQL keeps no foreign key
    /// from attempts since migration `0009`).
    pub async fn sweep(&self, pipeline: &str, cutoff_ms: i64) -> Result<u64> {
        // PostgreSQL: the events are locked in the order `purge_payloads` locks them, so that a
        // sweep and a purge on two gateways wait for each other instead of deadlocking, and
        // their work is looked at again in a new statement (a new snapshot): a replay that
        // committed meanwhile is seen, one that starts later waits for the sweep (it locks the
        // event first) and then finds nothing. SQLite: one writer.
        let postgres = matches!(self, Store::Postgres(_));
        let lock = if postgres { " FOR UPDATE" } else { "" };
        let finished = concat!(
            "state IN (",
            sql_literal!(EventState::Done),
            ", ",
            sql_literal!(EventState::Dead),
            ") AND NOT EXISTS (SELECT 1 FROM outbox WHERE outbox.event_id = events.id AND outbox.state = ",
            sql_literal!(ItemState::Pending),
            ")"
        );
        let ids = crate::batch::json_rows(postgres, 1, &[("v_id", "bigint")]);
        on_both!(self, pool => {
            let mut tx = pool.begin().await?;
            let candidates: Vec<i64> = sqlx::query_scalar(&format!(
                "SELECT id FROM events WHERE pipeline = $1 AND received_at_ms < $2 AND {finished} \
                 ORDER BY received_at_ms, id LIMIT $3{lock}"
            ))
            .bind(pipeline)
            .bind(cutoff_ms)
            .bind(SWEEP_BATCH)
            .fetch_all(&mut *tx)
            .await?;
            let old: Vec<i64> = if candidates.is_empty() {
                Vec::new()
            } else {
                sqlx::query_scalar(&format!(
                    "{ids} SELECT id FROM events WHERE id IN (SELECT v_id FROM v) AND {finished}"
                ))
                .bind(crate::batch::ids_json(&candidates))
                .fetch_all(&mut *tx)
                .await?
            };
            let mut deleted = 0;
            if !old.is_empty() {
                let old = crate::batch::ids_json(&old);
                for table in ["attempts", "outbox", "deliveries"] {
                    sqlx::query(&format!("{ids} DELETE FROM {table} WHERE event_id IN (SELECT v_id FROM v)"))
                        .bind(&old)
                        .execute(&mut *tx)
                        .await?;
                }
                deleted = sqlx::query(&format!("{ids} DELETE FROM events WHERE id IN (SELECT v_id FROM v)"))
                    .bind(&old)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
            }
            sqlx::query("DELETE FROM deliveries WHERE pipeline = $1 AND event_id IS NULL AND received_at_ms < $2")
                .bind(pipeline)
                .bind(cutoff_ms)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(deleted)
        })
    }

    /// How many items are in each state, across pipelines (an item in flight is `pending`
    /// here: its entity names it, see the module documentation).
    pub async fn item_states(&self) -> Result<Vec<(ItemState, i64)>> {
        read_on_both!(self, pool => {
            Ok(sqlx::query_as("SELECT state, COUNT(*) FROM outbox GROUP BY state ORDER BY state")
                .fetch_all(pool)
                .await?)
        })
    }

    /// Attempts that name an item or an event that is not there: none, unless a statement
    /// wrote evidence for the wrong row. On PostgreSQL no foreign key holds this since
    /// migration `0009` (see there); the store's tests and `cargo xtask chaos` check it.
    pub async fn orphaned_attempts(&self) -> Result<i64> {
        read_on_both!(self, pool => {
            Ok(sqlx::query_scalar(
                "SELECT COUNT(*) FROM attempts a \
                 WHERE NOT EXISTS (SELECT 1 FROM outbox o WHERE o.id = a.outbox_id AND o.event_id = a.event_id) \
                    OR NOT EXISTS (SELECT 1 FROM events e WHERE e.id = a.event_id)",
            )
            .fetch_one(pool)
            .await?)
        })
    }

    /// Items still to do (pending or in flight), across pipelines: zero means drained.
    pub async fn unfinished_items(&self) -> Result<i64> {
        read_on_both!(self, pool => {
            Ok(sqlx::query_scalar(UNFINISHED_COUNT).fetch_one(pool).await?)
        })
    }

    /// The backlog, for the operators' gauges: writes to do, writes dead-lettered, and when
    /// the oldest write to do was received. Each is an index range (on PostgreSQL, of a
    /// partial index holding those rows only).
    pub async fn backlog(&self) -> Result<Backlog> {
        read_on_both!(self, pool => {
            let unfinished: i64 = sqlx::query_scalar(UNFINISHED_COUNT).fetch_one(pool).await?;
            let dead: i64 = sqlx::query_scalar(DEAD_COUNT).fetch_one(pool).await?;
            let oldest_received_at_ms: Option<i64> =
                sqlx::query_scalar(OLDEST_UNFINISHED).fetch_one(pool).await?;
            Ok(Backlog { unfinished, dead, oldest_received_at_ms })
        })
    }

    /// Connections of the pool intake writes through: open, idle, and the most it may open.
    pub fn pool_usage(&self) -> PoolUsage {
        let (size, idle, max) = match self {
            Store::Sqlite { writer, .. } => {
                (writer.size(), writer.num_idle(), writer.options().get_max_connections())
            }
            Store::Postgres(pool) => {
                (pool.size(), pool.num_idle(), pool.options().get_max_connections())
            }
        };
        let idle = u32::try_from(idle).unwrap_or(u32::MAX).min(size);
        PoolUsage { in_use: size - idle, idle, max }
    }
}

/// Events deleted per [`Store::sweep`]: short transactions, and a bounded list of ids.
pub const SWEEP_BATCH: i64 = 500;

/// The lane of fresh work (every write intake creates).
pub const LANE_FRESH: i64 = 0;
/// The lane of operators' replays.
pub const LANE_REPLAY: i64 = 1;
/// Added to a write's lane while its target's delivery is paused: parked writes are outside
/// the due walks (which range over lanes 0 and 1) until the pause is lifted.
pub const LANE_PARKED: i64 = 2;

/// Each version's sort key and its text: applied, then doubted.
type GuardRow = (Option<String>, Option<String>, Option<String>, Option<String>);

fn guard_from_row((applied, applied_text, doubted, doubted_text): GuardRow) -> EntityGuard {
    let version = |sort_key: Option<String>, text: Option<String>| {
        sort_key.map(|sort_key| AppliedVersion {
            text: text.unwrap_or_else(|| sort_key.clone()),
            sort_key,
        })
    };
    EntityGuard { applied: version(applied, applied_text), doubted: version(doubted, doubted_text) }
}

/// The evidence of an attempt whose worker stopped before recording an outcome.
const ABANDONED: &str = "the lease ended before its worker recorded an outcome (it stopped, or lost \
    the database): a write may have been sent, so the record is looked up before anything is written";

/// Which lane a lease's candidates start with, flipped at each lease: with room for one
/// write, fresh work and replays take turns.
static REPLAY_FIRST: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Up to `limit` candidates, the lanes in turn, so that when both are full each gets half the
/// lease.
fn take_in_turn<T>(found: Vec<(T, i64)>, limit: usize) -> Vec<T> {
    let (mut fresh, mut replay) = (Vec::new(), Vec::new());
    for (candidate, lane) in found {
        if lane == LANE_REPLAY { &mut replay } else { &mut fresh }.push(candidate);
    }
    let (mut fresh, mut replay) = (fresh.into_iter(), replay.into_iter());
    let replay_first = REPLAY_FIRST.fetch_xor(true, std::sync::atomic::Ordering::Relaxed);
    let mut taken = Vec::with_capacity(limit);
    while taken.len() < limit {
        let (a, b) = if replay_first {
            (replay.next(), fresh.next())
        } else {
            (fresh.next(), replay.next())
        };
        if a.is_none() && b.is_none() {
            break;
        }
        taken.extend(a);
        taken.extend(b);
    }
    taken.truncate(limit);
    taken
}

/// An item taken by the lease `lease_owner`, which lasts until `lease_expires_at_ms`.
fn leased_from_row<R: Row>(
    row: &R,
    lease_owner: &str,
    lease_expires_at_ms: i64,
) -> Result<LeasedItem>
where
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(LeasedItem {
        id: row.try_get("id")?,
        event_id: row.try_get("event_id")?,
        pipeline: row.try_get("pipeline")?,
        target: row.try_get("target")?,
        target_index: row.try_get("target_index")?,
        entity: row.try_get("entity")?,
        version: row.try_get("version")?,
        version_text: row.try_get("version_text")?,
        attempts: row.try_get("attempts")?,
        in_doubt: row.try_get::<i64, _>("in_doubt")? != 0,
        lease_owner: lease_owner.to_owned(),
        lease_expires_at_ms,
        guard: EntityGuard::default(),
        siblings: row.try_get("siblings")?,
    })
}
