//! Error codes: one per kind of problem, so that a diagnostic can be looked up
//! (`hookgate explain H0103`), filtered in CI and matched by editors without parsing messages.
//!
//! Codes are grouped by hundreds: 00 files and YAML, 01 structure, 02 names, 03 signatures,
//! 04 JSON pointers, 05 templates, 06 connectors, 07 values, 08 secrets, 09 fixtures,
//! 10 payload types. A code, once published, keeps its meaning.

use std::fmt;

macro_rules! codes {
    ($($variant:ident = $code:literal, $title:literal, $explanation:literal;)*) => {
        /// The kind of a diagnostic.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Code {
            $($variant,)*
        }

        impl Code {
            pub const ALL: &'static [Code] = &[$(Code::$variant,)*];

            /// `H0103`.
            pub fn as_str(self) -> &'static str {
                match self { $(Code::$variant => $code,)* }
            }

            /// One line: what kind of problem this is.
            pub fn title(self) -> &'static str {
                match self { $(Code::$variant => $title,)* }
            }

            /// Why it is a problem and how to fix it, with an example.
            pub fn explanation(self) -> &'static str {
                match self { $(Code::$variant => $explanation,)* }
            }
        }
    };
}

codes! {
    Yaml = "H0001", "the file is not valid YAML, or exceeds a limit",
"The file could not be read as YAML: a syntax error, an alias to an unknown anchor, or one of
the limits every configuration file is held to (1 MiB, 64 levels of nesting, 100,000 nodes
after aliases are expanded, which stops \"billion laughs\" files).

    targets:
      - name: contact
       connector: crm      # indented one space less than `name`

Fix the line named; YAML is indentation-sensitive, and tabs are not indentation.";

    DuplicateKey = "H0002", "a key appears twice in one mapping",
"YAML parsers disagree about which of two equal keys wins, so hookgate refuses both and keeps
the first. The diagnostic points at the second and names the line of the first.

    name: signups
    name: sign-ups     # error[H0002]: duplicate key `name`";

    File = "H0003", "a file cannot be read",
"A named file is missing, unreadable, not UTF-8, or larger than its limit (configuration 1 MiB,
fixture bodies 16 MiB). Check the path: pipeline paths are relative to the current directory,
fixture `body_file`s to the fixture's directory.";

    UnknownField = "H0101", "a key that this block does not have",
"Every block accepts a fixed set of keys; anything else is usually a typo, and a typo in an
optional key would otherwise be silently ignored. The hint names the closest known key.

    ordring:           # error[H0101]: unknown field `ordring`; did you mean `ordering`?
      entity: \"{{ payload.id }}\"

The rest of the file is still checked, and a required key that was misspelt is not reported
again as missing.";

    WrongType = "H0102", "a value of the wrong type or form",
"The value is not what the key takes: a mapping where a list is expected, text where a number
is, or text that does not parse (a duration without a unit).

    delivery:
      attempts_max: twelve   # error[H0102]: expected a whole number that fits
    retention: 90            # error[H0102]: invalid duration: write `90d`

Durations are written `30s`, `5m`, `12h`, `7d`.";

    UnknownVariant = "H0103", "a name that is not one of the allowed values",
"The key takes one of a closed set of names; the hint lists them all, and the closest one
first when the value looks like a typo of it.

    signature:
      scheme: hmac
      algorithm: md5    # error[H0103]: unknown variant `md5`; supported: `sha1`, `sha256`, ...";

    MissingField = "H0104", "a required key is absent",
"The block needs this key and has no default for it. The diagnostic points at the block that
should hold it.

    targets:
      - name: contact     # error[H0104]: missing field `connector`
        object: contacts";

    InvalidName = "H0201", "a name that cannot be used",
"Pipeline and connector names become URL paths and metric labels: lowercase letters, digits,
`-` and `_`, starting with a letter, at most 64 characters.

    name: Sign Ups    # error[H0201]: invalid pipeline name";

    DuplicateName = "H0202", "a name defined twice",
"Target, connector and pipeline names must be unique where they are defined: they key
evidence, metrics and intake paths. The diagnostic points at the second definition and a
note at the first.";

    SignatureConflict = "H0301", "signature settings that do not go together",
"A setting was given where it has no meaning or contradicts another one: an HMAC option on a
preset, a `header` beside `variants`, `equals` without `header` or `body_field`.

    signature:
      scheme: github
      prefix: \"sha256=\"   # error[H0301]: `prefix` applies only to `scheme: hmac`

A preset already knows its sender's rules; write `scheme: custom` to state them yourself.";

    SignatureIncomplete = "H0302", "a signature rule that lacks something it needs",
"The rule cannot verify anything without the named setting: `scheme: custom` needs
`algorithm`, `message` and a place for the signature; `signed: timestamp_body` needs
`timestamp_header`; `fetch_keys` needs `hosts`; AWS SNS needs `senders`.

    signature:
      scheme: custom      # error[H0302]: `scheme: custom` needs `algorithm`
      header: X-Signature
      message: [body]";

    HeaderName = "H0303", "not a valid HTTP header name",
"Header names are tokens (RFC 9110): letters, digits and `!#$%&'*+-.^_`|~`, no spaces or
colons. Write the name only, without `:` or a value.

    signature:
      header: \"X-Signature: sha256\"   # error[H0303]";

    SignatureAlgorithm = "H0304", "an algorithm, key format or message that is wrong or weak",
"The algorithm cannot use the key format given, the name is ambiguous, or the construction is
unsafe: HMAC keeps its key out of the message, and a plain SHA-256 of the secret followed by
the content can be extended by anyone who has seen one signature (a warning).

    variants:
      - algorithm: ecdsa-p256-sha256
        key_format: raw      # error[H0304]: `public_key` goes with `ecdsa-p256-sha256`";

    Secrets = "H0305", "no secret, or a secret that cannot be this scheme's key",
"A pipeline without a secret would accept anyone's deliveries. A secret that is set but is not
a key of its scheme (a public key that does not parse, a `whsec_` value that is not base64)
is refused before any delivery is.

    signature:
      scheme: stripe
      secrets: []     # error[H0305]: at least one secret is needed";

    KeyFetching = "H0306", "signing keys fetched from the sender, configured wrongly",
"Senders such as AWS SNS name a certificate URL in each delivery. hookgate fetches keys only
from the `hosts` listed (`*` for one DNS label, `{region}` for an AWS region), and only for
the `senders` trusted.

    fetch_keys:
      hosts: [\"*.com\"]   # error[H0306]: not a host name pattern";

    SignatureVariants = "H0307", "a problem with `variants` or their conditions",
"Each variant says when it applies (`header`, `query_param`, `body_field` with `equals`, `all`
or `always: true`) and variants are tried in order, so one that always applies hides those
after it (a warning).

    variants: []     # error[H0307]: `variants` is empty";

    JsonPointer = "H0401", "not a JSON pointer",
"JSON pointers (RFC 6901) start with `/` and separate members with `/`: `/data/object/id`.
Array items are numbers: `/items/0`.

    event_type:
      pointer: data.type    # error[H0401]: write `/data/type`";

    DottedPointer = "H0402", "a JSON pointer with a `.` in a member name",
"`/data.Command` names one member called `data.Command`, which is rarely meant: nested members
are separated by `/`, as in `/data/Command`. If the sender really uses dots in member names,
the warning can be ignored.";

    TemplateSyntax = "H0501", "a template or condition that does not parse",
"Templates are minijinja (Jinja2): `{{ payload.email }}`. A `when` condition is already an
expression, so it is written without `{{ }}`:

    when: \"{{ payload.type == 'update' }}\"   # error[H0501]
    when: \"payload.type == 'update'\"          # right";

    TemplateVariable = "H0502", "a template uses a variable that is not defined there",
"Templates see `payload`, `headers` and `body`; targets also see `event` (its `key`, `scope`,
`type`). The key, scope and type themselves are derived before `event` exists.

    scope: \"{{ event.scope }}\"   # error[H0502]: use `payload` or `headers`";

    TemplateFilter = "H0503", "a template applies a filter or test that does not exist",
