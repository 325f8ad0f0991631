//! A YAML document as a tree of nodes that remember where they came from.
//!
//! Built from saphyr-parser's event stream (an iterative state machine, so deep nesting
//! cannot overflow our stack), with a bound on everything an input controls: file size,
//! nesting depth and the number of nodes after alias expansion (the "billion laughs" bomb).

use std::collections::HashMap;

use saphyr_parser::{Event, Parser, ScalarStyle, Span as ParserSpan};

use crate::diagnostic::{Code, Diagnostic, Pos, Span};

/// Larger files are refused before parsing: a pipeline is a page of YAML, not a data set.
pub const FILE_BYTES_MAX: usize = 1024 * 1024;
/// Deeper nesting than this is refused; the pipeline model itself is about six levels deep.
pub const DEPTH_MAX: usize = 64;
/// Nodes after alias expansion. Real files have hundreds; an alias bomb has billions.
pub const NODES_MAX: usize = 100_000;

#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub span: Span,
    pub value: Value,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// An empty plain scalar, `~` or `null`.
    Null,
    Scalar {
        text: String,
        style: Style,
    },
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

/// How a scalar was written; it decides how a plain scalar is typed and how a position inside
/// the scalar maps back to the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    Plain,
    SingleQuoted,
    DoubleQuoted,
    Literal,
    Folded,
}

impl Node {
    /// Looks a child up by a path of map keys and sequence indexes.
    pub fn get(&self, segment: &PathSegment) -> Option<&Node> {
        match (&self.value, segment) {
            (Value::Map(entries), PathSegment::Key(key)) => entries
                .iter()
                .find(|(k, _)| matches!(&k.value, Value::Scalar { text, .. } if text == key))
                .map(|(_, v)| v),
            (Value::Seq(items), PathSegment::Index(i)) => items.get(*i),
            _ => None,
        }
    }

    /// The node at `path`, or the deepest ancestor that exists: a diagnostic about a missing
    /// field points at the map that should hold it.
    pub fn locate(&self, path: &[PathSegment]) -> &Node {
        let mut node = self;
        for segment in path {
            match node.get(segment) {
                Some(child) => node = child,
                None => break,
            }
        }
        node
    }

    /// The span of the *key* of the entry at `path` if it is a map entry, else of the node.
    pub fn key_span(&self, path: &[PathSegment]) -> Span {
        let Some((last, parent_path)) = path.split_last() else { return self.span };
        let parent = self.locate(parent_path);
        if let (Value::Map(entries), PathSegment::Key(key)) = (&parent.value, last)
            && let Some((k, _)) = entries
                .iter()
                .find(|(k, _)| matches!(&k.value, Value::Scalar { text, .. } if text == key))
        {
            return k.span;
        }
        self.locate(path).span
    }

    pub fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::Scalar { text, .. } => Some(text),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathSegment {
    Key(String),
    Index(usize),
}

impl From<&str> for PathSegment {
    fn from(key: &str) -> PathSegment {
        PathSegment::Key(key.to_owned())
    }
}

impl From<usize> for PathSegment {
    fn from(index: usize) -> PathSegment {
        PathSegment::Index(index)
    }
}

/// Builds `[PathSegment]` from keys and indexes: `path!["targets", 0, "connector"]`.
#[macro_export]
macro_rules! path {
    ($($segment:expr),* $(,)?) => { [$($crate::yaml::PathSegment::from($segment)),*] };
}

/// Parses one YAML document. Problems are returned as diagnostics; the tree is returned when
/// it could be built, even if some problems (duplicate keys) were found.
pub fn parse(file: &str, source: &str) -> (Option<Node>, Vec<Diagnostic>) {
    let mut builder = Builder { file, diagnostics: Vec::new(), anchors: HashMap::new(), nodes: 0 };
    if source.len() > FILE_BYTES_MAX {
        let message = format!(
            "the file is {} bytes, larger than the {FILE_BYTES_MAX}-byte limit for a configuration file",
            source.len()
        );
        return (None, vec![Diagnostic::error(Code::Yaml, file, Span::start(), message)]);
    }
    let root = builder.run(source);
    (root, builder.diagnostics)
}

struct Builder<'f> {
    file: &'f str,
    diagnostics: Vec<Diagnostic>,
    /// Anchored nodes with their expanded size, for aliases.
    anchors: HashMap<usize, (Node, usize)>,
    /// Nodes created so far, counting alias expansions.
    nodes: usize,
}

