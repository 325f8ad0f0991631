//! Deriving an event's identity from a verified delivery, and rendering its CRM writes.
//! Pure: the same delivery always gives the same result.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::time::Duration;

use minijinja::Value as TemplateValue;
use minijinja::value::Serde;
use serde::Serialize;
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::body::BodyReading;
use crate::check::{CompiledPipeline, CompiledSource, CompiledTarget};
use crate::model::{Fingerprint, Operation, VersionType};
use crate::template::RENDERED_BYTES_MAX;

/// Event keys become part of a unique database index.
pub const KEY_BYTES_MAX: usize = 512;
/// Scopes, types and entities are short identifiers too.
pub const LABEL_BYTES_MAX: usize = 256;
/// Versions are short: a timestamp is at most 35 characters.
pub const VERSION_BYTES_MAX: usize = 128;
/// How much of a sender's text an error message shows.
pub const SHOWN_CHARS_MAX: usize = 64;

/// Sender text made safe to show in logs, answers and the CLI: control characters and
/// bidirectional overrides escaped (`\u{1b}`, `\n`), cut to `chars_max` characters with `…`.
pub fn printable(text: &str, chars_max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(chars_max * 4));
    for (i, c) in text.chars().enumerate() {
        if i == chars_max {
            out.push('…');
            break;
        }
        if c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}') {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// A delivery as received; the signature has been verified already.
#[derive(Debug, Clone, Copy)]
pub struct Delivery<'a> {
    pub headers: &'a [(String, Vec<u8>)],
    pub body: &'a [u8],
}

/// What makes an event this event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Identity {
    pub key: String,
    pub scope: String,
    pub event_type: Option<String>,
    /// Hex SHA-256 of the parts that decide "same content".
    pub fingerprint: String,
    pub ordering: Option<OrderingValue>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OrderingValue {
    pub entity: String,
    pub version: Version,
}

/// An ordering version, comparable within its type.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Version {
    Integer(i64),
    Timestamp(OffsetDateTime),
    Text(String),
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Version::Integer(n) => write!(f, "{n}"),
            Version::Timestamp(t) => {
                let text = t.format(&Rfc3339).map_err(|_| fmt::Error)?;
                f.write_str(&text)
            }
            Version::Text(s) => f.write_str(s),
        }
    }
}

impl Version {
    /// A text whose byte order is the version order within one version type, for storage
    /// and comparison in SQL.
    pub fn sort_key(&self) -> String {
        match self {
            // Flipping the sign bit maps i64 order onto u64 order; 20 digits hold any u64.
            Version::Integer(n) => format!("{:020}", (*n as u64) ^ (1 << 63)),
            // Fixed width, UTC, nanoseconds: RFC 3339 years are 0000-9999, so text order is
            // time order.
            Version::Timestamp(t) => format!(
                "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:09}Z",
                t.year(),
                u8::from(t.month()),
                t.day(),
                t.hour(),
                t.minute(),
                t.second(),
                t.nanosecond()
            ),
            Version::Text(s) => s.clone(),
        }
    }
}

impl Serialize for Version {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// One CRM write, fully rendered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Upsert {
    pub target: String,
    pub connector: String,
    pub object: String,
    pub operation: Operation,
    pub external_id_field: String,
    pub external_id_value: String,
    pub fields: BTreeMap<String, String>,
    /// The URL the target's refresh fetches before the write.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refresh_url: Option<String>,
}

impl Serialize for Operation {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// Why a verified delivery cannot become an event. The sender gets this text in a 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EvalError {
    #[error("{what}: the body is not valid JSON ({reason})")]
    NotJson { what: String, reason: String },
    #[error("{what}: header `{header}` is missing")]
    MissingHeader { what: String, header: String },
    #[error("{what}: JSON pointer `{pointer}` matches nothing in the payload")]
    MissingPointer { what: String, pointer: String },
    #[error("{what}: JSON pointer `{pointer}` is {found}, not a string or a number")]
    NotScalar { what: String, pointer: String, found: &'static str },
    #[error("{what}: {reason}")]
    Template { what: String, reason: String },
    #[error("{what} is empty")]
    Empty { what: String },
    #[error("{what} is {bytes} bytes, more than the {max}")]
    TooLong { what: String, bytes: usize, max: usize },
    #[error("ordering version `{text}` is not {expected}")]
    BadVersion { text: String, expected: &'static str },
    #[error("{what} contains a control character (at character {at})")]
    ControlCharacter { what: String, at: usize },
    #[error("{what}: header `{header}` is sent more than once")]
    RepeatedHeader { what: String, header: String },
    #[error("ordering version `{text}` is more than {max_future:?} ahead of its receipt")]
    TooFarAhead { text: String, max_future: Duration },
    #[error("{what}: `{url}` is not under `{origin}`")]
    RefreshUrl { what: String, url: String, origin: String },
    #[error(
        "target `{target}` refreshes its source: give the fetched object under `sources: {{ {target}: ... }}`"
    )]
    NoSource { target: String },
}

