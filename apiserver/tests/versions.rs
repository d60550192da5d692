//! Version constraints on reconciles: one plugin mid-rollout, its two
//! instances of different versions (registered by hand in front of two real
//! hello plugins), each request routed only to instances in its range, the
//! newest first; no version in range is a 503 naming the Ready versions, a
//! range that does not parse a 422.

use std::time::Duration;

use kplug_proto::v1alpha1::HeartbeatRequest;
use kplug_test_support::database_table::{RECONCILES, reconcile_body};
use kplug_test_support::{BlockingRegistry, StandaloneKplug, heartbeat_request};
use serde_json::{Value, json};

/// The instance `instance` of `tables` at `address`, of `version`.
fn instance(instance: &str, address: &str, version: &str) -> HeartbeatRequest {
    HeartbeatRequest {
        version: version.to_owned(),
        ..heartbeat_request("tables", instance, address, Duration::from_secs(60))
    }
}

/// `POST reconciles` (or `plugins/NAME/reconcile`) for databasetables with
/// `constraint`: the code and the answer.
fn reconcile(kplug: &StandaloneKplug, path: &str, constraint: &str) -> (u16, Value) {
    kplug.post_json(
        path,
        &reconcile_body("users", json!({"versionConstraint": constraint})),
    )
}

/// Which instances answered `calls` reconciles with `constraint`.
fn served_by(kplug: &StandaloneKplug, constraint: &str, calls: usize) -> Vec<(String, String)> {
    let mut served: Vec<(String, String)> = (0..calls)
        .map(|_| {
            let (code, answer) = reconcile(kplug, RECONCILES, constraint);
            assert_eq!(code, 201, "{constraint}: {answer:#}");
            let plugin = &answer["status"]["plugin"];
            let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            (text(&plugin["instance"]), text(&plugin["version"]))
        })
        .collect();
    served.sort();
    served.dedup();
    served
}

#[test]
fn reconciles_go_to_the_newest_instance_in_range_and_nowhere_else() {
    let kplug = StandaloneKplug::start();
    let (_a, a) = kplug.plugin_serving("hello-a", &[]);
    let (_b, b) = kplug.plugin_serving("hello-b", &[]);
    let mut registry = BlockingRegistry::connect(&kplug.grpc);
    registry.accepted(instance("tables-old", &a, "1.4.2"));
    registry.accepted(instance("tables-new", &b, "2.0.0"));

    let pair = |instance: &str, version: &str| (instance.to_owned(), version.to_owned());
    assert_eq!(
        served_by(&kplug, ">=1.4, <2", 8),
        [pair("tables-old", "1.4.2")],
        "only the instance in range"
    );
    assert_eq!(served_by(&kplug, ">=2", 8), [pair("tables-new", "2.0.0")]);
    // Every instance in range takes calls, as every instance does without
    // a constraint.
    for constraint in [">=1.4", ""] {
        assert_eq!(
            served_by(&kplug, constraint, 8),
            [pair("tables-new", "2.0.0"), pair("tables-old", "1.4.2")],
            "{constraint:?}"
        );
    }
    let (_, answer) = reconcile(&kplug, RECONCILES, "^1");
    assert_eq!(
        answer["status"]["selection"]["message"],
        "chose tables (PostgreSQL) by highest version, then name; 1.4.2 is its newest Ready \
         version in ^1"
    );

    // No Ready version in range: 503, naming the versions that are.
    let (code, status) = reconcile(&kplug, RECONCILES, "^3");
    assert_eq!(
        (code, &status["reason"], &status["message"]),
        (
            503,
            &json!("ServiceUnavailable"),
            &json!(
                "no Ready plugin of databasetables.myorg.org has a version in ^3 (Ready: 1.4.2 \
                 (tables), 2.0.0 (tables))"
            )
        ),
        "{status:#}"
    );
    let pinned = "/apis/plugins.kplug.io/v1alpha1/plugins/tables/reconcile";
    let (code, status) = reconcile(&kplug, pinned, "<1");
    assert_eq!(code, 503, "{status:#}");
    assert_eq!(
        status["message"],
        "no Ready plugin named tables has a version in <1 (Ready: 1.4.2 (tables), 2.0.0 (tables))"
    );
    let (code, answer) = reconcile(&kplug, pinned, "<2");
    assert_eq!(
        (code, &answer["status"]["plugin"]["instance"]),
        (201, &json!("tables-old"))
    );

    // A range that does not parse: 422, naming the field.
    let (code, status) = reconcile(&kplug, RECONCILES, "newest");
    assert_eq!(
        (code, &status["reason"]),
        (422, &json!("Invalid")),
        "{status:#}"
    );
    let cause = &status["details"]["causes"][0];
    assert_eq!(cause["field"], "spec.versionConstraint", "{status:#}");
    assert!(
        cause["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("Invalid value: \"newest\": not a semver range (")),
        "{status:#}"
    );
}
