//! A fake in-house REST CRM: the kind of plain JSON API that `kind: http` (the declarative
//! REST connector) reaches with settings alone. This is its documented API.
//!
//! # Authentication
//! Every call except the token endpoint carries one of:
//! - `Authorization: Bearer <token>`, with a token from `POST /oauth/token` that has not
//!   expired, or the static personal token [`STATIC_TOKEN`];
//! - `X-Api-Key: <key>`, the static [`API_KEY`] (when [`RestState::api_key`] is set).
//!
//! Anything else is `401 {"error": "unauthorized", "message": ...}` with
//! `WWW-Authenticate: Bearer error="invalid_token"`.
//!
//! `POST /oauth/token`, form-encoded (`application/x-www-form-urlencoded`), the OAuth 2.0
//! client credentials grant: `grant_type=client_credentials`, the client's id and secret in
//! the form (`client_id`, `client_secret`) or as HTTP Basic, and an optional `scope`.
//! - `200 {"access_token": "...", "token_type": "Bearer", "expires_in": <seconds>}`; tokens
//!   stop working after [`RestState::token_lifetime`];
//! - `400 {"error": "unsupported_grant_type"}` for another grant;
//! - `401 {"error": "invalid_client"}` for an unknown client or a wrong secret.
//!
//! # Records
//! A record belongs to an object type and is identified by one external id, a (field, value)
//! pair: there is at most one record per (object, field, value), ever.
//!
//! `PUT /objects/{object}/by/{field}/{value}` with `{"fields": {"name": "value", ...}}`
//! (string values only) creates or updates that record:
//! - `201 {"id": "rec_...", "object": ..., "fields": {...}}` when it created the record,
//!   `200` with the same shape when it updated it; `fields` holds every field of the record,
//!   the external id field included;
//! - with `?mode=update` it never creates: `404 {"error": "not_found"}` when there is no
//!   record;
//! - `Idempotency-Key: <key>`: a key seen before gets the first answer again and writes
//!   nothing (only an applied write's answer is remembered, not a refusal);
//! - `422 {"error": "validation", "message": ...}` for a body that is not a JSON object with
//!   a `fields` object of strings.
//!
//! `GET /objects/{object}/by/{field}/{value}`: `200` with the record as above, or
//! `404 {"error": "not_found"}`.
//!
//! `GET /health`: `200 {"status": "ok"}` for an authenticated caller.
//!
//! Overload: `429 {"error": "rate_limited"}` with `Retry-After` (seconds or an HTTP date) when
//! it has one to give; `503 {"error": "unavailable"}`.
//!
//! # For tests
//! Scripted one-shot [`Fault`]s for the next writes and, separately, the next lookups; random
//! ones with [`FakeRest::set_chaos`]; the effect log [`FakeRest::writes`]; and every request
//! seen, headers included ([`FakeRest::requests`]), to check what a client sent.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine;
use serde_json::{Value, json};

use crate::Running;
use crate::chaos::{Access, Chaos, Dice, Fate};

/// The OAuth client the fake knows.
pub const CLIENT_ID: &str = "hookgate-fake-client";
pub const CLIENT_SECRET: &str = "fake-client-secret";
/// The static API key accepted in `X-Api-Key`.
pub const API_KEY: &str = "fake-rest-api-key";
/// A bearer token that never expires, like a personal access token.
pub const STATIC_TOKEN: &str = "fake-rest-personal-token";
/// How long issued tokens work unless a test changes [`RestState::token_lifetime`].
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(3600);
/// Requests kept in [`RestState::requests`]; older ones are dropped so that a long chaos run
/// does not grow without bound.
pub const REQUESTS_KEPT_MAX: usize = 1000;

/// A one-shot failure served to the next write (or lookup) instead of its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// This 5xx with `{"error": "unavailable"}`; nothing applied.
    ServerError(u16),
    /// 429 with `Retry-After: <this>` if given (seconds or an HTTP date); nothing applied.
    RateLimited { retry_after: Option<String> },
    /// 422 `validation`, as for a bad value; nothing applied.
    Validation,
    /// Apply the write (a lookup: read), then answer only after this delay, longer than a
    /// client waits.
    LostResponse(Duration),
    /// Apply the write, then close the connection without answering.
    ConnectionDropped,
}

