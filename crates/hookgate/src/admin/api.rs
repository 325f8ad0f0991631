//! The JSON routes under `/api/v1`. Each route is one row of [`ROUTES`], which the OpenAPI
//! document is generated from; its query and answer types derive their schemas, and a test
//! validates real answers against the committed document.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hookgate_engine::now_ms;
use hookgate_store::{
    DeadLetter, DeliveryOutcome, EventFilter, EventState, Pause, PauseKind, Replay, ReplayFilter,
    StoreError,
};
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Admin;
use crate::events::{self, PAGE_MAX, timestamp};
use crate::output::Bodies;

/// A page holds this many rows unless `limit` says otherwise.
pub const PAGE_DEFAULT: i64 = 50;
/// A replay takes at most this many events per request (`limit`); `more` says if others match.
/// Each event is a short transaction of its own, so a request stays within seconds.
pub const REPLAY_MAX: i64 = 1_000;
/// A replay takes this many events unless `limit` says otherwise.
pub const REPLAY_DEFAULT: i64 = 500;
/// At most this many event ids in one replay request.
pub const REPLAY_IDS_MAX: usize = 1_000;
/// A pause's reason is cut to this many characters.
pub const REASON_CHARS_MAX: usize = 500;

/// An error answer: a stable code and a message that says where and why.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApiError {
    /// `bad_request`, `too_large`, `not_found`, `unavailable` (the database; retry) or
    /// `internal`.
    pub error: String,
    pub message: String,
}

pub struct Failure(StatusCode, ApiError);

impl Failure {
    pub fn parts(self) -> (StatusCode, String) {
        (self.0, self.1.message)
    }

    pub fn bad(message: impl Into<String>) -> Failure {
        Failure(
            StatusCode::BAD_REQUEST,
            ApiError { error: "bad_request".into(), message: message.into() },
        )
    }

    pub fn not_found(message: impl Into<String>) -> Failure {
        Failure(
            StatusCode::NOT_FOUND,
            ApiError { error: "not_found".into(), message: message.into() },
        )
    }
}

impl From<StoreError> for Failure {
    fn from(error: StoreError) -> Failure {
        if error.is_unavailable() {
            Failure(
                StatusCode::SERVICE_UNAVAILABLE,
                ApiError {
                    error: "unavailable".into(),
                    message: "the database is unavailable".into(),
                },
            )
        } else {
            tracing::error!(%error, "admin API: store error");
            Failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                ApiError {
                    error: "internal".into(),
                    message: "internal error; the log says more".into(),
                },
            )
        }
    }
}

impl From<anyhow::Error> for Failure {
    fn from(error: anyhow::Error) -> Failure {
        if let Some(store) = error.downcast_ref::<StoreError>()
            && store.is_unavailable()
        {
            return Failure(
                StatusCode::SERVICE_UNAVAILABLE,
                ApiError {
                    error: "unavailable".into(),
                    message: "the database is unavailable".into(),
                },
            );
        }
        tracing::error!(error = %format!("{error:#}"), "admin API error");
        Failure(
            StatusCode::INTERNAL_SERVER_ERROR,
            ApiError {
                error: "internal".into(),
                message: "internal error; the log says more".into(),
            },
        )
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (self.0, Json(self.1)).into_response()
    }
}

type Answer<T> = Result<Json<T>, Failure>;

fn query<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, Failure> {
    query.map(|Query(q)| q).map_err(|e| Failure::bad(e.body_text()))
}

fn body<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, Failure> {
    body.map(|Json(b)| b).map_err(rejected_body)
}

/// A body that could not be read: 413 over [`super::BODY_BYTES_MAX`], else 400 (or 415).
fn rejected_body(rejection: JsonRejection) -> Failure {
    let status = rejection.status();
    let error = if status == StatusCode::PAYLOAD_TOO_LARGE { "too_large" } else { "bad_request" };
    Failure(status, ApiError { error: error.into(), message: rejection.body_text() })
}

/// A page's cursor: pass `after` for the next page.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct More {
    pub after: i64,
}

/// `limit`, checked, and one more row to fetch, to know whether there is more.
fn page_limit(limit: Option<i64>) -> Result<i64, Failure> {
    let limit = limit.unwrap_or(PAGE_DEFAULT);
    if !(1..=PAGE_MAX).contains(&limit) {
        return Err(Failure::bad(format!(
            "limit {limit}: a page holds 1 to {PAGE_MAX} rows; use `after` for the next"
        )));
    }
    Ok(limit)
}

/// The rows of a page and its cursor, from `limit + 1` rows.
fn paged<T>(mut rows: Vec<T>, limit: i64, id: impl Fn(&T) -> i64) -> (Vec<T>, Option<More>) {
    let limit = usize::try_from(limit).unwrap_or(0);
    let full = rows.len() > limit;
    rows.truncate(limit);
    let more = if full { rows.last().map(|r| More { after: id(r) }) } else { None };
    (rows, more)
}

