//! Connector instances from `hookgate.yaml`, built into running connectors.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use hookgate_connector::Connector;
use hookgate_connector_mock::MockCrm;
use hookgate_engine::Connectors;
use hookgate_pipeline::Instances;
use hookgate_pipeline::model::{ConnectorInstance, ConnectorKind};

/// Builds every instance. A kind this build cannot run is an error naming the instance.
pub async fn build(instances: &Instances) -> Result<Connectors> {
    let mut connectors = Connectors::new();
    for (name, instance) in &instances.connectors {
        let connector =
            build_one(instance).await.with_context(|| format!("connector instance `{name}`"))?;
        connectors.insert(name.clone(), connector);
    }
    Ok(connectors)
}

async fn build_one(instance: &ConnectorInstance) -> Result<Arc<dyn Connector>> {
    match instance.kind {
        ConnectorKind::Mock => Ok(Arc::new(MockCrm::from_settings(&instance.settings).await?)),
        other => bail!("kind `{}` cannot be run by this build yet", other.as_str()),
    }
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
    Ok(MockCrm::from_settings(&instance.settings).await?)
}
