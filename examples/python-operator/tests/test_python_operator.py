"""The operator's pure parts: the Reconcile it sends, the status it writes from
the answer, extension references, and what counts as a change."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from python_operator.operator import (
    FINALIZER,
    NotReady,
    Resource,
    changes,
    delegation_error,
    extension_refs,
    failure_patch,
    finalizes,
    find_extension,
    merge_conditions,
    merged,
    needs_reconcile,
    reconcile_body,
    reconciles_path,
    status_patch,
)

TABLES = Resource("myorg.org", "v1alpha1", "databasetables")
T0, T1, T2 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z", "2026-01-01T00:10:00Z"


def table(**status: Any) -> dict[str, Any]:
    """The walkthrough's DatabaseTable, as read from the cluster."""
    obj: dict[str, Any] = {
        "apiVersion": "myorg.org/v1alpha1",
        "kind": "DatabaseTable",
        "metadata": {
            "name": "users",
            "namespace": "shop",
            "generation": 2,
            "resourceVersion": "41",
            "uid": "u-1",
        },
        "spec": {
            "serverName": "authorization-cluster",
            "preferredImplementation": "MariaDB",
            "columns": [{"name": "id", "type": "uint64"}, {"name": "name", "type": "string"}],
            "extensions": [
                {
                    "apiVersion": "myorg.org/v1alpha1",
                    "kind": "DatabaseTableMariaDbExtension",
                    "name": "users",
                },
                {
                    "apiVersion": "myorg.org/v1alpha1",
                    "kind": "DatabaseTablePostgreSqlExtension",
                    "name": "users",
                },
            ],
        },
    }
    if status:
        obj["status"] = status
    return obj


def answer(success: bool = True, **fields: Any) -> dict[str, Any]:
    """A Reconcile's status as kplug answers it."""
    return {
        "plugin": {
            "name": "database-table-postgresql-plugin",
            "version": "0.1.0",
            "implementation": "PostgreSQL",
        },
        "selection": {"reason": "Fallback", "message": "no Ready plugin of implementation MariaDB"},
        "success": success,
        "results": [{"severity": "Normal", "reason": "TableCreated", "message": "created table users"}],
        "operationId": "op-1",
        "durationMilliseconds": 12.5,
        **fields,
    }


def by_type(conditions: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in conditions}


# --- the Reconcile request ------------------------------------------------------------


def test_reconcile_body_for_an_unbound_object_prefers_and_does_not_require() -> None:
    obj = table()
    extensions = [
        {
            "apiVersion": "myorg.org/v1alpha1",
            "kind": "DatabaseTablePostgreSqlExtension",
            "metadata": {"name": "users", "namespace": "shop"},
            "spec": {"partitionBy": "hash"},
        }
    ]
    body = reconcile_body(TABLES, obj, extensions, "Reconcile")
    assert body == {
        "apiVersion": "plugins.kplug.io/v1alpha1",
        "kind": "Reconcile",
        "spec": {
            "operation": "Reconcile",
            "api": {"group": "myorg.org", "resource": "databasetables"},
            "preferredImplementation": "MariaDB",
            "object": obj,
            "extensions": extensions,
        },
    }
    json.dumps(body)  # it goes over the wire as is


def test_reconcile_body_for_a_bound_object_requires_its_implementation() -> None:
    obj = table(implementation="PostgreSQL")
    del obj["spec"]["preferredImplementation"]
    spec = reconcile_body(TABLES, obj, [], "Finalize")["spec"]
    assert spec["operation"] == "Finalize"
    assert spec["requiredImplementation"] == "PostgreSQL"
    assert "preferredImplementation" not in spec
    assert spec["extensions"] == []


# --- extension references -------------------------------------------------------------


def test_reconciles_are_created_in_the_objects_namespace() -> None:
    assert reconciles_path(table()) == "/apis/plugins.kplug.io/v1alpha1/namespaces/shop/reconciles"
    cluster_scoped = table()
    del cluster_scoped["metadata"]["namespace"]
    assert reconciles_path(cluster_scoped) == "/apis/plugins.kplug.io/v1alpha1/reconciles"


