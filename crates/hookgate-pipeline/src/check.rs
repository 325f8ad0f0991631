//! Semantic checks: from a deserialized model to a compiled pipeline, reporting every problem
//! with its place in the file.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use hookgate_connector::TargetRule;
use hookgate_verify::{
    Algorithm, Condition, Encoding, Fields, HeaderRef, KeyFormat, Part, Preset, Scheme,
    SignatureSource, Spec, TimestampFormat, TimestampRule, TimestampSource, TimestampSpec, Variant,
};
use minijinja::Environment;

use crate::body::BodyReading;
use crate::diagnostic::{Code, Diagnostic, Pos, Span, suggestion};
use crate::model::{
    BodyFormat, ConditionConfig, ConnectorInstance, DigestEncoding, FieldsConfig, Fingerprint,
    HeaderNames, InstancesFile, KeyFormatName, MessagePart, NotFound, Operation, PayloadSchema,
    Pipeline, Provider, Redact, Refresh, RefreshAuth, RefreshMethod, SchemeName, SecretRef,
    SignatureAlgorithm, SignatureConfig, SignedPart, Target, TimestampConfig, TimestampFormatName,
    TimestampRuleName, ValueSource, VersionType,
};
use crate::redact::Redaction;
use crate::shape::{PayloadUse, Shape, ShapeSource};
use crate::template::{self, BUILTIN_FUNCTIONS, EVENT_VARIABLES, REQUEST_VARIABLES};
use crate::yaml::{Node, PathSegment, Value};

/// Pipeline names become URL path segments and database values.
const NAME_CHARS_MAX: usize = 64;
/// A tolerance beyond this makes replay protection meaningless: a day (SendGrid's retries keep
/// their first signature for that long) and 5 minutes. Within it a replay is held off by the
/// key, which `check` holds retention to outlive.
const TOLERANCE_MAX: Duration = Duration::from_secs(24 * 3600 + 300);
const ATTEMPTS_MAX_LIMIT: u32 = 1000;
/// Bounds of a connector's `limits.rate`: a window the engine can keep a log of, and one
/// that a person wrote on purpose.
const RATE_CALLS_MAX: u32 = 1_000_000;
const RATE_WINDOW_MIN: Duration = Duration::from_secs(1);
const RATE_WINDOW_MAX: Duration = Duration::from_secs(86_400);

/// A pipeline ready to serve: model checked, templates compiled, scheme resolved.
#[derive(Debug)]
pub struct CompiledPipeline {
    pub file: String,
    pub name: String,
    pub name_pos: Pos,
    pub scheme: Scheme,
    pub tolerance_secs: Option<u32>,
    /// The URL the sender calls, for URL-signed schemes; see [`CompiledPipeline::signed_url`].
    pub public_url: Option<String>,
    /// Where signing keys may be fetched from, for schemes whose deliveries name their key.
    pub key_fetch: Option<KeyFetch>,
    /// For schemes whose key senders share (AWS SNS): the senders trusted.
    pub senders: Vec<String>,
    /// How the body is read into `payload`.
    pub body_reading: BodyReading,
    /// With the position of each reference, for "unset secret" diagnostics: the signature's
    /// `secrets`, then each variant's own.
    pub secrets: Vec<(SecretRef, Pos)>,
    /// Which variants each of `secrets` verifies, parallel to it.
    pub secret_use: Vec<hookgate_verify::KeyUse>,
    pub key: CompiledSource,
    pub scope: Option<TemplateName>,
    pub event_type: Option<CompiledSource>,
    pub fingerprint: Fingerprint,
    pub ordering: Option<CompiledOrdering>,
    pub targets: Vec<CompiledTarget>,
    /// What a conflicting delivery is answered: 409, or a 2xx the pipeline chose.
    pub conflict_status: u16,
    pub delivery: crate::model::DeliveryPolicy,
    pub retention: Duration,
    /// How long bodies and kept headers are kept; `None`: as long as the event.
    pub payload_retention: Option<Duration>,
    /// What operators never see of a stored payload.
    pub redact: Redaction,
    pub(crate) env: Environment<'static>,
    /// Where templates and pointers read payload fields.
    pub payload_uses: Vec<PayloadUse>,
    /// `payload_schema: fixtures`: the payload's shape is the fixtures' bodies', which the
    /// caller that runs the fixtures checks [`CompiledPipeline::payload_uses`] against.
    pub payload_from_fixtures: bool,
}

impl CompiledPipeline {
    /// Payload fields this pipeline reads that `shape` does not have, and needed ones it does
    /// not promise; see [`crate::shape::problems`].
    pub fn payload_problems(&self, shape: &Shape, source: ShapeSource) -> Vec<Diagnostic> {
        crate::shape::problems(&self.file, &self.payload_uses, shape, source)
    }
}

/// A target's source refresh, checked.
#[derive(Debug, Clone)]
pub struct CompiledRefresh {
    pub url: TemplateName,
    /// `https://host[:port]`: every rendered URL starts with it and a `/`, `?` or `#`.
    pub origin: String,
    pub method: RefreshMethod,
    pub headers: Vec<(String, String)>,
    /// Headers whose values are secrets, by reference.
    pub secret_headers: Vec<(String, SecretRef)>,
    pub auth: Option<RefreshAuth>,
    /// The auth's secret references with their positions.
    pub secrets: Vec<(SecretRef, Pos)>,
    pub timeout: Duration,
    pub not_found: NotFound,
    /// A condition over `source`: the object is gone although it was fetched.
    pub gone_if: Option<TemplateName>,
    /// A JSON pointer into the fetched object to its version.
    pub version: Option<String>,
    pub max_bytes: usize,
    pub allow_plain_http: bool,
}

/// The name of a template in the pipeline's environment; it is also its place in the file
/// (`targets[0].fields.Name`), so runtime errors say where to look.
pub type TemplateName = String;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompiledSource {
    /// Lowercased header name.
    Header(String),
    Pointer(String),
    Template(TemplateName),
    BodySha256,
    FormSha256,
}

#[derive(Debug, Clone)]
pub struct CompiledOrdering {
    pub entity: TemplateName,
    pub version: TemplateName,
    pub version_type: VersionType,
    /// How far ahead of the receipt time a timestamp version may be.
    pub max_future: Duration,
}

/// A timestamp version may be this far ahead of its receipt unless a pipeline says otherwise.
pub const MAX_FUTURE_DEFAULT: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone)]
pub struct CompiledTarget {
    pub name: String,
    pub connector: String,
    pub connector_kind: Option<String>,
    pub when: Option<TemplateName>,
    pub object: String,
    pub operation: Operation,
    pub external_id_field: String,
    pub external_id_value: TemplateName,
    pub fields: Vec<(String, TemplateName)>,
    pub refresh: Option<CompiledRefresh>,
}

/// The connector instances, checked.
#[derive(Debug, Clone, Default)]
pub struct Instances {
    pub file: String,
    pub connectors: BTreeMap<String, ConnectorInstance>,
    /// The instance, and each reference with its position, for "unset secret" diagnostics.
    pub secrets: Vec<(String, SecretRef, Pos)>,
    /// `payload_encryption.keys`: each id, its secret and the secret's position, the first
    /// sealing new rows. Empty: payloads are stored in plaintext.
    pub payload_keys: Vec<(String, SecretRef, Pos)>,
    /// `source_origins`: a refresh written for the key's origin goes to the value's.
    pub source_origins: BTreeMap<String, String>,
    /// What each connector kind's API cannot do, by kind: filled in by whoever knows the
    /// kinds (the binary's registry), checked against every target.
    pub rules: BTreeMap<String, Vec<TargetRule>>,
    /// `plugins.directories` as written, each with its place in the file.
    pub plugin_directories: Vec<(String, Span)>,
    /// `plugins.max_calls_in_flight` and `plugins.max_answer_bytes`.
    pub plugin_limits: (usize, usize),
    /// The document and each instance's index in it, to check settings where they are written.
    doc: Option<Node>,
    index: BTreeMap<String, usize>,
}

impl Instances {
    /// Checks an instance's `settings` against a connector kind's settings type, reporting
    /// every problem at its place in the file.
    pub fn check_settings<T: serde::de::DeserializeOwned>(&self, name: &str) -> Vec<Diagnostic> {
        let (Some(doc), Some(&i)) = (&self.doc, self.index.get(name)) else { return Vec::new() };
        let instance = doc.locate(&path!["connectors", i]);
        let mut node = match instance.get(&"settings".into()) {
            Some(settings) => settings.clone(),
            // No `settings:` at all is an empty mapping, checked like one (required settings
            // are then reported at the instance).
            None => Node { span: instance.span, value: Value::Map(Vec::new()) },
        };
        // A reference (`{ env: NAME }`) gives a string when the gateway starts: checked as one.
        replace_references(&mut node);
        crate::de::from_node::<T>(&self.file, &mut node).1
    }

    /// Where an instance's `kind` is written (the start of the file if unknown).
    pub fn kind_span(&self, name: &str) -> Span {
        match (&self.doc, self.index.get(name)) {
            (Some(doc), Some(&i)) => doc.locate(&path!["connectors", i, "kind"]).span,
            _ => Span::start(),
        }
    }

    /// Where the value at `pointer` (a JSON pointer, e.g. `/auth/token_url`) inside an
    /// instance's `settings` is written: the deepest part of it that exists in the file.
    pub fn settings_span(&self, name: &str, pointer: &str) -> Span {
        let (Some(doc), Some(&i)) = (&self.doc, self.index.get(name)) else {
            return Span::start();
        };
        let instance = doc.locate(&path!["connectors", i]);
        let Some(mut node) = instance.get(&"settings".into()) else { return instance.span };
        for token in pointer.split('/').skip(1) {
            let token = token.replace("~1", "/").replace("~0", "~");
            let segment = match token.parse::<usize>() {
                Ok(k) if matches!(node.value, Value::Seq(_)) => PathSegment::Index(k),
                _ => PathSegment::Key(token),
            };
            let next = node.get(&segment);
            match next {
                Some(next) => node = next,
                None => break,
            }
        }
        node.span
    }

    /// Reports each credential a kind requires that an instance does not reference.
    pub fn check_credentials(&self, name: &str, required: &[&str]) -> Vec<Diagnostic> {
        let (Some(doc), Some(&i), Some(instance)) =
            (&self.doc, self.index.get(name), self.connectors.get(name))
        else {
            return Vec::new();
        };
        let kind = instance.kind.as_str();
        required
            .iter()
            .filter(|credential| !instance.credentials.contains_key(**credential))
            .map(|credential| {
                let span = doc.key_span(&path!["connectors", i, "credentials"]);
                Diagnostic::error(
                    Code::ConnectorSettings,
                    &self.file,
                    span,
                    format!("connector `{name}` ({kind}) needs the credential `{credential}`"),
                )
                .with_hint(format!(
                    "add `{credential}: {{ env: SOME_VARIABLE }}` under `credentials`"
                ))
            })
            .collect()
    }
}

/// A settings value that is a reference to the environment or a file (`{ env: NAME }`,
/// `{ file: PATH }`): a mapping with that one key. It stands for the variable's or file's text.
pub fn setting_reference(value: &serde_json::Value) -> Option<SecretRef> {
    let object = value.as_object().filter(|object| object.len() == 1)?;
    let (key, value) = object.iter().next()?;
    // `{ env: 123 }` names the variable `123`, as the YAML that wrote it reads.
    let text = match value {
        serde_json::Value::String(text) => text.clone(),
        serde_json::Value::Number(number) => number.to_string(),
        serde_json::Value::Bool(flag) => flag.to_string(),
        _ => return None,
    };
    match key.as_str() {
        "env" => Some(SecretRef::Env(text)),
        "file" => Some(SecretRef::File(text)),
        _ => None,
    }
}

/// Each reference in `settings`, with its JSON pointer (e.g. `/base_url`).
pub fn setting_references(
    settings: &BTreeMap<String, serde_json::Value>,
) -> Vec<(String, SecretRef)> {
    fn walk(pointer: String, value: &serde_json::Value, found: &mut Vec<(String, SecretRef)>) {
        if let Some(reference) = setting_reference(value) {
            found.push((pointer, reference));
            return;
        }
        match value {
            serde_json::Value::Object(object) => {
                for (key, inner) in object {
                    walk(
                        format!("{pointer}/{}", key.replace('~', "~0").replace('/', "~1")),
                        inner,
                        found,
                    );
                }
            }
            serde_json::Value::Array(items) => {
                for (i, inner) in items.iter().enumerate() {
                    walk(format!("{pointer}/{i}"), inner, found);
                }
            }
            _ => {}
        }
    }
    let mut found = Vec::new();
    for (key, value) in settings {
        walk(format!("/{}", key.replace('~', "~0").replace('/', "~1")), value, &mut found);
    }
    found
}

