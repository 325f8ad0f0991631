//! Types for templates: the shape of a sender's payload, declared as a JSON Schema or inferred
//! from sample payloads (the fixtures' bodies), and where a pipeline uses payload fields, so
//! that `check` can say "no such field" at the template or pointer, without running anything.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::diagnostic::{Code, Diagnostic, Span, did_you_mean};

/// How deep `$ref`s and nesting are followed; deeper is treated as "anything".
const SCHEMA_DEPTH_MAX: usize = 32;

#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// Nothing is known: any field may be there.
    Any,
    /// A string, number, boolean or null: it has no fields.
    Scalar,
    Array(Box<Shape>),
    Object {
        fields: BTreeMap<String, Field>,
        /// Whether a field not listed is unknown. Schemas close an object unless
        /// `additionalProperties` or `patternProperties` allows more; samples always do.
        closed: bool,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    pub shape: Shape,
    /// Present in every payload: listed in `required`, or in every sample.
    pub required: bool,
}

/// What a lookup of a field path found.
#[derive(Debug, PartialEq)]
pub enum Lookup {
    /// The field may be there; `always` when every payload has it.
    Found { always: bool },
    /// Segment `at` of the path is not a field of what precedes it; `known` lists what is.
    Unknown { at: usize, known: Vec<String> },
}

impl Shape {
    /// The shape a JSON Schema describes. Local `$ref`s (`#/$defs/...`) are followed;
    /// `allOf` adds fields (required in any branch), `anyOf`/`oneOf` offer fields (required
    /// only if in every branch).
    pub fn from_schema(schema: &Value) -> Shape {
        from_schema(schema, schema, 0)
    }

    /// The shape every sample has: an object's fields are those any sample has, required when
    /// every sample (that has the object) has them.
    pub fn infer<'a>(samples: impl IntoIterator<Item = &'a Value>) -> Shape {
        samples.into_iter().map(infer_one).reduce(merge).unwrap_or(Shape::Any)
    }

    pub fn lookup(&self, path: &[String]) -> Lookup {
        self.lookup_past(path, 0)
    }

    /// [`Shape::lookup`], where the first `known` segments are known to be there (a `when`
    /// has tested them), so only the rest decide whether the field always is.
    pub fn lookup_past(&self, path: &[String], known: usize) -> Lookup {
        let mut shape = self;
        let mut always = true;
        for (at, segment) in path.iter().enumerate() {
            match shape {
                Shape::Any => return Lookup::Found { always },
                Shape::Scalar => return Lookup::Unknown { at, known: Vec::new() },
                Shape::Array(items) => {
                    if segment.parse::<usize>().is_err() {
                        return Lookup::Unknown { at, known: Vec::new() };
                    }
                    always &= at < known;
                    shape = items;
                }
                Shape::Object { fields, closed } => match fields.get(segment) {
                    Some(field) => {
                        always &= field.required || at < known;
                        shape = &field.shape;
                    }
                    None if *closed => {
                        return Lookup::Unknown { at, known: fields.keys().cloned().collect() };
                    }
                    None => return Lookup::Found { always: false },
                },
            }
        }
        Lookup::Found { always }
    }
}

fn resolve<'a>(root: &'a Value, schema: &'a Value, depth: usize) -> Option<&'a Value> {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(reference) if depth < SCHEMA_DEPTH_MAX => {
            let pointer = reference.strip_prefix('#')?;
            resolve(root, root.pointer(pointer)?, depth + 1)
        }
        Some(_) => None,
        None => Some(schema),
    }
}

