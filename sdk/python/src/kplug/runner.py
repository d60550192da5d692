"""``kplug.run``: a plugin's whole life as a process, from flags to graceful shutdown."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from types import FrameType

from kplug.config import add_arguments, from_arguments
from kplug.logcontext import LOG_FORMAT, LogContextFilter
from kplug.plugin import Plugin
from kplug.server import ServeError, _serve, _StoppedError

_log = logging.getLogger(__name__)

_SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: How often the main thread wakes to run Python's signal handlers. The kernel
#: may deliver SIGTERM to any thread (a gRPC or handler thread); Python then
#: only flags it, and a main thread blocked in a wait without a timeout would
#: never run the handler (cpython#85300; gRPC polls for the same reason).
_SIGNAL_CHECK_INTERVAL = 0.25


def run(plugin: Plugin, argv: Sequence[str] | None = None) -> None:
    """Runs ``plugin`` until SIGTERM or SIGINT, then shuts down gracefully and returns.

    Parses the command line (``argv``, default ``sys.argv[1:]``; see
    :mod:`kplug.config` for the flags and their environment variables) along
    with the plugin's own flags (:meth:`Plugin.add_arguments`), sets up
    logging to stderr (unless the application did; each line carries the
    ``operation_id`` and ``trace_id`` of the call it belongs to, see
    :mod:`kplug.logcontext`), serves the plugin and heartbeats into kplug.

    On the first SIGTERM or SIGINT it tells kplug the instance is draining,
    lets in-flight calls finish within ``--drain-timeout``, then stops
    heartbeating and deregisters (:meth:`Server.stop`); a second signal ends
    the process at once. With ``--issued-identity``, a signal that arrives
    while waiting for kplug to sign the first certificate stops the heartbeats
    (deregistering) and returns. Bad flags exit with status 2 and a plugin
    that cannot be served with status 1.

    Must be called from the main thread (Python delivers signals there).
    """
    parser = argparse.ArgumentParser(description=type(plugin).__doc__)
    add_arguments(parser, os.environ)
    plugin.add_arguments(parser)
    args = parser.parse_args(argv)
    _configure_logging(args.log_level)
    try:
        config = from_arguments(args, os.environ)
        plugin.configure(args)
    except ValueError as error:
        parser.error(str(error))

    with _ShutdownSignals() as signals:
        try:
            server = _serve(plugin, config, signals.event)
        except _StoppedError as stopped:
            _log.info("received %s: %s", signals.received, stopped)
            return
        except (ServeError, ValueError) as error:
            _log.error("cannot serve the plugin: %s", error)
            raise SystemExit(1) from None
        try:
            received = signals.wait()
            _log.info("received %s, shutting down", received)
        finally:
            server.stop()


def _configure_logging(level: str) -> None:
    """Logs to stderr unless the application configured logging already.

    Each line carries the operation id and trace id of the call it was
    logged for (``-`` outside calls): see :mod:`kplug.logcontext`.
    """
    root = logging.getLogger()
    if root.handlers:
        return
    logging.basicConfig(level=level, stream=sys.stderr, format=LOG_FORMAT)
    for handler in root.handlers:
        handler.addFilter(LogContextFilter())


class _ShutdownSignals:
    """Turns the first SIGTERM/SIGINT into an event; the handlers are restored on exit.

    Installed before serving starts, so a signal arriving in between is not lost.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self._received = ""
        self._previous: dict[signal.Signals, Callable[[int, FrameType | None], object] | int | None] = {}

    def __enter__(self) -> _ShutdownSignals:
        for sig in _SHUTDOWN_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for sig, handler in self._previous.items():
            # None: the handler was not installed from Python; the default is the best guess.
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)

    @property
    def event(self) -> threading.Event:
        """Set once a shutdown signal arrived."""
        return self._event

    @property
    def received(self) -> str:
        """The name of the signal that arrived; ``""`` before one did."""
        return self._received

    def wait(self) -> str:
        """Blocks until a shutdown signal arrives; returns its name."""
        while not self._event.wait(_SIGNAL_CHECK_INTERVAL):
            pass
        return self._received

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        del frame
        self._received = signal.Signals(signum).name
        self._event.set()
        # A second signal ends the process without waiting for the shutdown.
        for sig in _SHUTDOWN_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
