use std::fmt;

/// Secret key material. `Debug` never shows the bytes, so a secret cannot leak through a log
/// line or a panic message.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretBytes(Vec<u8>);

impl SecretBytes {
    pub fn new(bytes: impl Into<Vec<u8>>) -> SecretBytes {
        SecretBytes(bytes.into())
    }

    /// The raw bytes. Named loudly so every use is easy to audit.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for SecretBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretBytes(<{} bytes redacted>)", self.0.len())
    }
}

/// A configured key that cannot be used for its scheme.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("no secret is configured")]
    NoSecret,
    #[error("secret #{} is empty", index + 1)]
    Empty { index: usize },
    #[error("secret #{} is not valid base64 after its `whsec_` prefix", index + 1)]
    NotBase64 { index: usize },
    #[error("secret #{} is not an ECDSA P-256 public key (base64 DER or PEM): {reason}", index + 1)]
    NotPublicKey { index: usize, reason: String },
    #[error("secret #{} is not a PEM X.509 certificate with an RSA key: {reason}", index + 1)]
    NotCertificate { index: usize, reason: String },
    #[error("{0}")]
    Scheme(String),
    #[error("not an ECDSA P-256 or RSA private key (PKCS#8, SEC1 or PKCS#1; PEM or base64 DER)")]
    NotPrivateKey,
    #[error("the scheme's variants read keys in different formats")]
    MixedKeyFormats,
}

impl KeyError {
    /// What is wrong with one key, without its position in the list.
    pub fn reason(&self) -> String {
        match self {
            KeyError::Empty { .. } => "it is empty".into(),
            KeyError::NotBase64 { .. } => "it is not valid base64 after its `whsec_` prefix".into(),
            KeyError::NotPublicKey { reason, .. } => {
                format!("it is not an ECDSA P-256 public key (base64 DER or PEM): {reason}")
            }
            KeyError::NotCertificate { reason, .. } => {
                format!("it is not a PEM X.509 certificate with an RSA key: {reason}")
            }
            other => other.to_string(),
        }
    }

    pub(crate) fn at(self, index: usize) -> KeyError {
        match self {
            KeyError::Empty { .. } => KeyError::Empty { index },
            KeyError::NotBase64 { .. } => KeyError::NotBase64 { index },
            KeyError::NotPublicKey { reason, .. } => KeyError::NotPublicKey { index, reason },
            KeyError::NotCertificate { reason, .. } => KeyError::NotCertificate { index, reason },
            other => other,
        }
    }
}