/// `settings` with every reference replaced by what `resolve` gives for it.
pub fn with_references_resolved<E>(
    settings: &BTreeMap<String, serde_json::Value>,
    resolve: &mut impl FnMut(&SecretRef) -> Result<String, E>,
) -> Result<BTreeMap<String, serde_json::Value>, E> {
    fn walk<E>(
        value: &serde_json::Value,
        resolve: &mut impl FnMut(&SecretRef) -> Result<String, E>,
    ) -> Result<serde_json::Value, E> {
        if let Some(reference) = setting_reference(value) {
            return Ok(serde_json::Value::String(resolve(&reference)?));
        }
        Ok(match value {
            serde_json::Value::Object(object) => serde_json::Value::Object(
                object
                    .iter()
                    .map(|(key, inner)| Ok((key.clone(), walk(inner, resolve)?)))
                    .collect::<Result<_, E>>()?,
            ),
            serde_json::Value::Array(items) => serde_json::Value::Array(
                items.iter().map(|inner| walk(inner, resolve)).collect::<Result<_, E>>()?,
            ),
            other => other.clone(),
        })
    }
    settings.iter().map(|(key, value)| Ok((key.clone(), walk(value, resolve)?))).collect()
}

/// Replaces each reference mapping in a settings node by an empty string of the same span.
fn replace_references(node: &mut Node) {
    let is_reference = match &node.value {
        Value::Map(entries) => {
            entries.len() == 1
                && matches!(&entries[0].0.value, Value::Scalar { text, .. } if text == "env" || text == "file")
                && matches!(&entries[0].1.value, Value::Scalar { .. })
        }
        _ => false,
    };
    if is_reference {
        node.value = Value::Scalar { text: String::new(), style: crate::yaml::Style::DoubleQuoted };
        return;
    }
    match &mut node.value {
        Value::Map(entries) => entries.iter_mut().for_each(|(_, value)| replace_references(value)),
        Value::Seq(items) => items.iter_mut().for_each(replace_references),
        _ => {}
    }
}

pub(crate) fn check_instances(
    file: &str,
    doc: &Node,
    model: InstancesFile,
) -> (Instances, Vec<Diagnostic>) {
    let mut diagnostics = Vec::new();
    let mut connectors = BTreeMap::new();
    let mut index = BTreeMap::new();
    let mut secrets = Vec::new();
    for (i, instance) in model.connectors.into_iter().enumerate() {
        let name_span = doc.locate(&path!["connectors", i, "name"]).span;
        if !valid_name(&instance.name) {
            diagnostics.push(
                Diagnostic::error(
                    Code::InvalidName,
                    file,
                    name_span,
                    format!("invalid connector name `{}`", instance.name),
                )
                .with_hint(NAME_HINT),
            );
        }
        for key in instance.credentials.keys() {
            let pos = doc.locate(&path!["connectors", i, "credentials", key.as_str()]).span.start;
            secrets.push((instance.name.clone(), instance.credentials[key].clone(), pos));
        }
        // References in settings are secrets like credentials: reported when unset, required
        // by `serve` only for the instances it builds.
        for (pointer, reference) in setting_references(&instance.settings) {
            let mut path = path!["connectors", i, "settings"].to_vec();
            for token in pointer.split('/').skip(1) {
                let token = token.replace("~1", "/").replace("~0", "~");
                path.push(match token.parse::<usize>() {
                    Ok(index) => PathSegment::Index(index),
                    Err(_) => PathSegment::Key(token),
                });
            }
            let pos = doc.locate(&path).span.start;
            secrets.push((instance.name.clone(), reference, pos));
        }
        if let Some(&first) = index.get(&instance.name) {
            let first_span = doc.locate(&path!["connectors", first, "name"]).span;
            diagnostics.push(
                Diagnostic::error(
                    Code::DuplicateName,
                    file,
                    name_span,
                    format!("duplicate connector name `{}`", instance.name),
                )
                .with_hint("targets name connector instances: make each name unique")
                .with_related(file, first_span, "first defined here"),
            );
            continue;
        }
        if let Some(rate) = instance.limits.as_ref().and_then(|l| l.rate.as_ref()) {
            let at =
                |field: &str| doc.locate(&path!["connectors", i, "limits", "rate", field]).span;
            if !(1..=RATE_CALLS_MAX).contains(&rate.calls) {
                diagnostics.push(
                    Diagnostic::error(
                        Code::OutOfRange,
                        file,
                        at("calls"),
                        format!("`limits.rate.calls` is {}, outside 1..={RATE_CALLS_MAX}", rate.calls),
                    )
                    .with_hint("a budget of no calls would hold every write forever; give the calls the CRM allows in `per`"),
                );
            }
            if !(RATE_WINDOW_MIN..=RATE_WINDOW_MAX).contains(&rate.per.0) {
                diagnostics.push(
                    Diagnostic::error(
                        Code::OutOfRange,
                        file,
                        at("per"),
                        format!(
                            "`limits.rate.per` is {}, outside 1s..=24h",
                            humantime::format_duration(rate.per.0)
                        ),
                    )
                    .with_hint("give the CRM's own window, e.g. `per: 10s` for HubSpot"),
                );
            }
        }
        index.insert(instance.name.clone(), i);
        connectors.insert(instance.name.clone(), instance);
    }
    let mut plugin_directories = Vec::new();
    let mut plugin_limits = (16, 1 << 20);
    if let Some(plugins) = &model.plugins {
        for (i, directory) in plugins.directories.iter().enumerate() {
            let span = doc.locate(&path!["plugins", "directories", i]).span;
            plugin_directories.push((directory.clone(), span));
        }
        for (field, value, range) in [
            ("max_calls_in_flight", plugins.max_calls_in_flight, 1..=256),
            ("max_answer_bytes", plugins.max_answer_bytes, 1024..=16 << 20),
        ] {
            if !range.contains(&value) {
                diagnostics.push(
                    Diagnostic::error(
                        Code::OutOfRange,
                        file,
                        doc.locate(&path!["plugins", field]).span,
                        format!("`plugins.{field}` is {value}, outside {range:?}"),
                    )
                    .with_hint(format!(
                        "use a value from {} to {}",
                        range.start(),
                        range.end()
                    )),
                );
            }
        }
        plugin_limits = (plugins.max_calls_in_flight, plugins.max_answer_bytes);
    }
    let mut payload_keys: Vec<(String, SecretRef, Pos)> = Vec::new();
    match &model.payload_encryption {
        None => diagnostics.push(
            Diagnostic::warning(
                Code::PlaintextPayloads,
                file,
                doc.key_span(&path!["connectors"]),
                "payloads are stored in plaintext: this file configures no `payload_encryption`",
            )
            .with_hint("add `payload_encryption: { keys: [{ id: k1, secret: { env: HOOKGATE_PAYLOAD_KEY } }] }` with 32 random bytes in base64"),
        ),
        Some(encryption) => {
            if encryption.keys.is_empty() {
                diagnostics.push(
                    Diagnostic::error(
                        Code::OutOfRange,
                        file,
                        doc.locate(&path!["payload_encryption", "keys"]).span,
                        "`payload_encryption.keys` is empty",
                    )
                    .with_hint("list at least one key; the first seals new rows"),
                );
            }
            for (i, key) in encryption.keys.iter().enumerate() {
                let id_span = doc.locate(&path!["payload_encryption", "keys", i, "id"]).span;
                if !valid_name(&key.id) {
                    diagnostics.push(
                        Diagnostic::error(
                            Code::InvalidName,
                            file,
                            id_span,
                            format!("invalid payload key id `{}`", key.id),
                        )
                        .with_hint(NAME_HINT),
                    );
                }
                if let Some(first) = payload_keys.iter().position(|(id, _, _)| *id == key.id) {
                    let first_span =
                        doc.locate(&path!["payload_encryption", "keys", first, "id"]).span;
                    diagnostics.push(
                        Diagnostic::error(
                            Code::DuplicateName,
                            file,
                            id_span,
                            format!("duplicate payload key id `{}`", key.id),
                        )
                        .with_hint("each row records the id of its key: ids must be unique")
                        .with_related(file, first_span, "first defined here"),
                    );
                    continue;
                }
                let pos = doc.locate(&path!["payload_encryption", "keys", i, "secret"]).span.start;
                payload_keys.push((key.id.clone(), key.secret.clone(), pos));
            }
        }
    }
    let mut source_origins = BTreeMap::new();
    for (from, to) in &model.source_origins {
        let span = doc.locate(&path!["source_origins", from.as_str()]).span;
        let mut problem = |message: String| {
            diagnostics.push(
                Diagnostic::error(Code::Refresh, file, span, message)
                    .with_hint("write origins as `scheme://host[:port]`, without a path"),
            );
        };
        match (refresh_origin(from), refresh_origin(to)) {
            (Ok(a), Ok(b)) if a == from.to_ascii_lowercase() && b == to.to_ascii_lowercase() => {
                let plain = b.strip_prefix("http://");
                if plain.is_some_and(|host| !is_loopback_host(host)) {
                    problem(format!("`{to}` is plain http to a host that is not loopback"));
                } else {
                    source_origins.insert(a, b);
                }
            }
            (Err(e), _) | (_, Err(e)) => problem(e),
            _ => problem(format!("`{from}: {to}` is not an origin to an origin")),
        }
    }
    (
        Instances {
            file: file.to_owned(),
            connectors,
            secrets,
            payload_keys,
            source_origins,
            rules: BTreeMap::new(),
            plugin_directories,
            plugin_limits,
            doc: Some(doc.clone()),
            index,
        },
        diagnostics,
    )
}

const NAME_HINT: &str = "names use lowercase letters, digits, `-` and `_`, start with a letter, and have at most 64 characters";

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some('a'..='z'))
        && name.len() <= NAME_CHARS_MAX
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '-' | '_'))
}

struct Checker<'a> {
    file: &'a str,
    /// The file's text, to find a place inside a scalar where it really is.
    source: &'a str,
    doc: &'a Node,
    env: Environment<'static>,
    diagnostics: Vec<Diagnostic>,
    /// Every payload field a template or pointer reads, for [`crate::shape::problems`].
    payload_uses: Vec<PayloadUse>,
}

