//! Webhook signature verification over the raw request bytes.
//!
//! This crate is pure: it reads no clock, no environment and no file. The caller passes the
//! request exactly as received (method, URL, headers, body bytes) and the current time, and
//! gets back either [`Verified`] or a [`Rejection`] that says why.
//!
//! # Layout
//! - [`Scheme`]: what a pipeline declares (a sender preset or a generic HMAC description).
//! - [`Verifier`]: a scheme bound to its decoded secrets; built once at load time, so a malformed
//!   secret is a configuration error and never a per-request surprise.
//! - [`Request`] and [`Clock`]: the inputs of one verification.
//!
//! # Rules every scheme follows
//! - The signature is computed over the raw body bytes; nothing is parsed first.
//! - Header names match case-insensitively; a header sent twice is malformed, not "pick one".
//! - A missing or malformed header is a rejection, never "allow".
//! - Comparison is constant-time over the encoded signature ([`subtle`]).
//! - Any configured secret may match, so secrets can be rotated without downtime.
//! - Timestamped schemes reject a timestamp further than their tolerance in the past *or* the
//!   future; see [`Scheme::timestamp_rule`] for each scheme's edge.

mod scheme;
mod secret;

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::{Sha256, Sha512};
use subtle::ConstantTimeEq;

pub use scheme::{Algorithm, Encoding, GenericHmac, Scheme, SignedContent, TimestampRule};
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

    fn required_text(&self, name: &str) -> Result<&'a str, Rejection> {
        match self.header(name) {
            HeaderLookup::Missing => Err(Rejection::MissingHeader(name.to_owned())),
            HeaderLookup::Repeated => Err(malformed(name, "sent more than once")),
            HeaderLookup::Found(raw) => {
                if raw.len() > SIGNATURE_HEADER_BYTES_MAX {
                    return Err(malformed(name, "too long"));
                }
                let text = std::str::from_utf8(raw).map_err(|_| malformed(name, "not UTF-8"))?;
                let text = text.trim();
                if text.is_empty() {
                    return Err(malformed(name, "empty"));
                }
                Ok(text)
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
    #[error("timestamp {age_secs} s old, past the {tolerance_secs} s tolerance")]
    TimestampTooOld { age_secs: i64, tolerance_secs: u32 },
    #[error("timestamp {ahead_secs} s in the future, past the {tolerance_secs} s tolerance")]
    TimestampTooNew { ahead_secs: i64, tolerance_secs: u32 },
    #[error("no signature matches any configured secret")]
    NoMatch,
    #[error("the request has an empty body")]
    EmptyBody,
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
        }
    }
}

fn malformed(header: &str, reason: &str) -> Rejection {
    Rejection::MalformedHeader { header: header.to_owned(), reason: reason.to_owned() }
}

/// What a successful verification learnt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified {
    /// Index of the secret that matched, in configuration order: evidence for rotations.
    pub secret_index: usize,
    /// The signed timestamp, in Unix seconds, for timestamped schemes.
    pub timestamp_secs: Option<i64>,
}

/// A scheme bound to its decoded secrets.
#[derive(Debug, Clone)]
pub struct Verifier {
    scheme: Scheme,
    tolerance_secs: u32,
    keys: Vec<SecretBytes>,
}

impl Verifier {
    /// Decodes every secret the way the scheme's sender defines it. `tolerance_secs` overrides
    /// the scheme's default tolerance; it has no effect on schemes without a timestamp.
    pub fn new(
        scheme: Scheme,
        secrets: &[SecretBytes],
        tolerance_secs: Option<u32>,
    ) -> Result<Verifier, KeyError> {
        if secrets.is_empty() {
            return Err(KeyError::NoSecret);
        }
        let keys = secrets
            .iter()
            .enumerate()
            .map(|(index, raw)| scheme.decode_key(raw).map_err(|e| e.at(index)))
            .collect::<Result<Vec<_>, _>>()?;
        let tolerance_secs = tolerance_secs.unwrap_or(DEFAULT_TOLERANCE_SECS);
        Ok(Verifier { scheme, tolerance_secs, keys })
    }

    pub fn scheme(&self) -> &Scheme {
        &self.scheme
    }

