//! The connector registry: every kind this build knows (one line per in-tree connector) and
//! the plugins `hookgate.yaml` names, checked, built into running connectors, and described
//! by schemas. The only place that maps a kind to its code.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use hookgate_connector::{
    BoxFuture, CallLimits, ConfigError, Connector, Credentials, Kind, KindDescription, RateLimit,
    Secret, TargetRule, describe_kind,
};
use hookgate_connector_hubspot::HubSpot;
use hookgate_connector_mock::MockCrm;
use hookgate_connector_salesforce::Salesforce;
use hookgate_engine::{Budgets, Connectors};
use hookgate_pipeline::{
    Code, Diagnostic, Instances, suggestion, variant_suggestion, with_references_resolved,
};
use hookgate_plugin::host::{Limits, Plugin};

use crate::output::Format;
use crate::secrets::Resolver;

/// The kinds of one configuration: in-tree connectors, then its plugins.
#[derive(Debug)]
pub struct Registry {
    kinds: BTreeMap<String, Entry>,
}

#[derive(Debug)]
struct Entry {
    description: KindDescription,
    origin: Origin,
}

/// Settings as written in `hookgate.yaml`.
type Settings = BTreeMap<String, serde_json::Value>;

/// Builds an in-tree connector from its settings and credentials.
type CreateFn =
    fn(&Settings, &Credentials) -> BoxFuture<'static, Result<Arc<dyn Connector>, ConfigError>>;

/// Where a kind's code lives.
enum Origin {
    InTree {
        check: fn(&Instances, &str) -> Vec<Diagnostic>,
        validate: fn(&Settings) -> Result<(), ConfigError>,
        credentials: fn(&BTreeMap<String, serde_json::Value>) -> Vec<String>,
        create: CreateFn,
    },
    Plugin(Arc<Plugin>),
}

impl std::fmt::Debug for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::InTree { .. } => f.write_str("in-tree"),
            Origin::Plugin(plugin) => write!(f, "plugin {}", plugin.path().display()),
        }
    }
}

fn check_typed<K: Kind>(instances: &Instances, name: &str) -> Vec<Diagnostic> {
    instances.check_settings::<K::Settings>(name)
}

fn create_typed<K: Kind>(
    settings: &BTreeMap<String, serde_json::Value>,
    credentials: &Credentials,
) -> BoxFuture<'static, Result<Arc<dyn Connector>, ConfigError>> {
    let created = K::create(settings, credentials);
    Box::pin(async move { Ok(Arc::new(created.await?) as Arc<dyn Connector>) })
}

impl Registry {
    /// The kinds built into hookgate. Adding an in-tree connector is one line here (and its
    /// crate in `Cargo.toml`).
    pub fn in_tree() -> Registry {
        let mut registry = Registry { kinds: BTreeMap::new() };
        registry.add::<MockCrm>();
        registry.add::<Salesforce>();
        registry.add::<HubSpot>();
        registry.add::<hookgate_connector_rest::Rest>();
        registry
    }

    fn add<K: Kind>(&mut self) {
        let description = describe_kind::<K>();
        let code = Origin::InTree {
            check: check_typed::<K>,
            validate: K::validate,
            credentials: K::required_credentials,
            create: create_typed::<K>,
        };
        self.kinds.insert(description.kind.clone(), Entry { description, origin: code });
    }

