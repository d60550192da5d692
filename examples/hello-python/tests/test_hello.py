"""The hello plugin, in-process over real gRPC and as a process of its own."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import kplug
from kplug.testing import FakeRegistry, PluginClient, PluginProcess

HELLO = Path(__file__).resolve().parent.parent / "hello.py"
WORLD = {"apiVersion": "example.com/v1", "kind": "Greeting", "metadata": {"name": "world", "namespace": "default"}}
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


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


def test_reports_the_trace_id_it_was_called_with_when_asked() -> None:
    hello = load_hello()
    config = kplug.Config(registry=None, listen="127.0.0.1:0")
    with kplug.serve(hello.Hello(), config) as server, PluginClient(server.address) as client:
        assert client.reconcile(WORLD, traceparent=TRACEPARENT).object_status == {"greeting": "hello, world"}
    reporting = hello.Hello()
    reporting.report_trace_id = True
    with kplug.serve(reporting, config) as server, PluginClient(server.address) as client:
        traced = client.reconcile(WORLD, traceparent=TRACEPARENT)
        assert traced.object_status == {"greeting": "hello, world", "traceID": TRACE_ID}
        # An invalid trace context is no trace context.
        assert client.reconcile(WORLD, traceparent=TRACEPARENT.upper()).object_status == {"greeting": "hello, world"}


def test_runs_registers_and_stops_on_sigterm(tmp_path: Path) -> None:
    with FakeRegistry() as registry, PluginProcess(
        [str(HELLO), "--registry", registry.address, "--listen", "127.0.0.1:0", "--report-trace-id"],
        tmp_path / "hello.log",
    ) as process:
        heartbeat = registry.wait_for_heartbeats(1).pop().request
        assert (heartbeat.name, heartbeat.implementation, heartbeat.version) == ("hello-python", "Hello", "0.1.0")
        assert (heartbeat.api.group, heartbeat.api.resource, heartbeat.api.version) == (
            "example.com",
            "greetings",
            "v1",
        )
        with PluginClient(heartbeat.address) as client:
            assert client.reconcile(WORLD).object_status == {"greeting": "hello, world"}
            traced = client.reconcile(WORLD, operation_id="op-traced", traceparent=TRACEPARENT)
            assert traced.object_status == {"greeting": "hello, world", "traceID": TRACE_ID}
        # Its line for the call, written before the answer, carries the ids.
        greetings = [line for line in process.stderr.splitlines() if line.endswith(": greeting world")]
        assert any(f"operation_id=op-traced trace_id={TRACE_ID}:" in line for line in greetings), greetings
        process.send_signal(signal.SIGTERM)
        assert process.wait() == 0, process.stderr
        assert registry.wait_for_deregistration(timeout=0).address == heartbeat.address
        assert "received SIGTERM" in process.stderr


def test_api_and_implementation_come_from_its_flags_or_environment(tmp_path: Path) -> None:
    with FakeRegistry() as registry, PluginProcess(
        [str(HELLO), "--registry", registry.address, "--listen", "127.0.0.1:0", "--api", "widgets.test.kplug.io/v2"],
        tmp_path / "hello.log",
        env={"KPLUG_IMPLEMENTATION": "FromEnvironment"},
    ):
        heartbeat = registry.wait_for_heartbeats(1).pop().request
        assert heartbeat.implementation == "FromEnvironment"
        assert (heartbeat.api.group, heartbeat.api.resource, heartbeat.api.version) == (
            "test.kplug.io",
            "widgets",
            "v2",
        )


def test_exposes_the_sdks_instance_and_tls_flags() -> None:
    result = subprocess.run(
        [sys.executable, str(HELLO), "--help"], capture_output=True, text=True, timeout=15, check=True
    )
    for flag in ["--instance", "--tls-cert-file", "--tls-key-file", "--client-ca-file", "--server-name"]:
        assert flag in result.stdout
