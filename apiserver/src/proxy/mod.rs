//! gRPC to plugins: one reused HTTP/2 channel per instance address, calls
//! spread over a plugin's Ready instances with a bound on in-flight calls
//! per instance ([`balance`]), deadlines, and honest failure kinds.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use kplug_api::canary::Track;
use kplug_proto::trace::{TRACEPARENT, TraceParent};
use kplug_proto::v1alpha1::plugin_client::PluginClient;
use kplug_proto::v1alpha1::{ReconcileRequest, ReconcileResponse};
use parking_lot::Mutex;
use tokio::sync::{Semaphore, broadcast};
use tonic::transport::Channel;

use crate::registry::{EventType, Registry};
use crate::v1alpha1::{Operation, Plugin, PluginInstance};
use crate::version::VersionConstraint;

mod balance;
mod failure;
mod metrics;
mod tls;
use balance::{Chosen, undelivered};
pub use failure::Target;
use failure::{Timeouts, classify};
pub use metrics::ProxyMetrics;
pub use tls::{PluginTls, PluginTlsError, PluginTlsFiles, PluginTlsSource};

/// Tunables of the proxy.
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    /// Calls in flight to one plugin instance beyond which it takes no
    /// more; a call is refused (429) when every Ready instance is full.
    pub max_in_flight: usize,
    /// Largest message accepted from or sent to a plugin.
    pub max_message_bytes: usize,
    /// How long to wait for a TCP connection to a plugin.
    pub connect_timeout: Duration,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            max_in_flight: 256,
            max_message_bytes: 4 << 20,
            connect_timeout: Duration::from_secs(2),
        }
    }
}

/// Why a call did not produce the plugin's answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyError {
    #[error("plugin {plugin} already has {limit} calls in flight on each Ready instance")]
    Busy { plugin: String, limit: usize },
    #[error("plugin {plugin} has no Ready instance")]
    NoneReady { plugin: String },
    #[error("{target} {what}")]
    Unavailable { target: Target, what: String },
    #[error("{target} did not answer within {timeout:?}")]
    DeadlineExceeded { target: Target, timeout: Duration },
    #[error("{target} rejected the request: {message}")]
    Rejected { target: Target, message: String },
    #[error("plugin {plugin} does not implement {operation}")]
    Unimplemented { plugin: String, operation: String },
    #[error("{target} failed ({}): {message}", code.description())]
    Failed {
        target: Target,
        code: tonic::Code,
        message: String,
    },
    #[error("plugin {plugin} has an invalid address {address:?}: {detail}")]
    InvalidAddress {
        plugin: String,
        address: String,
        detail: String,
    },
    /// What the plugin sent is not HTTP/2, or broken HTTP/2.
    #[error("{target} does not speak gRPC over HTTP/2: {detail}")]
    NotGrpc { target: Target, detail: String },
    /// The answer is larger than kplug accepts.
    #[error("{target} answered more than kplug accepts (--max-request-bytes plus 1 MiB): {detail}")]
    AnswerTooLarge { target: Target, detail: String },
    /// kplug and the plugin do not accept each other's certificates.
    #[error("TLS with {target} failed: {detail}")]
    Tls { target: Target, detail: String },
}

/// Which of a plugin's instances may take a call.
#[derive(Clone, Copy, Debug, Default)]
pub struct Route<'a> {
    /// Only instances of a version in this range.
    pub versions: Option<&'a VersionConstraint>,
    /// Only the instances on this side of a canary.
    pub track: Option<Track>,
    /// Only shadow instances (a dry-run copy); otherwise none.
    pub shadow: bool,
}

impl Route<'_> {
    pub fn admits(&self, instance: &PluginInstance) -> bool {
        self.versions.is_none_or(|v| v.matches(&instance.version))
            && self.track.is_none_or(|t| Track::of(instance) == t)
            && instance.is_shadow() == self.shadow
    }
}

