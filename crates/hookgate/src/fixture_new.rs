//! `hookgate fixture new`: a signed fixture for a body, its expectation written from what the
//! delivery produces, so a fixture is reviewed rather than typed.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use hookgate_pipeline::model::SecretRef;
use hookgate_verify::{KeyFormat, PrivateKey, SecretBytes, SignInput};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::check::fixture_dir;
use crate::files;

#[derive(Debug)]
pub struct NewFixture<'a> {
    pub pipeline: &'a Path,
    pub body: &'a Path,
    /// The fixture's file name, without `.yaml`.
    pub name: &'a str,
    pub url: Option<&'a str>,
    /// RFC 3339; the signing time and the fixture's clock. Default: now.
    pub now: Option<&'a str>,
    /// Headers the sender sends besides the signature (`Name: value`).
    pub headers: &'a [String],
    pub message_id: &'a str,
    /// Test values for secret references (`NAME=VALUE`); others are made up.
    pub secrets: &'a [String],
    pub private_key: Option<&'a Path>,
}

/// Writes the fixture and returns its path.
pub fn run(input: &NewFixture<'_>) -> Result<PathBuf> {
    if input.name.is_empty()
        || !input.name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        bail!("`{}` is not a fixture name (letters, digits, `-`, `_`)", input.name);
    }
    let (source, compiled) = crate::sign::compile_pipeline(input.pipeline)?;
    let pipeline_name = input.pipeline.display().to_string();
    let dir = fixture_dir(input.pipeline);
    let path = dir.join(format!("{}.yaml", input.name));
    if path.exists() {
        bail!("{} exists; choose another name", path.display());
    }

    // Test secrets: given, or made up in the form the scheme reads.
    let given: Vec<(&str, &str)> = input
        .secrets
        .iter()
        .map(|pair| pair.split_once('=').context("secrets are given as NAME=VALUE"))
        .collect::<Result<_>>()?;
    let mut secrets = Vec::new();
    for (i, (reference, _)) in compiled.secrets.iter().enumerate() {
        let name = match reference {
            SecretRef::Env(name) | SecretRef::File(name) => name.as_str(),
        };
        let value = match given.iter().find(|(n, _)| *n == name) {
            Some((_, value)) => (*value).to_owned(),
            None => match compiled.scheme.key_format() {
                KeyFormat::Raw => format!("fixture-secret-{}", i + 1),
                KeyFormat::Whsec => format!(
                    "whsec_{}",
                    base64::engine::general_purpose::STANDARD
                        .encode(format!("hookgate fixture secret {}", i + 1))
                ),
                KeyFormat::PublicKey | KeyFormat::Certificate => bail!(
                    "`{}` verifies with a public key: give it with --secret {name}=VALUE and sign with --private-key",
                    compiled.scheme.name
                ),
            },
        };
        secrets.push((name.to_owned(), value));
    }
    let Some((_, first)) = secrets.first() else { bail!("{pipeline_name} lists no secret") };

    let now = match input.now {
        Some(text) => OffsetDateTime::parse(text, &Rfc3339)
            .with_context(|| format!("`{text}` is not an RFC 3339 time"))?,
        None => {
            OffsetDateTime::now_utc().replace_nanosecond(0).unwrap_or(OffsetDateTime::UNIX_EPOCH)
        }
    };
    let private_key = match input.private_key {
        Some(path) => {
            let bytes = files::read_bounded(path, 64 * 1024).map_err(|d| anyhow::anyhow!("{d}"))?;
            Some(PrivateKey::parse(&bytes).with_context(|| path.display().to_string())?)
        }
        None => None,
    };
    let mut body = files::read_bounded(input.body, files::BODY_BYTES_MAX)
        .map_err(|d| anyhow::anyhow!("{d}"))?;
    let url = input.url.unwrap_or("https://hookgate.example/hooks");
    let verifier = compiled.verifier(&[SecretBytes::new(first.as_bytes())])?;
    let signature = verifier.sign_with(
        &SignInput {
            method: "POST",
            url: &compiled.signed_url(url),
            body: &body,
            timestamp_secs: now.unix_timestamp(),
            message_id: input.message_id,
        },
        private_key.as_ref(),
    )?;
    if let Some((pointer, value)) = &signature.body_field {
        body = crate::sign::with_body_field(&body, pointer, value)?;
    }

    // The body beside the fixture, under the fixture's name.
    let extension = input.body.extension().and_then(|e| e.to_str()).unwrap_or("body");
    let body_file = format!("{}.{extension}", input.name);
    std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
    let body_path = dir.join(&body_file);
    if body_path.exists() {
        bail!("{} exists; choose another name", body_path.display());
    }
    std::fs::write(&body_path, &body).with_context(|| body_path.display().to_string())?;

    let q = |text: &str| serde_json::to_string(text).expect("strings serialise");
    // The fixture's modeline, one directory deeper than the pipeline's own.
    let mut text = String::new();
    if let Some(schema) = source
        .lines()
        .find_map(|line| line.strip_prefix("# yaml-language-server: $schema="))
        .and_then(|p| p.trim().strip_suffix("pipeline.schema.json"))
    {
        let _ = writeln!(text, "# yaml-language-server: $schema=../{schema}fixture.schema.json");
    }
    let _ = writeln!(text, "description: {}", q("Written by `hookgate fixture new`; review it."));
    text.push_str("secrets:\n");
    for (name, value) in &secrets {
        let _ = writeln!(text, "  {}: {}", q(name), q(value));
    }
    text.push_str("request:\n");
    if let Some(url) = input.url {
        let _ = writeln!(text, "  url: {}", q(url));
    }
    text.push_str("  headers:\n");
    for line in input.headers {
        let (name, value) =
            line.split_once(':').with_context(|| format!("`{line}` is not `Name: value`"))?;
        let _ = writeln!(text, "    {}: {}", q(name.trim()), q(value.trim()));
    }
    for (name, value) in &signature.headers {
        let _ = writeln!(text, "    {}: {}", q(name), q(value));
    }
    let _ = writeln!(text, "  body_file: {}", q(&body_file));
    let _ = writeln!(text, "  now: {}", now.format(&Rfc3339)?);
    text.push_str("expect:\n  signature: valid\n");

    // The expectation, from what the delivery produces.
    let (loaded, found) = hookgate_pipeline::load_fixture(&path.display().to_string(), &text);
    let Some(loaded) = loaded else {
        let text: Vec<String> = found.iter().map(ToString::to_string).collect();
        bail!("{}", text.join("\n"));
    };
    let outcome = loaded.fixture.outcome(&compiled, &body).map_err(|problems| {
        let text: Vec<String> = problems.into_iter().map(|p| p.message).collect();
        anyhow::anyhow!("{}", text.join("; "))
    })?;
    let text = hookgate_pipeline::fixture::replace_expect_block(&text, &outcome.expect_block());
    std::fs::write(&path, text).with_context(|| path.display().to_string())?;
    Ok(path)
}