/// A duration as `since` takes it: `90s`, `15m`, `1h`, `7d`.
fn since_ms(since: Option<&str>) -> Result<Option<i64>, Failure> {
    let Some(text) = since else { return Ok(None) };
    let duration: Duration = text
        .parse::<humantime::Duration>()
        .map_err(|e| Failure::bad(format!("since `{text}`: {e} (e.g. 90s, 15m, 1h, 7d)")))?
        .into();
    let ms = i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
    Ok(Some(now_ms().saturating_sub(ms)))
}

/// An RFC 3339 time as Unix milliseconds.
fn instant_ms(name: &str, text: Option<&str>) -> Result<Option<i64>, Failure> {
    let Some(text) = text else { return Ok(None) };
    let at = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .map_err(|e| Failure::bad(format!("{name} `{text}`: not an RFC 3339 time ({e})")))?;
    Ok(Some(i64::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)))
}

impl Admin {
    /// Checks a pipeline filter: configured, or known to the store.
    async fn check_pipeline(&self, pipeline: Option<&str>) -> Result<(), Failure> {
        let configured = self.gateway.pipeline_names();
        events::check_filters(self.gateway.store(), &configured, pipeline, 1).await.map_err(|e| {
            match e.downcast_ref::<StoreError>() {
                Some(_) => Failure::from(e),
                None => Failure::bad(format!("pipeline: {e:#}")),
            }
        })
    }

    /// A served pipeline's targets, or 404 naming the served pipelines.
    fn targets_of(&self, pipeline: &str) -> Result<Vec<(String, String)>, Failure> {
        let served = self.gateway.pipeline(pipeline);
        let Some(served) = served else {
            let names = self.gateway.pipeline_names();
            return Err(Failure::not_found(format!(
                "no pipeline `{}` is served: one of {}",
                hookgate_pipeline::evaluate::printable(pipeline, 64),
                names.join(", ")
            )));
        };
        Ok(served.compiled.targets.iter().map(|t| (t.name.clone(), t.connector.clone())).collect())
    }
}

// ---- events ----

/// Filters and cursor of `GET /events`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Only this pipeline's events.
    pub pipeline: Option<String>,
    /// `accepted` (writes to do), `done` or `dead`.
    pub state: Option<String>,
    /// Only events received in this last period: `90s`, `15m`, `1h`, `7d`.
    pub since: Option<String>,
    /// Rows per page, 1 to 1000 (default 50).
    pub limit: Option<i64>,
    /// The next page: events older than this id (the `more.after` of the last page).
    pub after: Option<i64>,
}

/// An event as lists show it (the `events list --json` line).
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EventSummary {
    pub id: i64,
    pub pipeline: String,
    pub scope: String,
    pub key: String,
    #[serde(rename = "type")]
    pub event_type: Option<String>,
    /// RFC 3339, UTC.
    pub received_at: String,
    /// `accepted`, `done` or `dead`.
    pub state: String,
    pub deliveries: i64,
    pub conflicts: i64,
    pub fingerprint: String,
    /// The payload key the body is sealed under, or null for plaintext.
    pub sealed_with: Option<String>,
    /// When `payload_retention` deleted the body.
    pub payload_deleted_at: Option<String>,
}

/// A page of events, newest first: the rows are `events list --json`'s objects, documented
/// as [`EventsPageDoc`] (which the tests validate these against).
#[derive(Debug, Serialize)]
pub struct EventsPage {
    pub events: Vec<Value>,
    pub more: Option<More>,
}

async fn list_events(
    State(admin): State<Admin>,
    q: Result<Query<EventsQuery>, QueryRejection>,
) -> Answer<EventsPage> {
    let q = query(q)?;
    let limit = page_limit(q.limit)?;
    let state = match q.state.as_deref() {
        None => None,
        Some(text) => Some(EventState::parse(text).ok_or_else(|| {
            Failure::bad(format!("state `{text}`: one of {}", EventState::names()))
        })?),
    };
    admin.check_pipeline(q.pipeline.as_deref()).await?;
    let filter = EventFilter {
        pipeline: q.pipeline,
        state,
        since_ms: since_ms(q.since.as_deref())?,
        before_id: q.after,
        limit: limit + 1,
    };
    let rows = admin.gateway.store().list_events(&filter).await?;
    let (rows, more) = paged(rows, limit, |e| e.id);
    Ok(Json(EventsPage { events: rows.iter().map(events::event_json).collect(), more }))
}

/// `GET /events/{id}`: `body=true` adds the stored headers and body (masked as configured).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShowQuery {
    /// Also the stored headers and body, and conflicting deliveries' bodies (at most 64 KiB
    /// each, escaped, masked by the pipeline's `redact`).
    pub body: Option<bool>,
}