impl Checker<'_> {
    fn error(
        &mut self,
        code: Code,
        path: &[PathSegment],
        message: impl Into<String>,
    ) -> &mut Diagnostic {
        let span = self.doc.locate(path).span;
        self.diagnostics.push(Diagnostic::error(code, self.file, span, message));
        self.diagnostics.last_mut().expect("just pushed")
    }

    fn error_at_key(
        &mut self,
        code: Code,
        path: &[PathSegment],
        message: impl Into<String>,
    ) -> &mut Diagnostic {
        let span = self.doc.key_span(path);
        self.diagnostics.push(Diagnostic::error(code, self.file, span, message));
        self.diagnostics.last_mut().expect("just pushed")
    }

    /// Compiles `source` as template `name` (its path in the file) and checks that it only
    /// uses the variables available at its stage.
    fn template(&mut self, path: &[PathSegment], source: &str, allowed: &[&str]) -> TemplateName {
        self.template_with_offset(path, source, source.to_owned(), 0, allowed)
    }

    fn template_with_offset(
        &mut self,
        path: &[PathSegment],
        user_source: &str,
        compiled_source: String,
        offset: usize,
        allowed: &[&str],
    ) -> TemplateName {
        let name = display_path(path);
        if let Err(error) = self.env.add_template_owned(name.clone(), compiled_source) {
            let node = self.doc.locate(path);
            let span = node.span;
            let byte = error.range().map(|r| r.start.saturating_sub(offset)).unwrap_or(0);
            let at = self.place_in_scalar(node, user_source, byte.min(user_source.len()), None);
            let detail = error.detail().unwrap_or("invalid syntax").to_owned();
            // A condition is already an expression: `{{ }}` inside one is the usual mistake,
            // and the generic hint would recommend it.
            let gone_if = matches!(path.last(), Some(PathSegment::Key(k)) if k == "gone_if");
            let (field, example) = if gone_if {
                ("gone_if", "source.deleted | default(false)")
            } else {
                ("when", "event.type == \"push\"")
            };
            let hint = if offset > 0 && user_source.contains("{{") {
                let inner =
                    user_source.trim().trim_start_matches("{{").trim_end_matches("}}").trim();
                format!(
                    "`{field}` is already an expression; write it without `{{{{ }}}}`: `{inner}`"
                )
            } else if offset > 0 {
                format!("`{field}` is a minijinja expression, e.g. `{example}`")
            } else {
                "templates use minijinja (Jinja2) syntax: `{{ payload.field }}`".to_owned()
            };
            self.diagnostics.push(
                Diagnostic::error(
                    Code::TemplateSyntax,
                    self.file,
                    span,
                    format!("template syntax error: {detail}"),
                )
                .at(at.start)
                .with_hint(hint),
            );
            return name;
        }
        let template = self.env.get_template(&name).expect("just added");
        // Nested lookups (`payload.data.object.email`), for checking against the payload's
        // shape; a use inside a longer chain is the chain's prefix, and only the longest counts.
        let mut chains: Vec<String> = template
            .undeclared_variables(true)
            .into_iter()
            .filter(|v| v.starts_with("payload."))
            .collect();
        chains.sort();
        let longest: Vec<&String> = chains
            .iter()
            .filter(|v| {
                !chains.iter().any(|w| w.len() > v.len() && w.starts_with(&format!("{v}.")))
            })
            .collect();
        let needed = matches!(
            path,
            [PathSegment::Key(a), PathSegment::Key(b)] if a == "ordering" && (b == "entity" || b == "version")
        ) || matches!(
            path,
            [PathSegment::Key(t), PathSegment::Index(_), PathSegment::Key(e), PathSegment::Key(v)]
                if t == "targets" && e == "external_id" && v == "value"
        );
        // A fallback of the template's own: a `default` filter, an `is defined` test, an `if`.
        let compact: String = user_source.chars().filter(|c| !c.is_whitespace()).collect();
        let guarded = compact.contains("|default")
            || compact.contains("|d(")
            || user_source.contains(" is defined")
            || user_source.contains(" is not none")
            || compact.contains("{%if");
        let node = self.doc.locate(path);
        for chain in longest {
            let span = match find_name(user_source, chain) {
                Some(byte) => self.place_in_scalar(node, user_source, byte, Some(chain.len())),
                None => Span { start: node.span.start, end: node.span.start },
            };
            self.payload_uses.push(PayloadUse {
                path: chain["payload.".len()..].split('.').map(str::to_owned).collect(),
                shown: chain.clone(),
                span,
                place: name.clone(),
                needed,
                guarded,
            });
        }
        let mut unknown: Vec<String> = template
            .undeclared_variables(false)
            .into_iter()
            .filter(|v| !allowed.contains(&v.as_str()) && !BUILTIN_FUNCTIONS.contains(&v.as_str()))
            .collect();
        unknown.sort();
        for variable in unknown {
            let mut hint = suggestion(&variable, allowed);
            if variable == "event" {
                hint = "`event` is not known yet here: the key, scope and type are derived from `payload`, `headers` and `body`".to_owned();
            }
            if variable == "source" {
                hint = "`source` is the object a target's `refresh:` fetches, seen by that target's `fields` only".to_owned();
            }
            let node = self.doc.locate(path);
            let span = match find_name(user_source, &variable) {
                Some(byte) => self.place_in_scalar(node, user_source, byte, Some(variable.len())),
                None => Span { start: node.span.start, end: node.span.start },
            };
            self.diagnostics.push(
                Diagnostic::error(
                    Code::TemplateVariable,
                    self.file,
                    span,
                    format!("template uses `{variable}`, which is not defined here"),
                )
                .with_hint(hint),
            );
        }
        for (applied, used) in template::unknown_filters_and_tests(&self.env, &template) {
            let node = self.doc.locate(path);
            let span = match find_name(user_source, &used) {
                Some(byte) => self.place_in_scalar(node, user_source, byte, Some(used.len())),
                None => Span { start: node.span.start, end: node.span.start },
            };
            let kind = match applied {
                template::Applied::Filter => "filter",
                template::Applied::Test => "test",
            };
            self.diagnostics.push(
                Diagnostic::error(
                    Code::TemplateFilter,
                    self.file,
                    span,
                    format!("template applies the {kind} `{used}`, which does not exist"),
                )
                .with_hint(
                    "filters and tests are minijinja's built-ins plus `sha256` and `urldecode`; `hookgate explain H0503`",
                ),
            );
        }
        name
    }
}

pub(crate) fn check_pipeline(
    file: &str,
    source: &str,
    doc: &Node,
    model: Pipeline,
    instances: Option<&Instances>,
) -> (Option<CompiledPipeline>, Vec<Diagnostic>) {
    let mut c = Checker {
        file,
        source,
        doc,
        env: template::environment(),
        diagnostics: Vec::new(),
        payload_uses: Vec::new(),
    };

    if !valid_name(&model.name) {
        c.error(
            Code::InvalidName,
            &path!["name"],
            format!("invalid pipeline name `{}`", model.name),
        )
        .hint = Some(NAME_HINT.into());
    }
    let preset = model.provider.map(ProviderDefaults::of);

    let scheme = check_signature(&mut c, &model, preset.as_ref());
    let preset_in_use = match (&model.signature.scheme, model.provider) {
        (Some(SchemeName::Preset(preset)), _) => Some(*preset),
        (None, Some(provider)) => Some(provider.scheme()),
        _ => None,
    };
    // A sender whose retries keep their first signature (SendGrid) has a longer default.
    let default_tolerance = preset_in_use
        .map_or(hookgate_verify::DEFAULT_TOLERANCE_SECS, Preset::default_tolerance_secs);
    let tolerance_max = TOLERANCE_MAX;
    let tolerance_secs = model.signature.tolerance.map(|t| {
        if t.0 > tolerance_max || t.0.is_zero() {
            c.error(
                Code::OutOfRange,
                &path!["signature", "tolerance"],
                format!("tolerance must be between 1s and {}s", tolerance_max.as_secs()),
            );
        }
        u32::try_from(t.0.as_secs()).unwrap_or(u32::MAX)
    });
    let tolerance_secs = tolerance_secs
        .or((default_tolerance != hookgate_verify::DEFAULT_TOLERANCE_SECS)
            .then_some(default_tolerance));
    // A delivery replayed within the tolerance must still find its key, or it is a new event.
    let tolerance = Duration::from_secs(u64::from(tolerance_secs.unwrap_or(default_tolerance)));
    if model.retention.0 < tolerance && scheme.as_ref().is_some_and(Scheme::has_timestamp) {
        c.error(
            Code::OutOfRange,
            &path!["retention"],
            format!(
                "retention ({}s) is shorter than the signature's tolerance ({}s): a delivery replayed after its key is forgotten would be accepted again as a new event",
                model.retention.0.as_secs(),
                tolerance.as_secs()
            ),
        )
        .hint = Some("keep events at least as long as a signed delivery may be replayed".into());
    }
    let key_fetch = check_key_fetch(&mut c, &model.signature, scheme.as_ref());
    let senders = check_senders(&mut c, &model.signature, scheme.as_ref());
    // How bodies look is the sender's, not its signature's: a provider's own bodies whatever
    // scheme is written out, else a preset scheme's sender's.
    let body_reading = match (model.body_format, model.provider, &model.signature.scheme) {
        (Some(format), _, _) => BodyReading::Fixed(format),
        (None, Some(provider), _) => preset_body_reading(provider.scheme()),
        (None, None, Some(SchemeName::Preset(preset))) => preset_body_reading(*preset),
        (None, None, _) => BodyReading::ByContentType { form: BodyFormat::Form },
    };
    let variant_secrets: Vec<(usize, &Vec<SecretRef>)> = model
        .signature
        .variants
        .iter()
        .flatten()
        .enumerate()
        .filter_map(|(i, v)| v.secrets.as_ref().map(|secrets| (i, secrets)))
        .collect();
    // Every rule needs a key: its own, or the signature's.
    let variants_count = model.signature.variants.as_ref().map_or(1, Vec::len);
    let all_own = !variant_secrets.is_empty()
        && variant_secrets.len() == variants_count
        && variant_secrets.iter().all(|(_, s)| !s.is_empty());
    if model.signature.secrets.is_empty() && key_fetch.is_none() && !all_own {
        c.error_at_key(Code::Secrets, &path!["signature", "secrets"], "at least one secret is needed").hint =
            Some("a pipeline without a secret would accept anyone's deliveries; add `- env: SOME_VARIABLE`".into());
    }
    for (i, own) in &variant_secrets {
        if own.is_empty() {
            c.error(
                Code::Secrets,
                &path!["signature", "variants", *i, "secrets"],
                "`secrets` is empty",
            )
            .hint = Some(
                "list this rule's secrets, or leave `secrets` out to use the signature's".into(),
            );
        }
    }
    let mut secrets: Vec<(SecretRef, Pos)> = model
        .signature
        .secrets
        .iter()
        .enumerate()
        .map(|(i, s)| (s.clone(), doc.locate(&path!["signature", "secrets", i]).span.start))
        .collect();
    let mut secret_use = vec![hookgate_verify::KeyUse::Shared; secrets.len()];
    for (i, own) in &variant_secrets {
        for (j, secret) in own.iter().enumerate() {
            let pos = doc.locate(&path!["signature", "variants", *i, "secrets", j]).span.start;
            secrets.push((secret.clone(), pos));
            secret_use.push(hookgate_verify::KeyUse::Variant(*i));
        }
    }

    let key = match (&model.key, preset.as_ref().map(|p| &p.key)) {
        (Some(source), _) => compile_source(&mut c, &path!["key"], source, false),
        (None, Some(source)) => compile_source(&mut c, &path!["key"], source, false),
        (None, None) => {
            c.error_at_key(Code::MissingField, &path!["key"], "missing field `key`").hint = Some("say where the sender's event id is, e.g. `key: { header: X-Event-Id }`, or set `provider`".into());
            CompiledSource::BodySha256
        }
    };
    let event_type = match (&model.event_type, preset.as_ref().and_then(|p| p.event_type.as_ref()))
    {
        (Some(source), _) | (None, Some(source)) => {
            Some(compile_source(&mut c, &path!["event_type"], source, true))
        }
        (None, None) => None,
    };
    let scope = match (&model.scope, preset.as_ref().and_then(|p| p.scope)) {
        (Some(source), _) => Some(c.template(&path!["scope"], source, REQUEST_VARIABLES)),
        (None, Some(source)) => Some(c.template(&path!["scope"], source, REQUEST_VARIABLES)),
        (None, None) => None,
    };
    let fingerprint = model.fingerprint.clone().unwrap_or(Fingerprint::RawBody);
    if let Fingerprint::Include(pointers) | Fingerprint::Exclude(pointers) = &fingerprint {
        let variant =
            if matches!(fingerprint, Fingerprint::Include(_)) { "include" } else { "exclude" };
        if pointers.is_empty() {
            c.error(
                Code::JsonPointer,
                &path!["fingerprint", variant],
                "list at least one JSON pointer",
            );
        }
        for (i, pointer) in pointers.iter().enumerate() {
            check_pointer(&mut c, &path!["fingerprint", variant, i], pointer);
        }
    }
    let ordering = model.ordering.as_ref().map(|o| {
        if o.max_future.is_some() && o.version_type != VersionType::Timestamp {
            c.error(Code::OutOfRange,
                &path!["ordering", "max_future"],
                "`max_future` bounds timestamp versions; this pipeline's versions are not timestamps",
            );
        }
        CompiledOrdering {
            entity: c.template(&path!["ordering", "entity"], &o.entity, EVENT_VARIABLES),
            version: c.template(&path!["ordering", "version"], &o.version, EVENT_VARIABLES),
            version_type: o.version_type,
            max_future: o.max_future.as_ref().map_or(MAX_FUTURE_DEFAULT, |d| d.0),
        }
    });

    if model.targets.is_empty() {
        c.error_at_key(
            Code::MissingField,
            &path!["targets"],
            "a pipeline needs at least one target",
        );
    }
    let mut target_names: HashMap<String, usize> = HashMap::new();
    let targets = model
        .targets
        .iter()
        .enumerate()
        .map(|(i, target)| {
            if let Some(&first) = target_names.get(&target.name) {
                let first_span = c.doc.locate(&path!["targets", first, "name"]).span;
                let file = c.file;
                let diagnostic = c.error(
                    Code::DuplicateName,
                    &path!["targets", i, "name"],
                    format!("duplicate target name `{}`", target.name),
                );
                diagnostic.hint =
                    Some("target names key evidence and metrics: make each unique".into());
                diagnostic.related.push(crate::diagnostic::Related {
                    file: file.to_owned(),
                    span: first_span,
                    message: "first defined here".into(),
                });
            } else {
                target_names.insert(target.name.clone(), i);
            }
            check_target(&mut c, i, target, instances, model.ordering.is_some())
        })
        .collect();

    let conflict_status = model.conflict_status.unwrap_or(409);
    if !(conflict_status == 409 || (200..300).contains(&conflict_status)) {
        c.error(
            Code::OutOfRange,
            &path!["conflict_status"],
            format!("conflict_status must be 409 or a 2xx, not {conflict_status}"),
        );
    }
    let policy = &model.delivery;
    if policy.attempts_max == 0 || policy.attempts_max > ATTEMPTS_MAX_LIMIT {
        c.error(
            Code::OutOfRange,
            &path!["delivery", "attempts_max"],
            format!("attempts_max must be between 1 and {ATTEMPTS_MAX_LIMIT}"),
        );
    }
    if policy.backoff_initial.0.is_zero() {
        c.error(
            Code::OutOfRange,
            &path!["delivery", "backoff_initial"],
            "backoff_initial must be more than zero",
        );
    }
    if policy.backoff_max.0 < policy.backoff_initial.0 {
        c.error(
            Code::OutOfRange,
            &path!["delivery", "backoff_max"],
            "backoff_max is shorter than backoff_initial",
        );
    }
    if !(0.0..=1.0).contains(&policy.jitter) {
        c.error(Code::OutOfRange, &path!["delivery", "jitter"], "jitter is a fraction from 0 to 1");
    }
    if model.retention.0 < Duration::from_secs(3600) {
        c.error(Code::OutOfRange, &path!["retention"], "retention must be at least 1h").hint = Some(
            "evidence is what operators read when something went wrong; keep it for days".into(),
        );
    }
    if let Some(payload_retention) = model.payload_retention {
        if payload_retention.0 < Duration::from_secs(60) {
            c.error(
                Code::OutOfRange,
                &path!["payload_retention"],
                "payload_retention must be at least 1m",
            )
            .hint = Some("payloads are deleted by a sweep that runs every minute".into());
        } else if payload_retention.0 > model.retention.0 {
            c.error(
                Code::OutOfRange,
                &path!["payload_retention"],
                "payload_retention is longer than retention",
            )
            .hint = Some("an event's payload is deleted with it at the latest; make payload_retention at most retention".into());
        }
    }
    let redact = check_redact(&mut c, &model.redact);
    if !model.redact.source.is_empty() && !model.targets.iter().any(|t| t.refresh.is_some()) {
        let span = c.doc.key_span(&path!["redact", "source"]);
        c.diagnostics.push(
            Diagnostic::warning(
                Code::NoEffect,
                c.file,
                span,
                "`redact.source` has no effect: no target refreshes its source",
            )
            .with_hint("`source` masks members of objects a target's `refresh:` fetches"),
        );
    }

    let public_url = model.public_url.as_ref().map(|url| url.trim_end_matches('/').to_owned());
    if let Some(url) = &public_url {
        let scheme_ok = url.starts_with("https://") || url.starts_with("http://");
        if !scheme_ok
            || url.contains(['?', '#'])
            || url.chars().any(|ch| ch.is_whitespace() || ch.is_control())
        {
            c.error(
                Code::OutOfRange,
                &path!["public_url"],
                format!("`{url}` is not an http(s) URL without query string"),
            )
            .hint = Some("the query string the sender sends is appended as received".into());
        }
    }
    if let Some(scheme) = &scheme
        && public_url.is_some()
        && !scheme.signs_url()
    {
        let span = c.doc.key_span(&path!["public_url"]);
        c.diagnostics.push(Diagnostic::warning(
            Code::NoEffect,
            c.file,
            span,
            format!("`{}` does not sign the URL, so `public_url` has no effect", scheme.name),
        ));
    }
    // Reported with everything else, so that one run shows every problem.
    if let Some(PayloadSchema::Schema(schema)) = &model.payload_schema {
        let shape = Shape::from_schema(schema);
        let found = crate::shape::problems(file, &c.payload_uses, &shape, ShapeSource::Declared);
        c.diagnostics.extend(found);
    }
    let Some(scheme) = scheme else { return (None, c.diagnostics) };
    if c.diagnostics.iter().any(Diagnostic::is_error) {
        return (None, c.diagnostics);
    }
    let compiled = CompiledPipeline {
        file: file.to_owned(),
        name: model.name.clone(),
        name_pos: doc.locate(&path!["name"]).span.start,
        scheme,
        tolerance_secs,
        public_url,
        key_fetch,
        senders,
        body_reading,
        secrets,
        secret_use,
        key,
        scope,
        event_type,
        fingerprint,
        ordering,
        targets,
        conflict_status,
        delivery: model.delivery.clone(),
        retention: model.retention.0,
        payload_retention: model.payload_retention.map(|d| d.0),
        redact,
        env: c.env,
        payload_uses: c.payload_uses,
        payload_from_fixtures: model.payload_schema == Some(PayloadSchema::Fixtures),
    };
    (Some(compiled), c.diagnostics)
}

