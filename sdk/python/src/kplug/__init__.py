"""Write `kplug <https://github.com/kplug/kplug>`_ plugins in Python.

A plugin is a small gRPC server that kplug calls to reconcile a custom
resource. Subclass :class:`Plugin`, implement :meth:`Plugin.reconcile` (and
:meth:`Plugin.finalize` if the object owns anything), and hand an instance to
:func:`run`::

    import kplug

    class Hello(kplug.Plugin):
        name = "hello-python"
        api = "greetings.example.com/v1"
        implementation = "Hello"
        version = "0.1.0"

        def reconcile(self, request: kplug.Request) -> kplug.Outcome:
            return kplug.Outcome.success("Greeted", f"hello, {request.name}")

    if __name__ == "__main__":
        kplug.run(Hello())

:func:`run` parses flags and environment variables (:mod:`kplug.config`),
serves the plugin with gRPC health checking, heartbeats into kplug's
registry on a background thread and shuts down gracefully on SIGTERM or
SIGINT. :func:`serve` does the serving part and returns a :class:`Server`
handle, for tests and for applications that manage their own lifecycle;
:mod:`kplug.testing` has a fake registry and a client for tests.

Calls are served by grpcio's synchronous server from a thread pool, so
``reconcile`` and ``finalize`` are plain methods that may block (on a
database, say) and may run concurrently for different objects.

Several processes may serve one plugin, each an *instance* (``--instance``,
default the pod's name); on shutdown each tells kplug it is draining before
it stops accepting calls, so none is lost. A registry name with several
addresses (kplug replicas) gets heartbeats at each (:mod:`kplug.heartbeat`),
and plugins may serve mutual TLS from rotating files (:mod:`kplug.tls`) or
with the certificate kplug issues them (:mod:`kplug.identity`).

kplug sends each call with a W3C trace context; :attr:`Request.trace_id` is
its trace id, and log records emitted while handling the call carry
``operation_id`` and ``trace_id`` (:mod:`kplug.logcontext`).
"""

from kplug._version import __version__
from kplug.config import Config
from kplug.heartbeat import HeartbeatStatus
from kplug.logcontext import LogContextFilter
from kplug.plugin import ApiRef, Extension, Plugin
from kplug.runner import run
from kplug.server import SDK, ServeError, Server, serve
from kplug.trace import TraceParent
from kplug.types import (
    Caller,
    Child,
    Condition,
    JsonObject,
    ObjectRef,
    Operation,
    Outcome,
    Request,
    Result,
    Severity,
)

__all__ = [
    "SDK",
    "ApiRef",
    "Caller",
    "Child",
    "Condition",
    "Config",
    "Extension",
    "HeartbeatStatus",
    "JsonObject",
    "LogContextFilter",
    "ObjectRef",
    "Operation",
    "Outcome",
    "Plugin",
    "Request",
    "Result",
    "ServeError",
    "Server",
    "Severity",
    "TraceParent",
    "__version__",
    "run",
    "serve",
]
