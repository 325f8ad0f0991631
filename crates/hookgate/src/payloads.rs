//! Stored payloads as operators see them (opened, then masked), the payload keys from the
//! instances file, and `hookgate keys rotate`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow};
use hookgate_engine::seal::{Keyring, Part, open_stored, open_stored_text};
use hookgate_pipeline::Instances;
use hookgate_pipeline::redact::{Redaction, ShownBody, mask_echoes};
use hookgate_store::{
    AttemptRecord, DeliveryRecord, EventRecord, PayloadTable, Store, StoredPayload,
};

use crate::check::{self, SecretPolicy};
use crate::secrets::Resolver;

/// The payload keys `instances` configures, resolved; `None` when it configures none.
pub fn keyring(instances: &Instances, resolver: &Resolver) -> Result<Option<Keyring>> {
    if instances.payload_keys.is_empty() {
        return Ok(None);
    }
    let mut secrets = Vec::new();
    for (id, reference, _) in &instances.payload_keys {
        let secret = resolver
            .resolve(reference)
            .with_context(|| format!("payload key `{id}` in {}", instances.file))?;
        secrets.push((id.as_str(), secret));
    }
    let keyring = Keyring::new(secrets.iter().map(|(id, s)| (*id, s.expose())))
        .with_context(|| format!("payload_encryption in {}", instances.file))?;
    Ok(Some(keyring))
}

/// What a pipeline says about its stored payloads.
#[derive(Debug, Clone)]
pub struct PayloadPolicy {
    pub retention: Duration,
    pub payload_retention: Option<Duration>,
    pub redaction: Redaction,
}

/// The views as configured now: a reload replaces them, so that a changed `redact` masks
/// what the admin API and the console show from then on.
#[derive(Debug, Clone, Default)]
pub struct SharedViews(Arc<std::sync::RwLock<Arc<Views>>>);

impl SharedViews {
    pub fn new(views: Views) -> SharedViews {
        SharedViews(Arc::new(std::sync::RwLock::new(Arc::new(views))))
    }

    pub fn current(&self) -> Arc<Views> {
        let held = self.0.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        Arc::clone(&held)
    }

    pub fn replace(&self, views: Views) {
        let mut held = self.0.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        *held = Arc::new(views);
    }
}

/// What operators' views need to show payloads: the keys to open them, and each configured
/// pipeline's redaction.
#[derive(Debug, Default)]
pub struct Views {
    keyring: Option<Keyring>,
    /// Why there are no keys, when the configuration could not be read: said if a sealed row
    /// is met.
    keys_problem: Option<String>,
    pipelines: HashMap<String, PayloadPolicy>,
}

impl Views {
    /// From the configuration `serve` uses. Problems are kept, not raised: most views need
    /// neither keys nor redaction.
    pub fn load(options: &check::Options) -> Views {
        let project =
            check::load(&check::Options { secrets: SecretPolicy::Allow, ..options.clone() });
        let pipelines = project
            .pipelines
            .iter()
            .map(|p| {
                let policy = PayloadPolicy {
                    retention: p.compiled.retention,
                    payload_retention: p.compiled.payload_retention,
                    redaction: p.compiled.redact.clone(),
                };
                (p.compiled.name.clone(), policy)
            })
            .collect();
        let (keyring, keys_problem) = match &project.instances {
            None => (None, Some(format!("{} cannot be loaded", options.instances.display()))),
            Some(instances) => match keyring(instances, &options.resolver) {
                Ok(keyring) => (keyring, None),
                Err(error) => (None, Some(format!("{error:#}"))),
            },
        };
        Views { keyring, keys_problem, pipelines }
    }

    pub fn keyring(&self) -> Option<&Keyring> {
        self.keyring.as_ref()
    }

    pub fn policy(&self, pipeline: &str) -> Option<&PayloadPolicy> {
        self.pipelines.get(pipeline)
    }

    fn problem(
        &self,
        row: &str,
        key_id: Option<&str>,
        error: impl std::fmt::Display,
    ) -> anyhow::Error {
        let mut message = format!("{row}: the payload {error}");
        if let (Some(_), Some(problem)) = (key_id, &self.keys_problem) {
            message.push_str(&format!(" ({problem})"));
        }
        anyhow!(message)
    }