fn check_signature(
    c: &mut Checker<'_>,
    model: &Pipeline,
    preset: Option<&ProviderDefaults>,
) -> Option<Scheme> {
    let signature = &model.signature;
    let name = match (signature.scheme, preset) {
        (Some(name), _) => name,
        (None, Some(preset)) => preset.scheme,
        (None, None) => {
            c.error_at_key(Code::MissingField, &path!["signature"], "missing field `scheme`").hint =
                Some("name a sender preset (`github`, `stripe`, `twilio`, …), `hmac` or `custom`, or set `provider`".into());
            return None;
        }
    };
    if let (Some(given), Some(preset)) = (signature.scheme, preset)
        && given != preset.scheme
        && !matches!(given, SchemeName::Hmac | SchemeName::Custom)
    {
        let message = format!(
            "scheme `{}` differs from the `{}` the provider uses",
            given.as_str(),
            preset.scheme.as_str()
        );
        let span = c.doc.locate(&path!["signature", "scheme"]).span;
        c.diagnostics.push(Diagnostic::warning(Code::SignatureConflict, c.file, span, message));
    }
    let present = given_fields(signature);
    const HMAC_FIELDS: [&str; 7] =
        ["header", "prefix", "algorithm", "encoding", "signed", "timestamp_header", "separator"];
    const HMAC_ONLY: [&str; 3] = ["signed", "timestamp_header", "separator"];
    for (field, is_present) in present {
        if !is_present {
            continue;
        }
        let allowed = match name {
            SchemeName::Hmac => HMAC_FIELDS.contains(&field),
            SchemeName::Custom => !HMAC_ONLY.contains(&field),
            SchemeName::Preset(_) => false,
        };
        if allowed {
            continue;
        }
        let applies = if HMAC_FIELDS.contains(&field) && !HMAC_ONLY.contains(&field) {
            "`scheme: hmac` and `scheme: custom`"
        } else if HMAC_ONLY.contains(&field) {
            "`scheme: hmac`"
        } else {
            "`scheme: custom`"
        };
        c.error_at_key(
            Code::SignatureConflict,
            &path!["signature", field],
            format!("`{field}` applies only to {applies}"),
        )
        .hint = Some(match name {
            SchemeName::Hmac | SchemeName::Custom => {
                "`hmac` is the short form, `custom` the full language; use the fields of one".into()
            }
            _ => format!("`{}` fixes its own header and format; remove `{field}`", name.as_str()),
        });
    }
    let scheme = match name {
        SchemeName::Hmac => hmac_scheme(c, signature)?,
        SchemeName::Custom => custom_scheme(c, signature)?,
        SchemeName::Preset(preset) => preset.scheme(),
    };
    // Each rule's own problems were reported at the rule; these concern the scheme as a whole.
    for problem in scheme.scheme_problems() {
        c.error_at_key(Code::SignatureConflict, &path!["signature"], problem);
    }
    // SHA-256 can be extended past its end: a digest with the secret anywhere but last lets
    // whoever saw one signature sign more content.
    if scheme.variants.iter().any(|v| {
        v.spec.algorithm == Algorithm::DigestSha256 && v.spec.message.last() != Some(&Part::Secret)
    }) {
        let span = c.doc.key_span(&path!["signature"]);
        c.diagnostics.push(
            Diagnostic::warning(Code::SignatureAlgorithm,
                c.file,
                span,
                format!("`{}` accepts a SHA-256 of the secret and then the content: whoever has seen one delivery can append to its body and compute a valid signature, and nothing dates it, so it can be replayed", name.as_str()),
            )
            .with_hint("prefer an HMAC with a timestamp (for HubSpot, `hubspot-v3`); if the sender offers nothing else, set `body_format` so appended bytes cannot become new fields"),
        );
    }
    if signature.tolerance.is_some() && !scheme.has_timestamp() {
        let span = c.doc.key_span(&path!["signature", "tolerance"]);
        let message =
            format!("`{}` signs no timestamp, so `tolerance` has no effect", name.as_str());
        c.diagnostics.push(Diagnostic::warning(Code::NoEffect, c.file, span, message));
    }
    Some(scheme)
}

/// Hosts AWS SNS serves its signing certificates from: its regional endpoints only (a bare `*`
/// would also match S3's `sns.s3-….amazonaws.com`, where anyone may own a bucket).
const SNS_CERTIFICATE_HOSTS: [&str; 2] =
    ["sns.{region}.amazonaws.com", "sns.{region}.amazonaws.com.cn"];

/// How a sender's bodies are read: fixed where it documents one kind.
fn preset_body_reading(preset: Preset) -> BodyReading {
    match preset {
        Preset::Twilio => BodyReading::Fixed(BodyFormat::Form),
        // A GitHub hook created with `content_type: form` (the API's default) posts
        // `payload=<the JSON document>`, signed over those raw bytes like a JSON body.
        Preset::Github => BodyReading::ByContentType { form: BodyFormat::FormPayload },
        // Slack posts commands as forms and events as JSON.
        Preset::Slack => BodyReading::ByContentType { form: BodyFormat::Form },
        _ => BodyReading::Fixed(BodyFormat::Json),
    }
}

fn check_senders(
    c: &mut Checker<'_>,
    signature: &SignatureConfig,
    scheme: Option<&Scheme>,
) -> Vec<String> {
    if let Some(pointer) = &signature.sender_field {
        check_pointer(c, &path!["signature", "sender_field"], pointer);
    }
    let Some(scheme) = scheme else { return Vec::new() };
    match (&scheme.sender_field, &signature.senders) {
        (Some(_), None) => {
            c.error_at_key(Code::KeyFetching, &path!["signature"], format!("`{}` needs `senders`", scheme.name)).hint =
                Some("everyone with an account signs with the same key; list the senders to trust, e.g. `senders: [arn:aws:sns:us-east-2:123456789012:orders]`".into());
            Vec::new()
        }
        (Some(_), Some(senders)) => {
            if senders.is_empty() {
                c.error(
                    Code::KeyFetching,
                    &path!["signature", "senders"],
                    "`senders` is empty, so every delivery would be refused",
                );
            }
            senders.clone()
        }
        (None, Some(_)) => {
            c.error_at_key(Code::SignatureConflict, &path!["signature", "senders"], format!("`{}` signs no sender to check", scheme.name))
                .hint = Some("`senders` is for schemes whose key senders share (AWS SNS); `scheme: custom` names the member with `sender_field`".into());
            Vec::new()
        }
        (None, None) => Vec::new(),
    }
}

fn check_key_fetch(
    c: &mut Checker<'_>,
    signature: &SignatureConfig,
    scheme: Option<&Scheme>,
) -> Option<KeyFetch> {
    let fetch = signature.fetch_keys.as_ref()?;
    let at = path!["signature", "fetch_keys"];
    let Some(field) = scheme.and_then(|s| s.key_url_field.clone()) else {
        if scheme.is_some() {
            c.error_at_key(Code::SignatureConflict, &at, "this scheme's deliveries name no key to fetch").hint = Some(
                "`fetch_keys` is for senders like AWS SNS; `scheme: custom` names the field with `key_url_field`".into(),
            );
        }
        return None;
    };
    let hosts = match (&fetch.hosts, scheme.map(|s| s.name.as_str())) {
        (Some(hosts), _) => hosts.clone(),
        (None, Some("aws-sns")) => SNS_CERTIFICATE_HOSTS.iter().map(|h| (*h).to_owned()).collect(),
        (None, _) => {
            c.error_at_key(
                Code::KeyFetching,
                &at,
                "`fetch_keys` needs `hosts`, the hosts keys may come from",
            );
            return None;
        }
    };
    for (i, host) in hosts.iter().enumerate() {
        let literal = |label: &str| {
            !label.is_empty() && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        };
        let labels: Vec<&str> = host.split('.').collect();
        let valid = labels.iter().all(|l| *l == "*" || *l == "{region}" || literal(l))
            // A domain of its own at the end: `*.com` or `*.co.uk` would trust anyone. Under a
            // country code (`.cn`, `.uk`), whose second level is often public, three labels.
            && {
                let country = labels.last().is_some_and(|tld| tld.len() == 2);
                let needed = if country { 3 } else { 2 };
                labels.len() >= needed && labels.iter().rev().take(needed).all(|l| literal(l))
            };
        if !valid {
            c.error(Code::KeyFetching, &join(&at, &path!["hosts", i]), format!("`{host}` is not a host name pattern"))
                .hint = Some("DNS labels, `*` for one label or `{region}` for an AWS region, ending in a domain of its own, e.g. `sns.{region}.amazonaws.com`".into());
        }
    }
    let file_prefix =
        scheme.filter(|s| s.name == "aws-sns").map(|_| "SimpleNotificationService-".to_owned());
    Some(KeyFetch { field, hosts, file_prefix })
}