/// One delivery of an event: the first, duplicates and conflicts.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StoryDelivery {
    pub id: i64,
    pub received_at: String,
    /// `accepted`, `duplicate` or `conflict`.
    pub outcome: String,
    pub fingerprint: Option<String>,
    /// The size of the body kept (conflicts keep theirs), or null.
    pub body_bytes: Option<usize>,
    pub body: Option<ShownBody>,
}

/// A stored body as shown.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShownBody {
    pub bytes: usize,
    /// Cut at 64 KiB.
    pub truncated: bool,
    /// `utf-8`, or `base64` for bytes that are not UTF-8.
    pub encoding: String,
    pub text: String,
    /// What was done to the body before it was shown, if anything.
    pub redaction: Option<String>,
}

/// One CRM write an event asked for.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StoryWrite {
    pub id: i64,
    pub target: String,
    pub entity: String,
    /// The ordering version as the sender wrote it.
    pub version: Option<String>,
    /// `pending`, `in_flight`, `done`, `dead` or `skipped_stale`.
    pub state: String,
    pub attempts: i64,
    /// The write may have reached the CRM without its answer reaching us.
    pub in_doubt: bool,
    pub record_id: Option<String>,
    pub last_error: Option<String>,
}

/// One call to a CRM (or an operator's action) for a write.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StoryAttempt {
    /// The write's id.
    pub write: i64,
    pub target: Option<String>,
    pub attempt: i64,
    pub started_at: String,
    pub duration_ms: Option<i64>,
    /// `upsert`, `lookup`, `refresh`, `replay`, ...
    pub action: Option<String>,
    pub outcome: Option<String>,
    /// The CRM's HTTP status.
    pub status: Option<i64>,
    pub error: Option<String>,
    /// An excerpt of the CRM's answer.
    pub answer: Option<String>,
    /// Why the answer cannot be shown (its payload key is missing).
    pub answer_error: Option<String>,
    pub meta: Option<String>,
    pub worker: String,
}

/// Where the payload is and how long it is kept.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StoryPayload {
    pub sealed_with: Option<String>,
    pub deleted_at: Option<String>,
    pub retention_secs: Option<u64>,
    pub payload_retention_secs: Option<u64>,
}

/// An event's whole story (the `events show --json` object).
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EventStory {
    pub id: i64,
    pub pipeline: String,
    pub scope: String,
    pub key: String,
    #[serde(rename = "type")]
    pub event_type: Option<String>,
    pub received_at: String,
    pub state: String,
    pub deliveries: i64,
    pub conflicts: i64,
    pub fingerprint: String,
    pub sealed_with: Option<String>,
    pub payload_deleted_at: Option<String>,
    pub delivery_list: Vec<StoryDelivery>,
    pub writes: Vec<StoryWrite>,
    pub attempts: Vec<StoryAttempt>,
    pub payload: StoryPayload,
    /// With `body=true`: the kept headers as `[name, value]` pairs.
    pub headers: Option<Vec<[String; 2]>>,
    /// With `body=true`: the stored body.
    pub body: Option<ShownBody>,
}

async fn show_event(
    State(admin): State<Admin>,
    Path(id): Path<i64>,
    q: Result<Query<ShowQuery>, QueryRejection>,
) -> Result<Json<Value>, Failure> {
    let q = query(q)?;
    let store = admin.gateway.store();
    let Some(event) = store.event(id).await? else {
        return Err(Failure::not_found(format!("no event {id}")));
    };
    let bodies = Bodies::shown_if(q.body.unwrap_or(false));
    let story = events::story_value(store, &admin.views(), &event, bodies).await?;
    Ok(Json(story))
}

// ---- conflicts, rejected deliveries, dead letters ----

/// Filters and cursor of the delivery lists.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeliveriesQuery {
    pub pipeline: Option<String>,
    /// Also each kept body (at most 64 KiB, masked by the pipeline's `redact`).
    pub body: Option<bool>,
    /// Rows per page, 1 to 1000 (default 50).
    pub limit: Option<i64>,
    /// The next page: rows older than this id.
    pub after: Option<i64>,
}

/// A delivery whose key was known with another fingerprint: the original was kept.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conflict {
    /// The delivery's id.
    pub id: i64,
    pub event_id: Option<i64>,
    pub pipeline: String,
    pub key: Option<String>,
    pub received_at: String,
    /// This delivery's fingerprint ...
    pub fingerprint: Option<String>,
    /// ... and the original's, which was kept.
    pub original_fingerprint: Option<String>,
    pub body_bytes: Option<usize>,
    pub body: Option<ShownBody>,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConflictsPage {
    pub conflicts: Vec<Conflict>,
    pub more: Option<More>,
}

