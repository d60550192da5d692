//! The operator's Prometheus metrics, named as controller-runtime names
//! them (`controller_runtime_*`, `workqueue_*`, `leader_election_*`) so that
//! dashboards made for Go operators fit, plus kplug's own
//! (`kplug_operator_*`). [`Metrics`] owns the families; it is registered
//! into a `prometheus_client` [`Registry`] (no global statics) and shared
//! with every reconcile through the reconciler's context.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// controller-runtime's buckets for `controller_runtime_reconcile_time_seconds`.
const RECONCILE_BUCKETS: [f64; 40] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9,
    1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0,
    25.0, 30.0, 40.0, 50.0, 60.0,
];

/// How one reconcile ended, as controller-runtime's `result` label says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReconcileResult {
    /// Done: the object comes back only with a change or the periodic resync.
    Success,
    /// Not done (the plugin failed, no plugin, a write failed, ...): a
    /// retry with the object's backoff is scheduled.
    Error,
    /// Not done and not an error: kplug's plugin is at its concurrency
    /// bound, retry when it says.
    Requeue,
    /// Done, and the plugin asked to be called again sooner than the resync.
    RequeueAfter,
}

impl ReconcileResult {
    pub const ALL: [Self; 4] = [
        Self::Success,
        Self::Error,
        Self::Requeue,
        Self::RequeueAfter,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Error => "error",
            Self::Requeue => "requeue",
            Self::RequeueAfter => "requeue_after",
        }
    }

    /// Whether the object has a retry scheduled (it is in the "queue").
    pub fn retries(self) -> bool {
        matches!(self, Self::Error | Self::Requeue)
    }
}

