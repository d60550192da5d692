//! gRPC to plugins: one reused HTTP/2 channel per plugin address, a bound
//! on in-flight calls per plugin, deadlines, and honest failure kinds.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kplug_proto::trace::{TRACEPARENT, TraceParent};
use kplug_proto::v1alpha1::plugin_client::PluginClient;
use kplug_proto::v1alpha1::{ReconcileRequest, ReconcileResponse};
use parking_lot::Mutex;
use tokio::sync::{Semaphore, broadcast};
use tonic::transport::{Channel, Endpoint};

use crate::registry::{EventType, Registry};
use crate::v1alpha1::{Operation, Plugin};

mod metrics;
pub use metrics::ProxyMetrics;

/// Tunables of the proxy.
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    /// Calls beyond this many in flight to one plugin are refused (429).
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
    #[error("plugin {plugin} already has {limit} calls in flight")]
    Busy { plugin: String, limit: usize },
    #[error("plugin {plugin} at {address} is unavailable: {detail}")]
    Unavailable {
        plugin: String,
        address: String,
        detail: String,
    },
    #[error("plugin {plugin} did not answer within {timeout:?}")]
    DeadlineExceeded { plugin: String, timeout: Duration },
    #[error("plugin {plugin} rejected the request: {message}")]
    Rejected { plugin: String, message: String },
    #[error("plugin {plugin} does not implement {operation}")]
    Unimplemented { plugin: String, operation: String },
    #[error("plugin {plugin} failed ({code:?}): {message}")]
    Failed {
        plugin: String,
        code: tonic::Code,
        message: String,
    },
    #[error("plugin {plugin} has an invalid address {address:?}: {detail}")]
    InvalidAddress {
        plugin: String,
        address: String,
        detail: String,
    },
}

#[derive(Clone)]
struct Upstream {
    client: PluginClient<Channel>,
    in_flight: Arc<Semaphore>,
}

/// Calls plugins on behalf of API requests.
pub struct Proxy {
    config: ProxyConfig,
    upstreams: Mutex<HashMap<String, Upstream>>,
    metrics: ProxyMetrics,
}

impl Proxy {
    pub fn new(config: ProxyConfig) -> Self {
        Self {
            config,
            upstreams: Mutex::new(HashMap::new()),
            metrics: ProxyMetrics::default(),
        }
    }

