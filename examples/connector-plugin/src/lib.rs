//! `jsonfile`: a CRM kept in one JSON file, as a hookgate connector plugin.
//!
//! It is the example of a connector written outside hookgate and loaded at run time, and the
//! plugin the tests load: the file is the CRM's own record of what was written (its `effects`
//! list has one entry per applied write), and settings switch on each documented failure so
//! that the conformance suite can run against it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use hookgate_plugin::hookgate_connector::{
    self as sdk, Answer, BoxFuture, Capabilities, ConfigError, Connector, ConnectorError,
    Credentials, Description, KindDescription, LookupOutcome, LookupRequest, Operation, TargetRule,
    UpsertOutcome, UpsertRequest,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

hookgate_plugin::export_connector!(JsonFile);

/// Settings of a `jsonfile` instance.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JsonFileSettings {
    /// The JSON file holding the records; created if missing.
    pub path: PathBuf,
    /// Makes the first write of this instance fail: `unavailable`, `rate_limited`,
    /// `invalid`, `lost_response` (applied, answer lost) or `bad_credentials`.
    #[serde(default)]
    pub fault: Option<Fault>,
    /// Writes whose external id is listed panic inside the plugin (a test switch).
    #[serde(default)]
    pub panic_on: Vec<String>,
    /// Writes whose external id is listed block their thread for `block_ms` (a test switch).
    #[serde(default)]
    pub block_on: Vec<String>,
    #[serde(default = "default_block_ms")]
    pub block_ms: u64,
}

fn default_block_ms() -> u64 {
    60_000
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    Unavailable,
    RateLimited,
    Invalid,
    LostResponse,
    BadCredentials,
}

/// The file's contents.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Crm {
    /// `object/field/value` to record.
    records: BTreeMap<String, Record>,
    /// Every applied write, in order.
    effects: Vec<Effect>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    id: String,
    fields: BTreeMap<String, String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Effect {
    record_id: String,
    external_id: String,
    created: bool,
    fields: BTreeMap<String, String>,
    idempotency_key: String,
}

#[derive(Debug)]
pub struct JsonFile {
    settings: JsonFileSettings,
    /// One writer at a time; the fault is spent by the first write.
    state: Mutex<Option<Fault>>,
}

fn answer(status: u16, body: &str) -> Answer {
    Answer::with_excerpt(Some(status), body)
}

impl JsonFile {
    fn read(&self) -> Result<Crm, ConnectorError> {
        match std::fs::read(&self.settings.path) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes).map_err(|e| ConnectorError::Misconfigured {
                    message: format!("{} is not a jsonfile CRM: {e}", self.settings.path.display()),
                    answer: Answer::default(),
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Crm::default()),
            Err(e) => Err(ConnectorError::Retryable {
                message: format!("cannot read {}: {e}", self.settings.path.display()),
                retry_after: None,
                answer: Answer::default(),
            }),
        }
    }

    /// Replaces the file whole, so that a crash leaves the old or the new contents.
    fn write(&self, crm: &Crm) -> Result<(), ConnectorError> {
        let failed = |e: std::io::Error| ConnectorError::Retryable {
            message: format!("cannot write {}: {e}", self.settings.path.display()),
            retry_after: None,
            answer: Answer::default(),
        };
        let temporary = self.settings.path.with_extension("tmp");
        let bytes = serde_json::to_vec_pretty(crm).unwrap_or_default();
        std::fs::write(&temporary, bytes).map_err(failed)?;
        std::fs::rename(&temporary, &self.settings.path).map_err(failed)
    }

    fn upsert_now(&self, request: &UpsertRequest) -> Result<UpsertOutcome, ConnectorError> {
        let value = &request.external_id_value;
        if self.settings.panic_on.contains(value) {
            panic!("jsonfile was told to panic on `{value}`");
        }
        if self.settings.block_on.contains(value) {
            std::thread::sleep(Duration::from_millis(self.settings.block_ms));
        }
        let mut fault = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match fault.take() {
            Some(Fault::Unavailable) => {
                return Err(ConnectorError::Retryable {
                    message: "503 service unavailable".into(),
                    retry_after: None,
                    answer: answer(503, "unavailable"),
                });
            }
            Some(Fault::RateLimited) => {
                return Err(ConnectorError::RateLimited {
                    message: "429 too many requests".into(),
                    retry_after: Some(Duration::from_secs(2)),
                    answer: answer(429, "slow down"),
                });
            }
            Some(Fault::Invalid) => {
                return Err(ConnectorError::Rejected {
                    message: "422 a field is invalid".into(),
                    answer: answer(422, "invalid"),
                });
            }
            Some(Fault::BadCredentials) => {
                return Err(ConnectorError::Misconfigured {
                    message: "401 bad token".into(),
                    answer: answer(401, "unauthorized"),
                });
            }
            Some(Fault::LostResponse) | None => {}
        }
        let key = format!("{}/{}/{}", request.object, request.external_id_field, value);
        let mut crm = self.read()?;
        let created = !crm.records.contains_key(&key);
        if created && request.operation == Operation::UpdateOnly {
            return Err(ConnectorError::Rejected {
                message: format!("no record {key} to update"),
                answer: answer(404, "not found"),
            });
        }
        let id = format!("jf-{}", crm.records.len() + 1);
        let record =
            crm.records.entry(key).or_insert_with(|| Record { id, fields: BTreeMap::new() });
        record.fields.extend(request.fields.clone());
        let record_id = record.id.clone();
        crm.effects.push(Effect {
            record_id: record_id.clone(),
            external_id: value.clone(),
            created,
            fields: request.fields.clone(),
            idempotency_key: request.idempotency_key.clone(),
        });
        self.write(&crm)?;
        drop(fault);
        Ok(UpsertOutcome {
            record_id: record_id.clone(),
            created,
            answer: answer(if created { 201 } else { 200 }, &record_id),
        })
    }
}

