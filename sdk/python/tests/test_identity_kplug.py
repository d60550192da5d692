"""``--issued-identity`` against a real kplug: ``kplug-apiserver serve`` in cluster mode behind a
real kube-apiserver (hack/control-plane.sh), with a plugin CA made by ``kplug-apiserver
plugin-certs ca`` and one-minute certificates. kplug reviews the plugin's ServiceAccount token,
signs its request, calls it over mutual TLS verifying ``NAME.plugins.kplug.io``, and renews both
sides' certificates after 40 s.

Needs ``kplug-apiserver`` in cargo's target directory (``$CARGO_TARGET_DIR``, else ``target/``;
``cargo build``), etcd, kubectl and the kube-apiserver of hack/kube-build.sh: hack/test.sh has them
all; elsewhere the tests are skipped, and under CI they fail (the repository's conftest.py).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509

import kplug
from kplug.testing import PluginClient

REPO = Path(__file__).resolve().parents[3]
KPLUG = REPO / os.environ.get("CARGO_TARGET_DIR", "target") / "debug" / "kplug-apiserver"
PLUGIN = "hello-py-id"
IDENTITY = "hello-py-id.plugins.kplug.io"
GREETING = {"apiVersion": "greetings.example.com/v1", "kind": "Greeting", "metadata": {"name": "ada"}}
#: kplug renews at two thirds of this: every 40 s.
LIFETIME = "1m"
TAKEN = "certificate or trust bundle from kplug at"

pytestmark = pytest.mark.skipif(
    not KPLUG.exists() or shutil.which("etcd") is None or shutil.which("kubectl") is None,
    reason=f"needs {KPLUG} (cargo build), etcd and kubectl (hack/kube-build.sh)",
)


class Hello(kplug.Plugin):
    name = PLUGIN
    api = "greetings.example.com/v1"
    implementation = "Hello"
    version = "0.1.0"

    def reconcile(self, request: kplug.Request) -> kplug.Outcome:
        return kplug.Outcome.success("Greeted", f"hello, {request.name}")


@dataclass(frozen=True)
class ControlPlane:
    dir: Path
    env: dict[str, str]

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        done = subprocess.run(
            ["kubectl", "--kubeconfig", self.env["KUBECONFIG"], *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout


@dataclass(frozen=True)
class Kplug:
    https: int
    grpc: int
    #: kplug's serving CA (registry and API), from ``kplug-apiserver certs``.
    serving_ca: Path
    #: kplug's plugin CA, from ``kplug-apiserver plugin-certs ca``.
    plugin_ca: Path
    log: Path


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kplug-identity")


@pytest.fixture(scope="module")
def control_plane(work: Path) -> Iterator[ControlPlane]:
    script = REPO / "hack" / "control-plane.sh"
    directory = work / "cp"
    started = subprocess.run(
        [str(script), "start", str(directory)], capture_output=True, text=True, timeout=600, check=False
    )
    try:
        assert started.returncode == 0, f"hack/control-plane.sh start: {started.stderr}"
        env = {}
        for line in (directory / "env").read_text().splitlines():
            key, equals, value = line.partition("=")
            if equals and not line.startswith("#"):
                env[key.strip()] = value.strip().strip("'\"")
        cluster = ControlPlane(directory, env)
        cluster.kubectl("create", "namespace", "plugins")
        yield cluster
    finally:
        subprocess.run([str(script), "stop", str(directory)], capture_output=True, timeout=60, check=False)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def kplug_tool(*args: str) -> None:
    done = subprocess.run([str(KPLUG), *args], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"kplug-apiserver {' '.join(args)}: {done.stderr}"


@contextmanager
def running_kplug(cluster: ControlPlane, directory: Path, flags: Sequence[str]) -> Iterator[Kplug]:
    """``kplug-apiserver serve`` with the admin's kubeconfig and ``flags``, until it says it serves."""
    directory.mkdir()
    certs = directory / "certs"
    kplug_tool("certs", "--service", "kplug", "--namespace", "kplug-system", "--out-dir", str(certs))
    https, registry = free_port(), free_port()
    log = directory / "kplug.log"
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [
                str(KPLUG),
                "serve",
                f"--listen=127.0.0.1:{https}",
                f"--grpc-listen=127.0.0.1:{registry}",
                f"--tls-cert-file={certs / 'tls.crt'}",
                f"--tls-private-key-file={certs / 'tls.key'}",
                f"--kubeconfig={cluster.env['KUBECONFIG']}",
                "--authentication-cache-ttl=1s",
                "--authorization-allowed-cache-ttl=1s",
                "--min-heartbeat-interval=1s",
                *flags,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env={**os.environ, "NO_COLOR": "1"},
        )
    try:
        deadline = time.monotonic() + 30
        while "kplug is serving" not in log.read_text():
            assert process.poll() is None, f"kplug exited: {log.read_text()}"
            assert time.monotonic() < deadline, f"kplug did not serve within 30s: {log.read_text()}"
            time.sleep(0.1)
        yield Kplug(https, registry, certs / "ca.crt", directory / "plugin-ca", log)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def signing_kplug(control_plane: ControlPlane, work: Path) -> Iterator[Kplug]:
    """kplug as the plugin CA: its ca.crt is the signing certificate and the trust bundle."""
    plugin_ca = work / "signing" / "plugin-ca"
    plugin_ca.mkdir(parents=True)
    kplug_tool("plugin-certs", "--out-dir", str(plugin_ca), "ca")
    flags = [
        "--plugin-tls=required",
        f"--plugin-signing-cert-file={plugin_ca / 'ca.crt'}",
        f"--plugin-signing-key-file={plugin_ca / 'ca.key'}",
        f"--plugin-ca-file={plugin_ca / 'ca.crt'}",
        f"--plugin-cert-lifetime={LIFETIME}",
    ]
    with running_kplug(control_plane, work / "signing" / "kplug", flags) as running:
        yield Kplug(running.https, running.grpc, running.serving_ca, plugin_ca, running.log)


