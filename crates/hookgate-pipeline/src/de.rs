//! A serde deserializer over [`Node`] that keeps locations.
//!
//! Two things set it apart from a general-purpose YAML deserializer:
//! - every error carries the span of the node it concerns, so it becomes a
//!   `file:line:column` diagnostic;
//! - unknown fields do not stop deserialization. `deserialize_struct` is told the field names,
//!   so each unknown key is reported (with a did-you-mean hint) and skipped, and the rest of
//!   the file is still checked. One run reports every misspelt key in the file.

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeSeed, IntoDeserializer, Visitor};

use crate::diagnostic::{Diagnostic, Span, suggestion, variant_suggestion};
use crate::yaml::{Node, Style, Value};

#[derive(Debug)]
pub struct DeError {
    pub message: String,
    pub hint: Option<String>,
    pub span: Option<Span>,
}

impl DeError {
    fn at(mut self, span: Span) -> DeError {
        self.span.get_or_insert(span);
        self
    }

    pub fn into_diagnostic(self, file: &str, fallback: Span) -> Diagnostic {
        let diagnostic = Diagnostic::error(file, self.span.unwrap_or(fallback), self.message);
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
        DeError { message: msg.to_string(), hint: None, span: None }
    }

    fn unknown_variant(variant: &str, expected: &'static [&'static str]) -> Self {
        DeError {
            message: format!("unknown variant `{variant}`"),
            hint: Some(variant_suggestion(variant, expected)),
            span: None,
        }
    }

    fn unknown_field(field: &str, expected: &'static [&'static str]) -> Self {
        DeError {
            message: format!("unknown field `{field}`"),
            hint: Some(suggestion(field, expected)),
            span: None,
        }
    }

    fn missing_field(field: &'static str) -> Self {
        <DeError as de::Error>::custom(format_args!("missing field `{field}`"))
    }
}

/// Problems that did not stop deserialization (unknown fields).
#[derive(Debug, Default)]
pub struct Recovered {
    file: String,
    diagnostics: RefCell<Vec<Diagnostic>>,
}

impl Recovered {
    pub fn into_inner(self) -> Vec<Diagnostic> {
        self.diagnostics.into_inner()
    }
}

/// Deserializes `T` from `node`. Returns the value (if no hard error occurred) and every
/// diagnostic found on the way.
pub fn from_node<T: de::DeserializeOwned>(file: &str, node: &Node) -> (Option<T>, Vec<Diagnostic>) {
    let recovered = Recovered { file: file.to_owned(), diagnostics: RefCell::default() };
    let result = T::deserialize(NodeDeserializer { node, recovered: &recovered });
    let mut diagnostics = recovered.into_inner();
    match result {
        Ok(value) => (Some(value), diagnostics),
        Err(error) => {
            diagnostics.push(error.into_diagnostic(file, node.span));
            (None, diagnostics)
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
        DeError {
            message: format!("expected {expected}, found {found}"),
            hint: None,
            span: Some(self.node.span),
        }
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
            visitor.$visit(n).map_err(|e: DeError| e.at(self.node.span))
        }
    )*};
}

impl<'de> de::Deserializer<'de> for NodeDeserializer<'_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let span = self.node.span;
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
        result.map_err(|e: DeError| e.at(span))
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let b = self
            .plain()
            .and_then(parse_yaml_bool)
            .ok_or_else(|| self.invalid_type("`true` or `false`"))?;
        visitor.visit_bool(b).map_err(|e: DeError| e.at(self.node.span))
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
        visitor.visit_f64(x).map_err(|e: DeError| e.at(self.node.span))
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        // Any scalar reads as its text: `version: 1.0` is the string "1.0" when a string is
        // wanted. Null is not a string.
        let text = self.text().ok_or_else(|| self.invalid_type("a string"))?;
        visitor.visit_str(text).map_err(|e: DeError| e.at(self.node.span))
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
        visitor.visit_newtype_struct(self).map_err(|e: DeError| e.at(self.node.span))
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let Value::Seq(items) = &self.node.value else { return Err(self.invalid_type("a list")) };
        let access = SeqAccess { items: items.iter(), de: self };
        visitor.visit_seq(access).map_err(|e: DeError| e.at(self.node.span))
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
        visitor.visit_map(access).map_err(|e: DeError| e.at(self.node.span))
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
                        &self.recovered.file,
                        entry.0.span,
                        format!("unknown field `{key}`"),
                    )
                    .with_hint(suggestion(key, fields));
                    self.recovered.diagnostics.borrow_mut().push(diagnostic);
                }
                _ => known.push(entry),
            }
        }
        let access = MapAccess { entries: known.into_iter(), value: None, de: self };
        visitor.visit_map(access).map_err(|e: DeError| e.at(self.node.span))
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
            return Err(DeError {
                message: format!("unknown variant `{name}`"),
                hint: Some(variant_suggestion(name, variants)),
                span: Some(tag.span),
            });
        }
        let access = EnumAccess { name, value, de: self };
        visitor.visit_enum(access).map_err(|e: DeError| e.at(self.node.span))
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
            Some(node) => seed
                .deserialize(self.de.child(node))
                .map(Some)
                .map_err(|e: DeError| e.at(node.span)),
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
                seed.deserialize(self.de.child(key)).map(Some).map_err(|e: DeError| e.at(key.span))
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        let node = self.value.take().expect("serde asks for a value after its key");
        seed.deserialize(self.de.child(node)).map_err(|e: DeError| e.at(node.span))
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
        <DeError as de::Error>::custom(format_args!(
            "`{}` needs a value: write `{}: ...`",
            self.name, self.name
        ))
        .at(self.de.node.span)
    }
}

impl<'de> de::VariantAccess<'de> for VariantAccess<'_> {
    type Error = DeError;

    fn unit_variant(self) -> Result<(), DeError> {
        match self.value {
            None | Some(Node { value: Value::Null, .. }) => Ok(()),
            Some(node) => {
                Err(<DeError as de::Error>::custom(format_args!("`{}` takes no value", self.name))
                    .at(node.span))
            }
        }
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, DeError> {
        let node = self.value.ok_or_else(|| self.needs_value())?;
        seed.deserialize(self.de.child(node)).map_err(|e: DeError| e.at(node.span))
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
