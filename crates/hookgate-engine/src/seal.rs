//! Payloads at rest: bodies and kept headers sealed with AES-256-GCM (ring, already in the
//! tree for TLS) under a key the configuration names by id.
//!
//! A sealed value is `[1][12-byte random nonce][ciphertext and 16-byte tag]`; header texts,
//! stored in a text column, are that in base64. The additional data binds each value to what
//! it is and to its pipeline (`hookgate/body/stripe`), so a ciphertext moved to another
//! column or pipeline does not open. Random 96-bit nonces are safe for about 2^32 seals per
//! key: rotate keys long before (`hookgate keys rotate`).
//!
//! The store keeps the key id beside each row (`sealed_with`); the engine seals at intake and
//! opens only in memory, when the worker renders a write or an operator asks to see a body.

use std::borrow::Cow;
use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

/// The format byte every sealed value starts with.
const FORMAT_V1: u8 = 1;
/// A key is 32 random bytes.
pub const KEY_BYTES: usize = 32;
const TAG_BYTES: usize = 16;
/// What sealing adds to a value: the format byte, the nonce and the tag.
pub const SEAL_OVERHEAD_BYTES: usize = 1 + NONCE_LEN + TAG_BYTES;

/// Which stored value a seal is for: part of the additional data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// A body: an event's, a conflict's or a rejected delivery's.
    Body,
    /// Kept headers (an event's, or a delivery's excerpt), as JSON text.
    Headers,
    /// The start of a CRM's or a source's answer, kept with an attempt.
    Answer,
}

impl Part {
    fn name(self) -> &'static str {
        match self {
            Part::Body => "body",
            Part::Headers => "headers",
            Part::Answer => "answer",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("payload key `{key_id}`: {problem}")]
    BadKey { key_id: String, problem: String },
    #[error("payload key `{0}` is listed twice")]
    DuplicateKey(String),
    #[error(
        "sealed under key `{key_id}`, which is not configured (`payload_encryption.keys` in the instances file)"
    )]
    UnknownKey { key_id: String },
    #[error(
        "sealed under key `{key_id}`, and no payload keys are configured (`payload_encryption` in the instances file)"
    )]
    NoKeys { key_id: String },
    #[error(
        "does not open under key `{key_id}`: tampered with, or the key is not the one it was sealed with"
    )]
    Unopenable { key_id: String },
    #[error("is not a sealed value (key `{key_id}`): {problem}")]
    Malformed { key_id: String, problem: &'static str },
}

struct PayloadKey {
    id: String,
    key: LessSafeKey,
}

/// The configured payload keys: the first seals, every one opens.
pub struct Keyring {
    keys: Vec<PayloadKey>,
    random: SystemRandom,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|k| k.id.as_str()).collect();
        f.debug_struct("Keyring").field("keys", &ids).finish_non_exhaustive()
    }
}

