//! Loading a project's configuration from disk, and `check`: every problem in every file at
//! once, then every fixture run.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use hookgate_engine::seal::Keyring;
use hookgate_pipeline::model::SecretRef;
use hookgate_pipeline::{
    Code, CompiledPipeline, Diagnostic, Instances, Pos, Span, load_fixture, load_instances,
    load_pipeline,
    shape::{Shape, ShapeSource},
};

use crate::files::{self, BODY_BYTES_MAX};
use crate::secrets::{self, SecretError};

/// What an unresolvable secret reference is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretPolicy {
    /// `check` in CI, where production secrets are absent: one warning naming them all, those
    /// a pipeline's fixtures supply too (the fixtures run with their own test values; `serve`
    /// needs the real one), marked as such.
    Warn,
    /// `check --allow-unset-secrets`: not reported.
    Allow,
    /// `serve`: an error, because the pipeline could not verify anything.
    Require,
}

#[derive(Debug, Clone)]
pub struct Options {
    /// Pipeline files, or directories whose `*.yaml` files are pipelines.
    pub paths: Vec<PathBuf>,
    /// The connector-instances file.
    pub instances: PathBuf,
    pub secrets: SecretPolicy,
    pub resolver: secrets::Resolver,
}

/// Loaded configuration: what compiled, and everything found on the way.
#[derive(Debug)]
pub struct Project {
    pub instances: Option<Instances>,
    /// The connector kinds: in-tree, and the plugins the instances file names.
    pub registry: crate::connectors::Registry,
    pub pipelines: Vec<LoadedPipeline>,
    pub diagnostics: Vec<Diagnostic>,
}

#[derive(Debug)]
pub struct LoadedPipeline {
    pub path: PathBuf,
    pub compiled: CompiledPipeline,
}

impl Project {
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }
}

