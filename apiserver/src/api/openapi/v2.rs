//! The Swagger 2.0 document, derived from the serialised v3 one: references
//! rewritten to `#/definitions/`, single-reference `allOf` wrappers folded
//! into `$ref` with sibling description, `nullable` dropped, request bodies
//! turned into `body` parameters. Constructs Swagger 2.0 lacks are refused
//! at start-up rather than silently dropped.

use std::fmt::Write as _;

use serde_json::{Map, Value, json};

use super::{OpenApiError, V2_SCHEMA_REF, V3_SCHEMA_REF};

/// The Swagger 2.0 form of the serialised v3 document `v3`.
pub(super) fn swagger(v3: &Value) -> Result<Value, OpenApiError> {
    let mut definitions = Map::new();
    for (name, schema) in object_at(v3, &["components", "schemas"]) {
        definitions.insert(
            name.clone(),
            schema_v2(schema, &format!("definitions/{name}"))?,
        );
    }
    let mut paths = Map::new();
    for (path, item) in object_at(v3, &["paths"]) {
        paths.insert(path.clone(), path_item_v2(item, path)?);
    }
    Ok(json!({
        "swagger": "2.0",
        "info": v3.get("info").cloned().unwrap_or_else(|| json!({})),
        "paths": paths,
        "definitions": definitions,
    }))
}

/// The object at `path` in `value`, or an empty one.
pub(super) fn object_at<'a>(value: &'a Value, path: &[&str]) -> &'a Map<String, Value> {
    static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
    path.iter()
        .try_fold(value, |value, key| value.get(key))
        .and_then(Value::as_object)
        .unwrap_or_else(|| EMPTY.get_or_init(Map::new))
}

fn not_swagger2(location: &str, reason: impl Into<String>) -> OpenApiError {
    OpenApiError::NotSwagger2 {
        location: location.to_owned(),
        reason: reason.into(),
    }
}

fn path_item_v2(item: &Value, path: &str) -> Result<Value, OpenApiError> {
    let mut out = Map::new();
    for (key, value) in item.as_object().into_iter().flatten() {
        let at = format!("paths[{path}].{key}");
        match key.as_str() {
            "get" | "put" | "post" | "delete" | "options" | "head" | "patch" => {
                out.insert(key.clone(), operation_v2(value, &at)?);
            }
            "parameters" => {
                out.insert(key.clone(), parameters_v2(value, &at)?);
            }
            "summary" | "description" => {}
            extension if extension.starts_with("x-") => {
                out.insert(key.clone(), value.clone());
            }
            other => {
                return Err(not_swagger2(
                    &at,
                    format!("unsupported path item field {other}"),
                ));
            }
        }
    }
    Ok(Value::Object(out))
}

fn operation_v2(operation: &Value, at: &str) -> Result<Value, OpenApiError> {
    let mut out = Map::new();
    let mut parameters = Vec::new();
    let mut produces: Vec<Value> = Vec::new();
    for (key, value) in operation.as_object().into_iter().flatten() {
        match key.as_str() {
            "tags" | "summary" | "description" | "operationId" | "deprecated" => {
                out.insert(key.clone(), value.clone());
            }
            "parameters" => {
                if let Value::Array(converted) = parameters_v2(value, at)? {
                    parameters.extend(converted);
                }
            }
            "requestBody" => {
                let (content_types, schema) = single_schema(value, &format!("{at}.requestBody"))?;
                let mut body = json!({ "name": "body", "in": "body", "schema": schema });
                for field in ["description", "required"] {
                    if let Some(v) = value.get(field) {
                        body[field] = v.clone();
                    }
                }
                parameters.push(body);
                out.insert("consumes".to_owned(), Value::Array(content_types));
            }
            "responses" => {
                let mut responses = Map::new();
                for (code, response) in value.as_object().into_iter().flatten() {
                    let at = format!("{at}.responses.{code}");
                    let mut converted = Map::new();
                    if let Some(description) = response.get("description") {
                        converted.insert("description".to_owned(), description.clone());
                    }
                    if response.get("content").is_some() {
                        let (content_types, schema) = single_schema(response, &at)?;
                        converted.insert("schema".to_owned(), schema);
                        for content_type in content_types {
                            if !produces.contains(&content_type) {
                                produces.push(content_type);
                            }
                        }
                    }
                    responses.insert(code.clone(), Value::Object(converted));
                }
                out.insert(key.clone(), Value::Object(responses));
            }
            extension if extension.starts_with("x-") => {
                out.insert(key.clone(), value.clone());
            }
            other => {
                return Err(not_swagger2(
                    at,
                    format!("unsupported operation field {other}"),
                ));
            }
        }
    }
    if !parameters.is_empty() {
        out.insert("parameters".to_owned(), Value::Array(parameters));
    }
    if !produces.is_empty() {
        out.insert("produces".to_owned(), Value::Array(produces));
    }
    Ok(Value::Object(out))
}

