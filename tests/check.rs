//! `hookgate check` as an operator runs it: a child process over real files.
//!
//! The shipped pipelines must pass with every fixture; broken copies of them must fail with a
//! `file:line:column` diagnostic naming the problem; hostile files must be diagnosed, never
//! crash the checker.

// Helpers outside `#[test]` functions panic on a broken test setup, which is what a test should do.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// `hookgate check` in the short form (one line per problem, on stderr), which these tests
/// match; the human and JSON forms have tests of their own.
fn hookgate_check(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hookgate"))
        .args(["check", "--message-format", "short"])
        .args(args)
        .current_dir(dir)
        .env_remove("HOOKGATE_INSTANCES")
        .output()
        .expect("hookgate runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// What `check` reports: its diagnostics and summary go to stderr.
fn report(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A copy of the shipped pipelines and instances file, to break.
fn project_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&root().join("pipelines"), &dir.path().join("pipelines"));
    std::fs::copy(root().join("hookgate.yaml"), dir.path().join("hookgate.yaml")).unwrap();
    dir
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

fn replace_in(path: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.contains(from), "{} does not contain {from:?}", path.display());
    std::fs::write(path, text.replacen(from, to, 1)).unwrap();
}

#[test]
fn shipped_pipelines_pass_with_every_fixture() {
    let output = hookgate_check(&root(), &[]);
    let text = report(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("checked 6 pipelines and"), "{text}");
    assert!(text.contains("(0 failed): 0 errors"), "{text}");

    // Every example pipeline has a fixture for a valid delivery, a wrong signature and a
    // missing signature header.
    for pipeline in ["github", "stripe", "standard-webhooks", "crm-partner", "shopify", "signups"] {
        let mut verdicts = Vec::new();
        for entry in std::fs::read_dir(root().join("pipelines").join(pipeline)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "yaml") {
                let text = std::fs::read_to_string(&path).unwrap();
                if text.contains("signature: valid") && text.contains("upserts:") {
                    verdicts.push("valid");
                }
                if text.contains("rejection: signature_mismatch") {
                    verdicts.push("mismatch");
                }
                if text.contains("rejection: missing_header") {
                    verdicts.push("missing");
                }
            }
        }
        for needed in ["valid", "mismatch", "missing"] {
            assert!(verdicts.contains(&needed), "{pipeline} has no `{needed}` fixture");
        }
    }
}

#[test]
fn sender_pipelines_pass_with_every_fixture() {
    let output = hookgate_check(&root(), &["pipelines/senders"]);
    let text = report(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("(0 failed): 0 errors"), "{text}");
    // Each sender pipeline shows a valid delivery and at least one refused one.
    let mut senders = 0;
    for entry in std::fs::read_dir(root().join("pipelines/senders")).unwrap() {
        let path = entry.unwrap().path();
        if !path.is_dir() {
            continue;
        }
        senders += 1;
        let mut valid = false;
        let mut refused = false;
        for fixture in std::fs::read_dir(&path).unwrap() {
            let fixture = fixture.unwrap().path();
            if fixture.extension().is_some_and(|e| e == "yaml") {
                let text = std::fs::read_to_string(&fixture).unwrap();
                valid |= text.contains("signature: valid");
                refused |= text.contains("signature: invalid");
            }
        }
        assert!(valid && refused, "{} needs a valid and a refused fixture", path.display());
    }
    assert!(senders >= 12, "{senders} sender pipelines");
}

