"""Instance identity: which instance of a plugin a process is, in heartbeats and deregistrations."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

import kplug
from kplug.config import add_arguments, default_instance, from_arguments
from kplug.testing import FakeRegistry

Serve = Callable[..., kplug.Server]


class Hello(kplug.Plugin):
    name = "hello-python"
    api = "greetings.example.com/v1"

    def reconcile(self, request: kplug.Request) -> kplug.Outcome:
        return kplug.Outcome.success()


def parse(argv: list[str], environ: dict[str, str]) -> kplug.Config:
    parser = argparse.ArgumentParser()
    add_arguments(parser, environ)
    return from_arguments(parser.parse_args(argv), environ)


@pytest.mark.parametrize(
    ("argv", "environ", "instance"),
    [
        ([], {}, None),  # resolved when served: see default_instance
        ([], {"POD_NAME": "hello-7d9f-abcde"}, "hello-7d9f-abcde"),
        ([], {"POD_NAME": "hello-7d9f-abcde", "KPLUG_INSTANCE": "from-env"}, "from-env"),
        (["--instance", "from-flag"], {"POD_NAME": "pod", "KPLUG_INSTANCE": "from-env"}, "from-flag"),
        (["--instance="], {"POD_NAME": "pod"}, ""),  # explicitly none: the address names the instance
    ],
)
def test_instance_flag_environment_and_pod_name(argv: list[str], environ: dict[str, str], instance: str | None) -> None:
    assert parse(argv, environ).instance == instance


def test_default_instance_is_the_pod_name_else_none() -> None:
    assert default_instance({"POD_NAME": "hello-0"}) == "hello-0"
    assert default_instance({}) == ""
    assert default_instance({"POD_NAME": " "}) == ""


def test_heartbeats_carry_the_pod_name_by_default(
    registry: FakeRegistry, serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POD_NAME", "hello-python-5c8d-x2x9q")
    server = serve(Hello(), registry=registry.address)
    assert registry.wait_for_heartbeats(1)[0].request.instance == "hello-python-5c8d-x2x9q"
    assert server.instance == "hello-python-5c8d-x2x9q"


def test_without_a_pod_name_the_address_names_the_instance(
    registry: FakeRegistry, serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("POD_NAME", raising=False)
    monkeypatch.delenv("KPLUG_INSTANCE", raising=False)
    serve(Hello(), registry=registry.address)
    assert registry.wait_for_heartbeats(1)[0].request.instance == ""


def test_a_configured_instance_wins_and_the_deregistration_names_it(
    registry: FakeRegistry, serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POD_NAME", "not-this")
    server = serve(Hello(), registry=registry.address, instance="hello-1", server_name="hello.plugins.svc")
    heartbeat = registry.wait_for_heartbeats(1)[0].request
    assert (heartbeat.instance, heartbeat.server_name, heartbeat.draining) == ("hello-1", "hello.plugins.svc", False)
    server.stop()
    deregistration = registry.wait_for_deregistration(timeout=0)
    assert (deregistration.name, deregistration.address, deregistration.instance) == (
        "hello-python",
        server.address,
        "hello-1",
    )


def test_no_instance_is_sent_as_empty(registry: FakeRegistry, serve: Serve) -> None:
    server = serve(Hello(), registry=registry.address, instance="")
    assert registry.wait_for_heartbeats(1)[0].request.instance == ""
    server.stop()
    assert registry.wait_for_deregistration(timeout=0).instance == ""


def test_two_instances_of_a_plugin_register_side_by_side(registry: FakeRegistry, serve: Serve) -> None:
    first = serve(Hello(), registry=registry.address, instance="hello-0")
    second = serve(Hello(), registry=registry.address, instance="hello-1")
    assert first.wait_for_heartbeat(lambda s: s.uid is not None, 5)
    assert second.wait_for_heartbeat(lambda s: s.uid is not None, 5)
    first_status, second_status = first.heartbeat_status, second.heartbeat_status
    assert first_status is not None and second_status is not None
    assert first_status.uid != second_status.uid
    first.stop()
    assert registry.wait_for_deregistration(timeout=0).instance == "hello-0"
    assert second.wait_for_heartbeat(lambda s: s.uid is not None and not s.stopped, 0)


def test_a_canary_declares_its_weight_and_a_stable_instance_none(registry: FakeRegistry, serve: Serve) -> None:
    serve(Hello(), registry=registry.address, instance="canary", canary_weight=10)
    serve(Hello(), registry=registry.address, instance="stable")
    weights = {h.request.instance: h.request.canary_weight for h in registry.wait_for_heartbeats(2)}
    assert weights == {"canary": 10, "stable": 0}


def test_a_shadow_declares_its_share_and_a_serving_instance_none(registry: FakeRegistry, serve: Serve) -> None:
    serve(Hello(), registry=registry.address, instance="shadow", shadow=40)
    serve(Hello(), registry=registry.address, instance="serving")
    shares = {h.request.instance: h.request.shadow_percent for h in registry.wait_for_heartbeats(2)}
    assert shares == {"shadow": 40, "serving": 0}
