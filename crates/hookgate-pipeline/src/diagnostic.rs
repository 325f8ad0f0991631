//! Compiler-style diagnostics: `file:line:column: severity: message`, then an optional hint.

use std::fmt;

pub use crate::codes::Code;

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

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        }
    }
}

/// Another place that explains a diagnostic, such as the first definition of a duplicate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Related {
    pub file: String,
    pub span: Span,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub severity: Severity,
    pub code: Code,
    pub file: String,
    /// Where the problem is: the start is what `file:line:column` names, the end bounds the
    /// caret span when the diagnostic is shown with its source line.
    pub span: Span,
    pub message: String,
    /// A short label under the caret; the message says it when there is none.
    pub label: Option<String>,
    pub hint: Option<String>,
    pub related: Vec<Related>,
}

impl Diagnostic {
    pub fn error(code: Code, file: &str, span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            severity: Severity::Error,
            code,
            file: file.to_owned(),
            span,
            message: message.into(),
            label: None,
            hint: None,
            related: Vec::new(),
        }
    }

    pub fn warning(code: Code, file: &str, span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic { severity: Severity::Warning, ..Diagnostic::error(code, file, span, message) }
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Diagnostic {
        self.hint = Some(hint.into());
        self
    }

    pub fn with_label(mut self, label: impl Into<String>) -> Diagnostic {
        self.label = Some(label.into());
        self
    }

    pub fn with_related(
        mut self,
        file: &str,
        span: Span,
        message: impl Into<String>,
    ) -> Diagnostic {
        self.related.push(Related { file: file.to_owned(), span, message: message.into() });
        self
    }

    /// Narrows the diagnostic to one position inside its span (a column inside a template).
    pub fn at(mut self, pos: Pos) -> Diagnostic {
        self.span = Span { start: pos, end: pos };
        self
    }

    pub fn pos(&self) -> Pos {
        self.span.start
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// The short form, one problem per line as compilers print them:
/// `file:line:column: error[H0101]: message`, then the hint and related places.
impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Pos { line, column } = self.span.start;
        write!(
            f,
            "{}:{line}:{column}: {}[{}]: {}",
            self.file,
            self.severity.as_str(),
            self.code,
            self.message
        )?;
        if let Some(hint) = &self.hint {
            write!(f, "\n  = hint: {hint}")?;
        }
        for related in &self.related {
            let Pos { line, column } = related.span.start;
            write!(f, "\n  = note: {}:{line}:{column}: {}", related.file, related.message)?;
        }
        Ok(())
    }
}

/// The closest candidate to `name`, if it is close enough to be a likely typo: similar by
/// Jaro-Winkler, or one edit away (a transposition counts as one, so `kye` is `key`).
pub fn did_you_mean<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(name, c), strsim::damerau_levenshtein(name, c), c))
        .filter(|(score, edits, _)| *score > 0.8 || (*edits <= 1 && name.chars().count() >= 3))
        .min_by(|a, b| a.1.cmp(&b.1).then(b.0.total_cmp(&a.0)))
        .map(|(_, _, c)| c)
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