/// One write the fake applied, in the order applied: the effect log tests judge by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    pub object: String,
    /// The external id: field and value.
    pub field: String,
    pub value: String,
    /// The fields the write set.
    pub fields: BTreeMap<String, String>,
    pub idempotency_key: Option<String>,
    /// Whether it created the record.
    pub created: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub id: String,
    pub object: String,
    pub field: String,
    pub value: String,
    /// Every field, the external id field included.
    pub fields: BTreeMap<String, String>,
}

/// A request as the fake received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub method: String,
    /// Path and query, as sent (still percent-encoded).
    pub uri: String,
    /// Header names in lowercase.
    pub headers: BTreeMap<String, String>,
    pub body: String,
}

#[derive(Debug)]
pub struct RestState {
    pub client_id: String,
    pub client_secret: String,
    /// The key accepted in `X-Api-Key`; `None` turns key authentication off.
    pub api_key: Option<String>,
    /// How long an issued token works.
    pub token_lifetime: Duration,
    /// Issued tokens and when each stops working.
    tokens: HashMap<String, Instant>,
    /// Token requests answered 200.
    pub token_requests: u64,
    /// Calls refused for a bearer token that is unknown or expired.
    pub tokens_refused: u64,
    pub records: Vec<Record>,
    /// The first answer to each idempotency key.
    idempotent_answers: HashMap<String, (StatusCode, Value)>,
    /// Served, one each, to the next writes instead of their answers.
    pub faults: VecDeque<Fault>,
    /// Served, one each, to the next lookups.
    pub lookup_faults: VecDeque<Fault>,
    /// Random faults, when set with [`FakeRest::set_chaos`].
    dice: Option<Dice>,
    /// Every write applied, in order.
    pub writes: Vec<Write>,
    /// The last [`REQUESTS_KEPT_MAX`] requests, in order.
    pub requests: VecDeque<Seen>,
    next_id: u64,
    next_request_id: u64,
}

#[derive(Debug, Clone)]
pub struct FakeRest {
    pub state: Arc<Mutex<RestState>>,
    pub base_url: String,
    /// Held so the server stops when the last clone is dropped.
    _server: Arc<Running>,
}

impl FakeRest {
    pub async fn start() -> FakeRest {
        let (listener, base_url) = crate::bind().await;
        let state = Arc::new(Mutex::new(RestState {
            client_id: CLIENT_ID.into(),
            client_secret: CLIENT_SECRET.into(),
            api_key: Some(API_KEY.into()),
            token_lifetime: TOKEN_LIFETIME,
            tokens: HashMap::new(),
            token_requests: 0,
            tokens_refused: 0,
            records: Vec::new(),
            idempotent_answers: HashMap::new(),
            faults: VecDeque::new(),
            lookup_faults: VecDeque::new(),
            dice: None,
            writes: Vec::new(),
            requests: VecDeque::new(),
            next_id: 500,
            next_request_id: 0,
        }));
        let router = Router::new()
            .route("/oauth/token", post(token))
            .route("/health", get(health))
            .route("/objects/{object}/by/{field}/{value}", get(read).put(upsert))
            .with_state(Arc::clone(&state));
        let running = crate::spawn(listener, base_url.clone(), router);
        FakeRest { state, base_url, _server: Arc::new(running) }
    }

    pub fn lock(&self) -> MutexGuard<'_, RestState> {
        self.state.lock().expect("the fake's lock is never poisoned")
    }

    pub fn push_fault(&self, fault: Fault) {
        self.lock().faults.push_back(fault);
    }

    pub fn push_lookup_fault(&self, fault: Fault) {
        self.lock().lookup_faults.push_back(fault);
    }

    /// Every issued token stops working: the next call with one answers 401.
    pub fn expire_tokens(&self) {
        self.lock().tokens.clear();
    }

    pub fn records(&self, object: &str) -> Vec<Record> {
        self.lock().records.iter().filter(|r| r.object == object).cloned().collect()
    }

    pub fn writes(&self) -> Vec<Write> {
        self.lock().writes.clone()
    }

    pub fn requests(&self) -> Vec<Seen> {
        self.lock().requests.iter().cloned().collect()
    }

    /// From now on, every request draws a random fate (after any scripted fault).
    pub fn set_chaos(&self, chaos: Chaos) {
        self.lock().dice = Some(Dice::new(chaos));
    }

    /// How many requests met each random fault so far.
    pub fn injected(&self) -> BTreeMap<String, u64> {
        self.lock().dice.as_ref().map(Dice::injected).unwrap_or_default()
    }
}