def test_extension_refs_default_to_the_objects_namespace() -> None:
    obj = table()
    obj["spec"]["extensions"][1]["namespace"] = "elsewhere"
    assert extension_refs(obj) == [
        ("myorg.org/v1alpha1", "DatabaseTableMariaDbExtension", "shop", "users"),
        ("myorg.org/v1alpha1", "DatabaseTablePostgreSqlExtension", "elsewhere", "users"),
    ]


def test_no_extensions_is_fine() -> None:
    obj = table()
    del obj["spec"]["extensions"]
    assert extension_refs(obj) == []
    obj["spec"]["extensions"] = None
    assert extension_refs(obj) == []


@pytest.mark.parametrize(
    ("extensions", "complaint"),
    [
        ("users", "spec.extensions is not a list"),
        (["users"], r"spec.extensions\[0\] is not an object"),
        (
            [{"apiVersion": "v1", "kind": "ConfigMap", "name": 7}],
            r"spec.extensions\[0\] is not an object of strings",
        ),
        (
            [{"apiVersion": "v1", "kind": "ConfigMap", "name": "a"}, {"kind": "ConfigMap"}],
            r"spec.extensions\[1\] has no apiVersion, name",
        ),
        ([{"apiVersion": "v1", "kind": "", "name": "a"}], r"spec.extensions\[0\] has no kind"),
    ],
)
def test_bad_extension_refs_are_named(extensions: Any, complaint: str) -> None:
    obj = table()
    obj["spec"]["extensions"] = extensions
    with pytest.raises(ValueError, match=complaint):
        extension_refs(obj)


def test_a_plugins_extension_status_finds_only_an_extension_it_was_sent() -> None:
    pg = {
        "apiVersion": "myorg.org/v1alpha1",
        "kind": "DatabaseTablePostgreSqlExtension",
        "metadata": {"name": "users", "namespace": "shop"},
    }
    ref = {"apiVersion": "myorg.org/v1alpha1", "kind": "DatabaseTablePostgreSqlExtension", "name": "users"}
    assert find_extension([pg], ref) is pg
    assert find_extension([pg], {**ref, "namespace": "shop"}) is pg
    assert find_extension([pg], {**ref, "namespace": "other"}) is None
    assert find_extension([pg], {**ref, "name": "accounts"}) is None
    assert find_extension([], ref) is None


# --- which events are work ------------------------------------------------------------


def test_needs_reconcile_when_the_generation_was_not_observed() -> None:
    assert needs_reconcile(table())
    assert needs_reconcile(table(observedGeneration=1))
    # Our own status write: observedGeneration caught up.
    assert not needs_reconcile(table(observedGeneration=2))


def test_the_finalizer_stays_only_for_a_plugin_that_declares_finalize() -> None:
    assert finalizes({"plugin": {"capabilities": ["Reconcile", "Finalize", "DryRun"]}})
    assert not finalizes({"plugin": {"capabilities": ["Reconcile", "DryRun"]}})
    assert finalizes({"plugin": {"name": "old"}}), "declares nothing: everything"
    assert finalizes({})


def test_needs_reconcile_while_deleting_only_with_our_finalizer() -> None:
    obj = table(observedGeneration=2)
    obj["metadata"]["deletionTimestamp"] = T1
    assert not needs_reconcile(obj)
    obj["metadata"]["finalizers"] = ["other", FINALIZER]
    assert needs_reconcile(obj)


# --- the status written from an answer ------------------------------------------------


def test_status_patch_from_a_success() -> None:
    obj = table()
    patch = status_patch(obj, answer(objectStatus={"schema": "public", "table": "users", "columns": 2}), T0)
    assert patch["implementation"] == "PostgreSQL"
    assert patch["plugin"] == {
        "name": "database-table-postgresql-plugin",
        "version": "0.1.0",
        "implementation": "PostgreSQL",
    }
    assert patch["selection"]["reason"] == "Fallback"
    assert patch["observedGeneration"] == 2
    assert (patch["schema"], patch["table"], patch["columns"]) == ("public", "users", 2)
    conditions = by_type(patch["conditions"])
    assert conditions["Ready"] == {
        "type": "Ready",
        "status": "True",
        "reason": "Reconciled",
        "message": "reconciled by database-table-postgresql-plugin (PostgreSQL 0.1.0)",
        "lastTransitionTime": T0,
    }
    assert conditions["Synced"]["status"] == "True"
    json.dumps(patch)


