//! A fake Salesforce REST API.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch, post};
use axum::{Json, Router};
use serde_json::{Value, json};

use crate::Running;
use crate::chaos::{Access, Chaos, Dice, Fate};

/// A one-shot failure, served to the next write (upsert) instead of its normal answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// 503 with an HTML page, as the edge sends during an outage.
    Html503,
    /// 503 `SERVER_UNAVAILABLE`.
    Json503,
    /// 400 `UNABLE_TO_LOCK_ROW`.
    LockRow,
    /// 400 `FIELD_CUSTOM_VALIDATION_EXCEPTION`.
    Validation,
    /// Apply the write (or read), then answer only after this delay (longer than the client
    /// waits).
    LostResponse(Duration),
    /// 403 `REQUEST_LIMIT_EXCEEDED`, as when the org's API calls are used up.
    RequestLimit,
}

/// One write the fake applied, in the order applied: the effect log that tests and
/// `cargo xtask chaos` judge by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    pub object: String,
    /// The external id's value.
    pub id: String,
    /// The fields the write set, as text.
    pub fields: BTreeMap<String, String>,
}

/// Write requests received, by endpoint, whatever their answer: a test tells one collection
/// call from one call per record by them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteCalls {
    /// `PATCH …/sobjects/{object}/{field}/{value}`.
    pub upsert: u64,
    /// `PATCH …/composite/sobjects/{object}/{field}`, of any number of records.
    pub collection_upsert: u64,
}

/// Records one sObject Collections call may carry; more answer 400 `EXCEEDED_ID_LIMIT`.
pub const COLLECTION_RECORDS_MAX: usize = 200;

/// The first API version with sObject Collections upsert.
const COLLECTIONS_SINCE_VERSION: f64 = 46.0;

#[derive(Debug, Clone)]
pub struct Record {
    pub id: String,
    pub object: String,
    pub fields: BTreeMap<String, Value>,
}

#[derive(Debug)]
pub struct SalesforceState {
    /// The login URL and instance URL: this fake.
    pub base_url: String,
    pub client_id: String,
    pub client_secret: String,
    /// The connected app's certificate key, checking JWT bearer assertions.
    pub jwt_public_key: String,
    pub jwt_username: String,
    /// Tokens that are still valid; emptied to simulate expiry.
    pub valid_tokens: HashSet<String>,
    pub token_requests: u64,
    pub records: Vec<Record>,
    /// Objects the org has; others answer 404 `NOT_FOUND`.
    pub objects: HashSet<String>,
    /// With `false`, [`FakeSalesforce::insert_duplicate`] may create several records with one
    /// external id, and writes to it answer 300.
    pub ext_id_unique: bool,
    /// Calls allowed per day; past it, 403 `REQUEST_LIMIT_EXCEEDED`.
    pub daily_limit: u64,
    pub calls_today: u64,
    /// Fields a new record must have, per object.
    pub required_fields: HashMap<String, Vec<String>>,
    /// Served, one each, to the next writes instead of their answers.
    pub faults: VecDeque<Fault>,
    /// Served, one each, to the next lookups.
    pub lookup_faults: VecDeque<Fault>,
    /// Random faults, when set with [`FakeSalesforce::set_chaos`].
    dice: Option<Dice>,
    /// Every write applied, in order.
    pub writes: Vec<Write>,
    /// Write requests received, by endpoint.
    pub write_calls: WriteCalls,
    next_id: u64,
}

/// A fake Salesforce org on loopback. `base_url` is both the login URL and the instance URL.
#[derive(Debug, Clone)]
pub struct FakeSalesforce {
    pub state: Arc<Mutex<SalesforceState>>,
    pub base_url: String,
    /// Held so the server stops when the last clone is dropped.
    _server: Arc<Running>,
}

pub const CLIENT_ID: &str = "3MVG9fake-client-id";
pub const CLIENT_SECRET: &str = "fake-client-secret";
/// The user JWT bearer assertions must name.
pub const JWT_USERNAME: &str = "integration@example.com";
/// A key pair made for these tests only (`openssl genrsa 2048`); it protects nothing.
pub const JWT_TEST_PRIVATE_KEY: &str = include_str!("../keys/jwt-test-private.pem");
pub const JWT_TEST_PUBLIC_KEY: &str = include_str!("../keys/jwt-test-public.pem");

