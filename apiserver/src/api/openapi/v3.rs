//! The OpenAPI 3.0 document of the group-version: the embedded schemas
//! (`schemas.json`) and the path items of the operations kplug serves.

use serde_json::{Value, json};

use super::{JSON, META, OpenApiError, SCHEMA_PREFIX, V3_SCHEMA_REF, WATCH_JSON};
use crate::v1alpha1::{GROUP, Plugin, Reconcile, VERSION};
use kplug_api::shadow::PluginShadow;

/// The schemas, in OpenAPI v3 form: a `components` object.
const SCHEMAS: &str = include_str!("schemas.json");

/// The OpenAPI 3.0 document of the group-version.
pub(super) fn document() -> Result<openapiv3::OpenAPI, OpenApiError> {
    let components: openapiv3::Components =
        serde_json::from_str(SCHEMAS).map_err(OpenApiError::Schemas)?;
    let paths = path_items()
        .into_iter()
        .map(|(path, item)| {
            serde_json::from_value::<openapiv3::PathItem>(item)
                .map(|item| (path.clone(), openapiv3::ReferenceOr::Item(item)))
                .map_err(|source| OpenApiError::PathItem { path, source })
        })
        .collect::<Result<_, _>>()?;
    Ok(openapiv3::OpenAPI {
        openapi: "3.0.0".to_owned(),
        info: openapiv3::Info {
            title: "kplug".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            ..Default::default()
        },
        paths: openapiv3::Paths {
            paths,
            ..Default::default()
        },
        components: Some(components),
        ..Default::default()
    })
}

/// `plugins.kplug.io` -> `PluginsKplugIo`, `v1alpha1` -> `V1alpha1`.
fn camel_case(dotted: &str) -> String {
    dotted
        .split(['.', '-'])
        .flat_map(|word| {
            let mut chars = word.chars();
            chars
                .next()
                .map(|first| first.to_ascii_uppercase())
                .into_iter()
                .chain(chars)
        })
        .collect()
}

fn schema_ref(name: &str) -> Value {
    json!({ "$ref": format!("{V3_SCHEMA_REF}{name}") })
}

fn query(name: &str, kind: &str, description: &str) -> Value {
    json!({
        "name": name,
        "in": "query",
        "description": description,
        "schema": { "type": kind },
    })
}