impl Connector for JsonFile {
    fn describe(&self) -> Description {
        let about = <JsonFile as sdk::Kind>::about();
        Description {
            kind: about.kind,
            version: about.version,
            capabilities: Capabilities { update_only: true, idempotency_keys: false },
            settings_schema: serde_json::Value::Null,
        }
    }

    fn upsert<'a>(
        &'a self,
        request: &'a UpsertRequest,
    ) -> BoxFuture<'a, Result<UpsertOutcome, ConnectorError>> {
        let lost = {
            let fault = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            *fault == Some(Fault::LostResponse)
        };
        let result = self.upsert_now(request);
        Box::pin(async move {
            match result {
                Ok(outcome) if lost => Err(ConnectorError::Ambiguous {
                    message: format!("the answer to writing {} was lost", outcome.record_id),
                    answer: Answer::default(),
                }),
                other => other,
            }
        })
    }

    fn lookup<'a>(
        &'a self,
        request: &'a LookupRequest,
    ) -> BoxFuture<'a, Result<LookupOutcome, ConnectorError>> {
        let key = format!(
            "{}/{}/{}",
            request.object, request.external_id_field, request.external_id_value
        );
        let found = self.read().map(|crm| crm.records.get(&key).cloned());
        Box::pin(async move {
            Ok(match found? {
                Some(record) => LookupOutcome::Found {
                    record_id: record.id.clone(),
                    fields: record.fields,
                    answer: answer(200, &record.id),
                },
                None => LookupOutcome::NotFound { answer: answer(404, "not found") },
            })
        })
    }

    fn healthcheck(&self) -> BoxFuture<'_, Result<(), ConnectorError>> {
        let read = self.read().map(drop);
        Box::pin(async move { read })
    }
}

impl sdk::Kind for JsonFile {
    type Settings = JsonFileSettings;

    fn about() -> KindDescription {
        KindDescription {
            kind: "jsonfile".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            settings_schema: serde_json::Value::Null,
            credentials: vec!["token".into()],
            rules: vec![TargetRule::ExternalIdFieldNot {
                names: vec!["id".into()],
                message: "jsonfile cannot upsert by `id`".into(),
                hint: "`id` is the record id jsonfile assigns; use a field of your own".into(),
            }],
            limits: Default::default(),
            file_settings: Vec::new(),
        }
    }

    fn create(
        settings: &BTreeMap<String, serde_json::Value>,
        credentials: &Credentials,
    ) -> BoxFuture<'static, Result<JsonFile, ConfigError>> {
        let built = sdk::settings::<JsonFileSettings>(settings).and_then(|settings| {
            sdk::credential(credentials, "token")?;
            // A CRM that cannot exist: said when the instance is built, not at the first write.
            let directory = settings.path.parent().filter(|p| !p.as_os_str().is_empty());
            if directory.is_some_and(|directory| !directory.is_dir()) {
                return Err(ConfigError(format!(
                    "settings.path: {} is not in a directory that exists",
                    settings.path.display()
                )));
            }
            Ok(JsonFile { state: Mutex::new(settings.fault), settings })
        });
        Box::pin(async move { built })
    }
}

#[cfg(test)]
mod tests;