impl Keyring {
    /// `keys`: (id, secret) in order, the first being the one new rows are sealed under. A
    /// secret is 32 bytes in base64 (`openssl rand -base64 32`).
    pub fn new<'a>(
        keys: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    ) -> Result<Keyring, SealError> {
        let mut ring = Vec::new();
        for (id, secret) in keys {
            if ring.iter().any(|k: &PayloadKey| k.id == id) {
                return Err(SealError::DuplicateKey(id.to_owned()));
            }
            let bad = |problem: String| SealError::BadKey { key_id: id.to_owned(), problem };
            let text =
                std::str::from_utf8(secret).map_err(|_| bad("not base64 text".to_owned()))?.trim();
            let bytes = STANDARD.decode(text).map_err(|_| {
                bad("not base64 (write 32 random bytes as `openssl rand -base64 32` does)"
                    .to_owned())
            })?;
            if bytes.len() != KEY_BYTES {
                return Err(bad(format!("{} bytes; a key is {KEY_BYTES} bytes", bytes.len())));
            }
            let unbound = UnboundKey::new(&AES_256_GCM, &bytes)
                .map_err(|_| bad("rejected by AES-256-GCM".to_owned()))?;
            ring.push(PayloadKey { id: id.to_owned(), key: LessSafeKey::new(unbound) });
        }
        if ring.is_empty() {
            return Err(SealError::BadKey { key_id: String::new(), problem: "no keys".to_owned() });
        }
        Ok(Keyring { keys: ring, random: SystemRandom::new() })
    }

    /// The id new rows are sealed under.
    pub fn current(&self) -> &str {
        &self.keys[0].id
    }

    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|k| k.id.as_str())
    }

    /// Seals `plaintext` under the current key.
    pub fn seal(&self, part: Part, pipeline: &str, plaintext: &[u8]) -> Vec<u8> {
        let mut nonce = [0u8; NONCE_LEN];
        // The operating system's generator failing is not something to go on without.
        self.random.fill(&mut nonce).expect("the system's random generator works");
        let mut out = Vec::with_capacity(1 + NONCE_LEN + plaintext.len() + TAG_BYTES);
        out.push(FORMAT_V1);
        out.extend_from_slice(&nonce);
        let mut sealed = plaintext.to_vec();
        self.keys[0]
            .key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(additional_data(part, pipeline)),
                &mut sealed,
            )
            .expect("AES-GCM seals any length a request can have");
        out.extend_from_slice(&sealed);
        out
    }

    /// Seals a text as base64, for text columns.
    pub fn seal_text(&self, part: Part, pipeline: &str, text: &str) -> String {
        STANDARD.encode(self.seal(part, pipeline, text.as_bytes()))
    }

    /// Opens a value sealed under `key_id`.
    pub fn open(
        &self,
        key_id: &str,
        part: Part,
        pipeline: &str,
        sealed: &[u8],
    ) -> Result<Vec<u8>, SealError> {
        let key = self
            .keys
            .iter()
            .find(|k| k.id == key_id)
            .ok_or_else(|| SealError::UnknownKey { key_id: key_id.to_owned() })?;
        let malformed = |problem| SealError::Malformed { key_id: key_id.to_owned(), problem };
        let (&format, rest) = sealed.split_first().ok_or(malformed("empty"))?;
        if format != FORMAT_V1 {
            return Err(malformed("unknown format"));
        }
        if rest.len() < NONCE_LEN + TAG_BYTES {
            return Err(malformed("too short"));
        }
        let (nonce, ciphertext) = rest.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| malformed("bad nonce"))?;
        let mut buffer = ciphertext.to_vec();
        let plaintext = key
            .key
            .open_in_place(nonce, Aad::from(additional_data(part, pipeline)), &mut buffer)
            .map_err(|_| SealError::Unopenable { key_id: key_id.to_owned() })?;
        let len = plaintext.len();
        buffer.truncate(len);
        Ok(buffer)
    }

    /// Opens a text sealed by [`Keyring::seal_text`].
    pub fn open_text(
        &self,
        key_id: &str,
        part: Part,
        pipeline: &str,
        sealed: &str,
    ) -> Result<String, SealError> {
        let malformed = |problem| SealError::Malformed { key_id: key_id.to_owned(), problem };
        let bytes = STANDARD.decode(sealed.trim()).map_err(|_| malformed("not base64"))?;
        let opened = self.open(key_id, part, pipeline, &bytes)?;
        String::from_utf8(opened).map_err(|_| malformed("not UTF-8 once opened"))
    }
}

fn additional_data(part: Part, pipeline: &str) -> Vec<u8> {
    format!("hookgate/{}/{pipeline}", part.name()).into_bytes()
}

/// A stored value as its plaintext: as it is if the row is not sealed (`sealed_with` is
/// `None`), else opened with `keyring`.
pub fn open_stored<'a>(
    keyring: Option<&Keyring>,
    sealed_with: Option<&str>,
    part: Part,
    pipeline: &str,
    stored: &'a [u8],
) -> Result<Cow<'a, [u8]>, SealError> {
    match (sealed_with, keyring) {
        (None, _) => Ok(Cow::Borrowed(stored)),
        (Some(key_id), None) => Err(SealError::NoKeys { key_id: key_id.to_owned() }),
        (Some(key_id), Some(keyring)) => {
            keyring.open(key_id, part, pipeline, stored).map(Cow::Owned)
        }
    }
}

