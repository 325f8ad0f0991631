//! Stored payloads apart from their evidence: `payload_retention` deletes bodies and headers
//! while events stay (so dedupe holds for the whole `retention`), and key rotation re-seals
//! rows one at a time.
//!
//! The store never encrypts nor decrypts: the engine seals, and the store keeps bytes and the
//! key id they are sealed under (`sealed_with`, NULL for plaintext).

use sqlx::Row;

use crate::{Result, Store};

/// The two tables that hold payloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadTable {
    /// An event's body and stored headers.
    Events,
    /// A delivery's headers excerpt, and the body of a conflict or a rejected delivery.
    Deliveries,
}

impl PayloadTable {
    pub fn name(self) -> &'static str {
        match self {
            PayloadTable::Events => "events",
            PayloadTable::Deliveries => "deliveries",
        }
    }
}

/// One attempt's answer excerpt as stored, with the pipeline it is sealed for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredAnswer {
    pub id: i64,
    pub pipeline: String,
    pub sealed_with: Option<String>,
    pub excerpt: String,
}

/// One row's payload as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredPayload {
    pub id: i64,
    pub pipeline: String,
    pub sealed_with: Option<String>,
    pub headers: String,
    pub body: Option<Vec<u8>>,
}

/// What one call of [`Store::purge_payloads`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Purged {
    /// Events whose payload was deleted.
    pub events: u64,
    /// Deliveries whose payload was deleted.
    pub deliveries: u64,
    /// Events looked at: those purged, and those whose work came back meanwhile.
    pub candidates: u64,
}

impl Purged {
    /// Whether a batch was full, so that there may be more.
    pub fn full(&self) -> bool {
        let batch = u64::try_from(PURGE_BATCH).unwrap_or(u64::MAX);
        self.candidates >= batch || self.deliveries >= batch
    }
}

/// An event with no write to do.
const NO_WORK_TO_DO: &str = concat!(
    "NOT EXISTS (SELECT 1 FROM outbox WHERE outbox.event_id = events.id AND outbox.state = ",
    sql_literal!(ItemState::Pending),
    ")"
);

/// Rows changed per statement by [`Store::purge_payloads`]: short transactions, so intake and
/// workers are not held up behind one large update.
pub const PURGE_BATCH: i64 = 500;

impl Store {
    /// Deletes the bodies and headers of up to [`PURGE_BATCH`] events of `pipeline` received
    /// before `cutoff_ms`, with their attempts' answers, and of up to as many deliveries. An
    /// event whose writes are not finished keeps its payload until they are (the worker renders
    /// from it). Call again while either count is [`PURGE_BATCH`].
    pub async fn purge_payloads(
        &self,
        pipeline: &str,
        cutoff_ms: i64,
        now_ms: i64,
    ) -> Result<Purged> {
        // PostgreSQL: lock the candidates, then look at their work again in a new statement
        // (a new snapshot), so that a replay that committed meanwhile is seen, and one that
        // starts later waits for this purge and then refuses. SQLite: one writer; a write on a
        // stale snapshot fails instead.
        let lock = if matches!(self, Store::Postgres(_)) { " FOR UPDATE" } else { "" };
        on_both!(self, pool => {
            let mut tx = pool.begin().await?;
            let candidates: Vec<i64> = sqlx::query_scalar(&format!(
                "SELECT id FROM events WHERE pipeline = $1 AND received_at_ms < $2 \
                 AND payload_purged_at_ms IS NULL AND {NO_WORK_TO_DO} ORDER BY received_at_ms LIMIT $3{lock}"
            ))
            .bind(pipeline)
            .bind(cutoff_ms)
            .bind(PURGE_BATCH)
            .fetch_all(&mut *tx)
            .await?;
            let mut purged = Purged::default();
            if !candidates.is_empty() {
                // Integers, so the list is safe to write into the statements.
                let list = candidates.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
                let ids: Vec<i64> = sqlx::query_scalar(&format!(
                    "SELECT id FROM events WHERE id IN ({list}) AND {NO_WORK_TO_DO}"
                ))
                .fetch_all(&mut *tx)
                .await?;
                if !ids.is_empty() {
                    let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
                    purged.events = sqlx::query(&format!(
                        "UPDATE events SET body = $1, headers = '[]', sealed_with = NULL, payload_purged_at_ms = $2 \
                         WHERE id IN ({list}) AND payload_purged_at_ms IS NULL"
                    ))
                    .bind(Vec::<u8>::new())
                    .bind(now_ms)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                    // The CRM's and the source's answers can echo the payload: they go with it.
                    sqlx::query(&format!(
                        "UPDATE attempts SET excerpt = NULL, sealed_with = NULL WHERE event_id IN ({list})"
                    ))
                    .execute(&mut *tx)
                    .await?;
                }
                purged.candidates = u64::try_from(candidates.len()).unwrap_or(u64::MAX);
            }
            // Deliveries are evidence only: nothing renders from them.
            purged.deliveries = sqlx::query(
                "UPDATE deliveries SET body = NULL, headers = '[]', sealed_with = NULL, payload_purged_at_ms = $3 \
                 WHERE id IN (SELECT id FROM deliveries WHERE pipeline = $1 AND received_at_ms < $2 \
                 AND payload_purged_at_ms IS NULL ORDER BY received_at_ms LIMIT $4)",
            )
            .bind(pipeline)
            .bind(cutoff_ms)
            .bind(now_ms)
            .bind(PURGE_BATCH)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            tx.commit().await?;
            Ok(purged)
        })
    }

