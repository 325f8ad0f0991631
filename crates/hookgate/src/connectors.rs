//! Connector instances from `hookgate.yaml`: checked, built into running connectors, and
//! described by schemas. The only place that maps a kind to its crate.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use hookgate_connector::{Connector, Credentials, Secret};
use hookgate_connector_hubspot::{HubSpot, HubSpotSettings};
use hookgate_connector_mock::{MockCrm, MockSettings};
use hookgate_connector_salesforce::{Salesforce, SalesforceSettings};
use hookgate_engine::Connectors;
use hookgate_pipeline::model::{ConnectorInstance, ConnectorKind};
use hookgate_pipeline::{Diagnostic, Instances, Span};

use crate::secrets::Resolver;

/// Checks every instance's settings and credentials against its kind, with locations.
pub fn check(instances: &Instances) -> Vec<Diagnostic> {
    let mut diagnostics = Vec::new();
    for (name, instance) in &instances.connectors {
        match instance.kind {
            ConnectorKind::Mock => {
                diagnostics.extend(instances.check_settings::<MockSettings>(name))
            }
            ConnectorKind::Salesforce => {
                diagnostics.extend(instances.check_settings::<SalesforceSettings>(name));
                let required =
                    hookgate_connector_salesforce::required_credentials(&instance.settings);
                diagnostics.extend(instances.check_credentials(name, required));
            }
            ConnectorKind::Hubspot => {
                diagnostics.extend(instances.check_settings::<HubSpotSettings>(name));
                diagnostics.extend(
                    instances.check_credentials(name, hookgate_connector_hubspot::CREDENTIALS),
                );
            }
            ConnectorKind::Plugin => diagnostics.push(
                Diagnostic::error(
                    hookgate_pipeline::Code::ConnectorSettings,
                    &instances.file,
                    Span::start(),
                    format!("connector `{name}`: kind `plugin` is not available in this build"),
                )
                .with_hint("the kinds available are `mock`, `salesforce` and `hubspot`"),
            ),
        }
    }
    diagnostics
}

/// Builds every instance, resolving its credentials.
pub async fn build(instances: &Instances, resolver: &Resolver) -> Result<Connectors> {
    let mut connectors = Connectors::new();
    for (name, instance) in &instances.connectors {
        let connector = build_one(instance, resolver)
            .await
            .with_context(|| format!("connector instance `{name}`"))?;
        connectors.insert(name.clone(), connector);
    }
    Ok(connectors)
}

async fn build_one(
    instance: &ConnectorInstance,
    resolver: &Resolver,
) -> Result<Arc<dyn Connector>> {
    let mut credentials = Credentials::new();
    for (name, reference) in &instance.credentials {
        let value = resolver.resolve(reference).with_context(|| format!("credential `{name}`"))?;
        let text = String::from_utf8(value.expose().to_vec())
            .with_context(|| format!("credential `{name}` is not UTF-8"))?;
        credentials.insert(name.clone(), Secret::new(text));
    }
    Ok(match instance.kind {
        ConnectorKind::Mock => Arc::new(MockCrm::from_settings(&instance.settings).await?),
        ConnectorKind::Salesforce => {
            Arc::new(Salesforce::from_config(&instance.settings, &credentials)?)
        }
        ConnectorKind::Hubspot => Arc::new(HubSpot::from_config(&instance.settings, &credentials)?),
        ConnectorKind::Plugin => bail!("kind `plugin` is not available in this build"),
    })
}

/// The JSON Schema of each kind's `settings`, as committed under `schemas/connectors/`.
pub fn settings_schemas() -> Vec<(&'static str, String)> {
    fn render(schema: schemars::Schema) -> String {
        let mut text = serde_json::to_string_pretty(&schema).expect("schemas serialise");
        text.push('\n');
        text
    }
    vec![
        ("mock.settings.schema.json", render(schemars::schema_for!(MockSettings))),
        ("salesforce.settings.schema.json", render(schemars::schema_for!(SalesforceSettings))),
        ("hubspot.settings.schema.json", render(schemars::schema_for!(HubSpotSettings))),
    ]
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
    if instance.kind != ConnectorKind::Mock {
        bail!("connector instance `{name}` is a `{}`, not a mock CRM", instance.kind.as_str());
    }
    // Inspecting never creates the mock's database: a mistyped path is an error.
    if let Some(path) = instance.settings.get("path").and_then(|p| p.as_str())
        && !std::path::Path::new(path).is_file()
    {
        bail!(
            "no mock CRM database at {path} (connector `{name}`): the gateway creates it; check `path`"
        );
    }
    Ok(MockCrm::from_settings(&instance.settings).await?)
}

/// CRM text for a terminal: escaped, bounded.
fn shown(text: &str) -> String {
    hookgate_pipeline::evaluate::printable(text, 2048)
}

/// A mock CRM's records: a table, or one JSON object per line.
pub fn records_text(records: &[hookgate_connector_mock::MockRecord], json: bool) -> Result<String> {
    use std::fmt::Write as _;
    let mut out = String::new();
    if json {
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
pub fn effects_text(effects: &[hookgate_connector_mock::Effect], json: bool) -> Result<String> {
    use std::fmt::Write as _;
    let mut out = String::new();
    if json {
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
