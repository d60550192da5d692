"""Helpers for testing plugins against real gRPC, without kplug.

:class:`FakeRegistry` is an in-process registry that records heartbeats and
can be told to refuse or fail them; :class:`PluginClient` calls a plugin the
way kplug does::

    from kplug.testing import FakeRegistry, PluginClient

    def test_greets():
        with FakeRegistry() as registry, kplug.serve(
            Hello(), kplug.Config(registry=registry.address, listen="127.0.0.1:0")
        ) as server, PluginClient(server.address) as client:
            outcome = client.reconcile({"metadata": {"name": "world"}})
            assert outcome.result("Greeted").message == "hello, world"
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import grpc

from kplug._wire import decode_outcome, encode_json, seconds_duration
from kplug.proto import PROTOCOL_VERSION, plugin_pb2, plugin_pb2_grpc, registry_pb2, registry_pb2_grpc
from kplug.types import Operation, Outcome

#: Decides the registry's answer to a heartbeat: a response, or a status code
#: to fail the call with.
Answer = Callable[[registry_pb2.HeartbeatRequest], "registry_pb2.HeartbeatResponse | grpc.StatusCode"]


@dataclass(frozen=True, slots=True)
class ReceivedHeartbeat:
    """A heartbeat the fake registry received, and when (:func:`time.monotonic`)."""

    at: float
    request: registry_pb2.HeartbeatRequest


class FakeRegistry:
    """An in-process ``kplug.v1alpha1.Registry`` for tests.

    Accepts every heartbeat unless :attr:`answer` says otherwise, asking for
    ``interval`` seconds between heartbeats. Records every heartbeat, failed
    or not, and every deregistration.
    """

    def __init__(self, *, interval: float = 10.0, ttl: float = 30.0, address: str = "127.0.0.1:0") -> None:
        self.interval = interval
        self.ttl = ttl
        #: Replaces the default answer (:meth:`accept`) when set.
        self.answer: Answer | None = None
        self._changed = threading.Condition()
        self._heartbeats: list[ReceivedHeartbeat] = []
        self._deregistrations: list[registry_pb2.DeregisterRequest] = []
        self._uids: dict[tuple[str, str], str] = {}
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fake-registry")
        self._server = grpc.server(self._executor, options=[("grpc.so_reuseport", 0)])
        registry_pb2_grpc.add_RegistryServicer_to_server(_RegistryServicer(self), self._server)
        host = address.rpartition(":")[0]
        port = self._server.add_insecure_port(address)
        #: ``host:port`` to pass as the plugin's registry.
        self.address = f"{host}:{port}"

    def start(self) -> FakeRegistry:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(None).wait()
        self._executor.shutdown(wait=False)

    def __enter__(self) -> FakeRegistry:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def heartbeats(self) -> list[ReceivedHeartbeat]:
        """Every heartbeat received so far, oldest first."""
        with self._changed:
            return list(self._heartbeats)

    @property
    def deregistrations(self) -> list[registry_pb2.DeregisterRequest]:
        """Every deregistration received so far, oldest first."""
        with self._changed:
            return list(self._deregistrations)

    def wait_for_heartbeats(self, count: int, timeout: float = 10.0) -> list[ReceivedHeartbeat]:
        """Waits until ``count`` heartbeats arrived; raises :class:`TimeoutError` otherwise."""
        with self._changed:
            if not self._changed.wait_for(lambda: len(self._heartbeats) >= count, timeout):
                raise TimeoutError(f"{len(self._heartbeats)} heartbeats within {timeout}s, expected {count}")
            return list(self._heartbeats)

    def wait_for_deregistration(self, timeout: float = 10.0) -> registry_pb2.DeregisterRequest:
        """Waits for the first deregistration; raises :class:`TimeoutError` if none arrives."""
        with self._changed:
            if not self._changed.wait_for(lambda: bool(self._deregistrations), timeout):
                raise TimeoutError(f"no deregistration within {timeout}s")
            return self._deregistrations[0]

    def accept(self, request: registry_pb2.HeartbeatRequest) -> registry_pb2.HeartbeatResponse:
        """An accepting answer, with a uid stable per name and address."""
        with self._changed:
            uid = self._uids.setdefault((request.name, request.address), str(uuid.uuid4()))
        return registry_pb2.HeartbeatResponse(
            accepted=True,
            interval=seconds_duration(self.interval),
            ttl=seconds_duration(self.ttl),
            uid=uid,
            server_protocol=registry_pb2.Protocol(
                version=PROTOCOL_VERSION, sdk="kplug-fake-registry", capabilities=["Reconcile", "Finalize", "DryRun"]
            ),
        )

    def refuse(self, reason: str, message: str) -> registry_pb2.HeartbeatResponse:
        """A refusing answer."""
        return registry_pb2.HeartbeatResponse(
            accepted=False, reason=reason, message=message, interval=seconds_duration(self.interval)
        )

    def _heartbeat(
        self, request: registry_pb2.HeartbeatRequest, context: grpc.ServicerContext
    ) -> registry_pb2.HeartbeatResponse:
        with self._changed:
            self._heartbeats.append(ReceivedHeartbeat(time.monotonic(), request))
            self._changed.notify_all()
        answer = (self.answer or self.accept)(request)
        if isinstance(answer, grpc.StatusCode):
            context.abort(answer, "failed by the fake registry")
        return answer

    def _deregister(self, request: registry_pb2.DeregisterRequest) -> registry_pb2.DeregisterResponse:
        with self._changed:
            self._deregistrations.append(request)
            removed = self._uids.pop((request.name, request.address), None) is not None
            self._changed.notify_all()
        return registry_pb2.DeregisterResponse(removed=removed)


class _RegistryServicer(registry_pb2_grpc.RegistryServicer):
    def __init__(self, registry: FakeRegistry) -> None:
        self._registry = registry

    def Heartbeat(  # noqa: N802 - the generated servicer's name
        self, request: registry_pb2.HeartbeatRequest, context: grpc.ServicerContext
    ) -> registry_pb2.HeartbeatResponse:
        return self._registry._heartbeat(request, context)

    def Deregister(  # noqa: N802 - the generated servicer's name
        self, request: registry_pb2.DeregisterRequest, context: grpc.ServicerContext
    ) -> registry_pb2.DeregisterResponse:
        del context
        return self._registry._deregister(request)


class PluginClient:
    """Calls a plugin's Reconcile and Finalize over gRPC, as kplug does."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.stub = plugin_pb2_grpc.PluginStub(self.channel)

    def reconcile(
        self,
        obj: Mapping[str, Any],
        extensions: Iterable[Mapping[str, Any]] = (),
        *,
        dry_run: bool = False,
        timeout: float = 30.0,
        operation_id: str | None = None,
    ) -> Outcome:
        """Calls Reconcile with ``obj`` and its ``extensions``; raises :class:`grpc.RpcError` on errors."""
        return self.call(Operation.RECONCILE, request(obj, extensions, dry_run, timeout, operation_id), timeout)

    def finalize(
        self,
        obj: Mapping[str, Any],
        extensions: Iterable[Mapping[str, Any]] = (),
        *,
        dry_run: bool = False,
        timeout: float = 30.0,
        operation_id: str | None = None,
    ) -> Outcome:
        """Calls Finalize with ``obj`` and its ``extensions``; raises :class:`grpc.RpcError` on errors."""
        return self.call(Operation.FINALIZE, request(obj, extensions, dry_run, timeout, operation_id), timeout)

    def call(self, operation: Operation, message: plugin_pb2.ReconcileRequest, timeout: float = 30.0) -> Outcome:
        """Sends a prepared request, e.g. one with deliberately broken JSON."""
        method = self.stub.Reconcile if operation is Operation.RECONCILE else self.stub.Finalize
        return decode_outcome(method(message, timeout=timeout))

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> PluginClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def request(
    obj: Mapping[str, Any],
    extensions: Iterable[Mapping[str, Any]] = (),
    dry_run: bool = False,
    timeout: float | None = 30.0,
    operation_id: str | None = None,
) -> plugin_pb2.ReconcileRequest:
    """The ReconcileRequest kplug would send for ``obj`` and its ``extensions``."""
    message = plugin_pb2.ReconcileRequest(
        operation_id=operation_id or str(uuid.uuid4()),
        dry_run=dry_run,
        object=encode_json(obj, "object"),
        extensions=[encode_json(e, "extension") for e in extensions],
    )
    if timeout is not None:
        message.timeout.CopyFrom(seconds_duration(timeout))
    return message
