//! The one engine that verifies every scheme.

use std::borrow::Cow;

use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq;

use crate::keys::{self, Key, PrivateKey};
use crate::scheme::{
    Algorithm, Condition, Encoding, Part, Scheme, SignatureSource, Spec, TimestampFormat,
    TimestampRule, TimestampSource,
};
use crate::{
    Clock, DEFAULT_TOLERANCE_SECS, HeaderLookup, KeyError, Rejection, Request, SecretBytes,
    Verified, compute_mac, malformed, quote,
};

/// A scheme bound to its decoded keys.
#[derive(Debug, Clone)]
pub struct Verifier {
    scheme: Scheme,
    tolerance_secs: u32,
    keys: Vec<Key>,
    /// Which variants each key verifies, parallel to `keys`.
    key_use: Vec<KeyUse>,
    /// By variant: whether it has keys of its own in the pipeline (then no shared key verifies
    /// it), whether or not they are among `keys` (a signer holds one).
    own_keys: Vec<bool>,
    /// For schemes with a `sender_field`: the senders trusted. Empty trusts none.
    senders: Vec<String>,
}

/// Signatures a structured header may carry at most; more is an attack, not a secret roll.
const SIGNATURES_MAX: usize = 16;

/// Which variants of a scheme a key verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyUse {
    /// Every variant that has no keys of its own.
    Shared,
    /// This variant (by index) alone: a sender that signs one rule with one secret and another
    /// rule with another (Twilio's auth token with SHA-1, a SharedKey with SHA-256) must not
    /// have either secret accepted under the other's rule.
    Variant(usize),
}

impl Verifier {
    /// Decodes every key the way the scheme's sender defines it. `tolerance_secs` overrides
    /// the default tolerance; it has no effect on schemes without a timestamp.
    pub fn new(
        scheme: Scheme,
        secrets: &[SecretBytes],
        tolerance_secs: Option<u32>,
    ) -> Result<Verifier, KeyError> {
        let key_use = vec![KeyUse::Shared; secrets.len()];
        Verifier::with_key_use(scheme, secrets, &key_use, &[], tolerance_secs)
    }

    /// [`Verifier::new`], each secret used as `key_use` says (parallel to `secrets`);
    /// `own_keys` names the variants that have keys of their own in the pipeline, among
    /// `secrets` or not, which no shared key verifies. Some variant must have a key.
    pub fn with_key_use(
        scheme: Scheme,
        secrets: &[SecretBytes],
        key_use: &[KeyUse],
        own_keys: &[usize],
        tolerance_secs: Option<u32>,
    ) -> Result<Verifier, KeyError> {
        if let Some(problem) = scheme.problems().into_iter().next() {
            return Err(KeyError::Scheme(problem));
        }
        if secrets.is_empty() {
            return Err(KeyError::NoSecret);
        }
        if key_use.len() != secrets.len() {
            return Err(KeyError::Scheme(format!(
                "{} secrets, and a use for {} of them",
                secrets.len(),
                key_use.len()
            )));
        }
        let variants = scheme.variants.len();
        let own_keys: Vec<bool> = (0..variants)
            .map(|i| own_keys.contains(&i) || key_use.contains(&KeyUse::Variant(i)))
            .collect();
        if key_use.iter().any(|u| matches!(u, KeyUse::Variant(v) if *v >= variants)) {
            return Err(KeyError::Scheme("a secret of a variant the scheme does not have".into()));
        }
        let usable = |variant: usize| {
            key_use.iter().any(|u| match u {
                KeyUse::Variant(v) => *v == variant,
                KeyUse::Shared => !own_keys[variant],
            })
        };
        if !(0..variants).any(usable) {
            return Err(KeyError::Scheme("no variant has a secret among those given".into()));
        }
        let format = scheme.key_format();
        if scheme.variants.iter().any(|v| v.spec.key_format != format) {
            return Err(KeyError::MixedKeyFormats);
        }
        let keys = secrets
            .iter()
            .enumerate()
            .map(|(index, raw)| keys::decode(format, raw).map_err(|e| e.at(index)))
            .collect::<Result<Vec<_>, _>>()?;
        let tolerance_secs = tolerance_secs.unwrap_or(DEFAULT_TOLERANCE_SECS);
        Ok(Verifier {
            scheme,
            tolerance_secs,
            keys,
            key_use: key_use.to_vec(),
            own_keys,
            senders: Vec::new(),
        })
    }

    /// Whether the key at `index` verifies `variant`: its own keys if it has any, else the
    /// shared ones.
    fn verifies(&self, index: usize, variant: usize) -> bool {
        match self.key_use[index] {
            KeyUse::Variant(v) => v == variant,
            KeyUse::Shared => !self.own_keys.get(variant).copied().unwrap_or(false),
        }
    }

    pub fn scheme(&self) -> &Scheme {
        &self.scheme
    }

    /// The senders this verifier trusts, for schemes whose key many senders share (AWS SNS:
    /// topic ARNs). A scheme with a `sender_field` trusts no one until told.
    pub fn with_senders(mut self, senders: Vec<String>) -> Verifier {
        self.senders = senders;
        self
    }

