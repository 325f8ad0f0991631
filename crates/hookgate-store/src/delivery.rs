//! Delivery: leasing outbox items, recording attempts, finishing items, replay and retention.

use sqlx::Row;

use crate::{Result, Store};

/// Outbox item states.
pub mod state {
    pub const PENDING: &str = "pending";
    pub const IN_FLIGHT: &str = "in_flight";
    pub const DONE: &str = "done";
    pub const DEAD: &str = "dead";
    pub const SKIPPED_STALE: &str = "skipped_stale";
}

/// An item a worker holds until `lease_expires_at_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeasedItem {
    pub id: i64,
    pub event_id: i64,
    pub pipeline: String,
    pub target: String,
    pub target_index: i64,
    pub entity: String,
    pub version: Option<String>,
    /// Counting this one.
    pub attempts: i64,
    /// A previous attempt may have written without its answer arriving: look up first.
    pub in_doubt: bool,
    pub lease_owner: String,
}

/// How an attempt ended, and what becomes of its item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finish {
    /// `pending` (retry at `next_attempt_at_ms`), `done`, `dead` or `skipped_stale`.
    pub state: &'static str,
    pub next_attempt_at_ms: i64,
    pub in_doubt: bool,
    pub record_id: Option<String>,
    pub error: Option<String>,
    /// The attempt's evidence.
    pub action: &'static str,
    pub outcome: String,
    pub status: Option<i64>,
    pub excerpt: Option<String>,
    pub meta: Option<String>,
    /// Record this version as the entity's last applied one.
    pub applied_version: Option<String>,
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
    pub outcome: Option<String>,
    pub status: Option<i64>,
    pub excerpt: Option<String>,
    pub error: Option<String>,
    pub record_id: Option<String>,
    pub meta: Option<String>,
}

/// Candidates: due pending items and items whose lease expired, that are the head of their
/// entity (no other unfinished item of the same entity comes before them) and whose entity no
/// other worker holds. `$1` owner, `$2` lease expiry, `$3` now, `$4` limit.
const LEASE_CANDIDATES: &str = "SELECT o.id FROM outbox o \
    WHERE ((o.state = 'pending' AND o.next_attempt_at_ms <= $3) \
        OR (o.state = 'in_flight' AND o.lease_expires_at_ms <= $3)) \
      AND NOT EXISTS (SELECT 1 FROM outbox b \
        WHERE b.pipeline = o.pipeline AND b.target = o.target AND b.entity = o.entity AND b.id <> o.id \
          AND b.state IN ('pending', 'in_flight') \
          AND ((b.state = 'in_flight' AND b.lease_expires_at_ms > $3) \
            OR b.version < o.version \
            OR (b.version = o.version AND b.id < o.id) \
            OR (o.version IS NULL AND b.id < o.id))) \
    ORDER BY o.next_attempt_at_ms, o.id LIMIT $4";

const LEASE_RETURNING: &str = "RETURNING id, event_id, pipeline, target, target_index, entity, version, attempts, in_doubt, lease_owner";

/// Recomputes an event's state from its items: pending work, a dead letter, or done.
const EVENT_STATE: &str = "UPDATE events SET state = CASE \
    WHEN EXISTS (SELECT 1 FROM outbox WHERE event_id = $1 AND state IN ('pending', 'in_flight')) THEN 'accepted' \
    WHEN EXISTS (SELECT 1 FROM outbox WHERE event_id = $1 AND state = 'dead') THEN 'dead' \
    ELSE 'done' END WHERE id = $1";

impl Store {
    /// Leases up to `limit` items for `owner` until `lease_expires_at_ms`.
    pub async fn lease(
        &self,
        owner: &str,
        now_ms: i64,
        lease_expires_at_ms: i64,
        limit: i64,
    ) -> Result<Vec<LeasedItem>> {
        let update = "UPDATE outbox SET state = 'in_flight', lease_owner = $1, lease_expires_at_ms = $2, \
                      attempts = attempts + 1 WHERE id IN";
        // SQLite has one writer connection, so the subquery and the update run alone; in
        // PostgreSQL concurrent leasers skip each other's rows instead of waiting on them.
        let lock = match self {
            Store::Sqlite { .. } => "",
            Store::Postgres(_) => "FOR UPDATE OF o SKIP LOCKED",
        };
        let sql = format!("{update} ({LEASE_CANDIDATES} {lock}) {LEASE_RETURNING}");
        on_both!(self, pool => {
            let rows = sqlx::query(&sql).bind(owner).bind(lease_expires_at_ms).bind(now_ms).bind(limit).fetch_all(pool).await?;
            rows.iter().map(leased_from_row).collect()
        })
    }

