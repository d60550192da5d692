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

Like kplug in cluster mode, the fake can serve TLS (``tls=``) and require a
ServiceAccount token (``tokens=``); :attr:`FakeRegistry.url` is then the
``https://`` address to pass as the registry. It announces the capabilities of
a current kplug, ``Instances`` included; ``capabilities=`` makes it an older one.
:class:`PluginClient` calls a plugin served with TLS when given the CA to
trust (and a client certificate for mutual TLS). :class:`PluginProcess` runs
a plugin as a child process, e.g. to test its shutdown on SIGTERM.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import grpc

from kplug._wire import decode_outcome, encode_json, seconds_duration
from kplug.proto import PROTOCOL_VERSION, plugin_pb2, plugin_pb2_grpc, registry_pb2, registry_pb2_grpc
from kplug.trace import TRACEPARENT
from kplug.types import Operation, Outcome

#: Decides the registry's answer to a heartbeat: a response, or a status code
#: (optionally with a message) to fail the call with.
Answer = Callable[
    [registry_pb2.HeartbeatRequest],
    "registry_pb2.HeartbeatResponse | grpc.StatusCode | tuple[grpc.StatusCode, str]",
]
#: Decides the registry's answer to a deregistration, like :data:`Answer`.
DeregisterAnswer = Callable[
    [registry_pb2.DeregisterRequest],
    "registry_pb2.DeregisterResponse | grpc.StatusCode | tuple[grpc.StatusCode, str]",
]
#: What kplug announces in ``server_protocol.capabilities``.
CAPABILITIES = ("Reconcile", "Finalize", "DryRun", "Instances")
#: What kplug announced before it told plugin instances apart.
CAPABILITIES_BEFORE_INSTANCES = ("Reconcile", "Finalize", "DryRun")
#: kplug's answer to a call without a token, in cluster mode.
NO_TOKEN = 'a ServiceAccount token is required: send it as "authorization: Bearer TOKEN" (the SDKs\' --token-file)'
#: kplug's answer to a token that does not authenticate.
INVALID_TOKEN = "Unauthorized: invalid bearer token"


@dataclass(frozen=True, slots=True)
class ReceivedHeartbeat:
    """A heartbeat the fake registry received, and when (:func:`time.monotonic`)."""

    at: float
    request: registry_pb2.HeartbeatRequest
    #: The bearer token it carried (``authorization: Bearer <token>``), if any.
    token: str | None = None