fn from_schema(root: &Value, schema: &Value, depth: usize) -> Shape {
    if depth >= SCHEMA_DEPTH_MAX {
        return Shape::Any;
    }
    let Some(schema) = resolve(root, schema, depth) else { return Shape::Any };
    let Some(object) = schema.as_object() else { return Shape::Any };
    let branches = |key: &str| -> Vec<Shape> {
        object
            .get(key)
            .and_then(Value::as_array)
            .map(|list| list.iter().map(|s| from_schema(root, s, depth + 1)).collect())
            .unwrap_or_default()
    };
    let all_of = branches("allOf");
    let mut any_of = branches("anyOf");
    any_of.extend(branches("oneOf"));

    let types: Vec<&str> = match object.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(list)) => list.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let is = |t: &str| types.contains(&t);
    let own = if is("object") || object.contains_key("properties") {
        let required: Vec<&str> = object
            .get("required")
            .and_then(Value::as_array)
            .map(|list| list.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let fields = object
            .get("properties")
            .and_then(Value::as_object)
            .map(|properties| {
                properties
                    .iter()
                    .map(|(name, schema)| {
                        let field = Field {
                            shape: from_schema(root, schema, depth + 1),
                            required: required.contains(&name.as_str()),
                        };
                        (name.clone(), field)
                    })
                    .collect()
            })
            .unwrap_or_default();
        // Closed when the schema says so, or lists its properties and says nothing that could
        // add more (JSON Schema itself leaves an object open unless told otherwise; a listed
        // set of properties is how schemas for webhooks are written, and typos are what this
        // is for).
        let says_closed = object.get("additionalProperties") == Some(&Value::Bool(false))
            || object.get("unevaluatedProperties") == Some(&Value::Bool(false));
        let may_add = [
            "additionalProperties",
            "unevaluatedProperties",
            "patternProperties",
            "if",
            "then",
            "else",
            "dependentSchemas",
        ]
        .iter()
        .any(|keyword| object.contains_key(*keyword));
        let closed = (says_closed && !object.contains_key("patternProperties"))
            || (object.contains_key("properties") && !may_add);
        if !closed && !object.contains_key("properties") {
            Some(Shape::Any)
        } else {
            Some(Shape::Object { fields, closed })
        }
    } else if is("array") || object.contains_key("items") {
        let items = object.get("items").map_or(Shape::Any, |s| from_schema(root, s, depth + 1));
        Some(Shape::Array(Box::new(items)))
    } else if !types.is_empty() && types.iter().all(|t| *t != "object" && *t != "array") {
        Some(Shape::Scalar)
    } else {
        None
    };

    let mut shape = own;
    for branch in all_of {
        shape = Some(match shape {
            None => branch,
            Some(shape) => intersect(shape, branch),
        });
    }
    if !any_of.is_empty() {
        let offered = any_of.into_iter().reduce(merge).unwrap_or(Shape::Any);
        shape = Some(match shape {
            None => offered,
            Some(shape) => intersect(shape, offered),
        });
    }
    shape.unwrap_or(Shape::Any)
}

/// Both at once (`allOf`): the fields of either, required if either requires them.
fn intersect(a: Shape, b: Shape) -> Shape {
    match (a, b) {
        (
            Shape::Object { fields: mut left, closed: a },
            Shape::Object { fields: right, closed: b },
        ) => {
            for (name, field) in right {
                match left.remove(&name) {
                    Some(existing) => {
                        let shape = intersect(existing.shape, field.shape);
                        left.insert(
                            name,
                            Field { shape, required: existing.required || field.required },
                        );
                    }
                    None => {
                        left.insert(name, field);
                    }
                }
            }
            // A closed branch lists only its own fields, which the other adds to.
            Shape::Object { fields: left, closed: a && b }
        }
        (Shape::Any, other) | (other, Shape::Any) => other,
        (a, _) => a,
    }
}

fn infer_one(sample: &Value) -> Shape {
    match sample {
        Value::Object(members) => Shape::Object {
            fields: members
                .iter()
                .map(|(name, value)| {
                    let field = Field { shape: infer_one(value), required: !value.is_null() };
                    (name.clone(), field)
                })
                .collect(),
            closed: true,
        },
        Value::Array(items) => {
            Shape::Array(Box::new(items.iter().map(infer_one).reduce(merge).unwrap_or(Shape::Any)))
        }
        _ => Shape::Scalar,
    }
}

/// Either one (samples, `anyOf`): the fields of either, required only if both require them.
fn merge(a: Shape, b: Shape) -> Shape {
    match (a, b) {
        (
            Shape::Object { fields: mut left, closed: a },
            Shape::Object { fields: right, closed: b },
        ) => {
            let mut merged = BTreeMap::new();
            for (name, field) in right {
                match left.remove(&name) {
                    Some(existing) => {
                        let shape = merge(existing.shape, field.shape);
                        let required = existing.required && field.required;
                        merged.insert(name, Field { shape, required });
                    }
                    None => {
                        merged.insert(name, Field { required: false, ..field });
                    }
                }
            }
            for (name, field) in left {
                merged.insert(name, Field { required: false, ..field });
            }
            Shape::Object { fields: merged, closed: a && b }
        }
        (Shape::Array(a), Shape::Array(b)) => Shape::Array(Box::new(merge(*a, *b))),
        (Shape::Scalar, Shape::Scalar) => Shape::Scalar,
        _ => Shape::Any,
    }
}

/// Where a pipeline reads a payload field.
#[derive(Debug, Clone, PartialEq)]
pub struct PayloadUse {
    /// `["data", "object", "email"]` for `payload.data.object.email` or `/data/object/email`.
    pub path: Vec<String>,
    /// As written: `payload.data.object.email`, or the pointer `/data/object/email`.
    pub shown: String,
    pub span: Span,
    /// The template or pointer it is in, by its place in the file: `targets[0].fields.email`.
    pub place: String,
    /// For the entity, version and external id, which every delivery a target takes needs.
    pub needed: bool,
    /// The template has its own fallback (`default`, `is defined`, an `if`).
    pub guarded: bool,
}