    /// Verifies one request. Checks run in the order of the official libraries: headers
    /// present, then timestamp window, then signature.
    pub fn verify(&self, request: &Request<'_>, now: Clock) -> Result<Verified, Rejection> {
        match &self.scheme {
            Scheme::Github => {
                self.verify_body(request, "x-hub-signature-256", "sha256=", Encoding::Hex)
            }
            Scheme::Shopify => {
                if request.body.is_empty() {
                    return Err(Rejection::EmptyBody);
                }
                self.verify_body(request, "x-shopify-hmac-sha256", "", Encoding::Base64)
            }
            Scheme::Slack => {
                let ts = request.required_text("x-slack-request-timestamp")?;
                let ts_secs = parse_unix(ts, "x-slack-request-timestamp")?;
                let sig = request.required_text("x-slack-signature")?;
                self.check_window(ts_secs * 1000, now)?;
                let message = [b"v0:", ts.as_bytes(), b":", request.body];
                self.match_any(
                    &message,
                    std::iter::once(sig),
                    "v0=",
                    Algorithm::Sha256,
                    Encoding::Hex,
                )
                .map(|i| Verified { secret_index: i, timestamp_secs: Some(ts_secs) })
            }
            Scheme::Stripe => self.verify_stripe(request, now),
            Scheme::StandardWebhooks => self.verify_standard(request, now),
            Scheme::HubspotV3 => self.verify_hubspot_v3(request, now),
            Scheme::Hmac(generic) => self.verify_generic(generic, request, now),
        }
    }

    /// One header carrying `prefix + encode(HMAC-SHA256(body))`, no timestamp.
    fn verify_body(
        &self,
        request: &Request<'_>,
        header: &str,
        prefix: &str,
        encoding: Encoding,
    ) -> Result<Verified, Rejection> {
        let sig = request.required_text(header)?;
        self.match_any(&[request.body], std::iter::once(sig), prefix, Algorithm::Sha256, encoding)
            .map(|i| Verified { secret_index: i, timestamp_secs: None })
    }

    fn verify_stripe(&self, request: &Request<'_>, now: Clock) -> Result<Verified, Rejection> {
        const HEADER: &str = "stripe-signature";
        let value = request.required_text(HEADER)?;
        let mut timestamp = None;
        let mut v1 = Vec::new();
        // stripe-python splits on "," and each item on the first "="; items it does not know
        // (v0, future schemes) are ignored.
        for item in value.split(',') {
            let Some((name, item_value)) = item.split_once('=') else { continue };
            match name.trim() {
                "t" => timestamp = Some(item_value),
                "v1" => v1.push(item_value),
                _ => {}
            }
        }
        let (Some(ts), false) = (timestamp, v1.is_empty()) else {
            return Err(malformed(HEADER, "no timestamp or no v1 signature"));
        };
        let ts_secs = parse_unix(ts, HEADER)?;
        self.check_window(ts_secs * 1000, now)?;
        let message = [ts.as_bytes(), b".", request.body];
        self.match_any(&message, v1.into_iter(), "", Algorithm::Sha256, Encoding::Hex)
            .map(|i| Verified { secret_index: i, timestamp_secs: Some(ts_secs) })
    }

    fn verify_standard(&self, request: &Request<'_>, now: Clock) -> Result<Verified, Rejection> {
        // Svix sends `svix-*` and may white-label to `webhook-*`; like its libraries, the
        // `svix-*` name wins when both are present.
        let pick = |suffix: &str| -> Result<&str, Rejection> {
            let svix = format!("svix-{suffix}");
            match request.header(&svix) {
                HeaderLookup::Missing => request.required_text(&format!("webhook-{suffix}")),
                _ => request.required_text(&svix),
            }
        };
        let id = pick("id")?;
        let ts = pick("timestamp")?;
        let signatures = pick("signature")?;
        let ts_secs = parse_unix(ts, "webhook-timestamp")?;
        self.check_window(ts_secs * 1000, now)?;
        let message = [id.as_bytes(), b".", ts.as_bytes(), b".", request.body];
        // Only entries whose version is exactly `v1` count; others (v1a, v2) are skipped.
        let candidates = signatures
            .split(' ')
            .filter_map(|entry| entry.split_once(','))
            .filter(|(version, _)| *version == "v1")
            .map(|(_, sig)| sig);
        self.match_any(&message, candidates, "", Algorithm::Sha256, Encoding::Base64)
            .map(|i| Verified { secret_index: i, timestamp_secs: Some(ts_secs) })
    }

