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

/// A configured secret that cannot be used as a key for its scheme.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("no secret is configured")]
    NoSecret,
    #[error("secret #{} is empty", index + 1)]
    Empty { index: usize },
    #[error("secret #{} is not valid base64 after its `whsec_` prefix", index + 1)]
    NotBase64 { index: usize },
}

impl KeyError {
    pub(crate) fn at(self, index: usize) -> KeyError {
        match self {
            KeyError::NoSecret => KeyError::NoSecret,
            KeyError::Empty { .. } => KeyError::Empty { index },
            KeyError::NotBase64 { .. } => KeyError::NotBase64 { index },
        }
    }
}
