//! A fake HubSpot CRM v3 objects API.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::Running;
use crate::chaos::{Access, Chaos, Dice, Fate};

pub const TOKEN: &str = "pat-na1-fake-token";
/// HubSpot's rolling rate-limit window.
pub const WINDOW: Duration = Duration::from_secs(10);
/// Calls a private app may make per day on a Free or Starter account (more on higher tiers).
pub const DAILY_LIMIT: u64 = 250_000;
/// HubSpot's day, which ends at midnight in the account's time zone (shorter in tests).
pub const DAY: Duration = Duration::from_secs(24 * 3600);
/// Inputs one batch upsert may carry; more answer 400.
pub const BATCH_INPUTS_MAX: usize = 100;

/// A one-shot failure served to the next write instead of its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// A 5xx with HubSpot's error body.
    ServerError(u16),
    /// 400 `VALIDATION_ERROR` for a property value.
    Validation,
    /// Apply the write (or read), then answer only after this delay.
    LostResponse(Duration),
    /// 429 with the rate-limit headers of a used-up window, and `Retry-After` if given.
    RateLimited { retry_after: Option<Duration> },
}

/// One write the fake applied, in the order applied: the effect log that tests and
/// `cargo xtask chaos` judge by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    pub object: String,
    /// The id property's value.
    pub id: String,
    /// The properties the write set.
    pub properties: BTreeMap<String, String>,
}

/// Every request the window judged, as the CRM's own count: what tests and the bench judge a
/// budget by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallCounts {
    /// Requests the window let through.
    pub admitted: u64,
    /// Requests refused with 429 because the window was used up.
    pub refused_window: u64,
    /// Requests refused with 429 (`policyName: DAILY`) because the day's calls were used up.
    pub refused_daily: u64,
    /// The most requests admitted within any one rolling window.
    pub max_in_any_window: usize,
}

/// Write requests received, by endpoint, whatever their answer: a test tells one batch call
/// from one call per record by them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteCalls {
    /// `POST /crm/v3/objects/{type}/batch/upsert`, of any number of inputs.
    pub batch_upsert: u64,
    /// `PATCH /crm/v3/objects/{type}/{id}`.
    pub update: u64,
}

#[derive(Debug, Clone)]
pub struct Record {
    pub id: u64,
    pub object: String,
    pub properties: BTreeMap<String, String>,
    pub updated: Instant,
}

#[derive(Debug)]
pub struct HubSpotState {
    pub token: String,
    /// The token has the scopes it needs; `false` answers 403 `MISSING_SCOPES`.
    pub scopes_granted: bool,
    /// Properties with unique values, per object type: the only valid `idProperty`s.
    pub unique_properties: HashMap<String, HashSet<String>>,
    /// Properties nobody may write.
    pub read_only: HashSet<String>,
    pub records: Vec<Record>,
    /// Requests allowed per window per token.
    pub max_per_window: usize,
    /// The rolling window ([`WINDOW`]; shorter in tests that would otherwise wait).
    pub window_length: Duration,
    /// Whether a 429 carries `Retry-After` (not confirmed in HubSpot's docs).
    pub retry_after_on_429: bool,
    window: VecDeque<Instant>,
    /// Requests allowed per day, reported in `X-HubSpot-RateLimit-Daily`.
    pub daily_limit: u64,
    /// The day's length ([`DAY`]; shorter in tests of a day that rolls on).
    pub day_length: Duration,
    day_started: Instant,
    /// Requests counted against today's limit.
    pub calls_today: u64,
    /// When each admitted request arrived, in order: how a budget spread its calls.
    pub admitted_at: Vec<Instant>,
    /// The window's verdicts so far.
    pub calls: CallCounts,
    /// How long a created or updated record stays invisible to search.
    pub search_lag: Duration,
    /// Batch results come in reverse input order: HubSpot does not promise input order, and a
    /// client that relies on it shows here.
    pub results_reversed: bool,
    /// Added to every answer: a real CRM's round trip, for benchmarks.
    pub latency: Duration,
    /// Served, one each, to the next writes instead of their answers.
    pub faults: VecDeque<Fault>,
    /// Served, one each, to the next reads of one record.
    pub lookup_faults: VecDeque<Fault>,
    /// Random faults, when set with [`FakeHubSpot::set_chaos`].
    dice: Option<Dice>,
    /// Every write applied, in order.
    pub writes: Vec<Write>,
    /// Write requests received, by endpoint.
    pub write_calls: WriteCalls,
    next_id: u64,
}

