//! The OpenAPI documents of `plugins.kplug.io/v1alpha1`: what `kubectl
//! explain` reads, and what kube-apiserver's aggregator fetches and merges.
//!
//! Served as kube-openapi serves them:
//!
//! - `GET /openapi/v2`: one Swagger 2.0 document, as JSON (what the
//!   aggregator asks for) or as gnostic's protobuf `openapi.v2.Document`
//!   (what kubectl asks for: before 1.29, `kubectl explain` fails without it
//!   even though it renders from v3). Any other Accept gets 406.
//! - `GET /openapi/v3`: the index, `{"paths": {"apis/<group>/<version>":
//!   {"serverRelativeURL": "/openapi/v3/apis/<group>/<version>?hash=<HASH>"}}}`.
//!   The aggregator merges these indexes and proxies the URLs to us.
//! - `GET /openapi/v3/apis/plugins.kplug.io/v1alpha1`: the OpenAPI 3.0
//!   document of the group-version (JSON only), with ETag `"<HASH>"`. With a
//!   matching `?hash=` it may be cached for good (`Cache-Control: public,
//!   immutable` and a year's `Expires`, so kubectl does not even revalidate
//!   it); with a stale one the client is redirected to the current URL.
//!
//! Every answer carries a strong ETag (quoted content hash) and honours
//! `If-None-Match` with 304.
//!
//! The schemas have one source, `openapi/schemas.json`: an OpenAPI v3
//! `components` object with `#/components/schemas/` references. It is parsed
//! into `openapiv3` types for the v3 document, and the v2 document is derived
//! from the serialised v3 one (references rewritten to `#/definitions/`,
//! single-reference `allOf` wrappers folded into `$ref` with sibling
//! description, `nullable` dropped, request bodies turned into `body`
//! parameters), then encoded in protobuf. kubectl finds the schema to explain through the
//! `x-kubernetes-group-version-kind` of the path operations and of the
//! schemas, so both carry it.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use http::header::{
    ACCEPT, CACHE_CONTROL, CONTENT_TYPE, ETAG, EXPIRES, IF_NONE_MATCH, LOCATION, VARY,
};
use http::{HeaderMap, HeaderValue, StatusCode, Uri};
use serde_json::{Map, Value, json};

use crate::v1alpha1::{GROUP, Plugin, Reconcile, VERSION};

/// The schemas, in OpenAPI v3 form: a `components` object.
const SCHEMAS: &str = include_str!("openapi/schemas.json");

/// Name prefix of this group's schemas: the group reversed, then the version,
/// as Kubernetes names the schemas of custom resources.
const SCHEMA_PREFIX: &str = "io.kplug.plugins.v1alpha1.";
const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.";

const V3_SCHEMA_REF: &str = "#/components/schemas/";
const V2_SCHEMA_REF: &str = "#/definitions/";

const JSON: &str = "application/json";
const WATCH_JSON: &str = "application/json;stream=watch";
/// The protobuf form of the v2 document (gnostic's `openapi.v2.Document`).
const V2_PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";
/// What kubectl asks for; answered as [`V2_PROTOBUF`], as kube-openapi does.
const V2_PROTOBUF_DEPRECATED: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";

/// A group-version document's URL may be cached this long when it names the
/// document's hash (kube-openapi: one year).
const IMMUTABLE_FOR: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// Why the OpenAPI documents could not be built. Every variant is a bug in
/// the embedded schemas or in this module, caught at start-up.
#[derive(Debug, thiserror::Error)]
pub enum OpenApiError {
    #[error("openapi/schemas.json is not a valid OpenAPI v3 components object")]
    Schemas(#[source] serde_json::Error),
    #[error("the OpenAPI v3 path item {path} is not valid")]
    PathItem {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot serialise the OpenAPI {document} document")]
    Serialize {
        document: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "OpenAPI {document} document: {location} refers to {reference}, which it does not define"
    )]
    UnresolvedRef {
        document: &'static str,
        location: String,
        reference: String,
    },
    #[error("cannot express {location} in Swagger 2.0: {reason}")]
    NotSwagger2 { location: String, reason: String },
    #[error("cannot encode {location} of the Swagger 2.0 document in protobuf: {reason}")]
    NotProtobuf { location: String, reason: String },
}

/// One representation of a document as served.
#[derive(Debug)]
struct Served {
    body: Bytes,
    content_type: &'static str,
    /// Uppercase hex content hash of the JSON form, unquoted (the `?hash=`
    /// value).
    hash: String,
    /// `"<hash>"`, the ETag header value.
    etag: String,
}

impl Served {
    /// The JSON form of `value`, tagged with its own hash.
    fn json(document: &'static str, value: &impl serde::Serialize) -> Result<Self, OpenApiError> {
        let body = serde_json::to_vec(value)
            .map_err(|source| OpenApiError::Serialize { document, source })?;
        let hash = content_hash(&body);
        Ok(Self {
            body: Bytes::from(body),
            content_type: JSON,
            etag: format!("\"{hash}\""),
            hash,
        })
    }

