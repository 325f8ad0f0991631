//! How diagnostics are shown: like rustc (the source line, a caret under the span, a label,
//! the hint) for people, one line each for grep, or one JSON object per line for editors and
//! CI. Sources are read back from the files the diagnostics name; a file that cannot be read
//! is shown without its line.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::IsTerminal as _;
use std::ops::Range;
use std::path::Path;

use annotate_snippets::{AnnotationKind, Group, Level, Renderer, Snippet};
use hookgate_pipeline::{Diagnostic, Pos, Severity};
use serde_json::json;

use crate::check::Report;

/// `--message-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MessageFormat {
    /// The source line with a caret, like rustc.
    Human,
    /// `file:line:column: error[H0101]: message`, one per line.
    Short,
    /// One JSON object per line on stdout: each diagnostic, then a summary.
    Json,
}

/// `--color`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Color {
    /// Colour when stderr is a terminal and `NO_COLOR` is not set.
    Auto,
    Always,
    Never,
}

impl Color {
    pub fn enabled(self) -> bool {
        match self {
            Color::Always => true,
            Color::Never => false,
            Color::Auto => {
                std::io::stderr().is_terminal()
                    && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
                    && std::env::var_os("TERM").is_none_or(|t| t != "dumb")
            }
        }
    }
}

/// The sources of the files diagnostics name, read once each.
#[derive(Debug, Default)]
pub struct Sources {
    files: HashMap<String, Option<String>>,
}

impl Sources {
    fn get(&mut self, file: &str) -> Option<&str> {
        self.files
            .entry(file.to_owned())
            .or_insert_with(|| crate::files::read_config(Path::new(file)).ok())
            .as_deref()
    }
}

/// A report in the human form: each diagnostic with its source, then the summary line.
pub fn human(report: &Report, color: bool) -> String {
    let renderer = if color { Renderer::styled() } else { Renderer::plain() };
    let mut sources = Sources::default();
    let mut out = String::new();
    for error in &report.option_errors {
        let group = [Group::with_title(Level::ERROR.primary_title(error.as_str()))];
        let _ = writeln!(out, "{}\n", renderer.render(&group));
    }
    for diagnostic in &report.diagnostics {
        let _ = writeln!(out, "{}\n", rendered(diagnostic, &mut sources, &renderer));
    }
    let mut codes: Vec<&str> = report.diagnostics.iter().map(|d| d.code.as_str()).collect();
    codes.sort_unstable();
    codes.dedup();
    if let Some(first) = codes.first() {
        let _ = writeln!(
            out,
            "codes found: {}; `hookgate explain {first}` says what one means and how to fix it",
            codes.join(", ")
        );
    }
    out.push_str(&report.summary());
    out
}

/// A report in the short form.
pub fn short(report: &Report) -> String {
    let mut out = String::new();
    for error in &report.option_errors {
        let _ = writeln!(out, "error: {error}");
    }
    for diagnostic in &report.diagnostics {
        let _ = writeln!(out, "{diagnostic}");
    }
    out.push_str(&report.summary());
    out
}

/// A report as JSON lines: `{"reason":"diagnostic",...}` per problem, then
/// `{"reason":"summary",...}`. The shape is documented in docs/guide/checking.md and stable.
pub fn json(report: &Report) -> String {
    let renderer = Renderer::plain();
    let mut sources = Sources::default();
    let mut out = String::new();
    for error in &report.option_errors {
        let line = json!({
            "reason": "diagnostic",
            "severity": "error",
            "code": null,
            "message": error,
            "file": null,
            "line": null,
            "column": null,
            "end_line": null,
            "end_column": null,
            "label": null,
            "hint": null,
            "related": [],
            "rendered": format!("error: {error}"),
        });
        let _ = writeln!(out, "{line}");
    }
    for diagnostic in &report.diagnostics {
        let related: Vec<_> = diagnostic
            .related
            .iter()
            .map(|r| {
                json!({
                    "file": r.file,
                    "line": r.span.start.line,
                    "column": r.span.start.column,
                    "message": r.message,
                })
            })
            .collect();
        let line = json!({
            "reason": "diagnostic",
            "severity": diagnostic.severity.as_str(),
            "code": diagnostic.code.as_str(),
            "message": diagnostic.message,
            "file": diagnostic.file,
            "line": diagnostic.span.start.line,
            "column": diagnostic.span.start.column,
            "end_line": diagnostic.span.end.line.max(diagnostic.span.start.line),
            "end_column": diagnostic.span.end.column,
            "label": diagnostic.label,
            "hint": diagnostic.hint,
            "related": related,
            "rendered": rendered(diagnostic, &mut sources, &renderer),
        });
        let _ = writeln!(out, "{line}");
    }
    let summary = json!({
        "reason": "summary",
        "pipelines": report.pipelines,
        "fixtures": report.fixtures_run,
        "fixtures_failed": report.fixtures_failed,
        "fixtures_blessed": report.fixtures_blessed,
        "errors": report.errors(),
        "warnings": report.warnings(),
    });
    let _ = writeln!(out, "{summary}");
    out
}

