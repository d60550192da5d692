//! A reconcile acts only on what its caller may touch: kplug in cluster
//! mode, behind a real kube-apiserver (hack/control-plane.sh) with RBAC,
//! checks with SubjectAccessReviews that the caller holds, on the object, on
//! each extension and on each observed child of a reconcile, the right a controller of it holds
//! (`kplug_api::access`), in the object's own namespace, before any plugin
//! is called.

use std::process::{Output, Stdio};
use std::time::Duration;

use kplug_test_support::metrics::Samples;
use kplug_test_support::{
    AggregatedKplug, ControlPlane, FAST_REVIEWS, Lines, Process, hello_plugin_command, output_text,
    plugin_identity, wait_plugin_ready, wait_until, widget_crd,
};
use serde_json::{Value, json};

const PLUGIN: &str = "widgets";
const RECONCILE: &str = "/apis/plugins.kplug.io/v1alpha1/plugins/widgets/reconcile";

/// A Reconcile of the Widget `namespace/name`, with `extensions`.
fn request(operation: &str, dry_run: bool, namespace: &str, extensions: Value) -> String {
    json!({
        "apiVersion": "plugins.kplug.io/v1alpha1",
        "kind": "Reconcile",
        "spec": {
            "operation": operation,
            "dryRun": dry_run,
            "object": {
                "apiVersion": "example.com/v1",
                "kind": "Widget",
                "metadata": {"name": "w1", "namespace": namespace},
                "spec": {"size": 1},
            },
            "extensions": extensions,
        },
    })
    .to_string()
}

/// Fields drop in order: the processes, then the control plane (its stop
/// reads its folder), then the folder.
struct World {
    _plugin: Process,
    /// The plugin's log: a line per greeting, naming the caller.
    plugin_log: Lines,
    kplug: AggregatedKplug,
    cluster: ControlPlane,
    work: tempfile::TempDir,
}

impl World {
    fn start() -> Self {
        Self::start_with(FAST_REVIEWS)
    }

    /// With kplug's `flags`.
    fn start_with(flags: &[&str]) -> Self {
        let work = tempfile::Builder::new()
            .prefix("kplug-access-")
            .tempdir_in("/tmp")
            .expect("temp dir");
        let cluster = ControlPlane::start(work.path().join("cp"));
        cluster.apply(&widget_crd("example.com"));
        let kplug = AggregatedKplug::start(&cluster, work.path(), flags);
        for namespace in ["plugins", "team-a", "team-b"] {
            cluster.kubectl_ok(&["create", "namespace", namespace]);
        }
        let token = plugin_identity(&cluster, PLUGIN, Some(PLUGIN), work.path());
        let (plugin, plugin_log) = Process::spawn_with_stderr(
            hello_plugin_command(&kplug, PLUGIN, &token)
                .args(["--heartbeat-interval", "1"])
                .args(["--api", "widgets.example.com/v1"])
                .env("NO_COLOR", "1")
                .stdout(Stdio::null()),
            PLUGIN,
        );
        wait_plugin_ready(&cluster, PLUGIN);
        Self {
            work,
            cluster,
            kplug,
            _plugin: plugin,
            plugin_log,
        }
    }

    /// `kubectl create --raw` of `body` as the user `who`.
    fn reconcile_as(&self, who: &str, body: &str) -> Output {
        let file = self.work.path().join("request.json");
        std::fs::write(&file, body).expect("write the request");
        self.cluster.kubectl(&[
            &format!("--as={who}"),
            "create",
            "--raw",
            RECONCILE,
            "-f",
            &file.to_string_lossy(),
        ])
    }

    /// Calls kplug made to the plugin, whatever their outcome.
    fn plugin_calls(&self) -> f64 {
        let front_proxy = (
            self.cluster.var("KPLUG_FRONT_PROXY_CLIENT_CERT"),
            self.cluster.var("KPLUG_FRONT_PROXY_CLIENT_KEY"),
        );
        let (_, code, body) = self.kplug.curl(
            Some((&front_proxy.0, &front_proxy.1)),
            &["X-Remote-User: admin", "X-Remote-Group: system:masters"],
            "/metrics",
        );
        assert_eq!(code, 200, "{body}");
        Samples::parse(&body).sum("kplug_reconciles_total", &[("plugin", PLUGIN)])
    }

