use serde_json::json;

use super::*;
use crate::v1alpha1::{DesiredChild, ExtensionStatus, ReconcileResult, ResultCondition};

fn answer(success: bool, reasons: &[&str], object_status: Value) -> PluginAnswer {
    PluginAnswer {
        success,
        results: reasons
            .iter()
            .map(|reason| ReconcileResult {
                severity: "Normal".to_owned(),
                reason: (*reason).to_owned(),
                message: format!("did {reason}"),
            })
            .collect(),
        object_status: Some(object_status),
        ..PluginAnswer::default()
    }
}

fn paths(differences: &[FieldDifference]) -> Vec<&str> {
    differences.iter().map(|d| d.path.as_str()).collect()
}

#[test]
fn the_same_answer_has_no_difference_whatever_the_messages_and_requeue() {
    let primary = answer(
        true,
        &["Created"],
        json!({"phase": "Ready", "columns": [1, 2]}),
    );
    let mut shadow = primary.clone();
    shadow.results[0].message = "would create".to_owned();
    shadow.requeue_after_seconds = Some(5.0);
    assert_eq!(differences(&primary, &shadow), vec![]);
}

#[test]
fn each_differing_leaf_is_named_with_both_values() {
    let primary = answer(
        true,
        &["Created"],
        json!({"phase": "Ready", "columns": [{"name": "id", "type": "bigint"}], "gone": 1}),
    );
    let shadow = answer(
        false,
        &["Created", "Refused"],
        json!({"phase": "Ready", "columns": [{"name": "id", "type": "numeric"}], "new": true}),
    );
    let found = differences(&primary, &shadow);
    assert_eq!(
        paths(&found),
        [
            "success",
            "results",
            "objectStatus.columns[0].type",
            "objectStatus.gone",
            "objectStatus.new"
        ]
    );
    assert_eq!(found[0].primary, Some(json!(true)));
    assert_eq!(found[0].shadow, Some(json!(false)));
    assert_eq!(
        found[1].shadow,
        Some(json!([{"reason": "Created"}, {"reason": "Refused"}]))
    );
    assert_eq!(found[2].primary, Some(json!("bigint")));
    assert_eq!(found[2].shadow, Some(json!("numeric")));
    assert_eq!(
        (found[3].primary.clone(), found[3].shadow.clone()),
        (Some(json!(1)), None)
    );
    assert_eq!(
        (found[4].primary.clone(), found[4].shadow.clone()),
        (None, Some(json!(true)))
    );
}

#[test]
fn results_of_one_number_differ_by_reason() {
    let primary = answer(true, &["Created", "Indexed"], json!({}));
    let shadow = answer(true, &["Created", "Skipped"], json!({}));
    let found = differences(&primary, &shadow);
    assert_eq!(paths(&found), ["results[1].reason"]);
    assert_eq!(
        (found[0].primary.clone(), found[0].shadow.clone()),
        (Some(json!("Indexed")), Some(json!("Skipped")))
    );
}

#[test]
fn arrays_of_other_lengths_and_values_of_other_types_differ_whole() {
    let primary = answer(true, &[], json!({"columns": [1, 2], "n": 1}));
    let shadow = answer(true, &[], json!({"columns": [1], "n": "1"}));
    let found = differences(&primary, &shadow);
    assert_eq!(paths(&found), ["objectStatus.columns", "objectStatus.n"]);
    assert_eq!(found[0].shadow, Some(json!([1])));
}

#[test]
fn conditions_compare_type_status_and_reason() {
    let condition = |status: &str, message: &str| ResultCondition {
        type_: "Ready".to_owned(),
        status: status.to_owned(),
        reason: "Reconciled".to_owned(),
        message: message.to_owned(),
    };
    let mut primary = answer(true, &[], json!({}));
    primary.conditions = vec![condition("True", "done")];
    let mut shadow = primary.clone();
    shadow.conditions = vec![condition("True", "would be done")];
    assert_eq!(differences(&primary, &shadow), vec![]);
    shadow.conditions = vec![condition("False", "done")];
    assert_eq!(
        paths(&differences(&primary, &shadow)),
        ["conditions[0].status"]
    );
}

