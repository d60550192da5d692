"""The CRDs in examples/database-table/crds, and the sample objects in users.yaml against them.

kubectl cannot check CRDs without a cluster (even ``--dry-run=client`` asks
the server for its API groups), so these tests check what the API server
would: the CRD's own shape, that its schema is structural, and objects
against its OpenAPI v3 schema. Fields a schema does not declare are pruned
by the API server rather than rejected, so objects are checked strictly:
an undeclared field would be lost, which is a failure here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from kplug.testing import PluginClient

EXAMPLE = Path(__file__).resolve().parents[2]
CRDS = EXAMPLE / "crds"
KINDS = {"DatabaseTable", "DatabaseTableMariaDbExtension", "DatabaseTablePostgreSqlExtension"}


def load(path: Path) -> list[dict[str, Any]]:
    with path.open() as file:
        return [doc for doc in yaml.safe_load_all(file) if doc]


def crds() -> dict[str, dict[str, Any]]:
    found = {}
    for path in sorted(CRDS.glob("*.yaml")):
        for crd in load(path):
            found[crd["spec"]["names"]["kind"]] = crd
    return found


def schema_of(kind: str) -> dict[str, Any]:
    (version,) = crds()[kind]["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with undeclared fields refused wherever the API server would prune them."""
    schema = dict(schema)
    if "properties" in schema:
        schema["properties"] = {name: strict(child) for name, child in schema["properties"].items()}
        if not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema.setdefault("additionalProperties", False)
    if isinstance(schema.get("items"), dict):
        schema["items"] = strict(schema["items"])
    return schema


def validate(kind: str, obj: dict[str, Any]) -> None:
    body = {key: value for key, value in obj.items() if key not in ("apiVersion", "kind", "metadata")}
    jsonschema.Draft4Validator(strict(schema_of(kind))).validate(body)


def walk(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path or "<root>", schema
    for name, child in schema.get("properties", {}).items():
        yield from walk(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from walk(schema["items"], f"{path}[]")


def test_the_three_crds_are_well_formed() -> None:
    found = crds()
    assert set(found) == KINDS
    for kind, crd in found.items():
        spec = crd["spec"]
        assert (crd["apiVersion"], crd["kind"]) == ("apiextensions.k8s.io/v1", "CustomResourceDefinition")
        assert spec["group"] == "myorg.org"
        assert crd["metadata"]["name"] == f"{spec['names']['plural']}.myorg.org"
        assert spec["names"]["plural"] == kind.lower() + "s"
        assert spec["scope"] == "Namespaced"
        (version,) = spec["versions"]
        assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
        assert version["subresources"] == {"status": {}}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_schemas_are_structural(kind: str) -> None:
    schema = schema_of(kind)
    assert schema["type"] == "object"
    for path, node in walk(schema):
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), f"{kind} {path} has no type"
        for key in node.get("x-kubernetes-list-map-keys", []):
            item = node["items"]
            assert key in item.get("required", []) or "default" in item["properties"][key], (
                f"{kind} {path}: list map key {key} must be required"
            )
    jsonschema.Draft4Validator.check_schema(strict(schema))


def test_users_yaml_matches_the_crds() -> None:
    objects = load(EXAMPLE / "users.yaml")
    assert sorted(obj["kind"] for obj in objects) == sorted(KINDS)
    for obj in objects:
        assert obj["apiVersion"] == "myorg.org/v1alpha1"
        validate(obj["kind"], obj)
    table = next(obj for obj in objects if obj["kind"] == "DatabaseTable")
    linked = {(ref["kind"], ref["name"]) for ref in table["spec"]["extensions"]}
    assert linked == {(obj["kind"], obj["metadata"]["name"]) for obj in objects if obj is not table}


@pytest.mark.parametrize(
    ("kind", "spec", "problem"),
    [
        ("DatabaseTable", {"serverName": "db"}, "'columns' is a required property"),
        ("DatabaseTable", {"serverName": "db", "columns": []}, "should be non-empty"),
        ("DatabaseTable", {"serverName": "db", "columns": [{"name": "Id", "type": "int64"}]}, "does not match"),
        ("DatabaseTable", {"serverName": "db", "columns": [{"name": "id"}]}, "'type' is a required property"),
        (
            "DatabaseTable",
            {"serverName": "db", "columns": [{"name": "id", "type": "int64"}], "colour": "red"},
            "colour",
        ),
        ("DatabaseTablePostgreSqlExtension", {"partitionBy": "circular"}, "is not one of"),
        ("DatabaseTablePostgreSqlExtension", {"partitionBy": "hash", "partitions": 0}, "less than the minimum"),
        ("DatabaseTableMariaDbExtension", {"storageEngine": 7}, "is not of type 'string'"),
    ],
)
def test_invalid_objects_are_refused(kind: str, spec: dict[str, Any], problem: str) -> None:
    with pytest.raises(jsonschema.ValidationError) as error:
        validate(kind, {"spec": spec})
    assert problem in str(error.value)


def test_the_plugins_statuses_fit_the_crds(client: PluginClient, walkthrough: dict[str, dict[str, Any]]) -> None:
    extension = walkthrough["DatabaseTablePostgreSqlExtension"]
    outcome = client.reconcile(walkthrough["DatabaseTable"], [extension])
    assert outcome.succeeded
    extension_status = outcome.extension_status(extension)
    assert extension_status is not None
    validate("DatabaseTablePostgreSqlExtension", {"spec": extension["spec"], "status": extension_status})
    conditions = [
        {"type": c.type, "status": c.status, "reason": c.reason, "message": c.message} for c in outcome.conditions
    ]
    validate(
        "DatabaseTable",
        {
            "spec": walkthrough["DatabaseTable"]["spec"],
            "status": {**(outcome.object_status or {}), "conditions": conditions},
        },
    )
