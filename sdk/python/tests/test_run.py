"""``kplug.run`` as a real process: flags, env, signals, exit codes."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from plugin_calls import DrainingCall, wait_until_refused
from tls_certs import Ca, make_pki

import kplug
from kplug.testing import CAPABILITIES_BEFORE_INSTANCES, FakeRegistry, PluginClient, PluginProcess

PLUGIN = Path(__file__).with_name("sleepy_plugin.py")


Spawn = Callable[..., PluginProcess]


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawn]:
    """Starts the plugin with the given arguments (and ``env=``); killed after the test if still running."""
    processes: list[PluginProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> PluginProcess:
        log = tmp_path / f"plugin-{len(processes)}.log"
        processes.append(PluginProcess([str(PLUGIN), *args], log, env))
        return processes[-1]

    yield start
    for process in processes:
        process.stop()


def wait_for_file(path: Path, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


class InFlight:
    """A Reconcile call to the plugin that runs until :meth:`release`, on a thread of its own."""

    def __init__(self, address: str, tmp_path: Path) -> None:
        self.started = tmp_path / "started"
        self.released = tmp_path / "release"
        self.finished = tmp_path / "finished"
        self.outcomes: list[kplug.Outcome] = []
        spec = {"startedFile": str(self.started), "releaseFile": str(self.released), "finishedFile": str(self.finished)}
        self._thread = threading.Thread(target=self._call, args=(address, spec))
        self._thread.start()
        wait_for_file(self.started, "the call never reached the plugin")

    def _call(self, address: str, spec: dict[str, str]) -> None:
        with PluginClient(address) as client:
            self.outcomes.append(client.reconcile({"spec": spec}, timeout=20))

    def release(self) -> kplug.Outcome:
        self.released.touch()
        self._thread.join(20)
        assert self.outcomes, "the in-flight call did not complete"
        return self.outcomes[0]


def test_sigterm_drains_then_finishes_calls_then_deregisters(
    registry: FakeRegistry, spawn: Spawn, tmp_path: Path
) -> None:
    """(a) a draining heartbeat, calls still served; (b) no new calls, in-flight ones finish; (c) deregistration."""
    plugin = spawn("--registry", registry.address, "--listen", "127.0.0.1:0", "--instance", "sleepy-0")
    first = registry.wait_for_heartbeats(1)[0].request
    address = first.address
    assert address.startswith("127.0.0.1:") and not address.endswith(":0")
    assert (first.instance, first.draining) == ("sleepy-0", False)
    in_flight = InFlight(address, tmp_path)

    # kplug picked this instance for a call just before the draining
    # heartbeat: the call arrives while kplug answers it, and is served.
    late = DrainingCall(registry, address, {"spec": {}}, in_flight.finished.exists)
    plugin.send_signal(signal.SIGTERM)

    draining = registry.wait_for_heartbeat(lambda h: h.request.draining, timeout=5).request
    assert (draining.name, draining.instance, draining.address) == ("sleepy", "sleepy-0", address)
    assert late.noticed.wait(10)
    assert late.outcomes and late.outcomes[0].result("Slept") == kplug.Result("Slept", "hi")

    # Then it stops accepting calls, but waits for the one in flight.
    wait_until_refused(address, {"spec": {}})
    assert registry.deregistrations == [], "deregistered before the in-flight call finished"
    assert in_flight.release().result("Slept") == kplug.Result("Slept", "hi")

    assert plugin.wait() == 0  # after kplug answered the deregistration
    deregistration = registry.wait_for_deregistration(timeout=0)
    assert (deregistration.name, deregistration.address, deregistration.instance) == ("sleepy", address, "sleepy-0")
    assert late.finished_when_deregistered == [True]
    assert "received SIGTERM" in plugin.stderr


def test_sigterm_with_a_kplug_before_instances_deregisters_first_then_drains(spawn: Spawn, tmp_path: Path) -> None:
    """An older kplug ignores ``draining``: deregistering is what stops its calls, as before instances."""
    with FakeRegistry(capabilities=CAPABILITIES_BEFORE_INSTANCES) as registry:
        plugin = spawn("--registry", registry.address, "--listen", "127.0.0.1:0")
        address = registry.wait_for_heartbeats(1)[0].request.address
        in_flight = InFlight(address, tmp_path)

        plugin.send_signal(signal.SIGTERM)
        deregistration = registry.wait_for_deregistration(timeout=5)
        assert (deregistration.name, deregistration.address) == ("sleepy", address)
        assert not in_flight.finished.exists(), "deregistration must come before the drain ends"
        assert in_flight.release().result("Slept") == kplug.Result("Slept", "hi")
        assert plugin.wait() == 0
        assert [h for h in registry.heartbeats if h.request.draining] == []
        assert len(registry.deregistrations) == 1


def test_sigterm_delivered_to_another_thread_still_shuts_down(registry: FakeRegistry, spawn: Spawn) -> None:
    """The kernel hands a process's signal to any thread; the main thread must still notice it."""
    plugin = spawn("--registry", registry.address, "--listen", "127.0.0.1:0")
    address = registry.wait_for_heartbeats(1)[0].request.address
    with PluginClient(address) as client:
        assert client.reconcile({"spec": {"signalThread": True}}).result("Slept") == kplug.Result("Slept", "hi")
    assert plugin.wait() == 0, plugin.stderr
    assert "received SIGTERM" in plugin.stderr
    assert registry.wait_for_deregistration(timeout=0).name == "sleepy"