#[derive(Debug, Clone)]
pub struct FakeHubSpot {
    pub state: Arc<Mutex<HubSpotState>>,
    pub base_url: String,
    /// Held so the server stops when the last clone is dropped.
    _server: Arc<Running>,
}

impl FakeHubSpot {
    pub async fn start() -> FakeHubSpot {
        let (listener, base_url) = crate::bind().await;
        let state = Arc::new(Mutex::new(HubSpotState {
            token: TOKEN.into(),
            scopes_granted: true,
            unique_properties: HashMap::from([
                (
                    "contacts".to_owned(),
                    HashSet::from(["email".to_owned(), "external_id".to_owned()]),
                ),
                ("companies".to_owned(), HashSet::from(["external_id".to_owned()])),
            ]),
            read_only: ["hs_object_id", "createdate", "lastmodifieddate"]
                .into_iter()
                .map(String::from)
                .collect(),
            records: Vec::new(),
            max_per_window: 100,
            window_length: WINDOW,
            retry_after_on_429: false,
            window: VecDeque::new(),
            daily_limit: DAILY_LIMIT,
            day_length: DAY,
            day_started: Instant::now(),
            calls_today: 0,
            admitted_at: Vec::new(),
            calls: CallCounts::default(),
            search_lag: Duration::ZERO,
            results_reversed: false,
            latency: Duration::ZERO,
            faults: VecDeque::new(),
            lookup_faults: VecDeque::new(),
            dice: None,
            writes: Vec::new(),
            write_calls: WriteCalls::default(),
            next_id: 500,
        }));
        let router = Router::new()
            .route("/crm/v3/objects/{object}/batch/upsert", post(batch_upsert))
            .route("/crm/v3/objects/{object}/search", post(search))
            .route("/crm/v3/objects/{object}", get(list))
            .route("/crm/v3/objects/{object}/{id}", get(read).patch(update))
            .with_state(Arc::clone(&state));
        let running = crate::spawn(listener, base_url.clone(), router);
        FakeHubSpot { state, base_url, _server: Arc::new(running) }
    }

    pub fn lock(&self) -> MutexGuard<'_, HubSpotState> {
        self.state.lock().expect("the fake's lock is never poisoned")
    }

    pub fn push_fault(&self, fault: Fault) {
        self.lock().faults.push_back(fault);
    }

    pub fn records(&self, object: &str) -> Vec<Record> {
        self.lock().records.iter().filter(|r| r.object == object).cloned().collect()
    }

    pub fn push_lookup_fault(&self, fault: Fault) {
        self.lock().lookup_faults.push_back(fault);
    }

    /// From now on, every request draws a random fate (after any scripted fault).
    pub fn set_chaos(&self, chaos: Chaos) {
        self.lock().dice = Some(Dice::new(chaos));
    }

    /// How many requests met each random fault so far.
    pub fn injected(&self) -> BTreeMap<String, u64> {
        self.lock().dice.as_ref().map(Dice::injected).unwrap_or_default()
    }

    pub fn writes(&self) -> Vec<Write> {
        self.lock().writes.clone()
    }

    /// The window's verdicts so far.
    pub fn call_counts(&self) -> CallCounts {
        self.lock().calls
    }

    /// Write requests received so far, by endpoint.
    pub fn write_calls(&self) -> WriteCalls {
        self.lock().write_calls
    }
}

