//! Secret references resolved from the process environment or the file system. This module is
//! the only place that reads either for secrets.

use std::path::Path;

use hookgate_pipeline::model::SecretRef;
use hookgate_verify::SecretBytes;

/// Secret files are small; anything larger is a wrong path.
const SECRET_FILE_BYTES_MAX: u64 = 64 * 1024;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    #[error("{0} is not set")]
    Unset(String),
    /// A secret file that does not exist: unset, as an environment variable can be.
    #[error("{0} does not exist")]
    Missing(String),
    #[error("{0} is empty")]
    Empty(String),
    #[error("{reference} cannot be read: {reason}")]
    Unreadable { reference: String, reason: String },
}

impl SecretError {
    /// The reference the error is about: `environment variable `X``.
    pub fn subject(&self) -> &str {
        match self {
            SecretError::Unset(reference)
            | SecretError::Missing(reference)
            | SecretError::Empty(reference) => reference,
            SecretError::Unreadable { reference, .. } => reference,
        }
    }
}

/// Where secret values come from.
#[derive(Debug, Clone, Default)]
pub enum Resolver {
    /// The process environment and the file system: production.
    #[default]
    Environment,
    /// Fixed values by variable name or file path: the demo's test secrets.
    Fixed(std::collections::HashMap<String, String>),
}

impl Resolver {
    pub fn resolve(&self, reference: &SecretRef) -> Result<SecretBytes, SecretError> {
        match self {
            Resolver::Environment => resolve(reference),
            Resolver::Fixed(values) => {
                let (SecretRef::Env(name) | SecretRef::File(name)) = reference;
                values
                    .get(name)
                    .map(|v| SecretBytes::new(v.as_bytes()))
                    .ok_or_else(|| SecretError::Unset(reference.to_string()))
            }
        }
    }
}

/// Resolves one reference. A file's single trailing newline is removed, since editors and
/// `echo` add one.
pub fn resolve(reference: &SecretRef) -> Result<SecretBytes, SecretError> {
    let bytes = match reference {
        SecretRef::Env(name) => match std::env::var_os(name) {
            None => return Err(SecretError::Unset(reference.to_string())),
            Some(value) => value.into_encoded_bytes(),
        },
        SecretRef::File(path) => {
            if !Path::new(path).exists() {
                return Err(SecretError::Missing(reference.to_string()));
            }
            let mut bytes = crate::files::read_bounded(Path::new(path), SECRET_FILE_BYTES_MAX)
                .map_err(|d| SecretError::Unreadable {
                    reference: reference.to_string(),
                    reason: d.message,
                })?;
            if bytes.ends_with(b"\n") {
                bytes.pop();
                if bytes.ends_with(b"\r") {
                    bytes.pop();
                }
            }
            bytes
        }
    };
    if bytes.is_empty() {
        return Err(SecretError::Empty(reference.to_string()));
    }
    Ok(SecretBytes::new(bytes))
}