def test_the_plugins_conditions_win_except_ready() -> None:
    plugin_conditions = [
        {
            "type": "Synced",
            "status": "False",
            "reason": "ChangesPending",
            "message": "1 change(s) would be made",
        },
        {"type": "Ready", "status": "False", "reason": "Mine", "message": "the plugin may not decide Ready"},
        {"type": "Partitioned", "status": "True"},
    ]
    conditions = by_type(status_patch(table(), answer(conditions=plugin_conditions), T0)["conditions"])
    assert conditions["Ready"]["status"] == "True"
    assert conditions["Synced"] == {
        "type": "Synced",
        "status": "False",
        "reason": "ChangesPending",
        "message": "1 change(s) would be made",
        "lastTransitionTime": T0,
    }
    assert conditions["Partitioned"] == {
        "type": "Partitioned",
        "status": "True",
        "reason": "",
        "message": "",
        "lastTransitionTime": T0,
    }


def test_status_patch_from_a_failure_gives_the_first_result_that_is_not_normal() -> None:
    results = [
        {"severity": "Normal", "reason": "Checked", "message": "looked at the table"},
        {"severity": "Error", "reason": "UnknownColumnType", "message": "column name: unknown type strng"},
        {"severity": "Warning", "reason": "Later", "message": "not this one"},
    ]
    patch = status_patch(table(), answer(success=False, results=results), T0)
    assert "implementation" not in patch  # a failure does not bind the object
    ready = by_type(patch["conditions"])["Ready"]
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        "UnknownColumnType",
        "column name: unknown type strng",
    )
    assert by_type(patch["conditions"])["Synced"]["status"] == "False"
    assert patch["observedGeneration"] == 2


def test_a_failure_without_results_still_says_something() -> None:
    ready = by_type(status_patch(table(), answer(success=False, results=[]), T0)["conditions"])["Ready"]
    assert (ready["reason"], ready["message"]) == (
        "ReconcileFailed",
        "database-table-postgresql-plugin reported a failure",
    )


def test_a_bound_object_stays_bound() -> None:
    obj = table(implementation="PostgreSQL")
    other = answer()
    other["plugin"]["implementation"] = "Postgres"  # a plugin that spells it differently
    assert status_patch(obj, other, T0)["implementation"] == "PostgreSQL"


def test_object_status_cannot_overwrite_the_operators_keys() -> None:
    reported = {"conditions": [], "implementation": "Nope", "observedGeneration": 99, "rows": 3}
    patch = status_patch(table(), answer(objectStatus=reported), T0)
    assert patch["implementation"] == "PostgreSQL"
    assert patch["observedGeneration"] == 2
    assert patch["rows"] == 3
    assert {c["type"] for c in patch["conditions"]} == {"Ready", "Synced"}


def test_last_transition_time_is_kept_while_the_status_stays() -> None:
    first = status_patch(table(), answer(), T0)
    obj = table(**first)
    again = status_patch(obj, answer(), T1)
    assert [c["lastTransitionTime"] for c in again["conditions"]] == [T0, T0]
    assert not changes(obj["status"], again)

    broken = status_patch(obj, answer(success=False), T1)
    assert by_type(broken["conditions"])["Ready"]["lastTransitionTime"] == T1
    assert by_type(broken["conditions"])["Ready"]["status"] == "False"