fn error(status: StatusCode, category: &str, message: &str) -> Response {
    let body = json!({
        "status": "error",
        "message": message,
        "correlationId": "aaaaaaaa-0000-4000-8000-000000000000",
        "category": category,
    });
    (status, Json(body)).into_response()
}

/// Auth, scopes and the rate-limit window; returns the rate-limit headers for the answer.
fn admit(
    state: &mut HubSpotState,
    headers: &HeaderMap,
) -> Result<Vec<(&'static str, String)>, Response> {
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    if token != state.token {
        let mut response = error(
            StatusCode::UNAUTHORIZED,
            "INVALID_AUTHENTICATION",
            "Authentication credentials not found. This API supports OAuth 2.0 authentication and you can find more details at https://developers.hubspot.com/docs/methods/auth/oauth-overview",
        );
        response
            .headers_mut()
            .insert("x-hubspot-auth-failure", HeaderValue::from_static("401 Unauthorized"));
        return Err(response);
    }
    if !state.scopes_granted {
        return Err(error(
            StatusCode::FORBIDDEN,
            "MISSING_SCOPES",
            "This app hasn't been granted all required scopes to make this call. Read more about required scopes here: https://developers.hubspot.com/scopes.",
        ));
    }
    let now = Instant::now();
    while state.window.front().is_some_and(|t| now.duration_since(*t) >= state.window_length) {
        state.window.pop_front();
    }
    if now.duration_since(state.day_started) >= state.day_length {
        state.day_started = now;
        state.calls_today = 0;
    }
    if state.calls_today >= state.daily_limit {
        state.calls.refused_daily += 1;
        return Err(daily_limit_reached(state));
    }
    let remaining = state.max_per_window.saturating_sub(state.window.len());
    let daily_remaining = state.daily_limit - state.calls_today - 1;
    let limits = |remaining: usize| {
        vec![
            ("x-hubspot-ratelimit-max", state.max_per_window.to_string()),
            ("x-hubspot-ratelimit-remaining", remaining.to_string()),
            (
                "x-hubspot-ratelimit-interval-milliseconds",
                state.window_length.as_millis().to_string(),
            ),
            ("x-hubspot-ratelimit-daily", state.daily_limit.to_string()),
            ("x-hubspot-ratelimit-daily-remaining", daily_remaining.to_string()),
        ]
    };
    if remaining == 0 {
        let retry_after = state.retry_after_on_429.then(|| {
            let oldest = state.window.front().copied().unwrap_or(now);
            state.window_length.saturating_sub(now.duration_since(oldest))
        });
        state.calls.refused_window += 1;
        return Err(rate_limited(state, retry_after));
    }
    state.window.push_back(now);
    state.admitted_at.push(now);
    state.calls_today += 1;
    state.calls.admitted += 1;
    state.calls.max_in_any_window = state.calls.max_in_any_window.max(state.window.len());
    Ok(limits(remaining - 1))
}

/// HubSpot's 429 for a used-up window: its body, the window's headers at zero, and
/// `Retry-After` (whole seconds, at least one) if given.
fn rate_limited(state: &HubSpotState, retry_after: Option<Duration>) -> Response {
    let mut headers = vec![
        ("x-hubspot-ratelimit-max", state.max_per_window.to_string()),
        ("x-hubspot-ratelimit-remaining", "0".to_owned()),
        ("x-hubspot-ratelimit-interval-milliseconds", state.window_length.as_millis().to_string()),
    ];
    if let Some(wait) = retry_after {
        headers.push(("retry-after", wait.as_secs().max(1).to_string()));
    }
    too_many_requests("ten_secondly_rolling", "TEN_SECONDLY_ROLLING", &headers)
}

