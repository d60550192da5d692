//! Reconciles by plugin, operation and outcome, and why calls failed.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::ProxyError;

/// From 1 ms (a local plugin) to the longest allowed timeout, 300 s.
const DURATION_BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

const OPERATIONS: [&str; 2] = ["Reconcile", "Finalize"];
const OUTCOMES: [&str; 3] = ["success", "failure", "error"];
const CLASSES: [&str; 8] = [
    "overloaded",
    "unavailable",
    "timeout",
    "rejected",
    "unimplemented",
    "failed",
    "invalid_address",
    "tls",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    plugin: String,
    operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    plugin: String,
    operation: &'static str,
    /// `success` or `failure` as the plugin reported it; `error` when
    /// there was no answer (see `kplug_proxy_errors_total`).
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    plugin: String,
    class: &'static str,
}

impl ProxyError {
    /// The class a dashboard groups failures by.
    pub fn class(&self) -> &'static str {
        match self {
            Self::Busy { .. } => "overloaded",
            Self::Unavailable { .. } | Self::NoneReady { .. } => "unavailable",
            Self::DeadlineExceeded { .. } => "timeout",
            Self::Rejected { .. } => "rejected",
            Self::Unimplemented { .. } => "unimplemented",
            Self::Failed { .. } | Self::AnswerTooLarge { .. } => "failed",
            Self::NotGrpc { .. } => "unavailable",
            Self::InvalidAddress { .. } => "invalid_address",
            Self::Tls { .. } => "tls",
        }
    }
}

/// One plugin's series of one operation, held so that a call updates
/// them without building and hashing its labels.
#[derive(Debug)]
struct OperationSeries {
    duration: Histogram,
    /// By outcome, in the order of `OUTCOMES`.
    outcomes: [Counter; 3],
}

/// By operation, in the order of `OPERATIONS`.
type PluginSeries = [OperationSeries; 2];

/// The proxy's families.
#[derive(Clone, Debug)]
pub struct ProxyMetrics {
    reconciles: Family<OutcomeLabels, Counter>,
    duration: Family<CallLabels, Histogram, fn() -> Histogram>,
    errors: Family<ErrorLabels, Counter>,
    series: Arc<RwLock<HashMap<String, Arc<PluginSeries>>>>,
}

impl Default for ProxyMetrics {
    fn default() -> Self {
        Self {
            reconciles: Family::default(),
            duration: Family::new_with_constructor(|| Histogram::new(DURATION_BUCKETS)),
            errors: Family::default(),
            series: Arc::default(),
        }
    }
}

impl ProxyMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kplug_reconciles",
            "Calls to plugins, by plugin, operation (Reconcile, Finalize) and outcome (success, failure: the plugin reported one, error: no answer)",
            self.reconciles.clone(),
        );
        registry.register(
            "kplug_reconcile_duration_seconds",
            "Time from sending a call to a plugin to its answer or error, by plugin and operation",
            self.duration.clone(),
        );
        registry.register(
            "kplug_proxy_errors",
            "Calls to plugins that produced no answer, by plugin and class (overloaded, unavailable, timeout, rejected, unimplemented, failed, invalid_address, tls)",
            self.errors.clone(),
        );
    }

    /// `plugin`'s series: a read lock when they exist; made (at zero, so
    /// every outcome shows) at its first call.
    fn plugin_series(&self, plugin: &str) -> Arc<PluginSeries> {
        if let Some(series) = self.series.read().get(plugin) {
            return series.clone();
        }
        let operation = |operation: &'static str| OperationSeries {
            duration: self
                .duration
                .get_or_create(&CallLabels {
                    plugin: plugin.to_owned(),
                    operation,
                })
                .clone(),
            outcomes: OUTCOMES.map(|outcome| {
                self.reconciles
                    .get_or_create(&OutcomeLabels {
                        plugin: plugin.to_owned(),
                        operation,
                        outcome,
                    })
                    .clone()
            }),
        };
        self.series
            .write()
            .entry(plugin.to_owned())
            .or_insert_with(|| Arc::new(OPERATIONS.map(operation)))
            .clone()
    }

    /// Records one call of `operation` that took `seconds`.
    pub fn call<T>(
        &self,
        plugin: &str,
        operation: &'static str,
        seconds: f64,
        result: &Result<T, ProxyError>,
        success: impl FnOnce(&T) -> bool,
    ) {
        let outcome = match result {
            Ok(answer) if success(answer) => 0,
            Ok(_) => 1,
            Err(error) => {
                self.errors
                    .get_or_create(&ErrorLabels {
                        plugin: plugin.to_owned(),
                        class: error.class(),
                    })
                    .inc();
                2
            }
        };
        let series = self.plugin_series(plugin);
        let Some(series) = OPERATIONS
            .iter()
            .position(|known| *known == operation)
            .and_then(|index| series.get(index))
        else {
            return;
        };
        series.duration.observe(seconds);
        series.outcomes[outcome].inc();
    }

    /// Drops the series of a plugin that left the registry, so plugins that
    /// come and go do not grow the metrics without bound.
    pub fn forget(&self, plugin: &str) {
        self.series.write().remove(plugin);
        for operation in OPERATIONS {
            let plugin = plugin.to_owned();
            self.duration.remove(&CallLabels {
                plugin: plugin.clone(),
                operation,
            });
            for outcome in OUTCOMES {
                self.reconciles.remove(&OutcomeLabels {
                    plugin: plugin.clone(),
                    operation,
                    outcome,
                });
            }
        }
        for class in CLASSES {
            self.errors.remove(&ErrorLabels {
                plugin: plugin.to_owned(),
                class,
            });
        }
    }
}
