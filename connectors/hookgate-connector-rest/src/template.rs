//! The templates of a REST instance: compiled once at start, rendered per call.
//!
//! Two kinds, told apart by the template's name:
//! - `*.url`: every printed value is percent-encoded as one path segment, so a value cannot
//!   add segments, a query or a host; the rendered path is then checked segment by segment.
//! - `*.body`: every printed value is written as JSON, so a value cannot break the document
//!   or add members; the result is parsed before it is sent.
//!
//! Like the pipeline's templates: strict undefined, bounded work, bounded output.

use std::borrow::Cow;
use std::collections::BTreeSet;

use minijinja::value::{Value, ValueKind};
use minijinja::{AutoEscape, Environment, UndefinedBehavior};

/// Work one render may do, in minijinja fuel units.
const FUEL_MAX: u64 = 100_000;
/// Nested calls and blocks.
const RECURSION_MAX: usize = 32;
/// Bytes of a rendered URL path and query.
pub(crate) const URL_BYTES_MAX: usize = 8 * 1024;
/// Bytes of a rendered body.
pub(crate) const BODY_BYTES_MAX: usize = 1024 * 1024;

/// Variables of upsert templates.
pub(crate) const UPSERT_VARIABLES: &[&str] =
    &["object", "external_id_field", "external_id_value", "fields", "operation", "idempotency_key"];
/// Variables of lookup templates.
pub(crate) const LOOKUP_VARIABLES: &[&str] =
    &["object", "external_id_field", "external_id_value", "fields"];
/// Functions minijinja provides that templates may call.
const BUILTIN_FUNCTIONS: &[&str] = &["range", "dict", "namespace"];

const URL_ESCAPE: &str = "url";

pub(crate) fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_fuel(Some(FUEL_MAX));
    env.set_recursion_limit(RECURSION_MAX);
    env.set_auto_escape_callback(|name| {
        if name.ends_with(".url") {
            AutoEscape::Custom(Cow::Borrowed(URL_ESCAPE))
        } else if name.ends_with(".body") {
            AutoEscape::Json
        } else {
            AutoEscape::None
        }
    });
    env.set_formatter(|out, state, value| match state.auto_escape() {
        AutoEscape::Custom(name) if name == URL_ESCAPE => {
            // Only what `urlencode` made is printed as it is. Anything else is encoded, even a
            // value marked safe (`| safe`, `| tojson`): a payload value must never add a `?`,
            // `&` or `/` to the URL.
            let text = match value.downcast_object_ref::<Encoded>() {
                Some(encoded) => encoded.0.clone(),
                None => encode_segment(&plain(value)),
            };
            // An empty value would leave an empty segment, or turn a record's URL into its
            // collection's (`/contacts/`): almost surely a missing external id.
            if text.is_empty() {
                return Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    "a value printed in a URL is empty",
                ));
            }
            out.write_str(&text).map_err(Into::into)
        }
        _ => minijinja::escape_formatter(out, state, value),
    });
    // minijinja's own `urlencode` keeps `/` (as Jinja's does), which would let a value add
    // path segments; this one encodes everything but unreserved characters, and marks its
    // result safe so the URL formatter does not encode it twice.
    env.add_filter("urlencode", |value: Value| -> Value {
        let encoded = if value.kind() == ValueKind::Map {
            let mut pairs = Vec::new();
            if let Ok(keys) = value.try_iter() {
                for key in keys {
                    let item = value.get_item(&key).unwrap_or_default();
                    if item.is_none() || item.is_undefined() {
                        continue;
                    }
                    pairs.push(format!(
                        "{}={}",
                        encode_segment(&plain(&key)),
                        encode_segment(&plain(&item))
                    ));
                }
            }
            pairs.join("&")
        } else {
            encode_segment(&plain(&value))
        };
        Value::from_object(Encoded(encoded))
    });
    env
}

/// Text `urlencode` made: already encoded, so the URL formatter prints it as it is.
#[derive(Debug)]
struct Encoded(String);