async fn list_conflicts(
    State(admin): State<Admin>,
    q: Result<Query<DeliveriesQuery>, QueryRejection>,
) -> Answer<ConflictsPage> {
    let q = query(q)?;
    let limit = page_limit(q.limit)?;
    admin.check_pipeline(q.pipeline.as_deref()).await?;
    let store = admin.gateway.store();
    let rows = store
        .deliveries_page(DeliveryOutcome::Conflict, q.pipeline.as_deref(), q.after, limit + 1)
        .await?;
    let (rows, more) = paged(rows, limit, |d| d.id);
    let ids: Vec<i64> = rows.iter().filter_map(|d| d.event_id).collect();
    let originals: BTreeMap<i64, String> = store.fingerprints(&ids).await?.into_iter().collect();
    let mut conflicts = Vec::new();
    for row in rows {
        let body = shown_kept_body(&admin, &row, q.body.unwrap_or(false))?;
        conflicts.push(Conflict {
            id: row.id,
            event_id: row.event_id,
            key: row.event_key.clone(),
            received_at: timestamp(row.received_at_ms),
            original_fingerprint: row.event_id.and_then(|id| originals.get(&id).cloned()),
            fingerprint: row.fingerprint.clone(),
            body_bytes: row.body.as_ref().map(Vec::len),
            pipeline: row.pipeline,
            body,
        });
    }
    Ok(Json(ConflictsPage { conflicts, more }))
}

/// A delivery's kept body as shown, only when asked for: opening it needs its payload key, and
/// a list should not fail for a row whose key is gone when no body was asked for.
fn shown_kept_body(
    admin: &Admin,
    row: &hookgate_store::DeliveryRecord,
    wanted: bool,
) -> Result<Option<ShownBody>, Failure> {
    if !wanted {
        return Ok(None);
    }
    match admin.views().open_delivery_body(row)? {
        Some(kept) => Ok(Some(shown_body(admin, &row.pipeline, &kept)?)),
        None => Ok(None),
    }
}

fn shown_body(admin: &Admin, pipeline: &str, body: &[u8]) -> Result<ShownBody, Failure> {
    serde_json::from_value(events::shown_body_json(&admin.views(), pipeline, body))
        .map_err(|e| Failure::from(anyhow::anyhow!("a shown body: {e}")))
}

/// A delivery signed correctly but refused (not JSON, no key, ...).
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RejectedDelivery {
    pub id: i64,
    pub pipeline: String,
    pub received_at: String,
    pub reason: Option<String>,
    pub body_bytes: Option<usize>,
    pub body: Option<ShownBody>,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RejectedPage {
    pub rejected: Vec<RejectedDelivery>,
    pub more: Option<More>,
}

async fn list_rejected(
    State(admin): State<Admin>,
    q: Result<Query<DeliveriesQuery>, QueryRejection>,
) -> Answer<RejectedPage> {
    let q = query(q)?;
    let limit = page_limit(q.limit)?;
    admin.check_pipeline(q.pipeline.as_deref()).await?;
    let rows = admin
        .gateway
        .store()
        .rejected_deliveries(q.pipeline.as_deref(), q.after, limit + 1)
        .await?;
    let (rows, more) = paged(rows, limit, |d| d.id);
    let mut rejected = Vec::new();
    for row in rows {
        let body = shown_kept_body(&admin, &row, q.body.unwrap_or(false))?;
        rejected.push(RejectedDelivery {
            id: row.id,
            received_at: timestamp(row.received_at_ms),
            reason: row.reason.clone(),
            body_bytes: row.body.as_ref().map(Vec::len),
            pipeline: row.pipeline,
            body,
        });
    }
    Ok(Json(RejectedPage { rejected, more }))
}

/// Filters of `GET /refused`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RefusedQuery {
    pub pipeline: Option<String>,
    /// Rows at most, 1 to 1000 (default 50).
    pub limit: Option<i64>,
}

/// Deliveries refused for their signature under one pipeline, code and reason: nothing of
/// them is stored but this count.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Refusal {
    pub pipeline: String,
    /// The stable rejection code (`signature_mismatch`, `timestamp_too_old`, ...).
    pub code: String,
    pub reason: String,
    /// For URL-signing senders: the URL verified against, last seen.
    pub url: Option<String>,
    pub first_seen_at: String,
    pub last_seen_at: String,
    pub refusals: i64,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RefusedPage {
    pub refused: Vec<Refusal>,
}

async fn list_refused(
    State(admin): State<Admin>,
    q: Result<Query<RefusedQuery>, QueryRejection>,
) -> Answer<RefusedPage> {
    let q = query(q)?;
    let limit = page_limit(q.limit)?;
    admin.check_pipeline(q.pipeline.as_deref()).await?;
    let rows = admin.gateway.store().signature_refusals(q.pipeline.as_deref(), limit).await?;
    let refused = rows
        .into_iter()
        .map(|row| Refusal {
            first_seen_at: timestamp(row.first_at_ms),
            last_seen_at: timestamp(row.last_at_ms),
            pipeline: row.pipeline,
            code: row.code,
            reason: row.reason,
            url: row.url,
            refusals: row.refusals,
        })
        .collect();
    Ok(Json(RefusedPage { refused }))
}

