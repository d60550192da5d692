//! API discovery: what kubectl reads to learn which resources kplug serves,
//! in the legacy form and as aggregated discovery (`apidiscovery.k8s.io`).

use axum::Router;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    APIGroup, APIGroupList, APIResource, APIResourceList, APIVersions, GroupVersionForDiscovery,
};
use k8s_openapi::apimachinery::pkg::version::Info;
use serde_json::{Value, json};

use super::negotiate::{DiscoveryFormat, discovery_format};
use super::status::ApiError;
use crate::v1alpha1::{API_VERSION, GROUP, VERSION};

/// One resource (or subresource) kplug serves.
struct Served {
    /// Plural name, `resource/subresource` for subresources.
    name: &'static str,
    singular: &'static str,
    kind: &'static str,
    /// Served under `namespaces/{namespace}/` (a subresource shares its
    /// resource's scope).
    namespaced: bool,
    verbs: &'static [&'static str],
    short_names: &'static [&'static str],
    categories: &'static [&'static str],
}

const RESOURCES: &[Served] = &[
    Served {
        name: "plugins",
        singular: "plugin",
        kind: "Plugin",
        namespaced: false,
        verbs: &["delete", "get", "list", "watch"],
        short_names: &["plg"],
        categories: &["kplug"],
    },
    Served {
        name: "plugins/reconcile",
        singular: "",
        kind: "Reconcile",
        namespaced: false,
        verbs: &["create"],
        short_names: &[],
        categories: &[],
    },
    Served {
        name: "plugins/shadow",
        singular: "",
        kind: "PluginShadow",
        namespaced: false,
        verbs: &["get"],
        short_names: &[],
        categories: &[],
    },
    Served {
        name: "reconciles",
        singular: "reconcile",
        kind: "Reconcile",
        namespaced: true,
        verbs: &["create"],
        short_names: &[],
        categories: &[],
    },
];

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

fn group_version() -> GroupVersionForDiscovery {
    GroupVersionForDiscovery {
        group_version: API_VERSION.to_owned(),
        version: VERSION.to_owned(),
    }
}

fn api_group() -> APIGroup {
    APIGroup {
        name: GROUP.to_owned(),
        versions: vec![group_version()],
        preferred_version: Some(group_version()),
        server_address_by_client_cidrs: None,
    }
}

fn resource_list() -> APIResourceList {
    APIResourceList {
        group_version: API_VERSION.to_owned(),
        resources: RESOURCES
            .iter()
            .map(|r| APIResource {
                name: r.name.to_owned(),
                singular_name: r.singular.to_owned(),
                namespaced: r.namespaced,
                kind: r.kind.to_owned(),
                verbs: strings(r.verbs),
                short_names: (!r.short_names.is_empty()).then(|| strings(r.short_names)),
                categories: (!r.categories.is_empty()).then(|| strings(r.categories)),
                ..APIResource::default()
            })
            .collect(),
    }
}

/// The `APIGroupDiscovery` entry for kplug's group.
fn aggregated_group() -> Value {
    let resources: Vec<Value> = RESOURCES
        .iter()
        .filter(|r| !r.name.contains('/'))
        .map(|r| {
            let subresources: Vec<Value> = RESOURCES
                .iter()
                .filter_map(|s| {
                    let sub = s.name.strip_prefix(r.name)?.strip_prefix('/')?;
                    Some(json!({
                        "subresource": sub,
                        "responseKind": {"group": GROUP, "version": VERSION, "kind": s.kind},
                        "verbs": s.verbs,
                    }))
                })
                .collect();
            json!({
                "resource": r.name,
                "responseKind": {"group": GROUP, "version": VERSION, "kind": r.kind},
                "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
                "singularResource": r.singular,
                "verbs": r.verbs,
                "shortNames": r.short_names,
                "categories": r.categories,
                "subresources": subresources,
            })
        })
        .collect();
    json!({
        "metadata": {"name": GROUP},
        "versions": [{"version": VERSION, "resources": resources, "freshness": "Current"}],
    })
}

