//! The Plugin object a registration shows: spec from the declaration,
//! status from its lifecycle.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};

use super::{Declaration, LATE_AFTER_INTERVALS, Lifecycle, Registry, signed};
use crate::v1alpha1::{self, API_VERSION, CONDITION_READY, Plugin, PluginStatus};

impl Registry {
    pub(super) fn render(
        &self,
        declaration: &Declaration,
        lifecycle: &Lifecycle,
        resource_version: u64,
    ) -> Plugin {
        let spec = declaration.spec();
        let (reason, message) = if lifecycle.ready {
            ("HeartbeatReceived", "the plugin is heartbeating".to_owned())
        } else {
            (
                "HeartbeatLate",
                format!(
                    "no heartbeat for {LATE_AFTER_INTERVALS} intervals of {}s",
                    declaration.interval.as_secs()
                ),
            )
        };
        Plugin {
            api_version: API_VERSION.to_owned(),
            kind: Plugin::KIND.to_owned(),
            metadata: ObjectMeta {
                name: Some(declaration.name.clone()),
                uid: Some(lifecycle.uid.clone()),
                resource_version: Some(resource_version.to_string()),
                creation_timestamp: Some(Time(lifecycle.created)),
                labels: Some(v1alpha1::object_labels(&declaration.labels, &spec)),
                ..ObjectMeta::default()
            },
            spec,
            status: PluginStatus {
                conditions: vec![Condition {
                    type_: CONDITION_READY.to_owned(),
                    status: if lifecycle.ready { "True" } else { "False" }.to_owned(),
                    reason: reason.to_owned(),
                    message,
                    last_transition_time: Time(lifecycle.ready_since),
                    observed_generation: None,
                }],
                last_heartbeat_time: Time(lifecycle.recorded),
                expires_at: Time(lifecycle.recorded + signed(self.ttl(declaration.interval))),
                registered_by: declaration.registered_by.clone(),
            },
        }
    }
}
