//! Webhook signature verification over the raw request bytes.
//!
//! This crate is pure: it reads no clock, no environment and no file. The caller passes the
//! request exactly as received (method, URL, headers, body bytes) and the current time, and
//! gets back either [`Verified`] or a [`Rejection`] that says why.
//!
//! # Layout
//! - [`Scheme`]: the signature language: where signatures and timestamps are, what is signed,
//!   with which algorithm and encoding. [`Preset`]s are schemes written in it.
//! - [`Verifier`]: a scheme bound to its decoded keys; built once at load time, so a malformed
//!   secret or public key is a configuration error and never a per-request surprise.
//! - [`Request`] and [`Clock`]: the inputs of one verification.
//!
//! # Rules every scheme follows
//! - The signature is computed over the raw body bytes; nothing is parsed first, except where
//!   the sender signs parsed content (form parameters, AWS SNS's message members).
//! - Header names match case-insensitively; a header sent twice is malformed, not "pick one".
//! - A missing or malformed header is a rejection, never "allow"; so is a structured header
//!   with a repeated timestamp, and a signature version the scheme does not know.
//! - Comparison is constant-time over the decoded signature ([`subtle`]).
//! - Any configured key may match, so secrets can be rotated without downtime.
//! - Timestamped schemes reject a timestamp further than their tolerance in the past (and, by
//!   most rules, the future); see [`TimestampRule`].

mod engine;
mod keys;
mod preset;
mod scheme;
mod secret;

use hmac::{Hmac, Mac};
use sha1::Sha1;
use sha2::{Sha256, Sha512};

pub use engine::{KeyUse, SignError, SignInput, Signature, Verifier};
pub use keys::PrivateKey;
pub use preset::{Preset, SNS_SIGNED_MEMBERS};
pub use scheme::{
    Algorithm, Condition, Encoding, Fields, HeaderRef, KeyFormat, Part, Scheme, SignatureSource,
    Spec, TimestampFormat, TimestampRule, TimestampSource, TimestampSpec, Variant,
};
pub use secret::{KeyError, SecretBytes};

/// The default tolerance of every timestamped preset, as their official libraries use it.
pub const DEFAULT_TOLERANCE_SECS: u32 = 300;

/// Signature headers never exceed this many bytes in any scheme we know; longer values are
/// rejected before any parsing, which bounds the work an attacker can cause per request.
pub const SIGNATURE_HEADER_BYTES_MAX: usize = 8 * 1024;

/// One request as the sender sent it.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// HTTP method as received (`POST`). HubSpot v3 signs it.
    pub method: &'a str,
    /// The full public URL the sender called, with query string. HubSpot v3 signs it.
    pub url: &'a str,
    /// Header names and raw values, in the order received.
    pub headers: &'a [(String, Vec<u8>)],
    /// The body, byte for byte.
    pub body: &'a [u8],
}

impl<'a> Request<'a> {
    /// Looks a header up by name, case-insensitively. A header that appears more than once is
    /// reported as [`HeaderLookup::Repeated`], because verifying one of several values would
    /// let an attacker choose which one we check.
    pub fn header(&self, name: &str) -> HeaderLookup<'a> {
        let mut found = None;
        for (candidate, value) in self.headers {
            if candidate.eq_ignore_ascii_case(name) {
                if found.is_some() {
                    return HeaderLookup::Repeated;
                }
                found = Some(value.as_slice());
            }
        }
        match found {
            Some(value) => HeaderLookup::Found(value),
            None => HeaderLookup::Missing,
        }
    }

    /// The first of `header`'s names that is present.
    fn pick<'h>(&self, header: &'h HeaderRef) -> &'h str {
        header
            .names
            .iter()
            .find(|name| self.header(name) != HeaderLookup::Missing)
            .or(header.names.last())
            .map(String::as_str)
            .unwrap_or("")
    }

    /// The trimmed text of a header that must be present once, non-empty, UTF-8 and of a sane
    /// length. Returns the name it was found under, for messages.
    fn required_text(&self, header: &HeaderRef) -> Result<(&'a str, String), Rejection> {
        let name = self.pick(header).to_owned();
        match self.header(&name) {
            HeaderLookup::Missing => Err(Rejection::MissingHeader(name)),
            HeaderLookup::Repeated => Err(malformed(&name, "sent more than once")),
            HeaderLookup::Found(raw) => {
                if raw.len() > SIGNATURE_HEADER_BYTES_MAX {
                    return Err(malformed(&name, "too long"));
                }
                let text = std::str::from_utf8(raw).map_err(|_| malformed(&name, "not UTF-8"))?;
                let text = text.trim();
                if text.is_empty() {
                    return Err(malformed(&name, "empty"));
                }
                Ok((text, name))
            }
        }
    }
}

/// The result of looking a header up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderLookup<'a> {
    Missing,
    Repeated,
    Found(&'a [u8]),
}

