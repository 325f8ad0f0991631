//! `kind: http`: a declarative connector for a plain REST CRM, described by settings instead
//! of code.
//!
//! - **Upsert**: one request by external id, its method, path and JSON body from templates
//!   ([`UpsertSettings`]); the status says created or updated, a JSON pointer finds the
//!   record id. The idempotency key travels in a header if the CRM honours one.
//! - **Lookup**: one request by external id ([`LookupSettings`]); status lists say found or
//!   not found, JSON pointers find the id and the fields.
//! - **Auth**: none, a bearer token, HTTP Basic, an API key header, or OAuth 2.0 client
//!   credentials ([`Auth`]); a token is cached until shortly before it expires and fetched
//!   again once when a call answers 401.
//! - **Answers to classes**: status lists ([`ClassifySettings`]); `Retry-After` (seconds or
//!   an HTTP date) on rate-limited and retryable answers. A timeout or a connection lost after
//!   a write was sent is ambiguous, and so is a 2xx write answer that cannot be read; a
//!   failure before sending is retryable; a lookup that gets no answer is retryable.
//! - **Safety**: templates are compiled at start (a syntax error or an unknown variable fails
//!   there, not per call); URL values are encoded as single path segments and the rendered
//!   path is checked, so a payload value cannot leave the path the settings describe; body
//!   values are written as JSON and the body is parsed before it is sent; redirects are not
//!   followed, so requests and their credentials never leave `base_url`'s host.
//!
//! # Layout
//! - `settings`: the settings types, their defaults and their JSON Schema.
//! - `template`: the template environment, URL encoding and path checks.
//! - this file: building an instance from settings (every problem named by its setting),
//!   tokens, requests and the classification of answers.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use hookgate_connector::{
    Answer, BoxFuture, Capabilities, ConfigError, Connector, ConnectorError, Credentials,
    Description, LookupOutcome, LookupRequest, Operation, Secret, UpsertOutcome, UpsertRequest,
};
use hookgate_connector_http::{self as http, HttpSettings, Response};
use minijinja::Environment;
use reqwest::header::{self, HeaderMap, HeaderName, HeaderValue};
use serde::Serialize;
use tokio::sync::Mutex;

mod settings;
mod template;

pub use settings::{
    Auth, ClassifySettings, ClientAuthentication, HealthcheckSettings, LookupSettings, ReadMethod,
    RestSettings, UpsertSettings, WriteMethod,
};

/// The shortest `timeout`: below it, a healthy CRM's ordinary latency would read as failure.
pub const TIMEOUT_MIN: Duration = Duration::from_millis(100);
/// The longest `timeout`: a worker waits no longer than this on one call.
pub const TIMEOUT_MAX: Duration = Duration::from_secs(300);
/// The smallest `max_answer_bytes`: room for an ordinary record or error answer.
pub const ANSWER_BYTES_MIN: usize = 1024;
/// The largest `max_answer_bytes`: the most one answer may hold in memory.
pub const ANSWER_BYTES_MAX: usize = 64 * 1024 * 1024;
/// The longest a connection may take to open, within `timeout`.
const CONNECT_TIMEOUT_MAX: Duration = Duration::from_secs(5);
/// A token is fetched again this long before it expires, or a tenth of its lifetime if that
/// is shorter, so that a call never starts with a token about to die.
const TOKEN_EXPIRY_MARGIN_MAX: Duration = Duration::from_secs(60);
/// The longest lifetime a token answer is believed for: a bogus `expires_in` must not keep a
/// token cached for ever (a 401 would still refresh it, but only after a failed call).
const TOKEN_LIFETIME_MAX: Duration = Duration::from_secs(24 * 3600);
/// Characters of an answer quoted in an error message (the whole excerpt is in the evidence).
const MESSAGE_QUOTE_CHARS_MAX: usize = 200;
/// Headers that the HTTP client owns: a setting cannot set them.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "proxy-authorization",
];

/// A REST CRM instance: its settings compiled into templates, headers and status lists.
#[derive(Debug)]
pub struct Rest {
    /// `base_url`; rendered paths are appended to it.
    base: url::Url,
    auth: Authenticator,
    /// `headers` and `secret_headers`, the latter marked sensitive so `Debug` hides them.
    headers: HeaderMap,
    /// The compiled templates, by setting name (`upsert.url`, `lookup.body`, ...).
    templates: Environment<'static>,
    upsert: UpsertSettings,
    idempotency_header: Option<HeaderName>,
    lookup: LookupSettings,
    healthcheck: Option<url::Url>,
    classify: ClassifySettings,
    retry_after: HeaderName,
    evidence_headers: Vec<HeaderName>,
    http: HttpSettings,
    /// One client per instance; it follows no redirect.
    client: reqwest::Client,
    /// The cached OAuth token; replaced when it is about to expire or a call answers 401.
    token: Mutex<Option<Arc<Token>>>,
}

/// What proves who sends a request.
#[derive(Debug)]
enum Authenticator {
    None,
    /// A header with a fixed, sensitive value: bearer, basic or an API key.
    Header(HeaderName, HeaderValue),
    OAuth(OAuthClient),
}

#[derive(Debug)]
struct OAuthClient {
    token_url: url::Url,
    client_id: Secret,
    client_secret: Secret,
    scope: Option<String>,
    client_authentication: ClientAuthentication,
}

#[derive(Debug)]
struct Token {
    /// `Bearer <token>`, sensitive.
    authorization: HeaderValue,
    /// When to fetch a new one; `None`: until a call answers 401.
    refresh_at: Option<Instant>,
}

/// Whether a request may change the CRM: what a lost answer means depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Write,
    Read,
}

