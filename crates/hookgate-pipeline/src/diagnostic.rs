//! Compiler-style diagnostics: `file:line:column: severity: message`, then an optional hint.

use std::fmt;

/// A position in a file, 1-based like every editor shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pos {
    pub line: u32,
    pub column: u32,
}

impl Pos {
    /// saphyr markers have 1-based lines and 0-based character columns.
    pub(crate) fn from_marker(line: usize, col: usize) -> Pos {
        Pos {
            line: u32::try_from(line.max(1)).unwrap_or(u32::MAX),
            column: u32::try_from(col + 1).unwrap_or(u32::MAX),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub start: Pos,
    pub end: Pos,
}

impl Span {
    /// The start of a file, for problems that belong to the whole file.
    pub fn start() -> Span {
        let pos = Pos { line: 1, column: 1 };
        Span { start: pos, end: pos }
    }

    pub(crate) fn to(self, end: Span) -> Span {
        Span { start: self.start, end: end.end }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Error,
    Warning,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub severity: Severity,
    pub file: String,
    pub pos: Pos,
    pub message: String,
    pub hint: Option<String>,
}

impl Diagnostic {
    pub fn error(file: &str, span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            severity: Severity::Error,
            file: file.to_owned(),
            pos: span.start,
            message: message.into(),
            hint: None,
        }
    }

    pub fn warning(file: &str, span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic { severity: Severity::Warning, ..Diagnostic::error(file, span, message) }
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Diagnostic {
        self.hint = Some(hint.into());
        self
    }

    pub fn at(mut self, pos: Pos) -> Diagnostic {
        self.pos = pos;
        self
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let severity = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(
            f,
            "{}:{}:{}: {severity}: {}",
            self.file, self.pos.line, self.pos.column, self.message
        )?;
        if let Some(hint) = &self.hint {
            write!(f, "\n  = hint: {hint}")?;
        }
        Ok(())
    }
}

/// The closest candidate to `name`, if it is close enough to be a likely typo.
pub fn did_you_mean<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(name, c), c))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

/// A hint naming the likely intended candidate, or else listing them all.
pub fn suggestion(name: &str, candidates: &[&str]) -> String {
    match did_you_mean(name, candidates.iter().copied()) {
        Some(candidate) => format!("did you mean `{candidate}`?"),
        None => {
            let list: Vec<String> = candidates.iter().map(|c| format!("`{c}`")).collect();
            format!("expected one of {}", list.join(", "))
        }
    }
}

/// For a closed set of values (an enum's variants): the likely intended one, if any, and
/// always the whole set, since a near miss may be a value that does not exist at all.
pub fn variant_suggestion(name: &str, candidates: &[&str]) -> String {
    let list: Vec<String> = candidates.iter().map(|c| format!("`{c}`")).collect();
    match did_you_mean(name, candidates.iter().copied()) {
        Some(candidate) => {
            format!("did you mean `{candidate}`? supported: {}", list.join(", "))
        }
        None => format!("supported: {}", list.join(", ")),
    }
}
