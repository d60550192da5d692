"""A reconcile acts only on what its caller may touch, on the real cluster, with kplug and the DatabaseTable
plugins installed by the READMEs: an identity that may create reconciles and nothing else forges a Finalize of
another team's DatabaseTable; kplug refuses it in kube-apiserver's words before any plugin is called, and writes
an audit line for it. Given the right a controller of that object holds, the same call reaches the plugin. A
team's identity bound in its namespace alone reconciles there through ``namespaces/team-a/reconciles``, and nowhere
else, and so does the zero-code operator run as a pod with ``--namespace`` and README's RBAC for one namespace.
A reconcile by reference sends the stored object, and one of a missing object is a 404.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from install import PLUGINS, Installed, delete_without_finalize, kplug_audit_lines, table_without_database, wait_plugin_answer
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


def reader_in(namespace: str, user: str) -> str:
    """RBAC in ``namespace`` alone: ``user`` may create reconciles there and get its DatabaseTables (what a dry run
    needs), nothing else."""
    return f"""apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: tables-reader, namespace: {namespace}}}
rules: [{{apiGroups: [myorg.org], resources: [databasetables], verbs: [get]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: tables-reader, namespace: {namespace}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: tables-reader}}
subjects: [{{kind: User, name: "{user}"}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: "kplug:operator", namespace: {namespace}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "kplug:operator"}}
subjects: [{{kind: User, name: "{user}"}}]
"""


def kubectl_create_as(cluster: Cluster, who: str, namespace: str, body: str) -> subprocess.CompletedProcess[str]:
    """``kubectl create -f -`` of a Reconcile: kubectl posts it to the namespace's reconciles (discovery says so)."""
    return subprocess.run(
        ["kubectl", "--kubeconfig", cluster.kubeconfig, f"--as={who}", "-n", namespace, "create", "-f", "-", "-o", "json"],
        input=body, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def created_as(cluster: Cluster, who: str, namespace: str, body: str, what: str) -> subprocess.CompletedProcess[str]:
    """``kubectl_create_as``, again until it succeeds (RBAC bindings take a moment to reach every cache); a failure
    shows kubectl's last words."""
    tries: list[subprocess.CompletedProcess[str]] = []

    def succeeded() -> subprocess.CompletedProcess[str] | None:
        tries.append(kubectl_create_as(cluster, who, namespace, body))
        return tries[-1] if tries[-1].returncode == 0 else None

    try:
        return wait_for(what, succeeded, 30)
    except AssertionError as error:
        raise AssertionError(f"{error}; kubectl said: {tries[-1].stderr if tries else 'nothing'}") from None


def reconcile_as(cluster: Cluster, who: str, body: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", "--kubeconfig", cluster.kubeconfig, f"--as={who}", "create", "--raw",
         f"/apis/plugins.kplug.io/v1alpha1/plugins/{PLUGIN}/reconcile", "-f", "-"],
        input=body, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


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
        lambda: kplug_audit_lines(cluster, lambda e: e["user"]["username"] == INTRUDER and e["code"] == 403) or None,
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
        lambda: kplug_audit_lines(cluster, lambda e: e["user"]["username"] == INTRUDER and e["code"] == 201) or None,
        30,
    )
    assert event["instance"] == answer["status"]["plugin"]["instance"] and event["operationId"] == answer["status"]["operationId"], (event, answer)


TEAM_A_OPERATOR = "system:serviceaccount:team-a:tables-operator"


def test_an_identity_bound_in_its_namespace_reconciles_there_and_nowhere_else(installed: Installed) -> None:
    cluster = installed.cluster
    for namespace in ("team-a", "team-b"):
        cluster.apply(f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {namespace}}}\n")
    # Everything in team-a: create reconciles there, get its DatabaseTables (what a dry run needs).
    cluster.apply(reader_in("team-a", TEAM_A_OPERATOR))
    done = created_as(cluster, TEAM_A_OPERATOR, "team-a", reconcile_in("team-a", "ours"), "team-a's reconcile")
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
        lambda: kplug_audit_lines(cluster, lambda e: e["user"]["username"] == TEAM_A_OPERATOR and e["code"] == 422) or None,
        30,
    )
    assert event["objectRef"]["namespace"] == "team-b" and event["operationId"] == "" and event["instance"] == "", event


