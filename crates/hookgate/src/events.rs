//! `hookgate events`: the evidence, for operators asking "what happened to event X?".
//!
//! Every command has a human form and a `--json` form: one JSON object per line, whose fields
//! are documented in docs/guide/operating.md and only ever added to.

use std::fmt::Write as _;

use anyhow::{Result, bail};
use base64::Engine as _;
use hookgate_engine::now_ms;
use hookgate_engine::seal::SEAL_OVERHEAD_BYTES;
use hookgate_pipeline::evaluate::printable;
use hookgate_pipeline::redact::{ShownBody, mask_echoes};
use hookgate_store::{
    AttemptOutcome, DeliveryRecord, EventFilter, EventRecord, EventState, Replay, Store,
};
use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::output::{Bodies, Format};
use crate::payloads::Views;

/// Identifiers from senders (keys, scopes, entities) are shown up to this many characters.
const ID_CHARS_MAX: usize = 200;
/// Longer sender text (errors, the CRM's answers) up to this many.
const TEXT_CHARS_MAX: usize = 2048;
/// A stored body is shown up to this many bytes (`--body`).
pub const BODY_BYTES_SHOWN_MAX: usize = 64 * 1024;
/// A page of a list holds at most this many rows.
pub const PAGE_MAX: i64 = 1000;

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

/// The event state an operator named, or an error naming the valid ones.
pub fn event_state(text: &str) -> Result<EventState> {
    EventState::parse(text)
        .ok_or_else(|| anyhow::anyhow!("unknown state `{text}`: one of {}", EventState::names()))
}

/// Checks a list's filters: a pipeline neither configured (`configured`,
/// from the pipeline files) nor ever seen by the store, is an error that names the valid ones,
/// not an empty list.
pub async fn check_filters(
    store: &Store,
    configured: &[String],
    pipeline: Option<&str>,
    limit: i64,
) -> Result<()> {
    if !(1..=PAGE_MAX).contains(&limit) {
        bail!("--limit {limit}: a page holds 1 to {PAGE_MAX} rows; use --after for the next");
    }
    if let Some(pipeline) = pipeline
        && !configured.iter().any(|p| p == pipeline)
        && !store.has_pipeline(pipeline).await?
    {
        let mut known = store.pipelines().await?;
        known.extend(configured.iter().cloned());
        known.sort();
        known.dedup();
        if known.is_empty() {
            bail!("unknown pipeline `{pipeline}`: none is configured, and the store has no events");
        }
        bail!("unknown pipeline `{pipeline}`: one of {}", known.join(", "));
    }
    Ok(())
}