    fn verify_hubspot_v3(&self, request: &Request<'_>, now: Clock) -> Result<Verified, Rejection> {
        let ts = request.required_text("x-hubspot-request-timestamp")?;
        let ts_ms = parse_unix(ts, "x-hubspot-request-timestamp")?;
        let sig = request.required_text("x-hubspot-signature-v3")?;
        self.check_window(ts_ms, now)?;
        let message =
            [request.method.as_bytes(), request.url.as_bytes(), request.body, ts.as_bytes()];
        self.match_any(&message, std::iter::once(sig), "", Algorithm::Sha256, Encoding::Base64)
            .map(|i| Verified { secret_index: i, timestamp_secs: Some(ts_ms.div_euclid(1000)) })
    }

    fn verify_generic(
        &self,
        generic: &GenericHmac,
        request: &Request<'_>,
        now: Clock,
    ) -> Result<Verified, Rejection> {
        let sig = request.required_text(&generic.header)?;
        match &generic.signed {
            SignedContent::Body => self
                .match_any(
                    &[request.body],
                    std::iter::once(sig),
                    &generic.prefix,
                    generic.algorithm,
                    generic.encoding,
                )
                .map(|i| Verified { secret_index: i, timestamp_secs: None }),
            SignedContent::TimestampAndBody { timestamp_header, separator } => {
                let ts = request.required_text(timestamp_header)?;
                let ts_secs = parse_unix(ts, timestamp_header)?;
                self.check_window(ts_secs * 1000, now)?;
                let message = [ts.as_bytes(), separator.as_bytes(), request.body];
                self.match_any(
                    &message,
                    std::iter::once(sig),
                    &generic.prefix,
                    generic.algorithm,
                    generic.encoding,
                )
                .map(|i| Verified { secret_index: i, timestamp_secs: Some(ts_secs) })
            }
        }
    }

    /// Applies the scheme's timestamp rule. `signed_ms` is the signed timestamp in Unix ms.
    fn check_window(&self, signed_ms: i64, now: Clock) -> Result<(), Rejection> {
        let tolerance_ms = i64::from(self.tolerance_secs) * 1000;
        let age_ms = now.unix_ms.saturating_sub(signed_ms);
        let too_old = match self.scheme.timestamp_rule() {
            TimestampRule::InclusiveBothWays => age_ms > tolerance_ms,
            TimestampRule::StrictPastInclusiveFuture => age_ms >= tolerance_ms,
            TimestampRule::None => false,
        };
        if too_old {
            return Err(Rejection::TimestampTooOld {
                age_secs: age_ms / 1000,
                tolerance_secs: self.tolerance_secs,
            });
        }
        if -age_ms > tolerance_ms {
            return Err(Rejection::TimestampTooNew {
                ahead_secs: -age_ms / 1000,
                tolerance_secs: self.tolerance_secs,
            });
        }
        Ok(())
    }

    /// Computes the MAC of `message` (given in parts, so nothing is copied) under each key and
    /// compares its encoding with every candidate in constant time. Returns the index of the
    /// first key that matched any candidate.
    fn match_any<'c>(
        &self,
        message: &[&[u8]],
        candidates: impl Iterator<Item = &'c str>,
        prefix: &str,
        algorithm: Algorithm,
        encoding: Encoding,
    ) -> Result<usize, Rejection> {
        let candidates: Vec<&str> = candidates.collect();
        if candidates.is_empty() {
            return Err(Rejection::NoMatch);
        }
        for (index, key) in self.keys.iter().enumerate() {
            let mac = compute_mac(algorithm, key.expose(), message);
            let expected = format!("{prefix}{}", encoding.encode(&mac));
            // Check every candidate rather than stopping early, so the time taken does not
            // depend on which entry matched.
            let mut matched = subtle::Choice::from(0);
            for candidate in &candidates {
                matched |= expected.as_bytes().ct_eq(candidate.as_bytes());
            }
            if bool::from(matched) {
                return Ok(index);
            }
        }
        Err(Rejection::NoMatch)
    }
}

/// What a signer needs besides the body: the parts some schemes sign.
#[derive(Debug, Clone, Copy)]
pub struct SignInput<'a> {
    pub method: &'a str,
    pub url: &'a str,
    pub body: &'a [u8],
    /// Unix seconds, for timestamped schemes.
    pub timestamp_secs: i64,
    /// The message id, for Standard Webhooks.
    pub message_id: &'a str,
}