    /// Another representation of the same document: kube-openapi tags every
    /// representation with the JSON form's hash (and sends `Vary: Accept`).
    fn alternative(&self, body: Vec<u8>, content_type: &'static str) -> Self {
        Self {
            body: Bytes::from(body),
            content_type,
            hash: self.hash.clone(),
            etag: self.etag.clone(),
        }
    }
}

/// The OpenAPI documents kplug serves, built once at start-up.
#[derive(Debug)]
pub struct OpenApi {
    v2: Served,
    v2_protobuf: Served,
    v3_index: Served,
    v3_group_version: Served,
}

impl OpenApi {
    /// Builds the v3 group-version document from the embedded schemas (typed
    /// with `openapiv3`), derives the v2 document from it, and checks that
    /// every reference in both resolves.
    pub fn new() -> Result<Self, OpenApiError> {
        let document = v3_document()?;
        let v3_value =
            serde_json::to_value(&document).map_err(|source| OpenApiError::Serialize {
                document: "v3",
                source,
            })?;
        check_refs("v3", &v3_value, V3_SCHEMA_REF, &["components", "schemas"])?;
        let v2_value = swagger(&v3_value)?;
        check_refs("v2", &v2_value, V2_SCHEMA_REF, &["definitions"])?;

        let v2 = Served::json("v2", &v2_value)?;
        let v2_protobuf = v2.alternative(gnostic_v2::document(&v2_value)?, V2_PROTOBUF);
        let v3_group_version = Served::json("v3", &document)?;
        let index = json!({
            "paths": {
                group_version_path(): {
                    "serverRelativeURL": group_version_url(&v3_group_version.hash),
                }
            }
        });
        Ok(Self {
            v2,
            v2_protobuf,
            v3_index: Served::json("v3 index", &index)?,
            v3_group_version,
        })
    }
}

/// Routes: `GET /openapi/v2`, `GET /openapi/v3` and
/// `GET /openapi/v3/apis/plugins.kplug.io/v1alpha1` (and HEAD of each).
pub fn router(openapi: Arc<OpenApi>) -> Router {
    Router::new()
        .route("/openapi/v2", get(serve_v2))
        .route("/openapi/v3", get(serve_v3_index))
        .route(
            &format!("/openapi/v3/{}", group_version_path()),
            get(serve_v3_group_version),
        )
        .with_state(openapi)
}

async fn serve_v2(State(openapi): State<Arc<OpenApi>>, headers: HeaderMap) -> Response {
    match negotiate(&headers, true) {
        Some(Format::Json) => respond(&openapi.v2, &headers, Caching::Revalidate, true),
        Some(Format::Protobuf) => {
            respond(&openapi.v2_protobuf, &headers, Caching::Revalidate, true)
        }
        None => not_acceptable(),
    }
}

/// kube-openapi serves the index whatever the Accept.
async fn serve_v3_index(State(openapi): State<Arc<OpenApi>>, headers: HeaderMap) -> Response {
    respond(&openapi.v3_index, &headers, Caching::Revalidate, false)
}

async fn serve_v3_group_version(
    State(openapi): State<Arc<OpenApi>>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    if negotiate(&headers, false).is_none() {
        return not_acceptable();
    }
    let served = &openapi.v3_group_version;
    match query_param(&uri, "hash") {
        Some(hash) if hash == served.hash => respond(served, &headers, Caching::Immutable, true),
        // A stale (or mistyped) hash: send the client to the current URL.
        Some(_) => {
            let mut response = StatusCode::MOVED_PERMANENTLY.into_response();
            if let Ok(location) = HeaderValue::try_from(group_version_url(&served.hash)) {
                response.headers_mut().insert(LOCATION, location);
            }
            response
        }
        None => respond(served, &headers, Caching::Revalidate, true),
    }
}

#[derive(Clone, Copy)]
enum Caching {
    /// Clients revalidate with the ETag.
    Revalidate,
    /// The URL names the content: it never changes.
    Immutable,
}

/// 200 with the document, or 304 when `If-None-Match` names its ETag.
fn respond(served: &Served, request: &HeaderMap, caching: Caching, vary: bool) -> Response {
    let mut headers = HeaderMap::new();
    // Hex digits in quotes: always a valid header value.
    if let Ok(etag) = HeaderValue::from_str(&served.etag) {
        headers.insert(ETAG, etag);
    }
    if vary {
        // The representation depends on Accept (kube-openapi also serves
        // protobuf there): keep caches from mixing them up.
        headers.insert(VARY, HeaderValue::from_static("Accept"));
    }
    if let Caching::Immutable = caching {
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("public, immutable"));
        if let Ok(expires) = HeaderValue::try_from(http_date(SystemTime::now() + IMMUTABLE_FOR)) {
            headers.insert(EXPIRES, expires);
        }
    }
    if if_none_match(request, &served.etag) {
        return (StatusCode::NOT_MODIFIED, headers).into_response();
    }
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(served.content_type));
    (StatusCode::OK, headers, served.body.clone()).into_response()
}

fn not_acceptable() -> Response {
    (
        StatusCode::NOT_ACCEPTABLE,
        [(VARY, HeaderValue::from_static("Accept"))],
    )
        .into_response()
}

/// Whether `If-None-Match` names `etag` (weak comparison, as RFC 9110 asks
/// for this header) or is `*`.
fn if_none_match(request: &HeaderMap, etag: &str) -> bool {
    request
        .get_all(IF_NONE_MATCH)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .any(|tag| tag == "*" || tag.strip_prefix("W/").unwrap_or(tag) == etag)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Json,
    Protobuf,
}

/// The representation `Accept` asks for, as kube-openapi picks it: the
/// ranges by quality (q = 0 excluded), the first that JSON, or protobuf when
/// `protobuf` is offered, satisfies; media type parameters aside. No Accept
/// means JSON.
fn negotiate(request: &HeaderMap, protobuf: bool) -> Option<Format> {
    let mut ranges: Vec<(f32, String)> = request
        .get_all(ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|range| {
            let mut parts = range.split(';').map(str::trim);
            let essence = parts.next().filter(|e| !e.is_empty())?.to_ascii_lowercase();
            let quality = parts
                .filter_map(|param| param.split_once('='))
                .find(|(name, _)| name.trim().eq_ignore_ascii_case("q"))
                .map_or(1.0, |(_, q)| q.trim().parse::<f32>().unwrap_or(0.0));
            Some((quality, essence))
        })
        .collect();
    if ranges.is_empty() {
        // No Accept, or an empty one: anything goes (kube-openapi: */*).
        return Some(Format::Json);
    }
    ranges.retain(|(quality, _)| *quality > 0.0);
    // Stable: equal qualities keep the client's order.
    ranges.sort_by(|a, b| b.0.total_cmp(&a.0));
    ranges
        .iter()
        .find_map(|(_, essence)| match essence.as_str() {
            "application/json" | "application/*" | "*/*" => Some(Format::Json),
            V2_PROTOBUF | V2_PROTOBUF_DEPRECATED if protobuf => Some(Format::Protobuf),
            _ => None,
        })
}

