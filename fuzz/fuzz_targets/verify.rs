//! Signature verification over hostile headers and bodies, for every scheme at once. Nothing
//! may panic, and nothing forged may verify: the secrets are the fuzzer's to guess.
#![no_main]

use std::sync::LazyLock;

use hookgate_verify::{Clock, Preset, Request, SecretBytes, Verifier};
use libfuzzer_sys::fuzz_target;

/// Every header any scheme reads; the input gives each a value.
const HEADERS: &[&str] = &[
    "x-hub-signature-256",
    "stripe-signature",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "x-shopify-hmac-sha256",
    "x-slack-signature",
    "x-slack-request-timestamp",
    "x-hubspot-signature-v3",
    "x-hubspot-request-timestamp",
    "x-signature",
    "x-timestamp",
    // Appended, so that the committed corpus keeps its meaning.
    "x-hubspot-signature",
    "x-hubspot-signature-version",
    "x-twilio-signature",
    "paddle-signature",
    "calendly-webhook-signature",
    "x-square-hmacsha256-signature",
    "x-zendesk-webhook-signature",
    "x-zendesk-webhook-signature-timestamp",
    "x-hub-signature",
    "authorization",
    "x-api-key",
    "svix-id",
    "svix-timestamp",
    "svix-signature",
];

static VERIFIERS: LazyLock<Vec<Verifier>> = LazyLock::new(|| {
    // Every preset that verifies with a shared secret; SendGrid's and SNS's public keys would
    // need a key pair the fuzzer cannot forge anyway, and their parsing is covered by the
    // shared engine.
    Preset::ALL
        .into_iter()
        .filter(|p| !matches!(p, Preset::Sendgrid | Preset::AwsSns))
        .map(|preset| {
            let secret = match preset {
                Preset::StandardWebhooks | Preset::Svix | Preset::SupabaseAuth => {
                    SecretBytes::new(&b"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"[..])
                }
                _ => SecretBytes::new(&b"fuzz-secret"[..]),
            };
            Verifier::new(preset.scheme(), &[secret], None).expect("a usable secret")
        })
        .collect()
});

fuzz_target!(|data: &[u8]| {
    // Header values, then the body, separated by NUL bytes; a missing part is no header.
    let mut parts = data.split(|b| *b == 0);
    let headers: Vec<(String, Vec<u8>)> = HEADERS
        .iter()
        .zip(parts.by_ref())
        .filter(|(_, value)| !value.is_empty())
        .map(|(name, value)| ((*name).to_owned(), value.to_vec()))
        .collect();
    let body: Vec<u8> = parts.flatten().copied().collect();
    let request = Request {
        method: "POST",
        url: "https://hooks.example.com/hooks/x",
        headers: &headers,
        body: &body,
    };
    for verifier in VERIFIERS.iter() {
        let verdict = verifier.verify(&request, Clock::from_unix_secs(1_700_000_000));
        assert!(verdict.is_err(), "a forged request verified under {:?}", verifier.scheme());
    }
});