    /// The in-tree kinds and the plugins `instances` names, with a located error for each
    /// plugin that cannot be used.
    pub fn load(instances: Option<&Instances>) -> (Registry, Vec<Diagnostic>) {
        let mut registry = Registry::in_tree();
        let mut diagnostics = Vec::new();
        let Some(instances) = instances else { return (registry, diagnostics) };
        let base = Path::new(&instances.file).parent().unwrap_or(Path::new(""));
        for (written, span) in &instances.plugin_directories {
            let problem = |message: String, hint: &str| {
                Diagnostic::error(Code::Plugin, &instances.file, *span, message).with_hint(hint)
            };
            let directory = base.join(written);
            let libraries = match plugin_libraries(&directory) {
                Ok(libraries) => libraries,
                Err(message) => {
                    diagnostics.push(problem(
                        message,
                        "a plugin directory exists, only its owner may write to it and its libraries, and each library is a file inside it",
                    ));
                    continue;
                }
            };
            for library in libraries {
                let plugin = match load_within(&library, PLUGIN_LOAD_TIMEOUT) {
                    Ok(plugin) => plugin,
                    Err(error) => {
                        diagnostics.push(problem(
                            error.to_string(),
                            "remove it from the directory, or rebuild it with `hookgate_plugin::export_connector!`",
                        ));
                        continue;
                    }
                };
                let kind = plugin.description().kind.clone();
                if let Some(taken) = registry.kinds.get(&kind) {
                    let by = match &taken.origin {
                        Origin::InTree { .. } => "an in-tree connector".to_owned(),
                        Origin::Plugin(other) => other.path().display().to_string(),
                    };
                    diagnostics.push(problem(
                        format!("{}: kind `{kind}` is already provided by {by}", library.display()),
                        "each kind comes from one place: rename the plugin's kind or remove one",
                    ));
                    continue;
                }
                let description = plugin.description().clone();
                registry
                    .kinds
                    .insert(kind, Entry { description, origin: Origin::Plugin(Arc::new(plugin)) });
            }
        }
        (registry, diagnostics)
    }

    /// What each kind's API cannot do, for the pipeline checks.
    pub fn rules(&self) -> BTreeMap<String, Vec<TargetRule>> {
        self.kinds
            .iter()
            .map(|(kind, entry)| (kind.clone(), entry.description.rules.clone()))
            .collect()
    }

    /// Each kind: its description, and the plugin library it comes from (`None`: in-tree).
    pub fn kinds(&self) -> impl Iterator<Item = (&KindDescription, Option<&Path>)> {
        self.kinds.values().map(|entry| {
            let path = match &entry.origin {
                Origin::InTree { .. } => None,
                Origin::Plugin(plugin) => Some(plugin.path()),
            };
            (&entry.description, path)
        })
    }

    /// Checks every instance's kind, settings and credentials, with locations. References in
    /// settings are resolved with `resolver` where they can be (an unset one is reported on
    /// its own and checked as an empty string).
    pub fn check(&self, instances: &Instances, resolver: &Resolver) -> Vec<Diagnostic> {
        let mut diagnostics = Vec::new();
        for (name, instance) in &instances.connectors {
            let Some(entry) = self.kinds.get(&instance.kind) else {
                let known: Vec<&str> = self.kinds.keys().map(String::as_str).collect();
                diagnostics.push(
                    Diagnostic::error(
                        Code::UnknownConnectorKind,
                        &instances.file,
                        instances.kind_span(name),
                        format!("connector `{name}`: no connector provides kind `{}`", instance.kind),
                    )
                    .with_hint(format!(
                        "{}; a plugin's kind needs its library in `plugins.directories` (`hookgate connectors` lists the kinds)",
                        variant_suggestion(&instance.kind, &known)
                    )),
                );
                continue;
            };
            let required = match &entry.origin {
                Origin::InTree { check, validate, credentials, .. } => {
                    let found = check(instances, name);
                    // Settings the schema accepts, every reference in them set: the kind
                    // says what else `serve` would refuse in them.
                    if found.is_empty()
                        && let Ok(settings) = strictly_resolved(&instance.settings, resolver)
                        && let Err(error) = validate(&settings)
                    {
                        diagnostics.push(refused_instance(instances, name, &error));
                    }
                    diagnostics.extend(found);
                    credentials(&instance.settings)
                }
                Origin::Plugin(plugin) => {
                    let Ok(settings) = resolved_settings(&instance.settings, resolver);
                    let found =
                        check_against_schema(instances, name, &settings, &entry.description);
                    let required: Vec<&str> =
                        entry.description.credentials.iter().map(String::as_str).collect();
                    let missing = instances.check_credentials(name, &required);
                    // Settings the schema accepts and every credential at hand: the plugin
                    // itself says whether it can build the instance, before `serve` does.
                    if found.is_empty()
                        && missing.is_empty()
                        && let Some(credentials) = credentials_at_hand(instance, resolver)
                        && let Ok(settings) = strictly_resolved(&instance.settings, resolver)
                        && let Err(error) = plugin.try_create(&settings, &credentials)
                    {
                        diagnostics.push(refused_instance(instances, name, &error));
                    }
                    diagnostics.extend(found);
                    diagnostics.extend(missing);
                    continue;
                }
            };
            let required: Vec<&str> = required.iter().map(String::as_str).collect();
            diagnostics.extend(instances.check_credentials(name, &required));
        }
        diagnostics
    }

