"""Keeping the plugin registered: heartbeats into kplug's registry.

kplug forgets a plugin that stops heartbeating, so :class:`Heartbeater`
never gives up on an unreachable or refusing registry. Each registry address
gets a session on a background thread (:mod:`kplug.heartbeat.session`):

- the first heartbeat goes out at once, later ones at the interval the
  registry asks for, varied by ±10% so plugins started together spread out;
- a failed heartbeat (registry unreachable, RPC error) is retried after an
  exponential backoff starting at 200 ms, never longer than the interval;
- a refused heartbeat (``accepted=false``: the registry is fine, the
  declaration is not) is logged and retried at the interval, and so is a call
  kplug refuses as ``UNAUTHENTICATED`` (no or an invalid ServiceAccount token)
  or ``PERMISSION_DENIED`` (the token's identity may not heartbeat under this
  name): neither fixes itself within a backoff;
- :meth:`Heartbeater.drain` tells every kplug that the instance is shutting
  down (``draining=True``), so they send it no new calls;
- :meth:`Heartbeater.stop` abandons a heartbeat in flight and deregisters.

**Several kplug replicas.** Each kplug replica keeps its own registry in
memory, so a registry host name that resolves to several addresses (a
headless Service) gets a session per address. The name is resolved again
every :data:`RESOLVE_INTERVAL` (30 s), and at the failure backoff while it
does not resolve; sessions start for new addresses and end, without
deregistering, for addresses gone. A failed resolution keeps the sessions
there are. An IP address or ``unix:`` target is dialed as it is, by one
session. Once draining, the addresses are no longer followed.

Against kplug in cluster mode the registry is ``https://`` (trusting the CA
given as ``registry_ca``, and checking the certificate against the registry's
host name whichever of its addresses is dialed) and every heartbeat and the
deregistration carry the ServiceAccount token in ``token_file`` as
``authorization: Bearer <token>``, read afresh each time as the kubelet
rotates it.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import grpc

from kplug.config import check_registry
from kplug.heartbeat.endpoint import Endpoint, Resolve, resolve_addresses
from kplug.heartbeat.session import INSTANCES, Session
from kplug.heartbeat.status import Accepted, Failed, HeartbeatResult, HeartbeatStatus, Refused, summarize
from kplug.heartbeat.timing import (
    DEFAULT_INTERVAL,
    DEREGISTER_TIMEOUT,
    DRAIN_NOTICE_TIMEOUT,
    INITIAL_BACKOFF,
    JITTER,
    MIN_HEARTBEAT_TIMEOUT,
    RESOLVE_INTERVAL,
    backoff,
    jitter,
)
from kplug.heartbeat.token import TokenFile
from kplug.identity import IssuedIdentity
from kplug.proto import registry_pb2

__all__ = [
    "DEFAULT_INTERVAL",
    "DEREGISTER_TIMEOUT",
    "DRAIN_NOTICE_TIMEOUT",
    "INITIAL_BACKOFF",
    "INSTANCES",
    "JITTER",
    "MIN_HEARTBEAT_TIMEOUT",
    "RESOLVE_INTERVAL",
    "Accepted",
    "Failed",
    "HeartbeatResult",
    "HeartbeatStatus",
    "Heartbeater",
    "Refused",
    "Resolve",
    "backoff",
    "jitter",
]

_log = logging.getLogger(__name__)

#: How long :meth:`Heartbeater.stop` waits for the sessions beyond the deregistration timeout.
_STOP_SLACK = 5.0


class Heartbeater:
    """Keeps a plugin registered with kplug (every replica of it) until :meth:`stop`.

    ``request`` is the declaration sent with every heartbeat; its
    ``interval``, if set, is the interval asked for. ``token_file`` names a
    ServiceAccount token file sent with every call. ``registry_ca`` is the
    PEM of the CA to trust for an ``https://`` registry, required for one.
    ``resolve`` turns the registry's host name into addresses (default: the
    system resolver) and ``resolve_interval`` is how often it is asked again;
    both are there for tests. With an ``identity`` (``--issued-identity``),
    heartbeats ask for its certificate when one is due and take what kplug
    answers (:mod:`kplug.identity`).

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
        resolve: Resolve = resolve_addresses,
        resolve_interval: float = RESOLVE_INTERVAL,
        identity: IssuedIdentity | None = None,
    ) -> None:
        self._endpoint = Endpoint.parse(registry)
        self._identity = identity
        self._credentials: grpc.ChannelCredentials | None = None
        if self._endpoint.tls:
            if registry_ca is None:
                check_registry(registry, None)
            elif b"-----BEGIN CERTIFICATE-----" not in registry_ca:
                raise ValueError("the registry CA holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
            self._credentials = grpc.ssl_channel_credentials(root_certificates=registry_ca)
        elif registry_ca is not None:
            _log.warning("ignoring the registry CA: the registry %s is plain http", registry)
        if token_file and self._credentials is None:
            _log.warning("sending the ServiceAccount token to %s over plain http; use https://", registry)
        self._token = TokenFile(token_file)
        self._request = request
        self._uniform = uniform
        self._resolve = resolve
        self._resolve_interval = resolve_interval
        asked = request.interval.seconds + request.interval.nanos / 1e9 if request.HasField("interval") else 0.0
        self._interval = asked if asked > 0 else DEFAULT_INTERVAL
        # Guards everything below; sessions announce status changes on it.
        self._changed = threading.Condition()
        self._sessions: dict[str, Session] = {}
        #: The status while there are no sessions: the name did not resolve (yet).
        self._unresolved = HeartbeatStatus()
        self._started = False
        self._draining = False
        self._stopping = False
        self._resolver: threading.Thread | None = None
        if self._endpoint.host is not None:
            self._resolver = threading.Thread(target=self._follow_addresses, name="kplug-registry-dns", daemon=True)

    @property
    def status(self) -> HeartbeatStatus:
        """A snapshot of what the heartbeats have achieved."""
        with self._changed:
            return self._summary()

    def wait_for(self, predicate: Callable[[HeartbeatStatus], bool], timeout: float) -> bool:
        """Waits until ``predicate(status)`` holds; ``False`` if ``timeout`` seconds pass first."""
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self._summary()), timeout)

    def start(self) -> None:
        """Starts heartbeating on background threads."""
        with self._changed:
            self._started = True
            if self._resolver is None:
                self._follow([self._endpoint.target])
        if self._resolver is not None:
            self._resolver.start()

    def drain(self, timeout: float = DRAIN_NOTICE_TIMEOUT) -> None:
        """Tells every kplug that this instance is shutting down, so it sends no new calls.

        Sends a heartbeat with ``draining=True`` to each registry address
        where the plugin is registered, at once, in parallel, and returns
        when all answered or failed, or after ``timeout`` seconds. Later
        heartbeats say ``draining`` too. A kplug whose last answer lacked
        the ``Instances`` capability might ignore ``draining``: it is
        deregistered from instead. Safe to call more than once.
        """
        with self._changed:
            self._draining = True
            sessions = list(self._sessions.values())
        for session in sessions:
            session.drain()
        deadline = time.monotonic() + timeout
        for session in sessions:
            if not session.wait_drained(max(deadline - time.monotonic(), 0.0)):
                _log.warning("kplug at %s did not take note of the draining in time", session.target)

    def stop(self) -> None:
        """Stops heartbeating and deregisters; returns when done. Safe to call more than once."""
        with self._changed:
            self._stopping = True
            sessions = list(self._sessions.values())
            self._changed.notify_all()
        for session in sessions:
            session.stop()
        deadline = time.monotonic() + DEREGISTER_TIMEOUT + _STOP_SLACK
        for session in sessions:
            if not session.join(max(deadline - time.monotonic(), 0.0)):
                _log.warning("heartbeats to %s did not finish deregistering in time", session.target)
        with self._changed:
            self._unresolved = replace(self._unresolved, stopped=True)
            self._changed.notify_all()

    def _summary(self) -> HeartbeatStatus:
        return summarize({target: session.status for target, session in self._sessions.items()}, self._unresolved)

    def _follow_addresses(self) -> None:
        """Resolves the registry's host name now and then and keeps a session per address."""
        host, failures = self._endpoint.host, 0
        assert host is not None
        while True:
            try:
                targets = self._endpoint.targets(self._resolve(host, self._endpoint.port))
                problem = None if targets else f"{host} has no addresses"
            except OSError as error:
                targets, problem = [], f"cannot resolve {host}: {error}"
            if problem is None:
                failures = 0
                delay = self._resolve_interval
                with self._changed:
                    self._follow(targets)
            else:
                failures += 1
                delay = jitter(backoff(failures, self._interval), self._uniform)
                self._unresolvable(problem, failures, delay)
            with self._changed:
                if self._changed.wait_for(lambda: self._stopping or self._draining, delay):
                    return

    def _unresolvable(self, problem: str, failures: int, delay: float) -> None:
        with self._changed:
            kept = list(self._sessions)
            if not kept:
                failed = Failed(grpc.StatusCode.UNAVAILABLE, problem)
                self._unresolved = replace(self._unresolved, last=failed, consecutive_failures=failures)
                self._changed.notify_all()
        if kept:
            _log.warning("%s, %d in a row; still heartbeating to %s", problem, failures, ", ".join(kept))
        else:
            _log.warning("%s, %d in a row; retrying in %.3gs", problem, failures, delay)

    def _follow(self, targets: list[str]) -> None:
        """Starts sessions for new ``targets`` and stops those for targets gone; holds ``_changed``."""
        if self._stopping or self._draining or not self._started:
            return
        gone = [target for target in self._sessions if target not in targets]
        new = [target for target in targets if target not in self._sessions]
        if gone or (new and self._sessions):
            _log.info("kplug's registry %s is now at %s", self._endpoint.host, ", ".join(targets))
        for target in gone:
            self._sessions.pop(target).stop(deregister=False)
        for target in new:
            session = Session(
                target,
                self._request,
                credentials=self._credentials,
                server_name=self._endpoint.host if self._endpoint.tls else None,
                token=self._token,
                changed=self._changed,
                uniform=self._uniform,
                identity=self._identity,
            )
            self._sessions[target] = session
            session.start()
        if new or gone:
            self._changed.notify_all()