    /// Up to `limit` rows of `table` with a payload not sealed under `current`, after row
    /// `after_id`, in id order: what key rotation has left to do.
    pub async fn payloads_not_under(
        &self,
        table: PayloadTable,
        current: &str,
        after_id: i64,
        limit: i64,
    ) -> Result<Vec<StoredPayload>> {
        read_on_both!(self, pool => {
            let rows = sqlx::query(&format!(
                "SELECT id, pipeline, sealed_with, headers, body FROM {} \
                 WHERE id > $1 AND COALESCE(sealed_with, '') <> $2 AND payload_purged_at_ms IS NULL \
                 ORDER BY id LIMIT $3",
                table.name()
            ))
            .bind(after_id)
            .bind(current)
            .bind(limit)
            .fetch_all(pool)
            .await?;
            rows.iter()
                .map(|row| {
                    Ok(StoredPayload {
                        id: row.try_get("id")?,
                        pipeline: row.try_get("pipeline")?,
                        sealed_with: row.try_get("sealed_with")?,
                        headers: row.try_get("headers")?,
                        body: row.try_get("body")?,
                    })
                })
                .collect()
        })
    }

    /// Up to `limit` attempts after `after_id` whose answer excerpt is not sealed under
    /// `current`, in id order.
    pub async fn answers_not_under(
        &self,
        current: &str,
        after_id: i64,
        limit: i64,
    ) -> Result<Vec<StoredAnswer>> {
        read_on_both!(self, pool => {
            let rows = sqlx::query(
                "SELECT a.id, o.pipeline, a.sealed_with, a.excerpt FROM attempts a JOIN outbox o ON o.id = a.outbox_id \
                 WHERE a.id > $1 AND a.excerpt IS NOT NULL AND COALESCE(a.sealed_with, '') <> $2 ORDER BY a.id LIMIT $3",
            )
            .bind(after_id)
            .bind(current)
            .bind(limit)
            .fetch_all(pool)
            .await?;
            rows.iter()
                .map(|row| {
                    Ok(StoredAnswer {
                        id: row.try_get("id")?,
                        pipeline: row.try_get("pipeline")?,
                        sealed_with: row.try_get("sealed_with")?,
                        excerpt: row.try_get("excerpt")?,
                    })
                })
                .collect()
        })
    }

    /// Replaces an attempt's answer excerpt by its re-sealed form, only if it is still sealed
    /// under `from` and not purged.
    pub async fn reseal_answer(
        &self,
        id: i64,
        from: Option<&str>,
        to: &str,
        excerpt: &str,
    ) -> Result<bool> {
        on_both!(self, pool => {
            let changed = sqlx::query(
                "UPDATE attempts SET excerpt = $1, sealed_with = $2 \
                 WHERE id = $3 AND excerpt IS NOT NULL AND COALESCE(sealed_with, '') = $4",
            )
            .bind(excerpt)
            .bind(to)
            .bind(id)
            .bind(from.unwrap_or_default())
            .execute(pool)
            .await?
            .rows_affected();
            Ok(changed == 1)
        })
    }

    /// Replaces a row's payload by its re-sealed form, only if it is still as it was read
    /// (sealed under `from`, not purged): a purge or another rotation in between wins.
    /// Returns whether the row was changed.
    pub async fn reseal_payload(
        &self,
        table: PayloadTable,
        id: i64,
        from: Option<&str>,
        to: &str,
        headers: &str,
        body: Option<&[u8]>,
    ) -> Result<bool> {
        on_both!(self, pool => {
            let changed = sqlx::query(&format!(
                "UPDATE {} SET headers = $1, body = $2, sealed_with = $3 \
                 WHERE id = $4 AND COALESCE(sealed_with, '') = $5 AND payload_purged_at_ms IS NULL",
                table.name()
            ))
            .bind(headers)
            .bind(body)
            .bind(to)
            .bind(id)
            .bind(from.unwrap_or_default())
            .execute(pool)
            .await?
            .rows_affected();
            Ok(changed == 1)
        })
    }
}