/// One JSON object as a line. serde_json leaves C1 controls and bidirectional overrides raw
/// inside strings (JSON allows them); they are written as `\uXXXX` here, so that output read
/// on a terminal without a JSON tool cannot drive it.
pub fn json_line(value: &Value) -> String {
    let text = value.to_string();
    let mut out = String::with_capacity(text.len() + 1);
    for c in text.chars() {
        if matches!(c, '\u{80}'..='\u{9f}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out.push('\n');
    out
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

pub fn event_json(event: &EventRecord) -> Value {
    json!({
        "id": event.id,
        "pipeline": event.pipeline,
        "scope": event.scope,
        "key": event.key,
        "type": event.event_type,
        "received_at": timestamp(event.received_at_ms),
        "state": event.state,
        "deliveries": event.delivery_count,
        "conflicts": event.conflict_count,
        "fingerprint": event.fingerprint,
        "sealed_with": event.sealed_with,
        "payload_deleted_at": event.payload_purged_at_ms.map(timestamp),
    })
}

/// A stored body as it may be shown: masked per its pipeline's `redact`, or withheld; and
/// what was done to it, if anything.
fn masked<'a>(
    views: &Views,
    pipeline: &str,
    body: &'a [u8],
) -> (std::borrow::Cow<'a, [u8]>, Option<&'static str>) {
    use std::borrow::Cow;
    match views.shown_body(pipeline, body) {
        ShownBody::AsStored(body) if views.unknown(pipeline) && !body.is_empty() => (
            Cow::Borrowed(body),
            Some("the pipeline is not in the loaded configuration: nothing redacted"),
        ),
        ShownBody::AsStored(body) => (Cow::Borrowed(body), None),
        ShownBody::Masked(body) => (Cow::Owned(body), Some("redacted")),
        ShownBody::Withheld => (
            Cow::Borrowed(&[][..]),
            Some("withheld: not JSON, and the pipeline redacts members of its bodies"),
        ),
    }
}

/// [`body_json`] of a body as it may be shown.
pub fn shown_body_json(views: &Views, pipeline: &str, body: &[u8]) -> Value {
    let (shown, note) = masked(views, pipeline, body);
    let mut value = body_json(&shown);
    if let (Value::Object(map), Some(note)) = (&mut value, note) {
        map.insert("redaction".into(), note.into());
    }
    value
}

/// [`body_text`] of a body as it may be shown.
fn shown_body_text(views: &Views, pipeline: &str, title: &str, body: &[u8]) -> String {
    let (shown, note) = masked(views, pipeline, body);
    let title = match note {
        Some(note) => format!("{title} [{note}]"),
        None => title.to_owned(),
    };
    body_text(&title, &shown)
}

/// The part of a body that is shown: at most [`BODY_BYTES_SHOWN_MAX`] bytes, not cutting a
/// UTF-8 character in two.
fn shown_part(body: &[u8]) -> &[u8] {
    let part = &body[..body.len().min(BODY_BYTES_SHOWN_MAX)];
    match std::str::from_utf8(part) {
        // Only the last character is incomplete: the cut fell inside it.
        Err(error) if error.error_len().is_none() && part.len() < body.len() => {
            &part[..error.valid_up_to()]
        }
        _ => part,
    }
}

/// A body as JSON: its text when it is UTF-8, else base64; cut at [`BODY_BYTES_SHOWN_MAX`].
fn body_json(body: &[u8]) -> Value {
    let shown = shown_part(body);
    let (text, encoding) = match std::str::from_utf8(shown) {
        Ok(text) => (text.to_owned(), "utf-8"),
        Err(_) => (base64::engine::general_purpose::STANDARD.encode(shown), "base64"),
    };
    json!({ "bytes": body.len(), "truncated": body.len() > shown.len(), "encoding": encoding, "text": text })
}

/// A body for a terminal: escaped, cut at [`BODY_BYTES_SHOWN_MAX`].
fn body_text(title: &str, body: &[u8]) -> String {
    let shown = shown_part(body);
    let text = printable(&String::from_utf8_lossy(shown), BODY_BYTES_SHOWN_MAX);
    let cut = if body.len() > shown.len() {
        format!("\n  (cut: {} of {} bytes shown)", shown.len(), body.len())
    } else {
        String::new()
    };
    format!("{title} ({} bytes)\n  {text}{cut}\n", body.len())
}

/// The "more" line of a page: in the human form a hint with the next command's cursor, in
/// JSON an object `{"more": {"after": ID}}`.
fn more(out: &mut String, format: Format, page_full: bool, last_id: Option<i64>) {
    let (true, Some(last)) = (page_full, last_id) else { return };
    if format == Format::Json {
        out.push_str(&json_line(&json!({ "more": { "after": last } })));
    } else {
        let _ = writeln!(out, "more: add `--after {last}` for the next page");
    }
}

/// A page of `limit` rows from one more, and whether there was more.
fn page<T>(mut rows: Vec<T>, limit: i64) -> (Vec<T>, bool) {
    let limit = usize::try_from(limit).unwrap_or(0);
    let more = rows.len() > limit;
    rows.truncate(limit);
    (rows, more)
}

/// Events, newest first, one page.
pub async fn list(store: &Store, filter: &EventFilter, format: Format) -> Result<String> {
    // One more than the page, to know whether there is more.
    let events =
        store.list_events(&EventFilter { limit: filter.limit + 1, ..filter.clone() }).await?;
    let (events, page_full) = page(events, filter.limit);
    let mut out = String::new();
    if format == Format::Json {
        for event in &events {
            out.push_str(&json_line(&event_json(event)));
        }
    } else {
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
        let _ = writeln!(out, "{}", plural(events.len(), "event", "events"));
    }
    more(&mut out, format, page_full, events.last().map(|e| e.id));
    Ok(out)
}

/// Refused deliveries (signed correctly, then rejected), newest first, one page.
pub async fn rejected(
    store: &Store,
    views: &Views,
    pipeline: Option<&str>,
    before_id: Option<i64>,
    limit: i64,
    bodies: Bodies,
    format: Format,
) -> Result<String> {
    let rows = store.rejected_deliveries(pipeline, before_id, limit + 1).await?;
    let (rows, page_full) = page(rows, limit);
    let mut out = String::new();
    if format == Format::Json {
        for row in &rows {
            let mut line = rejected_json(row);
            // One row that cannot be opened does not hide the others: it says why instead.
            if bodies == Bodies::Shown
                && let Value::Object(map) = &mut line
            {
                match views.open_delivery_body(row) {
                    Ok(Some(opened)) => {
                        map.insert("body".into(), shown_body_json(views, &row.pipeline, &opened));
                    }
                    Ok(None) => {}
                    Err(error) => {
                        map.insert("body_error".into(), format!("{error:#}").into());
                    }
                }
            }
            out.push_str(&json_line(&line));
        }
    } else {
        let _ = writeln!(out, "{:>8}  {:<24}  {:<18}  REASON", "ID", "RECEIVED", "PIPELINE");
        for row in &rows {
            let _ = writeln!(
                out,
                "{:>8}  {:<24}  {:<18}  {}",
                row.id,
                timestamp(row.received_at_ms),
                row.pipeline,
                printable(row.reason.as_deref().unwrap_or("-"), TEXT_CHARS_MAX)
            );
            if bodies == Bodies::Shown {
                match views.open_delivery_body(row) {
                    Ok(Some(opened)) => {
                        out.push_str(&shown_body_text(views, &row.pipeline, "  body", &opened));
                    }
                    Ok(None) => {}
                    Err(error) => {
                        let _ = writeln!(
                            out,
                            "  body not shown: {}",
                            printable(&format!("{error:#}"), TEXT_CHARS_MAX)
                        );
                    }
                }
            }
        }
        let _ = writeln!(out, "{}", plural(rows.len(), "rejected delivery", "rejected deliveries"));
        // Those refused for their signature are kept apart: say where.
        let refused = store.signature_refusals(pipeline, 1).await?;
        if !refused.is_empty() {
            let _ = writeln!(
                out,
                "deliveries were also refused for their signature (401): `hookgate events refused`"
            );
        }
    }
    more(&mut out, format, page_full, rows.last().map(|r| r.id));
    Ok(out)
}

/// Signature refusals (401), counted per pipeline, code and reason, newest first.
pub async fn refused(
    store: &Store,
    pipeline: Option<&str>,
    limit: i64,
    format: Format,
) -> Result<String> {
    let rows = store.signature_refusals(pipeline, limit).await?;
    let mut out = String::new();
    if format == Format::Json {
        for row in &rows {
            out.push_str(&json_line(&refusal_json(row)));
        }
        return Ok(out);
    }
    let _ = writeln!(
        out,
        "{:<24}  {:<24}  {:<18}  {:>8}  {:<20}  REASON",
        "LAST SEEN", "FIRST SEEN", "PIPELINE", "COUNT", "CODE"
    );
    for row in &rows {
        let _ = writeln!(
            out,
            "{:<24}  {:<24}  {:<18}  {:>8}  {:<20}  {}",
            timestamp(row.last_at_ms),
            timestamp(row.first_at_ms),
            row.pipeline,
            row.refusals,
            row.code,
            printable(&row.reason, TEXT_CHARS_MAX)
        );
        if let Some(url) = &row.url {
            let _ = writeln!(out, "  verified against {}", printable(url, TEXT_CHARS_MAX));
        }
    }
    let total: i64 = rows.iter().map(|r| r.refusals).sum();
    let _ = writeln!(
        out,
        "{} refused for their signature, under {} (nothing of them is stored)",
        plural(usize::try_from(total).unwrap_or(usize::MAX), "delivery", "deliveries"),
        plural(rows.len(), "reason", "reasons")
    );
    Ok(out)
}

pub fn refusal_json(row: &hookgate_store::RefusalCount) -> Value {
    json!({
        "pipeline": row.pipeline,
        "code": row.code,
        "reason": row.reason,
        "url": row.url,
        "first_seen_at": timestamp(row.first_at_ms),
        "last_seen_at": timestamp(row.last_at_ms),
        "refusals": row.refusals,
    })
}

pub fn rejected_json(row: &DeliveryRecord) -> Value {
    json!({
        "id": row.id,
        "pipeline": row.pipeline,
        "received_at": timestamp(row.received_at_ms),
        "reason": row.reason,
        "body_bytes": row.body.as_ref().map(Vec::len),
    })
}

/// The whole story of one event: receipt, identity, every delivery, every item and attempt;
/// with `body`, the stored body too.
pub async fn show(
    store: &Store,
    views: &Views,
    id: i64,
    bodies: Bodies,
    format: Format,
) -> Result<String> {
    let Some(event) = store.event(id).await? else { bail!("no event {id}") };
    if format == Format::Json {
        return story_json(store, views, &event, bodies).await;
    }
    let mut out = story(store, views, &event).await?;
    if bodies == Bodies::Shown {
        if let Some(purged) = event.payload_purged_at_ms {
            let _ = writeln!(out, "body (deleted at {} by payload_retention)", timestamp(purged));
        } else {
            let (opened, headers) = views.open_event(&event)?;
            let _ = writeln!(out, "headers ({})", headers.len());
            for [name, value] in views.shown_headers(&event.pipeline, &headers) {
                let _ = writeln!(out, "  {}: {}", shown(&name), printable(&value, TEXT_CHARS_MAX));
            }
            out.push_str(&shown_body_text(views, &event.pipeline, "body", &opened));
        }
        // Conflicting deliveries keep their own body beside the original's.
        for delivery in store.deliveries_for(event.id).await? {
            if let Some(kept) = views.open_delivery_body(&delivery)? {
                let title = format!("body of delivery {} ({})", delivery.id, delivery.outcome);
                out.push_str(&shown_body_text(views, &event.pipeline, &title, &kept));
            }
        }
    }
    Ok(out)
}

async fn story_json(
    store: &Store,
    views: &Views,
    event: &EventRecord,
    bodies: Bodies,
) -> Result<String> {
    Ok(json_line(&story_value(store, views, event, bodies).await?))
}

/// The story of `events show --json`, as a value (the admin API answers it too).
pub async fn story_value(
    store: &Store,
    views: &Views,
    event: &EventRecord,
    bodies: Bodies,
) -> Result<Value> {
    let mut object = event_json(event);
    let attempt_rows = store.attempts_for(event.id).await?;
    let echoes = views.echoes(event, &attempt_rows);
    let deliveries: Vec<Value> = store
        .deliveries_for(event.id)
        .await?
        .iter()
        .map(|d| {
            let mut line = json!({
                "id": d.id,
                "received_at": timestamp(d.received_at_ms),
                "outcome": d.outcome,
                "fingerprint": d.fingerprint,
                "body_bytes": d.body.as_ref().map(Vec::len),
            });
            if bodies == Bodies::Shown
                && let (Value::Object(map), Some(kept)) = (&mut line, views.open_delivery_body(d)?)
            {
                map.insert("body".into(), shown_body_json(views, &event.pipeline, &kept));
            }
            Ok(line)
        })
        .collect::<Result<_>>()?;
    let items = store.outbox_for(event.id).await?;
    let writes: Vec<Value> = items
        .iter()
        .map(|i| {
            json!({
                "id": i.id,
                "target": i.target,
                "entity": i.entity,
                "version": i.version_text.as_deref().or(i.version.as_deref()),
                "state": i.state,
                "attempts": i.attempts,
                "in_doubt": i.in_doubt,
                "record_id": i.record_id,
                "last_error": i.last_error.as_deref().map(|e| mask_echoes(e, &echoes)),
            })
        })
        .collect();
    let attempts: Vec<Value> = attempt_rows
        .iter()
        .map(|a| {
            // A story is still told without the keys: the answer says why it is not shown.
            let (answer, answer_error) = match views.shown_answer(&event.pipeline, a, &echoes) {
                Ok(answer) => (answer, None),
                Err(error) => (None, Some(format!("{error:#}"))),
            };
            Ok(json!({
                "write": a.outbox_id,
                "target": items.iter().find(|i| i.id == a.outbox_id).map(|i| i.target.as_str()),
                "attempt": a.attempt,
                "started_at": timestamp(a.started_at_ms),
                "duration_ms": a.finished_at_ms.map(|end| end - a.started_at_ms),
                "action": a.action,
                "outcome": a.outcome,
                "status": a.status,
                "error": a.error.as_deref().map(|e| mask_echoes(e, &echoes)),
                "answer": answer,
                "answer_error": answer_error,
                "meta": a.meta,
                "worker": a.worker,
            }))
        })
        .collect::<Result<_>>()?;
    if let Value::Object(map) = &mut object {
        map.insert("delivery_list".into(), deliveries.into());
        map.insert("writes".into(), writes.into());
        map.insert("attempts".into(), attempts.into());
        map.insert("payload".into(), payload_json(views, event));
        if bodies == Bodies::Shown && event.payload_purged_at_ms.is_none() {
            let (opened, headers) = views.open_event(event)?;
            let headers: Vec<Value> = views
                .shown_headers(&event.pipeline, &headers)
                .into_iter()
                .map(|[n, v]| json!([n, v]))
                .collect();
            map.insert("headers".into(), headers.into());
            map.insert("body".into(), shown_body_json(views, &event.pipeline, &opened));
        }
    }
    Ok(object)
}

/// A duration as pipelines write it: `30d`, `12h`, `90m`, `45s`.
fn duration_text(duration: std::time::Duration) -> String {
    let secs = duration.as_secs();
    match secs {
        0 => "0s".to_owned(),
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// How long an event's payload is kept, and whether it is still there.
fn payload_json(views: &Views, event: &EventRecord) -> Value {
    let policy = views.policy(&event.pipeline);
    json!({
        "sealed_with": event.sealed_with,
        "deleted_at": event.payload_purged_at_ms.map(timestamp),
        "retention_secs": policy.map(|p| p.retention.as_secs()),
        "payload_retention_secs": policy.and_then(|p| p.payload_retention).map(|d| d.as_secs()),
    })
}

/// The payload line of a story: kept or deleted, sealed or not, and which retention applies.
fn payload_text(views: &Views, event: &EventRecord) -> String {
    let days = duration_text;
    if let Some(purged) = event.payload_purged_at_ms {
        return format!(
            "deleted at {} by payload_retention; key, fingerprint and evidence kept until retention",
            timestamp(purged)
        );
    }
    let stored = usize::try_from(event.body_bytes).unwrap_or(0);
    let sealed = match &event.sealed_with {
        Some(key) => format!(
            "{} bytes sealed under key `{}` ({stored} stored)",
            stored.saturating_sub(SEAL_OVERHEAD_BYTES),
            shown(key)
        ),
        None => format!("{stored} bytes, plaintext"),
    };
    let rule = match views.policy(&event.pipeline) {
        Some(policy) => match policy.payload_retention {
            Some(payload) => format!(
                "payload_retention {} (once its writes finish), then the event at retention {}",
                days(payload),
                days(policy.retention)
            ),
            None => format!("kept with the event: retention {}", days(policy.retention)),
        },
        None => "retention unknown: the pipeline is not in the loaded configuration".to_owned(),
    };
    format!("{sealed}; {rule}")
}

pub async fn story(store: &Store, views: &Views, event: &EventRecord) -> Result<String> {
    let mut out = String::new();
    let attempts = store.attempts_for(event.id).await?;
    // What `redact` masks is masked wherever the evidence echoes it.
    let echoes = views.echoes(event, &attempts);
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
    let _ = writeln!(out, "  payload      {}", payload_text(views, event));
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
                .map(|e| format!(
                    "\n    last error: {}",
                    printable(&mask_echoes(e, &echoes), TEXT_CHARS_MAX)
                ))
                .unwrap_or_default(),
        );
    }
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
            attempt.outcome.map_or("(in doubt)", AttemptOutcome::as_str),
            attempt.status.map(|s| s.to_string()).unwrap_or_else(|| "-".into()),
            attempt.worker,
        );
        if let Some(error) = &attempt.error {
            let error = mask_echoes(error, &echoes);
            let _ = writeln!(out, "      error: {}", printable(&error, TEXT_CHARS_MAX));
        }
        match views.shown_answer(&event.pipeline, &attempt, &echoes) {
            Ok(Some(excerpt)) => {
                let _ = writeln!(out, "      answer: {}", printable(&excerpt, TEXT_CHARS_MAX));
            }
            Ok(None) => {}
            Err(error) => {
                let _ = writeln!(
                    out,
                    "      answer: not shown: {}",
                    printable(&format!("{error:#}"), TEXT_CHARS_MAX)
                );
            }
        }
        if let Some(meta) = &attempt.meta {
            let _ = writeln!(out, "      meta: {}", printable(meta, TEXT_CHARS_MAX));
        }
    }
    Ok(out)
}