/// Loads the instances file and every pipeline, checks cross-file rules (unique names) and
/// resolves secrets under `options.secrets`.
pub fn load(options: &Options) -> Project {
    let mut diagnostics = Vec::new();
    let instances_name = options.instances.display().to_string();
    let mut registry = None;
    let instances = match files::read_config(&options.instances) {
        Ok(source) => {
            let (mut instances, found) = load_instances(&instances_name, &source);
            diagnostics.extend(found);
            let (loaded, found) = crate::connectors::Registry::load(instances.as_ref());
            diagnostics.extend(found);
            if let Some(instances) = &mut instances {
                diagnostics.extend(loaded.check(instances, &options.resolver));
                instances.rules = loaded.rules();
            }
            registry = Some(loaded);
            instances
        }
        Err(error) => {
            diagnostics.push(
                Diagnostic::from(error)
                    .with_hint("name the connector-instances file with `--instances`"),
            );
            None
        }
    };

    let mut pipelines: Vec<LoadedPipeline> = Vec::new();
    for path in pipeline_files(&options.paths, &mut diagnostics) {
        let name = path.display().to_string();
        let source = match files::read_config(&path) {
            Ok(source) => source,
            Err(error) => {
                diagnostics.push(error.into());
                continue;
            }
        };
        let (compiled, found) = load_pipeline(&name, &source, instances.as_ref());
        diagnostics.extend(found);
        if let Some(compiled) = compiled {
            pipelines.push(LoadedPipeline { path, compiled });
        }
    }

    let mut seen: HashMap<&str, &CompiledPipeline> = HashMap::new();
    for loaded in &pipelines {
        let compiled = &loaded.compiled;
        match seen.get(compiled.name.as_str()) {
            Some(first) => diagnostics.push(
                Diagnostic::error(
                    Code::DuplicateName,
                    &compiled.file,
                    compiled.span_of_name(),
                    format!("duplicate pipeline name `{}`", compiled.name),
                )
                .with_hint("names are intake paths and must be unique")
                .with_related(
                    &first.file,
                    first.span_of_name(),
                    "also the name of this pipeline",
                ),
            ),
            None => {
                seen.insert(&compiled.name, compiled);
            }
        }
    }

    let mut references: Vec<(&str, &SecretRef, Pos)> = Vec::new();
    if let Some(instances) = &instances {
        // Only the connectors the loaded pipelines write to need their credentials: `serve`
        // builds no other, so an instance kept for another deployment asks for nothing.
        let used: HashSet<&str> = pipelines
            .iter()
            .flat_map(|p| p.compiled.targets.iter().map(|t| t.connector.as_str()))
            .collect();
        references.extend(
            instances
                .secrets
                .iter()
                .filter(|(instance, _, _)| used.contains(instance.as_str()))
                .map(|(_, r, p)| (instances.file.as_str(), r, *p)),
        );
        references.extend(
            instances.payload_keys.iter().map(|(_, r, p)| (instances.file.as_str(), r, *p)),
        );
    }
    // Names a pipeline's fixtures supply: `check` runs those fixtures with their test values,
    // and `serve` still needs the real ones. They are reported, marked, so that `check` warns of
    // everything `serve` would refuse.
    let mut supplied: HashSet<(String, String)> = HashSet::new();
    for loaded in &pipelines {
        references.extend(
            loaded.compiled.secrets.iter().map(|(r, p)| (loaded.compiled.file.as_str(), r, *p)),
        );
        let refreshes = loaded.compiled.targets.iter().filter_map(|t| t.refresh.as_ref());
        references.extend(
            refreshes
                .flat_map(|r| r.secrets.iter())
                .map(|(r, p)| (loaded.compiled.file.as_str(), r, *p)),
        );
        if options.secrets != SecretPolicy::Require {
            for name in fixture_secret_names(&loaded.path) {
                supplied.insert((loaded.compiled.file.clone(), name));
            }
        }
    }
    let unresolved: Vec<Unresolved> = references
        .into_iter()
        .filter_map(|(file, reference, pos)| {
            let (SecretRef::Env(name) | SecretRef::File(name)) = reference;
            let error = options.resolver.resolve(reference).err()?;
            let in_fixtures = supplied.contains(&(file.to_owned(), name.clone()));
            Some(Unresolved { file, pos, error, in_fixtures })
        })
        .collect();
    diagnostics.extend(secret_diagnostics(&unresolved, options.secrets));
    // A secret that is set but cannot be a key of its scheme (a public key that is not one, a
    // `whsec_` value that is not base64) is an error wherever it is found.
    for loaded in &pipelines {
        let compiled = &loaded.compiled;
        for (reference, pos) in &compiled.secrets {
            let Ok(secret) = options.resolver.resolve(reference) else { continue };
            if let Err(error) = compiled.scheme.check_key(&secret) {
                let span = Span { start: *pos, end: *pos };
                diagnostics.push(
                    Diagnostic::error(
                        Code::Secrets,
                        &compiled.file,
                        span,
                        format!(
                            "{reference} cannot be used by `{}`: {}",
                            compiled.scheme.name,
                            error.reason()
                        ),
                    )
                    .with_hint("check that the value is the one the sender gives for this scheme"),
                );
            }
        }
    }
    // A payload key that is set must be one: 32 bytes in base64.
    if let Some(instances) = &instances {
        for (id, reference, pos) in &instances.payload_keys {
            let Ok(secret) = options.resolver.resolve(reference) else { continue };
            if let Err(error) = Keyring::new([(id.as_str(), secret.expose())]) {
                diagnostics.push(
                    Diagnostic::error(
                        Code::PayloadKey,
                        &instances.file,
                        Span { start: *pos, end: *pos },
                        format!("{reference}: {error}"),
                    )
                    .with_hint("make a key with `openssl rand -base64 32`"),
                );
            }
        }
    }
    let registry = registry.unwrap_or_else(crate::connectors::Registry::in_tree);
    Project { instances, registry, pipelines, diagnostics }
}

/// A secret reference that does not resolve here.
struct Unresolved<'a> {
    file: &'a str,
    pos: Pos,
    error: SecretError,
    /// The pipeline's fixtures have a test value of it (what `check` runs them with).
    in_fixtures: bool,
}

/// Unresolvable secrets: each an error when serving. For `check`, CI rarely has production
/// secrets, so the unset ones are one warning that names them all (a warning per reference
/// would bury the errors); one that is set but empty or unreadable is a mistake in the
/// environment, a warning of its own whatever the policy.
fn secret_diagnostics(unresolved: &[Unresolved], policy: SecretPolicy) -> Vec<Diagnostic> {
    let span_at = |pos: Pos| Span { start: pos, end: pos };
    if policy == SecretPolicy::Require {
        return unresolved
            .iter()
            .map(|u| {
                Diagnostic::error(Code::UnsetSecret, u.file, span_at(u.pos), u.error.to_string())
                    .with_hint(
                        "set it before starting; secrets are never written in configuration files",
                    )
            })
            .collect();
    }
    let (unset, wrong): (Vec<_>, Vec<_>) = unresolved
        .iter()
        .partition(|u| matches!(u.error, SecretError::Unset(_) | SecretError::Missing(_)));
    let mut out: Vec<Diagnostic> = wrong
        .iter()
        .map(|u| {
            Diagnostic::warning(Code::UnsetSecret, u.file, span_at(u.pos), u.error.to_string())
                .with_hint("`hookgate serve` refuses to start until it can be read")
        })
        .collect();
    if policy == SecretPolicy::Allow {
        return out;
    }
    let fixtures_note = |u: &Unresolved| {
        if u.in_fixtures { "; its fixtures run with a test value of their own" } else { "" }
    };
    if let Some(first) = unset.first() {
        let message = match unset.as_slice() {
            [only] => format!("{}{}", only.error, fixtures_note(only)),
            _ => {
                let list: Vec<String> = unset
                    .iter()
                    .map(|u| {
                        let missing = if matches!(u.error, SecretError::Missing(_)) {
                            ", no such file"
                        } else {
                            ""
                        };
                        let pos = u.pos;
                        let fixtures =
                            if u.in_fixtures { ", fixtures have a test value" } else { "" };
                        format!(
                            "{}{missing} ({}:{}:{}{fixtures})",
                            u.error.subject(),
                            u.file,
                            pos.line,
                            pos.column
                        )
                    })
                    .collect();
                format!("{} secrets are not set: {}", unset.len(), list.join(", "))
            }
        };
        out.push(
            Diagnostic::warning(Code::UnsetSecret, first.file, span_at(first.pos), message)
                .with_hint("`hookgate serve` refuses to start until they are set; `--allow-unset-secrets` silences this"),
        );
    }
    out
}

