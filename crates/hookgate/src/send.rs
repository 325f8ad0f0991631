//! `hookgate send`: a delivery signed as the pipeline's sender signs it, posted to a running
//! gateway, and its answer. The test-event button of a sender's dashboard, for any pipeline.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result, bail};
use hookgate_connector_http::HttpSettings;
use hookgate_pipeline::model::SecretRef;
use hookgate_verify::{PrivateKey, SecretBytes, SignInput};

use crate::sign::{compile_pipeline, with_body_field};
use crate::{files, secrets};

/// What to send, and where.
#[derive(Debug)]
pub struct Input<'a> {
    pub pipeline: &'a Path,
    /// The body and the headers (other than the signature's) come from this fixture.
    pub fixture: Option<&'a Path>,
    /// Or the body alone, byte for byte.
    pub body: Option<&'a Path>,
    /// The gateway (`http://127.0.0.1:8080`, posted to `/hooks/NAME`) or a whole hook URL.
    pub to: &'a str,
    /// Headers to add, `Name: value`.
    pub headers: &'a [String],
    pub message_id: Option<&'a str>,
    /// For public-key schemes (SendGrid): the sender's private key, as for `hookgate sign`.
    pub private_key: Option<&'a Path>,
}

/// A fixture's request, as a delivery to send again.
struct FromFixture {
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    method: String,
    secrets: std::collections::BTreeMap<String, String>,
}

fn read_fixture(path: &Path) -> Result<FromFixture> {
    let text = files::read_config(path).map_err(|d| anyhow::anyhow!("{d}"))?;
    let name = path.display().to_string();
    let (loaded, diagnostics) = hookgate_pipeline::load_fixture(&name, &text);
    let Some(loaded) = loaded else {
        let text: Vec<String> = diagnostics.iter().map(ToString::to_string).collect();
        bail!("{}", text.join("\n"));
    };
    let request = loaded.fixture.request;
    let body_path = path.parent().unwrap_or(Path::new(".")).join(&request.body_file);
    let body = files::read_bounded(&body_path, files::BODY_BYTES_MAX)
        .map_err(|d| anyhow::anyhow!("{d}"))?;
    let mut headers: Vec<(String, String)> = request.headers.into_iter().collect();
    headers.extend(request.header_list.into_iter().map(|h| (h.name, h.value)));
    Ok(FromFixture { headers, body, method: request.method, secrets: loaded.fixture.secrets })
}

/// Signs and posts; returns what to print: the URL, the status and the answer's body.
pub async fn run(input: &Input<'_>) -> Result<String> {
    let (_, compiled) = compile_pipeline(input.pipeline)?;
    let name = input.pipeline.display().to_string();
    let fixture = input.fixture.map(read_fixture).transpose()?;
    let (mut headers, body, method) = match (&fixture, input.body) {
        (Some(fixture), None) => {
            (fixture.headers.clone(), fixture.body.clone(), fixture.method.clone())
        }
        (None, Some(path)) => {
            let body = files::read_bounded(path, files::BODY_BYTES_MAX)
                .map_err(|d| anyhow::anyhow!("{d}"))?;
            (Vec::new(), body, "POST".to_owned())
        }
        _ => bail!("give the delivery as `--fixture FILE` or `--body FILE`"),
    };
    for header in input.headers {
        let Some((header_name, value)) = header.split_once(':') else {
            bail!("--header `{header}` is not `Name: value`");
        };
        headers.retain(|(n, _)| !n.eq_ignore_ascii_case(header_name.trim()));
        headers.push((header_name.trim().to_owned(), value.trim().to_owned()));
    }

    // The secret the gateway verifies with: the one the pipeline names, as `serve` reads it;
    // without it, a fixture's test value (for a gateway started with the fixtures' secrets).
    let mut notes = Vec::new();
    // The first secret signs, as a sender holds one; the others only verify.
    let Some((reference, _)) = compiled.secrets.first() else {
        bail!("{name} lists no secret to sign with");
    };
    let (SecretRef::Env(key) | SecretRef::File(key)) = reference;
    let secret =
        match (secrets::resolve(reference), fixture.as_ref().and_then(|f| f.secrets.get(key))) {
            (Ok(secret), _) => secret,
            (Err(_), Some(value)) => {
                notes.push(format!("signed with the fixture's test value of {reference}"));
                SecretBytes::new(value.as_bytes())
            }
            (Err(error), None) => {
                return Err(error)
                    .with_context(|| format!("the secret to sign with ({reference})"));
            }
        };
    let verifier = compiled.verifier(&[secret])?;

    let url = if input.to.contains("/hooks/") {
        input.to.to_owned()
    } else {
        format!("{}/hooks/{}", input.to.trim_end_matches('/'), compiled.name)
    };
    let url = verifier.url_for_body(&url, &body);
    let signed_url = compiled.signed_url(&url);
    let timestamp_secs = hookgate_engine::now_ms() / 1000;
    let message_id = input
        .message_id
        .map_or_else(|| format!("msg_{}", hookgate_engine::now_ms()), str::to_owned);
    let sign_input = SignInput {
        method: &method,
        url: &signed_url,
        body: &body,
        timestamp_secs,
        message_id: &message_id,
    };
    let private_key = match input.private_key {
        Some(path) => {
            let bytes = files::read_bounded(path, 64 * 1024).map_err(|d| anyhow::anyhow!("{d}"))?;
            Some(PrivateKey::parse(&bytes).with_context(|| path.display().to_string())?)
        }
        None => None,
    };
    let signature = verifier.sign_with(&sign_input, private_key.as_ref())?;
    let mut signed_body = body.clone();
    if let Some((pointer, value)) = &signature.body_field {
        signed_body = with_body_field(&body, pointer, value)?;
    }
    // The signature's headers replace the fixture's, which were signed for its clock: every
    // header the scheme reads a signature from goes, alternative names included.
    let stale = compiled.scheme.signing_headers();
    headers.retain(|(n, _)| !stale.iter().any(|s| s.eq_ignore_ascii_case(n)));
    for (header_name, value) in &signature.headers {
        headers.retain(|(n, _)| !n.eq_ignore_ascii_case(header_name));
        headers.push((header_name.clone(), value.clone()));
    }

    let settings = HttpSettings::default();
    let client = hookgate_connector_http::client(&settings)?;
    let method = reqwest::Method::from_bytes(method.as_bytes())
        .with_context(|| format!("`{method}` is not an HTTP method"))?;
    let mut request = client.request(method.clone(), &url).body(signed_body);
    for (header_name, value) in &headers {
        request = request.header(header_name, value);
    }
    let answer = hookgate_connector_http::send(request, &settings)
        .await
        .map_err(|error| anyhow::anyhow!("{method} {url}: {error}"))?;
    let mut out = String::new();
    for note in notes {
        let _ = writeln!(out, "({note})");
    }
    let _ = writeln!(out, "{method} {url} -> {}", answer.status);
    let _ = writeln!(out, "{}", answer.body.trim_end());
    if answer.status >= 300 {
        bail!("{out}the gateway answered {}", answer.status);
    }
    Ok(out)
}
