//! Masking what operators see of a stored payload (`redact:`). The stored payload is never
//! changed: the worker renders from it. Views (`events show --body`, and whatever shows a
//! body or headers to people) pass it through a [`Redaction`] first.

use std::borrow::Cow;

/// What a masked value is replaced by.
pub const MASK: &str = "[redacted]";

/// Masked values at least this long are also masked where they are echoed.
pub const ECHO_CHARS_MIN: usize = 4;

/// `text` with every occurrence of `values`, as written or as in a JSON string, replaced by
/// [`MASK`].
pub fn mask_echoes<'a>(text: &'a str, values: &[String]) -> Cow<'a, str> {
    let mut out = Cow::Borrowed(text);
    for value in values {
        let quoted = serde_json::to_string(value).unwrap_or_default();
        let escaped = &quoted[1..quoted.len().saturating_sub(1).max(1)];
        for form in [value.as_str(), escaped] {
            if !form.is_empty() && out.contains(form) {
                out = Cow::Owned(out.replace(form, MASK));
            }
        }
    }
    out
}

/// A pipeline's `redact:` rules, compiled.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Redaction {
    /// Each pointer as its unescaped segments; `*` matches any member or item.
    body: Vec<Vec<String>>,
    /// Lowercased header names.
    headers: Vec<String>,
    /// Pointers into objects that refreshes fetch, masked in the answers kept as evidence.
    source: Vec<Vec<String>>,
}

/// A body as it may be shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShownBody<'a> {
    /// Nothing to mask, or nothing matched: the body as stored.
    AsStored(&'a [u8]),
    /// JSON with the listed members masked (re-serialised, so spacing may differ).
    Masked(Vec<u8>),
    /// The pipeline masks members of its bodies, and this one is not JSON: it is not shown,
    /// since what should be masked cannot be found in it.
    Withheld,
}

impl Redaction {
    pub fn new(pointers: &[String], headers: &[String], source: &[String]) -> Redaction {
        let segments = |pointers: &[String]| -> Vec<Vec<String>> {
            pointers
                .iter()
                .filter_map(|p| p.strip_prefix('/'))
                .map(|rest| {
                    rest.split('/').map(|s| s.replace("~1", "/").replace("~0", "~")).collect()
                })
                .collect()
        };
        let headers = headers.iter().map(|h| h.to_ascii_lowercase()).collect();
        Redaction { body: segments(pointers), headers, source: segments(source) }
    }

    pub fn is_empty(&self) -> bool {
        self.body.is_empty() && self.headers.is_empty() && self.source.is_empty()
    }

    /// The body with every member a pointer names replaced by [`MASK`].
    pub fn body<'a>(&self, body: &'a [u8]) -> ShownBody<'a> {
        masked(&self.body, body)
    }

    /// A refresh's answer, kept as evidence, with every member a `source` pointer names
    /// masked. An answer cut at the excerpt bound is no longer JSON: it is withheld.
    pub fn source_answer<'a>(&self, answer: &'a str) -> ShownBody<'a> {
        masked(&self.source, answer.as_bytes())
    }

    /// The values this redaction masks in a stored payload (`body` pointers) and in the
    /// fetched objects (`source` pointers, each a refresh's answer): what must not show
    /// through elsewhere either, such as in a CRM's answer that echoes a written field. Values
    /// shorter than [`ECHO_CHARS_MIN`] are left out: masking `1` or `no` everywhere would
    /// hide the story without protecting anything.
    pub fn masked_values(&self, payload: &[u8], sources: &[&str]) -> Vec<String> {
        let mut values = Vec::new();
        let mut take = |pointers: &[Vec<String>], bytes: &[u8]| {
            if pointers.is_empty() {
                return;
            }
            if let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) {
                for pointer in pointers {
                    collect(&value, pointer, &mut values);
                }
            }
        };
        take(&self.body, payload);
        for source in sources {
            take(&self.source, source.as_bytes());
        }
        values.retain(|v| v.chars().count() >= ECHO_CHARS_MIN);
        values.sort();
        values.dedup();
        values
    }

    /// Whether a header's value is masked.
    pub fn masks_header(&self, name: &str) -> bool {
        self.headers.iter().any(|h| h.eq_ignore_ascii_case(name))
    }

    /// Header pairs with masked values.
    pub fn header_pairs<'a>(&self, pairs: &'a [[String; 2]]) -> Vec<[Cow<'a, str>; 2]> {
        pairs
            .iter()
            .map(|[name, value]| {
                let value = if self.masks_header(name) {
                    Cow::Borrowed(MASK)
                } else {
                    Cow::Borrowed(value.as_str())
                };
                [Cow::Borrowed(name.as_str()), value]
            })
            .collect()
    }
}

fn masked<'a>(pointers: &[Vec<String>], body: &'a [u8]) -> ShownBody<'a> {
    if pointers.is_empty() || body.is_empty() {
        return ShownBody::AsStored(body);
    }
    let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return ShownBody::Withheld;
    };
    let mut count = 0;
    for pointer in pointers {
        count += mask(&mut value, pointer);
    }
    if count == 0 {
        return ShownBody::AsStored(body);
    }
    ShownBody::Masked(serde_json::to_vec(&value).unwrap_or_else(|_| MASK.as_bytes().to_vec()))
}