TEAM_C_READER = "system:serviceaccount:team-c:tables-reader"


def by_reference(name: str) -> str:
    """A dry-run Reconcile, pinned to the PostgreSQL plugin, of the stored DatabaseTable ``name`` (``spec.objectRef``)."""
    return json.dumps({
        "apiVersion": "plugins.kplug.io/v1alpha1",
        "kind": "Reconcile",
        "spec": {
            "plugin": PLUGIN,
            "dryRun": True,
            "objectRef": {"apiVersion": "myorg.org/v1alpha1", "kind": "DatabaseTable", "name": name},
        },
    })


def test_a_reconcile_by_reference_sends_the_stored_object_and_a_missing_one_is_404(installed: Installed) -> None:
    """kplug reads the object with the right the example's plugin manifests grant it (``kplug:read:PLUGIN``), once
    the caller may read it; the namespace is the request's, so a name alone is enough."""
    cluster = installed.cluster
    cluster.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: team-c}\n")
    cluster.apply(table_without_database("team-c", "stored"))
    cluster.apply(reader_in("team-c", TEAM_C_READER))
    done = created_as(cluster, TEAM_C_READER, "team-c", by_reference("stored"), "the reconcile by reference")
    answer = json.loads(done.stdout)
    stored = cluster.kubectl_json("-n", "team-c", "get", "databasetable", "stored")
    assert answer["status"]["plugin"]["name"] == PLUGIN, answer
    assert answer["spec"]["object"]["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"], answer
    assert answer["spec"]["object"]["spec"] == stored["spec"], answer

    missing = kubectl_create_as(cluster, TEAM_C_READER, "team-c", by_reference("absent"))
    assert missing.returncode != 0, missing.stdout
    assert missing.stderr.startswith("Error from server (NotFound): "), missing.stderr
    assert 'databasetables.myorg.org "absent" not found' in missing.stderr, missing.stderr
    [event] = wait_for(
        "the 404's audit line",
        lambda: kplug_audit_lines(cluster, lambda e: e["user"]["username"] == TEAM_C_READER and e["code"] == 404) or None,
        30,
    )
    assert event["objectRef"] == {"apiVersion": "myorg.org/v1alpha1", "kind": "DatabaseTable", "namespace": "team-c", "name": "absent"}, event
    assert event["instance"] == "" and event["outcome"] == "NotFound", event


OPERATOR_NS = "team-d"
TEAM_D_OPERATOR = f"system:serviceaccount:{OPERATOR_NS}:tables-operator"
EXAMPLE_OPERATOR = ("plugins", "database-table-operator")