/// One request, kept so that a 401 can send it again with a fresh token.
#[derive(Debug)]
struct Call {
    method: reqwest::Method,
    url: url::Url,
    body: Option<String>,
    headers: Vec<(HeaderName, HeaderValue)>,
    access: Access,
}

impl Call {
    /// `PUT /objects/...`: kept with the answer, so evidence says what was asked.
    fn line(&self) -> String {
        let query = self.url.query().map(|q| format!("?{q}")).unwrap_or_default();
        format!("{} {}{query}", self.method, self.url.path())
    }
}

/// The variables of upsert templates.
#[derive(Serialize)]
struct UpsertContext<'a> {
    object: &'a str,
    external_id_field: &'a str,
    external_id_value: &'a str,
    fields: &'a BTreeMap<String, String>,
    operation: &'static str,
    idempotency_key: &'a str,
}

/// The variables of lookup templates.
#[derive(Serialize)]
struct LookupContext<'a> {
    object: &'a str,
    external_id_field: &'a str,
    external_id_value: &'a str,
    fields: &'a [String],
}

/// The credential names that `settings` refers to (`auth` and `secret_headers`), so that
/// `check` can say which ones an instance lacks. Settings that do not parse contribute what
/// can be read; their problems are reported by the settings check.
pub fn required_credentials(settings: &BTreeMap<String, serde_json::Value>) -> Vec<String> {
    let mut names = BTreeSet::new();
    if let Some(auth) =
        settings.get("auth").and_then(|auth| serde_json::from_value::<Auth>(auth.clone()).ok())
    {
        names.extend(auth.credentials().into_iter().map(|(name, _)| name));
    }
    if let Some(serde_json::Value::Object(headers)) = settings.get("secret_headers") {
        names.extend(headers.values().filter_map(|v| v.as_str()).map(str::to_owned));
    }
    names.into_iter().collect()
}

/// Problems found while building an instance, each named by its setting, all reported at once.
#[derive(Debug, Default)]
struct Problems(Vec<String>);

impl Problems {
    fn add(&mut self, setting: &str, message: impl std::fmt::Display) {
        self.0.push(format!("settings.{setting}: {message}"));
    }

    /// The value, or `None` with the problem recorded.
    fn check<T>(&mut self, setting: &str, result: Result<T, String>) -> Option<T> {
        result.map_err(|message| self.add(setting, message)).ok()
    }
}

impl Rest {
    /// Builds an instance from `hookgate.yaml`'s `settings` and resolved `credentials`.
    pub fn from_config(
        settings: &BTreeMap<String, serde_json::Value>,
        credentials: &Credentials,
    ) -> Result<Rest, ConfigError> {
        Rest::new(settings::parse(settings).map_err(ConfigError)?, credentials)
    }

    /// Builds an instance, reporting every problem at once, each named by its setting.
    pub fn new(settings: RestSettings, credentials: &Credentials) -> Result<Rest, ConfigError> {
        let mut problems = Problems::default();
        let base = problems.check("base_url", check_base_url(&settings.base_url));
        let timeout = problems.check("timeout", check_timeout(&settings.timeout));
        if !(ANSWER_BYTES_MIN..=ANSWER_BYTES_MAX).contains(&settings.max_answer_bytes) {
            problems.add(
                "max_answer_bytes",
                format!("must be from {ANSWER_BYTES_MIN} to {ANSWER_BYTES_MAX}"),
            );
        }
        let auth = authenticator(&settings.auth, credentials, &mut problems);
        let idempotency_header = settings
            .upsert
            .idempotency_header
            .as_deref()
            .and_then(|name| problems.check("upsert.idempotency_header", header_name(name)));
        let mut owned: Vec<(HeaderName, &str)> = Vec::new();
        if let Some(name) = &idempotency_header {
            owned.push((name.clone(), "upsert.idempotency_header"));
        }
        match &auth {
            Some(Authenticator::Header(name, _)) => owned.push((name.clone(), "auth")),
            Some(Authenticator::OAuth(_)) => owned.push((header::AUTHORIZATION, "auth")),
            _ => {}
        }
        let headers = fixed_headers(&settings, credentials, &owned, &mut problems);
        let templates = compile_templates(&settings, &mut problems);
        check_statuses(&settings, &mut problems);
        if settings.lookup.fields.is_none() {
            // Found alone does not say the write in doubt was applied: the record may predate
            // it. Every such write would be sent again, a second effect.
            problems.add(
                "lookup.fields",
                "is required: a write whose answer was lost is looked up, and only the record's \
                 fields tell whether it was applied; without them it would be written again \
                 (`fields: /fields`, a JSON pointer to the object of fields in the answer)",
            );
        }
        for (setting, pointer) in [
            ("upsert.record_id", Some(&settings.upsert.record_id)),
            ("lookup.record_id", Some(&settings.lookup.record_id)),
            ("lookup.fields", settings.lookup.fields.as_ref()),
        ] {
            if let Some(pointer) = pointer
                && !pointer.starts_with('/')
            {
                problems.add(setting, format!("`{pointer}` is not a JSON pointer like `/id`"));
            }
        }
        let healthcheck = match (&settings.healthcheck, &base) {
            (Some(check), Some(base)) => problems.check(
                "healthcheck.url",
                template::check_url_source(&check.url)
                    .and_then(|()| template::check_rendered_path(&check.url))
                    .and_then(|()| join(base, &check.url)),
            ),
            _ => None,
        };
        let retry_after =
            problems.check("classify.retry_after", header_name(&settings.classify.retry_after));
        let evidence_headers: Vec<HeaderName> = settings
            .evidence_headers
            .iter()
            .filter_map(|name| problems.check("evidence_headers", header_name(name)))
            .collect();
        let client = timeout.and_then(|timeout| {
            problems.check("timeout", build_client(timeout).map_err(|e| e.to_string()))
        });

        // Every `None` above recorded a problem; the second `else` is only the compiler's due.
        if !problems.0.is_empty() {
            return Err(ConfigError(problems.0.join("; ")));
        }
        let (
            Some(base),
            Some(timeout),
            Some(auth),
            Some(headers),
            Some(templates),
            Some(retry_after),
            Some(client),
        ) = (base, timeout, auth, headers, templates, retry_after, client)
        else {
            return Err(ConfigError("settings: invalid".into()));
        };
        let http = HttpSettings {
            connect_timeout_ms: millis(timeout.min(CONNECT_TIMEOUT_MAX)),
            request_timeout_ms: millis(timeout),
            response_bytes_max: settings.max_answer_bytes,
        };
        Ok(Rest {
            base,
            auth,
            headers,
            templates,
            upsert: settings.upsert,
            idempotency_header,
            lookup: settings.lookup,
            healthcheck,
            classify: settings.classify,
            retry_after,
            evidence_headers,
            http,
            client,
            token: Mutex::new(None),
        })
    }

