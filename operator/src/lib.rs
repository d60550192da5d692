//! Operators that delegate to kplug plugins.
//!
//! An [`Operator`] watches one custom resource and, for each object:
//! resolves the extension objects it refers to, delegates it with one
//! `create reconciles.plugins.kplug.io` through kube-apiserver (so the
//! operator's RBAC applies; or, opted in, straight to kplug with the same
//! identity: [`DirectToKplug`]), records which implementation served it and
//! keeps it there ([`BindingPolicy`]), writes the plugin's answer into the
//! object's and the extensions' status with server-side apply, records
//! Events, finalizes through the plugin, and requeues with per-object
//! backoff. Objects waiting for a plugin wake when a Ready plugin of their
//! API appears (kplug's own watch API). Replicas elect a leader on a Lease.
//! Each delegation carries a W3C `traceparent` ([`trace`]), and the
//! operator serves Prometheus metrics ([`metrics`]) on an authorized
//! HTTPS `/metrics` endpoint.
//!
//! ```no_run
//! # async fn run(config: kube::Config, resource: kube::api::ApiResource) -> Result<(), kplug_operator::Error> {
//! use kplug_operator::{Operator, Options};
//! Operator::new(config, resource, Options::default())?
//!     .run(async { tokio::signal::ctrl_c().await.ok(); })
//!     .await
//! # }
//! ```

pub mod binding;
mod child_watch;
pub mod children;
mod config;
mod controller;
pub mod delegate;
pub mod direct;
mod discovery;
pub mod extensions;
mod finalizers;
mod leader;
pub mod metrics;
mod metrics_server;
mod reconciler;
pub mod status;
pub mod trace;
mod words;

use std::future::Future;
use std::sync::Arc;

use kube::api::{ApiResource, DynamicObject};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::store::Writer;
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use serde_json::Value;

pub use binding::BindingPolicy;
pub use config::{BindAddress, ChildScope, LeaderElection, MetricsServing, OperatorArgs, Options};
pub use direct::{DirectError, DirectToKplug};
pub use discovery::discover;
pub use extensions::{ExtensionError, ExtensionRef};
pub use kplug_api::reference::FieldPath;
pub use metrics::Metrics;
pub use metrics_server::{ServeError, TlsError};

use delegate::Delegator;
use reconciler::{Context, Events};

/// Resolves on SIGTERM (how Kubernetes stops a pod) or Ctrl-C.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let terminate = async {
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                terminate.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
    tracing::info!("shutting down: finishing the reconciles under way");
}