impl FakeSalesforce {
    pub async fn start() -> FakeSalesforce {
        let (listener, base_url) = crate::bind().await;
        let state = Arc::new(Mutex::new(SalesforceState {
            base_url: base_url.clone(),
            client_id: CLIENT_ID.into(),
            client_secret: CLIENT_SECRET.into(),
            jwt_public_key: JWT_TEST_PUBLIC_KEY.into(),
            jwt_username: JWT_USERNAME.into(),
            valid_tokens: HashSet::new(),
            token_requests: 0,
            records: Vec::new(),
            objects: ["Account", "Contact", "Lead", "Customer__c", "Patient__c"]
                .into_iter()
                .map(String::from)
                .collect(),
            ext_id_unique: true,
            daily_limit: 15_000,
            calls_today: 0,
            required_fields: HashMap::from([("Contact".to_owned(), vec!["LastName".to_owned()])]),
            faults: VecDeque::new(),
            lookup_faults: VecDeque::new(),
            dice: None,
            writes: Vec::new(),
            write_calls: WriteCalls::default(),
            next_id: 1,
        }));
        let router = Router::new()
            .route("/services/oauth2/token", post(token))
            .route("/services/data/", get(versions))
            .route(
                "/services/data/{version}/sobjects/{object}/{field}/{value}",
                get(lookup).patch(upsert),
            )
            .route(
                "/services/data/{version}/composite/sobjects/{object}/{field}",
                patch(collection_upsert),
            )
            .with_state(Arc::clone(&state));
        let running = crate::spawn(listener, base_url.clone(), router);
        FakeSalesforce { state, base_url, _server: Arc::new(running) }
    }

    pub fn lock(&self) -> MutexGuard<'_, SalesforceState> {
        self.state.lock().expect("the fake's lock is never poisoned")
    }

    /// Every issued token stops working: the next call answers 401 `INVALID_SESSION_ID`.
    pub fn expire_tokens(&self) {
        self.lock().valid_tokens.clear();
    }

    pub fn push_fault(&self, fault: Fault) {
        self.lock().faults.push_back(fault);
    }

    /// Creates a second record with an existing external id (possible only when the field is
    /// not unique), so writes to it answer 300.
    pub fn insert_duplicate(&self, object: &str, field: &str, value: &str) {
        let mut state = self.lock();
        assert!(!state.ext_id_unique, "a unique external id cannot have duplicates");
        let id = state.new_id(object);
        state.records.push(Record {
            id,
            object: object.into(),
            fields: BTreeMap::from([(field.into(), json!(value))]),
        });
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

    /// Write requests received so far, by endpoint.
    pub fn write_calls(&self) -> WriteCalls {
        self.lock().write_calls
    }
}

impl SalesforceState {
    fn new_id(&mut self, object: &str) -> String {
        let prefix = match object {
            "Account" => "001",
            "Contact" => "003",
            "Lead" => "00Q",
            _ => "a0B",
        };
        self.next_id += 1;
        format!("{prefix}Dn0000{:09}AAA", self.next_id)
    }

    fn matching(&self, object: &str, field: &str, value: &str) -> Vec<usize> {
        self.records
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                r.object == object && r.fields.get(field).and_then(Value::as_str) == Some(value)
            })
            .map(|(i, _)| i)
            .collect()
    }
}

fn error(status: StatusCode, code: &str, message: &str, limit: Option<&str>) -> Response {
    let mut response =
        (status, Json(json!([{"message": message, "errorCode": code}]))).into_response();
    if let Some(limit) = limit {
        response = with_limit(response, limit);
    }
    response
}

