"""The W3C trace context: parsing ``traceparent``, and calls over real gRPC with and without one."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

import kplug
from kplug.logcontext import LOG_FORMAT, call_context, current_call
from kplug.testing import FakeRegistry, PluginClient, PluginProcess, request
from kplug.trace import INVALID_VERSION, MALFORMED, ZERO_ID, TraceParent, TraceParentError, parse_traceparent

Serve = Callable[..., kplug.Server]
ClientFor = Callable[[kplug.Server], PluginClient]

#: The example of the W3C specification.
EXAMPLE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
EXAMPLE_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
THING = {"apiVersion": "things.example.com/v1", "kind": "Thing", "metadata": {"name": "traced"}}

# The parser: the same cases as kplug's proto/src/trace.rs.


def test_parses_and_prints_the_specification_example() -> None:
    parsed = TraceParent.parse(EXAMPLE)
    assert parsed.trace_id == EXAMPLE_TRACE_ID
    assert parsed.parent_id == "00f067aa0ba902b7"
    assert parsed.sampled
    assert str(parsed) == EXAMPLE


def test_later_versions_may_carry_more_fields() -> None:
    parsed = TraceParent.parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-what-the-future-holds")
    assert not parsed.sampled
    assert str(parsed) == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"


def test_surrounding_blanks_are_ignored() -> None:
    assert str(TraceParent.parse(f" \t{EXAMPLE}\t ")) == EXAMPLE


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", MALFORMED),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", MALFORMED),
        ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", MALFORMED),
        ("00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", MALFORMED),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", MALFORMED),
        ("0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", MALFORMED),
        ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", INVALID_VERSION),
        ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", ZERO_ID),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", ZERO_ID),
        # Beyond the Rust cases: Python's int() and str methods must not let these through.
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-+1", MALFORMED),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x", MALFORMED),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-١٢", MALFORMED),
        ("00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", MALFORMED),
        ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x", MALFORMED),
    ],
)
def test_rejects_what_the_specification_rejects(value: str, problem: str) -> None:
    with pytest.raises(TraceParentError) as raised:
        TraceParent.parse(value)
    assert str(raised.value) == problem
    assert parse_traceparent(value) is None


def test_parse_traceparent_is_lenient() -> None:
    assert parse_traceparent(None) is None
    assert parse_traceparent(EXAMPLE) == TraceParent(EXAMPLE_TRACE_ID, "00f067aa0ba902b7", 1)


def test_request_trace_id() -> None:
    bare = kplug.Request(kplug.Operation.RECONCILE, "op-1", False, THING)
    assert (bare.traceparent, bare.trace_id) == (None, None)
    traced = kplug.Request(kplug.Operation.RECONCILE, "op-1", False, THING, traceparent=EXAMPLE)
    assert traced.trace_id == EXAMPLE_TRACE_ID


def test_the_log_context_is_set_only_within_a_call() -> None:
    assert current_call() is None
    with call_context("op-1", EXAMPLE_TRACE_ID) as ids:
        assert current_call() == ids
        record = logging.LogRecord("x", logging.INFO, __file__, 1, "inside", None, None)
        kplug.LogContextFilter().filter(record)
        assert (record.operation_id, record.trace_id) == ("op-1", EXAMPLE_TRACE_ID)
    assert current_call() is None
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "outside", None, None)
    kplug.LogContextFilter().filter(record)
    assert (record.operation_id, record.trace_id) == ("-", "-")
    # An application's own extra= fields win.
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "mine", None, None)
    record.trace_id = "mine"
    kplug.LogContextFilter().filter(record)
    assert record.trace_id == "mine"


# Served over real gRPC.


class Traced(kplug.Plugin):
    """Remembers the requests it saw, logs a line per call and answers with the trace id."""

    name = "traced"
    api = "things.example.com/v1"

    def __init__(self) -> None:
        self.requests: list[kplug.Request] = []

    def reconcile(self, request: kplug.Request) -> kplug.Outcome:
        self.requests.append(request)
        logging.getLogger("traced").info("the plugin's own line")
        return kplug.Outcome.success("Traced", object_status={"traceID": request.trace_id})

    def finalize(self, request: kplug.Request) -> kplug.Outcome:
        return self.reconcile(request)


class Records(logging.Handler):
    """Keeps every record, after :class:`kplug.LogContextFilter` ran on it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.addFilter(kplug.LogContextFilter())
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def of(self, operation_id: str) -> list[logging.LogRecord]:
        return [r for r in self.records if getattr(r, "operation_id", None) == operation_id]


def trace_ids(records: list[logging.LogRecord]) -> set[str]:
    """The ``trace_id`` attributes of ``records``."""
    return {getattr(r, "trace_id", "(none)") for r in records}


@pytest.fixture
def records() -> Iterator[Records]:
    """Every record logged during the test, through a handler with the SDK's filter."""
    handler = Records()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield handler
    root.removeHandler(handler)
    root.setLevel(level)


