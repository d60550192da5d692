//! The processes measured and the routes a call takes to the plugin.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use http::StatusCode;
use kplug_proto::v1alpha1::ReconcileRequest;
use kplug_proto::v1alpha1::plugin_client::PluginClient;
use kplug_test_support::measure::process_cpu_time;
use kplug_test_support::server_timing;
use kplug_test_support::{Process, free_port};
use rustls::pki_types::ServerName;

/// The user of standalone kplug's admin certificate, whom kplug names to
/// the plugin as the caller.
const STANDALONE_ADMIN: &str = "kplug-admin";
use serde::Deserialize;
use serde_json::Value;
use tonic::transport::{Channel, Endpoint};

use crate::payload::Payload;
use crate::relay::RelayProcess;
use crate::support::{ApiClient, REQUEST_TIMEOUT, STARTUP_TIMEOUT, Server, admin_tls_config};
use crate::{
    MAX_MESSAGE_BYTES, OBJECT_NAME, PLUGIN_INTERVAL_SECONDS, PLUGIN_NAME, RECONCILE_PATH,
    RECONCILE_TIMEOUT,
};

/// A kplug and the plugin registered with it, and for the current build a
/// relay in front of the same plugin.
pub struct Deployment {
    // Declared first, so that the relay and then the plugin are killed
    // before the server.
    pub relay: Option<RelayProcess>,
    pub plugin: PluginProcess,
    pub server: Server,
}

impl Deployment {
    pub fn start(server: Server, plugin_binary: &Path) -> Self {
        let plugin = PluginProcess::start(plugin_binary, &server);
        Self {
            relay: None,
            plugin,
            server,
        }
    }

    /// Starts a relay in front of this deployment's plugin.
    pub fn with_relay(mut self) -> Result<Self> {
        self.relay = Some(RelayProcess::start(
            &self.server.kplug,
            self.plugin.address,
        )?);
        Ok(self)
    }

    /// The CPU time so far of the process between the caller and the
    /// plugin on `route`: kplug, or the relay (none on the direct route,
    /// where kplug's own is given: idle, it shows what it spends alone).
    pub fn proxy_cpu_time(&self, route: Route) -> Result<Duration> {
        match route {
            Route::Relay => self.relay()?.cpu_time(),
            Route::Kplug | Route::Baseline | Route::Direct => self.server.cpu_time(),
        }
    }

    fn relay(&self) -> Result<&RelayProcess> {
        self.relay.as_ref().context("this deployment has no relay")
    }
}

/// A running `hello-plugin`, registered with kplug as `bench`; killed when
/// dropped.
pub struct PluginProcess {
    process: Process,
    pub address: SocketAddr,
}

impl PluginProcess {
    fn start(binary: &Path, server: &Server) -> Self {
        let address = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut command = Command::new(binary);
        // Settings come from the flags only.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("KPLUG_") {
                command.env_remove(key);
            }
        }
        let process = Process::spawn(
            command
                .args(["--registry", &format!("http://{}", server.grpc)])
                .args(["--name", PLUGIN_NAME])
                .args(["--listen", &address.to_string()])
                .args(["--heartbeat-interval", PLUGIN_INTERVAL_SECONDS])
                // The hello plugin logs every call at info; what is
                // measured here is kplug, not the plugin's log writing.
                .env("RUST_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit()),
            "hello-plugin",
        );
        let plugin = Self { process, address };
        eprintln!(
            "started hello-plugin (pid {}) on {}",
            plugin.pid(),
            plugin.address
        );
        plugin
    }

    fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub fn cpu_time(&self) -> Result<Duration> {
        process_cpu_time(self.pid())
    }
}

/// Which way a call goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Kplug,
    /// Through the earlier build of kplug.
    Baseline,
    Direct,
    /// Through the relay (`relay`): TLS and HTTP/2 in, the gRPC call out.
    Relay,
}

impl Route {
    pub fn label(self) -> &'static str {
        match self {
            Self::Kplug => "through kplug",
            Self::Baseline => "through kplug (baseline)",
            Self::Direct => "direct",
            Self::Relay => "through a relay",
        }
    }
}

/// One connection to call over.
#[derive(Clone)]
pub enum Caller {
    Kplug(ApiClient),
    Direct(PluginClient<Channel>),
    Relay(ApiClient),
}