    /// Each instance's budget: its own `limits`, else what its kind publishes.
    pub fn limits(&self, instances: &Instances) -> Budgets {
        instances
            .connectors
            .iter()
            .map(|(name, instance)| (name.clone(), self.limits_of(instance)))
            .collect()
    }

    fn limits_of(&self, instance: &hookgate_pipeline::model::ConnectorInstance) -> CallLimits {
        let published = self.kinds.get(&instance.kind).map(|e| e.description.limits);
        let declared = instance.limits.as_ref().and_then(|limits| limits.rate.as_ref());
        match declared {
            Some(rate) => {
                CallLimits { rate: Some(RateLimit { calls: rate.calls, per: rate.per.0 }) }
            }
            None => published.unwrap_or_default(),
        }
    }

    /// Builds every instance, resolving its credentials. `call_timeout` bounds each call
    /// into a plugin.
    pub async fn build(
        &self,
        instances: &Instances,
        resolver: &Resolver,
        call_timeout: std::time::Duration,
    ) -> Result<Connectors> {
        let (max_calls_in_flight, max_answer_bytes) = instances.plugin_limits;
        let limits =
            Limits { call_timeout, max_calls_in_flight, max_answer_bytes, ..Limits::default() };
        let mut connectors = Connectors::new();
        for (name, instance) in &instances.connectors {
            // Located like a `check` diagnostic: a failing create is an error of this instance.
            let at = instances.kind_span(name).start;
            let connector =
                self.build_one(instances, instance, resolver, limits).await.with_context(|| {
                    format!(
                        "{}:{}:{}: connector instance `{name}`",
                        instances.file, at.line, at.column
                    )
                })?;
            connectors.insert(name.clone(), connector);
        }
        Ok(connectors)
    }

    async fn build_one(
        &self,
        instances: &Instances,
        instance: &hookgate_pipeline::model::ConnectorInstance,
        resolver: &Resolver,
        limits: Limits,
    ) -> Result<Arc<dyn Connector>> {
        let mut credentials = Credentials::new();
        for (name, reference) in &instance.credentials {
            let value =
                resolver.resolve(reference).with_context(|| format!("credential `{name}`"))?;
            let text = String::from_utf8(value.expose().to_vec())
                .with_context(|| format!("credential `{name}` is not UTF-8"))?;
            credentials.insert(name.clone(), Secret::new(text));
        }
        let Some(entry) = self.kinds.get(&instance.kind) else {
            bail!("no connector provides kind `{}`", instance.kind);
        };
        let settings = with_references_resolved(&instance.settings, &mut |reference| {
            let value =
                resolver.resolve(reference).with_context(|| format!("settings: {reference}"))?;
            String::from_utf8(value.expose().to_vec())
                .with_context(|| format!("settings: {reference} is not UTF-8"))
        })?;
        let settings = anchored(settings, &entry.description.file_settings, instances);
        Ok(match &entry.origin {
            Origin::InTree { create, .. } => create(&settings, &credentials).await?,
            Origin::Plugin(plugin) => {
                Arc::new(plugin.create(&settings, &credentials, limits).await?)
            }
        })
    }