/// Filters and cursor of `GET /dead-letters`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeadLettersQuery {
    pub pipeline: Option<String>,
    pub target: Option<String>,
    /// Rows per page, 1 to 1000 (default 50).
    pub limit: Option<i64>,
    /// The next page: writes older than this write id.
    pub after: Option<i64>,
}

/// A write that could not succeed, with its event.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterRow {
    pub write: i64,
    pub event_id: i64,
    pub pipeline: String,
    pub target: String,
    pub entity: String,
    pub version: Option<String>,
    pub attempts: i64,
    /// Dead-lettered while in doubt: a replay looks the record up first.
    pub in_doubt: bool,
    pub last_error: Option<String>,
    pub dead_at: Option<String>,
    pub key: String,
    pub scope: String,
    #[serde(rename = "type")]
    pub event_type: Option<String>,
    pub received_at: String,
}

impl From<DeadLetter> for DeadLetterRow {
    fn from(d: DeadLetter) -> DeadLetterRow {
        DeadLetterRow {
            write: d.write_id,
            event_id: d.event_id,
            pipeline: d.pipeline,
            target: d.target,
            entity: d.entity,
            version: d.version,
            attempts: d.attempts,
            in_doubt: d.in_doubt,
            last_error: d.last_error,
            dead_at: d.finished_at_ms.map(timestamp),
            key: d.event_key,
            scope: d.scope,
            event_type: d.event_type,
            received_at: timestamp(d.received_at_ms),
        }
    }
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeadLettersPage {
    pub dead_letters: Vec<DeadLetterRow>,
    pub more: Option<More>,
}

pub(super) async fn dead_letters(
    admin: &Admin,
    q: DeadLettersQuery,
) -> Result<DeadLettersPage, Failure> {
    let limit = page_limit(q.limit)?;
    admin.check_pipeline(q.pipeline.as_deref()).await?;
    let rows = admin
        .gateway
        .store()
        .dead_letters(q.pipeline.as_deref(), q.target.as_deref(), q.after, limit + 1)
        .await?;
    let (rows, more) = paged(rows, limit, |d| d.write_id);
    Ok(DeadLettersPage { dead_letters: rows.into_iter().map(DeadLetterRow::from).collect(), more })
}

async fn list_dead_letters(
    State(admin): State<Admin>,
    q: Result<Query<DeadLettersQuery>, QueryRejection>,
) -> Answer<DeadLettersPage> {
    Ok(Json(dead_letters(&admin, query(q)?).await?))
}

// ---- replay ----

/// Which dead writes to queue again. At least one filter is required, so that "replay
/// everything" is said explicitly (`"all": true`).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayRequest {
    pub pipeline: Option<String>,
    /// Only this target's dead writes.
    pub target: Option<String>,
    /// Only these events (at most 1,000).
    pub event_ids: Option<Vec<i64>>,
    /// Only events received at or after this time (RFC 3339).
    pub since: Option<String>,
    /// Only events received before this time (RFC 3339).
    pub until: Option<String>,
    /// Every dead write, when no other filter is given.
    pub all: Option<bool>,
    /// At most this many events, oldest first: 1 to 1,000 (default 500).
    pub limit: Option<i64>,
}

/// What a replay did to one event.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayedEvent {
    pub event: i64,
    /// Dead writes queued again (in the replay lane).
    pub queued: u64,
    /// Why nothing was queued (the payload was deleted by `payload_retention`).
    pub refused: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayAnswer {
    pub events: Vec<ReplayedEvent>,
    /// Writes queued in all.
    pub queued: u64,
    /// More events match than `limit`: send the request again for the next ones.
    pub more: bool,
}

