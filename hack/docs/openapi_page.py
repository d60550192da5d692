"""The API reference from the OpenAPI v3 document kplug serves: each kind's fields, their types and descriptions,
as ``kubectl explain --recursive`` would walk them."""

from __future__ import annotations

import json
from pathlib import Path

GROUP_PREFIX = "io.kplug.plugins.v1alpha1."
# Kubernetes' own types are documented by Kubernetes; the walk stops at them.
APIMACHINERY = "io.k8s.apimachinery.pkg.apis.meta.v1."


def api_page(document: Path) -> str:
    schemas = json.loads(document.read_text())["components"]["schemas"]
    kinds = [
        (name, schema)
        for name, schema in schemas.items()
        if name.startswith(GROUP_PREFIX) and schema.get("x-kubernetes-group-version-kind")
    ]
    out = [
        "Every kind of `plugins.kplug.io/v1alpha1`, field by field. `kubectl explain` shows the same from the cluster "
        "(`kubectl explain reconciles.spec --recursive`). A field marked **required** must be set in a request; "
        "Kubernetes' own types (`ObjectMeta`, `Condition`, `Time`) are described in the Kubernetes API reference.\n\n"
    ]
    for name, schema in kinds:
        kind = name.removeprefix(GROUP_PREFIX)
        out.append(f"## {kind}\n\n{_one_line(schema.get('description', ''))}\n\n")
        out.append("| field | type | description |\n|---|---|---|\n")
        rows: list[str] = []
        _walk(schemas, schema, "", rows, seen=(name,))
        out.append("".join(rows) + "\n")
    return "".join(out).rstrip("\n") + "\n"


def _walk(schemas: dict, schema: dict, path: str, rows: list[str], seen: tuple[str, ...]) -> None:
    required = set(schema.get("required", []))
    for field, prop in schema.get("properties", {}).items():
        field_path = f"{path}.{field}" if path else field
        target, type_name = _resolve(schemas, prop)
        mark = " **required**" if field in required else ""
        description = _one_line(prop.get("description") or (target or {}).get("description", ""))
        rows.append(f"| `{field_path}`{mark} | {type_name} | {description} |\n")
        ref = _ref_name(prop)
        if target is not None and ref is not None and ref.startswith(GROUP_PREFIX) and ref not in seen:
            _walk(schemas, target, field_path + ("[]" if type_name.startswith("[]") else ""), rows, seen + (ref,))


def _ref_name(prop: dict) -> str | None:
    for candidate in (prop, prop.get("items", {}), *(prop.get("allOf", []))):
        if "$ref" in candidate:
            return candidate["$ref"].rsplit("/", 1)[-1]
        if candidate is not prop and candidate.get("allOf"):
            return _ref_name(candidate)
    return None


def _resolve(schemas: dict, prop: dict) -> tuple[dict | None, str]:
    """The schema a property refers to (or None), and its type as kubectl explain writes it."""
    ref = _ref_name(prop)
    short = lambda name: name.rsplit(".", 1)[-1]  # noqa: E731
    if prop.get("type") == "array":
        items = prop.get("items", {})
        if ref:
            return schemas.get(ref), f"[]{short(ref)}"
        return None, f"[]{_scalar(items)}"
    if ref:
        return schemas.get(ref), short(ref)
    if prop.get("type") == "object" and "additionalProperties" in prop:
        return None, f"map[string]{_scalar(prop['additionalProperties'])}"
    return None, _scalar(prop)


def _scalar(prop: dict) -> str:
    if prop.get("x-kubernetes-preserve-unknown-fields"):
        return "Object"
    kind = prop.get("type", "Object")
    if prop.get("format") and kind in ("integer", "number", "string"):
        return f"{kind} ({prop['format']})"
    if kind == "array":
        return f"[]{_scalar(prop.get('items', {}))}"
    return kind


def _one_line(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")
