"""The W3C trace context (``traceparent``) that kplug sends with every call.

kplug passes the trace context it got from the operator (or started itself)
to the plugin as gRPC metadata, so that every hop can log the same trace id.
No OpenTelemetry pipeline is needed for that: the value is a fixed format
(https://www.w3.org/TR/trace-context/#traceparent-header), e.g.
``00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01``. This is the
Python twin of kplug's ``kplug_proto::trace`` and accepts and rejects the
same values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Self

#: The gRPC metadata key (and HTTP header).
TRACEPARENT = "traceparent"

#: Why a value was ignored; the messages match kplug's.
MALFORMED = "traceparent must be version-traceid-parentid-flags in lowercase hex"
INVALID_VERSION = "traceparent version ff is invalid"
ZERO_ID = "traceparent trace-id and parent-id must not be all zeros"

_FIELDS = (("version", 2), ("trace-id", 32), ("parent-id", 16), ("flags", 2))
_LOWER_HEX = re.compile(r"[0-9a-f]*")


class TraceParentError(ValueError):
    """A ``traceparent`` value that is not valid; its message says why."""


@dataclass(frozen=True, slots=True)
class TraceParent:
    """A parsed ``traceparent``: which trace, which span is the caller, and the caller's flags."""

    #: 32 lowercase hex digits, not all zeros.
    trace_id: str
    #: The caller's span id: 16 lowercase hex digits, not all zeros.
    parent_id: str
    #: Bit 0: sampled.
    flags: int

    @classmethod
    def parse(cls, value: str) -> Self:
        """Parses a ``traceparent`` value; raises :class:`TraceParentError` when it is not valid.

        Version ``00`` is exactly ``00-<32 hex>-<16 hex>-<2 hex>`` (55
        characters); a later version may append fields after another dash,
        which are ignored; version ``ff`` is invalid. Hex digits must be
        lowercase, and neither id may be all zeros.
        """
        fields = value.strip(" \t").split("-", 4)
        if len(fields) < 4:
            raise TraceParentError(MALFORMED)
        for field, (_, length) in zip(fields, _FIELDS, strict=False):
            if len(field) != length or not _LOWER_HEX.fullmatch(field):
                raise TraceParentError(MALFORMED)
        version, trace_id, parent_id, flags = fields[:4]
        if version == "ff":
            raise TraceParentError(INVALID_VERSION)
        # Version 00 has exactly four fields; later versions may append more.
        if version == "00" and len(fields) > 4:
            raise TraceParentError(MALFORMED)
        if trace_id == "0" * 32 or parent_id == "0" * 16:
            raise TraceParentError(ZERO_ID)
        return cls(trace_id=trace_id, parent_id=parent_id, flags=int(flags, 16))

    @property
    def sampled(self) -> bool:
        """Whether the caller records the trace (flag bit 0)."""
        return bool(self.flags & 0x01)

    def __str__(self) -> str:
        """The value as version ``00``, e.g. to pass the context on."""
        return f"00-{self.trace_id}-{self.parent_id}-{self.flags:02x}"


def parse_traceparent(value: str | None) -> TraceParent | None:
    """The parsed ``value``, or ``None`` when it is missing or not valid."""
    if value is None:
        return None
    try:
        return TraceParent.parse(value)
    except TraceParentError:
        return None