    /// Verifies one request. Checks run in the order of the official libraries: headers
    /// present and well formed, then the timestamp window, then the signature.
    pub fn verify(&self, request: &Request<'_>, now: Clock) -> Result<Verified, Rejection> {
        let body = LazyJson::new(request.body);
        let Some(index) = self.scheme.variants.iter().position(|v| holds(&v.when, request, &body))
        else {
            return Err(self.unsupported(request, &body));
        };
        let verified = self.verify_spec(index, request, &body, now)?;
        // The key proves the message is the key holder's; whom it came from among those who
        // share the key is a signed member, and must be one the pipeline trusts.
        if let Some(pointer) = &self.scheme.sender_field {
            let sender = body_string(&body, pointer)?;
            if !self.senders.iter().any(|trusted| trusted == sender) {
                return Err(Rejection::UntrustedSender(quote(sender)));
            }
        }
        Ok(verified)
    }

    fn unsupported(&self, request: &Request<'_>, body: &LazyJson<'_>) -> Rejection {
        let reads_body = |c: &Condition| match c {
            Condition::BodyField(..) => true,
            Condition::All(parts) => parts.iter().any(|p| matches!(p, Condition::BodyField(..))),
            _ => false,
        };
        if self.scheme.variants.iter().any(|v| reads_body(&v.when)) && body.get().is_none() {
            return Rejection::MalformedBody(
                if has_repeated_member(body.raw) { "a member is given twice" } else { "not JSON" }
                    .into(),
            );
        }
        // For each variant, the condition that failed and how many of its parts held before
        // it: the variants that got furthest say what the request has that nobody knows.
        let failures: Vec<(usize, &Condition)> = self
            .scheme
            .variants
            .iter()
            .map(|variant| match &variant.when {
                Condition::All(parts) => {
                    let held = parts.iter().take_while(|c| holds(c, request, body)).count();
                    (held, parts.get(held).unwrap_or(&variant.when))
                }
                other => (0, other),
            })
            .collect();
        let furthest = failures.iter().map(|(held, _)| *held).max().unwrap_or(0);
        let mut known: Vec<String> = Vec::new();
        let mut subject = String::from("the request matches none of the scheme's variants");
        for (_, when) in failures.iter().filter(|(held, _)| *held == furthest) {
            let value = match when {
                Condition::HeaderEquals(header, value) => {
                    subject = match request.header(header) {
                        HeaderLookup::Found(raw) => {
                            format!("`{header}: {}`", quote(String::from_utf8_lossy(raw).trim()))
                        }
                        _ => format!("no `{header}` header"),
                    };
                    format!("`{value}`")
                }
                Condition::BodyField(pointer, value) => {
                    subject = match body.get().and_then(|json| json.pointer(pointer)) {
                        Some(serde_json::Value::String(found)) => {
                            format!("`{pointer}` is `{}`", quote(found))
                        }
                        Some(found) => format!("`{pointer}` is {}", quote(&found.to_string())),
                        None => format!("no `{pointer}` in the body"),
                    };
                    format!("`{value}`")
                }
                Condition::HeaderPresent(header) => format!("`{header}`"),
                Condition::QueryParam(_) | Condition::Always | Condition::All(_) => continue,
            };
            if !known.contains(&value) {
                known.push(value);
            }
        }
        Rejection::UnsupportedVersion(format!("{subject}; known: {}", known.join(", ")))
    }

