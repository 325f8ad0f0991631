//! The instance settings of `kind: http`, as written in `hookgate.yaml`. The doc comments
//! become the published JSON Schema.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Instance settings of `kind: http`: how to reach a plain REST CRM, described instead of
/// coded.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RestSettings {
    /// The API's root, e.g. `https://crm.example.com/api/v1`. Every request goes to this URL
    /// followed by a path from `upsert.url`, `lookup.url` or `healthcheck.url`, so no template
    /// can reach another host. Plain `http` is only allowed to loopback (test servers).
    pub base_url: String,
    /// How long one request may take, its answer included, e.g. `10s` or `500ms`; from
    /// `100ms` to `5m`.
    #[serde(default = "default_timeout")]
    pub timeout: String,
    /// Bytes of an answer read at most, from 1024 to 67108864 (64 MiB). A longer answer to a
    /// write that succeeded is ambiguous; a longer record from a lookup is rejected.
    #[serde(default = "default_max_answer_bytes")]
    #[schemars(range(min = 1024, max = 67_108_864))]
    pub max_answer_bytes: usize,
    /// How requests are authenticated. Credentials are named here and resolved from the
    /// instance's `credentials`.
    pub auth: Auth,
    /// Headers sent with every request, with literal values (e.g. `Accept-Version: "2"`).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Headers sent with every request whose values are secrets: header name to the name of
    /// a credential (e.g. `X-Tenant-Token: tenant_token`).
    #[serde(default)]
    pub secret_headers: BTreeMap<String, String>,
    /// How a record is created or updated by its external id.
    pub upsert: UpsertSettings,
    /// How a record is found by its external id. Reconciliation after an ambiguous write
    /// depends on it: it must see a write at once (not a search index that lags).
    pub lookup: LookupSettings,
    /// A request that proves the CRM is reachable with these credentials. Without it, the
    /// healthcheck only obtains an OAuth token (with `oauth_client_credentials`) and sends
    /// nothing otherwise.
    #[serde(default)]
    pub healthcheck: Option<HealthcheckSettings>,
    /// Which answer statuses mean which error class.
    #[serde(default)]
    pub classify: ClassifySettings,
    /// Answer headers kept as evidence with each attempt (e.g. `X-Request-Id`,
    /// `X-RateLimit-Remaining`).
    #[serde(default)]
    pub evidence_headers: Vec<String>,
}

pub(crate) fn default_timeout() -> String {
    "10s".into()
}

pub(crate) fn default_max_answer_bytes() -> usize {
    1024 * 1024
}

/// How requests are authenticated. Each names credentials of the instance, never values.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Auth {
    /// No authentication header (a CRM on a private network, or `secret_headers` only).
    None,
    /// `Authorization: Bearer <credential>`, a static token.
    Bearer {
        /// The credential holding the token.
        credential: String,
    },
    /// `Authorization: Basic ...` (RFC 7617).
    Basic {
        /// The credential holding the user name.
        username: String,
        /// The credential holding the password.
        password: String,
    },
    /// A static key in a header of the API's choosing.
    ApiKey {
        /// The header that carries the key, e.g. `X-Api-Key`.
        header: String,
        /// The credential holding the key.
        credential: String,
    },
    /// OAuth 2.0 client credentials (RFC 6749 §4.4): a token from `token_url`, sent as
    /// `Authorization: Bearer`, cached until shortly before its `expires_in`, and fetched again
    /// once when a call answers 401.
    OauthClientCredentials {
        /// The token endpoint, a full URL (https, or http to loopback).
        token_url: String,
        /// The credential holding the client id.
        client_id: String,
        /// The credential holding the client secret.
        client_secret: String,
        /// The `scope` to ask for, if the server wants one.
        #[serde(default)]
        scope: Option<String>,
        /// How the client proves itself to the token endpoint.
        #[serde(default)]
        client_authentication: ClientAuthentication,
    },
}

/// How a client sends its id and secret to the token endpoint (the names of OpenID Connect's
/// `token_endpoint_auth_method`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClientAuthentication {
    /// `client_id` and `client_secret` in the form body.
    #[default]
    ClientSecretPost,
    /// HTTP Basic with the client id and secret.
    ClientSecretBasic,
}