/// The operations kplug serves, as OpenAPI v3 path items: list, watch, get
/// and delete of Plugins, and the create-only Reconciles.
fn path_items() -> Vec<(String, Value)> {
    let kind = Plugin::KIND;
    let collection = format!("/apis/{GROUP}/{VERSION}/{}", Plugin::PLURAL);
    let gvk = json!({ "group": GROUP, "version": VERSION, "kind": kind });
    // As kube-apiserver names operations, e.g. listPluginsKplugIoV1alpha1Plugin,
    // and tags them, e.g. pluginsKplugIo_v1alpha1.
    let group = camel_case(GROUP);
    let operation_id =
        |verb: &str, kind: &str| format!("{verb}{group}{}{kind}", camel_case(VERSION));
    let ids = |verb: &str| operation_id(verb, kind);
    let mut tag: Vec<char> = group.chars().collect();
    if let Some(first) = tag.first_mut() {
        first.make_ascii_lowercase();
    }
    let tags = json!([format!("{}_{VERSION}", tag.into_iter().collect::<String>())]);
    let plugin = format!("{SCHEMA_PREFIX}{kind}");
    let list = format!("{SCHEMA_PREFIX}{}", Plugin::LIST_KIND);
    let unauthorized = json!({ "description": "Unauthorized" });

    let list_params = vec![
        query(
            "allowWatchBookmarks",
            "boolean",
            "With watch: ask for BOOKMARK events, which carry only a resourceVersion, so that \
             a watch can resume after quiet periods.",
        ),
        query(
            "continue",
            "string",
            "The continue token of the previous page (metadata.continue), to receive the next \
             one. Use the same selectors.",
        ),
        query(
            "fieldSelector",
            "string",
            "Restricts the list to objects whose fields match. Only metadata.name is \
             supported, with =, == and !=, e.g. metadata.name=db-plugin. Defaults to \
             everything.",
        ),
        query(
            "labelSelector",
            "string",
            "Restricts the list to objects whose labels match, e.g. \
             kplug.io/implementation=postgresql. Defaults to everything.",
        ),
        query(
            "limit",
            "integer",
            "The most items to return. When more remain, metadata.continue is set to fetch \
             the next page.",
        ),
        query(
            "resourceVersion",
            "string",
            "Without watch: the version of the collection the list must be at least as new \
             as (\"0\" or unset: any). With watch: start after this version; the watch fails \
             with 410 Gone when it is older than the server's history.",
        ),
        query(
            "resourceVersionMatch",
            "string",
            "How resourceVersion applies to a list: NotOlderThan or Exact.",
        ),
        query(
            "sendInitialEvents",
            "boolean",
            "With watch: start with an ADDED event for every object that matches, then a \
             BOOKMARK annotated k8s.io/initial-events-end. Requires allowWatchBookmarks=true.",
        ),
        query(
            "timeoutSeconds",
            "integer",
            "With watch: end the watch after this many seconds.",
        ),
        query(
            "watch",
            "boolean",
            "Stream changes (ADDED, MODIFIED, DELETED) as WatchEvents instead of returning a \
             list.",
        ),
    ];

    vec![
        (
            collection.clone(),
            json!({
                "get": {
                    "tags": tags,
                    "description": format!("list or watch objects of kind {kind}"),
                    "operationId": ids("list"),
                    "parameters": list_params,
                    "responses": {
                        "200": {
                            "description": "OK",
                            "content": {
                                JSON: { "schema": schema_ref(&list) },
                                WATCH_JSON: { "schema": schema_ref(&format!("{META}WatchEvent")) },
                            },
                        },
                        "401": unauthorized,
                    },
                    "x-kubernetes-action": "list",
                    "x-kubernetes-group-version-kind": gvk,
                },
            }),
        ),
        (
            format!("{collection}/{{name}}"),
            json!({
                "parameters": [{
                    "name": "name",
                    "in": "path",
                    "description": format!("name of the {kind}"),
                    "required": true,
                    "schema": { "type": "string" },
                }],
                "get": {
                    "tags": tags,
                    "description": format!("read the specified {kind}"),
                    "operationId": ids("read"),
                    "responses": {
                        "200": {
                            "description": "OK",
                            "content": { JSON: { "schema": schema_ref(&plugin) } },
                        },
                        "401": unauthorized,
                    },
                    "x-kubernetes-action": "get",
                    "x-kubernetes-group-version-kind": gvk,
                },
                "delete": {
                    "tags": tags,
                    "description": format!(
                        "delete a {kind}: drop the registration at once instead of waiting for \
                         its TTL; a plugin that is still running registers again at its next \
                         heartbeat"
                    ),
                    "operationId": ids("delete"),
                    "requestBody": {
                        "content": {
                            JSON: { "schema": schema_ref(&format!("{META}DeleteOptions")) },
                        },
                    },
                    "responses": {
                        "200": {
                            "description": format!("OK: the {kind} as it was deleted"),
                            "content": { JSON: { "schema": schema_ref(&plugin) } },
                        },
                        "401": unauthorized,
                    },
                    "x-kubernetes-action": "delete",
                    "x-kubernetes-group-version-kind": gvk,
                },
            }),
        ),
        (
            format!("{collection}/{{name}}/reconcile"),
            json!({
                "parameters": [{
                    "name": "name",
                    "in": "path",
                    "description": format!("name of the {kind} to send the Reconcile to"),
                    "required": true,
                    "schema": { "type": "string" },
                }],
                "post": create_reconcile(
                    &tags,
                    &operation_id("create", &format!("{kind}{}", Reconcile::KIND)),
                    &format!(
                        "create a {reconcile}: send it to this {kind}, whatever spec.api and \
                         spec.preferredImplementation say, and answer with the plugin's \
                         outcome in status",
                        reconcile = Reconcile::KIND,
                    ),
                ),
            }),
        ),
        (
            format!("{collection}/{{name}}/shadow"),
            json!({
                "parameters": [{
                    "name": "name",
                    "in": "path",
                    "description": format!("name of the {kind}"),
                    "required": true,
                    "schema": { "type": "string" },
                }],
                "get": {
                    "tags": tags,
                    "description": format!(
                        "read how the shadow instances of the specified {kind} answered the \
                         dry-run copies of its reconciles, compared with the callers' answers"
                    ),
                    "operationId": operation_id("read", &format!("{kind}{}", PluginShadow::KIND)),
                    "responses": {
                        "200": {
                            "description": "OK",
                            "content": { JSON: { "schema": schema_ref(&format!("{SCHEMA_PREFIX}{}", PluginShadow::KIND)) } },
                        },
                        "401": unauthorized,
                        "404": {
                            "description": "Not Found: no Plugin has the requested name",
                            "content": { JSON: { "schema": schema_ref(&format!("{META}Status")) } },
                        },
                    },
                    "x-kubernetes-action": "get",
                    "x-kubernetes-group-version-kind": {
                        "group": GROUP,
                        "version": VERSION,
                        "kind": PluginShadow::KIND,
                    },
                },
            }),
        ),
        (
            format!("/apis/{GROUP}/{VERSION}/{}", Reconcile::PLURAL),
            json!({
                "post": create_reconcile(
                    &tags,
                    &operation_id("create", Reconcile::KIND),
                    &format!(
                        "create a {reconcile}: send it to the {kind} that kplug selects by \
                         spec.plugin, spec.api and spec.preferredImplementation, and answer \
                         with the plugin's outcome in status",
                        reconcile = Reconcile::KIND,
                    ),
                ),
            }),
        ),
        (
            format!(
                "/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/{}",
                Reconcile::PLURAL
            ),
            json!({
                "parameters": [{
                    "name": "namespace",
                    "in": "path",
                    "description": "object name and auth scope, such as for teams and projects",
                    "required": true,
                    "schema": { "type": "string" },
                }],
                "post": create_reconcile(
                    &tags,
                    &operation_id("create", &format!("Namespaced{}", Reconcile::KIND)),
                    &format!(
                        "create a {reconcile} of an object in this namespace: as a {reconcile} \
                         at the cluster scope, for a spec.object whose metadata.namespace is \
                         the namespace of the path, so that a RoleBinding in the namespace can \
                         grant it",
                        reconcile = Reconcile::KIND,
                    ),
                ),
            }),
        ),
    ]
}