    fn verify_spec(
        &self,
        variant: usize,
        request: &Request<'_>,
        body: &LazyJson<'_>,
        now: Clock,
    ) -> Result<Verified, Rejection> {
        let spec = &self.scheme.variants[variant].spec;
        if spec.require_body && request.body.is_empty() {
            return Err(Rejection::EmptyBody);
        }
        // Where the signatures are, as sent.
        let mut fields = None;
        let (where_, raw_signatures): (String, Vec<&str>) = match &spec.signature {
            SignatureSource::Header(header) => {
                let (text, name) = request.required_text(header)?;
                (name, vec![text])
            }
            SignatureSource::Field { header, fields: format, name: field } => {
                let (text, header_name) = request.required_text(header)?;
                let parsed = parse_fields(text, format.separator, format.assign, &header_name)?;
                let signatures: Vec<&str> =
                    parsed.iter().filter(|(n, _)| n == field).map(|(_, v)| *v).collect();
                if signatures.is_empty() {
                    let others: Vec<String> =
                        parsed.iter().map(|(n, _)| format!("`{}`", quote(n))).take(5).collect();
                    let found = if others.is_empty() {
                        String::new()
                    } else {
                        format!(" (found {})", others.join(", "))
                    };
                    return Err(malformed(&header_name, format!("no `{field}` signature{found}")));
                }
                if signatures.len() > SIGNATURES_MAX {
                    return Err(malformed(&header_name, "too many signatures"));
                }
                if let Some(_empty) = signatures.iter().find(|s| s.is_empty()) {
                    return Err(malformed(&header_name, format!("empty `{field}` signature")));
                }
                fields = Some(parsed);
                (header_name, signatures)
            }
            SignatureSource::BodyField(pointer) => {
                let text = body_string(body, pointer)?;
                (format!("body {pointer}"), vec![text])
            }
        };
        // Decode every candidate; one that cannot be a signature is a malformed header.
        // The timestamp: present and readable before the signatures are decoded.
        let mut timestamp = None;
        if let Some(ts) = &spec.timestamp {
            let (text, ts_where) = match &ts.source {
                TimestampSource::Header(header) => {
                    let (text, name) = request.required_text(header)?;
                    (text, name)
                }
                TimestampSource::Field(name) => {
                    let parsed = fields.as_deref().unwrap_or(&[]);
                    let mut found = parsed.iter().filter(|(n, _)| n == name);
                    let Some((_, value)) = found.next() else {
                        return Err(malformed(&where_, format!("no `{name}` timestamp")));
                    };
                    if found.next().is_some() {
                        return Err(malformed(&where_, format!("`{name}` given more than once")));
                    }
                    if value.is_empty() {
                        return Err(malformed(&where_, format!("empty `{name}` timestamp")));
                    }
                    (*value, where_.clone())
                }
                TimestampSource::BodyField(pointer) => {
                    (body_string(body, pointer)?, format!("body {pointer}"))
                }
            };
            let unix_ms = parse_timestamp(text, ts.format, &ts_where)?;
            timestamp = Some((text, unix_ms, ts.rule));
        }

        // Candidates that cannot be a signature are skipped (Stripe accepts `v1=bad,v1=<good>`);
        // if none can, the header is malformed, and the rejection says why.
        let mut candidates = Vec::with_capacity(raw_signatures.len());
        let mut first_problem = None;
        for raw in &raw_signatures {
            match decode_candidate(spec, &where_, raw) {
                Ok(candidate) => candidates.push(candidate),
                Err(problem) => {
                    first_problem.get_or_insert(problem);
                }
            }
        }
        if let (true, Some(problem)) = (candidates.is_empty(), first_problem) {
            return Err(problem);
        }

        if let Some((_, unix_ms, rule)) = timestamp {
            self.check_window(unix_ms, rule, now)?;
        }

        // The message, in parts; the key's own place is kept as `None`.
        let mut message: Vec<Option<Cow<'_, [u8]>>> = Vec::with_capacity(spec.message.len());
        for part in &spec.message {
            message.push(match part {
                Part::Literal(text) => Some(Cow::Borrowed(text.as_bytes())),
                Part::Timestamp => {
                    Some(Cow::Borrowed(timestamp.map(|(t, _, _)| t).unwrap_or("").as_bytes()))
                }
                Part::Method => Some(Cow::Borrowed(request.method.as_bytes())),
                Part::Url => Some(Cow::Borrowed(request.url.as_bytes())),
                Part::Body => Some(Cow::Borrowed(request.body)),
                Part::FormSorted => Some(Cow::Owned(form_sorted(request.body)?)),
                Part::Header(header) => {
                    Some(Cow::Borrowed(request.required_text(header)?.0.as_bytes()))
                }
                Part::Secret => None,
                Part::BodyFields(names) => Some(Cow::Owned(body_fields(body, names)?)),
            });
        }

        let mut matched = self.match_any(variant, spec.algorithm, &message, &candidates);
        if matched.is_err() && spec.url_port_variants {
            // Twilio's validators accept the URL with its port removed or the scheme's
            // default port added, since proxies on the way may do either.
            for url in port_variants(request.url) {
                for (part, slot) in spec.message.iter().zip(message.iter_mut()) {
                    if *part == Part::Url {
                        *slot = Some(Cow::Owned(url.clone().into_bytes()));
                    }
                }
                matched = self.match_any(variant, spec.algorithm, &message, &candidates);
                if matched.is_ok() {
                    break;
                }
            }
        }
        let index = matched?;

        if let Some(param) = &spec.body_digest_param {
            let claimed = query_param(request.url, param)
                .and_then(|hex_text| hex::decode(hex_text).ok())
                .unwrap_or_default();
            let actual = Sha256::digest(request.body);
            if !bool::from(actual.as_slice().ct_eq(&claimed)) {
                return Err(Rejection::BodyDigestMismatch(param.clone()));
            }
        }
        Ok(Verified {
            secret_index: index,
            timestamp_secs: timestamp.map(|(_, ms, _)| ms.div_euclid(1000)),
        })
    }

    /// Applies the timestamp rule. `signed_ms` is the signed timestamp in Unix ms.
    fn check_window(
        &self,
        signed_ms: i64,
        rule: TimestampRule,
        now: Clock,
    ) -> Result<(), Rejection> {
        let tolerance_ms = i64::from(self.tolerance_secs) * 1000;
        let age_ms = now.unix_ms.saturating_sub(signed_ms);
        let too_old = match rule {
            TimestampRule::InclusiveBothWays | TimestampRule::PastOnly => age_ms > tolerance_ms,
            TimestampRule::StrictPastInclusiveFuture => age_ms >= tolerance_ms,
        };
        if too_old {
            return Err(Rejection::TimestampTooOld {
                age_secs: age_ms / 1000,
                tolerance_secs: self.tolerance_secs,
                strict: rule == TimestampRule::StrictPastInclusiveFuture,
            });
        }
        if rule != TimestampRule::PastOnly && -age_ms > tolerance_ms {
            return Err(Rejection::TimestampTooNew {
                ahead_secs: -age_ms / 1000,
                tolerance_secs: self.tolerance_secs,
            });
        }
        Ok(())
    }

