//! The four ways a reconcile reaches the plugin pods from a pod, and one
//! call on each.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use kplug_proto::v1alpha1::ReconcileRequest;
use kplug_proto::v1alpha1::plugin_client::PluginClient;
use kplug_test_support::in_cluster::{
    Installation, KPLUG_PORT, KPLUG_SERVER_NAME, Node, PLUGIN, PLUGIN_PORT, PLUGIN_SERVER_NAME, Pod,
};
use rustls::pki_types::ServerName;
use serde::Deserialize;
use serde_json::Value;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::GREETINGS_CONTROLLER;
use crate::support::{ApiClient, REQUEST_TIMEOUT, tls_config, tls_config_without_client_cert};

pub(super) const RECONCILE_PATH: &str = "/apis/plugins.kplug.io/v1alpha1/plugins/hello/reconcile";
/// The deadline kplug passes the plugin (its default), and the largest
/// message either side takes.
const RECONCILE_TIMEOUT: Duration = Duration::from_secs(30);
const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// Which way a call goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// The admin → kube-apiserver → (the aggregator, the Service) a kplug
    /// pod → a plugin pod.
    Apiserver,
    /// The front proxy's certificate as the admin → a kplug pod → a plugin
    /// pod: what kube-apiserver sends, without kube-apiserver.
    Kplug,
    /// A ServiceAccount's token → kplug's Service → a kplug pod → a plugin
    /// pod: an operator's direct path (`kplug-operator --kplug-url`).
    Token,
    /// kplug's client certificate → a plugin pod, plain gRPC.
    Direct,
}

impl Route {
    pub(super) const ALL: [Self; 4] = [Self::Apiserver, Self::Kplug, Self::Token, Self::Direct];

    pub(super) fn label(self) -> &'static str {
        match self {
            Self::Apiserver => "through kube-apiserver and a kplug pod",
            Self::Kplug => "straight to a kplug pod",
            Self::Token => "a ServiceAccount token to kplug's Service",
            Self::Direct => "direct gRPC to a plugin pod",
        }
    }
}

/// The reconcile sent on every route: the Reconcile body for kplug, the
/// object's JSON for the plugin.
pub(super) struct Payload {
    pub(super) body: Bytes,
    pub(super) object: Bytes,
}

impl Payload {
    pub(super) fn new(object: &Value) -> Result<Self> {
        Ok(Self {
            body: Bytes::from(serde_json::to_vec(&serde_json::json!({
                "apiVersion": "plugins.kplug.io/v1alpha1",
                "kind": "Reconcile",
                "spec": {"object": object},
            }))?),
            object: Bytes::from(serde_json::to_vec(object)?),
        })
    }
}

/// One connection to call over.
#[derive(Clone)]
pub(super) enum Caller {
    Api(ApiClient),
    Plugin(PluginClient<Channel>),
}