    /// The SubjectAccessReviews kplug sent since the last call, asking
    /// whether `who` may act on Widgets (from its debug log).
    fn widget_reviews_of(&self, who: &str) -> usize {
        let user = format!("user={who} ");
        self.kplug
            .log
            .drain()
            .iter()
            .filter(|l| {
                l.contains("SubjectAccessReview answered")
                    && l.contains(&user)
                    && l.contains(r#"resource: "widgets""#)
            })
            .count()
    }

    /// Waits until `who` gets the answer `check` accepts (bindings reach
    /// kube-apiserver's RBAC cache, and kplug's, within seconds).
    fn eventually(&self, what: &str, who: &str, body: &str, check: impl Fn(&Output) -> bool) {
        wait_until(what, Duration::from_secs(30), || {
            let output = self.reconcile_as(who, body);
            check(&output)
                .then_some(())
                .ok_or_else(|| output_text(&output))
        });
    }
}

fn refused(output: &Output, message: &str) -> bool {
    !output.status.success()
        && output_text(output).contains(&format!("Error from server (Forbidden): {message}"))
}

fn answered(output: &Output) -> bool {
    output.status.success()
        && serde_json::from_slice::<Value>(&output.stdout)
            .is_ok_and(|answer| answer["status"]["plugin"]["name"] == PLUGIN)
}

#[test]
fn a_reconcile_acts_only_on_what_its_caller_may_touch() {
    let world = World::start();
    let cluster = &world.cluster;
    // An operator's identity: it may create reconciles, nothing else.
    cluster.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        "op-reconciles",
        "--clusterrole=kplug:operator",
        "--user=op",
    ]);

    // The forged Finalize of another team's object: refused in
    // kube-apiserver's words, and the plugin never called.
    let forged = request("Finalize", false, "team-b", json!([]));
    let denial = "widgets.example.com \"w1\" is forbidden: User \"op\" cannot update resource \
                  \"widgets/finalizers\" in API group \"example.com\" in the namespace \"team-b\"";
    world.eventually("the forged Finalize refused", "op", &forged, |o| {
        refused(o, denial)
    });
    assert_eq!(world.plugin_calls(), 0.0, "the plugin was called");

    // A controller's rights in team-a: team-a's objects, not team-b's.
    cluster.apply(
        r"apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: widget-controller, namespace: team-a}
rules:
- apiGroups: [example.com]
  resources: [widgets]
  verbs: [get, list, watch]
- apiGroups: [example.com]
  resources: [widgets/status, widgets/finalizers]
  verbs: [update, patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: op-widgets, namespace: team-a}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: widget-controller}
