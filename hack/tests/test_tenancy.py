"""A reconcile acts only on what its caller may touch, on the real cluster, with kplug and the DatabaseTable
plugins installed by the READMEs: an identity that may create reconciles and nothing else forges a Finalize of
another team's DatabaseTable; kplug refuses it in kube-apiserver's words before any plugin is called, and writes
an audit line for it. Given the right a controller of that object holds, the same call reaches the plugin. And a
team's identity bound in its namespace alone reconciles there through ``namespaces/team-a/reconciles``, and nowhere
else.
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


def reconcile_in(namespace: str, name: str) -> str:
    """A dry-run Reconcile, pinned to the PostgreSQL plugin, of the DatabaseTable ``namespace/name``."""
    return json.dumps({
        "apiVersion": "plugins.kplug.io/v1alpha1",
        "kind": "Reconcile",
        "spec": {
            "plugin": PLUGIN,
            "dryRun": True,
            "object": {
                "apiVersion": "myorg.org/v1alpha1",
                "kind": "DatabaseTable",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"serverName": "nowhere", "columns": [{"name": "id", "type": "uint64"}]},
            },
        },
    })


def kubectl_create_as(cluster: Cluster, who: str, namespace: str, body: str) -> subprocess.CompletedProcess[str]:
    """``kubectl create -f -`` of a Reconcile: kubectl posts it to the namespace's reconciles (discovery says so)."""
    return subprocess.run(
        ["kubectl", "--kubeconfig", cluster.kubeconfig, f"--as={who}", "-n", namespace, "create", "-f", "-", "-o", "json"],
        input=body, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


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


TEAM_A_OPERATOR = "system:serviceaccount:team-a:tables-operator"


def test_an_identity_bound_in_its_namespace_reconciles_there_and_nowhere_else(installed: Installed) -> None:
    cluster = installed.cluster
    for namespace in ("team-a", "team-b"):
        cluster.apply(f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {namespace}}}\n")
    # Everything in team-a: create reconciles there, get its DatabaseTables (what a dry run needs).
    cluster.apply(
        f"""apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: tables-reader, namespace: team-a}}
rules: [{{apiGroups: [myorg.org], resources: [databasetables], verbs: [get]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: tables-reader, namespace: team-a}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: tables-reader}}
subjects: [{{kind: User, name: "{TEAM_A_OPERATOR}"}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: "kplug:operator", namespace: team-a}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "kplug:operator"}}
subjects: [{{kind: User, name: "{TEAM_A_OPERATOR}"}}]
"""
    )
    ours = reconcile_in("team-a", "ours")
    done = wait_for("team-a's reconcile", lambda: (done := kubectl_create_as(cluster, TEAM_A_OPERATOR, "team-a", ours)).returncode == 0 and done, 30)
    answer = json.loads(done.stdout)
    assert answer["metadata"]["namespace"] == "team-a" and answer["status"]["plugin"]["name"] == PLUGIN, answer

    # team-b's object: kube-apiserver refuses its namespace's reconciles before kplug sees them ...
    theirs = reconcile_in("team-b", "theirs")
    refused = kubectl_create_as(cluster, TEAM_A_OPERATOR, "team-b", theirs)
    assert refused.returncode != 0, refused.stdout
    # kubectl create -f words it "Error from server (Forbidden): error when creating ...: <kube-apiserver's message>".
    assert refused.stderr.startswith("Error from server (Forbidden): "), refused.stderr
    assert (
        f'reconciles.plugins.kplug.io is forbidden: User "{TEAM_A_OPERATOR}" cannot create '
        'resource "reconciles" in API group "plugins.kplug.io" in the namespace "team-b"'
    ) in refused.stderr, refused.stderr
    # ... and kplug refuses it in team-a's, with an audit line; the plugin is never called for it.
    smuggled = kubectl_create_as(cluster, TEAM_A_OPERATOR, "team-a", theirs)
    assert smuggled.returncode != 0, smuggled.stdout
    assert 'spec.object.metadata.namespace: Invalid value: "team-b": must be "team-a", the namespace of the request' in smuggled.stderr, smuggled.stderr
    [event] = wait_for(
        "the refusal's audit line",
        lambda: audit_lines(cluster, lambda e: e["user"]["username"] == TEAM_A_OPERATOR and e["code"] == 422) or None,
        30,
    )
    assert event["objectRef"]["namespace"] == "team-b" and event["operationId"] == "" and event["instance"] == "", event