fn error(status: StatusCode, error: &str, message: &str) -> Response {
    (status, Json(json!({"error": error, "message": message}))).into_response()
}

fn remember(state: &mut RestState, method: &Method, uri: &Uri, headers: &HeaderMap, body: &str) {
    let headers = headers
        .iter()
        .map(|(name, value)| {
            (name.as_str().to_owned(), String::from_utf8_lossy(value.as_bytes()).into_owned())
        })
        .collect();
    let uri = uri.path_and_query().map(|p| p.as_str().to_owned()).unwrap_or_default();
    if state.requests.len() >= REQUESTS_KEPT_MAX {
        state.requests.pop_front();
    }
    state.requests.push_back(Seen {
        method: method.as_str().to_owned(),
        uri,
        headers,
        body: body.to_owned(),
    });
}

/// A valid bearer token or API key, or the 401 to answer.
fn authenticate(state: &mut RestState, headers: &HeaderMap) -> Result<(), Response> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let (Some(key), Some(expected)) = (header("x-api-key"), state.api_key.as_deref()) {
        if key == expected {
            return Ok(());
        }
        return Err(unauthorized("unknown API key"));
    }
    let Some(token) = header("authorization").and_then(|v| v.strip_prefix("Bearer ")) else {
        return Err(unauthorized("a bearer token or an API key is required"));
    };
    if token == STATIC_TOKEN {
        return Ok(());
    }
    match state.tokens.get(token) {
        Some(expires) if Instant::now() < *expires => Ok(()),
        Some(_) => {
            state.tokens_refused += 1;
            Err(unauthorized("the token has expired"))
        }
        None => {
            state.tokens_refused += 1;
            Err(unauthorized("unknown token"))
        }
    }
}

fn unauthorized(message: &str) -> Response {
    let mut response = error(StatusCode::UNAUTHORIZED, "unauthorized", message);
    response
        .headers_mut()
        .insert("www-authenticate", HeaderValue::from_static("Bearer error=\"invalid_token\""));
    response
}

fn rate_limited(retry_after: Option<&str>) -> Response {
    let mut response = error(StatusCode::TOO_MANY_REQUESTS, "rate_limited", "slow down");
    if let Some(value) = retry_after.and_then(|v| HeaderValue::from_str(v).ok()) {
        response.headers_mut().insert("retry-after", value);
    }
    response
}

fn unavailable(status: u16) -> Response {
    error(
        StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
        "unavailable",
        "try again later",
    )
}

/// What happens to a request after authentication.
enum Plan {
    /// Go on, and answer after this delay.
    Go(Duration),
    /// Go on, then close the connection instead of answering.
    Drop,
    /// Answer this instead, applying nothing.
    Refuse(Response),
}

/// A scripted fault if one is queued for this kind of access, else a random fate if chaos is
/// set.
fn plan(state: &mut RestState, access: Access) -> Plan {
    let scripted = match access {
        Access::Write => state.faults.pop_front(),
        Access::Read => state.lookup_faults.pop_front(),
    };
    match scripted {
        Some(Fault::ServerError(status)) => return Plan::Refuse(unavailable(status)),
        Some(Fault::RateLimited { retry_after }) => {
            return Plan::Refuse(rate_limited(retry_after.as_deref()));
        }
        Some(Fault::Validation) => {
            return Plan::Refuse(error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "validation",
                "a field value was not valid",
            ));
        }
        Some(Fault::LostResponse(delay)) => return Plan::Go(delay),
        Some(Fault::ConnectionDropped) => return Plan::Drop,
        None => {}
    }
    let Some(dice) = state.dice.as_mut() else { return Plan::Go(Duration::ZERO) };
    match dice.draw(access) {
        (Fate::Pass, latency) => Plan::Go(latency),
        (Fate::Fail, _) => Plan::Refuse(unavailable(503)),
        (Fate::Delay(delay), latency) => Plan::Go(latency + delay),
        (Fate::RateLimited { retry_after }, _) => {
            Plan::Refuse(rate_limited(retry_after.then_some("1")))
        }
    }
}

