//! Every sender hookgate knows, written in the signature language. Nothing here is special
//! cased in the engine: a preset is data, and a pipeline can write out the same data itself.

use crate::scheme::{
    Algorithm, Condition, Encoding, Fields, HeaderRef, KeyFormat, Part, Scheme, SignatureSource,
    Spec, TimestampFormat, TimestampRule, TimestampSource, TimestampSpec, Variant,
};

/// A sender whose signature scheme is built in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    Github,
    Stripe,
    StandardWebhooks,
    Svix,
    Shopify,
    Slack,
    /// HubSpot v3 only (`X-HubSpot-Signature-v3`).
    HubspotV3,
    /// HubSpot v1, v2 and v3, chosen as HubSpot marks each request.
    Hubspot,
    /// Twilio form webhooks (voice, messaging): URL + sorted parameters.
    Twilio,
    /// Twilio webhooks with JSON bodies: the URL carries the body's SHA-256. A separate preset,
    /// so that a delivery cannot choose which of the two rules checks it.
    TwilioJson,
    Sendgrid,
    Paddle,
    Square,
    Zendesk,
    Intercom,
    Calendly,
    /// Supabase auth hooks: Standard Webhooks.
    SupabaseAuth,
    /// Supabase database webhooks: a secret the project sends as `Authorization: Bearer …`.
    SupabaseDatabase,
    /// EventBridge API destinations with an API-key connection: `x-api-key: <secret>`.
    EventbridgeApiKey,
    /// EventBridge API destinations with a basic-auth connection; the secret is `user:password`.
    EventbridgeBasic,
    /// AWS SNS messages, signed with the certificate of the topic's region.
    AwsSns,
}