pub(super) async fn replay(admin: &Admin, request: ReplayRequest) -> Result<ReplayAnswer, Failure> {
    let limit = request.limit.unwrap_or(REPLAY_DEFAULT);
    if !(1..=REPLAY_MAX).contains(&limit) {
        return Err(Failure::bad(format!("limit {limit}: 1 to {REPLAY_MAX} events per replay")));
    }
    if request.event_ids.as_ref().is_some_and(|ids| ids.len() > REPLAY_IDS_MAX) {
        return Err(Failure::bad(format!("event_ids: at most {REPLAY_IDS_MAX} per replay")));
    }
    let filtered = request.pipeline.is_some()
        || request.target.is_some()
        || request.event_ids.is_some()
        || request.since.is_some()
        || request.until.is_some();
    if !filtered && request.all != Some(true) {
        return Err(Failure::bad(
            "no filter: give pipeline, target, event_ids, since or until, or \"all\": true",
        ));
    }
    if let Some(pipeline) = &request.pipeline {
        let targets = admin.targets_of(pipeline).map_err(|f| Failure::bad(f.1.message))?;
        if let Some(target) = &request.target
            && !targets.iter().any(|(t, _)| t == target)
        {
            let names: Vec<&str> = targets.iter().map(|(t, _)| t.as_str()).collect();
            return Err(Failure::bad(format!(
                "target `{target}`: pipeline `{pipeline}` has {}",
                names.join(", ")
            )));
        }
    }
    let filter = ReplayFilter {
        pipeline: request.pipeline.clone(),
        target: request.target.clone(),
        event_ids: request.event_ids.clone(),
        since_ms: instant_ms("since", request.since.as_deref())?,
        until_ms: instant_ms("until", request.until.as_deref())?,
        limit: limit + 1,
    };
    let store = admin.gateway.store();
    let mut ids = store.dead_events_matching(&filter).await?;
    let more = ids.len() > usize::try_from(limit).unwrap_or(0);
    ids.truncate(usize::try_from(limit).unwrap_or(0));
    let mut answer = ReplayAnswer { events: Vec::new(), queued: 0, more };
    // Oldest first, so that each entity's writes are queued in the order they were received;
    // the lease takes them in version order anyway.
    for id in ids {
        match store.replay_event_writes(id, request.target.as_deref(), now_ms()).await? {
            Replay::Queued(queued) => {
                answer.queued += queued;
                answer.events.push(ReplayedEvent { event: id, queued, refused: None });
            }
            Replay::PayloadGone { purged_at_ms } => answer.events.push(ReplayedEvent {
                event: id,
                queued: 0,
                refused: Some(format!(
                    "the payload was deleted at {} by payload_retention",
                    timestamp(purged_at_ms)
                )),
            }),
        }
    }
    tracing::info!(events = answer.events.len(), queued = answer.queued, "admin: replay");
    Ok(answer)
}

async fn replay_route(
    State(admin): State<Admin>,
    request: Result<Json<ReplayRequest>, JsonRejection>,
) -> Answer<ReplayAnswer> {
    Ok(Json(replay(&admin, body(request)?).await?))
}

async fn replay_event_route(
    State(admin): State<Admin>,
    Path(id): Path<i64>,
) -> Answer<ReplayAnswer> {
    if admin.gateway.store().event(id).await?.is_none() {
        return Err(Failure::not_found(format!("no event {id}")));
    }
    let request =
        ReplayRequest { event_ids: Some(vec![id]), limit: Some(1), ..ReplayRequest::default() };
    Ok(Json(replay(&admin, request).await?))
}

// ---- pipelines, targets, pauses ----

/// A served pipeline: its intake pause and its targets.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PipelineState {
    pub name: String,
    /// Intake answers 503 with Retry-After while paused.
    pub intake_paused: bool,
    pub paused_at: Option<String>,
    pub pause_reason: Option<String>,
    pub targets: Vec<TargetState>,
}

/// A target of a pipeline: its delivery pause and its unfinished and dead writes.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TargetState {
    pub name: String,
    pub connector: String,
    /// Its writes are held (not leased) while paused.
    pub paused: bool,
    pub paused_at: Option<String>,
    pub pause_reason: Option<String>,
    pub pending: i64,
    pub in_flight: i64,
    pub dead: i64,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PipelinesAnswer {
    pub pipelines: Vec<PipelineState>,
}

pub(super) async fn pipelines(admin: &Admin) -> Result<PipelinesAnswer, Failure> {
    let store = admin.gateway.store();
    let pauses = store.pauses().await?;
    let backlog = store.target_backlog().await?;
    let find = |pipeline: &str, kind: PauseKind, target: &str| {
        pauses.iter().find(|p| p.pipeline == pipeline && p.kind == kind && p.target == target)
    };
    let mut answer = Vec::new();
    for name in admin.gateway.pipeline_names() {
        let name = name.as_str();
        let intake = find(name, PauseKind::Intake, "");
        let mut targets = Vec::new();
        for (target, connector) in admin.targets_of(name)? {
            let pause = find(name, PauseKind::Delivery, &target);
            let counts = backlog.iter().find(|b| b.pipeline == name && b.target == target);
            targets.push(TargetState {
                paused: pause.is_some(),
                paused_at: pause.map(|p| timestamp(p.paused_at_ms)),
                pause_reason: pause.and_then(|p| p.reason.clone()),
                pending: counts.map_or(0, |c| c.pending),
                in_flight: counts.map_or(0, |c| c.in_flight),
                dead: counts.map_or(0, |c| c.dead),
                name: target,
                connector,
            });
        }
        answer.push(PipelineState {
            name: name.to_owned(),
            intake_paused: intake.is_some(),
            paused_at: intake.map(|p| timestamp(p.paused_at_ms)),
            pause_reason: intake.and_then(|p| p.reason.clone()),
            targets,
        });
    }
    Ok(PipelinesAnswer { pipelines: answer })
}

