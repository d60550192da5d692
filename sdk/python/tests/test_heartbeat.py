"""Heartbeats against an in-process registry: timing, backoff, refusals, deregistration.

Timing bounds are generous upwards (a busy machine delays threads) and
tight downwards (a wait never ends early), so they fail for real regressions
such as a missing backoff, not for a slow CI machine.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator

import grpc
import pytest

import kplug
from kplug.heartbeat import DRAIN_NOTICE_TIMEOUT, INITIAL_BACKOFF, Accepted, Failed, Refused, backoff, jitter
from kplug.proto import registry_pb2
from kplug.testing import FakeRegistry, ReceivedHeartbeat

Serve = Callable[..., kplug.Server]
#: How late a heartbeat may arrive on a busy machine.
SLACK = 0.35


class Hello(kplug.Plugin):
    name = "hello-python"
    api = "greetings.example.com/v1"
    implementation = "Hello"
    version = "0.1.0"
    extensions = (kplug.Extension("myorg.org", "GreetingExtension"), kplug.Extension("myorg.org", "Audit", "v2"))

    def reconcile(self, request: kplug.Request) -> kplug.Outcome:
        return kplug.Outcome.success()


def gaps(heartbeats: list[ReceivedHeartbeat]) -> list[float]:
    return [later.at - earlier.at for earlier, later in itertools.pairwise(heartbeats)]


def assert_delay(gap: float, expected: float) -> None:
    """``gap`` is ``expected`` ± jitter, arriving late by at most SLACK."""
    assert expected * 0.9 - 0.02 <= gap <= expected * 1.1 + SLACK, f"waited {gap:.3f}s, expected ~{expected:.3f}s"


@pytest.fixture
def fast_registry() -> Iterator[FakeRegistry]:
    with FakeRegistry(interval=0.3, ttl=1.0) as fake:
        yield fake


def test_backoff_doubles_up_to_the_interval() -> None:
    assert [backoff(n, 5.0) for n in range(1, 8)] == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0])
    assert backoff(10**9, 5.0) == 5.0
    assert backoff(1, 0.1) == 0.1


def test_jitter_stays_within_ten_percent() -> None:
    assert jitter(10.0, lambda: 0.0) == pytest.approx(9.0)
    assert jitter(10.0, lambda: 0.5) == pytest.approx(10.0)
    assert jitter(10.0, lambda: 0.999999) == pytest.approx(11.0)
    delays = [jitter(10.0) for _ in range(1000)]
    assert all(9.0 <= d <= 11.0 for d in delays)
    assert max(delays) - min(delays) > 1.0  # it does vary


def test_first_heartbeat_declares_the_plugin(registry: FakeRegistry, serve: Serve) -> None:
    started = time.monotonic()
    server = serve(
        Hello(), registry=registry.address, heartbeat_interval=5.0, labels={"team": "greeters"}, instance="hello-0"
    )
    first = registry.wait_for_heartbeats(1)[0]
    # At once, not after the 5 s interval: the bound leaves a busy machine
    # seconds to start the server.
    assert first.at - started < 2.5, "the first heartbeat goes out at once"

    expected = registry_pb2.HeartbeatRequest(
        name="hello-python",
        version="0.1.0",
        api=registry_pb2.PluginApi(group="example.com", resource="greetings", version="v1"),
        implementation="Hello",
        address=server.address,
        extensions=[
            registry_pb2.ExtensionKind(group="myorg.org", kind="GreetingExtension"),
            registry_pb2.ExtensionKind(group="myorg.org", kind="Audit", version="v2"),
        ],
        labels={"team": "greeters"},
        protocol=registry_pb2.Protocol(
            version="v1alpha1",
            sdk=f"kplug-sdk-python/{kplug.__version__}",
            # No Finalize: Hello keeps the default finalize, which has nothing to clean up.
            capabilities=["Reconcile", "DryRun"],
        ),
        instance="hello-0",
    )
    expected.interval.FromSeconds(5)
    assert first.request == expected
    assert kplug.SDK == "kplug-sdk-python/0.1.0"


class Goodbye(Hello):
    def finalize(self, request: kplug.Request) -> kplug.Outcome:
        return kplug.Outcome.success("Goodbye", f"goodbye, {request.name}")


def test_a_plugin_that_finalizes_declares_finalize(registry: FakeRegistry, serve: Serve) -> None:
    serve(Goodbye(), registry=registry.address)
    protocol = registry.wait_for_heartbeats(1)[0].request.protocol
    assert list(protocol.capabilities) == ["Reconcile", "Finalize", "DryRun"]


def test_name_override_and_no_interval_asked(registry: FakeRegistry, serve: Serve) -> None:
    serve(Hello(), registry=registry.address, name="hello-two")
    request = registry.wait_for_heartbeats(1)[0].request
    assert request.name == "hello-two"
    assert not request.HasField("interval")


def test_heartbeats_follow_the_registry_interval(fast_registry: FakeRegistry, serve: Serve) -> None:
    server = serve(Hello(), registry=fast_registry.address, heartbeat_interval=60.0)
    heartbeats = fast_registry.wait_for_heartbeats(5)
    for gap in gaps(heartbeats):
        assert_delay(gap, 0.3)
    status = server.heartbeat_status
    assert status is not None
    assert (status.last, status.interval, status.ttl, status.consecutive_failures) == (Accepted(), 0.3, 1.0, 0)
    assert status.uid


def test_failures_back_off_exponentially_then_recover(registry: FakeRegistry, serve: Serve) -> None:
    def fail_four_times(request: registry_pb2.HeartbeatRequest) -> registry_pb2.HeartbeatResponse | grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE if len(registry.heartbeats) <= 4 else registry.accept(request)

    registry.answer = fail_four_times
    server = serve(Hello(), registry=registry.address)
    heartbeats = registry.wait_for_heartbeats(5)
    for failures, gap in enumerate(gaps(heartbeats), start=1):
        assert_delay(gap, INITIAL_BACKOFF * 2 ** (failures - 1))
    assert server.wait_for_heartbeat(lambda s: s.last == Accepted(), 5)
    status = server.heartbeat_status
    assert status is not None and status.consecutive_failures == 0 and status.uid


def test_backoff_is_capped_at_the_interval(registry: FakeRegistry, serve: Serve) -> None:
    registry.answer = lambda request: grpc.StatusCode.INTERNAL
    server = serve(Hello(), registry=registry.address, heartbeat_interval=0.5)
    heartbeats = registry.wait_for_heartbeats(5)
    for expected, gap in zip([0.2, 0.4, 0.5, 0.5], gaps(heartbeats[:5]), strict=True):
        assert_delay(gap, expected)
    status = server.heartbeat_status
    assert status is not None and status.consecutive_failures >= 4
    assert isinstance(status.last, Failed) and status.last.code == grpc.StatusCode.INTERNAL
    assert status.uid is None


def test_refusals_are_retried_at_the_interval(fast_registry: FakeRegistry, serve: Serve) -> None:
    fast_registry.answer = lambda request: fast_registry.refuse("AddressConflict", "someone else is there")
    server = serve(Hello(), registry=fast_registry.address)
    heartbeats = fast_registry.wait_for_heartbeats(4)
    for gap in gaps(heartbeats):
        assert_delay(gap, 0.3)
    status = server.heartbeat_status
    assert status is not None
    assert status.last == Refused("AddressConflict", "someone else is there")
    assert (status.uid, status.consecutive_failures) == (None, 0)

    fast_registry.answer = None
    assert server.wait_for_heartbeat(lambda s: s.uid is not None, 5)


def test_registers_once_an_absent_registry_comes_up(serve: Serve) -> None:
    with FakeRegistry() as gone:
        address = gone.address
    server = serve(Hello(), registry=address, heartbeat_interval=1.0)
    assert server.wait_for_heartbeat(lambda s: s.consecutive_failures >= 3, 5)
    status = server.heartbeat_status
    assert status is not None and isinstance(status.last, Failed)
    assert status.last.code == grpc.StatusCode.UNAVAILABLE

    with FakeRegistry(address=address) as back:
        came_up = time.monotonic()
        first = back.wait_for_heartbeats(1, timeout=5)[0]
        # Retries are at most an interval (1 s + 10%) apart.
        assert first.at - came_up <= 1.1 + SLACK
        assert server.wait_for_heartbeat(lambda s: s.uid is not None, 5)
        server.stop()
        assert back.wait_for_deregistration(1).address == server.address


def test_recovery_is_not_held_up_by_grpc_reconnect_backoff(serve: Serve) -> None:
    """After a long outage gRPC's channel waits seconds between dials; the SDK dials afresh."""
    with FakeRegistry() as gone:
        address = gone.address
    server = serve(Hello(), registry=address, heartbeat_interval=0.3)
    time.sleep(4.5)  # gRPC's own reconnect backoff grows 1 s, 1.6 s, 2.6 s, ...
    with FakeRegistry(address=address) as back:
        came_up = time.monotonic()
        first = back.wait_for_heartbeats(1, timeout=10)[0]
        assert first.at - came_up <= 0.3 * 1.1 + SLACK
        assert server.wait_for_heartbeat(lambda s: s.uid is not None, 5)


