//! The Plugin object a registration shows: spec from its newest instance's
//! declaration, status from its lifecycle and every instance.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};

use super::{
    Instance, Instances, LATE_AFTER_INTERVALS, Lifecycle, Registry, compare_versions, signed,
};
use crate::v1alpha1::{
    self, API_VERSION, CONDITION_CANARY, CONDITION_READY, Plugin, PluginInstance, PluginStatus,
};

/// The Ready condition's reason and message.
fn readiness(instances: &Instances, lifecycle: &Lifecycle) -> (&'static str, String) {
    let total = instances.len();
    if lifecycle.ready {
        let message = if total == 1 {
            "the plugin is heartbeating".to_owned()
        } else {
            let serving = instances
                .iter()
                .filter(|i| lifecycle.takes_calls(i))
                .count();
            format!("{serving} of {total} instances are Ready")
        };
        ("HeartbeatReceived", message)
    } else if instances.iter().any(|i| i.on_time) {
        (
            "Draining",
            if total == 1 {
                "the plugin is shutting down".to_owned()
            } else {
                "every instance that heartbeats on time is shutting down".to_owned()
            },
        )
    } else if total == 1 {
        (
            "HeartbeatLate",
            format!(
                "no heartbeat for {LATE_AFTER_INTERVALS} intervals of {}s",
                instances.newest().declaration.interval.as_secs()
            ),
        )
    } else {
        (
            "HeartbeatLate",
            format!(
                "none of the {total} instances heartbeated within {LATE_AFTER_INTERVALS} of its \
                 intervals"
            ),
        )
    }
}

fn instance_status(instance: &Instance, lifecycle: &Lifecycle) -> PluginInstance {
    let declaration = &instance.declaration;
    PluginInstance {
        name: declaration.identity().to_owned(),
        address: declaration.address.clone(),
        server_name: declaration.server_name.clone(),
        version: declaration.version.clone(),
        ready: lifecycle.takes_calls(instance),
        draining: declaration.draining,
        last_heartbeat_time: Time(instance.last_seen()),
        canary_weight: declaration.canary_weight,
        shadow_percent: declaration.shadow_percent,
    }
}

/// The Canary condition, while the plugin lists canary instances: which
/// version takes which share, or that kplug withdrew it and why.
fn canary(instances: &Instances, lifecycle: &Lifecycle) -> Option<Condition> {
    let newest = instances
        .iter()
        .filter(|i| i.declaration.canary_weight > 0)
        .max_by(|a, b| compare_versions(&a.declaration.version, &b.declaration.version))?;
    let version = &newest.declaration.version;
    let weight = kplug_api::canary::weight(
        instances
            .iter()
            .filter(|i| i.declaration.version == *version)
            .map(|i| i.declaration.canary_weight),
    );
    let (status, reason, message, since) = match lifecycle.withdrawn() {
        Some(withdrawn) if withdrawn.version == *version => (
            "False",
            "Withdrawn",
            format!(
                "kplug withdrew canary {version}: {}; it sends the canary nothing until its \
                 instances declare another version",
                withdrawn.withdrawal
            ),
            withdrawn.at,
        ),
        _ => (
            "True",
            "Serving",
            format!(
                "canary {version} takes {}% of the objects",
                weight.unwrap_or_default()
            ),
            lifecycle.canary_since().unwrap_or(lifecycle.created),
        ),
    };
    Some(Condition {
        type_: CONDITION_CANARY.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message,
        last_transition_time: Time(since),
        observed_generation: None,
    })
}

impl Registry {
    /// The object as of now: heartbeat times are the instances' latest,
    /// which is why unchanged heartbeats re-render only once per status
    /// refresh interval. It has no resourceVersion until it is stored
    /// ([`Registry::stamp`]).
    pub(super) fn render(&self, instances: &Instances, lifecycle: &Lifecycle) -> Plugin {
        let declaration = &instances.newest().declaration;
        let spec = declaration.spec();
        let (reason, message) = readiness(instances, lifecycle);
        let last_heartbeat = instances
            .iter()
            .map(Instance::last_seen)
            .max()
            .unwrap_or(lifecycle.created);
        let expires_at = instances
            .iter()
            .map(|i| i.last_seen() + signed(self.ttl(i.declaration.interval)))
            .max()
            .unwrap_or(lifecycle.created);
        Plugin {
            api_version: API_VERSION.to_owned(),
            kind: Plugin::KIND.to_owned(),
            metadata: ObjectMeta {
                name: Some(declaration.name.clone()),
                uid: Some(lifecycle.uid()),
                creation_timestamp: Some(Time(lifecycle.created)),
                labels: Some(v1alpha1::object_labels(declaration.labels.iter(), &spec)),
                ..ObjectMeta::default()
            },
            spec,
            status: PluginStatus {
                conditions: std::iter::once(Condition {
                    type_: CONDITION_READY.to_owned(),
                    status: if lifecycle.ready { "True" } else { "False" }.to_owned(),
                    reason: reason.to_owned(),
                    message,
                    last_transition_time: Time(lifecycle.ready_since),
                    observed_generation: None,
                })
                .chain(canary(instances, lifecycle))
                .collect(),
                last_heartbeat_time: Time(last_heartbeat),
                expires_at: Time(expires_at),
                registered_by: declaration.registered_by.clone(),
                instances: instances
                    .iter()
                    .map(|i| instance_status(i, lifecycle))
                    .collect(),
            },
        }
    }

    /// Gives `object` the resourceVersion it is stored at.
    pub(super) fn stamp(&self, object: &mut Plugin, resource_version: u64) {
        object.metadata.resource_version = Some(self.version(resource_version));
    }
}
