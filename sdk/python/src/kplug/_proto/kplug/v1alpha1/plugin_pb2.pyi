import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Readiness(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    READINESS_UNSPECIFIED: _ClassVar[Readiness]
    READINESS_READY: _ClassVar[Readiness]
    READINESS_NOT_READY: _ClassVar[Readiness]

class Severity(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEVERITY_UNSPECIFIED: _ClassVar[Severity]
    SEVERITY_NORMAL: _ClassVar[Severity]
    SEVERITY_WARNING: _ClassVar[Severity]
    SEVERITY_ERROR: _ClassVar[Severity]
READINESS_UNSPECIFIED: Readiness
READINESS_READY: Readiness
READINESS_NOT_READY: Readiness
SEVERITY_UNSPECIFIED: Severity
SEVERITY_NORMAL: Severity
SEVERITY_WARNING: Severity
SEVERITY_ERROR: Severity

class ReconcileRequest(_message.Message):
    __slots__ = ("operation_id", "dry_run", "object", "extensions", "timeout", "caller", "observed_children")
    OPERATION_ID_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    EXTENSIONS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_CHILDREN_FIELD_NUMBER: _ClassVar[int]
    operation_id: str
    dry_run: bool
    object: bytes
    extensions: _containers.RepeatedScalarFieldContainer[bytes]
    timeout: _duration_pb2.Duration
    caller: UserInfo
    observed_children: _containers.RepeatedCompositeFieldContainer[ObservedChild]
    def __init__(self, operation_id: _Optional[str] = ..., dry_run: _Optional[bool] = ..., object: _Optional[bytes] = ..., extensions: _Optional[_Iterable[bytes]] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., caller: _Optional[_Union[UserInfo, _Mapping]] = ..., observed_children: _Optional[_Iterable[_Union[ObservedChild, _Mapping]]] = ...) -> None: ...

class ObservedChild(_message.Message):
    __slots__ = ("key", "object")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    key: str
    object: bytes
    def __init__(self, key: _Optional[str] = ..., object: _Optional[bytes] = ...) -> None: ...

class UserInfo(_message.Message):
    __slots__ = ("username", "groups", "extra")
    class ExtraEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ExtraValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ExtraValue, _Mapping]] = ...) -> None: ...
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    username: str
    groups: _containers.RepeatedScalarFieldContainer[str]
    extra: _containers.MessageMap[str, ExtraValue]
    def __init__(self, username: _Optional[str] = ..., groups: _Optional[_Iterable[str]] = ..., extra: _Optional[_Mapping[str, ExtraValue]] = ...) -> None: ...

class ExtraValue(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, values: _Optional[_Iterable[str]] = ...) -> None: ...

class ReconcileResponse(_message.Message):
    __slots__ = ("success", "results", "conditions", "object_status", "extension_statuses", "requeue_after", "desired_children")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    OBJECT_STATUS_FIELD_NUMBER: _ClassVar[int]
    EXTENSION_STATUSES_FIELD_NUMBER: _ClassVar[int]
    REQUEUE_AFTER_FIELD_NUMBER: _ClassVar[int]
    DESIRED_CHILDREN_FIELD_NUMBER: _ClassVar[int]
    success: bool
    results: _containers.RepeatedCompositeFieldContainer[Result]
    conditions: _containers.RepeatedCompositeFieldContainer[Condition]
    object_status: bytes
    extension_statuses: _containers.RepeatedCompositeFieldContainer[ExtensionStatus]
    requeue_after: _duration_pb2.Duration
    desired_children: _containers.RepeatedCompositeFieldContainer[DesiredChild]
    def __init__(self, success: _Optional[bool] = ..., results: _Optional[_Iterable[_Union[Result, _Mapping]]] = ..., conditions: _Optional[_Iterable[_Union[Condition, _Mapping]]] = ..., object_status: _Optional[bytes] = ..., extension_statuses: _Optional[_Iterable[_Union[ExtensionStatus, _Mapping]]] = ..., requeue_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., desired_children: _Optional[_Iterable[_Union[DesiredChild, _Mapping]]] = ...) -> None: ...

class DesiredChild(_message.Message):
    __slots__ = ("key", "object", "ready", "wave")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    WAVE_FIELD_NUMBER: _ClassVar[int]
    key: str
    object: bytes
    ready: Readiness
    wave: int
    def __init__(self, key: _Optional[str] = ..., object: _Optional[bytes] = ..., ready: _Optional[_Union[Readiness, str]] = ..., wave: _Optional[int] = ...) -> None: ...

class Result(_message.Message):
    __slots__ = ("severity", "reason", "message")
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    severity: Severity
    reason: str
    message: str
    def __init__(self, severity: _Optional[_Union[Severity, str]] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class Condition(_message.Message):
    __slots__ = ("type", "status", "reason", "message")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    type: str
    status: str
    reason: str
    message: str
    def __init__(self, type: _Optional[str] = ..., status: _Optional[str] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class ObjectReference(_message.Message):
    __slots__ = ("api_version", "kind", "namespace", "name")
    API_VERSION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    api_version: str
    kind: str
    namespace: str
    name: str
    def __init__(self, api_version: _Optional[str] = ..., kind: _Optional[str] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class ExtensionStatus(_message.Message):
    __slots__ = ("ref", "status")
    REF_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ref: ObjectReference
    status: bytes
    def __init__(self, ref: _Optional[_Union[ObjectReference, _Mapping]] = ..., status: _Optional[bytes] = ...) -> None: ...
