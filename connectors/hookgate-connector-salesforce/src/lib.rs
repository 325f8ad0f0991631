//! Salesforce through its REST API.
//!
//! - **Upsert** by external id: `PATCH {instance}/services/data/vNN.N/sobjects/{object}/{field}/{value}`
//!   (value URL-encoded; `?updateOnly=true` for update-only writes). 201 created; 200 updated
//!   (v46.0 and later); 204 updated (before v46.0, no body: the record id is looked up).
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

    fn record_url(
        &self,
        token: &Token,
        object: &str,
        field: &str,
        value: &str,
    ) -> Result<url::Url, ConnectorError> {
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
            .extend([
                "services",
                "data",
                &format!("v{}", self.settings.api_version),
                "sobjects",
                object,
                field,
                value,
            ]);
        Ok(url)
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
            400 if codes.iter().any(|c| c == "UNABLE_TO_LOCK_ROW") => ConnectorError::Retryable {
                message: format!("record locked: {}", errors(&response.body)),
                retry_after: None,
                answer,
            },
            400 => ConnectorError::Rejected { message: errors(&response.body), answer },
            403 if codes.iter().any(|c| c == "REQUEST_LIMIT_EXCEEDED") => {
                ConnectorError::RateLimited {
                    message: format!("daily API limit reached: {}", errors(&response.body)),
                    retry_after: None,
                    answer,
                }
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

/// Salesforce error bodies are arrays of `{message, errorCode, fields}`.
fn error_codes(body: &str) -> Vec<String> {
    serde_json::from_str::<Vec<serde_json::Value>>(body)
        .map(|errors| {
            errors
                .iter()
                .filter_map(|e| e.get("errorCode").and_then(|c| c.as_str()).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn errors(body: &str) -> String {
    match serde_json::from_str::<Vec<serde_json::Value>>(body) {
        Ok(errors) if !errors.is_empty() => errors
            .iter()
            .map(|e| {
                let code = e.get("errorCode").and_then(|c| c.as_str()).unwrap_or("?");
                let message = e.get("message").and_then(|m| m.as_str()).unwrap_or("");
                format!("{code}: {message}")
            })
            .collect::<Vec<_>>()
            .join("; "),
        _ => hookgate_connector::excerpt(body.trim()),
    }
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
