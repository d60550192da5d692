"""Reconcile and Finalize over real gRPC: JSON, errors, deadlines, health, serving."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import kplug
from kplug.proto import plugin_pb2
from kplug.testing import PluginClient, request

Serve = Callable[..., kplug.Server]
ClientFor = Callable[[kplug.Server], PluginClient]


class Recorder(kplug.Plugin):
    """Answers with whatever ``respond`` returns and remembers the requests it saw."""

    name = "recorder"
    api = "things.example.com/v1"
    implementation = "Recorder"
    version = "1.2.3"

    def __init__(self, respond: Callable[[kplug.Request], kplug.Outcome] | None = None) -> None:
        self.respond = respond or (lambda req: kplug.Outcome.success())
        self.requests: list[kplug.Request] = []

    def reconcile(self, request: kplug.Request) -> kplug.Outcome:
        self.requests.append(request)
        return self.respond(request)

    def finalize(self, request: kplug.Request) -> kplug.Outcome:
        self.requests.append(request)
        return self.respond(request)


class Minimal(kplug.Plugin):
    name = "minimal"
    api = "things.example.com/v1"

    def reconcile(self, request: kplug.Request) -> kplug.Outcome:
        return kplug.Outcome.success("Reconciled")


TRICKY_OBJECT = {
    "apiVersion": "things.example.com/v1",
    "kind": "Thing",
    "metadata": {"name": "tricky", "labels": {}},
    "spec": {
        "big": 2**70,
        "negative": -(2**65),
        "uint64max": 18446744073709551615,
        "float": 0.1,
        "huge": 1e300,
        "null": None,
        "nested": {"list": [1, [2, [3, {"deep": None}]], {}, []], "empty": {}},
        "unicode": "grüße, 世界, \u2028",
        "bool": True,
    },
}


def echo(req: kplug.Request) -> kplug.Outcome:
    outcome = kplug.Outcome.success("Echoed", req.operation_id, object_status=req.object, requeue_after=300.5)
    for extension in req.extensions:
        outcome.set_extension_status(extension, extension["spec"])
    return outcome


def test_json_round_trip_is_lossless(serve: Serve, client_for: ClientFor) -> None:
    plugin = Recorder(echo)
    client = client_for(serve(plugin))
    extension = {
        "apiVersion": "ext.example.com/v1",
        "kind": "ThingExtension",
        "metadata": {"name": "tricky", "namespace": "apps"},
        "spec": {"count": 2**64, "none": None},
    }
    outcome = client.reconcile(TRICKY_OBJECT, [extension], operation_id="op-42")

    assert plugin.requests[0].object == TRICKY_OBJECT
    assert plugin.requests[0].extensions == [extension]
    assert outcome.succeeded
    assert outcome.object_status == TRICKY_OBJECT
    assert outcome.extension_statuses == [
        (kplug.ObjectRef("ext.example.com/v1", "ThingExtension", "tricky", "apps"), {"count": 2**64, "none": None})
    ]
    assert outcome.results == [kplug.Result("Echoed", "op-42")]
    assert outcome.requeue_after == pytest.approx(300.5)


def test_request_fields(serve: Serve, client_for: ClientFor) -> None:
    plugin = Recorder()
    client = client_for(serve(plugin))
    client.reconcile(TRICKY_OBJECT, operation_id="op-1", timeout=20)
    client.finalize(TRICKY_OBJECT, dry_run=True, operation_id="op-2", timeout=20)

    reconcile, finalize = plugin.requests
    assert (reconcile.operation, reconcile.operation_id, reconcile.dry_run) == (
        kplug.Operation.RECONCILE,
        "op-1",
        False,
    )
    assert (finalize.operation, finalize.operation_id, finalize.dry_run) == (kplug.Operation.FINALIZE, "op-2", True)
    assert reconcile.timeout == pytest.approx(20)
    assert reconcile.deadline is not None
    assert reconcile.extensions == []


def test_the_caller_reaches_the_plugin(serve: Serve, client_for: ClientFor) -> None:
    plugin = Recorder()
    client = client_for(serve(plugin))
    message = request(TRICKY_OBJECT)
    message.caller.username = "system:serviceaccount:team-a:operator"
    message.caller.groups.extend(["system:serviceaccounts", "system:authenticated"])
    message.caller.extra["authentication.kubernetes.io/pod-name"].values.append("operator-0")
    client.call(kplug.Operation.RECONCILE, message)
    client.reconcile(TRICKY_OBJECT)

    told, untold = plugin.requests
    assert told.caller == kplug.Caller(
        username="system:serviceaccount:team-a:operator",
        groups=("system:serviceaccounts", "system:authenticated"),
        extra={"authentication.kubernetes.io/pod-name": ("operator-0",)},
    )
    # From a kplug that predates the field.
    assert untold.caller is None


def test_children_cross_the_wire_both_ways(serve: Serve, client_for: ClientFor) -> None:
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}}

    def respond(req: kplug.Request) -> kplug.Outcome:
        live = req.observed_child("web") or {}
        available = (live.get("status") or {}).get("availableReplicas", 0) > 0
        return (
            kplug.Outcome.success()
            .add_child("site", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "site"}})
            .add_child("web", deployment, ready=available, wave=1)
        )

    plugin = Recorder(respond)
    client = client_for(serve(plugin))
    message = request(TRICKY_OBJECT)
    message.observed_children.add(key="web", object=b'{"kind":"Deployment","status":{"availableReplicas":2}}')
    raw = client.stub.Reconcile(message, timeout=10)
    assert [(c.key, c.ready, c.wave) for c in raw.desired_children] == [
        ("site", plugin_pb2.READINESS_UNSPECIFIED, 0),
        ("web", plugin_pb2.READINESS_READY, 1),
    ]
    assert raw.desired_children[1].object == b'{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web"}}'
    assert plugin.requests[0].observed_children == {"web": {"kind": "Deployment", "status": {"availableReplicas": 2}}}

    # Nothing observed: the verdict follows, and the client reads it back.
    outcome = client.reconcile(TRICKY_OBJECT)
    assert outcome.child("web") == kplug.Child("web", deployment, ready=False, wave=1)
    assert plugin.requests[1].observed_child("web") is None

    bad = request(TRICKY_OBJECT)
    bad.observed_children.add(key="web", object=b"[1]")
    with pytest.raises(grpc.RpcError) as error:
        client.call(kplug.Operation.RECONCILE, bad)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "observedChildren[0].object must be a JSON object" in (error.value.details() or "")


def test_deadline_is_the_earlier_of_timeout_and_grpc_deadline(serve: Serve, client_for: ClientFor) -> None:
    remaining: list[float | None] = []

    def respond(req: kplug.Request) -> kplug.Outcome:
        remaining.append(req.time_remaining())
        return kplug.Outcome.success()

    client = client_for(serve(Recorder(respond)))
    # Deadlines 10 s apart, so that a call delayed by seconds on a busy
    # machine still tells them apart; the plugin answers at once either way.
    # The request says 20 s, the RPC allows 200 s: 20 s it is.
    client.call(kplug.Operation.RECONCILE, request(TRICKY_OBJECT, timeout=20), timeout=200)
    # The request says 60 s, the RPC allows 30 s: 30 s it is.
    client.call(kplug.Operation.RECONCILE, request(TRICKY_OBJECT, timeout=60), timeout=30)
    # No timeout in the request: the RPC's.
    client.call(kplug.Operation.RECONCILE, request(TRICKY_OBJECT, timeout=None), timeout=40)
    # gRPC rounds the deadline it propagates up a little.
    first, second, third = remaining
    assert first is not None and 10 < first <= 20
    assert second is not None and 20 < second <= 30.1
    assert third is not None and 30 < third <= 40.1


def test_requests_past_their_deadline_are_not_handled(serve: Serve, client_for: ClientFor) -> None:
    plugin = Recorder()
    client = client_for(serve(plugin))
    with pytest.raises(grpc.RpcError) as error:
        client.call(kplug.Operation.RECONCILE, request(TRICKY_OBJECT, timeout=1e-9), timeout=10)
    assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "arrived after its deadline" in (error.value.details() or "")
    assert plugin.requests == []


def test_outcome_reaches_the_wire(serve: Serve, client_for: ClientFor) -> None:
    def respond(req: kplug.Request) -> kplug.Outcome:
        return (
            kplug.Outcome.failure("TableLocked", "try later", requeue_after=0.25)
            .add_result("Slow", "it took a while", kplug.Severity.WARNING)
            .add_condition("Synced", False, "TableLocked", "try later")
        )

    client = client_for(serve(Recorder(respond)))
    raw = client.stub.Reconcile(request(TRICKY_OBJECT), timeout=10)
    assert raw.success is False
    assert [(r.severity, r.reason, r.message) for r in raw.results] == [
        (plugin_pb2.SEVERITY_ERROR, "TableLocked", "try later"),
        (plugin_pb2.SEVERITY_WARNING, "Slow", "it took a while"),
    ]
    assert [(c.type, c.status, c.reason) for c in raw.conditions] == [("Synced", "False", "TableLocked")]
    assert raw.object_status == b""
    assert raw.HasField("requeue_after")
    assert (raw.requeue_after.seconds, raw.requeue_after.nanos) == (0, 250_000_000)


def test_no_requeue_and_no_status_stay_unset(serve: Serve, client_for: ClientFor) -> None:
    client = client_for(serve(Minimal()))
    raw = client.stub.Reconcile(request(TRICKY_OBJECT), timeout=10)
    assert raw.success
    assert not raw.HasField("requeue_after")
    assert raw.object_status == b""


def test_default_finalize_succeeds(serve: Serve, client_for: ClientFor) -> None:
    outcome = client_for(serve(Minimal())).finalize(TRICKY_OBJECT)
    assert outcome.succeeded and outcome.results == []


@pytest.mark.parametrize(
    ("object_json", "extensions", "message"),
    [
        (b"{not json", [], "object is not valid JSON"),
        (b"", [], "object is empty"),
        (b"[1, 2]", [], "object must be a JSON object"),
        (b'{"a": NaN}', [], "NaN"),
        (b'{"a": "\xff"}', [], "not UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, [], "object is nested too deeply"),
        (b"{}", [b"{}", b"nope"], "extensions[1] is not valid JSON"),
    ],
)
def test_invalid_json_is_rejected_before_the_plugin(
    serve: Serve, client_for: ClientFor, object_json: bytes, extensions: list[bytes], message: str
) -> None:
    plugin = Recorder()
    client = client_for(serve(plugin))
    bad = plugin_pb2.ReconcileRequest(operation_id="bad", object=object_json, extensions=extensions)
    for method in (client.stub.Reconcile, client.stub.Finalize):
        with pytest.raises(grpc.RpcError) as error:
            method(bad, timeout=10)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in (error.value.details() or "")
    assert plugin.requests == []


def test_exceptions_become_internal_errors_and_the_server_keeps_serving(
    serve: Serve, client_for: ClientFor, caplog: pytest.LogCaptureFixture
) -> None:
    def respond(req: kplug.Request) -> kplug.Outcome:
        if req.spec.get("explode"):
            raise RuntimeError("the table is on fire")
        return kplug.Outcome.success("Fine")

    client = client_for(serve(Recorder(respond)))
    with pytest.raises(grpc.RpcError) as error:
        client.reconcile({"kind": "Thing", "metadata": {"name": "x"}, "spec": {"explode": True}})
    assert error.value.code() == grpc.StatusCode.INTERNAL
    assert "RuntimeError: the table is on fire" in (error.value.details() or "")
    assert "Traceback" in caplog.text and "the table is on fire" in caplog.text

    assert client.reconcile({"kind": "Thing", "metadata": {"name": "x"}, "spec": {}}).result("Fine")


@pytest.mark.parametrize(
    ("respond", "message"),
    [
        (lambda req: "done", "reconcile() returned str, not kplug.Outcome"),
        (lambda req: kplug.Outcome.success(object_status={"ids": {1, 2}}), "object_status is not JSON"),
        (lambda req: kplug.Outcome.success(object_status={"x": float("nan")}), "object_status is not JSON"),
        (lambda req: kplug.Outcome.success(requeue_after=-1), "non-negative"),
    ],
)
def test_outcomes_that_do_not_fit_the_wire_are_internal_errors(
    serve: Serve, client_for: ClientFor, respond: Callable[[kplug.Request], object], message: str
) -> None:
    client = client_for(serve(Recorder(respond)))  # type: ignore[arg-type]
    with pytest.raises(grpc.RpcError) as error:
        client.reconcile(TRICKY_OBJECT)
    assert error.value.code() == grpc.StatusCode.INTERNAL
    assert message in (error.value.details() or "")


def test_calls_run_concurrently(serve: Serve, client_for: ClientFor) -> None:
    both_inside = threading.Barrier(2, timeout=5)

    def respond(req: kplug.Request) -> kplug.Outcome:
        both_inside.wait()  # breaks (raises) unless two calls are inside at once
        return kplug.Outcome.success()

    client = client_for(serve(Recorder(respond)))
    outcomes: list[kplug.Outcome] = []
    threads = [threading.Thread(target=lambda: outcomes.append(client.reconcile(TRICKY_OBJECT))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert [o.succeeded for o in outcomes] == [True, True]


def test_health_reports_serving(serve: Serve, client_for: ClientFor) -> None:
    client = client_for(serve(Minimal()))
    health = health_pb2_grpc.HealthStub(client.channel)
    for service in ("", "kplug.v1alpha1.Plugin"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_port_zero_advertises_the_bound_port(serve: Serve) -> None:
    server = serve(Minimal())
    assert server.port > 0
    assert server.address == f"127.0.0.1:{server.port}"
    elsewhere = serve(Minimal(), listen="0.0.0.0:0", advertise="minimal.plugins.svc")
    assert elsewhere.address == f"minimal.plugins.svc:{elsewhere.port}"


def test_a_taken_port_is_an_error(serve: Serve) -> None:
    taken = serve(Minimal()).port
    with pytest.raises(kplug.ServeError, match=f"127.0.0.1:{taken}"):
        kplug.serve(Minimal(), kplug.Config(registry=None, listen=f"127.0.0.1:{taken}"))


def test_invalid_declarations_are_refused_before_serving() -> None:
    class Nameless(Minimal):
        name = ""

    class BadApi(Minimal):
        api = "things"

    with pytest.raises(ValueError, match="RFC 1123"):
        kplug.serve(Nameless(), kplug.Config(registry=None, listen="127.0.0.1:0"))
    with pytest.raises(ValueError, match="resource.group/version"):
        kplug.serve(BadApi(), kplug.Config(registry=None, listen="127.0.0.1:0"))


def test_stop_drains_in_flight_calls(serve: Serve, client_for: ClientFor) -> None:
    inside = threading.Event()

    def slow(req: kplug.Request) -> kplug.Outcome:
        inside.set()
        time.sleep(0.5)
        return kplug.Outcome.success("Finished")

    server = serve(Recorder(slow))
    client = client_for(server)
    outcomes: list[kplug.Outcome] = []
    call = threading.Thread(target=lambda: outcomes.append(client.reconcile(TRICKY_OBJECT)))
    call.start()
    assert inside.wait(5)
    server.stop(drain_timeout=5)
    call.join(5)
    assert outcomes and outcomes[0].result("Finished")
    with pytest.raises(grpc.RpcError) as error:
        client.reconcile(TRICKY_OBJECT, timeout=2)
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE


def test_serving_locally_writes_the_address_and_heartbeats_nowhere(tmp_path: Path) -> None:
    # As kubectl kplug render starts a plugin: the registry and TLS settings it inherits are not used.
    address_file = tmp_path / "address"
    config = kplug.Config(
        registry="https://kplug.kplug-system.svc:8444",
        listen="127.0.0.1:0",
        tls_cert_file="/nonexistent/tls.crt",
        tls_key_file="/nonexistent/tls.key",
        local_address_file=str(address_file),
    )
    with kplug.serve(Minimal(), config) as server:
        assert address_file.read_text() == f"127.0.0.1:{server.port}"
        assert server.heartbeat_status is None