/// The method of a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum WriteMethod {
    /// Usually a create-or-replace by the URL's external id.
    Put,
    /// Usually a create, or an upsert endpoint.
    Post,
    /// Usually a partial update; by external id, an upsert on some APIs.
    Patch,
}

/// The method of a read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum ReadMethod {
    /// A plain read.
    #[default]
    Get,
    /// For APIs that look records up with a query in a body.
    Post,
}

/// The write. Templates are minijinja over `object`, `external_id_field`,
/// `external_id_value`, `fields` (a map of strings), `operation` (`upsert` or `update_only`)
/// and `idempotency_key`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UpsertSettings {
    /// `PUT`, `POST` or `PATCH`.
    pub method: WriteMethod,
    /// The path after `base_url`, a template, e.g.
    /// `/objects/{{ object }}/by/{{ external_id_field }}/{{ external_id_value }}`. It must
    /// start with `/`. Every value printed is percent-encoded as one path segment (as if
    /// through `urlencode`); a segment that is `.` or `..`, or holds a `/`, once decoded, is
    /// refused. A query (`?key={{ value }}`) may follow.
    pub url: String,
    /// The JSON body, a template, e.g. `{"properties": {{ fields }}}`. Every value printed is
    /// written as JSON (a string gets its quotes: `{"email": {{ fields.email }}}`), so no value
    /// can break the document; the result is checked to be JSON before it is sent.
    pub body: String,
    /// A header that carries `idempotency_key`, for CRMs that apply a repeated key once
    /// (e.g. `Idempotency-Key`).
    #[serde(default)]
    pub idempotency_header: Option<String>,
    /// Statuses that mean the record was created.
    #[serde(default = "default_created")]
    pub created: Vec<u16>,
    /// Statuses that mean the record was updated.
    #[serde(default = "default_updated")]
    pub updated: Vec<u16>,
    /// A JSON pointer (RFC 6901) to the CRM's record id in the answer, e.g. `/id` or
    /// `/data/id`; a string or a number. Required in every success answer that has a body;
    /// after a success with an empty body the id is looked up.
    pub record_id: String,
    /// The templates honour `operation == "update_only"` (the CRM then never creates, e.g.
    /// `?mode=update`). When false, update-only writes are rejected rather than risk creating
    /// a record.
    #[serde(default)]
    pub update_only: bool,
}

fn default_created() -> Vec<u16> {
    vec![201]
}

fn default_updated() -> Vec<u16> {
    vec![200, 204]
}

/// The lookup. Templates are minijinja over `object`, `external_id_field`,
/// `external_id_value` and `fields` (the list of field names wanted).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LookupSettings {
    /// `GET` (the default) or `POST`.
    #[serde(default)]
    pub method: ReadMethod,
    /// The path after `base_url`, a template, with the same rules as `upsert.url`.
    pub url: String,
    /// A JSON body template, with the same rules as `upsert.body`; only with `POST`.
    #[serde(default)]
    pub body: Option<String>,
    /// Statuses that mean the record was found.
    #[serde(default = "default_found")]
    pub found: Vec<u16>,
    /// Statuses that mean no record has the external id.
    #[serde(default = "default_not_found")]
    pub not_found: Vec<u16>,
    /// A JSON pointer to the record id in a found answer, e.g. `/id`.
    pub record_id: String,
    /// A JSON pointer to the object that holds the record's fields, e.g. `/fields` or
    /// `/properties`; values that are not strings are written as JSON, null as empty.
    /// Required: a write in doubt is settled by comparing these with what it wrote. (Optional
    /// in the schema so that its absence gets that reason, not a bare "missing field".)
    #[serde(default)]
    pub fields: Option<String>,
}

fn default_found() -> Vec<u16> {
    vec![200]
}

fn default_not_found() -> Vec<u16> {
    vec![404]
}

/// A `GET` that any 2xx answers when the CRM is reachable with these credentials.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HealthcheckSettings {
    /// The path after `base_url`, e.g. `/health` or `/me`.
    pub url: String,
}

