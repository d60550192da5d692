"""The plugin's release, announced to kplug."""

__version__ = "0.1.0"