subjects: [{kind: User, name: op}]
",
    );
    for operation in ["Reconcile", "Finalize"] {
        let own = request(operation, false, "team-a", json!([]));
        world.eventually(
            &format!("{operation} of team-a's Widget"),
            "op",
            &own,
            answered,
        );
    }
    // The plugin is told who asked.
    world
        .plugin_log
        .wait_for(Duration::from_secs(10), "the greeting naming op", |l| {
            l.contains("greeting=hello, w1") && l.contains("caller=op")
        });
    assert!(refused(&world.reconcile_as("op", &forged), denial));
    let reconcile_b = request("Reconcile", false, "team-b", json!([]));
    assert!(refused(
        &world.reconcile_as("op", &reconcile_b),
        "widgets.example.com \"w1\" is forbidden: User \"op\" cannot update resource \
         \"widgets/status\" in API group \"example.com\" in the namespace \"team-b\""
    ));

    // A dry run only reads: `get` is enough, and nothing less.
    cluster.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        "viewer-reconciles",
        "--clusterrole=kplug:operator",
        "--user=viewer",
    ]);
    let dry_run = request("Reconcile", true, "team-b", json!([]));
    world.eventually("a dry run without get refused", "viewer", &dry_run, |o| {
        refused(
            o,
            "widgets.example.com \"w1\" is forbidden: User \"viewer\" cannot get resource \
             \"widgets\" in API group \"example.com\" in the namespace \"team-b\"",
        )
    });
    cluster.apply(
        r"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: widget-viewer}
rules: [{apiGroups: [example.com], resources: [widgets], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: viewer-widgets, namespace: team-b}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: widget-viewer}
subjects: [{kind: User, name: viewer}]
",
    );
    world.eventually("a dry run with get", "viewer", &dry_run, answered);
    let real = request("Reconcile", false, "team-b", json!([]));
    assert!(!answered(&world.reconcile_as("viewer", &real)));

    // Each extension needs `get`, in its own namespace: a ConfigMap of
    // team-b is refused to op, one of team-a too until op may read it.
    let settings = |namespace: &str| json!([{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "namespace": namespace}}]);
    let with_extension = request("Reconcile", false, "team-a", settings("team-a"));
    let output = world.reconcile_as("op", &with_extension);
    assert!(
        refused(
            &output,
            "configmaps \"settings\" is forbidden: User \"op\" cannot get resource \
             \"configmaps\" in API group \"\" in the namespace \"team-a\""
        ),
        "{}",
        output_text(&output)
    );
    cluster.kubectl_ok(&[
        "-n",
        "team-a",
        "create",
        "role",
        "settings-reader",
        "--verb=get",
        "--resource=configmaps",
    ]);
    cluster.kubectl_ok(&[
        "-n",
        "team-a",
        "create",
        "rolebinding",
        "op-reads-settings",
        "--role=settings-reader",
        "--user=op",
    ]);
    world.eventually("an extension op may read", "op", &with_extension, answered);
    let foreign = request("Reconcile", false, "team-a", settings("team-b"));
    assert!(refused(
        &world.reconcile_as("op", &foreign),
        "configmaps \"settings\" is forbidden"
    ));

    // So does each observed child: a caller who may not read a Deployment
    // cannot feed the plugin a copy of it.
    let mut observed: Value =
        serde_json::from_str(&request("Reconcile", false, "team-a", json!([])))
            .expect("the request is JSON");
    observed["spec"]["observedChildren"] = json!([{"key": "web", "object": {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "team-a"},
        "status": {"availableReplicas": 1},
    }}]);
    let output = world.reconcile_as("op", &observed.to_string());
    assert!(
        refused(
            &output,
            "deployments.apps \"web\" is forbidden: User \"op\" cannot get resource \
             \"deployments\" in API group \"apps\" in the namespace \"team-a\""
        ),
        "{}",
        output_text(&output)
    );

    // An object of a kind the cluster does not serve, outside the plugin's
    // group, has no right to check: 422 naming it.
    let invented =
        json!([{"apiVersion": "made.up/v1", "kind": "Gadget", "metadata": {"name": "g"}}]);
    let output = world.reconcile_as("op", &request("Reconcile", false, "team-a", invented));
    assert!(
        !output.status.success()
            && output_text(&output).contains("spec.extensions[0].kind: Invalid value: \"Gadget\": the cluster serves no kind \"Gadget\" in \"made.up/v1\""),
        "{}",
        output_text(&output)
    );

    // The refused calls reached no plugin: the four answered ones did
    // (team-a's Reconcile and Finalize, the dry run, the extension).
    assert_eq!(world.plugin_calls(), 4.0);
}

/// A Reconcile of the Widget `namespace/name`, without extensions.
fn reconcile_of(namespace: &str, name: &str) -> String {
    let mut body: Value = serde_json::from_str(&request("Reconcile", false, namespace, json!([])))
        .expect("the request is JSON");
    body["spec"]["object"]["metadata"]["name"] = json!(name);
    body.to_string()
}

