//! Signature verification over hostile headers and bodies, for every scheme at once. Nothing
//! may panic, and nothing forged may verify: the secrets are the fuzzer's to guess.
#![no_main]

use std::sync::LazyLock;

use hookgate_verify::{
    Algorithm, Clock, Encoding, GenericHmac, Request, Scheme, SecretBytes, SignedContent, Verifier,
};
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
];

static VERIFIERS: LazyLock<Vec<Verifier>> = LazyLock::new(|| {
    let generic = |encoding, signed| {
        Scheme::Hmac(GenericHmac {
            header: "X-Signature".into(),
            prefix: "v1=".into(),
            algorithm: Algorithm::Sha512,
            encoding,
            signed,
        })
    };
    let timestamped =
        SignedContent::TimestampAndBody { timestamp_header: "X-Timestamp".into(), separator: ".".into() };
    [
        Scheme::Github,
        Scheme::Stripe,
        Scheme::StandardWebhooks,
        Scheme::Shopify,
        Scheme::Slack,
        Scheme::HubspotV3,
        generic(Encoding::Hex, SignedContent::Body),
        generic(Encoding::Base64, timestamped),
    ]
    .into_iter()
    .map(|scheme| {
        let secret = match scheme {
            Scheme::StandardWebhooks => SecretBytes::new(&b"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"[..]),
            _ => SecretBytes::new(&b"fuzz-secret"[..]),
        };
        Verifier::new(scheme, &[secret], None).expect("a usable secret")
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
    let request = Request { method: "POST", url: "https://hooks.example.com/hooks/x", headers: &headers, body: &body };
    for verifier in VERIFIERS.iter() {
        let verdict = verifier.verify(&request, Clock::from_unix_secs(1_700_000_000));
        assert!(verdict.is_err(), "a forged request verified under {:?}", verifier.scheme());
    }
});
