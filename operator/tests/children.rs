//! Plugins that manage Kubernetes objects (issue 27), on a real control
//! plane: the website plugin (examples/website) returns a ConfigMap, a
//! Deployment and a Service for each Website, and the zero-code operator
//! applies them in waves as the Website's, records them in its
//! `status.children`, holds `Ready` until they are, leaves alone what
//! another manager set, undoes and reports a change to what the plugin asks
//! for (drift), prunes what the plugin stops asking for (but holds
//! a mass prune until the Website allows it, and abandons a child marked
//! to be kept), and removes them, highest wave first, before the Website
//! goes.
//!
//! This control plane runs no controller-manager: no Deployment becomes
//! available by itself, which shows `Ready` waiting for it; the test then
//! writes the Deployment's status as its controller would.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use kplug_test_support::{
    Process, free_port, hello_plugin_command, output_text, plugin_identity, plugin_tls, repo_root,
    wait_plugin_ready, wait_until, workspace_binary,
};
use serde_json::Value;
use support::widgets::Widgets;

const WEBSITES: &str = "websites.sites.example.com";

/// The Widgets world with the Website CRD.
fn websites() -> Widgets {
    let world = Widgets::start();
    let crd = std::fs::read_to_string(repo_root().join("examples/website/crds/websites.yaml"))
        .expect("the Website CRD");
    world.cluster.apply(&crd);
    world.cluster.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        &format!("crd/{WEBSITES}"),
        "--timeout=30s",
    ]);
    world
}

/// The Widgets world with the Website CRD and the website plugin.
fn start() -> (Widgets, Process) {
    let world = websites();
    let token = plugin_identity(
        &world.cluster,
        "website",
        Some("website"),
        world.work.path(),
    );
    let mut command = Command::new(workspace_binary("website-plugin"));
    command
        .args(["--name", "website"])
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--image", "kplug.local/toolbox:1"]);
    plugin_tls(&mut command, &world.kplug, &token);
    let plugin = Process::spawn(&mut command, "website-plugin");
    wait_plugin_ready(&world.cluster, "website");
    (world, plugin)
}

fn get(world: &Widgets, what: &str) -> Result<Value, String> {
    let output = world
        .cluster
        .kubectl(&["get", what, "-n", "default", "-o", "json"]);
    serde_json::from_slice(&output.stdout).map_err(|_| output_text(&output))
}

fn condition<'v>(object: &'v Value, type_: &str) -> Option<&'v Value> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// Annotates the Website `default/hello` with `annotation` (`KEY=VALUE`).
fn annotate_website(world: &Widgets, annotation: &str) {
    world
        .cluster
        .kubectl_ok(&["annotate", "website", "hello", "-n", "default", annotation]);
}

