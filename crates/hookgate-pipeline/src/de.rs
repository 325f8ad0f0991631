//! A serde deserializer over [`Node`] that keeps locations.
//!
//! Two things set it apart from a general-purpose YAML deserializer:
//! - every error carries the span of the node it concerns, so it becomes a
//!   `file:line:column` diagnostic;
//! - unknown fields do not stop deserialization. `deserialize_struct` is told the field names,
//!   so each unknown key is reported (with a did-you-mean hint) and skipped, and the rest of
//!   the file is still checked. One run reports every misspelt key in the file.

use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, IntoDeserializer, Visitor};

use crate::diagnostic::{
    Code, Diagnostic, Pos, Span, did_you_mean, suggestion, variant_suggestion,
};
use crate::yaml::{Node, Style, Value};

#[derive(Debug)]
pub struct DeError {
    pub message: String,
    pub hint: Option<String>,
    pub span: Option<Span>,
    kind: ErrorKind,
    /// The address of the node the error concerns, so that [`from_node`] can repair exactly
    /// that node and go on. Only compared, never dereferenced.
    node: Option<usize>,
}

/// What kind of repair lets deserialization go on past an error.
#[derive(Debug, Clone, PartialEq)]
enum ErrorKind {
    /// A value of the wrong type, or one a type's own parser refused: replace it.
    Value,
    /// A name that is not one of the enum's variants: substitute one that is.
    UnknownVariant { expected: &'static [&'static str] },
    /// A required field is absent from a mapping: add a stand-in.
    MissingField { name: &'static str },
    /// An enum variant written as a bare name needs a value: give it one.
    NeedsValue,
}

impl DeError {
    fn at(mut self, node: &Node) -> DeError {
        if self.node.is_none() {
            self.node = Some(std::ptr::from_ref(node) as usize);
            self.span.get_or_insert(node.span);
        }
        self
    }

    fn new(message: String, hint: Option<String>, kind: ErrorKind) -> DeError {
        DeError { message, hint, span: None, kind, node: None }
    }

    pub fn into_diagnostic(self, file: &str, fallback: Span) -> Diagnostic {
        let code = match self.kind {
            ErrorKind::Value | ErrorKind::NeedsValue => Code::WrongType,
            ErrorKind::UnknownVariant { .. } => Code::UnknownVariant,
            ErrorKind::MissingField { .. } => Code::MissingField,
        };
        let mut diagnostic =
            Diagnostic::error(code, file, self.span.unwrap_or(fallback), self.message);
        if let ErrorKind::MissingField { name } = self.kind {
            diagnostic = diagnostic.with_label(format!("this block needs `{name}`"));
        }
        match self.hint {
            Some(hint) => diagnostic.with_hint(hint),
            None => diagnostic,
        }
    }
}

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DeError {}

impl de::Error for DeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        DeError::new(msg.to_string(), None, ErrorKind::Value)
    }

    fn unknown_variant(variant: &str, expected: &'static [&'static str]) -> Self {
        DeError::new(
            format!("unknown variant `{variant}`"),
            Some(variant_suggestion(variant, expected)),
            ErrorKind::UnknownVariant { expected },
        )
    }

    fn unknown_field(field: &str, expected: &'static [&'static str]) -> Self {
        DeError::new(
            format!("unknown field `{field}`"),
            Some(suggestion(field, expected)),
            ErrorKind::Value,
        )
    }

    fn missing_field(field: &'static str) -> Self {
        DeError::new(
            format!("missing field `{field}`"),
            None,
            ErrorKind::MissingField { name: field },
        )
    }
}

