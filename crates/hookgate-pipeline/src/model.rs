//! The configuration model: what a pipeline file and the connector-instances file say.
//!
//! These types mirror the YAML one to one (serde) and generate the JSON Schema (schemars).
//! They carry no behaviour beyond parsing leaf values; meaning is given by `check`.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use std::sync::LazyLock;

use hookgate_verify::Preset;
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
    /// How the body is read into `payload`: `json`, `form`, or `form_payload` (a form whose
    /// `payload` field holds the JSON document). Senders with one documented body kind fix
    /// it; otherwise the delivery's `Content-Type` decides between JSON and the sender's form
    /// (it is not signed, so a pipeline that knows its sender's kind should say so).
    #[serde(default)]
    pub body_format: Option<BodyFormat>,
    /// The URL the sender is configured to call, without query string, e.g.
    /// `https://hooks.example.com/hooks/twilio`. Schemes that sign the URL (Twilio, Square,
    /// HubSpot) verify against it, with the query string as received appended. Without it,
    /// the gateway's `--public-url` plus the request path is used, else the Host header.
    #[serde(default)]
    pub public_url: Option<String>,
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
    /// The sender's payload, so that `check` reports a template, pointer or condition that
    /// reads a field the sender never sends, at its place, without running a fixture: a JSON
    /// Schema written here (an object lists its fields in `properties`; one not listed is
    /// unknown unless `additionalProperties` allows it), or `fixtures` to take the shape of the
    /// pipeline's fixtures' bodies. Fields the entity, version or external id read must be
    /// `required` (in every fixture), or guarded.
    pub payload_schema: Option<PayloadSchema>,
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
    /// How long an event's body and kept headers are kept, e.g. `7d`: at most `retention`.
    /// After it they are deleted (once the event's writes are finished) while the key,
    /// fingerprint and evidence stay until `retention`, so redeliveries are still duplicates
    /// but personal data is gone sooner. Without it, payloads go with their events.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub payload_retention: Option<HumanDuration>,
    /// What operators never see of a payload: masked in `events show --body` and every other
    /// view of a stored body or its headers. The stored payload is unchanged (the worker
    /// renders from it).
    #[serde(default)]
    pub redact: Redact,
}

/// Parts of payloads masked wherever operators see them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Redact {
    /// JSON pointers into the body; `*` stands for any member or item at its level, e.g.
    /// `/customer/email` or `/items/*/card`.
    #[serde(default)]
    pub body: Vec<String>,
    /// Header names (case-insensitive) whose values are masked.
    #[serde(default)]
    pub headers: Vec<String>,
    /// JSON pointers into the objects `refresh:` fetches, masked in the answers kept with
    /// attempts as evidence, e.g. `/email`.
    #[serde(default)]
    pub source: Vec<String>,
}

fn default_retention() -> HumanDuration {
    HumanDuration(Duration::from_secs(30 * 24 * 3600))
}

/// `payload_schema:` `fixtures`, or a JSON Schema.
#[derive(Debug, Clone, PartialEq)]
pub enum PayloadSchema {
    Fixtures,
    Schema(serde_json::Value),
}

impl<'de> Deserialize<'de> for PayloadSchema {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<PayloadSchema, D::Error> {
        match serde_json::Value::deserialize(deserializer)? {
            serde_json::Value::String(text) if text == "fixtures" => Ok(PayloadSchema::Fixtures),
            schema @ serde_json::Value::Object(_) => Ok(PayloadSchema::Schema(schema)),
            _ => Err(serde::de::Error::custom(
                "expected `fixtures` or a JSON Schema (a mapping such as `{ type: object, properties: ... }`)",
            )),
        }
    }
}

impl JsonSchema for PayloadSchema {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "PayloadSchema".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "`fixtures`, to infer the payload from the fixtures' bodies, or a JSON Schema of the payload.",
            "oneOf": [
                { "const": "fixtures" },
                { "type": "object", "description": "A JSON Schema (draft 2020-12) of the payload." }
            ]
        })
    }
}

