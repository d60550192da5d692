"""The gRPC ``kplug.v1alpha1.Plugin`` service, delegating to a :class:`~kplug.Plugin`."""

from __future__ import annotations

import logging

import grpc

from kplug._wire import InvalidRequestError, decode_request, encode_outcome
from kplug.logcontext import call_context
from kplug.plugin import Plugin
from kplug.proto import plugin_pb2, plugin_pb2_grpc
from kplug.trace import TRACEPARENT, TraceParent, TraceParentError
from kplug.types import Operation, Outcome, Request

_log = logging.getLogger(__name__)


class PluginService(plugin_pb2_grpc.PluginServicer):
    """Serves Reconcile and Finalize by calling the plugin's methods.

    - A request whose object or extensions are not JSON objects is answered
      with ``INVALID_ARGUMENT``; the plugin is not called.
    - A request whose deadline has already passed is answered with
      ``DEADLINE_EXCEEDED``; the plugin is not called.
    - An exception from the plugin (or an outcome that does not fit the wire)
      is logged with its traceback and answered with ``INTERNAL`` carrying
      its message; the server keeps serving.
    - A ``traceparent`` in the call's metadata becomes
      :attr:`Request.traceparent` when valid and is ignored otherwise. The
      call is handled inside :func:`kplug.logcontext.call_context`, so log
      records (the plugin's too) carry its operation id and trace id.
    """

    def __init__(self, plugin: Plugin) -> None:
        self._plugin = plugin

    def Reconcile(  # noqa: N802 - the generated servicer's name
        self, request: plugin_pb2.ReconcileRequest, context: grpc.ServicerContext
    ) -> plugin_pb2.ReconcileResponse:
        return self._call(Operation.RECONCILE, request, context)

    def Finalize(  # noqa: N802 - the generated servicer's name
        self, request: plugin_pb2.ReconcileRequest, context: grpc.ServicerContext
    ) -> plugin_pb2.ReconcileResponse:
        return self._call(Operation.FINALIZE, request, context)

    def _call(
        self,
        operation: Operation,
        message: plugin_pb2.ReconcileRequest,
        context: grpc.ServicerContext,
    ) -> plugin_pb2.ReconcileResponse:
        values = [value for key, value in context.invocation_metadata() if key == TRACEPARENT]
        traceparent, problem = _traceparent(values)
        with call_context(message.operation_id, traceparent.trace_id if traceparent else None):
            if problem:
                _log.debug("ignoring the traceparent metadata: %s", problem)
            try:
                request = decode_request(
                    operation, message, context.time_remaining(), str(traceparent) if traceparent else None
                )
            except InvalidRequestError as error:
                _log.warning("rejected %s %s: %s", operation, message.operation_id or "(no operation id)", error)
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
            subject = _describe(request)
            if request.time_remaining() == 0:
                context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"{operation} of {subject} arrived after its deadline")
            try:
                return self._handle(request, subject)
            except _PluginError as error:
                context.abort(grpc.StatusCode.INTERNAL, str(error))

    def _handle(self, request: Request, subject: str) -> plugin_pb2.ReconcileResponse:
        """Calls the plugin; its failures become :class:`_PluginError`."""
        operation = request.operation
        _log.debug("%s %s (operation %s, dry run %s)", operation, subject, request.operation_id, request.dry_run)
        handler = self._plugin.reconcile if operation is Operation.RECONCILE else self._plugin.finalize
        try:
            outcome = handler(request)
            if not isinstance(outcome, Outcome):
                raise TypeError(f"{operation.lower()}() returned {type(outcome).__name__}, not kplug.Outcome")
            response = encode_outcome(outcome)
        except Exception as error:  # the plugin's bug must not take the server down
            _log.exception("%s of %s failed (operation %s)", operation, subject, request.operation_id)
            raise _PluginError(f"{operation} of {subject} failed: {type(error).__name__}: {error}") from error
        _log.info(
            "%s of %s %s%s: %s",
            operation,
            subject,
            "succeeded" if outcome.succeeded else "failed",
            " (dry run)" if request.dry_run else "",
            "; ".join(f"{r.reason}: {r.message}" if r.message else r.reason for r in outcome.results) or "-",
        )
        return response


class _PluginError(Exception):
    """The plugin raised, or answered with something that is not a valid outcome."""


def _traceparent(values: list[str | bytes]) -> tuple[TraceParent | None, str | None]:
    """The trace context of a call's ``traceparent`` metadata values, or why there is none usable."""
    if not values:
        return None, None
    if len(values) > 1:
        # What a combined header would be: invalid. (grpc-core currently
        # hands on only the last of several values.)
        return None, "more than one traceparent"
    value = values[0]
    if not isinstance(value, str):
        return None, "traceparent is not text"
    try:
        return TraceParent.parse(value), None
    except TraceParentError as error:
        return None, str(error)


def _describe(request: Request) -> str:
    """``Kind namespace/name`` for logs."""
    kind = request.object.get("kind") or "object"
    name = f"{request.namespace}/{request.name}" if request.namespace else request.name
    return f"{kind} {name!r}"
