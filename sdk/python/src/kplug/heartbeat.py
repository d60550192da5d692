"""Keeping the plugin registered: heartbeats into kplug's registry.

kplug forgets a plugin that stops heartbeating, so :class:`Heartbeater`
never gives up on an unreachable or refusing registry. It runs on a
background thread:

- the first heartbeat goes out at once, later ones at the interval the
  registry asks for, varied by ±10% so plugins started together spread out;
- a failed heartbeat (registry unreachable, RPC error) is retried after an
  exponential backoff starting at 200 ms, never longer than the interval;
- a refused heartbeat (``accepted=false``: the registry is fine, the
  declaration is not) is logged and retried at the interval, and so is a call
  kplug refuses as ``UNAUTHENTICATED`` (no or an invalid ServiceAccount token)
  or ``PERMISSION_DENIED`` (the token's identity may not heartbeat under this
  name): neither fixes itself within a backoff;
- :meth:`Heartbeater.stop` abandons a heartbeat in flight and deregisters.

Against kplug in cluster mode the registry is ``https://`` (trusting the CA
given as ``registry_ca``) and every heartbeat and the deregistration carry the
ServiceAccount token in ``token_file`` as ``authorization: Bearer <token>``,
read afresh each time as the kubelet rotates it.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

import grpc
from google.protobuf import duration_pb2

from kplug.config import check_registry, registry_target, registry_uses_tls
from kplug.proto import registry_pb2, registry_pb2_grpc

_log = logging.getLogger(__name__)

#: Assumed until the registry answers; matches the registry's own default.
DEFAULT_INTERVAL = 10.0
#: First retry delay after a failed heartbeat; doubles up to the interval.
INITIAL_BACKOFF = 0.2
#: Intervals and retry delays vary by up to this fraction, so plugins
#: restarted together do not keep hitting the registry in lockstep.
JITTER = 0.1
#: Lower bound on how long a heartbeat may take, so that a busy registry does
#: not look down to plugins with very short intervals.
MIN_HEARTBEAT_TIMEOUT = 1.0
#: Shutdown waits at most this long to deregister; past it, kplug drops the
#: registration when its TTL passes anyway.
DEREGISTER_TIMEOUT = 2.0
#: kplug's refusals of the call itself, as the ``reason`` of :class:`Refused`.
_DENIED = {
    grpc.StatusCode.UNAUTHENTICATED: "Unauthenticated",
    grpc.StatusCode.PERMISSION_DENIED: "PermissionDenied",
}
#: Call metadata, as grpcio takes it.
Metadata = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Accepted:
    """The registry recorded the heartbeat."""


@dataclass(frozen=True, slots=True)
class Refused:
    """The registry answered but did not record the heartbeat. Retried at the interval.

    Also kplug's refusals of the call: ``UNAUTHENTICATED`` (no or an invalid
    ServiceAccount token) and ``PERMISSION_DENIED`` (its identity may not
    heartbeat under this name).
    """

    #: Machine-readable, e.g. ``AddressConflict``; ``Unauthenticated`` or
    #: ``PermissionDenied`` for kplug's refusals of the call.
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Failed:
    """The registry could not be reached or the call failed. Retried with backoff."""

    #: ``DEADLINE_EXCEEDED`` when no answer came in time.
    code: grpc.StatusCode
    message: str


#: How one heartbeat went.
HeartbeatResult = Accepted | Refused | Failed


@dataclass(frozen=True, slots=True)
class HeartbeatStatus:
    """What the heartbeats have achieved so far."""

    #: The registration's uid per the registry's last answer: set by an
    #: accepted heartbeat, cleared by a refusal or deregistration. Failures
    #: leave it alone: the registration outlives them until its TTL passes.
    uid: str | None = None
    #: The interval the registry last asked for, in seconds.
    interval: float | None = None
    #: How long the registry keeps the registration without heartbeats, per
    #: its last accepted answer, in seconds.
    ttl: float | None = None
    #: The latest heartbeat's result; ``None`` before the first answer or failure.
    last: HeartbeatResult | None = None
    #: Heartbeats that failed in a row; any answer from the registry resets it.
    consecutive_failures: int = 0
    #: The loop has ended and deregistration was attempted.
    stopped: bool = False


def backoff(failures: int, interval: float) -> float:
    """The delay after the ``failures``-th failure in a row.

    Doubles from :data:`INITIAL_BACKOFF` and never exceeds ``interval``, so a
    recovered registry hears from the plugin no later than from a healthy one.
    """
    exponent = min(max(failures - 1, 0), 62)
    return min(INITIAL_BACKOFF * 2.0**exponent, interval)


def jitter(seconds: float, uniform: Callable[[], float] = random.random) -> float:
    """``seconds`` ± :data:`JITTER`; ``uniform`` returns a number in [0, 1)."""
    return seconds * (1.0 + JITTER * (2.0 * uniform() - 1.0))


class Heartbeater:
    """Keeps a plugin registered with kplug until :meth:`stop`.

    ``request`` is the declaration sent with every heartbeat; its
    ``interval``, if set, is the interval asked for. ``token_file`` names a
    ServiceAccount token file sent with every call. ``registry_ca`` is the
    PEM of the CA to trust for an ``https://`` registry, required for one.

    Raises :class:`ValueError` for an invalid registry address, an
    ``https://`` one without ``registry_ca``, or a ``registry_ca`` without a
    PEM certificate.
    """

    def __init__(
        self,
        registry: str,
        request: registry_pb2.HeartbeatRequest,
        *,
        token_file: str | None = None,
        registry_ca: bytes | None = None,
        uniform: Callable[[], float] = random.random,
    ) -> None:
        self._target = registry_target(registry)
        self._credentials: grpc.ChannelCredentials | None = None
        if registry_uses_tls(registry):
            if registry_ca is None:
                check_registry(registry, None)
            elif b"-----BEGIN CERTIFICATE-----" not in (registry_ca or b""):
                raise ValueError("the registry CA holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
            self._credentials = grpc.ssl_channel_credentials(root_certificates=registry_ca)
        elif registry_ca is not None:
            _log.warning("ignoring the registry CA: the registry %s is plain http", registry)
        if token_file and self._credentials is None:
            _log.warning("sending the ServiceAccount token to %s over plain http; use https://", registry)
        self._token_file = token_file
        self._token_problem: str | None = None
        self._request = request
        self._uniform = uniform
        asked = _seconds(request.interval) if request.HasField("interval") else None
        self._interval = asked or DEFAULT_INTERVAL
        self._channel = self._dial()
        self._stub = registry_pb2_grpc.RegistryStub(self._channel)
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._in_flight: grpc.Future[registry_pb2.HeartbeatResponse] | None = None
        self._changed = threading.Condition()
        self._status = HeartbeatStatus()
        self._thread = threading.Thread(target=self._run, name="kplug-heartbeat", daemon=True)

    @property
    def status(self) -> HeartbeatStatus:
        """A snapshot of what the heartbeats have achieved."""
        with self._changed:
            return self._status

    def wait_for(self, predicate: Callable[[HeartbeatStatus], bool], timeout: float) -> bool:
        """Waits until ``predicate(status)`` holds; ``False`` if ``timeout`` seconds pass first."""
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self._status), timeout)

    def start(self) -> None:
        """Starts heartbeating on a background thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stops heartbeating and deregisters; returns when done. Safe to call more than once."""
        with self._lock:
            self._stopping.set()
            if self._in_flight is not None:
                self._in_flight.cancel()
        if self._thread.is_alive():
            self._thread.join(DEREGISTER_TIMEOUT + 5.0)
            if self._thread.is_alive():
                _log.warning("heartbeat thread did not finish deregistering in time")
        elif self._thread.ident is None:
            self._update(lambda status: replace(status, stopped=True))
        self._channel.close()

    def _run(self) -> None:
        _log.debug("heartbeating %r into %s", self._request.name, self._target)
        while not self._stopping.is_set():
            delay = self._heartbeat()
            if self._stopping.wait(delay):
                break
        self._deregister()

    def _heartbeat(self) -> float:
        """Sends one heartbeat and returns how long to wait for the next."""
        timeout = max(self._interval, MIN_HEARTBEAT_TIMEOUT)
        metadata = self._metadata()
        with self._lock:
            if self._stopping.is_set():
                return 0.0
            call = self._stub.Heartbeat.future(self._request, timeout=timeout, metadata=metadata)
            self._in_flight = call
        try:
            reply = call.result()
        except grpc.FutureCancelledError:
            return 0.0  # stop() abandoned it; deregistration supersedes it
        except grpc.RpcError as error:
            if self._stopping.is_set():
                return 0.0
            code, message = _status_of(error)
            if code in _DENIED:
                return self._denied(code, message)
            return self._failed(error)
        finally:
            with self._lock:
                self._in_flight = None
        return self._answered(reply)

    def _answered(self, reply: registry_pb2.HeartbeatResponse) -> float:
        asked = _seconds(reply.interval) if reply.HasField("interval") else None
        if asked:
            if asked != self._interval:
                _log.debug("registry set the heartbeat interval to %.3gs", asked)
            self._interval = asked
        previous = self.status
        self._reachable(previous)
        result: HeartbeatResult
        if reply.accepted:
            result = Accepted()
            if previous.uid is None:
                _log.info(
                    "registered with kplug as %r (uid %s), heartbeating every %.3gs",
                    self._request.name,
                    reply.uid,
                    self._interval,
                )
            elif previous.uid != reply.uid:
                _log.info(
                    "registered again under a new uid %s (was %s): the registration expired or the registry restarted",
                    reply.uid,
                    previous.uid,
                )
            else:
                _log.debug("heartbeat accepted")
        else:
            result = Refused(reply.reason, reply.message)
            _log.warning(
                "kplug refused the heartbeat: %s (%s); retrying in %.3gs",
                reply.message,
                reply.reason,
                self._interval,
            )
        ttl = _seconds(reply.ttl) if reply.HasField("ttl") else None
        self._update(
            lambda status: replace(
                status,
                uid=reply.uid if reply.accepted else None,
                interval=asked or status.interval,
                ttl=ttl if reply.accepted else status.ttl,
                last=result,
                consecutive_failures=0,
            )
        )
        return jitter(self._interval, self._uniform)

    def _denied(self, code: grpc.StatusCode, message: str) -> float:
        """kplug refused the call: retried at the interval, like a refusal in the answer."""
        self._reachable(self.status)
        _log.warning(
            "kplug refused the heartbeat: %s (%s); retrying in %.3gs",
            message,
            code.name,
            self._interval,
        )
        result = Refused(_DENIED[code], message)
        self._update(lambda status: replace(status, uid=None, last=result, consecutive_failures=0))
        return jitter(self._interval, self._uniform)

    @staticmethod
    def _reachable(previous: HeartbeatStatus) -> None:
        if previous.consecutive_failures:
            _log.info("registry reachable again after %d failed heartbeats", previous.consecutive_failures)

    def _metadata(self) -> Metadata | None:
        """The ``authorization`` metadata from the token file, read afresh; ``None`` without one."""
        if self._token_file is None:
            return None
        try:
            token, problem = _read_token(self._token_file), None
        except (OSError, ValueError) as error:
            token, problem = None, str(error)
        if problem is None:
            if self._token_problem is not None:
                _log.info("the token file %s is usable again", self._token_file)
            self._token_problem = None
            return (("authorization", f"Bearer {token}"),)
        if problem != self._token_problem:
            _log.warning(
                "cannot use the ServiceAccount token file %s (%s); sending without a token, "
                "which kplug in cluster mode refuses",
                self._token_file,
                problem,
            )
            self._token_problem = problem
        else:
            _log.debug("heartbeating without a token: %s", problem)
        return None

    def _failed(self, error: grpc.RpcError) -> float:
        code, message = _status_of(error)
        # A channel that saw a failure waits out its own reconnect backoff
        # (up to minutes) before dialing again, and one whose peer vanished
        # can hang: dial afresh, so only the backoff below decides.
        self._reconnect()
        failures = self.status.consecutive_failures + 1
        delay = jitter(backoff(failures, self._interval), self._uniform)
        _log.warning(
            "heartbeat to %s failed (%s: %s), %d in a row; retrying in %.3gs",
            self._target,
            code.name,
            message,
            failures,
            delay,
        )
        self._update(lambda status: replace(status, last=Failed(code, message), consecutive_failures=failures))
        return delay

    def _deregister(self) -> None:
        """Best effort: the registry drops the registration at its TTL anyway."""
        request = registry_pb2.DeregisterRequest(name=self._request.name, address=self._request.address)
        try:
            reply = self._stub.Deregister(request, timeout=DEREGISTER_TIMEOUT, metadata=self._metadata())
        except grpc.RpcError as error:
            code, message = _status_of(error)
            _log.warning(
                "could not deregister (%s: %s); kplug drops the registration when its TTL passes",
                code.name,
                message,
            )
        else:
            if reply.removed:
                _log.info("deregistered %r from kplug", self._request.name)
            else:
                _log.debug("nothing to deregister")
        self._update(lambda status: replace(status, uid=None, stopped=True))

    def _dial(self) -> grpc.Channel:
        if self._credentials is None:
            return grpc.insecure_channel(self._target)
        return grpc.secure_channel(self._target, self._credentials)

    def _reconnect(self) -> None:
        with self._lock:
            self._channel.close()
            self._channel = self._dial()
            self._stub = registry_pb2_grpc.RegistryStub(self._channel)

    def _update(self, change: Callable[[HeartbeatStatus], HeartbeatStatus]) -> None:
        with self._changed:
            self._status = change(self._status)
            self._changed.notify_all()


def _read_token(path: str) -> str:
    """The token in ``path``; raises :class:`OSError` or :class:`ValueError` when it is unusable."""
    with open(path, encoding="utf-8") as file:
        token = file.read().strip()
    if not token:
        raise ValueError("the file is empty")
    # grpcio refuses metadata values beyond printable ASCII.
    if not all(" " <= character <= "~" for character in token):
        raise ValueError("the token has characters a gRPC header cannot carry")
    return token


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