    /// Counts calls into `metrics` (registered by the caller).
    pub fn with_metrics(mut self, metrics: ProxyMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    pub fn config(&self) -> &ProxyConfig {
        &self.config
    }

    fn upstream(&self, plugin: &Plugin) -> Result<Upstream, ProxyError> {
        let address = &plugin.spec.address;
        let mut upstreams = self.upstreams.lock();
        if let Some(upstream) = upstreams.get(address) {
            return Ok(upstream.clone());
        }
        let endpoint = Endpoint::from_shared(format!("http://{address}")).map_err(|e| {
            ProxyError::InvalidAddress {
                plugin: plugin.name().to_owned(),
                address: address.clone(),
                detail: e.to_string(),
            }
        })?;
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
            in_flight: Arc::new(Semaphore::new(self.config.max_in_flight)),
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
    /// receives `trace` as its `traceparent`.
    pub async fn call(
        &self,
        plugin: &Plugin,
        operation: Operation,
        request: ReconcileRequest,
        timeout: Duration,
        trace: &TraceParent,
    ) -> Result<ReconcileResponse, ProxyError> {
        let started = Instant::now();
        let result = self
            .call_unmeasured(plugin, operation, request, timeout, trace)
            .await;
        self.metrics.call(
            plugin.name(),
            operation.as_str(),
            started.elapsed().as_secs_f64(),
            &result,
            |answer| answer.success,
        );
        result
    }

    async fn call_unmeasured(
        &self,
        plugin: &Plugin,
        operation: Operation,
        request: ReconcileRequest,
        timeout: Duration,
        trace: &TraceParent,
    ) -> Result<ReconcileResponse, ProxyError> {
        let name = plugin.name().to_owned();
        let upstream = self.upstream(plugin)?;
        let _permit = upstream
            .in_flight
            .try_acquire()
            .map_err(|_| ProxyError::Busy {
                plugin: name.clone(),
                limit: self.config.max_in_flight,
            })?;
        let mut client = upstream.client;
        let mut grpc_request = tonic::Request::new(request);
        // Tells the plugin its deadline (grpc-timeout); the local timeout
        // below also covers a plugin that ignores it.
        grpc_request.set_timeout(timeout);
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
        let answer = tokio::time::timeout(timeout, call).await.map_err(|_| {
            ProxyError::DeadlineExceeded {
                plugin: name.clone(),
                timeout,
            }
        })?;
        answer
            .map(tonic::Response::into_inner)
            .map_err(|status| classify(&name, &plugin.spec.address, operation, timeout, status))
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
                        self.forget(&event.object.spec.address);
                        self.metrics.forget(event.object.name());
                    }
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        // Missed deletions: keep only channels of live plugins.
                        let live: HashSet<String> = registry
                            .list(None, |_| true)
                            .items
                            .iter()
                            .map(|i| i.object.spec.address.clone())
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

fn classify(
    plugin: &str,
    address: &str,
    operation: Operation,
    timeout: Duration,
    status: tonic::Status,
) -> ProxyError {
    let plugin = plugin.to_owned();
    match status.code() {
        tonic::Code::DeadlineExceeded => ProxyError::DeadlineExceeded { plugin, timeout },
        // A refused connection, or one that broke mid-call (the plugin
        // crashed): both mean "not now", never a success.
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled => {
            ProxyError::Unavailable {
                plugin,
                address: address.to_owned(),
                detail: status.message().to_owned(),
            }
        }
        tonic::Code::InvalidArgument => ProxyError::Rejected {
            plugin,
            message: status.message().to_owned(),
        },
        tonic::Code::Unimplemented => ProxyError::Unimplemented {
            plugin,
            operation: operation.as_str().to_owned(),
        },
        tonic::Code::ResourceExhausted => ProxyError::Busy { plugin, limit: 0 },
        code => ProxyError::Failed {
            plugin,
            code,
            message: status.message().to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use jiff::Timestamp;

    use super::*;
    use crate::registry::{Declaration, Preconditions, RegistryConfig};
    use crate::v1alpha1::{PluginApi, Protocol};

    fn declaration(address: &str) -> Declaration {
        Declaration {
            name: "gone".to_owned(),
            version: "1.0.0".to_owned(),
            api: PluginApi {
                group: "example.com".to_owned(),
                resource: "things".to_owned(),
                version: "v1".to_owned(),
            },
            implementation: "Test".to_owned(),
            address: address.to_owned(),
            extensions: Vec::new(),
            labels: BTreeMap::new(),
            interval: Duration::from_secs(1),
            protocol: Protocol::default(),
            registered_by: None,
        }
    }

    /// A loopback port with nothing listening.
    fn closed_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(1)
    }

    #[tokio::test]
    async fn an_unreachable_plugin_is_unavailable_and_its_channel_goes_with_it() {
        let registry = Arc::new(Registry::new(RegistryConfig::default()));
        let proxy = Arc::new(Proxy::new(ProxyConfig::default()));
        let forget = tokio::spawn(proxy.clone().forget_departed(registry.clone()));
        let address = format!("127.0.0.1:{}", closed_port());
        registry
            .heartbeat(declaration(&address), Timestamp::now())
            .expect("registered");
        let plugin = registry.get("gone").expect("plugin");

        let error = proxy
            .call(
                &plugin,
                Operation::Reconcile,
                ReconcileRequest::default(),
                Duration::from_secs(5),
                &TraceParent::new_root(),
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
