//! Request metrics under the names kube-apiserver uses, so the dashboards
//! people already have for aggregated API servers work for kplug, and the
//! `/metrics` endpoint that serves every registered family.
//!
//! Labels come only from the fixed set of kplug's routes: a request for an
//! unknown path counts with an empty resource, so clients cannot grow the
//! number of series.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use futures::future::BoxFuture;
use prometheus_client::encoding::{EncodeLabel, EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use tower::{Layer, Service};

use super::status::ApiError;
use crate::auth::RequestInfo;
use crate::v1alpha1::{GROUP, VERSION};

/// kube-apiserver's buckets for `apiserver_request_duration_seconds`.
const DURATION_BUCKETS: [f64; 23] = [
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0,
    10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
];

/// The Prometheus text exposition kplug serves (OpenMetrics 1.0, which
/// Prometheus negotiates and parses).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Which of kplug's resources a request was for.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Route {
    Plugins,
    PluginReconcile,
    Reconciles,
    /// Anything else: a non-resource path, or one kplug does not serve.
    Other,
}

/// What a request was, in kube-apiserver's metric labels. Kept to a verb
/// and two small enums, which every request hashes to find its series;
/// the label values are spelled out only when encoding.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct RequestLabels {
    verb: &'static str,
    route: Route,
    scope: Scope,
}

/// kube-apiserver's `scope` label: a named object, a collection in a
/// namespace, or one across the cluster.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Scope {
    Resource,
    Namespace,
    Cluster,
}

impl RequestLabels {
    /// The labels kube-apiserver puts on its request metrics.
    fn pairs(&self) -> [(&'static str, &'static str); 7] {
        let (group, version, resource, subresource) = match self.route {
            Route::Plugins => (GROUP, VERSION, "plugins", ""),
            Route::PluginReconcile => (GROUP, VERSION, "plugins", "reconcile"),
            Route::Reconciles => (GROUP, VERSION, "reconciles", ""),
            Route::Other => ("", "", "", ""),
        };
        let scope = match (self.route, self.scope) {
            (Route::Other, _) => "",
            (_, Scope::Resource) => "resource",
            (_, Scope::Namespace) => "namespace",
            (_, Scope::Cluster) => "cluster",
        };
        [
            ("verb", self.verb),
            ("group", group),
            ("version", version),
            ("resource", resource),
            ("subresource", subresource),
            ("scope", scope),
            ("component", "apiserver"),
        ]
    }
}

