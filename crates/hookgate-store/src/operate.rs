//! What operators do to a running gateway through the store: pauses, which every gateway on
//! the database honours; lists of conflicts and dead letters; replays by filter; the backlog
//! per target.

use sqlx::Row;

use crate::delivery::LANE_PARKED;
use crate::{DeliveryOutcome, DeliveryRecord, ItemState, Result, Store, WriteView};

/// What a pause holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PauseKind {
    /// The pipeline's intake: deliveries are answered 503 with Retry-After.
    Intake,
    /// One target's writes: not leased until resumed (held, not dropped).
    Delivery,
}

impl PauseKind {
    pub fn name(self) -> &'static str {
        match self {
            PauseKind::Intake => "intake",
            PauseKind::Delivery => "delivery",
        }
    }

    fn parse(name: &str) -> Option<PauseKind> {
        match name {
            "intake" => Some(PauseKind::Intake),
            "delivery" => Some(PauseKind::Delivery),
            _ => None,
        }
    }
}

/// One pause in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pause {
    pub pipeline: String,
    pub kind: PauseKind,
    /// The target a delivery pause holds; empty for an intake pause.
    pub target: String,
    pub paused_at_ms: i64,
    pub reason: Option<String>,
}

/// A dead-lettered write with what identifies its event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub write_id: i64,
    pub event_id: i64,
    pub pipeline: String,
    pub target: String,
    pub entity: String,
    pub version: Option<String>,
    pub attempts: i64,
    pub in_doubt: bool,
    pub last_error: Option<String>,
    pub finished_at_ms: Option<i64>,
    pub event_key: String,
    pub scope: String,
    pub event_type: Option<String>,
    pub received_at_ms: i64,
}

/// Which dead writes a replay takes.
#[derive(Debug, Clone, Default)]
pub struct ReplayFilter {
    pub pipeline: Option<String>,
    pub target: Option<String>,
    /// Only these events (none: any).
    pub event_ids: Option<Vec<i64>>,
    /// Only events received at or after this time.
    pub since_ms: Option<i64>,
    /// Only events received before this time.
    pub until_ms: Option<i64>,
    /// At most this many events, oldest first.
    pub limit: i64,
}

/// The writes of one target, by state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetBacklog {
    pub pipeline: String,
    pub target: String,
    pub pending: i64,
    pub in_flight: i64,
    pub dead: i64,
}