/// A plugin's answer, and the instance that gave it.
#[derive(Debug)]
pub struct Answered {
    pub response: ReconcileResponse,
    /// The instance's name (its pod's, else its address).
    pub instance: String,
    /// The instance's release, which differs from the plugin's during a
    /// rolling update.
    pub version: String,
}

#[derive(Clone)]
struct Upstream {
    client: PluginClient<Channel>,
    in_flight: Arc<Semaphore>,
    /// What the channel was made with: the TLS generation (0: plaintext)
    /// and the server name verified. Either changing replaces it.
    tls_generation: u64,
    server_name: String,
}

/// What the attempts of one call share.
#[derive(Clone, Copy)]
struct Call<'a> {
    name: &'a str,
    /// The plugin's Ready instances.
    instances: &'a [&'a PluginInstance],
    operation: Operation,
    deadline: Instant,
    /// The whole call's, for messages.
    timeout: Duration,
    trace: &'a TraceParent,
}

/// Calls plugins on behalf of API requests.
pub struct Proxy {
    config: ProxyConfig,
    upstreams: Mutex<HashMap<String, Upstream>>,
    metrics: ProxyMetrics,
    /// Where the search for the least busy instance starts, turning with
    /// every call.
    rotation: AtomicUsize,
    /// `None`: plugins are dialed in plaintext.
    tls: Option<Arc<PluginTls>>,
}

impl Proxy {
    pub fn new(config: ProxyConfig) -> Self {
        Self {
            config,
            upstreams: Mutex::new(HashMap::new()),
            metrics: ProxyMetrics::default(),
            rotation: AtomicUsize::new(0),
            tls: None,
        }
    }

    /// Dials plugins over mutual TLS with `tls` (`None`: plaintext).
    pub fn with_tls(mut self, tls: Option<Arc<PluginTls>>) -> Self {
        self.tls = tls;
        self
    }