    // --- Tokens ---

    /// The cached token if it is not about to expire, else a new one.
    async fn token(&self, oauth: &OAuthClient) -> Result<Arc<Token>, ConnectorError> {
        let mut cached = self.token.lock().await;
        if let Some(token) = cached.as_ref()
            && token.refresh_at.is_none_or(|at| Instant::now() < at)
        {
            return Ok(Arc::clone(token));
        }
        let token = Arc::new(self.request_token(oauth).await?);
        *cached = Some(Arc::clone(&token));
        Ok(token)
    }

    /// Replaces `stale` after a 401, unless another call already did.
    async fn refresh(
        &self,
        oauth: &OAuthClient,
        stale: &Arc<Token>,
    ) -> Result<Arc<Token>, ConnectorError> {
        let mut cached = self.token.lock().await;
        if let Some(current) = cached.as_ref()
            && !Arc::ptr_eq(current, stale)
        {
            return Ok(Arc::clone(current));
        }
        tracing::info!(token_url = %oauth.token_url, "a call answered 401; fetching a new token once");
        let token = Arc::new(self.request_token(oauth).await?);
        *cached = Some(Arc::clone(&token));
        Ok(token)
    }

    async fn request_token(&self, oauth: &OAuthClient) -> Result<Token, ConnectorError> {
        // Built before any await: the form serializer is not `Send`.
        let form = {
            let mut form = url::form_urlencoded::Serializer::new(String::new());
            form.append_pair("grant_type", "client_credentials");
            if let Some(scope) = &oauth.scope {
                form.append_pair("scope", scope);
            }
            if oauth.client_authentication == ClientAuthentication::ClientSecretPost {
                form.append_pair("client_id", oauth.client_id.expose())
                    .append_pair("client_secret", oauth.client_secret.expose());
            }
            form.finish()
        };
        let mut request = self
            .client
            .post(oauth.token_url.clone())
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(header::ACCEPT, "application/json")
            .body(form);
        if oauth.client_authentication == ClientAuthentication::ClientSecretBasic {
            // RFC 6749 §2.3.1: each part form-encoded, then HTTP Basic.
            let encode = |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect();
            let id: String = encode(oauth.client_id.expose());
            let secret: String = encode(oauth.client_secret.expose());
            request = request.header(
                header::AUTHORIZATION,
                basic(&id, &secret).map_err(|()| {
                    misconfigured("the client id or secret cannot be sent in a header".into())
                })?,
            );
        }
        let line = format!("POST {}", oauth.token_url.path());
        // Asking for a token changes nothing: whatever the transport did, it may be retried.
        let response =
            http::send(request, &self.http).await.map_err(|error| ConnectorError::Retryable {
                message: format!("token request: {error}"),
                retry_after: None,
                answer: with_line(error.answer().clone(), &line),
            })?;
        let answer = self.answer(&response, &line);
        let status = response.status;
        match status {
            200..=299 => {
                let parsed = (!response.truncated)
                    .then(|| serde_json::from_str::<serde_json::Value>(&response.body).ok())
                    .flatten();
                let access_token =
                    parsed.as_ref().and_then(|v| v.get("access_token")).and_then(|v| v.as_str());
                let Some(access_token) = access_token.filter(|t| !t.is_empty()) else {
                    return Err(ConnectorError::Retryable {
                        message: "the token answer has no `access_token`".into(),
                        retry_after: None,
                        answer,
                    });
                };
                let token_type =
                    parsed.as_ref().and_then(|v| v.get("token_type")).and_then(|v| v.as_str());
                if token_type.is_some_and(|t| !t.eq_ignore_ascii_case("bearer")) {
                    return Err(misconfigured_with(
                        format!(
                            "the token endpoint issues `{}` tokens, not bearer tokens",
                            token_type.unwrap_or_default()
                        ),
                        answer,
                    ));
                }
                let mut authorization = HeaderValue::from_str(&format!("Bearer {access_token}"))
                    .map_err(|_| ConnectorError::Retryable {
                        message: "the access token cannot be sent in a header".into(),
                        retry_after: None,
                        answer: answer.clone(),
                    })?;
                authorization.set_sensitive(true);
                let lifetime = parsed
                    .as_ref()
                    .and_then(|v| v.get("expires_in"))
                    .and_then(|v| v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok())))
                    .map(|secs| Duration::from_secs(secs).min(TOKEN_LIFETIME_MAX));
                let refresh_at = lifetime.map(|lifetime| {
                    Instant::now() + lifetime - (lifetime / 10).min(TOKEN_EXPIRY_MARGIN_MAX)
                });
                tracing::debug!(token_url = %oauth.token_url, ?lifetime, "token obtained");
                Ok(Token { authorization, refresh_at })
            }
            _ if self.classify.rate_limited.contains(&status) => Err(ConnectorError::RateLimited {
                message: format!("the token endpoint answered {status}"),
                retry_after: self.retry_after(&response),
                answer,
            }),
            500..=599 | 408 => Err(ConnectorError::Retryable {
                message: format!("the token endpoint answered {status}"),
                retry_after: self.retry_after(&response),
                answer,
            }),
            _ => Err(misconfigured_with(
                format!(
                    "the token request was refused ({status}): {}",
                    oauth_error(&response.body)
                ),
                answer,
            )),
        }
    }

    // --- Requests ---

    /// Sends one request with the instance's headers and auth; on 401 with OAuth, fetches a
    /// new token once and sends again (a 401 means nothing was applied). A read that gets no
    /// answer is retryable: it can simply be made again.
    async fn call(&self, call: &Call) -> Result<Response, ConnectorError> {
        let result = match &self.auth {
            Authenticator::OAuth(oauth) => {
                let token = self.token(oauth).await?;
                match self.send(call, Some(&token)).await {
                    Ok(response) if response.status == 401 => {
                        let fresh = self.refresh(oauth, &token).await?;
                        self.send(call, Some(&fresh)).await
                    }
                    other => other,
                }
            }
            _ => self.send(call, None).await,
        };
        result.map_err(|error| match (call.access, error) {
            (Access::Read, ConnectorError::Ambiguous { message, answer }) => {
                ConnectorError::Retryable { message, retry_after: None, answer }
            }
            (_, error) => error,
        })
    }

    async fn send(&self, call: &Call, token: Option<&Token>) -> Result<Response, ConnectorError> {
        let mut headers = self.headers.clone();
        if !headers.contains_key(header::ACCEPT) {
            headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        }
        match (&self.auth, token) {
            (Authenticator::Header(name, value), _) => {
                headers.insert(name.clone(), value.clone());
            }
            (_, Some(token)) => {
                headers.insert(header::AUTHORIZATION, token.authorization.clone());
            }
            _ => {}
        }
        for (name, value) in &call.headers {
            headers.insert(name.clone(), value.clone());
        }
        let mut request = self.client.request(call.method.clone(), call.url.clone());
        if let Some(body) = &call.body {
            if !headers.contains_key(header::CONTENT_TYPE) {
                headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            }
            request = request.body(body.clone());
        }
        http::send(request.headers(headers), &self.http)
            .await
            .map_err(|error| with_request_line(error, &call.line()))
    }

    /// The answer as evidence: status, excerpt, the request line and the headers worth
    /// keeping.
    fn answer(&self, response: &Response, line: &str) -> Answer {
        let mut answer = with_line(response.answer(), line);
        for name in self.evidence_headers.iter().chain([&self.retry_after]) {
            if let Some(value) = response.header(name.as_str()) {
                answer.meta.insert(name.as_str().to_owned(), value.to_owned());
            }
        }
        answer
    }

    /// How long the CRM asks to wait: the `classify.retry_after` header, in seconds or as an
    /// HTTP date (a date in the past is no wait).
    fn retry_after(&self, response: &Response) -> Option<Duration> {
        let value = response.header(self.retry_after.as_str())?.trim();
        if let Ok(seconds) = value.parse::<u64>() {
            return Some(Duration::from_secs(seconds));
        }
        let format = time::macros::format_description!(
            "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
        );
        let date = time::PrimitiveDateTime::parse(value, format).ok()?.assume_utc();
        Some(Duration::try_from(date - time::OffsetDateTime::now_utc()).unwrap_or(Duration::ZERO))
    }

    /// A status that is neither a success nor (for lookups) not-found, as its error class.
    fn classify(&self, response: &Response, answer: Answer, access: Access) -> ConnectorError {
        let status = response.status;
        let what = match access {
            Access::Write => "the write",
            Access::Read => "the lookup",
        };
        let message = format!("{what} answered {status}: {}", quote(&response.body));
        let lists = &self.classify;
        if lists.rate_limited.contains(&status) {
            ConnectorError::RateLimited { message, retry_after: self.retry_after(response), answer }
        } else if lists.retryable.contains(&status) {
            ConnectorError::Retryable { message, retry_after: self.retry_after(response), answer }
        } else if lists.rejected.contains(&status) {
            ConnectorError::Rejected { message, answer }
        } else if lists.misconfigured.contains(&status) {
            ConnectorError::Misconfigured { message, answer }
        } else {
            match (access, status) {
                // A success the settings do not name: the write may well have been applied.
                (Access::Write, 200..=299) => ConnectorError::Ambiguous { message, answer },
                (_, 500..=599) => ConnectorError::Retryable {
                    message,
                    retry_after: self.retry_after(response),
                    answer,
                },
                _ => ConnectorError::Rejected { message, answer },
            }
        }
    }

    // --- Templates ---

    fn render(&self, name: &str, context: &minijinja::Value) -> Result<String, ConnectorError> {
        self.templates.get_template(name).and_then(|template| template.render(context)).map_err(
            |e| rejected(format!("settings.{name}: cannot render: {}", template::describe(&e))),
        )
    }

    /// The request URL: the rendered path, checked, after `base_url`.
    fn url(&self, name: &str, context: &minijinja::Value) -> Result<url::Url, ConnectorError> {
        let rendered = self.render(name, context)?;
        template::check_rendered_path(&rendered)
            .and_then(|()| join(&self.base, &rendered))
            .map_err(|e| rejected(format!("settings.{name}: {e}; nothing was sent")))
    }

    /// The request body: rendered, bounded and parsed as JSON before anything is sent.
    fn body(&self, name: &str, context: &minijinja::Value) -> Result<String, ConnectorError> {
        let body = self.render(name, context)?;
        if body.len() > template::BODY_BYTES_MAX {
            return Err(rejected(format!(
                "settings.{name}: the rendered body is longer than {} bytes; nothing was sent",
                template::BODY_BYTES_MAX
            )));
        }
        if let Err(error) = serde_json::from_str::<serde::de::IgnoredAny>(&body) {
            return Err(rejected(format!(
                "settings.{name}: the rendered body is not JSON ({error}); nothing was sent: {}",
                quote(&body)
            )));
        }
        Ok(body)
    }

    // --- The connector ---

    async fn upsert_inner(&self, request: &UpsertRequest) -> Result<UpsertOutcome, ConnectorError> {
        if request.operation == Operation::UpdateOnly && !self.upsert.update_only {
            return Err(rejected(
                "an update-only write, but settings.upsert.update_only is false: the templates \
                 are not known to keep the CRM from creating a record"
                    .into(),
            ));
        }
        let context = minijinja::Value::from(minijinja::value::Serde(UpsertContext {
            object: &request.object,
            external_id_field: &request.external_id_field,
            external_id_value: &request.external_id_value,
            fields: &request.fields,
            operation: match request.operation {
                Operation::Upsert => "upsert",
                Operation::UpdateOnly => "update_only",
            },
            idempotency_key: &request.idempotency_key,
        }));
        let url = self.url("upsert.url", &context)?;
        let body = self.body("upsert.body", &context)?;
        let mut headers = Vec::new();
        if let Some(name) = &self.idempotency_header {
            let value = HeaderValue::from_str(&request.idempotency_key).map_err(|_| {
                rejected("the idempotency key cannot be sent in a header; nothing was sent".into())
            })?;
            headers.push((name.clone(), value));
        }
        let method = match self.upsert.method {
            WriteMethod::Put => reqwest::Method::PUT,
            WriteMethod::Post => reqwest::Method::POST,
            WriteMethod::Patch => reqwest::Method::PATCH,
        };
        let call = Call { method, url, body: Some(body), headers, access: Access::Write };
        let response = self.call(&call).await?;
        let answer = self.answer(&response, &call.line());
        let status = response.status;
        let created_by_status = self.upsert.created.contains(&status);
        if !created_by_status && !self.upsert.updated.contains(&status) {
            return Err(self.classify(&response, answer, Access::Write));
        }
        // The write was applied; from here on, what cannot be read leaves it in doubt.
        let ambiguous = |message: String, answer: Answer| ConnectorError::Ambiguous {
            message: format!("applied ({status}), but {message}"),
            answer,
        };
        if response.truncated {
            return Err(ambiguous(
                format!(
                    "the answer is longer than max_answer_bytes ({})",
                    self.http.response_bytes_max
                ),
                answer,
            ));
        }
        if response.body.trim().is_empty() {
            let lookup = LookupRequest { fields: Vec::new(), ..LookupRequest::from(request) };
            return match self.lookup_inner(&lookup).await {
                Ok(LookupOutcome::Found { record_id, .. }) => {
                    Ok(UpsertOutcome { record_id, created: created_by_status, answer })
                }
                Ok(LookupOutcome::NotFound { .. }) => {
                    Err(ambiguous("the lookup for its record id found nothing".into(), answer))
                }
                Err(error) => {
                    Err(ambiguous(format!("the lookup for its record id failed: {error}"), answer))
                }
            };
        }
        let parsed: serde_json::Value = match serde_json::from_str(&response.body) {
            Ok(parsed) => parsed,
            Err(error) => {
                return Err(ambiguous(format!("the answer is not JSON: {error}"), answer));
            }
        };
        let Some(record_id) = pointer_id(&parsed, &self.upsert.record_id) else {
            return Err(ambiguous(
                format!(
                    "the answer has no record id at settings.upsert.record_id `{}`",
                    self.upsert.record_id
                ),
                answer,
            ));
        };
        Ok(UpsertOutcome { record_id, created: created_by_status, answer })
    }

    async fn lookup_inner(&self, request: &LookupRequest) -> Result<LookupOutcome, ConnectorError> {
        let context = minijinja::Value::from(minijinja::value::Serde(LookupContext {
            object: &request.object,
            external_id_field: &request.external_id_field,
            external_id_value: &request.external_id_value,
            fields: &request.fields,
        }));
        let url = self.url("lookup.url", &context)?;
        let body = match self.lookup.body {
            Some(_) => Some(self.body("lookup.body", &context)?),
            None => None,
        };
        let method = match self.lookup.method {
            ReadMethod::Get => reqwest::Method::GET,
            ReadMethod::Post => reqwest::Method::POST,
        };
        let call = Call { method, url, body, headers: Vec::new(), access: Access::Read };
        let response = self.call(&call).await?;
        let answer = self.answer(&response, &call.line());
        let status = response.status;
        if self.lookup.not_found.contains(&status) {
            return Ok(LookupOutcome::NotFound { answer });
        }
        if !self.lookup.found.contains(&status) {
            return Err(self.classify(&response, answer, Access::Read));
        }
        if response.truncated {
            return Err(rejected_with(
                format!(
                    "the record is longer than max_answer_bytes ({})",
                    self.http.response_bytes_max
                ),
                answer,
            ));
        }
        // An unreadable record is retried, never taken for "not found": that would let
        // reconciliation create a second record.
        let unreadable = |message: String, answer: Answer| ConnectorError::Retryable {
            message: format!("the lookup answered {status}, but {message}"),
            retry_after: None,
            answer,
        };
        let parsed: serde_json::Value = match serde_json::from_str(&response.body) {
            Ok(parsed) => parsed,
            Err(error) => {
                return Err(unreadable(format!("the answer is not JSON: {error}"), answer));
            }
        };
        let Some(record_id) = pointer_id(&parsed, &self.lookup.record_id) else {
            return Err(unreadable(
                format!(
                    "the answer has no record id at settings.lookup.record_id `{}`",
                    self.lookup.record_id
                ),
                answer,
            ));
        };
        let fields = match self.lookup.fields.as_deref() {
            None => BTreeMap::new(),
            Some(pointer) => match parsed.pointer(pointer) {
                Some(serde_json::Value::Object(fields)) => {
                    fields.iter().map(|(name, value)| (name.clone(), stringify(value))).collect()
                }
                _ => {
                    return Err(unreadable(
                        format!("the answer has no object at settings.lookup.fields `{pointer}`"),
                        answer,
                    ));
                }
            },
        };
        Ok(LookupOutcome::Found { record_id, fields, answer })
    }

    async fn healthcheck_inner(&self) -> Result<(), ConnectorError> {
        let Some(url) = &self.healthcheck else {
            if let Authenticator::OAuth(oauth) = &self.auth {
                self.token(oauth).await?;
            }
            return Ok(());
        };
        let call = Call {
            method: reqwest::Method::GET,
            url: url.clone(),
            body: None,
            headers: Vec::new(),
            access: Access::Read,
        };
        let response = self.call(&call).await?;
        if (200..=299).contains(&response.status) {
            return Ok(());
        }
        let answer = self.answer(&response, &call.line());
        Err(self.classify(&response, answer, Access::Read))
    }
}