/// Problems that did not stop deserialization (unknown fields).
#[derive(Debug, Default)]
pub struct Recovered {
    file: String,
    diagnostics: RefCell<Vec<Diagnostic>>,
    /// Unknown keys seen in this pass: the mapping's address, and the field the key was
    /// probably meant to be. A "missing field" for that field is an echo of the typo.
    misspelt: RefCell<Vec<(usize, &'static str)>>,
}

/// How many times one file may be repaired and deserialized again. Each repair fixes one
/// error (or tries the next stand-in for one), so this bounds the work a hostile file causes.
const REPAIRS_MAX: usize = 512;
/// Nodes visited over all passes: a large file gets fewer repairs (at least 8), so that a
/// megabyte of mistakes is reported in bounded time.
const NODE_VISITS_MAX: usize = 5_000_000;

fn node_count(node: &Node) -> usize {
    1 + match &node.value {
        Value::Map(entries) => entries.iter().map(|(k, v)| node_count(k) + node_count(v)).sum(),
        Value::Seq(items) => items.iter().map(node_count).sum(),
        _ => 0,
    }
}

/// What later, semantic checks of a repaired tree must not report again, because it only
/// restates an error already reported (see `without_echoes` in lib.rs).
#[derive(Debug, Default)]
pub struct Echoes {
    /// Exact spans of stand-ins and of the keys that hold them. Values added by a repair have
    /// spans on line 0, which no file has, so anything located at them is an echo too.
    pub spans: Vec<Span>,
    /// Blocks whose kind was unknown and stood in for by a guess: nothing in them is checked
    /// further, since every check would be of the guess.
    pub regions: Vec<Span>,
    /// `(span, field)`: a problem at the span (a mapping, or the key that holds it) that names
    /// the field (a "missing field", "say where ...: `header` or ...") is explained by a
    /// misspelt key already reported.
    pub misspelt: Vec<(Span, &'static str)>,
}

impl Echoes {
    /// Whether `diagnostic` only restates what was reported while deserializing.
    pub fn restates(&self, diagnostic: &Diagnostic) -> bool {
        let span = diagnostic.span;
        span.start.line == 0
            || self.spans.contains(&span)
            || self.regions.iter().any(|r| r.start <= span.start && span.start <= r.end)
            || self
                .misspelt
                .iter()
                .any(|(at, name)| *at == span && diagnostic.message.contains(&format!("`{name}`")))
    }
}

/// A repair made to the tree, remembered so that errors inside it are not reported.
#[derive(Debug)]
struct StandIn {
    path: Vec<Step>,
    /// Which of [`stand_in`]'s values is in place; `None` for a substituted variant name.
    attempt: Option<usize>,
}

/// Deserializes `T` from `node`, reporting every problem in one pass.
///
/// serde stops at the first hard error, so one run would show one error per file. Instead,
/// each hard error is reported and then repaired in the tree (a wrong value replaced by a
/// stand-in, an unknown variant by the closest known one, a missing field added), and
/// deserialization runs again, until it succeeds. Stand-ins are tried in turn (null, a string,
/// a number, a boolean, a mapping, a list) until one has the type serde wants; errors inside
/// stand-ins are never reported. A missing field is not reported when an unknown key in the
/// same mapping was probably meant to be it: the typo has already been reported.
///
/// `node` is left repaired, so that later checks locate values in the tree the returned value
/// came from. The value is returned even when errors were reported, so that the semantic
/// checks run too; callers must not use it for anything but checking when errors exist.
pub fn from_node<T: de::DeserializeOwned>(
    file: &str,
    node: &mut Node,
) -> (Option<T>, Vec<Diagnostic>) {
    let (value, diagnostics, _) = from_node_repairing(file, node);
    (value, diagnostics)
}

/// [`from_node`], also returning what later checks must not report again.
pub fn from_node_repairing<T: de::DeserializeOwned>(
    file: &str,
    node: &mut Node,
) -> (Option<T>, Vec<Diagnostic>, Echoes) {
    let mut diagnostics: Vec<Diagnostic> = Vec::new();
    // Unknown fields are found again on every pass; each is reported once.
    let mut reported: HashSet<(Pos, String)> = HashSet::new();
    let mut report = |diagnostic: Diagnostic, diagnostics: &mut Vec<Diagnostic>| {
        if reported.insert((diagnostic.span.start, diagnostic.message.clone())) {
            diagnostics.push(diagnostic);
        }
    };
    let mut stand_ins: Vec<StandIn> = Vec::new();
    let mut echoes = Echoes::default();
    let repairs_max = (NODE_VISITS_MAX / node_count(node).max(1)).clamp(8, REPAIRS_MAX);
    for _ in 0..repairs_max {
        let recovered = Recovered {
            file: file.to_owned(),
            diagnostics: RefCell::default(),
            misspelt: RefCell::default(),
        };
        let result = T::deserialize(NodeDeserializer { node, recovered: &recovered });
        let misspelt = recovered.misspelt.take();
        for diagnostic in recovered.diagnostics.take() {
            report(diagnostic, &mut diagnostics);
        }
        let error = match result {
            Ok(value) => {
                // Addresses are those of this last pass, which repaired nothing.
                for (address, name) in misspelt {
                    if let Some(path) = path_to(node, address) {
                        for span in block_spans(node, &path) {
                            echoes.misspelt.push((span, name));
                        }
                    }
                }
                for stand_in in &stand_ins {
                    if let Some((Step::Value(i), parent)) = stand_in.path.split_last()
                        && let Some(Node { value: Value::Map(entries), .. }) = node_at(node, parent)
                        && let Some((key, _)) = entries.get(*i)
                    {
                        echoes.spans.push(key.span);
                    }
                }
                return (Some(value), diagnostics, echoes);
            }
            Err(error) => error,
        };
        let (kind, address) = (error.kind.clone(), error.node);
        let Some(path) = address.and_then(|address| path_to(node, address)) else {
            report(error.into_diagnostic(file, node.span), &mut diagnostics);
            return (None, diagnostics, echoes);
        };
        // Inside a stand-in value nothing is the user's; a substituted variant name is the
        // user's block with a corrected name, whose contents are still checked.
        let inside_stand_in = stand_ins.iter().any(|s| {
            path.starts_with(&s.path) && (s.attempt.is_some() || path.len() == s.path.len())
        });
        let echo = match kind {
            ErrorKind::MissingField { name } => {
                misspelt.iter().any(|&(map, meant)| Some(map) == address && meant == name)
            }
            _ => false,
        };
        if !inside_stand_in && !echo {
            let mut diagnostic = error.into_diagnostic(file, node.span);
            // A missing field is shown at the key of the block that lacks it.
            if matches!(kind, ErrorKind::MissingField { .. })
                && let Some(span) = block_spans(node, &path).into_iter().nth(1)
            {
                diagnostic.span = span;
            }
            report(diagnostic, &mut diagnostics);
        }
        if !repair(node, &path, &kind, &mut stand_ins, &mut echoes) {
            return (None, diagnostics, echoes);
        }
    }
    let stopped = format!(
        "stopped after {repairs_max} repairs: too many problems to check in one run; fix these and run again"
    );
    report(Diagnostic::error(Code::Yaml, file, node.span, stopped), &mut diagnostics);
    (None, diagnostics, echoes)
}

/// The span of the node at `path` and, when it is a mapping's value, of the key holding it.
fn block_spans(root: &mut Node, path: &[Step]) -> Vec<Span> {
    let mut spans = Vec::new();
    if let Some(node) = node_at(root, path) {
        spans.push(node.span);
    }
    if let Some((Step::Value(i), parent)) = path.split_last()
        && let Some(Node { value: Value::Map(entries), .. }) = node_at(root, parent)
        && let Some((key, _)) = entries.get(*i)
    {
        spans.push(key.span);
    }
    spans
}

/// One step from a node to a child: a mapping's value or key by entry index, a list's item.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    Value(usize),
    Key(usize),
    Item(usize),
}

fn path_to(node: &Node, address: usize) -> Option<Vec<Step>> {
    if std::ptr::from_ref(node) as usize == address {
        return Some(Vec::new());
    }
    let found = |step: Step, child: &Node| {
        path_to(child, address).map(|mut rest| {
            rest.insert(0, step);
            rest
        })
    };
    match &node.value {
        Value::Map(entries) => entries.iter().enumerate().find_map(|(i, (key, value))| {
            found(Step::Key(i), key).or_else(|| found(Step::Value(i), value))
        }),
        Value::Seq(items) => {
            items.iter().enumerate().find_map(|(i, item)| found(Step::Item(i), item))
        }
        _ => None,
    }
}

fn node_at<'a>(node: &'a mut Node, path: &[Step]) -> Option<&'a mut Node> {
    let Some((step, rest)) = path.split_first() else { return Some(node) };
    let child = match (&mut node.value, step) {
        (Value::Map(entries), Step::Value(i)) => &mut entries.get_mut(*i)?.1,
        (Value::Map(entries), Step::Key(i)) => &mut entries.get_mut(*i)?.0,
        (Value::Seq(items), Step::Item(i)) => items.get_mut(*i)?,
        _ => return None,
    };
    node_at(child, rest)
}