impl Verifier {
    /// The headers a sender of this scheme would send with `input.body`, signed with the first
    /// configured secret: for writing fixtures and for tests. Verifying them at
    /// `input.timestamp_secs` succeeds.
    pub fn sign(&self, input: &SignInput<'_>) -> Vec<(String, String)> {
        let key = self.keys[0].expose();
        let ts = input.timestamp_secs.to_string();
        let mac = |parts: &[&[u8]]| compute_mac(Algorithm::Sha256, key, parts);
        let header = |name: &str, value: String| (name.to_owned(), value);
        match &self.scheme {
            Scheme::Github => vec![header(
                "X-Hub-Signature-256",
                format!("sha256={}", hex::encode(mac(&[input.body]))),
            )],
            Scheme::Stripe => {
                let signature = hex::encode(mac(&[ts.as_bytes(), b".", input.body]));
                vec![header("Stripe-Signature", format!("t={ts},v1={signature}"))]
            }
            Scheme::StandardWebhooks => {
                let id = input.message_id;
                let signature = Encoding::Base64.encode(&mac(&[
                    id.as_bytes(),
                    b".",
                    ts.as_bytes(),
                    b".",
                    input.body,
                ]));
                vec![
                    header("webhook-id", id.to_owned()),
                    header("webhook-timestamp", ts),
                    header("webhook-signature", format!("v1,{signature}")),
                ]
            }
            Scheme::Shopify => {
                vec![header("X-Shopify-Hmac-Sha256", Encoding::Base64.encode(&mac(&[input.body])))]
            }
            Scheme::Slack => {
                let signature = hex::encode(mac(&[b"v0:", ts.as_bytes(), b":", input.body]));
                vec![
                    header("X-Slack-Request-Timestamp", ts),
                    header("X-Slack-Signature", format!("v0={signature}")),
                ]
            }
            Scheme::HubspotV3 => {
                let ms = input.timestamp_secs.saturating_mul(1000).to_string();
                let parts: [&[u8]; 4] =
                    [input.method.as_bytes(), input.url.as_bytes(), input.body, ms.as_bytes()];
                vec![
                    header("X-HubSpot-Request-Timestamp", ms.clone()),
                    header("X-HubSpot-Signature-v3", Encoding::Base64.encode(&mac(&parts))),
                ]
            }
            Scheme::Hmac(generic) => {
                let digest = |parts: &[&[u8]]| {
                    let mac = compute_mac(generic.algorithm, key, parts);
                    format!("{}{}", generic.prefix, generic.encoding.encode(&mac))
                };
                match &generic.signed {
                    SignedContent::Body => vec![header(&generic.header, digest(&[input.body]))],
                    SignedContent::TimestampAndBody { timestamp_header, separator } => {
                        let signature = digest(&[ts.as_bytes(), separator.as_bytes(), input.body]);
                        vec![header(timestamp_header, ts), header(&generic.header, signature)]
                    }
                }
            }
        }
    }
}

/// HMAC of the concatenation of `parts` under `key`.
pub fn compute_mac(algorithm: Algorithm, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    match algorithm {
        Algorithm::Sha256 => {
            let mut mac =
                Hmac::<Sha256>::new_from_slice(key).expect("HMAC accepts keys of any length");
            parts.iter().for_each(|p| mac.update(p));
            mac.finalize().into_bytes().to_vec()
        }
        Algorithm::Sha512 => {
            let mut mac =
                Hmac::<Sha512>::new_from_slice(key).expect("HMAC accepts keys of any length");
            parts.iter().for_each(|p| mac.update(p));
            mac.finalize().into_bytes().to_vec()
        }
    }
}

impl Encoding {
    pub fn encode(self, bytes: &[u8]) -> String {
        match self {
            Encoding::Hex => hex::encode(bytes),
            Encoding::Base64 => base64::engine::general_purpose::STANDARD.encode(bytes),
        }
    }
}

fn parse_unix(text: &str, header: &str) -> Result<i64, Rejection> {
    // Digits only: a sign, a fraction or an exponent is not a timestamp any sender produces.
    if text.is_empty() || text.len() > 16 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed(header, "timestamp is not a whole number"));
    }
    text.parse().map_err(|_| malformed(header, "timestamp is not a whole number"))
}

#[cfg(test)]
mod tests;