impl Store {
    /// Puts a pause in force; `false` if it already was (its first time and reason stay). A
    /// delivery pause parks its target's pending writes in the same transaction.
    pub async fn pause(&self, pause: &Pause) -> Result<bool> {
        let postgres = matches!(self, Store::Postgres(_));
        on_both!(self, pool => {
            let mut tx = pool.begin().await?;
            let inserted = sqlx::query(
                "INSERT INTO pauses (pipeline, kind, target, paused_at_ms, reason) VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT DO NOTHING",
            )
            .bind(&pause.pipeline)
            .bind(pause.kind.name())
            .bind(&pause.target)
            .bind(pause.paused_at_ms)
            .bind(&pause.reason)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if inserted == 1 && pause.kind == PauseKind::Delivery {
                sqlx::query(&relane(
                    postgres,
                    "+ $3",
                    concat!(
                        "pipeline = $1 AND target = $2 AND state = ",
                        sql_literal!(ItemState::Pending),
                        " AND lane < $3"
                    ),
                ))
                .bind(&pause.pipeline)
                .bind(&pause.target)
                .bind(LANE_PARKED)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            Ok(inserted == 1)
        })
    }

    /// Lifts a pause; `false` if none was in force. Lifting a delivery pause puts its
    /// target's parked writes back in their lanes in the same transaction.
    pub async fn resume(&self, pipeline: &str, kind: PauseKind, target: &str) -> Result<bool> {
        let postgres = matches!(self, Store::Postgres(_));
        on_both!(self, pool => {
            let mut tx = pool.begin().await?;
            let deleted = sqlx::query("DELETE FROM pauses WHERE pipeline = $1 AND kind = $2 AND target = $3")
                .bind(pipeline)
                .bind(kind.name())
                .bind(target)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if kind == PauseKind::Delivery {
                sqlx::query(&relane(postgres, "- $3", "pipeline = $1 AND target = $2 AND lane >= $3"))
                .bind(pipeline)
                .bind(target)
                .bind(LANE_PARKED)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            Ok(deleted == 1)
        })
    }

    /// Keeps parking in step with the pauses, for what the pause and resume statements could
    /// not see: parks the pending writes of paused targets created after write `after_id`
    /// (intake does not know delivery pauses), and puts back parked writes whose target is
    /// no longer paused, by the pauses in force (`pauses`, as just read). Returns the highest
    /// write id, the next call's `after_id`. Each statement is an index range: new ids, and
    /// parked rows; without a delivery pause in force there is nothing to park.
    pub async fn maintain_pauses(&self, after_id: i64, pauses: &[Pause]) -> Result<i64> {
        let park = pauses.iter().any(|p| p.kind == PauseKind::Delivery);
        let postgres = matches!(self, Store::Postgres(_));
        let paused = "EXISTS (SELECT 1 FROM pauses p WHERE p.kind = 'delivery' \
            AND p.pipeline = outbox.pipeline AND p.target = outbox.target)";
        on_both!(self, pool => {
            if park {
                let condition = format!(
                    "id > $1 AND state = {} AND lane < $2 AND {paused}",
                    sql_literal!(ItemState::Pending)
                );
                sqlx::query(&relane(postgres, "+ $2", &condition))
                    .bind(after_id)
                    .bind(LANE_PARKED)
                    .execute(pool)
                    .await?;
            }
            sqlx::query(&relane(postgres, "- $1", &format!("lane >= $1 AND NOT {paused}")))
                .bind(LANE_PARKED)
                .execute(pool)
                .await?;
            let last: Option<i64> = sqlx::query_scalar("SELECT MAX(id) FROM outbox").fetch_one(pool).await?;
            Ok(last.unwrap_or(after_id))
        })
    }

    /// Every pause in force, by pipeline, kind and target.
    pub async fn pauses(&self) -> Result<Vec<Pause>> {
        // From the writer on SQLite: a pause just put in force is read back at once.
        let rows: Vec<(String, String, String, i64, Option<String>)> = on_both!(self, pool => {
            sqlx::query_as(
                "SELECT pipeline, kind, target, paused_at_ms, reason FROM pauses ORDER BY pipeline, kind, target",
            )
            .fetch_all(pool)
            .await?
        });
        Ok(rows
            .into_iter()
            .filter_map(|(pipeline, kind, target, paused_at_ms, reason)| {
                Some(Pause {
                    pipeline,
                    kind: PauseKind::parse(&kind)?,
                    target,
                    paused_at_ms,
                    reason,
                })
            })
            .collect())
    }

    /// Deliveries with an outcome (`rejected`, `conflict`, `duplicate`), newest first, after
    /// a cursor.
    pub async fn deliveries_page(
        &self,
        outcome: DeliveryOutcome,
        pipeline: Option<&str>,
        before_id: Option<i64>,
        limit: i64,
    ) -> Result<Vec<DeliveryRecord>> {
        read_on_both!(self, pool => {
            let rows = sqlx::query(&format!(
                "{} WHERE outcome = $4 AND ($1 IS NULL OR pipeline = $1) \
                 AND id < $2 ORDER BY id DESC LIMIT $3",
                crate::DELIVERY_COLUMNS
            ))
            .bind(pipeline)
            .bind(before_id.unwrap_or(i64::MAX))
            .bind(limit)
            .bind(outcome)
            .fetch_all(pool)
            .await?;
            rows.iter().map(crate::delivery_from_row).collect()
        })
    }

    /// Dead-lettered writes, newest first (by write id), after a cursor.
    pub async fn dead_letters(
        &self,
        pipeline: Option<&str>,
        target: Option<&str>,
        before_id: Option<i64>,
        limit: i64,
    ) -> Result<Vec<DeadLetter>> {
        read_on_both!(self, pool => {
            let rows = sqlx::query(DEAD_LETTERS)
            .bind(pipeline)
            .bind(target)
            .bind(before_id.unwrap_or(i64::MAX))
            .bind(limit)
            .fetch_all(pool)
            .await?;
            rows.iter()
                .map(|r| {
                    let version: Option<String> = r.try_get("version")?;
                    let version_text: Option<String> = r.try_get("version_text")?;
                    Ok(DeadLetter {
                        write_id: r.try_get("id")?,
                        event_id: r.try_get("event_id")?,
                        pipeline: r.try_get("pipeline")?,
                        target: r.try_get("target")?,
                        entity: r.try_get("entity")?,
                        version: version_text.or(version),
                        attempts: r.try_get("attempts")?,
                        in_doubt: r.try_get::<i64, _>("in_doubt")? != 0,
                        last_error: r.try_get("last_error")?,
                        finished_at_ms: r.try_get("finished_at_ms")?,
                        event_key: r.try_get("event_key")?,
                        scope: r.try_get("scope")?,
                        event_type: r.try_get("event_type")?,
                        received_at_ms: r.try_get("received_at_ms")?,
                    })
                })
                .collect()
        })
    }

    /// Events with dead writes matching `filter`, oldest first: the events a replay takes,
    /// in the order it takes them. Events whose payload `payload_retention` deleted are left
    /// out: there is nothing to write them from, and they would fill every page.
    pub async fn dead_events_matching(&self, filter: &ReplayFilter) -> Result<Vec<i64>> {
        let ids =
            filter.event_ids.as_ref().map(|ids| serde_json::Value::from(ids.clone()).to_string());
        let ids_source = if matches!(self, Store::Postgres(_)) {
            "SELECT value::bigint FROM jsonb_array_elements_text($5::jsonb) AS t(value)"
        } else {
            "SELECT value FROM json_each($5)"
        };
        let sql = format!(
            "SELECT DISTINCT o.event_id FROM outbox o JOIN events e ON e.id = o.event_id \
             WHERE o.state = {dead} AND ($1 IS NULL OR o.pipeline = $1) AND ($2 IS NULL OR o.target = $2) \
               AND e.received_at_ms >= $3 AND e.received_at_ms < $4 AND e.payload_purged_at_ms IS NULL \
               AND ($5 IS NULL OR o.event_id IN ({ids_source})) \
             ORDER BY o.event_id LIMIT $6",
            dead = sql_literal!(ItemState::Dead),
        );
        read_on_both!(self, pool => {
            Ok(sqlx::query_scalar(&sql)
                .bind(&filter.pipeline)
                .bind(&filter.target)
                .bind(filter.since_ms.unwrap_or(i64::MIN))
                .bind(filter.until_ms.unwrap_or(i64::MAX))
                .bind(&ids)
                .bind(filter.limit)
                .fetch_all(pool)
                .await?)
        })
    }

    /// Each target's unfinished and dead writes (targets with none are absent). Finished
    /// writes are not counted: they are most of the table (see [`TARGET_BACKLOG`]).
    pub async fn target_backlog(&self) -> Result<Vec<TargetBacklog>> {
        let rows: Vec<(String, String, String, i64)> = read_on_both!(self, pool => {
            sqlx::query_as(TARGET_BACKLOG)
            .fetch_all(pool)
            .await?
        });
        let mut backlog: Vec<TargetBacklog> = Vec::new();
        for (pipeline, target, state, count) in rows {
            let same = backlog.last().is_some_and(|b| b.pipeline == pipeline && b.target == target);
            if !same {
                backlog.push(TargetBacklog { pipeline, target, pending: 0, in_flight: 0, dead: 0 });
            }
            let Some(last) = backlog.last_mut() else { continue };
            match state.as_str() {
                // Items in flight are pending in `outbox`, and counted there too.
                text if text == WriteView::InFlight.as_str() => {
                    last.in_flight += count;
                    last.pending -= count;
                }
                text if text == ItemState::Pending.as_str() => last.pending += count,
                _ => last.dead += count,
            }
        }
        Ok(backlog)
    }
}

/// Each target's unfinished and dead writes, by state, and its writes in flight. The outbox
/// arms are each the predicate of one of PostgreSQL's partial indexes (unfinished, dead), so
/// that each is an index range: one `IN` of all three states is implied by neither, and was
/// planned as a scan of the table. Writes in flight are named by their entities' rows, which
/// carry no index on it (so that leases update them in place): that arm reads `entities`,
/// one short row per entity, and its count is taken from the pending one.
pub(crate) const TARGET_BACKLOG: &str = concat!(
    "SELECT pipeline, target, state, COUNT(*) FROM outbox WHERE state = ",
    sql_literal!(ItemState::Pending),
    " GROUP BY pipeline, target, state \
     UNION ALL SELECT pipeline, target, state, COUNT(*) FROM outbox WHERE state = ",
    sql_literal!(ItemState::Dead),
    " GROUP BY pipeline, target, state \
     UNION ALL SELECT pipeline, target, ",
    sql_literal!(WriteView::InFlight),
    ", COUNT(*) FROM entities WHERE in_flight_item IS NOT NULL GROUP BY pipeline, target \
     ORDER BY 1, 2"
);

/// A page of dead letters, newest first: `$1` pipeline and `$2` target (either may be NULL:
/// all), `$3` below this write id, `$4` at most.
pub(crate) const DEAD_LETTERS: &str = concat!(
    "SELECT o.id, o.event_id, o.pipeline, o.target, o.entity, \
       o.version, o.version_text, o.attempts, o.in_doubt, o.last_error, o.finished_at_ms, \
       e.event_key, e.scope, e.event_type, e.received_at_ms \
     FROM outbox o JOIN events e ON e.id = o.event_id \
     WHERE o.state = ",
    sql_literal!(ItemState::Dead),
    " AND ($1 IS NULL OR o.pipeline = $1) AND ($2 IS NULL OR o.target = $2) \
       AND o.id < $3 ORDER BY o.id DESC LIMIT $4"
);

/// A statement moving the lanes of the writes that match `condition` by `shift` (parking or
/// putting back). On PostgreSQL it skips rows another transaction holds (a lease, a finish),
/// so that it never waits on them, nor they on it, in an order that could deadlock; a row
/// skipped is moved by the next upkeep. SQLite has one writer: nothing to skip.
fn relane(postgres: bool, shift: &str, condition: &str) -> String {
    if postgres {
        format!(
            "UPDATE outbox SET lane = lane {shift} WHERE ctid = ANY(ARRAY(SELECT ctid FROM outbox \
             WHERE {condition} FOR UPDATE OF outbox SKIP LOCKED))"
        )
    } else {
        format!("UPDATE outbox SET lane = lane {shift} WHERE {condition}")
    }
}
