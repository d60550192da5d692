//! One reconcile of one object: resolve its extensions, delegate through
//! kplug, write the answer back, record Events, and decide when to come
//! back. Its finalizers are only those the object needs (`finalizers`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use kplug_api::v1alpha1::{ApiSelector, Operation, ReconcileStatus};
use kplug_proto::trace::TraceParent;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store, store::Writer};
use kube::{Client, ResourceExt};
use parking_lot::Mutex;
use serde_json::Value;
use tracing::{Instrument, info, warn};

mod children;
mod events;
mod writes;

pub use events::Events;

use children::Applied;
use writes::{LastWrite, Written};

use crate::Hooks;
use crate::binding::{self, bound_implementation, bound_major_version};
use crate::child_watch::ChildWatches;
use crate::children::ChildStatus;
use crate::config::Options;
use crate::delegate::{DelegateError, Delegation, Delegator};
use crate::extensions::{ExtensionError, Resolver};
use crate::finalizers::{self, Needed};
use crate::metrics::{DELEGATION_SUCCESS, Metrics, ReconcileResult};
use crate::status::{Outcome, RETRYING, reporter};

/// How soon a parent whose children are being removed is looked at again
/// (their deletion also wakes it, through the watch on their kind).
const CHILDREN_POLL: Duration = Duration::from_secs(2);

/// Why a reconcile ended early; each carries when to try again.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// Writing to the API failed (status, Events are best effort).
    #[error("writing {what}: {}", crate::words::kube_error(source))]
    Write {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// The object cannot be finalized yet; its conditions say why.
    #[error("not finalized yet: {0}")]
    NotFinalized(String, Duration),
}

impl ReconcileError {
    fn retry_in(&self) -> Option<Duration> {
        match self {
            Self::NotFinalized(_, retry_in) => Some(*retry_in),
            Self::Write { .. } => None,
        }
    }
}

/// What every reconcile of one operator shares.
pub struct Context {
    pub client: Client,
    /// Where kplug's reconciles go.
    pub delegator: Delegator,
    pub resource: ApiResource,
    pub api: ApiSelector,
    pub options: Options,
    pub hooks: Hooks,
    pub resolver: Resolver,
    pub events: Events,
    /// Objects that wait for a Ready plugin: a plugin turning Ready wakes them.
    pub waiting: Mutex<HashSet<ObjectRef<DynamicObject>>>,
    /// Objects whose last delegation did not reach kplug: kplug answering
    /// again wakes them (see `controller`).
    pub unreachable: Mutex<HashSet<ObjectRef<DynamicObject>>>,
    /// Told whenever an object joins `unreachable`.
    pub kplug_unreachable: tokio::sync::Notify,
    backoffs: Mutex<HashMap<ObjectRef<DynamicObject>, ExponentialBackoff>>,
    pub metrics: Metrics,
    /// Objects whose last reconcile scheduled a retry: `workqueue_depth`.
    retrying: Mutex<HashSet<ObjectRef<DynamicObject>>>,
    /// Where each kind of child is served, by `apiVersion/kind`.
    child_kinds: Mutex<HashMap<String, children::ChildKind>>,
    /// The watches on the children's kinds.
    pub child_watches: ChildWatches,
    /// The Plugins of the resource's API, as kplug's watch last showed them.
    plugins: Store<DynamicObject>,
    /// Each object as the last status write left it, with the
    /// resourceVersion that write replaced (`writes`).
    last_written: Mutex<HashMap<ObjectRef<DynamicObject>, LastWrite>>,
}

impl Context {
    pub fn new(
        client: Client,
        delegator: Delegator,
        resource: ApiResource,
        api: ApiSelector,
        options: Options,
        hooks: Hooks,
        events: Events,
    ) -> Self {
        let metrics = Metrics::new(&resource.kind.to_lowercase(), options.concurrency);
        Self {
            resolver: Resolver::new(client.clone()),
            client,
            delegator,
            resource,
            api,
            options,
            hooks,
            events,
            waiting: Mutex::default(),
            unreachable: Mutex::default(),
            kplug_unreachable: tokio::sync::Notify::new(),
            backoffs: Mutex::default(),
            metrics,
            retrying: Mutex::default(),
            child_kinds: Mutex::default(),
            child_watches: ChildWatches::default(),
            plugins: Writer::new(crate::controller::plugin_resource()).as_reader(),
            last_written: Mutex::default(),
        }
    }

    /// Reads the Plugins of the API from `plugins` (filled by the watch of
    /// them); without it none is known before it answers.
    pub fn with_plugins(mut self, plugins: Store<DynamicObject>) -> Self {
        self.plugins = plugins;
        self
    }