@pytest.fixture(scope="module")
def token_file(control_plane: ControlPlane, work: Path) -> Path:
    """A token of the ServiceAccount plugins/hello-py-id, which may heartbeat as the plugin only."""
    control_plane.kubectl("create", "serviceaccount", PLUGIN, "-n", "plugins")
    role = f"kplug:plugin:{PLUGIN}"
    control_plane.kubectl(
        "apply",
        "-f",
        "-",
        stdin=f"""apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: '{role}'}}
rules:
- {{apiGroups: [plugins.kplug.io], resources: [plugins/heartbeat], verbs: [create], resourceNames: [{PLUGIN}]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: '{role}'}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: '{role}'}}
subjects:
- {{kind: ServiceAccount, name: {PLUGIN}, namespace: plugins}}
""",
    )
    request = work / "token-request.json"
    # A token for kplug's registry, as a plugin's projected token is.
    spec = {"expirationSeconds": 3600, "audiences": ["plugins.kplug.io"]}
    request.write_text(json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}))
    answer = control_plane.kubectl(
        "create", "--raw", f"/api/v1/namespaces/plugins/serviceaccounts/{PLUGIN}/token", "-f", str(request)
    )
    path = work / f"{PLUGIN}.token"
    path.write_text(json.loads(answer)["status"]["token"])
    return path


def config(kplug_: Kplug, token_file: Path) -> kplug.Config:
    return kplug.Config(
        registry=f"https://localhost:{kplug_.grpc}",
        registry_ca_file=str(kplug_.serving_ca),
        token_file=str(token_file),
        listen="127.0.0.1:0",
        heartbeat_interval=1.0,
        drain_timeout=2.0,
        issued_identity=True,
    )


def reconcile_through_kplug(cluster: ControlPlane, kplug_: Kplug) -> str:
    """POSTs a Reconcile to kplug's API as the cluster's admin; kplug calls the plugin. The message."""
    context = ssl.create_default_context(cafile=str(kplug_.serving_ca))
    context.load_cert_chain(cluster.env["KPLUG_ADMIN_CERT"], cluster.env["KPLUG_ADMIN_KEY"])
    body = {"apiVersion": "plugins.kplug.io/v1alpha1", "kind": "Reconcile", "spec": {"object": GREETING}}
    request = urllib.request.Request(
        f"https://localhost:{kplug_.https}/apis/plugins.kplug.io/v1alpha1/plugins/{PLUGIN}/reconcile",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, context=context, timeout=20) as response:
            answer = json.load(response)
    except urllib.error.HTTPError as error:
        raise AssertionError(f"kplug answered {error.code}: {error.read().decode()}") from None
    assert answer["status"]["success"], answer
    message: str = answer["status"]["results"][0]["message"]
    return message