#[test]
fn extension_statuses_are_matched_by_reference() {
    let extension = |name: &str, status: Value| ExtensionStatus {
        reference: ObjectRef {
            api_version: "v1".to_owned(),
            kind: "PostgresTable".to_owned(),
            namespace: "shop".to_owned(),
            name: name.to_owned(),
        },
        status,
    };
    let mut primary = answer(true, &[], json!({}));
    primary.extension_statuses = vec![
        extension("a", json!({"rows": 1})),
        extension("b", json!({"rows": 2})),
    ];
    let mut shadow = primary.clone();
    // Another order, one changed, one missing.
    shadow.extension_statuses = vec![extension("b", json!({"rows": 3}))];
    let found = differences(&primary, &shadow);
    assert_eq!(
        paths(&found),
        [
            "extensionStatuses[PostgresTable/shop/a]",
            "extensionStatuses[PostgresTable/shop/b].rows"
        ]
    );
    assert_eq!(found[0].shadow, None);
}

#[test]
fn desired_children_compare_by_key_field_by_field() {
    let deployment = |image: &str| DesiredChild {
        key: "web".to_owned(),
        object: json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                       "spec": {"template": {"spec": {"containers": [{"name": "httpd", "image": image}]}}}}),
        ready: None,
        wave: 1,
    };
    let config_map = DesiredChild {
        key: "site".to_owned(),
        object: json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "site"}}),
        ready: Some(true),
        wave: 0,
    };
    let mut primary = answer(true, &[], json!({}));
    primary.desired_children = vec![config_map.clone(), deployment("busybox:1.36")];
    let mut shadow = primary.clone();
    // Another order alone is no difference.
    shadow.desired_children.reverse();
    assert_eq!(differences(&primary, &shadow), vec![]);
    // Version 2 changes the image, drops the ConfigMap and adds a Service.
    let service = DesiredChild {
        key: "svc".to_owned(),
        object: json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}}),
        ready: None,
        wave: 1,
    };
    shadow.desired_children = vec![deployment("busybox:1.37"), service];
    let found = differences(&primary, &shadow);
    assert_eq!(
        paths(&found),
        [
            "desiredChildren[site]",
            "desiredChildren[svc]",
            "desiredChildren[web].object.spec.template.spec.containers[0].image",
        ]
    );
    assert_eq!(found[0].shadow, None);
    assert_eq!(found[1].primary, None);
    assert_eq!(
        (found[2].primary.as_ref(), found[2].shadow.as_ref()),
        (Some(&json!("busybox:1.36")), Some(&json!("busybox:1.37")))
    );
    // A verdict or a wave of its own differs too.
    let mut waved = primary.clone();
    waved.desired_children[0].ready = Some(false);
    waved.desired_children[1].wave = 2;
    assert_eq!(
        paths(&differences(&primary, &waved)),
        ["desiredChildren[site].ready", "desiredChildren[web].wave"]
    );
}

#[test]
fn long_values_are_shown_by_their_size() {
    let long = "x".repeat(MAX_VALUE_BYTES);
    let primary = answer(true, &[], json!({"blob": long}));
    let shadow = answer(true, &[], json!({"blob": "short"}));
    let found = differences(&primary, &shadow);
    assert_eq!(
        found[0].primary,
        Some(json!(format!(
            "(a string of {} bytes)",
            MAX_VALUE_BYTES + 2
        )))
    );
    assert_eq!(found[0].shadow, Some(json!("short")));
}

#[test]
fn sampling_takes_about_the_share_asked() {
    assert!((0..50).all(|i| sampled("p", &format!("op-{i}"), 100)));
    let taken = (0..10_000)
        .filter(|i| sampled("p", &format!("op-{i}"), 25))
        .count();
    assert!((2_200..=2_800).contains(&taken), "{taken} of 10000 at 25 %");
}