def test_merge_conditions_keeps_the_others_and_their_order() -> None:
    old = [
        {"type": "Ready", "status": "True", "reason": "Reconciled", "message": "", "lastTransitionTime": T0},
        {"type": "Custom", "status": "True", "lastTransitionTime": T0},
    ]
    new = merge_conditions(
        old, [{"type": "Ready", "status": "True", "reason": "Reconciled", "message": "again"}], T1
    )
    assert new == [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Reconciled",
            "message": "again",
            "lastTransitionTime": T0,
        },
        {"type": "Custom", "status": "True", "lastTransitionTime": T0},
    ]
    assert old[0]["message"] == ""  # the input is not modified


def test_failure_patch_when_no_plugin_answered() -> None:
    obj = table(**status_patch(table(), answer(), T0))
    patch = failure_patch(
        obj, NotReady("NoPluginReady", "no Ready plugin serves databasetables.myorg.org"), T1
    )
    assert patch["observedGeneration"] == 2
    conditions = by_type(patch["conditions"])
    assert conditions["Ready"] == {
        "type": "Ready",
        "status": "False",
        "reason": "NoPluginReady",
        "message": "no Ready plugin serves databasetables.myorg.org",
        "lastTransitionTime": T1,
    }
    assert conditions["Synced"]["lastTransitionTime"] == T0  # untouched
    assert changes(obj["status"], patch)
    # The same failure again changes nothing, so it is not written again; a new message does.
    failed = table(**merged(obj["status"], patch))
    same = failure_patch(
        failed, NotReady("NoPluginReady", "no Ready plugin serves databasetables.myorg.org"), T2
    )
    assert not changes(failed["status"], same)
    assert changes(failed["status"], failure_patch(failed, NotReady("NoPluginReady", "still none"), T2))


# --- nothing changed ------------------------------------------------------------------


def test_merged_is_a_json_merge_patch() -> None:
    target = {"a": 1, "b": {"c": 2, "d": 3}, "list": [1, 2]}
    before = copy.deepcopy(target)
    assert merged(target, {"a": None, "b": {"c": 5}, "list": [3], "new": {"x": None}}) == {
        "b": {"c": 5, "d": 3},
        "list": [3],
        "new": {},
    }
    assert target == before


def test_changes() -> None:
    status = {"implementation": "PostgreSQL", "partitions": {"count": 4}, "conditions": [{"type": "Ready"}]}
    assert not changes(status, {})
    assert not changes(status, {"implementation": "PostgreSQL", "partitions": {"count": 4}})
    assert changes(status, {"partitions": {"count": 5}})
    assert changes(status, {"conditions": [{"type": "Ready"}, {"type": "Synced"}]})
    assert changes(status, {"implementation": None})
    assert not changes(None, {})
    assert changes(None, {"observedGeneration": 1})


# --- kplug's refusals -----------------------------------------------------------------


def refusal(code: int, reason: str, message: str, **headers: str) -> ApiException:
    error = ApiException(status=code, reason="whatever")
    error.body = json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "code": code,
            "reason": reason,
            "message": message,
        }
    )
    error.headers = headers
    return error


def test_no_ready_plugin() -> None:
    error = delegation_error(
        refusal(
            503,
            "ServiceUnavailable",
            "no Ready plugin serves databasetables.myorg.org",
            **{"Retry-After": "1"},
        )
    )
    assert (error.reason, error.message, error.retry_after) == (
        "NoPluginReady",
        "no Ready plugin serves databasetables.myorg.org",
        1.0,
    )


def test_forbidden_and_others() -> None:
    forbidden = delegation_error(refusal(403, "Forbidden", 'cannot create resource "reconciles"'))
    assert (forbidden.reason, forbidden.retry_after) == ("Forbidden", None)
    invalid = delegation_error(refusal(422, "Invalid", "spec.timeoutSeconds: must be 1..300"))
    assert (invalid.reason, invalid.message) == ("Invalid", "spec.timeoutSeconds: must be 1..300")


def test_a_refusal_that_is_not_a_status() -> None:
    error = ApiException(status=502, reason="Bad Gateway")
    error.body = "<html>proxy error</html>"
    refused = delegation_error(error)
    assert (refused.reason, refused.message) == ("DelegationFailed", "HTTP 502 Bad Gateway")