/// A sender whose contract hookgate knows: any preset but `hubspot-v3`, since
/// `provider: hubspot` already means HubSpot's v3 signatures (the safe default; the `hubspot`
/// scheme, which also takes v1 and v2, is chosen with `signature.scheme`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Provider(pub Preset);

impl Provider {
    /// The scheme the provider verifies with.
    pub fn scheme(self) -> Preset {
        match self.0 {
            Preset::Hubspot => Preset::HubspotV3,
            preset => preset,
        }
    }
}

static PROVIDER_NAMES: LazyLock<Vec<&'static str>> = LazyLock::new(|| {
    Preset::ALL.iter().map(|p| p.name()).filter(|name| *name != "hubspot-v3").collect()
});

static SCHEME_NAMES: LazyLock<Vec<&'static str>> =
    LazyLock::new(|| Preset::ALL.iter().map(|p| p.name()).chain(["hmac", "custom"]).collect());

/// Deserialises a name from a fixed list, reporting an unknown one with its alternatives.
fn named<'de, D: Deserializer<'de>, T>(
    deserializer: D,
    names: &'static [&'static str],
    from: impl Fn(&str) -> Option<T>,
) -> Result<T, D::Error> {
    let text = String::deserialize(deserializer)?;
    from(&text).ok_or_else(|| serde::de::Error::unknown_variant(&text, names))
}

fn names_schema(names: &[&str], description: &str) -> schemars::Schema {
    schemars::json_schema!({ "type": "string", "enum": names, "description": description })
}

impl<'de> Deserialize<'de> for Provider {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Provider, D::Error> {
        named(deserializer, PROVIDER_NAMES.as_slice(), |name| {
            Preset::from_name(name).filter(|p| *p != Preset::HubspotV3).map(Provider)
        })
    }
}

impl JsonSchema for Provider {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Provider".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        names_schema(
            &PROVIDER_NAMES,
            "A sender whose signature, key, type and scope hookgate knows.",
        )
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SignatureConfig {
    /// The signing scheme: a sender preset, `hmac` (a one-header HMAC, in short) or `custom`
    /// (the signature language, written out). May be left out when `provider` is set.
    #[serde(default)]
    pub scheme: Option<SchemeName>,
    /// Secrets to verify with. Any may match, so list the new one and the old one while
    /// rotating. For public-key schemes these are the sender's public keys or certificates.
    pub secrets: Vec<SecretRef>,
    /// Accepted clock difference for timestamped schemes, e.g. `5m` (the default).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub tolerance: Option<HumanDuration>,
    /// `hmac`, `custom`: the header carrying the signature (`custom`: or a list of names, the
    /// first present of which is read).
    #[serde(default)]
    pub header: Option<HeaderNames>,
    /// `hmac`, `custom`: text before the encoded signature, e.g. `sha256=`.
    #[serde(default)]
    pub prefix: Option<String>,
    /// `hmac`: the hash function. `custom`: the whole algorithm (`hmac-sha256`, …).
    #[serde(default)]
    pub algorithm: Option<SignatureAlgorithm>,
    /// `hmac`, `custom`: how the signature is encoded.
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
    /// `custom`: the signature header holds named fields, e.g. `t=…,v1=…`.
    #[serde(default)]
    pub fields: Option<FieldsConfig>,
    /// `custom` with `fields`: the name of the fields holding signatures (any may match).
    #[serde(default)]
    pub signature_field: Option<String>,
    /// `custom`: the signature is this member of the JSON body (a JSON pointer), not a header.
    #[serde(default)]
    pub body_field: Option<String>,
    /// `custom`: where the signed timestamp is and how it is read.
    #[serde(default)]
    pub timestamp: Option<TimestampConfig>,
    /// `custom`: what is signed, in order.
    #[serde(default)]
    pub message: Option<Vec<MessagePart>>,
    /// `custom`: how secrets are read (default `raw`, or what the algorithm needs).
    #[serde(default)]
    pub key_format: Option<KeyFormatName>,
    /// `custom`: the signed URL carries a hex SHA-256 of the body in this query parameter,
    /// which must match the body (Twilio's `bodySHA256`).
    #[serde(default)]
    pub body_digest_param: Option<String>,
    /// `custom`: if the signature does not hold over the URL as received, try it with the port
    /// removed or the scheme's default port added (Twilio).
    #[serde(default)]
    pub url_port_variants: Option<bool>,
    /// `custom`: an empty body is refused before anything else.
    #[serde(default)]
    pub require_body: Option<bool>,
    /// The senders trusted, for schemes whose key many senders share: AWS SNS signs every
    /// topic's messages with one certificate per region, so list the topic ARNs
    /// (`arn:aws:sns:us-east-2:123456789012:orders`). Required for `aws-sns`.
    #[serde(default)]
    pub senders: Option<Vec<String>>,
    /// `custom`: a JSON pointer to the signed body member naming the sender (see `senders`).
    #[serde(default)]
    pub sender_field: Option<String>,
    /// `custom`: a JSON pointer to the body member naming where the signing key can be
    /// fetched (see `fetch_keys`).
    #[serde(default)]
    pub key_url_field: Option<String>,
    /// Fetch signing keys (certificates) from the URL the delivery names, only from these
    /// hosts, over https, and keep them for a day (AWS SNS: `fetch_keys: {}` allows
    /// `sns.{region}.amazonaws.com` and `sns.{region}.amazonaws.com.cn`). `secrets` may then
    /// be empty.
    #[serde(default)]
    pub fetch_keys: Option<FetchKeysConfig>,
    /// `custom`: several rules, each with a `when`; the first whose `when` holds verifies the
    /// request, and a request none fits is refused as an unsupported signature version.
    /// Each variant takes the fields above; they are not given beside `variants`.
    #[serde(default)]
    pub variants: Option<Vec<VariantConfig>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BodyFormat {
    Json,
    /// `application/x-www-form-urlencoded`: each parameter is a field of `payload`.
    Form,
    /// `application/x-www-form-urlencoded` carrying the JSON document in its `payload`
    /// parameter, which becomes `payload`: GitHub's `content_type: form`, Slack's interactive
    /// components.
    FormPayload,
}

/// Where signing keys may be fetched from.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FetchKeysConfig {
    /// Host names keys may come from; `*` stands for one DNS label and `{region}` for an AWS
    /// region name (`us-east-2`), e.g. `sns.{region}.amazonaws.com`. Plain http is allowed
    /// only to loopback hosts (tests).
    #[serde(default)]
    pub hosts: Option<Vec<String>>,
}