    /// Checks every candidate under each key and returns the first key that matched any.
    /// Every candidate is compared, so the time taken does not depend on which one matched.
    fn match_any(
        &self,
        variant: usize,
        algorithm: Algorithm,
        message: &[Option<Cow<'_, [u8]>>],
        candidates: &[Vec<u8>],
    ) -> Result<usize, Rejection> {
        for (index, key) in self.keys.iter().enumerate() {
            if !self.verifies(index, variant) {
                continue;
            }
            let parts: Vec<&[u8]> =
                message.iter().map(|p| p.as_deref().unwrap_or(key.secret())).collect();
            let matched = match (algorithm, key) {
                (Algorithm::HmacSha1 | Algorithm::HmacSha256 | Algorithm::HmacSha512, _) => {
                    let expected = compute_mac(algorithm, key.secret(), &parts);
                    any_equal(&expected, candidates)
                }
                (Algorithm::DigestSha256, _) => {
                    let mut digest = Sha256::new();
                    parts.iter().for_each(|p| digest.update(p));
                    any_equal(&digest.finalize(), candidates)
                }
                (Algorithm::SharedSecret, _) => {
                    // Compare digests, so the comparison does not end early on a length.
                    let expected = Sha256::digest(key.secret());
                    let hashed: Vec<Vec<u8>> =
                        candidates.iter().map(|c| Sha256::digest(c).to_vec()).collect();
                    any_equal(&expected, &hashed)
                }
                (Algorithm::EcdsaP256Sha256, Key::Ecdsa(public)) => {
                    use p256::ecdsa::signature::Verifier as _;
                    let signed = parts.concat();
                    candidates.iter().any(|candidate| {
                        let signature = p256::ecdsa::Signature::from_der(candidate)
                            .or_else(|_| p256::ecdsa::Signature::from_slice(candidate));
                        signature.is_ok_and(|s| public.verify(&signed, &s).is_ok())
                    })
                }
                (Algorithm::RsaSha1 | Algorithm::RsaSha256, Key::Rsa(public)) => {
                    let signed = parts.concat();
                    candidates
                        .iter()
                        .any(|candidate| rsa_verifies(algorithm, public, &signed, candidate))
                }
                _ => false,
            };
            if matched {
                return Ok(index);
            }
        }
        Err(Rejection::NoMatch)
    }
}

fn rsa_verifies(
    algorithm: Algorithm,
    key: &rsa::RsaPublicKey,
    signed: &[u8],
    candidate: &[u8],
) -> bool {
    use rsa::signature::Verifier as _;
    let Ok(signature) = rsa::pkcs1v15::Signature::try_from(candidate) else { return false };
    match algorithm {
        Algorithm::RsaSha1 => rsa::pkcs1v15::VerifyingKey::<sha1::Sha1>::new(key.clone())
            .verify(signed, &signature)
            .is_ok(),
        _ => rsa::pkcs1v15::VerifyingKey::<Sha256>::new(key.clone())
            .verify(signed, &signature)
            .is_ok(),
    }
}

fn any_equal(expected: &[u8], candidates: &[Vec<u8>]) -> bool {
    let mut matched = subtle::Choice::from(0);
    for candidate in candidates {
        matched |= expected.ct_eq(candidate);
    }
    bool::from(matched)
}

fn decode_candidate(spec: &Spec, where_: &str, raw: &str) -> Result<Vec<u8>, Rejection> {
    let Some(encoded) = raw.strip_prefix(spec.prefix.as_str()) else {
        return Err(malformed(where_, format!("does not start with `{}`", spec.prefix)));
    };
    let Some(decoded) = spec.encoding.decode(encoded) else {
        return Err(malformed(where_, format!("signature is not {}", spec.encoding.name())));
    };
    if let Some(len) = spec.algorithm.output_len()
        && spec.encoding != Encoding::Text
        && decoded.len() != len
    {
        return Err(malformed(
            where_,
            format!("signature is {} bytes; {} gives {len}", decoded.len(), spec.algorithm.name()),
        ));
    }
    Ok(decoded)
}

/// Splits `t=1,v1=ab,v1=cd` into its fields. Empty items (a trailing separator) are skipped;
/// an item without the assignment character is malformed.
fn parse_fields<'t>(
    text: &'t str,
    separator: char,
    assign: char,
    header: &str,
) -> Result<Vec<(&'t str, &'t str)>, Rejection> {
    let mut fields = Vec::new();
    // In a space-separated list, a comma after an item is punctuation: Supabase's auth hooks
    // join several Standard Webhooks signatures with ", ".
    let items = text.split(separator).map(|item| {
        let item = item.trim();
        if separator == ' ' { item.trim_end_matches(',') } else { item }
    });
    for item in items.filter(|i| !i.is_empty()) {
        let Some((name, value)) = item.split_once(assign) else {
            return Err(malformed(
                header,
                format!("`{}` is not a `name{assign}value` field", quote(item)),
            ));
        };
        fields.push((name.trim(), value.trim()));
    }
    Ok(fields)
}