async fn token(State(state): State<Arc<Mutex<SalesforceState>>>, body: String) -> Response {
    let form: HashMap<String, String> =
        url::form_urlencoded::parse(body.as_bytes()).into_owned().collect();
    let mut state = state.lock().expect("lock");
    state.token_requests += 1;
    let refuse = |error: &str, description: &str| {
        let body = json!({"error": error, "error_description": description});
        (StatusCode::BAD_REQUEST, Json(body)).into_response()
    };
    match form.get("grant_type").map(String::as_str) {
        Some("client_credentials") => {
            if form.get("client_id") != Some(&state.client_id)
                || form.get("client_secret") != Some(&state.client_secret)
            {
                return refuse("invalid_client", "invalid client credentials");
            }
        }
        Some("urn:ietf:params:oauth:grant-type:jwt-bearer") => {
            let assertion = form.get("assertion").map(String::as_str).unwrap_or_default();
            if let Err(description) = check_assertion(&state, assertion) {
                return refuse("invalid_grant", &description);
            }
        }
        _ => return refuse("unsupported_grant_type", "grant type not supported"),
    }
    let token = format!("00DFAKE!{}", state.token_requests);
    state.valid_tokens.insert(token.clone());
    // The instance URL is this fake itself, like a My Domain URL.
    Json(json!({
        "access_token": token,
        "instance_url": state.base_url,
        "id": "https://login.salesforce.com/id/00DFAKE/005FAKE",
        "token_type": "Bearer",
        "issued_at": "1700000000000",
        "signature": "fake",
    }))
    .into_response()
}

/// Checks a JWT bearer assertion as Salesforce does: RS256 by the app's key, `iss` the app,
/// `sub` a user, `aud` the login host, and not expired.
fn check_assertion(state: &SalesforceState, assertion: &str) -> Result<(), String> {
    #[derive(serde::Deserialize)]
    struct Claims {
        iss: String,
        sub: String,
    }
    let key = jsonwebtoken::DecodingKey::from_rsa_pem(state.jwt_public_key.as_bytes())
        .map_err(|e| e.to_string())?;
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
    validation.set_audience(&["https://login.salesforce.com", "https://test.salesforce.com"]);
    let claims = jsonwebtoken::decode::<Claims>(assertion, &key, &validation)
        .map_err(|e| format!("invalid assertion: {e}"))?
        .claims;
    if claims.iss != state.client_id {
        return Err("client identifier invalid".into());
    }
    if claims.sub != state.jwt_username {
        return Err("user hasn't approved this consumer".into());
    }
    Ok(())
}

async fn versions() -> Response {
    Json(json!([{"label": "Spring '24", "url": "/services/data/v60.0", "version": "60.0"}]))
        .into_response()
}

/// Checks auth and the daily limit; returns the `Sforce-Limit-Info` value.
fn admit(state: &mut SalesforceState, headers: &HeaderMap) -> Result<String, Response> {
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    if !state.valid_tokens.contains(token) {
        return Err(error(
            StatusCode::UNAUTHORIZED,
            "INVALID_SESSION_ID",
            "Session expired or invalid",
            None,
        ));
    }
    if state.calls_today >= state.daily_limit {
        let limit = format!("api-usage={}/{}", state.calls_today, state.daily_limit);
        return Err(error(
            StatusCode::FORBIDDEN,
            "REQUEST_LIMIT_EXCEEDED",
            "TotalRequests Limit exceeded.",
            Some(&limit),
        ));
    }
    state.calls_today += 1;
    Ok(format!("api-usage={}/{}", state.calls_today, state.daily_limit))
}

fn version_number(version: &str) -> f64 {
    version.trim_start_matches('v').parse().unwrap_or(0.0)
}

fn with_limit(mut response: Response, limit: &str) -> Response {
    if let Ok(value) = HeaderValue::from_str(limit) {
        response.headers_mut().insert("sforce-limit-info", value);
    }
    response
}

fn record_urls(state: &SalesforceState, version: &str, object: &str, indexes: &[usize]) -> Value {
    json!(
        indexes
            .iter()
            .map(|i| format!("/services/data/{version}/sobjects/{object}/{}", state.records[*i].id))
            .collect::<Vec<_>>()
    )
}

async fn upsert(
    State(shared): State<Arc<Mutex<SalesforceState>>>,
    Path((version, object, field, value)): Path<(String, String, String, String)>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let (response, delay) = {
        let mut state = shared.lock().expect("lock");
        state.write_calls.upsert += 1;
        match admit(&mut state, &headers) {
            Err(response) => (response, Duration::ZERO),
            Ok(limit) => match plan(&mut state, Access::Write, &limit) {
                (Err(response), delay) => (response, delay),
                (Ok(()), delay) => {
                    let response = apply_upsert(
                        &mut state, &version, &object, &field, &value, &query, &body, &limit,
                    );
                    (response, delay)
                }
            },
        }
    };
    after(delay, response).await
}

