//! Published vectors from the senders' docs and official SDK test suites, and the negative
//! cases those suites test. Each vector names its source.

use super::*;

struct Case<'a> {
    method: &'a str,
    url: &'a str,
    headers: Vec<(&'a str, &'a str)>,
    body: &'a [u8],
    now: Clock,
}

impl<'a> Case<'a> {
    fn post(headers: Vec<(&'a str, &'a str)>, body: &'a [u8], now_secs: i64) -> Case<'a> {
        Case { method: "POST", url: "", headers, body, now: Clock::from_unix_secs(now_secs) }
    }

    fn run(&self, verifier: &Verifier) -> Result<Verified, Rejection> {
        let headers: Vec<(String, Vec<u8>)> =
            self.headers.iter().map(|(n, v)| ((*n).to_owned(), v.as_bytes().to_vec())).collect();
        let request =
            Request { method: self.method, url: self.url, headers: &headers, body: self.body };
        verifier.verify(&request, self.now)
    }

    fn with_header(mut self, name: &'a str, value: &'a str) -> Case<'a> {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.headers.push((name, value));
        self
    }

    fn without_header(mut self, name: &str) -> Case<'a> {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self
    }
}

fn verifier(scheme: Scheme, secrets: &[&str]) -> Verifier {
    let secrets: Vec<SecretBytes> =
        secrets.iter().map(|s| SecretBytes::new(s.as_bytes())).collect();
    Verifier::new(scheme, &secrets, None).expect("valid secrets")
}

#[track_caller]
fn accepts(verifier: &Verifier, case: &Case<'_>) -> Verified {
    match case.run(verifier) {
        Ok(verified) => verified,
        Err(rejection) => panic!("expected acceptance, got rejection: {rejection}"),
    }
}

#[track_caller]
fn rejects(verifier: &Verifier, case: &Case<'_>, code: &str) {
    match case.run(verifier) {
        Ok(_) => panic!("expected rejection `{code}`, got acceptance"),
        Err(rejection) => assert_eq!(rejection.code(), code, "{rejection}"),
    }
}

// GitHub docs, "Validating webhook deliveries": secret "It's a Secret to Everybody", payload
// "Hello, World!".
const GITHUB_SIG: &str = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";

fn github_case(signature: &str) -> Case<'_> {
    Case::post(vec![("X-Hub-Signature-256", signature)], b"Hello, World!", 0)
}

#[test]
fn github_published_vector() {
    let v = verifier(Scheme::Github, &["It's a Secret to Everybody"]);
    assert_eq!(accepts(&v, &github_case(GITHUB_SIG)).secret_index, 0);
    // Header names are case-insensitive.
    let lower = github_case(GITHUB_SIG)
        .without_header("X-Hub-Signature-256")
        .with_header("x-hub-signature-256", GITHUB_SIG);
    accepts(&v, &lower);
}

#[test]
fn github_negative_cases() {
    let v = verifier(Scheme::Github, &["It's a Secret to Everybody"]);
    rejects(&v, &github_case(GITHUB_SIG).without_header("X-Hub-Signature-256"), "missing_header");
    // Octokit compares the whole `sha256=<hex>` string: a bare hex or uppercase hex fails.
    rejects(&v, &github_case(&GITHUB_SIG[7..]), "signature_mismatch");
    rejects(&v, &github_case(&GITHUB_SIG.to_uppercase()), "signature_mismatch");
    let tampered = Case::post(vec![("X-Hub-Signature-256", GITHUB_SIG)], b"Hello, World?", 0);
    rejects(&v, &tampered, "signature_mismatch");
    let wrong = verifier(Scheme::Github, &["It's a Secret to Nobody"]);
    rejects(&wrong, &github_case(GITHUB_SIG), "signature_mismatch");
    // A header sent twice is not resolved by picking one.
    let twice = github_case(GITHUB_SIG);
    let twice =
        Case { headers: vec![twice.headers[0], ("x-hub-signature-256", GITHUB_SIG)], ..twice };
    rejects(&v, &twice, "malformed_header");
    rejects(&v, &github_case(""), "malformed_header");
}

#[test]
fn github_rotation_like_octokit_verify_with_fallback() {
    let v = verifier(Scheme::Github, &["new secret", "It's a Secret to Everybody"]);
    assert_eq!(accepts(&v, &github_case(GITHUB_SIG)).secret_index, 1);
}

