//! Every JSON Schema hookgate publishes, and the admin API's OpenAPI document, as committed under `schemas/` and printed by
//! `hookgate schema`. The instances schema is completed here, where the connector kinds are
//! known: each kind's `settings` schema is selected by `kind` (`if`/`then`), so editors check
//! settings per kind.

use serde_json::{Value, json};

/// `(path under schemas/, text)` for every schema.
pub fn all() -> Vec<(String, String)> {
    let settings = crate::connectors::Registry::in_tree().settings_schemas();
    let mut out = Vec::new();
    for (name, text) in hookgate_pipeline::schemas() {
        let text =
            if name == "hookgate.schema.json" { with_settings(&text, &settings) } else { text };
        out.push((name.to_owned(), text));
    }
    out.extend(settings.into_iter().map(|(name, text)| (format!("connectors/{name}"), text)));
    let mut openapi = serde_json::to_string_pretty(&crate::admin::openapi_document())
        .expect("a generated document");
    openapi.push('\n');
    out.push(("admin.openapi.json".to_owned(), openapi));
    out
}

/// The schema a `hookgate schema NAME` prints.
pub fn named(name: &str) -> Option<String> {
    let file = match name {
        "pipeline" => "pipeline.schema.json",
        "fixture" => "fixture.schema.json",
        "instances" => "hookgate.schema.json",
        _ => return None,
    };
    all().into_iter().find(|(path, _)| path == file).map(|(_, text)| text)
}

/// The instances schema with each kind's settings schema inlined under a condition on `kind`.
/// Each settings schema's `$defs` move to the root, prefixed by the kind, so its references
/// still resolve.
fn with_settings(instances: &str, settings: &[(String, String)]) -> String {
    let mut root: Value = serde_json::from_str(instances).expect("a generated schema");
    let mut conditions = Vec::new();
    for (file, text) in settings {
        let kind = file.trim_end_matches(".settings.schema.json");
        let mut schema: Value = serde_json::from_str(text).expect("a generated schema");
        let defs = schema.as_object_mut().and_then(|o| o.remove("$defs"));
        if let Some(object) = schema.as_object_mut() {
            object.remove("$schema");
        }
        rename_refs(&mut schema, kind);
        allow_references(&mut schema);
        if let Some(Value::Object(defs)) = defs {
            for (name, mut def) in defs {
                rename_refs(&mut def, kind);
                allow_references(&mut def);
                root["$defs"][format!("{kind}.{name}")] = def;
            }
        }
        root["$defs"][format!("{kind}.settings")] = schema;
        conditions.push(json!({
            "if": { "properties": { "kind": { "const": kind } }, "required": ["kind"] },
            "then": { "properties": { "settings": { "$ref": format!("#/$defs/{kind}.settings") } } }
        }));
    }
    root["$defs"]["ConnectorInstance"]["allOf"] = Value::Array(conditions);
    let mut text = serde_json::to_string_pretty(&root).expect("schemas serialise");
    text.push('\n');
    text
}

/// Lets every setting be a reference (`{ env: NAME }`, `{ file: PATH }`) as well as its own
/// type, as `hookgate` reads settings.
fn allow_references(value: &mut Value) {
    match value {
        Value::Object(object) => {
            for (key, inner) in object.iter_mut() {
                if key == "properties"
                    && let Value::Object(properties) = inner
                {
                    for property in properties.values_mut() {
                        allow_references(property);
                        let own = property.take();
                        *property = json!({ "anyOf": [own, { "$ref": "#/$defs/SecretRef" }] });
                    }
                } else {
                    allow_references(inner);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(allow_references),
        _ => {}
    }
}

fn rename_refs(value: &mut Value, kind: &str) {
    match value {
        Value::Object(object) => {
            for (key, inner) in object.iter_mut() {
                match (key.as_str(), inner) {
                    ("$ref", Value::String(target)) => {
                        if let Some(name) = target.strip_prefix("#/$defs/") {
                            *target = format!("#/$defs/{kind}.{name}");
                        }
                    }
                    (_, inner) => rename_refs(inner, kind),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| rename_refs(item, kind)),
        _ => {}
    }
}

/// The guide's page of diagnostic codes, generated from their table (`Code::ALL`), as
/// `cargo xtask codegen` writes it to `docs/guide/diagnostics.md`.
pub fn diagnostics_page() -> String {
    use std::fmt::Write as _;
    let mut page = String::from(
        "# Diagnostic codes\n\n\
         Every diagnostic of `hookgate check` (and of `serve`, which refuses what `check` reports\n\
         as an error) has a code; `hookgate explain CODE` prints its entry. This page is generated\n\
         from the codes' table by `cargo xtask codegen`, and `cargo xtask check` fails when it is\n\
         stale. A code, once published, keeps its meaning.\n\n\
         | Code | What it is |\n|---|---|\n",
    );
    for code in hookgate_pipeline::Code::ALL {
        let _ =
            writeln!(page, "| [{code}](#{}) | {} |", code.as_str().to_lowercase(), code.title());
    }
    for code in hookgate_pipeline::Code::ALL {
        let _ = write!(page, "\n## {code}\n\n{}\n\n{}\n", code.title(), code.explanation());
    }
    page
}