impl Connector for Rest {
    fn describe(&self) -> Description {
        Description {
            kind: "http".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            capabilities: Capabilities {
                update_only: self.upsert.update_only,
                idempotency_keys: self.idempotency_header.is_some(),
            },
            settings_schema: serde_json::to_value(schemars::schema_for!(RestSettings))
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
        Box::pin(self.healthcheck_inner())
    }
}

// --- Building an instance ---

fn check_base_url(text: &str) -> Result<url::Url, String> {
    let url = http::check_url(text).map_err(|e| e.to_string())?;
    if url.cannot_be_a_base() || url.query().is_some() || url.fragment().is_some() {
        return Err(format!("`{text}` must be a URL without a query or a fragment"));
    }
    Ok(url)
}

fn check_timeout(text: &str) -> Result<Duration, String> {
    let timeout = humantime::parse_duration(text)
        .map_err(|e| format!("`{text}` is not a duration like `10s` or `500ms`: {e}"))?;
    if !(TIMEOUT_MIN..=TIMEOUT_MAX).contains(&timeout) {
        return Err(format!("`{text}` must be from 100ms to 5m"));
    }
    Ok(timeout)
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn build_client(timeout: Duration) -> Result<reqwest::Client, reqwest::Error> {
    http::install_crypto_provider();
    reqwest::Client::builder()
        .connect_timeout(timeout.min(CONNECT_TIMEOUT_MAX))
        .timeout(timeout)
        // A redirect could take the request, and its credentials, to another host than the
        // one `base_url` names.
        .redirect(reqwest::redirect::Policy::none())
        .build()
}

fn header_name(name: &str) -> Result<HeaderName, String> {
    let parsed = HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("`{name}` is not a valid header name"))?;
    if RESERVED_HEADERS.contains(&parsed.as_str()) {
        return Err(format!("`{name}` is set by the HTTP client, not by settings"));
    }
    Ok(parsed)
}

/// A credential by name, or the problem recorded against the setting that names it.
fn secret<'a>(
    credentials: &'a Credentials,
    name: &str,
    setting: &str,
    problems: &mut Problems,
) -> Option<&'a Secret> {
    let found = credentials.get(name);
    if found.is_none() {
        problems.0.push(format!("credentials: `{name}` is required (settings.{setting})"));
    }
    found
}