/// The template context of one delivery, built once.
#[derive(Clone)]
pub struct Context {
    payload: Result<serde_json::Value, String>,
    headers: BTreeMap<String, String>,
    /// Header names sent more than once: not a key source, since which one is meant is a
    /// sender's choice to make, not ours.
    repeated_headers: BTreeSet<String>,
    body: Option<String>,
    event: Option<TemplateValue>,
    /// The object a target's refresh fetched, for that target's fields.
    source: Option<serde_json::Value>,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context").field("headers", &self.headers.keys()).finish_non_exhaustive()
    }
}

impl Context {
    pub fn new(delivery: &Delivery<'_>, body_reading: BodyReading) -> Context {
        let mut headers = BTreeMap::new();
        let mut repeated_headers = BTreeSet::new();
        for (name, value) in delivery.headers {
            let name = name.to_ascii_lowercase();
            let value = String::from_utf8_lossy(value).into_owned();
            if let Some(previous) = headers.insert(name.clone(), value)
                && previous != headers[&name]
            {
                repeated_headers.insert(name);
            }
        }
        let body = std::str::from_utf8(delivery.body).ok().map(str::to_owned);
        let payload = body_reading.format(headers.get("content-type")).read(delivery.body);
        Context { payload, headers, repeated_headers, body, event: None, source: None }
    }

    fn value(&self) -> TemplateValue {
        let payload = match &self.payload {
            Ok(json) => TemplateValue::from(Serde(json)),
            Err(_) => TemplateValue::UNDEFINED,
        };
        let mut map = BTreeMap::new();
        map.insert("payload", payload);
        map.insert("headers", TemplateValue::from(Serde(&self.headers)));
        map.insert(
            "body",
            self.body.as_deref().map(TemplateValue::from).unwrap_or(TemplateValue::UNDEFINED),
        );
        if let Some(event) = &self.event {
            map.insert("event", event.clone());
        }
        if let Some(source) = &self.source {
            map.insert("source", TemplateValue::from(Serde(source)));
        }
        TemplateValue::from(Serde(&map))
    }

    /// Sets the object a refresh fetched, for rendering the target that fetched it.
    pub fn set_source(&mut self, source: Option<serde_json::Value>) {
        self.source = source;
    }

    /// The payload, if the body parsed.
    pub fn payload_value(&self) -> Option<&serde_json::Value> {
        self.payload.as_ref().ok()
    }

    fn payload(&self, what: &str) -> Result<&serde_json::Value, EvalError> {
        self.payload
            .as_ref()
            .map_err(|reason| EvalError::NotJson { what: what.to_owned(), reason: reason.clone() })
    }
}

