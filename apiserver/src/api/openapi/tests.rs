//! What the documents say: the schemas, the operations and the kinds that
//! `kubectl explain` finds, in both versions. The serving, the v2 conversion
//! and the protobuf encoding have their own tests beside them.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::v2::object_at;
use super::*;
use crate::v1alpha1::Reconcile;

pub(super) fn openapi() -> Arc<OpenApi> {
    Arc::new(OpenApi::new().unwrap())
}

pub(super) fn v2_json(openapi: &OpenApi) -> Value {
    serde_json::from_slice(&openapi.v2.body).unwrap()
}

pub(super) fn v3_json(openapi: &OpenApi) -> Value {
    serde_json::from_slice(&openapi.v3_group_version.body).unwrap()
}

pub(super) fn gvk(kind: &str) -> Value {
    json!({ "group": GROUP, "version": VERSION, "kind": kind })
}

#[test]
fn both_documents_parse() {
    let openapi = openapi();
    let v3: openapiv3::OpenAPI = serde_json::from_slice(&openapi.v3_group_version.body).unwrap();
    assert_eq!(v3.openapi, "3.0.0");
    let schemas = &v3.components.as_ref().unwrap().schemas;
    for name in [
        "Plugin",
        "PluginList",
        "PluginSpec",
        "PluginStatus",
        "Reconcile",
        "ReconcileSpec",
        "ReconcileStatus",
    ] {
        assert!(
            schemas.contains_key(&format!("{SCHEMA_PREFIX}{name}")),
            "{name}"
        );
    }
    for name in ["ObjectMeta", "ListMeta", "Condition", "Time", "Status"] {
        assert!(schemas.contains_key(&format!("{META}{name}")), "{name}");
    }
    let collection = "/apis/plugins.kplug.io/v1alpha1/plugins";
    assert!(v3.paths.paths.contains_key(collection));
    for path in [
        format!("{collection}/{{name}}"),
        format!("{collection}/{{name}}/reconcile"),
        format!("{collection}/{{name}}/shadow"),
        "/apis/plugins.kplug.io/v1alpha1/reconciles".to_owned(),
        "/apis/plugins.kplug.io/v1alpha1/namespaces/{namespace}/reconciles".to_owned(),
    ] {
        assert!(v3.paths.paths.contains_key(&path), "{path}");
    }

    let v2 = v2_json(&openapi);
    assert_eq!(v2["swagger"], "2.0");
    assert!(v2["definitions"][format!("{META}ObjectMeta")].is_object());
    let list = &v2["paths"][collection]["get"];
    assert_eq!(list["x-kubernetes-action"], "list");
    assert_eq!(
        list["responses"]["200"]["schema"]["$ref"],
        format!("#/definitions/{SCHEMA_PREFIX}PluginList")
    );
    assert_eq!(list["produces"], json!([JSON, WATCH_JSON]));
    let delete = &v2["paths"][format!("{collection}/{{name}}")]["delete"];
    assert_eq!(delete["parameters"][0]["in"], "body");
    assert_eq!(delete["consumes"], json!([JSON]));
    // The name path parameter, with its type inline as v2 wants.
    let name = &v2["paths"][format!("{collection}/{{name}}")]["parameters"][0];
    assert_eq!(
        name,
        &json!({
            "name": "name", "in": "path", "required": true, "type": "string",
            "description": "name of the Plugin",
        })
    );
}

#[test]
fn kinds_carry_their_group_version_kind() {
    let openapi = openapi();
    let v3 = v3_json(&openapi);
    let v2 = v2_json(&openapi);
    for (kind, name) in [
        ("Plugin", "Plugin"),
        ("PluginList", "PluginList"),
        ("Reconcile", "Reconcile"),
        ("PluginShadow", "PluginShadow"),
    ] {
        let name = format!("{SCHEMA_PREFIX}{name}");
        let expected = json!([gvk(kind)]);
        assert_eq!(
            v3["components"]["schemas"][&name]["x-kubernetes-group-version-kind"],
            expected
        );
        assert_eq!(
            v2["definitions"][&name]["x-kubernetes-group-version-kind"],
            expected
        );
    }
    // kubectl explain (v3) finds the kind through the operations.
    for (path, method) in [("", "get"), ("/{name}", "get"), ("/{name}", "delete")] {
        let path = format!("/apis/{GROUP}/{VERSION}/plugins{path}");
        for document in [&v3, &v2] {
            assert_eq!(
                document["paths"][&path][method]["x-kubernetes-group-version-kind"],
                gvk("Plugin"),
                "{method} {path}"
            );
        }
    }
    let shadow = format!("/apis/{GROUP}/{VERSION}/plugins/{{name}}/shadow");
    for document in [&v3, &v2] {
        assert_eq!(
            document["paths"][&shadow]["get"]["x-kubernetes-group-version-kind"],
            gvk("PluginShadow"),
            "get {shadow}"
        );
    }
    for path in [
        "plugins/{name}/reconcile",
        "reconciles",
        "namespaces/{namespace}/reconciles",
    ] {
        let path = format!("/apis/{GROUP}/{VERSION}/{path}");
        for document in [&v3, &v2] {
            assert_eq!(
                document["paths"][&path]["post"]["x-kubernetes-group-version-kind"],
                gvk("Reconcile"),
                "post {path}"
            );
        }
    }
    // Only the kinds carry one: kubectl explain must find a single schema.
    let carriers: Vec<&String> = object_at(&v3, &["components", "schemas"])
        .iter()
        .filter(|(_, schema)| schema.get("x-kubernetes-group-version-kind").is_some())
        .map(|(name, _)| name)
        .collect();
    assert_eq!(carriers.len(), 4, "{carriers:?}");
}

