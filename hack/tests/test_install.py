"""kplug installed as README.md says, on the real cluster: the APIService
Available through the real Service, two Ready replicas, and plugins
heartbeating to both through the headless Service with projected tokens."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from install import (
    APISERVICE,
    KPLUG_NS,
    KPLUG_SELECTOR,
    OPERATOR_DEPLOYMENT,
    OPERATOR_SELECTOR,
    PLUGINS,
    PLUGINS_NS,
    Installed,
    delete_without_finalize,
    kplug_audit_lines,
    operator_straight_to_kplug,
    operator_through_kube_apiserver,
    run_script,
    table_without_database,
    wait_plugin_answer,
)
from kubecluster import REPO, wait_for
from load import OPERATOR_USER
from readme import replace_in_line, shell_blocks


def test_the_api_is_available_through_the_service(installed: Installed) -> None:
    cluster = installed.cluster
    apiservice = cluster.kubectl_json("get", "apiservice", APISERVICE)
    assert apiservice["spec"]["service"] == {"name": "kplug", "namespace": KPLUG_NS, "port": 443}
    available = [c for c in apiservice["status"]["conditions"] if c["type"] == "Available"]
    assert available and available[0]["status"] == "True", apiservice["status"]
    assert len(cluster.ready_pods(KPLUG_NS, KPLUG_SELECTOR)) == 2
    resources = cluster.kubectl("api-resources", "--api-group=plugins.kplug.io", "-o", "name")
    assert "plugins.plugins.kplug.io" in resources.split()
    # Discovery of every group works with kplug in it (an unavailable
    # aggregated API fails the whole of `kubectl api-resources`).
    cluster.kubectl("api-resources")


def at_replica(installed: Installed, pod_ip: str, path: str, body: str | None = None) -> dict:
    """GET (or POST ``body`` to) ``path`` under plugins.kplug.io/v1alpha1 of
    one kplug replica directly, as the cluster's admin (a client certificate
    kplug trusts)."""
    pki = installed.cluster.env["KPLUG_CLUSTER_PKI_DIR"]
    post = ["-H", "Content-Type: application/json", "--data-binary", body] if body is not None else []
    reply = subprocess.run(
        [
            "curl", "-sS", "--fail-with-body", "-m", "10", *post,
            "--resolve", f"kplug.{KPLUG_NS}.svc:8443:{pod_ip}",
            "--cacert", str(installed.serving_ca),
            "--cert", f"{pki}/admin.crt", "--key", f"{pki}/admin.key",
            f"https://kplug.{KPLUG_NS}.svc:8443/apis/plugins.kplug.io/v1alpha1/{path}",
        ],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(reply.stdout)


def plugins_at(installed: Installed, pod_ip: str) -> dict[str, dict]:
    """The plugins one kplug replica lists."""
    return {item["metadata"]["name"]: item for item in at_replica(installed, pod_ip, "plugins")["items"]}


def test_plugins_heartbeat_to_both_replicas_with_projected_tokens(installed: Installed) -> None:
    cluster = installed.cluster
    replicas = cluster.ready_pods(KPLUG_NS, KPLUG_SELECTOR)
    assert len(replicas) == 2
    plugin_pods = {p["metadata"]["name"] for p in cluster.kubectl_json("-n", PLUGINS_NS, "get", "pods")["items"] if p["metadata"]["name"].startswith(PLUGINS)}

    def both_ready_everywhere() -> dict[str, dict[str, dict]] | None:
        seen = {pod["metadata"]["name"]: plugins_at(installed, pod["status"]["podIP"]) for pod in replicas}
        for plugins in seen.values():
            for name in PLUGINS:
                instances = plugins.get(name, {}).get("status", {}).get("instances", [])
                if len([i for i in instances if i["ready"]]) != 2:
                    return None
        return seen

    seen = wait_for("both plugins with 2 Ready instances on both kplug replicas", both_ready_everywhere, 120)
    for replica, plugins in seen.items():
        assert set(PLUGINS) <= set(plugins), f"{replica} lists {sorted(plugins)}"
        for name in PLUGINS:
            status = plugins[name]["status"]
            # The heartbeats carried the plugin's own ServiceAccount token.
            assert status["registeredBy"] == f"system:serviceaccount:{PLUGINS_NS}:{name}", status
            instances = {i["name"] for i in status["instances"]}
            assert instances <= plugin_pods, f"{replica}: instances {instances} are not the plugin pods {plugin_pods}"
    first, second = seen.values()
    assert {n: first[n]["spec"] for n in PLUGINS} == {n: second[n]["spec"] for n in PLUGINS}

    # kubectl, through kube-apiserver and the kplug Service, sees them too.
    listed = cluster.kubectl("get", "plugins", "-o", "name").split()
    assert {f"plugin.plugins.kplug.io/{name}" for name in PLUGINS} <= set(listed)


def test_the_registry_service_names_every_replica(installed: Installed) -> None:
    """kplug-registry is headless: its name resolves, in a pod of the plugins' namespace, to each kplug pod, as the
    SDKs need; kplug's own Service to its cluster IP."""
    cluster = installed.cluster
    endpoints = cluster.kubectl_json("-n", KPLUG_NS, "get", "endpoints", "kplug-registry")
    addresses = {a["ip"] for subset in endpoints.get("subsets", []) for a in subset.get("addresses", [])}
    pod_ips = {p["status"]["podIP"] for p in cluster.kubectl_json("-n", KPLUG_NS, "get", "pods", "-l", KPLUG_SELECTOR)["items"]}
    assert addresses == pod_ips
    assert cluster.resolve_in_pod(f"kplug-registry.{KPLUG_NS}.svc.cluster.local", PLUGINS_NS) == pod_ips
    cluster_ip = cluster.kubectl("-n", KPLUG_NS, "get", "service", "kplug", "-o", "jsonpath={.spec.clusterIP}")
    assert cluster.resolve_in_pod(f"kplug.{KPLUG_NS}.svc.cluster.local", PLUGINS_NS) == {cluster_ip}