class FakeRegistry:
    """An in-process ``kplug.v1alpha1.Registry`` for tests.

    Accepts every heartbeat unless :attr:`answer` says otherwise, asking for
    ``interval`` seconds between heartbeats. Records every heartbeat, failed
    or not, and every deregistration.

    ``tls`` is a ``(private key, certificate chain)`` PEM pair to serve TLS
    with, as kplug in cluster mode does. With ``tokens``, heartbeats and
    deregistrations must carry ``authorization: Bearer <one of them>``, or
    fail with ``UNAUTHENTICATED``, as in cluster mode. ``capabilities`` are
    announced in every accepting answer; :data:`CAPABILITIES_BEFORE_INSTANCES`
    makes a kplug that ignores ``instance`` and ``draining``.

    Registrations are kept per name and instance (the address when a
    heartbeat names no instance, or for an older kplug), as kplug does; a
    deregistration removes the one with its name, instance and address.
    """

    def __init__(
        self,
        *,
        interval: float = 10.0,
        ttl: float = 30.0,
        address: str = "127.0.0.1:0",
        tls: tuple[bytes, bytes] | None = None,
        tokens: Iterable[str] | None = None,
        capabilities: Iterable[str] = CAPABILITIES,
    ) -> None:
        self.interval = interval
        self.ttl = ttl
        self.capabilities = tuple(capabilities)
        #: Replaces the default answer (:meth:`accept`) when set.
        self.answer: Answer | None = None
        #: Replaces the default answer to a deregistration (:meth:`remove`) when set.
        self.answer_deregister: DeregisterAnswer | None = None
        #: The tokens that authenticate; ``None`` requires none. May be replaced while running.
        self.tokens: frozenset[str] | None = None if tokens is None else frozenset(tokens)
        self._changed = threading.Condition()
        self._heartbeats: list[ReceivedHeartbeat] = []
        self._deregistrations: list[registry_pb2.DeregisterRequest] = []
        self._deregistration_tokens: list[str | None] = []
        #: (name, instance or address) -> (address, uid)
        self._registrations: dict[tuple[str, str], tuple[str, str]] = {}
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fake-registry")
        self._server = grpc.server(self._executor, options=[("grpc.so_reuseport", 0)])
        registry_pb2_grpc.add_RegistryServicer_to_server(_RegistryServicer(self), self._server)
        host = address.rpartition(":")[0]
        if tls is None:
            port = self._server.add_insecure_port(address)
        else:
            port = self._server.add_secure_port(address, grpc.ssl_server_credentials([tls]))
        #: ``host:port`` where the registry listens: the plugin's registry
        #: without TLS (see :attr:`url`).
        self.address = f"{host}:{port}"
        #: The registry to pass to the plugin: ``https://host:port`` with TLS,
        #: else ``http://host:port``.
        self.url = f"{'https' if tls else 'http'}://{self.address}"

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

    @property
    def deregistration_tokens(self) -> list[str | None]:
        """The bearer token each of :attr:`deregistrations` carried, if any."""
        with self._changed:
            return list(self._deregistration_tokens)

    def wait_for_heartbeats(self, count: int, timeout: float = 10.0) -> list[ReceivedHeartbeat]:
        """Waits until ``count`` heartbeats arrived; raises :class:`TimeoutError` otherwise."""
        with self._changed:
            if not self._changed.wait_for(lambda: len(self._heartbeats) >= count, timeout):
                raise TimeoutError(f"{len(self._heartbeats)} heartbeats within {timeout}s, expected {count}")
            return list(self._heartbeats)

    def wait_for_heartbeat(
        self, predicate: Callable[[ReceivedHeartbeat], bool], timeout: float = 10.0
    ) -> ReceivedHeartbeat:
        """Waits for the first heartbeat for which ``predicate`` holds, e.g. ``lambda h: h.request.draining``;
        raises :class:`TimeoutError` if none arrives."""
        with self._changed:
            if not self._changed.wait_for(lambda: any(predicate(h) for h in self._heartbeats), timeout):
                raise TimeoutError(f"no such heartbeat within {timeout}s among {len(self._heartbeats)}")
            return next(h for h in self._heartbeats if predicate(h))

    def wait_for_deregistration(self, timeout: float = 10.0) -> registry_pb2.DeregisterRequest:
        """Waits for the first deregistration; raises :class:`TimeoutError` if none arrives."""
        with self._changed:
            if not self._changed.wait_for(lambda: bool(self._deregistrations), timeout):
                raise TimeoutError(f"no deregistration within {timeout}s")
            return self._deregistrations[0]

    def accept(self, request: registry_pb2.HeartbeatRequest) -> registry_pb2.HeartbeatResponse:
        """An accepting answer, with a uid stable per name and instance (or address, without one)."""
        key = self._key(request)
        with self._changed:
            address, uid = self._registrations.get(key, (request.address, str(uuid.uuid4())))
            if address != request.address:
                uid = str(uuid.uuid4())  # the instance moved: a new registration
            self._registrations[key] = (request.address, uid)
        return registry_pb2.HeartbeatResponse(
            accepted=True,
            interval=seconds_duration(self.interval),
            ttl=seconds_duration(self.ttl),
            uid=uid,
            server_protocol=registry_pb2.Protocol(
                version=PROTOCOL_VERSION, sdk="kplug-fake-registry", capabilities=self.capabilities
            ),
        )

    def remove(self, request: registry_pb2.DeregisterRequest) -> registry_pb2.DeregisterResponse:
        """The default answer to a deregistration: removes the matching registration, if any."""
        key = self._key(request)
        with self._changed:
            removed = self._registrations.get(key, ("", ""))[0] == request.address
            if removed:
                del self._registrations[key]
        return registry_pb2.DeregisterResponse(removed=removed)

    def _key(self, request: registry_pb2.HeartbeatRequest | registry_pb2.DeregisterRequest) -> tuple[str, str]:
        """What a registration is known by: name and instance (or address); just the address before instances."""
        instances = "Instances" in self.capabilities
        return request.name, (request.instance if instances else "") or request.address

    def refuse(self, reason: str, message: str) -> registry_pb2.HeartbeatResponse:
        """A refusing answer."""
        return registry_pb2.HeartbeatResponse(
            accepted=False, reason=reason, message=message, interval=seconds_duration(self.interval)
        )

    def _heartbeat(
        self, request: registry_pb2.HeartbeatRequest, context: grpc.ServicerContext
    ) -> registry_pb2.HeartbeatResponse:
        token = _bearer(context)
        with self._changed:
            self._heartbeats.append(ReceivedHeartbeat(time.monotonic(), request, token))
            self._changed.notify_all()
        self._authenticate(token, context)
        return _reply_or_abort((self.answer or self.accept)(request), context)

    def _deregister(
        self, request: registry_pb2.DeregisterRequest, context: grpc.ServicerContext
    ) -> registry_pb2.DeregisterResponse:
        token = _bearer(context)
        with self._changed:
            self._deregistrations.append(request)
            self._deregistration_tokens.append(token)
            self._changed.notify_all()
        self._authenticate(token, context)
        return _reply_or_abort((self.answer_deregister or self.remove)(request), context)

    def _authenticate(self, token: str | None, context: grpc.ServicerContext) -> None:
        tokens = self.tokens
        if tokens is None:
            return
        if token is None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, NO_TOKEN)
        if token not in tokens:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, INVALID_TOKEN)