    /// The JSON Schema of each in-tree kind's `settings`, as committed under
    /// `schemas/connectors/`.
    pub fn settings_schemas(&self) -> Vec<(String, String)> {
        self.kinds
            .values()
            .filter(|entry| matches!(entry.origin, Origin::InTree { .. }))
            .map(|entry| {
                let mut text = serde_json::to_string_pretty(&entry.description.settings_schema)
                    .expect("schemas serialise");
                text.push('\n');
                (format!("{}.settings.schema.json", entry.description.kind), text)
            })
            .collect()
    }
}

/// How long a plugin may take to load and describe itself.
const PLUGIN_LOAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Loads a plugin on a thread of its own, so that a library whose initialiser or `describe`
/// never returns is an error, not a hung `check` or start. (That thread is then left behind.)
fn load_within(
    library: &Path,
    timeout: std::time::Duration,
) -> Result<Plugin, Box<dyn std::error::Error + Send + Sync>> {
    let (sender, receiver) = std::sync::mpsc::channel();
    let path = library.to_path_buf();
    std::thread::Builder::new().name("hookgate-plugin-load".into()).spawn(move || {
        let _ = sender.send(Plugin::load(&path));
    })?;
    match receiver.recv_timeout(timeout) {
        Ok(loaded) => Ok(loaded?),
        Err(_) => Err(format!(
            "{}: did not load and describe itself within {timeout:?}",
            library.display()
        )
        .into()),
    }
}

/// The libraries in a plugin directory, each resolved and refused if it leaves the directory
/// or others may replace it.
fn plugin_libraries(directory: &Path) -> Result<Vec<PathBuf>, String> {
    let shown = directory.display();
    let canonical =
        directory.canonicalize().map_err(|e| format!("plugin directory {shown}: {e}"))?;
    let entries =
        std::fs::read_dir(&canonical).map_err(|e| format!("plugin directory {shown}: {e}"))?;
    writable_by_others(&canonical).map_err(|why| format!("plugin directory {shown} {why}"))?;
    let mut libraries = Vec::new();
    for entry in entries {
        let found = entry.map_err(|e| format!("plugin directory {shown}: {e}"))?.path();
        // Named as the configuration names it, not by where the directory resolves.
        let path = directory.join(found.file_name().unwrap_or_default());
        let is_library = path
            .file_name()
            .and_then(|name| name.to_str())
            .is_some_and(|name| name.ends_with(std::env::consts::DLL_SUFFIX));
        if !is_library {
            continue;
        }
        if let Ok(target) = std::fs::read_link(&found)
            && std::fs::metadata(&found).is_err()
        {
            return Err(format!(
                "{} is a symbolic link to {}, which does not exist",
                path.display(),
                target.display()
            ));
        }
        let resolved = found.canonicalize().map_err(|e| format!("{}: {e}", path.display()))?;
        if resolved.parent() != Some(canonical.as_path()) {
            return Err(format!(
                "{} resolves to {}, outside the plugin directory {shown}",
                path.display(),
                resolved.display()
            ));
        }
        writable_by_others(&resolved).map_err(|why| format!("{} {why}", path.display()))?;
        libraries.push(resolved);
    }
    libraries.sort();
    Ok(libraries)
}

/// An instance its kind refuses to build, located where the instance names its kind.
fn refused_instance(
    instances: &Instances,
    name: &str,
    error: &dyn std::fmt::Display,
) -> Diagnostic {
    Diagnostic::error(
        Code::ConnectorSettings,
        &instances.file,
        instances.kind_span(name),
        format!("connector `{name}`: {error}"),
    )
}