def test_plugins_from_the_short_manifest_serve_over_kplugs_identities_with_no_secret_of_theirs(
    installed: Installed,
) -> None:
    """The example's plugins, installed from `kubectl kplug create plugin`'s
    output: each instance declares its identity NAME.plugins.kplug.io, a
    reconcile through kube-apiserver and one sent to each kplug replica
    directly reach it over mutual TLS (whichever replica signed an
    instance's certificate, both verify it), and no Secret was made for it
    (the namespace holds the databases' two and the ServiceAccounts' own
    tokens only)."""
    cluster = installed.cluster
    trust = cluster.kubectl_json("-n", PLUGINS_NS, "get", "configmap", "kplug-trust")
    assert trust["data"]["ca.crt"] == installed.serving_ca.read_text(), "kplug-trust is not kplug's CA"
    for name in PLUGINS:
        plugin = cluster.kubectl_json("get", "plugin", name)
        instances = plugin["status"]["instances"]
        assert len(instances) == 2 and all(i["ready"] for i in instances), instances
        assert {i["serverName"] for i in instances} == {f"{name}.plugins.kplug.io"}, instances
        body = json.dumps({
            "apiVersion": "plugins.kplug.io/v1alpha1",
            "kind": "Reconcile",
            "spec": {
                "dryRun": True,
                "object": {
                    "apiVersion": "myorg.org/v1alpha1",
                    "kind": "DatabaseTable",
                    "metadata": {"name": "identity-check", "namespace": "default"},
                    "spec": {"table": "identity_check", "columns": [{"name": "id", "type": "integer"}]},
                },
            },
        })
        path = f"plugins/{name}/reconcile"
        answer = json.loads(cluster.kubectl("create", "--raw", f"/apis/plugins.kplug.io/v1alpha1/{path}", "-f", "-", input=body))
        # The plugin answered (no database here, so it may report a failure):
        # kplug reached it over mutual TLS.
        assert answer["kind"] == "Reconcile" and answer["status"]["plugin"]["name"] == name, answer
        replicas = cluster.ready_pods(KPLUG_NS, KPLUG_SELECTOR)
        assert len(replicas) == 2
        pods = {i["name"] for i in instances}
        for replica in replicas:
            # Each replica shares idle calls among the instances in turn, so a
            # few calls reach every instance, whichever replica signed it.
            reached: set[str] = set()
            for _ in range(10 * len(pods)):
                answer = at_replica(installed, replica["status"]["podIP"], path, body)
                assert answer["kind"] == "Reconcile" and answer["status"]["plugin"]["name"] == name, answer
                reached.add(answer["status"]["plugin"]["instance"])
                if reached == pods:
                    break
            assert reached == pods, f"kplug {replica['metadata']['name']} reached {sorted(reached)} of {name}'s instances {sorted(pods)}"
    secrets = cluster.kubectl_json("-n", PLUGINS_NS, "get", "secrets")["items"]
    made = sorted(s["metadata"]["name"] for s in secrets if s["type"] != "kubernetes.io/service-account-token")
    assert made == ["database-table-mariadb-db", "database-table-postgresql-db"], made