_Reply = TypeVar("_Reply")


def _reply_or_abort(
    answer: _Reply | grpc.StatusCode | tuple[grpc.StatusCode, str], context: grpc.ServicerContext
) -> _Reply:
    """The reply an :data:`Answer` or :data:`DeregisterAnswer` gave, or the call failed with its status code."""
    if isinstance(answer, grpc.StatusCode):
        context.abort(answer, "failed by the fake registry")
    if isinstance(answer, tuple):
        context.abort(*answer)
    return answer


def _bearer(context: grpc.ServicerContext) -> str | None:
    """The bearer token in a call's ``authorization`` metadata, if any."""
    for key, value in context.invocation_metadata():
        if key == "authorization" and isinstance(value, str):
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


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
        return self._registry._deregister(request, context)


class PluginClient:
    """Calls a plugin's Reconcile and Finalize over gRPC, as kplug does.

    For a plugin served with TLS, ``root_certificates`` is the PEM of the CA
    to trust, ``server_name`` the name to verify (default: the address's
    host) and ``private_key`` with ``certificate_chain`` the client
    certificate to present. Each client opens a connection of its own.
    """

    def __init__(
        self,
        address: str,
        *,
        root_certificates: bytes | None = None,
        private_key: bytes | None = None,
        certificate_chain: bytes | None = None,
        server_name: str | None = None,
    ) -> None:
        options: list[tuple[str, str | int]] = [("grpc.use_local_subchannel_pool", 1)]
        if root_certificates is None:
            self.channel = grpc.insecure_channel(address, options=options)
        else:
            if server_name:
                options.append(("grpc.ssl_target_name_override", server_name))
            credentials = grpc.ssl_channel_credentials(root_certificates, private_key, certificate_chain)
            self.channel = grpc.secure_channel(address, credentials, options=options)
        self.stub = plugin_pb2_grpc.PluginStub(self.channel)

    def reconcile(
        self,
        obj: Mapping[str, Any],
        extensions: Iterable[Mapping[str, Any]] = (),
        *,
        dry_run: bool = False,
        timeout: float = 30.0,
        operation_id: str | None = None,
        traceparent: str | None = None,
    ) -> Outcome:
        """Calls Reconcile with ``obj`` and its ``extensions``; raises :class:`grpc.RpcError` on errors.

        ``traceparent`` is sent as the call's ``traceparent`` metadata, as kplug does.
        """
        message = request(obj, extensions, dry_run, timeout, operation_id)
        return self.call(Operation.RECONCILE, message, timeout, traceparent=traceparent)

    def finalize(
        self,
        obj: Mapping[str, Any],
        extensions: Iterable[Mapping[str, Any]] = (),
        *,
        dry_run: bool = False,
        timeout: float = 30.0,
        operation_id: str | None = None,
        traceparent: str | None = None,
    ) -> Outcome:
        """Calls Finalize with ``obj`` and its ``extensions``; raises :class:`grpc.RpcError` on errors.

        ``traceparent`` is sent as the call's ``traceparent`` metadata, as kplug does.
        """
        message = request(obj, extensions, dry_run, timeout, operation_id)
        return self.call(Operation.FINALIZE, message, timeout, traceparent=traceparent)

    def call(
        self,
        operation: Operation,
        message: plugin_pb2.ReconcileRequest,
        timeout: float = 30.0,
        *,
        traceparent: str | None = None,
    ) -> Outcome:
        """Sends a prepared request, e.g. one with deliberately broken JSON.

        ``traceparent`` is sent as ``traceparent`` metadata.
        """
        method = self.stub.Reconcile if operation is Operation.RECONCILE else self.stub.Finalize
        metadata = None if traceparent is None else [(TRACEPARENT, traceparent)]
        return decode_outcome(method(message, timeout=timeout, metadata=metadata))

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