/// Every scalar under what `path` names, as text.
fn collect(value: &serde_json::Value, path: &[String], out: &mut Vec<String>) {
    let Some((first, rest)) = path.split_first() else {
        scalars(value, out);
        return;
    };
    match value {
        serde_json::Value::Object(map) if first == "*" => {
            map.values().for_each(|v| collect(v, rest, out))
        }
        serde_json::Value::Object(map) => {
            if let Some(v) = map.get(first) {
                collect(v, rest, out);
            }
        }
        serde_json::Value::Array(items) if first == "*" => {
            items.iter().for_each(|v| collect(v, rest, out))
        }
        serde_json::Value::Array(items) => {
            if let Some(v) = first.parse::<usize>().ok().and_then(|i| items.get(i)) {
                collect(v, rest, out);
            }
        }
        _ => {}
    }
}

fn scalars(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::String(s) => out.push(s.clone()),
        serde_json::Value::Number(n) => out.push(n.to_string()),
        serde_json::Value::Object(map) => map.values().for_each(|v| scalars(v, out)),
        serde_json::Value::Array(items) => items.iter().for_each(|v| scalars(v, out)),
        serde_json::Value::Bool(_) | serde_json::Value::Null => {}
    }
}

/// Masks what `path` names under `value`; returns how many values were masked.
fn mask(value: &mut serde_json::Value, path: &[String]) -> usize {
    let Some((first, rest)) = path.split_first() else {
        *value = serde_json::Value::String(MASK.to_owned());
        return 1;
    };
    match value {
        serde_json::Value::Object(map) if first == "*" => {
            map.values_mut().map(|v| mask(v, rest)).sum()
        }
        serde_json::Value::Object(map) => map.get_mut(first).map_or(0, |v| mask(v, rest)),
        serde_json::Value::Array(items) if first == "*" => {
            items.iter_mut().map(|v| mask(v, rest)).sum()
        }
        serde_json::Value::Array(items) => {
            first.parse::<usize>().ok().and_then(|i| items.get_mut(i)).map_or(0, |v| mask(v, rest))
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(pointers: &[&str], headers: &[&str]) -> Redaction {
        let own = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        Redaction::new(&own(pointers), &own(headers), &own(pointers))
    }

    #[test]
    fn named_members_and_wildcards_are_masked_and_the_rest_kept() {
        let redaction = rules(&["/customer/email", "/items/*/card", "/a~1b"], &[]);
        let body = br#"{"customer":{"email":"ann@example.com","name":"Ann"},"items":[{"card":"4242","sku":"x"},{"card":{"n":1}}],"a/b":1}"#;
        let ShownBody::Masked(shown) = redaction.body(body) else { panic!("not masked") };
        let shown: serde_json::Value = serde_json::from_slice(&shown).unwrap();
        assert_eq!(
            shown,
            serde_json::json!({"customer":{"email":MASK,"name":"Ann"},"items":[{"card":MASK,"sku":"x"},{"card":MASK}],"a/b":MASK})
        );
    }

    #[test]
    fn bodies_without_the_members_are_shown_as_stored_and_others_withheld() {
        let redaction = rules(&["/customer/email"], &[]);
        assert_eq!(redaction.body(br#"{"id":1}"#), ShownBody::AsStored(br#"{"id":1}"#));
        assert_eq!(redaction.body(b"email=ann%40example.com"), ShownBody::Withheld);
        assert_eq!(rules(&[], &[]).body(b"not json"), ShownBody::AsStored(b"not json"));
        // A purged payload is empty: nothing to withhold.
        assert_eq!(redaction.body(b""), ShownBody::AsStored(b""));
    }

    #[test]
    fn masked_values_are_masked_where_they_are_echoed() {
        let redaction = rules(&["/customer/email", "/customer/pin"], &[]);
        let payload = br#"{"customer":{"email":"ann@example.com","pin":12,"name":"Ann \"A\""}}"#;
        let source = r#"{"customer":{"email":"ann.new@example.com"}}"#;
        let values = redaction.masked_values(payload, &[source, "{cut"]);
        // `12` is too short to mask everywhere.
        assert_eq!(values, ["ann.new@example.com", "ann@example.com"]);
        let answer = r#"{"email":"ann.new@example.com","old":"ann@example.com","id":12}"#;
        assert_eq!(
            mask_echoes(answer, &values),
            r#"{"email":"[redacted]","old":"[redacted]","id":12}"#
        );
        // A value with characters JSON escapes is found in its escaped form too.
        let quoted = vec!["say \"hi\"".to_owned()];
        assert_eq!(mask_echoes(r#"{"m":"say \"hi\""}"#, &quoted), r#"{"m":"[redacted]"}"#);
    }

    #[test]
    fn header_values_are_masked_by_name_whatever_the_case() {
        let redaction = rules(&[], &["X-Customer-Email"]);
        let pairs = [
            ["x-customer-email".to_owned(), "ann@example.com".to_owned()],
            ["x-request-id".to_owned(), "r1".to_owned()],
        ];
        let shown = redaction.header_pairs(&pairs);
        assert_eq!(shown[0][1], MASK);
        assert_eq!(shown[1][1], "r1");
    }
}