impl Preset {
    pub const ALL: [Preset; 21] = [
        Preset::Github,
        Preset::Stripe,
        Preset::StandardWebhooks,
        Preset::Svix,
        Preset::Shopify,
        Preset::Slack,
        Preset::HubspotV3,
        Preset::Hubspot,
        Preset::Twilio,
        Preset::TwilioJson,
        Preset::Sendgrid,
        Preset::Paddle,
        Preset::Square,
        Preset::Zendesk,
        Preset::Intercom,
        Preset::Calendly,
        Preset::SupabaseAuth,
        Preset::SupabaseDatabase,
        Preset::EventbridgeApiKey,
        Preset::EventbridgeBasic,
        Preset::AwsSns,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Preset::Github => "github",
            Preset::Stripe => "stripe",
            Preset::StandardWebhooks => "standard-webhooks",
            Preset::Svix => "svix",
            Preset::Shopify => "shopify",
            Preset::Slack => "slack",
            Preset::HubspotV3 => "hubspot-v3",
            Preset::Hubspot => "hubspot",
            Preset::Twilio => "twilio",
            Preset::TwilioJson => "twilio-json",
            Preset::Sendgrid => "sendgrid",
            Preset::Paddle => "paddle",
            Preset::Square => "square",
            Preset::Zendesk => "zendesk",
            Preset::Intercom => "intercom",
            Preset::Calendly => "calendly",
            Preset::SupabaseAuth => "supabase-auth",
            Preset::SupabaseDatabase => "supabase-database",
            Preset::EventbridgeApiKey => "eventbridge-api-key",
            Preset::EventbridgeBasic => "eventbridge-basic",
            Preset::AwsSns => "aws-sns",
        }
    }

    pub fn from_name(name: &str) -> Option<Preset> {
        Preset::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The scheme, written in the signature language.
    /// How old a delivery's signed timestamp may be unless the pipeline says otherwise.
    /// SendGrid retries a failed post for up to 24 hours, its documentation does not say that
    /// a retry is signed again, and its libraries check no age: a day and 5 minutes, so that
    /// no retry of a real delivery is refused. A delivery replayed within that is the same
    /// body, so the same key: a duplicate (`check` holds retention to at least this).
    pub fn default_tolerance_secs(self) -> u32 {
        match self {
            Preset::Sendgrid => 24 * 3600 + 300,
            _ => crate::DEFAULT_TOLERANCE_SECS,
        }
    }

    pub fn scheme(self) -> Scheme {
        let name = self.name();
        match self {
            Preset::Github => Scheme::single(name, body_hmac("X-Hub-Signature-256", "sha256=")),
            Preset::Intercom => Scheme::single(
                name,
                Spec { algorithm: Algorithm::HmacSha1, ..body_hmac("X-Hub-Signature", "sha1=") },
            ),
            Preset::Shopify => Scheme::single(
                name,
                Spec {
                    encoding: Encoding::Base64,
                    require_body: true,
                    ..body_hmac("X-Shopify-Hmac-Sha256", "")
                },
            ),
            Preset::Stripe => Scheme::single(
                name,
                timestamped_fields(
                    "Stripe-Signature",
                    ',',
                    "t",
                    "v1",
                    vec![Part::Timestamp, lit("."), Part::Body],
                ),
            ),
            Preset::Calendly => Scheme::single(
                name,
                timestamped_fields(
                    "Calendly-Webhook-Signature",
                    ',',
                    "t",
                    "v1",
                    vec![Part::Timestamp, lit("."), Part::Body],
                ),
            ),
            Preset::Paddle => Scheme::single(
                name,
                timestamped_fields(
                    "Paddle-Signature",
                    ';',
                    "ts",
                    "h1",
                    vec![Part::Timestamp, lit(":"), Part::Body],
                ),
            ),
            Preset::StandardWebhooks | Preset::Svix | Preset::SupabaseAuth => {
                Scheme::single(name, standard_webhooks())
            }
            Preset::Slack => Scheme::single(
                name,
                Spec {
                    timestamp: Some(unix_header("X-Slack-Request-Timestamp")),
                    message: vec![lit("v0:"), Part::Timestamp, lit(":"), Part::Body],
                    ..body_hmac("X-Slack-Signature", "v0=")
                },
            ),
            Preset::HubspotV3 => Scheme::single(name, hubspot_v3()),
            Preset::Hubspot => {
                let version = |v: &str, message: Vec<Part>| Variant {
                    when: Condition::HeaderEquals(
                        "X-HubSpot-Signature-Version".into(),
                        v.to_owned(),
                    ),
                    spec: Spec {
                        algorithm: Algorithm::DigestSha256,
                        message,
                        ..body_hmac("X-HubSpot-Signature", "")
                    },
                };
                Scheme {
                    name: name.to_owned(),
                    variants: vec![
                        Variant {
                            when: Condition::HeaderPresent("X-HubSpot-Signature-v3".into()),
                            spec: hubspot_v3(),
                        },
                        version("v2", vec![Part::Secret, Part::Method, Part::Url, Part::Body]),
                        version("v1", vec![Part::Secret, Part::Body]),
                    ],
                    key_url_field: None,
                    sender_field: None,
                }
            }
            Preset::Twilio | Preset::TwilioJson => {
                let (message, body_digest_param) = match self {
                    // JSON bodies: the URL alone is signed, and carries the body's hash.
                    Preset::TwilioJson => (vec![Part::Url], Some("bodySHA256".to_owned())),
                    _ => (vec![Part::Url, Part::FormSorted], None),
                };
                Scheme::single(
                    name,
                    Spec {
                        algorithm: Algorithm::HmacSha1,
                        encoding: Encoding::Base64,
                        message,
                        body_digest_param,
                        url_port_variants: true,
                        ..body_hmac("X-Twilio-Signature", "")
                    },
                )
            }
            Preset::Sendgrid => Scheme::single(
                name,
                Spec {
                    algorithm: Algorithm::EcdsaP256Sha256,
                    key_format: KeyFormat::PublicKey,
                    encoding: Encoding::Base64,
                    timestamp: Some(unix_header("X-Twilio-Email-Event-Webhook-Timestamp")),
                    message: vec![Part::Timestamp, Part::Body],
                    ..body_hmac("X-Twilio-Email-Event-Webhook-Signature", "")
                },
            ),
            Preset::Square => Scheme::single(
                name,
                Spec {
                    encoding: Encoding::Base64,
                    message: vec![Part::Url, Part::Body],
                    ..body_hmac("X-Square-HmacSha256-Signature", "")
                },
            ),
            Preset::Zendesk => Scheme::single(
                name,
                Spec {
                    encoding: Encoding::Base64,
                    timestamp: Some(TimestampSpec {
                        source: TimestampSource::Header(HeaderRef::one(
                            "X-Zendesk-Webhook-Signature-Timestamp",
                        )),
                        format: TimestampFormat::Rfc3339,
                        rule: TimestampRule::InclusiveBothWays,
                    }),
                    message: vec![Part::Timestamp, Part::Body],
                    ..body_hmac("X-Zendesk-Webhook-Signature", "")
                },
            ),
            Preset::SupabaseDatabase => {
                Scheme::single(name, shared_secret("Authorization", "Bearer ", Encoding::Text))
            }
            Preset::EventbridgeApiKey => {
                Scheme::single(name, shared_secret("x-api-key", "", Encoding::Text))
            }
            Preset::EventbridgeBasic => {
                Scheme::single(name, shared_secret("Authorization", "Basic ", Encoding::Base64))
            }
            Preset::AwsSns => {
                // One rule per signature version and message type: each type signs a fixed set
                // of members.
                let mut variants = Vec::new();
                for (version, algorithm) in [("1", Algorithm::RsaSha1), ("2", Algorithm::RsaSha256)]
                {
                    for (kind, members) in SNS_SIGNED_MEMBERS {
                        variants.push(Variant {
                            when: Condition::All(vec![
                                Condition::BodyField("/SignatureVersion".into(), version.into()),
                                Condition::BodyField("/Type".into(), kind.into()),
                            ]),
                            spec: Spec {
                                algorithm,
                                key_format: KeyFormat::Certificate,
                                signature: SignatureSource::BodyField("/Signature".into()),
                                prefix: String::new(),
                                encoding: Encoding::Base64,
                                timestamp: None,
                                message: vec![Part::BodyFields(
                                    members.iter().map(|m| (*m).to_owned()).collect(),
                                )],
                                require_body: true,
                                body_digest_param: None,
                                url_port_variants: false,
                            },
                        });
                    }
                }
                Scheme {
                    name: name.to_owned(),
                    variants,
                    key_url_field: Some("/SigningCertURL".into()),
                    sender_field: Some("/TopicArn".into()),
                }
            }
        }
    }
}