impl minijinja::value::Object for Encoded {
    fn render(self: &std::sync::Arc<Self>, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A value as text in a URL: JSON's spelling for booleans, nothing for none.
fn plain(value: &Value) -> String {
    match value.kind() {
        ValueKind::Bool => if value.is_true() { "true" } else { "false" }.to_owned(),
        ValueKind::None | ValueKind::Undefined => String::new(),
        _ => value.to_string(),
    }
}

/// Percent-encodes all but RFC 3986's unreserved characters.
pub(crate) fn encode_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Decodes `%XX` escapes; a `%` not followed by two hex digits stays as it is.
pub(crate) fn decode_segment(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(high), Some(low)) =
                (bytes.get(i + 1).and_then(|b| hex(*b)), bytes.get(i + 2).and_then(|b| hex(*b)))
        {
            // Two hex digits are at most 0xFF.
            out.push(u8::try_from(high * 16 + low).unwrap_or(b'?'));
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Checks a template's source before compiling it: what no rendering could fix.
pub(crate) fn check_url_source(source: &str) -> Result<(), String> {
    if !source.starts_with('/') || source.starts_with("//") {
        return Err(format!(
            "`{source}` must be a path that starts with one `/` (the scheme and host come from \
             base_url)"
        ));
    }
    if source.contains('#') {
        return Err("a URL sent to an API has no `#fragment`".into());
    }
    Ok(())
}

/// Compiles a template and checks that it uses only `variables`.
pub(crate) fn compile(
    env: &mut Environment<'static>,
    name: &str,
    source: &str,
    variables: &[&str],
) -> Result<(), String> {
    env.add_template_owned(name.to_owned(), source.to_owned()).map_err(|e| describe(&e))?;
    let template = env.get_template(name).map_err(|e| describe(&e))?;
    let unknown: BTreeSet<String> = template
        .undeclared_variables(false)
        .into_iter()
        .filter(|v| !variables.contains(&v.as_str()) && !BUILTIN_FUNCTIONS.contains(&v.as_str()))
        .collect();
    if !unknown.is_empty() {
        let unknown: Vec<String> = unknown.into_iter().map(|v| format!("`{v}`")).collect();
        return Err(format!(
            "unknown variable {}; the variables are {}",
            unknown.join(", "),
            variables.iter().map(|v| format!("`{v}`")).collect::<Vec<_>>().join(", ")
        ));
    }
    Ok(())
}

/// A minijinja error as one line: its kind, its detail and where (`in upsert.url:1`).
pub(crate) fn describe(error: &minijinja::Error) -> String {
    error.to_string()
}

/// Checks a rendered path (and query): it starts with one `/`, and no segment is `.` or `..`,
/// empty (but the last), or holds `/` or `\` once decoded. This holds whatever a template
/// printed; values themselves are encoded whole (only `urlencode`'s output is not encoded
/// again), so a value cannot add a `?` or a segment.
pub(crate) fn check_rendered_path(rendered: &str) -> Result<(), String> {
    if rendered.len() > URL_BYTES_MAX {
        return Err(format!("the rendered URL is longer than {URL_BYTES_MAX} bytes"));
    }
    if !rendered.starts_with('/') || rendered.starts_with("//") {
        return Err("the rendered URL must be a path that starts with one `/`".into());
    }
    if rendered.contains('#') || rendered.contains('\\') {
        return Err("the rendered URL holds `#` or `\\`".into());
    }
    let path = rendered.split_once('?').map_or(rendered, |(path, _)| path);
    let segments: Vec<&str> = path[1..].split('/').collect();
    for (i, segment) in segments.iter().enumerate() {
        let decoded = decode_segment(segment);
        if segment.is_empty() && i + 1 < segments.len() {
            return Err(format!("the rendered path `{path}` has an empty segment"));
        }
        if decoded == "." || decoded == ".." {
            return Err(format!("the rendered path `{path}` has a `{decoded}` segment"));
        }
        if decoded.contains('/') || decoded.contains('\\') {
            return Err(format!(
                "the rendered path `{path}` has a segment that holds `/` or `\\` once decoded"
            ));
        }
        if decoded.chars().any(char::is_control) {
            return Err(format!("the rendered path `{path}` holds a control character"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn render(source: &str, context: Value) -> Result<String, String> {
        let mut env = environment();
        compile(&mut env, "t.url", source, UPSERT_VARIABLES)?;
        let template = env.get_template("t.url").map_err(|e| describe(&e))?;
        template.render(context).map_err(|e| describe(&e))
    }

    #[test]
    fn url_values_are_encoded_once_as_one_segment() {
        let context = minijinja::context! { object => "contacts", external_id_value => "a/b c@d" };
        assert_eq!(
            render("/o/{{ object }}/{{ external_id_value }}", context.clone()).unwrap(),
            "/o/contacts/a%2Fb%20c%40d"
        );
        assert_eq!(
            render("/o/{{ external_id_value | urlencode }}", context).unwrap(),
            "/o/a%2Fb%20c%40d",
            "an explicit urlencode is not encoded twice"
        );
    }

    #[test]
    fn paths_that_leave_their_place_are_refused() {
        for bad in ["/a/../b", "/a/%2e%2E/b", "/a/./b", "/a/x%2Fy", "/a//b", "//host/x", "/a\\b"] {
            assert!(check_rendered_path(bad).is_err(), "{bad} must be refused");
        }
        for good in ["/a/b", "/a/b/", "/a/b?x=..%2F", "/a/b.c", "/a/%40"] {
            assert!(check_rendered_path(good).is_ok(), "{good} must pass");
        }
    }

    #[test]
    fn decoding_keeps_a_stray_percent() {
        assert_eq!(decode_segment("100%"), "100%");
        assert_eq!(decode_segment("%zz%41"), "%zzA");
        assert_eq!(decode_segment("%2"), "%2");
    }

    #[test]
    fn unknown_variables_fail_at_compile() {
        let mut env = environment();
        let error = compile(&mut env, "t.url", "/o/{{ externalid }}", UPSERT_VARIABLES);
        assert!(error.unwrap_err().contains("unknown variable `externalid`"));
    }
}
