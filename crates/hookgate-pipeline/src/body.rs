//! How a delivery's body becomes the templates' `payload`: JSON, a form, or a form carrying
//! the JSON document in one field.

use crate::model::BodyFormat;

/// How a pipeline reads a delivery's body into `payload`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyReading {
    /// Always as this format.
    Fixed(BodyFormat),
    /// As the delivery's `Content-Type` says: a form as `form`, anything else as JSON.
    ByContentType { form: BodyFormat },
}

impl BodyReading {
    /// The format of one delivery. A sender with one documented body kind is read as that
    /// kind; the `Content-Type` is not signed, so it decides only where the pipeline leaves
    /// it open.
    pub fn format(self, content_type: Option<&String>) -> BodyFormat {
        match self {
            BodyReading::Fixed(format) => format,
            BodyReading::ByContentType { form } => {
                let is_form = content_type.is_some_and(|value| {
                    let media_type = value.split(';').next().unwrap_or("").trim();
                    media_type.eq_ignore_ascii_case("application/x-www-form-urlencoded")
                });
                if is_form { form } else { BodyFormat::Json }
            }
        }
    }
}

impl BodyFormat {
    /// The `payload` of a body in this format, or why it has none.
    pub fn read(self, body: &[u8]) -> Result<serde_json::Value, String> {
        match self {
            BodyFormat::Json => serde_json::from_slice(body).map_err(|e| e.to_string()),
            BodyFormat::Form => Ok(form_payload(body)),
            BodyFormat::FormPayload => {
                let mut documents = form_urlencoded::parse(body)
                    .filter(|(name, _)| name == FORM_PAYLOAD_FIELD)
                    .map(|(_, value)| value);
                match (documents.next(), documents.next()) {
                    (Some(document), None) => serde_json::from_str(&document)
                        .map_err(|e| format!("form field `{FORM_PAYLOAD_FIELD}`: {e}")),
                    (None, _) => Err(format!("form has no `{FORM_PAYLOAD_FIELD}` field")),
                    (Some(_), Some(_)) => {
                        Err(format!("form has more than one `{FORM_PAYLOAD_FIELD}` field"))
                    }
                }
            }
        }
    }
}

/// The form parameter that carries the JSON document of a `form_payload` body.
const FORM_PAYLOAD_FIELD: &str = "payload";

pub fn form_payload(body: &[u8]) -> serde_json::Value {
    let mut object = serde_json::Map::new();
    for (name, value) in form_urlencoded::parse(body) {
        let value = serde_json::Value::String(value.into_owned());
        match object.get_mut(name.as_ref()) {
            None => {
                object.insert(name.into_owned(), value);
            }
            Some(serde_json::Value::Array(values)) => values.push(value),
            Some(first) => {
                let first = first.take();
                object.insert(name.into_owned(), serde_json::Value::Array(vec![first, value]));
            }
        }
    }
    serde_json::Value::Object(object)
}