#[test]
fn reconciles_are_created_by_post() {
    let openapi = openapi();
    let v3 = v3_json(&openapi);
    let v2 = v2_json(&openapi);
    let reconcile = format!("{SCHEMA_PREFIX}Reconcile");
    let status = format!("{META}Status");
    for (path, id) in [
        (
            "plugins/{name}/reconcile",
            "createPluginsKplugIoV1alpha1PluginReconcile",
        ),
        ("reconciles", "createPluginsKplugIoV1alpha1Reconcile"),
        (
            "namespaces/{namespace}/reconciles",
            "createPluginsKplugIoV1alpha1NamespacedReconcile",
        ),
    ] {
        let path = format!("/apis/{GROUP}/{VERSION}/{path}");
        let item = v2["paths"][&path].as_object().unwrap();
        let methods: Vec<&String> = item.keys().filter(|k| *k != "parameters").collect();
        assert_eq!(methods, ["post"], "{path}");
        let post = &item["post"];
        assert_eq!(post["operationId"], id);
        assert_eq!(post["x-kubernetes-action"], "post");
        assert_eq!(post["consumes"], json!([JSON]));
        assert_eq!(post["produces"], json!([JSON]));
        let parameters = post["parameters"].as_array().unwrap();
        let body = parameters.iter().find(|p| p["in"] == "body").unwrap();
        assert_eq!(body["required"], true);
        assert_eq!(body["schema"]["$ref"], format!("#/definitions/{reconcile}"));
        for name in ["dryRun", "fieldValidation"] {
            let query = parameters.iter().find(|p| p["name"] == name).unwrap();
            assert_eq!(query["in"], "query", "{name}");
            assert_eq!(query["type"], "string", "{name}");
        }

        let responses = post["responses"].as_object().unwrap();
        let codes: Vec<&str> = responses.keys().map(String::as_str).collect();
        assert_eq!(
            codes,
            [
                "201", "400", "401", "403", "404", "413", "415", "422", "429", "500", "503", "504"
            ]
        );
        assert_eq!(
            responses["201"]["schema"]["$ref"],
            format!("#/definitions/{reconcile}")
        );
        for (code, response) in responses {
            assert!(response["description"].is_string(), "{code}");
            if code.starts_with(['4', '5']) && code != "401" {
                assert_eq!(
                    response["schema"]["$ref"],
                    format!("#/definitions/{status}"),
                    "{code}"
                );
            }
        }
        // And in v3, the same with content types.
        let post = &v3["paths"][&path]["post"];
        assert_eq!(
            post["requestBody"]["content"][JSON]["schema"]["$ref"],
            format!("{V3_SCHEMA_REF}{reconcile}")
        );
        assert_eq!(
            post["responses"]["503"]["content"][JSON]["schema"]["$ref"],
            format!("{V3_SCHEMA_REF}{status}")
        );
    }
    for (path, parameter) in [
        ("plugins/{name}/reconcile", "name"),
        ("namespaces/{namespace}/reconciles", "namespace"),
    ] {
        let path = format!("/apis/{GROUP}/{VERSION}/{path}");
        let named = &v2["paths"][&path]["parameters"][0];
        assert_eq!(
            (&named["name"], &named["in"], &named["required"]),
            (&json!(parameter), &json!("path"), &json!(true)),
            "{path}"
        );
    }
}