// stripe-dotnet `EventUtilityTest`: secret "webhook_secret", t=1533204620, body in
// tests/vectors/stripe-dotnet-event.json (with its trailing newline).
const STRIPE_BODY: &[u8] = include_bytes!("../tests/vectors/stripe-dotnet-event.json");
const STRIPE_HEADER: &str = "t=1533204620,v1=2220f87ef101a04665f11cdf770523143f875572008577fa0f20882ddb9cc3c7,v0=63f3a72374a733066c4be69ed7f8e5ac85c22c9f0a6a612ab9a025a9e4ee7eef";
const STRIPE_T: i64 = 1533204620;

fn stripe_case(header: &str, now: i64) -> Case<'_> {
    Case::post(vec![("Stripe-Signature", header)], STRIPE_BODY, now)
}

#[test]
fn stripe_published_vector() {
    let v = verifier(Scheme::Stripe, &["webhook_secret"]);
    let verified = accepts(&v, &stripe_case(STRIPE_HEADER, STRIPE_T + 100));
    assert_eq!(verified.timestamp_secs, Some(STRIPE_T));
}

#[test]
fn stripe_negative_cases() {
    let v = verifier(Scheme::Stripe, &["webhook_secret"]);
    // RejectOutdatedTimestamp: now = t + tolerance + 100.
    rejects(&v, &stripe_case(STRIPE_HEADER, STRIPE_T + 400), "timestamp_too_old");
    // Exactly the tolerance is accepted by every Stripe SDK.
    accepts(&v, &stripe_case(STRIPE_HEADER, STRIPE_T + 300));
    // Future: we follow stripe-dotnet and stripe-php and reject beyond the tolerance.
    accepts(&v, &stripe_case(STRIPE_HEADER, STRIPE_T - 300));
    rejects(&v, &stripe_case(STRIPE_HEADER, STRIPE_T - 301), "timestamp_too_new");
    // RejectIncorrectSignature: the body is changed.
    let mut tampered = STRIPE_BODY.to_vec();
    tampered.extend_from_slice(b"this_changes_the_json");
    let case = Case::post(vec![("Stripe-Signature", STRIPE_HEADER)], &tampered, STRIPE_T);
    rejects(&v, &case, "signature_mismatch");
    // Re-serialised body (whitespace removed) fails too.
    let compact = serde_like_compact(STRIPE_BODY);
    let case = Case::post(vec![("Stripe-Signature", STRIPE_HEADER)], &compact, STRIPE_T);
    rejects(&v, &case, "signature_mismatch");
    // ValidateSignatureHandlesIncorrectHeaderValues.
    for header in [
        "t=,v1=2220f87ef101a04665f11cdf770523143f875572008577fa0f20882ddb9cc3c7",
        "t,v1=,v0=",
        "t,v1=,v0",
        "t,v1=,",
        "t,,",
        ",,",
        "t",
        "i'm not even a real signature header",
    ] {
        let result = stripe_case(header, STRIPE_T).run(&v);
        assert!(result.is_err(), "{header:?} must be rejected");
    }
    // NoV1Signatures: a header with only v0 fails.
    rejects(
        &v,
        &stripe_case(
            "t=1533204620,v0=63f3a72374a733066c4be69ed7f8e5ac85c22c9f0a6a612ab9a025a9e4ee7eef",
            STRIPE_T,
        ),
        "malformed_header",
    );
    // MultipleSignatures_AtLeastOneValid: a bad extra v1 does not hide the good one.
    let extra = format!(
        "{STRIPE_HEADER},v1=deadbeefdeadbeefdeadbeefdeadbeefdeadbeefdeadbeefdeadbeefdeadbeef"
    );
    accepts(&v, &stripe_case(&extra, STRIPE_T));
    let extra_first = format!("t=1533204620,v1=bad_signature,{}", &STRIPE_HEADER[13..]);
    accepts(&v, &stripe_case(&extra_first, STRIPE_T));
    // Wrong secret.
    let wrong = verifier(Scheme::Stripe, &["wrong_secret"]);
    rejects(&wrong, &stripe_case(STRIPE_HEADER, STRIPE_T), "signature_mismatch");
}

fn serde_like_compact(body: &[u8]) -> Vec<u8> {
    body.iter().copied().filter(|b| !b.is_ascii_whitespace()).collect()
}

// Standard Webhooks spec and Svix docs: secret whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw.
const SW_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SW_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const SW_TS: &str = "1614265330";
const SW_BODY: &[u8] = br#"{"test": 2432232314}"#;
const SW_SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

fn standard_case<'a>(signature: &'a str, now: i64) -> Case<'a> {
    Case::post(
        vec![("webhook-id", SW_ID), ("webhook-timestamp", SW_TS), ("webhook-signature", signature)],
        SW_BODY,
        now,
    )
}

