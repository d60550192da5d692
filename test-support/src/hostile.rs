//! A hostile plugin, for the tests that show kplug contains one: a gRPC
//! plugin server whose answers misbehave on demand ([`Mode`]), a listener
//! that answers gRPC with garbage bytes, and a heartbeat flood.
//!
//! It is a fake on purpose: the SDKs cannot misbehave on demand. Everything
//! else is real: it heartbeats into kplug's registry over gRPC as an SDK
//! does, and kplug calls it over the network.
//!
//! Its servers run on a runtime of their own, stopped with the value that
//! started them; the tests themselves stay synchronous, as the rest of this
//! crate is.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kplug_proto::v1alpha1::plugin_server::{Plugin, PluginServer};
use kplug_proto::v1alpha1::registry_client::RegistryClient;
use kplug_proto::v1alpha1::{HeartbeatRequest, ReconcileRequest, ReconcileResponse};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::runtime::Runtime;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::{Request, Response, Status};

use crate::kplug::AggregatedKplug;
use crate::registry::heartbeat_request;

/// How the hostile plugin answers a reconcile.
#[derive(Clone, Debug)]
pub enum Mode {
    /// With this answer, at once.
    Answer(ReconcileResponse),
    /// With an object status (a JSON object) of this many bytes.
    Huge(usize),
    /// Never: the call stays open until kplug gives up on it.
    Silent,
    /// A success after this long, whatever deadline kplug sent.
    Late(Duration),
}

/// `{"filler":"xxx…"}` of exactly `bytes` bytes (at least 14).
pub fn json_of(bytes: usize) -> Vec<u8> {
    let mut json = b"{\"filler\":\"".to_vec();
    json.resize(bytes.saturating_sub(2).max(json.len()), b'x');
    json.extend_from_slice(b"\"}");
    json
}

/// `levels` objects nested in each other: `{"a":{"a":…{}}}`.
pub fn nested_json(levels: usize) -> Vec<u8> {
    let levels = levels.max(1);
    let mut json = "{\"a\":".repeat(levels - 1).into_bytes();
    json.extend_from_slice(b"{}");
    json.extend(std::iter::repeat_n(b'}', levels - 1));
    json
}

/// The mode, switched by the test while the server runs.
type Shared = Arc<Mutex<Mode>>;

fn current(mode: &Shared) -> Mode {
    mode.lock().expect("the hostile plugin's mode").clone()
}

struct Service {
    mode: Shared,
    calls: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl Plugin for Service {
    async fn reconcile(
        &self,
        _request: Request<ReconcileRequest>,
    ) -> Result<Response<ReconcileResponse>, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let answer = match current(&self.mode) {
            Mode::Answer(answer) => answer,
            Mode::Huge(bytes) => ReconcileResponse {
                success: true,
                object_status: json_of(bytes),
                ..ReconcileResponse::default()
            },
            Mode::Silent => std::future::pending().await,
            Mode::Late(delay) => {
                tokio::time::sleep(delay).await;
                ReconcileResponse {
                    success: true,
                    ..ReconcileResponse::default()
                }
            }
        };
        Ok(Response::new(answer))
    }

    async fn finalize(
        &self,
        request: Request<ReconcileRequest>,
    ) -> Result<Response<ReconcileResponse>, Status> {
        self.reconcile(request).await
    }
}