impl CompiledPipeline {
    /// Derives key, scope, type, fingerprint and ordering from a verified delivery, and
    /// returns the context the targets are rendered in.
    pub fn identify(&self, delivery: &Delivery<'_>) -> Result<(Identity, Context), EvalError> {
        let mut ctx = Context::new(delivery, self.body_reading);
        let key = self.source("key", &self.key, &ctx, delivery)?;
        check_label("key", &key, KEY_BYTES_MAX)?;
        let scope = match &self.scope {
            Some(template) => self.render("scope", template, &ctx)?,
            None => String::new(),
        };
        check_label("scope", &scope, LABEL_BYTES_MAX)?;
        let event_type = match &self.event_type {
            Some(source) => {
                let value = self.source("event_type", source, &ctx, delivery)?;
                check_label("event_type", &value, LABEL_BYTES_MAX)?;
                Some(value)
            }
            None => None,
        };
        let fingerprint = match &self.fingerprint {
            Fingerprint::RawBody => body_sha256(delivery.body),
            Fingerprint::Include(pointers) => {
                let payload = ctx.payload("fingerprint")?;
                let parts: Vec<&serde_json::Value> = pointers
                    .iter()
                    .map(|p| payload.pointer(p).unwrap_or(&serde_json::Value::Null))
                    .collect();
                canonical_hash(&parts)
            }
            Fingerprint::Exclude(pointers) => {
                let mut payload = ctx.payload("fingerprint")?.clone();
                for pointer in pointers {
                    remove_pointer(&mut payload, pointer);
                }
                canonical_hash(&payload)
            }
        };
        let mut event = BTreeMap::new();
        event.insert("key", TemplateValue::from(key.clone()));
        event.insert("scope", TemplateValue::from(scope.clone()));
        event.insert(
            "type",
            event_type.clone().map(TemplateValue::from).unwrap_or(TemplateValue::from(())),
        );
        ctx.event = Some(TemplateValue::from(Serde(&event)));

        let ordering = match &self.ordering {
            Some(ordering) => {
                let entity = self.render("ordering.entity", &ordering.entity, &ctx)?;
                check_entity("ordering.entity", &entity)?;
                let text = self.render("ordering.version", &ordering.version, &ctx)?;
                check_label("ordering.version", &text, VERSION_BYTES_MAX)?;
                let version = parse_version(text.trim(), ordering.version_type)?;
                Some(OrderingValue { entity, version })
            }
            None => None,
        };
        Ok((Identity { key, scope, event_type, fingerprint, ordering }, ctx))
    }

    /// The indexes of the targets whose `when` holds for this event.
    pub fn due_targets(&self, ctx: &Context) -> Result<Vec<usize>, EvalError> {
        let mut due = Vec::new();
        for (i, target) in self.targets.iter().enumerate() {
            let holds = match &target.when {
                Some(template) => {
                    self.render(&format!("targets[{i}].when"), template, ctx)? == "true"
                }
                None => true,
            };
            if holds {
                due.push(i);
            }
        }
        Ok(due)
    }

    /// Renders only target `index`'s external id value: the entity its writes are ordered by
    /// when the pipeline declares no ordering.
    pub fn render_external_id(&self, index: usize, ctx: &Context) -> Result<String, EvalError> {
        let template = &self.targets[index].external_id_value;
        let value = self.render(template, template, ctx)?;
        check_entity(template, &value)?;
        Ok(value)
    }

    /// Refuses a timestamp version further ahead of the receipt time `now_ms` than the
    /// pipeline allows: it would make every later update of its entity stale.
    pub fn check_future(&self, identity: &Identity, now_ms: i64) -> Result<(), EvalError> {
        let (Some(ordering), Some(value)) = (&self.ordering, &identity.ordering) else {
            return Ok(());
        };
        let Version::Timestamp(at) = &value.version else { return Ok(()) };
        let ahead_ms = i128::from(at.unix_timestamp()) * 1000 - i128::from(now_ms);
        if ahead_ms > i128::try_from(ordering.max_future.as_millis()).unwrap_or(i128::MAX) {
            return Err(EvalError::TooFarAhead {
                text: printable(&value.version.to_string(), SHOWN_CHARS_MAX),
                max_future: ordering.max_future,
            });
        }
        Ok(())
    }

    /// Renders target `index` into a CRM write.
    /// A target's external id as the write uses it: rendered and not blank (no label bound,
    /// since it is not a key of ours but the CRM's value). Intake renders it for every due
    /// target, so that a delivery whose record cannot be named is refused, not accepted and
    /// dead-lettered.
    pub fn render_record_id(&self, index: usize, ctx: &Context) -> Result<String, EvalError> {
        let template = &self.targets[index].external_id_value;
        let value = self.render(template, template, ctx)?;
        if value.trim().is_empty() {
            return Err(EvalError::Empty { what: template.clone() });
        }
        Ok(value)
    }

    pub fn render_target(&self, index: usize, ctx: &Context) -> Result<Upsert, EvalError> {
        let target: &CompiledTarget = &self.targets[index];
        let external_id_value = self.render_record_id(index, ctx)?;
        let mut fields = BTreeMap::new();
        for (field, template) in &target.fields {
            fields.insert(field.clone(), self.render(template, template, ctx)?);
        }
        Ok(Upsert {
            target: target.name.clone(),
            connector: target.connector.clone(),
            object: target.object.clone(),
            operation: target.operation,
            external_id_field: target.external_id_field.clone(),
            external_id_value,
            fields,
            refresh_url: None,
        })
    }