fn sensitive(value: &str) -> Result<HeaderValue, ()> {
    let mut value = HeaderValue::from_str(value).map_err(|_| ())?;
    value.set_sensitive(true);
    Ok(value)
}

fn basic(username: &str, password: &str) -> Result<HeaderValue, ()> {
    let encoded =
        base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"));
    sensitive(&format!("Basic {encoded}"))
}

fn authenticator(
    auth: &Auth,
    credentials: &Credentials,
    problems: &mut Problems,
) -> Option<Authenticator> {
    let unusable = |name: &str| format!("credentials: `{name}` cannot be sent in a header");
    match auth {
        Auth::None => Some(Authenticator::None),
        Auth::Bearer { credential } => {
            let token = secret(credentials, credential, "auth.bearer.credential", problems)?;
            match sensitive(&format!("Bearer {}", token.expose())) {
                Ok(value) => Some(Authenticator::Header(header::AUTHORIZATION, value)),
                Err(()) => {
                    problems.0.push(unusable(credential));
                    None
                }
            }
        }
        Auth::Basic { username, password } => {
            let user = secret(credentials, username, "auth.basic.username", problems);
            let pass = secret(credentials, password, "auth.basic.password", problems);
            let (user, pass) = (user?, pass?);
            if user.expose().contains(':') {
                problems.0.push(format!(
                    "credentials: `{username}` cannot hold `:` (HTTP Basic separates the user \
                     name from the password with it)"
                ));
                return None;
            }
            match basic(user.expose(), pass.expose()) {
                Ok(value) => Some(Authenticator::Header(header::AUTHORIZATION, value)),
                Err(()) => {
                    problems.0.push(unusable(password));
                    None
                }
            }
        }
        Auth::ApiKey { header, credential } => {
            let name = problems.check("auth.api_key.header", header_name(header));
            let key = secret(credentials, credential, "auth.api_key.credential", problems);
            let (name, key) = (name?, key?);
            match sensitive(key.expose()) {
                Ok(value) => Some(Authenticator::Header(name, value)),
                Err(()) => {
                    problems.0.push(unusable(credential));
                    None
                }
            }
        }
        Auth::OauthClientCredentials {
            token_url,
            client_id,
            client_secret,
            scope,
            client_authentication,
        } => {
            let token_url = problems.check(
                "auth.oauth_client_credentials.token_url",
                http::check_url(token_url).map_err(|e| e.to_string()),
            );
            let id =
                secret(credentials, client_id, "auth.oauth_client_credentials.client_id", problems);
            let secret_value = secret(
                credentials,
                client_secret,
                "auth.oauth_client_credentials.client_secret",
                problems,
            );
            Some(Authenticator::OAuth(OAuthClient {
                token_url: token_url?,
                client_id: id?.clone(),
                client_secret: secret_value?.clone(),
                scope: scope.clone(),
                client_authentication: *client_authentication,
            }))
        }
    }
}