/// The relay's path: any path is relayed.
const RELAY_PATH: &str = "/reconcile";

/// The parts of kplug's answer that are checked.
#[derive(Deserialize)]
struct Answer {
    status: AnswerStatus,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AnswerStatus {
    success: bool,
    plugin: AnswerPlugin,
    /// How long kplug waited for the plugin's gRPC answer.
    duration_milliseconds: f64,
}

#[derive(Deserialize)]
struct AnswerPlugin {
    name: String,
}

/// What one call measured.
pub struct Call {
    /// From sending the request to having read the whole answer.
    pub elapsed: Duration,
    /// Through kplug, with a checked answer: how long kplug's own gRPC call
    /// to the plugin took (`status.durationMilliseconds`).
    pub plugin_call: Option<Duration>,
    /// Through kplug, with a checked answer: the stages of kplug's handling
    /// as its `Server-Timing` header gives them (the baseline build may
    /// send none).
    pub stages: Vec<(String, Duration)>,
}

impl Caller {
    /// A new connection for `route` to `deployment` (whose server is the
    /// baseline build for [`Route::Baseline`]).
    pub async fn connect(route: Route, deployment: &Deployment) -> Result<Self> {
        Ok(match route {
            Route::Kplug | Route::Baseline => {
                Self::Kplug(ApiClient::connect(&deployment.server).await?)
            }
            Route::Direct => Self::Direct(connect_plugin(deployment.plugin.address).await?),
            Route::Relay => {
                let address = deployment.relay()?.address;
                Self::Relay(
                    ApiClient::connect_with(
                        address,
                        ServerName::IpAddress(address.ip().into()),
                        admin_tls_config(&deployment.server.kplug)?,
                        http::HeaderMap::new(),
                    )
                    .await?,
                )
            }
        })
    }

    /// Reconciles `payload` once. `check` decodes kplug's JSON answer and
    /// checks it, after the timed part; the plugin's answer is always checked.
    pub async fn reconcile(
        &mut self,
        payload: &Payload,
        number: usize,
        check: bool,
    ) -> Result<Call> {
        match self {
            Self::Kplug(api) => {
                let started = Instant::now();
                let (status, headers, body) = api
                    .post_json_with_headers(RECONCILE_PATH, payload.body.clone())
                    .await?;
                let elapsed = started.elapsed();
                if status != StatusCode::CREATED {
                    bail!(
                        "reconcile {number} through kplug: {status}: {}",
                        String::from_utf8_lossy(&body)
                    );
                }
                let mut plugin_call = None;
                let mut stages = Vec::new();
                if check {
                    if let Some(timing) = headers.get("server-timing") {
                        let timing = timing.to_str().context("a Server-Timing header")?;
                        stages = server_timing::parse(timing)?;
                    }
                    let answer: Answer = serde_json::from_slice(&body).with_context(|| {
                        format!("reconcile {number} through kplug: undecodable answer")
                    })?;
                    ensure!(
                        answer.status.success && answer.status.plugin.name == PLUGIN_NAME,
                        "reconcile {number} through kplug did not succeed on {PLUGIN_NAME}: {}",
                        String::from_utf8_lossy(&body)
                    );
                    plugin_call = Some(Duration::from_secs_f64(
                        answer.status.duration_milliseconds.max(0.0) / 1000.0,
                    ));
                }
                Ok(Call {
                    elapsed,
                    plugin_call,
                    stages,
                })
            }
            Self::Direct(client) => {
                let mut request =
                    tonic::Request::new(plugin_request(payload.object.clone().into(), number));
                request.set_timeout(RECONCILE_TIMEOUT);
                let started = Instant::now();
                let reply = tokio::time::timeout(REQUEST_TIMEOUT, client.reconcile(request))
                    .await
                    .with_context(|| format!("direct reconcile {number} took too long"))?
                    .with_context(|| format!("direct reconcile {number}"))?
                    .into_inner();
                let elapsed = started.elapsed();
                ensure!(
                    reply.success,
                    "direct reconcile {number} did not succeed: {reply:?}"
                );
                Ok(Call {
                    elapsed,
                    plugin_call: None,
                    stages: Vec::new(),
                })
            }
            Self::Relay(relay) => {
                let object = Bytes::from(payload.object.clone());
                let started = Instant::now();
                let (status, body) = relay.post_json(RELAY_PATH, object).await?;
                let elapsed = started.elapsed();
                ensure!(
                    status == StatusCode::OK,
                    "reconcile {number} through the relay: {status}: {}",
                    String::from_utf8_lossy(&body)
                );
                if check {
                    let status: Value =
                        serde_json::from_slice(&body).context("the relayed objectStatus")?;
                    ensure!(
                        status["greeting"] == format!("hello, {OBJECT_NAME}").as_str(),
                        "reconcile {number} through the relay: {status}"
                    );
                }
                Ok(Call {
                    elapsed,
                    plugin_call: None,
                    stages: Vec::new(),
                })
            }
        }
    }
}

/// What kplug sends the plugin for the bench's client, with `object`:
/// the direct route's and the relay's request.
pub fn plugin_request(object: Bytes, number: usize) -> ReconcileRequest {
    ReconcileRequest {
        // Same length as kplug's UUIDs.
        operation_id: format!("00000000-0000-4000-8000-{number:012x}"),
        dry_run: false,
        object,
        extensions: Vec::new(),
        timeout: prost_types::Duration::try_from(RECONCILE_TIMEOUT).ok(),
        // The same bytes as kplug's.
        caller: Some(kplug_proto::v1alpha1::UserInfo {
            username: STANDALONE_ADMIN.to_owned(),
            groups: vec!["system:masters".to_owned()],
            extra: Default::default(),
        }),
        ..ReconcileRequest::default()
    }
}

/// One HTTP/2 connection to the plugin, configured as kplug's proxy
/// configures its own.
pub async fn connect_plugin(address: SocketAddr) -> Result<PluginClient<Channel>> {
    let channel = Endpoint::from_shared(format!("http://{address}"))
        .context("the plugin's endpoint")?
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10))
        .connect()
        .await
        .with_context(|| format!("connecting to the plugin at {address}"))?;
    Ok(PluginClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}

