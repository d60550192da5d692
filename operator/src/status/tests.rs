use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use kplug_api::v1alpha1::{PluginRef, ReconcileResult, Selection, SelectionReason};

use crate::children::ChildStatus;

use super::*;

const MANAGER: &str = "kplug-operator";

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).expect("valid")
}

fn answer(success: bool) -> ReconcileStatus {
    ReconcileStatus {
        plugin: PluginRef {
            name: "pg".into(),
            version: "1.0.0".into(),
            implementation: "PostgreSQL".into(),
            instance: "pg-0".into(),
            capabilities: Vec::new(),
        },
        selection: Selection {
            reason: SelectionReason::Fallback,
            message: "no Ready plugin implements MariaDB".into(),
        },
        success,
        results: vec![if success {
            ReconcileResult {
                severity: "Normal".into(),
                reason: "TableCreated".into(),
                message: "created table users".into(),
            }
        } else {
            ReconcileResult {
                severity: "Error".into(),
                reason: "UnknownColumnType".into(),
                message: "column x: unknown type \"blob9\"".into(),
            }
        }],
        conditions: vec![ResultCondition {
            type_: "Synced".into(),
            status: "True".into(),
            reason: "Reconciled".into(),
            message: String::new(),
        }],
        object_status: Some(json!({"columns": 2, "plugin": "not allowed"})),
        ..Default::default()
    }
}

fn desired<'a>(current: &'a Value, owned: &'a Owned, now: Timestamp) -> Desired<'a> {
    Desired {
        children: &[],
        prune_held: None,
        current,
        owned,
        generation: Some(3),
        binding: Some("PostgreSQL"),
        layout: &ObjectStatusLayout::Merged,
        now,
    }
}

/// Our entry for `fields` of the status, and someone else's.
fn two_managers(fields: Value) -> ObjectMeta {
    ObjectMeta {
        managed_fields: Some(vec![
            ManagedFieldsEntry {
                manager: Some(MANAGER.into()),
                operation: Some("Apply".into()),
                fields_v1: Some(FieldsV1(json!({"f:status": fields}))),
                ..Default::default()
            },
            ManagedFieldsEntry {
                manager: Some("someone-else".into()),
                fields_v1: Some(FieldsV1(json!({"f:status": {"f:theirs": {}}}))),
                ..Default::default()
            },
        ]),
        ..Default::default()
    }
}

fn owned(fields: Value) -> Owned {
    Owned::read(&two_managers(fields), MANAGER)
}

#[test]
fn a_cached_object_keeps_only_our_entry_and_reads_the_same() {
    let fields = json!({"f:columns": {}, "f:conditions": {"k:{\"type\":\"Ready\"}": {}}});
    let mut meta = two_managers(fields.clone());
    Owned::keep_only_ours(&mut meta, MANAGER);
    let managers: Vec<_> = meta
        .managed_fields
        .iter()
        .flatten()
        .map(|e| e.manager.as_deref())
        .collect();
    assert_eq!(managers, [Some(MANAGER)]);
    assert_eq!(Owned::read(&meta, MANAGER), owned(fields));
}

#[test]
fn owned_fields_and_condition_types_come_from_managed_fields() {
    let owned = owned(json!({
        "f:columns": {}, "f:conditions": {".": {}, "k:{\"type\":\"Ready\"}": {}, "k:{\"type\":\"Synced\"}": {}}
    }));
    assert_eq!(
        owned.fields,
        ["columns", "conditions"].map(str::to_owned).into()
    );
    assert_eq!(
        owned.condition_types,
        ["Ready", "Synced"].map(str::to_owned).into()
    );
}

#[test]
fn an_answer_writes_binding_plugin_selection_conditions_and_object_status() {
    let current = json!({});
    let owned = Owned::default();
    let status = desired(&current, &owned, at(0)).status(&Outcome::Answered(&answer(true)));
    assert_eq!(status["implementation"], "PostgreSQL");
    assert_eq!(status["plugin"]["name"], "pg");
    assert!(
        status["plugin"].get("instance").is_none(),
        "another instance answering must not rewrite the status"
    );
    assert_eq!(status["selection"]["reason"], "Fallback");
    assert_eq!(status["observedGeneration"], 3);
    assert_eq!(status["columns"], 2);
    assert_eq!(
        status["plugin"]["implementation"], "PostgreSQL",
        "objectStatus may not replace the operator's fields"
    );
    let conditions = status["conditions"].as_array().expect("conditions");
    assert_eq!(conditions[0]["type"], "Ready");
    assert_eq!(conditions[0]["status"], "True");
    assert_eq!(conditions[0]["message"], "created table users");
    assert_eq!(conditions[0]["observedGeneration"], 3);
    assert_eq!(conditions[1]["reason"], "Reconciled", "the plugin's Synced");
    assert_eq!(conditions[0]["lastTransitionTime"], "2027-01-15T08:00:00Z");
}