    /// Everything at once: identity and the rendered writes of the due targets, each
    /// refreshing target given its fetched object from `sources` (by target name).
    pub fn evaluate(
        &self,
        delivery: &Delivery<'_>,
        sources: &BTreeMap<String, serde_json::Value>,
    ) -> Result<(Identity, Vec<Upsert>), EvalError> {
        let (identity, mut ctx) = self.identify(delivery)?;
        let mut upserts = Vec::new();
        for index in self.due_targets(&ctx)? {
            let target = &self.targets[index];
            let mut refresh_url = None;
            if target.refresh.is_some() {
                refresh_url = Some(self.render_refresh_url(index, &ctx)?);
                let Some(source) = sources.get(&target.name) else {
                    return Err(EvalError::NoSource { target: target.name.clone() });
                };
                ctx.set_source(Some(source.clone()));
                // A source that says it is gone is not written.
                if self.source_gone(index, &ctx)? {
                    ctx.set_source(None);
                    continue;
                }
                // The version the worker would read, so that a fixture shows a wrong pointer.
                self.source_version(index, source)?;
            }
            let mut upsert = self.render_target(index, &ctx)?;
            upsert.refresh_url = refresh_url;
            ctx.set_source(None);
            upserts.push(upsert);
        }
        Ok((identity, upserts))
    }

    /// The URL a target's refresh fetches. It starts with the origin written in the
    /// pipeline, so a payload cannot send the request elsewhere.
    pub fn render_refresh_url(&self, index: usize, ctx: &Context) -> Result<String, EvalError> {
        let refresh = self.targets[index].refresh.as_ref().expect("a target that refreshes");
        let url = self.render(&refresh.url, &refresh.url, ctx)?;
        // The origin was lowercased at load; the template may spell it otherwise.
        let rest = match url.get(..refresh.origin.len()) {
            Some(head) if head.eq_ignore_ascii_case(&refresh.origin) => {
                &url[refresh.origin.len()..]
            }
            _ => "-",
        };
        let starts_right = rest.is_empty() || rest.starts_with(['/', '?', '#']);
        if !starts_right
            || url.chars().any(|c| c.is_whitespace() || c.is_control() || c == '\\')
            || climbs(rest)
        {
            return Err(EvalError::RefreshUrl {
                what: refresh.url.clone(),
                url: printable(&url, SHOWN_CHARS_MAX),
                origin: refresh.origin.clone(),
            });
        }
        Ok(url)
    }

    /// Whether the refresh's `gone_if` holds for the source set in `ctx`.
    pub fn source_gone(&self, index: usize, ctx: &Context) -> Result<bool, EvalError> {
        let refresh = self.targets[index].refresh.as_ref();
        match refresh.and_then(|r| r.gone_if.as_ref()) {
            Some(template) => Ok(self.render(template, template, ctx)? == "true"),
            None => Ok(false),
        }
    }

    /// The version a fetched object carries at the refresh's `version` pointer, as the
    /// pipeline's ordering reads versions; `None` without a pointer or without ordering.
    pub fn source_version(
        &self,
        index: usize,
        source: &serde_json::Value,
    ) -> Result<Option<Version>, EvalError> {
        let refresh = self.targets[index].refresh.as_ref();
        let (Some(pointer), Some(ordering)) =
            (refresh.and_then(|r| r.version.as_ref()), &self.ordering)
        else {
            return Ok(None);
        };
        let what = format!("targets[{index}].refresh.version");
        let text = match source.pointer(pointer) {
            Some(serde_json::Value::String(text)) => text.clone(),
            Some(serde_json::Value::Number(number)) => number.to_string(),
            None | Some(serde_json::Value::Null) => {
                return Err(EvalError::MissingPointer { what, pointer: pointer.clone() });
            }
            Some(other) => {
                let found = if other.is_object() {
                    "an object"
                } else if other.is_array() {
                    "an array"
                } else {
                    "a boolean"
                };
                return Err(EvalError::NotScalar { what, pointer: pointer.clone(), found });
            }
        };
        parse_version(&text, ordering.version_type).map(Some)
    }

