"""Serving a plugin: the gRPC server, its health service and the heartbeats."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kplug import identity as _identity
from kplug._version import __version__
from kplug._wire import seconds_duration
from kplug.config import (
    Config,
    advertised_address,
    bind_address,
    check_issued_identity,
    check_registry,
    check_serving_tls,
    default_instance,
    local,
)
from kplug.heartbeat import Accepted, Failed, Heartbeater, HeartbeatStatus, Refused
from kplug.identity import IdentityError, IssuedIdentity
from kplug.plugin import ApiRef, Plugin, check_name
from kplug.proto import PROTOCOL_VERSION, plugin_pb2_grpc, registry_pb2
from kplug.service import PluginService
from kplug.tls import ServingCertificates, TlsFileError

_log = logging.getLogger(__name__)

#: This SDK's name and version, as announced to the registry.
SDK = f"kplug-sdk-python/{__version__}"
#: What a plugin served by this SDK supports; ``Finalize`` only when it overrides :meth:`Plugin.finalize`.
CAPABILITIES = ("Reconcile", "Finalize", "DryRun")
#: The gRPC service name reported SERVING by the health service.
SERVICE_NAME = "kplug.v1alpha1.Plugin"
#: How often the wait for the first issued certificate checks for a shutdown
#: (and lets the main thread run Python's signal handlers).
_WAIT_SLICE = 0.25


class ServeError(RuntimeError):
    """The plugin cannot be served, e.g. because its listen address is taken."""


class _StoppedError(ServeError):
    """A shutdown was asked for before the plugin served (:func:`kplug.run`)."""


class Server:
    """A running plugin, as returned by :func:`serve`.

    Use it as a context manager, or call :meth:`stop`::

        with kplug.serve(Hello(), kplug.Config(listen="127.0.0.1:0")) as server:
            ...  # kplug reaches the plugin at server.address
    """

    def __init__(
        self,
        *,
        name: str,
        address: str,
        port: int,
        instance: str = "",
        grpc_server: grpc.Server,
        executor: ThreadPoolExecutor,
        health_servicer: health.HealthServicer,
        heartbeater: Heartbeater | None,
        drain_timeout: float,
    ) -> None:
        self.name = name
        #: ``host:port`` advertised to kplug.
        self.address = address
        #: The port actually bound (useful with port 0).
        self.port = port
        #: The instance name sent with the heartbeats ("" for none).
        self.instance = instance
        self._server = grpc_server
        self._executor = executor
        self._health = health_servicer
        self._heartbeater = heartbeater
        self._drain_timeout = drain_timeout
        self._lock = threading.Lock()
        self._stopped = False

    @property
    def heartbeat_status(self) -> HeartbeatStatus | None:
        """What the heartbeats have achieved; ``None`` when served without a registry."""
        return self._heartbeater.status if self._heartbeater else None

    def wait_for_heartbeat(self, predicate: Callable[[HeartbeatStatus], bool], timeout: float) -> bool:
        """Waits until ``predicate(heartbeat_status)`` holds, e.g. ``lambda s: s.uid is not None``
        for "registered"; ``False`` if ``timeout`` seconds pass first or there is no registry.
        """
        return self._heartbeater is not None and self._heartbeater.wait_for(predicate, timeout)

    def stop(self, drain_timeout: float | None = None) -> None:
        """Shuts down gracefully, losing no call; returns when done. Safe to call more than once.

        1. Reports NOT_SERVING and tells every kplug it is registered with
           that this instance is draining (a heartbeat with
           ``draining=True``, waiting at most
           :data:`kplug.heartbeat.DRAIN_NOTICE_TIMEOUT` for the answers), so
           kplug sends its calls to other instances. Calls arriving
           meanwhile are served. A kplug not known to tell instances apart
           is deregistered from instead, as before instances.
        2. Stops accepting calls and gives those in flight ``drain_timeout``
           seconds (default: the config's) to finish before cancelling them.
        3. Stops heartbeating and deregisters this instance.
        """
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        grace = self._drain_timeout if drain_timeout is None else drain_timeout
        _log.info("stopping plugin %r", self.name)
        self._health.enter_graceful_shutdown()
        if self._heartbeater is not None:
            self._heartbeater.drain()
        self._server.stop(grace).wait()
        if self._heartbeater is not None:
            self._heartbeater.stop()
        # Handlers still running past the grace period cannot be interrupted;
        # the interpreter waits for them on exit.
        self._executor.shutdown(wait=False)
        _log.info("plugin %r stopped", self.name)

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        """Blocks until the server stops; ``False`` if ``timeout`` seconds pass first."""
        return self._server.wait_for_termination(timeout)

    def __enter__(self) -> Server:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def serve(plugin: Plugin, config: Config | None = None) -> Server:
    """Starts serving ``plugin`` and heartbeating into kplug's registry; returns at once, except
    with :attr:`Config.issued_identity`.

    With :attr:`Config.issued_identity` the port is bound first (connections
    wait in its backlog) and the heartbeats start, asking kplug for the
    certificate; the server starts once kplug signed it, waiting at most
    :data:`kplug.identity.FIRST_CERTIFICATE_TIMEOUT` (60 s). Past that, or
    when kplug refuses the request, it raises :class:`ServeError`.

    Raises :class:`ValueError` for an invalid declaration or address (e.g. a
    plugin name kplug would refuse, or an ``https://`` registry without
    :attr:`Config.registry_ca_file`) or serving TLS options that do not fit
    together, and :class:`ServeError` when the listen address cannot be bound,
    the registry CA file or the serving TLS files cannot be read or used, or
    kplug issued no certificate (above). Nothing is left running when it raises.
    """
    return _serve(plugin, config, None)


def _serve(plugin: Plugin, config: Config | None, shutdown: threading.Event | None) -> Server:
    """:func:`serve`; ``shutdown`` set while waiting for the first issued certificate raises :class:`_StoppedError`."""
    config = config or Config()
    if config.local_address_file:
        config = local(config)
    name = config.name or plugin.name
    check_name(name)
    api = ApiRef.parse(plugin.api)
    check_issued_identity(config)
    check_serving_tls(
        config.tls_cert_file, config.tls_key_file, config.client_ca_file, config.allow_unauthenticated_clients
    )
    registry_ca = None
    if config.registry:
        check_registry(config.registry, config.registry_ca_file)
        registry_ca = _read_registry_ca(config.registry_ca_file)
    certificates = _serving_certificates(config)
    identity = _issued_identity(config, name)
    credentials = certificates.credentials() if certificates else identity.credentials() if identity else None
    instance = default_instance() if config.instance is None else config.instance
    if config.server_name and credentials is None:
        _log.warning("--server-name %s has no effect: the plugin serves plain gRPC", config.server_name)

    executor = ThreadPoolExecutor(max_workers=config.max_workers, thread_name_prefix="kplug-rpc")
    # Without SO_REUSEPORT (on by default in gRPC) a port already in use is
    # an error instead of a second server silently sharing it.
    grpc_server = grpc.server(executor, options=[("grpc.so_reuseport", 0)])
    plugin_pb2_grpc.add_PluginServicer_to_server(PluginService(plugin), grpc_server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, grpc_server)
    heartbeater: Heartbeater | None = None
    try:
        port = _bind(grpc_server, config.listen, credentials)
        address = advertised_address(config.listen, port, config.advertise)
        heartbeater = (
            Heartbeater(
                config.registry,
                _heartbeat_request(plugin, name, api, address, instance, config, identity),
                token_file=config.token_file,
                registry_ca=registry_ca,
                identity=identity,
            )
            if config.registry
            else None
        )
        if identity is not None and heartbeater is not None:
            heartbeater.start()
            _wait_for_certificate(identity, heartbeater, shutdown)
    except BaseException:
        if heartbeater is not None:
            heartbeater.stop()
        grpc_server.stop(None)
        executor.shutdown(wait=False)
        raise

    grpc_server.start()
    for service in ("", SERVICE_NAME):
        health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    if heartbeater is not None and identity is None:
        heartbeater.start()
    if config.local_address_file:
        try:
            _write_address(config.local_address_file, address)
        except OSError as error:
            grpc_server.stop(None)
            executor.shutdown(wait=False)
            raise ServeError(f"cannot write the listening address to {config.local_address_file}: {error}") from error
    _log.info(
        "serving plugin %r%s (%s, %s %s) on port %d (%s), advertised as %s%s",
        name,
        f" instance {instance!r}" if instance else "",
        api,
        plugin.implementation or "no implementation",
        plugin.version or "unversioned",
        port,
        _describe_tls(certificates, identity),
        address,
        f"; registry {config.registry}" if config.registry else "; no registry",
    )
    return Server(
        name=name,
        address=address,
        port=port,
        instance=instance,
        grpc_server=grpc_server,
        executor=executor,
        health_servicer=health_servicer,
        heartbeater=heartbeater,
        drain_timeout=config.drain_timeout,
    )


def _write_address(path: str, address: str) -> None:
    """Writes ``address`` to ``path`` whole: to a file beside it, then renamed, so that a reader never sees half."""
    partial = f"{path}.partial"
    with open(partial, "w", encoding="utf-8") as file:
        file.write(address)
    os.replace(partial, path)


def _read_registry_ca(path: str | None) -> bytes | None:
    """The registry CA file's PEM; ``None`` without one."""
    if not path:
        return None
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as error:
        raise ServeError(f"cannot read the registry CA file {path}: {error.strerror or error}") from None


def _serving_certificates(config: Config) -> ServingCertificates | None:
    """The serving TLS files, read and checked; ``None`` to serve plain gRPC."""
    if not config.tls_cert_file or not config.tls_key_file:
        return None
    try:
        return ServingCertificates(config.tls_cert_file, config.tls_key_file, config.client_ca_file)
    except TlsFileError as error:
        raise ServeError(str(error)) from None


def _issued_identity(config: Config, name: str) -> IssuedIdentity | None:
    """The key and signing request for ``--issued-identity``; ``None`` without it."""
    if not config.issued_identity:
        return None
    try:
        return IssuedIdentity(name)
    except IdentityError as error:
        raise ServeError(str(error)) from None


def _wait_for_certificate(
    identity: IssuedIdentity, heartbeater: Heartbeater, shutdown: threading.Event | None = None
) -> None:
    """Waits for kplug to sign the first certificate; raises :class:`ServeError` if it does not,
    :class:`_StoppedError` once ``shutdown`` is set."""
    timeout = _identity.FIRST_CERTIFICATE_TIMEOUT
    _log.info("asking kplug for the certificate of %s", identity.name)
    deadline = time.monotonic() + timeout
    while not identity.wait(min(_WAIT_SLICE, max(deadline - time.monotonic(), 0.0))):
        if shutdown is not None and shutdown.is_set():
            raise _StoppedError(f"stopped while waiting for kplug to sign the certificate of {identity.name}")
        if identity.refusal is not None or time.monotonic() >= deadline:
            break
    else:
        return
    problem = identity.refusal
    if problem is None:
        last = heartbeater.status.last
        if isinstance(last, Failed):
            outcome = f"the last heartbeat failed: {last.code.name}: {last.message}"
        elif isinstance(last, Refused):
            outcome = f"kplug refused the last heartbeat: {last.reason}: {last.message}"
        elif isinstance(last, Accepted):
            outcome = "kplug accepted the heartbeats but sent no certificate"
        else:
            outcome = "no heartbeat was answered"
        problem = f"kplug signed no certificate within {timeout:.3g}s ({outcome})"
    raise ServeError(f"cannot serve the identity {identity.name}: {problem}")


def _describe_tls(certificates: ServingCertificates | None, identity: IssuedIdentity | None = None) -> str:
    if identity is not None:
        return f"TLS as {identity.name} issued by kplug, client certificates of kplug's trust bundle required"
    if certificates is None:
        return "plain gRPC"
    if certificates.verifies_clients:
        return f"TLS, client certificates of {certificates.client_ca_file} required"
    return "TLS, callers not authenticated"


def _bind(grpc_server: grpc.Server, listen: str, credentials: grpc.ServerCredentials | None) -> int:
    """Binds ``listen`` (with TLS if there are ``credentials``) and returns the port bound."""
    try:
        if credentials is None:
            port = grpc_server.add_insecure_port(bind_address(listen))
        else:
            port = grpc_server.add_secure_port(bind_address(listen), credentials)
    except RuntimeError as error:  # gRPC's way of saying the bind failed
        raise ServeError(f"cannot listen on {listen}: {error}") from None
    if port == 0:
        raise ServeError(f"cannot listen on {listen}")
    return port


def _capabilities(plugin: Plugin) -> list[str]:
    """What ``plugin`` declares: without ``Finalize`` when it keeps the default, which has nothing to clean up.

    The operator then puts no finalizer on its objects: one write fewer per
    object, and a delete waits for nobody.
    """
    finalizes = type(plugin).finalize is not Plugin.finalize
    return [c for c in CAPABILITIES if finalizes or c != "Finalize"]


def _heartbeat_request(
    plugin: Plugin,
    name: str,
    api: ApiRef,
    address: str,
    instance: str,
    config: Config,
    identity: IssuedIdentity | None = None,
) -> registry_pb2.HeartbeatRequest:
    """The declaration sent with every heartbeat; with an ``identity``, its name is the server name."""
    request = registry_pb2.HeartbeatRequest(
        name=name,
        version=plugin.version,
        api=registry_pb2.PluginApi(group=api.group, resource=api.resource, version=api.version),
        implementation=plugin.implementation,
        address=address,
        extensions=[
            registry_pb2.ExtensionKind(group=e.group, kind=e.kind, version=e.version) for e in plugin.extensions
        ],
        labels=dict(config.labels),
        protocol=registry_pb2.Protocol(version=PROTOCOL_VERSION, sdk=SDK, capabilities=_capabilities(plugin)),
        instance=instance,
        server_name=identity.name if identity else config.server_name,
        canary_weight=config.canary_weight,
        shadow_percent=config.shadow,
    )
    if config.heartbeat_interval is not None:
        request.interval.CopyFrom(seconds_duration(config.heartbeat_interval))
    return request
