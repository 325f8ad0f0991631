//! Salesforce through its REST API.
//!
//! - **Upsert** by external id: `PATCH {instance}/services/data/vNN.N/sobjects/{object}/{field}/{value}`
//!   (value URL-encoded; `?updateOnly=true` for update-only writes). 201 created; 200 updated
//!   (v46.0 and later); 204 updated (before v46.0, no body: the record id is looked up).
//! - **Batches** (v46.0 and later): sObject Collections upsert,
//!   `PATCH {instance}/services/data/vNN.N/composite/sobjects/{object}/{field}` with
//!   `allOrNone: false` and up to [`COLLECTION_RECORDS_MAX`] records, one call per (object,
//!   external-id field). The results come in record order, each with its own `success`,
//!   `created` and `errors`, whose `statusCode`s are classified as a single upsert's
//!   `errorCode`s. Update-only writes are not in collections (an upsert would create): each is
//!   a single upsert with `?updateOnly=true`. Before v46.0 there are no collections, and
//!   [`Connector::batch_max`] is 1.
//! - **Lookup**: `GET` on the same path.
//! - **Auth**: OAuth 2.0 against `login_url`, by client credentials or by the JWT bearer flow
//!   (an RS256 assertion signed with the connected app's private key); the token is cached,
//!   and a 401 `INVALID_SESSION_ID` refreshes it once, then retries once.
//! - **Answers to classes**: 300 (several records match) rejected, with the matching record
//!   URLs kept as evidence; 400 rejected, except `UNABLE_TO_LOCK_ROW` (retryable); 401 after a
//!   refresh, and other 403s, misconfigured; 403 `REQUEST_LIMIT_EXCEEDED` rate-limited (no
//!   re-authentication); 404 misconfigured (unknown object or field), or rejected for an
//!   update-only write with no record; 5xx (JSON or HTML) retryable; timeouts ambiguous.
//! - `Sforce-Limit-Info` is kept with each attempt.

use std::collections::BTreeMap;
use std::sync::Arc;

use hookgate_connector::{
    Answer, BoxFuture, Capabilities, ConfigError, Connector, ConnectorError, Credentials,
    Description, KindDescription, LookupOutcome, LookupRequest, Operation, Secret, TargetRule,
    UpsertOutcome, UpsertRequest, credential,
};
use hookgate_connector_http::{self as http, HttpSettings, Response};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

/// Instance settings of `kind: salesforce`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SalesforceSettings {
    /// Where tokens are requested: your My Domain URL, `https://login.salesforce.com` or
    /// `https://test.salesforce.com`.
    pub login_url: String,
    /// The instance to call; by default the `instance_url` of the token answer.
    #[serde(default)]
    pub instance_url: Option<String>,
    /// The REST API version, e.g. `60.0`.
    #[serde(default = "default_api_version")]
    pub api_version: String,
    /// How tokens are obtained.
    #[serde(default)]
    pub auth: Auth,
    #[serde(default)]
    pub http: HttpSettings,
}

fn default_api_version() -> String {
    "60.0".into()
}

/// The OAuth 2.0 flow.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Auth {
    /// `grant_type=client_credentials`; credentials `client_id` and `client_secret`.
    #[default]
    ClientCredentials,
    /// `grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer`: an assertion signed (RS256)
    /// with the connected app's private key; credentials `client_id` and `private_key` (PEM).
    JwtBearer {
        /// The Salesforce user the integration acts as (the `sub` claim).
        username: String,
        /// The `aud` claim: `https://login.salesforce.com` (the default),
        /// `https://test.salesforce.com` for sandboxes, or a community URL.
        #[serde(default)]
        audience: Option<String>,
    },
}

/// Lifetime of a JWT assertion: Salesforce asks for an expiry a few minutes ahead.
const ASSERTION_LIFETIME_SECS: u64 = 180;

/// Records Salesforce takes in one sObject Collections call.
pub const COLLECTION_RECORDS_MAX: usize = 200;

/// The first API version with sObject Collections upsert.
const COLLECTIONS_SINCE_MAJOR_VERSION: u32 = 46;

/// A record Salesforce could not lock (another transaction holds it): retried.
const RECORD_LOCKED: &str = "UNABLE_TO_LOCK_ROW";
/// The org's daily API calls are used up: rate-limited, and no re-authentication.
const DAILY_LIMIT_EXCEEDED: &str = "REQUEST_LIMIT_EXCEEDED";

