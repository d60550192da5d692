"""The generated gRPC contract, for plugins that need more than the SDK wraps.

The modules are generated from ``proto/kplug/v1alpha1/*.proto`` by
``sdk/python/generate.sh``.
"""

from kplug._proto.kplug.v1alpha1 import plugin_pb2, plugin_pb2_grpc, registry_pb2, registry_pb2_grpc

#: The wire protocol version this SDK speaks.
PROTOCOL_VERSION = "v1alpha1"

__all__ = ["PROTOCOL_VERSION", "plugin_pb2", "plugin_pb2_grpc", "registry_pb2", "registry_pb2_grpc"]