"Filters and tests are minijinja's built-ins (`lower`, `default`, `tojson`, `is defined`, ...)
plus hookgate's deterministic helpers (`sha256`, `urldecode`). minijinja looks a filter up
only when the template runs, so `check` looks for them before:

    value: \"{{ payload.email | lowercase }}\"   # error[H0503]: write `lower`";

    UnknownConnector = "H0601", "a target names a connector instance that does not exist",
"`connector:` names an instance in the connector-instances file (`hookgate.yaml`, or the file
given with `--instances`). The hint names the closest one and where instances are defined.";

    ConnectorRule = "H0602", "a target that its connector cannot carry out",
"Each connector kind has rules of its own: Salesforce upserts by an external-id field, never
by `Id`; HubSpot upserts by a unique property. The message says which rule and why.";

    ConnectorSettings = "H0603", "connector settings or credentials that are wrong or missing",
"An instance's `settings` are checked against its kind's own settings, and each credential
the kind needs must be referenced (`client_secret: { env: SF_CLIENT_SECRET }`).";

    UnknownConnectorKind = "H0604", "an instance whose kind no connector provides",
"A `kind` is an in-tree connector (`mock`, `salesforce`, `hubspot`, `http`) or one that a
plugin in `plugins.directories` describes. `hookgate connectors` lists the kinds this
configuration has, with where each comes from.";

    Plugin = "H0605", "a connector plugin that cannot be used",
"Plugins load only from the directories `plugins.directories` names (relative to
`hookgate.yaml`). A library is refused when it resolves outside them, others may write to it,
it is not a hookgate plugin (no `hookgate_connector_plugin` symbol), it was built for another
connector ABI, its description is not valid, or its kind is already taken.

    # hookgate.yaml
    plugins:
      directories: [plugins]     # plugins/libhookgate_plugin_pipedrive.so
    connectors:
      - name: crm
        kind: pipedrive          # the kind the library describes

    hookgate.yaml:2:17: error[H0605]: plugins/libhookgate_plugin_pipedrive.so is writable by
      its group or others (mode 775)