/// HubSpot's 429 for a day's calls used up: `policyName: DAILY`, the daily headers at zero.
fn daily_limit_reached(state: &HubSpotState) -> Response {
    let headers = [
        ("x-hubspot-ratelimit-daily", state.daily_limit.to_string()),
        ("x-hubspot-ratelimit-daily-remaining", "0".to_owned()),
    ];
    too_many_requests("daily", "DAILY", &headers)
}

/// HubSpot's 429 body for the limit `policy` (`limit` as its message names it), with headers.
fn too_many_requests(limit: &str, policy: &str, headers: &[(&'static str, String)]) -> Response {
    let body = json!({
        "status": "error",
        "message": format!("You have reached your {limit} limit."),
        "errorType": "RATE_LIMIT",
        "correlationId": "bbbbbbbb-0000-4000-8000-000000000000",
        "policyName": policy,
        "category": "RATE_LIMITS",
    });
    with_headers((StatusCode::TOO_MANY_REQUESTS, Json(body)).into_response(), headers)
}

fn with_headers(mut response: Response, headers: &[(&'static str, String)]) -> Response {
    for (name, value) in headers {
        response.headers_mut().insert(*name, HeaderValue::from_str(value).expect("ascii"));
    }
    response
}

fn record_json(record: &Record, new: Option<bool>) -> Value {
    let mut body = json!({
        "id": record.id.to_string(),
        "properties": record.properties,
        "createdAt": "2026-01-01T00:00:00Z",
        "updatedAt": "2026-01-01T00:00:00Z",
        "archived": false,
    });
    if let Some(new) = new {
        body["new"] = json!(new);
    }
    body
}

#[derive(Debug, Deserialize)]
struct BatchInput {
    #[serde(rename = "idProperty")]
    id_property: String,
    id: String,
    properties: BTreeMap<String, String>,
    /// A label the answer repeats on this input's result or error.
    #[serde(rename = "objectWriteTraceId", default)]
    object_write_trace_id: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Batch {
    inputs: Vec<BatchInput>,
}

/// What becomes of a request before it is applied: a scripted fault if one is queued for its
/// kind, else a random fate if chaos is set. `Err`: answer this instead, after the delay.
/// `Ok`: go on, and answer after the delay.
fn plan(state: &mut HubSpotState, access: Access) -> (Result<(), Response>, Duration) {
    let scripted = match access {
        Access::Write => state.faults.pop_front(),
        Access::Read => state.lookup_faults.pop_front(),
    };
    let (fate, latency) = match scripted {
        Some(Fault::ServerError(status)) => return (Err(server_error(status)), Duration::ZERO),
        Some(Fault::Validation) => {
            let response = error(
                StatusCode::BAD_REQUEST,
                "VALIDATION_ERROR",
                "Property values were not valid",
            );
            return (Err(response), Duration::ZERO);
        }
        Some(Fault::LostResponse(delay)) => (Fate::Delay(delay), Duration::ZERO),
        Some(Fault::RateLimited { retry_after }) => {
            return (Err(rate_limited(state, retry_after)), Duration::ZERO);
        }
        None => match state.dice.as_mut() {
            Some(dice) => dice.draw(access),
            None => (Fate::Pass, Duration::ZERO),
        },
    };
    let latency = latency + state.latency;
    match fate {
        Fate::Pass => (Ok(()), latency),
        Fate::Fail => (Err(server_error(503)), latency),
        Fate::Delay(delay) => (Ok(()), latency + delay),
        Fate::RateLimited { retry_after } => {
            let wait = retry_after.then_some(Duration::from_secs(1));
            (Err(rate_limited(state, wait)), latency)
        }
    }
}

fn server_error(status: u16) -> Response {
    error(
        StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
        "INTERNAL_ERROR",
        "internal error",
    )
}

/// Answers after `delay`.
async fn after(delay: Duration, response: Response) -> Response {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    response
}

/// The first property nobody may write, if the write sets one.
fn read_only_property<'a>(
    state: &HubSpotState,
    properties: &'a BTreeMap<String, String>,
) -> Option<&'a str> {
    properties.keys().find(|p| state.read_only.contains(*p)).map(String::as_str)
}

fn read_only_message(name: &str) -> String {
    format!(
        "Property values were not valid: \"{name}\" is a read only property; its value cannot be set."
    )
}

fn check_properties(
    state: &HubSpotState,
    properties: &BTreeMap<String, String>,
) -> Result<(), Response> {
    match read_only_property(state, properties) {
        Some(name) => {
            Err(error(StatusCode::BAD_REQUEST, "VALIDATION_ERROR", &read_only_message(name)))
        }
        None => Ok(()),
    }
}

/// One input's error in a multi-status answer: HubSpot's error body, naming the input by its
/// id and its trace id.
fn input_error(input: &BatchInput, property: &str) -> Value {
    let message = read_only_message(property);
    let mut error = json!({
        "status": "error",
        "category": "VALIDATION_ERROR",
        "message": message,
        "id": input.id,
        "context": {"ids": [input.id]},
        "errors": [{"message": message, "code": "READ_ONLY_VALUE", "in": property}],
    });
    if let Some(trace) = &input.object_write_trace_id {
        error["objectWriteTraceId"] = json!(trace);
    }
    error
}

/// Batch upsert as documented: at most [`BATCH_INPUTS_MAX`] inputs; a duplicate id, a
/// non-unique `idProperty` or a malformed body rejects the whole batch (400) before anything
/// is applied. An input with an invalid property fails alone (207, in `errors`) when every
/// input carries an `objectWriteTraceId`, as HubSpot documents multi-status answers; without
/// them it rejects the whole batch (400). Each applied input is one entry of the effect log.
/// Faults apply to the call as a whole: a 5xx or 429 before anything is applied, a lost answer
/// after every input is.
async fn batch_upsert(
    State(shared): State<Arc<Mutex<HubSpotState>>>,
    Path(object): Path<String>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let (response, delay) = 'answer: {
        let mut state = shared.lock().expect("lock");
        state.write_calls.batch_upsert += 1;
        let limits = match admit(&mut state, &headers) {
            Ok(limits) => limits,
            Err(response) => return response,
        };
        let delay = match plan(&mut state, Access::Write) {
            (Ok(()), delay) => delay,
            (Err(response), delay) => break 'answer (with_headers(response, &limits), delay),
        };
        match apply_batch(&mut state, &object, &body) {
            Ok(response) => (with_headers(response, &limits), delay),
            // A refused batch applied nothing: there is no answer to lose.
            Err(response) => return with_headers(response, &limits),
        }
    };
    after(delay, response).await
}

/// Checks a batch and applies its valid inputs; `Err`: the whole batch is refused.
fn apply_batch(state: &mut HubSpotState, object: &str, body: &str) -> Result<Response, Response> {
    let Ok(batch) = serde_json::from_str::<Batch>(body) else {
        return Err(error(StatusCode::BAD_REQUEST, "VALIDATION_ERROR", "Invalid input JSON"));
    };
    if batch.inputs.len() > BATCH_INPUTS_MAX {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "VALIDATION_ERROR",
            &format!(
                "Batch input size {} exceeds the limit of {BATCH_INPUTS_MAX} inputs",
                batch.inputs.len()
            ),
        ));
    }
    let ids: HashSet<(&str, &str)> =
        batch.inputs.iter().map(|i| (i.id_property.as_str(), i.id.as_str())).collect();
    if ids.len() != batch.inputs.len() {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "VALIDATION_ERROR",
            "Duplicate IDs found in batch input",
        ));
    }
    for input in &batch.inputs {
        let unique =
            state.unique_properties.get(object).is_some_and(|u| u.contains(&input.id_property));
        if !unique {
            let type_id = if object == "contacts" { "0-1" } else { "0-2" };
            let message = format!(
                "Unable to perform update/upsert by non-unique {type_id} property {} in portal ID 21939747",
                input.id_property
            );
            return Err(error(StatusCode::BAD_REQUEST, "VALIDATION_ERROR", &message));
        }
    }
    let multi_status = batch.inputs.iter().all(|i| i.object_write_trace_id.is_some());
    let mut errors = Vec::new();
    let mut valid = Vec::new();
    for input in batch.inputs {
        match read_only_property(state, &input.properties) {
            None => valid.push(input),
            Some(name) if multi_status => errors.push(input_error(&input, name)),
            Some(name) => {
                return Err(error(
                    StatusCode::BAD_REQUEST,
                    "VALIDATION_ERROR",
                    &read_only_message(name),
                ));
            }
        }
    }
    let mut results = Vec::new();
    for input in valid {
        let existing = state.records.iter().position(|r| {
            r.object == object && r.properties.get(&input.id_property) == Some(&input.id)
        });
        state.writes.push(Write {
            object: object.to_owned(),
            id: input.id.clone(),
            properties: input.properties.clone(),
        });
        let (index, new) = match existing {
            Some(index) => {
                state.records[index].properties.extend(input.properties);
                state.records[index].updated = Instant::now();
                (index, false)
            }
            None => {
                state.next_id += 1;
                let mut properties = input.properties;
                properties.insert(input.id_property.clone(), input.id.clone());
                let id = state.next_id;
                state.records.push(Record {
                    id,
                    object: object.to_owned(),
                    properties,
                    updated: Instant::now(),
                });
                (state.records.len() - 1, true)
            }
        };
        let mut result = record_json(&state.records[index], Some(new));
        if let Some(trace) = input.object_write_trace_id {
            result["objectWriteTraceId"] = json!(trace);
        }
        results.push(result);
    }
    if state.results_reversed {
        results.reverse();
    }
    let mut body = json!({
        "status": "COMPLETE",
        "results": results,
        "requestedAt": "2026-01-01T00:00:00Z",
        "startedAt": "2026-01-01T00:00:00Z",
        "completedAt": "2026-01-01T00:00:00Z",
    });
    if errors.is_empty() {
        return Ok(Json(body).into_response());
    }
    body["numErrors"] = json!(errors.len());
    body["errors"] = json!(errors);
    Ok((StatusCode::MULTI_STATUS, Json(body)).into_response())
}