fn signature_header(
    c: &mut Checker<'_>,
    signature: &SignatureConfig,
    scheme: &str,
) -> Option<String> {
    let names = match &signature.header {
        None => {
            c.error_at_key(
                Code::SignatureIncomplete,
                &path!["signature"],
                format!("`scheme: {scheme}` needs `header`"),
            );
            return None;
        }
        Some(HeaderNames::One(name)) => name.clone(),
        Some(HeaderNames::FirstOf(_)) => {
            c.error(
                Code::SignatureConflict,
                &path!["signature", "header"],
                "`scheme: hmac` reads one header",
            )
            .hint = Some("alternative header names need `scheme: custom`".into());
            return None;
        }
    };
    if !valid_header_name(&names) {
        c.error(
            Code::HeaderName,
            &path!["signature", "header"],
            format!("`{names}` is not a valid header name"),
        );
    }
    Some(names)
}

/// Which of the scheme-describing fields of `signature` are given.
fn given_fields(signature: &SignatureConfig) -> [(&'static str, bool); 19] {
    [
        ("header", signature.header.is_some()),
        ("prefix", signature.prefix.is_some()),
        ("algorithm", signature.algorithm.is_some()),
        ("encoding", signature.encoding.is_some()),
        ("signed", signature.signed.is_some()),
        ("timestamp_header", signature.timestamp_header.is_some()),
        ("separator", signature.separator.is_some()),
        ("fields", signature.fields.is_some()),
        ("signature_field", signature.signature_field.is_some()),
        ("body_field", signature.body_field.is_some()),
        ("timestamp", signature.timestamp.is_some()),
        ("message", signature.message.is_some()),
        ("key_format", signature.key_format.is_some()),
        ("body_digest_param", signature.body_digest_param.is_some()),
        ("url_port_variants", signature.url_port_variants.is_some()),
        ("require_body", signature.require_body.is_some()),
        ("variants", signature.variants.is_some()),
        ("key_url_field", signature.key_url_field.is_some()),
        ("sender_field", signature.sender_field.is_some()),
    ]
}

/// `scheme: hmac`: the short form, one header with an HMAC of the body or `timestamp.body`.
fn hmac_scheme(c: &mut Checker<'_>, signature: &SignatureConfig) -> Option<Scheme> {
    let header = signature_header(c, signature, "hmac")?;
    let (timestamp, message) = match signature.signed.unwrap_or(SignedPart::Body) {
        SignedPart::Body => {
            if signature.timestamp_header.is_some() || signature.separator.is_some() {
                c.error_at_key(
                    Code::SignatureIncomplete,
                    &path!["signature", "signed"],
                    "`timestamp_header` and `separator` need `signed: timestamp_body`",
                );
            }
            (None, vec![Part::Body])
        }
        SignedPart::TimestampBody => {
            let Some(timestamp_header) = signature.timestamp_header.clone() else {
                c.error_at_key(
                    Code::SignatureIncomplete,
                    &path!["signature", "signed"],
                    "`signed: timestamp_body` needs `timestamp_header`",
                );
                return None;
            };
            let separator = signature.separator.clone().unwrap_or_else(|| ".".into());
            (
                Some(TimestampSpec {
                    source: TimestampSource::Header(HeaderRef::one(&timestamp_header)),
                    format: TimestampFormat::UnixSeconds,
                    rule: TimestampRule::InclusiveBothWays,
                }),
                vec![Part::Timestamp, Part::Literal(separator), Part::Body],
            )
        }
    };
    let algorithm = match signature.algorithm.unwrap_or(SignatureAlgorithm::Sha256) {
        SignatureAlgorithm::Sha1 | SignatureAlgorithm::HmacSha1 => Algorithm::HmacSha1,
        SignatureAlgorithm::Sha256 | SignatureAlgorithm::HmacSha256 => Algorithm::HmacSha256,
        SignatureAlgorithm::Sha512 | SignatureAlgorithm::HmacSha512 => Algorithm::HmacSha512,
        _ => {
            c.error(
                Code::SignatureIncomplete,
                &path!["signature", "algorithm"],
                "`scheme: hmac` takes `sha1`, `sha256` or `sha512`",
            )
            .hint = Some("other algorithms need `scheme: custom`".into());
            Algorithm::HmacSha256
        }
    };
    Some(Scheme::single(
        "hmac",
        Spec {
            algorithm,
            key_format: KeyFormat::Raw,
            signature: SignatureSource::Header(HeaderRef::one(&header)),
            prefix: signature.prefix.clone().unwrap_or_default(),
            encoding: encoding_of(signature.encoding.unwrap_or(DigestEncoding::Hex)),
            timestamp,
            message,
            require_body: false,
            body_digest_param: None,
            url_port_variants: false,
        },
    ))
}

fn encoding_of(encoding: DigestEncoding) -> Encoding {
    match encoding {
        DigestEncoding::Hex => Encoding::Hex,
        DigestEncoding::Base64 => Encoding::Base64,
        DigestEncoding::Text => Encoding::Text,
    }
}

fn one_char(c: &mut Checker<'_>, path: &[PathSegment], text: &str) -> Option<char> {
    let mut chars = text.chars();
    match (chars.next(), chars.next()) {
        (Some(ch), None) => Some(ch),
        _ => {
            c.error(Code::OutOfRange, path, format!("`{text}` must be exactly one character"));
            None
        }
    }
}

/// The fields of one `custom` rule, whether given at the top of `signature` or in a variant.
struct SpecFields<'a> {
    header: Option<&'a HeaderNames>,
    prefix: Option<&'a String>,
    algorithm: Option<SignatureAlgorithm>,
    encoding: Option<DigestEncoding>,
    fields: Option<&'a FieldsConfig>,
    signature_field: Option<&'a String>,
    body_field: Option<&'a String>,
    timestamp: Option<&'a TimestampConfig>,
    message: Option<&'a Vec<MessagePart>>,
    key_format: Option<KeyFormatName>,
    body_digest_param: Option<&'a String>,
    url_port_variants: Option<bool>,
    require_body: Option<bool>,
}

/// `scheme: custom`: the signature language written out, as one rule or several variants.
fn custom_scheme(c: &mut Checker<'_>, signature: &SignatureConfig) -> Option<Scheme> {
    let Some(variants) = &signature.variants else {
        let top = SpecFields {
            header: signature.header.as_ref(),
            prefix: signature.prefix.as_ref(),
            algorithm: signature.algorithm,
            encoding: signature.encoding,
            fields: signature.fields.as_ref(),
            signature_field: signature.signature_field.as_ref(),
            body_field: signature.body_field.as_ref(),
            timestamp: signature.timestamp.as_ref(),
            message: signature.message.as_ref(),
            key_format: signature.key_format,
            body_digest_param: signature.body_digest_param.as_ref(),
            url_port_variants: signature.url_port_variants,
            require_body: signature.require_body,
        };
        let spec = custom_spec(c, &path!["signature"], &top)?;
        let mut scheme = Scheme::single("custom", spec);
        scheme.key_url_field = signature.key_url_field.clone();
        scheme.sender_field = signature.sender_field.clone();
        return Some(scheme);
    };
    // A rule's own fields; the rest of `signature` (secrets, tolerance, …) is shared.
    const NOT_RULE: [&str; 6] =
        ["signed", "timestamp_header", "separator", "variants", "key_url_field", "sender_field"];
    let beside = given_fields(signature).into_iter().filter(|(field, _)| !NOT_RULE.contains(field));
    for (field, present) in beside {
        if present {
            c.error_at_key(
                Code::SignatureConflict,
                &path!["signature", field],
                format!("`{field}` beside `variants`"),
            )
            .hint = Some("with `variants`, each variant gives its own rule".into());
        }
    }
    if variants.is_empty() {
        c.error(Code::SignatureVariants, &path!["signature", "variants"], "`variants` is empty");
        return None;
    }
    let mut out = Vec::new();
    for (i, variant) in variants.iter().enumerate() {
        let base = path!["signature", "variants", i];
        let when = condition(c, &join(&base, &path!["when"]), &variant.when);
        let fields = SpecFields {
            header: variant.header.as_ref(),
            prefix: variant.prefix.as_ref(),
            algorithm: variant.algorithm,
            encoding: variant.encoding,
            fields: variant.fields.as_ref(),
            signature_field: variant.signature_field.as_ref(),
            body_field: variant.body_field.as_ref(),
            timestamp: variant.timestamp.as_ref(),
            message: variant.message.as_ref(),
            key_format: variant.key_format,
            body_digest_param: variant.body_digest_param.as_ref(),
            url_port_variants: variant.url_port_variants,
            require_body: variant.require_body,
        };
        let spec = custom_spec(c, &base, &fields);
        if let (Some(when), Some(spec)) = (when, spec) {
            out.push(Variant { when, spec });
        }
    }
    if out.len() != variants.len() {
        return None;
    }
    if let Some(i) = out.iter().position(|v| v.when == Condition::Always)
        && i + 1 < out.len()
    {
        let span = c.doc.key_span(&path!["signature", "variants", i + 1]);
        c.diagnostics.push(Diagnostic::warning(
            Code::SignatureVariants,
            c.file,
            span,
            "variants after one that always applies are never used".to_owned(),
        ));
    }
    Some(Scheme {
        name: "custom".into(),
        variants: out,
        key_url_field: signature.key_url_field.clone(),
        sender_field: signature.sender_field.clone(),
    })
}

fn condition(
    c: &mut Checker<'_>,
    path: &[PathSegment],
    when: &ConditionConfig,
) -> Option<Condition> {
    let equals = when.equals.clone();
    let chosen = [
        when.header.is_some(),
        when.query_param.is_some(),
        when.body_field.is_some(),
        when.always == Some(true),
        when.all.is_some(),
    ]
    .iter()
    .filter(|b| **b)
    .count();
    if chosen != 1 {
        c.error_at_key(
            Code::SignatureVariants,
            path,
            "say one of `header`, `query_param`, `body_field`, `all` or `always: true`",
        );
        return None;
    }
    if let Some(all) = &when.all {
        if all.is_empty() {
            c.error(Code::SignatureVariants, &join(path, &path!["all"]), "`all` is empty");
            return None;
        }
        let parts: Vec<Option<Condition>> = all
            .iter()
            .enumerate()
            .map(|(i, part)| condition(c, &join(path, &path!["all", i]), part))
            .collect();
        return parts.into_iter().collect::<Option<Vec<_>>>().map(Condition::All);
    }
    Some(match (&when.header, &when.query_param, &when.body_field) {
        (Some(header), _, _) => match equals {
            Some(value) => Condition::HeaderEquals(header.clone(), value),
            None => Condition::HeaderPresent(header.clone()),
        },
        (_, Some(param), _) => {
            if equals.is_some() {
                c.error_at_key(
                    Code::SignatureConflict,
                    path,
                    "`equals` goes with `header` or `body_field`",
                );
            }
            Condition::QueryParam(param.clone())
        }
        (_, _, Some(pointer)) => {
            check_pointer(c, &join(path, &path!["body_field"]), pointer);
            let Some(value) = equals else {
                c.error_at_key(
                    Code::SignatureVariants,
                    path,
                    "`body_field` needs `equals`, the value it must have",
                );
                return None;
            };
            Condition::BodyField(pointer.clone(), value)
        }
        _ => Condition::Always,
    })
}

fn join(base: &[PathSegment], tail: &[PathSegment]) -> Vec<PathSegment> {
    [base, tail].concat()
}

fn header_ref(c: &mut Checker<'_>, path: &[PathSegment], names: &HeaderNames) -> HeaderRef {
    let names = names.names();
    if names.is_empty() {
        c.error(Code::HeaderName, path, "no header name given");
    }
    for name in &names {
        if !valid_header_name(name) {
            c.error(Code::HeaderName, path, format!("`{name}` is not a valid header name"));
        }
    }
    HeaderRef { names }
}