/// The signature block of a pipeline file: from `signature:` to the next line that does not
/// start with a space.
fn replace_signature_block(pipeline: &str, block: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for line in pipeline.lines() {
        if line.starts_with("signature:") {
            inside = true;
            out.push_str(block.trim_end());
            out.push('\n');
            continue;
        }
        if inside && !line.starts_with(' ') {
            inside = false;
        }
        if !inside {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Every preset is the signature language, so writing it out must change nothing: each
/// shipped pipeline, its preset replaced by the block in tests/written-out/, passes the same
/// fixtures (published vectors, negative cases, rejection codes and reasons).
#[test]
fn every_preset_written_out_verifies_the_same_fixtures() {
    let mut checked = Vec::new();
    for entry in std::fs::read_dir(root().join("tests/written-out")).unwrap() {
        let written = entry.unwrap().path();
        if written.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let name = written.file_stem().unwrap().to_str().unwrap().to_owned();
        let relative = ["pipelines", "pipelines/senders"]
            .iter()
            .map(|dir| format!("{dir}/{name}.yaml"))
            .find(|path| root().join(path).is_file())
            .unwrap_or_else(|| panic!("no shipped pipeline for {}", written.display()));
        let block = std::fs::read_to_string(&written).unwrap();
        assert!(block.contains("scheme: custom"), "{name}: not written out");

        let as_shipped = hookgate_check(&root(), &[&relative]);
        let shipped_text = report(&as_shipped);
        assert!(as_shipped.status.success(), "{shipped_text}");

        let dir = project_copy();
        copy_dir(&root().join("pipelines/senders"), &dir.path().join("pipelines/senders"));
        let copy = dir.path().join(&relative);
        let original = std::fs::read_to_string(&copy).unwrap();
        let rewritten = replace_signature_block(&original, &block);
        assert_ne!(rewritten, original);
        std::fs::write(&copy, &rewritten).unwrap();
        let written_out = hookgate_check(dir.path(), &[&relative]);
        let text = report(&written_out);
        assert!(written_out.status.success(), "{name} written out:\n{text}");
        // Same number of fixtures, all passing.
        let summary =
            |t: &str| t.lines().last().unwrap_or("").split(':').next().unwrap_or("").to_owned();
        assert_eq!(summary(&text), summary(&shipped_text), "{name}: {text}");
        assert!(text.contains("(0 failed): 0 errors"), "{name}: {text}");
        checked.push(name);
    }
    checked.sort();
    assert_eq!(checked.len(), 23, "{checked:?}");
}

/// One breakage of a shipped file, and the diagnostic it must produce.
struct Breakage {
    file: &'static str,
    from: &'static str,
    to: &'static str,
    expected: &'static str,
}

const BREAKAGES: &[Breakage] = &[
    Breakage {
        file: "pipelines/github.yaml",
        from: "signature:",
        to: "singature:",
        expected: "pipelines/github.yaml:9:1: error[H0101]: unknown field `singature`\n  = hint: did you mean `signature`?",
    },
    Breakage {
        file: "pipelines/github.yaml",
        from: "connector: crm",
        to: "connector: crn",
        expected: "pipelines/github.yaml:16:16: error[H0601]: unknown connector instance `crn`\n  = hint: did you mean `crm`? (defined in hookgate.yaml)",
    },
    Breakage {
        file: "pipelines/stripe.yaml",
        from: "{{ source.email }}",
        to: "{{ source.email }",
        expected: "pipelines/stripe.yaml:39:31: error[H0501]: template syntax error",
    },
    Breakage {
        file: "pipelines/stripe.yaml",
        from: "version_type: integer",
        to: "version_type: number",
        expected: "pipelines/stripe.yaml:18:17: error[H0103]: unknown variant `number`\n  = hint: supported: `integer`, `timestamp`, `string`",
    },
    Breakage {
        file: "pipelines/crm-partner.yaml",
        from: "scheme: hmac",
        to: "scheme: hmca",
        expected: "pipelines/crm-partner.yaml:10:11: error[H0103]: unknown variant `hmca`\n  = hint: did you mean `hmac`?",
    },
    Breakage {
        file: "pipelines/crm-partner.yaml",
        from: "{{ payload.PatientId }}\"\n  version",
        to: "{{ patient.id }}\"\n  version",
        expected: "pipelines/crm-partner.yaml:36:15: error[H0502]: template uses `patient`, which is not defined here",
    },
    // Payload fields are checked against the declared schema, or the fixtures' bodies.
    Breakage {
        file: "pipelines/crm-partner.yaml",
        from: "entity: \"{{ payload.PatientId }}\"",
        to: "entity: \"{{ payload.PatientID }}\"",
        expected: "pipelines/crm-partner.yaml:36:15: error[H1001]: `payload.PatientID`: the payload schema has no `PatientID` in the payload\n  = hint: did you mean `PatientId`?",
    },
    Breakage {
        file: "pipelines/crm-partner.yaml",
        from: "required: [PracticeId, Command, PatientId, CommandTime]",
        to: "required: [PracticeId, Command, CommandTime]",
        expected: "pipelines/crm-partner.yaml:36:15: error[H1002]: `payload.PatientId` is needed by `ordering.entity`, but not every payload has it",
    },
    Breakage {
        file: "pipelines/signups.yaml",
        from: "{{ payload.user.first_name }}",
        to: "{{ payload.user.firstname }}",
        expected: "pipelines/signups.yaml:36:22: error[H1001]: `payload.user.firstname`: no fixture's payload has `firstname` in `payload.user`\n  = hint: did you mean `first_name`?",
    },
    Breakage {
        file: "pipelines/standard-webhooks.yaml",
        from: "tolerance: 5m",
        to: "tolerance: 5 minutez",
        expected: "pipelines/standard-webhooks.yaml:11:14: error[H0102]: invalid duration `5 minutez`",
    },
    Breakage {
        file: "pipelines/standard-webhooks.yaml",
        from: "targets:",
        to: "targets:\n\t- name: x",
        expected: "pipelines/standard-webhooks.yaml:19:2: error[H0001]: invalid YAML: tabs disallowed",
    },
    Breakage {
        file: "hookgate.yaml",
        from: "kind: mock",
        to: "kind: mocked",
        expected: "hookgate.yaml:7:11: error[H0604]: connector `crm`: no connector provides kind `mocked`\n  = hint: did you mean `mock`? supported: `http`, `hubspot`, `mock`, `salesforce`",
    },
    // Connector settings are checked against each kind's settings, where they are written.
    Breakage {
        file: "hookgate.yaml",
        from: "login_url:",
        to: "loginurl:",
        expected: "hookgate.yaml:15:7: error[H0101]: unknown field `loginurl`\n  = hint: did you mean `login_url`?",
    },
    Breakage {
        file: "hookgate.yaml",
        from: "      client_secret: { env: SALESFORCE_CLIENT_SECRET }\n",
        to: "",
        expected: "hookgate.yaml:17:5: error[H0603]: connector `salesforce` (salesforce) needs the credential `client_secret`",
    },
    Breakage {
        file: "hookgate.yaml",
        from: "path: hookgate-crm.sqlite",
        to: "path: hookgate-crm.sqlite\n      faults: { failure_rate: high }",
        expected: "hookgate.yaml:10:31: error[H0102]: expected a number, found `high`",
    },
    // A secret written as a literal is not a reference.
    Breakage {
        file: "hookgate.yaml",
        from: "token: { env: HUBSPOT_TOKEN }",
        to: "token: pat-na1-literal",
        expected: "hookgate.yaml:26:14: error[H0103]: unknown variant `pat-na1-literal`\n  = hint: supported: `env`, `file`",
    },
    // A fixture whose expectation no longer holds fails at the expectation's line.
    Breakage {
        file: "pipelines/github/push.yaml",
        from: "value: monalisa",
        to: "value: octocat",
        expected: "pipelines/github/push.yaml:19:7: error[H0901]: external_id.value: expected `octocat`, got `monalisa`",
    },
    Breakage {
        file: "pipelines/github/push.yaml",
        from: "body_file: push.json",
        to: "body_file: pushed.json",
        expected: "pipelines/github/push.yaml:11:14: error[H0902]: cannot read: No such file or directory",
    },
    Breakage {
        file: "pipelines/crm-partner/missing-header.yaml",
        from: "rejection: missing_header",
        to: "rejection: signature_mismatch",
        expected: "pipelines/crm-partner/missing-header.yaml:12:14: error[H0901]: expected rejection `signature_mismatch`, got `missing_header`",
    },
    Breakage {
        file: "pipelines/stripe/published-vector.yaml",
        from: "now: 2018-08-02T10:12:00Z",
        to: "now: 2018-08-02T10:20:00Z",
        expected: "pipelines/stripe/published-vector.yaml:15:14: error[H0901]: expected a valid signature, but it was rejected: timestamp 580 s old, past the 300 s tolerance",
    },
];

#[test]
fn broken_copies_fail_with_located_diagnostics() {
    for breakage in BREAKAGES {
        let project = project_copy();
        replace_in(&project.path().join(breakage.file), breakage.from, breakage.to);
        let output = hookgate_check(project.path(), &[]);
        let text = report(&output);
        assert_eq!(output.status.code(), Some(1), "{} should fail:\n{text}", breakage.file);
        assert!(
            text.contains(breakage.expected),
            "{}: expected\n{}\nin\n{text}",
            breakage.file,
            breakage.expected
        );
    }
}

#[test]
fn duplicate_pipeline_names_across_files_are_reported() {
    let project = project_copy();
    std::fs::copy(
        project.path().join("pipelines/github.yaml"),
        project.path().join("pipelines/github-copy.yaml"),
    )
    .unwrap();
    let output = hookgate_check(project.path(), &[]);
    let text = report(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(text.contains("pipelines/github.yaml:6:7: error[H0202]: duplicate pipeline name `github`\n  = hint: names are intake paths and must be unique\n  = note: pipelines/github-copy.yaml:6:7: also the name of this pipeline"), "{text}");
}

#[test]
fn hostile_files_are_diagnosed_not_crashed_on() {
    let project = project_copy();
    let pipelines = project.path().join("pipelines");
    // 50 MB: refused from its size, without being parsed.
    let big = std::fs::File::create(pipelines.join("huge.yaml")).unwrap();
    big.set_len(50 * 1024 * 1024).unwrap();
    std::fs::write(
        pipelines.join("binary.yaml"),
        [0x6e, 0x61, 0x6d, 0x65, 0x3a, 0x20, 0xff, 0xfe, 0x00],
    )
    .unwrap();
    std::fs::write(pipelines.join("deep.yaml"), format!("name: {}", "{a: ".repeat(20_000)))
        .unwrap();
    let bomb: String = std::iter::once("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n".to_owned())
        .chain((1..12).map(|i| format!("a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n", p = i - 1)))
        .collect();
    std::fs::write(pipelines.join("bomb.yaml"), bomb).unwrap();
    std::fs::write(pipelines.join("wrong-types.yaml"), "name: [1, 2]\nsignature: 7\ntargets: {}\n")
        .unwrap();
    std::fs::write(
        pipelines.join("truncated.yaml"),
        "name: t\nsignature:\n  secrets:\n    - env: \"X",
    )
    .unwrap();

    let output = hookgate_check(project.path(), &[]);
    let text = report(&output);
    assert_eq!(output.status.code(), Some(1), "exit 1 (diagnostics), not 101 (panic):\n{text}");
    for expected in [
        "pipelines/huge.yaml:1:1: error[H0003]: the file is 52428800 bytes, larger than the 1048576-byte limit",
        "pipelines/binary.yaml:1:1: error[H0003]: the file is not UTF-8 (invalid byte at offset 6)",
        "pipelines/deep.yaml:1:",
        "is this an alias bomb?",
        "pipelines/wrong-types.yaml:1:7: error[H0102]: expected a string, found a list",
        "pipelines/truncated.yaml:4:12: error[H0001]: invalid YAML",
    ] {
        assert!(text.contains(expected), "expected {expected:?} in\n{text}");
    }
    // The good pipelines are still checked and their fixtures still run.
    assert!(text.contains("checked 6 pipelines and 32 fixtures (0 failed)"), "{text}");
}

#[test]
fn a_missing_instances_file_is_an_error_that_says_how_to_fix_it() {
    let project = project_copy();
    let output = hookgate_check(project.path(), &["pipelines", "--instances", "nowhere.yaml"]);
    let text = report(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(
        text.contains("nowhere.yaml:1:1: error[H0003]: cannot read: No such file or directory"),
        "{text}"
    );
    assert!(text.contains("name the connector-instances file with `--instances`"), "{text}");
}

/// Unset secrets are warnings for `check`, grouped into one line so that they cannot bury the
/// errors, and `--allow-unset-secrets` silences them. Those a pipeline's fixtures supply are
/// reported too, marked: the fixtures run with test values, `serve` needs the real ones. What
/// `check` warns of is exactly what `serve` refuses.
#[test]
fn unset_secrets_are_one_warning_for_check() {
    let project = project_copy();
    // A pipeline without fixtures needs its secret from the environment.
    std::fs::copy(
        project.path().join("pipelines/stripe.yaml"),
        project.path().join("stripe-alone.yaml"),
    )
    .unwrap();
    replace_in(&project.path().join("stripe-alone.yaml"), "name: stripe", "name: stripe-alone");
    let run = |command: &[&str], extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_hookgate"))
            .args(command)
            .args(["pipelines", "stripe-alone.yaml"])
            .args(extra)
            .current_dir(project.path())
            .env("GITHUB_WEBHOOK_SECRET", "set")
            .env_remove("STRIPE_WEBHOOK_SECRET")
            .env_remove("HUBSPOT_TOKEN")
            .env_remove("SALESFORCE_CLIENT_ID")
            .env_remove("SALESFORCE_CLIENT_SECRET")
            // Set but empty: a mistake in the environment, which fixtures do not excuse.
            .env("SIGNUPS_SECRET", "")
            .env_remove("CRM_PARTNER_SECRET")
            .env_remove("SHOPIFY_WEBHOOK_SECRET")
            .env_remove("STANDARD_WEBHOOKS_SECRET")
            .env_remove("STRIPE_API_KEY")
            .output()
            .unwrap()
    };
    let check = |extra: &[&str]| {
        let output = run(&["check", "--message-format", "short"], extra);
        (output.status.success(), report(&output))
    };
    let (success, text) = check(&[]);
    assert!(success, "{text}");
    let warnings: Vec<&str> =
        text.lines().filter(|l| l.contains("warning[H0801]") && l.contains("not set")).collect();
    assert_eq!(warnings.len(), 1, "one line for every unset secret:\n{text}");
    let warning = warnings[0];
    for expected in [
        "10 secrets are not set",
        "environment variable `SALESFORCE_CLIENT_ID` (hookgate.yaml:",
        "environment variable `HUBSPOT_TOKEN` (hookgate.yaml:",
        "environment variable `STRIPE_WEBHOOK_SECRET` (stripe-alone.yaml:11:7)",
        "environment variable `STRIPE_API_KEY` (stripe-alone.yaml:35:21)",
        // pipelines/stripe.yaml's fixtures supply test values: serve still needs the real ones.
        "environment variable `STRIPE_WEBHOOK_SECRET` (pipelines/stripe.yaml:11:7, fixtures have a test value)",
        "environment variable `STRIPE_API_KEY` (pipelines/stripe.yaml:35:21, fixtures have a test value)",
    ] {
        assert!(warning.contains(expected), "{expected:?} in {warning}");
    }
    // A set secret is never reported.
    assert!(!text.contains("GITHUB_WEBHOOK_SECRET"), "{text}");
    // `serve` refuses each secret `check` warned of, and no other.
    let database = format!("sqlite://{}", project.path().join("never.db").display());
    let served = run(&["serve", "--database-url", &database], &[]);
    assert!(!served.status.success(), "serve started without its secrets");
    let refusal = report(&served);
    let named = |text: &str| -> std::collections::BTreeSet<String> {
        text.split("variable `")
            .skip(1)
            .filter_map(|rest| rest.split('`').next())
            .map(str::to_owned)
            .collect()
    };
    let mut warned = named(warning);
    warned.insert("SIGNUPS_SECRET".into());
    assert_eq!(named(&refusal), warned, "{refusal}");
    let empty = "pipelines/signups.yaml:19:7: warning[H0801]: environment variable `SIGNUPS_SECRET` is empty";
    assert!(text.contains(empty), "{text}");
    // The shipped instances file keeps payloads in plaintext, which is said once.
    let plaintext = "hookgate.yaml:5:1: warning[H0802]: payloads are stored in plaintext";
    assert!(text.contains(plaintext), "{text}");
    assert!(
        text.contains("checked 7 pipelines and 32 fixtures (0 failed): 0 errors, 3 warnings"),
        "{text}"
    );

    let (success, text) = check(&["--allow-unset-secrets"]);
    assert!(success, "{text}");
    assert!(!text.contains("are not set"), "{text}");
    assert!(text.contains(empty), "{text}");
    assert!(text.contains("0 errors, 2 warnings\n"), "{text}");
}

/// Payload keys are secrets like any other (unset: the grouped warning), and one that is set
/// must be a key: 32 bytes of base64, reported where its reference is written. With keys, the
/// plaintext warning is gone.
#[test]
fn payload_keys_are_checked_where_they_are_referenced() {
    let project = project_copy();
    let instances = project.path().join("hookgate.yaml");
    let mut text = std::fs::read_to_string(&instances).unwrap();
    text.push_str(
        "payload_encryption:\n  keys:\n    - id: k2\n      secret: { env: TEST_KEY_2 }\n    - id: k1\n      secret: { file: k1.key }\n",
    );
    std::fs::write(&instances, &text).unwrap();
    let line = text.lines().position(|l| l.contains("TEST_KEY_2")).unwrap() + 1;
    let check = |key_2: &str| {
        let output = Command::new(env!("CARGO_BIN_EXE_hookgate"))
            .args(["check", "--message-format", "short", "--allow-unset-secrets"])
            .current_dir(project.path())
            .env("TEST_KEY_2", key_2)
            .output()
            .unwrap();
        (output.status.success(), report(&output))
    };
    let (success, text) = check("c2hvcnQ=");
    assert!(!success, "{text}");
    let expected = format!(
        "hookgate.yaml:{line}:15: error[H0803]: environment variable `TEST_KEY_2`: payload key `k2`: 5 bytes; a key is 32 bytes"
    );
    assert!(text.contains(&expected), "{expected}\n{text}");
    assert!(!text.contains("H0802"), "{text}");

    std::fs::write(project.path().join("k1.key"), "not base64 at all\n").unwrap();
    let (success, text) = check("MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=");
    assert!(!success, "{text}");
    assert!(text.contains("error[H0803]: file `k1.key`: payload key `k1`: not base64"), "{text}");
    assert!(!text.contains("TEST_KEY_2"), "{text}");

    std::fs::write(project.path().join("k1.key"), "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=\n")
        .unwrap();
    let (success, text) = check("MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=");
    assert!(success, "{text}");
    assert!(!text.contains("H08"), "{text}");
}

#[test]
fn unset_secrets_are_errors_when_serving() {
    // The policy `serve` loads with; exercised through the library, since `serve` would start.
    let options = hookgate::check::Options {
        paths: vec![root().join("pipelines/stripe.yaml")],
        instances: root().join("hookgate.yaml"),
        secrets: hookgate::check::SecretPolicy::Require,
        resolver: Default::default(),
    };
    let project = hookgate::check::load(&options);
    assert!(project.has_errors());
    let rendered: Vec<String> = project.diagnostics.iter().map(ToString::to_string).collect();
    assert!(
        rendered.iter().any(|d| d.ends_with("stripe.yaml:11:7: error[H0801]: environment variable `STRIPE_WEBHOOK_SECRET` is not set\n  = hint: set it before starting; secrets are never written in configuration files")),
        "{rendered:#?}"
    );
}

#[test]
fn schemas_in_the_repository_are_fresh_and_printed_by_hookgate_schema() {
    for (name, text) in hookgate::schemas::all() {
        let committed =
            std::fs::read_to_string(root().join("schemas").join(&name)).unwrap_or_default();
        assert!(
            committed == text,
            "schemas/{name} is stale: run `cargo xtask codegen` and commit it"
        );
    }
    for (argument, file) in [
        ("pipeline", "pipeline.schema.json"),
        ("fixture", "fixture.schema.json"),
        ("instances", "hookgate.schema.json"),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_hookgate"))
            .args(["schema", argument])
            .output()
            .unwrap();
        assert!(output.status.success());
        let committed = std::fs::read_to_string(root().join("schemas").join(file)).unwrap();
        assert_eq!(stdout(&output), committed, "hookgate schema {argument}");
    }
    let output =
        Command::new(env!("CARGO_BIN_EXE_hookgate")).args(["schema", "nope"]).output().unwrap();
    assert_eq!(output.status.code(), Some(2), "an unknown schema is a usage error");
}

/// Every shipped file validates against its schema with an independent validator (Python's
/// `jsonschema`, which `.ci/run` installs): a setting of the wrong kind's connector, or a
/// fixture field the schema lacks, shows in an editor as it does at `check`.
#[test]
fn shipped_files_validate_against_their_schemas_independently() {
    let script = r#"
import json, pathlib, sys, yaml, jsonschema
root = pathlib.Path(sys.argv[1])
# YAML 1.2, as hookgate and editors read it: a timestamp is a string, not a date.
class Loader(yaml.SafeLoader):
    pass
Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
def check(schema_file, files):
    schema = json.loads((root / "schemas" / schema_file).read_text())
    validator = jsonschema.Draft202012Validator(schema)
    count = 0
    for path in files:
        for error in validator.iter_errors(yaml.load(path.read_text(), Loader=Loader)):
            print(f"{path.relative_to(root)}: {error.json_path}: {error.message}")
            sys.exit(1)
        count += 1
    return count
groups = ["pipelines", "pipelines/senders", "pipelines/examples"]
pipelines = [f for g in groups for f in sorted(root.glob(f"{g}/*.yaml"))]
fixtures = [f for g in groups for f in sorted(root.glob(f"{g}/*/*.yaml")) if f.parent.name not in ("senders", "examples")]
n = check("pipeline.schema.json", pipelines) + check("fixture.schema.json", fixtures) + check("hookgate.schema.json", [root / "hookgate.yaml"])
# A setting of another kind is an error under the instances schema.
schema = json.loads((root / "schemas" / "hookgate.schema.json").read_text())
wrong = {"connectors": [{"name": "crm", "kind": "mock", "settings": {"login_url": "https://login.salesforce.com"}}]}
if not list(jsonschema.Draft202012Validator(schema).iter_errors(wrong)):
    print("a salesforce setting on a mock instance validated"); sys.exit(1)
print(f"validated {n} files")
"#;
    let output =
        Command::new("python3").args(["-c", script]).arg(root()).output().expect("python3 runs");
    let text = stdout(&output);
    assert!(output.status.success(), "{text}{}", String::from_utf8_lossy(&output.stderr));
    assert!(text.starts_with("validated "), "{text}");
}

#[test]
fn sign_prints_the_headers_a_fixture_needs() {
    // The shipped fixture's signature was computed independently (Python's hmac); `sign` must
    // produce the same header for the same body and secret.
    let output = Command::new(env!("CARGO_BIN_EXE_hookgate"))
        .args([
            "sign",
            "pipelines/crm-partner.yaml",
            "--body",
            "pipelines/crm-partner/update-1000.json",
        ])
        .current_dir(root())
        .env("CRM_PARTNER_SECRET", "crm-partner-test-secret")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let printed = stdout(&output);
    let fixture =
        std::fs::read_to_string(root().join("pipelines/crm-partner/patient-update.yaml")).unwrap();
    let line = printed.trim();
    assert!(line.starts_with("X-Hub-Signature-256: sha256="), "{printed}");
    assert!(fixture.contains(line), "`{line}` is not the fixture's header");

    let output = Command::new(env!("CARGO_BIN_EXE_hookgate"))
        .args([
            "sign",
            "pipelines/stripe.yaml",
            "--body",
            "pipelines/stripe/customer-created.json",
            "--timestamp",
            "1533204620",
        ])
        .current_dir(root())
        .env("STRIPE_WEBHOOK_SECRET", "webhook_secret")
        .output()
        .unwrap();
    assert_eq!(
        stdout(&output),
        "Stripe-Signature: t=1533204620,v1=2220f87ef101a04665f11cdf770523143f875572008577fa0f20882ddb9cc3c7\n",
        "stripe-dotnet's published signature"
    );

    let output = Command::new(env!("CARGO_BIN_EXE_hookgate"))
        .args(["sign", "pipelines/stripe.yaml", "--body", "pipelines/stripe/customer-created.json"])
        .current_dir(root())
        .env_remove("STRIPE_WEBHOOK_SECRET")
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr)
            .contains("environment variable `STRIPE_WEBHOOK_SECRET` is not set")
    );
}

/// A secret `check` can read but its scheme cannot use is an error at the secret's line, not a
/// surprise when serving: a SendGrid verification key that is no public key, an SNS
/// certificate file that is no certificate.
#[test]
fn a_secret_that_cannot_be_a_key_of_its_scheme_is_a_located_error() {
    let dir = tempfile::tempdir().unwrap();
    let not_a_certificate = dir.path().join("sns.pem");
    std::fs::write(
        &not_a_certificate,
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let sns = std::fs::read_to_string(root().join("pipelines/senders/aws-sns.yaml")).unwrap();
    let sns_copy = dir.path().join("aws-sns.yaml");
    std::fs::write(
        &sns_copy,
        sns.replace("/etc/hookgate/sns-us-east-2.pem", not_a_certificate.to_str().unwrap()),
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_hookgate"))
        .args(["check", "--message-format", "short", "pipelines/senders/sendgrid.yaml"])
        .arg(&sns_copy)
        .current_dir(root())
        .env("SENDGRID_VERIFICATION_KEY", "c2VjcmV0")
        .output()
        .unwrap();
    let text = report(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(
        text.contains("pipelines/senders/sendgrid.yaml:11:7: error[H0305]: environment variable `SENDGRID_VERIFICATION_KEY` cannot be used by `sendgrid`: it is not an ECDSA P-256 public key"),
        "{text}"
    );
    assert!(
        text.contains("cannot be used by `aws-sns`: it is not a PEM X.509 certificate"),
        "{text}"
    );
}

fn hookgate_sign(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hookgate"))
        .arg("sign")
        .args(args)
        .current_dir(root())
        .env_remove("TWILIO_AUTH_TOKEN")
        .output()
        .unwrap()
}

/// `sign` reproduces senders' published signatures for the new presets, takes the secret from
/// a fixture, and signs public-key schemes with a private key, checking the result with the
/// pipeline's public key (a mismatched pair is an error, not a useless fixture).
#[test]
fn sign_works_for_every_kind_of_preset() {
    // Twilio's documented form example, with the auth token taken from the fixture.
    let output = hookgate_sign(&[
        "pipelines/senders/twilio.yaml",
        "--body",
        "pipelines/senders/twilio/call.form",
        "--fixture",
        "pipelines/senders/twilio/published-vector.yaml",
        "--url",
        "https://mycompany.com/myapp.php?foo=1&bar=2",
    ]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(stdout(&output), "X-Twilio-Signature: RSOYDt4T1cUTdK1PDd93/VVr8B8=\n");

    // HubSpot v1 and v3 on one pipeline: v3 is what `sign` sends.
    let output = hookgate_sign(&[
        "pipelines/senders/hubspot-legacy.yaml",
        "--body",
        "pipelines/senders/hubspot-legacy/python-body.txt",
        "--fixture",
        "pipelines/senders/hubspot-legacy/v3-published-vector.yaml",
        "--url",
        "https://www.example.com/webhook_uri",
        "--timestamp",
        "15000",
    ]);
    assert_eq!(
        stdout(&output),
        "X-HubSpot-Request-Timestamp: 15000000\nX-HubSpot-Signature-v3: HPW73RUtKmcYoEDADG0s6MmGFWUzWJKAW07r8RDgcQw=\n",
        "hubspot-api-python's published v3 signature; {}",
        String::from_utf8_lossy(&output.stderr)
    );

    // SendGrid: no private key, no signature; with the wrong pair, an error; with the right
    // one, headers that verify.
    let body = "pipelines/senders/sendgrid/dropped.json";
    let fixture = "pipelines/senders/sendgrid/published-vector.yaml";
    let output =
        hookgate_sign(&["pipelines/senders/sendgrid.yaml", "--body", body, "--fixture", fixture]);
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("signing needs the sender's private key")
    );
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("sendgrid.key");
    // sendgrid-go's test key pair: its public half is the published-vector-go fixture's key.
    std::fs::write(&key, "MHcCAQEEIEQmZgBEh9DcU9zMl34czK3xov4AYvm9P3r7rNB2dNXtoAoGCCqGSM49AwEHoUQDQgAEEDr2LjtURuePQzplybdC+u4CwrqDqBaWjcMMsTbhdbcwHBcepxo7yAQGhHPTnlvFYPAZFceEu/1FwCM/QmGUhA==").unwrap();
    let key = key.to_str().unwrap();
    let output = hookgate_sign(&[
        "pipelines/senders/sendgrid.yaml",
        "--body",
        body,
        "--fixture",
        fixture,
        "--private-key",
        key,
    ]);
    assert!(!output.status.success(), "another pair's key");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("does not verify with the pipeline's key")
    );
    let matching = "pipelines/senders/sendgrid/published-vector-go.yaml";
    let output = hookgate_sign(&[
        "pipelines/senders/sendgrid.yaml",
        "--body",
        body,
        "--fixture",
        matching,
        "--private-key",
        key,
        "--timestamp",
        "1700000000",
    ]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = stdout(&output);
    assert!(text.starts_with("X-Twilio-Email-Event-Webhook-Timestamp: 1700000000\nX-Twilio-Email-Event-Webhook-Signature: ME"), "{text}");
}

/// `--bless` writes every shipped fixture's expectation back from what its delivery produces:
/// with every `expect:` reduced to a bare `signature: valid`, one blessing run rewrites them,
/// a plain `check` then passes them all, and each key the original expected is the key written.
#[test]
fn bless_round_trips_every_shipped_fixture() {
    let dir = project_copy();
    copy_dir(&root().join("pipelines/senders"), &dir.path().join("pipelines/senders"));
    let mut originals = Vec::new();
    for pattern_dir in ["pipelines", "pipelines/senders", "pipelines/examples"] {
        for pipeline in std::fs::read_dir(dir.path().join(pattern_dir)).unwrap() {
            let pipeline = pipeline.unwrap().path();
            if !pipeline.is_dir() || pipeline.ends_with("senders") || pipeline.ends_with("examples")
            {
                continue;
            }
            for fixture in std::fs::read_dir(&pipeline).unwrap() {
                let fixture = fixture.unwrap().path();
                if fixture.extension().is_none_or(|e| e != "yaml") {
                    continue;
                }
                let text = std::fs::read_to_string(&fixture).unwrap();
                let at = text.find("\nexpect:").expect("every fixture has `expect:`");
                std::fs::write(&fixture, format!("{}\nexpect:\n  signature: valid\n", &text[..at]))
                    .unwrap();
                originals.push((fixture, text));
            }
        }
    }
    assert!(originals.len() > 100, "{} fixtures", originals.len());

    let all = ["pipelines", "pipelines/senders", "pipelines/examples"];
    let blessed = hookgate_check(dir.path(), &[&["--bless"][..], &all].concat());
    let text = report(&blessed);
    assert!(text.contains(&format!("blessed {} fixtures", originals.len())), "{text}");
    let checked = hookgate_check(dir.path(), &all);
    let text = report(&checked);
    assert!(checked.status.success(), "{text}");
    assert!(text.contains("(0 failed): 0 errors"), "{text}");

    for (fixture, original) in &originals {
        let rewritten = std::fs::read_to_string(fixture).unwrap();
        let field = |text: &str, name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("  {name}: ")))
                .map(|v| v.trim().trim_matches('"').to_owned())
        };
        for name in ["key", "rejection", "signature"] {
            if let Some(expected) = field(original, name) {
                assert_eq!(
                    field(&rewritten, name),
                    Some(expected),
                    "{}: {name}",
                    fixture.display()
                );
            }
        }
        let kept = &original[..original.find("\nexpect:").unwrap()];
        assert!(rewritten.starts_with(kept), "{}: the request is kept", fixture.display());
    }
}

/// `hookgate fixture new` writes a signed fixture whose expectation is what the delivery
/// produces, and `check` passes it; public-key schemes say what they need instead.
#[test]
fn fixture_new_writes_a_fixture_that_passes() {
    let dir = project_copy();
    copy_dir(&root().join("pipelines/senders"), &dir.path().join("pipelines/senders"));
    let new = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_hookgate"))
            .args(["fixture", "new"])
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap()
    };
    let output = new(&[
        "pipelines/github.yaml",
        "--body",
        "pipelines/github/push.json",
        "--name",
        "written",
        "--header",
        "X-GitHub-Delivery: d-1",
        "--header",
        "X-GitHub-Event: push",
        "--header",
        "X-GitHub-Hook-ID: 7",
    ]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let written =
        std::fs::read_to_string(dir.path().join("pipelines/github/written.yaml")).unwrap();
    assert!(
        written.starts_with("# yaml-language-server: $schema=../../schemas/fixture.schema.json")
    );
    assert!(
        written.contains("  key: \"d-1\"") && written.contains("value: \"monalisa\""),
        "{written}"
    );
    // A Standard Webhooks sender under pipelines/senders: a whsec test secret is made up.
    let output = new(&[
        "pipelines/senders/svix.yaml",
        "--body",
        "pipelines/senders/svix/invoice-paid.json",
        "--name",
        "written",
        "--message-id",
        "msg_written",
        "--now",
        "2026-11-01T12:00:00Z",
    ]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let written =
        std::fs::read_to_string(dir.path().join("pipelines/senders/svix/written.yaml")).unwrap();
    assert!(
        written.starts_with("# yaml-language-server: $schema=../../../schemas/fixture.schema.json"),
        "{written}"
    );
    assert!(written.contains("SVIX_WEBHOOK_SECRET\": \"whsec_"), "{written}");
    assert!(written.contains("  key: \"msg_written\""), "{written}");
    let checked = hookgate_check(dir.path(), &["pipelines", "pipelines/senders"]);
    let text = report(&checked);
    assert!(checked.status.success() && text.contains("(0 failed): 0 errors"), "{text}");
    // Existing names are not overwritten; public keys are asked for.
    let again = new(&[
        "pipelines/github.yaml",
        "--body",
        "pipelines/github/push.json",
        "--name",
        "written",
    ]);
    assert!(!again.status.success());
    let sns = new(&[
        "pipelines/senders/aws-sns.yaml",
        "--body",
        "pipelines/senders/aws-sns/sha1.json",
        "--name",
        "x",
    ]);
    assert!(String::from_utf8_lossy(&sns.stderr).contains("verifies with a public key"));
}

/// A project whose one pipeline has ten independent mistakes (the pipeline crate's golden
/// case), with the shipped instances file.
fn ten_mistakes_project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let cases = root().join("crates/hookgate-pipeline/tests/diagnostics");
    std::fs::create_dir(dir.path().join("pipelines")).unwrap();
    std::fs::copy(cases.join("ten-mistakes.yaml"), dir.path().join("pipelines/ten-mistakes.yaml"))
        .unwrap();
    std::fs::copy(root().join("hookgate.yaml"), dir.path().join("hookgate.yaml")).unwrap();
    dir
}

fn check_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hookgate"))
        .args(["check", "--allow-unset-secrets"])
        .args(args)
        .current_dir(dir)
        .env_remove("HOOKGATE_INSTANCES")
        .env_remove("NO_COLOR")
        .output()
        .unwrap()
}

/// Compares `actual` with a golden file under tests/diagnostics/; `UPDATE_EXPECT=1` rewrites it.
fn assert_golden(name: &str, actual: &str) {
    let path = root().join("tests/diagnostics").join(name);
    if std::env::var_os("UPDATE_EXPECT").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        expected == actual,
        "{} differs (UPDATE_EXPECT=1 rewrites it); actual:\n{actual}",
        path.display()
    );
}

