//! A team's operator: the zero-code operator bound by RoleBindings in its
//! namespace alone delegates that namespace's Widgets through
//! `namespaces/team-a/reconciles`, and its identity is refused another
//! namespace's objects (README "Who may reconcile what").

mod support;

use std::path::Path;
use std::time::Duration;

use kplug_test_support::{output_text, wait_plugin_ready, wait_until};
use support::widgets::Widgets;

const OPERATOR: &str = "system:serviceaccount:team-a:widgets-operator";

/// The README's RBAC for an operator of one namespace: a Role and
/// RoleBindings in `team-a`, and the cluster-wide read of plugins (they
/// are cluster-scoped: nothing to bind in a namespace), nothing else.
const TEAM_A_OPERATOR: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: widgets-operator, namespace: team-a}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: widgets-operator, namespace: team-a}
rules:
- apiGroups: [test.kplug.io]
  resources: [widgets]
  verbs: [get, list, watch, patch, update]
- apiGroups: [test.kplug.io]
  resources: [widgets/status, widgets/finalizers]
  verbs: [get, patch, update]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: widgets-operator, namespace: team-a}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: widgets-operator}
subjects:
- {kind: ServiceAccount, name: widgets-operator, namespace: team-a}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: 'kplug:operator:widgets-operator', namespace: team-a}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: 'kplug:operator'}
subjects:
- {kind: ServiceAccount, name: widgets-operator, namespace: team-a}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: 'kplug:reader:team-a-widgets-operator'}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: 'kplug:reader'}
subjects:
- {kind: ServiceAccount, name: widgets-operator, namespace: team-a}
"#;

fn widget_in(namespace: &str, name: &str) -> String {
    format!(
        "apiVersion: test.kplug.io/v1\nkind: Widget\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec: {{size: 1}}\n"
    )
}

/// A Reconcile of the Widget `namespace/name`, as a file for `kubectl create --raw -f`.
fn reconcile_file(dir: &Path, namespace: &str, name: &str) -> String {
    let body = serde_json::json!({
        "apiVersion": "plugins.kplug.io/v1alpha1",
        "kind": "Reconcile",
        "spec": {
            "api": {"group": "test.kplug.io", "resource": "widgets"},
            "object": {
                "apiVersion": "test.kplug.io/v1",
                "kind": "Widget",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"size": 1},
            },
        },
    });
    let path = dir.join(format!("reconcile-{namespace}-{name}.json"));
    std::fs::write(&path, body.to_string()).expect("write the Reconcile");
    path.to_string_lossy().into_owned()
}

#[test]
fn an_operator_bound_in_its_namespace_delegates_its_objects_and_no_others() {
    let world = Widgets::start();
    for namespace in ["team-a", "team-b"] {
        world
            .cluster
            .kubectl_ok(&["create", "namespace", namespace]);
    }
    world.cluster.apply(TEAM_A_OPERATOR);
    let (_plugin, plugin_log) = world.plugin_logged("widgets", "Hello", &[]);
    wait_plugin_ready(&world.cluster, "widgets");

    // End to end: the operator, as its ServiceAccount, reconciles team-a's
    // Widget; the plugin sees who asked.
    let kubeconfig = world.work.path().join("team-a-operator.kubeconfig");
    let token = world.cluster.token("team-a", "widgets-operator");
    world.cluster.kubeconfig_for_token(&kubeconfig, &token);
    let (_operator, operator_log) = world.run_operator_in("team-a", &kubeconfig, &[]);
    world.cluster.apply(&widget_in("team-a", "mine"));
    wait_until(
        "team-a's Widget Ready",
        Duration::from_secs(60),
        || match world.ready_in("team-a", "mine") {
            Ok(ready) if ready["status"] == "True" => Ok(()),
            Ok(ready) => Err(format!("{ready}; operator: {:?}", operator_log.drain())),
            Err(error) => Err(error),
        },
    );
    plugin_log.wait_for(Duration::from_secs(5), "the operator as caller", |line| {
        line.contains(&format!("caller={OPERATOR}"))
    });

    // The same identity, by hand: refused team-b's Widget wherever it asks.
    world.cluster.apply(&widget_in("team-b", "theirs"));
    let dir = world.work.path();
    let as_operator = |path: &str, file: &str| {
        let as_user = format!("--as={OPERATOR}");
        let output = world
            .cluster
            .kubectl(&["create", "--raw", path, "-f", file, &as_user]);
        assert!(!output.status.success(), "{path} accepted");
        output_text(&output)
    };
    let theirs = reconcile_file(dir, "team-b", "theirs");
    let group = "/apis/plugins.kplug.io/v1alpha1";
    // kube-apiserver refuses these before kplug sees them.
    let in_team_b = as_operator(&format!("{group}/namespaces/team-b/reconciles"), &theirs);
    assert!(
        in_team_b.contains("cannot create resource \"reconciles\" in API group \"plugins.kplug.io\" in the namespace \"team-b\""),
        "{in_team_b}"
    );
    let cluster_wide = as_operator(&format!("{group}/reconciles"), &theirs);
    assert!(
        cluster_wide.contains("cannot create resource \"reconciles\" in API group \"plugins.kplug.io\" at the cluster scope"),
        "{cluster_wide}"
    );
    // kplug refuses another namespace's object in team-a's reconciles.
    let smuggled = as_operator(&format!("{group}/namespaces/team-a/reconciles"), &theirs);
    assert!(
        smuggled.contains("spec.object.metadata.namespace: Invalid value: \"team-b\": must be \"team-a\", the namespace of the request"),
        "{smuggled}"
    );
    // Nothing of it reached the plugin: it saw the operator's reconciles only.
    let seen = plugin_log.drain();
    assert!(
        seen.iter().all(|line| !line.contains("theirs")),
        "the plugin was called for team-b's Widget: {seen:?}"
    );
    // And the operator never touched team-b's Widget (it watches team-a).
    let theirs = world.get_in("team-b", "theirs").expect("team-b's Widget");
    assert!(theirs.get("status").is_none(), "{theirs}");
}