/// The content types of a v3 request body or response, and the schema of the
/// first (`application/json`, here): Swagger 2.0 has one schema per response.
fn single_schema(holder: &Value, at: &str) -> Result<(Vec<Value>, Value), OpenApiError> {
    let content = object_at(holder, &["content"]);
    let schema = content
        .values()
        .next()
        .and_then(|media| media.get("schema"))
        .ok_or_else(|| not_swagger2(at, "no content schema"))?;
    let content_types = content.keys().map(|k| Value::String(k.clone())).collect();
    Ok((content_types, schema_v2(schema, at)?))
}

/// Non-body parameters: v2 has the schema's type inline.
fn parameters_v2(parameters: &Value, at: &str) -> Result<Value, OpenApiError> {
    let mut out = Vec::new();
    for parameter in parameters.as_array().into_iter().flatten() {
        let mut converted = Map::new();
        for (key, value) in parameter.as_object().into_iter().flatten() {
            match key.as_str() {
                "name" | "in" | "description" | "required" => {
                    converted.insert(key.clone(), value.clone());
                }
                "schema" => {
                    if value.get("$ref").is_some() {
                        return Err(not_swagger2(at, "a non-body parameter cannot use $ref"));
                    }
                    for (field, v) in value.as_object().into_iter().flatten() {
                        if field != "description" {
                            converted.insert(field.clone(), v.clone());
                        }
                    }
                }
                // v3 serialisation details with no v2 counterpart.
                "style" | "explode" | "allowReserved" | "deprecated" => {}
                extension if extension.starts_with("x-") => {
                    converted.insert(key.clone(), value.clone());
                }
                other => {
                    return Err(not_swagger2(
                        at,
                        format!("unsupported parameter field {other}"),
                    ));
                }
            }
        }
        out.push(Value::Object(converted));
    }
    Ok(Value::Array(out))
}

/// A schema in Swagger 2.0 form: references to `#/definitions/`, a lone
/// `allOf: [{$ref}]` folded into `$ref` (kube-openapi writes v2 properties that
/// way, with their description beside the reference), v3-only keywords
/// dropped, and constructs v2 lacks refused.
fn schema_v2(schema: &Value, at: &str) -> Result<Value, OpenApiError> {
    let Some(fields) = schema.as_object() else {
        return Err(not_swagger2(at, "a schema must be an object"));
    };
    let mut out = Map::new();
    for (key, value) in fields {
        let at = format!("{at}.{key}");
        match key.as_str() {
            "$ref" => {
                let reference = value.as_str().unwrap_or_default();
                let name = reference.strip_prefix(V3_SCHEMA_REF).ok_or_else(|| {
                    not_swagger2(&at, format!("unsupported reference {reference}"))
                })?;
                out.insert(key.clone(), Value::String(format!("{V2_SCHEMA_REF}{name}")));
            }
            "properties" => {
                let mut properties = Map::new();
                for (name, property) in value.as_object().into_iter().flatten() {
                    properties.insert(name.clone(), schema_v2(property, &format!("{at}.{name}"))?);
                }
                out.insert(key.clone(), Value::Object(properties));
            }
            "items" => {
                out.insert(key.clone(), schema_v2(value, &at)?);
            }
            "additionalProperties" => {
                let converted = match value {
                    Value::Bool(_) => value.clone(),
                    _ => schema_v2(value, &at)?,
                };
                out.insert(key.clone(), converted);
            }
            "allOf" => {
                let members = value
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|member| schema_v2(member, &at))
                    .collect::<Result<Vec<_>, _>>()?;
                out.insert(key.clone(), Value::Array(members));
            }
            "nullable" | "writeOnly" | "deprecated" => {}
            "oneOf" | "anyOf" | "not" | "discriminator" => {
                return Err(not_swagger2(&at, "Swagger 2.0 has no such keyword"));
            }
            _ => {
                out.insert(key.clone(), value.clone());
            }
        }
    }
    let lone_ref = match out.get("allOf") {
        Some(Value::Array(members)) if members.len() == 1 => members
            .first()
            .and_then(Value::as_object)
            .filter(|member| member.len() == 1)
            .and_then(|member| member.get("$ref"))
            .cloned(),
        _ => None,
    };
    if let Some(reference) = lone_ref
        && !out.contains_key("$ref")
        && !out.contains_key("properties")
        && !out.contains_key("type")
    {
        out.remove("allOf");
        out.insert("$ref".to_owned(), reference);
    }
    Ok(Value::Object(out))
}