/// `headers` and `secret_headers`, checked against each other and against the headers the
/// connector sets itself (`owned`).
fn fixed_headers(
    settings: &RestSettings,
    credentials: &Credentials,
    owned: &[(HeaderName, &str)],
    problems: &mut Problems,
) -> Option<HeaderMap> {
    let mut headers = HeaderMap::new();
    let mut sound = true;
    let literal = settings.headers.iter().map(|(name, value)| (name, value, "headers"));
    let secret =
        settings.secret_headers.iter().map(|(name, value)| (name, value, "secret_headers"));
    for (name, value, setting) in literal.chain(secret) {
        let Some(parsed) = problems.check(setting, header_name(name)) else {
            sound = false;
            continue;
        };
        if let Some((_, owner)) = owned.iter().find(|(owned, _)| *owned == parsed) {
            problems.add(setting, format!("`{name}` is already set by settings.{owner}"));
            sound = false;
            continue;
        }
        if headers.contains_key(&parsed) {
            problems.add(setting, format!("`{name}` is set twice"));
            sound = false;
            continue;
        }
        let value = if setting == "secret_headers" {
            let Some(credential) =
                self::secret(credentials, value, &format!("secret_headers.{name}"), problems)
            else {
                sound = false;
                continue;
            };
            sensitive(credential.expose())
                .map_err(|()| format!("credentials: `{value}` cannot be sent in a header"))
        } else {
            HeaderValue::from_str(value)
                .map_err(|_| format!("settings.headers.{name}: not a valid header value"))
        };
        match value {
            Ok(value) => {
                headers.insert(parsed, value);
            }
            Err(message) => {
                problems.0.push(message);
                sound = false;
            }
        }
    }
    sound.then_some(headers)
}

