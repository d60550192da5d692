"""Fixtures for the SDK's tests: a fake registry and plugins served over real gRPC."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

import kplug
from kplug.testing import FakeRegistry, PluginClient


@pytest.fixture
def registry() -> Iterator[FakeRegistry]:
    """A fake registry asking for heartbeats every 10 s (so only the first arrives in a quick test)."""
    with FakeRegistry(interval=10.0) as fake:
        yield fake


Serve = Callable[..., kplug.Server]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Serves a plugin on a free port (``serve(plugin, **config)``); stopped after the test."""
    servers: list[kplug.Server] = []

    def start(plugin: kplug.Plugin, **config: object) -> kplug.Server:
        settings: dict[str, object] = {"registry": None, "listen": "127.0.0.1:0", "drain_timeout": 5.0}
        settings.update(config)
        server = kplug.serve(plugin, kplug.Config(**settings))  # type: ignore[arg-type]
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def client_for() -> Iterator[Callable[[kplug.Server], PluginClient]]:
    """Opens a :class:`PluginClient` to a served plugin; closed after the test."""
    clients: list[PluginClient] = []

    def connect(server: kplug.Server) -> PluginClient:
        client = PluginClient(server.address)
        clients.append(client)
        return client

    yield connect
    for client in clients:
        client.close()