fn custom_spec(c: &mut Checker<'_>, base: &[PathSegment], spec: &SpecFields<'_>) -> Option<Spec> {
    let at = |field: &str| -> Vec<PathSegment> { [base.to_vec(), vec![field.into()]].concat() };
    // Every field is checked even after one fails, so one run reports every mistake; the
    // rule is built only if none did.
    let mut failed = false;
    let algorithm = match spec.algorithm {
        None => {
            c.error_at_key(Code::SignatureIncomplete, base, "`scheme: custom` needs `algorithm`")
                .hint = Some(
                "e.g. `hmac-sha256`, `hmac-sha1`, `digest-sha256`, `ecdsa-p256-sha256`".into(),
            );
            failed = true;
            Algorithm::HmacSha256
        }
        Some(algorithm) => match algorithm {
            SignatureAlgorithm::HmacSha1 => Algorithm::HmacSha1,
            SignatureAlgorithm::HmacSha256 => Algorithm::HmacSha256,
            SignatureAlgorithm::HmacSha512 => Algorithm::HmacSha512,
            SignatureAlgorithm::DigestSha256 => Algorithm::DigestSha256,
            SignatureAlgorithm::SharedSecret => Algorithm::SharedSecret,
            SignatureAlgorithm::EcdsaP256Sha256 => Algorithm::EcdsaP256Sha256,
            SignatureAlgorithm::RsaSha1 => Algorithm::RsaSha1,
            SignatureAlgorithm::RsaSha256 => Algorithm::RsaSha256,
            short @ (SignatureAlgorithm::Sha1
            | SignatureAlgorithm::Sha256
            | SignatureAlgorithm::Sha512) => {
                let name = match short {
                    SignatureAlgorithm::Sha1 => "sha1",
                    SignatureAlgorithm::Sha256 => "sha256",
                    _ => "sha512",
                };
                c.error(
                    Code::SignatureAlgorithm,
                    &at("algorithm"),
                    format!("`{name}` is ambiguous in `scheme: custom`"),
                )
                .hint = Some(format!(
                    "say `hmac-{name}`, or `digest-sha256` for a plain hash of secret and content"
                ));
                failed = true;
                Algorithm::HmacSha256
            }
        },
    };
    let (signature_source, fields) = match (spec.header, spec.body_field) {
        (Some(_), Some(_)) | (None, None) => {
            c.error_at_key(
                Code::SignatureIncomplete,
                base,
                "say where the signature is: `header` or `body_field`",
            );
            failed = true;
            (SignatureSource::Header(HeaderRef::one("")), None)
        }
        (None, Some(pointer)) => {
            check_pointer(c, &at("body_field"), pointer);
            if spec.fields.is_some() {
                c.error_at_key(
                    Code::SignatureIncomplete,
                    &at("fields"),
                    "`fields` needs a signature `header`",
                );
            }
            (SignatureSource::BodyField(pointer.clone()), None)
        }
        (Some(names), None) => {
            let header = header_ref(c, &at("header"), names);
            match spec.fields {
                None => {
                    if spec.signature_field.is_some() {
                        c.error_at_key(
                            Code::SignatureIncomplete,
                            &at("signature_field"),
                            "`signature_field` needs `fields`",
                        );
                    }
                    (SignatureSource::Header(header), None)
                }
                Some(fields) => {
                    let fields_at = at("fields");
                    let separator =
                        one_char(c, &join(&fields_at, &path!["separator"]), &fields.separator)
                            .unwrap_or_else(|| {
                                failed = true;
                                ','
                            });
                    let assign = match &fields.assign {
                        Some(assign) => one_char(c, &join(&fields_at, &path!["assign"]), assign)
                            .unwrap_or_else(|| {
                                failed = true;
                                '='
                            }),
                        None => '=',
                    };
                    if separator == assign {
                        c.error(
                            Code::SignatureIncomplete,
                            &join(&fields_at, &path!["assign"]),
                            "`assign` must differ from `separator`",
                        );
                    }
                    let name = spec.signature_field.cloned().unwrap_or_else(|| {
                        c.error_at_key(
                            Code::SignatureIncomplete,
                            &fields_at,
                            "`fields` needs `signature_field`, the name of the signature fields",
                        );
                        failed = true;
                        String::new()
                    });
                    let fields = Fields { separator, assign };
                    (SignatureSource::Field { header, fields: fields.clone(), name }, Some(fields))
                }
            }
        }
    };
    let timestamp = match spec.timestamp {
        None => None,
        Some(ts) => {
            let ts_at = at("timestamp");
            let source = match (&ts.header, &ts.field) {
                (Some(names), None) => {
                    TimestampSource::Header(header_ref(c, &join(&ts_at, &path!["header"]), names))
                }
                (None, Some(field)) => {
                    if fields.is_none() {
                        c.error(
                            Code::SignatureIncomplete,
                            &join(&ts_at, &path!["field"]),
                            "a timestamp `field` needs the signature header's `fields`",
                        );
                    }
                    TimestampSource::Field(field.clone())
                }
                _ => {
                    c.error_at_key(
                        Code::SignatureIncomplete,
                        &ts_at,
                        "say either `header` or `field`, not both or neither",
                    );
                    failed = true;
                    TimestampSource::Field(String::new())
                }
            };
            Some(TimestampSpec {
                source,
                format: match ts.format.unwrap_or(TimestampFormatName::Unix) {
                    TimestampFormatName::Unix => TimestampFormat::UnixSeconds,
                    TimestampFormatName::UnixMs => TimestampFormat::UnixMillis,
                    TimestampFormatName::Rfc3339 => TimestampFormat::Rfc3339,
                },
                rule: match ts.rule.unwrap_or(TimestampRuleName::BothWays) {
                    TimestampRuleName::BothWays => TimestampRule::InclusiveBothWays,
                    TimestampRuleName::StrictPast => TimestampRule::StrictPastInclusiveFuture,
                    TimestampRuleName::PastOnly => TimestampRule::PastOnly,
                },
            })
        }
    };
    let message = match spec.message {
        Some(parts) => {
            let mut out = Vec::with_capacity(parts.len());
            for (i, part) in parts.iter().enumerate() {
                out.push(match part {
                    MessagePart::Body => Part::Body,
                    MessagePart::Timestamp => Part::Timestamp,
                    MessagePart::Method => Part::Method,
                    MessagePart::Url => Part::Url,
                    MessagePart::FormSorted => Part::FormSorted,
                    MessagePart::Secret => Part::Secret,
                    MessagePart::Literal(text) => Part::Literal(text.clone()),
                    MessagePart::Header(names) => {
                        Part::Header(header_ref(c, &join(&at("message"), &path![i]), names))
                    }
                    MessagePart::BodyFields(names) => Part::BodyFields(names.clone()),
                });
            }
            out
        }
        None if algorithm == Algorithm::SharedSecret => Vec::new(),
        None => {
            c.error_at_key(
                Code::SignatureIncomplete,
                base,
                "`scheme: custom` needs `message`, what is signed",
            )
            .hint = Some("e.g. `message: [timestamp, { literal: \".\" }, body]`".into());
            failed = true;
            Vec::new()
        }
    };
    let key_format = match spec.key_format {
        Some(KeyFormatName::Raw) => KeyFormat::Raw,
        Some(KeyFormatName::Whsec) => KeyFormat::Whsec,
        Some(KeyFormatName::PublicKey) => KeyFormat::PublicKey,
        Some(KeyFormatName::Certificate) => KeyFormat::Certificate,
        None => match algorithm {
            Algorithm::EcdsaP256Sha256 => KeyFormat::PublicKey,
            Algorithm::RsaSha1 | Algorithm::RsaSha256 => KeyFormat::Certificate,
            _ => KeyFormat::Raw,
        },
    };
    let fits = match key_format {
        KeyFormat::PublicKey => algorithm == Algorithm::EcdsaP256Sha256,
        KeyFormat::Certificate => matches!(algorithm, Algorithm::RsaSha1 | Algorithm::RsaSha256),
        KeyFormat::Raw | KeyFormat::Whsec => !algorithm.is_public_key(),
    };
    if !fits {
        c.error(Code::SignatureAlgorithm, &at("key_format"), format!("{} cannot use this key format", algorithm.name())).hint =
            Some("`public_key` goes with `ecdsa-p256-sha256`, `certificate` with `rsa-*`, `raw` and `whsec` with the others".into());
    }
    let spec = Spec {
        algorithm,
        key_format,
        signature: signature_source,
        prefix: spec.prefix.cloned().unwrap_or_default(),
        encoding: encoding_of(spec.encoding.unwrap_or(if algorithm.is_public_key() {
            DigestEncoding::Base64
        } else {
            DigestEncoding::Hex
        })),
        timestamp,
        message,
        require_body: spec.require_body.unwrap_or(false),
        body_digest_param: spec.body_digest_param.cloned(),
        url_port_variants: spec.url_port_variants.unwrap_or(false),
    };
    if failed {
        return None;
    }
    let problems = Scheme::single("custom", spec.clone()).problems();
    let problem_at = if spec.message.is_empty() { base.to_vec() } else { at("message") };
    for problem in &problems {
        c.error_at_key(Code::SignatureAlgorithm, &problem_at, problem.clone());
    }
    problems.is_empty().then_some(spec)
}

fn valid_header_name(name: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_!#$%&'*+.^`|~".contains(&b))
}

fn compile_source(
    c: &mut Checker<'_>,
    path: &[PathSegment],
    source: &ValueSource,
    is_type: bool,
) -> CompiledSource {
    let mut inner = path.to_vec();
    match source {
        ValueSource::Header(name) => {
            inner.push("header".into());
            if !valid_header_name(name) {
                c.error(Code::HeaderName, &inner, format!("`{name}` is not a valid header name"));
            }
            CompiledSource::Header(name.to_ascii_lowercase())
        }
        ValueSource::Pointer(pointer) => {
            inner.push("pointer".into());
            check_pointer(c, &inner, pointer);
            CompiledSource::Pointer(pointer.clone())
        }
        ValueSource::Template(source) => {
            inner.push("template".into());
            CompiledSource::Template(c.template(&inner, source, REQUEST_VARIABLES))
        }
        ValueSource::BodySha256 | ValueSource::FormSha256 => {
            if is_type {
                c.error(Code::WrongType, path, "the body's hash is not an event type").hint =
                    Some("use `header`, `pointer` or `template`".into());
            }
            if *source == ValueSource::FormSha256 {
                CompiledSource::FormSha256
            } else {
                CompiledSource::BodySha256
            }
        }
    }
}

/// `redact:` pointers and header names, compiled; a pointer without `*` reads a payload
/// field, so it is checked against the payload's type like a template's.
fn check_redact(c: &mut Checker<'_>, redact: &Redact) -> Redaction {
    for (i, pointer) in redact.body.iter().enumerate() {
        let path = path!["redact", "body", i];
        if !pointer.starts_with('/') || pointer == "/" {
            c.error(
                Code::JsonPointer,
                &path,
                format!("`{pointer}` is not a JSON pointer to a member"),
            )
            .hint =
                Some("write the member to mask, e.g. `/customer/email` or `/items/*/card`".into());
        } else if !pointer.contains('*') {
            let span = c.doc.locate(&path).span;
            let rest = &pointer[1..];
            c.payload_uses.push(PayloadUse {
                path: rest.split('/').map(|s| s.replace("~1", "/").replace("~0", "~")).collect(),
                shown: pointer.clone(),
                span,
                place: display_path(&path),
                needed: false,
                guarded: false,
            });
        }
    }
    for (i, name) in redact.headers.iter().enumerate() {
        if !valid_header_name(name) {
            c.error(
                Code::HeaderName,
                &path!["redact", "headers", i],
                format!("`{name}` is not a valid header name"),
            );
        }
    }
    for (i, pointer) in redact.source.iter().enumerate() {
        if !pointer.starts_with('/') || pointer == "/" {
            c.error(
                Code::JsonPointer,
                &path!["redact", "source", i],
                format!("`{pointer}` is not a JSON pointer to a member"),
            );
        }
    }
    Redaction::new(&redact.body, &redact.headers, &redact.source)
}