/// The first value of query parameter `name` (no percent-decoding: the
/// values this module reads are hex).
fn query_param<'a>(uri: &'a Uri, name: &str) -> Option<&'a str> {
    uri.query()?
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// `apis/<group>/<version>`: the key of the v3 index.
fn group_version_path() -> String {
    format!("apis/{GROUP}/{VERSION}")
}

fn group_version_url(hash: &str) -> String {
    format!("/openapi/v3/{}?hash={hash}", group_version_path())
}

/// 128-bit FNV-1a, as 32 uppercase hex digits: stable across Rust versions
/// and platforms (unlike `DefaultHasher`), and plenty for change detection.
fn content_hash(data: &[u8]) -> String {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    let hash = data.iter().fold(OFFSET, |hash, &byte| {
        (hash ^ u128::from(byte)).wrapping_mul(PRIME)
    });
    format!("{hash:032X}")
}

/// An HTTP date (RFC 9110 IMF-fixdate), e.g. `Sun, 06 Nov 1994 08:49:37 GMT`.
fn http_date(time: SystemTime) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let secs = time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = secs / 86_400;
    let (hour, minute, second) = (secs % 86_400 / 3600, secs % 3600 / 60, secs % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    // Both indices are in range by construction.
    let weekday = DAYS.get((days % 7) as usize).copied().unwrap_or("Thu");
    let month_name = MONTHS.get((month - 1) as usize).copied().unwrap_or("Jan");
    format!("{weekday}, {day:02} {month_name} {year} {hour:02}:{minute:02}:{second:02} GMT")
}

// ---------------------------------------------------------------------------
// The v3 document.