def served_leaf(server: kplug.Server, plugin_ca: Path) -> x509.Certificate:
    """The certificate a new connection gets, verified against the plugin CA for the identity."""
    context = ssl.create_default_context(cafile=str(plugin_ca / "ca.crt"))
    context.load_cert_chain(str(plugin_ca / "kplug-client.crt"), str(plugin_ca / "kplug-client.key"))
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=5) as connection,
        context.wrap_socket(connection, server_hostname=IDENTITY) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def direct_client(server: kplug.Server, plugin_ca: Path, identity: str | None) -> PluginClient:
    """A client of the plugin trusting the plugin CA, presenting ``identity`` (a certificate of
    ``plugin-certs``: ``kplug-client`` or ``plugins/NAME/tls``) or no certificate."""
    cert = key = None
    if identity is not None:
        cert = (plugin_ca / f"{identity}.crt").read_bytes()
        key = (plugin_ca / f"{identity}.key").read_bytes()
    return PluginClient(
        server.address,
        root_certificates=(plugin_ca / "ca.crt").read_bytes(),
        private_key=key,
        certificate_chain=cert,
        server_name=IDENTITY,
    )


@pytest.mark.timeout(300)
def test_kplug_signs_calls_over_mutual_tls_and_renews(
    control_plane: ControlPlane, signing_kplug: Kplug, token_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kplug")
    # kplug's own client certificate, and a serving one (serverAuth only), from the plugin CA.
    kplug_tool("plugin-certs", "--out-dir", str(signing_kplug.plugin_ca), "client")
    kplug_tool("plugin-certs", "--out-dir", str(signing_kplug.plugin_ca), "serving", "other.plugins.svc")

    with kplug.serve(Hello(), config(signing_kplug, token_file)) as server:
        # serve() returned: kplug signed the request of the first heartbeat.
        first = served_leaf(server, signing_kplug.plugin_ca)
        names = first.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert names.get_values_for_type(x509.DNSName) == [IDENTITY]
        assert reconcile_through_kplug(control_plane, signing_kplug) == "hello, ada"

        # Straight to the plugin: only a client certificate of the plugin CA gets in.
        with direct_client(server, signing_kplug.plugin_ca, "kplug-client") as caller:
            assert caller.reconcile(GREETING, timeout=5).results[0].message == "hello, ada"
        for identity in (None, "plugins/other.plugins.svc/tls"):
            with direct_client(server, signing_kplug.plugin_ca, identity) as caller, pytest.raises(grpc.RpcError):
                caller.reconcile(GREETING, timeout=5)

        # After 40 s the heartbeats ask again; new connections get the renewed certificate.
        deadline = time.monotonic() + 70
        while sum(TAKEN in record.getMessage() for record in caplog.records) < 2:
            assert time.monotonic() < deadline, "no renewal within 70 s"
            time.sleep(0.5)
        renewed = served_leaf(server, signing_kplug.plugin_ca)
        assert renewed.serial_number != first.serial_number
        assert renewed.not_valid_after_utc > first.not_valid_after_utc
        assert reconcile_through_kplug(control_plane, signing_kplug) == "hello, ada"
    refusals = [r.getMessage() for r in caplog.records if "cannot use what kplug" in r.getMessage()]
    assert refusals == []


@pytest.mark.timeout(120)
def test_a_kplug_without_a_plugin_ca_refuses_and_serving_fails_at_once(
    control_plane: ControlPlane, work: Path, token_file: Path
) -> None:
    with running_kplug(control_plane, work / "not-signing", []) as plain:
        started = time.monotonic()
        with pytest.raises(kplug.ServeError) as raised:
            kplug.serve(Hello(), config(plain, token_file))
        assert time.monotonic() - started < 10
    message = str(raised.value)
    assert message.startswith(
        f"cannot serve the identity {IDENTITY}: kplug failed the heartbeat that asked for a certificate "
        "(FAILED_PRECONDITION): this kplug does not sign plugin certificates"
    ), message