    /// Records the start of an attempt and marks the item in doubt until it finishes. Returns
    /// `None` when the lease was lost to another worker.
    pub async fn start_attempt(
        &self,
        item: &LeasedItem,
        action: &str,
        now_ms: i64,
    ) -> Result<Option<i64>> {
        on_both!(self, pool => {
            let mut tx = pool.begin().await?;
            let held = sqlx::query("UPDATE outbox SET in_doubt = 1 WHERE id = $1 AND lease_owner = $2 AND state = 'in_flight'")
                .bind(item.id)
                .bind(&item.lease_owner)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if held == 0 {
                return Ok(None);
            }
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO attempts (outbox_id, event_id, attempt, worker, started_at_ms, action) \
                 VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
            )
            .bind(item.id)
            .bind(item.event_id)
            .bind(item.attempts)
            .bind(&item.lease_owner)
            .bind(now_ms)
            .bind(action)
            .fetch_one(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(Some(id))
        })
    }

    /// The last version applied to an entity.
    pub async fn entity_version(
        &self,
        pipeline: &str,
        target: &str,
        entity: &str,
    ) -> Result<Option<String>> {
        on_both!(self, pool => {
            Ok(sqlx::query_scalar("SELECT version FROM entity_versions WHERE pipeline = $1 AND target = $2 AND entity = $3")
                .bind(pipeline)
                .bind(target)
                .bind(entity)
                .fetch_optional(pool)
                .await?)
        })
    }

    /// Ends an attempt and moves its item on, if `item` still holds the lease (a worker whose
    /// lease expired cannot overwrite the work of the one that took over). Returns whether it
    /// did.
    pub async fn finish(
        &self,
        item: &LeasedItem,
        attempt_id: Option<i64>,
        finish: &Finish,
        now_ms: i64,
    ) -> Result<bool> {
        on_both!(self, pool => {
            let mut tx = pool.begin().await?;
            let finished_at = matches!(finish.state, "done" | "dead" | "skipped_stale").then_some(now_ms);
            let moved = sqlx::query(
                "UPDATE outbox SET state = $3, next_attempt_at_ms = $4, in_doubt = $5, record_id = COALESCE($6, record_id), \
                 last_error = $7, finished_at_ms = $8, lease_owner = NULL, lease_expires_at_ms = NULL \
                 WHERE id = $1 AND lease_owner = $2 AND state = 'in_flight'",
            )
            .bind(item.id)
            .bind(&item.lease_owner)
            .bind(finish.state)
            .bind(finish.next_attempt_at_ms)
            .bind(i64::from(finish.in_doubt))
            .bind(&finish.record_id)
            .bind(&finish.error)
            .bind(finished_at)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if moved == 0 {
                return Ok(false);
            }
            if let Some(attempt_id) = attempt_id {
                sqlx::query(
                    "UPDATE attempts SET finished_at_ms = $2, action = $3, outcome = $4, status = $5, excerpt = $6, \
                     error = $7, record_id = $8, meta = $9 WHERE id = $1",
                )
                .bind(attempt_id)
                .bind(now_ms)
                .bind(finish.action)
                .bind(&finish.outcome)
                .bind(finish.status)
                .bind(&finish.excerpt)
                .bind(&finish.error)
                .bind(&finish.record_id)
                .bind(&finish.meta)
                .execute(&mut *tx)
                .await?;
            }
            if let Some(version) = &finish.applied_version {
                // Keep the greatest version: the guard never moves backwards.
                sqlx::query(
                    "INSERT INTO entity_versions (pipeline, target, entity, version) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (pipeline, target, entity) DO UPDATE SET version = excluded.version \
                     WHERE entity_versions.version < excluded.version",
                )
                .bind(&item.pipeline)
                .bind(&item.target)
                .bind(&item.entity)
                .bind(version)
                .execute(&mut *tx)
                .await?;
            }
            sqlx::query(EVENT_STATE).bind(item.event_id).execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(true)
        })
    }

