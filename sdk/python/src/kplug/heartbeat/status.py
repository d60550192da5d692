"""What the heartbeats have achieved: :class:`HeartbeatStatus` and the result of one heartbeat."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import grpc


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
    """The registry could not be reached (or its name not resolved) or the call failed.
    Retried with backoff."""

    #: ``DEADLINE_EXCEEDED`` when no answer came in time; ``UNAVAILABLE``
    #: also when the registry's host name does not resolve.
    code: grpc.StatusCode
    message: str


#: How one heartbeat went.
HeartbeatResult = Accepted | Refused | Failed


@dataclass(frozen=True, slots=True)
class HeartbeatStatus:
    """What the heartbeats have achieved so far.

    kplug may run as several replicas, each with its own registry in memory:
    a registry host name that resolves to several addresses (a headless
    Service) gets heartbeats at each, and :attr:`replicas` has the status per
    address. The other fields sum them up so that, with a single registry
    address, they read as that registry's: the plugin counts as registered
    (``uid`` set, ``last`` :class:`Accepted`) as soon as one replica accepted
    it.
    """

    #: The registration's uid per the registry's last answer: set by an
    #: accepted heartbeat, cleared by a refusal or deregistration. Failures
    #: leave it alone: the registration outlives them until its TTL passes.
    #: With several replicas, the uid at the first (by address) that has one.
    uid: str | None = None
    #: The interval the registry last asked for, in seconds.
    interval: float | None = None
    #: How long the registry keeps the registration without heartbeats, per
    #: its last accepted answer, in seconds.
    ttl: float | None = None
    #: The latest heartbeat's result; ``None`` before the first answer or
    #: failure. With several replicas: :class:`Accepted` when any replica
    #: accepted the plugin, else a refusal when any refused it, else a
    #: failure. A registry host name that does not resolve is a failure too,
    #: with the code ``UNAVAILABLE``.
    last: HeartbeatResult | None = None
    #: Heartbeats that failed in a row; any answer from the registry resets
    #: it. With several replicas, the fewest of any replica.
    consecutive_failures: int = 0
    #: The loop has ended and deregistration was attempted (at every replica).
    stopped: bool = False
    #: The capabilities the registry announced in its last answer
    #: (``server_protocol``), e.g. ``Instances``; ``None`` before one.
    server_capabilities: frozenset[str] | None = None
    #: Shutdown has begun: heartbeats tell kplug that this instance is
    #: draining, so that it sends no new calls.
    draining: bool = False
    #: One entry per kplug replica heartbeated to, by address (``host:port``
    #: as resolved from the registry's host name, or the one address given),
    #: sorted; empty before the name resolved.
    replicas: Mapping[str, HeartbeatStatus] = field(default_factory=dict)


def summarize(replicas: Mapping[str, HeartbeatStatus], fallback: HeartbeatStatus) -> HeartbeatStatus:
    """The status summing up the ``replicas``' (see :class:`HeartbeatStatus`); ``fallback`` without any."""
    if not replicas:
        return fallback
    ordered = dict(sorted(replicas.items()))
    statuses = list(ordered.values())
    chosen = next((status for status in statuses if status.uid is not None), statuses[0])
    results = [status.last for status in statuses if status.last is not None]
    last = next(
        (result for kind in (Accepted, Refused) for result in results if isinstance(result, kind)),
        results[0] if results else None,
    )
    return replace(
        chosen,
        last=last,
        consecutive_failures=min(status.consecutive_failures for status in statuses),
        stopped=all(status.stopped for status in statuses),
        draining=any(status.draining for status in statuses),
        replicas=ordered,
    )
