//! Configured keys turned into key material, once, at load time.

use base64::Engine as _;
use p256::pkcs8::DecodePublicKey as _;
use x509_cert::der::{DecodePem as _, Encode as _};

use crate::scheme::{Algorithm, KeyFormat};
use crate::secret::{KeyError, SecretBytes};

/// One configured key, decoded for its scheme. Public keys are not secret, so they may show
/// in `Debug`; shared secrets stay redacted by [`SecretBytes`].
#[derive(Debug, Clone)]
pub(crate) enum Key {
    Secret(SecretBytes),
    Ecdsa(p256::ecdsa::VerifyingKey),
    Rsa(rsa::RsaPublicKey),
}

impl Key {
    pub(crate) fn secret(&self) -> &[u8] {
        match self {
            Key::Secret(secret) => secret.expose(),
            Key::Ecdsa(_) | Key::Rsa(_) => &[],
        }
    }
}

/// Decodes one configured key. Errors carry index 0; the caller sets the real index.
pub(crate) fn decode(format: KeyFormat, raw: &SecretBytes) -> Result<Key, KeyError> {
    let bytes = raw.expose();
    if bytes.is_empty() {
        return Err(KeyError::Empty { index: 0 });
    }
    match format {
        KeyFormat::Raw => Ok(Key::Secret(raw.clone())),
        KeyFormat::Whsec => {
            let text = std::str::from_utf8(bytes).map_err(|_| KeyError::NotBase64 { index: 0 })?;
            // Supabase's dashboard shows the secret as `v1,whsec_…`, the signature's version
            // before it: pasted as shown, it is the same key.
            let text =
                text.strip_prefix("v1,").filter(|rest| rest.starts_with("whsec_")).unwrap_or(text);
            let body = text.strip_prefix("whsec_").unwrap_or(text).trim_end_matches('=');
            if body.is_empty() {
                return Err(KeyError::Empty { index: 0 });
            }
            // The reference library pads with `==`; decoding unpadded input is the same.
            base64::engine::general_purpose::STANDARD_NO_PAD
                .decode(body)
                .map(|key| Key::Secret(SecretBytes::new(key)))
                .map_err(|_| KeyError::NotBase64 { index: 0 })
        }
        KeyFormat::PublicKey => {
            let not_key = |reason: String| KeyError::NotPublicKey { index: 0, reason };
            let text = std::str::from_utf8(bytes).map_err(|_| not_key("not UTF-8".into()))?;
            let text = text.trim();
            let key = if text.starts_with("-----BEGIN") {
                p256::ecdsa::VerifyingKey::from_public_key_pem(text)
            } else {
                let compact: String = text.split_whitespace().collect();
                let der = base64::engine::general_purpose::STANDARD
                    .decode(compact)
                    .map_err(|_| not_key("not base64".into()))?;
                p256::ecdsa::VerifyingKey::from_public_key_der(&der)
            };
            key.map(Key::Ecdsa).map_err(|e| not_key(e.to_string()))
        }
        KeyFormat::Certificate => {
            let not_cert = |reason: String| KeyError::NotCertificate { index: 0, reason };
            let certificate = x509_cert::Certificate::from_pem(bytes)
                .map_err(|e| not_cert(format!("not a PEM certificate ({e})")))?;
            let spki = certificate
                .tbs_certificate
                .subject_public_key_info
                .to_der()
                .map_err(|e| not_cert(e.to_string()))?;
            rsa::RsaPublicKey::from_public_key_der(&spki)
                .map(Key::Rsa)
                .map_err(|e| not_cert(format!("its key is not RSA ({e})")))
        }
    }
}

/// A sender's private key, for signing fixtures and tests of public-key schemes: ECDSA P-256
/// (PKCS#8 or SEC1, PEM or base64 DER) or RSA (PKCS#8 or PKCS#1). Never used to verify.
pub enum PrivateKey {
    Ecdsa(p256::ecdsa::SigningKey),
    Rsa(Box<rsa::RsaPrivateKey>),
}

impl std::fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PrivateKey::Ecdsa(_) => f.write_str("PrivateKey::Ecdsa(<redacted>)"),
            PrivateKey::Rsa(_) => f.write_str("PrivateKey::Rsa(<redacted>)"),
        }
    }
}

impl PrivateKey {
    pub fn parse(bytes: &[u8]) -> Result<PrivateKey, KeyError> {
        use p256::pkcs8::DecodePrivateKey as _;
        use rsa::pkcs1::DecodeRsaPrivateKey as _;
        let not_key = || KeyError::NotPrivateKey;
        let text = std::str::from_utf8(bytes).map_err(|_| not_key())?.trim();
        if text.starts_with("-----BEGIN") {
            if let Ok(key) = p256::ecdsa::SigningKey::from_pkcs8_pem(text) {
                return Ok(PrivateKey::Ecdsa(key));
            }
            if let Ok(key) = p256::SecretKey::from_sec1_pem(text) {
                return Ok(PrivateKey::Ecdsa(key.into()));
            }
            if let Ok(key) = rsa::RsaPrivateKey::from_pkcs8_pem(text) {
                return Ok(PrivateKey::Rsa(Box::new(key)));
            }
            return rsa::RsaPrivateKey::from_pkcs1_pem(text)
                .map(|key| PrivateKey::Rsa(Box::new(key)))
                .map_err(|_| not_key());
        }
        let compact: String = text.split_whitespace().collect();
        let der =
            base64::engine::general_purpose::STANDARD.decode(compact).map_err(|_| not_key())?;
        if let Ok(key) = p256::ecdsa::SigningKey::from_pkcs8_der(&der) {
            return Ok(PrivateKey::Ecdsa(key));
        }
        if let Ok(key) = p256::SecretKey::from_sec1_der(&der) {
            return Ok(PrivateKey::Ecdsa(key.into()));
        }
        if let Ok(key) = rsa::RsaPrivateKey::from_pkcs8_der(&der) {
            return Ok(PrivateKey::Rsa(Box::new(key)));
        }
        rsa::RsaPrivateKey::from_pkcs1_der(&der)
            .map(|key| PrivateKey::Rsa(Box::new(key)))
            .map_err(|_| not_key())
    }

    /// Signs `message` as `algorithm` does; `None` if the key is of another kind.
    pub(crate) fn sign(&self, algorithm: Algorithm, message: &[u8]) -> Option<Vec<u8>> {
        use p256::ecdsa::signature::Signer as _;
        match (algorithm, self) {
            (Algorithm::EcdsaP256Sha256, PrivateKey::Ecdsa(key)) => {
                let signature: p256::ecdsa::Signature = key.sign(message);
                Some(signature.to_der().as_bytes().to_vec())
            }
            (Algorithm::RsaSha1, PrivateKey::Rsa(key)) => {
                let signer = rsa::pkcs1v15::SigningKey::<sha1::Sha1>::new((**key).clone());
                Some(rsa::signature::SignatureEncoding::to_vec(&rsa::signature::Signer::sign(
                    &signer, message,
                )))
            }
            (Algorithm::RsaSha256, PrivateKey::Rsa(key)) => {
                let signer = rsa::pkcs1v15::SigningKey::<sha2::Sha256>::new((**key).clone());
                Some(rsa::signature::SignatureEncoding::to_vec(&rsa::signature::Signer::sign(
                    &signer, message,
                )))
            }
            _ => None,
        }
    }
}