impl EncodeLabelSet for RequestLabels {
    fn encode(&self, encoder: LabelSetEncoder) -> Result<(), std::fmt::Error> {
        self.pairs().encode(encoder)
    }
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct CodeLabels {
    code: u16,
    request: RequestLabels,
}

impl EncodeLabelSet for CodeLabels {
    fn encode(&self, mut encoder: LabelSetEncoder) -> Result<(), std::fmt::Error> {
        ("code", self.code).encode(encoder.encode_label())?;
        for pair in self.request.pairs() {
            pair.encode(encoder.encode_label())?;
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    request_kind: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// `apiserver_request_*` families, shared by every request.
#[derive(Clone, Debug)]
pub struct RequestMetrics {
    total: Family<CodeLabels, Counter>,
    duration: HistogramFamily<RequestLabels>,
    in_flight: Family<KindLabels, Gauge>,
    /// The two series of `in_flight`, held so requests skip the lookup.
    read_only: Gauge,
    mutating: Gauge,
    long_running: Family<RequestLabels, Gauge>,
}

impl Default for RequestMetrics {
    fn default() -> Self {
        let in_flight = Family::<KindLabels, Gauge>::default();
        let series = |request_kind| {
            in_flight
                .get_or_create(&KindLabels { request_kind })
                .clone()
        };
        Self {
            total: Family::default(),
            duration: Family::new_with_constructor(|| Histogram::new(DURATION_BUCKETS)),
            read_only: series("readOnly"),
            mutating: series("mutating"),
            in_flight,
            long_running: Family::default(),
        }
    }
}

impl RequestMetrics {
    /// Adds the families to `registry` (under the `apiserver_` prefix).
    pub fn register(&self, registry: &mut Registry) {
        let registry = registry.sub_registry_with_prefix("apiserver");
        registry.register(
            "request",
            "Counter of apiserver requests broken out for each verb, group, version, resource, subresource, scope, component and HTTP response code",
            self.total.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Response latency distribution in seconds for each verb, group, version, resource, subresource, scope and component; watches are not included",
            self.duration.clone(),
        );
        registry.register(
            "current_inflight_requests",
            "Number of requests being served, by kind (readOnly or mutating); watches are not included",
            self.in_flight.clone(),
        );
        registry.register(
            "longrunning_requests",
            "Number of open watches, by verb, group, version, resource, subresource, scope and component",
            self.long_running.clone(),
        );
    }
}

/// Counts and times every request, including refused ones. A tower layer
/// rather than axum's `from_fn`, which boxes the inner service for every
/// request: under callgrind that cost ~9,000 instructions per reconcile,
/// 4 % of kplug's work on a small one.
#[derive(Clone, Debug)]
pub struct InstrumentLayer(Arc<RequestMetrics>);

impl InstrumentLayer {
    pub fn new(metrics: RequestMetrics) -> Self {
        Self(Arc::new(metrics))
    }
}

impl<S> Layer<S> for InstrumentLayer {
    type Service = Instrument<S>;

    fn layer(&self, inner: S) -> Instrument<S> {
        Instrument {
            inner,
            metrics: self.0.clone(),
        }
    }
}

/// The service [`InstrumentLayer`] wraps around the application.
#[derive(Clone, Debug)]
pub struct Instrument<S> {
    inner: S,
    metrics: Arc<RequestMetrics>,
}

impl<S> Service<Request> for Instrument<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let labels = classify(RequestInfo::parse(
            request.method(),
            request.uri().path(),
            request.uri().query(),
        ));
        let metrics = self.metrics.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = if labels.verb == "WATCH" {
                watch(&metrics, labels, response).await
            } else {
                measure(&metrics, labels, response).await
            };
            Ok(response)
        })
    }
}

/// A request that ends with its response.
async fn measure(
    metrics: &RequestMetrics,
    labels: RequestLabels,
    response: impl Future<Output = Result<Response, Infallible>>,
) -> Response {
    let in_flight = if matches!(labels.verb, "GET" | "LIST" | "HEAD" | "OPTIONS") {
        &metrics.read_only
    } else {
        &metrics.mutating
    };
    in_flight.inc();
    let started = Instant::now();
    let Ok(response) = response.await;
    in_flight.dec();
    metrics
        .duration
        .get_or_create(&labels)
        .observe(started.elapsed().as_secs_f64());
    metrics
        .total
        .get_or_create(&CodeLabels {
            request: labels,
            code: response.status().as_u16(),
        })
        .inc();
    response
}

/// A watch counts as long-running until its response body is dropped,
/// that is, until the stream ends or the client goes away.
async fn watch(
    metrics: &RequestMetrics,
    labels: RequestLabels,
    response: impl Future<Output = Result<Response, Infallible>>,
) -> Response {
    let Ok(response) = response.await;
    metrics
        .total
        .get_or_create(&CodeLabels {
            request: labels,
            code: response.status().as_u16(),
        })
        .inc();
    if !response.status().is_success() {
        return response;
    }
    let open = OpenWatch(metrics.long_running.get_or_create(&labels).clone());
    open.0.inc();
    let (parts, body) = response.into_parts();
    let body = body.into_data_stream().map(move |chunk| {
        let _held_until_the_stream_is_dropped = &open;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(body))
}

struct OpenWatch(Gauge);

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Maps a request to labels drawn only from kplug's own routes.
fn classify(info: RequestInfo<'_>) -> RequestLabels {
    let unknown = |verb| RequestLabels {
        verb,
        route: Route::Other,
        scope: Scope::Cluster,
    };
    match info {
        RequestInfo::NonResource { method, .. } => unknown(method_verb(method)),
        RequestInfo::Resource {
            verb,
            namespace,
            resource,
            subresource,
            name,
        } => {
            let route = match (resource, subresource) {
                ("plugins", "") => Route::Plugins,
                ("plugins", "reconcile") => Route::PluginReconcile,
                ("reconciles", "") => Route::Reconciles,
                _ => return unknown(resource_verb(verb)),
            };
            let scope = match (name.is_empty(), namespace.is_empty()) {
                (false, _) => Scope::Resource,
                (true, false) => Scope::Namespace,
                (true, true) => Scope::Cluster,
            };
            RequestLabels {
                verb: resource_verb(verb),
                route,
                scope,
            }
        }
    }
}

/// kube-apiserver reports the HTTP method, with LIST and WATCH for reads
/// of collections.
fn resource_verb(verb: &str) -> &'static str {
    match verb {
        "get" => "GET",
        "list" => "LIST",
        "watch" => "WATCH",
        "create" => "POST",
        "update" => "PUT",
        "patch" => "PATCH",
        "delete" | "deletecollection" => "DELETE",
        _ => "other",
    }
}