/// The OpenAPI 3.0 document of the group-version.
fn v3_document() -> Result<openapiv3::OpenAPI, OpenApiError> {
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
                 fields with fieldValidation=Strict, or the plugin does not support the \
                 operation or dry run",
            ),
            "401": { "description": "Unauthorized" },
            "404": failure("Not Found: no Plugin has the requested name"),
            "413": failure("Request Entity Too Large: the body is larger than the server accepts"),
            "415": failure("Unsupported Media Type: the body is not application/json"),
            "422": failure(
                "Invalid: spec.object or an extension is not a Kubernetes object, \
                 spec.timeoutSeconds is out of range, spec.api is missing or not served by \
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

// ---------------------------------------------------------------------------
// The v2 document, derived from the v3 one.

/// The Swagger 2.0 form of the serialised v3 document `v3`.
fn swagger(v3: &Value) -> Result<Value, OpenApiError> {
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
fn object_at<'a>(value: &'a Value, path: &[&str]) -> &'a Map<String, Value> {
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
fn check_refs(
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

// ---------------------------------------------------------------------------
// The v2 document in protobuf.

/// The v2 document as gnostic's `openapi.v2.Document` protobuf message
/// (github.com/google/gnostic, openapiv2/OpenAPIv2.proto), what kubectl
/// before 1.29 needs for `kubectl explain` and reads instead of the JSON.
///
/// Encoded by hand from the Swagger 2.0 JSON, for the constructs this
/// module emits: anything else is an error at start-up rather than silently
/// dropped. Values of type `Any` (extensions, `default`, `example`, `enum`)
/// carry their JSON text in the `yaml` field, as JSON is YAML.
mod gnostic_v2 {
    use serde_json::{Map, Value};

    use super::OpenApiError;

    type Result<T> = std::result::Result<T, OpenApiError>;

    fn unsupported(at: &str, what: impl std::fmt::Display) -> OpenApiError {
        OpenApiError::NotProtobuf {
            location: at.to_owned(),
            reason: what.to_string(),
        }
    }

    /// A protobuf message being written. Fields left at their proto3
    /// default are not written, except members of a `oneof`.
    #[derive(Default)]
    struct Message(Vec<u8>);

    impl Message {
        fn varint(&mut self, mut value: u64) {
            while value >= 0x80 {
                self.0.push((value & 0x7f) as u8 | 0x80);
                value >>= 7;
            }
            self.0.push(value as u8);
        }

        fn key(&mut self, field: u32, wire_type: u32) {
            self.varint(u64::from(field << 3 | wire_type));
        }

        fn bytes(&mut self, field: u32, bytes: &[u8]) {
            self.key(field, 2);
            self.varint(bytes.len() as u64);
            self.0.extend_from_slice(bytes);
        }

        fn string(&mut self, field: u32, value: &str) {
            if !value.is_empty() {
                self.bytes(field, value.as_bytes());
            }
        }

        /// A repeated string element: written even when empty.
        fn string_element(&mut self, field: u32, value: &str) {
            self.bytes(field, value.as_bytes());
        }

        fn message(&mut self, field: u32, message: Message) {
            self.bytes(field, &message.0);
        }

        fn boolean(&mut self, field: u32, value: bool) {
            if value {
                self.oneof_boolean(field, value);
            }
        }

        fn oneof_boolean(&mut self, field: u32, value: bool) {
            self.key(field, 0);
            self.varint(u64::from(value));
        }

        fn int64(&mut self, field: u32, value: i64) {
            if value != 0 {
                self.key(field, 0);
                // Two's complement, as protobuf encodes negative int64.
                self.varint(value as u64);
            }
        }

        fn double(&mut self, field: u32, value: f64) {
            if value != 0.0 {
                self.key(field, 1);
                self.0.extend_from_slice(&value.to_le_bytes());
            }
        }
    }

    fn object<'a>(value: &'a Value, at: &str) -> Result<&'a Map<String, Value>> {
        value
            .as_object()
            .ok_or_else(|| unsupported(at, "expected an object"))
    }

    fn text<'a>(value: &'a Value, at: &str) -> Result<&'a str> {
        value
            .as_str()
            .ok_or_else(|| unsupported(at, "expected a string"))
    }

    fn flag(value: &Value, at: &str) -> Result<bool> {
        value
            .as_bool()
            .ok_or_else(|| unsupported(at, "expected a boolean"))
    }

    fn number(value: &Value, at: &str) -> Result<f64> {
        value
            .as_f64()
            .ok_or_else(|| unsupported(at, "expected a number"))
    }

    fn integer(value: &Value, at: &str) -> Result<i64> {
        value
            .as_i64()
            .ok_or_else(|| unsupported(at, "expected an integer"))
    }

    fn strings<'a>(value: &'a Value, at: &str) -> Result<Vec<&'a str>> {
        value
            .as_array()
            .ok_or_else(|| unsupported(at, "expected an array of strings"))?
            .iter()
            .map(|item| text(item, at))
            .collect()
    }

    /// `Any { yaml = 2 }`.
    fn any(value: &Value) -> Message {
        let mut any = Message::default();
        any.string(2, &value.to_string());
        any
    }

    /// `NamedAny { name = 1; value = 2 }`, for a vendor extension.
    fn named_any(name: &str, value: &Value) -> Message {
        let mut named = Message::default();
        named.string(1, name);
        named.message(2, any(value));
        named
    }

    /// `Document`.
    pub(super) fn document(document: &Value) -> Result<Vec<u8>> {
        let mut message = Message::default();
        for (key, value) in object(document, "document")? {
            let at = key.as_str();
            match at {
                "swagger" => message.string(1, text(value, at)?),
                "info" => message.message(2, info(value)?),
                "paths" => message.message(8, paths(value)?),
                // Definitions { repeated NamedSchema additional_properties = 1 }
                "definitions" => message.message(9, named_schemas(value, at)?),
                key if key.starts_with("x-") => message.message(16, named_any(key, value)),
                other => return Err(unsupported("document", format!("field {other}"))),
            }
        }
        Ok(message.0)
    }

    fn info(info: &Value) -> Result<Message> {
        let mut message = Message::default();
        for (key, value) in object(info, "info")? {
            let at = format!("info.{key}");
            match key.as_str() {
                "title" => message.string(1, text(value, &at)?),
                "version" => message.string(2, text(value, &at)?),
                "description" => message.string(3, text(value, &at)?),
                key if key.starts_with("x-") => message.message(7, named_any(key, value)),
                _ => return Err(unsupported(&at, "unsupported field")),
            }
        }
        Ok(message)
    }

    /// `Paths { repeated NamedPathItem path = 2 }`.
    fn paths(paths: &Value) -> Result<Message> {
        let mut message = Message::default();
        for (path, item) in object(paths, "paths")? {
            let mut named = Message::default();
            named.string(1, path);
            named.message(2, path_item(item, &format!("paths[{path}]"))?);
            message.message(2, named);
        }
        Ok(message)
    }

    fn path_item(item: &Value, at: &str) -> Result<Message> {
        let mut message = Message::default();
        for (key, value) in object(item, at)? {
            let at = format!("{at}.{key}");
            let field = match key.as_str() {
                "get" => 2,
                "put" => 3,
                "post" => 4,
                "delete" => 5,
                "options" => 6,
                "head" => 7,
                "patch" => 8,
                "parameters" => {
                    parameters(&mut message, 9, value, &at)?;
                    continue;
                }
                key if key.starts_with("x-") => {
                    message.message(10, named_any(key, value));
                    continue;
                }
                _ => return Err(unsupported(&at, "unsupported field")),
            };
            message.message(field, operation(value, &at)?);
        }
        Ok(message)
    }

    fn operation(operation: &Value, at: &str) -> Result<Message> {
        let mut message = Message::default();
        for (key, value) in object(operation, at)? {
            let at = format!("{at}.{key}");
            match key.as_str() {
                "tags" => strings(value, &at)?
                    .into_iter()
                    .for_each(|tag| message.string_element(1, tag)),
                "summary" => message.string(2, text(value, &at)?),
                "description" => message.string(3, text(value, &at)?),
                "operationId" => message.string(5, text(value, &at)?),
                "produces" => strings(value, &at)?
                    .into_iter()
                    .for_each(|media| message.string_element(6, media)),
                "consumes" => strings(value, &at)?
                    .into_iter()
                    .for_each(|media| message.string_element(7, media)),
                "parameters" => parameters(&mut message, 8, value, &at)?,
                "responses" => message.message(9, responses(value, &at)?),
                "schemes" => strings(value, &at)?
                    .into_iter()
                    .for_each(|scheme| message.string_element(10, scheme)),
                "deprecated" => message.boolean(11, flag(value, &at)?),
                key if key.starts_with("x-") => message.message(13, named_any(key, value)),
                _ => return Err(unsupported(&at, "unsupported field")),
            }
        }
        Ok(message)
    }

    /// Each parameter as `ParametersItem { Parameter parameter = 1 }`, where
    /// `Parameter` is `oneof { BodyParameter = 1; NonBodyParameter = 2 }`.
    fn parameters(into: &mut Message, field: u32, list: &Value, at: &str) -> Result<()> {
        let list = list
            .as_array()
            .ok_or_else(|| unsupported(at, "expected an array"))?;
        for (index, parameter) in list.iter().enumerate() {
            let at = format!("{at}[{index}]");
            let location = parameter
                .get("in")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let mut one_of = Message::default();
            match location {
                "body" => one_of.message(1, body_parameter(parameter, &at)?),
                // NonBodyParameter: oneof { query = 3; path = 4 }.
                "query" => {
                    let mut non_body = Message::default();
                    non_body.message(3, non_body_parameter(parameter, &at, &QUERY_FIELDS)?);
                    one_of.message(2, non_body);
                }
                "path" => {
                    let mut non_body = Message::default();
                    non_body.message(4, non_body_parameter(parameter, &at, &PATH_FIELDS)?);
                    one_of.message(2, non_body);
                }
                other => return Err(unsupported(&at, format!("parameter in {other:?}"))),
            }
            let mut item = Message::default();
            item.message(1, one_of);
            into.message(field, item);
        }
        Ok(())
    }

    fn body_parameter(parameter: &Value, at: &str) -> Result<Message> {
        let mut message = Message::default();
        for (key, value) in object(parameter, at)? {
            let at = format!("{at}.{key}");
            match key.as_str() {
                "description" => message.string(1, text(value, &at)?),
                "name" => message.string(2, text(value, &at)?),
                "in" => message.string(3, text(value, &at)?),
                "required" => message.boolean(4, flag(value, &at)?),
                "schema" => message.message(5, schema(value, &at)?),
                key if key.starts_with("x-") => message.message(6, named_any(key, value)),
                _ => return Err(unsupported(&at, "unsupported field")),
            }
        }
        Ok(message)
    }

    /// Field numbers of `QueryParameterSubSchema` / `PathParameterSubSchema`.
    struct NonBodyFields {
        required: u32,
        location: u32,
        description: u32,
        name: u32,
        kind: u32,
        format: u32,
        unique_items: u32,
        vendor_extension: u32,
    }

    const QUERY_FIELDS: NonBodyFields = NonBodyFields {
        required: 1,
        location: 2,
        description: 3,
        name: 4,
        kind: 6,
        format: 7,
        unique_items: 20,
        vendor_extension: 23,
    };

    const PATH_FIELDS: NonBodyFields = NonBodyFields {
        required: 1,
        location: 2,
        description: 3,
        name: 4,
        kind: 5,
        format: 6,
        unique_items: 19,
        vendor_extension: 22,
    };

    fn non_body_parameter(parameter: &Value, at: &str, fields: &NonBodyFields) -> Result<Message> {
        let mut message = Message::default();
        for (key, value) in object(parameter, at)? {
            let at = format!("{at}.{key}");
            match key.as_str() {
                "required" => message.boolean(fields.required, flag(value, &at)?),
                "in" => message.string(fields.location, text(value, &at)?),
                "description" => message.string(fields.description, text(value, &at)?),
                "name" => message.string(fields.name, text(value, &at)?),
                "type" => message.string(fields.kind, text(value, &at)?),
                "format" => message.string(fields.format, text(value, &at)?),
                "uniqueItems" => message.boolean(fields.unique_items, flag(value, &at)?),
                key if key.starts_with("x-") => {
                    message.message(fields.vendor_extension, named_any(key, value));
                }
                _ => return Err(unsupported(&at, "unsupported field")),
            }
        }
        Ok(message)
    }

    /// `Responses { repeated NamedResponseValue response_code = 1 }`, each
    /// value `ResponseValue { Response response = 1 }`.
    fn responses(responses: &Value, at: &str) -> Result<Message> {
        let mut message = Message::default();
        for (code, response) in object(responses, at)? {
            let at = format!("{at}.{code}");
            if code.starts_with("x-") {
                message.message(2, named_any(code, response));
                continue;
            }
            let mut body = Message::default();
            for (key, value) in object(response, &at)? {
                let at = format!("{at}.{key}");
                match key.as_str() {
                    "description" => body.string(1, text(value, &at)?),
                    // SchemaItem { oneof { Schema schema = 1 } }
                    "schema" => {
                        let mut item = Message::default();
                        item.message(1, schema(value, &at)?);
                        body.message(2, item);
                    }
                    key if key.starts_with("x-") => body.message(5, named_any(key, value)),
                    _ => return Err(unsupported(&at, "unsupported field")),
                }
            }
            let mut one_of = Message::default();
            one_of.message(1, body);
            let mut named = Message::default();
            named.string(1, code);
            named.message(2, one_of);
            message.message(1, named);
        }
        Ok(message)
    }

    /// A message whose field 1 is `repeated NamedSchema` (`Definitions`,
    /// `Properties`).
    fn named_schemas(schemas: &Value, at: &str) -> Result<Message> {
        let mut message = Message::default();
        for (name, value) in object(schemas, at)? {
            let mut named = Message::default();
            named.string(1, name);
            named.message(2, schema(value, &format!("{at}.{name}"))?);
            message.message(1, named);
        }
        Ok(message)
    }

    fn schema(schema: &Value, at: &str) -> Result<Message> {
        let mut message = Message::default();
        for (key, value) in object(schema, at)? {
            let at = format!("{at}.{key}");
            match key.as_str() {
                "$ref" => message.string(1, text(value, &at)?),
                "format" => message.string(2, text(value, &at)?),
                "title" => message.string(3, text(value, &at)?),
                "description" => message.string(4, text(value, &at)?),
                "default" => message.message(5, any(value)),
                "multipleOf" => message.double(6, number(value, &at)?),
                "maximum" => message.double(7, number(value, &at)?),
                "exclusiveMaximum" => message.boolean(8, flag(value, &at)?),
                "minimum" => message.double(9, number(value, &at)?),
                "exclusiveMinimum" => message.boolean(10, flag(value, &at)?),
                "maxLength" => message.int64(11, integer(value, &at)?),
                "minLength" => message.int64(12, integer(value, &at)?),
                "pattern" => message.string(13, text(value, &at)?),
                "maxItems" => message.int64(14, integer(value, &at)?),
                "minItems" => message.int64(15, integer(value, &at)?),
                "uniqueItems" => message.boolean(16, flag(value, &at)?),
                "maxProperties" => message.int64(17, integer(value, &at)?),
                "minProperties" => message.int64(18, integer(value, &at)?),
                "required" => strings(value, &at)?
                    .into_iter()
                    .for_each(|name| message.string_element(19, name)),
                "enum" => {
                    let values = value
                        .as_array()
                        .ok_or_else(|| unsupported(&at, "expected an array"))?;
                    values.iter().for_each(|v| message.message(20, any(v)));
                }
                // AdditionalPropertiesItem { oneof { Schema schema = 1; bool boolean = 2 } }
                "additionalProperties" => {
                    let mut item = Message::default();
                    match value {
                        Value::Bool(allowed) => item.oneof_boolean(2, *allowed),
                        _ => item.message(1, self::schema(value, &at)?),
                    }
                    message.message(21, item);
                }
                // TypeItem { repeated string value = 1 }
                "type" => {
                    let mut item = Message::default();
                    match value {
                        Value::Array(_) => strings(value, &at)?
                            .into_iter()
                            .for_each(|kind| item.string_element(1, kind)),
                        _ => item.string_element(1, text(value, &at)?),
                    }
                    message.message(22, item);
                }
                // ItemsItem { repeated Schema schema = 1 }
                "items" => {
                    let mut item = Message::default();
                    match value {
                        Value::Array(schemas) => {
                            for member in schemas {
                                item.message(1, self::schema(member, &at)?);
                            }
                        }
                        _ => item.message(1, self::schema(value, &at)?),
                    }
                    message.message(23, item);
                }
                "allOf" => {
                    let members = value
                        .as_array()
                        .ok_or_else(|| unsupported(&at, "expected an array"))?;
                    for member in members {
                        message.message(24, self::schema(member, &at)?);
                    }
                }
                "properties" => message.message(25, named_schemas(value, &at)?),
                "discriminator" => message.string(26, text(value, &at)?),
                "readOnly" => message.boolean(27, flag(value, &at)?),
                "example" => message.message(30, any(value)),
                key if key.starts_with("x-") => message.message(31, named_any(key, value)),
                _ => return Err(unsupported(&at, "unsupported schema keyword")),
            }
        }
        Ok(message)
    }
}