/// Which statuses mean which error class. The lists must not share a status, nor share one
/// with `upsert.created` and `upsert.updated`. A status in no list: for a write, another 2xx
/// is ambiguous (it may have been applied), a 5xx retryable, anything else rejected; for a
/// lookup, a 5xx is retryable and anything else rejected.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClassifySettings {
    /// Transient failures: retried with backoff.
    #[serde(default = "default_retryable")]
    pub retryable: Vec<u16>,
    /// The CRM asks to slow down: retried no earlier than `retry_after` says.
    #[serde(default = "default_rate_limited")]
    pub rate_limited: Vec<u16>,
    /// The answer header that says how long to wait, in seconds or as an HTTP date; read on
    /// rate-limited and retryable answers.
    #[serde(default = "default_retry_after")]
    pub retry_after: String,
    /// The request will never succeed as it is: dead-lettered. (A lookup's `not_found`
    /// statuses are read before this list.)
    #[serde(default = "default_rejected")]
    pub rejected: Vec<u16>,
    /// The connector's settings or credentials are wrong: retried with backoff, so that a fix
    /// lets pending work through.
    #[serde(default = "default_misconfigured")]
    pub misconfigured: Vec<u16>,
}

impl Default for ClassifySettings {
    fn default() -> ClassifySettings {
        ClassifySettings {
            retryable: default_retryable(),
            rate_limited: default_rate_limited(),
            retry_after: default_retry_after(),
            rejected: default_rejected(),
            misconfigured: default_misconfigured(),
        }
    }
}

fn default_retryable() -> Vec<u16> {
    vec![408, 500, 502, 503, 504]
}

fn default_rate_limited() -> Vec<u16> {
    vec![429]
}

fn default_retry_after() -> String {
    "Retry-After".into()
}

fn default_rejected() -> Vec<u16> {
    vec![400, 404, 409, 422]
}

fn default_misconfigured() -> Vec<u16> {
    vec![401, 403]
}

impl Auth {
    /// The credentials this auth names, each with the setting that names it.
    pub(crate) fn credentials(&self) -> Vec<(String, &'static str)> {
        match self {
            Auth::None => Vec::new(),
            Auth::Bearer { credential } => vec![(credential.clone(), "auth.bearer.credential")],
            Auth::Basic { username, password } => vec![
                (username.clone(), "auth.basic.username"),
                (password.clone(), "auth.basic.password"),
            ],
            Auth::ApiKey { credential, .. } => {
                vec![(credential.clone(), "auth.api_key.credential")]
            }
            Auth::OauthClientCredentials { client_id, client_secret, .. } => vec![
                (client_id.clone(), "auth.oauth_client_credentials.client_id"),
                (client_secret.clone(), "auth.oauth_client_credentials.client_secret"),
            ],
        }
    }
}

/// Deserializes the settings, naming the part at fault: serde's own message names the field
/// but not where it sits, so each nested setting that fails on its own is reported by its
/// path.
pub(crate) fn parse(
    settings: &BTreeMap<String, serde_json::Value>,
) -> Result<RestSettings, String> {
    let object = serde_json::Value::Object(settings.clone().into_iter().collect());
    let whole = match serde_json::from_value::<RestSettings>(object) {
        Ok(parsed) => return Ok(parsed),
        Err(error) => error,
    };
    fn probe<T: serde::de::DeserializeOwned>(
        settings: &BTreeMap<String, serde_json::Value>,
        key: &str,
    ) -> Option<String> {
        let value = settings.get(key)?;
        serde_json::from_value::<T>(value.clone()).err().map(|e| format!("settings.{key}: {e}"))
    }
    let nested = [
        probe::<Auth>(settings, "auth"),
        probe::<UpsertSettings>(settings, "upsert"),
        probe::<LookupSettings>(settings, "lookup"),
        probe::<Option<HealthcheckSettings>>(settings, "healthcheck"),
        probe::<ClassifySettings>(settings, "classify"),
    ];
    let problems: Vec<String> = nested.into_iter().flatten().collect();
    if problems.is_empty() { Err(format!("settings: {whole}")) } else { Err(problems.join("; ")) }
}