#[test]
fn a_failure_is_ready_false_with_the_plugins_reason() {
    let current = json!({});
    let owned = Owned::default();
    let status = desired(&current, &owned, at(0)).status(&Outcome::Answered(&answer(false)));
    let ready = &status["conditions"][0];
    assert_eq!(ready["status"], "False");
    assert_eq!(ready["reason"], "UnknownColumnType");
    assert_eq!(
        ready["message"],
        "column x: unknown type \"blob9\" (reported by plugin pg (PostgreSQL 1.0.0)); retrying with backoff"
    );
}

#[test]
fn the_object_status_can_go_under_one_field() {
    let current = json!({});
    let owned = Owned::default();
    let layout = ObjectStatusLayout::Under("output".into());
    let status = Desired {
        layout: &layout,
        ..desired(&current, &owned, at(0))
    }
    .status(&Outcome::Answered(&answer(true)));
    assert_eq!(status["output"]["columns"], 2);
    assert!(status.get("columns").is_none());
}

#[test]
fn unchanged_outcomes_need_no_write_and_keep_their_transition_time() {
    let owned_fields = owned(json!({
        "f:implementation": {}, "f:plugin": {}, "f:selection": {}, "f:observedGeneration": {},
        "f:columns": {}, "f:conditions": {"k:{\"type\":\"Ready\"}": {}, "k:{\"type\":\"Synced\"}": {}}
    }));
    let empty = json!({});
    let first = desired(&empty, &owned_fields, at(0)).status(&Outcome::Answered(&answer(true)));
    let mut current = Value::Object(first.clone());
    current["theirs"] = json!("another manager's field");
    let again = desired(&current, &owned_fields, at(60)).status(&Outcome::Answered(&answer(true)));
    assert_eq!(
        again, first,
        "same answer, same status, same transition time"
    );
    assert!(!needs_write(&current, &again, &owned_fields));

    let failed =
        desired(&current, &owned_fields, at(120)).status(&Outcome::Answered(&answer(false)));
    assert!(needs_write(&current, &failed, &owned_fields));
    assert_eq!(
        failed["conditions"][0]["lastTransitionTime"], "2027-01-15T08:02:00Z",
        "Ready flipped"
    );
    assert_eq!(
        failed["conditions"][1]["lastTransitionTime"], first["conditions"][1]["lastTransitionTime"],
        "Synced held"
    );
}

#[test]
fn a_field_the_plugin_stops_reporting_is_removed() {
    let owned_fields = owned(json!({"f:columns": {}, "f:partitions": {}}));
    let current = json!({"columns": 2, "partitions": 4});
    let mut no_partitions = answer(true);
    no_partitions.object_status = Some(json!({"columns": 2}));
    let status = desired(&current, &owned_fields, at(0)).status(&Outcome::Answered(&no_partitions));
    assert!(needs_write(&current, &status, &owned_fields));
}

#[test]
fn without_an_answer_earlier_fields_stay_and_only_conditions_change() {
    let owned_fields = owned(json!({
        "f:implementation": {}, "f:columns": {}, "f:observedGeneration": {},
        "f:conditions": {"k:{\"type\":\"Ready\"}": {}, "k:{\"type\":\"Synced\"}": {}, "k:{\"type\":\"Partitioned\"}": {}}
    }));
    let current = json!({
        "implementation": "PostgreSQL", "columns": 2, "observedGeneration": 2,
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "Reconciled", "message": "", "lastTransitionTime": "2027-01-01T00:00:00Z"},
            {"type": "Partitioned", "status": "True", "reason": "Hash", "message": "", "lastTransitionTime": "2027-01-01T00:00:00Z"},
        ],
    });
    let outcome = Outcome::NotDelegated {
        reason: "PluginUnavailable",
        message: "no Ready plugin of implementation PostgreSQL serves databasetables.myorg.org"
            .into(),
    };
    let status = desired(&current, &owned_fields, at(0)).status(&outcome);
    assert_eq!(status["implementation"], "PostgreSQL");
    assert_eq!(status["columns"], 2);
    assert_eq!(
        status["observedGeneration"], 2,
        "no plugin saw generation 3"
    );
    let conditions = status["conditions"].as_array().expect("conditions");
    let types: Vec<&str> = conditions
        .iter()
        .filter_map(|c| c["type"].as_str())
        .collect();
    assert_eq!(types, ["Ready", "Synced", "Partitioned"]);
    assert_eq!(conditions[0]["reason"], "PluginUnavailable");
    assert!(needs_write(&current, &status, &owned_fields));
    let settled = Value::Object(status.clone());
    let again = desired(&settled, &owned_fields, at(30)).status(&outcome);
    assert!(
        !needs_write(&settled, &again, &owned_fields),
        "waiting writes once"
    );
}