fn find(state: &HubSpotState, object: &str, id: &str, id_property: Option<&str>) -> Option<usize> {
    state.records.iter().position(|r| {
        r.object == object
            && match id_property {
                Some(property) => r.properties.get(property).map(String::as_str) == Some(id),
                None => r.id.to_string() == id,
            }
    })
}

/// A page of records, as `GET /crm/v3/objects/{type}?limit=N` answers.
async fn list(
    State(shared): State<Arc<Mutex<HubSpotState>>>,
    Path(object): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let mut state = shared.lock().expect("lock");
    let limits = match admit(&mut state, &headers) {
        Ok(limits) => limits,
        Err(response) => return response,
    };
    let limit = query.get("limit").and_then(|l| l.parse().ok()).unwrap_or(10usize);
    let results: Vec<Value> = state
        .records
        .iter()
        .filter(|r| r.object == object)
        .take(limit)
        .map(|r| record_json(r, None))
        .collect();
    with_headers(Json(json!({"results": results})).into_response(), &limits)
}

async fn read(
    State(shared): State<Arc<Mutex<HubSpotState>>>,
    Path((object, id)): Path<(String, String)>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let (response, delay) = {
        let mut state = shared.lock().expect("lock");
        match plan(&mut state, Access::Read) {
            (Ok(()), delay) => (read_record(&mut state, &object, &id, &query, &headers), delay),
            (Err(response), delay) => (response, delay),
        }
    };
    after(delay, response).await
}

