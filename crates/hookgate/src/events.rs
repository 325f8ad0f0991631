//! `hookgate events`: the evidence, for operators asking "what happened to event X?".

use std::fmt::Write as _;

use anyhow::{Result, bail};
use hookgate_engine::now_ms;
use hookgate_pipeline::evaluate::printable;
use hookgate_store::{EventFilter, EventRecord, Store};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Identifiers from senders (keys, scopes, entities) are shown up to this many characters.
const ID_CHARS_MAX: usize = 200;
/// Longer sender text (errors, the CRM's answers) up to this many.
const TEXT_CHARS_MAX: usize = 2048;

/// Sender text as shown: control characters escaped, so that a key cannot drive the terminal.
fn shown(text: &str) -> String {
    printable(text, ID_CHARS_MAX)
}

/// Unix milliseconds as RFC 3339, UTC.
pub fn timestamp(ms: i64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| ms.to_string())
}

/// One line per event, newest first.
pub async fn list(store: &Store, filter: &EventFilter) -> Result<String> {
    let events = store.list_events(filter).await?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>8}  {:<24}  {:<18}  {:<10}  {:>10}  KEY",
        "ID", "RECEIVED", "PIPELINE", "STATE", "DELIVERIES"
    );
    for event in &events {
        let _ = writeln!(
            out,
            "{:>8}  {:<24}  {:<18}  {:<10}  {:>10}  {}",
            event.id,
            timestamp(event.received_at_ms),
            event.pipeline,
            event.state,
            event.delivery_count,
            shown(&event.key)
        );
    }
    let _ = writeln!(out, "{} events", events.len());
    Ok(out)
}

/// The whole story of one event: receipt, identity, every delivery, every item and attempt.
pub async fn show(store: &Store, id: i64) -> Result<String> {
    let Some(event) = store.event(id).await? else { bail!("no event {id}") };
    story(store, &event).await
}

pub async fn story(store: &Store, event: &EventRecord) -> Result<String> {
    let mut out = String::new();
    let _ = writeln!(out, "event {}  pipeline {}  state {}", event.id, event.pipeline, event.state);
    let _ = writeln!(out, "  key          {}", shown(&event.key));
    let _ = writeln!(
        out,
        "  scope        {}",
        if event.scope.is_empty() { "(none)".to_owned() } else { shown(&event.scope) }
    );
    let _ = writeln!(
        out,
        "  type         {}",
        event.event_type.as_deref().map_or("(none)".to_owned(), shown)
    );
    let _ =
        writeln!(out, "  received     {} (signature verified)", timestamp(event.received_at_ms));
    let _ = writeln!(out, "  fingerprint  {}", event.fingerprint);
    let _ = writeln!(out, "  body         {} bytes", event.body.len());
    let _ = writeln!(
        out,
        "deliveries ({} received, {} conflicting)",
        event.delivery_count, event.conflict_count
    );
    for delivery in store.deliveries_for(event.id).await? {
        let kept = match &delivery.body {
            Some(body) => format!(
                "  (body kept: {} bytes, fingerprint {})",
                body.len(),
                delivery.fingerprint.as_deref().unwrap_or("-")
            ),
            None => String::new(),
        };
        let _ =
            writeln!(out, "  {}  {}{kept}", timestamp(delivery.received_at_ms), delivery.outcome);
    }
    let items = store.outbox_for(event.id).await?;
    let _ = writeln!(out, "writes ({})", items.len());
    for item in &items {
        let _ = writeln!(
            out,
            "  {}  entity {}  version {}  state {}  attempts {}{}{}",
            item.target,
            shown(&item.entity),
            item.version_text.as_deref().or(item.version.as_deref()).map_or("-".to_owned(), shown),
            item.state,
            item.attempts,
            item.record_id.as_deref().map(|r| format!("  record {}", shown(r))).unwrap_or_default(),
            item.last_error
                .as_deref()
                .map(|e| format!("\n    last error: {}", printable(e, TEXT_CHARS_MAX)))
                .unwrap_or_default(),
        );
    }
    let attempts = store.attempts_for(event.id).await?;
    let _ = writeln!(out, "attempts ({})", attempts.len());
    for attempt in attempts {
        let target = items
            .iter()
            .find(|i| i.id == attempt.outbox_id)
            .map(|i| i.target.as_str())
            .unwrap_or("?");
        let duration = match attempt.finished_at_ms {
            Some(end) => format!("{} ms", end - attempt.started_at_ms),
            None => "never finished".to_owned(),
        };
        let _ = writeln!(
            out,
            "  #{} {}  {}  {}  {}  {}  status {}  by {}",
            attempt.attempt,
            target,
            timestamp(attempt.started_at_ms),
            duration,
            attempt.action.as_deref().unwrap_or("-"),
            attempt.outcome.as_deref().unwrap_or("(in doubt)"),
            attempt.status.map(|s| s.to_string()).unwrap_or_else(|| "-".into()),
            attempt.worker,
        );
        if let Some(error) = &attempt.error {
            let _ = writeln!(out, "      error: {}", printable(error, TEXT_CHARS_MAX));
        }
        if let Some(excerpt) = &attempt.excerpt {
            let _ = writeln!(out, "      answer: {}", printable(excerpt, TEXT_CHARS_MAX));
        }
        if let Some(meta) = &attempt.meta {
            let _ = writeln!(out, "      meta: {}", printable(meta, TEXT_CHARS_MAX));
        }
    }
    Ok(out)
}

/// Replays one event's dead writes.
pub async fn replay(store: &Store, id: i64) -> Result<String> {
    if store.event(id).await?.is_none() {
        bail!("no event {id}");
    }
    let replayed = store.replay_event(id, now_ms()).await?;
    Ok(format!("event {id}: {replayed} dead writes queued again\n"))
}

/// Replays every dead-lettered event, optionally of one pipeline.
pub async fn replay_dead(store: &Store, pipeline: Option<&str>) -> Result<String> {
    let mut out = String::new();
    let mut total = 0;
    for id in store.dead_events(pipeline).await? {
        total += store.replay_event(id, now_ms()).await?;
        let _ = writeln!(out, "event {id}: queued again");
    }
    let _ = writeln!(out, "{total} dead writes queued again");
    Ok(out)
}
