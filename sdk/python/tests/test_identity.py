"""``--issued-identity``: the key and signing request, stamping heartbeats, taking kplug's
answers, the config's refusals, and serving with what a registry signed.

The registry here is the fake one, signing with the test's own CA
(:meth:`tls_certs.Ca.sign_request`); tests/test_identity_kplug.py runs the
same against a real kplug that signs."""

from __future__ import annotations

import argparse
import hashlib
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from google.protobuf import duration_pb2
from tls_certs import Ca, make_pki

import kplug
import kplug.identity
from kplug.config import add_arguments, from_arguments
from kplug.identity import IdentityError, IssuedIdentity, identity
from kplug.proto import registry_pb2
from kplug.testing import FakeRegistry, PluginClient, PluginProcess

Serve = Callable[..., kplug.Server]
GREETING = {"apiVersion": "greetings.example.com/v1", "kind": "Greeting", "metadata": {"name": "ada"}}


class Hello(kplug.Plugin):
    name = "hello-id"
    api = "greetings.example.com/v1"

    def reconcile(self, request: kplug.Request) -> kplug.Outcome:
        return kplug.Outcome.success("Greeted", f"hello, {request.name}")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def answer(
    ca: Ca, request: registry_pb2.HeartbeatRequest, renew_after: float = 40.0, bundle: bytes | None = None
) -> registry_pb2.HeartbeatResponse:
    """What kplug answers a heartbeat that carries a signing request."""
    return registry_pb2.HeartbeatResponse(
        accepted=True,
        certificate_chain=ca.sign_request(request.certificate_request).decode(),
        trust_bundle=(bundle or ca.pem).decode(),
        certificate_renew_after=duration_pb2.Duration(seconds=int(renew_after), nanos=int(renew_after % 1 * 1e9)),
    )


def stamped(held: IssuedIdentity) -> registry_pb2.HeartbeatRequest:
    request = registry_pb2.HeartbeatRequest(name="hello-id")
    held.stamp(request)
    return request


def test_the_request_names_exactly_the_identity_with_a_p256_key() -> None:
    held = IssuedIdentity("hello-id")
    assert held.name == identity("hello-id") == "hello-id.plugins.kplug.io"
    csr = x509.load_der_x509_csr(held.request)
    assert csr.is_signature_valid
    key = csr.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1"
    names = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert list(names) == [x509.DNSName("hello-id.plugins.kplug.io")]
    assert [extension.oid for extension in csr.extensions] == [x509.oid.ExtensionOID.SUBJECT_ALTERNATIVE_NAME]
    # One key for the process's life: every renewal asks for the same.
    assert stamped(held).certificate_request == held.request


def test_a_plugin_name_of_63_characters_fits_its_request_and_placeholder() -> None:
    # An identity over 64 characters cannot be a common name (X.509's bound):
    # the request names it only as the DNS name kplug reads.
    name = "database-table-postgresql-plugin-" + "x" * 30
    held = IssuedIdentity(name)
    csr = x509.load_der_x509_csr(held.request)
    assert list(csr.subject) == []
    names = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert list(names) == [x509.DNSName(f"{name}.plugins.kplug.io")]
    assert held._self_signed() is not None


def test_a_request_is_due_until_a_certificate_comes_then_at_its_renewal_time() -> None:
    ca, clock = Ca(), Clock()
    held = IssuedIdentity("hello-id", clock=clock)
    request = stamped(held)
    assert request.certificate_request == held.request
    assert request.trust_bundle_sha256 == b""

    assert held.take(answer(ca, request, renew_after=40.0))
    digest = hashlib.sha256(ca.pem).digest()
    request = stamped(held)
    assert (request.certificate_request, request.trust_bundle_sha256) == (b"", digest)

    clock.now += 39.9
    assert stamped(held).certificate_request == b""
    clock.now += 0.1
    request = stamped(held)
    assert (request.certificate_request, request.trust_bundle_sha256) == (held.request, digest)
    # Renewed: not due again until the new renewal time.
    assert held.take(answer(ca, request, renew_after=40.0))
    assert stamped(held).certificate_request == b""


