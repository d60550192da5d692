//! Shadow copies: after a plugin answered a caller, a sampled share of its
//! reconciles goes again, with dryRun set, to its shadow instances (the
//! candidate of its next version), and the registry records how the two
//! answers compare (`kplug_api::shadow`). The copy runs once the caller's
//! answer is written, on a thread of its own at a lower CPU priority
//! ([`ShadowRunner`]): nothing the shadow does, answers, or fails to
//! answer reaches the caller, and when CPU is short callers get it first.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kplug_api::answer::{self, PluginAnswer};
use kplug_api::children::Placement;
use kplug_api::shadow::{self, KEPT_FIELDS, ShadowDifference};
use kplug_proto::trace::TraceParent;
use kplug_proto::v1alpha1 as proto;
use serde::Deserialize;
use tokio::runtime::Handle;
use tokio::sync::OwnedSemaphorePermit;
use tracing::Instrument;

use crate::proxy::{Answered, Proxy};
use crate::registry::{Comparison, Registry};
use crate::v1alpha1::{ChildScope, ObjectRef, Operation, Plugin, ReconcileStatus};

/// The nice value of the shadow thread: copies yield the CPU to callers.
const NICENESS: i32 = 10;

/// Where copies run: a single-threaded runtime on a thread of its own,
/// niced by [`NICENESS`] (on Linux a thread's nice value is its own), so
/// that comparing answers nobody waits for never takes CPU time from the
/// reconciles callers wait for. The thread lives as long as the process.
#[derive(Clone)]
pub struct ShadowRunner(Handle);

impl ShadowRunner {
    /// Starts the thread.
    pub fn start() -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        std::thread::Builder::new()
            .name("kplug-shadow".to_owned())
            .spawn(move || {
                if let Err(error) = rustix::process::setpriority_process(None, NICENESS) {
                    tracing::warn!(%error, "shadow copies run at the callers' CPU priority");
                }
                runtime.block_on(std::future::pending::<()>());
            })?;
        Ok(Self(handle))
    }
}

/// A reconcile sampled for the plugin's shadows, before the caller's
/// answer: the copy to send, with dryRun set.
pub(super) struct Sampled {
    request: proto::ReconcileRequest,
}

/// Whether this reconcile of `plugin` goes to a shadow too: the plugin has
/// a Ready shadow instance, and the reconcile falls in its share. `request`
/// is what the caller's plugin is sent (its objects are shared bytes, so
/// the copy is cheap).
pub(super) fn sample(plugin: &Plugin, request: &proto::ReconcileRequest) -> Option<Sampled> {
    let percent = plugin
        .status
        .ready_instances()
        .filter(|i| i.is_shadow())
        .map(|i| i.shadow_percent)
        .max()?;
    shadow::sampled(plugin.name(), &request.operation_id, percent).then(|| Sampled {
        request: proto::ReconcileRequest {
            dry_run: true,
            ..request.clone()
        },
    })
}

/// What the copy's task needs of the caller's call.
pub(super) struct Primary {
    pub plugin: Arc<Plugin>,
    pub operation: Operation,
    pub timeout: Duration,
    pub trace: TraceParent,
    /// The caller's answer.
    pub status: ReconcileStatus,
    /// Where the caller allows children: the shadow's are checked alike.
    pub child_scope: ChildScope,
}

/// Sends the copy to a shadow on a task of its own, or records it skipped
/// when the plugin has its most copies out (`Registry::shadow_slot`) or
/// cannot take a dry run.
pub(super) fn send(
    runner: &ShadowRunner,
    registry: &Arc<Registry>,
    proxy: &Arc<Proxy>,
    sampled: Sampled,
    primary: Primary,
) {
    let capabilities = &primary.plugin.spec.protocol.capabilities;
    let dry_run = capabilities.is_empty() || capabilities.iter().any(|c| c == "DryRun");
    let name = primary.plugin.name();
    let permit = match dry_run.then(|| registry.shadow_slot(name)).flatten() {
        Some(permit) => permit,
        None => {
            registry.shadow_outcome(name, Comparison::Skipped, Timestamp::now());
            return;
        }
    };
    let span = tracing::debug_span!(
        "shadow",
        plugin = %primary.plugin.name(),
        operation_id = %sampled.request.operation_id,
    );
    let registry = registry.clone();
    let proxy = proxy.clone();
    runner
        .0
        .spawn(compare(registry, proxy, sampled, primary, permit).instrument(span));
}