def test_sigint_and_environment_fallbacks(registry: FakeRegistry, spawn: Spawn) -> None:
    plugin = spawn(
        env={"KPLUG_REGISTRY": registry.address, "KPLUG_LISTEN": "127.0.0.1:0", "KPLUG_NAME": "sleepy-from-env"}
    )
    heartbeat = registry.wait_for_heartbeats(1)[0].request
    assert heartbeat.name == "sleepy-from-env"
    plugin.send_signal(signal.SIGINT)
    assert plugin.wait() == 0
    assert registry.wait_for_deregistration(timeout=0).name == "sleepy-from-env"
    assert "received SIGINT" in plugin.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--heartbeat-interval", "soon"], "invalid duration"),
        (["--greeting", ""], "--greeting must not be empty"),
        (["--registry", "https://kplug:50051"], "--registry-ca-file"),
        (["--tls-cert-file", "/tls.crt", "--tls-key-file", "/tls.key"], "--client-ca-file"),
        (["--no-such-flag"], "unrecognized arguments"),
    ],
)
def test_bad_flags_exit_2(spawn: Spawn, args: list[str], message: str) -> None:
    plugin = spawn("--listen", "127.0.0.1:0", *args)
    assert plugin.wait() == 2
    assert message in plugin.stderr


def test_a_plugin_that_cannot_serve_exits_1(registry: FakeRegistry, spawn: Spawn) -> None:
    with kplug.serve(PluginThatHoldsAPort(), kplug.Config(registry=None, listen="127.0.0.1:0")) as holder:
        plugin = spawn("--registry", registry.address, "--listen", f"127.0.0.1:{holder.port}")
        assert plugin.wait() == 1
    assert "cannot serve the plugin" in plugin.stderr
    assert registry.heartbeats == []


def test_help_lists_sdk_and_plugin_flags(spawn: Spawn, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(PLUGIN), "--help"], capture_output=True, text=True, timeout=15, check=True
    )
    for flag in [
        "--registry",
        "--listen",
        "--advertise",
        "--name",
        "--heartbeat-interval",
        "--drain-timeout",
        "--token-file",
        "--registry-ca-file",
        "--instance",
        "--tls-cert-file",
        "--tls-key-file",
        "--client-ca-file",
        "--allow-unauthenticated-clients",
        "--server-name",
    ]:
        assert flag in result.stdout
    assert "--greeting" in result.stdout
    assert "Naps on request." in result.stdout


class PluginThatHoldsAPort(kplug.Plugin):
    name = "holder"
    api = "ports.example.com/v1"

    def reconcile(self, request: kplug.Request) -> kplug.Outcome:
        return kplug.Outcome.success()