/// Settings with each of `file_settings` that is a relative path taken from the directory of
/// the instances file, so that a gateway started elsewhere opens the same file.
fn anchored(mut settings: Settings, file_settings: &[String], instances: &Instances) -> Settings {
    let Some(dir) = Path::new(&instances.file).parent() else { return settings };
    for name in file_settings {
        if let Some(serde_json::Value::String(path)) = settings.get_mut(name)
            && Path::new(path.as_str()).is_relative()
        {
            *path = dir.join(path.as_str()).display().to_string();
        }
    }
    settings
}

/// Settings with each reference replaced by its value, or by an empty string where it cannot
/// be resolved (for checking: the unset reference is reported on its own).
fn resolved_settings(
    settings: &Settings,
    resolver: &Resolver,
) -> Result<Settings, std::convert::Infallible> {
    with_references_resolved(settings, &mut |reference| {
        Ok(resolver
            .resolve(reference)
            .ok()
            .and_then(|value| String::from_utf8(value.expose().to_vec()).ok())
            .unwrap_or_default())
    })
}

/// An instance's credentials, if every one of them resolves.
fn credentials_at_hand(
    instance: &hookgate_pipeline::model::ConnectorInstance,
    resolver: &Resolver,
) -> Option<Credentials> {
    instance
        .credentials
        .iter()
        .map(|(name, reference)| {
            let value = resolver.resolve(reference).ok()?;
            Some((name.clone(), Secret::new(String::from_utf8(value.expose().to_vec()).ok()?)))
        })
        .collect()
}

/// Settings with every reference resolved, or `Err` if one does not.
fn strictly_resolved(settings: &Settings, resolver: &Resolver) -> Result<Settings, ()> {
    with_references_resolved(settings, &mut |reference| {
        let value = resolver.resolve(reference).map_err(drop)?;
        String::from_utf8(value.expose().to_vec()).map_err(drop)
    })
}

/// Whether users other than the owner may write to `path`: a library they could replace is
/// code they could run inside the gateway.
fn writable_by_others(path: &Path) -> Result<(), String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(path).map_err(|e| e.to_string())?.permissions().mode();
        if mode & 0o022 != 0 {
            return Err(format!("is writable by its group or others (mode {:o})", mode & 0o777));
        }
    }
    Ok(())
}

/// Checks a plugin instance's settings against the JSON Schema its plugin describes.
fn check_against_schema(
    instances: &Instances,
    name: &str,
    settings: &Settings,
    description: &KindDescription,
) -> Vec<Diagnostic> {
    let kind = &description.kind;
    let validator = match jsonschema::validator_for(&description.settings_schema) {
        Ok(validator) => validator,
        Err(e) => {
            return vec![Diagnostic::error(
                Code::Plugin,
                &instances.file,
                instances.kind_span(name),
                format!("plugin `{kind}` describes a settings schema that is not valid: {e}"),
            )];
        }
    };
    use jsonschema::error::ValidationErrorKind;
    let settings = serde_json::Value::Object(settings.clone().into_iter().collect());
    let errors: Vec<_> = validator.iter_errors(&settings).collect();
    // A misspelt setting is one mistake, not two (an unknown member and a missing one): the
    // unknown one says which it was meant to be, and the missing one is not reported again.
    let missing_at = |path: &str| -> Vec<String> {
        errors
            .iter()
            .filter(|e| e.instance_path().as_str() == path)
            .filter_map(|e| match e.kind() {
                ValidationErrorKind::Required { property } => property.as_str().map(str::to_owned),
                _ => None,
            })
            .collect()
    };
    let mut meant: Vec<String> = Vec::new();
    for error in &errors {
        if let ValidationErrorKind::AdditionalProperties { unexpected } = error.kind() {
            let path = error.instance_path().as_str();
            let missing = missing_at(path);
            for name in unexpected {
                let candidates = missing.iter().map(String::as_str);
                if let Some(candidate) =
                    hookgate_pipeline::diagnostic::did_you_mean(name, candidates)
                {
                    meant.push(format!("{path}/{candidate}"));
                }
            }
        }
    }
    errors
        .iter()
        .filter(|error| match error.kind() {
            ValidationErrorKind::Required { property } => {
                let at = format!(
                    "{}/{}",
                    error.instance_path().as_str(),
                    property.as_str().unwrap_or_default()
                );
                !meant.contains(&at)
            }
            _ => true,
        })
        .map(|error| {
            let mut pointer = error.instance_path().as_str().to_owned();
            let mut suggestion = String::new();
            // An unexpected member is best shown where it is written.
            if let ValidationErrorKind::AdditionalProperties { unexpected } = error.kind()
                && let Some(first) = unexpected.first()
            {
                let path = pointer.clone();
                pointer = format!("{pointer}/{}", first.replace('~', "~0").replace('/', "~1"));
                let missing = missing_at(&path);
                if let Some(candidate) = hookgate_pipeline::diagnostic::did_you_mean(
                    first,
                    missing.iter().map(String::as_str),
                ) {
                    suggestion = format!(": did you mean `{candidate}`?");
                }
            }
            let place = std::iter::once("settings".to_owned())
                .chain(error.instance_path().as_str().split('/').skip(1).map(str::to_owned))
                .collect::<Vec<_>>()
                .join(".");
            Diagnostic::error(
                Code::ConnectorSettings,
                &instances.file,
                instances.settings_span(name, &pointer),
                // Masked: a value may have come from a reference, and the message must not
                // repeat it.
                format!("connector `{name}` ({kind}): {place}: {}{suggestion}", error.masked()),
            )
            .with_hint(format!("`hookgate connectors --schema {kind}` prints the settings schema"))
        })
        .collect()
}

