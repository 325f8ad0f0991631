//! The configuration model: what a pipeline file and the connector-instances file say.
//!
//! These types mirror the YAML one to one (serde) and generate the JSON Schema (schemars).
//! They carry no behaviour beyond parsing leaf values; meaning is given by `check`.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer};

/// One webhook sender: how its deliveries are verified, identified, ordered and mapped to CRM
/// writes. Served at `POST /hooks/{name}`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Pipeline {
    /// Unique pipeline name; also the intake path `POST /hooks/{name}`. Lowercase letters,
    /// digits, `-` and `_`.
    pub name: String,
    /// What this pipeline is for, in a sentence.
    #[serde(default)]
    pub description: Option<String>,
    /// A known sender. Fills in the signature scheme, the event key and the event type the
    /// sender documents; anything set explicitly below wins.
    #[serde(default)]
    pub provider: Option<Provider>,
    /// How deliveries are authenticated. Verified over the raw body before anything is parsed.
    pub signature: SignatureConfig,
    /// Where the sender's stable event id comes from. Deliveries with the same scoped key are
    /// the same event.
    #[serde(default)]
    pub key: Option<ValueSource>,
    /// A template naming the account or subscription the key is unique within (for example a
    /// shop domain). Keys are deduplicated per (pipeline, scope). Empty by default.
    #[serde(default)]
    pub scope: Option<String>,
    /// Where the event type comes from.
    #[serde(default)]
    pub event_type: Option<ValueSource>,
    /// Which parts of the payload decide whether a repeated key carries the same content.
    #[serde(default)]
    pub fingerprint: Option<Fingerprint>,
    /// Orders updates to one entity: an older version never overwrites a newer one.
    #[serde(default)]
    pub ordering: Option<Ordering>,
    /// The CRM writes one event makes.
    pub targets: Vec<Target>,
    /// The status answered for a repeated key with different content: 409 (the default), or a
    /// 2xx for senders that retry anything else forever. The conflict is recorded either way.
    #[serde(default)]
    pub conflict_status: Option<u16>,
    /// Retries of CRM writes.
    #[serde(default)]
    pub delivery: DeliveryPolicy,
    /// How long events and payloads are kept after they are finished, e.g. `30d`.
    #[serde(default = "default_retention")]
    #[schemars(with = "String")]
    pub retention: HumanDuration,
}

fn default_retention() -> HumanDuration {
    HumanDuration(Duration::from_secs(30 * 24 * 3600))
}

/// Senders whose contract hookgate knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Provider {
    Github,
    Stripe,
    StandardWebhooks,
    Svix,
    Shopify,
    Slack,
    Hubspot,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SignatureConfig {
    /// The signing scheme. May be left out when `provider` is set.
    #[serde(default)]
    pub scheme: Option<SchemeName>,
    /// Secrets to verify with. Any may match, so list the new one and the old one while
    /// rotating.
    pub secrets: Vec<SecretRef>,
    /// Accepted clock difference for timestamped schemes, e.g. `5m` (the default).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub tolerance: Option<HumanDuration>,
    /// `hmac` only: the header carrying the signature.
    #[serde(default)]
    pub header: Option<String>,
    /// `hmac` only: text before the encoded digest, e.g. `sha256=`.
    #[serde(default)]
    pub prefix: Option<String>,
    /// `hmac` only: the hash function.
    #[serde(default)]
    pub algorithm: Option<HashAlgorithm>,
    /// `hmac` only: how the digest is encoded.
    #[serde(default)]
    pub encoding: Option<DigestEncoding>,
    /// `hmac` only: what is signed.
    #[serde(default)]
    pub signed: Option<SignedPart>,
    /// `hmac` with `signed: timestamp_body`: the header carrying the Unix timestamp.
    #[serde(default)]
    pub timestamp_header: Option<String>,
    /// `hmac` with `signed: timestamp_body`: what joins timestamp and body (default `.`).
    #[serde(default)]
    pub separator: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum SchemeName {
    Github,
    Stripe,
    StandardWebhooks,
    /// Svix signs exactly as Standard Webhooks does.
    Svix,
    Shopify,
    Slack,
    HubspotV3,
    Hmac,
}

impl SchemeName {
    pub fn as_str(self) -> &'static str {
        match self {
            SchemeName::Github => "github",
            SchemeName::Stripe => "stripe",
            SchemeName::StandardWebhooks => "standard-webhooks",
            SchemeName::Svix => "svix",
            SchemeName::Shopify => "shopify",
            SchemeName::Slack => "slack",
            SchemeName::HubspotV3 => "hubspot-v3",
            SchemeName::Hmac => "hmac",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum HashAlgorithm {
    Sha256,
    Sha512,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DigestEncoding {
    Hex,
    Base64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SignedPart {
    /// The raw body.
    Body,
    /// The timestamp header's value, the separator, then the raw body.
    TimestampBody,
}

/// A reference to a secret. Secrets are never written in configuration files.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum SecretRef {
    /// The value of an environment variable.
    Env(String),
    /// The contents of a file (a trailing newline is removed).
    File(String),
}

impl fmt::Display for SecretRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretRef::Env(name) => write!(f, "environment variable `{name}`"),
            SecretRef::File(path) => write!(f, "file `{path}`"),
        }
    }
}

/// Where a value (an event key, an event type) is read from.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ValueSource {
    /// A request header (case-insensitive).
    Header(String),
    /// A JSON pointer into the payload, e.g. `/id` or `/data/object/id`.
    Pointer(String),
    /// A template over `payload`, `headers` and `body`.
    Template(String),
    /// The SHA-256 of the raw body, in hex: for senders with no event id.
    BodySha256,
}