/// The server-side applies kube-apiserver has served on ConfigMaps,
/// Deployments and Services (its `apiserver_request_total`).
fn applies(world: &Widgets) -> u64 {
    let metrics = world.cluster.kubectl_ok(&["get", "--raw", "/metrics"]);
    metrics
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{") && l.contains(r#"verb="APPLY""#))
        .filter(|l| {
            ["configmaps", "deployments", "services"]
                .iter()
                .any(|r| l.contains(&format!(r#"resource="{r}""#)))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Writes the Deployment `default/hello`'s status as its controller would:
/// no controller-manager runs on this control plane.
fn deployment_status(world: &Widgets, status: &str) {
    world.cluster.kubectl_ok(&[
        "patch",
        "deployment",
        "hello",
        "-n",
        "default",
        "--subresource=status",
        "--type=merge",
        "-p",
        status,
    ]);
}

fn site(pages: &str, expose: bool) -> String {
    format!(
        "apiVersion: sites.example.com/v1alpha1\nkind: Website\nmetadata: {{name: hello, namespace: default}}\n\
         spec: {{expose: {expose}, pages: {{index.html: '{pages}'}}}}\n"
    )
}

#[test]
fn a_website_s_children_are_applied_owned_followed_pruned_and_torn_down() {
    let (world, mut plugin) = start();
    let kubeconfig = world.cluster.kubeconfig();
    let (_operator, log) = world.run_operator_for(WEBSITES, "default", &kubeconfig, &[]);
    world.cluster.apply(&site("<h1>one</h1>", true));
    let website = get(&world, "website/hello").expect("the Website");
    let uid = website["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();

    // Wave 0, then wave 1 once the ConfigMap exists: each owned by the
    // Website, labelled and annotated with its key.
    wait_until("the three children", Duration::from_secs(60), || {
        let status = |error: String| {
            let website = get(&world, "website/hello").unwrap_or_default();
            format!("{error}; the Website's status: {}", website["status"])
        };
        for (what, key) in [
            ("configmap/hello-pages", "pages"),
            ("deployment/hello", "web"),
            ("service/hello", "service"),
        ] {
            let child = get(&world, what).map_err(status)?;
            let owner = &child["metadata"]["ownerReferences"][0];
            let owned = owner["uid"] == uid.as_str()
                && owner["controller"] == true
                && owner["blockOwnerDeletion"] == true
                && owner["kind"] == "Website"
                && child["metadata"]["labels"]["plugins.kplug.io/parent-uid"] == uid.as_str()
                && child["metadata"]["annotations"]["plugins.kplug.io/child-key"] == key;
            if !owned {
                return Err(status(format!("{what}: {child}")));
            }
        }
        Ok(())
    });
    // Not Ready while the Deployment is not available, and saying so.
    wait_until(
        "Ready waiting for the Deployment",
        Duration::from_secs(30),
        || {
            let website = get(&world, "website/hello")?;
            let children = website["status"]["children"].as_array().map_or(0, Vec::len);
            let ready = condition(&website, "Ready").cloned().unwrap_or_default();
            let children_ready = condition(&website, "ChildrenReady")
                .cloned()
                .unwrap_or_default();
            let waiting = children == 3
                && ready["status"] == "False"
                && ready["reason"] == "ChildrenNotReady"
                && children_ready["status"] == "False"
                && children_ready["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("\"web\" (Deployment default/hello)"))
                && !children_ready["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("pages");
            waiting
                .then_some(())
                .ok_or_else(|| website["status"].to_string())
        },
    );

    // The Deployment turning available (its controller's status write,
    // made here by hand: no controller-manager runs) wakes the Website
    // through the watch on Deployments, well before its 5-minute resync.
    deployment_status(
        &world,
        r#"{"status":{"observedGeneration":1,"replicas":1,"updatedReplicas":1,"readyReplicas":1,"availableReplicas":1}}"#,
    );
    wait_until(
        "Ready once the Deployment is available",
        Duration::from_secs(20),
        || {
            let website = get(&world, "website/hello")?;
            let ready = condition(&website, "Ready").cloned().unwrap_or_default();
            let children_ready = condition(&website, "ChildrenReady")
                .cloned()
                .unwrap_or_default();
            (ready["status"] == "True"
                && children_ready["status"] == "True"
                && website["status"]["availableReplicas"] == 1)
                .then_some(())
                .ok_or_else(|| website["status"].to_string())
        },
    );
    // A reconcile whose children are as last applied applies none of them
    // again: kube-apiserver counts no apply of them.
    let before = applies(&world);
    assert!(
        before >= 3,
        "kube-apiserver counts applies as APPLY: {before}"
    );
    log.drain();
    annotate_website(&world, "kplug.io/reconcile-requested-at=1");
    log.wait_for(Duration::from_secs(20), "the reconcile asked for", |l| {
        l.contains("reconciled") && l.contains("hello.default")
    });
    assert_eq!(applies(&world), before, "children applied again unchanged");

    // A child deleted by hand is applied again, as soon.
    world
        .cluster
        .kubectl_ok(&["delete", "service", "hello", "-n", "default"]);
    wait_until("the Service back", Duration::from_secs(20), || {
        get(&world, "service/hello").map(|_| ())
    });

    // A label another manager sets on a child stays through the next apply;
    // the pages follow the spec.
    world.cluster.kubectl_ok(&[
        "label",
        "configmap",
        "hello-pages",
        "-n",
        "default",
        "team=web",
    ]);
    world.cluster.apply(&site("<h1>two</h1>", true));
    wait_until("the pages follow", Duration::from_secs(30), || {
        let pages = get(&world, "configmap/hello-pages")?;
        (pages["data"]["index.html"] == "<h1>two</h1>")
            .then_some(())
            .ok_or_else(|| pages.to_string())
    });
    let pages = get(&world, "configmap/hello-pages").expect("the pages");
    assert_eq!(pages["metadata"]["labels"]["team"], "web", "{pages}");

    // A field the plugin asks for, changed by hand: applied again at once
    // (the watch), and reported on the child's line and as an Event.
    world.cluster.kubectl_ok(&[
        "patch",
        "configmap",
        "hello-pages",
        "-n",
        "default",
        "--type=merge",
        "-p",
        r#"{"data":{"index.html":"hacked"}}"#,
    ]);
    wait_until(
        "the drift undone and reported",
        Duration::from_secs(20),
        || {
            let pages = get(&world, "configmap/hello-pages")?;
            let website = get(&world, "website/hello")?;
            let drifted = &website["status"]["children"][0]["drifted"];
            let undone = pages["data"]["index.html"] == "<h1>two</h1>"
                && drifted["fields"] == serde_json::json!(["data.index.html"])
                && drifted["managers"] == serde_json::json!(["kubectl-patch"]);
            undone
                .then_some(())
                .ok_or_else(|| format!("{}; {}", pages["data"], website["status"]["children"]))
        },
    );
    let events = world.cluster.kubectl_ok(&[
        "get",
        "events",
        "-n",
        "default",
        "--field-selector",
        "reason=ChildDrifted",
        "-o",
        "jsonpath={.items[*].message}",
    ]);
    assert!(
        events.contains("data.index.html changed by kubectl-patch; applied again"),
        "{events}"
    );

    // A child the plugin stops asking for is removed, and leaves the inventory.
    world.cluster.apply(&site("<h1>two</h1>", false));
    wait_until("the Service pruned", Duration::from_secs(30), || {
        let website = get(&world, "website/hello")?;
        let keys: Vec<&str> = website["status"]["children"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["key"].as_str())
            .collect();
        (world.gone(Some("default"), "service/hello") && keys == ["pages", "web"])
            .then_some(())
            .ok_or_else(|| format!("{keys:?}: {}", website["status"]))
    });

    // Deleted with its plugin scaled to zero: the children go from the
    // inventory, highest wave first, then the Website. The plugin declares
    // no Finalize, so the Website's only finalizer is the children's, for
    // their waves.
    world
        .cluster
        .apply(&site("<h1>other</h1>", true).replace("name: hello", "name: other"));
    wait_until("the other site's Service", Duration::from_secs(60), || {
        get(&world, "service/other").map(|_| ())
    });
    let other = get(&world, "website/other").expect("the other Website");
    assert_eq!(
        other["metadata"]["finalizers"],
        serde_json::json!(["kplug.io/children"]),
        "{other}"
    );
    plugin.terminate(Duration::from_secs(10));
    wait_until("the website plugin gone", Duration::from_secs(30), || {
        world
            .gone(None, "plugin/website")
            .then_some(())
            .ok_or("still registered")
    });
    log.drain();
    world.cluster.kubectl_ok(&[
        "delete",
        "website",
        "other",
        "-n",
        "default",
        "--wait=false",
    ]);
    wait_until(
        "the other Website and its children gone",
        Duration::from_secs(60),
        || {
            let left: Vec<&str> = [
                "website/other",
                "deployment/other",
                "service/other",
                "configmap/other-pages",
            ]
            .into_iter()
            .filter(|what| !world.gone(Some("default"), what))
            .collect();
            left.is_empty()
                .then_some(())
                .ok_or_else(|| format!("{left:?}"))
        },
    );
    let removed: Vec<String> = log
        .drain()
        .into_iter()
        .filter(|l| l.contains("removed a child") && l.contains("default/other"))
        .filter_map(|l| {
            Some(
                l.split("key=")
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .to_owned(),
            )
        })
        .collect();
    let pages_at = removed.iter().position(|k| k == "pages");
    let last_wave_one = removed.iter().rposition(|k| k == "web" || k == "service");
    assert!(
        removed.len() == 3 && last_wave_one < pages_at,
        "wave 1 (web, service), then wave 0 (pages): {removed:?}"
    );

    // A release that asks for no children at all (the hello plugin, in the
    // website plugin's place): nothing is deleted, and the Website says why.
    let token = world.work.path().join("website.token");
    let _hello = Process::spawn(
        hello_plugin_command(&world.kplug, "website", &token)
            .args(["--api", "websites.sites.example.com/v1alpha1"])
            .args([
                "--implementation",
                "BusyboxHttpd",
                "--heartbeat-interval",
                "1",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit()),
        "hello as website",
    );
    world.cluster.apply(&site("<h1>three</h1>", false));
    wait_until("the mass prune held", Duration::from_secs(60), || {
        let website = get(&world, "website/hello")?;
        let paused = condition(&website, "PrunePaused")
            .cloned()
            .unwrap_or_default();
        let held = paused["status"] == "True"
            && paused["message"].as_str().is_some_and(|m| {
                m.contains("no longer asks for 2 of the 2 children")
                    && m.contains("plugins.kplug.io/allow-mass-prune=true")
            });
        held.then_some(())
            .ok_or_else(|| website["status"].to_string())
    });
    get(&world, "deployment/hello").expect("the Deployment is kept");
    let events = world.cluster.kubectl_ok(&[
        "get",
        "events",
        "-n",
        "default",
        "--field-selector",
        "reason=PrunePaused",
        "-o",
        "jsonpath={.items[*].type}",
    ]);
    assert!(events.contains("Warning"), "{events}");

    // Allowed: the Deployment goes, and the ConfigMap marked to be kept is
    // abandoned: it stays, no longer the Website's.
    world.cluster.kubectl_ok(&[
        "annotate",
        "configmap",
        "hello-pages",
        "-n",
        "default",
        "plugins.kplug.io/prune=disabled",
    ]);
    annotate_website(&world, "plugins.kplug.io/allow-mass-prune=true");
    wait_until(
        "the Deployment pruned, the pages abandoned",
        Duration::from_secs(60),
        || {
            let pages = get(&world, "configmap/hello-pages")?;
            let website = get(&world, "website/hello")?;
            let done = world.gone(Some("default"), "deployment/hello")
                && pages["metadata"].get("ownerReferences").is_none()
                && pages["metadata"]["labels"]
                    .get("plugins.kplug.io/parent-uid")
                    .is_none()
                && pages["data"]["index.html"] == "<h1>two</h1>"
                && website["status"].get("children").is_none()
                && condition(&website, "PrunePaused").is_none();
            done.then_some(())
                .ok_or_else(|| format!("{pages}; {}", website["status"]))
        },
    );
}

#[test]
fn declared_child_kinds_are_watched_from_the_start_and_an_unknown_one_is_refused() {
    let world = websites();
    let kubeconfig = world.cluster.kubeconfig();
    // No Website exists, so no child was applied: the watches come from
    // --child-resource alone.
    let mut operator = world.operator_in("default", WEBSITES, &kubeconfig);
    operator
        .arg("--child-resource=configmaps,deployments.apps")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let (mut running, log) = Process::spawn_with_stderr(&mut operator, "kplug-operator");
    for kind in ["v1/ConfigMap", "apps/v1/Deployment"] {
        log.wait_for(Duration::from_secs(30), kind, |line| {
            line.contains("watching the operator's children of this kind") && line.contains(kind)
        });
    }
    assert!(
        running.terminate(Duration::from_secs(10)),
        "stops on SIGTERM"
    );

    let mut refused = world.operator_in("default", WEBSITES, &kubeconfig);
    let output = refused
        .arg("--child-resource=services,gadgets.nowhere.example.com")
        .stdout(Stdio::null())
        .output()
        .expect("run kplug-operator");
    let said = output_text(&output);
    assert!(!output.status.success(), "{said}");
    assert!(
        said.contains("discovering gadgets.nowhere.example.com") && said.contains("is not served"),
        "{said}"
    );
}

/// `kubectl kplug reconcile` sends the observed children as the operator
/// does, and `--dry-run=server` shows what applying the answer's children
/// would change, by a server-side dry run of the operator's own apply,
/// without writing anything.
#[test]
fn kubectl_kplug_reconcile_observes_the_children_and_dry_runs_their_apply() {
    let (world, _plugin) = start();
    let kubeconfig = world.cluster.kubeconfig();
    let (mut operator, _log) = world.run_operator_for(WEBSITES, "default", &kubeconfig, &[]);
    world.cluster.apply(&site("<h1>one</h1>", true));
    wait_until(
        "the three children in the inventory",
        Duration::from_secs(60),
        || {
            let website = get(&world, "website/hello")?;
            let children = website["status"]["children"].as_array().map_or(0, Vec::len);
            (children == 3)
                .then_some(())
                .ok_or_else(|| website["status"].to_string())
        },
    );
    assert!(
        operator.terminate(Duration::from_secs(30)),
        "the operator stops"
    );
    deployment_status(
        &world,
        r#"{"status":{"replicas":1,"readyReplicas":1,"availableReplicas":1}}"#,
    );
    world.cluster.apply(&site("<h1>two</h1>", false));

    let kplug = |args: &[&str]| {
        let output = Command::new(workspace_binary("kubectl-kplug"))
            .args(["reconcile", "website/hello", "-n", "default"])
            .args(args)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .output()
            .expect("run kubectl kplug");
        let text = output_text(&output);
        assert!(output.status.success(), "{text}");
        text
    };
    // The plugin reads the Deployment it was sent: the observed children.
    let answer: Value =
        serde_json::from_str(&kplug(&["--dry-run=server", "-o", "json"])).expect("json");
    assert_eq!(
        answer["status"]["objectStatus"]["availableReplicas"], 1,
        "{answer}"
    );
    let printed = kplug(&["--dry-run=server"]);
    for line in [
        "pages (wave 0, ConfigMap default/hello-pages): would change",
        r#"data.index.html: "<h1>one</h1>" -> "<h1>two</h1>""#,
        "web (wave 1, Deployment default/hello): would change",
        "spec.template.metadata.annotations.",
        "service (wave 1, Service default/hello): no longer desired: would be pruned",
    ] {
        assert!(printed.contains(line), "{line}: {printed}");
    }
    // A dry run: nothing changed.
    let pages = get(&world, "configmap/hello-pages").expect("the pages");
    assert_eq!(pages["data"]["index.html"], "<h1>one</h1>");
    get(&world, "service/hello").expect("the Service is still there");
}

/// The operator as its ServiceAccount, with the rights `kubectl kplug
/// create operator` prints for two of the website's three kinds of child:
/// those two are applied, and the Service, which it may not create, is
/// refused on its line of `status.children` with kube-apiserver's reason.
#[test]
fn an_operator_with_the_printed_rights_applies_the_kinds_granted_and_reports_the_others() {
    let (world, _plugin) = start();
    let printed = Command::new(workspace_binary("kubectl-kplug"))
        .args(["create", "operator", WEBSITES, "-n", "default"])
        .args(["--child-resource", "configmaps,deployments.apps"])
        .output()
        .expect("run kubectl kplug create operator");
    assert!(printed.status.success(), "{}", output_text(&printed));
    // Its RBAC applied as printed; the operator runs here, as its ServiceAccount.
    let manifests = String::from_utf8_lossy(&printed.stdout);
    let rbac: Vec<&str> = manifests
        .split("\n---\n")
        .filter(|document| !document.contains("kind: Deployment"))
        .collect();
    world.cluster.apply(&rbac.join("\n---\n"));
    let kubeconfig = world.work.path().join("websites-operator.kubeconfig");
    let token = world.cluster.token("default", "websites-operator");
    world.cluster.kubeconfig_for_token(&kubeconfig, &token);
    let (_operator, _log) = world.run_operator_for(
        WEBSITES,
        "default",
        &kubeconfig,
        &[
            "--field-manager=websites-operator",
            "--child-resource=configmaps,deployments.apps",
        ],
    );
    world.cluster.apply(&site("<h1>one</h1>", true));
    wait_until(
        "the Service refused, the others applied",
        Duration::from_secs(60),
        || {
            let website = get(&world, "website/hello")?;
            let lines = website["status"]["children"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let error = |key: &str| {
                lines
                    .iter()
                    .find(|line| line["key"] == key)
                    .map(|line| line["error"].as_str().unwrap_or_default().to_owned())
            };
            let applied = error("pages").as_deref() == Some("")
                && error("web").as_deref() == Some("")
                && error("service").is_some_and(|e| e.contains("forbidden"));
            (applied
                && get(&world, "configmap/hello-pages").is_ok()
                && get(&world, "deployment/hello").is_ok())
            .then_some(())
            .ok_or_else(|| website["status"].to_string())
        },
    );
    assert!(world.gone(Some("default"), "service/hello"));
}