    /// An event's body and header pairs, opened; headers as stored pairs.
    pub fn open_event(&self, event: &EventRecord) -> Result<(Vec<u8>, Vec<[String; 2]>)> {
        let row = format!("event {}", event.id);
        let key = event.sealed_with.as_deref();
        let body = open_stored(self.keyring(), key, Part::Body, &event.pipeline, &event.body)
            .map_err(|e| self.problem(&row, key, e))?;
        let headers = open_stored_text(
            self.keyring(),
            key,
            Part::Headers,
            &event.pipeline,
            &event.headers_json,
        )
        .map_err(|e| self.problem(&row, key, e))?;
        Ok((body.into_owned(), serde_json::from_str(&headers).unwrap_or_default()))
    }

    /// A delivery's kept body (a conflict's or a rejected one's), opened.
    pub fn open_delivery_body(&self, delivery: &DeliveryRecord) -> Result<Option<Vec<u8>>> {
        let Some(body) = &delivery.body else { return Ok(None) };
        let key = delivery.sealed_with.as_deref();
        let row = format!("delivery {}", delivery.id);
        let opened = open_stored(self.keyring(), key, Part::Body, &delivery.pipeline, body)
            .map_err(|e| self.problem(&row, key, e))?;
        Ok(Some(opened.into_owned()))
    }

    /// An attempt's answer excerpt (the CRM's or the source's), opened, as stored.
    fn open_answer(&self, pipeline: &str, attempt: &AttemptRecord) -> Result<Option<String>> {
        let Some(excerpt) = &attempt.excerpt else { return Ok(None) };
        let key = attempt.sealed_with.as_deref();
        let row = format!("attempt {}", attempt.id);
        let opened = open_stored_text(self.keyring(), key, Part::Answer, pipeline, excerpt)
            .map_err(|e| anyhow!("{row}: the answer {e}"))?;
        Ok(Some(opened.into_owned()))
    }

    /// The values an event's evidence must not show anywhere: those its pipeline's `redact`
    /// masks in its payload and in the objects its refreshes fetched. A CRM's answer echoes
    /// the fields written, an error may quote them; both are masked with these.
    pub fn echoes(&self, event: &EventRecord, attempts: &[AttemptRecord]) -> Vec<String> {
        let Some(policy) = self.pipelines.get(&event.pipeline) else { return Vec::new() };
        if policy.redaction.is_empty() {
            return Vec::new();
        }
        let body = self.open_event(event).map(|(body, _)| body).unwrap_or_default();
        let sources: Vec<String> = attempts
            .iter()
            .filter(|a| a.action.as_deref() == Some("refresh"))
            .filter_map(|a| self.open_answer(&event.pipeline, a).ok().flatten())
            .collect();
        let sources: Vec<&str> = sources.iter().map(String::as_str).collect();
        policy.redaction.masked_values(&body, &sources)
    }

    /// An attempt's answer as it may be shown: a fetched object masked per `redact.source`,
    /// and every answer with the event's `echoes` masked.
    pub fn shown_answer(
        &self,
        pipeline: &str,
        attempt: &AttemptRecord,
        echoes: &[String],
    ) -> Result<Option<String>> {
        let Some(opened) = self.open_answer(pipeline, attempt)? else { return Ok(None) };
        let refresh = attempt.action.as_deref() == Some("refresh");
        let shown = match self.pipelines.get(pipeline) {
            None if refresh => {
                format!("[the pipeline is not in the loaded configuration: nothing redacted] {opened}")
            }
            None => opened,
            Some(policy) if refresh => match policy.redaction.source_answer(&opened) {
                ShownBody::AsStored(_) => opened,
                ShownBody::Masked(masked) => String::from_utf8_lossy(&masked).into_owned(),
                ShownBody::Withheld => "[withheld: cut at the excerpt bound, and the pipeline redacts members of fetched objects]".to_owned(),
            },
            Some(_) => opened,
        };
        Ok(Some(mask_echoes(&shown, echoes).into_owned()))
    }