/// Stand-ins for a value of unknown type, in the order they are tried.
fn stand_in(attempt: usize) -> Option<Value> {
    let scalar = |text: &str, style| Value::Scalar { text: text.to_owned(), style };
    Some(match attempt {
        0 => Value::Null,
        1 => scalar("", Style::SingleQuoted),
        2 => scalar("0", Style::Plain),
        3 => scalar("false", Style::Plain),
        4 => Value::Map(Vec::new()),
        5 => Value::Seq(Vec::new()),
        _ => return None,
    })
}

/// A span on line 0, which no file has: what is located at it was made by a repair.
fn made_up(echoes: &Echoes) -> Span {
    let pos = Pos { line: 0, column: u32::try_from(echoes.spans.len() + 1).unwrap_or(u32::MAX) };
    Span { start: pos, end: pos }
}

/// Repairs the node at `path` so that the next pass gets past `kind`. False if it cannot.
fn repair(
    root: &mut Node,
    path: &[Step],
    kind: &ErrorKind,
    stand_ins: &mut Vec<StandIn>,
    echoes: &mut Echoes,
) -> bool {
    if path.is_empty() {
        // The document itself has the wrong shape: there is nothing to go on with.
        return false;
    }
    let made_up = made_up(echoes);
    let Some(node) = node_at(root, path) else { return false };
    match kind {
        ErrorKind::UnknownVariant { expected } => {
            let Some(first) = expected.first() else { return false };
            let meant = node.as_str().and_then(|n| did_you_mean(n, expected.iter().copied()));
            node.value =
                Value::Scalar { text: meant.unwrap_or(first).to_owned(), style: Style::Plain };
            echoes.spans.push(node.span);
            if !stand_ins.iter().any(|s| s.path == path) {
                stand_ins.push(StandIn { path: path.to_vec(), attempt: None });
            }
            if meant.is_none() {
                // A guess: the block whose kind it names is not checked further. A key names
                // the variant of its own mapping; a value, of the mapping that holds it.
                let block = &path[..path.len() - 1];
                if !block.is_empty()
                    && let Some(block) = node_at(root, block)
                {
                    echoes.regions.push(block.span);
                }
            }
            true
        }
        ErrorKind::MissingField { name } => {
            let Value::Map(entries) = &mut node.value else { return false };
            let key = Node {
                span: made_up,
                value: Value::Scalar { text: (*name).to_owned(), style: Style::Plain },
            };
            entries.push((key, Node { span: made_up, value: Value::Null }));
            let mut field = path.to_vec();
            field.push(Step::Value(entries.len() - 1));
            stand_ins.push(StandIn { path: field, attempt: Some(0) });
            echoes.spans.push(made_up);
            true
        }
        ErrorKind::NeedsValue => {
            let Some(name) = node.as_str().map(str::to_owned) else { return false };
            let key =
                Node { span: node.span, value: Value::Scalar { text: name, style: Style::Plain } };
            node.value = Value::Map(vec![(key, Node { span: made_up, value: Value::Null })]);
            let mut value = path.to_vec();
            value.push(Step::Value(0));
            stand_ins.push(StandIn { path: value, attempt: Some(0) });
            echoes.spans.push(made_up);
            true
        }
        ErrorKind::Value => {
            let attempt = match stand_ins.iter_mut().find(|s| s.path == path) {
                Some(StandIn { attempt: Some(attempt), .. }) => {
                    *attempt = attempt.saturating_add(1);
                    *attempt
                }
                // A substituted variant name that is still wrong here: a value after all.
                Some(stand_in) => {
                    stand_in.attempt = Some(0);
                    0
                }
                None => {
                    stand_ins.push(StandIn { path: path.to_vec(), attempt: Some(0) });
                    0
                }
            };
            match stand_in(attempt) {
                Some(value) => {
                    node.value = value;
                    node.span = made_up;
                    echoes.spans.push(made_up);
                    true
                }
                None => false,
            }
        }
    }
}

