//! Signature refusals, counted in memory at intake and written to the store in batches: a
//! delivery answered 401 stores nothing of itself, and a forged flood must cost an increment
//! per request, not a write. What operators read (`hookgate events rejected`, the API) is the
//! store's rows: per pipeline, code and reason, with a count and when each was first and last
//! seen.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use hookgate_store::{RefusalCount, Store, StoreError};

/// How often the counts are written.
pub const REFUSALS_FLUSH: Duration = Duration::from_secs(2);

/// Distinct (pipeline, code, reason) counted between two writes at most; more reasons (a
/// forger varying a header) are counted under one catch-all reason per pipeline and code.
const DISTINCT_MAX: usize = 1024;

/// A reason is cut to this many characters (its sender text is escaped by the verifier).
const REASON_CHARS_MAX: usize = 300;

/// The reason the counts of reasons beyond [`DISTINCT_MAX`] are kept under.
const MORE_REASONS: &str = "(more distinct reasons than are kept between writes)";

type Key = (String, String, String);

/// Counts since the last write.
#[derive(Debug, Default)]
pub(crate) struct RefusalLog {
    counts: Mutex<HashMap<Key, RefusalCount>>,
}

impl RefusalLog {
    /// Counts one refusal: `url` is the one verified against, for senders that sign it.
    pub(crate) fn note(
        &self,
        pipeline: &str,
        code: &str,
        reason: &str,
        url: Option<&str>,
        at_ms: i64,
    ) {
        let mut reason = hookgate_pipeline::evaluate::printable(reason, REASON_CHARS_MAX);
        let mut counts = self.lock();
        let mut key = (pipeline.to_owned(), code.to_owned(), reason.clone());
        if !counts.contains_key(&key) && counts.len() >= DISTINCT_MAX {
            reason = MORE_REASONS.to_owned();
            key.2 = reason.clone();
        }
        let entry = counts.entry(key).or_insert_with(|| RefusalCount {
            pipeline: pipeline.to_owned(),
            code: code.to_owned(),
            reason,
            url: None,
            first_at_ms: at_ms,
            last_at_ms: at_ms,
            refusals: 0,
        });
        entry.refusals += 1;
        entry.first_at_ms = entry.first_at_ms.min(at_ms);
        entry.last_at_ms = entry.last_at_ms.max(at_ms);
        if let Some(url) = url {
            entry.url =
                Some(hookgate_pipeline::evaluate::printable(&shown_url(url), REASON_CHARS_MAX));
        }
    }

    /// Writes the counts; a failed write keeps them for the next (bounded as above).
    pub(crate) async fn flush(&self, store: &Store) -> Result<(), StoreError> {
        let mut taken: Vec<RefusalCount> =
            std::mem::take(&mut *self.lock()).into_values().collect();
        // Rows in one order in every process, so that two flushing at once do not deadlock.
        taken.sort_by(|a, b| {
            (&a.pipeline, &a.code, &a.reason).cmp(&(&b.pipeline, &b.code, &b.reason))
        });
        if taken.is_empty() {
            return Ok(());
        }
        let written = store.record_refusals(&taken).await;
        if written.is_err() {
            let mut counts = self.lock();
            for count in taken {
                let key = (count.pipeline.clone(), count.code.clone(), count.reason.clone());
                let room = counts.len() < DISTINCT_MAX;
                match counts.get_mut(&key) {
                    Some(kept) => {
                        kept.refusals += count.refusals;
                        kept.first_at_ms = kept.first_at_ms.min(count.first_at_ms);
                        kept.last_at_ms = kept.last_at_ms.max(count.last_at_ms);
                    }
                    None if room => {
                        counts.insert(key, count);
                    }
                    // Kept under the catch-all reason, so that the count is never lost.
                    None => {
                        let more =
                            (count.pipeline.clone(), count.code.clone(), MORE_REASONS.to_owned());
                        let kept = counts.entry(more).or_insert_with(|| RefusalCount {
                            reason: MORE_REASONS.to_owned(),
                            refusals: 0,
                            url: None,
                            ..count.clone()
                        });
                        kept.refusals += count.refusals;
                        kept.first_at_ms = kept.first_at_ms.min(count.first_at_ms);
                        kept.last_at_ms = kept.last_at_ms.max(count.last_at_ms);
                    }
                }
            }
        }
        written
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, RefusalCount>> {
        // Counters: one poisoned by a panic elsewhere is still sound.
        self.counts.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The URL as operators may see it: scheme, host, port and path. A `user:password@` and the
/// query string go: the one is a credential, the other may carry a sender's personal data
/// (a Twilio GET's `From` and `Body`), and neither is sealed or expires with the payloads.
fn shown_url(url: &str) -> String {
    let without_query = url.split(['?', '#']).next().unwrap_or_default();
    match without_query.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
            let query = if without_query.len() < url.len() { "?…" } else { "" };
            format!("{scheme}://{host}{path}{query}")
        }
        None => without_query.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Credentials and query strings are not kept.
    #[test]
    fn a_url_is_kept_without_its_credentials_or_query() {
        assert_eq!(
            shown_url("https://user:pass@hooks.example:443/hooks/twilio?From=%2B1&Body=hi"),
            "https://hooks.example:443/hooks/twilio?…"
        );
        assert_eq!(
            shown_url("https://hooks.example/hooks/square"),
            "https://hooks.example/hooks/square"
        );
    }

    /// A flood of distinct reasons is counted in full, under a bounded number of reasons.
    #[test]
    fn a_flood_of_reasons_is_counted_in_bounded_memory() {
        let log = RefusalLog::default();
        for i in 0..DISTINCT_MAX + 500 {
            log.note(
                "github",
                "signature_mismatch",
                &format!("reason {i}"),
                None,
                1_000 + i as i64,
            );
        }
        log.note("github", "signature_mismatch", "reason 0", Some("https://h.example/x"), 5);
        let counts = log.lock();
        assert_eq!(counts.len(), DISTINCT_MAX + 1);
        let total: i64 = counts.values().map(|c| c.refusals).sum();
        assert_eq!(total, (DISTINCT_MAX + 501) as i64);
        let first = &counts[&("github".into(), "signature_mismatch".into(), "reason 0".into())];
        assert_eq!((first.refusals, first.first_at_ms), (2, 5));
        assert_eq!(first.url.as_deref(), Some("https://h.example/x"));
        let more = &counts[&("github".into(), "signature_mismatch".into(), MORE_REASONS.into())];
        assert_eq!(more.refusals, 500);
    }
}
