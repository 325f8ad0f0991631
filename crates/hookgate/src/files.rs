use std::fs;
use std::io::Read;
use std::path::Path;

use hookgate_pipeline::{Code, Diagnostic, Span, yaml::FILE_BYTES_MAX};

/// Fixture bodies may be larger than configuration, but not unbounded.
pub const BODY_BYTES_MAX: u64 = 16 * 1024 * 1024;

/// Reads a configuration file as UTF-8 text. A file over the limit is refused from its
/// metadata, without reading it.
pub fn read_config(path: &Path) -> Result<String, FileError> {
    let bytes = read_bounded(path, FILE_BYTES_MAX as u64)?;
    String::from_utf8(bytes).map_err(|e| {
        let offset = e.utf8_error().valid_up_to();
        error(path, format!("the file is not UTF-8 (invalid byte at offset {offset})"))
    })
}

/// Reads at most `max` bytes of a file, refusing larger ones.
pub fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, FileError> {
    let file = fs::File::open(path).map_err(|e| error(path, format!("cannot read: {e}")))?;
    let length = file.metadata().map_err(|e| error(path, format!("cannot read: {e}")))?.len();
    if length > max {
        return Err(error(
            path,
            format!("the file is {length} bytes, larger than the {max}-byte limit"),
        ));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(length).unwrap_or(0));
    // `take` guards against a file that grows between the metadata call and the read.
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| error(path, format!("cannot read: {e}")))?;
    if bytes.len() as u64 > max {
        return Err(error(path, format!("the file is larger than the {max}-byte limit")));
    }
    Ok(bytes)
}

pub fn error(path: &Path, message: String) -> FileError {
    FileError { path: path.display().to_string(), message }
}

/// A file that cannot be used, and why.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct FileError {
    pub path: String,
    pub message: String,
}

impl From<FileError> for Diagnostic {
    fn from(error: FileError) -> Diagnostic {
        Diagnostic::error(Code::File, &error.path, Span::start(), error.message)
    }
}