/// Why an operator stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("discovering {resource}: {why}")]
    Discovery { resource: String, why: String },
    #[error(
        "{0} has no status subresource: the operator writes status through it (add `subresources: {{status: {{}}}}` to its CRD version)"
    )]
    NoStatusSubresource(String),
    #[error("the Kubernetes client: {}", crate::words::kube_error(.0))]
    Client(#[from] kube::Error),
    #[error("leader election: {}", crate::words::lease_error(.0))]
    LeaderElection(#[from] kube_lease_manager::LeaseManagerError),
    #[error("lost the leader election Lease {0}: stopping so that only the new leader writes")]
    LostLeadership(String),
    #[error(transparent)]
    Metrics(#[from] ServeError),
    #[error("the direct path to kplug: {0}")]
    Direct(#[from] DirectError),
}

type ExtensionsHook =
    dyn Fn(&DynamicObject, &Options) -> Result<Vec<ExtensionRef>, ExtensionError> + Send + Sync;
type PreferredHook = dyn Fn(&DynamicObject, &Options) -> Option<String> + Send + Sync;

/// How an object names its extensions and preferred implementation: by
/// default the paths in [`Options`]; typed operators can read their own
/// fields instead.
#[derive(Clone)]
pub(crate) struct Hooks {
    extensions: Arc<ExtensionsHook>,
    preferred_implementation: Arc<PreferredHook>,
}

impl Default for Hooks {
    fn default() -> Self {
        Self {
            extensions: Arc::new(|object, options| {
                let path = &options.extensions_path;
                Ok(extensions::parse_references(
                    &path.to_string(),
                    path.get(&object.data),
                )?)
            }),
            preferred_implementation: Arc::new(|object, options| {
                let value = options.preferred_implementation_path.get(&object.data);
                value
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
            }),
        }
    }
}

fn parse<K: Resource + DeserializeOwned>(object: &DynamicObject) -> Result<K, ExtensionError> {
    object
        .clone()
        .try_parse::<K>()
        .map_err(|e| ExtensionError::InvalidObject(e.to_string()))
}

/// A delegating controller for one resource.
pub struct Operator {
    client: Client,
    delegator: Delegator,
    resource: ApiResource,
    options: Options,
    hooks: Hooks,
    metrics: Metrics,
}

impl Operator {
    /// An operator for a resource found through discovery (see [`discover`]).
    pub fn new(
        config: kube::Config,
        resource: ApiResource,
        options: Options,
    ) -> Result<Self, Error> {
        let client = Client::try_from(config.clone())?;
        let delegator = match &options.direct_to_kplug {
            Some(direct) => Delegator::direct(
                Client::try_from(direct.config(&config)?)?,
                direct.url.clone(),
            ),
            None => {
                let mut without_retries = config;
                without_retries.default_retry = false;
                Delegator::through_kube_apiserver(Client::try_from(without_retries)?)
            }
        };
        // controller-runtime names a controller after its kind, lowercased.
        let metrics = Metrics::new(&resource.kind.to_lowercase(), options.concurrency);
        Ok(Self {
            client,
            delegator,
            resource,
            options,
            hooks: Hooks::default(),
            metrics,
        })
    }

    /// The operator's metrics, to register into a registry of one's own
    /// ([`Metrics::register`]) when not serving them with
    /// [`Options::metrics`].
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// An operator for a typed resource, e.g. one derived with
    /// `kube::CustomResource`.
    pub fn for_resource<K: Resource<DynamicType = ()>>(
        config: kube::Config,
        options: Options,
    ) -> Result<Self, Error> {
        Self::new(config, ApiResource::erase::<K>(&()), options)
    }

    /// Reads the extension references from a typed object.
    #[must_use]
    pub fn extensions<K, F>(mut self, read: F) -> Self
    where
        K: Resource + DeserializeOwned,
        F: Fn(&K) -> Vec<ExtensionRef> + Send + Sync + 'static,
    {
        self.hooks.extensions = Arc::new(move |object, _| parse::<K>(object).map(|k| read(&k)));
        self
    }

    /// Reads the preferred implementation from a typed object.
    #[must_use]
    pub fn preferred_implementation<K, F>(mut self, read: F) -> Self
    where
        K: Resource + DeserializeOwned,
        F: Fn(&K) -> Option<String> + Send + Sync + 'static,
    {
        self.hooks.preferred_implementation =
            Arc::new(move |object, _| parse::<K>(object).ok().and_then(|k| read(&k)));
        self
    }

    /// Runs until `shutdown` completes (then finishes the reconciles under
    /// way) or, with leader election, until the Lease is lost.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), Error> {
        let reporter = Reporter {
            controller: self.options.field_manager.clone(),
            instance: self
                .options
                .leader_election
                .as_ref()
                .map(|l| l.identity.clone()),
        };
        let events = Events::new(self.client.clone(), reporter);
        // Served by every replica, leader or not, until `run` returns.
        let _metrics_server = match &self.options.metrics {
            Some(serving) => Some(
                metrics_server::start(
                    serving,
                    metrics::registry(&self.metrics),
                    self.client.clone(),
                )
                .await?,
            ),
            None => None,
        };
        let api = kplug_api::v1alpha1::ApiSelector {
            group: self.resource.group.clone(),
            resource: self.resource.plural.clone(),
            version: String::new(),
        };
        let watched = controller::Watched {
            extensions: discovery::discover_all(&self.client, &self.options.watched_extensions)
                .await?,
            children: discovery::discover_all(&self.client, &self.options.child_resources).await?,
        };
        let election = self.options.leader_election.clone();
        let plugins = Writer::new(controller::plugin_resource());
        let ctx = Arc::new(
            Context::new(
                self.client.clone(),
                self.delegator,
                self.resource,
                api,
                self.options,
                self.hooks,
                events,
            )
            .with_metrics(self.metrics.clone())
            .with_plugins(plugins.as_reader()),
        );
        match election {
            None => {
                controller::run(ctx, watched, plugins, shutdown).await;
                Ok(())
            }
            Some(election) => {
                leader::run_as_leader(self.client, &election, &self.metrics, shutdown, |stop| {
                    controller::run(ctx, watched, plugins, stop)
                })
                .await
            }
        }
    }
}