/// One diagnostic as rustc shows it.
fn rendered(diagnostic: &Diagnostic, sources: &mut Sources, renderer: &Renderer) -> String {
    let level = match diagnostic.severity {
        Severity::Error => Level::ERROR,
        Severity::Warning => Level::WARNING,
    };
    let title = level.primary_title(diagnostic.message.as_str()).id(diagnostic.code.as_str());
    // Snippets borrow their sources; gather the texts first.
    let main_source = sources.get(&diagnostic.file).map(str::to_owned);
    let related_sources: Vec<Option<String>> =
        diagnostic.related.iter().map(|r| sources.get(&r.file).map(str::to_owned)).collect();

    let mut group = Group::with_title(title);
    let mut origin = None;
    match &main_source {
        Some(source) => {
            let range = byte_range(source, diagnostic.span.start, diagnostic.span.end);
            let label = diagnostic.label.as_deref().unwrap_or(diagnostic.code.title());
            let mut snippet = Snippet::source(source.as_str())
                .path(diagnostic.file.as_str())
                .annotation(AnnotationKind::Primary.span(range).label(label));
            // Related places in the same file are shown in the same snippet.
            for (related, _) in diagnostic.related.iter().zip(&related_sources) {
                if related.file == diagnostic.file {
                    let range = byte_range(source, related.span.start, related.span.end);
                    snippet = snippet.annotation(
                        AnnotationKind::Context.span(range).label(related.message.as_str()),
                    );
                }
            }
            group = group.element(snippet);
        }
        None => {
            origin = Some(format!(
                "{}:{}:{}",
                diagnostic.file, diagnostic.span.start.line, diagnostic.span.start.column
            ));
        }
    }
    if let Some(origin) = &origin {
        group = group.element(annotate_snippets::Origin::path(origin.as_str()));
    }
    for (related, source) in diagnostic.related.iter().zip(&related_sources) {
        if related.file == diagnostic.file && main_source.is_some() {
            continue;
        }
        match source {
            Some(source) => {
                let range = byte_range(source, related.span.start, related.span.end);
                group = group.element(
                    Snippet::source(source.as_str()).path(related.file.as_str()).annotation(
                        AnnotationKind::Context.span(range).label(related.message.as_str()),
                    ),
                );
            }
            None => {
                group = group.element(Level::NOTE.message(format!(
                    "{}:{}:{}: {}",
                    related.file,
                    related.span.start.line,
                    related.span.start.column,
                    related.message
                )));
            }
        }
    }
    if let Some(hint) = &diagnostic.hint {
        group = group.element(Level::HELP.message(hint.as_str()));
    }
    renderer.render(&[group])
}

/// The bytes a span covers, for the caret. A span that runs over several lines (a mapping)
/// is shown on its first line; an empty one covers the token it starts.
fn byte_range(source: &str, start: Pos, end: Pos) -> Range<usize> {
    let begin = offset(source, start);
    let line_end = source[begin..].find('\n').map_or(source.len(), |i| begin + i);
    let end = if end.line == start.line && end.column > start.column {
        offset(source, end).min(line_end)
    } else {
        let rest = &source[begin..line_end];
        let token = rest.find(char::is_whitespace).unwrap_or(rest.len());
        begin + rest[..token].trim_end_matches(':').len()
    };
    if end > begin {
        begin..end
    } else {
        // The end of a line or file: one column past it.
        begin..begin
    }
}

/// The byte offset of a 1-based line and character column, clamped to the source.
fn offset(source: &str, pos: Pos) -> usize {
    let mut line_start = 0;
    for _ in 1..pos.line {
        match source[line_start..].find('\n') {
            Some(i) => line_start += i + 1,
            None => return source.len(),
        }
    }
    let line = &source[line_start..];
    let line = &line[..line.find('\n').unwrap_or(line.len())];
    let column = usize::try_from(pos.column.saturating_sub(1)).unwrap_or(usize::MAX);
    line_start + line.char_indices().nth(column).map_or(line.len(), |(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_ranges_follow_characters_and_stay_on_one_line() {
        let source = "name: café\nkey:\n  header: X-Id\n";
        let at = |line, column| Pos { line, column };
        assert_eq!(byte_range(source, at(1, 7), at(1, 11)), 6..11);
        // A multi-line span is cut at the end of its first line.
        assert_eq!(byte_range(source, at(2, 1), at(4, 1)), 12..15);
        // An empty span covers the token it starts.
        assert_eq!(byte_range(source, at(3, 11), at(3, 11)), 27..31);
        // Past the end is clamped.
        assert_eq!(byte_range(source, at(9, 1), at(9, 1)), source.len()..source.len());
    }
}