def namespaced_operator(namespace: str) -> str:
    """kplug-operator for DatabaseTables of ``namespace`` only, with README's RBAC for one namespace ("Zero code"):
    a Role and RoleBindings there, and the one cluster-wide binding, ``kplug:reader``."""
    return f"""apiVersion: v1
kind: ServiceAccount
metadata: {{name: tables-operator, namespace: {namespace}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: tables-operator, namespace: {namespace}}}
rules:
- {{apiGroups: [myorg.org], resources: [databasetables], verbs: [get, list, watch, update, patch]}}
- {{apiGroups: [myorg.org], resources: [databasetables/status, databasetables/finalizers], verbs: [update, patch]}}
- {{apiGroups: ["", events.k8s.io], resources: [events], verbs: [create, patch]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: tables-operator, namespace: {namespace}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: tables-operator}}
subjects: [{{kind: ServiceAccount, name: tables-operator, namespace: {namespace}}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: "kplug:operator", namespace: {namespace}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "kplug:operator"}}
subjects: [{{kind: ServiceAccount, name: tables-operator, namespace: {namespace}}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: "kplug:reader:{namespace}-tables-operator"}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "kplug:reader"}}
subjects: [{{kind: ServiceAccount, name: tables-operator, namespace: {namespace}}}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: tables-operator, namespace: {namespace}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app.kubernetes.io/name: tables-operator}}}}
  template:
    metadata: {{labels: {{app.kubernetes.io/name: tables-operator}}}}
    spec:
      serviceAccountName: tables-operator
      enableServiceLinks: false
      securityContext: {{runAsNonRoot: true, runAsUser: 65532, seccompProfile: {{type: RuntimeDefault}}}}
      containers:
      - name: operator
        image: ghcr.io/kplug/kplug-operator:0.1.0
        imagePullPolicy: IfNotPresent
        args: [--resource=databasetables.myorg.org, --namespace={namespace}, --leader-elect=false,
               --metrics-secure=false, --field-manager=tables-operator, --finalizer=myorg.org/database-table]
        securityContext: {{allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {{drop: [ALL]}}}}
"""


@pytest.mark.adds_to_the_installation
def test_a_zero_code_operator_bound_in_its_namespace_delegates_its_objects_and_nothing_else(installed: Installed) -> None:
    """The example's cluster-wide operator is scaled to zero meanwhile, so that only the namespaced one acts."""
    cluster = installed.cluster
    namespace, name = EXAMPLE_OPERATOR
    cluster.kubectl("-n", namespace, "scale", "deployment", name, "--replicas=0")
    selector = f"app.kubernetes.io/name={name}"
    wait_for("the example operator gone", lambda: not cluster.kubectl_json("-n", namespace, "get", "pods", "-l", selector)["items"], 120)
    try:
        for other in (OPERATOR_NS, "team-e"):
            cluster.apply(f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {other}}}\n")
        cluster.apply(namespaced_operator(OPERATOR_NS))
        cluster.apply(table_without_database(OPERATOR_NS, "ours"))
        cluster.apply(table_without_database("team-e", "theirs"))

        # The operator delegated its object through kube-apiserver and kplug, and wrote the plugin's answer back.
        ours = wait_plugin_answer(cluster, OPERATOR_NS, "ours", "the plugin's answer in team-d's DatabaseTable")
        assert any(c["type"] == "Ready" for c in ours["status"]["conditions"]), ours["status"]
        assert "myorg.org/database-table" in ours["metadata"]["finalizers"], ours["metadata"]
        [event, *_] = wait_for(
            "the operator's audit line",
            lambda: kplug_audit_lines(cluster, lambda e: e["user"]["username"] == TEAM_D_OPERATOR and e["code"] == 201) or None,
            30,
        )
        assert event["objectRef"]["namespace"] == OPERATOR_NS and event["objectRef"]["name"] == "ours", event

        # team-e's object, which it does not watch, is untouched; and its identity may not delegate it.
        theirs = cluster.kubectl_json("-n", "team-e", "get", "databasetable", "theirs")
        assert "status" not in theirs and not theirs["metadata"].get("finalizers"), theirs
        refused = kubectl_create_as(cluster, TEAM_D_OPERATOR, "team-e", reconcile_in("team-e", "theirs"))
        assert refused.returncode != 0 and "Error from server (Forbidden): " in refused.stderr, refused.stderr
        assert f'User "{TEAM_D_OPERATOR}" cannot create resource "reconciles"' in refused.stderr, refused.stderr
    finally:
        cluster.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=true", input=namespaced_operator(OPERATOR_NS))
        for where, table_name in ((OPERATOR_NS, "ours"), ("team-e", "theirs")):
            delete_without_finalize(cluster, where, table_name)
        cluster.kubectl("-n", namespace, "scale", "deployment", name, "--replicas=2")
        cluster.kubectl("-n", namespace, "rollout", "status", "deployment", name, "--timeout=120s", timeout=150)