/// The secret names a pipeline's fixtures supply: `check` runs those fixtures with them.
/// Fixtures that do not load are reported when they are run.
fn fixture_secret_names(pipeline: &Path) -> HashSet<String> {
    let Ok(entries) = std::fs::read_dir(fixture_dir(pipeline)) else { return HashSet::new() };
    let mut names = HashSet::new();
    for path in entries.filter_map(Result::ok).map(|e| e.path()).filter(|p| is_yaml(p)) {
        let Ok(source) = files::read_config(&path) else { continue };
        if let (Some(loaded), _) = load_fixture(&path.display().to_string(), &source) {
            names.extend(loaded.fixture.secrets.keys().cloned());
        }
    }
    names
}

/// The names of the pipelines in `paths` that load, for commands that only need to know them;
/// files that do not load are `check`'s business.
pub fn pipeline_names(paths: &[PathBuf]) -> Vec<String> {
    pipeline_files(paths, &mut Vec::new())
        .iter()
        .filter_map(|path| {
            let source = files::read_config(path).ok()?;
            let (compiled, _) = load_pipeline(&path.display().to_string(), &source, None);
            compiled.map(|c| c.name)
        })
        .collect()
}

/// The pipeline files named by `paths`: files as given, directories' `*.yaml` and `*.yml`
/// files (not their subdirectories, which hold fixtures), sorted for a stable report.
fn pipeline_files(paths: &[PathBuf], diagnostics: &mut Vec<Diagnostic>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for path in paths {
        if path.is_dir() {
            match std::fs::read_dir(path) {
                Ok(entries) => {
                    let mut found: Vec<PathBuf> = entries
                        .filter_map(Result::ok)
                        .map(|e| e.path())
                        .filter(|p| p.is_file() && is_yaml(p))
                        .collect();
                    found.sort();
                    out.extend(found);
                }
                Err(e) => diagnostics
                    .push(files::error(path, format!("cannot read directory: {e}")).into()),
            }
        } else {
            out.push(path.clone());
        }
    }
    out
}

