//! The connector SDK: what a CRM connector implements for hookgate.
//!
//! A connector writes records into one CRM by **external id**: create the record if no record
//! has that external id, update it if one does. The engine owns everything else: leasing,
//! ordering, retries, reconciliation, dead letters, evidence. A connector only has to say what
//! happened, and classify failures with [`ConnectorError`] so that retry policy lives in one
//! place.
//!
//! # Writing a connector
//! 1. Implement [`Connector`] for a type built from its instance settings
//!    (`hookgate.yaml`: `kind`, `settings`, `credentials`).
//! 2. Map every documented answer of the CRM to a result or an error class:
//!    - the write happened: [`UpsertOutcome`] with the CRM's record id;
//!    - the CRM asked to slow down: [`ConnectorError::RateLimited`] with its retry-after;
//!    - a transient failure (5xx, connection refused before sending): [`ConnectorError::Retryable`];
//!    - the request will never succeed as is (validation, several records match one external
//!      id): [`ConnectorError::Rejected`];
//!    - the request may or may not have been applied (a timeout, a connection lost after
//!      sending): [`ConnectorError::Ambiguous`]; the engine will look the record up before
//!      retrying;
//!    - the connector itself is wrong (credentials, unknown object): [`ConnectorError::Misconfigured`].
//! 3. Implement [`Connector::lookup`] faithfully: reconciliation after an ambiguous answer
//!    depends on it.
//!
//! Requests and results are plain serde data, so a connector can also live in a dynamic
//! library behind a C ABI that carries them as JSON.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A boxed future, so that [`Connector`] can be used as a trait object.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Bytes of a CRM answer kept as evidence with each attempt.
pub const EXCERPT_BYTES_MAX: usize = 2048;

/// A credential. `Debug` never shows it, so it cannot leak through a log line.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value. Named loudly so every use is easy to audit.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Credentials of an instance by name (`client_secret`, `token`), resolved from references.
pub type Credentials = BTreeMap<String, Secret>;

/// A connector's settings and credentials could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Deserializes an instance's `settings` into a connector's settings type.
pub fn settings<T: serde::de::DeserializeOwned>(
    settings: &BTreeMap<String, serde_json::Value>,
) -> Result<T, ConfigError> {
    let object = serde_json::Value::Object(settings.clone().into_iter().collect());
    serde_json::from_value(object).map_err(|e| ConfigError(format!("settings: {e}")))
}

/// A required credential.
pub fn credential<'a>(credentials: &'a Credentials, name: &str) -> Result<&'a Secret, ConfigError> {
    credentials.get(name).ok_or_else(|| ConfigError(format!("credentials: `{name}` is required")))
}

/// Whether a write may create a record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    #[default]
    Upsert,
    UpdateOnly,
}

/// One write: the record with `external_id_field = external_id_value` in `object` gets
/// `fields`. It merges: the fields named are set, every other field of the record is left as
/// it is (a CRM's PATCH or upsert, not a PUT of the whole record), and the engine reconciles
/// a write in doubt by checking those fields alone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpsertRequest {
    pub object: String,
    pub external_id_field: String,
    pub external_id_value: String,
    pub fields: BTreeMap<String, String>,
    pub operation: Operation,
    /// Stable for one (event, target): `hookgate-{event id}-{target}`. A CRM that honours
    /// idempotency keys applies a repeated key once.
    pub idempotency_key: String,
}

/// Finds the record an upsert would write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LookupRequest {
    pub object: String,
    pub external_id_field: String,
    pub external_id_value: String,
    /// The fields whose current values the caller needs (CRMs such as HubSpot return only
    /// the properties asked for).
    pub fields: Vec<String>,
}

impl From<&UpsertRequest> for LookupRequest {
    fn from(request: &UpsertRequest) -> LookupRequest {
        LookupRequest {
            object: request.object.clone(),
            external_id_field: request.external_id_field.clone(),
            external_id_value: request.external_id_value.clone(),
            fields: request.fields.keys().cloned().collect(),
        }
    }
}

/// What the CRM answered; kept with the attempt as evidence.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// The HTTP status, for HTTP CRMs.
    pub status: Option<u16>,
    /// The start of the answer's body, at most [`EXCERPT_BYTES_MAX`] bytes.
    pub excerpt: Option<String>,
    /// Headers worth keeping, e.g. `Sforce-Limit-Info`.
    pub meta: BTreeMap<String, String>,
}

impl Answer {
    pub fn with_excerpt(status: Option<u16>, body: &str) -> Answer {
        Answer { status, excerpt: Some(excerpt(body)), meta: BTreeMap::new() }
    }
}

