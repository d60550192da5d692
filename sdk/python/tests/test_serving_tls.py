"""Serving TLS with client certificates (mutual TLS from kplug), from files rotated in place."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from tls_certs import Ca, KeyPair

import kplug
from kplug.testing import PluginClient

Serve = Callable[..., kplug.Server]


class Hello(kplug.Plugin):
    name = "hello-python"
    api = "greetings.example.com/v1"

    def reconcile(self, request: kplug.Request) -> kplug.Outcome:
        return kplug.Outcome.success("Greeted", f"hello, {request.name}")


WORLD = {"metadata": {"name": "world"}}


class SecretVolume:
    """A Kubernetes Secret volume: files are symlinks into ``..data``, swapped in one step on update."""

    def __init__(self, root: Path, files: dict[str, bytes]) -> None:
        self.root = root
        self.root.mkdir()
        self._version = 0
        self.update(files)
        for name in files:
            (self.root / name).symlink_to(Path("..data") / name)

    def path(self, name: str) -> str:
        return str(self.root / name)

    def update(self, files: dict[str, bytes]) -> None:
        self._version += 1
        version = self.root / f"..v{self._version}"
        version.mkdir()
        for name, data in files.items():
            (version / name).write_bytes(data)
        staged = self.root / "..data_tmp"
        staged.symlink_to(version.name)
        os.replace(staged, self.root / "..data")


class Pki:
    """The plugin's serving CA and certificate, kplug's client CA and certificate."""

    def __init__(self) -> None:
        self.serving_ca = Ca("plugin serving CA")
        self.serving = self.serving_ca.serving(dns=["hello.plugins.svc"], ips=["127.0.0.1"])
        self.client_ca = Ca("kplug client CA")
        self.kplug = self.client_ca.client("kplug")

    def files(self) -> dict[str, bytes]:
        return {"tls.crt": self.serving.cert, "tls.key": self.serving.key, "client-ca.crt": self.client_ca.pem}


@pytest.fixture
def pki() -> Pki:
    return Pki()


@pytest.fixture
def volume(pki: Pki, tmp_path: Path) -> SecretVolume:
    return SecretVolume(tmp_path / "tls", pki.files())


def serve_tls(serve: Serve, volume: SecretVolume, **config: object) -> kplug.Server:
    settings: dict[str, object] = {
        "tls_cert_file": volume.path("tls.crt"),
        "tls_key_file": volume.path("tls.key"),
        "client_ca_file": volume.path("client-ca.crt"),
    }
    settings.update(config)
    return serve(Hello(), **settings)


def call(
    server: kplug.Server, trust: bytes, client: KeyPair | None, server_name: str | None = None
) -> kplug.Outcome | grpc.StatusCode:
    """Reconciles over a new connection; the status code if it fails."""
    with PluginClient(
        server.address,
        root_certificates=trust,
        private_key=client.key if client else None,
        certificate_chain=client.cert if client else None,
        server_name=server_name,
    ) as plugin:
        try:
            return plugin.reconcile(WORLD, timeout=5)
        except grpc.RpcError as error:
            return error.code()


def greeted(result: kplug.Outcome | grpc.StatusCode) -> bool:
    return isinstance(result, kplug.Outcome) and result.result("Greeted") == kplug.Result("Greeted", "hello, world")


def test_kplug_with_a_client_certificate_of_the_client_ca_is_served(
    serve: Serve, volume: SecretVolume, pki: Pki
) -> None:
    server = serve_tls(serve, volume)
    assert greeted(call(server, pki.serving_ca.pem, pki.kplug))
    assert greeted(call(server, pki.serving_ca.pem, pki.kplug, server_name="hello.plugins.svc"))


def test_a_caller_without_a_client_certificate_is_refused(serve: Serve, volume: SecretVolume, pki: Pki) -> None:
    server = serve_tls(serve, volume)
    assert call(server, pki.serving_ca.pem, None) == grpc.StatusCode.UNAVAILABLE


def test_a_client_certificate_of_another_ca_is_refused(serve: Serve, volume: SecretVolume, pki: Pki) -> None:
    server = serve_tls(serve, volume)
    impostor = Ca("some other CA").client("kplug")
    assert call(server, pki.serving_ca.pem, impostor) == grpc.StatusCode.UNAVAILABLE


def test_plain_grpc_callers_are_refused(serve: Serve, volume: SecretVolume) -> None:
    server = serve_tls(serve, volume)
    with PluginClient(server.address) as plain, pytest.raises(grpc.RpcError) as error:
        plain.reconcile(WORLD, timeout=5)
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_rotated_serving_certificate_is_used_for_new_connections(
    serve: Serve, volume: SecretVolume, pki: Pki
) -> None:
    server = serve_tls(serve, volume)
    assert greeted(call(server, pki.serving_ca.pem, pki.kplug))
    rotated_ca = Ca("rotated serving CA")
    rotated = rotated_ca.serving(dns=["hello.plugins.svc"], ips=["127.0.0.1"])
    volume.update({"tls.crt": rotated.cert, "tls.key": rotated.key, "client-ca.crt": pki.client_ca.pem})
    assert greeted(call(server, rotated_ca.pem, pki.kplug))
    assert call(server, pki.serving_ca.pem, pki.kplug) == grpc.StatusCode.UNAVAILABLE


def test_a_rotated_client_ca_is_used_for_new_connections(serve: Serve, volume: SecretVolume, pki: Pki) -> None:
    server = serve_tls(serve, volume)
    new_client_ca = Ca("new kplug client CA")
    new_kplug = new_client_ca.client("kplug")
    assert call(server, pki.serving_ca.pem, new_kplug) == grpc.StatusCode.UNAVAILABLE
    volume.update({"tls.crt": pki.serving.cert, "tls.key": pki.serving.key, "client-ca.crt": new_client_ca.pem})
    assert greeted(call(server, pki.serving_ca.pem, new_kplug))
    assert call(server, pki.serving_ca.pem, pki.kplug) == grpc.StatusCode.UNAVAILABLE


def test_unusable_rotated_files_keep_the_previous_certificate(
    serve: Serve, volume: SecretVolume, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    server = serve_tls(serve, volume)
    other = Ca().serving(dns=["hello.plugins.svc"], ips=["127.0.0.1"])
    # A key that does not belong to the certificate.
    volume.update({"tls.crt": pki.serving.cert, "tls.key": other.key, "client-ca.crt": pki.client_ca.pem})
    assert greeted(call(server, pki.serving_ca.pem, pki.kplug))
    assert "keeping the previous serving certificate" in caplog.text
    # Not PEM at all.
    volume.update({"tls.crt": b"garbage", "tls.key": pki.serving.key, "client-ca.crt": pki.client_ca.pem})
    assert greeted(call(server, pki.serving_ca.pem, pki.kplug))
    assert "holds no PEM" in caplog.text
    # Fixed again: picked up.
    rotated_ca = Ca("rotated serving CA")
    rotated = rotated_ca.serving(dns=["hello.plugins.svc"], ips=["127.0.0.1"])
    volume.update({"tls.crt": rotated.cert, "tls.key": rotated.key, "client-ca.crt": pki.client_ca.pem})
    assert greeted(call(server, rotated_ca.pem, pki.kplug))


def test_tls_without_a_client_ca_needs_to_be_allowed(serve: Serve, volume: SecretVolume, pki: Pki) -> None:
    with pytest.raises(ValueError, match="--allow-unauthenticated-clients"):
        serve_tls(serve, volume, client_ca_file=None)
    server = serve_tls(serve, volume, client_ca_file=None, allow_unauthenticated_clients=True)
    assert greeted(call(server, pki.serving_ca.pem, None))


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"tls_key_file": None}, "go together"),
        ({"tls_cert_file": None}, "go together"),
        ({"tls_cert_file": None, "tls_key_file": None}, "verifies callers over TLS only"),
        ({"allow_unauthenticated_clients": True}, "contradicts"),
    ],
)
def test_tls_options_that_do_not_fit_together(
    serve: Serve, volume: SecretVolume, config: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        serve_tls(serve, volume, **config)


def test_unusable_files_fail_at_start(serve: Serve, volume: SecretVolume, pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(kplug.ServeError, match="cannot read the serving certificate file"):
        serve_tls(serve, volume, tls_cert_file=str(tmp_path / "missing.crt"))
    wrong_key = tmp_path / "wrong.key"
    wrong_key.write_bytes(Ca().client().key)
    with pytest.raises(kplug.ServeError, match="cannot be used"):
        serve_tls(serve, volume, tls_key_file=str(wrong_key))
    not_a_ca = tmp_path / "ca.crt"
    not_a_ca.write_text("hello")
    with pytest.raises(kplug.ServeError, match="client CA file .* holds no PEM"):
        serve_tls(serve, volume, client_ca_file=str(not_a_ca))
