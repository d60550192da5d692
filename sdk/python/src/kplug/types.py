"""What a plugin receives (:class:`Request`) and what it answers (:class:`Outcome`)."""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from kplug.trace import parse_traceparent

#: A JSON object as decoded by :mod:`json`: integers of any size, nested
#: objects and arrays, ``None`` for ``null``.
JsonObject = dict[str, Any]


class Operation(enum.StrEnum):
    """The RPC kplug called."""

    RECONCILE = "Reconcile"
    """Bring the world in line with the object's spec."""
    FINALIZE = "Finalize"
    """Clean up what the object owns before it is deleted."""


class Severity(enum.StrEnum):
    """How serious a :class:`Result` is."""

    NORMAL = "Normal"
    WARNING = "Warning"
    ERROR = "Error"


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """Names a Kubernetes object, e.g. the extension a status belongs to."""

    api_version: str
    kind: str
    name: str
    namespace: str = ""

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> Self:
        """The reference to ``obj``, a Kubernetes object as a JSON dict."""
        metadata = obj.get("metadata") or {}
        return cls(
            api_version=str(obj.get("apiVersion", "")),
            kind=str(obj.get("kind", "")),
            name=str(metadata.get("name", "")),
            namespace=str(metadata.get("namespace", "") or ""),
        )


