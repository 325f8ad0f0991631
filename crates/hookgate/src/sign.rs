//! `hookgate sign`: the headers a sender would send with a body, so that fixture authors do not
//! compute signatures by hand.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result, bail};
use hookgate_pipeline::CompiledPipeline;
use hookgate_pipeline::model::SecretRef;
use hookgate_verify::{Clock, PrivateKey, Request, SecretBytes, SignInput};

use crate::{files, secrets};

#[derive(Debug)]
pub struct Input<'a> {
    pub pipeline: &'a Path,
    pub body: &'a Path,
    /// A fixture whose `secrets` give the secret to sign with.
    pub fixture: Option<&'a Path>,
    /// The sender's private key, for public-key schemes.
    pub private_key: Option<&'a Path>,
    pub timestamp: Option<i64>,
    pub message_id: &'a str,
    pub url: &'a str,
    pub method: &'a str,
}

/// The signature headers, one `Name: value` line each, ready for a fixture's `headers:`.
/// One pipeline file, compiled on its own (no instances file): its text and the result, or
/// its diagnostics as the error.
pub(crate) fn compile_pipeline(path: &Path) -> Result<(String, CompiledPipeline)> {
    let source = files::read_config(path).map_err(|d| anyhow::anyhow!("{d}"))?;
    let name = path.display().to_string();
    let (compiled, diagnostics) = hookgate_pipeline::load_pipeline(&name, &source, None);
    let Some(compiled) = compiled else {
        let text: Vec<String> = diagnostics.iter().map(ToString::to_string).collect();
        bail!("{}", text.join("\n"));
    };
    Ok((source, compiled))
}

pub fn run(input: &Input<'_>) -> Result<String> {
    let (_, compiled) = compile_pipeline(input.pipeline)?;
    let name = input.pipeline.display().to_string();
    let Some((reference, _)) = compiled.secrets.first() else { bail!("{name} lists no secret") };
    let secret = match input.fixture {
        Some(path) => {
            let text = files::read_config(path).map_err(|d| anyhow::anyhow!("{d}"))?;
            let fixture_name = path.display().to_string();
            let (loaded, diagnostics) = hookgate_pipeline::load_fixture(&fixture_name, &text);
            let Some(loaded) = loaded else {
                let text: Vec<String> = diagnostics.iter().map(ToString::to_string).collect();
                bail!("{}", text.join("\n"));
            };
            let fixture = loaded.fixture;
            let name = match reference {
                SecretRef::Env(name) | SecretRef::File(name) => name,
            };
            let Some(value) = fixture.secrets.get(name) else {
                bail!("{fixture_name} gives no test value for `{name}` ({reference})");
            };
            SecretBytes::new(value.as_bytes())
        }
        None => secrets::resolve(reference)
            .with_context(|| format!("the secret to sign with ({reference})"))?,
    };
    let verifier = compiled.verifier(&[secret])?;
    let url = compiled.signed_url(input.url);
    let body = files::read_bounded(input.body, files::BODY_BYTES_MAX)
        .map_err(|d| anyhow::anyhow!("{d}"))?;
    let timestamp_secs = input.timestamp.unwrap_or_else(|| hookgate_engine::now_ms() / 1000);
    let private_key = match input.private_key {
        Some(path) => {
            let bytes = files::read_bounded(path, 64 * 1024).map_err(|d| anyhow::anyhow!("{d}"))?;
            Some(PrivateKey::parse(&bytes).with_context(|| path.display().to_string())?)
        }
        None => None,
    };
    let sign_input = SignInput {
        method: input.method,
        url: &url,
        body: &body,
        timestamp_secs,
        message_id: input.message_id,
    };
    let signature = verifier.sign_with(&sign_input, private_key.as_ref())?;
    // A signature the pipeline's own keys do not accept is a mismatched key pair: say so
    // rather than print something no fixture will pass with.
    let mut headers: Vec<(String, Vec<u8>)> =
        signature.headers.iter().map(|(n, v)| (n.clone(), v.clone().into_bytes())).collect();
    let mut signed_body = body.clone();
    if let Some((pointer, value)) = &signature.body_field {
        signed_body = with_body_field(&body, pointer, value)?;
    }
    headers.shrink_to_fit();
    let request =
        Request { method: input.method, url: &url, headers: &headers, body: &signed_body };
    verifier.verify(&request, Clock::from_unix_secs(timestamp_secs)).map_err(|rejection| {
        anyhow::anyhow!("the signature does not verify with the pipeline's key: {rejection}")
    })?;
    let mut out = String::new();
    for (name, value) in &signature.headers {
        let _ = writeln!(out, "{name}: {value}");
    }
    if let Some((pointer, value)) = &signature.body_field {
        let _ = writeln!(out, "body {pointer}: {value}");
    }
    Ok(out)
}

/// The body with one string member set (the rest of the JSON is re-serialised; senders that
/// sign body members sign their values, not the body's bytes).
pub(crate) fn with_body_field(body: &[u8], pointer: &str, value: &str) -> Result<Vec<u8>> {
    let mut json: serde_json::Value =
        serde_json::from_slice(body).context("the body must be JSON for this scheme")?;
    let value = serde_json::Value::String(value.to_owned());
    match json.pointer_mut(pointer) {
        Some(slot) => *slot = value,
        None => {
            // A top-level member that is absent is added.
            let name = pointer.strip_prefix('/').filter(|n| !n.contains('/'));
            let (Some(name), Some(object)) = (name, json.as_object_mut()) else {
                anyhow::bail!("the body has no `{pointer}`");
            };
            object.insert(name.replace("~1", "/").replace("~0", "~"), value);
        }
    }
    Ok(serde_json::to_vec(&json)?)
}