/// [`connect_plugin`], retried until the plugin listens, for at most
/// `STARTUP_TIMEOUT`.
pub async fn connect_plugin_once_listening(address: SocketAddr) -> Result<PluginClient<Channel>> {
    tokio::time::timeout(STARTUP_TIMEOUT, async {
        loop {
            match connect_plugin(address).await {
                Ok(client) => return client,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await
    .with_context(|| format!("the plugin did not listen on {address} in time"))
}

/// Waits until kplug reconciles with the plugin (it has registered and is
/// Ready), then checks one answer of each route in full. Returns the size of
/// kplug's answer.
pub async fn check_routes(
    kplug: &mut ApiClient,
    direct: &mut PluginClient<Channel>,
    payload: &Payload,
) -> Result<usize> {
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    let body = loop {
        let (status, body) = kplug
            .post_json(RECONCILE_PATH, payload.body.clone())
            .await?;
        match status {
            StatusCode::CREATED => break body,
            // Not registered yet, or not Ready yet.
            StatusCode::NOT_FOUND | StatusCode::SERVICE_UNAVAILABLE
                if Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            _ => bail!(
                "reconcile through kplug: {status}: {}",
                String::from_utf8_lossy(&body)
            ),
        }
    };
    let greeting = format!("hello, {OBJECT_NAME}");
    let answer: Value = serde_json::from_slice(&body).context("kplug's answer is not JSON")?;
    let object: Value = serde_json::from_slice(&payload.object)?;
    ensure!(
        answer["status"]["success"] == true
            && answer["status"]["plugin"]["name"] == PLUGIN_NAME
            && answer["status"]["objectStatus"]["greeting"] == greeting.as_str()
            && answer["spec"]["object"] == object,
        "unexpected answer through kplug: {answer}"
    );
    let reply = direct
        .reconcile(ReconcileRequest {
            operation_id: "00000000-0000-4000-8000-000000000000".to_owned(),
            object: payload.object.clone().into(),
            timeout: prost_types::Duration::try_from(RECONCILE_TIMEOUT).ok(),
            ..ReconcileRequest::default()
        })
        .await
        .context("direct reconcile")?
        .into_inner();
    let status: Value =
        serde_json::from_slice(&reply.object_status).context("the plugin's objectStatus")?;
    ensure!(
        reply.success && status["greeting"] == greeting.as_str(),
        "unexpected direct answer: {reply:?}"
    );
    Ok(body.len())
}