#[test]
fn a_right_on_every_object_of_a_namespace_is_asked_once_and_one_on_some_names_still_counts() {
    // Allowed answers kept five minutes, so that a review not sent shows;
    // refusals one second, so that new bindings apply at once.
    let world = World::start_with(&[
        "--authentication-cache-ttl",
        "1s",
        "--authorization-allowed-cache-ttl",
        "5m",
        "--authorization-denied-cache-ttl",
        "1s",
        "--min-heartbeat-interval",
        "1s",
        "--log",
        "info,kplug_apiserver::auth=debug",
    ]);
    let cluster = &world.cluster;
    for (binding, user) in [("op-reconciles", "op"), ("named-reconciles", "named")] {
        cluster.kubectl_ok(&[
            "create",
            "clusterrolebinding",
            binding,
            "--clusterrole=kplug:operator",
            &format!("--user={user}"),
        ]);
    }
    // op controls every Widget of team-a; named, only w1's status.
    for (user, names) in [("op", None), ("named", Some("w1"))] {
        let role = format!("{user}-controls-widgets");
        let mut create_role = vec![
            "-n",
            "team-a",
            "create",
            "role",
            &role,
            "--verb=update",
            "--resource=widgets.example.com/status",
        ];
        let resource_name = names.map(|name| format!("--resource-name={name}"));
        create_role.extend(resource_name.as_deref());
        cluster.kubectl_ok(&create_role);
        cluster.kubectl_ok(&[
            "-n",
            "team-a",
            "create",
            "rolebinding",
            &role,
            &format!("--role={role}"),
            &format!("--user={user}"),
        ]);
    }
    world.eventually(
        "op's Reconcile of w0",
        "op",
        &reconcile_of("team-a", "w0"),
        answered,
    );
    // Five more Widgets: the right on every Widget of team-a, allowed and
    // cached with w0's, answers for each of them.
    world.widget_reviews_of("op");
    for i in 1..=5 {
        let output = world.reconcile_as("op", &reconcile_of("team-a", &format!("w{i}")));
        assert!(answered(&output), "{}", output_text(&output));
    }
    assert_eq!(
        world.widget_reviews_of("op"),
        0,
        "reviews sent for op's Widgets"
    );

    // A right on w1 alone: refused on every name, so asked by name.
    world.eventually(
        "named's Reconcile of w1",
        "named",
        &reconcile_of("team-a", "w1"),
        answered,
    );
    assert!(refused(
        &world.reconcile_as("named", &reconcile_of("team-a", "w2")),
        "widgets.example.com \"w2\" is forbidden: User \"named\" cannot update resource \
         \"widgets/status\" in API group \"example.com\" in the namespace \"team-a\""
    ));
    // Nor does op's right reach past team-a.
    assert!(refused(
        &world.reconcile_as("op", &reconcile_of("team-b", "w1")),
        "widgets.example.com \"w1\" is forbidden: User \"op\" cannot update resource"
    ));
}

/// A Reconcile of the stored object `namespace/name` of `kind` (`spec.objectRef`).
fn by_reference(kind: &str, namespace: &str, name: &str) -> String {
    json!({
        "apiVersion": "plugins.kplug.io/v1alpha1",
        "kind": "Reconcile",
        "spec": {
            "objectRef": {"apiVersion": "example.com/v1", "kind": kind, "namespace": namespace, "name": name},
        },
    })
    .to_string()
}

fn failed_with(output: &Output, message: &str) -> bool {
    !output.status.success() && output_text(output).contains(message)
}

#[test]
fn a_reconcile_by_reference_sends_what_is_stored_and_only_to_who_may_read_it() {
    let world = World::start();
    let cluster = &world.cluster;
    cluster.apply(
        r"apiVersion: example.com/v1
kind: Widget
metadata: {name: w1, namespace: team-a}
spec:
  size: 1
  extensions: [{apiVersion: v1, kind: ConfigMap, name: settings}]
---
apiVersion: example.com/v1
kind: Widget
metadata: {name: orphan, namespace: team-a}
spec:
  extensions: [{apiVersion: v1, kind: ConfigMap, name: absent}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: team-a}
data: {colour: blue}
---
apiVersion: example.com/v1
kind: Widget
metadata: {name: w1, namespace: team-b}
spec: {size: 2}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: widget-controller, namespace: team-a}
rules:
- apiGroups: [example.com]
  resources: [widgets]
  verbs: [get, list, watch]
- apiGroups: [example.com]
  resources: [widgets/status, widgets/finalizers]
  verbs: [update, patch]
- apiGroups: ['']
  resources: [configmaps]
  verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: op-widgets, namespace: team-a}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: widget-controller}