/// The credentials an instance with these settings needs (`credentials:` in `hookgate.yaml`).
pub fn required_credentials(
    settings: &BTreeMap<String, serde_json::Value>,
) -> &'static [&'static str] {
    // Only `auth` decides; other settings' problems are reported on their own.
    let auth =
        settings.get("auth").and_then(|auth| serde_json::from_value::<Auth>(auth.clone()).ok());
    match auth {
        Some(Auth::JwtBearer { .. }) => &["client_id", "private_key"],
        _ => &["client_id", "client_secret"],
    }
}

/// What proves the connector's identity to the token endpoint.
enum Grant {
    ClientSecret(Secret),
    Jwt { key: jsonwebtoken::EncodingKey, username: String, audience: String },
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Grant::ClientSecret(_) => f.write_str("ClientSecret(<redacted>)"),
            Grant::Jwt { username, audience, .. } => {
                write!(
                    f,
                    "Jwt {{ username: {username:?}, audience: {audience:?}, key: <redacted> }}"
                )
            }
        }
    }
}

#[derive(Debug)]
struct Token {
    access_token: Secret,
    instance_url: String,
}

#[derive(Debug)]
pub struct Salesforce {
    settings: SalesforceSettings,
    client_id: Secret,
    grant: Grant,
    client: reqwest::Client,
    /// The cached token; replaced when Salesforce says it expired.
    token: Mutex<Option<Arc<Token>>>,
}

/// What a call asked, so a 401 can repeat it with a fresh token.
enum Call<'a> {
    Upsert(&'a UpsertRequest),
    Lookup(&'a LookupRequest),
    /// An sObject Collections upsert: writes sharing one object and external-id field.
    Collection(&'a [&'a UpsertRequest]),
}