#[cfg(test)]
mod tests {
    use axum::body::{Body, to_bytes};
    use http::Request;
    use tower::ServiceExt;

    use super::*;

    const KUBECTL_V2_ACCEPT: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";

    fn openapi() -> Arc<OpenApi> {
        Arc::new(OpenApi::new().unwrap())
    }

    async fn get(
        openapi: &Arc<OpenApi>,
        uri: &str,
        headers: &[(&str, &str)],
    ) -> (StatusCode, HeaderMap, Bytes) {
        let mut request = Request::get(uri);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = router(openapi.clone())
            .oneshot(request.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let body = to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (status, headers, body)
    }

    fn header(headers: &HeaderMap, name: http::HeaderName) -> &str {
        headers.get(name).unwrap().to_str().unwrap()
    }

    fn v2_json(openapi: &OpenApi) -> Value {
        serde_json::from_slice(&openapi.v2.body).unwrap()
    }

    fn v3_json(openapi: &OpenApi) -> Value {
        serde_json::from_slice(&openapi.v3_group_version.body).unwrap()
    }

    fn gvk(kind: &str) -> Value {
        json!({ "group": GROUP, "version": VERSION, "kind": kind })
    }

    #[test]
    fn both_documents_parse() {
        let openapi = openapi();
        let v3: openapiv3::OpenAPI =
            serde_json::from_slice(&openapi.v3_group_version.body).unwrap();
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
            "/apis/plugins.kplug.io/v1alpha1/reconciles".to_owned(),
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
    fn kinds_carry_their_group_version_kind() {
        let openapi = openapi();
        let v3 = v3_json(&openapi);
        let v2 = v2_json(&openapi);
        for (kind, name) in [
            ("Plugin", "Plugin"),
            ("PluginList", "PluginList"),
            ("Reconcile", "Reconcile"),
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
        for path in ["plugins/{name}/reconcile", "reconciles"] {
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
        assert_eq!(carriers.len(), 3, "{carriers:?}");
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
                    "201", "400", "401", "404", "413", "415", "422", "429", "500", "503", "504"
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
        let subresource = format!("/apis/{GROUP}/{VERSION}/plugins/{{name}}/reconcile");
        let name = &v2["paths"][&subresource]["parameters"][0];
        assert_eq!(name["in"], "path");
        assert_eq!(name["required"], true);
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
            ApiSelector, ExtensionStatus, ObjectRef, PluginRef, RawObject, ReconcileResult,
            ReconcileSpec, ReconcileStatus, ResultCondition, Selection, SelectionReason,
        };

        let raw = |value: &Value| -> RawObject {
            serde_json::value::to_raw_value(value).expect("raw JSON")
        };
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
                extensions: vec![raw(&object)],
                api: Some(ApiSelector {
                    group: "example.com".into(),
                    resource: "things".into(),
                    version: "v1".into(),
                }),
                preferred_implementation: Some("Impl".into()),
                required_implementation: Some("Impl".into()),
                plugin: Some("p".into()),
            },
            status: Some(ReconcileStatus {
                plugin: PluginRef {
                    name: "p".into(),
                    version: "1.0.0".into(),
                    implementation: "Impl".into(),
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
                operation_id: "id".into(),
                duration_milliseconds: 2.0,
            }),
        };
        // spec.object is the one required field of a request.
        let minimal = Reconcile {
            spec: ReconcileSpec {
                object: Some(raw(&object)),
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

    #[tokio::test]
    async fn index_names_the_group_version_document_by_its_hash() {
        let openapi = openapi();
        let (status, headers, body) = get(&openapi, "/openapi/v3", &[]).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(header(&headers, CONTENT_TYPE), JSON);
        let index: Value = serde_json::from_slice(&body).unwrap();
        let paths = index["paths"].as_object().unwrap();
        assert_eq!(paths.len(), 1);
        let url = paths["apis/plugins.kplug.io/v1alpha1"]["serverRelativeURL"]
            .as_str()
            .unwrap();
        let hash = url
            .strip_prefix("/openapi/v3/apis/plugins.kplug.io/v1alpha1?hash=")
            .unwrap();
        assert_eq!(hash.len(), 32);
        assert!(
            hash.chars()
                .all(|c| c.is_ascii_digit() || c.is_ascii_uppercase())
        );

        // kubectl appends its own parameters.
        let (status, headers, body) =
            get(&openapi, &format!("{url}&timeout=32s"), &[("accept", JSON)]).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(header(&headers, ETAG), format!("\"{hash}\""));
        assert_eq!(header(&headers, CACHE_CONTROL), "public, immutable");
        assert!(header(&headers, EXPIRES).ends_with(" GMT"));
        assert_eq!(header(&headers, VARY), "Accept");
        assert_eq!(content_hash(&body), hash);

        // Without the hash: the same document, to be revalidated.
        let (status, headers, unhashed) =
            get(&openapi, "/openapi/v3/apis/plugins.kplug.io/v1alpha1", &[]).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(header(&headers, ETAG), format!("\"{hash}\""));
        assert!(headers.get(CACHE_CONTROL).is_none());
        assert_eq!(unhashed, body);
    }

    #[tokio::test]
    async fn a_stale_hash_is_redirected() {
        let openapi = openapi();
        let (status, headers, _) = get(
            &openapi,
            "/openapi/v3/apis/plugins.kplug.io/v1alpha1?hash=0123",
            &[],
        )
        .await;
        assert_eq!(status, StatusCode::MOVED_PERMANENTLY);
        assert_eq!(
            header(&headers, LOCATION),
            group_version_url(&openapi.v3_group_version.hash)
        );
    }

    #[tokio::test]
    async fn if_none_match_gives_304() {
        let openapi = openapi();
        let hashed = group_version_url(&openapi.v3_group_version.hash);
        for uri in [
            "/openapi/v2",
            "/openapi/v3",
            "/openapi/v3/apis/plugins.kplug.io/v1alpha1",
            hashed.as_str(),
        ] {
            let (status, headers, _) = get(&openapi, uri, &[]).await;
            assert_eq!(status, StatusCode::OK, "{uri}");
            let etag = header(&headers, ETAG).to_owned();
            assert!(
                etag.starts_with('"') && etag.ends_with('"'),
                "strong ETag: {etag}"
            );

            for matching in [
                etag.clone(),
                format!("W/{etag}"),
                format!("\"x\", {etag}"),
                "*".into(),
            ] {
                let (status, headers, body) =
                    get(&openapi, uri, &[("if-none-match", &matching)]).await;
                assert_eq!(status, StatusCode::NOT_MODIFIED, "{uri} {matching}");
                assert_eq!(header(&headers, ETAG), etag);
                assert!(body.is_empty());
            }
            let (status, _, _) = get(&openapi, uri, &[("if-none-match", "\"other\"")]).await;
            assert_eq!(status, StatusCode::OK, "{uri}");
        }
    }

    #[tokio::test]
    async fn v2_is_served_as_json_or_as_kubectl_s_protobuf() {
        let openapi = openapi();
        // kube-apiserver's aggregator.
        let (status, headers, body) = get(&openapi, "/openapi/v2", &[("accept", JSON)]).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(header(&headers, CONTENT_TYPE), JSON);
        assert_eq!(body, openapi.v2.body);
        let etag = header(&headers, ETAG).to_owned();

        // kubectl (and client-go's OpenAPISchema).
        for accept in [
            KUBECTL_V2_ACCEPT,
            V2_PROTOBUF,
            "application/json;q=0.5, application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
        ] {
            let (status, headers, body) = get(&openapi, "/openapi/v2", &[("accept", accept)]).await;
            assert_eq!(status, StatusCode::OK, "{accept}");
            assert_eq!(header(&headers, CONTENT_TYPE), V2_PROTOBUF);
            assert_eq!(header(&headers, ETAG), etag);
            assert_eq!(body, openapi.v2_protobuf.body);
        }

        for accept in ["*/*", "application/*", "text/html, */*;q=0.1", ""] {
            let (status, headers, _) = get(&openapi, "/openapi/v2", &[("accept", accept)]).await;
            assert_eq!(status, StatusCode::OK, "{accept}");
            assert_eq!(header(&headers, CONTENT_TYPE), JSON, "{accept}");
        }
        for accept in ["text/html", "application/json;q=0", "application/yaml"] {
            let (status, _, _) = get(&openapi, "/openapi/v2", &[("accept", accept)]).await;
            assert_eq!(status, StatusCode::NOT_ACCEPTABLE, "{accept}");
        }
        // v3 in protobuf is not served.
        let (status, _, _) = get(
            &openapi,
            "/openapi/v3/apis/plugins.kplug.io/v1alpha1",
            &[(
                "accept",
                "application/com.github.proto-openapi.spec.v3.v1.0+protobuf",
            )],
        )
        .await;
        assert_eq!(status, StatusCode::NOT_ACCEPTABLE);
    }

    /// Reads one level of a protobuf message: (field, wire type, payload),
    /// the payload of a varint being empty.
    fn protobuf_fields(mut data: &[u8]) -> Vec<(u64, u64, Vec<u8>)> {
        fn varint(data: &mut &[u8]) -> u64 {
            let mut value = 0;
            for shift in (0..64).step_by(7) {
                let (byte, rest) = data.split_first().unwrap();
                *data = rest;
                value |= u64::from(byte & 0x7f) << shift;
                if byte & 0x80 == 0 {
                    break;
                }
            }
            value
        }
        let mut fields = Vec::new();
        while !data.is_empty() {
            let key = varint(&mut data);
            let payload = match key & 7 {
                0 => {
                    varint(&mut data);
                    Vec::new()
                }
                1 => {
                    let (payload, rest) = data.split_at(8);
                    data = rest;
                    payload.to_vec()
                }
                2 => {
                    let len = usize::try_from(varint(&mut data)).unwrap();
                    let (payload, rest) = data.split_at(len);
                    data = rest;
                    payload.to_vec()
                }
                other => panic!("wire type {other}"),
            };
            fields.push((key >> 3, key & 7, payload));
        }
        fields
    }

    #[test]
    fn protobuf_follows_gnostic_s_document() {
        let openapi = openapi();
        let document = protobuf_fields(&openapi.v2_protobuf.body);
        let field = |n: u64| {
            document
                .iter()
                .find(|(number, _, _)| *number == n)
                .map(|(_, _, payload)| payload.clone())
                .unwrap()
        };
        assert_eq!(field(1), b"2.0"); // swagger
        let info = protobuf_fields(&field(2));
        assert_eq!(info[0], (1, 2, b"kplug".to_vec())); // title
        // definitions: repeated NamedSchema { name = 1; value = 2 }
        let definitions = protobuf_fields(&field(9));
        let names: Vec<String> = definitions
            .iter()
            .map(|(_, _, named)| String::from_utf8(protobuf_fields(named)[0].2.clone()).unwrap())
            .collect();
        let v2 = v2_json(&openapi);
        let expected: Vec<&String> = v2["definitions"].as_object().unwrap().keys().collect();
        assert_eq!(names.iter().collect::<Vec<_>>(), expected);

        // Plugin's schema: description (4) and its kind extension (31), as
        // NamedAny { name = 1; Any { yaml = 2 } = 2 }.
        let plugin = definitions
            .iter()
            .map(|(_, _, named)| protobuf_fields(named))
            .find(|named| named[0].2 == format!("{SCHEMA_PREFIX}Plugin").as_bytes())
            .unwrap();
        let schema = protobuf_fields(&plugin[1].2);
        let description = schema.iter().find(|(n, _, _)| *n == 4).unwrap();
        assert!(description.2.starts_with(b"A Plugin is"));
        let extension = schema.iter().find(|(n, _, _)| *n == 31).unwrap();
        let extension = protobuf_fields(&extension.2);
        assert_eq!(extension[0].2, b"x-kubernetes-group-version-kind");
        let yaml = protobuf_fields(&extension[1].2);
        assert_eq!(yaml[0].0, 2);
        let value: Value = serde_json::from_slice(&yaml[0].2).unwrap();
        assert_eq!(value, json!([gvk("Plugin")]));

        // Reconcile's too, and spec.object's extensions (ReconcileSpec's
        // properties (25) hold NamedSchema { name = 1; value = 2 }).
        let named_schema = |name: &str| {
            definitions
                .iter()
                .map(|(_, _, named)| protobuf_fields(named))
                .find(|named| named[0].2 == format!("{SCHEMA_PREFIX}{name}").as_bytes())
                .map(|named| protobuf_fields(&named[1].2))
                .unwrap()
        };
        let extension = |schema: &[(u64, u64, Vec<u8>)], name: &str| -> Value {
            let extension = schema
                .iter()
                .filter(|(n, _, _)| *n == 31)
                .map(|(_, _, payload)| protobuf_fields(payload))
                .find(|named| named[0].2 == name.as_bytes())
                .unwrap();
            serde_json::from_slice(&protobuf_fields(&extension[1].2)[0].2).unwrap()
        };
        let reconcile = named_schema("Reconcile");
        assert_eq!(
            extension(&reconcile, "x-kubernetes-group-version-kind"),
            json!([gvk("Reconcile")])
        );
        let spec = named_schema("ReconcileSpec");
        let properties = spec.iter().find(|(n, _, _)| *n == 25).unwrap();
        let object = protobuf_fields(&properties.2)
            .iter()
            .map(|(_, _, named)| protobuf_fields(named))
            .find(|named| named[0].2 == b"object")
            .map(|named| protobuf_fields(&named[1].2))
            .unwrap();
        assert_eq!(
            extension(&object, "x-kubernetes-preserve-unknown-fields"),
            json!(true)
        );

        // The paths (8): the reconcile subresource's post (4) is there.
        let paths = protobuf_fields(&field(8));
        let subresource = format!("/apis/{GROUP}/{VERSION}/plugins/{{name}}/reconcile");
        let item = paths
            .iter()
            .map(|(_, _, named)| protobuf_fields(named))
            .find(|named| named[0].2 == subresource.as_bytes())
            .unwrap();
        let item = protobuf_fields(&item[1].2);
        assert!(item.iter().any(|(n, _, _)| *n == 4));
    }

    #[test]
    fn content_hash_is_fnv1a_128() {
        assert_eq!(content_hash(b""), "6C62272E07BB014262B821756295C58D");
        assert_eq!(content_hash(b"a"), "D228CB696F1A8CAF78912B704E4A8964");
    }

    #[test]
    fn http_dates() {
        let at = |secs| http_date(UNIX_EPOCH + Duration::from_secs(secs));
        assert_eq!(at(784_111_777), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(at(951_782_400), "Tue, 29 Feb 2000 00:00:00 GMT");
        assert_eq!(at(0), "Thu, 01 Jan 1970 00:00:00 GMT");
    }
}