fn compile_templates(
    settings: &RestSettings,
    problems: &mut Problems,
) -> Option<Environment<'static>> {
    let mut env = template::environment();
    let mut sound = true;
    let urls = [
        ("upsert.url", &settings.upsert.url, template::UPSERT_VARIABLES),
        ("lookup.url", &settings.lookup.url, template::LOOKUP_VARIABLES),
    ];
    for (name, source, variables) in urls {
        let compiled = template::check_url_source(source)
            .and_then(|()| template::compile(&mut env, name, source, variables));
        sound &= problems.check(name, compiled).is_some();
    }
    let mut bodies = vec![("upsert.body", &settings.upsert.body, template::UPSERT_VARIABLES)];
    match (&settings.lookup.body, settings.lookup.method) {
        (Some(body), ReadMethod::Post) => {
            bodies.push(("lookup.body", body, template::LOOKUP_VARIABLES));
        }
        (Some(_), ReadMethod::Get) => {
            problems.add("lookup.body", "a body needs `method: POST`");
            sound = false;
        }
        (None, _) => {}
    }
    for (name, source, variables) in bodies {
        sound &=
            problems.check(name, template::compile(&mut env, name, source, variables)).is_some();
    }
    sound.then_some(env)
}

/// Status lists: real statuses, success lists of 2xx, and no status in two lists that are
/// read together.
fn check_statuses(settings: &RestSettings, problems: &mut Problems) {
    let classify = &settings.classify;
    let upsert = &settings.upsert;
    let lookup = &settings.lookup;
    let lists: [(&str, &Vec<u16>); 8] = [
        ("upsert.created", &upsert.created),
        ("upsert.updated", &upsert.updated),
        ("lookup.found", &lookup.found),
        ("lookup.not_found", &lookup.not_found),
        ("classify.retryable", &classify.retryable),
        ("classify.rate_limited", &classify.rate_limited),
        ("classify.rejected", &classify.rejected),
        ("classify.misconfigured", &classify.misconfigured),
    ];
    for (name, list) in lists {
        for status in list {
            if !(100..=599).contains(status) {
                problems.add(name, format!("{status} is not an HTTP status"));
            }
        }
    }
    for (name, list) in [
        ("upsert.created", &upsert.created),
        ("upsert.updated", &upsert.updated),
        ("lookup.found", &lookup.found),
    ] {
        if let Some(status) = list.iter().find(|s| !(200..=299).contains(*s)) {
            problems.add(name, format!("{status} is not a success (2xx)"));
        }
    }
    if upsert.created.is_empty() && upsert.updated.is_empty() {
        problems.add("upsert.created", "`created` and `updated` cannot both be empty");
    }
    if lookup.found.is_empty() {
        problems.add("lookup.found", "cannot be empty");
    }
    let classes = &lists[4..];
    // A write reads its success lists, then the classes; a lookup reads `not_found` first (a
    // 404 there wins over `classify.rejected`), then `found`, then the classes.
    let groups: [Vec<(&str, &Vec<u16>)>; 3] =
        [[&lists[..2], classes].concat(), [&lists[2..3], classes].concat(), lists[2..4].to_vec()];
    // The classes meet each other in two groups: each pair is reported once.
    let mut reported = BTreeSet::new();
    for group in &groups {
        for (i, (first, a)) in group.iter().enumerate() {
            for (second, b) in &group[i + 1..] {
                if let Some(status) = a.iter().find(|s| b.contains(s))
                    && reported.insert((*first, *second))
                {
                    problems.add(first, format!("{status} is also in settings.{second}"));
                }
            }
        }
    }
}