fn method_verb(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// `GET /metrics`: every family, in the text exposition format.
pub async fn serve(State(registry): State<Arc<Registry>>) -> Result<Response, ApiError> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)
        .map_err(|e| ApiError::Internal(format!("encoding metrics: {e}")))?;
    let mut response = text.into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// verb, resource, subresource, scope and group, as encoded.
    struct Labels {
        verb: &'static str,
        resource: &'static str,
        subresource: &'static str,
        scope: &'static str,
        group: &'static str,
    }

    fn labels(method: Method, path: &str, query: Option<&str>) -> Labels {
        let pairs = classify(RequestInfo::parse(&method, path, query)).pairs();
        let get = |key: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == key)
                .map_or("", |(_, value)| *value)
        };
        Labels {
            verb: get("verb"),
            resource: get("resource"),
            subresource: get("subresource"),
            scope: get("scope"),
            group: get("group"),
        }
    }

    #[test]
    fn routes_map_to_kube_apiserver_labels() {
        let collection = format!("/apis/{GROUP}/{VERSION}/plugins");
        let list = labels(Method::GET, &collection, None);
        assert_eq!(
            (list.verb, list.resource, list.scope),
            ("LIST", "plugins", "cluster")
        );
        let watch = labels(Method::GET, &collection, Some("watch=true"));
        assert_eq!(watch.verb, "WATCH");
        let get = labels(Method::GET, &format!("{collection}/a"), None);
        assert_eq!((get.verb, get.scope), ("GET", "resource"));
        let reconcile = labels(Method::POST, &format!("{collection}/a/reconcile"), None);
        assert_eq!(
            (reconcile.verb, reconcile.resource, reconcile.subresource),
            ("POST", "plugins", "reconcile")
        );
        let reconciles = labels(
            Method::POST,
            &format!("/apis/{GROUP}/{VERSION}/reconciles"),
            None,
        );
        assert_eq!(
            (reconciles.verb, reconciles.resource, reconciles.scope),
            ("POST", "reconciles", "cluster")
        );
        let in_namespace = labels(
            Method::POST,
            &format!("/apis/{GROUP}/{VERSION}/namespaces/team-a/reconciles"),
            None,
        );
        assert_eq!(
            (in_namespace.verb, in_namespace.resource, in_namespace.scope),
            ("POST", "reconciles", "namespace")
        );
    }

    #[test]
    fn unknown_paths_cannot_add_label_values() {
        let made_up = labels(
            Method::GET,
            &format!("/apis/{GROUP}/{VERSION}/x{}", "y".repeat(40)),
            None,
        );
        assert_eq!((made_up.resource, made_up.group), ("", ""));
        let odd_subresource = labels(
            Method::GET,
            &format!("/apis/{GROUP}/{VERSION}/plugins/a/b/c"),
            None,
        );
        assert_eq!(odd_subresource.resource, "");
        let metrics = labels(Method::GET, "/metrics", None);
        assert_eq!((metrics.verb, metrics.resource), ("GET", ""));
        assert_eq!(
            labels(Method::from_bytes(b"BREW").expect("method"), "/", None).verb,
            "other"
        );
    }
}