#[derive(Clone, Copy)]
struct NodeDeserializer<'a> {
    node: &'a Node,
    recovered: &'a Recovered,
}

impl<'a> NodeDeserializer<'a> {
    fn child(&self, node: &'a Node) -> NodeDeserializer<'a> {
        NodeDeserializer { node, recovered: self.recovered }
    }

    fn invalid_type(&self, expected: &str) -> DeError {
        let found = match &self.node.value {
            Value::Null => "nothing (null)".to_owned(),
            Value::Scalar { text, .. } => format!("`{}`", truncate(text)),
            Value::Seq(_) => "a list".to_owned(),
            Value::Map(_) => "a mapping".to_owned(),
        };
        DeError::new(format!("expected {expected}, found {found}"), None, ErrorKind::Value)
            .at(self.node)
    }

    /// The text of a scalar as a string, if the node is one.
    fn text(&self) -> Option<&'a str> {
        match &self.node.value {
            Value::Scalar { text, .. } => Some(text),
            _ => None,
        }
    }

    /// The text of a plain scalar, for numbers and booleans: a quoted `"8"` is a string.
    fn plain(&self) -> Option<&'a str> {
        match &self.node.value {
            Value::Scalar { text, style: Style::Plain } => Some(text),
            _ => None,
        }
    }

    fn parse_int<T: TryFrom<i128>>(&self, expected: &str) -> Result<T, DeError> {
        let text = self.plain().ok_or_else(|| self.invalid_type(expected))?;
        parse_yaml_int(text)
            .and_then(|n| T::try_from(n).ok())
            .ok_or_else(|| self.invalid_type(expected))
    }

    fn parse_float(&self) -> Result<f64, DeError> {
        let text = self.plain().ok_or_else(|| self.invalid_type("a number"))?;
        parse_yaml_float(text).ok_or_else(|| self.invalid_type("a number"))
    }
}