impl Salesforce {
    pub fn new(
        settings: SalesforceSettings,
        credentials: &Credentials,
    ) -> Result<Salesforce, ConfigError> {
        http::check_url(&settings.login_url)
            .map_err(|e| ConfigError(format!("settings.login_url: {e}")))?;
        if let Some(instance) = &settings.instance_url {
            http::check_url(instance)
                .map_err(|e| ConfigError(format!("settings.instance_url: {e}")))?;
        }
        if !settings
            .api_version
            .split('.')
            .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(ConfigError(format!(
                "settings.api_version: `{}` is not like `60.0`",
                settings.api_version
            )));
        }
        let client = http::client(&settings.http).map_err(|e| ConfigError(e.to_string()))?;
        let client_id = credential(credentials, "client_id")?.clone();
        let grant = match &settings.auth {
            Auth::ClientCredentials => {
                Grant::ClientSecret(credential(credentials, "client_secret")?.clone())
            }
            Auth::JwtBearer { username, audience } => {
                let pem = credential(credentials, "private_key")?;
                let key = jsonwebtoken::EncodingKey::from_rsa_pem(pem.expose().as_bytes())
                    .map_err(|e| {
                        ConfigError(format!(
                            "credentials: `private_key` is not an RSA private key in PEM: {e}"
                        ))
                    })?;
                let audience =
                    audience.clone().unwrap_or_else(|| "https://login.salesforce.com".into());
                Grant::Jwt { key, username: username.clone(), audience }
            }
        };
        Ok(Salesforce { client_id, grant, settings, client, token: Mutex::new(None) })
    }

    pub fn from_config(
        settings: &BTreeMap<String, serde_json::Value>,
        credentials: &Credentials,
    ) -> Result<Salesforce, ConfigError> {
        Salesforce::new(hookgate_connector::settings(settings)?, credentials)
    }

    /// The cached token, or a new one.
    async fn token(&self) -> Result<Arc<Token>, ConnectorError> {
        let mut cached = self.token.lock().await;
        if let Some(token) = cached.as_ref() {
            return Ok(Arc::clone(token));
        }
        let token = Arc::new(self.request_token().await?);
        *cached = Some(Arc::clone(&token));
        Ok(token)
    }

    /// Replaces `stale` with a new token, unless another call already did.
    async fn refresh(&self, stale: &Arc<Token>) -> Result<Arc<Token>, ConnectorError> {
        let mut cached = self.token.lock().await;
        if let Some(current) = cached.as_ref()
            && !Arc::ptr_eq(current, stale)
        {
            return Ok(Arc::clone(current));
        }
        let token = Arc::new(self.request_token().await?);
        *cached = Some(Arc::clone(&token));
        Ok(token)
    }

    async fn request_token(&self) -> Result<Token, ConnectorError> {
        let url =
            format!("{}/services/oauth2/token", self.settings.login_url.trim_end_matches('/'));
        // Built before any await: the form serializer is not `Send`.
        let form = {
            let mut form = url::form_urlencoded::Serializer::new(String::new());
            match &self.grant {
                Grant::ClientSecret(secret) => {
                    form.append_pair("grant_type", "client_credentials")
                        .append_pair("client_id", self.client_id.expose())
                        .append_pair("client_secret", secret.expose());
                }
                Grant::Jwt { key, username, audience } => {
                    let assertion = self.assertion(key, username, audience)?;
                    form.append_pair("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer")
                        .append_pair("assertion", &assertion);
                }
            }
            form.finish()
        };
        let request = self
            .client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(form);
        // Asking for a token changes nothing: any transport failure may simply be retried.
        let response = http::send(request, &self.settings.http).await.map_err(|e| {
            ConnectorError::Retryable {
                message: format!("token request: {e}"),
                retry_after: None,
                answer: e.answer().clone(),
            }
        })?;
        match response.status {
            200 => {
                #[derive(Deserialize)]
                struct TokenAnswer {
                    access_token: String,
                    instance_url: String,
                }
                let answer: TokenAnswer = serde_json::from_str(&response.body).map_err(|e| {
                    ConnectorError::Retryable {
                        message: format!("unreadable token answer: {e}"),
                        retry_after: None,
                        answer: response.answer(),
                    }
                })?;
                let instance_url =
                    self.settings.instance_url.clone().unwrap_or(answer.instance_url);
                http::check_url(&instance_url).map_err(|e| ConnectorError::Misconfigured {
                    message: format!("instance URL: {e}"),
                    answer: Answer::default(),
                })?;
                tracing::debug!(instance = %instance_url, "Salesforce token obtained");
                Ok(Token { access_token: Secret::new(answer.access_token), instance_url })
            }
            status if status >= 500 => Err(ConnectorError::Retryable {
                message: format!("token request answered {status}"),
                retry_after: None,
                answer: response.answer(),
            }),
            status => Err(ConnectorError::Misconfigured {
                message: format!(
                    "token request refused ({status}): {}",
                    oauth_error(&response.body)
                ),
                answer: response.answer(),
            }),
        }
    }

    /// An RS256 assertion: the connected app (`iss`) acting as `sub`, for `aud`, valid for a
    /// few minutes.
    fn assertion(
        &self,
        key: &jsonwebtoken::EncodingKey,
        username: &str,
        audience: &str,
    ) -> Result<String, ConnectorError> {
        #[derive(Serialize)]
        struct Claims<'a> {
            iss: &'a str,
            sub: &'a str,
            aud: &'a str,
            exp: u64,
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let claims = Claims {
            iss: self.client_id.expose(),
            sub: username,
            aud: audience,
            exp: now + ASSERTION_LIFETIME_SECS,
        };
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256),
            &claims,
            key,
        )
        .map_err(|e| ConnectorError::Misconfigured {
            message: format!("cannot sign the JWT assertion: {e}"),
            answer: Answer::default(),
        })
    }

    /// `{instance}/services/data/vNN.N/{segments}`, each segment encoded.
    fn data_url(&self, token: &Token, segments: &[&str]) -> Result<url::Url, ConnectorError> {
        let mut url =
            url::Url::parse(&token.instance_url).map_err(|e| ConnectorError::Misconfigured {
                message: format!("instance URL: {e}"),
                answer: Answer::default(),
            })?;
        url.path_segments_mut()
            .map_err(|()| ConnectorError::Misconfigured {
                message: "instance URL has no path".into(),
                answer: Answer::default(),
            })?
            .pop_if_empty()
            .extend(["services", "data", &format!("v{}", self.settings.api_version)])
            .extend(segments);
        Ok(url)
    }

    fn record_url(
        &self,
        token: &Token,
        object: &str,
        field: &str,
        value: &str,
    ) -> Result<url::Url, ConnectorError> {
        self.data_url(token, &["sobjects", object, field, value])
    }

    async fn send(&self, token: &Token, call: &Call<'_>) -> Result<Response, ConnectorError> {
        let bearer = format!("Bearer {}", token.access_token.expose());
        let request = match call {
            Call::Upsert(request) => {
                let mut url = self.record_url(
                    token,
                    &request.object,
                    &request.external_id_field,
                    &request.external_id_value,
                )?;
                if request.operation == Operation::UpdateOnly {
                    url.query_pairs_mut().append_pair("updateOnly", "true");
                }
                self.client.patch(url).json(&request.fields)
            }
            Call::Lookup(request) => {
                let mut url = self.record_url(
                    token,
                    &request.object,
                    &request.external_id_field,
                    &request.external_id_value,
                )?;
                let mut fields = vec!["Id".to_owned()];
                fields.extend(request.fields.iter().cloned());
                url.query_pairs_mut().append_pair("fields", &fields.join(","));
                self.client.get(url)
            }
            Call::Collection(requests) => {
                let Some(first) = requests.first() else {
                    return Err(ConnectorError::Misconfigured {
                        message: "a collection call without records".into(),
                        answer: Answer::default(),
                    });
                };
                let (object, field) = (&first.object, &first.external_id_field);
                let url = self.data_url(token, &["composite", "sobjects", object, field])?;
                let records: Vec<serde_json::Value> = requests
                    .iter()
                    .map(|request| {
                        let mut record: serde_json::Map<String, serde_json::Value> = request
                            .fields
                            .iter()
                            .map(|(name, value)| (name.clone(), value.clone().into()))
                            .collect();
                        record.insert("attributes".into(), serde_json::json!({"type": object}));
                        record.insert(field.clone(), request.external_id_value.clone().into());
                        serde_json::Value::Object(record)
                    })
                    .collect();
                // Without allOrNone each record stands alone: one invalid record must not
                // undo the others.
                let body = serde_json::json!({"allOrNone": false, "records": records});
                self.client.patch(url).json(&body)
            }
        };
        http::send(request.header(reqwest::header::AUTHORIZATION, bearer), &self.settings.http)
            .await
    }

    /// Sends with the cached token; on 401 refreshes it once and sends again.
    async fn call(&self, call: Call<'_>) -> Result<Response, ConnectorError> {
        let token = self.token().await?;
        let response = self.send(&token, &call).await?;
        if response.status != 401 {
            return Ok(response);
        }
        tracing::info!("Salesforce session expired; refreshing the token once");
        let fresh = self.refresh(&token).await?;
        let response = self.send(&fresh, &call).await?;
        if response.status == 401 {
            return Err(ConnectorError::Misconfigured {
                message: format!("unauthorized after a token refresh: {}", errors(&response.body)),
                answer: with_limit_info(&response),
            });
        }
        Ok(response)
    }

    async fn upsert_inner(&self, request: &UpsertRequest) -> Result<UpsertOutcome, ConnectorError> {
        let response = self.call(Call::Upsert(request)).await?;
        let answer = with_limit_info(&response);
        match response.status {
            200 | 201 => {
                #[derive(Deserialize)]
                struct UpsertAnswer {
                    id: String,
                    created: Option<bool>,
                }
                let parsed: UpsertAnswer = serde_json::from_str(&response.body).map_err(|e| {
                    ConnectorError::Ambiguous {
                        message: format!("unreadable answer to a write: {e}"),
                        answer: answer.clone(),
                    }
                })?;
                let created = parsed.created.unwrap_or(response.status == 201);
                Ok(UpsertOutcome { record_id: parsed.id, created, answer })
            }
            // Before v46.0 an update answers 204 with no body; the record id is looked up. The
            // write happened: a failed lookup leaves it in doubt, never "not applied".
            204 => match self
                .lookup_inner(&LookupRequest { fields: Vec::new(), ..LookupRequest::from(request) })
                .await
                .map_err(|error| ConnectorError::Ambiguous {
                    message: format!(
                        "applied (204), but the record id could not be looked up: {error}"
                    ),
                    answer: answer.clone(),
                })? {
                LookupOutcome::Found { record_id, .. } => {
                    Ok(UpsertOutcome { record_id, created: false, answer })
                }
                LookupOutcome::NotFound { .. } => Err(ConnectorError::Ambiguous {
                    message: "204 to an upsert, but the record cannot be found".into(),
                    answer,
                }),
            },
            status => {
                Err(self.classify(status, &response, request.operation == Operation::UpdateOnly))
            }
        }
    }

    /// Whether this API version has sObject Collections upsert.
    fn collections_available(&self) -> bool {
        self.settings
            .api_version
            .split('.')
            .next()
            .and_then(|major| major.parse::<u32>().ok())
            .is_some_and(|major| major >= COLLECTIONS_SINCE_MAJOR_VERSION)
    }

    async fn upsert_batch_inner(
        &self,
        requests: &[UpsertRequest],
    ) -> Vec<Result<UpsertOutcome, ConnectorError>> {
        let calls = plan_calls(requests, self.collections_available());
        let mut outcomes = Vec::with_capacity(requests.len());
        for index in calls.single {
            outcomes.push((index, self.upsert_inner(&requests[index]).await));
        }
        for call in calls.collections {
            let records: Vec<&UpsertRequest> = call.iter().map(|&index| &requests[index]).collect();
            outcomes.extend(call.into_iter().zip(self.collection_upsert(&records).await));
        }
        // Every index is in exactly one call, so this is one outcome per request, in order.
        outcomes.sort_by_key(|(index, _)| *index);
        outcomes.into_iter().map(|(_, outcome)| outcome).collect()
    }

    /// One collection call of writes sharing object and external-id field, no two to one
    /// record; one outcome per write, in the order given.
    async fn collection_upsert(
        &self,
        records: &[&UpsertRequest],
    ) -> Vec<Result<UpsertOutcome, ConnectorError>> {
        let response = match self.call(Call::Collection(records)).await {
            Ok(response) => response,
            Err(error) => return every(records.len(), error),
        };
        let answer = with_limit_info(&response);
        if response.status != 200 {
            return match self.classify(response.status, &response, false) {
                // A whole collection refused for one bad record (a field, the JSON): nothing
                // was written, and alone each record gets its own answer.
                ConnectorError::Rejected { .. } if records.len() > 1 => {
                    let mut outcomes = Vec::with_capacity(records.len());
                    for record in records {
                        outcomes.push(self.upsert_inner(record).await);
                    }
                    outcomes
                }
                error => every(records.len(), error),
            };
        }
        let results = match serde_json::from_str::<Vec<serde_json::Value>>(&response.body) {
            Ok(results) if results.len() == records.len() => results,
            Ok(results) => {
                let error = ConnectorError::Ambiguous {
                    message: format!(
                        "{} results to a collection of {} records",
                        results.len(),
                        records.len()
                    ),
                    answer,
                };
                return every(records.len(), error);
            }
            Err(e) => {
                let error = ConnectorError::Ambiguous {
                    message: format!("unreadable answer to a write: {e}"),
                    answer,
                };
                return every(records.len(), error);
            }
        };
        // Results come in record order.
        results.iter().map(|result| record_result(result, &answer)).collect()
    }

    async fn lookup_inner(&self, request: &LookupRequest) -> Result<LookupOutcome, ConnectorError> {
        let response = self.call(Call::Lookup(request)).await?;
        let answer = with_limit_info(&response);
        match response.status {
            200 => {
                let record: serde_json::Map<String, serde_json::Value> =
                    serde_json::from_str(&response.body).map_err(|e| {
                        ConnectorError::Retryable {
                            message: format!("unreadable record: {e}"),
                            retry_after: None,
                            answer: answer.clone(),
                        }
                    })?;
                let record_id =
                    record.get("Id").and_then(|v| v.as_str()).unwrap_or_default().to_owned();
                let fields = record
                    .iter()
                    .filter(|(name, _)| name.as_str() != "attributes")
                    .map(|(name, value)| (name.clone(), text(value)))
                    .collect();
                Ok(LookupOutcome::Found { record_id, fields, answer })
            }
            404 => Ok(LookupOutcome::NotFound { answer }),
            status => Err(self.classify(status, &response, false)),
        }
    }

    fn classify(&self, status: u16, response: &Response, update_only: bool) -> ConnectorError {
        let answer = with_limit_info(response);
        let codes = error_codes(&response.body);
        match status {
            300 => ConnectorError::Rejected {
                message: format!(
                    "several records match this external id: {}",
                    response.body.trim()
                ),
                answer,
            },
            400 if has_code(&codes, RECORD_LOCKED) => locked(errors(&response.body), answer),
            400 => ConnectorError::Rejected { message: errors(&response.body), answer },
            403 if has_code(&codes, DAILY_LIMIT_EXCEEDED) => {
                daily_limit(errors(&response.body), answer)
            }
            401 | 403 => ConnectorError::Misconfigured { message: errors(&response.body), answer },
            404 if update_only => {
                ConnectorError::Rejected { message: "no record to update".into(), answer }
            }
            404 => ConnectorError::Misconfigured {
                message: format!("unknown object or external-id field: {}", errors(&response.body)),
                answer,
            },
            429 => ConnectorError::RateLimited {
                message: "too many requests".into(),
                retry_after: http::retry_after(response),
                answer,
            },
            status if status >= 500 => ConnectorError::Retryable {
                message: format!("Salesforce answered {status}"),
                retry_after: http::retry_after(response),
                answer,
            },
            status => ConnectorError::Rejected {
                message: format!("unexpected status {status}: {}", errors(&response.body)),
                answer,
            },
        }
    }
}