/// The members AWS SNS signs for each message type, in its order (`?`: only when present), as
/// AWS's own validators build the string to sign.
pub const SNS_SIGNED_MEMBERS: [(&str, &[&str]); 3] = [
    ("Notification", &["Message", "MessageId", "Subject?", "Timestamp", "TopicArn", "Type"]),
    (
        "SubscriptionConfirmation",
        &["Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"],
    ),
    (
        "UnsubscribeConfirmation",
        &["Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"],
    ),
];

fn lit(text: &str) -> Part {
    Part::Literal(text.to_owned())
}

/// HMAC-SHA256 of the body, hex, in one header: the base most presets vary.
fn body_hmac(header: &str, prefix: &str) -> Spec {
    Spec {
        algorithm: Algorithm::HmacSha256,
        key_format: KeyFormat::Raw,
        signature: SignatureSource::Header(HeaderRef::one(header)),
        prefix: prefix.to_owned(),
        encoding: Encoding::Hex,
        timestamp: None,
        message: vec![Part::Body],
        require_body: false,
        body_digest_param: None,
        url_port_variants: false,
    }
}

fn unix_header(header: &str) -> TimestampSpec {
    TimestampSpec {
        source: TimestampSource::Header(HeaderRef::one(header)),
        format: TimestampFormat::UnixSeconds,
        rule: TimestampRule::InclusiveBothWays,
    }
}

/// `t=…,v1=…`-style headers: timestamp and signatures are fields of one header.
fn timestamped_fields(
    header: &str,
    separator: char,
    timestamp: &str,
    signature: &str,
    message: Vec<Part>,
) -> Spec {
    Spec {
        signature: SignatureSource::Field {
            header: HeaderRef::one(header),
            fields: Fields { separator, assign: '=' },
            name: signature.to_owned(),
        },
        timestamp: Some(TimestampSpec {
            source: TimestampSource::Field(timestamp.to_owned()),
            format: TimestampFormat::UnixSeconds,
            rule: TimestampRule::InclusiveBothWays,
        }),
        message,
        ..body_hmac(header, "")
    }
}

fn standard_webhooks() -> Spec {
    // Svix sends `svix-*` and may white-label to `webhook-*`; like its libraries, the `svix-*`
    // name wins when both are present.
    Spec {
        key_format: KeyFormat::Whsec,
        signature: SignatureSource::Field {
            header: HeaderRef::first_of(&["svix-signature", "webhook-signature"]),
            fields: Fields { separator: ' ', assign: ',' },
            name: "v1".into(),
        },
        encoding: Encoding::Base64,
        timestamp: Some(TimestampSpec {
            source: TimestampSource::Header(HeaderRef::first_of(&[
                "svix-timestamp",
                "webhook-timestamp",
            ])),
            format: TimestampFormat::UnixSeconds,
            rule: TimestampRule::InclusiveBothWays,
        }),
        message: vec![
            Part::Header(HeaderRef::first_of(&["svix-id", "webhook-id"])),
            lit("."),
            Part::Timestamp,
            lit("."),
            Part::Body,
        ],
        ..body_hmac("webhook-signature", "")
    }
}

fn hubspot_v3() -> Spec {
    Spec {
        encoding: Encoding::Base64,
        timestamp: Some(TimestampSpec {
            source: TimestampSource::Header(HeaderRef::one("X-HubSpot-Request-Timestamp")),
            format: TimestampFormat::UnixMillis,
            rule: TimestampRule::StrictPastInclusiveFuture,
        }),
        message: vec![Part::Method, Part::Url, Part::Body, Part::Timestamp],
        ..body_hmac("X-HubSpot-Signature-v3", "")
    }
}

fn shared_secret(header: &str, prefix: &str, encoding: Encoding) -> Spec {
    Spec {
        algorithm: Algorithm::SharedSecret,
        encoding,
        message: Vec::new(),
        ..body_hmac(header, prefix)
    }
}
