//! HubSpot through its CRM v3 objects API.
//!
//! - **Upsert**: `POST /crm/v3/objects/{type}/batch/upsert` with one input whose `idProperty`
//!   is the external-id field (a property with unique values) and whose `id` is its value;
//!   the answer's `new` flag says whether the record was created. The idempotency key travels
//!   as `objectWriteTraceId` (a label, not a deduplication key: HubSpot documents none).
//! - **Batches**: the same call with up to [`BATCH_INPUTS_MAX`] inputs of one object type; a
//!   single upsert is a batch of one, so both are read by the same code. Results are matched
//!   to inputs by id value, not by position (HubSpot does not promise input order); an input's
//!   own error in a 207 answer is classified by its category; an input the answer does not
//!   mention is ambiguous. Update-only writes cannot go in a batch upsert (it would create):
//!   each is its own update call.
//! - **Update only**: `PATCH /crm/v3/objects/{type}/{value}?idProperty={field}`, which never
//!   creates.
//! - **Lookup**: `GET /crm/v3/objects/{type}/{value}?idProperty={field}&properties=...`. Not
//!   search: search lags writes by seconds, and reconciliation must see a write that just
//!   happened.
//! - **Auth**: a private-app bearer token.
//! - **Answers to classes**: 429 rate-limited, waiting `Retry-After` if sent, else the
//!   `X-HubSpot-RateLimit-Interval-Milliseconds` window when nothing remains in it; 400 (such
//!   as `VALIDATION_ERROR` or a non-unique `idProperty`) rejected; 401 and 403 misconfigured (a
//!   401 is not a sign to refresh a private-app token); 404 misconfigured, or rejected for an
//!   update-only write with no record; 5xx retryable; timeouts ambiguous.

use std::collections::BTreeMap;
use std::time::Duration;

use hookgate_connector::{
    Answer, BoxFuture, CallLimits, Capabilities, ConfigError, Connector, ConnectorError,
    Credentials, Description, KindDescription, LookupOutcome, LookupRequest, Operation, RateLimit,
    Secret, TargetRule, UpsertOutcome, UpsertRequest, credential,
};
use hookgate_connector_http::{self as http, HttpSettings, Response};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Instance settings of `kind: hubspot`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HubSpotSettings {
    /// The API's base URL.
    #[serde(default = "default_base_url")]
    pub base_url: String,
    #[serde(default)]
    pub http: HttpSettings,
}

fn default_base_url() -> String {
    "https://api.hubapi.com".into()
}

/// The credentials a HubSpot instance needs.
pub const CREDENTIALS: &[&str] = &["token"];

/// Inputs HubSpot takes in one batch upsert.
pub const BATCH_INPUTS_MAX: usize = 100;

/// Rate-limit headers kept with each attempt: the window's and the day's.
const RATE_LIMIT_HEADERS: &[&str] = &[
    "x-hubspot-ratelimit-max",
    "x-hubspot-ratelimit-remaining",
    "x-hubspot-ratelimit-interval-milliseconds",
    "x-hubspot-ratelimit-daily",
    "x-hubspot-ratelimit-daily-remaining",
];

#[derive(Debug)]
pub struct HubSpot {
    settings: HubSpotSettings,
    token: Secret,
    client: reqwest::Client,
}

impl HubSpot {
    pub fn new(
        settings: HubSpotSettings,
        credentials: &Credentials,
    ) -> Result<HubSpot, ConfigError> {
        http::check_url(&settings.base_url)
            .map_err(|e| ConfigError(format!("settings.base_url: {e}")))?;
        let client = http::client(&settings.http).map_err(|e| ConfigError(e.to_string()))?;
        Ok(HubSpot { token: credential(credentials, "token")?.clone(), settings, client })
    }

    pub fn from_config(
        settings: &BTreeMap<String, serde_json::Value>,
        credentials: &Credentials,
    ) -> Result<HubSpot, ConfigError> {
        HubSpot::new(hookgate_connector::settings(settings)?, credentials)
    }

