//! Semantic checks: from a deserialized model to a compiled pipeline, reporting every problem
//! with its place in the file.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use hookgate_verify::{Algorithm, Encoding, GenericHmac, Scheme, SignedContent};
use minijinja::Environment;

use crate::diagnostic::{Diagnostic, Pos, Span, suggestion};
use crate::model::{
    ConnectorInstance, ConnectorKind, DigestEncoding, Fingerprint, HashAlgorithm, InstancesFile,
    Operation, Pipeline, Provider, SchemeName, SecretRef, SignedPart, Target, ValueSource,
    VersionType,
};
use crate::template::{self, BUILTIN_FUNCTIONS, EVENT_VARIABLES, REQUEST_VARIABLES};
use crate::yaml::{Node, PathSegment, Style, Value};

/// Pipeline names become URL path segments and database values.
const NAME_CHARS_MAX: usize = 64;
/// A tolerance beyond this makes replay protection meaningless.
const TOLERANCE_MAX: Duration = Duration::from_secs(3600);
const ATTEMPTS_MAX_LIMIT: u32 = 1000;

/// A pipeline ready to serve: model checked, templates compiled, scheme resolved.
#[derive(Debug)]
pub struct CompiledPipeline {
    pub file: String,
    pub name: String,
    pub name_pos: Pos,
    pub scheme: Scheme,
    pub tolerance_secs: Option<u32>,
    /// With the position of each reference, for "unset secret" diagnostics.
    pub secrets: Vec<(SecretRef, Pos)>,
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
    pub(crate) env: Environment<'static>,
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
    pub connector_kind: Option<ConnectorKind>,
    pub when: Option<TemplateName>,
    pub object: String,
    pub operation: Operation,
    pub external_id_field: String,
    pub external_id_value: TemplateName,
    pub fields: Vec<(String, TemplateName)>,
}

/// The connector instances, checked.
#[derive(Debug, Clone, Default)]
pub struct Instances {
    pub file: String,
    pub connectors: BTreeMap<String, ConnectorInstance>,
    /// With the position of each reference, for "unset secret" diagnostics.
    pub secrets: Vec<(SecretRef, Pos)>,
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
        let node = match instance.get(&"settings".into()) {
            Some(settings) => settings.clone(),
            // No `settings:` at all is an empty mapping, checked like one (required settings
            // are then reported at the instance).
            None => Node { span: instance.span, value: Value::Map(Vec::new()) },
        };
        crate::de::from_node::<T>(&self.file, &node).1
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
                    file,
                    name_span,
                    format!("invalid connector name `{}`", instance.name),
                )
                .with_hint(NAME_HINT),
            );
        }
        for key in instance.credentials.keys() {
            let pos = doc.locate(&path!["connectors", i, "credentials", key.as_str()]).span.start;
            secrets.push((instance.credentials[key].clone(), pos));
        }
        if connectors.contains_key(&instance.name) {
            diagnostics.push(Diagnostic::error(
                file,
                name_span,
                format!("duplicate connector name `{}`", instance.name),
            ));
            continue;
        }
        index.insert(instance.name.clone(), i);
        connectors.insert(instance.name.clone(), instance);
    }
    (
        Instances { file: file.to_owned(), connectors, secrets, doc: Some(doc.clone()), index },
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
    doc: &'a Node,
    env: Environment<'static>,
    diagnostics: Vec<Diagnostic>,
}

