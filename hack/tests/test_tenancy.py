"""A reconcile acts only on what its caller may touch, on the real cluster, with kplug and the DatabaseTable
plugins installed by the READMEs: an identity that may create reconciles and nothing else forges a Finalize of
another team's DatabaseTable; kplug refuses it in kube-apiserver's words before any plugin is called, and writes
an audit line for it. Given the right a controller of that object holds, the same call reaches the plugin.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

from install import KPLUG_NS, KPLUG_SELECTOR, PLUGINS, Installed
from kubecluster import Cluster, wait_for

INTRUDER = "system:serviceaccount:team-b:intruder"
PLUGIN = PLUGINS[0]
FORGED = json.dumps({
    "apiVersion": "plugins.kplug.io/v1alpha1",
    "kind": "Reconcile",
    "spec": {
        "operation": "Finalize",
        "object": {
            "apiVersion": "myorg.org/v1alpha1",
            "kind": "DatabaseTable",
            "metadata": {"name": "victim", "namespace": "team-a"},
            "spec": {"table": "victim", "columns": [{"name": "id", "type": "integer"}]},
        },
    },
})


def reconcile_as(cluster: Cluster, who: str, body: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", "--kubeconfig", cluster.kubeconfig, f"--as={who}", "create", "--raw",
         f"/apis/plugins.kplug.io/v1alpha1/plugins/{PLUGIN}/reconcile", "-f", "-"],
        input=body, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def audit_lines(cluster: Cluster, wanted: Callable[[dict], bool]) -> list[dict]:
    """kplug's audit lines (its pods' stdout, both replicas) that ``wanted`` accepts."""
    found = []
    for pod in cluster.ready_pods(KPLUG_NS, KPLUG_SELECTOR):
        for line in cluster.kubectl("-n", KPLUG_NS, "logs", pod["metadata"]["name"]).splitlines():
            if line.startswith("{") and '"objectRef"' in line and wanted(event := json.loads(line)):
                found.append(event)
    return found


def test_a_forged_finalize_is_refused_before_the_plugin_and_audited(installed: Installed) -> None:
    cluster = installed.cluster
    cluster.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a}\n")
    cluster.kubectl("create", "clusterrolebinding", "intruder-reconciles", "--clusterrole=kplug:operator", f"--user={INTRUDER}")

    denial = (
        f'databasetables.myorg.org "victim" is forbidden: User "{INTRUDER}" cannot update resource '
        '"databasetables/finalizers" in API group "myorg.org" in the namespace "team-a"'
    )
    refused = wait_for(
        "the forged Finalize refused for the object",
        lambda: (done := reconcile_as(cluster, INTRUDER, FORGED)).returncode != 0 and denial in done.stderr and done,
        30,
    )
    assert f"Error from server (Forbidden): {denial}" in refused.stderr, refused.stderr
    # No plugin was called for it, and kplug's audit log says who tried what.
    [event] = wait_for(
        "the refusal's audit line",
        lambda: audit_lines(cluster, lambda e: e["user"]["username"] == INTRUDER and e["code"] == 403) or None,
        30,
    )
    assert event["operation"] == "Finalize" and event["outcome"] == "Forbidden", event
    assert event["objectRef"] == {"apiVersion": "myorg.org/v1alpha1", "kind": "DatabaseTable", "namespace": "team-a", "name": "victim"}, event
    assert (event["plugin"], event["instance"], event["operationId"]) == (PLUGIN, "", ""), event
    assert denial in event["message"], event

    # A controller's right on team-a's DatabaseTables: the same call reaches the plugin.
    cluster.apply(
        f"""apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: tables-finalizer, namespace: team-a}}
rules: [{{apiGroups: [myorg.org], resources: [databasetables/finalizers], verbs: [update]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: intruder-finalizes, namespace: team-a}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: tables-finalizer}}
subjects: [{{kind: User, name: "{INTRUDER}"}}]
"""
    )
    allowed = wait_for("the Finalize allowed", lambda: (done := reconcile_as(cluster, INTRUDER, FORGED)).returncode == 0 and done, 30)
    answer = json.loads(allowed.stdout)
    assert answer["status"]["plugin"]["name"] == PLUGIN, answer
    [event] = wait_for(
        "the call's audit line",
        lambda: audit_lines(cluster, lambda e: e["user"]["username"] == INTRUDER and e["code"] == 201) or None,
        30,
    )
    assert event["instance"] == answer["status"]["plugin"]["instance"] and event["operationId"] == answer["status"]["operationId"], (event, answer)