    /// Counts into `metrics` (the operator's, which it serves).
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Records a finished reconcile: its result and time, and whether the
    /// object now waits for a retry.
    fn reconciled(&self, object: &DynamicObject, result: ReconcileResult, took: Duration) {
        self.metrics.reconciled(result, took);
        let mut retrying = self.retrying.lock();
        if result.retries() {
            retrying.insert(self.object_ref(object));
        } else {
            retrying.remove(&self.object_ref(object));
        }
        self.metrics.queue_depth(retrying.len());
    }

    fn object_ref(&self, object: &DynamicObject) -> ObjectRef<DynamicObject> {
        ObjectRef::from_obj_with(object, self.resource.clone())
    }

    /// The next delay in the object's exponential backoff.
    fn backoff(&self, object: &DynamicObject) -> Duration {
        let builder = ExponentialBuilder::default()
            .with_min_delay(self.options.min_backoff)
            .with_max_delay(self.options.max_backoff)
            .with_jitter()
            .without_max_times();
        self.backoffs
            .lock()
            .entry(self.object_ref(object))
            .or_insert_with(|| builder.build())
            .next()
            .unwrap_or(self.options.max_backoff)
    }

    /// When to retry after kplug gave no answer: the object's backoff, never
    /// sooner than kplug's `Retry-After`. Without a Ready plugin the object
    /// also waits for one to appear; when kplug could not be reached, for
    /// kplug to answer again.
    fn retry_delay(&self, object: &DynamicObject, error: &DelegateError) -> Duration {
        match error {
            DelegateError::Unavailable { .. } => {
                self.waiting.lock().insert(self.object_ref(object));
            }
            DelegateError::Unreachable(_) => {
                self.unreachable.lock().insert(self.object_ref(object));
                self.kplug_unreachable.notify_one();
            }
            _ => {}
        }
        error
            .retry_after()
            .unwrap_or_default()
            .max(self.backoff(object))
    }

    /// Drops the object's backoff and waiting state: it succeeded, or it
    /// is going away.
    fn forget(&self, object: &DynamicObject) {
        let key = self.object_ref(object);
        self.last_written.lock().remove(&key);
        self.backoffs.lock().remove(&key);
        self.waiting.lock().remove(&key);
        self.unreachable.lock().remove(&key);
    }

    fn api_for(&self, object: &DynamicObject) -> Api<DynamicObject> {
        match object.namespace() {
            Some(namespace) => {
                Api::namespaced_with(self.client.clone(), &namespace, &self.resource)
            }
            None => Api::all_with(self.client.clone(), &self.resource),
        }
    }

    /// Writes the conditions (and keeps the rest) for an outcome without an
    /// answer, and records a Warning.
    async fn not_delegated(
        &self,
        api: &Api<DynamicObject>,
        object: &DynamicObject,
        reason: &str,
        message: String,
        action: &str,
    ) -> Result<(), ReconcileError> {
        warn!(object = %self.object_ref(object), reason, %message, "not reconciled");
        self.warning(object, reason, &message, action).await;
        let outcome = Outcome::NotDelegated { reason, message };
        let children = inventory(object);
        let written = Written {
            children: &children,
            prune_held: None,
        };
        self.write_outcome(api, object, bound_implementation(object), &outcome, written)
            .await?;
        Ok(())
    }

    /// Whether a plugin that may serve `object` declares `Finalize`, as the
    /// watch of Plugins last showed them. The finalizer then goes on before
    /// the first call, so that an object deleted just after a plugin acted
    /// on it is still finalized.
    fn may_finalize(&self, object: &DynamicObject) -> bool {
        let required = self
            .options
            .binding
            .required(bound_implementation(object), false);
        let preferred = (self.hooks.preferred_implementation)(object, &self.options);
        finalizers::may_finalize(&self.plugins.state(), required, preferred.as_deref())
    }

