//! Children a parent cannot own (issue 27), on a real control plane: the
//! team-access plugin (examples/team-access, Python) asks for a ClusterRole
//! and a RoleBinding in each of a team's namespaces for a TeamAccess in
//! namespace `platform`. An owner reference cannot tie them to it, so the
//! operator refuses them unless started with `--child-scope=cluster`, and
//! then tracks them by label, an annotation naming the parent and the
//! TeamAccess's inventory: it watches them in every namespace, puts back
//! one deleted by hand, prunes one no longer asked for, and removes them
//! before the TeamAccess goes.

mod support;

use std::time::Duration;

use kplug_test_support::{Lines, Process, output_text, repo_root, wait_plugin_ready, wait_until};
use serde_json::Value;
use support::condition;
use support::widgets::Widgets;

const TEAM_ACCESSES: &str = "teamaccesses.platform.example.com";
const ROLE: &str = "team-access.platform.web";
const PARENT_UID_LABEL: &str = "plugins.kplug.io/parent-uid";

/// The Widgets world with the TeamAccess CRD, the team's namespaces and
/// the team-access plugin.
fn start() -> (Widgets, (Process, Lines)) {
    let world = Widgets::start();
    let crd =
        std::fs::read_to_string(repo_root().join("examples/team-access/crds/teamaccesses.yaml"))
            .expect("the TeamAccess CRD");
    world.cluster.apply(&crd);
    world.cluster.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        &format!("crd/{TEAM_ACCESSES}"),
        "--timeout=30s",
    ]);
    for namespace in ["platform", "shop", "blog"] {
        world
            .cluster
            .kubectl_ok(&["create", "namespace", namespace]);
    }
    let plugin = world.python_example("examples/team-access/team_access.py", "team-access", &[]);
    wait_plugin_ready(&world.cluster, "team-access");
    (world, plugin)
}

fn get(world: &Widgets, namespace: Option<&str>, what: &str) -> Result<Value, String> {
    let mut args = vec!["get", what, "-o", "json"];
    if let Some(namespace) = namespace {
        args.extend(["-n", namespace]);
    }
    let output = world.cluster.kubectl(&args);
    serde_json::from_slice(&output.stdout).map_err(|_| output_text(&output))
}

fn team_access(world: &Widgets) -> Value {
    get(world, Some("platform"), "teamaccess/web").unwrap_or_default()
}

fn apply(world: &Widgets, namespaces: &str) {
    world.cluster.apply(&format!(
        "apiVersion: platform.example.com/v1alpha1\nkind: TeamAccess\n\
         metadata: {{name: web, namespace: platform}}\n\
         spec: {{group: web-team, namespaces: [{namespaces}]}}\n"
    ));
}

#[test]
fn children_the_parent_cannot_own_are_refused_by_default_and_tracked_with_the_flag() {
    let (world, _plugin) = start();
    let kubeconfig = world.cluster.kubeconfig();

    // Without the flag: a cluster-scoped child is refused on its line,
    // naming the flag; one in another namespace makes kplug refuse the
    // answer (the operator said childScope Namespace), on the conditions.
    let (mut operator, _log) = world.run_operator_for(TEAM_ACCESSES, "platform", &kubeconfig, &[]);
    apply(&world, "platform");
    wait_until("the ClusterRole refused", Duration::from_secs(60), || {
        let access = team_access(&world);
        let role = access["status"]["children"]
            .as_array()
            .and_then(|lines| lines.iter().find(|l| l["key"] == "role"))
            .cloned()
            .unwrap_or_default();
        let refused = role["error"]
            .as_str()
            .is_some_and(|e| e.contains("is cluster-scoped") && e.contains("--child-scope"));
        let not_ready = condition(&access, "ChildrenReady").is_some_and(|c| c["status"] == "False");
        (refused && not_ready)
            .then_some(())
            .ok_or_else(|| access["status"].to_string())
    });
    apply(&world, "shop, blog");
    wait_until("the answer refused", Duration::from_secs(60), || {
        let access = team_access(&world);
        let said = condition(&access, "Ready").map(|c| c["message"].to_string());
        said.filter(|m| m.contains(r#"child \"binding-blog\""#) && m.contains("childScope Cluster"))
            .map(drop)
            .ok_or_else(|| access["status"].to_string())
    });
    assert!(world.gone(None, &format!("clusterrole/{ROLE}")));
    assert!(
        operator.terminate(Duration::from_secs(30)),
        "the operator stops"
    );

    // With it: applied, labelled and annotated, never owned.
    let (_operator, _log) = world.run_operator_for(
        TEAM_ACCESSES,
        "platform",
        &kubeconfig,
        &["--child-scope=cluster"],
    );
    let uid = team_access(&world)["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let tracked = |namespace: Option<&str>, what: &str| -> Result<(), String> {
        let child = get(&world, namespace, what)?;
        let metadata = &child["metadata"];
        let ok = metadata["labels"][PARENT_UID_LABEL] == uid.as_str()
            && metadata["annotations"]["plugins.kplug.io/parent"] == "platform/web"
            && metadata.get("ownerReferences").is_none();
        ok.then_some(())
            .ok_or_else(|| format!("{what}: {metadata}"))
    };
    wait_until(
        "the children applied and Ready",
        Duration::from_secs(60),
        || {
            tracked(None, &format!("clusterrole/{ROLE}"))?;
            tracked(Some("shop"), "rolebinding/team-access-web")?;
            tracked(Some("blog"), "rolebinding/team-access-web")?;
            let access = team_access(&world);
            condition(&access, "Ready")
                .is_some_and(|c| c["status"] == "True")
                .then_some(())
                .ok_or_else(|| access["status"].to_string())
        },
    );

    // Deleted by hand in another namespace: the watch there brings it back.
    world
        .cluster
        .kubectl_ok(&["delete", "rolebinding", "team-access-web", "-n", "blog"]);
    wait_until(
        "the RoleBinding in blog back",
        Duration::from_secs(30),
        || tracked(Some("blog"), "rolebinding/team-access-web"),
    );

    // No longer asked for: pruned through the inventory.
    apply(&world, "shop");
    wait_until(
        "the RoleBinding in blog pruned",
        Duration::from_secs(30),
        || {
            world
                .gone(Some("blog"), "rolebinding/team-access-web")
                .then_some(())
                .ok_or("still there")
        },
    );
    tracked(Some("shop"), "rolebinding/team-access-web").expect("the one in shop stays");

    // Deleted: its children go through the inventory, then the TeamAccess.
    world.cluster.kubectl_ok(&[
        "delete",
        "teamaccess",
        "web",
        "-n",
        "platform",
        "--wait=false",
    ]);
    let role = format!("clusterrole/{ROLE}");
    wait_until(
        "the TeamAccess and its children gone",
        Duration::from_secs(60),
        || {
            let left: Vec<String> = [
                (Some("shop"), "rolebinding/team-access-web"),
                (None, role.as_str()),
                (Some("platform"), "teamaccess/web"),
            ]
            .into_iter()
            .filter(|(namespace, what)| !world.gone(*namespace, what))
            .map(|(_, what)| what.to_owned())
            .collect();
            left.is_empty()
                .then_some(())
                .ok_or_else(|| format!("still there: {left:?}"))
        },
    );
}