def test_stop_deregisters_and_ends_heartbeats(fast_registry: FakeRegistry, serve: Serve) -> None:
    server = serve(Hello(), registry=fast_registry.address)
    fast_registry.wait_for_heartbeats(2)
    server.stop()
    deregistration = fast_registry.wait_for_deregistration(timeout=0)
    assert (deregistration.name, deregistration.address) == ("hello-python", server.address)
    status = server.heartbeat_status
    assert status is not None and status.stopped and status.uid is None

    count = len(fast_registry.heartbeats)
    time.sleep(0.6)
    assert len(fast_registry.heartbeats) == count
    assert len(fast_registry.deregistrations) == 1
    server.stop()  # again: nothing happens
    assert len(fast_registry.deregistrations) == 1


def test_stop_abandons_a_hanging_heartbeat(registry: FakeRegistry, serve: Serve) -> None:
    release = threading.Event()

    def hang(request: registry_pb2.HeartbeatRequest) -> registry_pb2.HeartbeatResponse:
        if not request.draining:
            release.wait(10)
        return registry.accept(request)

    registry.answer = hang
    server = serve(Hello(), registry=registry.address)
    registry.wait_for_heartbeats(1)
    started = time.monotonic()
    server.stop()
    release.set()
    assert time.monotonic() - started < 2.0
    assert registry.wait_for_deregistration(timeout=0).address == server.address