fn truncate(text: &str) -> String {
    const SHOWN_CHARS_MAX: usize = 40;
    if text.chars().count() <= SHOWN_CHARS_MAX {
        text.to_owned()
    } else {
        format!("{}…", text.chars().take(SHOWN_CHARS_MAX).collect::<String>())
    }
}

fn parse_yaml_int(text: &str) -> Option<i128> {
    let (negative, digits) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let magnitude = if let Some(hex) = digits.strip_prefix("0x") {
        i128::from_str_radix(hex, 16).ok()?
    } else if let Some(octal) = digits.strip_prefix("0o") {
        i128::from_str_radix(octal, 8).ok()?
    } else if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        digits.parse().ok()?
    } else {
        return None;
    };
    Some(if negative { -magnitude } else { magnitude })
}

fn parse_yaml_float(text: &str) -> Option<f64> {
    match text {
        ".inf" | ".Inf" | ".INF" | "+.inf" => Some(f64::INFINITY),
        "-.inf" | "-.Inf" | "-.INF" => Some(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => Some(f64::NAN),
        _ if text.bytes().any(|b| b.is_ascii_digit()) => text.parse().ok(),
        _ => None,
    }
}

fn parse_yaml_bool(text: &str) -> Option<bool> {
    match text {
        "true" | "True" | "TRUE" => Some(true),
        "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

macro_rules! deserialize_int {
    ($($method:ident => $visit:ident,)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
            let n = self.parse_int("a whole number that fits")?;
            visitor.$visit(n).map_err(|e: DeError| e.at(self.node))
        }
    )*};
}

impl<'de> de::Deserializer<'de> for NodeDeserializer<'_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let node = self.node;
        let result = match &self.node.value {
            Value::Null => visitor.visit_unit(),
            Value::Scalar { text, style: Style::Plain } => {
                if let Some(b) = parse_yaml_bool(text) {
                    visitor.visit_bool(b)
                } else if let Some(n) = parse_yaml_int(text) {
                    match i64::try_from(n) {
                        Ok(n) => visitor.visit_i64(n),
                        Err(_) => visitor.visit_str(text),
                    }
                } else if let Some(x) = parse_yaml_float(text) {
                    visitor.visit_f64(x)
                } else {
                    visitor.visit_str(text)
                }
            }
            Value::Scalar { text, .. } => visitor.visit_str(text),
            Value::Seq(_) => return self.deserialize_seq(visitor),
            Value::Map(_) => return self.deserialize_map(visitor),
        };
        result.map_err(|e: DeError| e.at(node))
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let b = self
            .plain()
            .and_then(parse_yaml_bool)
            .ok_or_else(|| self.invalid_type("`true` or `false`"))?;
        visitor.visit_bool(b).map_err(|e: DeError| e.at(self.node))
    }

    deserialize_int! {
        deserialize_i8 => visit_i8,
        deserialize_i16 => visit_i16,
        deserialize_i32 => visit_i32,
        deserialize_i64 => visit_i64,
        deserialize_u8 => visit_u8,
        deserialize_u16 => visit_u16,
        deserialize_u32 => visit_u32,
        deserialize_u64 => visit_u64,
    }

    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_f64(visitor)
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let x = self.parse_float()?;
        visitor.visit_f64(x).map_err(|e: DeError| e.at(self.node))
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        // Any scalar reads as its text: `version: 1.0` is the string "1.0" when a string is
        // wanted. Null is not a string.
        let text = self.text().ok_or_else(|| self.invalid_type("a string"))?;
        visitor.visit_str(text).map_err(|e: DeError| e.at(self.node))
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, DeError> {
        Err(self.invalid_type("bytes, which YAML configuration does not carry"))
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_bytes(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.node.value {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.node.value {
            Value::Null => visitor.visit_unit(),
            _ => Err(self.invalid_type("nothing")),
        }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        visitor.visit_newtype_struct(self).map_err(|e: DeError| e.at(self.node))
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let Value::Seq(items) = &self.node.value else { return Err(self.invalid_type("a list")) };
        let access = SeqAccess { items: items.iter(), de: self };
        visitor.visit_seq(access).map_err(|e: DeError| e.at(self.node))
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let Value::Map(entries) = &self.node.value else {
            return Err(self.invalid_type("a mapping"));
        };
        let access = MapAccess {
            entries: entries.iter().collect::<Vec<_>>().into_iter(),
            value: None,
            de: self,
        };
        visitor.visit_map(access).map_err(|e: DeError| e.at(self.node))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        let Value::Map(entries) = &self.node.value else {
            return Err(self.invalid_type("a mapping"));
        };
        let mut known = Vec::with_capacity(entries.len());
        for entry in entries {
            match entry.0.as_str() {
                Some(key) if !fields.contains(&key) => {
                    let diagnostic = Diagnostic::error(
                        Code::UnknownField,
                        &self.recovered.file,
                        entry.0.span,
                        format!("unknown field `{key}`"),
                    )
                    .with_hint(suggestion(key, fields));
                    self.recovered.diagnostics.borrow_mut().push(diagnostic);
                    if let Some(meant) = did_you_mean(key, fields.iter().copied()) {
                        let map = std::ptr::from_ref(self.node) as usize;
                        self.recovered.misspelt.borrow_mut().push((map, meant));
                    }
                }
                _ => known.push(entry),
            }
        }
        let access = MapAccess { entries: known.into_iter(), value: None, de: self };
        visitor.visit_map(access).map_err(|e: DeError| e.at(self.node))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        let (tag, value) = match &self.node.value {
            Value::Scalar { .. } => (self.node, None),
            Value::Map(entries) if entries.len() == 1 => (&entries[0].0, Some(&entries[0].1)),
            _ => {
                let list: Vec<String> = variants.iter().map(|v| format!("`{v}`")).collect();
                return Err(self.invalid_type(&format!(
                    "one of {} (a name, or a mapping with one of them as its only key)",
                    list.join(", ")
                )));
            }
        };
        let Some(name) = tag.as_str() else { return Err(self.child(tag).invalid_type("a name")) };
        if !variants.contains(&name) {
            return Err(DeError::new(
                format!("unknown variant `{name}`"),
                Some(variant_suggestion(name, variants)),
                ErrorKind::UnknownVariant { expected: variants },
            )
            .at(tag));
        }
        let access = EnumAccess { name, value, de: self };
        visitor.visit_enum(access).map_err(|e: DeError| e.at(self.node))
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_unit()
    }
}

struct SeqAccess<'a> {
    items: std::slice::Iter<'a, Node>,
    de: NodeDeserializer<'a>,
}

