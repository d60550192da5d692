"""The SDK's release, announced to kplug as kplug-sdk-python/<version>."""

__version__ = "0.1.0"