fn read_record(
    state: &mut HubSpotState,
    object: &str,
    id: &str,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Response {
    let limits = match admit(state, headers) {
        Ok(limits) => limits,
        Err(response) => return response,
    };
    let Some(index) = find(state, object, id, query.get("idProperty").map(String::as_str)) else {
        return with_headers(
            error(StatusCode::NOT_FOUND, "OBJECT_NOT_FOUND", "resource not found"),
            &limits,
        );
    };
    let record = &state.records[index];
    let wanted: Option<HashSet<&str>> = query.get("properties").map(|p| p.split(',').collect());
    let properties: BTreeMap<&String, &String> = record
        .properties
        .iter()
        .filter(|(name, _)| wanted.as_ref().is_none_or(|w| w.contains(name.as_str())))
        .collect();
    let body = json!({"id": record.id.to_string(), "properties": properties, "archived": false});
    with_headers(Json(body).into_response(), &limits)
}

#[derive(Debug, Deserialize)]
struct PropertiesBody {
    properties: BTreeMap<String, String>,
}

async fn update(
    State(shared): State<Arc<Mutex<HubSpotState>>>,
    Path((object, id)): Path<(String, String)>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let mut state = shared.lock().expect("lock");
    state.write_calls.update += 1;
    let limits = match admit(&mut state, &headers) {
        Ok(limits) => limits,
        Err(response) => return response,
    };
    if let (Err(response), _) = plan(&mut state, Access::Write) {
        return with_headers(response, &limits);
    }
    let Ok(body) = serde_json::from_str::<PropertiesBody>(&body) else {
        return with_headers(
            error(StatusCode::BAD_REQUEST, "VALIDATION_ERROR", "Invalid input JSON"),
            &limits,
        );
    };
    if let Err(response) = check_properties(&state, &body.properties) {
        return with_headers(response, &limits);
    }
    // Update by a unique property never creates: it is not an upsert.
    let Some(index) = find(&state, &object, &id, query.get("idProperty").map(String::as_str))
    else {
        return with_headers(
            error(StatusCode::NOT_FOUND, "OBJECT_NOT_FOUND", "resource not found"),
            &limits,
        );
    };
    state.writes.push(Write { object: object.clone(), id, properties: body.properties.clone() });
    state.records[index].properties.extend(body.properties);
    state.records[index].updated = Instant::now();
    let record = record_json(&state.records[index], None);
    with_headers(Json(record).into_response(), &limits)
}

#[derive(Debug, Deserialize)]
struct SearchBody {
    #[serde(rename = "filterGroups", default)]
    filter_groups: Vec<FilterGroup>,
}

#[derive(Debug, Deserialize)]
struct FilterGroup {
    filters: Vec<Filter>,
}

#[derive(Debug, Deserialize)]
struct Filter {
    #[serde(rename = "propertyName")]
    property_name: String,
    operator: String,
    value: String,
}

/// Search, eventually consistent: records changed within `search_lag` are not found yet.
async fn search(
    State(shared): State<Arc<Mutex<HubSpotState>>>,
    Path(object): Path<String>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let mut state = shared.lock().expect("lock");
    if let Err(response) = admit(&mut state, &headers) {
        return response;
    }
    let Ok(search) = serde_json::from_str::<SearchBody>(&body) else {
        return error(StatusCode::BAD_REQUEST, "VALIDATION_ERROR", "Invalid input JSON");
    };
    let now = Instant::now();
    let results: Vec<Value> = state
        .records
        .iter()
        .filter(|r| r.object == object && now.duration_since(r.updated) >= state.search_lag)
        .filter(|r| {
            search.filter_groups.is_empty()
                || search.filter_groups.iter().any(|group| {
                    group.filters.iter().all(|f| {
                        f.operator == "EQ" && r.properties.get(&f.property_name) == Some(&f.value)
                    })
                })
        })
        .map(|r| record_json(r, None))
        .collect();
    // Search answers carry only the correlation id, no rate-limit headers.
    Json(json!({"total": results.len(), "results": results})).into_response()
}