/// What becomes of a request before it is applied: a scripted fault if one is queued for its
/// kind, else a random fate if chaos is set. `Err`: answer this instead, after the delay.
/// `Ok`: go on, and answer after the delay.
fn plan(
    state: &mut SalesforceState,
    access: Access,
    limit: &str,
) -> (Result<(), Response>, Duration) {
    let scripted = match access {
        Access::Write => state.faults.pop_front(),
        Access::Read => state.lookup_faults.pop_front(),
    };
    let (fate, latency) = match scripted {
        Some(Fault::Html503) => {
            let page = "<html><head><title>Service Unavailable</title></head><body>Maintenance</body></html>";
            let mut response = (StatusCode::SERVICE_UNAVAILABLE, page).into_response();
            response.headers_mut().insert("content-type", HeaderValue::from_static("text/html"));
            return (Err(response), Duration::ZERO);
        }
        Some(Fault::Json503) => (Fate::Fail, Duration::ZERO),
        Some(Fault::LockRow) => {
            let response = error(
                StatusCode::BAD_REQUEST,
                "UNABLE_TO_LOCK_ROW",
                "unable to obtain exclusive access to this record",
                Some(limit),
            );
            return (Err(response), Duration::ZERO);
        }
        Some(Fault::Validation) => {
            let response = error(
                StatusCode::BAD_REQUEST,
                "FIELD_CUSTOM_VALIDATION_EXCEPTION",
                "Value does not pass validation",
                Some(limit),
            );
            return (Err(response), Duration::ZERO);
        }
        Some(Fault::LostResponse(delay)) => (Fate::Delay(delay), Duration::ZERO),
        Some(Fault::RequestLimit) => (Fate::RateLimited { retry_after: false }, Duration::ZERO),
        None => match state.dice.as_mut() {
            Some(dice) => dice.draw(access),
            None => (Fate::Pass, Duration::ZERO),
        },
    };
    match fate {
        Fate::Pass => (Ok(()), latency),
        Fate::Fail => {
            let response = error(
                StatusCode::SERVICE_UNAVAILABLE,
                "SERVER_UNAVAILABLE",
                "Server too busy",
                Some(limit),
            );
            (Err(response), latency)
        }
        Fate::Delay(delay) => (Ok(()), latency + delay),
        // Salesforce documents no Retry-After: its limit answer is a 403 either way.
        Fate::RateLimited { .. } => {
            let response = error(
                StatusCode::FORBIDDEN,
                "REQUEST_LIMIT_EXCEEDED",
                "TotalRequests Limit exceeded.",
                Some(limit),
            );
            (Err(response), latency)
        }
    }
}

/// Answers after `delay`.
async fn after(delay: Duration, response: Response) -> Response {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    response
}