fn parse_timestamp(text: &str, format: TimestampFormat, where_: &str) -> Result<i64, Rejection> {
    let whole = || -> Result<i64, Rejection> {
        // Digits only: a sign, a fraction or an exponent is not a timestamp senders produce.
        if text.is_empty() || text.len() > 16 || !text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(malformed(
                where_,
                format!("timestamp `{}` is not a whole number", quote(text)),
            ));
        }
        text.parse().map_err(|_| malformed(where_, "timestamp is not a whole number"))
    };
    match format {
        TimestampFormat::UnixSeconds => Ok(whole()?.saturating_mul(1000)),
        TimestampFormat::UnixMillis => whole(),
        TimestampFormat::Rfc3339 => {
            let parsed =
                time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
                    .map_err(|_| {
                    malformed(where_, format!("timestamp `{}` is not RFC 3339", quote(text)))
                })?;
            Ok(i64::try_from(parsed.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX))
        }
    }
}

/// `url` with its port removed, and with the scheme's default port added where it has none;
/// the variants that differ from `url`.
fn port_variants(url: &str) -> Vec<String> {
    let Some((scheme, rest)) = url.split_once("://") else { return Vec::new() };
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "https" => "443",
        "http" => "80",
        _ => return Vec::new(),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    // `user:password@` is kept as it is: its colon is no port's (Twilio signs such URLs too).
    let (userinfo, host_port) = match authority.rfind('@') {
        Some(at) => authority.split_at(at + 1),
        None => ("", authority),
    };
    // A bracketed IPv6 host keeps its colons; only a `:port` after it is a port.
    let host_end = if host_port.starts_with('[') {
        host_port.find(']').map(|i| i + 1).unwrap_or(host_port.len())
    } else {
        host_port.find(':').unwrap_or(host_port.len())
    };
    let (host, port) = host_port.split_at(host_end);
    let mut variants = Vec::new();
    if port.is_empty() {
        variants.push(format!("{scheme}://{userinfo}{host}:{default_port}{tail}"));
    } else {
        variants.push(format!("{scheme}://{userinfo}{host}{tail}"));
    }
    variants
}

/// Twilio's form rule: parameters sorted by name, then value; each name then value, decoded.
///
/// A pair sent twice is refused: twilio-python signs it once (`sorted(set(values))`), so a
/// repeat is not covered by the signature, yet a reader would see a list where the sender sent
/// a value.
pub(crate) fn form_sorted(body: &[u8]) -> Result<Vec<u8>, Rejection> {
    let mut pairs: Vec<(String, String)> =
        form_urlencoded::parse(body).map(|(n, v)| (n.into_owned(), v.into_owned())).collect();
    pairs.sort();
    if let Some(pair) = pairs.windows(2).find(|w| w[0] == w[1]) {
        return Err(Rejection::MalformedBody(format!(
            "parameter `{}` repeated with the same value",
            quote(&pair[0].0)
        )));
    }
    let mut out = Vec::with_capacity(body.len());
    for (name, value) in pairs {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(value.as_bytes());
    }
    Ok(out)
}

fn query_param(url: &str, name: &str) -> Option<String> {
    let query = url.split_once('?')?.1;
    let query = query.split('#').next().unwrap_or(query);
    form_urlencoded::parse(query.as_bytes()).find(|(n, _)| n == name).map(|(_, v)| v.into_owned())
}

fn holds(condition: &Condition, request: &Request<'_>, body: &LazyJson<'_>) -> bool {
    match condition {
        Condition::Always => true,
        Condition::HeaderPresent(header) => request.header(header) != HeaderLookup::Missing,
        Condition::HeaderEquals(header, value) => match request.header(header) {
            HeaderLookup::Found(raw) => raw.trim_ascii() == value.as_bytes(),
            _ => false,
        },
        Condition::QueryParam(name) => query_param(request.url, name).is_some(),
        Condition::All(conditions) => conditions.iter().all(|c| holds(c, request, body)),
        Condition::BodyField(pointer, value) => body
            .get()
            .and_then(|json| json.pointer(pointer))
            .and_then(|found| found.as_str())
            .is_some_and(|found| found == value),
    }
}

/// The body parsed as JSON at most once, and only by schemes that sign JSON members.
struct LazyJson<'b> {
    raw: &'b [u8],
    parsed: std::cell::OnceCell<Option<serde_json::Value>>,
}

impl<'b> LazyJson<'b> {
    fn new(raw: &'b [u8]) -> LazyJson<'b> {
        LazyJson { raw, parsed: std::cell::OnceCell::new() }
    }

    /// The parsed body; `None` if it is not JSON, or is an object with a member given twice
    /// (which of two values a reader takes is the reader's choice, so neither is trusted).
    fn get(&self) -> Option<&serde_json::Value> {
        self.parsed
            .get_or_init(|| {
                let value: serde_json::Value = serde_json::from_slice(self.raw).ok()?;
                if value.is_object() && has_repeated_member(self.raw) {
                    return None;
                }
                Some(value)
            })
            .as_ref()
    }
}

/// Whether the top-level JSON object in `raw` names a member twice.
fn has_repeated_member(raw: &[u8]) -> bool {
    use serde::de::{Deserializer as _, IgnoredAny, MapAccess, Visitor};
    struct Members;
    impl<'de> Visitor<'de> for Members {
        type Value = bool;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
            let mut seen = std::collections::HashSet::new();
            let mut repeated = false;
            while let Some(name) = map.next_key::<String>()? {
                map.next_value::<IgnoredAny>()?;
                repeated |= !seen.insert(name);
            }
            Ok(repeated)
        }
    }
    let mut deserializer = serde_json::Deserializer::from_slice(raw);
    deserializer.deserialize_map(Members).unwrap_or(false)
}

