"""Heartbeats to kplug in cluster mode: TLS with a CA of the test's own, and a
ServiceAccount token in the ``authorization`` metadata, against a fake
registry that checks both the way kplug does."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from tls_certs import Pki, make_pki

import kplug
from kplug.heartbeat import Accepted, Failed, Heartbeater, Refused
from kplug.heartbeat.token import read_token
from kplug.proto import registry_pb2
from kplug.testing import INVALID_TOKEN, NO_TOKEN, FakeRegistry, ReceivedHeartbeat

Serve = Callable[..., kplug.Server]
#: How late a heartbeat may arrive on a busy machine.
SLACK = 0.35
DENIED = 'system:serviceaccount:plugins:hello may not create plugins/heartbeat "hello-python"'


class Hello(kplug.Plugin):
    name = "hello-python"
    api = "greetings.example.com/v1"

    def reconcile(self, request: kplug.Request) -> kplug.Outcome:
        return kplug.Outcome.success()


@pytest.fixture(scope="module")
def pki() -> Pki:
    return make_pki()


@pytest.fixture
def ca_file(pki: Pki, tmp_path: Path) -> str:
    path = tmp_path / "ca.crt"
    path.write_bytes(pki.ca)
    return str(path)


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    """Where the token goes; not written yet."""
    return tmp_path / "token"


def write_atomically(path: Path, text: str) -> None:
    """Replaces the file in one step, as the kubelet does."""
    staged = path.with_suffix(".new")
    staged.write_text(text)
    os.replace(staged, path)


@pytest.fixture
def tls_registry(pki: Pki) -> Iterator[FakeRegistry]:
    """A TLS registry that accepts ``token-a``, asking for a heartbeat every hour."""
    with FakeRegistry(interval=3600.0, tls=pki.tls, tokens=["token-a"]) as fake:
        yield fake


def gaps(heartbeats: list[ReceivedHeartbeat]) -> list[float]:
    return [later.at - earlier.at for earlier, later in itertools.pairwise(heartbeats)]


def test_tls_heartbeats_and_deregistration_carry_the_token(
    tls_registry: FakeRegistry, serve: Serve, ca_file: str, token_file: Path
) -> None:
    token_file.write_text("token-a\n")  # the newline of `kubectl create token > file`
    assert tls_registry.url.startswith("https://127.0.0.1:")
    server = serve(Hello(), registry=tls_registry.url, registry_ca_file=ca_file, token_file=str(token_file))
    assert tls_registry.wait_for_heartbeats(1)[0].token == "token-a"
    assert server.wait_for_heartbeat(lambda s: s.last == Accepted(), 5)
    server.stop()
    assert tls_registry.wait_for_deregistration(timeout=0).name == "hello-python"
    assert tls_registry.deregistration_tokens == ["token-a"]


def test_the_certificate_is_checked_against_the_host_name(
    pki: Pki, serve: Serve, ca_file: str, token_file: Path
) -> None:
    token_file.write_text("token-a")
    with FakeRegistry(address="localhost:0", tls=pki.tls, tokens=["token-a"]) as fake:
        assert fake.url.startswith("https://localhost:")
        server = serve(Hello(), registry=fake.url, registry_ca_file=ca_file, token_file=str(token_file))
        assert server.wait_for_heartbeat(lambda s: s.uid is not None, 5)


def test_a_rotated_token_is_read_afresh(pki: Pki, serve: Serve, ca_file: str, token_file: Path) -> None:
    write_atomically(token_file, "token-a")
    with FakeRegistry(interval=0.1, tls=pki.tls, tokens=["token-a"]) as fake:
        serve(Hello(), registry=fake.url, registry_ca_file=ca_file, token_file=str(token_file))
        assert [h.token for h in fake.wait_for_heartbeats(2)] == ["token-a", "token-a"]
        # The kubelet rotates the token; the old one stops working.
        fake.tokens = frozenset({"token-b"})
        write_atomically(token_file, "token-b")
        count = len(fake.heartbeats)
        heartbeats = fake.wait_for_heartbeats(count + 2)
        assert heartbeats[-1].token == "token-b"


def test_no_token_is_refused_and_retried_at_the_interval_until_it_appears(
    tls_registry: FakeRegistry, serve: Serve, ca_file: str, token_file: Path
) -> None:
    # 0.6 s: the failure backoff would retry after 0.2 s, then 0.4 s.
    server = serve(
        Hello(),
        registry=tls_registry.url,
        registry_ca_file=ca_file,
        token_file=str(token_file),
        heartbeat_interval=0.6,
    )
    heartbeats = tls_registry.wait_for_heartbeats(3)
    assert [h.token for h in heartbeats] == [None, None, None]
    for gap in gaps(heartbeats):
        assert 0.6 * 0.9 - 0.02 <= gap <= 0.6 * 1.1 + SLACK, f"waited {gap:.3f}s, expected the interval"
    status = server.heartbeat_status
    assert status is not None
    assert status.last == Refused("Unauthenticated", NO_TOKEN)
    assert (status.uid, status.consecutive_failures) == (None, 0)

    # A wrong token is refused too, saying so.
    write_atomically(token_file, "token-x")
    assert server.wait_for_heartbeat(lambda s: s.last == Refused("Unauthenticated", INVALID_TOKEN), 5)

    # The right one lets the plugin in without a restart.
    write_atomically(token_file, "token-a")
    assert server.wait_for_heartbeat(lambda s: s.last == Accepted() and s.uid is not None, 5)


def test_permission_denied_is_retried_at_the_interval(
    tls_registry: FakeRegistry, serve: Serve, ca_file: str, token_file: Path
) -> None:
    token_file.write_text("token-a")

    def deny_three_times(request: registry_pb2.HeartbeatRequest) -> registry_pb2.HeartbeatResponse | tuple:
        if len(tls_registry.heartbeats) <= 3:
            return grpc.StatusCode.PERMISSION_DENIED, DENIED
        return tls_registry.accept(request)

    tls_registry.answer = deny_three_times
    server = serve(
        Hello(),
        registry=tls_registry.url,
        registry_ca_file=ca_file,
        token_file=str(token_file),
        heartbeat_interval=0.6,
    )
    assert server.wait_for_heartbeat(lambda s: s.last is not None, 5)
    status = server.heartbeat_status
    assert status is not None
    assert status.last == Refused("PermissionDenied", DENIED)
    assert (status.uid, status.consecutive_failures) == (None, 0)

    heartbeats = tls_registry.wait_for_heartbeats(4)
    for gap in gaps(heartbeats):
        assert gap >= 0.6 * 0.9 - 0.02, f"waited {gap:.3f}s: retried with the failure backoff?"
    assert server.wait_for_heartbeat(lambda s: s.uid is not None, 5)


def test_an_untrusted_certificate_is_a_failure(pki: Pki, serve: Serve, tmp_path: Path) -> None:
    other_ca = tmp_path / "other-ca.crt"
    other_ca.write_bytes(make_pki().ca)
    with FakeRegistry(tls=pki.tls) as fake:
        server = serve(Hello(), registry=fake.url, registry_ca_file=str(other_ca))
        assert server.wait_for_heartbeat(lambda s: s.consecutive_failures >= 2, 5)
        status = server.heartbeat_status
        assert status is not None and isinstance(status.last, Failed)
        assert status.last.code == grpc.StatusCode.UNAVAILABLE
        assert fake.heartbeats == []


def test_https_without_a_ca_fails_at_start(serve: Serve, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--registry-ca-file"):
        serve(Hello(), registry="https://kplug.kplug-system.svc:8444")
    with pytest.raises(kplug.ServeError, match="cannot read the registry CA file"):
        serve(Hello(), registry="https://kplug:8444", registry_ca_file=str(tmp_path / "missing.crt"))
    not_pem = tmp_path / "ca.crt"
    not_pem.write_text("hello")
    with pytest.raises(ValueError, match="no PEM certificate"):
        serve(Hello(), registry="https://kplug:8444", registry_ca_file=str(not_pem))
    with pytest.raises(ValueError, match="KPLUG_REGISTRY_CA_FILE"):
        Heartbeater("https://kplug:8444", registry_pb2.HeartbeatRequest(name="hello"))


def test_token_files(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(" abc.def-ghi\n")
    assert read_token(str(path)) == "abc.def-ghi"
    for contents, problem in [(" \n", "empty"), ("a\nb", "characters")]:
        path.write_text(contents)
        with pytest.raises(ValueError, match=problem):
            read_token(str(path))
    with pytest.raises(OSError):
        read_token(str(tmp_path / "missing"))