async fn compare(
    registry: Arc<Registry>,
    proxy: Arc<Proxy>,
    sampled: Sampled,
    primary: Primary,
    _permit: OwnedSemaphorePermit,
) {
    let request = sampled.request;
    let Primary {
        plugin,
        operation,
        timeout,
        trace,
        status,
        child_scope,
    } = primary;
    let object = object_ref(&request.object);
    let namespace = object.namespace.clone();
    let operation_id = request.operation_id.clone();
    let extensions = request.extensions.clone();
    let answered = proxy
        .call_shadow(&plugin, operation, request, timeout, &trace.child())
        .await;
    let primary = format!("{} ({})", status.plugin.version, status.plugin.instance);
    let difference = |shadow: String| ShadowDifference {
        time: Time(Timestamp::now()),
        operation_id,
        operation: operation.as_str().to_owned(),
        object,
        primary,
        shadow,
        error: String::new(),
        fields: Vec::new(),
        differing_fields: 0,
    };
    let comparison = match answered {
        // Nothing to compare with: the shadow went between sampling and
        // the call.
        Err(crate::proxy::ProxyError::NoneReady { .. }) => Comparison::Skipped,
        Err(error) => Comparison::Failed(ShadowDifference {
            error: error.to_string(),
            ..difference(String::new())
        }),
        Ok(Answered {
            response,
            instance,
            version,
        }) => {
            let shadow = format!("{version} ({instance})");
            let placement = Placement {
                namespace: &namespace,
                scope: child_scope,
            };
            match answer::checked(response, extensions.iter().map(|e| &e[..]), placement) {
                Err(error) => Comparison::Failed(ShadowDifference {
                    error: format!("the shadow's answer is refused: {error}"),
                    ..difference(shadow)
                }),
                Ok(answer) => {
                    let mut fields = shadow::differences(&answer_of(status), &answer);
                    if fields.is_empty() {
                        Comparison::Same
                    } else {
                        let differing_fields = fields.len();
                        fields.truncate(KEPT_FIELDS);
                        Comparison::Different(ShadowDifference {
                            fields,
                            differing_fields,
                            ..difference(shadow)
                        })
                    }
                }
            }
        }
    };
    if let Comparison::Different(d) | Comparison::Failed(d) = &comparison {
        tracing::debug!(
            fields = d.differing_fields,
            error = %d.error,
            "the shadow answered otherwise"
        );
    }
    registry.shadow_outcome(plugin.name(), comparison, Timestamp::now());
}

/// The plugin's part of the caller's answer, as the shadow's is read.
fn answer_of(status: ReconcileStatus) -> PluginAnswer {
    PluginAnswer {
        success: status.success,
        results: status.results,
        conditions: status.conditions,
        object_status: status.object_status,
        extension_statuses: status.extension_statuses,
        requeue_after_seconds: status.requeue_after_seconds,
        desired_children: status.desired_children,
    }
}

/// The reconciled object's reference, read from its JSON (what kplug
/// checked before the call: apiVersion, kind and name are there).
fn object_ref(object: &Bytes) -> ObjectRef {
    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Head {
        #[serde(default)]
        api_version: String,
        #[serde(default)]
        kind: String,
        #[serde(default)]
        metadata: Metadata,
    }
    #[derive(Default, Deserialize)]
    struct Metadata {
        #[serde(default)]
        namespace: String,
        #[serde(default)]
        name: String,
    }
    let head: Head = serde_json::from_slice(object).unwrap_or_default();
    ObjectRef {
        api_version: head.api_version,
        kind: head.kind,
        namespace: head.metadata.namespace,
        name: head.metadata.name,
    }
}