    /// Counts calls into `metrics` (registered by the caller).
    pub fn with_metrics(mut self, metrics: ProxyMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    pub fn config(&self) -> &ProxyConfig {
        &self.config
    }

    fn upstream(&self, plugin: &str, instance: &PluginInstance) -> Result<Upstream, ProxyError> {
        let address = &instance.address;
        let server_name = instance.server_name.as_str();
        let tls_generation = self.tls.as_ref().map_or(0, |tls| tls.generation());
        let mut upstreams = self.upstreams.lock();
        let cached = upstreams.get(address);
        if let Some(upstream) = cached
            && upstream.tls_generation == tls_generation
            && upstream.server_name == server_name
        {
            return Ok(upstream.clone());
        }
        // A replaced channel keeps its bound on calls in flight: the calls
        // still running on the old channel count against the new one.
        let in_flight = cached.map_or_else(
            || Arc::new(Semaphore::new(self.config.max_in_flight)),
            |upstream| upstream.in_flight.clone(),
        );
        let material = self.tls.as_ref().map(|tls| tls.current());
        let endpoint = tls::endpoint(
            &Target::new(plugin, instance),
            server_name,
            material.as_deref(),
            self.config.connect_timeout,
        )?;
        let channel = endpoint
            .connect_timeout(self.config.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(10))
            .connect_lazy();
        let upstream = Upstream {
            client: PluginClient::new(channel)
                .max_decoding_message_size(self.config.max_message_bytes)
                .max_encoding_message_size(self.config.max_message_bytes),
            in_flight,
            tls_generation: material.map_or(0, |material| material.generation),
            server_name: server_name.to_owned(),
        };
        upstreams.insert(address.clone(), upstream.clone());
        Ok(upstream)
    }

    /// Drops the channel to `address`.
    pub fn forget(&self, address: &str) {
        self.upstreams.lock().remove(address);
    }

    /// How many plugin channels are open.
    pub fn channels(&self) -> usize {
        self.upstreams.lock().len()
    }

    /// Calls `operation` on `plugin`, waiting at most `timeout`; the plugin
    /// receives `trace` as its `traceparent`. Only its instances that
    /// `route` admits take the call.
    pub async fn call(
        &self,
        plugin: &Plugin,
        operation: Operation,
        request: ReconcileRequest,
        timeout: Duration,
        trace: &TraceParent,
        route: Route<'_>,
    ) -> Result<Answered, ProxyError> {
        let started = Instant::now();
        let result = self
            .call_unmeasured(plugin, operation, request, timeout, trace, route)
            .await;
        self.metrics.call(
            plugin.name(),
            operation.as_str(),
            started.elapsed().as_secs_f64(),
            &result,
            |answer| answer.response.success,
        );
        result
    }

    /// Calls one of `plugin`'s shadow instances with a dry-run copy of a
    /// reconcile. Not counted in the plugin's call metrics: the shadow's
    /// record is the registry's.
    pub async fn call_shadow(
        &self,
        plugin: &Plugin,
        operation: Operation,
        request: ReconcileRequest,
        timeout: Duration,
        trace: &TraceParent,
    ) -> Result<Answered, ProxyError> {
        let route = Route {
            shadow: true,
            ..Route::default()
        };
        self.call_unmeasured(plugin, operation, request, timeout, trace, route)
            .await
    }

    /// Calls one Ready instance of `plugin`, and another when the first
    /// never received the call (see [`balance`]).
    async fn call_unmeasured(
        &self,
        plugin: &Plugin,
        operation: Operation,
        request: ReconcileRequest,
        timeout: Duration,
        trace: &TraceParent,
        route: Route<'_>,
    ) -> Result<Answered, ProxyError> {
        let deadline = Instant::now() + timeout;
        let name = plugin.name();
        let mut fallback = None;
        let mut instances = balance::serving(plugin, &mut fallback);
        instances.retain(|instance| route.admits(instance));
        if instances.is_empty() {
            return Err(ProxyError::NoneReady {
                plugin: name.to_owned(),
            });
        }
        let first = self.choose(name, &instances, None)?;
        let failed = first.index;
        let call = Call {
            name,
            instances: &instances,
            operation,
            deadline,
            timeout,
            trace,
        };
        // The object and extensions are shared bytes: a copy is cheap.
        let spare = (instances.len() > 1).then(|| request.clone());
        let (error, delivered) = match self.attempt(&call, first, request).await {
            Ok(answer) => return Ok(answer),
            Err(failure) => failure,
        };
        let (Some(request), false) = (spare, delivered) else {
            return Err(error);
        };
        let Ok(second) = self.choose(name, &instances, Some(failed)) else {
            return Err(error);
        };
        tracing::debug!(
            plugin = name,
            failed = %instances.get(failed).map_or("", |i| i.name.as_str()),
            retry = %instances.get(second.index).map_or("", |i| i.name.as_str()),
            %error,
            "the call never reached the instance: trying another"
        );
        self.attempt(&call, second, request)
            .await
            .map_err(|(error, _)| error)
    }

    /// One call to the chosen instance. A failure says whether the call may
    /// have reached the plugin (`true`) or certainly did not (`false`).
    async fn attempt(
        &self,
        call: &Call<'_>,
        chosen: Chosen,
        request: ReconcileRequest,
    ) -> Result<Answered, (ProxyError, bool)> {
        let Call {
            name,
            instances,
            operation,
            deadline,
            timeout,
            trace,
        } = *call;
        let Chosen {
            index,
            upstream,
            permit: _permit,
        } = chosen;
        let Some(instance) = instances.get(index) else {
            let error = ProxyError::NoneReady {
                plugin: name.to_owned(),
            };
            return Err((error, false));
        };
        let target = Target::new(name, instance);
        let remaining = deadline.saturating_duration_since(Instant::now());
        let mut client = upstream.client;
        let mut grpc_request = tonic::Request::new(request);
        // Tells the plugin its deadline (grpc-timeout); the local timeout
        // below also covers a plugin that ignores it.
        grpc_request.set_timeout(remaining);
        if let Ok(mut value) = trace
            .to_string()
            .parse::<tonic::metadata::AsciiMetadataValue>()
        {
            // Unique per call: HPACK would only churn its table indexing it.
            value.set_sensitive(true);
            grpc_request.metadata_mut().insert(TRACEPARENT, value);
        }
        let call = async {
            match operation {
                Operation::Reconcile => client.reconcile(grpc_request).await,
                Operation::Finalize => client.finalize(grpc_request).await,
            }
        };
        let answer = match tokio::time::timeout(remaining, call).await {
            Ok(answer) => answer,
            Err(_) => return Err((ProxyError::DeadlineExceeded { target, timeout }, true)),
        };
        let timeouts = Timeouts {
            call: timeout,
            connect: self.config.connect_timeout,
        };
        match answer {
            Ok(response) => Ok(Answered {
                response: response.into_inner(),
                instance: target.instance,
                version: instance.version.clone(),
            }),
            Err(status) => {
                let delivered = !undelivered(&status);
                Err((classify(target, operation, timeouts, status), delivered))
            }
        }
    }

    /// Drops channels of plugins that leave the registry, until the
    /// registry's event feed closes. Subscribes before returning, so no
    /// departure after this call is missed.
    pub fn forget_departed(
        self: Arc<Self>,
        registry: Arc<Registry>,
    ) -> impl Future<Output = ()> + Send + 'static {
        let mut feed = registry.subscribe();
        async move {
            loop {
                match feed.recv().await {
                    Ok(event) if event.event_type == EventType::Deleted => {
                        if let Some(gone) = event.encoded.object() {
                            for address in gone.addresses() {
                                self.forget(address);
                            }
                            self.metrics.forget(gone.name());
                        }
                    }
                    // Instances that deregistered, expired or moved.
                    Ok(event) => {
                        let Some(previous) = event.previous.as_ref().and_then(|p| p.object())
                        else {
                            continue;
                        };
                        let Some(current) = event.encoded.object() else {
                            continue;
                        };
                        for address in previous.addresses() {
                            if !current.addresses().any(|a| a == address) {
                                self.forget(address);
                            }
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        // Missed departures: keep only channels of live instances.
                        let live: HashSet<String> = registry
                            .objects()
                            .iter()
                            .flat_map(|p| p.addresses().map(str::to_owned))
                            .collect();
                        self.upstreams
                            .lock()
                            .retain(|address, _| live.contains(address));
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        }
    }
}

#[cfg(test)]
mod testing;

#[cfg(test)]
mod tests {
    use jiff::Timestamp;

    use super::testing::{closed_address, declaration};
    use super::*;
    use crate::registry::{Declaration, Preconditions, RegistryConfig};

    #[tokio::test]
    async fn an_unreachable_plugin_is_unavailable_and_its_channel_goes_with_it() {
        let registry = Arc::new(Registry::new(RegistryConfig::default()));
        let proxy = Arc::new(Proxy::new(ProxyConfig::default()));
        let forget = tokio::spawn(proxy.clone().forget_departed(registry.clone()));
        let declaration = Declaration {
            interval: Duration::from_secs(1),
            ..declaration("gone", "", &closed_address())
        };
        registry
            .heartbeat(declaration, Timestamp::now())
            .expect("registered");
        let plugin = registry.get("gone").expect("plugin");

        let error = proxy
            .call(
                &plugin,
                Operation::Reconcile,
                ReconcileRequest::default(),
                Duration::from_secs(5),
                &TraceParent::new_root(),
                Route::default(),
            )
            .await
            .expect_err("nothing listens");
        assert!(matches!(error, ProxyError::Unavailable { .. }), "{error}");
        assert_eq!(proxy.channels(), 1, "the channel is kept for reuse");

        registry
            .delete("gone", &Preconditions::default())
            .expect("deleted");
        let dropped = tokio::time::timeout(Duration::from_secs(5), async {
            while proxy.channels() > 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(dropped.is_ok(), "the channel outlived its plugin");
        forget.abort();
    }
}