    /// Gives `object` the finalizers `needed` asks for (`held` is its
    /// list as last written), returning the list it has now. When the list
    /// changed since it was read (the patch tests it: a cache behind this
    /// operator's own write, or another controller's finalizer), it is read
    /// again and patched once more.
    async fn set_finalizers(
        &self,
        api: &Api<DynamicObject>,
        object: &DynamicObject,
        held: Vec<String>,
        needed: Needed,
    ) -> Result<Vec<String>, ReconcileError> {
        let names = self.options.finalizer_names();
        let name = object.name_any();
        let write_error = |source| ReconcileError::Write {
            what: "the object's finalizers".to_owned(),
            source,
        };
        let Some(patch) = finalizers::patch(&held, names, needed) else {
            return Ok(held);
        };
        let params = PatchParams::default();
        let written = match api.patch(&name, &params, &Patch::Json::<()>(patch)).await {
            Err(kube::Error::Api(status)) if status.code == 422 => {
                info!(object = %self.object_ref(object), "the finalizers changed since read: reading them again");
                let fresh = api.get(&name).await.map_err(write_error)?;
                let Some(patch) = finalizers::patch(fresh.finalizers(), names, needed) else {
                    return Ok(fresh.finalizers().to_vec());
                };
                api.patch(&name, &params, &Patch::Json::<()>(patch)).await
            }
            written => written,
        }
        .map_err(write_error)?;
        info!(
            object = %self.object_ref(object), finalize = needed.finalize,
            children = needed.children, "finalizers set"
        );
        Ok(written.finalizers().to_vec())
    }

    /// The extension objects `object` refers to.
    async fn extensions(
        &self,
        object: &DynamicObject,
        finalizing: bool,
    ) -> Result<Vec<DynamicObject>, ExtensionError> {
        let references = (self.hooks.extensions)(object, &self.options)?;
        let namespace = object.namespace();
        if !finalizing {
            return self
                .resolver
                .resolve(&references, namespace.as_deref())
                .await;
        }
        // An extension deleted before the object must not block its
        // finalization: finalize with the ones still there.
        let mut found = Vec::with_capacity(references.len());
        for reference in references {
            match self
                .resolver
                .resolve(std::slice::from_ref(&reference), namespace.as_deref())
                .await
            {
                Ok(objects) => found.extend(objects),
                Err(ExtensionError::NotFound { .. }) => {}
                Err(error) => return Err(error),
            }
        }
        Ok(found)
    }

    async fn call(
        &self,
        object: &DynamicObject,
        extensions: &[DynamicObject],
        observed_children: &[(String, DynamicObject)],
        operation: Operation,
        trace: TraceParent,
    ) -> Result<ReconcileStatus, DelegateError> {
        let finalizing = operation == Operation::Finalize;
        let required = self
            .options
            .binding
            .required(bound_implementation(object), finalizing);
        let preferred = (self.hooks.preferred_implementation)(object, &self.options);
        let own = self.options.version_constraint_path.get(&object.data);
        let default = self
            .options
            .version_constraint
            .as_ref()
            .map(ToString::to_string);
        let version_constraint = binding::version_constraint(
            own.and_then(Value::as_str),
            default.as_deref(),
            required.and(bound_major_version(object)),
        );
        let started = Instant::now();
        let answer = self
            .delegator
            .delegate(&Delegation {
                operation,
                api: &self.api,
                object,
                extensions,
                preferred_implementation: preferred.filter(|_| required.is_none()),
                required_implementation: required.map(str::to_owned),
                version_constraint,
                timeout: self.options.reconcile_timeout,
                traceparent: Some(trace),
                observed_children,
                child_scope: self.options.child_scope,
            })
            .await;
        let reason = answer
            .as_ref()
            .map_or_else(DelegateError::reason, |_| DELEGATION_SUCCESS);
        self.metrics
            .delegated(operation.as_str(), reason, started.elapsed());
        if let Ok(answer) = &answer {
            // The reconcile's span: every line from here on carries it.
            tracing::Span::current().record(
                "operation_id",
                tracing::field::display(&answer.operation_id),
            );
        }
        answer
    }

