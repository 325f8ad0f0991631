//! HubSpot through its CRM v3 objects API.
//!
//! - **Upsert**: `POST /crm/v3/objects/{type}/batch/upsert` with one input whose `idProperty`
//!   is the external-id field (a property with unique values) and whose `id` is its value;
//!   the answer's `new` flag says whether the record was created. The idempotency key travels
//!   as `objectWriteTraceId` (a label, not a deduplication key: HubSpot documents none).
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
    Answer, BoxFuture, Capabilities, ConfigError, Connector, ConnectorError, Credentials,
    Description, KindDescription, LookupOutcome, LookupRequest, Operation, Secret, TargetRule,
    UpsertOutcome, UpsertRequest, credential,
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

/// Rate-limit headers kept with each attempt.
const RATE_LIMIT_HEADERS: &[&str] = &[
    "x-hubspot-ratelimit-max",
    "x-hubspot-ratelimit-remaining",
    "x-hubspot-ratelimit-interval-milliseconds",
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
        let url = self.url(&[&request.object, "batch", "upsert"])?;
        let body = json!({"inputs": [{
            "idProperty": request.external_id_field,
            "id": request.external_id_value,
            "properties": request.fields,
            "objectWriteTraceId": request.idempotency_key,
        }]});
        let response = self.send(self.client.post(url).json(&body)).await?;
        let answer = with_rate_limits(&response);
        match response.status {
            200 | 201 => {
                #[derive(Deserialize)]
                struct Batch {
                    results: Vec<BatchResult>,
                }
                #[derive(Deserialize)]
                struct BatchResult {
                    id: String,
                    #[serde(default)]
                    new: bool,
                }
                let batch: Batch = serde_json::from_str(&response.body).map_err(|e| {
                    ConnectorError::Ambiguous {
                        message: format!("unreadable answer to a write: {e}"),
                        answer: answer.clone(),
                    }
                })?;
                let Some(result) = batch.results.into_iter().next() else {
                    return Err(ConnectorError::Ambiguous {
                        message: "a batch answer without results".into(),
                        answer,
                    });
                };
                Ok(UpsertOutcome { record_id: result.id, created: result.new, answer })
            }
            // Multi-status: the input failed with its own error.
            207 => Err(ConnectorError::Rejected { message: message(&response.body), answer }),
            status => Err(classify(status, &response, false)),
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