    fn url(&self, segments: &[&str]) -> Result<url::Url, ConnectorError> {
        let mut url = url::Url::parse(&self.settings.base_url).map_err(|e| {
            ConnectorError::Misconfigured {
                message: format!("base URL: {e}"),
                answer: Answer::default(),
            }
        })?;
        url.path_segments_mut()
            .map_err(|()| ConnectorError::Misconfigured {
                message: "base URL has no path".into(),
                answer: Answer::default(),
            })?
            .pop_if_empty()
            .extend(["crm", "v3", "objects"])
            .extend(segments);
        Ok(url)
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<Response, ConnectorError> {
        let request = request.bearer_auth(self.token.expose());
        http::send(request, &self.settings.http).await
    }

    async fn upsert_inner(&self, request: &UpsertRequest) -> Result<UpsertOutcome, ConnectorError> {
        if request.operation == Operation::UpdateOnly {
            return self.update_only(request).await;
        }
        // One write is a batch of one: the same call, read by the same code.
        self.batch_upsert(&[request]).await.pop().unwrap_or_else(|| {
            Err(ConnectorError::Ambiguous {
                message: "no outcome for a batch of one".into(),
                answer: Answer::default(),
            })
        })
    }

    async fn upsert_batch_inner(
        &self,
        requests: &[UpsertRequest],
    ) -> Vec<Result<UpsertOutcome, ConnectorError>> {
        let calls = plan_calls(requests);
        let mut outcomes = Vec::with_capacity(requests.len());
        for index in calls.update_only {
            outcomes.push((index, self.update_only(&requests[index]).await));
        }
        for call in calls.batches {
            let batch: Vec<&UpsertRequest> = call.iter().map(|&index| &requests[index]).collect();
            outcomes.extend(call.into_iter().zip(self.batch_upsert(&batch).await));
        }
        // Every index is in exactly one call, so this is one outcome per request, in order.
        outcomes.sort_by_key(|(index, _)| *index);
        outcomes.into_iter().map(|(_, outcome)| outcome).collect()
    }

    /// One batch upsert call of writes to one object type, no two to one record; one outcome
    /// per write, in the order given.
    async fn batch_upsert(
        &self,
        requests: &[&UpsertRequest],
    ) -> Vec<Result<UpsertOutcome, ConnectorError>> {
        let Some(first) = requests.first() else { return Vec::new() };
        let url = match self.url(&[&first.object, "batch", "upsert"]) {
            Ok(url) => url,
            Err(error) => return every(requests.len(), error),
        };
        let inputs: Vec<serde_json::Value> = requests
            .iter()
            .map(|request| {
                json!({
                    "idProperty": request.external_id_field,
                    "id": request.external_id_value,
                    "properties": request.fields,
                    "objectWriteTraceId": request.idempotency_key,
                })
            })
            .collect();
        let response = match self.send(self.client.post(url).json(&json!({"inputs": inputs}))).await
        {
            Ok(response) => response,
            Err(error) => return every(requests.len(), error),
        };
        match response.status {
            // 207: some inputs failed, each with its own error.
            200 | 201 | 207 => read_batch_answer(requests, &response),
            status => match classify(status, &response, false) {
                // HubSpot refuses a whole batch for one bad input (a 400 without per-input
                // errors): nothing was written, and alone each write gets its own answer.
                ConnectorError::Rejected { .. } if requests.len() > 1 => {
                    let mut outcomes = Vec::with_capacity(requests.len());
                    for request in requests {
                        outcomes.extend(Box::pin(self.batch_upsert(&[*request])).await);
                    }
                    outcomes
                }
                error => every(requests.len(), error),
            },
        }
    }

    async fn update_only(&self, request: &UpsertRequest) -> Result<UpsertOutcome, ConnectorError> {
        let mut url = self.url(&[&request.object, &request.external_id_value])?;
        url.query_pairs_mut().append_pair("idProperty", &request.external_id_field);
        let response =
            self.send(self.client.patch(url).json(&json!({"properties": request.fields}))).await?;
        let answer = with_rate_limits(&response);
        match response.status {
            200 => {
                let id = serde_json::from_str::<serde_json::Value>(&response.body)
                    .ok()
                    .and_then(|v| v.get("id").and_then(|id| id.as_str()).map(str::to_owned))
                    .unwrap_or_default();
                Ok(UpsertOutcome { record_id: id, created: false, answer })
            }
            status => Err(classify(status, &response, true)),
        }
    }

    async fn lookup_inner(&self, request: &LookupRequest) -> Result<LookupOutcome, ConnectorError> {
        let mut url = self.url(&[&request.object, &request.external_id_value])?;
        {
            let mut query = url.query_pairs_mut();
            query.append_pair("idProperty", &request.external_id_field);
            if !request.fields.is_empty() {
                query.append_pair("properties", &request.fields.join(","));
            }
        }
        let response = self.send(self.client.get(url)).await?;
        let answer = with_rate_limits(&response);
        match response.status {
            200 => {
                #[derive(Deserialize)]
                struct Object {
                    id: String,
                    #[serde(default)]
                    properties: BTreeMap<String, Option<String>>,
                }
                let object: Object = serde_json::from_str(&response.body).map_err(|e| {
                    ConnectorError::Retryable {
                        message: format!("unreadable record: {e}"),
                        retry_after: None,
                        answer: answer.clone(),
                    }
                })?;
                let fields = object
                    .properties
                    .into_iter()
                    .map(|(k, v)| (k, v.unwrap_or_default()))
                    .collect();
                Ok(LookupOutcome::Found { record_id: object.id, fields, answer })
            }
            404 => Ok(LookupOutcome::NotFound { answer }),
            status => Err(classify(status, &response, false)),
        }
    }
}

/// How a batch goes out: calls of writes that can share a batch upsert, and the update-only
/// writes, one call each.
#[derive(Debug, Default)]
struct Calls {
    /// Indexes of the writes of each batch upsert call.
    batches: Vec<Vec<usize>>,
    update_only: Vec<usize>,
}

/// Groups writes into batch upsert calls: one object type per call (it is in the URL), at most
/// [`BATCH_INPUTS_MAX`] inputs, and never two writes of one record in a call (HubSpot rejects
/// a whole batch with a duplicate id; the engine does not send one, and this keeps a mistake
/// from failing every write of the call).
fn plan_calls(requests: &[UpsertRequest]) -> Calls {
    let mut calls = Calls::default();
    for (index, request) in requests.iter().enumerate() {
        if request.operation == Operation::UpdateOnly {
            calls.update_only.push(index);
            continue;
        }
        let fits = |call: &Vec<usize>| {
            call.len() < BATCH_INPUTS_MAX
                && call.first().is_some_and(|&first| requests[first].object == request.object)
                && !call.iter().any(|&other| same_record(&requests[other], request))
        };
        match calls.batches.iter_mut().find(|call| fits(call)) {
            Some(call) => call.push(index),
            None => calls.batches.push(vec![index]),
        }
    }
    calls
}

fn same_record(a: &UpsertRequest, b: &UpsertRequest) -> bool {
    a.object == b.object
        && a.external_id_field == b.external_id_field
        && a.external_id_value == b.external_id_value
}

/// A failure of a whole call, as the outcome of each of its writes.
fn every(count: usize, error: ConnectorError) -> Vec<Result<UpsertOutcome, ConnectorError>> {
    vec![Err(error); count]
}

/// One input's result in a batch answer.
#[derive(Deserialize)]
struct InputResult {
    id: String,
    #[serde(default)]
    new: bool,
    #[serde(default)]
    properties: BTreeMap<String, Option<String>>,
    #[serde(rename = "objectWriteTraceId", default)]
    object_write_trace_id: Option<String>,
}

/// The inputs one error of a 207 answer names.
#[derive(Deserialize)]
struct InputError {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    context: InputErrorContext,
    #[serde(rename = "objectWriteTraceId", default)]
    object_write_trace_id: Option<String>,
}

#[derive(Default, Deserialize)]
struct InputErrorContext {
    #[serde(default)]
    ids: Vec<String>,
}

/// Reads a 200 or 207 answer into one outcome per input. Each result and error is matched to
/// its input by the id value it carries, else by its trace id; a lone entry left over belongs
/// to a lone input left over. An input nothing matches may or may not have been written:
/// ambiguous.
fn read_batch_answer(
    requests: &[&UpsertRequest],
    response: &Response,
) -> Vec<Result<UpsertOutcome, ConnectorError>> {
    #[derive(Deserialize)]
    struct BatchAnswer {
        #[serde(default)]
        results: Vec<serde_json::Value>,
        #[serde(default)]
        errors: Vec<serde_json::Value>,
    }
    let answer = with_rate_limits(response);
    let batch: BatchAnswer = match serde_json::from_str(&response.body) {
        Ok(batch) => batch,
        Err(e) => {
            let error = ConnectorError::Ambiguous {
                message: format!("unreadable answer to a write: {e}"),
                answer,
            };
            return every(requests.len(), error);
        }
    };
    // Each input's own evidence is its own entry of the answer, not the whole answer.
    let own_answer = |entry: &serde_json::Value| Answer {
        status: answer.status,
        excerpt: Some(hookgate_connector::excerpt(&entry.to_string())),
        meta: answer.meta.clone(),
    };
    let mut outcomes: Vec<Option<Result<UpsertOutcome, ConnectorError>>> =
        vec![None; requests.len()];
    let mut left_over = Vec::new();
    for entry in &batch.results {
        let Ok(result) = serde_json::from_value::<InputResult>(entry.clone()) else {
            left_over.push(entry);
            continue;
        };
        let owner = only_match(requests, &outcomes, |request| {
            result.properties.get(&request.external_id_field).and_then(Option::as_deref)
                == Some(request.external_id_value.as_str())
        })
        .or_else(|| traced(requests, &outcomes, result.object_write_trace_id.as_deref()));
        match owner {
            Some(index) => {
                outcomes[index] = Some(Ok(UpsertOutcome {
                    record_id: result.id,
                    created: result.new,
                    answer: own_answer(entry),
                }));
            }
            None => left_over.push(entry),
        }
    }
    for entry in &batch.errors {
        let named = serde_json::from_value::<InputError>(entry.clone()).ok();
        let mut owners: Vec<usize> = named
            .as_ref()
            .map(|named| {
                (0..requests.len())
                    .filter(|&index| outcomes[index].is_none())
                    .filter(|&index| {
                        let value = &requests[index].external_id_value;
                        named.id.as_ref() == Some(value) || named.context.ids.contains(value)
                    })
                    .collect()
            })
            .unwrap_or_default();
        if owners.is_empty() {
            let trace = named.as_ref().and_then(|named| named.object_write_trace_id.as_deref());
            owners.extend(traced(requests, &outcomes, trace));
        }
        if owners.is_empty() {
            left_over.push(entry);
        }
        for index in owners {
            outcomes[index] = Some(Err(input_error(entry, own_answer(entry))));
        }
    }
    let unanswered: Vec<usize> = (0..requests.len()).filter(|&i| outcomes[i].is_none()).collect();
    // Only a write alone: in a batch, an entry nothing matches could be another input's, and
    // guessing would turn an unknown outcome into a known one.
    if let ([index], [entry], 1) = (unanswered.as_slice(), left_over.as_slice(), requests.len()) {
        let outcome = match serde_json::from_value::<InputResult>((*entry).clone()) {
            Ok(result) => Ok(UpsertOutcome {
                record_id: result.id,
                created: result.new,
                answer: own_answer(entry),
            }),
            Err(_) => Err(input_error(entry, own_answer(entry))),
        };
        outcomes[*index] = Some(outcome);
    }
    outcomes
        .into_iter()
        .map(|outcome| {
            outcome.unwrap_or_else(|| {
                Err(ConnectorError::Ambiguous {
                    message: "the batch answer has no result or error for this input".into(),
                    answer: answer.clone(),
                })
            })
        })
        .collect()
}

/// The one input still without an outcome that `is_it` picks, if exactly one.
fn only_match(
    requests: &[&UpsertRequest],
    outcomes: &[Option<Result<UpsertOutcome, ConnectorError>>],
    is_it: impl Fn(&UpsertRequest) -> bool,
) -> Option<usize> {
    let mut found =
        (0..requests.len()).filter(|&index| outcomes[index].is_none() && is_it(requests[index]));
    let first = found.next()?;
    found.next().is_none().then_some(first)
}

/// The one input still without an outcome whose idempotency key is this trace id.
fn traced(
    requests: &[&UpsertRequest],
    outcomes: &[Option<Result<UpsertOutcome, ConnectorError>>],
    trace: Option<&str>,
) -> Option<usize> {
    let trace = trace?;
    only_match(requests, outcomes, |request| request.idempotency_key == trace)
}

/// One input's error in a 207 answer, classified by its category as [`classify`] classifies
/// the status that category comes with. The input is in `errors`, not `results`: it was not
/// written.
fn input_error(entry: &serde_json::Value, answer: Answer) -> ConnectorError {
    let message = message(&entry.to_string());
    match entry.get("category").and_then(|c| c.as_str()) {
        Some("RATE_LIMITS") => ConnectorError::RateLimited { message, retry_after: None, answer },
        Some("INVALID_AUTHENTICATION" | "MISSING_SCOPES") => {
            ConnectorError::Misconfigured { message, answer }
        }
        // A server error inside a write need not mean it was not applied: look it up.
        Some("INTERNAL_ERROR") => ConnectorError::Ambiguous { message, answer },
        _ => ConnectorError::Rejected { message, answer },
    }
}

fn with_rate_limits(response: &Response) -> Answer {
    let mut answer = response.answer();
    for name in RATE_LIMIT_HEADERS {
        if let Some(value) = response.header(name) {
            answer.meta.insert((*name).to_owned(), value.to_owned());
        }
    }
    answer
}

/// How long to wait after a 429: `Retry-After` if given, else the window, if it is used up.
fn rate_limit_wait(response: &Response) -> Option<Duration> {
    if let Some(after) = http::retry_after(response) {
        return Some(after);
    }
    let remaining =
        response.header("x-hubspot-ratelimit-remaining").and_then(|v| v.parse::<u64>().ok());
    let interval = response
        .header("x-hubspot-ratelimit-interval-milliseconds")
        .and_then(|v| v.parse::<u64>().ok());
    match (remaining, interval) {
        (Some(0), Some(ms)) => Some(Duration::from_millis(ms)),
        _ => None,
    }
}

fn message(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .map(|v| {
            let category = v.get("category").and_then(|c| c.as_str()).unwrap_or("?");
            let message = v.get("message").and_then(|m| m.as_str()).unwrap_or("");
            format!("{category}: {message}")
        })
        .unwrap_or_else(|| hookgate_connector::excerpt(body.trim()))
}

fn classify(status: u16, response: &Response, update_only: bool) -> ConnectorError {
    let answer = with_rate_limits(response);
    let message = message(&response.body);
    match status {
        429 => {
            ConnectorError::RateLimited { message, retry_after: rate_limit_wait(response), answer }
        }
        400 | 409 | 422 => ConnectorError::Rejected { message, answer },
        401 | 403 => ConnectorError::Misconfigured { message, answer },
        404 if update_only => {
            ConnectorError::Rejected { message: format!("no record to update: {message}"), answer }
        }
        404 => ConnectorError::Misconfigured {
            message: format!("unknown object type: {message}"),
            answer,
        },
        status if status >= 500 => {
            ConnectorError::Retryable { message, retry_after: http::retry_after(response), answer }
        }
        status => ConnectorError::Rejected {
            message: format!("unexpected status {status}: {message}"),
            answer,
        },
    }
}

impl Connector for HubSpot {
    fn describe(&self) -> Description {
        Description {
            kind: "hubspot".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            capabilities: Capabilities { update_only: true, idempotency_keys: false },
            settings_schema: serde_json::to_value(schemars::schema_for!(HubSpotSettings))
                .unwrap_or_default(),
        }
    }

