"""The team-access plugin over real gRPC: its children are cluster-scoped or in other namespaces."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import kplug
from kplug.testing import PluginClient

TEAM_ACCESS = Path(__file__).resolve().parent.parent / "team_access.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("team_access", TEAM_ACCESS)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def access(spec: dict) -> dict:
    return {
        "apiVersion": "platform.example.com/v1alpha1",
        "kind": "TeamAccess",
        "metadata": {"name": "web", "namespace": "platform"},
        "spec": spec,
    }


def test_a_cluster_role_first_then_a_binding_in_each_namespace() -> None:
    config = kplug.Config(registry=None, listen="127.0.0.1:0")
    with kplug.serve(load().TeamAccess(), config) as server, PluginClient(server.address) as client:
        outcome = client.reconcile(access({"group": "web-team", "namespaces": ["shop", "blog", "shop"]}))
        assert outcome.succeeded, outcome.results
        assert [(c.key, c.wave) for c in outcome.children] == [("role", 0), ("binding-blog", 1), ("binding-shop", 1)]
        role = outcome.child("role")
        assert role is not None and role.object["kind"] == "ClusterRole"
        assert role.object["metadata"] == {"name": "team-access.platform.web"}
        binding = outcome.child("binding-shop")
        assert binding is not None
        assert binding.object["metadata"] == {"name": "team-access-web", "namespace": "shop"}
        assert binding.object["roleRef"]["name"] == "team-access.platform.web"
        assert binding.object["subjects"][0]["name"] == "web-team"

        refused = client.reconcile(access({"group": "web-team", "namespaces": []}))
        assert not refused.succeeded and refused.children == []
        assert refused.results[0].reason == "InvalidTeamAccess"
