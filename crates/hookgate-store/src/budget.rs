//! Shared call budgets: the slices of one connector instance's budget that the processes on
//! one PostgreSQL database hold.
//!
//! Every process leases a slice for a short while and renews it. A renewal, under the
//! connector's advisory lock, sees every slice: the budget is divided evenly among the live
//! processes, a process above its share shrinks to it at once, and one below grows only by
//! what is free. Calls given up are not free at once, since they may still be in the CRM's
//! window: a shrinking process says, from its own log of the window, when they leave it
//! (`budget_returns`), and an expired slice (its holder died or lost the database) counts for
//! one whole window past its end. So the slices in use, and the calls still counting from
//! slices given up, never sum to more than the budget, and times cross processes only as the
//! database's clock or as durations, never as one process's wall clock.
//!
//! On SQLite there is one process: the whole budget is its own, and nothing is stored.

use crate::{Result, Store};

/// One process's renewal of its slice of a connector's budget.
#[derive(Debug, Clone)]
pub struct SliceRequest<'a> {
    pub connector: &'a str,
    /// The process's lease token.
    pub owner: &'a str,
    /// The whole budget: calls per window.
    pub budget_calls: u32,
    /// The window a call counts in, in milliseconds (the CRM's, and the engine's margin).
    pub window_ms: i64,
    /// How long the slice lasts unless renewed.
    pub lease_ms: i64,
    /// How long from now each of this process's calls of the window stays in it, soonest
    /// first, a permit granted but not yet started counting as a whole window: what tells
    /// when the calls of a slice given up are free for others.
    pub in_window_ms: Vec<i64>,
}

impl SliceRequest<'_> {
    /// When, from now, at most `calls` of this process's calls are still in the window.
    fn free_in_ms(&self, calls: usize) -> i64 {
        let excess = self.in_window_ms.len().saturating_sub(calls);
        // The soonest `excess` leave first; the last of them decides.
        match excess {
            0 => 0,
            n => self.in_window_ms.get(n - 1).copied().unwrap_or(self.window_ms),
        }
    }
}

impl Store {
    /// Renews (or takes) `request.owner`'s slice of the connector's budget and returns how
    /// many calls of the window it may have now. On SQLite, the whole budget.
    pub async fn lease_budget_slice(&self, request: &SliceRequest<'_>) -> Result<u32> {
        let Store::Postgres(pool) = self else { return Ok(request.budget_calls) };
        let budget = i64::from(request.budget_calls);
        let mut tx = pool.begin().await?;
        // One renewal of a connector at a time, across processes: each reads every slice.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('hookgate-budget'), hashtext($1))")
            .bind(request.connector)
            .execute(&mut *tx)
            .await?;
        let now: i64 = sqlx::query_scalar(
            "SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
        )
        .fetch_one(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM budget_returns WHERE connector = $1 AND free_at_ms <= $2")
            .bind(request.connector)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM budget_slices WHERE connector = $1 AND expires_at_ms + $3 <= $2")
            .bind(request.connector)
            .bind(now)
            .bind(request.window_ms)
            .execute(&mut *tx)
            .await?;
        let slices: Vec<(String, i64, i64)> = sqlx::query_as(
            "SELECT owner, calls, expires_at_ms FROM budget_slices WHERE connector = $1",
        )
        .bind(request.connector)
        .fetch_all(&mut *tx)
        .await?;
        let returned: i64 = sqlx::query_scalar(
            "SELECT CAST(COALESCE(SUM(calls), 0) AS BIGINT) FROM budget_returns WHERE connector = $1",
        )
        .bind(request.connector)
        .fetch_one(&mut *tx)
        .await?;
        // Mine, only while its lease holds: an expired slice of mine counts as taken (below),
        // and my own log holds back the calls it still has in the window.
        let mine = slices
            .iter()
            .find(|(owner, _, expires)| owner == request.owner && *expires > now)
            .map_or(0, |(_, calls, _)| *calls);
        let others: Vec<&(String, i64, i64)> =
            slices.iter().filter(|(owner, _, _)| owner != request.owner).collect();
        let live_others = others.iter().filter(|(_, _, expires)| *expires > now).count();
        let taken_by_others: i64 = others.iter().map(|(_, calls, _)| *calls).sum();
        let share = budget / i64::try_from(live_others + 1).unwrap_or(i64::MAX);
        let free = (budget - taken_by_others - returned - mine).max(0);
        let granted = if mine > share {
            // Shrinks at once; what it gives up counts until its log says it left the window.
            let kept = usize::try_from(share).unwrap_or(0);
            sqlx::query(
                "INSERT INTO budget_returns (connector, calls, free_at_ms) VALUES ($1, $2, $3)",
            )
            .bind(request.connector)
            .bind(mine - share)
            .bind(now + request.free_in_ms(kept))
            .execute(&mut *tx)
            .await?;
            share
        } else {
            mine + (share - mine).min(free)
        };
        sqlx::query(
            "INSERT INTO budget_slices (connector, owner, calls, expires_at_ms) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (connector, owner) DO UPDATE SET calls = $3, expires_at_ms = $4",
        )
        .bind(request.connector)
        .bind(request.owner)
        .bind(granted)
        .bind(now + request.lease_ms)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(u32::try_from(granted).unwrap_or(0))
    }
}