    pub async fn attempts_for(&self, event_id: i64) -> Result<Vec<AttemptRecord>> {
        read_on_both!(self, pool => {
            let rows = sqlx::query(
                "SELECT id, outbox_id, attempt, worker, started_at_ms, finished_at_ms, action, outcome, status, excerpt, \
                 error, record_id, meta FROM attempts WHERE event_id = $1 ORDER BY id",
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
                    })
                })
                .collect()
        })
    }

    /// Puts an event's dead items back to work, with their attempts reset. Returns how many.
    pub async fn replay_event(&self, event_id: i64, now_ms: i64) -> Result<u64> {
        on_both!(self, pool => {
            let mut tx = pool.begin().await?;
            // Evidence first: the operator's replay is part of the item's story.
            sqlx::query(
                "INSERT INTO attempts (outbox_id, event_id, attempt, worker, started_at_ms, finished_at_ms, action, outcome) \
                 SELECT id, event_id, attempts, 'operator', $2, $2, 'replay', 'replay_requested' \
                 FROM outbox WHERE event_id = $1 AND state = 'dead'",
            )
            .bind(event_id)
            .bind(now_ms)
            .execute(&mut *tx)
            .await?;
            let replayed = sqlx::query(
                "UPDATE outbox SET state = 'pending', attempts = 0, next_attempt_at_ms = $2, last_error = NULL, \
                 finished_at_ms = NULL WHERE event_id = $1 AND state = 'dead'",
            )
            .bind(event_id)
            .bind(now_ms)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            sqlx::query(EVENT_STATE).bind(event_id).execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(replayed)
        })
    }

    /// Ids of events with a dead item, optionally of one pipeline.
    pub async fn dead_events(&self, pipeline: Option<&str>) -> Result<Vec<i64>> {
        read_on_both!(self, pool => {
            Ok(sqlx::query_scalar(
                "SELECT DISTINCT event_id FROM outbox WHERE state = 'dead' AND ($1 IS NULL OR pipeline = $1) ORDER BY event_id",
            )
            .bind(pipeline)
            .fetch_all(pool)
            .await?)
        })
    }

    /// Deletes a pipeline's finished events received before `cutoff_ms` (never one with an
    /// item still to do), with their items, attempts and deliveries, and rejected deliveries
    /// as old. Returns the number of events deleted.
    pub async fn sweep(&self, pipeline: &str, cutoff_ms: i64) -> Result<u64> {
        on_both!(self, pool => {
            let mut tx = pool.begin().await?;
            let old = "SELECT id FROM events WHERE pipeline = $1 AND received_at_ms < $2 AND state IN ('done', 'dead') \
                       AND NOT EXISTS (SELECT 1 FROM outbox WHERE outbox.event_id = events.id AND outbox.state IN ('pending', 'in_flight'))";
            for table in ["attempts", "outbox", "deliveries"] {
                sqlx::query(&format!("DELETE FROM {table} WHERE event_id IN ({old})"))
                    .bind(pipeline)
                    .bind(cutoff_ms)
                    .execute(&mut *tx)
                    .await?;
            }
            sqlx::query("DELETE FROM deliveries WHERE pipeline = $1 AND event_id IS NULL AND received_at_ms < $2")
                .bind(pipeline)
                .bind(cutoff_ms)
                .execute(&mut *tx)
                .await?;
            let deleted = sqlx::query(&format!("DELETE FROM events WHERE id IN ({old})"))
                .bind(pipeline)
                .bind(cutoff_ms)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            tx.commit().await?;
            Ok(deleted)
        })
    }

    /// Returns items whose lease expired to `pending`, in doubt (their worker died or stalled
    /// mid-call), so that they show as waiting rather than as being worked on.
    pub async fn release_stale_leases(&self, now_ms: i64) -> Result<u64> {
        on_both!(self, pool => {
            Ok(sqlx::query(
                "UPDATE outbox SET state = 'pending', in_doubt = 1, lease_owner = NULL, lease_expires_at_ms = NULL \
                 WHERE state = 'in_flight' AND lease_expires_at_ms <= $1",
            )
            .bind(now_ms)
            .execute(pool)
            .await?
            .rows_affected())
        })
    }

    /// Items still to do (pending or in flight), across pipelines: zero means drained.
    pub async fn unfinished_items(&self) -> Result<i64> {
        read_on_both!(self, pool => {
            Ok(sqlx::query_scalar("SELECT COUNT(*) FROM outbox WHERE state IN ('pending', 'in_flight')").fetch_one(pool).await?)
        })
    }
}

fn leased_from_row<R: Row>(row: &R) -> Result<LeasedItem>
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
        attempts: row.try_get("attempts")?,
        in_doubt: row.try_get::<i64, _>("in_doubt")? != 0,
        lease_owner: row.try_get("lease_owner")?,
    })
}