    fn source(
        &self,
        what: &str,
        source: &CompiledSource,
        ctx: &Context,
        delivery: &Delivery<'_>,
    ) -> Result<String, EvalError> {
        let value = match source {
            CompiledSource::Header(name) if ctx.repeated_headers.contains(name) => {
                return Err(EvalError::RepeatedHeader {
                    what: what.to_owned(),
                    header: name.clone(),
                });
            }
            CompiledSource::Header(name) => match ctx.headers.get(name) {
                Some(value) => value.trim().to_owned(),
                None => {
                    return Err(EvalError::MissingHeader {
                        what: what.to_owned(),
                        header: name.clone(),
                    });
                }
            },
            CompiledSource::Pointer(pointer) => {
                let payload = ctx.payload(what)?;
                match payload.pointer(pointer) {
                    None | Some(serde_json::Value::Null) => {
                        return Err(EvalError::MissingPointer {
                            what: what.to_owned(),
                            pointer: pointer.clone(),
                        });
                    }
                    Some(serde_json::Value::String(s)) => s.clone(),
                    // The number as the sender wrote it: parsed, a number beyond 2^64 would
                    // lose digits, and two ids could become one key.
                    Some(serde_json::Value::Number(n)) => {
                        number_text(delivery.body, pointer).unwrap_or_else(|| n.to_string())
                    }
                    Some(serde_json::Value::Bool(b)) => b.to_string(),
                    Some(serde_json::Value::Array(_)) => {
                        return Err(EvalError::NotScalar {
                            what: what.to_owned(),
                            pointer: pointer.clone(),
                            found: "a list",
                        });
                    }
                    Some(serde_json::Value::Object(_)) => {
                        return Err(EvalError::NotScalar {
                            what: what.to_owned(),
                            pointer: pointer.clone(),
                            found: "an object",
                        });
                    }
                }
            }
            CompiledSource::Template(template) => self.render(what, template, ctx)?,
            CompiledSource::BodySha256 => body_sha256(delivery.body),
            CompiledSource::FormSha256 => form_sha256(delivery.body),
        };
        if value.is_empty() {
            return Err(EvalError::Empty { what: what.to_owned() });
        }
        Ok(value)
    }

    fn render(&self, what: &str, template: &str, ctx: &Context) -> Result<String, EvalError> {
        let compiled = self.env.get_template(template).expect("compiled at load time");
        let rendered = compiled.render(ctx.value()).map_err(|error| {
            // With a body that is not JSON, `payload` is undefined: say why.
            if let (Err(reason), minijinja::ErrorKind::UndefinedError) =
                (&ctx.payload, error.kind())
            {
                return EvalError::NotJson { what: what.to_owned(), reason: reason.clone() };
            }
            let mut reason = error.kind().to_string();
            if let Some(detail) = error.detail() {
                reason = format!("{reason}: {detail}");
            }
            EvalError::Template { what: what.to_owned(), reason }
        })?;
        check_length(what, &rendered, RENDERED_BYTES_MAX)?;
        Ok(rendered)
    }
}

/// Whether a URL's path could reach another resource of the host than the one written: a
/// `.` or `..` segment (URL parsers resolve them, `%2e%2e` included; servers that decode
/// twice or drop `;parameters` resolve `%252e%252e` and `..;`), or a segment that decodes to a
/// `/` or `\` (servers that decode `%2F` before routing). Segments are decoded until they no
/// longer change, at most three times.
fn climbs(path_and_query: &str) -> bool {
    let path = path_and_query.split(['?', '#']).next().unwrap_or_default();
    path.split('/').any(|segment| {
        let mut decoded = segment.to_owned();
        for _ in 0..3 {
            let next = percent_decode(&decoded);
            if next == decoded {
                break;
            }
            decoded = next;
        }
        let bare = decoded.split(';').next().unwrap_or_default();
        bare == "." || bare == ".." || decoded.contains(['/', '\\'])
    })
}