/// Where and as whom the hostile plugin heartbeats.
#[derive(Clone)]
pub struct Registration {
    /// `http://HOST:PORT`, or `https://localhost:PORT` with `tls`.
    pub registry: String,
    /// kplug's CA (PEM), which signed its gRPC certificate for `localhost`,
    /// and a ServiceAccount token sent as `authorization: Bearer`.
    pub tls: Option<(Vec<u8>, String)>,
    pub request: HeartbeatRequest,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Registration {
    /// Plugin `name` at `address`, asking for a 1 s interval, to
    /// `registry` (`http://HOST:PORT`) in plaintext, as standalone kplug
    /// takes heartbeats.
    pub fn plain(registry: &str, name: &str, address: &str) -> Self {
        Self {
            registry: registry.to_owned(),
            tls: None,
            request: heartbeat_request(name, "", address, Duration::from_secs(1)),
        }
    }

    /// `request` to kplug in cluster mode, over TLS with the token in
    /// `token_file`, as a plugin's SDK sends it.
    pub fn cluster(kplug: &AggregatedKplug, token_file: &Path, request: HeartbeatRequest) -> Self {
        let ca = kplug.certs.join("ca.crt");
        Self {
            registry: format!("https://localhost:{}", kplug.grpc),
            tls: Some((
                std::fs::read(&ca).unwrap_or_else(|e| panic!("read {}: {e}", ca.display())),
                std::fs::read_to_string(token_file)
                    .unwrap_or_else(|e| panic!("read {}: {e}", token_file.display())),
            )),
            request,
        }
    }

    /// A client of kplug's registry, over TLS when `tls` is given.
    async fn client(&self) -> Result<RegistryClient<Channel>, BoxError> {
        let mut endpoint = Endpoint::from_shared(self.registry.clone())?;
        if let Some((ca, _)) = &self.tls {
            endpoint = endpoint.tls_config(
                ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(ca))
                    .domain_name("localhost"),
            )?;
        }
        Ok(RegistryClient::new(endpoint.connect().await?))
    }

    /// `heartbeat` as this registration sends it: with its token, if any.
    fn request(&self, heartbeat: HeartbeatRequest) -> Result<Request<HeartbeatRequest>, BoxError> {
        let mut request = Request::new(heartbeat);
        if let Some((_, token)) = &self.tls {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse()?);
        }
        Ok(request)
    }

    /// Sends the heartbeat once: whether kplug accepted it.
    async fn send(&self) -> Result<bool, BoxError> {
        let mut client = self.client().await?;
        let reply = client
            .heartbeat(self.request(self.request.clone())?)
            .await?;
        Ok(reply.get_ref().accepted)
    }

    /// The `index`th heartbeat of a flood over `names` plugins: the
    /// registration's own when `names` is 1, else plugin `NAME-K` serving
    /// resource `rK` (K = `index` modulo `names`), each a new API.
    fn nth(&self, index: usize, names: usize) -> HeartbeatRequest {
        let mut heartbeat = self.request.clone();
        if names > 1 {
            let k = index % names;
            heartbeat.name = format!("{}-{k}", heartbeat.name);
            if let Some(api) = heartbeat.api.as_mut() {
                api.resource = format!("r{k}");
            }
        }
        heartbeat
    }
}

/// What a heartbeat flood got back from kplug.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Flood {
    pub sent: usize,
    pub accepted: usize,
    /// Answered, but not accepted (a refusal with a reason).
    pub refused: usize,
    /// Failed at the gRPC layer (any status code).
    pub failed: usize,
    pub elapsed: Duration,
}

/// A listener on a free loopback port, and its address.
fn bind(runtime: &Runtime) -> (TcpListener, String) {
    let listener = runtime
        .block_on(TcpListener::bind("127.0.0.1:0"))
        .expect("bind a loopback port");
    let address = listener
        .local_addr()
        .expect("a bound listener's address")
        .to_string();
    (listener, address)
}

/// The hostile plugin's runtime, servers and heartbeats; all stop on drop.
pub struct Hostile {
    runtime: Runtime,
    mode: Shared,
    calls: Arc<AtomicUsize>,
    /// Where its gRPC server listens.
    pub address: String,
}