/// Where a payload's shape came from, for what diagnostics say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShapeSource {
    /// `payload_schema:` written in the pipeline: a contract, so a field it does not require
    /// that a write needs is an error.
    Declared,
    /// `payload_schema: fixtures`: samples, so such a field is a warning.
    Fixtures,
}

/// Every payload field `uses` names that `shape` does not have, and every needed field that
/// it does not promise (unless the template or the target's `when` guards it).
pub fn problems(
    file: &str,
    uses: &[PayloadUse],
    shape: &Shape,
    source: ShapeSource,
) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for using in uses {
        match shape.lookup_past(&using.path, known_by_when(using, uses)) {
            Lookup::Unknown { at, known } => {
                let missing = &using.path[at];
                let within = if at == 0 {
                    "the payload".to_owned()
                } else {
                    format!("`payload.{}`", using.path[..at].join("."))
                };
                let message = match source {
                    ShapeSource::Declared => format!(
                        "`{}`: the payload schema has no `{missing}` in {within}",
                        using.shown
                    ),
                    ShapeSource::Fixtures => format!(
                        "`{}`: no fixture's payload has `{missing}` in {within}",
                        using.shown
                    ),
                };
                let hint = match did_you_mean(missing, known.iter().map(String::as_str)) {
                    Some(candidate) => format!("did you mean `{candidate}`?"),
                    None if known.is_empty() => format!("{within} has no fields"),
                    None => {
                        let list: Vec<String> =
                            known.iter().take(12).map(|k| format!("`{k}`")).collect();
                        let more = if known.len() > 12 { ", …" } else { "" };
                        format!("{within} has {}{more}", list.join(", "))
                    }
                };
                out.push(
                    Diagnostic::error(Code::UnknownPayloadField, file, using.span, message)
                        .with_hint(hint),
                );
            }
            Lookup::Found { always: false } if using.needed && !using.guarded => {
                let message = format!(
                    "`{}` is needed by `{}`, but not every payload has it",
                    using.shown, using.place
                );
                let diagnostic = match source {
                    ShapeSource::Declared => {
                        Diagnostic::error(Code::UnguardedField, file, using.span, message)
                    }
                    ShapeSource::Fixtures => {
                        Diagnostic::warning(Code::UnguardedField, file, using.span, message)
                    }
                };
                let hint = format!(
                    "a delivery without it is refused (400): require it, add `| default(...)`, or limit the target with `when: {} is defined`",
                    using.shown
                );
                out.push(diagnostic.with_hint(hint));
            }
            Lookup::Found { .. } => {}
        }
    }
    out.dedup();
    out
}