/// `%XX` sequences decoded, leniently: what is not one is kept.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(high), Some(low)) => {
                out.push(u8::try_from(high * 16 + low).unwrap_or(b'?'));
                i += 3;
            }
            (byte, _, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// An `application/x-www-form-urlencoded` body as a payload: an object of decoded names to
/// decoded values; a name sent more than once maps to its values in the order sent.
/// The hex SHA-256 of a form's parameters, decoded, sorted and re-encoded: one text for every
/// encoding of the same parameters.
pub fn form_sha256(body: &[u8]) -> String {
    let mut pairs: Vec<(String, String)> =
        form_urlencoded::parse(body).map(|(n, v)| (n.into_owned(), v.into_owned())).collect();
    pairs.sort();
    let canonical = form_urlencoded::Serializer::new(String::new()).extend_pairs(pairs).finish();
    hex::encode(Sha256::digest(canonical.as_bytes()))
}

/// The hex SHA-256 of a body: the `body_sha256` key and the default fingerprint.
pub fn body_sha256(body: &[u8]) -> String {
    hex::encode(Sha256::digest(body))
}

fn check_length(what: &str, value: &str, max: usize) -> Result<(), EvalError> {
    if value.len() > max {
        return Err(EvalError::TooLong { what: what.to_owned(), bytes: value.len(), max });
    }
    Ok(())
}

/// A key, scope, type or version: bounded, and without control characters (a NUL cannot be
/// stored in PostgreSQL text, a newline forges log lines, an escape sequence drives a terminal).
fn check_label(what: &str, value: &str, max: usize) -> Result<(), EvalError> {
    check_length(what, value, max)?;
    match value.chars().position(char::is_control) {
        Some(at) => Err(EvalError::ControlCharacter { what: what.to_owned(), at }),
        None => Ok(()),
    }
}

/// An entity: a label that is not blank, since writes are ordered within it.
fn check_entity(what: &str, value: &str) -> Result<(), EvalError> {
    if value.trim().is_empty() {
        return Err(EvalError::Empty { what: what.to_owned() });
    }
    check_label(what, value, LABEL_BYTES_MAX)
}

/// The literal text of the JSON value at `pointer` in `body`, as the sender wrote it.
fn number_text(body: &[u8], pointer: &str) -> Option<String> {
    let mut value: &serde_json::value::RawValue = serde_json::from_slice(body).ok()?;
    for token in pointer.split('/').skip(1) {
        let token = token.replace("~1", "/").replace("~0", "~");
        let text = value.get();
        value = match text.trim_start().as_bytes().first()? {
            b'{' => {
                let mut object: HashMap<String, &serde_json::value::RawValue> =
                    serde_json::from_str(text).ok()?;
                object.remove(&token)?
            }
            b'[' => {
                let list: Vec<&serde_json::value::RawValue> = serde_json::from_str(text).ok()?;
                *list.get(token.parse::<usize>().ok()?)?
            }
            _ => return None,
        };
    }
    Some(value.get().trim().to_owned())
}

pub(crate) fn parse_version(text: &str, version_type: VersionType) -> Result<Version, EvalError> {
    let bad = |expected| EvalError::BadVersion { text: printable(text, SHOWN_CHARS_MAX), expected };
    match version_type {
        VersionType::Integer => {
            text.parse().map(Version::Integer).map_err(|_| bad("a whole number"))
        }
        VersionType::Timestamp => OffsetDateTime::parse(text, &Rfc3339)
            .map(|t| Version::Timestamp(t.to_offset(time::UtcOffset::UTC)))
            .map_err(|_| bad("an RFC 3339 timestamp")),
        VersionType::String => {
            if text.is_empty() {
                return Err(bad("a non-empty string"));
            }
            Ok(Version::Text(text.to_owned()))
        }
    }
}

/// serde_json's map is ordered by key (we do not enable `preserve_order`), so serialising a
/// value gives one text per value whatever order the sender used.
fn canonical_hash(value: &impl Serialize) -> String {
    let bytes = serde_json::to_vec(value).expect("JSON values always serialise");
    hex::encode(Sha256::digest(&bytes))
}

fn remove_pointer(value: &mut serde_json::Value, pointer: &str) {
    let Some((parent, last)) = pointer.rsplit_once('/') else { return };
    let last = last.replace("~1", "/").replace("~0", "~");
    match value.pointer_mut(parent) {
        Some(serde_json::Value::Object(map)) => {
            map.remove(&last);
        }
        Some(serde_json::Value::Array(items)) => {
            if let Ok(index) = last.parse::<usize>()
                && index < items.len()
            {
                items.remove(index);
            }
        }
        _ => {}
    }
}