fn text(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The answer with `Sforce-Limit-Info` kept.
fn with_limit_info(response: &Response) -> Answer {
    let mut answer = response.answer();
    if let Some(limit) = response.header("sforce-limit-info") {
        answer.meta.insert("sforce-limit-info".into(), limit.to_owned());
    }
    answer
}

/// An error's code: `errorCode` in error bodies, `statusCode` in a collection record's
/// `errors`.
fn code(error: &serde_json::Value) -> Option<&str> {
    error.get("errorCode").or_else(|| error.get("statusCode")).and_then(|c| c.as_str())
}

/// Salesforce error bodies are arrays of `{message, errorCode, fields}`.
fn error_codes(body: &str) -> Vec<String> {
    serde_json::from_str::<Vec<serde_json::Value>>(body)
        .map(|errors| errors.iter().filter_map(code).map(str::to_owned).collect())
        .unwrap_or_default()
}

fn has_code(codes: &[String], wanted: &str) -> bool {
    codes.iter().any(|c| c == wanted)
}

fn errors(body: &str) -> String {
    match serde_json::from_str::<Vec<serde_json::Value>>(body) {
        Ok(errors) if !errors.is_empty() => describe(&errors),
        _ => hookgate_connector::excerpt(body.trim()),
    }
}

/// `code: message` of each error, joined.
fn describe(errors: &[serde_json::Value]) -> String {
    errors
        .iter()
        .map(|e| {
            let message = e.get("message").and_then(|m| m.as_str()).unwrap_or("");
            format!("{}: {message}", code(e).unwrap_or("?"))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn locked(message: String, answer: Answer) -> ConnectorError {
    ConnectorError::Retryable {
        message: format!("record locked: {message}"),
        retry_after: None,
        answer,
    }
}

fn daily_limit(message: String, answer: Answer) -> ConnectorError {
    ConnectorError::RateLimited {
        message: format!("daily API limit reached: {message}"),
        retry_after: None,
        answer,
    }
}

/// A collection record's failure, classified by its `statusCode`s as a single upsert's answer
/// with those `errorCode`s is: a locked row retried, the daily limit rate-limited, a server
/// error looked up (alone it comes as a 500, after which the write may have been applied),
/// anything else about the record rejected.
fn record_error(errors: &[serde_json::Value], answer: Answer) -> ConnectorError {
    let codes: Vec<String> = errors.iter().filter_map(code).map(str::to_owned).collect();
    let message = describe(errors);
    if has_code(&codes, RECORD_LOCKED) {
        locked(message, answer)
    } else if has_code(&codes, DAILY_LIMIT_EXCEEDED) {
        daily_limit(message, answer)
    } else if has_code(&codes, "UNKNOWN_EXCEPTION") {
        ConnectorError::Ambiguous { message, answer }
    } else {
        ConnectorError::Rejected { message, answer }
    }
}

/// One collection result: a written record, or why not.
fn record_result(
    result: &serde_json::Value,
    answer: &Answer,
) -> Result<UpsertOutcome, ConnectorError> {
    #[derive(Deserialize)]
    struct RecordResult {
        #[serde(default)]
        id: Option<String>,
        success: bool,
        /// Documented from v46.0, the first version with collections.
        #[serde(default)]
        created: bool,
        #[serde(default)]
        errors: Vec<serde_json::Value>,
    }
    // Each record's own evidence is its own result, not the whole answer.
    let answer = Answer {
        status: answer.status,
        excerpt: Some(hookgate_connector::excerpt(&result.to_string())),
        meta: answer.meta.clone(),
    };
    match serde_json::from_value::<RecordResult>(result.clone()) {
        Ok(RecordResult { success: true, id: Some(id), created, .. }) => {
            Ok(UpsertOutcome { record_id: id, created, answer })
        }
        Ok(RecordResult { success: false, errors, .. }) => Err(record_error(&errors, answer)),
        Ok(RecordResult { success: true, id: None, .. }) => Err(ConnectorError::Ambiguous {
            message: "a record result with success but no id".into(),
            answer,
        }),
        Err(e) => Err(ConnectorError::Ambiguous {
            message: format!("unreadable record result: {e}"),
            answer,
        }),
    }
}

/// A failure of a whole call, as the outcome of each of its writes.
fn every(count: usize, error: ConnectorError) -> Vec<Result<UpsertOutcome, ConnectorError>> {
    vec![Err(error); count]
}

/// How a batch goes out: calls of writes that can share a collection, and the writes that go
/// alone.
#[derive(Debug, Default)]
struct Calls {
    /// Indexes of the writes of each collection call.
    collections: Vec<Vec<usize>>,
    /// Update-only writes, and every write when the API version has no collections.
    single: Vec<usize>,
}

/// Groups writes into collection calls: one (object, external-id field) per call (both are
/// in the URL), at most [`COLLECTION_RECORDS_MAX`] records, and never two writes of one
/// record in a call (the engine does not send them; what Salesforce would do is not
/// documented).
fn plan_calls(requests: &[UpsertRequest], collections: bool) -> Calls {
    let mut calls = Calls::default();
    for (index, request) in requests.iter().enumerate() {
        if !collections || request.operation == Operation::UpdateOnly {
            calls.single.push(index);
            continue;
        }
        let fits = |call: &Vec<usize>| {
            call.len() < COLLECTION_RECORDS_MAX
                && call.first().is_some_and(|&first| {
                    requests[first].object == request.object
                        && requests[first].external_id_field == request.external_id_field
                })
                && !call
                    .iter()
                    .any(|&other| requests[other].external_id_value == request.external_id_value)
        };
        match calls.collections.iter_mut().find(|call| fits(call)) {
            Some(call) => call.push(index),
            None => calls.collections.push(vec![index]),
        }
    }
    calls
}

fn oauth_error(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .map(|v| {
            let error = v.get("error").and_then(|e| e.as_str()).unwrap_or("?");
            let description = v.get("error_description").and_then(|e| e.as_str()).unwrap_or("");
            format!("{error}: {description}")
        })
        .unwrap_or_else(|| hookgate_connector::excerpt(body))
}

impl Connector for Salesforce {
    fn describe(&self) -> Description {
        Description {
            kind: "salesforce".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            capabilities: Capabilities { update_only: true, idempotency_keys: false },
            settings_schema: serde_json::to_value(schemars::schema_for!(SalesforceSettings))
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
        if self.collections_available() { COLLECTION_RECORDS_MAX } else { 1 }
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
        Box::pin(async move { self.token().await.map(|_| ()) })
    }
}

impl hookgate_connector::Kind for Salesforce {
    type Settings = SalesforceSettings;

    fn about() -> KindDescription {
        KindDescription {
            kind: "salesforce".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            settings_schema: serde_json::Value::Null,
            credentials: vec!["client_id".into(), "client_secret".into()],
            rules: vec![
                TargetRule::ExternalIdFieldNot {
                    names: vec!["Id".into()],
                    message: "Salesforce cannot upsert by `Id`".into(),
                    hint: "PATCH on `sobjects/{object}/Id` is refused (METHOD_NOT_ALLOWED); use an external-id field such as `Ext_Id__c`".into(),
                },
                TargetRule::ExternalIdFieldNotInFields {
                    hint: "Salesforce rejects an upsert whose body repeats the external-id field; it is taken from the URL".into(),
                },
            ],
            limits: Default::default(),
            file_settings: Vec::new(),
        }
    }

    fn required_credentials(settings: &BTreeMap<String, serde_json::Value>) -> Vec<String> {
        required_credentials(settings).iter().map(|name| (*name).to_owned()).collect()
    }

    fn create(
        settings: &BTreeMap<String, serde_json::Value>,
        credentials: &Credentials,
    ) -> BoxFuture<'static, Result<Salesforce, ConfigError>> {
        let built = Salesforce::from_config(settings, credentials);
        Box::pin(async move { built })
    }
}

#[cfg(test)]
mod tests;