#[allow(clippy::too_many_arguments)] // One argument per part of the documented request.
fn apply_upsert(
    state: &mut SalesforceState,
    version: &str,
    object: &str,
    field: &str,
    value: &str,
    query: &HashMap<String, String>,
    body: &str,
    limit: &str,
) -> Response {
    if !state.objects.contains(object) {
        return error(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            "The requested resource does not exist",
            Some(limit),
        );
    }
    let Ok(fields) = serde_json::from_str::<BTreeMap<String, Value>>(body) else {
        return error(
            StatusCode::BAD_REQUEST,
            "JSON_PARSER_ERROR",
            "Cannot deserialize the request body",
            Some(limit),
        );
    };
    if fields.contains_key(field) || fields.contains_key("Id") {
        return error(
            StatusCode::BAD_REQUEST,
            "INVALID_FIELD",
            "The external id field and Id cannot be set in the body",
            Some(limit),
        );
    }
    let matches = state.matching(object, field, value);
    if matches.len() > 1 {
        let urls = record_urls(state, version, object, &matches);
        return with_limit((StatusCode::MULTIPLE_CHOICES, Json(urls)).into_response(), limit);
    }
    let new_api = version_number(version) >= 46.0;
    if let Some(&index) = matches.first() {
        state.writes.push(write(object, value, &fields));
        state.records[index].fields.extend(fields);
        let id = state.records[index].id.clone();
        if new_api {
            return with_limit(
                Json(json!({"id": id, "errors": [], "success": true, "created": false}))
                    .into_response(),
                limit,
            );
        }
        return with_limit(StatusCode::NO_CONTENT.into_response(), limit);
    }
    if query.get("updateOnly").map(String::as_str) == Some("true") {
        return error(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            "The requested resource does not exist",
            Some(limit),
        );
    }
    if let Some(required) = state.required_fields.get(object) {
        let missing: Vec<&String> = required.iter().filter(|f| !fields.contains_key(*f)).collect();
        if !missing.is_empty() {
            let names: Vec<&str> = missing.iter().map(|s| s.as_str()).collect();
            let message = format!("Required fields are missing: [{}]", names.join(", "));
            let body = json!([{"message": message, "errorCode": "REQUIRED_FIELD_MISSING", "fields": names}]);
            return with_limit((StatusCode::BAD_REQUEST, Json(body)).into_response(), limit);
        }
    }
    let id = state.new_id(object);
    state.writes.push(write(object, value, &fields));
    let mut record_fields = fields;
    record_fields.insert(field.to_owned(), json!(value));
    state.records.push(Record { id: id.clone(), object: object.to_owned(), fields: record_fields });
    let body = if new_api {
        json!({"id": id, "errors": [], "success": true, "created": true})
    } else {
        json!({"id": id, "errors": [], "success": true})
    };
    with_limit((StatusCode::CREATED, Json(body)).into_response(), limit)
}

fn write(object: &str, id: &str, fields: &BTreeMap<String, Value>) -> Write {
    let text = |value: &Value| match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    Write {
        object: object.to_owned(),
        id: id.to_owned(),
        fields: fields.iter().map(|(name, value)| (name.clone(), text(value))).collect(),
    }
}

/// sObject Collections upsert as documented (v46.0 and later): at most
/// [`COLLECTION_RECORDS_MAX`] records of the URI's object, each with `attributes.type`, its
/// external id in the body and no `Id`. A malformed call answers 400 and applies nothing; a
/// well-formed one answers 200 with one result per record, in order, each with its own
/// `success`, `created` and `errors` (`statusCode`, not `errorCode`). With `allOrNone`, one
/// failure rolls every record back. Each applied record is one entry of the effect log.
/// Faults apply to the call as a whole (a 5xx or the daily limit before anything is applied, a
/// lost answer after every record is), except those about records (a locked row, a validation
/// rule), which fail every record in its result.
async fn collection_upsert(
    State(shared): State<Arc<Mutex<SalesforceState>>>,
    Path((version, object, field)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let (response, delay) = {
        let mut state = shared.lock().expect("lock");
        state.write_calls.collection_upsert += 1;
        match admit(&mut state, &headers) {
            Err(response) => (response, Duration::ZERO),
            Ok(limit) => {
                let record_fault = take_record_fault(&mut state);
                let planned = match record_fault {
                    Some(_) => (Ok(()), Duration::ZERO),
                    None => plan(&mut state, Access::Write, &limit),
                };
                match planned {
                    (Err(response), delay) => (response, delay),
                    (Ok(()), delay) => {
                        let call =
                            CollectionCall { version: &version, object: &object, field: &field };
                        let response = apply_collection(
                            &mut state,
                            &call,
                            &body,
                            record_fault.as_ref(),
                            &limit,
                        );
                        (response, delay)
                    }
                }
            }
        }
    };
    after(delay, response).await
}

/// A scripted fault about records rather than the call, as a record's error: a collection
/// reports a locked row or a validation rule in the record's result, under a 200.
fn take_record_fault(state: &mut SalesforceState) -> Option<Value> {
    let error = match state.faults.front() {
        Some(Fault::LockRow) => record_error(
            "UNABLE_TO_LOCK_ROW",
            "unable to obtain exclusive access to this record",
            &[],
        ),
        Some(Fault::Validation) => {
            record_error("FIELD_CUSTOM_VALIDATION_EXCEPTION", "Value does not pass validation", &[])
        }
        _ => return None,
    };
    state.faults.pop_front();
    Some(error)
}

/// One record's error in a collection's results.
fn record_error(code: &str, message: &str, fields: &[&str]) -> Value {
    json!({"statusCode": code, "message": message, "fields": fields})
}

fn record_failed(error: Value) -> Value {
    json!({"success": false, "errors": [error]})
}

/// What the URI of a collection call names.
struct CollectionCall<'a> {
    version: &'a str,
    object: &'a str,
    field: &'a str,
}