/// The mock CRM behind an instance, for `hookgate crm` and the demo.
pub async fn mock(instances: &Instances, name: &str) -> Result<MockCrm> {
    let Some(instance) = instances.connectors.get(name) else {
        let names: Vec<&str> = instances.connectors.keys().map(String::as_str).collect();
        bail!(
            "no connector instance `{name}` in {} (it has: {})",
            instances.file,
            names.join(", ")
        );
    };
    if instance.kind != "mock" {
        bail!("connector instance `{name}` is a `{}`, not a mock CRM", instance.kind);
    }
    let Ok(settings) = resolved_settings(&instance.settings, &Resolver::default());
    let settings = anchored(settings, &describe_kind::<MockCrm>().file_settings, instances);
    // Inspecting never creates the mock's database: a mistyped path is an error.
    if let Some(path) = settings.get("path").and_then(|p| p.as_str())
        && !Path::new(path).is_file()
    {
        bail!(
            "no mock CRM database at {path} (connector `{name}`): the gateway creates it; check `path`"
        );
    }
    Ok(MockCrm::from_settings(&settings).await?)
}

/// CRM text for a terminal: escaped, bounded.
fn shown(text: &str) -> String {
    hookgate_pipeline::evaluate::printable(text, 2048)
}

/// A mock CRM's records: a table, or one JSON object per line.
pub fn records_text(
    records: &[hookgate_connector_mock::MockRecord],
    format: Format,
) -> Result<String> {
    use std::fmt::Write as _;
    let mut out = String::new();
    if format == Format::Json {
        for record in records {
            out.push_str(&crate::events::json_line(&serde_json::to_value(record)?));
        }
        return Ok(out);
    }
    let _ = writeln!(out, "{:<16}  {:<14}  {:<24}  FIELDS", "OBJECT", "RECORD", "EXTERNAL ID");
    for record in records {
        let fields: Vec<String> = record.fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(
            out,
            "{:<16}  {:<14}  {:<24}  {}",
            shown(&record.object),
            shown(&record.record_id),
            shown(&format!("{}={}", record.external_id_field, record.external_id_value)),
            shown(&fields.join(" "))
        );
    }
    let _ = writeln!(out, "{} records", records.len());
    Ok(out)
}