/// Replays one event's dead writes.
pub async fn replay(store: &Store, id: i64, format: Format) -> Result<String> {
    if store.event(id).await?.is_none() {
        bail!("no event {id}");
    }
    let replayed = match store.replay_event(id, now_ms()).await? {
        Replay::Queued(replayed) => replayed,
        Replay::PayloadGone { purged_at_ms } => bail!(
            "event {id} cannot be replayed: its payload was deleted at {} by payload_retention, so \
             there is nothing to write from (its key, fingerprint and evidence are kept)",
            timestamp(purged_at_ms)
        ),
    };
    Ok(if format == Format::Json {
        json_line(&json!({ "event": id, "queued": replayed }))
    } else {
        format!("event {id}: {replayed} dead writes queued again\n")
    })
}

/// Replays every dead-lettered event, optionally of one pipeline.
pub async fn replay_dead(store: &Store, pipeline: Option<&str>, format: Format) -> Result<String> {
    let mut out = String::new();
    let mut total = 0;
    for id in store.dead_events(pipeline).await? {
        match store.replay_event(id, now_ms()).await? {
            Replay::Queued(queued) => {
                total += queued;
                if format == Format::Json {
                    out.push_str(&json_line(&json!({ "event": id, "queued": queued })));
                } else {
                    let _ = writeln!(out, "event {id}: queued again");
                }
            }
            Replay::PayloadGone { purged_at_ms } => {
                let deleted = timestamp(purged_at_ms);
                if format == Format::Json {
                    out.push_str(&json_line(&json!({ "event": id, "queued": 0, "refused": "payload deleted", "payload_deleted_at": deleted })));
                } else {
                    let _ = writeln!(
                        out,
                        "event {id}: not replayed: its payload was deleted at {deleted} by payload_retention"
                    );
                }
            }
        }
    }
    if format == Format::Text {
        let _ = writeln!(out, "{total} dead writes queued again");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_body_keeps_its_last_whole_character_and_stays_text() {
        let mut body = vec![b'a'; BODY_BYTES_SHOWN_MAX - 1];
        body.extend("é and more".as_bytes());
        let json = body_json(&body);
        assert_eq!(json["encoding"], "utf-8");
        assert_eq!(json["truncated"], true);
        assert_eq!(json["text"].as_str().unwrap().len(), BODY_BYTES_SHOWN_MAX - 1);
        // Bytes that are not UTF-8 are base64, within the same bound.
        let binary = vec![0xff; BODY_BYTES_SHOWN_MAX * 2];
        let json = body_json(&binary);
        assert_eq!(json["encoding"], "base64");
        assert_eq!(json["text"].as_str().unwrap().len(), BODY_BYTES_SHOWN_MAX / 3 * 4 + 4);
    }

    #[test]
    fn json_lines_escape_what_could_drive_a_terminal() {
        let line = json_line(&json!({ "key": "a\u{9b}b\u{202e}c\u{7}" }));
        assert_eq!(line, "{\"key\":\"a\\u009bb\\u202ec\\u0007\"}\n");
        let back: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(back["key"], "a\u{9b}b\u{202e}c\u{7}");
    }
}
