//! When a child is ready, for a plugin that gives no verdict: a rule a
//! user can predict from the object alone. Workloads are rolled out and
//! available, a Job is complete, an object with a `Ready` or `Available`
//! condition has it True, and anything else is ready once it exists.

use serde_json::Value;

/// Whether the live `object` is ready by the default rule.
pub fn ready_by_default(object: &Value) -> bool {
    let kind = object["kind"].as_str().unwrap_or_default();
    let group = object["apiVersion"]
        .as_str()
        .and_then(|v| v.split_once('/'))
        .map_or("", |(group, _)| group);
    match (group, kind) {
        ("apps", "Deployment") => deployment_available(object),
        ("apps", "StatefulSet") => stateful_set_rolled_out(object),
        ("apps", "DaemonSet") => daemon_set_rolled_out(object),
        ("batch", "Job") => condition(object, "Complete") == Some(true),
        _ => match (condition(object, "Ready"), condition(object, "Available")) {
            (Some(ready), _) => ready,
            (None, Some(available)) => available,
            (None, None) => true,
        },
    }
}

/// The status of the condition `type_`, when the object has it.
fn condition(object: &Value, type_: &str) -> Option<bool> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .map(|c| c["status"] == "True")
}

fn int(value: &Value) -> i64 {
    value.as_i64().unwrap_or(0)
}

/// The controller has seen the latest spec.
fn observed(object: &Value) -> bool {
    int(&object["status"]["observedGeneration"]) >= int(&object["metadata"]["generation"])
}

/// `kubectl rollout status`'s rule: every replica updated and available.
fn deployment_available(object: &Value) -> bool {
    let wanted = object["spec"]["replicas"].as_i64().unwrap_or(1);
    let status = &object["status"];
    observed(object)
        && int(&status["updatedReplicas"]) == wanted
        && int(&status["availableReplicas"]) == wanted
        && int(&status["replicas"]) == wanted
}

fn stateful_set_rolled_out(object: &Value) -> bool {
    let wanted = object["spec"]["replicas"].as_i64().unwrap_or(1);
    let status = &object["status"];
    observed(object)
        && int(&status["readyReplicas"]) == wanted
        && int(&status["updatedReplicas"]) == wanted
}

fn daemon_set_rolled_out(object: &Value) -> bool {
    let status = &object["status"];
    let wanted = int(&status["desiredNumberScheduled"]);
    observed(object)
        && int(&status["updatedNumberScheduled"]) == wanted
        && int(&status["numberAvailable"]) == wanted
}
