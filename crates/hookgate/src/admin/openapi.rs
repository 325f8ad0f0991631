//! The admin API's OpenAPI 3.1 document, generated from the route table and the types'
//! schemas (schemars, JSON Schema 2020-12, which OpenAPI 3.1 uses as is). It is committed as
//! `schemas/admin.openapi.json` and checked fresh by `cargo xtask check`.

use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

use super::api::{ApiError, ROUTES};

/// The document.
pub fn document() -> Value {
    let settings = SchemaSettings::draft2020_12().with(|s| {
        s.definitions_path = "/components/schemas".into();
    });
    let mut generator = settings.into_generator();
    let error = generator.subschema_for::<ApiError>();
    let mut paths = Map::new();
    for route in ROUTES {
        let mut parameters: Vec<Value> = path_parameters(route.path);
        if let Some(query) = route.query {
            let schema = query(&mut generator).to_value();
            let required: Vec<&str> = schema["required"]
                .as_array()
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            if let Some(properties) = schema["properties"].as_object() {
                for (name, property) in properties {
                    let mut property = property.clone();
                    let description = property
                        .as_object_mut()
                        .and_then(|p| p.remove("description"))
                        .unwrap_or(Value::Null);
                    let mut parameter = json!({
                        "name": name,
                        "in": "query",
                        "required": required.contains(&name.as_str()),
                        "schema": property,
                    });
                    if !description.is_null() {
                        parameter["description"] = description;
                    }
                    parameters.push(parameter);
                }
            }
        }
        let answer = (route.answer)(&mut generator).to_value();
        let mut operation = json!({
            "operationId": route.operation,
            "summary": route.summary,
            "responses": {
                "200": { "description": "OK", "content": { "application/json": { "schema": answer } } },
                "400": { "description": "A filter, id or body is invalid: the message says which and why.", "content": { "application/json": { "schema": error.clone() } } },
                "401": { "description": "No valid token: no body." },
                "404": { "description": "No such event, pipeline or target.", "content": { "application/json": { "schema": error.clone() } } },
                "503": { "description": "The database is unavailable; retry.", "content": { "application/json": { "schema": error.clone() } } },
            },
        });
        if !parameters.is_empty() {
            operation["parameters"] = Value::Array(parameters);
        }
        if let Some(body) = route.body {
            operation["responses"]["413"] = json!({
                "description": "The body is over 64 KiB.",
                "content": { "application/json": { "schema": error.clone() } },
            });
            operation["requestBody"] = json!({
                "required": route.method == "post" && !route.path.ends_with("/pause"),
                "content": { "application/json": { "schema": body(&mut generator).to_value() } },
            });
        }
        let item = paths.entry(route.path).or_insert_with(|| json!({}));
        item[route.method] = operation;
    }
    let schemas: Map<String, Value> = generator.take_definitions(true).into_iter().collect();
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "hookgate admin API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Evidence, replay and pauses of a running hookgate. Served on the admin listener (`serve --admin-listen`, loopback by default) under `/api/v1`; every route needs `Authorization: Bearer <token>` (`HOOKGATE_ADMIN_TOKEN`).",
        },
        "servers": [{ "url": "/api/v1" }],
        "security": [{ "bearer": [] }],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
        },
    })
}

/// The `{name}` segments of a path, as required path parameters.
fn path_parameters(path: &str) -> Vec<Value> {
    path.split('/')
        .filter_map(|segment| segment.strip_prefix('{')?.strip_suffix('}'))
        .map(|name| {
            let schema = if name == "id" {
                json!({"type": "integer", "format": "int64"})
            } else {
                json!({"type": "string"})
            };
            json!({ "name": name, "in": "path", "required": true, "schema": schema })
        })
        .collect()
}
