//! `hookgate sign`: the headers a sender would send with a body, so that fixture authors do not
//! compute signatures by hand.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result, bail};
use hookgate_verify::{SignInput, Verifier};

use crate::{files, secrets};

#[derive(Debug)]
pub struct Input<'a> {
    pub pipeline: &'a Path,
    pub body: &'a Path,
    pub timestamp: Option<i64>,
    pub message_id: &'a str,
    pub url: &'a str,
    pub method: &'a str,
}

/// The signature headers, one `Name: value` line each, ready for a fixture's `headers:`.
pub fn run(input: &Input<'_>) -> Result<String> {
    let source = files::read_config(input.pipeline).map_err(|d| anyhow::anyhow!("{d}"))?;
    let name = input.pipeline.display().to_string();
    let (compiled, diagnostics) = hookgate_pipeline::load_pipeline(&name, &source, None);
    let Some(compiled) = compiled else {
        let text: Vec<String> = diagnostics.iter().map(ToString::to_string).collect();
        bail!("{}", text.join("\n"));
    };
    let Some((reference, _)) = compiled.secrets.first() else { bail!("{name} lists no secret") };
    let secret = secrets::resolve(reference)
        .with_context(|| format!("the secret to sign with ({reference})"))?;
    let verifier = Verifier::new(compiled.scheme.clone(), &[secret], compiled.tolerance_secs)?;
    let body = files::read_bounded(input.body, files::BODY_BYTES_MAX)
        .map_err(|d| anyhow::anyhow!("{d}"))?;
    let timestamp_secs = input.timestamp.unwrap_or_else(|| hookgate_engine::now_ms() / 1000);
    let headers = verifier.sign(&SignInput {
        method: input.method,
        url: input.url,
        body: &body,
        timestamp_secs,
        message_id: input.message_id,
    });
    let mut out = String::new();
    for (name, value) in headers {
        let _ = writeln!(out, "{name}: {value}");
    }
    Ok(out)
}
