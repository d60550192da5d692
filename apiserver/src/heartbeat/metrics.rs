//! How many heartbeats kplug took and refused, and why.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// The answer a heartbeat got.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Answer {
    Accepted,
    /// Answered with `accepted: false` and a reason (the plugin retries).
    Refused(&'static str),
    /// `INVALID_ARGUMENT`: a declaration kplug cannot take.
    Invalid,
    Unauthenticated,
    Forbidden,
    /// kube-apiserver could not be asked who the caller is.
    Unavailable,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AnswerLabels {
    result: &'static str,
    reason: &'static str,
}

impl From<Answer> for AnswerLabels {
    fn from(answer: Answer) -> Self {
        let (result, reason) = match answer {
            Answer::Accepted => ("accepted", ""),
            Answer::Refused(reason) => ("refused", reason),
            Answer::Invalid => ("rejected", "Invalid"),
            Answer::Unauthenticated => ("rejected", "Unauthorized"),
            Answer::Forbidden => ("rejected", "Forbidden"),
            Answer::Unavailable => ("rejected", "ServiceUnavailable"),
        };
        Self { result, reason }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RemovedLabels {
    removed: bool,
}

/// The heartbeat ingest's families.
#[derive(Clone, Debug, Default)]
pub struct HeartbeatMetrics {
    heartbeats: Family<AnswerLabels, Counter>,
    deregistrations: Family<RemovedLabels, Counter>,
}

impl HeartbeatMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kplug_heartbeats",
            "Heartbeats received, by result (accepted, refused: told to retry, rejected: a gRPC error) and reason",
            self.heartbeats.clone(),
        );
        registry.register(
            "kplug_deregistrations",
            "Deregistration calls, by whether they removed a registration",
            self.deregistrations.clone(),
        );
    }

    pub fn heartbeat(&self, answer: Answer) {
        self.heartbeats.get_or_create(&answer.into()).inc();
    }

    pub fn deregistration(&self, removed: bool) {
        self.deregistrations
            .get_or_create(&RemovedLabels { removed })
            .inc();
    }
}