impl Checker<'_> {
    fn error(&mut self, path: &[PathSegment], message: impl Into<String>) -> &mut Diagnostic {
        let span = self.doc.locate(path).span;
        self.diagnostics.push(Diagnostic::error(self.file, span, message));
        self.diagnostics.last_mut().expect("just pushed")
    }

    fn error_at_key(
        &mut self,
        path: &[PathSegment],
        message: impl Into<String>,
    ) -> &mut Diagnostic {
        let span = self.doc.key_span(path);
        self.diagnostics.push(Diagnostic::error(self.file, span, message));
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
            let pos = position_in_scalar(node, user_source, byte.min(user_source.len()));
            let detail = error.detail().unwrap_or("invalid syntax").to_owned();
            self.diagnostics.push(
                Diagnostic::error(self.file, span, format!("template syntax error: {detail}"))
                    .at(pos)
                    .with_hint("templates use minijinja (Jinja2) syntax: `{{ payload.field }}`"),
            );
            return name;
        }
        let template = self.env.get_template(&name).expect("just added");
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
            let node = self.doc.locate(path);
            let byte = user_source.find(variable.as_str()).unwrap_or(0);
            let pos = position_in_scalar(node, user_source, byte);
            self.diagnostics.push(
                Diagnostic::error(
                    self.file,
                    node.span,
                    format!("template uses `{variable}`, which is not defined here"),
                )
                .at(pos)
                .with_hint(hint),
            );
        }
        name
    }
}

