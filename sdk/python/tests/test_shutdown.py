"""Shutting down without losing calls: tell kplug the instance is draining, let the calls in
flight finish, then deregister; and what a kplug that is down or old changes about that."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import grpc
import pytest
from plugin_calls import DrainingCall, wait_until_refused

import kplug
from kplug.heartbeat import DRAIN_NOTICE_TIMEOUT, INSTANCES, Accepted, Heartbeater, Refused
from kplug.proto import registry_pb2
from kplug.testing import CAPABILITIES_BEFORE_INSTANCES, FakeRegistry, PluginClient

Serve = Callable[..., kplug.Server]


class Gate(kplug.Plugin):
    """Reconcile of an object named ``held`` waits until :attr:`release` is set."""

    name = "gate"
    api = "gates.example.com/v1"

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()

    def reconcile(self, request: kplug.Request) -> kplug.Outcome:
        if request.name == "held":
            self.entered.set()
            self.release.wait(20)
            self.finished.set()
        return kplug.Outcome.success("Passed", request.name)


class Call:
    """A call on a thread of its own."""

    def __init__(self, address: str, name: str) -> None:
        self.outcome: kplug.Outcome | None = None
        self.error: grpc.RpcError | None = None
        self._thread = threading.Thread(target=self._run, args=(address, name))
        self._thread.start()

    def _run(self, address: str, name: str) -> None:
        with PluginClient(address) as client:
            try:
                self.outcome = client.reconcile({"metadata": {"name": name}}, timeout=20)
            except grpc.RpcError as error:
                self.error = error

    def result(self) -> kplug.Outcome:
        self._thread.join(20)
        assert self.error is None, self.error
        assert self.outcome is not None
        return self.outcome


@pytest.fixture
def request_message() -> registry_pb2.HeartbeatRequest:
    return registry_pb2.HeartbeatRequest(name="gate", address="127.0.0.1:1", instance="gate-0")


@pytest.fixture
def fast_registry() -> Iterator[FakeRegistry]:
    with FakeRegistry(interval=0.2) as fake:
        yield fake


def test_stop_drains_then_lets_calls_finish_then_deregisters(registry: FakeRegistry, serve: Serve) -> None:
    gate = Gate()
    server = serve(gate, registry=registry.address, instance="gate-0")
    assert server.wait_for_heartbeat(lambda s: s.uid is not None, 5)
    status = server.heartbeat_status
    assert status is not None and status.server_capabilities is not None and INSTANCES in status.server_capabilities
    held = Call(server.address, "held")
    assert gate.entered.wait(10)

    # kplug routed a call here just before it heard of the draining: served.
    late = DrainingCall(registry, server.address, {"metadata": {"name": "late"}}, gate.finished.is_set)
    stopper = threading.Thread(target=server.stop)
    stopper.start()

    assert late.noticed.wait(10), "no draining heartbeat"
    assert late.outcomes[0].result("Passed") == kplug.Result("Passed", "late")
    assert server.wait_for_heartbeat(lambda s: s.draining, 5)
    # Then it stops accepting calls, and waits for the one in flight before deregistering.
    wait_until_refused(server.address, {"metadata": {"name": "new"}})
    assert registry.deregistrations == []
    gate.release.set()
    assert held.result().result("Passed") == kplug.Result("Passed", "held")
    stopper.join(10)
    assert not stopper.is_alive()
    deregistration = registry.wait_for_deregistration(timeout=0)
    assert (deregistration.instance, deregistration.address) == ("gate-0", server.address)
    assert late.finished_when_deregistered == [True]
    draining = [h.request.draining for h in registry.heartbeats]
    assert draining[0] is False and draining[-1] is True


def test_a_kplug_before_instances_is_deregistered_from_before_the_calls_finish(serve: Serve) -> None:
    with FakeRegistry(capabilities=CAPABILITIES_BEFORE_INSTANCES) as old:
        gate = Gate()
        server = serve(gate, registry=old.address, instance="gate-0")
        assert server.wait_for_heartbeat(lambda s: s.uid is not None, 5)
        held = Call(server.address, "held")
        assert gate.entered.wait(10)
        stopper = threading.Thread(target=server.stop)
        stopper.start()
        try:
            old.wait_for_deregistration(timeout=5)
            assert not gate.finished.is_set()
        finally:
            gate.release.set()
        assert held.result().succeeded
        stopper.join(10)
        assert [h for h in old.heartbeats if h.request.draining] == []
        assert len(old.deregistrations) == 1


def test_a_kplug_that_has_not_answered_yet_is_deregistered_from_at_once(
    request_message: registry_pb2.HeartbeatRequest,
) -> None:
    """Without an answer the SDK cannot know that kplug honours ``draining``; deregistering stops calls either way."""
    release = threading.Event()
    with FakeRegistry() as old:

        def hang_first(request: registry_pb2.HeartbeatRequest) -> registry_pb2.HeartbeatResponse:
            if not request.draining:
                release.wait(10)
            return old.accept(request)

        old.answer = hang_first
        heartbeater = Heartbeater(old.address, request_message)
        heartbeater.start()
        try:
            old.wait_for_heartbeats(1)
            heartbeater.drain()
            assert old.wait_for_deregistration(timeout=0).instance == "gate-0"
            assert heartbeater.wait_for(lambda s: s.stopped, 5), "heartbeats go on after deregistering"
        finally:
            release.set()
            heartbeater.stop()
        assert len(old.deregistrations) == 1


def test_heartbeats_after_the_draining_one_say_draining_too(
    fast_registry: FakeRegistry, request_message: registry_pb2.HeartbeatRequest
) -> None:
    heartbeater = Heartbeater(fast_registry.address, request_message)
    heartbeater.start()
    try:
        assert heartbeater.wait_for(lambda s: s.uid is not None, 5)
        heartbeater.drain()
        assert heartbeater.status.draining and heartbeater.status.last == Accepted()
        drained_at = len(fast_registry.heartbeats)
        later = fast_registry.wait_for_heartbeats(drained_at + 2)[drained_at - 1 :]
        assert all(h.request.draining for h in later)
    finally:
        heartbeater.stop()
    assert fast_registry.wait_for_deregistration(timeout=0).instance == "gate-0"


def test_a_kplug_that_is_down_does_not_hold_up_shutdown(request_message: registry_pb2.HeartbeatRequest) -> None:
    with FakeRegistry() as gone:
        address = gone.address
    heartbeater = Heartbeater(address, request_message)
    heartbeater.start()
    assert heartbeater.wait_for(lambda s: s.consecutive_failures >= 1, 5)
    started = time.monotonic()
    heartbeater.drain()
    heartbeater.stop()
    assert time.monotonic() - started < DRAIN_NOTICE_TIMEOUT + 2.0
    assert heartbeater.status.stopped


def test_nothing_is_told_where_the_plugin_is_not_registered(
    fast_registry: FakeRegistry, request_message: registry_pb2.HeartbeatRequest
) -> None:
    fast_registry.answer = lambda request: fast_registry.refuse("AddressConflict", "taken")
    heartbeater = Heartbeater(fast_registry.address, request_message)
    heartbeater.start()
    try:
        assert heartbeater.wait_for(lambda s: isinstance(s.last, Refused), 5)
        heartbeater.drain()
        assert heartbeater.status.draining
        count = len(fast_registry.heartbeats)
        assert not heartbeater.wait_for(lambda s: len(fast_registry.heartbeats) > count, 0.5)
    finally:
        heartbeater.stop()
    assert [h for h in fast_registry.heartbeats if h.request.draining] == []
    assert len(fast_registry.deregistrations) == 1