/// The objects a Reconcile carries are whatever the plugin's API
/// defines: their schemas keep every field instead of pruning.
#[test]
fn embedded_objects_are_free_form() {
    let openapi = openapi();
    for (document, defs) in [
        (v3_json(&openapi), "/components/schemas"),
        (v2_json(&openapi), "/definitions"),
    ] {
        for (schema, field, embedded) in [
            ("ReconcileSpec", "/properties/object", true),
            ("ReconcileSpec", "/properties/extensions/items", true),
            ("ReconcileStatus", "/properties/objectStatus", false),
            ("ExtensionStatus", "/properties/status", false),
            ("ObservedChild", "/properties/object", true),
            ("DesiredChild", "/properties/object", true),
        ] {
            let at = format!("{defs}/{SCHEMA_PREFIX}{schema}{field}");
            let value = document.pointer(&at).unwrap();
            assert_eq!(value["type"], "object", "{at}");
            assert_eq!(value["x-kubernetes-preserve-unknown-fields"], true, "{at}");
            assert!(value.get("properties").is_none(), "{at}");
            assert_eq!(
                value.get("x-kubernetes-embedded-resource").is_some(),
                embedded,
                "{at}"
            );
        }
        let spec = document
            .pointer(&format!("{defs}/{SCHEMA_PREFIX}ReconcileSpec/properties"))
            .unwrap();
        let timeout = &spec["timeoutSeconds"];
        assert_eq!(
            (
                &timeout["minimum"],
                &timeout["maximum"],
                &timeout["default"]
            ),
            (&json!(1), &json!(300), &json!(30))
        );
        assert_eq!(spec["operation"]["enum"], json!(["Reconcile", "Finalize"]));
    }
}

/// The schemas follow the Rust types: every field a Reconcile
/// serialises to is described, enums list every variant, and required
/// fields are always there.
#[test]
fn reconcile_schema_follows_the_rust_types() {
    use crate::v1alpha1::{
        ApiSelector, ChildScope, DesiredChild, ExtensionStatus, ObjectRef, ObservedChild,
        PluginRef, RawObject, ReconcileResult, ReconcileSpec, ReconcileStatus, ResultCondition,
        Selection, SelectionReason,
    };

    let raw =
        |value: &Value| -> RawObject { serde_json::value::to_raw_value(value).expect("raw JSON") };
    let v3 = v3_json(&openapi());
    let schemas = object_at(&v3, &["components", "schemas"]);
    let object = json!({
        "apiVersion": "example.com/v1", "kind": "Thing",
        "metadata": { "name": "a" }, "spec": { "any": [1, { "deep": null }] },
    });
    let full = Reconcile {
        api_version: crate::v1alpha1::API_VERSION.to_owned(),
        kind: Reconcile::KIND.to_owned(),
        metadata: Default::default(),
        spec: ReconcileSpec {
            operation_name: Some("Finalize".into()),
            dry_run: true,
            timeout_seconds: Some(10),
            object: Some(raw(&object)),
            object_ref: None,
            extensions: vec![raw(&object)],
            api: Some(ApiSelector {
                group: "example.com".into(),
                resource: "things".into(),
                version: "v1".into(),
            }),
            preferred_implementation: Some("Impl".into()),
            required_implementation: Some("Impl".into()),
            version_constraint: Some(">=1.4, <2".into()),
            plugin: Some("p".into()),
            observed_children: vec![ObservedChild {
                key: "web".into(),
                object: raw(&object),
            }],
            child_scope: Some(ChildScope::Cluster),
        },
        status: Some(ReconcileStatus {
            plugin: PluginRef {
                name: "p".into(),
                version: "1.0.0".into(),
                implementation: "Impl".into(),
                instance: "p-0".into(),
                capabilities: vec!["Reconcile".into()],
            },
            selection: Selection {
                reason: SelectionReason::Fallback,
                message: "m".into(),
            },
            success: true,
            results: vec![ReconcileResult {
                severity: "Warning".into(),
                reason: "R".into(),
                message: "m".into(),
            }],
            conditions: vec![ResultCondition {
                type_: "Ready".into(),
                status: "True".into(),
                reason: "R".into(),
                message: "m".into(),
            }],
            object_status: Some(json!({ "phase": "Ready" })),
            extension_statuses: vec![ExtensionStatus {
                reference: ObjectRef {
                    api_version: "example.com/v1".into(),
                    kind: "Ext".into(),
                    namespace: "ns".into(),
                    name: "e".into(),
                },
                status: json!({ "ok": true }),
            }],
            requeue_after_seconds: Some(1.5),
            desired_children: vec![DesiredChild {
                key: "web".into(),
                object: object.clone(),
                ready: Some(true),
                wave: 1,
            }],
            operation_id: "id".into(),
            duration_milliseconds: 2.0,
        }),
    };
    // spec.object is the one required field of a request.
    let minimal = Reconcile {
        spec: ReconcileSpec {
            object: Some(raw(&object)),
            object_ref: None,
            ..ReconcileSpec::default()
        },
        status: Some(ReconcileStatus::default()),
        ..Reconcile::default()
    };

    /// Checks `value` against `schema`: known fields, required ones
    /// present, enum values listed. Returns the fields seen.
    fn walk(
        schemas: &Map<String, Value>,
        schema: &Value,
        value: &Value,
        at: &str,
        seen: &mut Vec<String>,
    ) {
        let schema = match schema
            .get("$ref")
            .or_else(|| schema.pointer("/allOf/0/$ref"))
            .and_then(Value::as_str)
        {
            Some(reference) => &schemas[reference.strip_prefix(V3_SCHEMA_REF).unwrap()],
            None => schema,
        };
        if schema["x-kubernetes-preserve-unknown-fields"] == true {
            return;
        }
        if let Some(allowed) = schema["enum"].as_array() {
            assert!(allowed.contains(value), "{at}: {value} not in {allowed:?}");
        }
        match value {
            Value::Object(fields) => {
                for required in schema["required"].as_array().into_iter().flatten() {
                    let required = required.as_str().unwrap();
                    assert!(fields.contains_key(required), "{at}.{required} missing");
                }
                for (name, field) in fields {
                    let at = format!("{at}.{name}");
                    let property = schema["properties"]
                        .get(name)
                        .unwrap_or_else(|| panic!("{at} is not in the schema"));
                    seen.push(at.clone());
                    walk(schemas, property, field, &at, seen);
                }
            }
            Value::Array(items) => {
                for item in items {
                    walk(schemas, &schema["items"], item, &format!("{at}[]"), seen);
                }
            }
            _ => {}
        }
    }

    let root = &schemas[&format!("{SCHEMA_PREFIX}Reconcile")];
    let mut seen = Vec::new();
    walk(
        schemas,
        root,
        &serde_json::to_value(&full).unwrap(),
        "",
        &mut seen,
    );
    assert!(seen.contains(&".status.extensionStatuses[].ref.namespace".to_owned()));
    assert!(seen.contains(&".spec.observedChildren[].key".to_owned()));
    assert!(seen.contains(&".spec.childScope".to_owned()));
    assert!(seen.contains(&".status.desiredChildren[].wave".to_owned()));
    walk(
        schemas,
        root,
        &serde_json::to_value(&minimal).unwrap(),
        "",
        &mut Vec::new(),
    );
    for operation in ["Reconcile", "Finalize"] {
        let spec = ReconcileSpec {
            operation_name: Some(operation.to_owned()),
            object: Some(raw(&object)),
            object_ref: None,
            ..ReconcileSpec::default()
        };
        let value = json!({ "spec": serde_json::to_value(&spec).unwrap() });
        walk(schemas, root, &value, "", &mut Vec::new());
    }
    for reason in [
        SelectionReason::Requested,
        SelectionReason::PreferredImplementation,
        SelectionReason::RequiredImplementation,
        SelectionReason::Fallback,
    ] {
        let selection = serde_json::to_value(Selection {
            reason,
            message: String::new(),
        })
        .unwrap();
        let schema = &schemas[&format!("{SCHEMA_PREFIX}Selection")];
        walk(schemas, schema, &selection, "selection", &mut Vec::new());
    }
    // The rules of selection are where kubectl explain reconciles.spec
    // shows them.
    let spec = schemas[&format!("{SCHEMA_PREFIX}ReconcileSpec")]["description"]
        .as_str()
        .unwrap();
    for word in [
        "Requested",
        "PreferredImplementation",
        "RequiredImplementation",
        "Fallback",
        "ignoring case",
        "highest version",
        "smallest name",
        "503",
    ] {
        assert!(spec.contains(word), "{word}");
    }
}