    /// `Event::Apply`: reconcile through a plugin.
    async fn apply(
        &self,
        api: &Api<DynamicObject>,
        object: &DynamicObject,
        trace: TraceParent,
    ) -> Result<(Action, ReconcileResult), ReconcileError> {
        use ReconcileResult::{Error, Requeue, RequeueAfter, Success};
        let key = self.object_ref(object);
        let extensions = match self.extensions(object, false).await {
            Ok(extensions) => extensions,
            Err(error) => {
                let message = format!("{error}; {RETRYING}");
                self.not_delegated(api, object, error.reason(), message, "Reconcile")
                    .await?;
                return Ok((Action::requeue(self.backoff(object)), Error));
            }
        };
        let names = self.options.finalizer_names();
        let mut finalizers = object.finalizers().to_vec();
        let held = Needed::held(&finalizers, names);
        if !held.finalize && self.may_finalize(object) {
            let needed = Needed {
                finalize: true,
                ..held
            };
            finalizers = self.set_finalizers(api, object, finalizers, needed).await?;
        }
        let inventory = inventory(object);
        let observed = self.observe_children(object, &inventory).await;
        let call = self.call(object, &extensions, &observed, Operation::Reconcile, trace);
        let answer = match call.await {
            Ok(answer) => answer,
            Err(DelegateError::TooManyRequests { retry_after, .. }) => {
                return Ok((Action::requeue(retry_after), Requeue));
            }
            Err(error) => {
                let delay = self.retry_delay(object, &error);
                let message = format!("{error}; {}", error.next_step());
                self.not_delegated(api, object, error.reason(), message, "Reconcile")
                    .await?;
                return Ok((Action::requeue(delay), Error));
            }
        };
        self.waiting.lock().remove(&key);
        let binding = match self
            .options
            .binding
            .required(bound_implementation(object), false)
        {
            Some(bound) => bound.to_owned(),
            None => answer.plugin.implementation.clone(),
        };
        // Before any child is applied: a child is never without the
        // finalizer that its removal needs.
        let needed = Needed {
            finalize: answer.plugin.declares(Operation::Finalize),
            children: finalizers::children_need_removing(
                object,
                &answer.desired_children,
                &inventory,
                &observed,
                self.options.child_scope == crate::config::ChildScope::Cluster,
            ),
        };
        self.set_finalizers(api, object, finalizers, needed).await?;
        // A failed answer leaves the children as they are.
        let Applied {
            lines: children,
            prune_held,
        } = match answer.success {
            true if !(answer.desired_children.is_empty() && inventory.is_empty()) => {
                self.apply_children(object, &answer.desired_children, &inventory, &observed)
                    .await
            }
            _ => Applied {
                lines: inventory,
                prune_held: None,
            },
        };
        if let Some(held) = &prune_held {
            warn!(object = %key, %held, "a mass prune is held");
            self.warning(object, "PrunePaused", held, "Reconcile").await;
        }
        let outcome = Outcome::Answered(&answer);
        let written = Written {
            children: &children,
            prune_held: prune_held.as_deref(),
        };
        let wrote = self
            .write_outcome(api, object, Some(&binding), &outcome, written)
            .await?;
        self.write_extension_statuses(object, &extensions, &answer)
            .await;
        if wrote || !answer.success {
            self.record_results(object, &answer, "Reconcile").await;
        }
        let asked = answer
            .requeue_after_seconds
            .filter(|s| s.is_finite() && *s > 0.0)
            .map(Duration::from_secs_f64);
        // A child not ready wakes its parent when it changes (the watch on
        // its kind); one the API refused is tried again with backoff.
        let refused = children.iter().any(|c| !c.error.is_empty());
        let asked = match refused {
            true => {
                let backoff = self.backoff(object);
                Some(asked.map_or(backoff, |a| a.min(backoff)))
            }
            false => asked,
        };
        let (requeue_in, result) = if answer.success {
            self.forget(object);
            match asked.filter(|a| *a < self.options.resync) {
                Some(asked) => (asked, RequeueAfter),
                None => (self.options.resync, Success),
            }
        } else {
            (asked.unwrap_or_default().max(self.backoff(object)), Error)
        };
        if !answer.success {
            let (reason, message) = crate::status::failure(&answer);
            warn!(
                object = %key, reason, %message, instance = %answer.plugin.instance,
                operation_id = %answer.operation_id, "the plugin reported a failure"
            );
        }
        info!(
            object = %key, plugin = %answer.plugin.name, implementation = %answer.plugin.implementation,
            selection = ?answer.selection.reason, success = answer.success, wrote,
            requeue_in_seconds = requeue_in.as_secs_f64(), operation_id = %answer.operation_id,
            "reconciled"
        );
        Ok((Action::requeue(requeue_in), result))
    }

    /// An object being deleted: its children go first, then, under the
    /// finalize finalizer, the bound implementation finalizes it; the
    /// operator's finalizers go once both are done.
    async fn cleanup(
        &self,
        api: &Api<DynamicObject>,
        object: &DynamicObject,
        trace: TraceParent,
    ) -> Result<Action, ReconcileError> {
        let key = self.object_ref(object);
        let held = Needed::held(object.finalizers(), self.options.finalizer_names());
        if !held.any() {
            // Someone else's finalizer keeps it: nothing here for us.
            self.forget(object);
            return Ok(Action::await_change());
        }
        let finalizers = object.finalizers().to_vec();
        // The children go first, highest wave first, whether or not a
        // plugin is up: the inventory says what they are.
        let children = inventory(object);
        if let Err(waiting) = self.tear_down_children(object, &children).await {
            let message = format!(
                "removing the object's children: {waiting}; the finalizers {} stay until they \
                 are gone",
                finalizers.join(", ")
            );
            self.not_delegated(
                api,
                object,
                "ChildrenRemaining",
                message.clone(),
                "Finalize",
            )
            .await?;
            return Err(ReconcileError::NotFinalized(message, CHILDREN_POLL));
        }
        match bound_implementation(object).filter(|_| held.finalize) {
            // Its finalizer predates a release that declares no Finalize
            // (kplug would refuse the call): nothing to clean up.
            Some(bound) if finalizers::declines_finalize(&self.plugins.state(), bound) => {
                info!(object = %key, implementation = bound, "its plugins declare no Finalize: nothing to finalize");
            }
            Some(bound) => self.finalize(api, object, bound, trace).await?,
            None if held.finalize => {
                info!(object = %key, "never served by a plugin: nothing to finalize");
            }
            None => {}
        }
        self.set_finalizers(api, object, finalizers, Needed::default())
            .await?;
        self.forget(object);
        Ok(Action::await_change())
    }