fn body_string<'j>(body: &'j LazyJson<'_>, pointer: &str) -> Result<&'j str, Rejection> {
    let json = body.get().ok_or_else(|| Rejection::MalformedBody("not JSON".into()))?;
    match json.pointer(pointer) {
        Some(serde_json::Value::String(text)) if !text.is_empty() => Ok(text.as_str()),
        Some(_) => Err(Rejection::MalformedBody(format!("`{pointer}` is not a non-empty string"))),
        None => Err(Rejection::MalformedBody(format!("no `{pointer}`"))),
    }
}

/// SNS's canonical message: for each listed member, name, newline, value, newline. Every member
/// is required unless its name ends in `?`; each must be a string; only the first may contain a
/// line break. With the set fixed and line breaks confined to the first member, the boundaries
/// between members cannot be moved: a value cannot absorb a neighbour or stand in for one.
fn body_fields(body: &LazyJson<'_>, names: &[String]) -> Result<Vec<u8>, Rejection> {
    let json = body.get().ok_or_else(|| Rejection::MalformedBody("not JSON".into()))?;
    let Some(object) = json.as_object() else {
        return Err(Rejection::MalformedBody("not a JSON object".into()));
    };
    let mut out = Vec::new();
    for (i, listed) in names.iter().enumerate() {
        let (name, optional) = match listed.strip_suffix('?') {
            Some(name) => (name, true),
            None => (listed.as_str(), false),
        };
        match object.get(name) {
            None if optional => {}
            None => return Err(Rejection::MalformedBody(format!("no `{name}`"))),
            Some(serde_json::Value::String(value)) => {
                if i > 0 && value.contains(['\n', '\r']) {
                    return Err(Rejection::MalformedBody(format!("`{name}` spans lines")));
                }
                out.extend_from_slice(name.as_bytes());
                out.push(b'\n');
                out.extend_from_slice(value.as_bytes());
                out.push(b'\n');
            }
            Some(_) => {
                return Err(Rejection::MalformedBody(format!("`{name}` is not a string")));
            }
        }
    }
    Ok(out)
}

/// What a signer needs besides the body: the parts some schemes sign.
#[derive(Debug, Clone, Copy)]
pub struct SignInput<'a> {
    pub method: &'a str,
    pub url: &'a str,
    pub body: &'a [u8],
    /// Unix seconds, for timestamped schemes.
    pub timestamp_secs: i64,
    /// The message id, for schemes that sign a header of it (Standard Webhooks).
    pub message_id: &'a str,
}

/// Why a request cannot be signed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignError {
    #[error("`{0}` is verified with a public key; signing needs the sender's private key")]
    PublicKey(String),
    #[error("`{0}` signs with a shared secret; a private key has no use here")]
    SharedKey(String),
    #[error("the private key does not fit `{0}`'s algorithm")]
    WrongPrivateKey(String),
    #[error("`{0}` signs parts of the body, which is not JSON with the members it signs")]
    Body(String),
}

/// What a signer adds to a request: headers, and for senders that carry their signature in
/// the body (AWS SNS), the member to set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    pub headers: Vec<(String, String)>,
    /// A JSON pointer into the body and the value to put there.
    pub body_field: Option<(String, String)>,
}

impl Verifier {
    /// The headers a sender of this scheme would send with `input.body`, signed with the first
    /// configured key: for writing fixtures and for tests. Verifying them at
    /// `input.timestamp_secs` succeeds. Shared-key schemes only; see [`Verifier::sign_with`].
    pub fn sign(&self, input: &SignInput<'_>) -> Result<Vec<(String, String)>, SignError> {
        let signature = self.sign_with(input, None)?;
        match signature.body_field {
            None => Ok(signature.headers),
            Some(_) => Err(SignError::PublicKey(self.scheme.name.clone())),
        }
    }

    /// Signs as the sender would: with the first configured key for shared-key schemes, with
    /// `private_key` for public-key schemes (SendGrid, AWS SNS), whose configured keys are
    /// only the public halves.
    /// The URL a sender calls with this body: `url`, with the body's SHA-256 (hex) added as
    /// the query parameter a scheme with `body_digest_param` signs (Twilio's JSON webhooks'
    /// `bodySHA256`), unless the URL has it already.
    pub fn url_for_body(&self, url: &str, body: &[u8]) -> String {
        let param = self.scheme.variants.iter().find_map(|v| v.spec.body_digest_param.as_ref());
        match param {
            Some(param) if query_param(url, param).is_none() => {
                let digest = hex::encode(Sha256::digest(body));
                let joiner = if url.contains('?') { '&' } else { '?' };
                format!("{url}{joiner}{param}={digest}")
            }
            _ => url.to_owned(),
        }
    }