pub(crate) fn check_pipeline(
    file: &str,
    doc: &Node,
    model: Pipeline,
    instances: Option<&Instances>,
) -> (Option<CompiledPipeline>, Vec<Diagnostic>) {
    let mut c = Checker { file, doc, env: template::environment(), diagnostics: Vec::new() };

    if !valid_name(&model.name) {
        c.error(&path!["name"], format!("invalid pipeline name `{}`", model.name)).hint =
            Some(NAME_HINT.into());
    }
    let preset = model.provider.map(Preset::of);

    let scheme = check_signature(&mut c, &model, preset.as_ref());
    let tolerance_secs = model.signature.tolerance.map(|t| {
        if t.0 > TOLERANCE_MAX || t.0.is_zero() {
            c.error(
                &path!["signature", "tolerance"],
                format!("tolerance must be between 1s and {}s", TOLERANCE_MAX.as_secs()),
            );
        }
        u32::try_from(t.0.as_secs()).unwrap_or(u32::MAX)
    });
    if model.signature.secrets.is_empty() {
        c.error_at_key(&path!["signature", "secrets"], "at least one secret is needed").hint =
            Some("a pipeline without a secret would accept anyone's deliveries; add `- env: SOME_VARIABLE`".into());
    }
    let secrets = model
        .signature
        .secrets
        .iter()
        .enumerate()
        .map(|(i, s)| (s.clone(), doc.locate(&path!["signature", "secrets", i]).span.start))
        .collect();

    let key = match (&model.key, preset.as_ref().map(|p| &p.key)) {
        (Some(source), _) => compile_source(&mut c, &path!["key"], source, false),
        (None, Some(source)) => compile_source(&mut c, &path!["key"], source, false),
        (None, None) => {
            c.error(&[], "missing field `key`").hint = Some("say where the sender's event id is, e.g. `key: { header: X-Event-Id }`, or set `provider`".into());
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
            c.error(&path!["fingerprint", variant], "list at least one JSON pointer");
        }
        for (i, pointer) in pointers.iter().enumerate() {
            check_pointer(&mut c, &path!["fingerprint", variant, i], pointer);
        }
    }
    let ordering = model.ordering.as_ref().map(|o| {
        if o.max_future.is_some() && o.version_type != VersionType::Timestamp {
            c.error(
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
        c.error_at_key(&path!["targets"], "a pipeline needs at least one target");
    }
    let mut target_names = HashSet::new();
    let targets = model
        .targets
        .iter()
        .enumerate()
        .map(|(i, target)| {
            if !target_names.insert(target.name.clone()) {
                c.error(
                    &path!["targets", i, "name"],
                    format!("duplicate target name `{}`", target.name),
                );
            }
            check_target(&mut c, i, target, instances)
        })
        .collect();

    let conflict_status = model.conflict_status.unwrap_or(409);
    if !(conflict_status == 409 || (200..300).contains(&conflict_status)) {
        c.error(
            &path!["conflict_status"],
            format!("conflict_status must be 409 or a 2xx, not {conflict_status}"),
        );
    }
    let policy = &model.delivery;
    if policy.attempts_max == 0 || policy.attempts_max > ATTEMPTS_MAX_LIMIT {
        c.error(
            &path!["delivery", "attempts_max"],
            format!("attempts_max must be between 1 and {ATTEMPTS_MAX_LIMIT}"),
        );
    }
    if policy.backoff_initial.0.is_zero() {
        c.error(&path!["delivery", "backoff_initial"], "backoff_initial must be more than zero");
    }
    if policy.backoff_max.0 < policy.backoff_initial.0 {
        c.error(&path!["delivery", "backoff_max"], "backoff_max is shorter than backoff_initial");
    }
    if !(0.0..=1.0).contains(&policy.jitter) {
        c.error(&path!["delivery", "jitter"], "jitter is a fraction from 0 to 1");
    }
    if model.retention.0 < Duration::from_secs(3600) {
        c.error(&path!["retention"], "retention must be at least 1h").hint = Some(
            "evidence is what operators read when something went wrong; keep it for days".into(),
        );
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
        secrets,
        key,
        scope,
        event_type,
        fingerprint,
        ordering,
        targets,
        conflict_status,
        delivery: model.delivery.clone(),
        retention: model.retention.0,
        env: c.env,
    };
    (Some(compiled), c.diagnostics)
}

fn check_signature(
    c: &mut Checker<'_>,
    model: &Pipeline,
    preset: Option<&Preset>,
) -> Option<Scheme> {
    let signature = &model.signature;
    let name = match (signature.scheme, preset) {
        (Some(name), _) => name,
        (None, Some(preset)) => preset.scheme,
        (None, None) => {
            c.error_at_key(&path!["signature"], "missing field `scheme`").hint =
                Some("name the scheme (`github`, `stripe`, `standard-webhooks`, `svix`, `shopify`, `slack`, `hubspot-v3`, `hmac`) or set `provider`".into());
            return None;
        }
    };
    if let (Some(given), Some(preset)) = (signature.scheme, preset)
        && given != preset.scheme
    {
        let message = format!(
            "scheme `{}` differs from the `{}` the provider uses",
            given.as_str(),
            preset.scheme.as_str()
        );
        let span = c.doc.locate(&path!["signature", "scheme"]).span;
        c.diagnostics.push(Diagnostic::warning(c.file, span, message));
    }
    let generic_only: [(&str, bool); 7] = [
        ("header", signature.header.is_some()),
        ("prefix", signature.prefix.is_some()),
        ("algorithm", signature.algorithm.is_some()),
        ("encoding", signature.encoding.is_some()),
        ("signed", signature.signed.is_some()),
        ("timestamp_header", signature.timestamp_header.is_some()),
        ("separator", signature.separator.is_some()),
    ];
    if name != SchemeName::Hmac {
        for (field, present) in generic_only {
            if present {
                c.error_at_key(
                    &path!["signature", field],
                    format!("`{field}` applies only to `scheme: hmac`"),
                )
                .hint = Some(format!(
                    "`{}` fixes its own header and format; remove `{field}`",
                    name.as_str()
                ));
            }
        }
    }
    let scheme = match name {
        SchemeName::Github => Scheme::Github,
        SchemeName::Stripe => Scheme::Stripe,
        SchemeName::StandardWebhooks | SchemeName::Svix => Scheme::StandardWebhooks,
        SchemeName::Shopify => Scheme::Shopify,
        SchemeName::Slack => Scheme::Slack,
        SchemeName::HubspotV3 => Scheme::HubspotV3,
        SchemeName::Hmac => {
            let Some(header) = signature.header.clone() else {
                c.error_at_key(&path!["signature"], "`scheme: hmac` needs `header`");
                return None;
            };
            if !valid_header_name(&header) {
                c.error(
                    &path!["signature", "header"],
                    format!("`{header}` is not a valid header name"),
                );
            }
            let signed = match signature.signed.unwrap_or(SignedPart::Body) {
                SignedPart::Body => {
                    if signature.timestamp_header.is_some() || signature.separator.is_some() {
                        c.error_at_key(
                            &path!["signature", "signed"],
                            "`timestamp_header` and `separator` need `signed: timestamp_body`",
                        );
                    }
                    SignedContent::Body
                }
                SignedPart::TimestampBody => {
                    let Some(timestamp_header) = signature.timestamp_header.clone() else {
                        c.error_at_key(
                            &path!["signature", "signed"],
                            "`signed: timestamp_body` needs `timestamp_header`",
                        );
                        return None;
                    };
                    SignedContent::TimestampAndBody {
                        timestamp_header,
                        separator: signature.separator.clone().unwrap_or_else(|| ".".into()),
                    }
                }
            };
            Scheme::Hmac(GenericHmac {
                header,
                prefix: signature.prefix.clone().unwrap_or_default(),
                algorithm: match signature.algorithm.unwrap_or(HashAlgorithm::Sha256) {
                    HashAlgorithm::Sha256 => Algorithm::Sha256,
                    HashAlgorithm::Sha512 => Algorithm::Sha512,
                },
                encoding: match signature.encoding.unwrap_or(DigestEncoding::Hex) {
                    DigestEncoding::Hex => Encoding::Hex,
                    DigestEncoding::Base64 => Encoding::Base64,
                },
                signed,
            })
        }
    };
    if signature.tolerance.is_some()
        && scheme.timestamp_rule() == hookgate_verify::TimestampRule::None
    {
        let span = c.doc.key_span(&path!["signature", "tolerance"]);
        let message =
            format!("`{}` signs no timestamp, so `tolerance` has no effect", name.as_str());
        c.diagnostics.push(Diagnostic::warning(c.file, span, message));
    }
    Some(scheme)
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
                c.error(&inner, format!("`{name}` is not a valid header name"));
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
        ValueSource::BodySha256 => {
            if is_type {
                c.error(path, "the body's hash is not an event type").hint =
                    Some("use `header`, `pointer` or `template`".into());
            }
            CompiledSource::BodySha256
        }
    }
}

fn check_pointer(c: &mut Checker<'_>, path: &[PathSegment], pointer: &str) {
    if !pointer.starts_with('/') {
        c.error(path, format!("`{pointer}` is not a JSON pointer")).hint = Some(format!(
            "JSON pointers start with `/`, e.g. `/{}`",
            pointer.trim_start_matches('.').replace('.', "/")
        ));
    }
}

fn check_target(
    c: &mut Checker<'_>,
    i: usize,
    target: &Target,
    instances: Option<&Instances>,
) -> CompiledTarget {
    let connector_kind = match instances {
        None => None,
        Some(instances) => match instances.connectors.get(&target.connector) {
            Some(instance) => Some(instance.kind),
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
                    &path!["targets", i, "connector"],
                    format!("unknown connector instance `{}`", target.connector),
                )
                .hint = Some(hint);
                None
            }
        },
    };
    if let Some(kind) = connector_kind {
        for (field, message, hint) in kind_restrictions(kind, target) {
            c.error(&path!["targets", i, field], message).hint = Some(hint);
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
    let fields = target
        .fields
        .iter()
        .map(|(field, source)| {
            let name =
                c.template(&path!["targets", i, "fields", field.as_str()], source, EVENT_VARIABLES);
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
    }
}

/// What a connector kind's API documents it cannot do, found before anything runs.
fn kind_restrictions(kind: ConnectorKind, target: &Target) -> Vec<(&'static str, String, String)> {
    let mut problems = Vec::new();
    let field = &target.external_id.field;
    match kind {
        ConnectorKind::Salesforce => {
            if field.eq_ignore_ascii_case("id") {
                problems.push(("external_id", "Salesforce cannot upsert by `Id`".to_owned(), "PATCH on `sobjects/{object}/Id` is refused (METHOD_NOT_ALLOWED); use an external-id field such as `Ext_Id__c`".to_owned()));
            }
            if target.fields.contains_key(field) {
                problems.push(("fields", format!("`{field}` is the external-id field and must not be in `fields`"), "Salesforce rejects an upsert whose body repeats the external-id field; it is taken from the URL".to_owned()));
            }
        }
        ConnectorKind::Hubspot => {
            if field == "hs_object_id" {
                problems.push(("external_id", "HubSpot cannot upsert by `hs_object_id`".to_owned(), "batch upsert needs a property with unique values (`hasUniqueValue: true`), e.g. `email` for contacts or a custom unique property".to_owned()));
            }
            if target.object.chars().any(|ch| ch.is_ascii_uppercase()) {
                problems.push((
                    "object",
                    format!("HubSpot object types are lowercase, not `{}`", target.object),
                    format!("e.g. `{}`", target.object.to_ascii_lowercase()),
                ));
            }
        }
        ConnectorKind::Mock | ConnectorKind::Plugin => {}
    }
    problems
}

/// What a provider preset fills in.
struct Preset {
    scheme: SchemeName,
    key: ValueSource,
    event_type: Option<ValueSource>,
    scope: Option<&'static str>,
}

impl Preset {
    fn of(provider: Provider) -> Preset {
        let header = |h: &str| ValueSource::Header(h.to_owned());
        let pointer = |p: &str| ValueSource::Pointer(p.to_owned());
        match provider {
            Provider::Github => Preset {
                scheme: SchemeName::Github,
                key: header("X-GitHub-Delivery"),
                event_type: Some(header("X-GitHub-Event")),
                scope: None,
            },
            Provider::Stripe => Preset {
                scheme: SchemeName::Stripe,
                key: pointer("/id"),
                event_type: Some(pointer("/type")),
                scope: None,
            },
            Provider::StandardWebhooks => Preset {
                scheme: SchemeName::StandardWebhooks,
                key: header("webhook-id"),
                event_type: Some(pointer("/type")),
                scope: None,
            },
            Provider::Svix => Preset {
                scheme: SchemeName::Svix,
                key: header("svix-id"),
                event_type: Some(pointer("/type")),
                scope: None,
            },
            Provider::Shopify => Preset {
                scheme: SchemeName::Shopify,
                key: header("X-Shopify-Webhook-Id"),
                event_type: Some(header("X-Shopify-Topic")),
                scope: Some("{{ headers['x-shopify-shop-domain'] }}"),
            },
            Provider::Slack => Preset {
                scheme: SchemeName::Slack,
                key: pointer("/event_id"),
                event_type: Some(pointer("/event/type")),
                scope: Some("{{ payload.team_id }}"),
            },
            // HubSpot batches several events in one array and sends no delivery id header.
            Provider::Hubspot => Preset {
                scheme: SchemeName::HubspotV3,
                key: ValueSource::BodySha256,
                event_type: Some(ValueSource::Template(
                    "{{ payload[0].subscriptionType }}".to_owned(),
                )),
                scope: Some("{{ payload[0].portalId }}"),
            },
        }
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

/// Maps a byte offset inside a scalar's value to a position in the file. Exact for
/// single-line scalars and literal blocks; otherwise the scalar's start.
fn position_in_scalar(node: &Node, value: &str, byte: usize) -> Pos {
    let start = node.span.start;
    let Value::Scalar { style, .. } = &node.value else { return start };
    let before = &value[..byte.min(value.len())];
    let line_in_value = before.matches('\n').count();
    let column_in_line = before.rsplit('\n').next().map(|s| s.chars().count()).unwrap_or(0);
    let to_u32 = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    match style {
        Style::Plain if line_in_value == 0 => {
            Pos { line: start.line, column: start.column + to_u32(column_in_line) }
        }
        Style::SingleQuoted | Style::DoubleQuoted
            if line_in_value == 0 && !value.contains(['\\', '\'']) =>
        {
            Pos { line: start.line, column: start.column + 1 + to_u32(column_in_line) }
        }
        // A literal block's content starts on the line after the `|`, indented by two more
        // columns than the key in the conventional layout.
        Style::Literal => Pos {
            line: start.line + 1 + to_u32(line_in_value),
            column: start.column + to_u32(column_in_line),
        },
        _ => start,
    }
}

impl CompiledPipeline {
    pub fn span_of_name(&self) -> Span {
        Span { start: self.name_pos, end: self.name_pos }
    }
}