fn check_pointer(c: &mut Checker<'_>, path: &[PathSegment], pointer: &str) {
    // The key, type and fingerprint read the payload; signature rules read the raw body. A
    // dotted pointer has its own warning, which says what it probably means.
    if let Some(PathSegment::Key(first)) = path.first()
        && ["key", "event_type", "fingerprint"].contains(&first.as_str())
        && let Some(rest) = pointer.strip_prefix('/')
        && !pointer.contains('.')
    {
        let span = c.doc.locate(path).span;
        c.payload_uses.push(PayloadUse {
            path: rest.split('/').map(|s| s.replace("~1", "/").replace("~0", "~")).collect(),
            shown: pointer.to_owned(),
            span,
            place: display_path(path),
            needed: false,
            guarded: false,
        });
    }
    if !pointer.starts_with('/') {
        c.error(Code::JsonPointer, path, format!("`{pointer}` is not a JSON pointer")).hint =
            Some(format!(
                "JSON pointers start with `/`, e.g. `/{}`",
                pointer.trim_start_matches('.').replace('.', "/")
            ));
    } else if pointer.contains('.') {
        // A member name may contain a dot, so this is a warning; usually it is a path written
        // the template way.
        let span = c.doc.locate(path).span;
        c.diagnostics.push(
            Diagnostic::warning(
                Code::DottedPointer,
                c.file,
                span,
                format!("`{pointer}` names one member with a `.` in its name"),
            )
            .with_hint(format!(
                "JSON pointers separate members with `/`: for nested members write `{}`",
                pointer.replace('.', "/")
            )),
        );
    }
}

fn check_target(
    c: &mut Checker<'_>,
    i: usize,
    target: &Target,
    instances: Option<&Instances>,
    has_ordering: bool,
) -> CompiledTarget {
    let connector_kind = match instances {
        None => None,
        Some(instances) => match instances.connectors.get(&target.connector) {
            Some(instance) => Some(instance.kind.clone()),
            None => {
                let names: Vec<&str> = instances.connectors.keys().map(String::as_str).collect();
                let hint = if names.is_empty() {
                    format!("{} defines no connectors", instances.file)
                } else {
                    format!(
                        "{} (defined in {})",
                        suggestion(&target.connector, &names),
                        instances.file
                    )
                };
                c.error(
                    Code::UnknownConnector,
                    &path!["targets", i, "connector"],
                    format!("unknown connector instance `{}`", target.connector),
                )
                .hint = Some(hint);
                None
            }
        },
    };
    let rules = connector_kind.as_ref().and_then(|kind| instances?.rules.get(kind));
    if let Some(rules) = rules {
        for (field, message, hint) in kind_restrictions(rules, target) {
            c.error(Code::ConnectorRule, &path!["targets", i, field], message).hint = Some(hint);
        }
    }
    let when = target.when.as_ref().map(|expression| {
        let path = path!["targets", i, "when"];
        let source = template::condition_template(expression);
        c.template_with_offset(
            &path,
            expression,
            source,
            template::CONDITION_PREFIX.len(),
            EVENT_VARIABLES,
        )
    });
    let external_id_value = c.template(
        &path!["targets", i, "external_id", "value"],
        &target.external_id.value,
        EVENT_VARIABLES,
    );
    let refresh = target.refresh.as_ref().map(|refresh| check_refresh(c, i, refresh, has_ordering));
    // `source` exists only in fields, and only where a refresh fetches it: the external id
    // and `when` are rendered at intake, before anything is fetched.
    let field_variables = if refresh.is_some() { SOURCE_VARIABLES } else { EVENT_VARIABLES };
    let fields = target
        .fields
        .iter()
        .map(|(field, source)| {
            let name =
                c.template(&path!["targets", i, "fields", field.as_str()], source, field_variables);
            (field.clone(), name)
        })
        .collect();
    CompiledTarget {
        name: target.name.clone(),
        connector: target.connector.clone(),
        connector_kind,
        when,
        object: target.object.clone(),
        operation: target.operation,
        external_id_field: target.external_id.field.clone(),
        external_id_value,
        fields,
        refresh,
    }
}

/// Variables of a target's fields when the target refreshes its source.
const SOURCE_VARIABLES: &[&str] = &["payload", "headers", "body", "event", "source"];

/// Longest a refresh may wait for its answer.
const REFRESH_TIMEOUT_MAX: Duration = Duration::from_secs(300);
/// Most bytes a refresh may read.
const REFRESH_BYTES_MAX: usize = 16 * 1024 * 1024;

/// A target's `refresh:`, checked where a mistake could send a request elsewhere or wait
/// forever.
fn check_refresh(
    c: &mut Checker<'_>,
    i: usize,
    refresh: &Refresh,
    has_ordering: bool,
) -> CompiledRefresh {
    let at = |field: &str| -> Vec<PathSegment> { path!["targets", i, "refresh", field].to_vec() };
    let url = c.template(&at("url"), &refresh.url, EVENT_VARIABLES);
    let origin = match refresh_origin(&refresh.url) {
        Ok(origin) => origin,
        Err(problem) => {
            c.error(Code::Refresh, &at("url"), problem).hint = Some(
                "write the scheme and host out, and template only the path or query: `https://api.example.com/v1/customers/{{ payload.id | urlencode }}`".into(),
            );
            String::new()
        }
    };
    // A value rendered raw can add path segments, parameters or a fragment.
    let raw: Vec<&str> = refresh
        .url
        .split("{{")
        .skip(1)
        .filter_map(|rest| rest.split_once("}}").map(|(inner, _)| inner.trim()))
        .filter(|inner| !inner.contains("urlencode"))
        .collect();
    if !raw.is_empty() && !origin.is_empty() {
        let span = c.doc.locate(&at("url")).span;
        c.diagnostics.push(
            Diagnostic::warning(
                Code::Refresh,
                c.file,
                span,
                format!("`{{{{ {} }}}}` is put in the URL as it is", raw.join(" }}`, `{{ ")),
            )
            .with_hint(
                "a value with `/`, `?`, `&` or `#` changes what is fetched: write `| urlencode`",
            ),
        );
    }
    if let Some(host) = origin.strip_prefix("http://")
        && !refresh.allow_plain_http
        && !is_loopback_host(host)
    {
        c.error(
            Code::Refresh,
            &at("url"),
            format!("`{origin}` is plain http to a host that is not loopback"),
        )
        .hint = Some(
            "use https; `allow_plain_http: true` allows http, never for production APIs".into(),
        );
    }
    for name in refresh.headers.keys() {
        if !valid_header_name(name) {
            let path = path!["targets", i, "refresh", "headers", name.as_str()];
            c.error(Code::HeaderName, &path, format!("`{name}` is not a valid header name"));
        }
    }
    let mut secrets = Vec::new();
    for (name, secret) in &refresh.secret_headers {
        let path = path!["targets", i, "refresh", "secret_headers", name.as_str()];
        if !valid_header_name(name) {
            c.error(Code::HeaderName, &path, format!("`{name}` is not a valid header name"));
        }
        secrets.push((secret.clone(), c.doc.locate(&path).span.start));
    }
    match &refresh.auth {
        Some(RefreshAuth::Bearer(secret)) => {
            let pos = c.doc.locate(&path!["targets", i, "refresh", "auth", "bearer"]).span.start;
            secrets.push((secret.clone(), pos));
        }
        Some(RefreshAuth::Basic { username, password }) => {
            if username.is_none() && password.is_none() {
                c.error(
                    Code::Refresh,
                    &path!["targets", i, "refresh", "auth", "basic"],
                    "`basic` needs a `username`, a `password` or both",
                );
            }
            for (name, secret) in [("username", username), ("password", password)] {
                if let Some(secret) = secret {
                    let path = path!["targets", i, "refresh", "auth", "basic", name];
                    secrets.push((secret.clone(), c.doc.locate(&path).span.start));
                }
            }
        }
        Some(RefreshAuth::ApiKey { header, secret }) => {
            if !valid_header_name(header) {
                let path = path!["targets", i, "refresh", "auth", "api_key", "header"];
                c.error(Code::HeaderName, &path, format!("`{header}` is not a valid header name"));
            }
            let path = path!["targets", i, "refresh", "auth", "api_key", "secret"];
            secrets.push((secret.clone(), c.doc.locate(&path).span.start));
        }
        None => {}
    }
    let gone_if = refresh.gone_if.as_ref().map(|expression| {
        let source = template::condition_template(expression);
        let offset = template::CONDITION_PREFIX.len();
        c.template_with_offset(&at("gone_if"), expression, source, offset, SOURCE_VARIABLES)
    });
    let timeout = refresh.timeout.0;
    if timeout < Duration::from_millis(100) || timeout > REFRESH_TIMEOUT_MAX {
        c.error(Code::OutOfRange, &at("timeout"), "a refresh timeout is from 100ms to 5m");
    }
    if refresh.max_bytes == 0 || refresh.max_bytes > REFRESH_BYTES_MAX {
        c.error(
            Code::OutOfRange,
            &at("max_bytes"),
            format!("max_bytes is from 1 to {REFRESH_BYTES_MAX}"),
        );
    }
    if refresh.version.is_some() && !has_ordering {
        let span = c.doc.key_span(&at("version"));
        c.diagnostics.push(
            Diagnostic::warning(
                Code::NoEffect,
                c.file,
                span,
                "`refresh.version` has no effect without `ordering`",
            )
            .with_hint("declare `ordering:` so that writes of one entity are ordered by version"),
        );
    }
    if let Some(pointer) = &refresh.version
        && !pointer.starts_with('/')
    {
        c.error(Code::JsonPointer, &at("version"), format!("`{pointer}` is not a JSON pointer"))
            .hint = Some("the version's place in the fetched object, e.g. `/updated`".into());
    }
    CompiledRefresh {
        url,
        origin,
        method: refresh.method,
        headers: refresh.headers.iter().map(|(n, v)| (n.clone(), v.clone())).collect(),
        secret_headers: refresh
            .secret_headers
            .iter()
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect(),
        auth: refresh.auth.clone(),
        secrets,
        timeout,
        not_found: refresh.not_found,
        gone_if,
        version: refresh.version.clone(),
        max_bytes: refresh.max_bytes,
        allow_plain_http: refresh.allow_plain_http,
    }
}

/// `https://host[:port]` of a refresh URL, which must be written out up to the `/` that ends
/// it, before any template: what a payload renders then lands in the path or the query.
pub(crate) fn refresh_origin(url: &str) -> Result<String, String> {
    let literal_end =
        ["{{", "{%", "{#"].iter().filter_map(|m| url.find(m)).min().unwrap_or(url.len());
    let literal = &url[..literal_end];
    let Some((scheme, rest)) = literal.split_once("://") else {
        return Err(format!("`{url}` does not start with `https://` and a host"));
    };
    if scheme != "https" && scheme != "http" {
        return Err(format!("`{scheme}` is not a scheme a refresh can use: https (or http)"));
    }
    let authority_end = rest.find(['/', '?', '#']);
    let authority = match authority_end {
        Some(end) => &rest[..end],
        None if literal_end == url.len() => rest,
        None => {
            return Err(format!(
                "the host of `{url}` is not written out before its first template"
            ));
        }
    };
    let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    if authority.contains('@') {
        return Err(format!("`{url}` carries credentials in its URL; use `auth`"));
    }
    let valid = !host.is_empty()
        && host.chars().all(|ch| ch.is_ascii_alphanumeric() || "-.:[]".contains(ch));
    if !valid {
        return Err(format!("`{host}` is not a host name"));
    }
    Ok(format!("{scheme}://{}", host.to_ascii_lowercase()))
}

fn is_loopback_host(host: &str) -> bool {
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) && !name.ends_with(':') => {
            name
        }
        _ => host,
    };
    name == "localhost"
        || name == "[::1]"
        || name.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

/// What a connector kind's API documents it cannot do, found before anything runs.
fn kind_restrictions(rules: &[TargetRule], target: &Target) -> Vec<(&'static str, String, String)> {
    let field = &target.external_id.field;
    let mut problems = Vec::new();
    for rule in rules {
        match rule {
            TargetRule::ExternalIdFieldNot { names, message, hint } => {
                if names.iter().any(|name| name.eq_ignore_ascii_case(field)) {
                    problems.push(("external_id", message.clone(), hint.clone()));
                }
            }
            TargetRule::ExternalIdFieldNotInFields { hint } => {
                if target.fields.contains_key(field) {
                    problems.push((
                        "fields",
                        format!("`{field}` is the external-id field and must not be in `fields`"),
                        hint.clone(),
                    ));
                }
            }
            TargetRule::ObjectLowercase { crm } => {
                if target.object.chars().any(|ch| ch.is_ascii_uppercase()) {
                    problems.push((
                        "object",
                        format!("{crm} object types are lowercase, not `{}`", target.object),
                        format!("e.g. `{}`", target.object.to_ascii_lowercase()),
                    ));
                }
            }
        }
    }
    problems
}