/// What decides "same content" for a repeated key.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Fingerprint {
    /// The raw body, byte for byte (the default).
    RawBody,
    /// Only these JSON pointers of the payload.
    Include(Vec<String>),
    /// The whole payload except these JSON pointers (e.g. a per-retry delivery timestamp).
    Exclude(Vec<String>),
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Ordering {
    /// A template naming the entity updates are ordered within, e.g. `{{ payload.PatientId }}`.
    pub entity: String,
    /// A template giving the update's version.
    pub version: String,
    /// How versions compare.
    pub version_type: VersionType,
    /// Timestamp versions further ahead of the receipt time than this are refused (400): a
    /// far-future version would make every later update of its entity stale. Default 1h.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub max_future: Option<HumanDuration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum VersionType {
    /// A signed 64-bit integer.
    Integer,
    /// An RFC 3339 timestamp; compared as instants, whatever the offset.
    Timestamp,
    /// Compared as text, byte by byte.
    String,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Target {
    /// Names this write in evidence and idempotency keys; unique within the pipeline.
    pub name: String,
    /// A connector instance from the instances file.
    pub connector: String,
    /// An expression; the write happens only when it is true, e.g. `event.type == "push"`.
    #[serde(default)]
    pub when: Option<String>,
    /// The CRM object type, e.g. `Contact` or `contacts`.
    pub object: String,
    /// Create-or-update (the default), or update only an existing record.
    #[serde(default)]
    pub operation: Operation,
    /// The field that identifies the record in the CRM, and its value.
    pub external_id: ExternalId,
    /// Field name to template. Every rendered value is a string.
    #[serde(default)]
    pub fields: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    #[default]
    Upsert,
    UpdateOnly,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Upsert => "upsert",
            Operation::UpdateOnly => "update_only",
        }
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExternalId {
    /// The CRM field holding the external id (Salesforce external-id field, HubSpot unique
    /// property).
    pub field: String,
    /// A template giving its value.
    pub value: String,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeliveryPolicy {
    /// Attempts before an item is dead-lettered.
    #[serde(default = "default_attempts_max")]
    pub attempts_max: u32,
    /// The first retry delay, doubled each attempt.
    #[serde(default = "default_backoff_initial")]
    #[schemars(with = "String")]
    pub backoff_initial: HumanDuration,
    /// The largest retry delay.
    #[serde(default = "default_backoff_max")]
    #[schemars(with = "String")]
    pub backoff_max: HumanDuration,
    /// The fraction of each delay that is randomised, from 0 to 1.
    #[serde(default = "default_jitter")]
    pub jitter: f64,
}

fn default_attempts_max() -> u32 {
    10
}
fn default_backoff_initial() -> HumanDuration {
    HumanDuration(Duration::from_secs(1))
}
fn default_backoff_max() -> HumanDuration {
    HumanDuration(Duration::from_secs(300))
}
fn default_jitter() -> f64 {
    0.2
}

impl Default for DeliveryPolicy {
    fn default() -> DeliveryPolicy {
        DeliveryPolicy {
            attempts_max: default_attempts_max(),
            backoff_initial: default_backoff_initial(),
            backoff_max: default_backoff_max(),
            jitter: default_jitter(),
        }
    }
}

/// A duration written for people: `30s`, `5m`, `1h 30m`, `30d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        humantime::parse_duration(&text).map(HumanDuration).map_err(|e| {
            serde::de::Error::custom(format_args!(
                "invalid duration `{text}`: {e} (write it like `30s`, `5m` or `7d`)"
            ))
        })
    }
}

/// The connector-instances file (`hookgate.yaml`): the CRMs pipelines write to.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InstancesFile {
    pub connectors: Vec<ConnectorInstance>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConnectorInstance {
    /// The name targets refer to.
    pub name: String,
    pub kind: ConnectorKind,
    /// Kind-specific settings (URLs, API version, fault injection for the mock).
    #[serde(default)]
    pub settings: BTreeMap<String, serde_json::Value>,
    /// Kind-specific credentials, each a secret reference.
    #[serde(default)]
    pub credentials: BTreeMap<String, SecretRef>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ConnectorKind {
    Mock,
    Salesforce,
    Hubspot,
    Plugin,
}

impl ConnectorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectorKind::Mock => "mock",
            ConnectorKind::Salesforce => "salesforce",
            ConnectorKind::Hubspot => "hubspot",
            ConnectorKind::Plugin => "plugin",
        }
    }
}