@dataclass(frozen=True, slots=True)
class Caller:
    """Who asked kplug for a call, as kplug authenticated them: the ``userInfo`` an admission webhook gets.

    kplug has checked their rights on the object and each extension; a plugin may log it for audit, or refuse
    callers it does not expect.
    """

    #: e.g. ``system:serviceaccount:team-a:widgets-operator``.
    username: str
    groups: tuple[str, ...] = ()
    #: Extra attributes of the user (e.g. ``authentication.kubernetes.io/pod-name``).
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Request:
    """One Reconcile or Finalize call from kplug.

    ``object`` and ``extensions`` are the custom resource and its linked
    extension objects, decoded from JSON.
    """

    operation: Operation
    #: Unique per request: de-duplicates retries and correlates logs.
    operation_id: str
    #: When true the plugin must not change anything, only report what it would do.
    dry_run: bool
    object: JsonObject
    extensions: list[JsonObject] = field(default_factory=list)
    #: Seconds the caller said it would wait, or ``None`` when it did not say.
    timeout: float | None = None
    #: The :func:`time.monotonic` instant by which to answer: the earlier of
    #: ``timeout`` and the gRPC deadline. ``None`` when neither is set.
    deadline: float | None = None
    #: The W3C trace context kplug sent as ``traceparent`` gRPC metadata, as
    #: version ``00`` (e.g. ``00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01``);
    #: ``None`` when it sent none or one that is not valid (which never fails the call).
    traceparent: str | None = None
    #: Who asked kplug for the call; ``None`` from a kplug that predates it.
    caller: Caller | None = None
    #: The children earlier answers asked for, as the operator last observed
    #: them (the live objects, status included), by key.
    observed_children: Mapping[str, JsonObject] = field(default_factory=dict)

    @property
    def trace_id(self) -> str | None:
        """The id of the trace the call belongs to: 32 lowercase hex digits, or ``None``.

        The same id kplug and the operator log; the SDK's log records for the
        call carry it as ``trace_id`` (see :mod:`kplug.logcontext`).
        """
        parsed = parse_traceparent(self.traceparent)
        return parsed.trace_id if parsed else None

    @property
    def name(self) -> str:
        """The object's ``metadata.name``; empty when absent."""
        return str((self.object.get("metadata") or {}).get("name", ""))

    @property
    def namespace(self) -> str:
        """The object's ``metadata.namespace``; empty when absent."""
        return str((self.object.get("metadata") or {}).get("namespace", "") or "")

    @property
    def spec(self) -> JsonObject:
        """The object's ``spec``; empty when absent."""
        spec = self.object.get("spec")
        return spec if isinstance(spec, dict) else {}

    def extension(self, kind: str, api_version: str | None = None) -> JsonObject | None:
        """The first linked extension of ``kind`` (and ``api_version``, if given), or ``None``."""
        for extension in self.extensions:
            if extension.get("kind") == kind and api_version in (None, extension.get("apiVersion")):
                return extension
        return None

    def observed_child(self, key: str) -> JsonObject | None:
        """The child the operator observed under ``key`` (see :class:`Child`), or ``None``."""
        return self.observed_children.get(key)

    def time_remaining(self) -> float | None:
        """Seconds left until :attr:`deadline` (never negative), or ``None`` for no deadline."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - time.monotonic())


@dataclass(frozen=True, slots=True)
class Result:
    """Something the plugin did or found, shown to the operator."""

    #: CamelCase and machine-readable, e.g. ``TableCreated``.
    reason: str
    message: str = ""
    severity: Severity = Severity.NORMAL


CONDITION_STATUSES = ("True", "False", "Unknown")


@dataclass(frozen=True, slots=True)
class Condition:
    """A Kubernetes-style condition to set on the object."""

    type: str
    #: ``"True"``, ``"False"`` or ``"Unknown"``.
    status: str
    reason: str = ""
    message: str = ""

    def __post_init__(self) -> None:
        if self.status not in CONDITION_STATUSES:
            raise ValueError(f"condition status must be one of {CONDITION_STATUSES}, not {self.status!r}")


@dataclass(frozen=True, slots=True)
class Child:
    """A Kubernetes object the plugin wants to exist for the object it reconciles.

    The operator applies it with server-side apply, ties it to the object
    with an owner reference (or, for a cluster-scoped child or one in another
    namespace, which only an operator run with ``--child-scope=cluster``
    accepts, with a label and its inventory), and removes it once an answer
    no longer returns it. ``object`` is *apply intent*: ``apiVersion``, ``kind``,
    ``metadata.name`` and only the fields the plugin cares about, every time.
    A field the plugin stops returning is removed from the child; a field
    someone else set and the plugin never returns stays theirs. No
    ``metadata.ownerReferences`` or ``metadata.managedFields``.
    """

    #: Names the child from one answer to the next: a DNS-1123 label, unique
    #: in the answer. The observed child comes back under it.
    key: str
    object: JsonObject
    #: The plugin's verdict on whether the child is ready; ``None`` leaves it
    #: to the operator's rule (rolled out for workloads, complete for Jobs, a
    #: ``Ready`` or ``Available`` condition where there is one, else exists).
    ready: bool | None = None
    #: Applied once every child of a lower wave is ready; removed, on
    #: deletion, once every child of a higher wave is gone.
    wave: int = 0


@dataclass(slots=True)
class Outcome:
    """A plugin's answer to a :class:`Request`.

    Build one with :meth:`success` or :meth:`failure`, then add to it::

        outcome = kplug.Outcome.success("TableCreated", "created table users")
        outcome.add_condition("Synced", True, "Reconciled")
        outcome.set_extension_status(request.extension("MyExtension"), {"partitions": 4})
        return outcome

    The mutators return the outcome itself, so they chain.
    """

    succeeded: bool
    results: list[Result] = field(default_factory=list)
    conditions: list[Condition] = field(default_factory=list)
    #: JSON for the object's status (merged by the caller); ``None`` for none.
    object_status: JsonObject | None = None
    #: Status for linked extension objects, one entry per object.
    extension_statuses: list[tuple[ObjectRef, JsonObject]] = field(default_factory=list)
    #: Ask to be called again after this many seconds; ``None`` for never.
    requeue_after: float | None = None
    #: The Kubernetes objects that should exist for the object, all of them.
    children: list[Child] = field(default_factory=list)

    @classmethod
    def success(
        cls,
        reason: str | None = None,
        message: str = "",
        *,
        object_status: JsonObject | None = None,
        requeue_after: float | None = None,
    ) -> Self:
        """A successful outcome, with a ``Normal`` result when ``reason`` is given."""
        outcome = cls(succeeded=True, object_status=object_status, requeue_after=requeue_after)
        if reason is not None:
            outcome.add_result(reason, message)
        return outcome

    @classmethod
    def failure(cls, reason: str, message: str, *, requeue_after: float | None = None) -> Self:
        """A failed outcome with an ``Error`` result saying why."""
        return cls(succeeded=False, requeue_after=requeue_after).add_result(reason, message, Severity.ERROR)

    def add_result(self, reason: str, message: str = "", severity: Severity = Severity.NORMAL) -> Self:
        """Appends a result."""
        self.results.append(Result(reason, message, Severity(severity)))
        return self

    def add_condition(self, type: str, status: bool | str, reason: str = "", message: str = "") -> Self:
        """Sets the condition ``type``, replacing an earlier one of that type.

        ``status`` is ``True``/``False`` or one of ``"True"``, ``"False"``, ``"Unknown"``.
        """
        if isinstance(status, bool):
            status = "True" if status else "False"
        condition = Condition(type, status, reason, message)
        self.conditions = [c for c in self.conditions if c.type != type]
        self.conditions.append(condition)
        return self

    def set_extension_status(self, extension: Mapping[str, Any] | ObjectRef, status: Mapping[str, Any]) -> Self:
        """Sets the status of a linked extension, replacing an earlier one for it.

        ``extension`` is the extension object as found in
        :attr:`Request.extensions` (or :meth:`Request.extension`), or a
        reference to it.
        """
        ref = extension if isinstance(extension, ObjectRef) else ObjectRef.of(extension)
        self.extension_statuses = [(r, s) for r, s in self.extension_statuses if r != ref]
        self.extension_statuses.append((ref, dict(status)))
        return self

    def add_child(self, key: str, obj: Mapping[str, Any], *, ready: bool | None = None, wave: int = 0) -> Self:
        """Adds the child ``key`` (see :class:`Child`), replacing an earlier one of that key.

        Return every child on every answer: one left out is removed.
        """
        self.children = [c for c in self.children if c.key != key]
        self.children.append(Child(key, dict(obj), ready, wave))
        return self

    def child(self, key: str) -> Child | None:
        """The child added under ``key``, or ``None``."""
        return next((c for c in self.children if c.key == key), None)

    def extension_status(self, extension: Mapping[str, Any] | ObjectRef) -> JsonObject | None:
        """The status set for a linked extension, or ``None``."""
        ref = extension if isinstance(extension, ObjectRef) else ObjectRef.of(extension)
        return next((status for r, status in self.extension_statuses if r == ref), None)

    def result(self, reason: str) -> Result | None:
        """The first result with ``reason``, or ``None``."""
        return next((r for r in self.results if r.reason == reason), None)

    def condition(self, type: str) -> Condition | None:
        """The condition of ``type``, or ``None``."""
        return next((c for c in self.conditions if c.type == type), None)