/// What a provider fills in besides its scheme.
struct ProviderDefaults {
    scheme: SchemeName,
    key: ValueSource,
    event_type: Option<ValueSource>,
    scope: Option<&'static str>,
}

impl ProviderDefaults {
    fn of(provider: Provider) -> ProviderDefaults {
        let header = |h: &str| ValueSource::Header(h.to_owned());
        let pointer = |p: &str| ValueSource::Pointer(p.to_owned());
        let template = |t: &str| ValueSource::Template(t.to_owned());
        // Svix and Standard Webhooks senders may send either header family; the key is read
        // from the one verification read.
        let standard_id =
            "{{ headers['svix-id'] if 'svix-id' in headers else headers['webhook-id'] }}";
        let (key, event_type, scope) = match provider.0 {
            Preset::Github => (header("X-GitHub-Delivery"), Some(header("X-GitHub-Event")), None),
            Preset::Stripe => (pointer("/id"), Some(pointer("/type")), None),
            Preset::StandardWebhooks | Preset::Svix => {
                (template(standard_id), Some(pointer("/type")), None)
            }
            // Auth hooks carry no type; the pipeline names its hook.
            Preset::SupabaseAuth => (template(standard_id), None, None),
            Preset::Shopify => (
                header("X-Shopify-Webhook-Id"),
                Some(header("X-Shopify-Topic")),
                Some("{{ headers['x-shopify-shop-domain'] }}"),
            ),
            Preset::Slack => {
                (pointer("/event_id"), Some(pointer("/event/type")), Some("{{ payload.team_id }}"))
            }
            // HubSpot batches several events in one array and sends no delivery id header.
            Preset::Hubspot | Preset::HubspotV3 => (
                ValueSource::BodySha256,
                Some(template("{{ payload[0].subscriptionType }}")),
                Some("{{ payload[0].portalId }}"),
            ),
            // Twilio's `I-Twilio-Idempotency-Token` is not signed: a captured request replayed
            // with a new token would be a new event. What is signed is the key instead: the
            // form's parameters (a re-encoding of them verifies too), or the JSON body.
            Preset::Twilio => {
                (ValueSource::FormSha256, None, Some("{{ payload.AccountSid | default('') }}"))
            }
            Preset::TwilioJson => {
                (ValueSource::BodySha256, None, Some("{{ payload.AccountSid | default('') }}"))
            }
            // SendGrid posts a batch of events (an array) and retries the batch whole.
            Preset::Sendgrid => {
                (ValueSource::BodySha256, Some(template("{{ payload[0].event }}")), None)
            }
            Preset::Paddle => (pointer("/event_id"), Some(pointer("/event_type")), None),
            Preset::Square => {
                (pointer("/event_id"), Some(pointer("/type")), Some("{{ payload.merchant_id }}"))
            }
            Preset::Zendesk => {
                (pointer("/id"), Some(pointer("/type")), Some("{{ payload.account_id }}"))
            }
            Preset::Intercom => {
                (pointer("/id"), Some(pointer("/topic")), Some("{{ payload.app_id }}"))
            }
            // Calendly sends no event id: an event is its kind and the resource it is about.
            Preset::Calendly => (
                template("{{ payload.event }} {{ payload.payload.uri }}"),
                Some(pointer("/event")),
                None,
            ),
            // Database webhooks carry no id; a row change is its body.
            Preset::SupabaseDatabase => (
                ValueSource::BodySha256,
                Some(pointer("/type")),
                Some("{{ payload.schema }}.{{ payload.table }}"),
            ),
            Preset::EventbridgeApiKey | Preset::EventbridgeBasic => {
                (pointer("/id"), Some(pointer("/detail-type")), Some("{{ payload.account }}"))
            }
            Preset::AwsSns => {
                (pointer("/MessageId"), Some(pointer("/Type")), Some("{{ payload.TopicArn }}"))
            }
        };
        ProviderDefaults { scheme: SchemeName::Preset(provider.scheme()), key, event_type, scope }
    }
}

pub(crate) fn display_path(path: &[PathSegment]) -> String {
    let mut out = String::new();
    for segment in path {
        match segment {
            PathSegment::Key(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            PathSegment::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// The first place `name` occurs in `text` as a whole name: not inside a longer one
/// (`payload.user` in `payload.user_id` or `payload.users`).
fn find_name(text: &str, name: &str) -> Option<usize> {
    let is_name_char = |c: char| c.is_alphanumeric() || c == '_';
    text.match_indices(name).map(|(i, _)| i).find(|&i| {
        let before = text[..i].chars().next_back();
        let after = text[i + name.len()..].chars().next();
        !before.is_some_and(is_name_char) && !after.is_some_and(is_name_char)
    })
}

/// The byte offset of a position in `source` (lines by `\n`, columns in characters).
fn offset_in(source: &str, pos: Pos) -> Option<usize> {
    let mut line_start = 0;
    for _ in 1..pos.line {
        line_start += source[line_start..].find('\n')? + 1;
    }
    let line = &source[line_start..];
    let line = &line[..line.find('\n').unwrap_or(line.len())];
    let column = usize::try_from(pos.column.checked_sub(1)?).ok()?;
    // One past the last character is the end of the line (where a span may end).
    line.char_indices().map(|(i, _)| i).chain([line.len()]).nth(column).map(|i| line_start + i)
}

/// The position of a byte offset in `source`.
fn pos_in(source: &str, offset: usize) -> Pos {
    let before = &source[..offset];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let to_u32 = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    Pos {
        line: to_u32(before.matches('\n').count() + 1),
        column: to_u32(before[line_start..].chars().count() + 1),
    }
}

impl Checker<'_> {
    /// Where byte `byte` of a scalar's value is in the file. Quoting, escapes, folding, block
    /// indentation and line endings make value and file differ, so the value's text from
    /// there (to the end of its line) is looked for in the scalar's own source, as its n-th
    /// occurrence when the value has it n times before; where it cannot be found (an escape
    /// inside it), the scalar's start, with an empty span. `len` is the length of what is
    /// pointed at, when it is a name.
    fn place_in_scalar(&self, node: &Node, value: &str, byte: usize, len: Option<usize>) -> Span {
        let fallback = Span { start: node.span.start, end: node.span.start };
        let rest = &value[byte.min(value.len())..];
        let needle_end = rest.find('\n').unwrap_or(rest.len());
        let mut needle = &rest[..needle_end];
        if let Some(len) = len {
            needle = &needle[..len.min(needle.len())];
        } else if let Some((cut, _)) = needle.char_indices().nth(24) {
            needle = &needle[..cut];
        }
        if needle.is_empty() {
            return fallback;
        }
        let Some(start) = offset_in(self.source, node.span.start) else { return fallback };
        // A block scalar may end past the file's last line.
        let end = offset_in(self.source, node.span.end).unwrap_or(self.source.len());
        let Some(raw) = self.source.get(start..end.max(start)) else { return fallback };
        let nth = value[..byte.min(value.len())].matches(needle).count();
        match raw.match_indices(needle).nth(nth) {
            Some((at, _)) => {
                let begin = pos_in(self.source, start + at);
                let end = if len.is_some() {
                    pos_in(self.source, start + at + needle.len())
                } else {
                    begin
                };
                Span { start: begin, end }
            }
            None => fallback,
        }
    }
}

/// Where a pipeline may fetch signing keys from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyFetch {
    /// The JSON pointer of the body member that names the key's URL.
    pub field: String,
    /// Host name patterns; `*` is one DNS label, `{region}` an AWS region name.
    pub hosts: Vec<String>,
    /// What the key's file name must start with (AWS SNS: `SimpleNotificationService-`).
    pub file_prefix: Option<String>,
}

impl KeyFetch {
    /// Whether a key may be fetched from `url`: https (http only to a loopback host), no user
    /// information, query or fragment, a `.pem` path, and a host one of the patterns allows.
    pub fn allows(&self, url: &str) -> Result<String, String> {
        let refuse =
            |why: &str| Err(format!("key URL `{}` {why}", crate::evaluate::printable(url, 96)));
        if url.len() > 2048 || url.chars().any(|ch| ch.is_control() || ch.is_whitespace()) {
            return refuse("is not a plain URL");
        }
        let (rest, secure) = if let Some(rest) = url.strip_prefix("https://") {
            (rest, true)
        } else if let Some(rest) = url.strip_prefix("http://") {
            (rest, false)
        } else {
            return refuse("is not https");
        };
        if rest.contains(['@', '\\', '?', '#', '%']) {
            return refuse("has user information, a query, a fragment or an escape");
        }
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (host, port) = match authority.rsplit_once(':') {
            Some((host, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
                (host, Some(port))
            }
            Some(_) => return refuse("has a malformed port"),
            None => (authority, None),
        };
        let host = host.to_ascii_lowercase();
        let loopback = matches!(host.as_str(), "localhost" | "127.0.0.1" | "[::1]");
        if !secure && !loopback {
            return refuse("is not https");
        }
        // Senders' keys live on the default port; any other spelling of the same URL would
        // only make the same key look new.
        if port.is_some() && !loopback {
            return refuse("names a port");
        }
        if !path.ends_with(".pem") || path.contains("..") {
            return refuse("does not name a `.pem` file");
        }
        if let Some(prefix) = &self.file_prefix {
            let stem = path.strip_prefix(prefix.as_str()).and_then(|f| f.strip_suffix(".pem"));
            let hex_name =
                stem.is_some_and(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit()));
            if !hex_name {
                return refuse(&format!("is not a `/{prefix}<hex>.pem` file"));
            }
        }
        if !self.hosts.iter().any(|pattern| host_matches(pattern, &host)) {
            return refuse("is on a host the pipeline does not allow");
        }
        // One spelling per key: the cache is keyed by it.
        let scheme = if secure { "https" } else { "http" };
        Ok(match port {
            Some(port) => format!("{scheme}://{host}:{port}/{path}"),
            None => format!("{scheme}://{host}/{path}"),
        })
    }
}

fn host_matches(pattern: &str, host: &str) -> bool {
    let pattern: Vec<&str> = pattern.split('.').collect();
    let host: Vec<&str> = host.split('.').collect();
    pattern.len() == host.len()
        && pattern.iter().zip(&host).all(|(p, h)| match *p {
            "*" => !h.is_empty() && h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'),
            "{region}" => is_aws_region(h),
            _ => p.eq_ignore_ascii_case(h),
        })
}

/// `us-east-2`, `eu-central-1`, `us-gov-west-1`, `cn-north-1`, `eusc-de-east-1`: two to four
/// letters, one or more words, a number.
fn is_aws_region(label: &str) -> bool {
    let parts: Vec<&str> = label.split('-').collect();
    parts.len() >= 3
        && (2..=4).contains(&parts[0].len())
        && parts[0].bytes().all(|b| b.is_ascii_lowercase())
        && parts[1..parts.len() - 1]
            .iter()
            .all(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase()))
        && parts.last().is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

impl CompiledPipeline {
    /// The pipeline's verifier for these keys, trusting its `senders`.
    pub fn verifier(
        &self,
        keys: &[hookgate_verify::SecretBytes],
    ) -> Result<hookgate_verify::Verifier, hookgate_verify::KeyError> {
        // `keys` are the first of `secrets`, in order (a signer passes one); keys beyond them
        // (fetched per delivery, `fetch_keys`) are shared.
        let key_use: Vec<hookgate_verify::KeyUse> = (0..keys.len())
            .map(|i| self.secret_use.get(i).copied().unwrap_or(hookgate_verify::KeyUse::Shared))
            .collect();
        let mut own_keys: Vec<usize> = self
            .secret_use
            .iter()
            .filter_map(|u| match u {
                hookgate_verify::KeyUse::Variant(v) => Some(*v),
                hookgate_verify::KeyUse::Shared => None,
            })
            .collect();
        own_keys.dedup();
        hookgate_verify::Verifier::with_key_use(
            self.scheme.clone(),
            keys,
            &key_use,
            &own_keys,
            self.tolerance_secs,
        )
        .map(|verifier| verifier.with_senders(self.senders.clone()))
    }

    /// The URL a URL-signing sender signed: the pipeline's `public_url` with the query string
    /// as received, else `received_url` (the gateway's public base, or the Host header).
    pub fn signed_url(&self, received_url: &str) -> String {
        match &self.public_url {
            Some(base) => match received_url.find('?') {
                Some(at) => format!("{base}{}", &received_url[at..]),
                None => base.clone(),
            },
            None => received_url.to_owned(),
        }
    }

    pub fn span_of_name(&self) -> Span {
        Span { start: self.name_pos, end: self.name_pos }
    }
}