/// How much of a target's external id path its `when` condition reads, and so has tested
/// (`when: payload.user is defined` guards `payload.user.email` as far as `user`).
fn known_by_when(using: &PayloadUse, uses: &[PayloadUse]) -> usize {
    let Some(target) = using.place.strip_suffix(".external_id.value") else { return 0 };
    let when = format!("{target}.when");
    uses.iter()
        .filter(|u| u.place == when && using.path.starts_with(&u.path))
        .map(|u| u.path.len())
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn path(text: &str) -> Vec<String> {
        text.split('.').map(str::to_owned).collect()
    }

    #[test]
    fn schemas_close_objects_follow_refs_and_know_what_is_required() {
        let schema = json!({
            "type": "object",
            "required": ["id", "data"],
            "properties": {
                "id": { "type": "string" },
                "data": { "$ref": "#/$defs/data" },
                "tags": { "type": "array", "items": { "type": "object", "properties": { "name": {} } } },
                "extra": { "type": "object", "additionalProperties": true }
            },
            "$defs": {
                "data": { "type": "object", "required": ["object"], "properties": {
                    "object": { "allOf": [
                        { "properties": { "email": { "type": "string" } }, "required": ["email"] },
                        { "properties": { "name": { "type": ["string", "null"] } } }
                    ] }
                } }
            }
        });
        let shape = Shape::from_schema(&schema);
        assert_eq!(shape.lookup(&path("id")), Lookup::Found { always: true });
        assert_eq!(shape.lookup(&path("data.object.email")), Lookup::Found { always: true });
        assert_eq!(shape.lookup(&path("data.object.name")), Lookup::Found { always: false });
        assert!(matches!(shape.lookup(&path("data.object.emial")), Lookup::Unknown { at: 2, .. }));
        assert!(matches!(shape.lookup(&path("id.length")), Lookup::Unknown { at: 1, .. }));
        assert_eq!(shape.lookup(&path("tags.0.name")), Lookup::Found { always: false });
        assert!(matches!(shape.lookup(&path("tags.first")), Lookup::Unknown { at: 1, .. }));
        assert_eq!(shape.lookup(&path("extra.anything.below")), Lookup::Found { always: false });
        match shape.lookup(&path("nope")) {
            Lookup::Unknown { at: 0, known } => assert_eq!(known, ["data", "extra", "id", "tags"]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn objects_are_open_unless_their_fields_are_listed_or_closed() {
        let schema = json!({ "type": "object", "properties": {
            "metadata": { "type": "object" },
            "prefixed": { "type": "object", "additionalProperties": false, "patternProperties": { "^x-": {} } },
            "closed": { "type": "object", "additionalProperties": false },
            "conditional": { "type": "object", "properties": { "kind": {} }, "if": {}, "then": { "properties": { "only_a": {} } } }
        } });
        let shape = Shape::from_schema(&schema);
        for open in ["metadata.plan", "prefixed.x-trace", "conditional.only_a", "conditional.kind"]
        {
            assert_eq!(shape.lookup(&path(open)), Lookup::Found { always: false }, "{open}");
        }
        assert!(matches!(shape.lookup(&path("closed.anything")), Lookup::Unknown { at: 1, .. }));
    }

    #[test]
    fn a_when_that_tests_a_parent_guards_a_needed_field_below_it() {
        let schema = json!({ "type": "object", "properties": {
            "user": { "type": "object", "required": ["email"], "properties": { "email": {}, "phone": {} } }
        } });
        let shape = Shape::from_schema(&schema);
        let at = Span::start();
        let using = |path: &str, place: &str, needed| PayloadUse {
            path: self::path(path),
            shown: format!("payload.{path}"),
            span: at,
            place: place.to_owned(),
            needed,
            guarded: false,
        };
        let external_id = "targets[0].external_id.value";
        let unguarded = [using("user.email", external_id, true)];
        assert_eq!(
            problems("p.yaml", &unguarded, &shape, ShapeSource::Declared)[0].code,
            Code::UnguardedField
        );
        let when_user =
            [using("user.email", external_id, true), using("user", "targets[0].when", false)];
        assert!(problems("p.yaml", &when_user, &shape, ShapeSource::Declared).is_empty());
        // `phone` may be missing even when `user` is there.
        let phone =
            [using("user.phone", external_id, true), using("user", "targets[0].when", false)];
        assert_eq!(problems("p.yaml", &phone, &shape, ShapeSource::Declared).len(), 1);
        // Another target's `when` guards nothing here.
        let other =
            [using("user.email", external_id, true), using("user", "targets[1].when", false)];
        assert_eq!(problems("p.yaml", &other, &shape, ShapeSource::Fixtures).len(), 1);
    }

    #[test]
    fn a_ref_cycle_is_bounded() {
        let schema = json!({ "$ref": "#/$defs/a", "$defs": { "a": { "$ref": "#/$defs/a" } } });
        assert_eq!(Shape::from_schema(&schema), Shape::Any);
        let nested = json!({ "$defs": { "n": { "type": "object", "properties": { "next": { "$ref": "#/$defs/n" } } } }, "$ref": "#/$defs/n" });
        let deep: Vec<String> = std::iter::repeat_n("next".to_owned(), 100).collect();
        assert_eq!(Shape::from_schema(&nested).lookup(&deep), Lookup::Found { always: false });
    }

    #[test]
    fn samples_make_fields_required_only_when_every_sample_has_them() {
        let samples = [
            json!({ "id": 1, "customer": { "email": "a@x", "phone": null }, "items": [{ "sku": "a" }] }),
            json!({ "id": 2, "customer": { "email": "b@x" }, "note": "x", "items": [] }),
        ];
        let shape = Shape::infer(&samples);
        assert_eq!(shape.lookup(&path("id")), Lookup::Found { always: true });
        assert_eq!(shape.lookup(&path("customer.email")), Lookup::Found { always: true });
        assert_eq!(shape.lookup(&path("customer.phone")), Lookup::Found { always: false });
        assert_eq!(shape.lookup(&path("note")), Lookup::Found { always: false });
        assert_eq!(shape.lookup(&path("items.0.sku")), Lookup::Found { always: false });
        assert!(matches!(shape.lookup(&path("customer.mail")), Lookup::Unknown { at: 1, .. }));
        assert_eq!(Shape::infer(&[]), Shape::Any);
    }
}