/// How an applied request's answer reaches the client.
enum Delivery {
    After(Duration),
    /// Never: the connection closes instead.
    Dropped,
}

/// Answers after the delay; or, for a dropped connection, never: the connection task unwinds,
/// which closes the socket before a byte of the answer is written. `resume_unwind` rather than
/// `panic!` so the panic hook does not print a backtrace for a fault the test asked for; it
/// only ever runs with the state's lock released, so the lock is not poisoned.
async fn answer(delivery: Delivery, response: Response) -> Response {
    match delivery {
        Delivery::After(delay) => {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            response
        }
        Delivery::Dropped => {
            std::panic::resume_unwind(Box::new("connection dropped by a scripted fault"))
        }
    }
}

/// Every answer about records carries a request id, as support desks ask for one.
fn with_request_id(state: &mut RestState, mut response: Response) -> Response {
    state.next_request_id += 1;
    let id = format!("req-{}", state.next_request_id);
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert("x-request-id", value);
    }
    response
}

async fn token(
    State(shared): State<Arc<Mutex<RestState>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: String,
) -> Response {
    let mut state = shared.lock().expect("lock");
    remember(&mut state, &method, &uri, &headers, &body);
    let form: HashMap<String, String> = url::form_urlencoded::parse(body.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    if form.get("grant_type").map(String::as_str) != Some("client_credentials") {
        return (StatusCode::BAD_REQUEST, Json(json!({"error": "unsupported_grant_type"})))
            .into_response();
    }
    let basic = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|v| base64::engine::general_purpose::STANDARD.decode(v).ok())
        .and_then(|v| String::from_utf8(v).ok());
    // RFC 6749 §2.3.1: in HTTP Basic, the id and the secret are each form-encoded first.
    let form_decoded = |part: &str| -> String {
        url::form_urlencoded::parse(format!("v={}", part.replace('&', "%26")).as_bytes())
            .map(|(_, v)| v.into_owned())
            .collect()
    };
    let (id, secret) = match &basic {
        Some(pair) => {
            let (id, secret) = pair.split_once(':').unwrap_or((pair.as_str(), ""));
            (form_decoded(id), form_decoded(secret))
        }
        None => (
            form.get("client_id").cloned().unwrap_or_default(),
            form.get("client_secret").cloned().unwrap_or_default(),
        ),
    };
    if id != state.client_id || secret != state.client_secret {
        return (StatusCode::UNAUTHORIZED, Json(json!({"error": "invalid_client"})))
            .into_response();
    }
    state.token_requests += 1;
    let token = format!("fake-rest-token-{}", state.token_requests);
    let lifetime = state.token_lifetime;
    state.tokens.insert(token.clone(), Instant::now() + lifetime);
    let mut answer = json!({
        "access_token": token,
        "token_type": "Bearer",
        // Whole seconds, at least one, as token endpoints answer.
        "expires_in": lifetime.as_secs_f64().ceil().max(1.0) as u64,
    });
    if let Some(scope) = form.get("scope") {
        answer["scope"] = json!(scope);
    }
    Json(answer).into_response()
}

async fn health(
    State(shared): State<Arc<Mutex<RestState>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let mut state = shared.lock().expect("lock");
    remember(&mut state, &method, &uri, &headers, "");
    match authenticate(&mut state, &headers) {
        Ok(()) => Json(json!({"status": "ok"})).into_response(),
        Err(response) => response,
    }
}

fn record_json(record: &Record) -> Value {
    json!({"id": record.id, "object": record.object, "fields": record.fields})
}

fn find(state: &RestState, object: &str, field: &str, value: &str) -> Option<usize> {
    state.records.iter().position(|r| r.object == object && r.field == field && r.value == value)
}

/// The `fields` of a write's body, or why it is refused.
fn fields_of(body: &str) -> Result<BTreeMap<String, String>, &'static str> {
    let Ok(Value::Object(mut body)) = serde_json::from_str::<Value>(body) else {
        return Err("the body must be a JSON object");
    };
    let Some(Value::Object(fields)) = body.remove("fields") else {
        return Err("`fields` must be an object");
    };
    fields
        .into_iter()
        .map(|(name, value)| match value {
            Value::String(value) => Ok((name, value)),
            _ => Err("every value in `fields` must be a string"),
        })
        .collect()
}