/// Cuts a text to [`EXCERPT_BYTES_MAX`] bytes on a character boundary.
pub fn excerpt(text: &str) -> String {
    if text.len() <= EXCERPT_BYTES_MAX {
        return text.to_owned();
    }
    let mut end = EXCERPT_BYTES_MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpsertOutcome {
    pub record_id: String,
    /// Whether the record was created (false: updated).
    pub created: bool,
    pub answer: Answer,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LookupOutcome {
    Found { record_id: String, fields: BTreeMap<String, String>, answer: Answer },
    NotFound { answer: Answer },
}

/// A connector kind as the registry knows it before any instance exists: what `check`
/// enforces and what `serve` needs. In-tree connectors and plugins describe themselves alike;
/// for a plugin this crosses the C ABI as JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KindDescription {
    /// The name instances use as `kind`: lowercase ASCII letters, digits, `_` and `-`.
    pub kind: String,
    pub version: String,
    /// JSON Schema of the instance `settings`.
    pub settings_schema: serde_json::Value,
    /// The credentials every instance must reference (a kind whose needs depend on its
    /// settings, such as Salesforce's auth flows, says so in [`Kind::required_credentials`]).
    #[serde(default)]
    pub credentials: Vec<String>,
    /// What the CRM's API cannot do, checked against every target before anything runs.
    #[serde(default)]
    pub rules: Vec<TargetRule>,
    /// The calls the CRM allows one client, as it publishes them: the budget of every
    /// instance that declares none of its own.
    #[serde(default)]
    pub limits: CallLimits,
    /// The settings that name a file (the mock CRM's `path`): written relative, they are
    /// taken from the directory of the instances file that holds them, not from wherever
    /// the gateway was started.
    #[serde(default)]
    pub file_settings: Vec<String>,
}

/// The calls a CRM allows one client (an app, a token): the budget the engine plans every
/// call within, writes and lookups alike, across every process on one store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallLimits {
    /// At most this many calls in any rolling window; `None`: the CRM publishes none, and
    /// calls are bounded only by the calls in flight.
    #[serde(default)]
    pub rate: Option<RateLimit>,
}

/// At most `calls` calls in any rolling window of `per` (HubSpot: 100 per 10 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimit {
    pub calls: u32,
    pub per: Duration,
}

/// A restriction a CRM's API documents, checked against each target that writes to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "rule", rename_all = "snake_case")]
pub enum TargetRule {
    /// `external_id.field` is none of `names` (compared ignoring ASCII case).
    ExternalIdFieldNot { names: Vec<String>, message: String, hint: String },
    /// `external_id.field` is not also written in `fields`.
    ExternalIdFieldNotInFields { hint: String },
    /// `object` has no uppercase letter; `crm` names the CRM in the message.
    ObjectLowercase { crm: String },
}

/// A connector kind: how the registry and the plugin export build instances of it. An
/// in-tree connector is registered with one line (`registry.add::<MyConnector>()`); the
/// same implementation becomes a plugin with `hookgate_plugin::export_connector!`.
pub trait Kind: Connector + Sized + 'static {
    /// The instance settings; their JSON Schema is published and checked.
    type Settings: serde::de::DeserializeOwned + schemars::JsonSchema;

    /// The kind's name, version, credentials and rules; [`describe_kind`] adds the schema.
    fn about() -> KindDescription;

    /// The credentials an instance with these settings needs.
    fn required_credentials(_settings: &BTreeMap<String, serde_json::Value>) -> Vec<String> {
        Self::about().credentials
    }

    /// What is wrong with these settings, found without building anything (no file, no
    /// network): `check` reports it where the instance is written, as `serve` would refuse it.
    /// Credentials are not known here. By default the schema says all.
    fn validate(_settings: &BTreeMap<String, serde_json::Value>) -> Result<(), ConfigError> {
        Ok(())
    }

    /// Builds an instance. Errors name the setting or credential at fault.
    fn create(
        settings: &BTreeMap<String, serde_json::Value>,
        credentials: &Credentials,
    ) -> BoxFuture<'static, Result<Self, ConfigError>>;
}

/// A kind's full description, its settings schema generated from [`Kind::Settings`].
pub fn describe_kind<K: Kind>() -> KindDescription {
    let mut description = K::about();
    description.settings_schema =
        serde_json::to_value(schemars::schema_for!(K::Settings)).unwrap_or_default();
    description
}

/// Whether `name` can be a connector kind.
pub fn valid_kind_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// What a connector can do, and its settings schema.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Description {
    pub kind: String,
    pub version: String,
    pub capabilities: Capabilities,
    /// JSON Schema of the instance `settings`.
    pub settings_schema: serde_json::Value,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    pub update_only: bool,
    /// The CRM applies a repeated idempotency key once.
    pub idempotency_keys: bool,
}