/// The reasons of `kplug_operator_delegations_total`: `Success` when kplug
/// returned the plugin's answer, else the delegation error's reason.
pub const DELEGATION_SUCCESS: &str = "Success";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    controller: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DelegationLabels {
    operation: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriteLabels {
    target: &'static str,
    result: &'static str,
}

/// `type` is a keyword: the labels as pairs.
type EventLabels = [(&'static str, String); 2];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LeaseLabels {
    name: String,
}

/// What a status write was for.
#[derive(Clone, Copy, Debug)]
pub enum WriteTarget {
    /// The reconciled object's status.
    Object,
    /// An extension object's status.
    Extension,
}

type Buckets = fn() -> Histogram;

/// The operator's metric families for one controller.
#[derive(Clone, Debug)]
pub struct Metrics {
    controller: String,
    reconciles: Family<ResultLabels, Counter>,
    reconcile_errors: Family<ControllerLabels, Counter>,
    reconcile_time: Family<ControllerLabels, Histogram, Buckets>,
    active_workers: Family<ControllerLabels, Gauge>,
    max_workers: Family<ControllerLabels, Gauge>,
    queue_depth: Family<QueueLabels, Gauge>,
    queue_retries: Family<QueueLabels, Counter>,
    delegations: Family<DelegationLabels, Counter>,
    delegation_time: Family<OperationLabels, Histogram, Buckets>,
    status_writes: Family<WriteLabels, Counter>,
    events: Family<EventLabels, Counter>,
    event_failures: Counter,
    child_drifts: Family<KindLabels, Counter>,
    leader: Family<LeaseLabels, Gauge>,
}

impl Metrics {
    /// Metrics for the controller `controller` (controller-runtime's
    /// default name: the lowercased kind), with every result at zero.
    pub fn new(controller: &str, max_concurrent_reconciles: u16) -> Self {
        let metrics = Self {
            controller: controller.to_owned(),
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_time: Family::new_with_constructor(|| {
                Histogram::new(RECONCILE_BUCKETS.iter().copied())
            }),
            active_workers: Family::default(),
            max_workers: Family::default(),
            queue_depth: Family::default(),
            queue_retries: Family::default(),
            delegations: Family::default(),
            delegation_time: Family::new_with_constructor(|| {
                Histogram::new(RECONCILE_BUCKETS.iter().copied())
            }),
            status_writes: Family::default(),
            events: Family::default(),
            event_failures: Counter::default(),
            child_drifts: Family::default(),
            leader: Family::default(),
        };
        // As controller-runtime does: every series exists from the start,
        // so that rate() sees the first increment.
        for result in ReconcileResult::ALL {
            drop(metrics.reconciles.get_or_create(&metrics.result(result)));
        }
        let labels = metrics.controller_labels();
        drop(metrics.reconcile_errors.get_or_create(&labels));
        drop(metrics.active_workers.get_or_create(&labels));
        metrics
            .max_workers
            .get_or_create(&labels)
            .set(i64::from(max_concurrent_reconciles));
        drop(metrics.queue_depth.get_or_create(&metrics.queue_labels()));
        drop(metrics.queue_retries.get_or_create(&metrics.queue_labels()));
        metrics
    }

    /// Registers the families into `registry`; the metrics stay shared
    /// with this value.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "controller_runtime_reconcile",
            "Total number of reconciliations per controller, by result: success, \
             error (not reconciled; retried with backoff), requeue (kplug's plugin was \
             at its concurrency bound) or requeue_after (the plugin asked to come back \
             sooner than the resync)",
            self.reconciles.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_errors",
            "Total number of reconciliation errors per controller",
            self.reconcile_errors.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            self.reconcile_time.clone(),
        );
        registry.register(
            "controller_runtime_active_workers",
            "Number of currently used workers (reconciles under way) per controller",
            self.active_workers.clone(),
        );
        registry.register(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            self.max_workers.clone(),
        );
        registry.register(
            "workqueue_depth",
            "Objects whose last reconcile did not succeed and that have a retry scheduled, \
             including the objects waiting for a Ready plugin. kube-rs's scheduler is not \
             observable, so periodic resyncs, requeues a plugin asked for and changes \
             not yet picked up are not counted",
            self.queue_depth.clone(),
        );
        registry.register(
            "workqueue_retries",
            "Total number of retries scheduled: reconciles that ended in error or requeue",
            self.queue_retries.clone(),
        );
        registry.register(
            "kplug_operator_delegations",
            "Delegations to kplug (POST reconciles) by operation and outcome: Success when \
             kplug returned the plugin's answer (which may itself report a failure), \
             else the reason of the condition the object gets (PluginUnavailable, \
             KplugUnavailable, TooManyRequests, Forbidden, KplugNotServed, PluginTimeout, ReconcileRejected, \
             DelegationFailed)",
            self.delegations.clone(),
        );
        registry.register(
            "kplug_operator_delegation_duration_seconds",
            "Length of time of one delegation to kplug, whatever its outcome",
            self.delegation_time.clone(),
        );
        registry.register(
            "kplug_operator_status_writes",
            "Status writes (server-side apply) by target (object or extension) and result \
             (success or error); writes that would change nothing are skipped and not counted",
            self.status_writes.clone(),
        );
        registry.register(
            "kplug_operator_events",
            "Events recorded about the reconciled objects, by type and reason",
            self.events.clone(),
        );
        registry.register(
            "kplug_operator_event_failures",
            "Events that could not be recorded",
            self.event_failures.clone(),
        );
        registry.register(
            "kplug_operator_child_drifts",
            "Children applied again because another field manager had changed a field \
             the plugin asks for (drift undone), by the child's kind",
            self.child_drifts.clone(),
        );
        registry.register(
            "leader_election_master_status",
            "1 while this replica holds the leader election Lease `name`, else 0",
            self.leader.clone(),
        );
    }

    /// The controller's name in the `controller` and `name` labels.
    pub fn controller(&self) -> &str {
        &self.controller
    }

    fn controller_labels(&self) -> ControllerLabels {
        ControllerLabels {
            controller: self.controller.clone(),
        }
    }

    fn queue_labels(&self) -> QueueLabels {
        QueueLabels {
            name: self.controller.clone(),
        }
    }

    fn result(&self, result: ReconcileResult) -> ResultLabels {
        ResultLabels {
            controller: self.controller.clone(),
            result: result.as_str(),
        }
    }

    /// Counts a reconcile under way until the guard drops.
    pub fn worker(&self) -> WorkerGuard {
        let gauge = self
            .active_workers
            .get_or_create(&self.controller_labels())
            .clone();
        gauge.inc();
        WorkerGuard(gauge)
    }

    /// Records a finished reconcile.
    pub fn reconciled(&self, result: ReconcileResult, took: Duration) {
        self.reconciles.get_or_create(&self.result(result)).inc();
        if result == ReconcileResult::Error {
            self.reconcile_errors
                .get_or_create(&self.controller_labels())
                .inc();
        }
        if result.retries() {
            self.queue_retries.get_or_create(&self.queue_labels()).inc();
        }
        self.reconcile_time
            .get_or_create(&self.controller_labels())
            .observe(took.as_secs_f64());
    }

    /// Sets `workqueue_depth`.
    pub fn queue_depth(&self, depth: usize) {
        self.queue_depth
            .get_or_create(&self.queue_labels())
            .set(i64::try_from(depth).unwrap_or(i64::MAX));
    }

    /// Records a delegation's outcome (`reason`: [`DELEGATION_SUCCESS`] or
    /// the error's reason).
    pub fn delegated(&self, operation: &'static str, reason: &'static str, took: Duration) {
        self.delegations
            .get_or_create(&DelegationLabels { operation, reason })
            .inc();
        self.delegation_time
            .get_or_create(&OperationLabels { operation })
            .observe(took.as_secs_f64());
    }

    pub fn status_written(&self, target: WriteTarget, ok: bool) {
        let target = match target {
            WriteTarget::Object => "object",
            WriteTarget::Extension => "extension",
        };
        let result = if ok { "success" } else { "error" };
        self.status_writes
            .get_or_create(&WriteLabels { target, result })
            .inc();
    }

    /// Records an Event's publication (`normal`: its type).
    pub fn event(&self, normal: bool, reason: &str, ok: bool) {
        if !ok {
            self.event_failures.inc();
            return;
        }
        let type_ = if normal { "Normal" } else { "Warning" };
        let labels = [("type", type_.to_owned()), ("reason", reason.to_owned())];
        self.events.get_or_create(&labels).inc();
    }

    /// Counts a drift undone on a child of `kind`.
    pub fn child_drifted(&self, kind: &str) {
        let labels = KindLabels {
            kind: kind.to_owned(),
        };
        self.child_drifts.get_or_create(&labels).inc();
    }

    /// Sets `leader_election_master_status` for the Lease `lease`.
    pub fn leading(&self, lease: &str, leading: bool) {
        self.leader
            .get_or_create(&LeaseLabels {
                name: lease.to_owned(),
            })
            .set(i64::from(leading));
    }
}