/// The verifier's notion of now, in Unix milliseconds. HubSpot v3 timestamps are in
/// milliseconds; the other schemes use seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clock {
    pub unix_ms: i64,
}

impl Clock {
    pub fn from_unix_secs(secs: i64) -> Clock {
        Clock { unix_ms: secs.saturating_mul(1000) }
    }
}

/// Why a request was rejected. The HTTP edge sends none of this to the sender (a bare 401);
/// it is for logs, evidence and fixtures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("missing header `{0}`")]
    MissingHeader(String),
    #[error("malformed header `{header}`: {reason}")]
    MalformedHeader { header: String, reason: String },
    #[error(
        "timestamp {age_secs} s old, {} the {tolerance_secs} s tolerance",
        if *strict { "not strictly under (this sender's rule)" } else { "past" }
    )]
    TimestampTooOld { age_secs: i64, tolerance_secs: u32, strict: bool },
    #[error("timestamp {ahead_secs} s in the future, past the {tolerance_secs} s tolerance")]
    TimestampTooNew { ahead_secs: i64, tolerance_secs: u32 },
    #[error("no signature matches any configured secret")]
    NoMatch,
    #[error("the request has an empty body")]
    EmptyBody,
    #[error("malformed body: {0}")]
    MalformedBody(String),
    #[error("unsupported signature version: {0}")]
    UnsupportedVersion(String),
    #[error("the body does not match the `{0}` digest the signed URL carries")]
    BodyDigestMismatch(String),
    #[error("untrusted signing key: {0}")]
    UntrustedKey(String),
    #[error("the message is from `{0}`, which the pipeline does not trust")]
    UntrustedSender(String),
}

impl Rejection {
    /// A stable machine name, used by fixtures and evidence records.
    pub fn code(&self) -> &'static str {
        match self {
            Rejection::MissingHeader(_) => "missing_header",
            Rejection::MalformedHeader { .. } => "malformed_header",
            Rejection::TimestampTooOld { .. } => "timestamp_too_old",
            Rejection::TimestampTooNew { .. } => "timestamp_too_new",
            Rejection::NoMatch => "signature_mismatch",
            Rejection::EmptyBody => "empty_body",
            Rejection::MalformedBody(_) => "malformed_body",
            Rejection::UnsupportedVersion(_) => "unsupported_version",
            Rejection::BodyDigestMismatch(_) => "body_digest_mismatch",
            Rejection::UntrustedKey(_) => "untrusted_key",
            Rejection::UntrustedSender(_) => "untrusted_sender",
        }
    }
}

fn malformed(header: &str, reason: impl Into<String>) -> Rejection {
    Rejection::MalformedHeader { header: header.to_owned(), reason: reason.into() }
}

/// What a successful verification learnt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified {
    /// Index of the key that matched, in configuration order: evidence for rotations.
    pub secret_index: usize,
    /// The signed timestamp, in Unix seconds, for timestamped schemes.
    pub timestamp_secs: Option<i64>,
}

/// HMAC of the concatenation of `parts` under `key`. `algorithm` must be an HMAC.
pub fn compute_mac(algorithm: Algorithm, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    fn mac<M: Mac + hmac::digest::KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
        let mut mac = <M as hmac::digest::KeyInit>::new_from_slice(key)
            .expect("HMAC accepts keys of any length");
        parts.iter().for_each(|p| mac.update(p));
        mac.finalize().into_bytes().to_vec()
    }
    match algorithm {
        Algorithm::HmacSha1 => mac::<Hmac<Sha1>>(key, parts),
        Algorithm::HmacSha512 => mac::<Hmac<Sha512>>(key, parts),
        _ => mac::<Hmac<Sha256>>(key, parts),
    }
}

impl Encoding {
    pub fn encode(self, bytes: &[u8]) -> String {
        use base64::Engine as _;
        match self {
            Encoding::Hex => hex::encode(bytes),
            Encoding::Base64 => base64::engine::general_purpose::STANDARD.encode(bytes),
            Encoding::Text => String::from_utf8_lossy(bytes).into_owned(),
        }
    }

    pub fn decode(self, text: &str) -> Option<Vec<u8>> {
        use base64::Engine as _;
        match self {
            Encoding::Hex => hex::decode(text).ok(),
            Encoding::Base64 => base64::engine::general_purpose::STANDARD.decode(text).ok(),
            Encoding::Text => Some(text.as_bytes().to_vec()),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Encoding::Hex => "hex",
            Encoding::Base64 => "base64",
            Encoding::Text => "text",
        }
    }
}

/// Text from a request, made safe for a message: control characters escaped, cut at 32
/// characters.
fn quote(text: &str) -> String {
    let mut out: String = text.chars().take(32).flat_map(char::escape_debug).collect();
    if text.chars().count() > 32 {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests;
