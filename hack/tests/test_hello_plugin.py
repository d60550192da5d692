"""The hello plugin installed by examples/hello-rust/deploy/README.md, next to
README.md's kplug: both of its pods heartbeat to both kplug replicas with
their own ServiceAccount's projected token, and a reconcile through
kube-apiserver reaches one of them over mutual TLS. (The in-cluster benches
measure this installation; here it is only checked.)"""

from __future__ import annotations

import json

from install import HELLO_README, KPLUG_NS, KPLUG_SELECTOR, PLUGINS_NS, Installed, run_script
from kubecluster import REPO, wait_for
from readme import shell_blocks
from test_install import plugins_at

SELECTOR = "app.kubernetes.io/name=hello-plugin"


def test_the_hello_plugin_by_its_readme(installed: Installed) -> None:
    cluster = installed.cluster
    run_script(cluster, installed.work, f"{REPO}/hack/images.sh load hello-plugin", "loading the hello plugin's image")
    run_script(cluster, installed.work, shell_blocks(HELLO_README, "Install")[0], "the hello plugin's installation")

    pods = {pod["metadata"]["name"] for pod in cluster.ready_pods(PLUGINS_NS, SELECTOR)}
    assert len(pods) == 2, pods
    replicas = [pod["status"]["podIP"] for pod in cluster.ready_pods(KPLUG_NS, KPLUG_SELECTOR)]
    assert len(replicas) == 2

    def on_every_replica() -> list[dict] | None:
        seen = [plugins_at(installed, ip).get("hello") for ip in replicas]
        for plugin in seen:
            ready = {i["name"] for i in (plugin or {}).get("status", {}).get("instances", []) if i["ready"]}
            if ready != pods:
                return None
        return seen

    for plugin in wait_for("hello with both pods Ready on both kplug replicas", on_every_replica, 90):
        assert plugin["status"]["registeredBy"] == f"system:serviceaccount:{PLUGINS_NS}:hello-plugin", plugin["status"]
        assert plugin["spec"]["api"]["group"] == "example.com", plugin["spec"]

    request = installed.work / "hello-reconcile.json"
    request.write_text(
        json.dumps(
            {
                "apiVersion": "plugins.kplug.io/v1alpha1",
                "kind": "Reconcile",
                "spec": {"object": {"apiVersion": "example.com/v1", "kind": "Greeting", "metadata": {"name": "ada"}}},
            }
        )
    )
    answer = json.loads(cluster.kubectl("create", "--raw", "/apis/plugins.kplug.io/v1alpha1/plugins/hello/reconcile", "-f", str(request)))
    assert answer["status"]["success"] is True, answer["status"]
    assert answer["status"]["objectStatus"] == {"greeting": "hello, ada"}, answer["status"]