subjects: [{kind: User, name: op}]
",
    );
    cluster.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        "op-reconciles",
        "--clusterrole=kplug:operator",
        "--user=op",
    ]);
    let own = by_reference("Widget", "team-a", "w1");

    // kplug's own identity may read nothing of the plugin's API yet: the
    // caller is told what to grant kplug, and the plugin is not called.
    world.eventually("kplug's missing read right named", "op", &own, |o| {
        failed_with(
            o,
            "kplug may not read widgets.example.com \"w1\" in the namespace \"team-a\" with its \
             own identity",
        )
    });
    // What `kubectl kplug create plugin --api widgets.example.com/v1
    // --extension-resource configmaps` grants kplug.
    cluster.apply(
        r"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: 'kplug:read:widgets'}
rules:
- {apiGroups: [''], resources: [configmaps], verbs: [get]}
- {apiGroups: [example.com], resources: [widgets], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: 'kplug:read:widgets'}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: 'kplug:read:widgets'}
subjects: [{kind: ServiceAccount, name: kplug, namespace: kplug-system}]
",
    );
    world.eventually("a reconcile by reference", "op", &own, answered);

    // The plugin saw the stored object, resourceVersion and extension
    // included, and the answer says so.
    let answer: Value =
        serde_json::from_slice(&world.reconcile_as("op", &own).stdout).expect("the answer");
    let stored = |what: &str, name: &str| {
        let output = cluster.kubectl_ok(&["-n", "team-a", "get", what, name, "-o", "json"]);
        serde_json::from_str::<Value>(&output).expect("the stored object")
    };
    let widget = stored("widget.example.com", "w1");
    assert_eq!(
        answer["spec"]["object"]["metadata"]["resourceVersion"],
        widget["metadata"]["resourceVersion"]
    );
    assert_eq!(answer["spec"]["object"]["spec"], widget["spec"]);
    assert_eq!(answer["spec"]["objectRef"]["name"], "w1");
    let settings = stored("configmap", "settings");
    assert_eq!(answer["spec"]["extensions"][0]["data"], settings["data"]);
    assert_eq!(
        answer["spec"]["extensions"][0]["metadata"]["uid"],
        settings["metadata"]["uid"]
    );
    world
        .plugin_log
        .wait_for(Duration::from_secs(10), "the greeting of w1 for op", |l| {
            l.contains("greeting=hello, w1") && l.contains("caller=op")
        });

    // A missing object, or a missing extension, is a 404 naming it.
    let missing = world.reconcile_as("op", &by_reference("Widget", "team-a", "w2"));
    assert!(
        failed_with(
            &missing,
            "Error from server (NotFound): widgets.example.com \"w2\" not found"
        ),
        "{}",
        output_text(&missing)
    );
    let orphan = world.reconcile_as("op", &by_reference("Widget", "team-a", "orphan"));
    assert!(
        failed_with(
            &orphan,
            "Error from server (NotFound): configmaps \"absent\" not found"
        ),
        "{}",
        output_text(&orphan)
    );

    // Another team's object: refused before it is read, in the same words
    // whether it exists or not, so nothing is learnt of it.
    for name in ["w1", "nothing"] {
        let output = world.reconcile_as("op", &by_reference("Widget", "team-b", name));
        let denial = format!(
            "Error from server (Forbidden): widgets.example.com \"{name}\" is forbidden: User \
             \"op\" cannot get resource \"widgets\" in API group \"example.com\" in the \
             namespace \"team-b\""
        );
        assert!(failed_with(&output, &denial), "{}", output_text(&output));
    }

    // A kind the cluster does not serve: 422 naming it.
    let output = world.reconcile_as("op", &by_reference("Gadget", "team-a", "g"));
    assert!(
        failed_with(
            &output,
            "spec.objectRef.kind: Invalid value: \"Gadget\": the cluster serves no kind \
             \"Gadget\" in \"example.com/v1\""
        ),
        "{}",
        output_text(&output)
    );

    // Only the two reconciles by reference of w1 reached the plugin.
    assert_eq!(world.plugin_calls(), 2.0);
}