#[test]
fn standard_webhooks_published_vector() {
    let v = verifier(Scheme::StandardWebhooks, &[SW_SECRET]);
    accepts(&v, &standard_case(SW_SIG, 1614265330));
    // Svix header names, and the secret without its prefix, work the same.
    let svix = Case::post(
        vec![("svix-id", SW_ID), ("svix-timestamp", SW_TS), ("svix-signature", SW_SIG)],
        SW_BODY,
        1614265330,
    );
    accepts(&verifier(Scheme::StandardWebhooks, &["MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]), &svix);
    // Several entries: any v1 may match; other versions are skipped.
    let list = format!("v1a,AAAA v1,Zm9v {SW_SIG}");
    accepts(&v, &standard_case(&list, 1614265330));
}

#[test]
fn standard_webhooks_negative_cases() {
    let v = verifier(Scheme::StandardWebhooks, &[SW_SECRET]);
    let t = 1614265330;
    // The tolerance is inclusive on both sides (python, go and rust accept exactly 300 s).
    accepts(&v, &standard_case(SW_SIG, t + 300));
    accepts(&v, &standard_case(SW_SIG, t - 300));
    rejects(&v, &standard_case(SW_SIG, t + 301), "timestamp_too_old");
    rejects(&v, &standard_case(SW_SIG, t - 301), "timestamp_too_new");
    // A v2 entry carrying the right bytes is not a v1 signature.
    rejects(
        &v,
        &standard_case("v2,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", t),
        "signature_mismatch",
    );
    rejects(
        &v,
        &standard_case("g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", t),
        "signature_mismatch",
    );
    rejects(
        &v,
        &standard_case(SW_SIG, t).with_header("webhook-timestamp", "hello"),
        "malformed_header",
    );
    rejects(&v, &standard_case(SW_SIG, t).without_header("webhook-id"), "missing_header");
    // Changing the (signed) timestamp breaks the signature even inside the window.
    rejects(
        &v,
        &standard_case(SW_SIG, t).with_header("webhook-timestamp", "1614265331"),
        "signature_mismatch",
    );
    let tampered = Case { body: br#"{"test": 2432232315}"#, ..standard_case(SW_SIG, t) };
    rejects(&v, &tampered, "signature_mismatch");
    // An empty secret or a bare prefix is a configuration error.
    for bad in ["", "whsec_", "whsec_!!!"] {
        assert!(
            Verifier::new(Scheme::StandardWebhooks, &[SecretBytes::new(bad)], None).is_err(),
            "{bad:?}"
        );
    }
}

// shopify-api-js `validate.test.ts`: apiSecretKey "test_secret_key", rawBody '{"foo": "bar"}'.
const SHOPIFY_HMAC: &str = "B23tXN681gZ0qIWNRrgtzBE9XSDo5yaUu6wfmhu3a7g=";

#[test]
fn shopify_published_vector_and_negatives() {
    let v = verifier(Scheme::Shopify, &["test_secret_key"]);
    let case = Case::post(vec![("X-Shopify-Hmac-Sha256", SHOPIFY_HMAC)], br#"{"foo": "bar"}"#, 0);
    accepts(&v, &case);
    rejects(&v, &Case { body: b"", ..case }, "empty_body");
    let case = Case::post(vec![("X-Shopify-Hmac-Sha256", SHOPIFY_HMAC)], br#"{"foo":"bar"}"#, 0);
    rejects(&v, &case, "signature_mismatch");
    rejects(&v, &case.without_header("X-Shopify-Hmac-Sha256"), "missing_header");
}

// Slack docs, "Verifying requests from Slack".
const SLACK_BODY: &[u8] = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
const SLACK_SIG: &str = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";

fn slack_case(now: i64) -> Case<'static> {
    Case::post(
        vec![("X-Slack-Request-Timestamp", "1531420618"), ("X-Slack-Signature", SLACK_SIG)],
        SLACK_BODY,
        now,
    )
}

#[test]
fn slack_published_vector_and_window() {
    let v = verifier(Scheme::Slack, &["8f742231b10e8888abcd99yyyzzz85a5"]);
    accepts(&v, &slack_case(1531420618));
    accepts(&v, &slack_case(1531420618 + 300));
    accepts(&v, &slack_case(1531420618 - 300));
    rejects(&v, &slack_case(1531420618 + 301), "timestamp_too_old");
    rejects(&v, &slack_case(1531420618 - 301), "timestamp_too_new");
    rejects(
        &v,
        &slack_case(1531420618).with_header("X-Slack-Signature", &SLACK_SIG[3..]),
        "signature_mismatch",
    );
    rejects(
        &v,
        &slack_case(1531420618).without_header("X-Slack-Request-Timestamp"),
        "missing_header",
    );
}

// hubspot-api-python `tests/spec/utils/test_signature.py`, v3.
const HUBSPOT_SECRET: &str = "yyyyyyyy-yyyy-yyyy-yyyy-yyyyyyyyyyyy";
const HUBSPOT_BODY: &[u8] = b"{'example_field':'example_value'}";
const HUBSPOT_SIG: &str = "HPW73RUtKmcYoEDADG0s6MmGFWUzWJKAW07r8RDgcQw=";

fn hubspot_case(now_ms: i64) -> Case<'static> {
    Case {
        method: "POST",
        url: "https://www.example.com/webhook_uri",
        headers: vec![
            ("X-HubSpot-Signature-v3", HUBSPOT_SIG),
            ("X-HubSpot-Request-Timestamp", "15000000"),
        ],
        body: HUBSPOT_BODY,
        now: Clock { unix_ms: now_ms },
    }
}

#[test]
fn hubspot_v3_published_vector_and_window() {
    let v = verifier(Scheme::HubspotV3, &[HUBSPOT_SECRET]);
    // The timestamp is in milliseconds: 15000000 ms = 15000 s.
    accepts(&v, &hubspot_case(15_000_000));
    accepts(&v, &hubspot_case(15_000_000 + 299_999));
    // The SDK checks `now - ts < 300` strictly: exactly 300 s old is rejected.
    rejects(&v, &hubspot_case(15_000_000 + 300_000), "timestamp_too_old");
    rejects(&v, &hubspot_case(15_000_000 - 300_001), "timestamp_too_new");
    let get = Case { method: "GET", ..hubspot_case(15_000_000) };
    rejects(&v, &get, "signature_mismatch");
    let other_url =
        Case { url: "https://www.example.com/webhook_uri?x=1", ..hubspot_case(15_000_000) };
    rejects(&v, &other_url, "signature_mismatch");
}

#[test]
fn generic_hmac_body_and_timestamped() {
    // The GitHub vector again, described generically: same bytes, same verdict.
    let generic = Scheme::Hmac(GenericHmac {
        header: "X-Hub-Signature-256".into(),
        prefix: "sha256=".into(),
        algorithm: Algorithm::Sha256,
        encoding: Encoding::Hex,
        signed: SignedContent::Body,
    });
    let v = verifier(generic, &["It's a Secret to Everybody"]);
    accepts(&v, &github_case(GITHUB_SIG));
    rejects(&v, &github_case(&GITHUB_SIG[7..]), "signature_mismatch");

    // Slack's vector, described generically with a prefix and a separator.
    let generic = Scheme::Hmac(GenericHmac {
        header: "X-Slack-Signature".into(),
        prefix: "v0=".into(),
        algorithm: Algorithm::Sha256,
        encoding: Encoding::Hex,
        signed: SignedContent::TimestampAndBody {
            timestamp_header: "X-Slack-Request-Timestamp".into(),
            separator: ":".into(),
        },
    });
    let key = SecretBytes::new("8f742231b10e8888abcd99yyyzzz85a5");
    let v = Verifier::new(generic, &[key], Some(60)).expect("valid");
    // The generic scheme signs `ts:body` (no `v0:` in front), so Slack's vector must fail...
    rejects(&v, &slack_case(1531420618), "signature_mismatch");
    // ...and one computed by that rule passes, within its 60 s tolerance only.
    let mac = compute_mac(
        Algorithm::Sha256,
        b"8f742231b10e8888abcd99yyyzzz85a5",
        &[b"1531420618:", SLACK_BODY],
    );
    let sig = format!("v0={}", hex::encode(mac));
    accepts(&v, &slack_case(1531420618 + 60).with_header("X-Slack-Signature", &sig));
    rejects(
        &v,
        &slack_case(1531420618 + 61).with_header("X-Slack-Signature", &sig),
        "timestamp_too_old",
    );

    // SHA-512 with base64.
    let generic = Scheme::Hmac(GenericHmac {
        header: "X-Signature".into(),
        prefix: String::new(),
        algorithm: Algorithm::Sha512,
        encoding: Encoding::Base64,
        signed: SignedContent::Body,
    });
    let v = verifier(generic, &["k"]);
    let sig = Encoding::Base64.encode(&compute_mac(Algorithm::Sha512, b"k", &[b"body"]));
    accepts(&v, &Case::post(vec![("x-signature", &sig)], b"body", 0));
    assert_eq!(sig.len(), 88, "SHA-512 is 64 bytes");
}

#[test]
fn no_secret_is_a_configuration_error() {
    assert_eq!(Verifier::new(Scheme::Github, &[], None).unwrap_err(), KeyError::NoSecret);
    assert_eq!(
        Verifier::new(Scheme::Github, &[SecretBytes::new("a"), SecretBytes::new("")], None)
            .unwrap_err(),
        KeyError::Empty { index: 1 }
    );
}

#[test]
fn secrets_are_redacted_in_debug() {
    let text = format!("{:?}", verifier(Scheme::Github, &["hunter2"]));
    assert!(!text.contains("hunter2"), "{text}");
}

/// A deterministic sweep of hostile inputs: every scheme rejects (never panics on) arbitrary
/// header values and bodies. There is no fuzz harness (cargo-fuzz needs nightly); this runs on
/// every test.
#[test]
fn hostile_inputs_are_rejected_without_panic() {
    let schemes = [
        Scheme::Github,
        Scheme::Stripe,
        Scheme::StandardWebhooks,
        Scheme::Shopify,
        Scheme::Slack,
        Scheme::HubspotV3,
    ];
    let long = "9".repeat(20_000);
    let values = [
        "",
        " ",
        "=",
        ",",
        "t=",
        "v1,",
        "sha256=",
        "v0=",
        "t=99999999999999999999,v1=00",
        "-1",
        "1e9",
        &long,
        "\u{0}",
        "v1,=== v1,",
        "t=1,v1=1,v1=2,v1=3",
    ];
    for scheme in schemes {
        let v = verifier(scheme.clone(), &["whsec_c2VjcmV0"]);
        for value in values {
            let headers: Vec<(&str, &str)> = [
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
            ]
            .iter()
            .map(|n| (*n, value))
            .collect();
            let case = Case::post(headers, value.as_bytes(), 1_700_000_000);
            assert!(case.run(&v).is_err(), "{scheme:?} accepted {value:?}");
        }
        // Non-UTF-8 header bytes.
        let headers = vec![("x-hub-signature-256".to_owned(), vec![0xff, 0xfe])];
        let request = Request { method: "POST", url: "", headers: &headers, body: b"" };
        assert!(v.verify(&request, Clock::from_unix_secs(0)).is_err());
    }
}

/// Signing is the inverse of verifying, for every scheme: what `sign` produces verifies at its
/// own timestamp, and fails under another secret or with another body.
#[test]
fn signed_requests_verify_for_every_scheme() {
    let generic = |signed| {
        Scheme::Hmac(GenericHmac {
            header: "X-Sig".into(),
            prefix: "sha512=".into(),
            algorithm: Algorithm::Sha512,
            encoding: Encoding::Base64,
            signed,
        })
    };
    let schemes = [
        Scheme::Github,
        Scheme::Stripe,
        Scheme::StandardWebhooks,
        Scheme::Shopify,
        Scheme::Slack,
        Scheme::HubspotV3,
        generic(SignedContent::Body),
        generic(SignedContent::TimestampAndBody {
            timestamp_header: "X-Ts".into(),
            separator: ":".into(),
        }),
    ];
    for scheme in schemes {
        let signer = verifier(scheme.clone(), &[SW_SECRET]);
        let input = SignInput {
            method: "POST",
            url: "https://hooks.example.com/hooks/x",
            body: br#"{"a":1}"#,
            timestamp_secs: 1_700_000_000,
            message_id: "msg_1",
        };
        let headers: Vec<(String, Vec<u8>)> =
            signer.sign(&input).into_iter().map(|(n, v)| (n, v.into_bytes())).collect();
        let request =
            Request { method: input.method, url: input.url, headers: &headers, body: input.body };
        let now = Clock::from_unix_secs(input.timestamp_secs);
        assert!(signer.verify(&request, now).is_ok(), "{scheme:?}: a signed request must verify");
        let other = verifier(scheme.clone(), &["whsec_b3RoZXIgc2VjcmV0IGtleSBieXRlcw=="]);
        assert_eq!(other.verify(&request, now).unwrap_err(), Rejection::NoMatch, "{scheme:?}");
        let tampered = Request { body: br#"{"a":2}"#, ..request };
        assert_eq!(signer.verify(&tampered, now).unwrap_err(), Rejection::NoMatch, "{scheme:?}");
    }
}