/// The create operation of Reconciles (both paths): nothing is stored, the
/// answer is the Reconcile with the plugin's outcome, or a Status.
fn create_reconcile(tags: &Value, operation_id: &str, description: &str) -> Value {
    let reconcile = schema_ref(&format!("{SCHEMA_PREFIX}{}", Reconcile::KIND));
    let failure = |description: &str| {
        json!({
            "description": description,
            "content": { JSON: { "schema": schema_ref(&format!("{META}Status")) } },
        })
    };
    json!({
        "tags": tags,
        "description": description,
        "operationId": operation_id,
        "parameters": [
            query(
                "dryRun",
                "string",
                "When present, the plugin is asked to report what it would do without \
                 changing anything, as with spec.dryRun. The only valid value is All.",
            ),
            query(
                "fieldValidation",
                "string",
                "What to do with fields of the Reconcile or of its spec that it does not \
                 define: Ignore drops them; Warn, the default, drops them with a Warning \
                 header each; Strict fails the request with 400 Bad Request.",
            ),
        ],
        "requestBody": {
            "required": true,
            "content": { JSON: { "schema": reconcile } },
        },
        "responses": {
            "201": {
                "description": "Created: the Reconcile with the plugin's answer in status \
                                (status.success tells whether the operation succeeded)",
                "content": { JSON: { "schema": reconcile } },
            },
            "400": failure(
                "Bad Request: the body or a query parameter cannot be decoded, unknown \
                 fields with fieldValidation=Strict, metadata.namespace is not the \
                 namespace of the path, or the plugin does not support the operation or \
                 dry run",
            ),
            "401": { "description": "Unauthorized" },
            "403": failure(
                "Forbidden: the caller does not hold, on spec.object or an extension, the \
                 right a controller of that object holds (update on its status to \
                 reconcile it, on its finalizers to finalize it, get for a dry run and on \
                 each extension)",
            ),
            "404": failure("Not Found: no Plugin has the requested name"),
            "413": failure("Request Entity Too Large: the body is larger than the server accepts"),
            "415": failure("Unsupported Media Type: the body is not application/json"),
            "422": failure(
                "Invalid: spec.object or an extension is not a Kubernetes object, \
                 spec.object is not in the namespace of the path, spec.timeoutSeconds is out of range, spec.api is missing or not served by \
                 the requested plugin, spec.plugin contradicts the path, or the plugin \
                 rejected the object",
            ),
            "429": failure(
                "Too Many Requests: the plugin has too many calls in flight; retry after \
                 Retry-After",
            ),
            "500": failure("Internal Error: the plugin call failed, or its answer was invalid"),
            "503": failure(
                "Service Unavailable: no Ready plugin serves spec.api, the requested plugin \
                 is not Ready, or it cannot be reached; retry after Retry-After",
            ),
            "504": failure("Gateway Timeout: the plugin did not answer within spec.timeoutSeconds"),
        },
        "x-kubernetes-action": "post",
        "x-kubernetes-group-version-kind": {
            "group": GROUP,
            "version": VERSION,
            "kind": Reconcile::KIND,
        },
    })
}