#[test]
fn conditions_are_a_map_keyed_by_type() {
    let openapi = openapi();
    for (document, prefix, defs) in [
        (v3_json(&openapi), V3_SCHEMA_REF, "/components/schemas"),
        (v2_json(&openapi), V2_SCHEMA_REF, "/definitions"),
    ] {
        let conditions = document
            .pointer(&format!(
                "{defs}/{SCHEMA_PREFIX}PluginStatus/properties/conditions"
            ))
            .unwrap();
        assert_eq!(conditions["x-kubernetes-list-type"], "map");
        assert_eq!(conditions["x-kubernetes-list-map-keys"], json!(["type"]));
        assert_eq!(
            conditions["items"]["$ref"],
            format!("{prefix}{META}Condition")
        );
    }
}

/// Every field of every schema explains itself, so that kubectl explain
/// never prints `<no description>`.
#[test]
fn every_schema_and_field_has_a_description() {
    let v3 = v3_json(&openapi());
    for (name, schema) in object_at(&v3, &["components", "schemas"]) {
        assert!(schema["description"].is_string(), "{name}");
        for (field, property) in object_at(schema, &["properties"]) {
            let description = property["description"].as_str().unwrap_or_default();
            assert!(!description.is_empty(), "{name}.{field}");
        }
    }
}
