//! Signature refusals: deliveries answered 401 store nothing of themselves, so what operators
//! need to see why (a rotated secret, a proxy that rewrites the URL, a forger) is kept as
//! counts per pipeline, code and reason, written in batches by the engine.

use sqlx::Row;

use crate::{Result, Store};

/// Rows kept per pipeline at most: the most recently seen. A forger who varies the reason
/// (a header of random text) replaces rows, it does not grow the table.
pub const REFUSALS_PER_PIPELINE_MAX: i64 = 200;

/// A row not seen again for this long is deleted (a pipeline removed, a fixed secret).
pub const REFUSALS_KEPT_MS: i64 = 30 * 24 * 3600 * 1000;

/// Refusals of one (pipeline, code, reason) counted since the last write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusalCount {
    pub pipeline: String,
    /// The stable rejection code (`signature_mismatch`, `timestamp_too_old`, ...).
    pub code: String,
    /// Why, as the verifier says it: sender text escaped and bounded by the caller.
    pub reason: String,
    /// For senders that sign the URL: the one verified against (the last seen).
    pub url: Option<String>,
    pub first_at_ms: i64,
    pub last_at_ms: i64,
    pub refusals: i64,
}

impl Store {
    /// Adds each count to its row (creating it), then keeps the newest
    /// [`REFUSALS_PER_PIPELINE_MAX`] rows of each pipeline written to.
    pub async fn record_refusals(&self, counts: &[RefusalCount]) -> Result<()> {
        if counts.is_empty() {
            return Ok(());
        }
        // The smaller and larger of two values: scalar MIN and MAX in SQLite.
        let (least, greatest) =
            if matches!(self, Store::Postgres(_)) { ("LEAST", "GREATEST") } else { ("MIN", "MAX") };
        let upsert = format!(
            "INSERT INTO signature_refusals \
             (pipeline, code, reason, url, first_at_ms, last_at_ms, refusals) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (pipeline, code, reason) DO UPDATE SET \
             url = COALESCE(excluded.url, signature_refusals.url), \
             first_at_ms = {least}(signature_refusals.first_at_ms, excluded.first_at_ms), \
             last_at_ms = {greatest}(signature_refusals.last_at_ms, excluded.last_at_ms), \
             refusals = signature_refusals.refusals + excluded.refusals"
        );
        on_both!(self, pool => {
            let mut tx = pool.begin().await?;
            for count in counts {
                sqlx::query(&upsert)
                .bind(&count.pipeline)
                .bind(&count.code)
                .bind(&count.reason)
                .bind(&count.url)
                .bind(count.first_at_ms)
                .bind(count.last_at_ms)
                .bind(count.refusals)
                .execute(&mut *tx)
                .await?;
            }
            let newest = counts.iter().map(|c| c.last_at_ms).max().unwrap_or(0);
            sqlx::query("DELETE FROM signature_refusals WHERE last_at_ms < $1")
                .bind(newest.saturating_sub(REFUSALS_KEPT_MS))
                .execute(&mut *tx)
                .await?;
            let mut pipelines: Vec<&str> = counts.iter().map(|c| c.pipeline.as_str()).collect();
            pipelines.sort_unstable();
            pipelines.dedup();
            for pipeline in pipelines {
                sqlx::query(
                    "DELETE FROM signature_refusals WHERE pipeline = $1 AND (code, reason) NOT IN \
                     (SELECT code, reason FROM signature_refusals WHERE pipeline = $1 \
                      ORDER BY last_at_ms DESC LIMIT $2)",
                )
                .bind(pipeline)
                .bind(REFUSALS_PER_PIPELINE_MAX)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            Ok(())
        })
    }

    /// Refusals, most recently seen first; of one pipeline, or of all.
    pub async fn signature_refusals(
        &self,
        pipeline: Option<&str>,
        limit: i64,
    ) -> Result<Vec<RefusalCount>> {
        read_on_both!(self, pool => {
            let rows = sqlx::query(
                "SELECT pipeline, code, reason, url, first_at_ms, last_at_ms, refusals \
                 FROM signature_refusals WHERE ($1 IS NULL OR pipeline = $1) \
                 ORDER BY last_at_ms DESC, pipeline, code, reason LIMIT $2",
            )
            .bind(pipeline)
            .bind(limit)
            .fetch_all(pool)
            .await?;
            rows.iter()
                .map(|r| {
                    Ok(RefusalCount {
                        pipeline: r.try_get("pipeline")?,
                        code: r.try_get("code")?,
                        reason: r.try_get("reason")?,
                        url: r.try_get("url")?,
                        first_at_ms: r.try_get("first_at_ms")?,
                        last_at_ms: r.try_get("last_at_ms")?,
                        refusals: r.try_get("refusals")?,
                    })
                })
                .collect()
        })
    }
}