/// One header name, or several of which the first present is used.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum HeaderNames {
    One(String),
    FirstOf(Vec<String>),
}

impl HeaderNames {
    pub fn names(&self) -> Vec<String> {
        match self {
            HeaderNames::One(name) => vec![name.clone()],
            HeaderNames::FirstOf(names) => names.clone(),
        }
    }
}

/// One rule of a `custom` scheme with several. Its fields repeat those of `SignatureConfig`
/// rather than sharing a flattened struct: `#[serde(flatten)]` cannot deny unknown fields, and
/// an unknown field reported at its line is worth the repetition.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VariantConfig {
    /// When this rule applies.
    pub when: ConditionConfig,
    /// The secrets of this rule alone, when its sender signs it with others than the rest
    /// (Twilio: a SharedKey with HMAC-SHA256, the auth token with SHA-1). Without, the
    /// signature's `secrets`; those then verify no rule that has its own.
    #[serde(default)]
    pub secrets: Option<Vec<SecretRef>>,
    #[serde(default)]
    pub header: Option<HeaderNames>,
    #[serde(default)]
    pub prefix: Option<String>,
    #[serde(default)]
    pub algorithm: Option<SignatureAlgorithm>,
    #[serde(default)]
    pub encoding: Option<DigestEncoding>,
    #[serde(default)]
    pub fields: Option<FieldsConfig>,
    #[serde(default)]
    pub signature_field: Option<String>,
    #[serde(default)]
    pub body_field: Option<String>,
    #[serde(default)]
    pub timestamp: Option<TimestampConfig>,
    #[serde(default)]
    pub message: Option<Vec<MessagePart>>,
    #[serde(default)]
    pub key_format: Option<KeyFormatName>,
    #[serde(default)]
    pub body_digest_param: Option<String>,
    #[serde(default)]
    pub url_port_variants: Option<bool>,
    #[serde(default)]
    pub require_body: Option<bool>,
}