/// What one call measured.
pub(super) struct Call {
    pub(super) elapsed: Duration,
    /// Through kplug, when the answer was read: how long kplug's own gRPC
    /// call to the plugin took (`status.durationMilliseconds`).
    pub(super) kplug_call: Option<Duration>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AnswerStatus {
    success: bool,
    duration_milliseconds: f64,
}

#[derive(Deserialize)]
struct Answer {
    status: AnswerStatus,
}

impl Caller {
    /// Reconciles `payload` once; with `read`, decodes kplug's answer after
    /// the timed part (the plugin's is always checked).
    pub(super) async fn reconcile(
        &mut self,
        payload: &Payload,
        number: usize,
        read: bool,
    ) -> Result<Call> {
        match self {
            Self::Api(api) => {
                let started = Instant::now();
                let (status, body) = api.post_json(RECONCILE_PATH, payload.body.clone()).await?;
                let elapsed = started.elapsed();
                if status != StatusCode::CREATED {
                    bail!(
                        "reconcile {number}: {status}: {}",
                        String::from_utf8_lossy(&body)
                    );
                }
                let mut kplug_call = None;
                if read {
                    let answer: Answer = serde_json::from_slice(&body)
                        .with_context(|| format!("reconcile {number}: undecodable answer"))?;
                    ensure!(
                        answer.status.success,
                        "reconcile {number} failed: {}",
                        String::from_utf8_lossy(&body)
                    );
                    kplug_call = Some(Duration::from_secs_f64(
                        answer.status.duration_milliseconds.max(0.0) / 1000.0,
                    ));
                }
                Ok(Call {
                    elapsed,
                    kplug_call,
                })
            }
            Self::Plugin(client) => {
                let mut request = tonic::Request::new(ReconcileRequest {
                    // As long as kplug's UUIDs.
                    operation_id: format!("00000000-0000-4000-8000-{number:012x}"),
                    object: payload.object.clone(),
                    timeout: prost_types::Duration::try_from(RECONCILE_TIMEOUT).ok(),
                    ..ReconcileRequest::default()
                });
                request.set_timeout(RECONCILE_TIMEOUT);
                let started = Instant::now();
                let reply = tokio::time::timeout(REQUEST_TIMEOUT, client.reconcile(request))
                    .await
                    .with_context(|| format!("direct reconcile {number} took too long"))?
                    .with_context(|| format!("direct reconcile {number}"))?
                    .into_inner();
                let elapsed = started.elapsed();
                ensure!(reply.success, "direct reconcile {number} failed: {reply:?}");
                Ok(Call {
                    elapsed,
                    kplug_call: None,
                })
            }
        }
    }
}

/// Per route, the connections to spread calls over: two to kube-apiserver,
/// one to each kplug pod, two to kplug's Service (kube-proxy picks a pod for
/// each), one to each plugin pod.
pub(super) struct Callers {
    pub(super) apiserver: Vec<Caller>,
    pub(super) kplug: Vec<Caller>,
    pub(super) token: Vec<Caller>,
    pub(super) direct: Vec<Caller>,
}

impl Callers {
    pub(super) async fn connect(node: &Node, installation: &Installation) -> Result<Self> {
        let read = |path: std::path::PathBuf| {
            std::fs::read(&path).with_context(|| format!("reading {}", path.display()))
        };
        let admin = tls_config(
            &read(node.pki("ca.crt")?)?,
            &read(node.pki("admin.crt")?)?,
            &read(node.pki("admin.key")?)?,
        )?;
        let apiserver = node.apiserver()?;
        let mut apiserver_callers = Vec::new();
        for _ in 0..2 {
            let name = ServerName::IpAddress(apiserver.ip().into());
            let client =
                ApiClient::connect_with(apiserver, name, admin.clone(), HeaderMap::new()).await?;
            apiserver_callers.push(Caller::Api(client));
        }

        // As the aggregator: the front proxy's certificate, the user in headers.
        let front_proxy = tls_config(
            &read(installation.kplug_ca())?,
            &read(node.pki("front-proxy-client.crt")?)?,
            &read(node.pki("front-proxy-client.key")?)?,
        )?;
        let mut headers = HeaderMap::new();
        headers.insert(
            HeaderName::from_static("x-remote-user"),
            HeaderValue::from_static("kubernetes-admin"),
        );
        headers.insert(
            HeaderName::from_static("x-remote-group"),
            HeaderValue::from_static("system:masters"),
        );
        let mut kplug = Vec::new();
        for pod in &installation.kplug {
            let name = ServerName::try_from(KPLUG_SERVER_NAME)?;
            let address = SocketAddr::new(pod.ip, KPLUG_PORT);
            let client =
                ApiClient::connect_with(address, name, front_proxy.clone(), headers.clone())
                    .await?;
            kplug.push(Caller::Api(client));
        }

        // As an operator with --kplug-url: a bearer token kplug reviews, to
        // the Service's address.
        let mut bearer = HeaderMap::new();
        bearer.insert(
            http::header::AUTHORIZATION,
            HeaderValue::try_from(format!("Bearer {}", caller_token(node)?))?,
        );
        let service = SocketAddr::new(kplug_service_ip(node)?, KPLUG_SERVICE_PORT);
        let server_only = tls_config_without_client_cert(&read(installation.kplug_ca())?)?;
        let mut token = Vec::new();
        for _ in 0..2 {
            let name = ServerName::try_from(KPLUG_SERVER_NAME)?;
            let client =
                ApiClient::connect_with(service, name, server_only.clone(), bearer.clone()).await?;
            token.push(Caller::Api(client));
        }

        let (cert, key) = installation.kplug_client();
        let plugin_tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read(installation.plugin_ca())?))
            .identity(Identity::from_pem(read(cert)?, read(key)?))
            .domain_name(PLUGIN_SERVER_NAME);
        let mut direct = Vec::new();
        for pod in &installation.plugins {
            direct.push(Caller::Plugin(plugin_client(pod, &plugin_tls).await?));
        }
        Ok(Self {
            apiserver: apiserver_callers,
            kplug,
            token,
            direct,
        })
    }

    pub(super) fn route(&self, route: Route) -> &[Caller] {
        match route {
            Route::Apiserver => &self.apiserver,
            Route::Kplug => &self.kplug,
            Route::Token => &self.token,
            Route::Direct => &self.direct,
        }
    }

    pub(super) fn route_mut(&mut self, route: Route) -> &mut [Caller] {
        match route {
            Route::Apiserver => &mut self.apiserver,
            Route::Kplug => &mut self.kplug,
            Route::Token => &mut self.token,
            Route::Direct => &mut self.direct,
        }
    }
}