def test_cluster_mode_from_the_environment(spawn: Spawn, tmp_path: Path) -> None:
    """TLS and a token, configured the way a Deployment does; a refusal is logged with kplug's message."""
    pki = make_pki()
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(pki.ca)
    token_file = tmp_path / "token"
    with FakeRegistry(interval=0.3, tls=pki.tls, tokens=["token-a"]) as registry:
        plugin = spawn(
            env={
                "KPLUG_REGISTRY": registry.url,
                "KPLUG_REGISTRY_CA_FILE": str(ca_file),
                "KPLUG_TOKEN_FILE": str(token_file),
                "KPLUG_LISTEN": "127.0.0.1:0",
                # Refusals carry no interval: retried at the one asked for.
                "KPLUG_HEARTBEAT_INTERVAL": "300ms",
            }
        )
        assert registry.wait_for_heartbeats(1)[0].token is None
        token_file.write_text("token-a")
        deadline = time.monotonic() + 10
        while registry.heartbeats[-1].token != "token-a":
            assert time.monotonic() < deadline, "the token file was not reread"
            time.sleep(0.05)
        plugin.send_signal(signal.SIGTERM)
        assert plugin.wait() == 0
        assert registry.deregistration_tokens == ["token-a"]
    assert "cannot use the ServiceAccount token file" in plugin.stderr
    assert "kplug refused the heartbeat: a ServiceAccount token is required" in plugin.stderr


def test_https_without_a_ca_file_exits_2(spawn: Spawn) -> None:
    plugin = spawn("--listen", "127.0.0.1:0", env={"KPLUG_REGISTRY": "https://kplug:8444"})
    assert plugin.wait() == 2
    assert "KPLUG_REGISTRY_CA_FILE" in plugin.stderr


def test_mutual_tls_and_the_instance_from_the_environment(registry: FakeRegistry, spawn: Spawn, tmp_path: Path) -> None:
    """Serving mTLS configured the way a Deployment does: Secret files, the pod's name."""
    serving_ca, client_ca = Ca("plugin serving CA"), Ca("kplug client CA")
    serving = serving_ca.serving(dns=["sleepy.plugins.svc"], ips=[])
    kplug_client = client_ca.client("kplug")
    files = {"tls.crt": serving.cert, "tls.key": serving.key, "client-ca.crt": client_ca.pem}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    plugin = spawn(
        env={
            "KPLUG_REGISTRY": registry.address,
            "KPLUG_LISTEN": "127.0.0.1:0",
            "KPLUG_TLS_CERT_FILE": str(tmp_path / "tls.crt"),
            "KPLUG_TLS_KEY_FILE": str(tmp_path / "tls.key"),
            "KPLUG_CLIENT_CA_FILE": str(tmp_path / "client-ca.crt"),
            "KPLUG_SERVER_NAME": "sleepy.plugins.svc",
            "POD_NAME": "sleepy-7f9c-x2x9q",
        }
    )
    heartbeat = registry.wait_for_heartbeats(1)[0].request
    assert (heartbeat.instance, heartbeat.server_name) == ("sleepy-7f9c-x2x9q", "sleepy.plugins.svc")
    with PluginClient(
        heartbeat.address,
        root_certificates=serving_ca.pem,
        private_key=kplug_client.key,
        certificate_chain=kplug_client.cert,
        server_name=heartbeat.server_name,
    ) as client:
        assert client.reconcile({"spec": {}}).result("Slept") == kplug.Result("Slept", "hi")
    with PluginClient(heartbeat.address, root_certificates=serving_ca.pem, server_name="sleepy.plugins.svc") as client:
        with pytest.raises(grpc.RpcError) as refused_without_certificate:
            client.reconcile({"spec": {}}, timeout=5)
        assert refused_without_certificate.value.code() == grpc.StatusCode.UNAVAILABLE
    plugin.send_signal(signal.SIGTERM)
    assert plugin.wait() == 0
    assert registry.wait_for_deregistration(timeout=0).instance == "sleepy-7f9c-x2x9q"
    assert "TLS, client certificates of" in plugin.stderr