/// When a variant applies: a header (present, or `equals` a value), a query parameter of the
/// URL, a member of the JSON body that `equals` a value, `all` of several, or `always: true`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConditionConfig {
    #[serde(default)]
    pub header: Option<String>,
    #[serde(default)]
    pub query_param: Option<String>,
    #[serde(default)]
    pub body_field: Option<String>,
    #[serde(default)]
    pub equals: Option<String>,
    #[serde(default)]
    pub always: Option<bool>,
    /// Every one of these holds.
    #[serde(default)]
    pub all: Option<Vec<ConditionConfig>>,
}

/// A signing scheme: a sender preset, `hmac` (one header, in short) or `custom` (written out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemeName {
    Preset(Preset),
    Hmac,
    Custom,
}

impl SchemeName {
    pub fn as_str(self) -> &'static str {
        match self {
            SchemeName::Preset(preset) => preset.name(),
            SchemeName::Hmac => "hmac",
            SchemeName::Custom => "custom",
        }
    }
}

impl<'de> Deserialize<'de> for SchemeName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<SchemeName, D::Error> {
        named(deserializer, SCHEME_NAMES.as_slice(), |name| match name {
            "hmac" => Some(SchemeName::Hmac),
            "custom" => Some(SchemeName::Custom),
            other => Preset::from_name(other).map(SchemeName::Preset),
        })
    }
}