/// Why a call failed, classified for the engine's retry policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[non_exhaustive]
pub enum ConnectorError {
    /// Transient: retry with backoff (no earlier than `retry_after`, if given).
    #[error("retryable: {message}")]
    Retryable { message: String, retry_after: Option<Duration>, answer: Answer },
    /// The CRM asked to slow down.
    #[error("rate limited: {message}")]
    RateLimited { message: String, retry_after: Option<Duration>, answer: Answer },
    /// Permanent for this request: dead-letter it.
    #[error("rejected: {message}")]
    Rejected { message: String, answer: Answer },
    /// The request may or may not have been applied: look the record up before retrying.
    #[error("ambiguous: {message}")]
    Ambiguous { message: String, answer: Answer },
    /// The connector's configuration is wrong (credentials, object); retried with backoff
    /// so that a fix lets pending work through.
    #[error("misconfigured: {message}")]
    Misconfigured { message: String, answer: Answer },
}

impl ConnectorError {
    /// A stable name for evidence and metrics.
    pub fn class(&self) -> &'static str {
        match self {
            ConnectorError::Retryable { .. } => "retryable",
            ConnectorError::RateLimited { .. } => "rate_limited",
            ConnectorError::Rejected { .. } => "rejected",
            ConnectorError::Ambiguous { .. } => "ambiguous",
            ConnectorError::Misconfigured { .. } => "misconfigured",
        }
    }

    pub fn answer(&self) -> &Answer {
        match self {
            ConnectorError::Retryable { answer, .. }
            | ConnectorError::RateLimited { answer, .. }
            | ConnectorError::Rejected { answer, .. }
            | ConnectorError::Ambiguous { answer, .. }
            | ConnectorError::Misconfigured { answer, .. } => answer,
        }
    }

    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ConnectorError::Retryable { retry_after, .. }
            | ConnectorError::RateLimited { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

pub mod conformance;

/// A fetch of the current state of the object an event names (a target's `refresh:`),
/// made by the engine just before the write.
#[derive(Debug, Clone)]
pub struct SourceRequest {
    /// `GET` or `POST`.
    pub method: &'static str,
    pub url: String,
    /// The pipeline's headers, then its auth header: all treated as secrets.
    pub headers: Vec<(String, Secret)>,
    pub timeout: Duration,
    /// Bytes of the answer read at most; a longer answer is refused.
    pub max_bytes: usize,
    /// Plain http to a host that is not loopback.
    pub allow_plain_http: bool,
}

/// What a source answered.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceOutcome {
    /// The object, a JSON object.
    Found { object: serde_json::Value, answer: Answer },
    /// 404 or 410: the object is gone.
    Gone { answer: Answer },
}

/// Fetches source objects. A fetch is a read: whatever fails, it can be made again, so a
/// timeout is retryable, never ambiguous.
pub trait SourceFetcher: Send + Sync + std::fmt::Debug {
    fn fetch<'a>(
        &'a self,
        request: &'a SourceRequest,
    ) -> BoxFuture<'a, Result<SourceOutcome, ConnectorError>>;
}

/// A CRM connector instance. Shared between workers: methods take `&self`.
pub trait Connector: Send + Sync + std::fmt::Debug {
    fn describe(&self) -> Description;

    /// Creates or updates the record by external id. Must not create a second record for an
    /// external id that already has one.
    fn upsert<'a>(
        &'a self,
        request: &'a UpsertRequest,
    ) -> BoxFuture<'a, Result<UpsertOutcome, ConnectorError>>;

    /// The most writes one [`Connector::upsert_batch`] call takes. 1 (the default): the CRM
    /// has no batch call, and the engine calls [`Connector::upsert`] once per write.
    fn batch_max(&self) -> usize {
        1
    }

    /// Writes several records in one call, where the CRM has one (HubSpot's batch upsert,
    /// Salesforce's sObject Collections). The engine sends at most [`Connector::batch_max`]
    /// requests, each naming a different record (no two share object, external id field and
    /// value), and never more than one write in flight per ordering entity (two entities
    /// that name one record may each have a write out, as with single calls).
    ///
    /// Returns one outcome per request, in request order, classified as [`Connector::upsert`]
    /// would classify it alone. A failure of the whole call is every request's outcome: a
    /// 429 or a 503 before anything was applied is retryable for each; a timeout or a lost
    /// answer is ambiguous for each. An answer of the wrong length is treated by the engine as
    /// ambiguous for every request.
    ///
    /// The default writes one request at a time through [`Connector::upsert`].
    fn upsert_batch<'a>(
        &'a self,
        requests: &'a [UpsertRequest],
    ) -> BoxFuture<'a, Vec<Result<UpsertOutcome, ConnectorError>>> {
        Box::pin(async move {
            let mut outcomes = Vec::with_capacity(requests.len());
            for request in requests {
                outcomes.push(self.upsert(request).await);
            }
            outcomes
        })
    }

    /// Finds the record by external id, with its current field values.
    fn lookup<'a>(
        &'a self,
        request: &'a LookupRequest,
    ) -> BoxFuture<'a, Result<LookupOutcome, ConnectorError>>;

    /// Whether the CRM is reachable with these credentials.
    fn healthcheck(&self) -> BoxFuture<'_, Result<(), ConnectorError>>;
}