    pub fn sign_with(
        &self,
        input: &SignInput<'_>,
        private_key: Option<&PrivateKey>,
    ) -> Result<Signature, SignError> {
        let name = || self.scheme.name.clone();
        let body = LazyJson::new(input.body);
        let probe =
            Request { method: input.method, url: input.url, headers: &[], body: input.body };
        // The first variant whose condition the request can meet and that the first key
        // signs: headers are what the signer adds; the rest depends on the request.
        let first_key_signs = |index: usize| self.verifies(0, index);
        let index = self
            .scheme
            .variants
            .iter()
            .enumerate()
            .position(|(index, v)| {
                first_key_signs(index)
                    && match &v.when {
                        // A header the signer writes (HubSpot's v3 signature header), or one
                        // it sets to the value the condition names.
                        Condition::HeaderPresent(header) => {
                            v.spec.signature.header().is_some_and(|h| {
                                h.names.iter().any(|n| n.eq_ignore_ascii_case(header))
                            })
                        }
                        Condition::HeaderEquals(..) => true,
                        other => holds(other, &probe, &body),
                    }
            })
            .unwrap_or(0);
        let variant = &self.scheme.variants[index];
        let spec = &variant.spec;
        match (spec.algorithm.is_public_key(), private_key) {
            (true, None) => return Err(SignError::PublicKey(name())),
            (false, Some(_)) => return Err(SignError::SharedKey(name())),
            _ => {}
        }
        let mut headers = Vec::new();
        if let Condition::HeaderEquals(header, value) = &variant.when {
            headers.push((header.clone(), value.clone()));
        }
        let ts = spec.timestamp.as_ref().map(|t| match t.format {
            TimestampFormat::UnixSeconds => input.timestamp_secs.to_string(),
            TimestampFormat::UnixMillis => input.timestamp_secs.saturating_mul(1000).to_string(),
            TimestampFormat::Rfc3339 => {
                time::OffsetDateTime::from_unix_timestamp(input.timestamp_secs)
                    .ok()
                    .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
                    .unwrap_or_default()
            }
        });
        if let Some(timestamp) = &spec.timestamp {
            match &timestamp.source {
                TimestampSource::Header(header) => {
                    headers.push((header.display().to_owned(), ts.clone().unwrap_or_default()))
                }
                TimestampSource::Field(_) => {}
                // The signer cannot choose a timestamp inside a body it was given.
                TimestampSource::BodyField(_) => return Err(SignError::Body(name())),
            }
        }
        let key = self.keys[0].secret();
        let mut message: Vec<Vec<u8>> = Vec::new();
        for part in &spec.message {
            message.push(match part {
                Part::Literal(text) => text.as_bytes().to_vec(),
                Part::Timestamp => ts.clone().unwrap_or_default().into_bytes(),
                Part::Method => input.method.as_bytes().to_vec(),
                Part::Url => input.url.as_bytes().to_vec(),
                Part::Body => input.body.to_vec(),
                Part::FormSorted => form_sorted(input.body).map_err(|_| SignError::Body(name()))?,
                Part::Header(header) => {
                    headers.push((header.display().to_owned(), input.message_id.to_owned()));
                    input.message_id.as_bytes().to_vec()
                }
                Part::Secret => key.to_vec(),
                Part::BodyFields(names) => {
                    body_fields(&body, names).map_err(|_| SignError::Body(name()))?
                }
            });
        }
        let parts: Vec<&[u8]> = message.iter().map(Vec::as_slice).collect();
        let signature = match (spec.algorithm, private_key) {
            (Algorithm::DigestSha256, _) => {
                let mut digest = Sha256::new();
                parts.iter().for_each(|p| digest.update(p));
                digest.finalize().to_vec()
            }
            (Algorithm::SharedSecret, _) => key.to_vec(),
            (algorithm, Some(private_key)) => private_key
                .sign(algorithm, &parts.concat())
                .ok_or_else(|| SignError::WrongPrivateKey(name()))?,
            (algorithm, None) => compute_mac(algorithm, key, &parts),
        };
        let encoded = format!("{}{}", spec.prefix, spec.encoding.encode(&signature));
        let mut body_field = None;
        match &spec.signature {
            SignatureSource::Header(header) => headers.push((header.display().to_owned(), encoded)),
            SignatureSource::Field { header, fields, name: field } => {
                let assign = fields.assign;
                let mut value = String::new();
                if let (Some(t), Some(TimestampSource::Field(ts_name))) =
                    (&ts, spec.timestamp.as_ref().map(|t| &t.source))
                {
                    value.push_str(&format!("{ts_name}{assign}{t}{}", fields.separator));
                }
                value.push_str(&format!("{field}{assign}{encoded}"));
                headers.push((header.display().to_owned(), value));
            }
            SignatureSource::BodyField(pointer) => body_field = Some((pointer.clone(), encoded)),
        }
        Ok(Signature { headers, body_field })
    }
}

impl Scheme {
    /// Whether one configured key can be used by this scheme: for `check`, which reports a
    /// secret it could read but not use at the secret's own line.
    pub fn check_key(&self, raw: &SecretBytes) -> Result<(), KeyError> {
        keys::decode(self.key_format(), raw).map(|_| ())
    }