async fn pipelines_route(State(admin): State<Admin>) -> Answer<PipelinesAnswer> {
    Ok(Json(pipelines(&admin).await?))
}

/// A pause's optional reason, kept with it as evidence.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PauseRequest {
    /// Why (at most 500 characters), e.g. `CRM maintenance until 14:00`.
    pub reason: Option<String>,
}

/// What a pause or a resume changed.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PauseAnswer {
    pub pipeline: String,
    /// The target, for a delivery pause; null for intake.
    pub target: Option<String>,
    pub paused: bool,
    /// False when it already was as asked.
    pub changed: bool,
}

/// Pauses or resumes; `target` `None` is the pipeline's intake. Refreshes this process's copy
/// at once; other gateways see it within their refresh.
pub(super) async fn set_pause(
    admin: &Admin,
    pipeline: &str,
    target: Option<&str>,
    paused: bool,
    reason: Option<String>,
) -> Result<PauseAnswer, Failure> {
    let targets = admin.targets_of(pipeline)?;
    if let Some(target) = target
        && !targets.iter().any(|(t, _)| t == target)
    {
        let names: Vec<&str> = targets.iter().map(|(t, _)| t.as_str()).collect();
        return Err(Failure::not_found(format!(
            "pipeline `{pipeline}` has no target `{}`: one of {}",
            hookgate_pipeline::evaluate::printable(target, 64),
            names.join(", ")
        )));
    }
    let kind = if target.is_some() { PauseKind::Delivery } else { PauseKind::Intake };
    let store = admin.gateway.store();
    let changed = if paused {
        let reason = reason.map(|r| r.chars().take(REASON_CHARS_MAX).collect());
        store
            .pause(&Pause {
                pipeline: pipeline.to_owned(),
                kind,
                target: target.unwrap_or_default().to_owned(),
                paused_at_ms: now_ms(),
                reason,
            })
            .await?
    } else {
        store.resume(pipeline, kind, target.unwrap_or_default()).await?
    };
    // Stored is in force: this process's copy catches up within its next refresh if not now.
    if let Err(error) = admin.gateway.refresh_pauses().await {
        tracing::warn!(%error, "admin: the pause is stored; this process reads it at its next refresh");
    }
    tracing::info!(
        pipeline,
        target = target.unwrap_or("-"),
        kind = kind.name(),
        paused,
        changed,
        "admin: pause"
    );
    Ok(PauseAnswer {
        pipeline: pipeline.to_owned(),
        target: target.map(str::to_owned),
        paused,
        changed,
    })
}

async fn pause_intake(
    State(admin): State<Admin>,
    Path(pipeline): Path<String>,
    request: Result<Json<PauseRequest>, JsonRejection>,
) -> Answer<PauseAnswer> {
    let reason = optional_body(request)?.reason;
    Ok(Json(set_pause(&admin, &pipeline, None, true, reason).await?))
}

async fn resume_intake(
    State(admin): State<Admin>,
    Path(pipeline): Path<String>,
) -> Answer<PauseAnswer> {
    Ok(Json(set_pause(&admin, &pipeline, None, false, None).await?))
}

async fn pause_target(
    State(admin): State<Admin>,
    Path((pipeline, target)): Path<(String, String)>,
    request: Result<Json<PauseRequest>, JsonRejection>,
) -> Answer<PauseAnswer> {
    let reason = optional_body(request)?.reason;
    Ok(Json(set_pause(&admin, &pipeline, Some(&target), true, reason).await?))
}

async fn resume_target(
    State(admin): State<Admin>,
    Path((pipeline, target)): Path<(String, String)>,
) -> Answer<PauseAnswer> {
    Ok(Json(set_pause(&admin, &pipeline, Some(&target), false, None).await?))
}

/// A body that may be absent (no `Content-Type`, nothing sent) but, if sent, must be valid.
fn optional_body<T: Default>(request: Result<Json<T>, JsonRejection>) -> Result<T, Failure> {
    match request {
        Ok(Json(value)) => Ok(value),
        Err(JsonRejection::MissingJsonContentType(_)) => Ok(T::default()),
        Err(error) => Err(rejected_body(error)),
    }
}

async fn openapi_route() -> Json<Value> {
    Json(super::openapi::document())
}

// ---- the route table ----

type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

/// One route, as the OpenAPI document describes it.
pub struct Route {
    pub method: &'static str,
    pub path: &'static str,
    pub operation: &'static str,
    pub summary: &'static str,
    /// The query's type: each of its properties is a query parameter.
    pub query: Option<SchemaFn>,
    /// The JSON body's type.
    pub body: Option<SchemaFn>,
    /// The 200 answer's type.
    pub answer: SchemaFn,
}

fn schema<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<T>()
}

fn inline<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    generator.root_schema_for::<T>()
}