fn is_yaml(path: &Path) -> bool {
    matches!(path.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
}

/// The fixture directory of a pipeline: `pipelines/github.yaml` → `pipelines/github/`.
pub fn fixture_dir(pipeline: &Path) -> PathBuf {
    pipeline.with_extension("")
}

#[derive(Debug, Default)]
pub struct Report {
    pub diagnostics: Vec<Diagnostic>,
    /// Errors that belong to no file: options and environment variables.
    pub option_errors: Vec<String>,
    pub pipelines: usize,
    pub fixtures_run: usize,
    pub fixtures_failed: usize,
    /// Fixtures whose `expect:` `--bless` rewrote.
    pub fixtures_blessed: usize,
}

impl Report {
    pub fn errors(&self) -> usize {
        self.diagnostics.iter().filter(|d| d.is_error()).count() + self.option_errors.len()
    }

    pub fn warnings(&self) -> usize {
        self.diagnostics.iter().filter(|d| !d.is_error()).count()
    }

    /// The last line: what was checked and what was found.
    pub fn summary(&self) -> String {
        let count =
            |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        let mut out = format!(
            "checked {} and {} ({} failed): {}, {}\n",
            count(self.pipelines, "pipeline", "pipelines"),
            count(self.fixtures_run, "fixture", "fixtures"),
            self.fixtures_failed,
            count(self.errors(), "error", "errors"),
            count(self.warnings(), "warning", "warnings"),
        );
        if self.fixtures_blessed > 0 {
            let _ = writeln!(
                out,
                "blessed {} fixtures: their `expect:` now says what their deliveries produce; review the diff",
                self.fixtures_blessed
            );
        }
        out
    }
}

/// `hookgate check`: load everything, then run each compiled pipeline's fixtures.
pub fn check(options: &Options) -> Report {
    check_fixtures(options, false)
}

/// `hookgate check --bless`: as `check`, but a fixture that fails, or expects nothing beyond a
/// valid signature, has its `expect:` rewritten from what its delivery produces, for review.
pub fn bless(options: &Options) -> Report {
    check_fixtures(options, true)
}

fn check_fixtures(options: &Options, bless: bool) -> Report {
    let project = load(options);
    let mut report = Report { pipelines: project.pipelines.len(), ..Report::default() };
    report.diagnostics = project.diagnostics;
    for loaded in &project.pipelines {
        run_fixtures(loaded, &mut report, bless);
    }
    report.diagnostics.sort_by(|a, b| (&a.file, a.pos()).cmp(&(&b.file, b.pos())));
    report
}

fn run_fixtures(loaded: &LoadedPipeline, report: &mut Report, bless: bool) {
    let dir = fixture_dir(&loaded.path);
    let mut paths: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => {
            entries.filter_map(Result::ok).map(|e| e.path()).filter(|p| is_yaml(p)).collect()
        }
        Err(_) => Vec::new(),
    };
    paths.sort();
    let mut payloads = Vec::new();
    for path in paths {
        report.fixtures_run += 1;
        let before = report.errors();
        payloads.extend(run_fixture(&loaded.compiled, &path, report, bless));
        if report.errors() > before {
            report.fixtures_failed += 1;
        }
    }
    let compiled = &loaded.compiled;
    if compiled.payload_from_fixtures {
        if payloads.is_empty() {
            report.diagnostics.push(
                Diagnostic::warning(
                    Code::NoEffect,
                    &compiled.file,
                    compiled.span_of_name(),
                    "`payload_schema: fixtures`, but no fixture has a body that parses",
                )
                .with_hint(format!("add fixtures under {}/", dir.display())),
            );
        } else {
            let shape = Shape::infer(&payloads);
            report.diagnostics.extend(compiled.payload_problems(&shape, ShapeSource::Fixtures));
        }
    }
}

/// Runs one fixture, reporting what it finds; returns the payload its body makes.
fn run_fixture(
    pipeline: &CompiledPipeline,
    path: &Path,
    report: &mut Report,
    bless: bool,
) -> Option<serde_json::Value> {
    let name = path.display().to_string();
    let source = match files::read_config(path) {
        Ok(source) => source,
        Err(error) => {
            report.diagnostics.push(error.into());
            return None;
        }
    };
    let (loaded, found) = load_fixture(&name, &source);
    report.diagnostics.extend(found);
    let loaded = loaded?;
    let body_path = path.parent().unwrap_or(Path::new(".")).join(&loaded.fixture.request.body_file);
    let body = match files::read_bounded(&body_path, BODY_BYTES_MAX) {
        Ok(body) => body,
        Err(error) => {
            let pos = loaded.position(&hookgate_pipeline::path!["request", "body_file"]);
            let span = Span { start: pos, end: pos };
            report.diagnostics.push(Diagnostic::error(
                Code::FixtureBody,
                &name,
                span,
                error.message,
            ));
            return None;
        }
    };
    let payload = loaded.fixture.payload(pipeline, &body);
    let mismatches = loaded.fixture.run(pipeline, &body);
    if bless
        && (!mismatches.is_empty() || loaded.fixture.expects_little())
        && let Ok(outcome) = loaded.fixture.outcome(pipeline, &body)
    {
        let blessed =
            hookgate_pipeline::fixture::replace_expect_block(&source, &outcome.expect_block());
        if blessed != source {
            match std::fs::write(path, blessed) {
                Ok(()) => {
                    report.fixtures_blessed += 1;
                    return payload;
                }
                Err(e) => {
                    let span = Span { start: loaded.position(&[]), end: loaded.position(&[]) };
                    report.diagnostics.push(Diagnostic::error(
                        Code::FixtureBody,
                        &name,
                        span,
                        format!("cannot rewrite: {e}"),
                    ));
                    return payload;
                }
            }
        }
    }
    for mismatch in mismatches {
        let pos = loaded.position(&mismatch.path);
        let span = Span { start: pos, end: pos };
        report.diagnostics.push(Diagnostic::error(
            Code::FixtureMismatch,
            &name,
            span,
            mismatch.message,
        ));
    }
    payload
}