/// Decrements `controller_runtime_active_workers` on drop.
pub struct WorkerGuard(Gauge);

impl Drop for WorkerGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// A registry with the operator's metrics and the process's
/// (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
/// `process_open_fds`, `process_start_time_seconds`, ...).
pub fn registry(metrics: &Metrics) -> Registry {
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    if let Err(error) =
        kubert_prometheus_process::register(registry.sub_registry_with_prefix("process"))
    {
        tracing::warn!(%error, "process metrics are not available");
    }
    registry
}

/// The registry in the Prometheus text format (OpenMetrics flavour).
pub fn encode(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
        text.lines().find(|l| l.starts_with(prefix))
    }

    #[test]
    fn names_and_labels_are_controller_runtimes() {
        let metrics = Metrics::new("widget", 4);
        let _busy = metrics.worker();
        metrics.reconciled(ReconcileResult::Success, Duration::from_millis(30));
        metrics.reconciled(ReconcileResult::Error, Duration::from_millis(70));
        metrics.reconciled(ReconcileResult::Requeue, Duration::from_millis(2));
        metrics.queue_depth(2);
        metrics.delegated("Reconcile", DELEGATION_SUCCESS, Duration::from_millis(20));
        metrics.delegated("Reconcile", "PluginUnavailable", Duration::from_millis(5));
        metrics.status_written(WriteTarget::Object, true);
        metrics.event(false, "Broken", true);
        metrics.event(true, "Greeted", false);
        metrics.leading("kplug-operator-widgets", true);
        let text = encode(&registry(&metrics)).expect("encodes");
        for expected in [
            r#"controller_runtime_reconcile_total{controller="widget",result="success"} 1"#,
            r#"controller_runtime_reconcile_total{controller="widget",result="error"} 1"#,
            r#"controller_runtime_reconcile_total{controller="widget",result="requeue"} 1"#,
            r#"controller_runtime_reconcile_total{controller="widget",result="requeue_after"} 0"#,
            r#"controller_runtime_reconcile_errors_total{controller="widget"} 1"#,
            r#"controller_runtime_reconcile_time_seconds_count{controller="widget"} 3"#,
            r#"controller_runtime_reconcile_time_seconds_bucket{le="0.05",controller="widget"} 2"#,
            r#"controller_runtime_active_workers{controller="widget"} 1"#,
            r#"controller_runtime_max_concurrent_reconciles{controller="widget"} 4"#,
            r#"workqueue_depth{name="widget"} 2"#,
            r#"workqueue_retries_total{name="widget"} 2"#,
            r#"kplug_operator_delegations_total{operation="Reconcile",reason="Success"} 1"#,
            r#"kplug_operator_delegations_total{operation="Reconcile",reason="PluginUnavailable"} 1"#,
            r#"kplug_operator_status_writes_total{target="object",result="success"} 1"#,
            r#"kplug_operator_events_total{type="Warning",reason="Broken"} 1"#,
            "kplug_operator_event_failures_total 1",
            r#"leader_election_master_status{name="kplug-operator-widgets"} 1"#,
        ] {
            assert!(text.contains(expected), "{expected} in\n{text}");
        }
        for process in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(line(&text, process).is_some(), "{process} in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn a_worker_guard_gives_its_worker_back() {
        let metrics = Metrics::new("widget", 1);
        drop(metrics.worker());
        let text = encode(&registry(&metrics)).expect("encodes");
        assert!(
            text.contains(r#"controller_runtime_active_workers{controller="widget"} 0"#),
            "{text}"
        );
    }
}