/// Every route of the API, in the document's order.
pub const ROUTES: &[Route] = &[
    Route {
        method: "get",
        path: "/events",
        operation: "listEvents",
        summary: "Events, newest first, a page at a time.",
        query: Some(inline::<EventsQuery>),
        body: None,
        answer: schema::<EventsPageDoc>,
    },
    Route {
        method: "get",
        path: "/events/{id}",
        operation: "showEvent",
        summary: "One event's whole story: deliveries, conflicts, writes, every attempt with the CRM's answer.",
        query: Some(inline::<ShowQuery>),
        body: None,
        answer: schema::<EventStory>,
    },
    Route {
        method: "post",
        path: "/events/{id}/replay",
        operation: "replayEvent",
        summary: "Queue one event's dead writes again, in the replay lane.",
        query: None,
        body: None,
        answer: schema::<ReplayAnswer>,
    },
    Route {
        method: "get",
        path: "/conflicts",
        operation: "listConflicts",
        summary: "Deliveries that reused a key with other content; the original was kept.",
        query: Some(inline::<DeliveriesQuery>),
        body: None,
        answer: schema::<ConflictsPage>,
    },
    Route {
        method: "get",
        path: "/rejected",
        operation: "listRejected",
        summary: "Deliveries signed correctly but refused, with the reason.",
        query: Some(inline::<DeliveriesQuery>),
        body: None,
        answer: schema::<RejectedPage>,
    },
    Route {
        method: "get",
        path: "/refused",
        operation: "listRefused",
        summary: "Deliveries refused for their signature (401), counted per pipeline, code and reason.",
        query: Some(inline::<RefusedQuery>),
        body: None,
        answer: schema::<RefusedPage>,
    },
    Route {
        method: "get",
        path: "/dead-letters",
        operation: "listDeadLetters",
        summary: "Writes that could not succeed, newest first.",
        query: Some(inline::<DeadLettersQuery>),
        body: None,
        answer: schema::<DeadLettersPage>,
    },
    Route {
        method: "post",
        path: "/replay",
        operation: "replay",
        summary: "Queue dead writes again by filter, oldest event first, in a lane that cannot starve fresh work.",
        query: None,
        body: Some(schema::<ReplayRequest>),
        answer: schema::<ReplayAnswer>,
    },
    Route {
        method: "get",
        path: "/pipelines",
        operation: "listPipelines",
        summary: "Served pipelines and targets: pauses and writes by state.",
        query: None,
        body: None,
        answer: schema::<PipelinesAnswer>,
    },
    Route {
        method: "post",
        path: "/pipelines/{pipeline}/pause",
        operation: "pauseIntake",
        summary: "Pause a pipeline's intake: deliveries are answered 503 with Retry-After.",
        query: None,
        body: Some(schema::<PauseRequest>),
        answer: schema::<PauseAnswer>,
    },
    Route {
        method: "post",
        path: "/pipelines/{pipeline}/resume",
        operation: "resumeIntake",
        summary: "Resume a pipeline's intake.",
        query: None,
        body: None,
        answer: schema::<PauseAnswer>,
    },
    Route {
        method: "post",
        path: "/pipelines/{pipeline}/targets/{target}/pause",
        operation: "pauseTarget",
        summary: "Hold a target's writes: not leased until resumed; writes in flight finish.",
        query: None,
        body: Some(schema::<PauseRequest>),
        answer: schema::<PauseAnswer>,
    },
    Route {
        method: "post",
        path: "/pipelines/{pipeline}/targets/{target}/resume",
        operation: "resumeTarget",
        summary: "Resume a target's delivery.",
        query: None,
        body: None,
        answer: schema::<PauseAnswer>,
    },
    Route {
        method: "get",
        path: "/openapi.json",
        operation: "openapi",
        summary: "This document.",
        query: None,
        body: None,
        answer: schema::<Value>,
    },
];

/// `EventsPage` as documented: its rows are [`EventSummary`]s.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename = "EventsPage")]
pub struct EventsPageDoc {
    pub events: Vec<EventSummary>,
    pub more: Option<More>,
}

/// The routes; `super::router` adds the token check.
pub(super) fn routes() -> Router<Admin> {
    Router::new()
        .route("/events", get(list_events))
        .route("/events/{id}", get(show_event))
        .route("/events/{id}/replay", post(replay_event_route))
        .route("/conflicts", get(list_conflicts))
        .route("/rejected", get(list_rejected))
        .route("/refused", get(list_refused))
        .route("/dead-letters", get(list_dead_letters))
        .route("/replay", post(replay_route))
        .route("/pipelines", get(pipelines_route))
        .route("/pipelines/{pipeline}/pause", post(pause_intake))
        .route("/pipelines/{pipeline}/resume", post(resume_intake))
        .route("/pipelines/{pipeline}/targets/{target}/pause", post(pause_target))
        .route("/pipelines/{pipeline}/targets/{target}/resume", post(resume_target))
        .route("/openapi.json", get(openapi_route))
}
