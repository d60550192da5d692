"""One heartbeat session: heartbeats to one registry address on a thread of its own.

The loop sends a heartbeat, waits the interval (or the failure backoff) and
starts over, until :meth:`Session.stop`; then it deregisters. On
:meth:`Session.drain` it sends a heartbeat with ``draining=True`` at once,
and every later heartbeat says so too, provided the kplug announced the
``Instances`` capability in its last answer. One that did not (a kplug
before instances, or one that has not answered yet) might ignore
``draining``, so the session deregisters from it instead, as plugins did
before instances, which stops its calls either way, and stops heartbeating.
Where the plugin is not registered (refused, or never reached) there is
nothing to tell: the session only deregisters when stopped.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import replace

import grpc
from google.protobuf import duration_pb2

from kplug.heartbeat.endpoint import dial
from kplug.heartbeat.status import Accepted, Failed, HeartbeatResult, HeartbeatStatus, Refused
from kplug.heartbeat.timing import (
    DEFAULT_INTERVAL,
    DEREGISTER_TIMEOUT,
    DRAIN_NOTICE_TIMEOUT,
    MIN_HEARTBEAT_TIMEOUT,
    backoff,
    jitter,
)
from kplug.heartbeat.token import TokenFile
from kplug.identity import IdentityError, IssuedIdentity
from kplug.proto import registry_pb2, registry_pb2_grpc

_log = logging.getLogger(__name__)

#: The capability of a kplug that tells instances apart and honors ``draining``.
INSTANCES = "Instances"
#: kplug's refusals of the call itself, as the ``reason`` of :class:`Refused`.
_DENIED = {
    grpc.StatusCode.UNAUTHENTICATED: "Unauthenticated",
    grpc.StatusCode.PERMISSION_DENIED: "PermissionDenied",
}


class Session:
    """Keeps the plugin registered with the registry at ``target`` until :meth:`stop`.

    ``server_name`` is the name to verify kplug's certificate against when
    ``target`` is an address resolved from it. Status changes are made, and
    announced, under ``changed``, which the sessions of one plugin share.
    With an ``identity``, each heartbeat asks for its certificate when one is
    due (:meth:`IssuedIdentity.stamp`) and each answer's certificate or trust
    bundle is taken (:meth:`IssuedIdentity.take`).
    """

    def __init__(
        self,
        target: str,
        request: registry_pb2.HeartbeatRequest,
        *,
        credentials: grpc.ChannelCredentials | None,
        server_name: str | None,
        token: TokenFile,
        changed: threading.Condition,
        uniform: Callable[[], float] = random.random,
        identity: IssuedIdentity | None = None,
    ) -> None:
        self.target = target
        self._identity = identity
        self._request = registry_pb2.HeartbeatRequest()
        self._request.CopyFrom(request)
        self._credentials = credentials
        self._server_name = server_name
        self._token = token
        self._uniform = uniform
        asked = _seconds(request.interval) if request.HasField("interval") else None
        self._interval = asked or DEFAULT_INTERVAL
        self._changed = changed
        self._status = HeartbeatStatus()
        self._channel = dial(target, credentials, server_name)
        self._stub = registry_pb2_grpc.RegistryStub(self._channel)
        # Guards the flags below and the call in flight; the loop waits on it.
        self._lock = threading.Condition()
        self._in_flight: grpc.Future[registry_pb2.HeartbeatResponse] | None = None
        #: The heartbeat last cancelled: its failure is no failure of the registry.
        self._abandoned: grpc.Future[registry_pb2.HeartbeatResponse] | None = None
        self._stopping = False
        self._deregister_on_stop = True
        self._drain_requested = False
        #: Set once the draining heartbeat went out (or deregistration replaced it).
        self._drain_noticed = threading.Event()
        #: Deregistered while draining: no more heartbeats.
        self._finished = False
        #: A heartbeat went out with no answer since (it may have registered the plugin).
        self._unanswered = False
        #: Draining where the plugin is not registered: no more heartbeats until stopped.
        self._quiet = False
        self._thread = threading.Thread(target=self._run, name=f"kplug-heartbeat {target}", daemon=True)

    @property
    def status(self) -> HeartbeatStatus:
        with self._changed:
            return self._status

    def start(self) -> None:
        self._thread.start()

    def drain(self) -> None:
        """Sends a heartbeat with ``draining=True`` now (abandoning one in flight); later ones say so too."""
        with self._lock:
            self._drain_requested = True
            self._cancel_in_flight()

    def wait_drained(self, timeout: float) -> bool:
        """Waits until the draining heartbeat went out; ``False`` if ``timeout`` seconds pass first."""
        return self._drain_noticed.wait(timeout)

    def stop(self, *, deregister: bool = True) -> None:
        """Ends the loop, abandoning a heartbeat in flight, and deregisters (if asked); returns at once."""
        with self._lock:
            self._stopping = True
            self._deregister_on_stop = deregister
            self._cancel_in_flight()
        if self._thread.ident is None:
            self._finish()

    def join(self, timeout: float) -> bool:
        """Waits for the loop to end after :meth:`stop`; ``False`` if ``timeout`` seconds pass first."""
        if self._thread.ident is not None:
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _cancel_in_flight(self) -> None:
        if self._in_flight is not None:
            self._abandoned = self._in_flight
            self._in_flight.cancel()
        self._lock.notify_all()

    def _run(self) -> None:
        _log.debug("heartbeating %r into %s", self._request.name, self.target)
        try:
            while True:
                with self._lock:
                    if self._stopping or self._finished:
                        break
                    notice = self._drain_requested and not self._drain_noticed.is_set()
                if notice:
                    delay = self._notice_draining()
                else:
                    delay = self._heartbeat(max(self._interval, MIN_HEARTBEAT_TIMEOUT))
                with self._lock:
                    self._lock.wait_for(self._woken, None if self._quiet else delay)
            with self._lock:
                deregister = self._deregister_on_stop and not self._finished
            if deregister:
                self._deregister()
        finally:
            self._finish()

    def _woken(self) -> bool:
        return self._stopping or self._finished or (self._drain_requested and not self._drain_noticed.is_set())

    def _finish(self) -> None:
        # Nobody waits for a draining heartbeat that will not go out.
        self._drain_noticed.set()
        self._update(lambda status: replace(status, stopped=True))
        self._channel.close()

    def _notice_draining(self) -> float:
        """Tells kplug the instance is draining; returns how long to wait for the next heartbeat."""
        self._request.draining = True
        self._update(lambda status: replace(status, draining=True))
        status = self.status
        delay = 0.0
        if status.uid is None and not self._unanswered:
            # Refused, or never reached: registering a draining instance would serve no one.
            _log.debug("not registered with kplug at %s: nothing to tell", self.target)
            with self._lock:
                self._quiet = True
        elif status.server_capabilities is not None and INSTANCES in status.server_capabilities:
            delay = self._heartbeat(DRAIN_NOTICE_TIMEOUT)
            if isinstance(self.status.last, Accepted):
                _log.info("told kplug at %s that this instance is draining", self.target)
        else:
            _log.info(
                "kplug at %s is not known to tell instances apart (no %r capability): deregistering before "
                "draining calls",
                self.target,
                INSTANCES,
            )
            self._deregister()
            with self._lock:
                self._finished = True
        self._drain_noticed.set()
        return delay

    def _heartbeat(self, timeout: float) -> float:
        """Sends one heartbeat and returns how long to wait for the next."""
        metadata = self._token.metadata()
        message = self._request
        if self._identity is not None:
            message = registry_pb2.HeartbeatRequest()
            message.CopyFrom(self._request)
            self._identity.stamp(message)
        with self._lock:
            if self._stopping:
                return 0.0
            call = self._stub.Heartbeat.future(message, timeout=timeout, metadata=metadata)
            self._in_flight = call
            self._unanswered = True  # until an answer says otherwise
        try:
            reply = call.result()
        except grpc.FutureCancelledError:
            return 0.0  # abandoned for a draining heartbeat or the deregistration
        except grpc.RpcError as error:
            with self._lock:
                abandoned = self._stopping or call is self._abandoned
            if abandoned:
                return 0.0
            code, details = _status_of(error)
            if code in _DENIED:
                return self._denied(code, details)
            if self._identity is not None and message.certificate_request:
                self._identity.refused(code, details)
            return self._failed(code, details)
        finally:
            with self._lock:
                self._in_flight = None
        return self._answered(reply)

    def _answered(self, reply: registry_pb2.HeartbeatResponse) -> float:
        if self._identity is not None:
            try:
                if self._identity.take(reply):
                    _log.info(
                        "certificate or trust bundle from kplug at %s in use for new connections (identity %s)",
                        self.target,
                        self._identity.name,
                    )
            except IdentityError as error:
                _log.warning("cannot use what kplug at %s sent for the plugin's identity: %s", self.target, error)
        asked = _seconds(reply.interval) if reply.HasField("interval") else None
        if asked:
            if asked != self._interval:
                _log.debug("registry at %s set the heartbeat interval to %.3gs", self.target, asked)
            self._interval = asked
        previous = self.status
        self._reachable(previous)
        result: HeartbeatResult
        if reply.accepted:
            result = Accepted()
            if previous.uid is None:
                _log.info(
                    "registered with kplug at %s as %r (uid %s), heartbeating every %.3gs",
                    self.target,
                    self._request.name,
                    reply.uid,
                    self._interval,
                )
            elif previous.uid != reply.uid:
                _log.info(
                    "registered again with kplug at %s under a new uid %s (was %s): "
                    "the registration expired or the registry restarted",
                    self.target,
                    reply.uid,
                    previous.uid,
                )
            else:
                _log.debug("heartbeat accepted by %s", self.target)
        else:
            result = Refused(reply.reason, reply.message)
            _log.warning(
                "kplug refused the heartbeat: %s (%s; registry %s); retrying in %.3gs",
                reply.message,
                reply.reason,
                self.target,
                self._interval,
            )
        capabilities = previous.server_capabilities
        if reply.HasField("server_protocol"):
            capabilities = frozenset(reply.server_protocol.capabilities)
        elif reply.accepted:
            capabilities = frozenset()  # a registry that announces nothing knows nothing new
        ttl = _seconds(reply.ttl) if reply.HasField("ttl") else None
        self._update(
            lambda status: replace(
                status,
                uid=reply.uid if reply.accepted else None,
                interval=asked or status.interval,
                ttl=ttl if reply.accepted else status.ttl,
                last=result,
                consecutive_failures=0,
                server_capabilities=capabilities,
            )
        )
        return jitter(self._interval, self._uniform)

    def _denied(self, code: grpc.StatusCode, message: str) -> float:
        """kplug refused the call: retried at the interval, like a refusal in the answer."""
        self._reachable(self.status)
        _log.warning(
            "kplug refused the heartbeat: %s (%s; registry %s); retrying in %.3gs",
            message,
            code.name,
            self.target,
            self._interval,
        )
        result = Refused(_DENIED[code], message)
        self._update(lambda status: replace(status, uid=None, last=result, consecutive_failures=0))
        return jitter(self._interval, self._uniform)

    def _reachable(self, previous: HeartbeatStatus) -> None:
        """Any answer from the registry ends a run of failures."""
        self._unanswered = False
        if previous.consecutive_failures:
            _log.info(
                "registry %s reachable again after %d failed heartbeats", self.target, previous.consecutive_failures
            )

    def _failed(self, code: grpc.StatusCode, message: str) -> float:
        # A channel that saw a failure waits out its own reconnect backoff
        # (up to minutes) before dialing again, and one whose peer vanished
        # can hang: dial afresh, so only the backoff below decides.
        self._reconnect()
        failures = self.status.consecutive_failures + 1
        delay = jitter(backoff(failures, self._interval), self._uniform)
        _log.warning(
            "heartbeat to %s failed (%s: %s), %d in a row; retrying in %.3gs",
            self.target,
            code.name,
            message,
            failures,
            delay,
        )
        self._update(lambda status: replace(status, last=Failed(code, message), consecutive_failures=failures))
        return delay

    def _deregister(self) -> None:
        """Best effort: the registry drops the registration at its TTL anyway."""
        request = registry_pb2.DeregisterRequest(
            name=self._request.name, address=self._request.address, instance=self._request.instance
        )
        try:
            reply = self._stub.Deregister(request, timeout=DEREGISTER_TIMEOUT, metadata=self._token.metadata())
        except grpc.RpcError as error:
            code, message = _status_of(error)
            _log.warning(
                "could not deregister from %s (%s: %s); kplug drops the registration when its TTL passes",
                self.target,
                code.name,
                message,
            )
        else:
            if reply.removed:
                _log.info("deregistered %r from kplug at %s", self._request.name, self.target)
            else:
                _log.debug("nothing to deregister at %s", self.target)
        self._update(lambda status: replace(status, uid=None))

    def _reconnect(self) -> None:
        self._channel.close()
        self._channel = dial(self.target, self._credentials, self._server_name)
        self._stub = registry_pb2_grpc.RegistryStub(self._channel)

    def _update(self, change: Callable[[HeartbeatStatus], HeartbeatStatus]) -> None:
        with self._changed:
            self._status = change(self._status)
            self._changed.notify_all()


def _seconds(duration: duration_pb2.Duration) -> float | None:
    """A positive protobuf Duration in seconds; ``None`` for zero or negative ("no opinion")."""
    seconds = duration.seconds + duration.nanos / 1e9
    return seconds if seconds > 0 else None


def _status_of(error: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    """The status code and message of a failed call."""
    if isinstance(error, grpc.Call):
        code = error.code()
        return code, error.details() or code.name
    return grpc.StatusCode.UNKNOWN, str(error)