#[derive(serde::Deserialize)]
struct Collection {
    #[serde(rename = "allOrNone", default)]
    all_or_none: bool,
    records: Vec<serde_json::Map<String, Value>>,
}

/// What one record of a collection does, decided for every record before any is applied (so
/// that `allOrNone` can refuse them all).
enum Step {
    Update { index: usize, value: String, fields: BTreeMap<String, Value> },
    Create { value: String, fields: BTreeMap<String, Value> },
    Fail(Value),
}

fn apply_collection(
    state: &mut SalesforceState,
    call: &CollectionCall<'_>,
    body: &str,
    record_fault: Option<&Value>,
    limit: &str,
) -> Response {
    let CollectionCall { version, object, field } = *call;
    if version_number(version) < COLLECTIONS_SINCE_VERSION || !state.objects.contains(object) {
        return error(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            "The requested resource does not exist",
            Some(limit),
        );
    }
    let Ok(collection) = serde_json::from_str::<Collection>(body) else {
        return error(
            StatusCode::BAD_REQUEST,
            "JSON_PARSER_ERROR",
            "Cannot deserialize the request body",
            Some(limit),
        );
    };
    if collection.records.len() > COLLECTION_RECORDS_MAX {
        return error(
            StatusCode::BAD_REQUEST,
            "EXCEEDED_ID_LIMIT",
            &format!(
                "record limit reached. cannot submit more than {COLLECTION_RECORDS_MAX} records into this call"
            ),
            Some(limit),
        );
    }
    let typed = |record: &serde_json::Map<String, Value>| {
        record.get("attributes").and_then(|a| a.get("type")).and_then(Value::as_str) == Some(object)
    };
    if !collection.records.iter().all(typed) {
        return error(
            StatusCode::BAD_REQUEST,
            "INVALID_TYPE",
            &format!("Each record must have attributes.type {object}, the object of the URI"),
            Some(limit),
        );
    }
    // How the real API treats one external id twice in a call is not documented: here every
    // occurrence fails, and none is applied.
    let mut occurrences: HashMap<String, usize> = HashMap::new();
    for value in collection.records.iter().filter_map(|r| r.get(field).and_then(Value::as_str)) {
        *occurrences.entry(value.to_owned()).or_default() += 1;
    }
    let steps: Vec<Step> = collection
        .records
        .into_iter()
        .map(|record| collection_step(state, call, &occurrences, record_fault, record))
        .collect();
    let failed = steps.iter().any(|step| matches!(step, Step::Fail(_)));
    if collection.all_or_none && failed {
        let results: Vec<Value> = steps
            .into_iter()
            .map(|step| match step {
                Step::Fail(error) => record_failed(error),
                Step::Update { .. } | Step::Create { .. } => record_failed(record_error(
                    "ALL_OR_NONE_OPERATION_ROLLED_BACK",
                    "Record rolled back because not all records were valid and the request was using AllOrNone header",
                    &[],
                )),
            })
            .collect();
        return with_limit(Json(results).into_response(), limit);
    }
    let results: Vec<Value> = steps
        .into_iter()
        .map(|step| match step {
            Step::Fail(error) => record_failed(error),
            Step::Update { index, value, fields } => {
                state.writes.push(write(object, &value, &fields));
                state.records[index].fields.extend(fields);
                json!({"id": state.records[index].id, "success": true, "errors": [], "created": false})
            }
            Step::Create { value, fields } => {
                let id = state.new_id(object);
                state.writes.push(write(object, &value, &fields));
                let mut record_fields = fields;
                record_fields.insert(field.to_owned(), json!(value));
                state.records.push(Record {
                    id: id.clone(),
                    object: object.to_owned(),
                    fields: record_fields,
                });
                json!({"id": id, "success": true, "errors": [], "created": true})
            }
        })
        .collect();
    with_limit(Json(results).into_response(), limit)
}