def test_taking_a_certificate_and_then_a_new_bundle() -> None:
    ca, other = Ca(), Ca("the next plugin CA")
    held = IssuedIdentity("hello-id")
    fetch = held._fetcher()
    assert held.take(registry_pb2.HeartbeatResponse(accepted=True)) is False
    # A bundle without a certificate: nothing to serve with it yet.
    assert held.take(registry_pb2.HeartbeatResponse(trust_bundle=ca.pem.decode())) is False
    assert held.held is None and fetch() is None

    assert held.take(answer(ca, stamped(held)))
    first = held.held
    assert first is not None and first.bundle == ca.pem.decode()
    assert x509.load_pem_x509_certificate(first.chain.encode()).subject == x509.load_der_x509_csr(held.request).subject
    assert fetch() is first.configuration
    assert fetch() is None, "unchanged until something new is taken"

    # kplug's CA rotation: a bundle with both CAs, the certificate kept.
    both = ca.pem + other.pem
    assert held.take(registry_pb2.HeartbeatResponse(accepted=True, trust_bundle=both.decode()))
    second = held.held
    assert second is not None
    assert (second.chain, second.renew_at) == (first.chain, first.renew_at)
    assert (second.bundle, second.bundle_sha256) == (both.decode(), hashlib.sha256(both).digest())
    assert fetch() is second.configuration


def test_what_cannot_be_used_is_refused_and_the_certificate_held_stays() -> None:
    ca = Ca()
    held = IssuedIdentity("hello-id")
    request = stamped(held)
    good = answer(ca, request)
    no_renewal = registry_pb2.HeartbeatResponse()
    no_renewal.CopyFrom(good)
    no_renewal.ClearField("certificate_renew_after")
    no_bundle = registry_pb2.HeartbeatResponse()
    no_bundle.CopyFrom(good)
    no_bundle.trust_bundle = ""
    garbage = registry_pb2.HeartbeatResponse()
    garbage.CopyFrom(good)
    garbage.certificate_chain = "not PEM"
    bad_bundle = registry_pb2.HeartbeatResponse()
    bad_bundle.CopyFrom(good)
    bad_bundle.trust_bundle = "not PEM"
    someone_else = registry_pb2.HeartbeatResponse()
    someone_else.CopyFrom(good)
    someone_else.certificate_chain = ca.sign_request(IssuedIdentity("hello-id").request).decode()
    for reply, problem in [
        (no_renewal, "without certificate_renew_after"),
        (no_bundle, "without its trust bundle"),
        (garbage, "the certificate kplug sent does not load"),
        (bad_bundle, "the trust bundle kplug sent does not load"),
        (someone_else, "not for this instance's key"),
    ]:
        with pytest.raises(IdentityError, match=problem):
            held.take(reply)
        assert held.held is None
        assert held.refusal is not None and problem in held.refusal
    assert held.take(good)
    kept = held.held
    assert held.refusal is None
    with pytest.raises(IdentityError, match="does not load"):
        held.take(garbage)
    assert held.held is kept


def test_refusals_end_the_wait_for_the_first_certificate() -> None:
    held = IssuedIdentity("hello-id")
    held.refused(grpc.StatusCode.UNAVAILABLE, "connection refused")
    assert held.refusal is None and not held.wait(0.01)
    held.refused(grpc.StatusCode.FAILED_PRECONDITION, "this kplug does not sign plugin certificates")
    assert held.refusal == (
        "kplug failed the heartbeat that asked for a certificate (FAILED_PRECONDITION): "
        "this kplug does not sign plugin certificates"
    )
    assert not held.wait(10.0), "returns at once"


def test_without_cryptography_it_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, registry: FakeRegistry, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "cryptography", None)
    with pytest.raises(IdentityError, match=r"needs the cryptography package .*: pip install 'kplug\[identity\]'"):
        IssuedIdentity("hello-id")
    with pytest.raises(kplug.ServeError, match="python3-cryptography"):
        kplug.serve(Hello(), identity_config(registry, tmp_path))
    assert registry.heartbeats == []


# --- configuration -----------------------------------------------------------


def parse(argv: list[str], environ: dict[str, str] | None = None) -> kplug.Config:
    environ = environ or {}
    parser = argparse.ArgumentParser()
    add_arguments(parser, environ)
    return from_arguments(parser.parse_args(argv), environ)


CLUSTER = ["--registry=https://kplug.kplug-system.svc:50051", "--registry-ca-file=ca.crt", "--token-file=token"]