enum Frame {
    Seq { span: Span, anchor: usize, items: Vec<Node>, size: usize },
    Map { span: Span, anchor: usize, entries: Vec<(Node, Node)>, key: Option<Node>, size: usize },
}

impl Builder<'_> {
    fn run(&mut self, source: &str) -> Option<Node> {
        let mut parser = Parser::new_from_str(source);
        let mut stack: Vec<Frame> = Vec::new();
        let mut root: Option<Node> = None;
        let mut documents = 0;
        loop {
            let (event, span) = match parser.next_event() {
                None => break,
                Some(Ok(pair)) => pair,
                Some(Err(error)) => {
                    let marker = error.marker();
                    let pos = Pos::from_marker(marker.line(), marker.col());
                    let message = format!("invalid YAML: {}", error.info());
                    let mut diagnostic = Diagnostic::error(
                        Code::Yaml,
                        self.file,
                        Span { start: pos, end: pos },
                        message,
                    );
                    if source.contains('\t') && error.info().contains("tab") {
                        diagnostic = diagnostic.with_hint("YAML indentation must use spaces");
                    }
                    self.diagnostics.push(diagnostic);
                    return None;
                }
            };
            let span = to_span(span);
            let completed = match event {
                Event::StreamStart | Event::StreamEnd | Event::Nothing | Event::DocumentEnd => None,
                Event::DocumentStart(_) => {
                    documents += 1;
                    if documents > 1 {
                        self.error(
                            span,
                            "a configuration file holds one YAML document; remove the second `---`",
                        );
                        return None;
                    }
                    None
                }
                Event::Alias(id) => {
                    let Some((node, size)) = self.anchors.get(&id).cloned() else {
                        self.error(span, "alias to an unknown anchor");
                        return None;
                    };
                    if !self.count(size, span) {
                        return None;
                    }
                    Some((Node { span, ..node }, size))
                }
                Event::Scalar(text, style, anchor, tag) => {
                    if let Some(tag) = tag
                        && !(tag.handle == "tag:yaml.org,2002:" || tag.handle == "!!")
                    {
                        self.error(
                            span,
                            format!("YAML tags are not supported (`{}{}`)", tag.handle, tag.suffix),
                        );
                        return None;
                    }
                    if !self.count(1, span) {
                        return None;
                    }
                    let value = scalar_value(&text, style);
                    let node = Node { span, value };
                    self.remember(anchor, &node, 1);
                    Some((node, 1))
                }
                Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                    if stack.len() >= DEPTH_MAX {
                        self.error(span, format!("nesting is deeper than {DEPTH_MAX} levels"));
                        return None;
                    }
                    if !self.count(1, span) {
                        return None;
                    }
                    stack.push(if matches!(event, Event::SequenceStart(..)) {
                        Frame::Seq { span, anchor, items: Vec::new(), size: 1 }
                    } else {
                        Frame::Map { span, anchor, entries: Vec::new(), key: None, size: 1 }
                    });
                    None
                }
                Event::SequenceEnd => match stack.pop() {
                    Some(Frame::Seq { span: start, anchor, items, size }) => {
                        let node = Node { span: start.to(span), value: Value::Seq(items) };
                        self.remember(anchor, &node, size);
                        Some((node, size))
                    }
                    _ => unreachable!("the parser balances sequence events"),
                },
                Event::MappingEnd => match stack.pop() {
                    Some(Frame::Map { span: start, anchor, entries, size, .. }) => {
                        let entries = self.without_duplicate_keys(entries);
                        let node = Node { span: start.to(span), value: Value::Map(entries) };
                        self.remember(anchor, &node, size);
                        Some((node, size))
                    }
                    _ => unreachable!("the parser balances mapping events"),
                },
            };
            if let Some((node, size)) = completed {
                match stack.last_mut() {
                    None => root = Some(node),
                    Some(Frame::Seq { items, size: total, .. }) => {
                        items.push(node);
                        *total += size;
                    }
                    Some(Frame::Map { entries, key, size: total, .. }) => {
                        *total += size;
                        match key.take() {
                            None => *key = Some(node),
                            Some(k) => entries.push((k, node)),
                        }
                    }
                }
            }
        }
        if root.is_none() {
            self.error(Span::start(), "the file is empty");
        }
        root
    }

    fn count(&mut self, nodes: usize, span: Span) -> bool {
        self.nodes = self.nodes.saturating_add(nodes);
        if self.nodes > NODES_MAX {
            self.error(
                span,
                format!("the document expands to more than {NODES_MAX} nodes (aliases are expanded); is this an alias bomb?"),
            );
            return false;
        }
        true
    }

    fn remember(&mut self, anchor: usize, node: &Node, size: usize) {
        if anchor > 0 {
            self.anchors.insert(anchor, (node.clone(), size));
        }
    }

    fn without_duplicate_keys(&mut self, entries: Vec<(Node, Node)>) -> Vec<(Node, Node)> {
        let mut seen: HashMap<String, Span> = HashMap::new();
        let mut kept = Vec::with_capacity(entries.len());
        for (key, value) in entries {
            if let Some(text) = key.as_str() {
                if let Some(first) = seen.get(text) {
                    let message = format!("duplicate key `{text}`");
                    let diagnostic =
                        Diagnostic::error(Code::DuplicateKey, self.file, key.span, message)
                            .with_label("defined again here")
                            .with_hint("a key may appear once; the first is kept")
                            .with_related(
                                self.file,
                                *first,
                                format!("`{text}` is first defined here"),
                            );
                    self.diagnostics.push(diagnostic);
                    continue;
                }
                seen.insert(text.to_owned(), key.span);
            }
            kept.push((key, value));
        }
        kept
    }

    fn error(&mut self, span: Span, message: impl Into<String>) {
        self.diagnostics.push(Diagnostic::error(Code::Yaml, self.file, span, message));
    }
}