/// One write to a record by its external id.
struct Put {
    object: String,
    field: String,
    value: String,
    update_only: bool,
    idempotency_key: Option<String>,
    body: String,
}

async fn upsert(
    State(shared): State<Arc<Mutex<RestState>>>,
    Path((object, field, value)): Path<(String, String, String)>,
    Query(query): Query<HashMap<String, String>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: String,
) -> Response {
    let (delivery, response) = {
        let mut state = shared.lock().expect("lock");
        remember(&mut state, &method, &uri, &headers, &body);
        let put = Put {
            object,
            field,
            value,
            update_only: query.get("mode").map(String::as_str) == Some("update"),
            idempotency_key: headers
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            body,
        };
        let (delivery, response) = match authenticate(&mut state, &headers) {
            Ok(()) => apply(&mut state, put),
            Err(response) => (Delivery::After(Duration::ZERO), response),
        };
        (delivery, with_request_id(&mut state, response))
    };
    answer(delivery, response).await
}

fn apply(state: &mut RestState, put: Put) -> (Delivery, Response) {
    let now = Delivery::After(Duration::ZERO);
    let delivery = match plan(state, Access::Write) {
        Plan::Go(delay) => Delivery::After(delay),
        Plan::Drop => Delivery::Dropped,
        Plan::Refuse(response) => return (now, response),
    };
    let key = put.idempotency_key;
    if let Some((status, body)) = key.as_ref().and_then(|k| state.idempotent_answers.get(k)) {
        return (delivery, (*status, Json(body.clone())).into_response());
    }
    let fields = match fields_of(&put.body) {
        Ok(fields) => fields,
        Err(message) => {
            return (now, error(StatusCode::UNPROCESSABLE_ENTITY, "validation", message));
        }
    };
    let existing = find(state, &put.object, &put.field, &put.value);
    if existing.is_none() && put.update_only {
        return (now, error(StatusCode::NOT_FOUND, "not_found", "no record to update"));
    }
    state.writes.push(Write {
        object: put.object.clone(),
        field: put.field.clone(),
        value: put.value.clone(),
        fields: fields.clone(),
        idempotency_key: key.clone(),
        created: existing.is_none(),
    });
    let (index, status) = match existing {
        Some(index) => {
            state.records[index].fields.extend(fields);
            (index, StatusCode::OK)
        }
        None => {
            state.next_id += 1;
            let mut all = fields;
            all.insert(put.field.clone(), put.value.clone());
            let id = format!("rec_{}", state.next_id);
            let Put { object, field, value, .. } = put;
            state.records.push(Record { id, object, field, value, fields: all });
            (state.records.len() - 1, StatusCode::CREATED)
        }
    };
    let body = record_json(&state.records[index]);
    if let Some(key) = key {
        state.idempotent_answers.insert(key, (status, body.clone()));
    }
    (delivery, (status, Json(body)).into_response())
}

async fn read(
    State(shared): State<Arc<Mutex<RestState>>>,
    Path((object, field, value)): Path<(String, String, String)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let (delivery, response) = {
        let mut state = shared.lock().expect("lock");
        remember(&mut state, &method, &uri, &headers, "");
        let (delivery, response) = match authenticate(&mut state, &headers) {
            Ok(()) => look_up(&mut state, &object, &field, &value),
            Err(response) => (Delivery::After(Duration::ZERO), response),
        };
        (delivery, with_request_id(&mut state, response))
    };
    answer(delivery, response).await
}

fn look_up(state: &mut RestState, object: &str, field: &str, value: &str) -> (Delivery, Response) {
    let delivery = match plan(state, Access::Read) {
        Plan::Go(delay) => Delivery::After(delay),
        Plan::Drop => Delivery::Dropped,
        Plan::Refuse(response) => return (Delivery::After(Duration::ZERO), response),
    };
    let response = match find(state, object, field, value) {
        Some(index) => Json(record_json(&state.records[index])).into_response(),
        None => error(StatusCode::NOT_FOUND, "not_found", "no such record"),
    };
    (delivery, response)
}