/// `base` followed by a rendered path, refused if the result leaves `base`'s origin or path.
fn join(base: &url::Url, path: &str) -> Result<url::Url, String> {
    let text = format!("{}{path}", base.as_str().trim_end_matches('/'));
    let url = url::Url::parse(&text).map_err(|e| format!("`{path}` does not make a URL: {e}"))?;
    let prefix = base.path().trim_end_matches('/');
    if url.origin() != base.origin() || !url.path().starts_with(prefix) {
        return Err(format!("`{path}` leaves base_url"));
    }
    Ok(url)
}

// --- Reading answers ---

/// The record id at `pointer`: a non-empty string, or a number written as text.
fn pointer_id(value: &serde_json::Value, pointer: &str) -> Option<String> {
    match value.pointer(pointer)? {
        serde_json::Value::String(id) if !id.is_empty() => Some(id.clone()),
        serde_json::Value::Number(id) => Some(id.to_string()),
        _ => None,
    }
}

/// A field's value as the engine compares it: strings as they are, null as empty, anything
/// else as JSON.
fn stringify(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(text) => text.clone(),
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The start of an answer, for a message.
fn quote(body: &str) -> String {
    let body = body.trim();
    match body.char_indices().nth(MESSAGE_QUOTE_CHARS_MAX) {
        Some((end, _)) => format!("{}…", &body[..end]),
        None if body.is_empty() => "(no body)".into(),
        None => body.to_owned(),
    }
}

/// An OAuth error answer (`error`, `error_description`), or the start of the body.
fn oauth_error(body: &str) -> String {
    let parsed = serde_json::from_str::<serde_json::Value>(body).ok();
    let field = |name: &str| {
        parsed.as_ref().and_then(|v| v.get(name)).and_then(|v| v.as_str()).map(str::to_owned)
    };
    match (field("error"), field("error_description")) {
        (Some(error), Some(description)) => format!("{error}: {description}"),
        (Some(error), None) => error,
        _ => quote(body),
    }
}

fn with_line(mut answer: Answer, line: &str) -> Answer {
    answer.meta.insert("request".into(), line.to_owned());
    answer
}

/// Adds the request line to a transport error's evidence.
fn with_request_line(error: ConnectorError, line: &str) -> ConnectorError {
    match error {
        ConnectorError::Retryable { message, retry_after, answer } => {
            ConnectorError::Retryable { message, retry_after, answer: with_line(answer, line) }
        }
        ConnectorError::RateLimited { message, retry_after, answer } => {
            ConnectorError::RateLimited { message, retry_after, answer: with_line(answer, line) }
        }
        ConnectorError::Rejected { message, answer } => {
            ConnectorError::Rejected { message, answer: with_line(answer, line) }
        }
        ConnectorError::Ambiguous { message, answer } => {
            ConnectorError::Ambiguous { message, answer: with_line(answer, line) }
        }
        ConnectorError::Misconfigured { message, answer } => {
            ConnectorError::Misconfigured { message, answer: with_line(answer, line) }
        }
        other => other,
    }
}

fn rejected(message: String) -> ConnectorError {
    ConnectorError::Rejected { message, answer: Answer::default() }
}

fn rejected_with(message: String, answer: Answer) -> ConnectorError {
    ConnectorError::Rejected { message, answer }
}

fn misconfigured(message: String) -> ConnectorError {
    ConnectorError::Misconfigured { message, answer: Answer::default() }
}

fn misconfigured_with(message: String, answer: Answer) -> ConnectorError {
    ConnectorError::Misconfigured { message, answer }
}

impl hookgate_connector::Kind for Rest {
    type Settings = RestSettings;

    /// Everything [`Rest::new`] checks but the credentials' values: each credential the
    /// settings name stands in as a placeholder.
    fn validate(settings: &BTreeMap<String, serde_json::Value>) -> Result<(), ConfigError> {
        let mut placeholders = Credentials::new();
        for name in required_credentials(settings) {
            placeholders.insert(name, Secret::new("placeholder".to_owned()));
        }
        Rest::from_config(settings, &placeholders).map(drop)
    }

    fn about() -> hookgate_connector::KindDescription {
        hookgate_connector::KindDescription {
            kind: "http".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            settings_schema: serde_json::Value::Null,
            // Which credentials depends on `auth` and `secret_headers`.
            credentials: Vec::new(),
            rules: Vec::new(),
            limits: Default::default(),
            file_settings: Vec::new(),
        }
    }

    fn required_credentials(settings: &BTreeMap<String, serde_json::Value>) -> Vec<String> {
        required_credentials(settings)
    }

    fn create(
        settings: &BTreeMap<String, serde_json::Value>,
        credentials: &Credentials,
    ) -> BoxFuture<'static, Result<Rest, ConfigError>> {
        let built = Rest::from_config(settings, credentials);
        Box::pin(async move { built })
    }
}

#[cfg(test)]
mod tests;
