//! The signature language: what a sender signs, with what, and where it puts the result.
//!
//! A [`Scheme`] is one or more [`Spec`]s, each guarded by a [`Condition`] (HubSpot picks its
//! scheme by a version header, Twilio by whether the URL carries `bodySHA256`, AWS SNS by the
//! message's `SignatureVersion`). Every built-in sender is a preset written in this language
//! (see [`crate::Preset`]), so one engine verifies them all.

/// How a sender signs its deliveries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scheme {
    /// The preset's name, or `custom`: shown in evidence and messages.
    pub name: String,
    /// Tried in order; the first whose condition holds verifies the request. A request that
    /// meets none is rejected as an unsupported signature version.
    pub variants: Vec<Variant>,
    /// A JSON pointer to the member of the body that names where the signing key can be
    /// fetched (AWS SNS's `/SigningCertURL`). Fetching is the caller's I/O, from hosts the
    /// pipeline allows; this crate only says where the URL is.
    pub key_url_field: Option<String>,
    /// A JSON pointer to the signed member that names who sent the message (AWS SNS's
    /// `/TopicArn`): everyone with the same key can sign, so the pipeline lists whom it trusts.
    pub sender_field: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variant {
    pub when: Condition,
    pub spec: Spec,
}

/// When a variant applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    Always,
    /// The header is present (any value).
    HeaderPresent(String),
    /// The header's trimmed value equals this text (case-sensitive).
    HeaderEquals(String, String),
    /// The URL's query string has this parameter.
    QueryParam(String),
    /// The body is a JSON object whose member (a JSON pointer) is this string.
    BodyField(String, String),
    /// Every one of these holds.
    All(Vec<Condition>),
}

/// One complete signing rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub algorithm: Algorithm,
    /// How configured keys are read.
    pub key_format: KeyFormat,
    /// Where the signatures are.
    pub signature: SignatureSource,
    /// Text before each encoded signature, e.g. `sha256=`; its absence is a malformed header.
    pub prefix: String,
    pub encoding: Encoding,
    pub timestamp: Option<TimestampSpec>,
    /// What is signed: these parts, concatenated.
    pub message: Vec<Part>,
    /// An empty body is rejected before anything else (Shopify).
    pub require_body: bool,
    /// A SHA-256 of the body, in hex, carried in this query parameter of the signed URL
    /// (Twilio's JSON webhooks): checked as well as the signature.
    pub body_digest_param: Option<String>,
    /// If the signature does not hold over the URL as received, try it with the port removed,
    /// or with the scheme's default port added (Twilio's validators do).
    pub url_port_variants: bool,
}

/// A header by name; the first of several alternative names that is present is used (Svix's
/// `svix-*` before the unbranded `webhook-*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderRef {
    pub names: Vec<String>,
}

impl HeaderRef {
    pub fn one(name: &str) -> HeaderRef {
        HeaderRef { names: vec![name.to_owned()] }
    }

    pub fn first_of(names: &[&str]) -> HeaderRef {
        HeaderRef { names: names.iter().map(|n| (*n).to_owned()).collect() }
    }

    /// The name shown in messages: the last alternative, the unbranded one.
    pub fn display(&self) -> &str {
        self.names.last().map(String::as_str).unwrap_or("")
    }
}

impl Scheme {
    /// Every header name a signature of this scheme is read from: the signature's, the
    /// timestamp's and each signed header, every alternative of each. A delivery signed
    /// afresh drops all of them first, so that a stale `svix-signature` cannot shadow a new
    /// `webhook-signature`.
    pub fn signing_headers(&self) -> Vec<String> {
        let mut names = Vec::new();
        for variant in &self.variants {
            let spec = &variant.spec;
            if let Some(header) = spec.signature.header() {
                names.extend(header.names.iter().cloned());
            }
            if let Some(TimestampSpec { source: TimestampSource::Header(header), .. }) =
                &spec.timestamp
            {
                names.extend(header.names.iter().cloned());
            }
            for part in &spec.message {
                if let Part::Header(header) = part {
                    names.extend(header.names.iter().cloned());
                }
            }
        }
        names.sort_by_key(|name| name.to_ascii_lowercase());
        names.dedup_by(|a, b| a.eq_ignore_ascii_case(b));
        names
    }
}

/// A header that holds named fields, like `t=1492774577,v1=5257a8…` (Stripe), `ts=…;h1=…`
/// (Paddle) or `v1,sig1 v1,sig2` (Standard Webhooks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fields {
    /// Between fields: `,`, `;` or a space.
    pub separator: char,
    /// Between a field's name and value: `=` or `,`.
    pub assign: char,
}

/// Where the signatures are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignatureSource {
    /// The whole value of a header is one signature.
    Header(HeaderRef),
    /// Every field of this name in a structured header is a signature; any may match
    /// (several during a secret roll). Fields of other names are ignored.
    Field { header: HeaderRef, fields: Fields, name: String },
    /// A string member of the JSON body (AWS SNS carries its signature in the message).
    BodyField(String),
}