    /// A body as it may be shown for `pipeline`. A pipeline missing from the configuration
    /// has no known redaction, which the caller says.
    pub fn shown_body<'a>(&self, pipeline: &str, body: &'a [u8]) -> ShownBody<'a> {
        match self.pipelines.get(pipeline) {
            Some(policy) => policy.redaction.body(body),
            None => ShownBody::AsStored(body),
        }
    }

    /// Header pairs as they may be shown for `pipeline`.
    pub fn shown_headers(&self, pipeline: &str, pairs: &[[String; 2]]) -> Vec<[String; 2]> {
        match self.pipelines.get(pipeline) {
            Some(policy) => policy
                .redaction
                .header_pairs(pairs)
                .into_iter()
                .map(|[n, v]| [n.into_owned(), v.into_owned()])
                .collect(),
            None => pairs.to_vec(),
        }
    }

    /// Whether `pipeline`'s redaction is unknown (not in the loaded configuration).
    pub fn unknown(&self, pipeline: &str) -> bool {
        !self.pipelines.contains_key(pipeline)
    }
}

/// What one run of [`rotate`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rotation {
    /// Rows re-sealed under the current key, by table.
    pub resealed: Vec<(&'static str, u64)>,
    /// Rows that changed under us (purged, or re-sealed by another run): left as they are.
    pub skipped: u64,
    /// Rows that could not be opened (an unknown key, tampered with), each with why: left
    /// as they are, so that one bad row does not hold up the rest.
    pub failed: Vec<String>,
}

/// Re-seals every stored payload not under `keyring`'s current key (plaintext rows included),
/// `batch` rows at a time, each row in its own statement: stopping at any point loses
/// nothing, and running again goes on where it stopped. Runs beside `serve`.
pub async fn rotate(
    store: &Store,
    keyring: &Keyring,
    batch: i64,
    mut progress: impl FnMut(&str, u64),
) -> Result<Rotation> {
    let current = keyring.current();
    let mut rotation = Rotation::default();
    for table in [PayloadTable::Events, PayloadTable::Deliveries] {
        let mut done = 0u64;
        let mut after = 0;
        loop {
            let rows = store.payloads_not_under(table, current, after, batch).await?;
            let Some(last) = rows.last() else { break };
            after = last.id;
            for row in &rows {
                let (headers, body) = match reseal(keyring, table, row) {
                    Ok(resealed) => resealed,
                    Err(error) => {
                        rotation.failed.push(format!("{error:#}"));
                        continue;
                    }
                };
                let changed = store
                    .reseal_payload(
                        table,
                        row.id,
                        row.sealed_with.as_deref(),
                        current,
                        &headers,
                        body.as_deref(),
                    )
                    .await?;
                if changed {
                    done += 1;
                } else {
                    rotation.skipped += 1;
                }
            }
            progress(table.name(), done);
        }
        rotation.resealed.push((table.name(), done));
    }
    // The answers kept with attempts.
    let (mut done, mut after) = (0u64, 0);
    loop {
        let rows = store.answers_not_under(current, after, batch).await?;
        let Some(last) = rows.last() else { break };
        after = last.id;
        for row in &rows {
            let key = row.sealed_with.as_deref();
            let opened = match open_stored_text(
                Some(keyring),
                key,
                Part::Answer,
                &row.pipeline,
                &row.excerpt,
            ) {
                Ok(opened) => opened,
                Err(error) => {
                    rotation.failed.push(format!("attempts row {}: the answer {error}", row.id));
                    continue;
                }
            };
            let sealed = keyring.seal_text(Part::Answer, &row.pipeline, &opened);
            if store.reseal_answer(row.id, key, current, &sealed).await? {
                done += 1;
            } else {
                rotation.skipped += 1;
            }
        }
        progress("attempts", done);
    }
    rotation.resealed.push(("attempts", done));
    Ok(rotation)
}

fn reseal(
    keyring: &Keyring,
    table: PayloadTable,
    row: &StoredPayload,
) -> Result<(String, Option<Vec<u8>>)> {
    let key = row.sealed_with.as_deref();
    let name = format!("{} row {}", table.name(), row.id);
    let headers = open_stored_text(Some(keyring), key, Part::Headers, &row.pipeline, &row.headers)
        .map_err(|e| anyhow!("{name}: the headers {e}"))?;
    let headers = keyring.seal_text(Part::Headers, &row.pipeline, &headers);
    let body = match &row.body {
        None => None,
        Some(body) => {
            let opened = open_stored(Some(keyring), key, Part::Body, &row.pipeline, body)
                .map_err(|e| anyhow!("{name}: the body {e}"))?;
            Some(keyring.seal(Part::Body, &row.pipeline, &opened))
        }
    };
    Ok((headers, body))
}