Fix what the message names: `chmod go-w` the directory and the library; build the plugin as a
`cdylib` with `hookgate_plugin::export_connector!(Kind);` against the hookgate-plugin crate of
this hookgate (the message says which ABI each speaks); replace a dangling symbolic link; or
rename one of two plugins that describe the same kind. `hookgate connectors` lists the kinds
that did load, with the library each came from.";

    OutOfRange = "H0701", "a value outside what it may be",
"Numbers and durations have bounds that keep the gateway safe and useful: `jitter` is a
fraction from 0 to 1, `attempts_max` from 1 to 100, `retention` at least 1h, a timestamp
`tolerance` from 1s to the scheme's maximum.

    delivery:
      jitter: 1.5     # error[H0701]: jitter is a fraction from 0 to 1";

    NoEffect = "H0702", "a setting that has no effect here",
"The setting is valid but this pipeline never uses it, for example `public_url` with a scheme
that does not sign the URL. Remove it, or check whether another scheme was meant.";

    Refresh = "H0703", "a source refresh that cannot be made safely",
"A target's `refresh:` fetches the object an event names just before writing. Its URL's
scheme and host are written out, so that nothing a sender puts in a payload can send the
request (and its credentials) elsewhere; templates go in the path or query, with `urlencode`:

    refresh:
      url: \"https://{{ payload.shop }}/customers/1\"            # error[H0703]
      url: \"https://api.stripe.com/v1/customers/{{ payload.data.object.customer | urlencode }}\"

Plain `http://` is allowed to loopback hosts (tests) or with `allow_plain_http: true`.";

    UnsetSecret = "H0801", "a secret's environment variable or file is not set",
"Secrets are references (`env: STRIPE_WEBHOOK_SECRET`, `file: /run/secrets/x`), never values.
`check` warns when one cannot be resolved, because CI rarely has production secrets (off with
`--allow-unset-secrets`, and not reported for secrets that the pipeline's fixtures supply);
`serve` refuses to start.";

    PlaintextPayloads = "H0802", "stored payloads are not encrypted",
"Without `payload_encryption` in the connector-instances file, event bodies, kept headers and
rejected deliveries' bodies are stored as received. With it, each is sealed (AES-256-GCM)
under the first listed key, and the key's id is kept with the row:

    payload_encryption:
      keys:
        - id: k2
          secret: { env: HOOKGATE_PAYLOAD_KEY }        # 32 random bytes, base64
        - id: k1                                       # older rows; remove after
          secret: { file: /run/secrets/payload-k1 }    # `hookgate keys rotate`";

    PayloadKey = "H0803", "a payload key that cannot be used",
"A payload key is 32 random bytes written in base64, as `openssl rand -base64 32` prints
them, in the environment variable or file its `secret` names.

    payload_encryption:
      keys:
        - id: k1
          secret: { env: HOOKGATE_PAYLOAD_KEY }   # error[H0803]: 16 bytes; a key is 32 bytes";

    FixtureMismatch = "H0901", "a fixture's delivery does not produce what it expects",
"The fixture's `expect:` differs from what the pipeline produced for its request. Either the
pipeline changed on purpose (run `hookgate check --bless` and review the diff) or it broke.";

    FixtureBody = "H0902", "a fixture's body or file cannot be used",
"The fixture's `body_file` is missing or too large, or the fixture could not be rewritten by
`--bless`. Body files are relative to the fixture's directory.";

    UnknownPayloadField = "H1001", "a template or pointer names a payload field the sender never sends",
"The pipeline declares the sender's payload (`payload_schema:`, a JSON Schema, or
`payload_schema: fixtures` to infer it from the fixtures' bodies), so `check` knows which
fields exist. A field outside it is almost always a typo or a field of another event.

    payload_schema: fixtures
    ordering:
      entity: \"{{ payload.PatientID }}\"   # error[H1001]: did you mean `PatientId`?";

    UnguardedField = "H1002", "a field every delivery needs may be absent",
"The ordering entity and version and each target's external id are rendered when a delivery
arrives; a delivery without a field they read is refused (400, kept as a rejected delivery),
and the sender's retries are refused too. `check` reports a needed field that the declared
schema does not require (an error) or that some fixture lacks (a warning). Require it in the
schema, give it a default (`{{ payload.id | default('') }}`), or limit the target with
`when: payload.id is defined`.

    payload_schema:
      properties: { id: { type: string } }    # `id` is not in `required`
    ordering:
      entity: \"{{ payload.id }}\"               # error[H1002]";
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Code {
    type Err = ();

    /// Accepts `H0103`, `h0103` and `0103`.
    fn from_str(text: &str) -> Result<Code, ()> {
        let text = text.trim();
        let digits = text.strip_prefix(['H', 'h']).unwrap_or(text);
        Code::ALL.iter().copied().find(|code| &code.as_str()[1..] == digits).ok_or(())
    }
}