fn aggregated(version: &str, items: Vec<Value>) -> Response {
    let body = json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": format!("apidiscovery.k8s.io/{version}"),
        "metadata": {},
        "items": items,
    });
    let content_type =
        format!("application/json;g=apidiscovery.k8s.io;v={version};as=APIGroupDiscoveryList");
    let mut response = axum::Json(body).into_response();
    if let Ok(value) = HeaderValue::from_str(&content_type) {
        response.headers_mut().insert(header::CONTENT_TYPE, value);
    }
    response
}

fn with_vary(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::VARY, HeaderValue::from_static("Accept"));
    response
}

/// `GET /api`: kplug serves no legacy (core) group.
async fn core(headers: HeaderMap) -> Result<Response, ApiError> {
    Ok(with_vary(match discovery_format(&headers)? {
        DiscoveryFormat::Aggregated(version) => aggregated(version, Vec::new()),
        DiscoveryFormat::Legacy => axum::Json(APIVersions {
            versions: Vec::new(),
            server_address_by_client_cidrs: Vec::new(),
        })
        .into_response(),
    }))
}

/// `GET /apis`.
async fn groups(headers: HeaderMap) -> Result<Response, ApiError> {
    Ok(with_vary(match discovery_format(&headers)? {
        DiscoveryFormat::Aggregated(version) => aggregated(version, vec![aggregated_group()]),
        DiscoveryFormat::Legacy => axum::Json(APIGroupList {
            groups: vec![api_group()],
        })
        .into_response(),
    }))
}

/// `GET /apis/plugins.kplug.io`.
async fn group() -> Response {
    axum::Json(api_group()).into_response()
}

/// `GET /apis/plugins.kplug.io/v1alpha1`.
async fn resources() -> Response {
    axum::Json(resource_list()).into_response()
}

/// `GET /version`. Behind kube-apiserver this path is served by the
/// aggregator itself; in standalone mode kubectl asks kplug.
async fn version() -> Response {
    let version = env!("CARGO_PKG_VERSION");
    let mut parts = version.split('.');
    axum::Json(Info {
        major: parts.next().unwrap_or_default().to_owned(),
        minor: parts.next().unwrap_or_default().to_owned(),
        git_version: format!("v{version}"),
        platform: format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
        ..Info::default()
    })
    .into_response()
}

/// Discovery routes.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/version", get(version))
        .route("/api", get(core))
        .route("/apis", get(groups))
        .route(&format!("/apis/{GROUP}"), get(group))
        .route(&format!("/apis/{GROUP}/{VERSION}"), get(resources))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_list_names_plugins() {
        let list = resource_list();
        let plugins = list.resources.iter().find(|r| r.name == "plugins");
        let plugins = plugins.map(|p| (p.kind.as_str(), p.namespaced, p.short_names.clone()));
        assert_eq!(
            plugins,
            Some(("Plugin", false, Some(vec!["plg".to_owned()])))
        );
    }

    #[test]
    fn aggregated_group_has_cluster_scope_and_categories() {
        let group = aggregated_group();
        let plugins = &group["versions"][0]["resources"][0];
        assert_eq!(plugins["resource"], "plugins");
        assert_eq!(plugins["scope"], "Cluster");
        assert_eq!(plugins["categories"][0], "kplug");
        assert_eq!(plugins["responseKind"]["kind"], "Plugin");
    }

    #[test]
    fn reconciles_are_namespaced_in_both_forms() {
        let list = resource_list();
        let legacy = list.resources.iter().find(|r| r.name == "reconciles");
        assert_eq!(legacy.map(|r| r.namespaced), Some(true));
        let group = aggregated_group();
        let resources = group["versions"][0]["resources"].as_array();
        let reconciles =
            resources.and_then(|all| all.iter().find(|r| r["resource"] == "reconciles"));
        assert_eq!(reconciles.map(|r| &r["scope"]), Some(&json!("Namespaced")));
    }
}
