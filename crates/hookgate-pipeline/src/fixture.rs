//! Pipeline fixtures: a sample delivery, given exactly, and the verdict expected for it.
//! Running one needs no server and no CRM; the caller reads the body file and passes it in.

use std::collections::BTreeMap;

use hookgate_verify::{Clock, Request, SecretBytes};
use schemars::JsonSchema;
use serde::Deserialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::check::CompiledPipeline;
use crate::evaluate::{Delivery, Upsert};
use crate::model::{Operation, SecretRef};
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
    pub fn run(&self, pipeline: &CompiledPipeline, body: &[u8]) -> Vec<Mismatch> {
        let mut out = Vec::new();
        let mut mismatch = |path: &[PathSegment], message: String| {
            out.push(Mismatch { path: path.to_vec(), message })
        };

        let mut secrets = Vec::new();
        for (reference, _) in &pipeline.secrets {
            match self.secret(reference) {
                Some(secret) => secrets.push(secret),
                None => mismatch(
                    &path!["secrets"],
                    format!("no test value for {reference}; add it under `secrets`"),
                ),
            }
        }
        let now = match OffsetDateTime::parse(&self.request.now, &Rfc3339) {
            Ok(now) => Clock {
                unix_ms: i64::try_from(now.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX),
            },
            Err(e) => {
                mismatch(
                    &path!["request", "now"],
                    format!("`{}` is not an RFC 3339 timestamp: {e}", self.request.now),
                );
                return out;
            }
        };
        if secrets.len() != pipeline.secrets.len() {
            return out;
        }
        let verifier = match pipeline.verifier(&secrets) {
            Ok(verifier) => verifier,
            Err(e) => {
                mismatch(&path!["secrets"], format!("test secret unusable: {e}"));
                return out;
            }
        };
        let headers = self.request.all_headers();
        let url = pipeline.signed_url(&self.request.url);
        let request = Request { method: &self.request.method, url: &url, headers: &headers, body };
        let expect = &self.expect;
        match (verifier.verify(&request, now), expect.signature) {
            (Ok(_), SignatureVerdict::Valid) => {}
            (Ok(_), SignatureVerdict::Invalid) => {
                mismatch(
                    &path!["expect", "signature"],
                    "expected the signature to be rejected, but it is valid".into(),
                );
                return out;
            }
            (Err(rejection), SignatureVerdict::Valid) => {
                mismatch(
                    &path!["expect", "signature"],
                    format!("expected a valid signature, but it was rejected: {rejection}"),
                );
                return out;
            }
            (Err(rejection), SignatureVerdict::Invalid) => {
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
        }

        let delivery = Delivery { headers: &headers, body };
        let evaluated = pipeline.evaluate(&delivery).and_then(|(identity, upserts)| {
            pipeline.check_future(&identity, now.unix_ms)?;
            Ok((identity, upserts))
        });
        let (identity, upserts) = match (evaluated, &expect.error) {
            (Ok(result), None) => result,
            (Ok(_), Some(text)) => {
                mismatch(
                    &path!["expect", "error"],
                    format!("expected an error containing `{text}`, but the event was derived"),
                );
                return out;
            }
            (Err(error), Some(text)) => {
                if !error.to_string().contains(text.as_str()) {
                    mismatch(
                        &path!["expect", "error"],
                        format!("expected an error containing `{text}`, got `{error}`"),
                    );
                }
                return out;
            }
            (Err(error), None) => {
                mismatch(&path!["expect"], format!("the event could not be derived: {error}"));
                return out;
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
                if expected.entity != actual.entity || expected.version != version {
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
