"""Log records that say which call they belong to: ``%(operation_id)s`` and ``%(trace_id)s``.

While the SDK handles a Reconcile or Finalize call, the call's operation id
and trace id (from the ``traceparent`` kplug sent) are set in a
:class:`contextvars.ContextVar`. :class:`LogContextFilter` copies them onto
every log record that passes a handler it is attached to, the plugin's own
records included, as ``operation_id`` and ``trace_id`` (``-`` when there is
none, e.g. outside a call or for a call without a trace context).

:func:`kplug.run` attaches the filter to the stderr handler it sets up and
logs with :data:`LOG_FORMAT`. An application that configures logging itself
attaches the filter to its handlers::

    handler = logging.StreamHandler()
    handler.addFilter(kplug.LogContextFilter())
    handler.setFormatter(logging.Formatter("%(levelname)s trace_id=%(trace_id)s %(message)s"))
    logging.getLogger().addHandler(handler)

The context belongs to the thread handling the call: threads the plugin
starts itself do not inherit it (:func:`contextvars.copy_context` takes it
along).
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

#: What a record outside a call (or without a trace context) shows.
NONE = "-"

#: :func:`kplug.run`'s log format: the call's ids before each message.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s operation_id=%(operation_id)s trace_id=%(trace_id)s: %(message)s"


@dataclass(frozen=True, slots=True)
class CallIds:
    """The ids of the call being handled."""

    #: The request's ``operation_id``; may be empty.
    operation_id: str
    #: The trace id (32 lowercase hex digits) of the call's ``traceparent``, or ``None``.
    trace_id: str | None = None


_current: contextvars.ContextVar[CallIds | None] = contextvars.ContextVar("kplug_call", default=None)


def current_call() -> CallIds | None:
    """The ids of the call this thread is handling, or ``None`` outside a call."""
    return _current.get()


@contextmanager
def call_context(operation_id: str, trace_id: str | None) -> Iterator[CallIds]:
    """Sets the call's ids for the duration of the ``with`` block, in this thread (or task)."""
    ids = CallIds(operation_id, trace_id)
    token = _current.set(ids)
    try:
        yield ids
    finally:
        _current.reset(token)


class LogContextFilter(logging.Filter):
    """Adds ``operation_id`` and ``trace_id`` to each record; never drops one.

    A record that already has such an attribute, e.g. from ``extra=``, keeps it.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        ids = _current.get()
        if not hasattr(record, "operation_id"):
            record.operation_id = (ids.operation_id if ids else "") or NONE
        if not hasattr(record, "trace_id"):
            record.trace_id = (ids.trace_id if ids else None) or NONE
        return True
