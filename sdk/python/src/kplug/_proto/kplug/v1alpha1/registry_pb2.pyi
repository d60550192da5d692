import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HeartbeatRequest(_message.Message):
    __slots__ = ("name", "version", "api", "implementation", "address", "extensions", "labels", "interval", "protocol", "instance", "draining", "server_name", "certificate_request", "trust_bundle_sha256", "canary_weight", "shadow_percent")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    API_FIELD_NUMBER: _ClassVar[int]
    IMPLEMENTATION_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    EXTENSIONS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    SERVER_NAME_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_REQUEST_FIELD_NUMBER: _ClassVar[int]
    TRUST_BUNDLE_SHA256_FIELD_NUMBER: _ClassVar[int]
    CANARY_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    SHADOW_PERCENT_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    api: PluginApi
    implementation: str
    address: str
    extensions: _containers.RepeatedCompositeFieldContainer[ExtensionKind]
    labels: _containers.ScalarMap[str, str]
    interval: _duration_pb2.Duration
    protocol: Protocol
    instance: str
    draining: bool
    server_name: str
    certificate_request: bytes
    trust_bundle_sha256: bytes
    canary_weight: int
    shadow_percent: int
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., api: _Optional[_Union[PluginApi, _Mapping]] = ..., implementation: _Optional[str] = ..., address: _Optional[str] = ..., extensions: _Optional[_Iterable[_Union[ExtensionKind, _Mapping]]] = ..., labels: _Optional[_Mapping[str, str]] = ..., interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., protocol: _Optional[_Union[Protocol, _Mapping]] = ..., instance: _Optional[str] = ..., draining: _Optional[bool] = ..., server_name: _Optional[str] = ..., certificate_request: _Optional[bytes] = ..., trust_bundle_sha256: _Optional[bytes] = ..., canary_weight: _Optional[int] = ..., shadow_percent: _Optional[int] = ...) -> None: ...

class PluginApi(_message.Message):
    __slots__ = ("group", "resource", "version")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    group: str
    resource: str
    version: str
    def __init__(self, group: _Optional[str] = ..., resource: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class ExtensionKind(_message.Message):
    __slots__ = ("group", "kind", "version")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    group: str
    kind: str
    version: str
    def __init__(self, group: _Optional[str] = ..., kind: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class Protocol(_message.Message):
    __slots__ = ("version", "sdk", "capabilities")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SDK_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    version: str
    sdk: str
    capabilities: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, version: _Optional[str] = ..., sdk: _Optional[str] = ..., capabilities: _Optional[_Iterable[str]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("accepted", "reason", "message", "interval", "ttl", "uid", "server_protocol", "certificate_chain", "trust_bundle", "certificate_renew_after")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    SERVER_PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_CHAIN_FIELD_NUMBER: _ClassVar[int]
    TRUST_BUNDLE_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_RENEW_AFTER_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: str
    message: str
    interval: _duration_pb2.Duration
    ttl: _duration_pb2.Duration
    uid: str
    server_protocol: Protocol
    certificate_chain: str
    trust_bundle: str
    certificate_renew_after: _duration_pb2.Duration
    def __init__(self, accepted: _Optional[bool] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., uid: _Optional[str] = ..., server_protocol: _Optional[_Union[Protocol, _Mapping]] = ..., certificate_chain: _Optional[str] = ..., trust_bundle: _Optional[str] = ..., certificate_renew_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class DeregisterRequest(_message.Message):
    __slots__ = ("name", "address", "instance")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    address: str
    instance: str
    def __init__(self, name: _Optional[str] = ..., address: _Optional[str] = ..., instance: _Optional[str] = ...) -> None: ...

class DeregisterResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: bool
    def __init__(self, removed: _Optional[bool] = ...) -> None: ...
