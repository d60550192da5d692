"""When heartbeats go out: intervals, backoff, jitter and the shutdown time limits (pure)."""

from __future__ import annotations

import random
from collections.abc import Callable

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
#: Shutdown waits at most this long for each kplug to take note that the
#: instance is draining; a kplug that is down does not hold shutdown up longer.
DRAIN_NOTICE_TIMEOUT = 2.0
#: Shutdown waits at most this long to deregister; past it, kplug drops the
#: registration when its TTL passes anyway.
DEREGISTER_TIMEOUT = 2.0
#: How often a registry host name is resolved again to follow kplug replicas
#: coming and going (a headless Service); sooner, at the failure backoff,
#: while it does not resolve.
RESOLVE_INTERVAL = 30.0


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