/// [`open_stored`] for a text column.
pub fn open_stored_text<'a>(
    keyring: Option<&Keyring>,
    sealed_with: Option<&str>,
    part: Part,
    pipeline: &str,
    stored: &'a str,
) -> Result<Cow<'a, str>, SealError> {
    match (sealed_with, keyring) {
        (None, _) => Ok(Cow::Borrowed(stored)),
        (Some(key_id), None) => Err(SealError::NoKeys { key_id: key_id.to_owned() }),
        (Some(key_id), Some(keyring)) => {
            keyring.open_text(key_id, part, pipeline, stored).map(Cow::Owned)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="; // "0123456789abcdef" twice
    const K2: &str = "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=";

    fn ring(keys: &[(&'static str, &'static str)]) -> Keyring {
        Keyring::new(keys.iter().map(|(id, k)| (*id, k.as_bytes()))).unwrap()
    }

    #[test]
    fn sealed_values_open_under_their_key_only_for_their_part_and_pipeline() {
        let keys = ring(&[("k2", K2), ("k1", K1)]);
        let sealed = keys.seal(Part::Body, "stripe", b"{\"email\":\"marker@example.com\"}");
        assert!(!sealed.windows(6).any(|w| w == b"marker"));
        let opened = keys.open("k2", Part::Body, "stripe", &sealed).unwrap();
        assert_eq!(opened, b"{\"email\":\"marker@example.com\"}");
        // Two seals of one plaintext differ (random nonces).
        assert_ne!(sealed, keys.seal(Part::Body, "stripe", b"{\"email\":\"marker@example.com\"}"));
        // Moved to another column, pipeline or key id: refused, never garbage.
        assert_eq!(
            keys.open("k2", Part::Headers, "stripe", &sealed),
            Err(SealError::Unopenable { key_id: "k2".into() })
        );
        assert!(keys.open("k2", Part::Body, "github", &sealed).is_err());
        assert_eq!(
            keys.open("k1", Part::Body, "stripe", &sealed),
            Err(SealError::Unopenable { key_id: "k1".into() })
        );
        assert_eq!(
            keys.open("k0", Part::Body, "stripe", &sealed),
            Err(SealError::UnknownKey { key_id: "k0".into() })
        );
        let mut tampered = sealed.clone();
        *tampered.last_mut().unwrap() ^= 1;
        assert!(matches!(
            keys.open("k2", Part::Body, "stripe", &tampered),
            Err(SealError::Unopenable { .. })
        ));
        assert!(matches!(
            keys.open("k2", Part::Body, "stripe", &sealed[..10]),
            Err(SealError::Malformed { .. })
        ));
        assert!(matches!(
            keys.open("k2", Part::Body, "stripe", &[]),
            Err(SealError::Malformed { .. })
        ));
    }

    #[test]
    fn an_older_key_still_opens_what_it_sealed() {
        let old = ring(&[("k1", K1)]);
        let text = old.seal_text(Part::Headers, "p", "[[\"x-a\",\"1\"]]");
        let rotated = ring(&[("k2", K2), ("k1", K1)]);
        assert_eq!(rotated.current(), "k2");
        assert_eq!(
            rotated.open_text("k1", Part::Headers, "p", &text).unwrap(),
            "[[\"x-a\",\"1\"]]"
        );
        assert!(matches!(
            open_stored_text(None, Some("k1"), Part::Headers, "p", &text),
            Err(SealError::NoKeys { .. })
        ));
        assert_eq!(open_stored(None, None, Part::Body, "p", b"plain").unwrap().as_ref(), b"plain");
    }

    #[test]
    fn keys_that_are_not_32_bytes_of_base64_are_refused_with_their_id() {
        let short = Keyring::new([("k1", "c2hvcnQ=".as_bytes())]).unwrap_err();
        assert_eq!(short.to_string(), "payload key `k1`: 5 bytes; a key is 32 bytes");
        let text = Keyring::new([("k1", "not base64!".as_bytes())]).unwrap_err();
        assert!(text.to_string().starts_with("payload key `k1`: not base64"), "{text}");
        let twice = Keyring::new([("k1", K1.as_bytes()), ("k1", K2.as_bytes())]).unwrap_err();
        assert_eq!(twice, SealError::DuplicateKey("k1".into()));
        // A trailing newline from a secret file or `echo` is fine.
        let with_newline = format!("{K1}\n");
        assert!(Keyring::new([("k1", with_newline.as_bytes())]).is_ok());
    }
}