/// What one record would do, checked as the single upsert checks it.
fn collection_step(
    state: &SalesforceState,
    call: &CollectionCall<'_>,
    occurrences: &HashMap<String, usize>,
    record_fault: Option<&Value>,
    record: serde_json::Map<String, Value>,
) -> Step {
    let CollectionCall { version, object, field } = *call;
    let Some(value) = record.get(field).and_then(Value::as_str).map(str::to_owned) else {
        return Step::Fail(record_error(
            "REQUIRED_FIELD_MISSING",
            &format!("Required fields are missing: [{field}]"),
            &[field],
        ));
    };
    if record.contains_key("Id") {
        return Step::Fail(record_error(
            "INVALID_FIELD",
            "Id cannot be set in an upsert by external id",
            &["Id"],
        ));
    }
    if occurrences.get(&value).is_some_and(|n| *n > 1) {
        return Step::Fail(record_error(
            "DUPLICATE_VALUE",
            &format!("Duplicate external id specified: {value}"),
            &[field],
        ));
    }
    let fields: BTreeMap<String, Value> =
        record.into_iter().filter(|(name, _)| name != "attributes" && name != field).collect();
    let matches = state.matching(object, field, &value);
    if matches.len() > 1 {
        let urls = record_urls(state, version, object, &matches);
        return Step::Fail(record_error(
            "DUPLICATE_EXTERNAL_ID",
            &format!("{field}: more than one record found for external id field: {urls}"),
            &[field],
        ));
    }
    if let Some(fault) = record_fault {
        return Step::Fail(fault.clone());
    }
    if let Some(&index) = matches.first() {
        return Step::Update { index, value, fields };
    }
    let missing: Vec<&str> = state
        .required_fields
        .get(object)
        .map(|required| {
            required.iter().filter(|f| !fields.contains_key(*f)).map(String::as_str).collect()
        })
        .unwrap_or_default();
    if !missing.is_empty() {
        return Step::Fail(record_error(
            "REQUIRED_FIELD_MISSING",
            &format!("Required fields are missing: [{}]", missing.join(", ")),
            &missing,
        ));
    }
    Step::Create { value, fields }
}

async fn lookup(
    State(shared): State<Arc<Mutex<SalesforceState>>>,
    Path((version, object, field, value)): Path<(String, String, String, String)>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let (response, delay) = {
        let mut state = shared.lock().expect("lock");
        match admit(&mut state, &headers) {
            Err(response) => (response, Duration::ZERO),
            Ok(limit) => match plan(&mut state, Access::Read, &limit) {
                (Err(response), delay) => (response, delay),
                (Ok(()), delay) => {
                    (find_record(&state, &version, &object, &field, &value, &query, &limit), delay)
                }
            },
        }
    };
    after(delay, response).await
}

fn find_record(
    state: &SalesforceState,
    version: &str,
    object: &str,
    field: &str,
    value: &str,
    query: &HashMap<String, String>,
    limit: &str,
) -> Response {
    if !state.objects.contains(object) {
        return error(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            "The requested resource does not exist",
            Some(limit),
        );
    }
    let matches = state.matching(object, field, value);
    match matches.as_slice() {
        [] => error(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            "The requested resource does not exist",
            Some(limit),
        ),
        [index] => {
            let record = &state.records[*index];
            let wanted: Option<HashSet<&str>> = query.get("fields").map(|f| f.split(',').collect());
            let mut body = serde_json::Map::new();
            body.insert(
                "attributes".into(),
                json!({"type": object, "url": format!("/services/data/{version}/sobjects/{object}/{}", record.id)}),
            );
            body.insert("Id".into(), json!(record.id));
            for (name, value) in &record.fields {
                if wanted.as_ref().is_none_or(|w| w.contains(name.as_str())) {
                    body.insert(name.clone(), value.clone());
                }
            }
            with_limit(Json(Value::Object(body)).into_response(), limit)
        }
        several => {
            let urls = record_urls(state, version, object, several);
            with_limit((StatusCode::MULTIPLE_CHOICES, Json(urls)).into_response(), limit)
        }
    }
}