/// A mock CRM's effect log: one line per applied write, or one JSON object per line.
pub fn effects_text(effects: &[hookgate_connector_mock::Effect], format: Format) -> Result<String> {
    use std::fmt::Write as _;
    let mut out = String::new();
    if format == Format::Json {
        for effect in effects {
            out.push_str(&crate::events::json_line(&serde_json::to_value(effect)?));
        }
        return Ok(out);
    }
    for effect in effects {
        let _ = writeln!(
            out,
            "#{:<6} {}  {} {}={}  {}  key {}",
            effect.id,
            crate::events::timestamp(effect.applied_at_ms),
            if effect.created { "created" } else { "updated" },
            shown(&effect.object),
            shown(&effect.external_id_value),
            shown(&effect.record_id),
            shown(&effect.idempotency_key)
        );
    }
    let _ = writeln!(out, "{} effects", effects.len());
    Ok(out)
}

/// `hookgate connectors`: a table of kinds, one JSON object per kind, or one kind's settings
/// schema.
pub fn kinds_text(
    registry: &Registry,
    instances: Option<&Instances>,
    schema: Option<&str>,
    format: Format,
) -> Result<String, String> {
    use std::fmt::Write as _;
    if let Some(kind) = schema {
        let Some((description, _)) = registry.kinds().find(|(d, _)| d.kind == kind) else {
            let known: Vec<&str> = registry.kinds().map(|(d, _)| d.kind.as_str()).collect();
            return Err(format!("no connector kind `{kind}`: {}", suggestion(kind, &known)));
        };
        let mut text = serde_json::to_string_pretty(&description.settings_schema)
            .map_err(|e| e.to_string())?;
        text.push('\n');
        return Ok(text);
    }
    let mut out = String::new();
    for (description, path) in registry.kinds() {
        let origin = path.map_or_else(|| "in-tree".to_owned(), |p| p.display().to_string());
        if format == Format::Json {
            let line = serde_json::json!({
                "kind": description.kind,
                "version": description.version,
                "origin": origin,
                "credentials": description.credentials,
                "rules": description.rules,
                "limits": limits_json(description.limits),
            });
            out.push_str(&crate::events::json_line(&line));
        } else {
            let credentials = if description.credentials.is_empty() {
                "-".to_owned()
            } else {
                description.credentials.join(",")
            };
            let _ = writeln!(
                out,
                "{:<12}  {:<8}  {:<24}  {:<22}  {}",
                shown(&description.kind),
                shown(&description.version),
                shown(&credentials),
                limits_text(description.limits),
                shown(&origin)
            );
        }
    }
    // Then each instance of the instances file, with the budget it runs under.
    for (name, instance) in instances.map(|i| &i.connectors).into_iter().flatten() {
        let limits = registry.limits_of(instance);
        let source = if instance.limits.is_some() { "declared" } else { "its kind's" };
        if format == Format::Json {
            let line = serde_json::json!({
                "instance": name,
                "kind": instance.kind,
                "limits": limits_json(limits),
                "limits_from": if instance.limits.is_some() { "instance" } else { "kind" },
            });
            out.push_str(&crate::events::json_line(&line));
        } else {
            let _ = writeln!(
                out,
                "instance {}  kind {}  budget {} ({source})",
                shown(name),
                shown(&instance.kind),
                limits_text(limits)
            );
        }
    }
    Ok(out)
}

/// A budget for people: `100 calls per 10s`, or `no rate limit`.
fn limits_text(limits: CallLimits) -> String {
    match limits.rate {
        Some(rate) => {
            format!("{} calls per {}", rate.calls, humantime::format_duration(rate.per))
        }
        None => "no rate limit".to_owned(),
    }
}

fn limits_json(limits: CallLimits) -> serde_json::Value {
    match limits.rate {
        Some(rate) => serde_json::json!({
            "rate": { "calls": rate.calls, "per_ms": u64::try_from(rate.per.as_millis()).unwrap_or(u64::MAX) }
        }),
        None => serde_json::json!({ "rate": null }),
    }
}
