"""Converting between the gRPC messages and the SDK's :mod:`kplug.types`."""

from __future__ import annotations

import json
import math
import time
from typing import Any

from google.protobuf import duration_pb2

from kplug.proto import plugin_pb2
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

_SEVERITIES = {
    Severity.NORMAL: plugin_pb2.SEVERITY_NORMAL,
    Severity.WARNING: plugin_pb2.SEVERITY_WARNING,
    Severity.ERROR: plugin_pb2.SEVERITY_ERROR,
}
_SEVERITY_NAMES = {number: severity for severity, number in _SEVERITIES.items()}
_READINESS = {
    None: plugin_pb2.READINESS_UNSPECIFIED,
    True: plugin_pb2.READINESS_READY,
    False: plugin_pb2.READINESS_NOT_READY,
}
_READINESS_VERDICTS = {number: verdict for verdict, number in _READINESS.items()}


class InvalidRequestError(ValueError):
    """The request cannot be handed to the plugin, e.g. its object is not JSON."""


def decode_request(
    operation: Operation,
    message: plugin_pb2.ReconcileRequest,
    rpc_time_remaining: float | None,
    traceparent: str | None = None,
) -> Request:
    """The :class:`Request` for ``message``; ``rpc_time_remaining`` is the gRPC deadline, if any.

    ``traceparent`` is the call's valid trace context, if any.

    Raises :class:`InvalidRequestError` when the object or an extension is not a JSON object.
    """
    timeout = duration_seconds(message.timeout) if message.HasField("timeout") else None
    budgets = [b for b in (timeout, rpc_time_remaining) if b is not None and b > 0]
    return Request(
        operation=operation,
        operation_id=message.operation_id,
        dry_run=message.dry_run,
        object=decode_json_object(message.object, "object"),
        extensions=[decode_json_object(e, f"extensions[{i}]") for i, e in enumerate(message.extensions)],
        timeout=timeout,
        deadline=time.monotonic() + min(budgets) if budgets else None,
        traceparent=traceparent,
        caller=decode_caller(message.caller) if message.HasField("caller") else None,
        observed_children={
            child.key: decode_json_object(child.object, f"observedChildren[{i}].object")
            for i, child in enumerate(message.observed_children)
        },
    )


def decode_caller(user: plugin_pb2.UserInfo) -> Caller:
    """The :class:`Caller` of a ``UserInfo`` message."""
    return Caller(
        username=user.username,
        groups=tuple(user.groups),
        extra={key: tuple(value.values) for key, value in user.extra.items()},
    )


def decode_json_object(data: bytes, what: str) -> JsonObject:
    """Decodes UTF-8 JSON that must be an object; integers keep their full size."""
    if not data:
        raise InvalidRequestError(f"{what} is empty")
    try:
        value = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError as error:
        raise InvalidRequestError(f"{what} is not UTF-8: {error}") from None
    except ValueError as error:  # JSONDecodeError, or NaN/Infinity
        raise InvalidRequestError(f"{what} is not valid JSON: {error}") from None
    except RecursionError:
        raise InvalidRequestError(f"{what} is nested too deeply") from None
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{what} must be a JSON object, not {type(value).__name__}")
    return value


def encode_json(value: Any, what: str) -> bytes:
    """Encodes ``value`` as compact UTF-8 JSON; :class:`TypeError` or :class:`ValueError` if it is not JSON."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError) as error:
        raise type(error)(f"{what} is not JSON: {error}") from error


def encode_outcome(outcome: Outcome) -> plugin_pb2.ReconcileResponse:
    """The response for ``outcome``.

    Raises :class:`TypeError` or :class:`ValueError` for an outcome that does
    not fit the wire, e.g. a status that is not JSON.
    """
    response = plugin_pb2.ReconcileResponse(
        success=outcome.succeeded,
        results=[
            plugin_pb2.Result(severity=_SEVERITIES[Severity(r.severity)], reason=r.reason, message=r.message)
            for r in outcome.results
        ],
        conditions=[
            plugin_pb2.Condition(type=c.type, status=c.status, reason=c.reason, message=c.message)
            for c in outcome.conditions
        ],
        extension_statuses=[
            plugin_pb2.ExtensionStatus(
                ref=plugin_pb2.ObjectReference(
                    api_version=ref.api_version, kind=ref.kind, namespace=ref.namespace, name=ref.name
                ),
                status=encode_json(status, f"status of {ref.kind} {ref.name!r}"),
            )
            for ref, status in outcome.extension_statuses
        ],
        desired_children=[
            plugin_pb2.DesiredChild(
                key=child.key,
                object=encode_json(child.object, f"child {child.key!r}"),
                ready=_READINESS[child.ready],
                wave=child.wave,
            )
            for child in outcome.children
        ],
    )
    if outcome.object_status is not None:
        response.object_status = encode_json(outcome.object_status, "object_status")
    if outcome.requeue_after is not None:
        response.requeue_after.CopyFrom(seconds_duration(outcome.requeue_after))
    return response


def decode_outcome(response: plugin_pb2.ReconcileResponse) -> Outcome:
    """The :class:`Outcome` a response carries (the client side of :func:`encode_outcome`)."""
    return Outcome(
        succeeded=response.success,
        results=[
            Result(r.reason, r.message, _SEVERITY_NAMES.get(r.severity, Severity.NORMAL)) for r in response.results
        ],
        conditions=[Condition(c.type, c.status, c.reason, c.message) for c in response.conditions],
        object_status=json.loads(response.object_status) if response.object_status else None,
        extension_statuses=[
            (
                ObjectRef(s.ref.api_version, s.ref.kind, s.ref.name, s.ref.namespace),
                json.loads(s.status) if s.status else {},
            )
            for s in response.extension_statuses
        ],
        requeue_after=duration_seconds(response.requeue_after) if response.HasField("requeue_after") else None,
        children=[
            Child(c.key, json.loads(c.object), _READINESS_VERDICTS.get(c.ready), c.wave)
            for c in response.desired_children
        ],
    )


def seconds_duration(seconds: float) -> duration_pb2.Duration:
    """A protobuf Duration of ``seconds``, which must be finite and not negative."""
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"a duration must be a finite, non-negative number of seconds, not {seconds!r}")
    duration = duration_pb2.Duration()
    duration.FromNanoseconds(round(seconds * 1e9))
    return duration


def duration_seconds(duration: duration_pb2.Duration) -> float:
    """A protobuf Duration in seconds."""
    return duration.seconds + duration.nanos / 1e9


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in JSON")