impl JsonSchema for SchemeName {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "SchemeName".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        names_schema(
            &SCHEME_NAMES,
            "A sender preset, `hmac` (one header carrying an HMAC, in short) or `custom` (the signature language written out).",
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
pub enum SignatureAlgorithm {
    /// `hmac` only: HMAC-SHA1.
    #[serde(rename = "sha1")]
    Sha1,
    /// `hmac` only: HMAC-SHA256.
    #[serde(rename = "sha256")]
    Sha256,
    /// `hmac` only: HMAC-SHA512.
    #[serde(rename = "sha512")]
    Sha512,
    #[serde(rename = "hmac-sha1")]
    HmacSha1,
    #[serde(rename = "hmac-sha256")]
    HmacSha256,
    #[serde(rename = "hmac-sha512")]
    HmacSha512,
    /// A plain SHA-256 of the message, which signs `secret` in it (HubSpot v1/v2).
    #[serde(rename = "digest-sha256")]
    DigestSha256,
    /// The header carries the secret itself (an API-key or basic-auth header).
    #[serde(rename = "shared-secret")]
    SharedSecret,
    /// ECDSA P-256 with SHA-256; secrets are public keys (base64 DER or PEM).
    #[serde(rename = "ecdsa-p256-sha256")]
    EcdsaP256Sha256,
    /// RSA PKCS#1 v1.5 with SHA-1; secrets are X.509 certificates (PEM).
    #[serde(rename = "rsa-sha1")]
    RsaSha1,
    /// RSA PKCS#1 v1.5 with SHA-256; secrets are X.509 certificates (PEM).
    #[serde(rename = "rsa-sha256")]
    RsaSha256,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DigestEncoding {
    Hex,
    Base64,
    /// The value as sent (a shared-secret header).
    Text,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SignedPart {
    /// The raw body.
    Body,
    /// The timestamp header's value, the separator, then the raw body.
    TimestampBody,
}

/// A structured signature header: fields split by `separator`, name and value by `assign`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FieldsConfig {
    /// Between fields, e.g. `,` (Stripe), `;` (Paddle) or a space (Standard Webhooks).
    pub separator: String,
    /// Between a field's name and its value: `=` (the default) or `,`.
    #[serde(default)]
    pub assign: Option<String>,
}

/// Where the signed timestamp is.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TimestampConfig {
    /// A header of its own (or a list of names, the first present of which is read).
    #[serde(default)]
    pub header: Option<HeaderNames>,
    /// A field of the (structured) signature header, e.g. `t`.
    #[serde(default)]
    pub field: Option<String>,
    /// How it is written (default `unix`).
    #[serde(default)]
    pub format: Option<TimestampFormatName>,
    /// Which edges of the tolerance window hold (default `both_ways`).
    #[serde(default)]
    pub rule: Option<TimestampRuleName>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TimestampFormatName {
    /// Unix seconds.
    Unix,
    /// Unix milliseconds.
    UnixMs,
    /// RFC 3339, e.g. `2024-01-15T10:00:00Z`.
    Rfc3339,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TimestampRuleName {
    /// Older or newer than the tolerance is refused; exactly the tolerance passes.
    BothWays,
    /// Exactly the tolerance old is refused already (HubSpot's rule).
    StrictPast,
    /// Only age counts.
    PastOnly,
}

/// One piece of the signed message.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum MessagePart {
    /// The raw body.
    Body,
    /// The timestamp, exactly as sent.
    Timestamp,
    /// The HTTP method (`POST`).
    Method,
    /// The public URL the sender called, with its query string.
    Url,
    /// Form parameters sorted by name, each name then value, decoded (Twilio).
    FormSorted,
    /// The secret itself (for `digest-sha256`).
    Secret,
    /// Fixed text.
    Literal(String),
    /// A header's value.
    Header(HeaderNames),
    /// For each of these names the JSON body has as a string member: name, newline, value,
    /// newline (AWS SNS's canonical message).
    BodyFields(Vec<String>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum KeyFormatName {
    /// The secret's bytes as configured.
    Raw,
    /// Base64 after an optional `whsec_` (Standard Webhooks).
    Whsec,
    /// An ECDSA P-256 public key, base64 DER or PEM.
    PublicKey,
    /// An X.509 certificate, PEM.
    Certificate,
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
    /// The SHA-256 of a form body's parameters, decoded and sorted: for senders that sign the
    /// parameters rather than the bytes (Twilio), so a re-encoding of the same parameters is
    /// the same event.
    FormSha256,
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
    /// Fetch the current source object just before the write, for senders without versions:
    /// `fields` then see it as `source`, so a late delivery writes today's state.
    #[serde(default)]
    pub refresh: Option<Refresh>,
}

/// An HTTP request for the current state of the object an event names.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Refresh {
    /// A template over `payload`, `headers`, `body` and `event`; its scheme and host are
    /// written out, so that a payload cannot send the request elsewhere, e.g.
    /// `https://api.stripe.com/v1/customers/{{ payload.data.object.id }}`.
    pub url: String,
    #[serde(default)]
    pub method: RefreshMethod,
    /// Header name to value, sent as written (no secrets here: see `secret_headers`, `auth`).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Header name to secret reference, for credentials a source reads from headers of its
    /// own, e.g. `{ apikey: { env: SUPABASE_SERVICE_KEY } }`.
    #[serde(default)]
    pub secret_headers: BTreeMap<String, SecretRef>,
    #[serde(default)]
    pub auth: Option<RefreshAuth>,
    /// How long the request may take, at most the worker's call timeout.
    #[serde(default = "default_refresh_timeout")]
    #[schemars(with = "String")]
    pub timeout: HumanDuration,
    /// What a 404 or 410 means: the object is gone, so the write is skipped with evidence
    /// (`skip`, the default), or dead-lettered for an operator (`dead`).
    #[serde(default)]
    pub not_found: NotFound,
    /// An expression over `source` (and the delivery's variables) that says a fetched object
    /// is gone although it was found, e.g. Stripe's `source.deleted`: handled as `not_found`.
    #[serde(default)]
    pub gone_if: Option<String>,
    /// A JSON pointer into the fetched object to its own version (`/updated`): the write then
    /// carries that version for ordering instead of the delivery's.
    #[serde(default)]
    pub version: Option<String>,
    /// Bytes of the fetched object read at most.
    #[serde(default = "default_refresh_bytes_max")]
    pub max_bytes: usize,
    /// Plain `http://` to a host that is not loopback (never for production APIs).
    #[serde(default)]
    pub allow_plain_http: bool,
}

fn default_refresh_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(10))
}

fn default_refresh_bytes_max() -> usize {
    1024 * 1024
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum RefreshMethod {
    #[default]
    Get,
    Post,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NotFound {
    #[default]
    Skip,
    Dead,
}

/// How a refresh authenticates; every secret is a reference.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum RefreshAuth {
    /// `Authorization: Bearer <secret>`.
    Bearer(SecretRef),
    /// `Authorization: Basic <username:password>`; Stripe's secret key is a username with
    /// an empty password.
    Basic {
        #[serde(default)]
        username: Option<SecretRef>,
        #[serde(default)]
        password: Option<SecretRef>,
    },
    /// The secret in a header of its own, e.g. `X-Api-Key`.
    ApiKey { header: String, secret: SecretRef },
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
    /// Seals stored bodies and kept headers (AES-256-GCM) under a key given by secret
    /// reference. Without it, payloads are stored in plaintext (`check` warns).
    #[serde(default)]
    pub payload_encryption: Option<PayloadEncryption>,
    /// Where this deployment sends the refreshes that pipelines write for an origin: origin
    /// to origin, e.g. `https://api.stripe.com: http://127.0.0.1:12111` for a test double.
    /// The pipeline's path and query are kept.
    #[serde(default)]
    pub source_origins: BTreeMap<String, String>,
    /// Connector plugins: libraries loaded at start, each providing the connector kind it
    /// describes.
    #[serde(default)]
    pub plugins: Option<Plugins>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Plugins {
    /// Directories, relative to this file, whose libraries (`*.so`, `*.dylib`, `*.dll`) are
    /// loaded. Nothing else is ever loaded; only the operator should be able to write to them.
    pub directories: Vec<String>,
    /// Calls of one plugin instance in flight at most (1 to 256), counting calls that ran
    /// past their timeout and have not returned.
    #[serde(default = "default_plugin_calls")]
    pub max_calls_in_flight: usize,
    /// Bytes of one plugin answer read at most (1 KiB to 16 MiB); a longer answer is treated
    /// like one that cannot be read.
    #[serde(default = "default_plugin_answer_bytes")]
    pub max_answer_bytes: usize,
}

fn default_plugin_calls() -> usize {
    16
}

fn default_plugin_answer_bytes() -> usize {
    1 << 20
}

/// Keys for payloads at rest.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PayloadEncryption {
    /// The first key seals new rows; every listed key opens the rows sealed under it. To
    /// rotate, put a new key first and run `hookgate keys rotate`; remove an old key only once
    /// rotation has finished.
    pub keys: Vec<PayloadKeyRef>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PayloadKeyRef {
    /// Recorded with every row sealed under this key; never reuse an id for another key.
    pub id: String,
    /// 32 random bytes in base64 (`openssl rand -base64 32`).
    pub secret: SecretRef,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConnectorInstance {
    /// The name targets refer to.
    pub name: String,
    /// The connector kind: an in-tree one (`mock`, `salesforce`, `hubspot`, `http`) or one a
    /// plugin describes (`hookgate connectors` lists them).
    pub kind: String,
    /// Kind-specific settings (URLs, API version, fault injection for the mock).
    #[serde(default)]
    pub settings: BTreeMap<String, serde_json::Value>,
    /// Kind-specific credentials, each a secret reference.
    #[serde(default)]
    pub credentials: BTreeMap<String, SecretRef>,
    /// The calls this instance may make, shared by every process on one store. Without it,
    /// the kind's published limits apply (HubSpot: 100 calls per 10 s).
    #[serde(default)]
    pub limits: Option<LimitsConfig>,
}

/// A connector instance's call budget.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// At most `calls` calls in any rolling `per`, e.g. `{ calls: 100, per: 10s }`: writes
    /// and reconciling lookups alike, by every gateway and `hookgate work` process together.
    #[serde(default)]
    pub rate: Option<RateConfig>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RateConfig {
    /// Calls allowed in one window, 1 to 1,000,000.
    pub calls: u32,
    /// The rolling window, 1s to 24h.
    #[schemars(with = "String")]
    pub per: HumanDuration,
}
