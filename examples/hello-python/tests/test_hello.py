"""The hello plugin, in-process over real gRPC and as a process of its own."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import kplug
from kplug.testing import FakeRegistry, PluginClient

HELLO = Path(__file__).resolve().parent.parent / "hello.py"
WORLD = {"apiVersion": "example.com/v1", "kind": "Greeting", "metadata": {"name": "world", "namespace": "default"}}


def load_hello() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hello", HELLO)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reconcile_greets_and_finalize_says_goodbye() -> None:
    hello = load_hello()
    config = kplug.Config(registry=None, listen="127.0.0.1:0")
    with kplug.serve(hello.Hello(), config) as server, PluginClient(server.address) as client:
        greeted = client.reconcile(WORLD)
        assert greeted.succeeded
        assert greeted.results == [kplug.Result("Greeted", "hello, world")]
        assert greeted.object_status == {"greeting": "hello, world"}

        assert client.reconcile(WORLD, dry_run=True) == greeted

        goodbye = client.finalize(WORLD)
        assert goodbye.succeeded
        assert goodbye.results == [kplug.Result("Goodbye", "goodbye, world")]


def test_runs_registers_and_stops_on_sigterm(tmp_path: Path) -> None:
    log = tmp_path / "hello.log"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KPLUG_")}
    with FakeRegistry() as registry, log.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, str(HELLO), "--registry", registry.address, "--listen", "127.0.0.1:0"],
            stderr=stderr,
            env=environ,
        )
        try:
            heartbeat = registry.wait_for_heartbeats(1).pop().request
            assert (heartbeat.name, heartbeat.implementation, heartbeat.version) == ("hello-python", "Hello", "0.1.0")
            assert (heartbeat.api.group, heartbeat.api.resource, heartbeat.api.version) == (
                "example.com",
                "greetings",
                "v1",
            )
            with PluginClient(heartbeat.address) as client:
                assert client.reconcile(WORLD).object_status == {"greeting": "hello, world"}
            process.send_signal(signal.SIGTERM)
            assert process.wait(15) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(5)
        assert registry.wait_for_deregistration(timeout=0).address == heartbeat.address
    assert "received SIGTERM" in log.read_text()