impl SignatureSource {
    pub fn header(&self) -> Option<&HeaderRef> {
        match self {
            SignatureSource::Header(h) | SignatureSource::Field { header: h, .. } => Some(h),
            SignatureSource::BodyField(_) => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimestampSpec {
    pub source: TimestampSource,
    pub format: TimestampFormat,
    pub rule: TimestampRule,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimestampSource {
    Header(HeaderRef),
    /// A field of the signature header (which must have [`Fields`]).
    Field(String),
    BodyField(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimestampFormat {
    UnixSeconds,
    UnixMillis,
    /// `2024-01-15T10:00:00Z` or with an offset; fractions allowed.
    Rfc3339,
}

/// How a scheme treats the edges of its timestamp window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimestampRule {
    /// Exactly `tolerance` seconds old or ahead is accepted (Standard Webhooks, Stripe, Slack).
    InclusiveBothWays,
    /// Exactly `tolerance` old is rejected, as HubSpot's SDK does (`now - ts < 300`); ahead
    /// as far as `tolerance` is accepted.
    StrictPastInclusiveFuture,
    /// Only age counts; a timestamp ahead of our clock is accepted (senders whose clocks are
    /// known to run ahead, or that sign a time they set when the event was created).
    PastOnly,
}

/// One piece of the signed message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Literal(String),
    /// The timestamp exactly as sent.
    Timestamp,
    /// The HTTP method, as received (`POST`).
    Method,
    /// The full public URL the sender called, with its query string.
    Url,
    /// The raw body, byte for byte.
    Body,
    /// The `application/x-www-form-urlencoded` body's parameters sorted by name (then value),
    /// each as name followed by value, decoded, no separators (Twilio).
    FormSorted,
    /// A header's value, trimmed (e.g. Standard Webhooks' message id).
    Header(HeaderRef),
    /// The key itself (HubSpot v1/v2 hash `client secret + content`).
    Secret,
    /// For each of these members of the JSON body: name, newline, value, newline (AWS SNS's
    /// canonical string). A name ending in `?` may be absent; the others are required, all are
    /// strings, and only the first may contain a line break.
    BodyFields(Vec<String>),
}

/// How the signature is produced from the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    HmacSha1,
    HmacSha256,
    HmacSha512,
    /// A plain SHA-256 digest of the message; the message names where the key goes.
    DigestSha256,
    /// The header carries the key itself (a shared-secret or basic-auth header); compared in
    /// constant time. The message must be empty.
    SharedSecret,
    /// ECDSA over P-256 with SHA-256; the key is a public key, the signature DER or raw `r‖s`.
    EcdsaP256Sha256,
    /// RSASSA-PKCS1-v1_5 with SHA-1 or SHA-256; the key is an X.509 certificate.
    RsaSha1,
    RsaSha256,
}

impl Algorithm {
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::HmacSha1 => "HMAC-SHA1",
            Algorithm::HmacSha256 => "HMAC-SHA256",
            Algorithm::HmacSha512 => "HMAC-SHA512",
            Algorithm::DigestSha256 => "SHA-256",
            Algorithm::SharedSecret => "shared secret",
            Algorithm::EcdsaP256Sha256 => "ECDSA P-256 SHA-256",
            Algorithm::RsaSha1 => "RSA SHA-1",
            Algorithm::RsaSha256 => "RSA SHA-256",
        }
    }

    /// The length of the signature it produces, where it is fixed.
    pub fn output_len(self) -> Option<usize> {
        match self {
            Algorithm::HmacSha1 => Some(20),
            Algorithm::HmacSha256 | Algorithm::DigestSha256 => Some(32),
            Algorithm::HmacSha512 => Some(64),
            _ => None,
        }
    }

    pub fn is_public_key(self) -> bool {
        matches!(self, Algorithm::EcdsaP256Sha256 | Algorithm::RsaSha1 | Algorithm::RsaSha256)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Hex,
    Base64,
    /// The bytes as sent (a shared-secret header).
    Text,
}

/// How a configured key is turned into key material.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyFormat {
    /// The bytes as configured.
    Raw,
    /// Base64, optionally after `whsec_` (Standard Webhooks, Svix).
    Whsec,
    /// An ECDSA P-256 public key: base64 of its DER SubjectPublicKeyInfo (SendGrid's
    /// "verification key"), or PEM.
    PublicKey,
    /// An X.509 certificate in PEM (AWS SNS).
    Certificate,
}

impl Scheme {
    /// A scheme with one spec that always applies.
    pub fn single(name: &str, spec: Spec) -> Scheme {
        Scheme {
            name: name.to_owned(),
            variants: vec![Variant { when: Condition::Always, spec }],
            key_url_field: None,
            sender_field: None,
        }
    }

    /// The header names this scheme reads signatures from; the intake strips them before
    /// storing headers, so a signature never becomes evidence an attacker could replay.
    pub fn signature_headers(&self) -> Vec<String> {
        let mut names = Vec::new();
        for variant in &self.variants {
            if let Some(header) = variant.spec.signature.header() {
                for name in &header.names {
                    let name = name.to_ascii_lowercase();
                    if !names.contains(&name) {
                        names.push(name);
                    }
                }
            }
        }
        names
    }

    /// Whether any variant signs a timestamp.
    pub fn has_timestamp(&self) -> bool {
        self.variants.iter().any(|v| v.spec.timestamp.is_some())
    }

    /// Whether any variant signs the public URL, so the URL the sender called must be known.
    pub fn signs_url(&self) -> bool {
        self.variants.iter().any(|v| v.spec.message.contains(&Part::Url))
    }

    pub fn key_format(&self) -> KeyFormat {
        self.variants.first().map(|v| v.spec.key_format).unwrap_or(KeyFormat::Raw)
    }
}
