//! Loading tests driven by data: each `tests/diagnostics/NAME.yaml` is loaded as a pipeline
//! (against the instances in `tests/diagnostics/instances.yaml`) and its diagnostics must equal
//! `NAME.expected`. Run with `UPDATE_EXPECT=1` to rewrite the expected files after a deliberate
//! change, and review the diff.

use std::path::Path;

use crate::{load_instances, load_pipeline};

fn render(diagnostics: &[crate::Diagnostic]) -> String {
    diagnostics.iter().map(|d| format!("{d}\n")).collect()
}

#[test]
fn diagnostics_match_golden_files() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/diagnostics");
    let instances_source = std::fs::read_to_string(dir.join("instances.yaml")).unwrap();
    let (instances, problems) = load_instances("instances.yaml", &instances_source);
    assert!(problems.is_empty(), "{}", render(&problems));
    let mut instances = instances.unwrap();
    // The kinds' rules come from the connectors themselves, as the binary's registry gives them.
    for description in [
        hookgate_connector::describe_kind::<hookgate_connector_salesforce::Salesforce>(),
        hookgate_connector::describe_kind::<hookgate_connector_hubspot::HubSpot>(),
    ] {
        instances.rules.insert(description.kind, description.rules);
    }

    let mut cases: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml") && !p.ends_with("instances.yaml"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 20, "the corpus lost cases: {}", cases.len());
    let update = std::env::var_os("UPDATE_EXPECT").is_some();
    let mut failures = Vec::new();
    for case in &cases {
        let name = case.file_name().unwrap().to_str().unwrap();
        let source = std::fs::read_to_string(case).unwrap();
        let (compiled, diagnostics) = load_pipeline(name, &source, Some(&instances));
        let mut actual = render(&diagnostics);
        actual.push_str(if compiled.is_some() { "=> compiled\n" } else { "=> rejected\n" });
        let expected_path = case.with_extension("expected");
        if update {
            std::fs::write(&expected_path, &actual).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
        if expected != actual {
            failures.push(format!("--- {name}: expected\n{expected}--- actual\n{actual}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} golden files differ (UPDATE_EXPECT=1 rewrites them):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn schemas_in_the_repository_are_fresh() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas");
    // The instances schema is completed by the binary, which knows the connector kinds; its
    // freshness is checked there.
    for (name, text) in crate::schemas().into_iter().filter(|(n, _)| *n != "hookgate.schema.json") {
        let committed = std::fs::read_to_string(dir.join(name)).unwrap_or_default();
        assert!(
            committed == text,
            "schemas/{name} is stale: run `cargo xtask codegen` and commit it"
        );
    }
}

#[test]
fn every_unknown_field_in_a_file_is_reported_in_one_run() {
    let source =
        "name: p\nsingature: {}\nkye: {header: X}\ntargets: []\nretention: 30d\nextra: 1\n";
    let (_, diagnostics) = load_pipeline("p.yaml", source, None);
    let unknown: Vec<_> =
        diagnostics.iter().filter(|d| d.message.starts_with("unknown field")).collect();
    assert_eq!(unknown.len(), 3, "{}", render(&diagnostics));
}

mod evaluation {
    use crate::evaluate::{Delivery, EvalError, Version};
    use crate::{CompiledPipeline, load_pipeline};

    fn pipeline(extra: &str, fields: &str) -> CompiledPipeline {
        let source = format!(
            "name: t\nsignature:\n  scheme: github\n  secrets: [{{env: S}}]\nkey:\n  pointer: /id\n{extra}\ntargets:\n  - name: t\n    connector: crm\n    object: o\n    external_id:\n      field: id\n      value: \"{{{{ payload.id }}}}\"\n    fields:\n{fields}\n"
        );
        let (compiled, diagnostics) = load_pipeline("t.yaml", &source, None);
        compiled.unwrap_or_else(|| panic!("{source}\n{diagnostics:?}"))
    }

    fn eval(
        pipeline: &CompiledPipeline,
        body: &str,
    ) -> Result<(crate::evaluate::Identity, Vec<crate::evaluate::Upsert>), EvalError> {
        let headers = vec![("X-Trace".to_owned(), b"abc".to_vec())];
        pipeline
            .evaluate(&Delivery { headers: &headers, body: body.as_bytes() }, &Default::default())
    }

    #[test]
    fn strict_undefined_is_an_error_but_default_and_none_are_allowed() {
        let p = pipeline("", "      a: \"{{ payload.missing }}\"");
        let err = eval(&p, r#"{"id":"1"}"#).unwrap_err();
        assert!(matches!(err, EvalError::Template { .. }), "{err}");
        assert!(err.to_string().starts_with("targets[0].fields.a: undefined value"), "{err}");

        let p = pipeline(
            "",
            "      a: \"{{ payload.missing | default('-') }}\"\n      b: \"{{ payload.nothing }}\"\n      c: \"{{ payload.flag }}|{{ headers['x-trace'] }}|{{ event.key }}\"",
        );
        let (_, upserts) = eval(&p, r#"{"id":"1","nothing":null,"flag":true}"#).unwrap();
        assert_eq!(upserts[0].fields["a"], "-");
        assert_eq!(upserts[0].fields["b"], "", "null renders empty");
        assert_eq!(
            upserts[0].fields["c"], "true|abc|1",
            "JSON spelling, lowercase header names, event"
        );
    }

    #[test]
    fn rendering_is_bounded() {
        let p = pipeline(
            "",
            "      a: \"{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}\"",
        );
        let err = eval(&p, r#"{"id":"1"}"#).unwrap_err();
        assert!(err.to_string().contains("fuel"), "a runaway loop runs out of fuel: {err}");

        let p = pipeline("", "      a: \"{{ payload.big }}{{ payload.big }}\"");
        let big = "y".repeat(40_000);
        let err = eval(&p, &format!(r#"{{"id":"1","big":"{big}"}}"#)).unwrap_err();
        assert!(matches!(err, EvalError::TooLong { max: 65536, .. }), "{err}");
    }

    #[test]
    fn keys_from_pointers_must_be_scalars() {
        let p = pipeline("", "      a: x");
        assert_eq!(eval(&p, r#"{"id":7}"#).unwrap().0.key, "7");
        let err = eval(&p, r#"{"id":{"nested":1}}"#).unwrap_err();
        assert_eq!(
            err.to_string(),
            "key: JSON pointer `/id` is an object, not a string or a number"
        );
        let err = eval(&p, r#"{"other":1}"#).unwrap_err();
        assert_eq!(err.to_string(), "key: JSON pointer `/id` matches nothing in the payload");
        let err = eval(&p, "not json").unwrap_err();
        assert!(err.to_string().starts_with("key: the body is not valid JSON"), "{err}");
        let err = eval(&p, r#"{"id":""}"#).unwrap_err();
        assert_eq!(err.to_string(), "key is empty");
    }

    #[test]
    fn fingerprints_ignore_key_order_and_excluded_parts() {
        let p = pipeline("fingerprint:\n  exclude: [/sent_at]", "      a: x");
        let a = eval(&p, r#"{"id":"1","v":2,"sent_at":"t1"}"#).unwrap().0.fingerprint;
        let b = eval(&p, r#"{"sent_at":"t2",  "v":2, "id":"1"}"#).unwrap().0.fingerprint;
        let c = eval(&p, r#"{"id":"1","v":3,"sent_at":"t1"}"#).unwrap().0.fingerprint;
        assert_eq!(a, b);
        assert_ne!(a, c);

        let p = pipeline("fingerprint:\n  include: [/v]", "      a: x");
        let a = eval(&p, r#"{"id":"1","v":2,"other":1}"#).unwrap().0.fingerprint;
        let b = eval(&p, r#"{"id":"1","v":2,"other":2}"#).unwrap().0.fingerprint;
        assert_eq!(a, b);

        let p = pipeline("", "      a: x");
        let a = eval(&p, r#"{"id":"1"}"#).unwrap().0.fingerprint;
        let b = eval(&p, r#"{"id": "1"}"#).unwrap().0.fingerprint;
        assert_ne!(a, b, "the default fingerprint is the raw body");
    }

    #[test]
    fn versions_compare_within_their_type() {
        let p = pipeline(
            "ordering:\n  entity: \"{{ payload.e }}\"\n  version: \"{{ payload.v }}\"\n  version_type: timestamp",
            "      a: x",
        );
        let at = |v: &str| {
            eval(&p, &format!(r#"{{"id":"1","e":"E","v":"{v}"}}"#))
                .map(|r| r.0.ordering.unwrap().version)
        };
        let earlier = at("2026-03-01T10:00:00+01:00").unwrap();
        let later = at("2026-03-01T09:30:00Z").unwrap();
        assert!(earlier < later, "compared as instants, whatever the offset");
        assert_eq!(earlier.to_string(), "2026-03-01T09:00:00Z");
        assert_eq!(earlier.sort_key(), "2026-03-01T09:00:00.000000000Z");
        assert!(earlier.sort_key() < at("2026-03-01T09:00:00.5Z").unwrap().sort_key());
        assert!(at("yesterday").unwrap_err().to_string().contains("is not an RFC 3339 timestamp"));

        let p = pipeline(
            "ordering:\n  entity: \"{{ payload.e }}\"\n  version: \"{{ payload.v }}\"\n  version_type: integer",
            "      a: x",
        );
        let at = |v: &str| {
            eval(&p, &format!(r#"{{"id":"1","e":"E","v":{v}}}"#))
                .map(|r| r.0.ordering.unwrap().version)
        };
        assert_eq!(at("10").unwrap(), Version::Integer(10));
        assert!(at("9").unwrap() < at("10").unwrap(), "numerically, not as text");
        let keys: Vec<String> = ["-10", "-1", "0", "9", "10", "9223372036854775807"]
            .iter()
            .map(|v| at(v).unwrap().sort_key())
            .collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "sort keys keep integer order: {keys:?}");
        assert!(at("1.5").is_err());
    }

    #[test]
    fn conditions_select_targets() {
        let source = "name: t\nsignature:\n  scheme: github\n  secrets: [{env: S}]\nkey:\n  pointer: /id\nevent_type:\n  pointer: /type\ntargets:\n  - name: a\n    connector: crm\n    when: event.type == \"x\"\n    object: o\n    external_id: {field: id, value: \"{{ payload.id }}\"}\n  - name: b\n    connector: crm\n    when: event.type is startingwith(\"y\")\n    object: o\n    external_id: {field: id, value: \"{{ payload.id }}\"}\n";
        let (p, d) = load_pipeline("t.yaml", source, None);
        let p = p.unwrap_or_else(|| panic!("{d:?}"));
        let targets = |body: &str| {
            eval(&p, body).unwrap().1.into_iter().map(|u| u.target).collect::<Vec<_>>()
        };
        assert_eq!(targets(r#"{"id":"1","type":"x"}"#), ["a"]);
        assert_eq!(targets(r#"{"id":"1","type":"yes"}"#), ["b"]);
        assert!(targets(r#"{"id":"1","type":"z"}"#).is_empty());
    }

    #[test]
    fn sender_values_are_data_bounded_printable_and_literal() {
        use crate::evaluate::printable;
        assert_eq!(
            printable("a\u{0}b\r\n\u{1b}[31m\u{202e}", 100),
            "a\\u{0}b\\r\\n\\u{1b}[31m\\u{202e}"
        );
        assert_eq!(printable("abcdef", 3), "abc…");

        let p = pipeline("", "      a: x");
        let key = |body: &str| eval(&p, body).map(|r| r.0.key);
        // Beyond 2^64, a parsed number would lose digits: the literal text is the key.
        assert_eq!(key(r#"{"id":18446744073709551617}"#).unwrap(), "18446744073709551617");
        assert_eq!(key(r#"{"id": 1.50}"#).unwrap(), "1.50");
        for (body, reason) in [
            ("{\"id\":\"a\\u0000b\"}", "key contains a control character (at character 1)"),
            ("{\"id\":\"ab\\t\"}", "key contains a control character (at character 2)"),
        ] {
            assert_eq!(key(body).unwrap_err().to_string(), reason, "{body}");
        }

        let ordered = pipeline(
            "ordering:\n  entity: \"{{ payload.e }}\"\n  version: \"{{ payload.v }}\"\n  version_type: timestamp\n  max_future: 10m",
            "      a: x",
        );
        let identity = |e: &str, v: &str| {
            eval(&ordered, &format!(r#"{{"id":"1","e":"{e}","v":"{v}"}}"#)).map(|r| r.0)
        };
        assert!(
            identity(" ", "2026-01-01T00:00:00Z")
                .unwrap_err()
                .to_string()
                .contains("ordering.entity is empty")
        );
        let long = identity("E", &"9".repeat(5000)).unwrap_err().to_string();
        assert!(long.len() < 200, "{long}");
        let now = 1_767_225_600_000; // 2026-01-01T00:00:00Z
        let within = identity("E", "2026-01-01T00:10:00Z").unwrap();
        assert!(ordered.check_future(&within, now).is_ok(), "exactly the allowance is allowed");
        let beyond = identity("E", "2026-01-01T00:10:01Z").unwrap();
        let error = ordered.check_future(&beyond, now).unwrap_err().to_string();
        assert_eq!(
            error,
            "ordering version `2026-01-01T00:10:01Z` is more than 600s ahead of its receipt"
        );
    }

    #[test]
    fn a_key_header_sent_twice_with_two_values_is_refused() {
        let source = "name: t\nsignature:\n  scheme: github\n  secrets: [{env: S}]\nkey:\n  header: X-Id\ntargets:\n  - name: t\n    connector: crm\n    object: o\n    external_id: {field: id, value: \"{{ payload.id }}\"}\n";
        let (p, d) = load_pipeline("t.yaml", source, None);
        let p = p.unwrap_or_else(|| panic!("{d:?}"));
        let key = |values: &[&str]| {
            let headers: Vec<(String, Vec<u8>)> =
                values.iter().map(|v| ("X-Id".to_owned(), v.as_bytes().to_vec())).collect();
            p.evaluate(&Delivery { headers: &headers, body: br#"{"id":"1"}"# }, &Default::default())
                .map(|r| r.0.key)
        };
        assert_eq!(key(&["a"]).unwrap(), "a");
        assert_eq!(key(&["a", "a"]).unwrap(), "a", "the same value twice says one thing");
        assert_eq!(
            key(&["a", "b"]).unwrap_err().to_string(),
            "key: header `x-id` is sent more than once"
        );
    }
}

#[test]
fn key_urls_are_allowed_only_on_https_from_listed_hosts() {
    let fetch = crate::KeyFetch {
        field: "/SigningCertURL".into(),
        hosts: vec!["sns.*.amazonaws.com".into(), "127.0.0.1".into()],
        file_prefix: None,
    };
    for (allowed, canonical) in [
        (
            "https://sns.us-east-2.amazonaws.com/SimpleNotificationService-7ff5318490ec183fbaddaa2a969abfda.pem",
            "https://sns.us-east-2.amazonaws.com/SimpleNotificationService-7ff5318490ec183fbaddaa2a969abfda.pem",
        ),
        ("https://SNS.eu-west-1.amazonaws.com/x.pem", "https://sns.eu-west-1.amazonaws.com/x.pem"),
        ("http://127.0.0.1:8080/good.pem", "http://127.0.0.1:8080/good.pem"),
    ] {
        assert_eq!(fetch.allows(allowed), Ok(canonical.to_owned()), "{allowed}");
    }
    for refused in [
        "http://sns.us-east-2.amazonaws.com/x.pem",
        "https://sns.us-east-2.amazonaws.com.evil.example/x.pem",
        "https://evil.example/sns.us-east-2.amazonaws.com/x.pem",
        "https://sns.a.b.amazonaws.com/x.pem",
        "https://sns..amazonaws.com/x.pem",
        "https://attacker@sns.us-east-2.amazonaws.com/x.pem",
        "https://sns.us-east-2.amazonaws.com/x.pem?x=1",
        "https://sns.us-east-2.amazonaws.com/x.txt",
        "https://sns.us-east-2.amazonaws.com/../x.pem",
        "https://sns.us-east-2.amazonaws.com:x/x.pem",
        "https://sns.us-east-2.amazonaws.com/x.pem\n",
        "ftp://sns.us-east-2.amazonaws.com/x.pem",
        "http://localhost/x.pem",
        "https://sns.us-east-2.amazonaws.com:443/x.pem",
        "https://sns.us-east-2.amazonaws.com:0443/x.pem",
        "https://sns.us-east-2.amazonaws.com/x%2Epem",
    ] {
        assert!(fetch.allows(refused).is_err(), "{refused:?} must be refused");
    }
}

#[test]
fn urldecode_follows_form_encoding() {
    let env = crate::template::environment();
    let render = |template: &str| env.render_str(template, minijinja::context! {}).unwrap();
    assert_eq!(render("{{ 'a%2Bb+c%20d' | urldecode }}"), "a+b c d");
    assert_eq!(render("{{ 'x%26y%3Dz' | urldecode }}"), "x&y=z");
    assert_eq!(render("{{ 'a&b=c' | urldecode }}"), "a&b=c", "a raw `&` or `=` is kept");
    assert_eq!(render("{{ '%E2%82%AC %ZZ %ff' | urldecode }}"), "€ %ZZ \u{fffd}");
}

#[test]
fn form_bodies_keep_repeated_names_in_order() {
    let payload =
        crate::body::form_payload(b"To=%2B1800&Digits=5678&Digits=1234&Body=Hi+there&Empty=");
    assert_eq!(
        payload,
        serde_json::json!({"To": "+1800", "Digits": ["5678", "1234"], "Body": "Hi there", "Empty": ""})
    );
}

/// Each reading of a body, as (reading, content type, body, payload or the error's text).
#[test]
fn bodies_are_read_as_the_pipeline_and_content_type_say() {
    use crate::body::BodyReading;
    use crate::model::BodyFormat;
    let github = BodyReading::ByContentType { form: BodyFormat::FormPayload };
    let open = BodyReading::ByContentType { form: BodyFormat::Form };
    let form = "application/x-www-form-urlencoded; charset=utf-8";
    type Case<'a> = (BodyReading, Option<&'a str>, &'a str, Result<serde_json::Value, &'a str>);
    let cases: &[Case<'_>] = &[
        (github, Some(form), "payload=%7B%22a%22%3A1%7D", Ok(serde_json::json!({"a": 1}))),
        (github, Some("application/json"), r#"{"a":1}"#, Ok(serde_json::json!({"a": 1}))),
        (github, None, r#"{"a":1}"#, Ok(serde_json::json!({"a": 1}))),
        (github, Some(form), "other=1", Err("form has no `payload` field")),
        (github, Some(form), "payload=1&payload=2", Err("more than one `payload` field")),
        (github, Some(form), "payload=%7Bnot", Err("form field `payload`: key must be a string")),
        (open, Some(form), "payload=%7B%7D", Ok(serde_json::json!({"payload": "{}"}))),
        (open, Some("text/plain"), "[1]", Ok(serde_json::json!([1]))),
        (BodyReading::Fixed(BodyFormat::Form), None, "a=1", Ok(serde_json::json!({"a": "1"}))),
        (BodyReading::Fixed(BodyFormat::Json), Some(form), "a=1", Err("expected value")),
    ];
    for (reading, content_type, body, expected) in cases {
        let content_type = content_type.map(str::to_owned);
        let read = reading.format(content_type.as_ref()).read(body.as_bytes());
        match (read, expected) {
            (Ok(payload), Ok(expected)) => assert_eq!(&payload, expected, "{body}"),
            (Err(error), Err(expected)) => assert!(error.contains(expected), "{body}: {error}"),
            (read, expected) => panic!("{body}: read {read:?}, expected {expected:?}"),
        }
    }
}

#[test]
fn sns_key_hosts_are_regional_endpoints_only() {
    let fetch = crate::KeyFetch {
        field: "/SigningCertURL".into(),
        hosts: vec!["sns.{region}.amazonaws.com".into(), "sns.{region}.amazonaws.com.cn".into()],
        file_prefix: Some("SimpleNotificationService-".into()),
    };
    for region in [
        "us-east-2",
        "us-gov-west-1",
        "cn-northwest-1",
        "ap-southeast-4",
        "il-central-1",
        "eusc-de-east-1",
    ] {
        let url = format!("https://sns.{region}.amazonaws.com/SimpleNotificationService-0a.pem");
        assert!(fetch.allows(&url).is_ok(), "{url}");
    }
    for host in [
        "sns.s3-accelerate.amazonaws.com",
        "sns.s3-external-1.amazonaws.com",
        "sns.s3.amazonaws.com",
        "sns.s3-website-us-east-1.amazonaws.com",
    ] {
        let url = format!("https://{host}/SimpleNotificationService-0a.pem");
        assert!(fetch.allows(&url).is_err(), "{url}");
    }
    assert!(
        fetch
            .allows("https://sns.us-east-2.amazonaws.com/SimpleNotificationService-xyz.pem")
            .is_err()
    );
    assert!(
        fetch
            .allows("https://sns.us-east-2.amazonaws.com/a/SimpleNotificationService-0a.pem")
            .is_err()
    );
}

/// The instances file is checked in one pass too: a duplicate name (of a connector or a
/// payload key) points at the first definition, and a wrong value does not hide the mistakes
/// after it. (Kinds are the registry's to check: `tests/check.rs`.)
#[test]
fn instances_report_every_mistake_and_where_a_duplicate_was_first_defined() {
    let source = "connectors:\n  - name: crm\n    kind: mock\n  - name: crm\n    kind: mokc\n  - name: Sales\n    kind: salesforce\n\
                  payload_encryption:\n  keys:\n    - id: k1\n      secret: { env: A }\n    - id: k1\n      secret: { env: B }\n    - id: K 2\n      secret: { env: C }\n\
                  source_origins:\n  https://api.stripe.com/v1: http://127.0.0.1:12111\n  https://api.github.com: http://mirror.example\n  https://ok.example: http://localhost:1\n";
    let (_, diagnostics) = load_instances("hookgate.yaml", source);
    let rendered: Vec<String> = diagnostics.iter().map(ToString::to_string).collect();
    assert_eq!(
        rendered,
        [
            "hookgate.yaml:4:11: error[H0202]: duplicate connector name `crm`\n  = hint: targets name connector instances: make each name unique\n  = note: hookgate.yaml:2:11: first defined here",
            "hookgate.yaml:6:11: error[H0201]: invalid connector name `Sales`\n  = hint: names use lowercase letters, digits, `-` and `_`, start with a letter, and have at most 64 characters",
            "hookgate.yaml:12:11: error[H0202]: duplicate payload key id `k1`\n  = hint: each row records the id of its key: ids must be unique\n  = note: hookgate.yaml:10:11: first defined here",
            "hookgate.yaml:14:11: error[H0201]: invalid payload key id `K 2`\n  = hint: names use lowercase letters, digits, `-` and `_`, start with a letter, and have at most 64 characters",
            "hookgate.yaml:17:30: error[H0703]: `https://api.stripe.com/v1: http://127.0.0.1:12111` is not an origin to an origin\n  = hint: write origins as `scheme://host[:port]`, without a path",
            "hookgate.yaml:18:27: error[H0703]: `http://mirror.example` is plain http to a host that is not loopback\n  = hint: write origins as `scheme://host[:port]`, without a path",
        ],
        "{rendered:#?}"
    );
}

/// Windows line endings do not shift positions inside scalars.
#[test]
fn positions_hold_with_crlf_line_endings() {
    let source = "name: p\r\nsignature:\r\n  scheme: hmac\r\n  header: X-Sig\r\n  secrets:\r\n    - env: S\r\nkey: body_sha256\r\ntargets:\r\n  - name: t\r\n    connector: crm\r\n    object: x\r\n    external_id:\r\n      field: id\r\n      value: |\r\n        id\r\n        {{ payload.id }\r\n";
    let (_, diagnostics) = load_pipeline("p.yaml", source, None);
    let rendered: Vec<String> = diagnostics.iter().map(ToString::to_string).collect();
    assert_eq!(rendered.len(), 1, "{rendered:#?}");
    assert!(
        rendered[0].starts_with("p.yaml:16:23: error[H0501]: template syntax error"),
        "{rendered:#?}"
    );
}

/// A refresh URL's origin is what is written before its first template, up to the `/`, `?`
/// or `#` that ends the host: what a payload renders can only land in the path or query.
#[test]
fn refresh_origins_are_written_out_before_any_template() {
    use crate::check::refresh_origin;
    for (url, origin) in [
        ("https://API.Stripe.com/v1/customers/{{ id }}", "https://api.stripe.com"),
        ("https://api.example.com:8443/{{ id }}", "https://api.example.com:8443"),
        ("https://api.example.com?id={{ id }}", "https://api.example.com"),
        ("http://127.0.0.1:9/x", "http://127.0.0.1:9"),
        ("https://api.example.com", "https://api.example.com"),
    ] {
        assert_eq!(refresh_origin(url).as_deref(), Ok(origin), "{url}");
    }
    for url in [
        "https://api.example.com{{ suffix }}/x",
        "https://{{ host }}/x",
        "https://api.example.com{# c #}.evil/x",
        "ftp://api.example.com/x",
        "api.example.com/x",
        "https://user@api.example.com/x",
        "https://api.example.com\\@evil/x",
    ] {
        assert!(refresh_origin(url).is_err(), "{url}");
    }
}

/// What a payload renders into a refresh URL cannot leave the resource tree the pipeline
/// wrote: dot segments (written out or percent-encoded) and backslashes are refused, while
/// the host is compared as hosts are, whatever its case.
#[test]
fn refresh_urls_cannot_climb_out_of_their_path() {
    let source = r#"
name: refreshing
signature: { scheme: hmac, header: X-Sig, secrets: [{ env: S }] }
key: { pointer: /id }
targets:
  - name: thing
    connector: crm
    object: things
    external_id: { field: id, value: "{{ payload.id }}" }
    refresh:
      url: "https://API.Example.com/v1/things/{{ payload.id | urlencode }}/{{ payload.raw }}?q={{ payload.q }}"
    fields: { a: "{{ source.a }}" }
"#;
    let (compiled, diagnostics) = load_pipeline("refreshing.yaml", source, None);
    let compiled = compiled.unwrap_or_else(|| panic!("{diagnostics:?}"));
    let render = |id: &str, raw: &str| {
        let body = serde_json::json!({ "id": id, "raw": raw, "q": "../up" }).to_string();
        let delivery = crate::evaluate::Delivery { headers: &[], body: body.as_bytes() };
        let (_, ctx) = compiled.identify(&delivery).unwrap();
        compiled.render_refresh_url(0, &ctx)
    };
    assert_eq!(
        render("cus 1", "x").unwrap(),
        "https://API.Example.com/v1/things/cus%201/x?q=../up",
        "a query may hold anything"
    );
    for (id, raw) in [
        ("../../v1/charges", "x"),
        ("a", ".."),
        ("a", "%2E%2e"),
        ("a", "."),
        ("a", "b\\c"),
        ("a", "..%2F..%2Fv1%2Fcharges"),
        ("a", "..%5Cx"),
        ("a", "..;"),
        ("a", "%252e%252e"),
        ("a", "x%2Fy"),
    ] {
        let error = render(id, raw).unwrap_err();
        assert!(
            error.to_string().contains("is not under `https://api.example.com`"),
            "{id} {raw}: {error}"
        );
    }
}

/// A budget of no calls, or a window outside 1s..=24h, is refused where it is written; an
/// unknown field in `limits` is a typo, not a budget.
#[test]
fn budgets_out_of_range_are_refused_where_written() {
    let source = "connectors:\n  - name: a\n    kind: hubspot\n    limits: { rate: { calls: 0, per: 10s } }\n\
                  \x20 - name: b\n    kind: hubspot\n    limits: { rate: { calls: 100, per: 500ms } }\n\
                  \x20 - name: c\n    kind: hubspot\n    limits: { rate: { calls: 100, per: 10s } }\n\
                  \x20 - name: d\n    kind: hubspot\n    limits: { rate: { call: 100, per: 10s } }\n";
    let (_, diagnostics) = load_instances("hookgate.yaml", source);
    let rendered: Vec<String> = diagnostics.iter().map(ToString::to_string).collect();
    assert_eq!(
        rendered[1..],
        [
            "hookgate.yaml:4:30: error[H0701]: `limits.rate.calls` is 0, outside 1..=1000000\n  = hint: a budget of no calls would hold every write forever; give the calls the CRM allows in `per`",
            "hookgate.yaml:7:40: error[H0701]: `limits.rate.per` is 500ms, outside 1s..=24h\n  = hint: give the CRM's own window, e.g. `per: 10s` for HubSpot",
            "hookgate.yaml:13:23: error[H0101]: unknown field `call`\n  = hint: did you mean `calls`?",
        ],
        "{rendered:#?}"
    );
}