/// The human form, as rustc shows errors: every mistake in one run, each with its source line,
/// a caret under the span, a label, the hint, and its code; a note at a duplicate's first
/// definition; the codes found and the summary last; all on stderr, nothing on stdout.
#[test]
fn the_human_form_shows_every_mistake_with_its_source_line() {
    let project = ten_mistakes_project();
    let output = check_in(project.path(), &["--color", "never"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty(), "{}", stdout(&output));
    let text = report(&output);
    assert_golden("ten-mistakes.human", &text);
    assert!(text.ends_with("10 errors, 2 warnings\n"), "{text}");
    assert!(!text.contains('\x1b'), "no colour when asked for none");

    // Colour: always when asked, never when stderr is not a terminal (as here) under `auto`.
    let coloured = report(&check_in(project.path(), &["--color", "always"]));
    assert!(coloured.contains("\x1b["), "{coloured}");
    let auto = report(&check_in(project.path(), &[]));
    assert!(!auto.contains('\x1b'), "{auto}");
}

/// `--message-format json`: one JSON object per line on stdout, parsed back here, with the
/// same problems at the same places as the short form, and a summary last.
#[test]
fn the_json_form_parses_back_to_the_same_problems() {
    let project = ten_mistakes_project();
    let json = check_in(project.path(), &["--message-format", "json"]);
    assert_eq!(json.status.code(), Some(1));
    assert!(json.stderr.is_empty(), "{}", report(&json));
    let short = report(&check_in(project.path(), &["--message-format", "short"]));
    let short_heads: Vec<&str> =
        short.lines().filter(|l| l.contains(": error[") || l.contains(": warning[")).collect();

    let lines: Vec<serde_json::Value> = stdout(&json)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    let (summary, diagnostics) = lines.split_last().unwrap();
    assert_eq!(summary["reason"], "summary");
    assert_eq!(summary["errors"], 10);
    assert_eq!(summary["warnings"], 2);
    assert_eq!(diagnostics.len(), short_heads.len());
    for (diagnostic, head) in diagnostics.iter().zip(&short_heads) {
        assert_eq!(diagnostic["reason"], "diagnostic");
        let rebuilt = format!(
            "{}:{}:{}: {}[{}]: {}",
            diagnostic["file"].as_str().unwrap(),
            diagnostic["line"],
            diagnostic["column"],
            diagnostic["severity"].as_str().unwrap(),
            diagnostic["code"].as_str().unwrap(),
            diagnostic["message"].as_str().unwrap(),
        );
        assert_eq!(&rebuilt, head);
        let rendered = diagnostic["rendered"].as_str().unwrap();
        assert!(rendered.contains(" --> ") && rendered.contains('^'), "{rendered}");
    }
    let duplicate = diagnostics.iter().find(|d| d["code"] == "H0202").unwrap();
    assert_eq!(duplicate["related"][0]["line"], 22, "{duplicate}");
    assert_eq!(duplicate["related"][0]["message"], "first defined here");
}

/// Every code has an explanation that `hookgate explain` prints, in any spelling; an unknown
/// code is a usage error that lists the codes.
#[test]
fn explain_prints_what_a_code_means() {
    let explain = |code: &str| {
        Command::new(env!("CARGO_BIN_EXE_hookgate")).args(["explain", code]).output().unwrap()
    };
    for code in hookgate_pipeline::Code::ALL {
        for spelling in [code.as_str().to_owned(), code.as_str().to_lowercase()] {
            let output = explain(&spelling);
            assert!(output.status.success(), "{spelling}");
            let text = stdout(&output);
            assert!(text.starts_with(&format!("{code}: {}\n\n", code.title())), "{text}");
            assert!(text.len() > 120, "{code} is explained in a few sentences: {text}");
        }
    }
    let unknown = explain("H9999");
    assert_eq!(unknown.status.code(), Some(2));
    assert!(report(&unknown).contains("H0103  a name that is not one of the allowed values"));
}

/// Every code is produced by some test that shows it: a golden file of the pipeline crate, of
/// this directory, or an expectation in this file. A code nothing produces is not a code.
#[test]
fn every_code_is_produced_by_a_test() {
    let mut shown = String::new();
    for dir in ["crates/hookgate-pipeline/tests/diagnostics", "tests/diagnostics"] {
        for entry in std::fs::read_dir(root().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "expected" || e == "human") {
                shown.push_str(&std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    shown.push_str(&std::fs::read_to_string(root().join("tests/check.rs")).unwrap());
    let missing: Vec<&str> = hookgate_pipeline::Code::ALL
        .iter()
        .map(|c| c.as_str())
        .filter(|c| !shown.contains(&format!("[{c}]")))
        .collect();
    assert!(missing.is_empty(), "codes no test shows: {missing:?}");
}

/// Plugins load only from the directories `plugins.directories` names, and each library there
/// that cannot be used is a located error: a missing directory, a library others may write
/// to, a symlink leading out of the directory, a file that is not a library at all.
#[test]
fn plugin_directories_that_cannot_be_trusted_are_located_errors() {
    use std::os::unix::fs::PermissionsExt as _;
    let project = project_copy();
    let dir = project.path();
    let instances = dir.join("hookgate.yaml");
    let text = std::fs::read_to_string(&instances).unwrap();
    std::fs::write(
        &instances,
        format!("plugins:\n  directories: [missing, open, leaks, junk]\n{text}"),
    )
    .unwrap();
    for name in ["open", "leaks", "junk"] {
        std::fs::create_dir(dir.join(name)).unwrap();
        std::fs::set_permissions(dir.join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(dir.join("open"), std::fs::Permissions::from_mode(0o777)).unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("libevil.so"), b"not a library").unwrap();
    std::os::unix::fs::symlink(outside.path().join("libevil.so"), dir.join("leaks/libevil.so"))
        .unwrap();
    std::fs::write(dir.join("junk/libjunk.so"), b"not a library").unwrap();
    std::fs::set_permissions(dir.join("junk/libjunk.so"), std::fs::Permissions::from_mode(0o644))
        .unwrap();

    let output = hookgate_check(dir, &[]);
    let text = report(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    for expected in [
        "hookgate.yaml:2:17: error[H0605]: plugin directory missing: No such file or directory",
        "hookgate.yaml:2:26: error[H0605]: plugin directory open is writable by its group or others (mode 777)",
        "hookgate.yaml:2:32: error[H0605]: leaks/libevil.so resolves to",
        "outside the plugin directory leaks",
        "hookgate.yaml:2:39: error[H0605]: ",
        "junk/libjunk.so: cannot load the library",
    ] {
        assert!(text.contains(expected), "expected {expected:?} in\n{text}");
    }
}

/// The guide's `export` lines before `serve` name every secret the shipped configuration
/// reads: with none of them set, `check` lists each (what `serve` would refuse), and each is
/// exported there, so that following the guide starts `serve`.
#[test]
fn the_guide_exports_every_secret_the_shipped_configuration_reads() {
    let output = Command::new(env!("CARGO_BIN_EXE_hookgate"))
        .args(["check", "--message-format", "short"])
        .current_dir(root())
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .output()
        .unwrap();
    let text = report(&output);
    let warning = text.lines().find(|l| l.contains("secrets are not set")).unwrap_or_else(|| {
        panic!("no unset secrets in an empty environment:\n{text}");
    });
    let needed: std::collections::BTreeSet<&str> =
        warning.split("variable `").skip(1).filter_map(|rest| rest.split('`').next()).collect();
    assert!(needed.len() >= 5, "{warning}");
    let guide = std::fs::read_to_string(root().join("docs/guide/serving.md")).unwrap();
    let serving = guide.split("# Serving\n").nth(1).unwrap();
    let exported: std::collections::BTreeSet<&str> = serving
        .lines()
        .take_while(|line| !line.starts_with("cargo run"))
        .filter_map(|line| line.strip_prefix("export "))
        .flat_map(str::split_whitespace)
        .filter_map(|assignment| assignment.split_once('=').map(|(name, _)| name))
        .collect();
    let missing: Vec<&&str> = needed.difference(&exported).collect();
    assert!(missing.is_empty(), "docs/guide/serving.md does not export {missing:?}");
}

/// `check` refuses what the connector kind would refuse at `serve`, not only what its schema
/// does: a `kind: http` lookup without `fields` could not tell whether a write in doubt was
/// applied, and would write it twice. The error is where the instance is written, and says why.
#[test]
fn a_rest_lookup_without_fields_is_refused_by_check() {
    let project = project_copy();
    let instances = project.path().join("hookgate.yaml");
    replace_in(&instances, "        fields: /fields\n", "");
    let output = Command::new(env!("CARGO_BIN_EXE_hookgate"))
        .args(["check", "--message-format", "short", "pipelines/examples/inhouse-orders.yaml"])
        .current_dir(project.path())
        .env("INHOUSE_CRM_URL", "https://crm.example.com")
        .env("INHOUSE_TOKEN_URL", "https://crm.example.com/oauth/token")
        .output()
        .unwrap();
    let text = report(&output);
    assert!(!output.status.success(), "{text}");
    let line = text.lines().find(|l| l.contains("settings.lookup.fields")).unwrap_or_else(|| {
        panic!("no lookup.fields error in:\n{text}");
    });
    assert!(line.starts_with("hookgate.yaml:31:"), "{line}");
    assert!(line.contains("error[") && line.contains("it would be written again"), "{line}");
}

/// Every relative link of the README, ARCHITECTURE.md and the guide names a file that exists,
/// and every `#anchor` a heading of its page (as GitHub makes anchors from headings).
#[test]
fn the_docs_link_to_what_exists() {
    let mut pages = vec![root().join("README.md"), root().join("ARCHITECTURE.md")];
    let mut guide: Vec<PathBuf> = std::fs::read_dir(root().join("docs/guide"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    guide.sort();
    assert!(guide.len() >= 5, "{guide:?}");
    pages.extend(guide);
    let anchors = |page: &Path| -> Vec<String> {
        let text = std::fs::read_to_string(page).unwrap();
        let mut fenced = false;
        let mut out = Vec::new();
        for line in text.lines() {
            if line.starts_with("```") {
                fenced = !fenced;
            }
            if fenced || !line.starts_with('#') {
                continue;
            }
            let title = line.trim_start_matches('#').trim().to_lowercase();
            let slug: String = title
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect();
            out.push(slug);
        }
        out
    };
    let mut broken = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        let mut fenced = false;
        for (number, line) in text.lines().enumerate() {
            if line.starts_with("```") {
                fenced = !fenced;
            }
            if fenced {
                continue;
            }
            for link in line.split("](").skip(1).filter_map(|rest| rest.split(')').next()) {
                if link.starts_with("http://")
                    || link.starts_with("https://")
                    || link.starts_with("mailto:")
                {
                    continue;
                }
                let (path, anchor) = link.split_once('#').unwrap_or((link, ""));
                let target =
                    if path.is_empty() { page.clone() } else { page.parent().unwrap().join(path) };
                let place = format!("{}:{}: {link}", page.display(), number + 1);
                if !target.exists() {
                    broken.push(format!("{place} (no such file)"));
                } else if !anchor.is_empty() && !anchors(&target).iter().any(|a| a == anchor) {
                    broken.push(format!("{place} (no such heading)"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The guide's command-line reference is `hookgate --help` and every subcommand's, as clap
/// prints them: regenerated with `UPDATE_EXPECT=1`, and a stale page fails here.
#[test]
fn the_cli_reference_is_the_help_hookgate_prints() {
    let help = |args: &[&str]| -> String {
        let output = Command::new(env!("CARGO_BIN_EXE_hookgate"))
            .args(args)
            .arg("--help")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .output()
            .unwrap();
        assert!(output.status.success(), "{args:?}");
        String::from_utf8(output.stdout).unwrap()
    };
    let commands = |text: &str| -> Vec<String> {
        let Some(list) = text.split("\nCommands:\n").nth(1) else { return Vec::new() };
        list.lines()
            .take_while(|line| line.starts_with("  "))
            .filter_map(|line| line.split_whitespace().next())
            .filter(|name| *name != "help")
            .map(str::to_owned)
            .collect()
    };
    let mut page = String::from(
        "# Command-line reference\n\n\
         What `hookgate --help` and each subcommand's `--help` print. Generated by the test\n\
         `check::the_cli_reference_is_the_help_hookgate_prints` (`UPDATE_EXPECT=1 cargo test -p\n\
         hookgate --test e2e check::the_cli` rewrites it), which fails when it is stale.\n",
    );
    let mut queue: Vec<Vec<String>> = vec![Vec::new()];
    while let Some(path) = queue.pop() {
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        let text = help(&args);
        let title = if path.is_empty() {
            "hookgate".to_owned()
        } else {
            format!("hookgate {}", path.join(" "))
        };
        page.push_str(&format!("\n## {title}\n\n```text\n{}\n```\n", text.trim_end()));
        for name in commands(&text).into_iter().rev() {
            let mut next = path.clone();
            next.push(name);
            queue.push(next);
        }
    }
    let committed = root().join("docs/guide/cli.md");
    if std::env::var_os("UPDATE_EXPECT").is_some_and(|v| v == "1") {
        std::fs::write(&committed, &page).unwrap();
    }
    let text = std::fs::read_to_string(&committed).unwrap_or_default();
    assert!(
        text == page,
        "docs/guide/cli.md is stale: UPDATE_EXPECT=1 cargo test -p hookgate --test e2e check::the_cli"
    );
    assert!(page.contains("## hookgate events refused") && page.contains("## hookgate send"));
}
