"""The values plugins work with: Request, Outcome, ApiRef, names."""

from __future__ import annotations

import time

import pytest

import kplug
from kplug.plugin import check_name

USERS = {
    "apiVersion": "myorg.org/v1alpha1",
    "kind": "DatabaseTable",
    "metadata": {"name": "users", "namespace": "apps"},
    "spec": {"serverName": "authorization-cluster"},
}
POSTGRES_EXTENSION = {
    "apiVersion": "myorg.org/v1alpha1",
    "kind": "DatabaseTablePostgreSqlExtension",
    "metadata": {"name": "users", "namespace": "apps"},
    "spec": {"partitionBy": "hash"},
}
MARIADB_EXTENSION = {
    "apiVersion": "myorg.org/v1alpha1",
    "kind": "DatabaseTableMariaDbExtension",
    "metadata": {"name": "users"},
    "spec": {"storageEngine": "InnoDB"},
}


def request(**changes: object) -> kplug.Request:
    fields: dict[str, object] = {
        "operation": kplug.Operation.RECONCILE,
        "operation_id": "op-1",
        "dry_run": False,
        "object": USERS,
        "extensions": [MARIADB_EXTENSION, POSTGRES_EXTENSION],
    }
    fields.update(changes)
    return kplug.Request(**fields)  # type: ignore[arg-type]


def test_request_helpers() -> None:
    req = request()
    assert req.name == "users"
    assert req.namespace == "apps"
    assert req.spec == {"serverName": "authorization-cluster"}
    assert req.extension("DatabaseTablePostgreSqlExtension") is POSTGRES_EXTENSION
    assert req.extension("DatabaseTablePostgreSqlExtension", "myorg.org/v1alpha1") is POSTGRES_EXTENSION
    assert req.extension("DatabaseTablePostgreSqlExtension", "myorg.org/v2") is None
    assert req.extension("Missing") is None


def test_request_without_metadata_or_spec() -> None:
    req = request(object={"kind": "DatabaseTable", "spec": "not an object"})
    assert (req.name, req.namespace, req.spec) == ("", "", {})


def test_time_remaining() -> None:
    assert request().time_remaining() is None
    remaining = request(deadline=time.monotonic() + 5).time_remaining()
    assert remaining is not None and 4 < remaining <= 5
    assert request(deadline=time.monotonic() - 1).time_remaining() == 0


def test_success_and_failure() -> None:
    ok = kplug.Outcome.success("Greeted", "hello", object_status={"a": 1}, requeue_after=30)
    assert ok.succeeded
    assert ok.results == [kplug.Result("Greeted", "hello", kplug.Severity.NORMAL)]
    assert (ok.object_status, ok.requeue_after) == ({"a": 1}, 30)
    assert kplug.Outcome.success().results == []

    failed = kplug.Outcome.failure("UnknownColumnType", "column id has type uint128")
    assert not failed.succeeded
    assert failed.results == [kplug.Result("UnknownColumnType", "column id has type uint128", kplug.Severity.ERROR)]


def test_outcome_builders_chain_and_replace() -> None:
    outcome = (
        kplug.Outcome.success()
        .add_result("ColumnAdded", "added column email", kplug.Severity.NORMAL)
        .add_result("SlowDisk", "", kplug.Severity.WARNING)
        .add_condition("Synced", False, "Pending")
        .add_condition("Synced", True, "Reconciled", "up to date")
        .add_condition("Degraded", "Unknown")
        .set_extension_status(POSTGRES_EXTENSION, {"partitions": 3})
        .set_extension_status(POSTGRES_EXTENSION, {"partitions": 4})
        .set_extension_status(MARIADB_EXTENSION, {})
    )
    assert [r.reason for r in outcome.results] == ["ColumnAdded", "SlowDisk"]
    assert outcome.result("SlowDisk") == kplug.Result("SlowDisk", "", kplug.Severity.WARNING)
    assert outcome.conditions == [
        kplug.Condition("Synced", "True", "Reconciled", "up to date"),
        kplug.Condition("Degraded", "Unknown"),
    ]
    assert outcome.condition("Synced") == kplug.Condition("Synced", "True", "Reconciled", "up to date")
    ref = kplug.ObjectRef("myorg.org/v1alpha1", "DatabaseTablePostgreSqlExtension", "users", "apps")
    assert outcome.extension_statuses == [
        (ref, {"partitions": 4}),
        (kplug.ObjectRef("myorg.org/v1alpha1", "DatabaseTableMariaDbExtension", "users"), {}),
    ]
    assert outcome.extension_status(ref) == {"partitions": 4}
    assert outcome.extension_status(POSTGRES_EXTENSION) == {"partitions": 4}


def test_children_replace_by_key_and_keep_their_verdict_and_wave() -> None:
    site = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "site"}}
    outcome = kplug.Outcome.success().add_child("site", site).add_child("web", {}, ready=True, wave=2)
    outcome.add_child("site", {**site, "data": {"a": "1"}})
    assert [c.key for c in outcome.children] == ["web", "site"]
    assert outcome.child("site") == kplug.Child("site", {**site, "data": {"a": "1"}})
    assert outcome.child("web") == kplug.Child("web", {}, ready=True, wave=2)
    assert outcome.child("gone") is None
    request = kplug.Request(kplug.Operation.RECONCILE, "op", False, {}, observed_children={"web": {"kind": "X"}})
    assert request.observed_child("web") == {"kind": "X"}
    assert request.observed_child("site") is None


def test_condition_status_is_checked() -> None:
    with pytest.raises(ValueError, match="True"):
        kplug.Condition("Synced", "yes")
    with pytest.raises(ValueError):
        kplug.Outcome.success().add_condition("Synced", "true")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("databasetables.myorg.org/v1alpha1", kplug.ApiRef("myorg.org", "databasetables", "v1alpha1")),
        ("greetings.example.com/v1", kplug.ApiRef("example.com", "greetings", "v1")),
    ],
)
def test_api_refs_parse(text: str, expected: kplug.ApiRef) -> None:
    assert kplug.ApiRef.parse(text) == expected
    assert str(expected) == text


@pytest.mark.parametrize(
    "text",
    ["", "databasetables.myorg.org", "pods/v1", ".myorg.org/v1", "tables./v1", "tables.myorg.org/", "t.g/v1/x"],
)
def test_bad_api_refs_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="resource.group/version"):
        kplug.ApiRef.parse(text)


def test_plugin_names_are_dns_subdomains() -> None:
    for good in ["hello-python", "database-table-postgresql-plugin", "a.b-c", "x"]:
        check_name(good)
    for bad in ["", "Hello", "-a", "a-", "a..b", "under_score", "a" * 254]:
        with pytest.raises(ValueError, match="RFC 1123"):
            check_name(bad)