impl Hostile {
    /// Starts the plugin server, answering as `mode` says.
    pub fn start(mode: Mode) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime for the hostile plugin");
        let mode = Arc::new(Mutex::new(mode));
        let calls = Arc::new(AtomicUsize::new(0));
        let (listener, address) = bind(&runtime);
        let service = Service {
            mode: mode.clone(),
            calls: calls.clone(),
        };
        // Served by axum, not tonic's transport server: that one would
        // answer DEADLINE_EXCEEDED at the deadline kplug sends, and this
        // plugin ignores deadlines. No limit on what it sends either.
        let router = tonic::service::Routes::new(
            PluginServer::new(service).max_encoding_message_size(usize::MAX),
        )
        .into_axum_router();
        let server = async move {
            let _ = axum::serve(listener, router).await;
        };
        runtime.spawn(server);
        Self {
            runtime,
            mode,
            calls,
            address,
        }
    }

    /// From now on, answers as `mode` says.
    pub fn set(&self, mode: Mode) {
        *self.mode.lock().expect("the hostile plugin's mode") = mode;
    }

    /// Reconcile and Finalize calls received so far.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// Runs `future` on the plugin's runtime.
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// Heartbeats to kplug's registry at `registry` (`http://HOST:PORT`)
    /// every second as plugin `name` at `address`, as an SDK does, until
    /// this value is dropped.
    pub fn heartbeat(&self, registry: &str, name: &str, address: &str) {
        self.heartbeat_as(Registration::plain(registry, name, address));
    }

    /// Sends `registration`'s heartbeat once: whether kplug accepted it,
    /// or the gRPC error.
    pub fn heartbeat_once(&self, registration: &Registration) -> Result<bool, String> {
        self.runtime
            .block_on(registration.send())
            .map_err(|e| e.to_string())
    }

    /// Sends `registration`'s heartbeat every second until this value is
    /// dropped.
    pub fn heartbeat_as(&self, registration: Registration) {
        self.runtime.spawn(async move {
            let mut ticks = tokio::time::interval(Duration::from_secs(1));
            loop {
                ticks.tick().await;
                // A failed heartbeat is retried at the next tick, as the
                // SDKs do; the test waits for the plugin to be Ready.
                let _ = registration.send().await;
            }
        });
    }

    /// Listens on loopback and answers every connection with garbage
    /// bytes (at most `limit` per connection, then closes it); returns its
    /// address, to be declared as a plugin's.
    pub fn garbage(&self, limit: usize) -> String {
        let (listener, address) = bind(&self.runtime);
        self.runtime.spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    // Not an HTTP/2 preface nor a frame: bytes of a cheap
                    // generator, the same on every connection.
                    let chunk: Vec<u8> = (0u32..4096)
                        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
                        .collect();
                    let mut written = 0;
                    while written < limit && stream.write_all(&chunk).await.is_ok() {
                        written += chunk.len();
                    }
                });
            }
        });
        address
    }

    /// Sends `registration`'s heartbeat, or heartbeats of `names` plugins
    /// in turn ([`Registration`]'s `nth`), at about `rate` a second for
    /// `duration`, over one connection with `concurrency` calls in flight
    /// at most, and counts kplug's answers.
    pub fn flood(
        &self,
        registration: &Registration,
        names: usize,
        rate: u32,
        duration: Duration,
        concurrency: usize,
    ) -> Flood {
        self.runtime.block_on(async move {
            let client = registration
                .client()
                .await
                .expect("connect to kplug's registry");
            let started = Instant::now();
            let deadline = started + duration;
            let workers = concurrency.max(1);
            // Each worker sends at rate / workers, so together they send at rate.
            let period = Duration::from_secs_f64(workers as f64 / f64::from(rate.max(1)));
            let registration = Arc::new(registration.clone());
            let next = Arc::new(AtomicUsize::new(0));
            let tasks: Vec<_> = (0..workers)
                .map(|_| {
                    let (mut client, registration, next) =
                        (client.clone(), registration.clone(), next.clone());
                    tokio::spawn(async move {
                        let mut counts = Flood::default();
                        let mut ticks = tokio::time::interval(period);
                        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                        while Instant::now() < deadline {
                            ticks.tick().await;
                            counts.sent += 1;
                            let index = next.fetch_add(1, Ordering::SeqCst);
                            let answer = match registration.request(registration.nth(index, names))
                            {
                                Ok(request) => client.heartbeat(request).await.ok(),
                                Err(_) => None,
                            };
                            match answer {
                                Some(reply) if reply.get_ref().accepted => counts.accepted += 1,
                                Some(_) => counts.refused += 1,
                                None => counts.failed += 1,
                            }
                        }
                        counts
                    })
                })
                .collect();
            let mut all = Vec::with_capacity(tasks.len());
            for task in tasks {
                all.push(task.await.expect("a flood worker"));
            }
            let mut total = Flood::default();
            for counts in all {
                total.sent += counts.sent;
                total.accepted += counts.accepted;
                total.refused += counts.refused;
                total.failed += counts.failed;
            }
            total.elapsed = started.elapsed();
            total
        })
    }
}