class PluginProcess:
    """A plugin run as a child process with this interpreter, its stderr in ``log``.

    ``args`` follow ``python``: a script and its flags, or ``-m``, a module
    and its flags. The ``KPLUG_`` variables of the test's own environment are
    left out; ``env`` adds variables. When :meth:`wait` runs out of time or
    :meth:`stop` finds the process running, the tracebacks of all its
    threads are written to the log (:mod:`faulthandler`, on SIGABRT) before
    it is killed, so a hang explains itself.
    """

    def __init__(self, args: Sequence[str], log: Path, env: Mapping[str, str] | None = None) -> None:
        self.log = log
        environ = {k: v for k, v in os.environ.items() if not k.startswith("KPLUG_")}
        environ.update(env or {})
        environ["PYTHONFAULTHANDLER"] = "1"
        with log.open("wb") as stderr:
            self.popen = subprocess.Popen([sys.executable, *args], stderr=stderr, env=environ)

    @property
    def stderr(self) -> str:
        """What the process logged so far."""
        return self.log.read_text()

    def send_signal(self, sig: signal.Signals) -> None:
        self.popen.send_signal(sig)

    def wait(self, timeout: float = 15.0) -> int:
        """Its exit status; raises :class:`TimeoutError`, with its log and tracebacks, if it runs past ``timeout``."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise TimeoutError(f"still running after {timeout} s; its log:\n{self.stderr}") from None

    def stop(self) -> None:
        """Ends the process if it is still running, its threads' tracebacks logged first."""
        if self.popen.poll() is not None:
            return
        try:
            resource.prlimit(self.popen.pid, resource.RLIMIT_CORE, (0, 0))  # the tracebacks, not a core file
            self.popen.send_signal(signal.SIGABRT)
        except ProcessLookupError:
            return  # it just ended
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(5)

    def __enter__(self) -> PluginProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