def test_the_flag_and_its_variable() -> None:
    assert parse(CLUSTER).issued_identity is False
    assert parse([*CLUSTER, "--issued-identity"]).issued_identity is True
    assert parse(CLUSTER, {"KPLUG_ISSUED_IDENTITY": "true"}).issued_identity is True
    assert parse(CLUSTER, {"KPLUG_ISSUED_IDENTITY": "false"}).issued_identity is False
    with pytest.raises(ValueError, match="KPLUG_ISSUED_IDENTITY: 'maybe' is not a boolean"):
        parse(CLUSTER, {"KPLUG_ISSUED_IDENTITY": "maybe"})


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (
            ["--registry=http://127.0.0.1:50051", "--token-file=token"],
            "asks kplug in cluster mode for a certificate: the registry must be https://",
        ),
        (CLUSTER[:2], "is granted to the plugin's ServiceAccount: set --token-file (KPLUG_TOKEN_FILE)"),
        (
            [*CLUSTER, "--tls-cert-file=tls.crt", "--tls-key-file=tls.key", "--client-ca-file=ca.crt"],
            "replaces --tls-cert-file, --tls-key-file and --client-ca-file: drop them",
        ),
        (
            [*CLUSTER, "--tls-cert-file=tls.crt"],
            "replaces --tls-cert-file, --tls-key-file and --client-ca-file: drop them",
        ),
        (
            [*CLUSTER, "--client-ca-file=ca.crt"],
            "replaces --tls-cert-file, --tls-key-file and --client-ca-file: drop them",
        ),
        (
            [*CLUSTER, "--allow-unauthenticated-clients"],
            "accepts only kplug's client certificate: drop --allow-unauthenticated-clients",
        ),
        (
            [*CLUSTER, "--server-name=hello.plugins.svc"],
            "certifies NAME.plugins.kplug.io, the name kplug verifies: drop --server-name",
        ),
    ],
)
def test_what_the_identity_excludes(argv: list[str], problem: str) -> None:
    want = f"--issued-identity (KPLUG_ISSUED_IDENTITY) {problem}"
    with pytest.raises(ValueError) as raised:
        parse([*argv, "--issued-identity"])
    assert str(raised.value) == want
    with pytest.raises(ValueError) as raised:
        kplug.serve(Hello(), _config_of(argv))
    assert str(raised.value) == want


def _config_of(argv: list[str]) -> kplug.Config:
    """The config of ``argv`` with the identity, unchecked."""
    parser = argparse.ArgumentParser()
    add_arguments(parser, {})
    args = parser.parse_args(argv)
    return kplug.Config(
        registry=args.registry,
        registry_ca_file=args.registry_ca_file,
        token_file=args.token_file,
        tls_cert_file=args.tls_cert_file,
        tls_key_file=args.tls_key_file,
        client_ca_file=args.client_ca_file,
        allow_unauthenticated_clients=bool(args.allow_unauthenticated_clients),
        server_name=args.server_name,
        issued_identity=True,
        listen="127.0.0.1:0",
    )


# --- serving -------------------------------------------------------------------


class Signer:
    """Answers heartbeats as kplug with a plugin CA does: accepts, signs the request with
    ``ca`` and sends the bundle with a certificate or when the digest differs."""

    def __init__(self, registry: FakeRegistry, ca: Ca) -> None:
        self.registry = registry
        self.ca = ca
        #: The certificate_renew_after of the next certificates.
        self.renew_after = 40.0

    def __call__(self, request: registry_pb2.HeartbeatRequest) -> registry_pb2.HeartbeatResponse:
        reply = self.registry.accept(request)
        if request.certificate_request:
            reply.MergeFrom(answer(self.ca, request, renew_after=self.renew_after))
        elif request.trust_bundle_sha256 != hashlib.sha256(self.ca.pem).digest():
            reply.trust_bundle = self.ca.pem.decode()
        return reply


@pytest.fixture
def plugin_ca() -> Ca:
    """kplug's plugin CA: signs the plugin's certificate and kplug's client certificate."""
    return Ca("kplug plugin CA")


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[FakeRegistry]:
    """A TLS registry asking for heartbeats every 0.2 s, its CA in tmp_path/registry-ca.crt and
    its token in tmp_path/token."""
    pki = make_pki()
    (tmp_path / "registry-ca.crt").write_bytes(pki.ca)
    (tmp_path / "token").write_text("token-a")
    with FakeRegistry(interval=0.2, tls=pki.tls, tokens=["token-a"]) as fake:
        yield fake


@pytest.fixture
def signer(registry: FakeRegistry, plugin_ca: Ca) -> Signer:
    """Makes ``registry`` sign with ``plugin_ca``."""
    signer = Signer(registry, plugin_ca)
    registry.answer = signer
    return signer


def identity_config(registry: FakeRegistry, tmp_path: Path) -> kplug.Config:
    return kplug.Config(
        registry=registry.url,
        registry_ca_file=str(tmp_path / "registry-ca.crt"),
        token_file=str(tmp_path / "token"),
        listen="127.0.0.1:0",
        drain_timeout=2.0,
        issued_identity=True,
    )