def test_a_plugin_installed_by_the_install_a_plugin_pages_two_lines(installed: Installed) -> None:
    """docs/src/guides/install-plugin.md's block as written, but for this cluster's Kubernetes 1.20
    (``--pdb-v1beta1``, which the page names for it), with its image loaded as a registry would serve it: the plugin
    ``hello`` turns Ready with 2 instances and answers a reconcile. The same output piped to ``kubectl delete``
    removes it after."""
    cluster = installed.cluster
    block = shell_blocks(REPO / "docs" / "src" / "guides" / "install-plugin.md", "Install a plugin")[0]
    on_1_20 = replace_in_line(block, "| kubectl apply -f -", "-n plugins", "-n plugins --pdb-v1beta1")
    label, apply = on_1_20.rstrip("\n").split("\n", 1)
    assert label.startswith("kubectl label namespace plugins "), label
    assert apply.startswith("kubectl kplug create plugin hello --image ghcr.io/kplug/hello-plugin:0.1.0 "), apply
    # `kubectl kplug` is the suite's build.
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target") / "debug"
    path = {"PATH": f"{target}:{os.environ['PATH']}"}
    run_script(cluster, installed.work, f"{REPO}/hack/images.sh load hello-plugin", "the hello image's loading")
    run_script(cluster, installed.work, on_1_20, "Install a plugin's two lines", env=path)
    try:

        def ready() -> bool:
            instances = cluster.kubectl_json("get", "plugin", "hello")["status"].get("instances", [])
            return len(instances) == 2 and all(i["ready"] for i in instances)

        wait_for("plugin hello Ready with 2 instances", ready, timeout=180)
        body = json.dumps({
            "apiVersion": "plugins.kplug.io/v1alpha1",
            "kind": "Reconcile",
            "spec": {"object": {"apiVersion": "greetings.example.com/v1", "kind": "Greeting", "metadata": {"name": "world"}}},
        })
        answer = json.loads(cluster.kubectl("create", "--raw", "/apis/plugins.kplug.io/v1alpha1/plugins/hello/reconcile", "-f", "-", input=body))
        assert answer["status"]["success"] is True and answer["status"]["results"][0]["message"] == "hello, world", answer
    finally:
        run_script(cluster, installed.work, apply.replace("| kubectl apply -f -", "| kubectl delete -f -"), "the plugin's removal", env=path)

    def gone() -> bool:
        return "hello" not in cluster.kubectl("get", "plugins", "-o", "name").replace("plugin.plugins.kplug.io/", "").split()

    wait_for("plugin hello gone from the registry", gone, timeout=120)


@pytest.mark.adds_to_the_installation
def test_the_example_operator_straight_to_kplug_delegates_past_kube_apiserver(installed: Installed) -> None:
    """The example README's "Straight to kplug" overlay: the operator's pods run with ``--kplug-url`` and kplug's
    trust ConfigMap, a new DatabaseTable gets its plugin's answer, kplug's audit log has the operator's reconcile
    of it, and kube-apiserver's has the operator's status write for it and no reconcile. The example's overlay
    applied again takes the operator back through kube-apiserver."""
    cluster = installed.cluster
    namespace, name = "straight", "direct"
    cluster.apply(f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {namespace}}}\n")
    operator_straight_to_kplug(installed)
    try:

        def only_direct_pods() -> bool:
            pods = cluster.kubectl_json("-n", PLUGINS_NS, "get", "pods", "-l", OPERATOR_SELECTOR)["items"]
            return bool(pods) and all("--kplug-url=https://kplug.kplug-system.svc" in p["spec"]["containers"][0]["args"] for p in pods)

        # Not even a terminating replica of before may delegate the object through kube-apiserver.
        wait_for("only operator pods with --kplug-url", only_direct_pods, timeout=120)
        offset = cluster.audit_offset()
        cluster.apply(table_without_database(namespace, name))
        # No database here: the plugin answers with its failure, which the operator writes back all the same.
        answered = wait_plugin_answer(cluster, namespace, name, "the plugin's answer in the DatabaseTable")
        assert any(c["type"] == "Ready" for c in answered["status"]["conditions"]), answered["status"]
        [reconciled, *_] = wait_for(
            "kplug's audit line of the operator's reconcile",
            lambda: kplug_audit_lines(cluster, lambda e: e["user"]["username"] == OPERATOR_USER and e["objectRef"].get("name") == name) or None,
            30,
        )
        assert reconciled["code"] == 201 and reconciled["objectRef"]["namespace"] == namespace, reconciled
        events, _ = cluster.audit_events(offset)
        by_operator = [e for e in events if e.get("user", {}).get("username") == OPERATOR_USER and e.get("stage") == "ResponseComplete"]
        status_writes = [e for e in by_operator if e["objectRef"].get("subresource") == "status" and e["objectRef"].get("name") == name]
        through = [e for e in by_operator if e["objectRef"].get("apiGroup") == "plugins.kplug.io"]
        assert status_writes, f"kube-apiserver's audit log has no status write of {namespace}/{name} by the operator"
        assert not through, f"the operator's reconciles went through kube-apiserver: {[e['objectRef'] for e in through]}"
    finally:
        delete_without_finalize(cluster, namespace, name)
        operator_through_kube_apiserver(installed)
    template = cluster.kubectl_json("-n", PLUGINS_NS, "get", OPERATOR_DEPLOYMENT)["spec"]["template"]["spec"]
    assert not any(a.startswith("--kplug-") for a in template["containers"][0]["args"]), template["containers"][0]["args"]
    assert "volumes" not in template, template["volumes"]
