use base64::Engine as _;

use crate::secret::{KeyError, SecretBytes};

/// How a sender signs its deliveries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scheme {
    /// `X-Hub-Signature-256: sha256=<lowercase hex>` over the raw body.
    Github,
    /// `Stripe-Signature: t=..,v1=..`, HMAC-SHA256 of `t.body`, secret used verbatim.
    Stripe,
    /// Standard Webhooks and Svix: HMAC-SHA256 of `id.timestamp.body`, key base64 after `whsec_`.
    StandardWebhooks,
    /// `X-Shopify-Hmac-Sha256: <base64>` over the raw body.
    Shopify,
    /// `X-Slack-Signature: v0=<hex>` over `v0:timestamp:body`.
    Slack,
    /// `X-HubSpot-Signature-v3: <base64>` over `method + url + body + timestamp(ms)`.
    HubspotV3,
    /// A sender that is none of the above, described field by field.
    Hmac(GenericHmac),
}

/// A generic HMAC scheme: one header carrying `prefix + encode(HMAC(secret, signed content))`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenericHmac {
    pub header: String,
    pub prefix: String,
    pub algorithm: Algorithm,
    pub encoding: Encoding,
    pub signed: SignedContent,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    Sha256,
    Sha512,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Hex,
    Base64,
}

/// What a generic HMAC signs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignedContent {
    Body,
    /// `timestamp + separator + body`, the timestamp (Unix seconds) taken from its own header.
    TimestampAndBody {
        timestamp_header: String,
        separator: String,
    },
}

/// How a scheme treats the edges of its timestamp window. Every rule also rejects timestamps
/// further in the future than the tolerance: a sender's clock can be off, an attacker's replay
/// window should not be doubled by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimestampRule {
    /// No timestamp is signed.
    None,
    /// Exactly `tolerance` seconds old is accepted (Standard Webhooks, Svix, Stripe, Slack).
    InclusiveBothWays,
    /// Exactly `tolerance` old is rejected, as HubSpot's SDK does (`now - ts < 300`).
    StrictPastInclusiveFuture,
}

impl Scheme {
    pub fn timestamp_rule(&self) -> TimestampRule {
        match self {
            Scheme::Github | Scheme::Shopify => TimestampRule::None,
            Scheme::Stripe | Scheme::StandardWebhooks | Scheme::Slack => {
                TimestampRule::InclusiveBothWays
            }
            Scheme::HubspotV3 => TimestampRule::StrictPastInclusiveFuture,
            Scheme::Hmac(generic) => match generic.signed {
                SignedContent::Body => TimestampRule::None,
                SignedContent::TimestampAndBody { .. } => TimestampRule::InclusiveBothWays,
            },
        }
    }

    /// The header names this scheme reads; the intake strips them before storing headers.
    pub fn signature_headers(&self) -> Vec<String> {
        let names: &[&str] = match self {
            Scheme::Github => &["x-hub-signature-256", "x-hub-signature"],
            Scheme::Stripe => &["stripe-signature"],
            Scheme::StandardWebhooks => &["webhook-signature", "svix-signature"],
            Scheme::Shopify => &["x-shopify-hmac-sha256"],
            Scheme::Slack => &["x-slack-signature"],
            Scheme::HubspotV3 => &["x-hubspot-signature-v3", "x-hubspot-signature"],
            Scheme::Hmac(generic) => return vec![generic.header.to_ascii_lowercase()],
        };
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    /// Turns a configured secret into HMAC key bytes, as the sender's libraries do.
    pub(crate) fn decode_key(&self, raw: &SecretBytes) -> Result<SecretBytes, KeyError> {
        let bytes = raw.expose();
        if bytes.is_empty() {
            return Err(KeyError::Empty { index: 0 });
        }
        match self {
            Scheme::StandardWebhooks => {
                let text =
                    std::str::from_utf8(bytes).map_err(|_| KeyError::NotBase64 { index: 0 })?;
                let body = text.strip_prefix("whsec_").unwrap_or(text).trim_end_matches('=');
                if body.is_empty() {
                    return Err(KeyError::Empty { index: 0 });
                }
                // The reference library pads with `==`; decoding unpadded input is the same.
                base64::engine::general_purpose::STANDARD_NO_PAD
                    .decode(body)
                    .map(SecretBytes::new)
                    .map_err(|_| KeyError::NotBase64 { index: 0 })
            }
            _ => Ok(raw.clone()),
        }
    }
}