/// The port of kplug's Service (`deploy/service.yaml`, `https`).
const KPLUG_SERVICE_PORT: u16 = 443;

/// The ServiceAccount the token route calls as, in `plugins`: an
/// operator's least rights, `kplug:operator` and a controller's on the
/// reconciled Greetings, so that kplug checks its right on each object (the
/// admin of the other routes, in `system:masters`, is not checked).
const TOKEN_CALLER: &str = "reconcile-bench";

/// A one-hour token of [`TOKEN_CALLER`] (made with its rights, and the
/// Greetings' CRD, if missing), from the TokenRequest API.
fn caller_token(node: &Node) -> Result<String> {
    node.apply(GREETINGS_CONTROLLER)?;
    node.kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd/greetings.example.com",
        "--timeout=60s",
    ])?;
    node.apply(&format!(
        "apiVersion: v1
kind: ServiceAccount
metadata: {{name: {TOKEN_CALLER}, namespace: plugins}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: 'kplug:operator:{TOKEN_CALLER}'}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: 'kplug:operator'}}
subjects:
- {{kind: ServiceAccount, name: {TOKEN_CALLER}, namespace: plugins}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: 'greetings-controller:{TOKEN_CALLER}'}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: greetings-controller}}
subjects:
- {{kind: ServiceAccount, name: {TOKEN_CALLER}, namespace: plugins}}
"
    ))?;
    node.token("plugins", TOKEN_CALLER)
}

/// The ClusterIP of the Service `kplug-system/kplug`.
fn kplug_service_ip(node: &Node) -> Result<std::net::IpAddr> {
    let service = node.kubectl_json(&["-n", "kplug-system", "get", "service", "kplug"])?;
    let ip = service["spec"]["clusterIP"]
        .as_str()
        .context("the Service kplug has no clusterIP")?;
    ip.parse()
        .with_context(|| format!("the Service kplug's clusterIP {ip:?}"))
}

/// One HTTP/2 connection over mutual TLS to a plugin pod, configured as
/// kplug's proxy configures its own.
async fn plugin_client(pod: &Pod, tls: &ClientTlsConfig) -> Result<PluginClient<Channel>> {
    let address = format!("https://{}:{PLUGIN_PORT}", pod.ip);
    let channel = Endpoint::from_shared(address.clone())
        .context("the plugin's endpoint")?
        .tls_config(tls.clone())
        .context("the plugin's TLS")?
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10))
        .connect()
        .await
        .with_context(|| format!("connecting to {PLUGIN} at {address}"))?;
    Ok(PluginClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}

/// One call on every connection of every route, with the answers checked
/// in full: kplug's greeting, and the plugin's.
pub(super) async fn check(callers: &mut Callers, payload: &Payload, object: &Value) -> Result<()> {
    let greeting = format!(
        "hello, {}",
        object["metadata"]["name"].as_str().unwrap_or("")
    );
    for route in Route::ALL {
        for caller in callers.route_mut(route) {
            match caller {
                Caller::Api(api) => {
                    let (status, body) =
                        api.post_json(RECONCILE_PATH, payload.body.clone()).await?;
                    let answer: Value = serde_json::from_slice(&body)
                        .with_context(|| format!("{}: {status}: not JSON", route.label()))?;
                    ensure!(
                        status == StatusCode::CREATED
                            && answer["status"]["plugin"]["name"] == PLUGIN
                            && answer["status"]["objectStatus"]["greeting"] == greeting.as_str(),
                        "{}: unexpected answer {status}: {answer}",
                        route.label()
                    );
                }
                Caller::Plugin(client) => {
                    let reply = client
                        .reconcile(ReconcileRequest {
                            operation_id: "00000000-0000-4000-8000-000000000000".to_owned(),
                            object: payload.object.clone(),
                            timeout: prost_types::Duration::try_from(RECONCILE_TIMEOUT).ok(),
                            ..ReconcileRequest::default()
                        })
                        .await
                        .context("direct reconcile")?
                        .into_inner();
                    let status: Value = serde_json::from_slice(&reply.object_status)
                        .context("the plugin's objectStatus")?;
                    ensure!(
                        reply.success && status["greeting"] == greeting.as_str(),
                        "unexpected direct answer: {reply:?}"
                    );
                }
            }
        }
    }
    Ok(())
}