    /// What makes a scheme unusable, in words for a configuration error.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = self.scheme_problems();
        for variant in &self.variants {
            problems.extend(spec_problems(&variant.spec));
        }
        problems
    }

    /// What makes the scheme as a whole unusable, beyond each rule's own problems.
    pub fn scheme_problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.variants.is_empty() {
            problems.push("the scheme has no variant".to_owned());
        }
        // A key fetched from a URL the delivery names is one anyone with an account can get
        // (AWS signs every customer's topics with it): the sender must be named and checked.
        if self.key_url_field.is_some() && self.sender_field.is_none() {
            problems.push(
                "a key fetched from the delivery's URL is shared by every sender; name the signed sender member with `sender_field` and list `senders`".to_owned(),
            );
        }
        for variant in &self.variants {
            let spec = &variant.spec;
            let has = |p: &dyn Fn(&Part) -> bool| spec.message.iter().any(p);
            // The sender is trusted only if it is signed: every rule must sign the member.
            if let Some(pointer) = &self.sender_field {
                let member = pointer.strip_prefix('/').unwrap_or(pointer);
                let signed = has(&|p| match p {
                    Part::Body => true,
                    Part::BodyFields(names) => names.iter().any(|n| n == member),
                    _ => false,
                });
                if !signed || member.contains('/') {
                    problems.push(format!(
                        "the sender member `{pointer}` must be a top-level member every rule signs (in `body_fields`, not optional)"
                    ));
                }
            }
            if self.key_url_field.is_some() && !spec.algorithm.is_public_key() {
                problems.push(format!(
                    "{} keys are secrets; only a public key or certificate may be fetched from a URL the delivery names",
                    spec.algorithm.name()
                ));
            }
        }
        problems.sort();
        problems.dedup();
        problems
    }
}

/// What makes one rule unusable.
pub fn spec_problems(spec: &Spec) -> Vec<String> {
    let mut problems = Vec::new();
    let has = |p: &dyn Fn(&Part) -> bool| spec.message.iter().any(p);
    if has(&|p| matches!(p, Part::Timestamp)) && spec.timestamp.is_none() {
        problems.push("the message signs `timestamp` but no timestamp is declared".into());
    }
    if let Some(ts) = &spec.timestamp
        && matches!(ts.source, TimestampSource::Field(_))
        && !matches!(spec.signature, SignatureSource::Field { .. })
    {
        problems.push("a timestamp `field` needs a signature header with `fields`".into());
    }
    let secret_in_message = has(&|p| matches!(p, Part::Secret));
    match spec.algorithm {
        Algorithm::DigestSha256 if !secret_in_message => problems
            .push("a plain SHA-256 digest must sign `secret` somewhere in its message".into()),
        Algorithm::SharedSecret if !spec.message.is_empty() => {
            problems.push("a shared secret signs no message; remove `message`".into())
        }
        Algorithm::DigestSha256 | Algorithm::SharedSecret => {}
        _ if secret_in_message => problems.push(format!(
            "{} keeps its key out of the message; remove `secret`",
            spec.algorithm.name()
        )),
        _ => {}
    }
    if spec.message.is_empty() && spec.algorithm != Algorithm::SharedSecret {
        problems.push("the message is empty".into());
    }
    // A signature that covers no body lets any body through with it.
    let covers_body = has(&|p| matches!(p, Part::Body | Part::FormSorted | Part::BodyFields(_)))
        || (spec.body_digest_param.is_some() && has(&|p| *p == Part::Url));
    if !covers_body && spec.algorithm != Algorithm::SharedSecret {
        problems.push(
            "the message signs nothing of the body (`body`, `form_sorted`, `body_fields`, or `url` with `body_digest_param`), so any body would pass".into(),
        );
    }
    if spec.body_digest_param.is_some() && !has(&|p| *p == Part::Url) {
        problems.push(
            "`body_digest_param` names a query parameter of the URL, which the message must sign"
                .into(),
        );
    }
    if spec.encoding == Encoding::Text && spec.algorithm != Algorithm::SharedSecret {
        problems.push("`text` encoding is for a shared secret sent as is".into());
    }
    if matches!(spec.signature, SignatureSource::BodyField(_)) && has(&|p| *p == Part::Body) {
        problems.push(
            "a signature inside the body cannot sign the whole body; sign `body_fields`".into(),
        );
    }
    problems
}

#[cfg(test)]
mod port_tests {
    use super::port_variants;

    #[test]
    fn port_variants_remove_a_port_or_add_the_default() {
        assert_eq!(port_variants("https://a.example/x?p=1:2"), ["https://a.example:443/x?p=1:2"]);
        assert_eq!(port_variants("http://a.example"), ["http://a.example:80"]);
        assert_eq!(port_variants("https://a.example:8443/x"), ["https://a.example/x"]);
        assert_eq!(port_variants("https://[::1]:8443/x"), ["https://[::1]/x"]);
        assert_eq!(port_variants("https://[::1]/x"), ["https://[::1]:443/x"]);
        // Credentials in the URL (as Twilio's own tests have them) stay; only the port moves.
        assert_eq!(
            port_variants("https://user:pass@mycompany.com:443/x"),
            ["https://user:pass@mycompany.com/x"]
        );
        assert_eq!(
            port_variants("https://user:pass@mycompany.com/x"),
            ["https://user:pass@mycompany.com:443/x"]
        );
        assert_eq!(port_variants("https://user@[::1]/x"), ["https://user@[::1]:443/x"]);
        assert!(port_variants("ftp://a.example/x").is_empty());
        assert!(port_variants("not a url").is_empty());
    }
}