    /// The bound implementation's Finalize: `Ok` once it succeeded.
    async fn finalize(
        &self,
        api: &Api<DynamicObject>,
        object: &DynamicObject,
        bound: &str,
        trace: TraceParent,
    ) -> Result<(), ReconcileError> {
        let key = self.object_ref(object);
        let waiting_note = format!(
            "; the finalizer {} stays until a {bound} plugin finalizes the object",
            self.options.finalizer
        );
        let extensions = match self.extensions(object, true).await {
            Ok(extensions) => extensions,
            Err(error) => {
                let message = format!("{error}; {RETRYING}{waiting_note}");
                self.not_delegated(api, object, error.reason(), message.clone(), "Finalize")
                    .await?;
                return Err(ReconcileError::NotFinalized(message, self.backoff(object)));
            }
        };
        match self
            .call(object, &extensions, &[], Operation::Finalize, trace)
            .await
        {
            Ok(answer) if answer.success => {
                info!(object = %key, plugin = %answer.plugin.name, operation_id = %answer.operation_id, "finalized");
                self.record_results(object, &answer, "Finalize").await;
                Ok(())
            }
            Ok(answer) => {
                self.record_results(object, &answer, "Finalize").await;
                let why = answer.results.iter().find(|r| r.severity != "Normal");
                let reason = why.map_or("FinalizeFailed", |r| r.reason.as_str());
                let message = format!(
                    "{} (reported by {}); {RETRYING}{waiting_note}",
                    why.map_or("the plugin could not finalize", |r| &r.message),
                    reporter(&answer.plugin)
                );
                self.not_delegated(api, object, reason, message.clone(), "Finalize")
                    .await?;
                Err(ReconcileError::NotFinalized(message, self.backoff(object)))
            }
            Err(error) => {
                let delay = self.retry_delay(object, &error);
                let message = format!("{error}; {}{waiting_note}", error.next_step());
                self.not_delegated(api, object, error.reason(), message.clone(), "Finalize")
                    .await?;
                Err(ReconcileError::NotFinalized(message, delay))
            }
        }
    }
}

/// The children's inventory recorded in `object`'s status.
fn inventory(object: &DynamicObject) -> Vec<ChildStatus> {
    object
        .data
        .get("status")
        .map(crate::children::inventory)
        .unwrap_or_default()
}

/// The controller's reconcile function: one trace and one span per
/// reconcile (see [`crate::trace`]), counted in the metrics.
pub async fn reconcile(
    object: Arc<DynamicObject>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let _worker = ctx.metrics.worker();
    let started = Instant::now();
    let trace = crate::trace::for_object(&object);
    let span = tracing::info_span!(
        "reconcile",
        object = %ctx.object_ref(&object),
        trace_id = %trace.trace_id(),
        operation_id = tracing::field::Empty,
    );
    let api = ctx.api_for(&object);
    let outcome = async {
        match object.metadata.deletion_timestamp {
            Some(_) => (ctx.cleanup(&api, &object, trace).await)
                .map(|action| (action, ReconcileResult::Success)),
            None => ctx.apply(&api, &object, trace).await,
        }
    }
    .instrument(span)
    .await;
    let ended = match &outcome {
        Ok((_, ended)) => *ended,
        Err(_) => ReconcileResult::Error,
    };
    ctx.reconciled(&object, ended, started.elapsed());
    outcome.map(|(action, _)| action)
}

/// The controller's error policy: the error's own delay, else the object's backoff.
pub fn error_policy(
    object: Arc<DynamicObject>,
    error: &ReconcileError,
    ctx: Arc<Context>,
) -> Action {
    let delay = error.retry_in().unwrap_or_else(|| ctx.backoff(&object));
    warn!(object = %ctx.object_ref(&object), %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}
