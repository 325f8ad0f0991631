//! Pipeline fixtures: a sample delivery, given exactly, and the verdict expected for it.
//! Running one needs no server and no CRM; the caller reads the body file and passes it in.

use std::collections::BTreeMap;

use hookgate_verify::{Clock, Request, SecretBytes};
use schemars::JsonSchema;
use serde::Deserialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::check::CompiledPipeline;
use crate::evaluate::{Delivery, Identity, Upsert};
use crate::model::{Operation, SecretRef, VersionType};
use crate::path;
use crate::yaml::PathSegment;

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Fixture {
    /// What this delivery shows.
    #[serde(default)]
    pub description: Option<String>,
    /// Test-only values for the pipeline's secret references, by environment variable name or
    /// file path. Never a production secret.
    #[serde(default)]
    pub secrets: BTreeMap<String, String>,
    /// The objects targets with `refresh:` fetch, by target name: `check` stays offline.
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, serde_json::Value>")]
    pub sources: BTreeMap<String, serde_json::Value>,
    pub request: FixtureRequest,
    pub expect: Expectation,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FixtureRequest {
    #[serde(default = "default_method")]
    pub method: String,
    /// The public URL the sender called; URL-signed schemes sign it.
    #[serde(default = "default_url")]
    pub url: String,
    /// Header name to value, exactly as sent.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// More headers, in order, after `headers`: a name may repeat here, so a header sent
    /// twice can be tested.
    #[serde(default)]
    pub header_list: Vec<FixtureHeader>,
    /// The raw body, byte for byte, in a file beside this fixture.
    pub body_file: String,
    /// The clock to verify at, RFC 3339.
    pub now: String,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FixtureHeader {
    pub name: String,
    pub value: String,
}

impl FixtureRequest {
    /// Every header, `headers` first, then `header_list` in order.
    pub fn all_headers(&self) -> Vec<(String, Vec<u8>)> {
        self.headers
            .iter()
            .map(|(n, v)| (n.clone(), v.as_bytes().to_vec()))
            .chain(self.header_list.iter().map(|h| (h.name.clone(), h.value.as_bytes().to_vec())))
            .collect()
    }
}

fn default_method() -> String {
    "POST".into()
}
fn default_url() -> String {
    "https://hookgate.example/hooks".into()
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Expectation {
    pub signature: SignatureVerdict,
    /// For an invalid signature: the rejection code (`missing_header`, `malformed_header`,
    /// `signature_mismatch`, `timestamp_too_old`, `timestamp_too_new`, `empty_body`,
    /// `malformed_body`, `unsupported_version`, `body_digest_mismatch`).
    #[serde(default)]
    pub rejection: Option<String>,
    /// For an invalid signature: text the rejection's reason must contain.
    #[serde(default)]
    pub reason: Option<String>,
    /// For a valid signature whose event cannot be derived: text the error must contain.
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub scope: Option<String>,
    #[serde(default)]
    pub event_type: Option<String>,
    #[serde(default)]
    pub fingerprint: Option<String>,
    #[serde(default)]
    pub ordering: Option<ExpectedOrdering>,
    /// The CRM writes, in target order. Targets whose `when` is false are absent.
    #[serde(default)]
    pub upserts: Option<Vec<ExpectedUpsert>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SignatureVerdict {
    Valid,
    Invalid,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExpectedOrdering {
    pub entity: String,
    pub version: String,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExpectedUpsert {
    pub target: String,
    pub connector: String,
    pub object: String,
    #[serde(default)]
    pub operation: Operation,
    pub external_id: ExpectedExternalId,
    #[serde(default)]
    pub fields: BTreeMap<String, String>,
    /// For a target with `refresh:`: the URL it fetches.
    #[serde(default)]
    pub refresh_url: Option<String>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExpectedExternalId {
    pub field: String,
    pub value: String,
}

/// A difference between what a fixture expects and what happened, with the path of the
/// expectation it concerns (so it can be reported at its line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub path: Vec<PathSegment>,
    pub message: String,
}

impl Fixture {
    /// The test secret for a reference, if the fixture gives one.
    fn secret(&self, reference: &SecretRef) -> Option<SecretBytes> {
        let name = match reference {
            SecretRef::Env(name) | SecretRef::File(name) => name,
        };
        self.secrets.get(name).map(|value| SecretBytes::new(value.as_bytes()))
    }

    /// Runs the fixture against a compiled pipeline with the given body bytes.
    /// What the delivery produces under `pipeline`; `Err` lists what keeps the fixture from
    /// running at all (a missing test secret, an unreadable clock).
    pub fn outcome(
        &self,
        pipeline: &CompiledPipeline,
        body: &[u8],
    ) -> Result<Outcome, Vec<Mismatch>> {
        let mut setup = Vec::new();
        let mut secrets = Vec::new();
        for (reference, _) in &pipeline.secrets {
            match self.secret(reference) {
                Some(secret) => secrets.push(secret),
                None => setup.push(Mismatch {
                    path: path!["secrets"].to_vec(),
                    message: format!("no test value for {reference}; add it under `secrets`"),
                }),
            }
        }
        let now = match OffsetDateTime::parse(&self.request.now, &Rfc3339) {
            Ok(now) => Clock {
                unix_ms: i64::try_from(now.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX),
            },
            Err(e) => {
                setup.push(Mismatch {
                    path: path!["request", "now"].to_vec(),
                    message: format!("`{}` is not an RFC 3339 timestamp: {e}", self.request.now),
                });
                return Err(setup);
            }
        };
        if !setup.is_empty() {
            return Err(setup);
        }
        let verifier = pipeline.verifier(&secrets).map_err(|e| {
            vec![Mismatch {
                path: path!["secrets"].to_vec(),
                message: format!("test secret unusable: {e}"),
            }]
        })?;
        let headers = self.request.all_headers();
        let url = pipeline.signed_url(&self.request.url);
        let request = Request { method: &self.request.method, url: &url, headers: &headers, body };
        if let Err(rejection) = verifier.verify(&request, now) {
            return Ok(Outcome::Rejected(rejection));
        }
        let delivery = Delivery { headers: &headers, body };
        let evaluated =
            pipeline.evaluate(&delivery, &self.sources).and_then(|(identity, upserts)| {
                pipeline.check_future(&identity, now.unix_ms)?;
                Ok((identity, upserts))
            });
        Ok(match evaluated {
            Ok((identity, upserts)) => Outcome::Derived(identity, upserts),
            Err(error) => Outcome::Failed(error.to_string()),
        })
    }

    /// The payload templates see for this fixture's request, if its body parses: a sample of
    /// the sender's payloads, for `payload_schema: fixtures`.
    pub fn payload(&self, pipeline: &CompiledPipeline, body: &[u8]) -> Option<serde_json::Value> {
        let headers = self.request.all_headers();
        let delivery = Delivery { headers: &headers, body };
        crate::evaluate::Context::new(&delivery, pipeline.body_reading).payload_value().cloned()
    }

    pub fn run(&self, pipeline: &CompiledPipeline, body: &[u8]) -> Vec<Mismatch> {
        let outcome = match self.outcome(pipeline, body) {
            Ok(outcome) => outcome,
            Err(setup) => return setup,
        };
        let mut out = Vec::new();
        let mut mismatch = |path: &[PathSegment], message: String| {
            out.push(Mismatch { path: path.to_vec(), message })
        };
        let expect = &self.expect;
        let (identity, upserts) = match (outcome, expect.signature) {
            (Outcome::Rejected(rejection), SignatureVerdict::Valid) => {
                mismatch(
                    &path!["expect", "signature"],
                    format!("expected a valid signature, but it was rejected: {rejection}"),
                );
                return out;
            }
            (Outcome::Rejected(rejection), SignatureVerdict::Invalid) => {
                if let Some(code) = &expect.rejection
                    && code != rejection.code()
                {
                    mismatch(
                        &path!["expect", "rejection"],
                        format!(
                            "expected rejection `{code}`, got `{}` ({rejection})",
                            rejection.code()
                        ),
                    );
                }
                if let Some(reason) = &expect.reason
                    && !rejection.to_string().contains(reason.as_str())
                {
                    mismatch(
                        &path!["expect", "reason"],
                        format!("expected the rejection to say `{reason}`, it says `{rejection}`"),
                    );
                }
                return out;
            }
            (_, SignatureVerdict::Invalid) => {
                mismatch(
                    &path!["expect", "signature"],
                    "expected the signature to be rejected, but it is valid".into(),
                );
                return out;
            }
            (Outcome::Failed(error), SignatureVerdict::Valid) => {
                match &expect.error {
                    Some(text) if !error.contains(text.as_str()) => mismatch(
                        &path!["expect", "error"],
                        format!("expected an error containing `{text}`, got `{error}`"),
                    ),
                    Some(_) => {}
                    None => mismatch(
                        &path!["expect"],
                        format!("the event could not be derived: {error}"),
                    ),
                }
                return out;
            }
            (Outcome::Derived(identity, upserts), SignatureVerdict::Valid) => {
                if let Some(text) = &expect.error {
                    mismatch(
                        &path!["expect", "error"],
                        format!("expected an error containing `{text}`, but the event was derived"),
                    );
                    return out;
                }
                (identity, upserts)
            }
        };
        let mut compare = |field: &str, expected: &Option<String>, actual: Option<&str>| {
            if let Some(expected) = expected
                && Some(expected.as_str()) != actual
            {
                mismatch(
                    &path!["expect", field],
                    format!("expected {field} `{expected}`, got {}", show(actual)),
                );
            }
        };
        compare("key", &expect.key, Some(&identity.key));
        compare("scope", &expect.scope, Some(&identity.scope));
        compare("event_type", &expect.event_type, identity.event_type.as_deref());
        compare("fingerprint", &expect.fingerprint, Some(&identity.fingerprint));
        match (&expect.ordering, &identity.ordering) {
            (None, _) => {}
            (Some(_), None) => mismatch(
                &path!["expect", "ordering"],
                "expected ordering values, but the pipeline declares no ordering".into(),
            ),
            (Some(expected), Some(actual)) => {
                let version = actual.version.to_string();
                // Versions compare as values of their type: `2026-11-01T12:00:00Z` is the same
                // instant as `2026-11-01T13:00:00.000000+01:00`.
                let version_type = pipeline
                    .ordering
                    .as_ref()
                    .map(|o| o.version_type)
                    .unwrap_or(VersionType::String);
                let same_version =
                    match crate::evaluate::parse_version(&expected.version, version_type) {
                        Ok(parsed) => parsed == actual.version,
                        Err(_) => expected.version == version,
                    };
                if expected.entity != actual.entity || !same_version {
                    mismatch(
                        &path!["expect", "ordering"],
                        format!(
                            "expected ordering {}@{}, got {}@{version}",
                            expected.entity, expected.version, actual.entity
                        ),
                    );
                }
            }
        }
        if let Some(expected) = &expect.upserts {
            compare_upserts(expected, &upserts, &mut mismatch);
        }
        out
    }

    /// Whether the expectation says little enough that `--bless` should fill it in: a valid
    /// signature with no identity, no upserts and no error.
    pub fn expects_little(&self) -> bool {
        let e = &self.expect;
        e.signature == SignatureVerdict::Valid
            && e.key.is_none()
            && e.upserts.is_none()
            && e.error.is_none()
            && e.event_type.is_none()
            && e.ordering.is_none()
    }
}

/// What a fixture's delivery produced.
#[derive(Debug)]
pub enum Outcome {
    Rejected(hookgate_verify::Rejection),
    /// Signed correctly, but the event could not be derived.
    Failed(String),
    Derived(Identity, Vec<Upsert>),
}

impl Outcome {
    /// The `expect:` block that describes this outcome, for `hookgate check --bless`.
    pub fn expect_block(&self) -> String {
        let q = |text: &str| serde_json::to_string(text).expect("strings serialise");
        let mut out = String::from("expect:\n");
        match self {
            Outcome::Rejected(rejection) => {
                out.push_str("  signature: invalid\n");
                out.push_str(&format!("  rejection: {}\n", rejection.code()));
                out.push_str(&format!("  reason: {}\n", q(&rejection.to_string())));
            }
            Outcome::Failed(error) => {
                out.push_str("  signature: valid\n");
                out.push_str(&format!("  error: {}\n", q(error)));
            }
            Outcome::Derived(identity, upserts) => {
                out.push_str("  signature: valid\n");
                out.push_str(&format!("  key: {}\n", q(&identity.key)));
                out.push_str(&format!("  scope: {}\n", q(&identity.scope)));
                if let Some(event_type) = &identity.event_type {
                    out.push_str(&format!("  event_type: {}\n", q(event_type)));
                }
                if let Some(ordering) = &identity.ordering {
                    out.push_str(&format!(
                        "  ordering: {{ entity: {}, version: {} }}\n",
                        q(&ordering.entity),
                        q(&ordering.version.to_string())
                    ));
                }
                if upserts.is_empty() {
                    out.push_str("  upserts: []\n");
                } else {
                    out.push_str("  upserts:\n");
                    for upsert in upserts {
                        out.push_str(&format!("    - target: {}\n", q(&upsert.target)));
                        out.push_str(&format!("      connector: {}\n", q(&upsert.connector)));
                        out.push_str(&format!("      object: {}\n", q(&upsert.object)));
                        if upsert.operation != Operation::default() {
                            out.push_str(&format!(
                                "      operation: {}\n",
                                upsert.operation.as_str()
                            ));
                        }
                        out.push_str(&format!(
                            "      external_id: {{ field: {}, value: {} }}\n",
                            q(&upsert.external_id_field),
                            q(&upsert.external_id_value)
                        ));
                        if let Some(url) = &upsert.refresh_url {
                            out.push_str(&format!("      refresh_url: {}\n", q(url)));
                        }
                        if !upsert.fields.is_empty() {
                            out.push_str("      fields:\n");
                            for (name, value) in &upsert.fields {
                                out.push_str(&format!("        {}: {}\n", q(name), q(value)));
                            }
                        }
                    }
                }
            }
        }
        out
    }
}

/// `source` with its top-level `expect:` block replaced by `block`.
pub fn replace_expect_block(source: &str, block: &str) -> String {
    let mut out = String::with_capacity(source.len() + block.len());
    let mut inside = false;
    let mut replaced = false;
    for line in source.lines() {
        if !inside && (line == "expect:" || line.starts_with("expect:")) {
            inside = true;
            replaced = true;
            out.push_str(block);
            continue;
        }
        if inside && !line.is_empty() && !line.starts_with(' ') && !line.starts_with('#') {
            inside = false;
        }
        if !inside {
            out.push_str(line);
            out.push('\n');
        }
    }
    if !replaced {
        out.push_str(block);
    }
    out
}

fn show(value: Option<&str>) -> String {
    match value {
        Some(v) => format!("`{v}`"),
        None => "nothing".into(),
    }
}

fn compare_upserts(
    expected: &[ExpectedUpsert],
    actual: &[Upsert],
    mismatch: &mut impl FnMut(&[PathSegment], String),
) {
    if expected.len() != actual.len() {
        let names: Vec<&str> = actual.iter().map(|u| u.target.as_str()).collect();
        mismatch(
            &path!["expect", "upserts"],
            format!(
                "expected {} writes, got {} ({})",
                expected.len(),
                actual.len(),
                names.join(", ")
            ),
        );
    }
    for (i, (expected, actual)) in expected.iter().zip(actual).enumerate() {
        let mut differences = Vec::new();
        let differ = |differences: &mut Vec<String>, what: &str, e: &str, a: &str| {
            if e != a {
                differences.push(format!("{what}: expected `{e}`, got `{a}`"));
            }
        };
        differ(&mut differences, "target", &expected.target, &actual.target);
        differ(&mut differences, "connector", &expected.connector, &actual.connector);
        differ(&mut differences, "object", &expected.object, &actual.object);
        differ(
            &mut differences,
            "operation",
            expected.operation.as_str(),
            actual.operation.as_str(),
        );
        differ(
            &mut differences,
            "external_id.field",
            &expected.external_id.field,
            &actual.external_id_field,
        );
        differ(
            &mut differences,
            "external_id.value",
            &expected.external_id.value,
            &actual.external_id_value,
        );
        for (field, value) in &expected.fields {
            match actual.fields.get(field) {
                Some(actual_value) => {
                    differ(&mut differences, &format!("fields.{field}"), value, actual_value)
                }
                None => differences
                    .push(format!("fields.{field}: expected `{value}`, but it is not written")),
            }
        }
        match (&expected.refresh_url, &actual.refresh_url) {
            (Some(e), Some(a)) => differ(&mut differences, "refresh_url", e, a),
            (Some(e), None) => differences
                .push(format!("refresh_url: expected `{e}`, but the target does not refresh")),
            (None, _) => {}
        }
        for field in actual.fields.keys().filter(|f| !expected.fields.contains_key(*f)) {
            differences.push(format!(
                "fields.{field}: written as `{}`, but not expected",
                actual.fields[field]
            ));
        }
        if !differences.is_empty() {
            mismatch(&path!["expect", "upserts", i], differences.join("; "));
        }
    }
}
