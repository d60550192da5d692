//! A team's operator: the zero-code operator bound by RoleBindings in its
//! namespace alone delegates that namespace's Widgets through
//! `namespaces/team-a/reconciles`, and its identity is refused another
//! namespace's objects (README "Who may reconcile what"). Straight to
//! kplug (`--kplug-url`), it is the same identity under the same rules.

mod support;

use std::path::Path;
use std::time::Duration;

use kplug_test_support::audit::AuditLog;
use kplug_test_support::{Lines, free_port, output_text, wait_plugin_ready, wait_until};
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

/// Waits until team-a's Widget `mine` is Ready (the operator's log in the
/// error) and the plugin saw the team's operator as the caller.
fn wait_served_by_the_operator(world: &Widgets, operator_log: &Lines, plugin_log: &Lines) {
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
    wait_served_by_the_operator(&world, &operator_log, &plugin_log);

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

/// The reconciles of `team-a` kube-apiserver passed on to kplug since `mark`.
fn reconciles_through_kube_apiserver(audit: &AuditLog, mark: u64) -> usize {
    let writes = audit
        .writes_since(mark)
        .expect("kube-apiserver's audit log");
    writes
        .get("create reconciles.plugins.kplug.io")
        .copied()
        .unwrap_or_default()
}

/// Waits until the Widget `team-a/name`'s Ready condition has `status` and
/// `reason`, and returns its message.
fn wait_ready_condition(world: &Widgets, name: &str, status: &str, reason: &str) -> String {
    let what = format!("{name} Ready={status} ({reason})");
    let mut message = String::new();
    wait_until(&what, Duration::from_secs(60), || {
        let ready = world.ready_in("team-a", name)?;
        message = ready["message"].as_str().unwrap_or_default().to_owned();
        (ready["status"] == status && ready["reason"] == reason)
            .then_some(())
            .ok_or_else(|| ready.to_string())
    });
    message
}

#[test]
fn straight_to_kplug_the_operator_is_the_same_identity_under_the_same_rules() {
    let (world, audit) = Widgets::start_audited("team-a");
    world.cluster.kubectl_ok(&["create", "namespace", "team-a"]);
    world.cluster.apply(TEAM_A_OPERATOR);
    world
        .cluster
        .kubectl_ok(&["create", "serviceaccount", "nobody", "-n", "team-a"]);
    let (_plugin, plugin_log) = world.plugin_logged("widgets", "Hello", &[]);
    wait_plugin_ready(&world.cluster, "widgets");
    let dir = world.work.path();
    // Watches, status and Events go to kube-apiserver as the operator.
    let kubeconfig = dir.join("team-a-operator.kubeconfig");
    let token = world.cluster.token("team-a", "widgets-operator");
    world.cluster.kubeconfig_for_token(&kubeconfig, &token);
    let token_file = |name: &str, token: &str| {
        let path = dir.join(format!("{name}.token"));
        std::fs::write(&path, token).expect("write the token");
        path
    };
    let operator_token = token_file("widgets-operator", &token);
    let nobody_token = token_file("nobody", &world.cluster.token("team-a", "nobody"));
    let ca = world.kplug.certs.join("ca.crt");
    let direct_operator = |port: u16, token: &Path| {
        world.run_operator_in(
            "team-a",
            &kubeconfig,
            &[
                &format!("--kplug-url=https://localhost:{port}"),
                &format!("--kplug-ca-file={}", ca.display()),
                &format!("--kplug-token-file={}", token.display()),
            ],
        )
    };

    // Where nothing listens: the Widget says kplug cannot be reached there.
    let closed = free_port();
    let (operator, _log) = direct_operator(closed, &operator_token);
    world.cluster.apply(&widget_in("team-a", "mine"));
    let message = wait_ready_condition(&world, "mine", "False", "KplugUnavailable");
    assert!(
        message.contains(&format!(
            "kplug could not be reached at https://localhost:{closed}/"
        )),
        "{message}"
    );
    drop(operator);

    // kplug reviews the token it is given, and RBAC decides as through
    // kube-apiserver: a ServiceAccount without `create reconciles` is refused.
    let (operator, _log) = direct_operator(world.kplug.https, &nobody_token);
    let message = wait_ready_condition(&world, "mine", "False", "Forbidden");
    assert!(
        message.contains("system:serviceaccount:team-a:nobody")
            && message.contains("cannot create resource \"reconciles\""),
        "{message}"
    );
    drop(operator);

    // The operator's own token: Ready, the plugin sees the operator as the
    // caller, and kube-apiserver served none of these reconciles (one sent
    // through it by hand first shows that it counts them).
    let by_hand = audit.mark().expect("the audit log's end");
    world.cluster.kubectl_ok(&[
        "create",
        "--raw",
        "/apis/plugins.kplug.io/v1alpha1/namespaces/team-a/reconciles",
        "-f",
        &reconcile_file(dir, "team-a", "mine"),
    ]);
    let mark = audit.mark().expect("the audit log's end");
    assert_eq!(
        reconciles_through_kube_apiserver(&audit, by_hand),
        1,
        "kube-apiserver logs the reconciles it passes on"
    );
    let (_operator, operator_log) = direct_operator(world.kplug.https, &operator_token);
    wait_served_by_the_operator(&world, &operator_log, &plugin_log);
    assert_eq!(
        reconciles_through_kube_apiserver(&audit, mark),
        0,
        "the operator's reconciles went through kube-apiserver"
    );
}
