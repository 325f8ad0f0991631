//! The pipeline and connector-instance configuration of hookgate.
//!
//! This crate is pure: it is given file names and their text, and returns compiled pipelines
//! and compiler-style [`Diagnostic`]s. Reading files and the environment belongs to the binary.
//!
//! # Layout
//! - [`yaml`]: YAML text to a tree of located nodes, with limits on size, depth and aliases.
//! - `de`: serde over that tree; every error keeps its location, unknown fields do not stop it.
//! - [`model`]: the configuration types (serde + schemars), one to one with the YAML.
//! - `check`: semantic checks, template compilation, presets → [`CompiledPipeline`].
//! - [`body`]: a delivery's body → the templates' `payload`.
//! - [`evaluate`]: a verified delivery → event identity and rendered CRM writes.
//! - [`fixture`]: sample deliveries with expected verdicts, run without a server.

pub mod body;
pub mod codes;
pub mod diagnostic;
pub mod evaluate;
pub mod fixture;
pub mod model;
pub mod redact;
pub mod shape;
pub mod template;
#[macro_use]
pub mod yaml;

mod check;
mod de;

pub use check::{
    CompiledOrdering, CompiledPipeline, CompiledSource, CompiledTarget, Instances, KeyFetch,
    TemplateName, setting_reference, setting_references, with_references_resolved,
};
pub use diagnostic::{
    Code, Diagnostic, Pos, Related, Severity, Span, suggestion, variant_suggestion,
};

use crate::yaml::Node;

/// Loads the connector-instances file.
pub fn load_instances(file: &str, source: &str) -> (Option<Instances>, Vec<Diagnostic>) {
    let (doc, mut diagnostics) = yaml::parse(file, source);
    let Some(mut doc) = doc else { return (None, diagnostics) };
    let (model, found, echoes) = de::from_node_repairing::<model::InstancesFile>(file, &mut doc);
    diagnostics.extend(found);
    let Some(model) = model else { return (None, diagnostics) };
    let (instances, found) = check::check_instances(file, &doc, model);
    diagnostics.extend(without_echoes(&echoes, found));
    diagnostics.sort_by_key(|d| d.pos());
    (Some(instances), diagnostics)
}

/// Loads and checks one pipeline file. With `instances`, connector references are checked
/// against them; without, they are not (a pipeline checked alone).
pub fn load_pipeline(
    file: &str,
    source: &str,
    instances: Option<&Instances>,
) -> (Option<CompiledPipeline>, Vec<Diagnostic>) {
    let (doc, mut diagnostics) = yaml::parse(file, source);
    let Some(mut doc) = doc else { return (None, diagnostics) };
    let (model, found, echoes) = de::from_node_repairing::<model::Pipeline>(file, &mut doc);
    diagnostics.extend(found);
    let Some(model) = model else { return (None, diagnostics) };
    // Unknown fields were skipped and wrong values stood in for, so that the rest could be
    // checked; the file is still wrong.
    let structurally_sound = !diagnostics.iter().any(Diagnostic::is_error);
    let (compiled, found) = check::check_pipeline(file, source, &doc, model, instances);
    diagnostics.extend(without_echoes(&echoes, found));
    diagnostics.sort_by_key(|d| d.pos());
    (compiled.filter(|_| structurally_sound), diagnostics)
}

/// The semantic `found` minus what only restates an error reported while deserializing: a
/// check of a value that stood in for a wrong or missing one, of a block whose kind had to be
/// guessed, or a missing field that a misspelt key explains.
fn without_echoes(echoes: &de::Echoes, found: Vec<Diagnostic>) -> Vec<Diagnostic> {
    found.into_iter().filter(|d| !echoes.restates(d)).collect()
}

/// A parsed fixture and its document, so mismatches can be reported at their line.
#[derive(Debug)]
pub struct LoadedFixture {
    pub fixture: fixture::Fixture,
    doc: Node,
}

impl LoadedFixture {
    /// The position of an expectation, for reporting a mismatch.
    pub fn position(&self, path: &[yaml::PathSegment]) -> Pos {
        self.doc.locate(path).span.start
    }
}

pub fn load_fixture(file: &str, source: &str) -> (Option<LoadedFixture>, Vec<Diagnostic>) {
    let (doc, mut diagnostics) = yaml::parse(file, source);
    let Some(mut doc) = doc else { return (None, diagnostics) };
    let (fixture, found) = de::from_node::<fixture::Fixture>(file, &mut doc);
    diagnostics.extend(found);
    if diagnostics.iter().any(Diagnostic::is_error) {
        return (None, diagnostics);
    }
    (fixture.map(|fixture| LoadedFixture { fixture, doc }), diagnostics)
}

/// The JSON Schemas of every configuration file, as committed under `schemas/`.
pub fn schemas() -> Vec<(&'static str, String)> {
    fn render(schema: schemars::Schema) -> String {
        let mut text = serde_json::to_string_pretty(&schema).expect("schemas serialise");
        text.push('\n');
        text
    }
    vec![
        ("pipeline.schema.json", render(schemars::schema_for!(model::Pipeline))),
        ("hookgate.schema.json", render(schemars::schema_for!(model::InstancesFile))),
        ("fixture.schema.json", render(schemars::schema_for!(fixture::Fixture))),
    ]
}

#[cfg(test)]
mod tests;