#[test]
fn a_call_that_followed_the_binding_keeps_the_reason_for_it() {
    let current = json!({"selection": {"reason": "Fallback", "message": "no Ready plugin implements MariaDB"}});
    let owned = Owned::default();
    let mut followed = answer(true);
    followed.selection = Selection {
        reason: SelectionReason::RequiredImplementation,
        message: "PostgreSQL is the required implementation".into(),
    };
    let status = desired(&current, &owned, at(0)).status(&Outcome::Answered(&followed));
    assert_eq!(status["selection"], current["selection"]);
    let status = desired(&current, &owned, at(0)).status(&Outcome::Answered(&answer(true)));
    assert_eq!(status["selection"]["reason"], "Fallback");
    assert_eq!(
        status["selection"]["message"],
        "no Ready plugin implements MariaDB"
    );
}

#[test]
fn the_major_version_is_recorded_with_the_binding_and_kept_while_it_holds() {
    let owned = Owned::default();
    let mut two = answer(true);
    two.plugin.version = "2.3.0".into();
    let major = |current: Value, answer: &ReconcileStatus| {
        let status = desired(&current, &owned, at(0)).status(&Outcome::Answered(answer));
        status.get("majorVersion").cloned().unwrap_or_default()
    };
    assert_eq!(major(json!({}), &answer(true)), 1, "a new binding");
    assert_eq!(
        major(
            json!({"implementation": "PostgreSQL", "majorVersion": 1}),
            &two
        ),
        1,
        "kept while the binding holds"
    );
    assert_eq!(
        major(json!({"majorVersion": 1}), &two),
        2,
        "the binding was cleared: the answer's"
    );
    let mut unversioned = answer(true);
    unversioned.plugin.version = "latest".into();
    assert_eq!(
        major(json!({}), &unversioned),
        Value::Null,
        "not semver: none"
    );
}

#[test]
fn children_are_listed_and_ready_waits_for_them() {
    let line = |key: &str, ready: bool| ChildStatus {
        key: key.into(),
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        namespace: "shop".into(),
        name: key.into(),
        ready,
        ..ChildStatus::default()
    };
    let (current, owned) = (json!({}), Owned::default());
    let waiting = [line("pages", true), line("web", false)];
    let status = Desired {
        children: &waiting,
        ..desired(&current, &owned, at(0))
    }
    .status(&Outcome::Answered(&answer(true)));
    assert_eq!(status["children"], json!(waiting));
    let types: Vec<&str> = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["type"].as_str())
        .collect();
    assert_eq!(types, ["Ready", "Synced", "ChildrenReady"]);
    let ready = &status["conditions"][0];
    assert_eq!(
        (&ready["status"], &ready["reason"], &ready["message"]),
        (
            &json!("False"),
            &json!("ChildrenNotReady"),
            &json!("waiting for \"web\" (ConfigMap shop/web)")
        )
    );
    let all_ready = [line("pages", true)];
    let status = Desired {
        children: &all_ready,
        ..desired(&current, &owned, at(0))
    }
    .status(&Outcome::Answered(&answer(true)));
    assert_eq!(status["conditions"][0]["status"], "True");
    assert_eq!(status["conditions"][0]["reason"], "Reconciled");
    assert_eq!(status["conditions"][2]["status"], "True");
    // A plugin's failure stays the reason Ready is False.
    let status = Desired {
        children: &waiting,
        ..desired(&current, &owned, at(0))
    }
    .status(&Outcome::Answered(&answer(false)));
    assert_eq!(status["conditions"][0]["reason"], "UnknownColumnType");
    // A held prune is a condition of its own.
    let status = Desired {
        children: &all_ready,
        prune_held: Some("held"),
        ..desired(&current, &owned, at(0))
    }
    .status(&Outcome::Answered(&answer(true)));
    let paused = &status["conditions"][3];
    assert_eq!(
        (&paused["type"], &paused["status"], &paused["message"]),
        (&json!("PrunePaused"), &json!("True"), &json!("held"))
    );
    // Without children: no list, no condition.
    let status = desired(&current, &owned, at(0)).status(&Outcome::Answered(&answer(true)));
    assert!(status.get("children").is_none());
    assert_eq!(status["conditions"].as_array().map(Vec::len), Some(2));
}