impl<'de> de::SeqAccess<'de> for SeqAccess<'_> {
    type Error = DeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DeError> {
        match self.items.next() {
            Some(node) => {
                seed.deserialize(self.de.child(node)).map(Some).map_err(|e: DeError| e.at(node))
            }
            None => Ok(None),
        }
    }
}

struct MapAccess<'a> {
    entries: std::vec::IntoIter<&'a (Node, Node)>,
    value: Option<&'a Node>,
    de: NodeDeserializer<'a>,
}

impl<'de> de::MapAccess<'de> for MapAccess<'_> {
    type Error = DeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        match self.entries.next() {
            Some((key, value)) => {
                self.value = Some(value);
                seed.deserialize(self.de.child(key)).map(Some).map_err(|e: DeError| e.at(key))
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        let node = self.value.take().expect("serde asks for a value after its key");
        seed.deserialize(self.de.child(node)).map_err(|e: DeError| e.at(node))
    }
}

struct EnumAccess<'a> {
    name: &'a str,
    value: Option<&'a Node>,
    de: NodeDeserializer<'a>,
}

impl<'de, 'a> de::EnumAccess<'de> for EnumAccess<'a> {
    type Error = DeError;
    type Variant = VariantAccess<'a>;

    fn variant_seed<V: DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, Self::Variant), DeError> {
        let name: de::value::StrDeserializer<'_, DeError> = self.name.into_deserializer();
        let variant = seed.deserialize(name)?;
        Ok((variant, VariantAccess { name: self.name, value: self.value, de: self.de }))
    }
}