/// Checks that every `$ref` in `document` names a schema it defines under
/// `section` (`components.schemas` or `definitions`).
pub(super) fn check_refs(
    document: &'static str,
    value: &Value,
    prefix: &str,
    section: &[&str],
) -> Result<(), OpenApiError> {
    let defined = object_at(value, section);
    let mut pending = vec![(String::new(), value)];
    while let Some((location, value)) = pending.pop() {
        match value {
            Value::Object(fields) => {
                for (key, field) in fields {
                    if key == "$ref" {
                        let reference = field.as_str().unwrap_or_default();
                        let resolves = reference
                            .strip_prefix(prefix)
                            .is_some_and(|name| defined.contains_key(name));
                        if !resolves {
                            return Err(OpenApiError::UnresolvedRef {
                                document,
                                location,
                                reference: reference.to_owned(),
                            });
                        }
                    } else {
                        let mut at = location.clone();
                        let _ = write!(at, "/{key}");
                        pending.push((at, field));
                    }
                }
            }
            Value::Array(items) => {
                for (index, item) in items.iter().enumerate() {
                    pending.push((format!("{location}/{index}"), item));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::tests::{openapi, v2_json, v3_json};
    use super::super::{META, SCHEMA_PREFIX};
    use super::*;

    #[test]
    fn every_ref_resolves() {
        let openapi = openapi();
        let v3 = v3_json(&openapi);
        let v2 = v2_json(&openapi);
        check_refs("v3", &v3, V3_SCHEMA_REF, &["components", "schemas"]).unwrap();
        check_refs("v2", &v2, V2_SCHEMA_REF, &["definitions"]).unwrap();
        let v2_text = String::from_utf8(openapi.v2.body.to_vec()).unwrap();
        assert!(!v2_text.contains("#/components/"));
        assert!(!v2_text.contains("\"nullable\""));

        // And a dangling one is caught.
        let broken = json!({
            "components": { "schemas": { "A": { "$ref": "#/components/schemas/B" } } }
        });
        let error = check_refs("v3", &broken, V3_SCHEMA_REF, &["components", "schemas"]);
        assert!(
            matches!(error, Err(OpenApiError::UnresolvedRef { reference, .. })
            if reference == "#/components/schemas/B")
        );
    }

    #[test]
    fn v2_folds_single_reference_all_of() {
        let v2 = v2_json(&openapi());
        let metadata =
            &v2["definitions"][format!("{SCHEMA_PREFIX}Plugin")]["properties"]["metadata"];
        assert_eq!(metadata["$ref"], format!("#/definitions/{META}ObjectMeta"));
        assert!(
            metadata["description"]
                .as_str()
                .unwrap()
                .starts_with("Standard object metadata")
        );
        assert!(metadata.get("allOf").is_none());

        let converted = schema_v2(
            &json!({ "nullable": true, "type": "string", "description": "d" }),
            "test",
        )
        .unwrap();
        assert_eq!(converted, json!({ "type": "string", "description": "d" }));
        let refused = schema_v2(&json!({ "oneOf": [{ "type": "string" }] }), "test");
        assert!(matches!(refused, Err(OpenApiError::NotSwagger2 { .. })));
    }
}