def client(server: kplug.Server, ca: Ca, *, certificate: bool = True) -> PluginClient:
    """A client as kplug's: trusting ``ca`` for the identity, with a client certificate of ``ca``."""
    pair = ca.client() if certificate else None
    return PluginClient(
        server.address,
        root_certificates=ca.pem,
        private_key=pair.key if pair else None,
        certificate_chain=pair.cert if pair else None,
        server_name="hello-id.plugins.kplug.io",
    )


def greeted(outcome: kplug.Outcome) -> str:
    return outcome.results[0].message


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout}s"
        time.sleep(0.05)


def test_serves_the_issued_identity_to_kplug_only_and_renews_it(
    registry: FakeRegistry, signer: Signer, plugin_ca: Ca, tmp_path: Path
) -> None:
    signer.renew_after = 1.0
    with kplug.serve(Hello(), identity_config(registry, tmp_path)) as server:
        # serve() returned: the first heartbeat brought the certificate.
        first = registry.heartbeats[0].request
        assert first.server_name == "hello-id.plugins.kplug.io"
        assert first.certificate_request and first.trust_bundle_sha256 == b""
        with client(server, plugin_ca) as kplug_client:
            assert greeted(kplug_client.reconcile(GREETING, timeout=5)) == "hello, ada"
        for caller in (client(server, plugin_ca, certificate=False), client(server, Ca("another CA"))):
            with caller, pytest.raises(grpc.RpcError):
                caller.reconcile(GREETING, timeout=5)

        # Renewed after a second: the request again, only the digest in between.
        signer.renew_after = 3600.0
        wait_until(lambda: sum(1 for h in registry.heartbeats if h.request.certificate_request) >= 2)
        heartbeats = registry.heartbeats
        digest = hashlib.sha256(plugin_ca.pem).digest()
        assert all(h.request.trust_bundle_sha256 == digest for h in heartbeats[1:])
        assert not heartbeats[1].request.certificate_request
        with client(server, plugin_ca) as kplug_client:
            assert greeted(kplug_client.reconcile(GREETING, timeout=5)) == "hello, ada"


def test_a_refused_request_fails_serving_at_once(registry: FakeRegistry, tmp_path: Path) -> None:
    refusal = "this kplug does not sign plugin certificates (it runs without --plugin-signing-cert-file)"
    registry.answer = lambda request: (grpc.StatusCode.FAILED_PRECONDITION, refusal)
    started = time.monotonic()
    with pytest.raises(kplug.ServeError) as raised:
        kplug.serve(Hello(), identity_config(registry, tmp_path))
    assert time.monotonic() - started < 5
    assert str(raised.value) == (
        "cannot serve the identity hello-id.plugins.kplug.io: kplug failed the heartbeat that asked for a "
        f"certificate (FAILED_PRECONDITION): {refusal}"
    )
    assert registry.wait_for_deregistration().name == "hello-id"


def test_sigterm_while_waiting_for_the_certificate_ends_the_process_at_once(
    registry: FakeRegistry, tmp_path: Path
) -> None:
    # The default answer: a kplug that ignores the request, so the plugin waits.
    argv = [
        str(Path(__file__).with_name("sleepy_plugin.py")),
        *("--registry", registry.url, "--registry-ca-file", str(tmp_path / "registry-ca.crt")),
        *("--token-file", str(tmp_path / "token"), "--listen", "127.0.0.1:0", "--issued-identity"),
    ]
    with PluginProcess(argv, tmp_path / "plugin.log") as plugin:
        assert registry.wait_for_heartbeats(1)[0].request.certificate_request
        plugin.send_signal(signal.SIGTERM)
        assert plugin.wait(timeout=5) == 0, plugin.stderr
    assert registry.wait_for_deregistration(timeout=0).name == "sleepy"
    assert "received SIGTERM: stopped while waiting for kplug to sign the certificate of sleepy.plugins.kplug.io" in (
        plugin.stderr
    )


def test_no_certificate_in_time_fails_serving(
    registry: FakeRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kplug.identity, "FIRST_CERTIFICATE_TIMEOUT", 0.5)
    # The default answer: a kplug that ignores the request.
    with pytest.raises(kplug.ServeError, match="kplug signed no certificate within 0.5s") as raised:
        kplug.serve(Hello(), identity_config(registry, tmp_path))
    assert "kplug accepted the heartbeats but sent no certificate" in str(raised.value)