struct VariantAccess<'a> {
    name: &'a str,
    value: Option<&'a Node>,
    de: NodeDeserializer<'a>,
}

impl VariantAccess<'_> {
    fn needs_value(&self) -> DeError {
        DeError::new(
            format!("`{}` needs a value: write `{}: ...`", self.name, self.name),
            None,
            ErrorKind::NeedsValue,
        )
        .at(self.de.node)
    }
}

impl<'de> de::VariantAccess<'de> for VariantAccess<'_> {
    type Error = DeError;

    fn unit_variant(self) -> Result<(), DeError> {
        match self.value {
            None | Some(Node { value: Value::Null, .. }) => Ok(()),
            Some(node) => {
                Err(<DeError as de::Error>::custom(format_args!("`{}` takes no value", self.name))
                    .at(node))
            }
        }
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, DeError> {
        let node = self.value.ok_or_else(|| self.needs_value())?;
        seed.deserialize(self.de.child(node)).map_err(|e: DeError| e.at(node))
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, DeError> {
        let node = self.value.ok_or_else(|| self.needs_value())?;
        de::Deserializer::deserialize_seq(self.de.child(node), visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        let node = self.value.ok_or_else(|| self.needs_value())?;
        de::Deserializer::deserialize_struct(self.de.child(node), "", fields, visitor)
    }
}