    fn upsert<'a>(
        &'a self,
        request: &'a UpsertRequest,
    ) -> BoxFuture<'a, Result<UpsertOutcome, ConnectorError>> {
        Box::pin(self.upsert_inner(request))
    }

    fn batch_max(&self) -> usize {
        BATCH_INPUTS_MAX
    }

    fn upsert_batch<'a>(
        &'a self,
        requests: &'a [UpsertRequest],
    ) -> BoxFuture<'a, Vec<Result<UpsertOutcome, ConnectorError>>> {
        Box::pin(self.upsert_batch_inner(requests))
    }

    fn lookup<'a>(
        &'a self,
        request: &'a LookupRequest,
    ) -> BoxFuture<'a, Result<LookupOutcome, ConnectorError>> {
        Box::pin(self.lookup_inner(request))
    }

    fn healthcheck(&self) -> BoxFuture<'_, Result<(), ConnectorError>> {
        Box::pin(async move {
            let mut url = self.url(&["contacts"])?;
            url.query_pairs_mut().append_pair("limit", "1");
            let response = self.send(self.client.get(url)).await?;
            match response.status {
                200 => Ok(()),
                status => Err(classify(status, &response, false)),
            }
        })
    }
}

impl hookgate_connector::Kind for HubSpot {
    type Settings = HubSpotSettings;

    fn about() -> KindDescription {
        KindDescription {
            kind: "hubspot".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            settings_schema: serde_json::Value::Null,
            credentials: CREDENTIALS.iter().map(|name| (*name).to_owned()).collect(),
            rules: vec![
                TargetRule::ExternalIdFieldNot {
                    names: vec!["hs_object_id".into()],
                    message: "HubSpot cannot upsert by `hs_object_id`".into(),
                    hint: "batch upsert needs a property with unique values (`hasUniqueValue: true`), e.g. `email` for contacts or a custom unique property".into(),
                },
                TargetRule::ObjectLowercase { crm: "HubSpot".into() },
            ],
            // HubSpot's published window for a private app (its higher tiers allow more: an
            // instance says so in `limits`).
            limits: CallLimits { rate: Some(RateLimit { calls: 100, per: Duration::from_secs(10) }) },
            file_settings: Vec::new(),
        }
    }

    fn create(
        settings: &BTreeMap<String, serde_json::Value>,
        credentials: &Credentials,
    ) -> BoxFuture<'static, Result<HubSpot, ConfigError>> {
        let built = HubSpot::from_config(settings, credentials);
        Box::pin(async move { built })
    }
}

#[cfg(test)]
mod tests;