fn scalar_value(text: &str, style: ScalarStyle) -> Value {
    let style = match style {
        ScalarStyle::Plain => Style::Plain,
        ScalarStyle::SingleQuoted => Style::SingleQuoted,
        ScalarStyle::DoubleQuoted => Style::DoubleQuoted,
        ScalarStyle::Literal => Style::Literal,
        ScalarStyle::Folded => Style::Folded,
    };
    if style == Style::Plain && matches!(text, "" | "~" | "null" | "Null" | "NULL") {
        return Value::Null;
    }
    Value::Scalar { text: text.to_owned(), style }
}

fn to_span(span: ParserSpan) -> Span {
    Span {
        start: Pos::from_marker(span.start.line(), span.start.col()),
        end: Pos::from_marker(span.end.line(), span.end.col()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_ok(source: &str) -> Node {
        let (node, diagnostics) = parse("t.yaml", source);
        assert!(diagnostics.is_empty(), "{diagnostics:?}");
        node.expect("a document")
    }

    #[test]
    fn spans_are_one_based() {
        let root = parse_ok("a: 1\nb:\n  c: x\n");
        let c = root.locate(&path!["b", "c"]);
        assert_eq!((c.span.start.line, c.span.start.column), (3, 6));
        assert_eq!(root.key_span(&path!["b", "c"]).start.column, 3);
    }

    #[test]
    fn limits_are_enforced_without_panicking() {
        // Flow nesting is stopped by the parser's own recursion guard, block nesting by ours.
        let deep = format!("{}1{}", "[".repeat(5000), "]".repeat(5000));
        let (node, diagnostics) = parse("t.yaml", &deep);
        assert!(node.is_none());
        assert!(diagnostics[0].message.contains("recursion limit"), "{diagnostics:?}");
        let block: String =
            (0..100).map(|depth| format!("{}k{depth}:\n", "  ".repeat(depth))).collect();
        let (node, diagnostics) = parse("t.yaml", &block);
        assert!(node.is_none());
        assert!(diagnostics[0].message.contains("nesting is deeper than 64"), "{diagnostics:?}");

        let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        for (i, prev) in
            ["b", "c", "d", "e", "f", "g", "h"].iter().zip(["a", "b", "c", "d", "e", "f", "g"])
        {
            bomb.push_str(&format!("{i}: &{i} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"));
        }
        let (node, diagnostics) = parse("t.yaml", &bomb);
        assert!(node.is_none());
        assert!(diagnostics[0].message.contains("alias bomb"), "{diagnostics:?}");
    }

    #[test]
    fn duplicate_keys_are_reported_and_the_first_kept() {
        let (node, diagnostics) = parse("t.yaml", "a: 1\nb: 2\na: 3\n");
        assert_eq!(diagnostics.len(), 1);
        assert_eq!(
            diagnostics[0].to_string(),
            "t.yaml:3:1: error[H0002]: duplicate key `a`\n  = hint: a key may appear once; the first is kept\n  = note: t.yaml:1:1: `a` is first defined here"
        );
        let node = node.expect("tree");
        assert_eq!(node.locate(&path!["a"]).as_str(), Some("1"));
    }
}