def test_the_plugin_sees_the_trace_context_and_its_records_carry_the_ids(
    serve: Serve, client_for: ClientFor, records: Records
) -> None:
    plugin = Traced()
    client = client_for(serve(plugin))

    outcome = client.reconcile(THING, operation_id="op-traced", traceparent=EXAMPLE)
    (seen,) = plugin.requests
    assert (seen.operation_id, seen.traceparent, seen.trace_id) == ("op-traced", EXAMPLE, EXAMPLE_TRACE_ID)
    assert outcome.object_status == {"traceID": EXAMPLE_TRACE_ID}
    # Records are emitted before the answer is sent.
    logged = records.of("op-traced")
    assert "the plugin's own line" in [r.getMessage() for r in logged]
    assert any(r.name == "kplug.service" and "succeeded" in r.getMessage() for r in logged)
    assert trace_ids(logged) == {EXAMPLE_TRACE_ID}

    # Finalize too; a later version is passed on as version 00.
    later = "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00-more-to-come"
    outcome = client.finalize(THING, operation_id="op-later", traceparent=later)
    assert plugin.requests[-1].traceparent == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
    assert outcome.object_status == {"traceID": "0af7651916cd43dd8448eb211c80319c"}
    assert trace_ids(records.of("op-later")) == {"0af7651916cd43dd8448eb211c80319c"}

    # Records outside any call have neither id.
    logging.getLogger("traced").info("after the calls")
    assert records.of("-")[-1].getMessage() == "after the calls"
    assert trace_ids(records.of("-")) == {"-"}


def test_without_a_trace_context_the_call_has_none(serve: Serve, client_for: ClientFor, records: Records) -> None:
    plugin = Traced()
    client = client_for(serve(plugin))
    outcome = client.reconcile(THING, operation_id="op-untraced")
    (seen,) = plugin.requests
    assert (seen.traceparent, seen.trace_id) == (None, None)
    assert outcome.object_status == {"traceID": None}
    logged = records.of("op-untraced")
    assert "the plugin's own line" in [r.getMessage() for r in logged]
    assert trace_ids(logged) == {"-"}


@pytest.mark.parametrize(
    "traceparent",
    [
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        f"{EXAMPLE}-extra",
        "not a traceparent",
        # (Of several traceparent values grpc-core hands on only the last.)
    ],
)
def test_an_invalid_trace_context_is_ignored_and_the_call_goes_ahead(
    serve: Serve, client_for: ClientFor, records: Records, traceparent: str
) -> None:
    plugin = Traced()
    client = client_for(serve(plugin))
    message = request(THING, operation_id="op-invalid")
    outcome = client.call(kplug.Operation.RECONCILE, message, traceparent=traceparent)
    assert outcome.succeeded
    (seen,) = plugin.requests
    assert (seen.traceparent, seen.trace_id) == (None, None)
    logged = records.of("op-invalid")
    assert any("ignoring the traceparent metadata" in r.getMessage() for r in logged)
    assert trace_ids(logged) == {"-"}


def test_a_rejected_call_is_logged_with_its_ids(serve: Serve, client_for: ClientFor, records: Records) -> None:
    client = client_for(serve(Traced()))
    message = request(THING, operation_id="op-rejected")
    message.object = b"not JSON"
    with pytest.raises(grpc.RpcError) as raised:
        client.call(kplug.Operation.RECONCILE, message, traceparent=EXAMPLE)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    (rejected,) = records.of("op-rejected")
    assert rejected.levelno == logging.WARNING
    assert trace_ids([rejected]) == {EXAMPLE_TRACE_ID}


# kplug.run's own logging, as a process.

PLUGIN = Path(__file__).with_name("sleepy_plugin.py")


def test_run_logs_the_ids_with_every_line_of_a_call(registry: FakeRegistry, tmp_path: Path) -> None:
    assert "%(operation_id)s" in LOG_FORMAT and "%(trace_id)s" in LOG_FORMAT
    args = [str(PLUGIN), "--registry", registry.address, "--listen", "127.0.0.1:0"]
    with PluginProcess(args, tmp_path / "plugin.log") as process:
        address = registry.wait_for_heartbeats(1)[0].request.address
        with PluginClient(address) as client:
            assert client.reconcile(THING, operation_id="op-run-traced", traceparent=EXAMPLE).succeeded
            assert client.reconcile(THING, operation_id="op-run-untraced").succeeded
        # The lines are written before the answers are sent.
        lines = process.stderr.splitlines()
        traced = [line for line in lines if "operation_id=op-run-traced " in line]
        untraced = [line for line in lines if "operation_id=op-run-untraced " in line]
        assert any("succeeded" in line for line in traced), lines
        assert all(f"trace_id={EXAMPLE_TRACE_ID}:" in line for line in traced), traced
        assert any("succeeded" in line for line in untraced), lines
        assert all("trace_id=-:" in line for line in untraced), untraced
        # Lines outside calls show neither id.
        assert any("operation_id=- trace_id=-:" in line for line in lines), lines
        process.send_signal(signal.SIGTERM)
        assert process.wait() == 0, process.stderr
