"""``kplug.run`` as a real process: flags, env, signals, exit codes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tls_certs import make_pki

import kplug
from kplug.testing import FakeRegistry, PluginClient

PLUGIN = Path(__file__).with_name("sleepy_plugin.py")


class Process:
    """The plugin as a child process, its stderr in a file."""

    def __init__(self, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.log = tmp_path / "plugin.log"
        environ = {k: v for k, v in os.environ.items() if not k.startswith("KPLUG_")}
        environ.update(env or {})
        with self.log.open("wb") as log:
            self.popen = subprocess.Popen([sys.executable, str(PLUGIN), *args], stderr=log, env=environ)

    def wait(self, timeout: float = 15.0) -> int:
        return self.popen.wait(timeout)

    @property
    def stderr(self) -> str:
        return self.log.read_text()

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(5)


Spawn = Callable[..., Process]


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawn]:
    """Starts the plugin with the given arguments (and ``env=``); killed after the test if still running."""
    processes: list[Process] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Process:
        processes.append(Process(tmp_path, *args, env=env))
        return processes[-1]

    yield start
    for process in processes:
        process.kill()


def test_sigterm_deregisters_first_then_drains(registry: FakeRegistry, spawn: Spawn, tmp_path: Path) -> None:
    plugin = spawn("--registry", registry.address, "--listen", "127.0.0.1:0", "--greeting", "hello")
    address = registry.wait_for_heartbeats(1)[0].request.address
    assert address.startswith("127.0.0.1:") and not address.endswith(":0")

    started = tmp_path / "started"
    finished: list[tuple[float, kplug.Outcome]] = []

    def call() -> None:
        with PluginClient(address) as client:
            outcome = client.reconcile({"spec": {"sleep": 1.5, "startedFile": str(started)}}, timeout=10)
        finished.append((time.monotonic(), outcome))

    caller = threading.Thread(target=call)
    caller.start()
    deadline = time.monotonic() + 10
    while not started.exists():
        assert time.monotonic() < deadline, "the call never reached the plugin"
        time.sleep(0.02)

    plugin.popen.send_signal(signal.SIGTERM)
    deregistration = registry.wait_for_deregistration(timeout=5)
    deregistered_at = time.monotonic()
    caller.join(10)

    assert (deregistration.name, deregistration.address) == ("sleepy", address)
    assert finished, "the in-flight call did not complete"
    done_at, outcome = finished[0]
    assert outcome.result("Slept") == kplug.Result("Slept", "hello")
    assert deregistered_at < done_at, "deregistration must come before the drain ends"
    assert plugin.wait() == 0
    assert "received SIGTERM" in plugin.stderr


def test_sigint_and_environment_fallbacks(registry: FakeRegistry, spawn: Spawn) -> None:
    plugin = spawn(
        env={"KPLUG_REGISTRY": registry.address, "KPLUG_LISTEN": "127.0.0.1:0", "KPLUG_NAME": "sleepy-from-env"}
    )
    heartbeat = registry.wait_for_heartbeats(1)[0].request
    assert heartbeat.name == "sleepy-from-env"
    plugin.popen.send_signal(signal.SIGINT)
    assert plugin.wait() == 0
    assert registry.wait_for_deregistration(timeout=0).name == "sleepy-from-env"
    assert "received SIGINT" in plugin.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--heartbeat-interval", "soon"], "invalid duration"),
        (["--greeting", ""], "--greeting must not be empty"),
        (["--registry", "https://kplug:50051"], "--registry-ca-file"),
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
        plugin.popen.send_signal(signal.SIGTERM)
        assert plugin.wait() == 0
        assert registry.deregistration_tokens == ["token-a"]
    assert "cannot use the ServiceAccount token file" in plugin.stderr
    assert "kplug refused the heartbeat: a ServiceAccount token is required" in plugin.stderr


def test_https_without_a_ca_file_exits_2(spawn: Spawn) -> None:
    plugin = spawn("--listen", "127.0.0.1:0", env={"KPLUG_REGISTRY": "https://kplug:8444"})
    assert plugin.wait() == 2
    assert "KPLUG_REGISTRY_CA_FILE" in plugin.stderr
