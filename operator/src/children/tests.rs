use serde_json::json;

use super::*;

fn desired(key: &str, wave: i32) -> DesiredChild {
    DesiredChild {
        key: key.to_owned(),
        object: json!({}),
        ready: None,
        wave,
    }
}

fn line(key: &str, kind: &str, name: &str) -> ChildStatus {
    ChildStatus {
        key: key.to_owned(),
        api_version: "v1".to_owned(),
        kind: kind.to_owned(),
        namespace: "shop".to_owned(),
        name: name.to_owned(),
        ..ChildStatus::default()
    }
}

#[test]
fn a_wave_is_applied_once_every_lower_wave_is_ready() {
    let children = [
        desired("pages", 0),
        desired("web", 1),
        desired("svc", 1),
        desired("dns", 2),
    ];
    assert_eq!(last_wave(&children, |_| false), Some(0));
    assert_eq!(last_wave(&children, |key| key == "pages"), Some(1));
    assert_eq!(last_wave(&children, |key| key != "svc"), Some(1));
    assert_eq!(last_wave(&children, |key| key != "dns"), Some(2));
    assert_eq!(last_wave(&children, |_| true), Some(2));
    assert_eq!(last_wave(&[], |_| true), None);
    let negative = [desired("crd", -1), desired("app", 0)];
    assert_eq!(last_wave(&negative, |_| false), Some(-1));
}

#[test]
fn what_is_pruned_is_what_the_inventory_has_and_the_answer_does_not() {
    let inventory = [
        line("pages", "ConfigMap", "site"),
        line("web", "Deployment", "web"),
        line("old", "Service", "old"),
    ];
    let desired = [
        line("pages", "ConfigMap", "site"),
        line("web", "Deployment", "web-2"),
    ];
    let pruned: Vec<&str> = to_prune(&inventory, &desired)
        .iter()
        .map(|l| l.name.as_str())
        .collect();
    // The renamed Deployment's old object goes, as does the key dropped.
    assert_eq!(pruned, ["web", "old"]);
    assert!(to_prune(&inventory, &inventory).is_empty());
}

#[test]
fn the_inventory_round_trips_through_the_status() {
    let mut ready = line("pages", "ConfigMap", "site");
    ready.ready = true;
    let mut failed = line("web", "Deployment", "web");
    failed.wave = 1;
    failed.error = "admission webhook denied it".to_owned();
    let status = json!({"children": [ready, failed], "other": 1});
    assert_eq!(inventory(&status), [ready.clone(), failed.clone()]);
    assert_eq!(inventory(&json!({})), []);
    assert_eq!(
        inventory(&json!({"children": [{"key": 3}, ready]})),
        [ready]
    );
}

#[test]
fn children_ready_names_what_it_waits_for_or_what_failed() {
    let mut pages = line("pages", "ConfigMap", "site");
    pages.ready = true;
    let web = line("web", "Deployment", "web");
    assert_eq!(
        children_ready(&[pages.clone()]),
        (true, "ChildrenReady", "1 child(ren) ready".to_owned())
    );
    assert_eq!(
        children_ready(&[pages.clone(), web.clone()]),
        (
            false,
            "ChildrenNotReady",
            "waiting for \"web\" (Deployment shop/web)".to_owned()
        )
    );
    let mut refused = web;
    refused.error = "forbidden".to_owned();
    assert_eq!(
        children_ready(&[pages, refused]),
        (
            false,
            "ApplyFailed",
            "child \"web\" (Deployment shop/web) was not applied: forbidden".to_owned()
        )
    );
}

#[test]
fn the_default_rule_reads_workloads_jobs_and_conditions() {
    let deployment = |replicas: i64, available: i64, generation: i64, observed: i64| {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"generation": generation}, "spec": {"replicas": replicas},
               "status": {"observedGeneration": observed, "replicas": replicas,
                          "updatedReplicas": replicas, "availableReplicas": available}})
    };
    assert!(ready_by_default(&deployment(2, 2, 3, 3)));
    assert!(!ready_by_default(&deployment(2, 1, 3, 3)));
    assert!(
        !ready_by_default(&deployment(2, 2, 4, 3)),
        "a spec not seen yet"
    );
    assert!(!ready_by_default(
        &json!({"apiVersion": "apps/v1", "kind": "Deployment"})
    ));
    let job = |status: &str| {
        json!({"apiVersion": "batch/v1", "kind": "Job",
        "status": {"conditions": [{"type": "Complete", "status": status}]}})
    };
    assert!(ready_by_default(&job("True")));
    assert!(!ready_by_default(&job("False")));
    let with = |type_: &str, status: &str| {
        json!({"apiVersion": "example.com/v1", "kind": "Database",
        "status": {"conditions": [{"type": type_, "status": status}]}})
    };
    assert!(ready_by_default(&with("Ready", "True")));
    assert!(!ready_by_default(&with("Ready", "False")));
    assert!(!ready_by_default(&with("Available", "False")));
    assert!(
        ready_by_default(&with("Progressing", "False")),
        "no Ready or Available condition"
    );
    assert!(ready_by_default(
        &json!({"apiVersion": "v1", "kind": "ConfigMap"})
    ));
    let daemon_set = json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
        "status": {"desiredNumberScheduled": 1, "updatedNumberScheduled": 1, "numberAvailable": 0}});
    assert!(!ready_by_default(&daemon_set));
}

#[test]
fn pruning_more_than_half_and_more_than_one_is_held_until_allowed() {
    let inventory = [
        line("pages", "ConfigMap", "site"),
        line("web", "Deployment", "web"),
        line("svc", "Service", "web"),
    ];
    let stale = |n: usize| inventory.iter().take(n).collect::<Vec<_>>();
    assert_eq!(prune_held(3, &stale(1), false), None, "one child may go");
    let held = prune_held(3, &stale(2), false).expect("two of three held");
    assert_eq!(
        held,
        "the plugin no longer asks for 2 of the 3 children (\"pages\" (ConfigMap shop/site), \
         \"web\" (Deployment shop/web)): nothing was deleted; annotate the object \
         plugins.kplug.io/allow-mass-prune=true to let them go"
    );
    assert_eq!(prune_held(3, &stale(2), true), None, "allowed");
    assert!(prune_held(3, &stale(3), false).is_some(), "all of them");
    assert_eq!(
        prune_held(4, &stale(2), false),
        None,
        "half is not more than half"
    );
    assert_eq!(prune_held(1, &stale(1), false), None, "a lone child may go");
}
