"""Heartbeats to every kplug replica: a registry host name resolving to several addresses
(a headless Service) gets a heartbeat session per address, followed as they change.

The replicas are fake registries on 127.0.0.1 and 127.0.0.2, on the same port,
and a resolver of the test's own maps the name ``kplug.test`` to them (the
SDK's seam for name resolution); the system resolver is tested on its own.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path

import grpc
import pytest
from tls_certs import Ca

from kplug.heartbeat import Accepted, Failed, Heartbeater
from kplug.heartbeat.endpoint import Endpoint, resolve_addresses
from kplug.proto import registry_pb2
from kplug.testing import FakeRegistry

FIRST, SECOND = "127.0.0.1", "127.0.0.2"


class Dns:
    """A resolver whose answer the test changes; counts the questions."""

    def __init__(self, *addresses: str) -> None:
        self.addresses: Sequence[str] | OSError = addresses
        self._asked = 0
        self._changed = threading.Condition()

    def __call__(self, host: str, port: int) -> Sequence[str]:
        assert host == "kplug.test"
        with self._changed:
            self._asked += 1
            self._changed.notify_all()
        if isinstance(self.addresses, OSError):
            raise self.addresses
        return self.addresses

    def answer(self, addresses: Sequence[str] | OSError, *, then_asked: int = 0) -> None:
        """Answers ``addresses`` from now on and waits until asked ``then_asked`` more times."""
        with self._changed:
            self.addresses = addresses
            until = self._asked + then_asked
            assert self._changed.wait_for(lambda: self._asked >= until, 10), "the name was not resolved again"


class Replicas:
    """Fake registries, one per address, all on one port."""

    def __init__(self, stack: ExitStack, tls: tuple[bytes, bytes] | None = None, interval: float = 0.2) -> None:
        first = stack.enter_context(FakeRegistry(address=f"{FIRST}:0", tls=tls, interval=interval))
        self.port = int(first.address.rpartition(":")[2])
        second = stack.enter_context(FakeRegistry(address=f"{SECOND}:{self.port}", tls=tls, interval=interval))
        self.by_address = {FIRST: first, SECOND: second}

    def __getitem__(self, address: str) -> FakeRegistry:
        return self.by_address[address]

    def target(self, address: str) -> str:
        return f"{address}:{self.port}"


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def heartbeater(registry: str, dns: Dns, **options: object) -> Heartbeater:
    request = registry_pb2.HeartbeatRequest(name="hello", address="127.0.0.1:50052", instance="hello-0")
    return Heartbeater(registry, request, resolve=dns, **options)  # type: ignore[arg-type]


def test_every_address_of_the_name_gets_heartbeats(stack: ExitStack) -> None:
    replicas = Replicas(stack)
    beats = heartbeater(f"kplug.test:{replicas.port}", Dns(FIRST, SECOND))
    beats.start()
    stack.callback(beats.stop)
    for address in (FIRST, SECOND):
        assert replicas[address].wait_for_heartbeats(1)[0].request.instance == "hello-0"
    assert beats.wait_for(lambda s: all(r.uid for r in s.replicas.values()) and len(s.replicas) == 2, 5)
    status = beats.status
    assert sorted(status.replicas) == [replicas.target(FIRST), replicas.target(SECOND)]
    assert status.uid == status.replicas[replicas.target(FIRST)].uid

    beats.drain()
    beats.stop()
    for address in (FIRST, SECOND):
        assert replicas[address].wait_for_heartbeat(lambda h: h.request.draining, timeout=0)
        assert replicas[address].wait_for_deregistration(timeout=0).instance == "hello-0"
    assert beats.status.stopped


def test_replicas_coming_and_going_are_followed(stack: ExitStack) -> None:
    replicas = Replicas(stack)
    dns = Dns(FIRST)
    beats = heartbeater(f"http://kplug.test:{replicas.port}", dns, resolve_interval=0.05)
    beats.start()
    stack.callback(beats.stop)
    replicas[FIRST].wait_for_heartbeats(1)
    assert replicas[SECOND].heartbeats == []

    # A second replica comes up.
    dns.addresses = (FIRST, SECOND)
    replicas[SECOND].wait_for_heartbeats(1)
    assert beats.wait_for(lambda s: len(s.replicas) == 2, 5)

    # The first one goes away: its session ends, without deregistering.
    dns.addresses = (SECOND,)
    assert beats.wait_for(lambda s: list(s.replicas) == [replicas.target(SECOND)], 5)
    gone = len(replicas[FIRST].heartbeats)
    seen = len(replicas[SECOND].heartbeats)
    replicas[SECOND].wait_for_heartbeats(seen + 3)
    assert len(replicas[FIRST].heartbeats) <= gone + 1  # at most one already in flight
    assert replicas[FIRST].deregistrations == []


def test_a_failed_resolution_keeps_the_sessions_and_is_retried(stack: ExitStack) -> None:
    replicas = Replicas(stack)
    dns = Dns()
    dns.addresses = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    beats = heartbeater(f"kplug.test:{replicas.port}", dns, resolve_interval=0.05)
    beats.start()
    stack.callback(beats.stop)
    # Nothing to heartbeat to yet: reported as a failure, retried at the backoff.
    assert beats.wait_for(lambda s: s.consecutive_failures >= 2, 5)
    last = beats.status.last
    assert isinstance(last, Failed) and last.code == grpc.StatusCode.UNAVAILABLE
    assert "cannot resolve kplug.test" in last.message
    assert beats.status.replicas == {}

    dns.addresses = (FIRST,)
    assert beats.wait_for(lambda s: s.uid is not None, 5)
    dns.answer(socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"), then_asked=2)
    count = len(replicas[FIRST].heartbeats)
    replicas[FIRST].wait_for_heartbeats(count + 2)
    assert list(beats.status.replicas) == [replicas.target(FIRST)]
    assert beats.status.last == Accepted()


def test_tls_is_verified_for_the_name_at_every_address(stack: ExitStack, tmp_path: Path) -> None:
    ca = Ca()
    serving = ca.serving(dns=["kplug.test"], ips=[])  # no IP addresses in the certificate
    replicas = Replicas(stack, tls=(serving.key, serving.cert))
    beats = heartbeater(f"https://kplug.test:{replicas.port}", Dns(FIRST, SECOND), registry_ca=ca.pem)
    beats.start()
    stack.callback(beats.stop)
    assert beats.wait_for(lambda s: len(s.replicas) == 2 and all(r.uid for r in s.replicas.values()), 10)


def test_a_certificate_for_another_name_is_refused_at_every_address(stack: ExitStack) -> None:
    ca = Ca()
    serving = ca.serving(dns=["other.test"], ips=[FIRST, SECOND])
    replicas = Replicas(stack, tls=(serving.key, serving.cert))
    beats = heartbeater(f"https://kplug.test:{replicas.port}", Dns(FIRST, SECOND), registry_ca=ca.pem)
    beats.start()
    stack.callback(beats.stop)
    assert beats.wait_for(
        lambda s: len(s.replicas) == 2 and all(r.consecutive_failures >= 2 for r in s.replicas.values()), 10
    )
    assert replicas[FIRST].heartbeats == [] and replicas[SECOND].heartbeats == []


def test_addresses_and_unix_targets_are_not_resolved() -> None:
    assert Endpoint.parse("127.0.0.1:50051").host is None
    assert Endpoint.parse("http://[::1]:50051").host is None
    assert Endpoint.parse("unix:/run/kplug.sock").host is None
    endpoint = Endpoint.parse("https://kplug.kplug-system.svc:8444")
    assert (endpoint.host, endpoint.port, endpoint.tls) == ("kplug.kplug-system.svc", 8444, True)
    assert endpoint.targets(["10.0.0.2", "fd00::1", "10.0.0.2"]) == ["10.0.0.2:8444", "[fd00::1]:8444"]


def test_an_address_is_dialed_as_it_is(registry: FakeRegistry) -> None:
    def no_dns(host: str, port: int) -> Sequence[str]:
        raise AssertionError(f"resolved {host}")

    beats = Heartbeater(registry.address, registry_pb2.HeartbeatRequest(name="hello"), resolve=no_dns)
    beats.start()
    try:
        assert beats.wait_for(lambda s: s.uid is not None, 5)
        assert list(beats.status.replicas) == [registry.address]
    finally:
        beats.stop()


def test_the_system_resolver() -> None:
    assert "127.0.0.1" in resolve_addresses("localhost", 50051)
    assert resolve_addresses("127.0.0.2", 1) == ["127.0.0.2"]
    with pytest.raises(OSError):
        resolve_addresses("no-such-host.invalid", 50051)