def test_a_kplug_hanging_on_the_draining_heartbeat_delays_stop_at_most_the_notice_timeout(
    registry: FakeRegistry, serve: Serve
) -> None:
    release = threading.Event()

    def hang_when_draining(request: registry_pb2.HeartbeatRequest) -> registry_pb2.HeartbeatResponse:
        if request.draining:
            release.wait(10)
        return registry.accept(request)

    registry.answer = hang_when_draining
    server = serve(Hello(), registry=registry.address)
    assert server.wait_for_heartbeat(lambda s: s.uid is not None, 5)
    started = time.monotonic()
    try:
        server.stop()
        took = time.monotonic() - started
    finally:
        release.set()
    assert DRAIN_NOTICE_TIMEOUT - 0.1 <= took < DRAIN_NOTICE_TIMEOUT + 1.5, f"stop took {took:.3f}s"
    assert registry.wait_for_deregistration(timeout=0).address == server.address


def test_stop_with_an_unreachable_registry_is_bounded(serve: Serve) -> None:
    with FakeRegistry() as gone:
        address = gone.address
    server = serve(Hello(), registry=address)
    assert server.wait_for_heartbeat(lambda s: s.consecutive_failures >= 1, 5)
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 4.0
    status = server.heartbeat_status
    assert status is not None and status.stopped
