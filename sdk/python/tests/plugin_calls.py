"""Calls to a plugin that is shutting down: one that kplug sends as it hears of the draining,
whether the plugin still accepts new ones, and what was done when it deregistered."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

import kplug
from kplug.proto import registry_pb2
from kplug.testing import FakeRegistry, PluginClient


def refused(address: str, obj: dict[str, Any]) -> bool:
    """Whether a new call with ``obj`` is left unserved: the plugin stopped accepting calls."""
    with PluginClient(address) as client:
        try:
            client.reconcile(obj, timeout=2)
        except grpc.RpcError as error:
            # Refused at connecting (UNAVAILABLE), by the server shutting down
            # (CANCELLED) or left unserved by it (DEADLINE_EXCEEDED).
            unserved = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED)
            assert error.code() in unserved, error
            return True
    return False


def wait_until_refused(address: str, obj: dict[str, Any], timeout: float = 10.0) -> None:
    """Calls with ``obj`` until one is refused; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not refused(address, obj):
        assert time.monotonic() < deadline, "the plugin kept accepting calls"


class DrainingCall:
    """Answers ``registry``'s heartbeats and deregistrations as it would, and around them:

    kplug picked the instance at ``address`` for a call with ``obj`` just before the first
    draining heartbeat, so the call arrives while kplug answers it (:attr:`outcomes` and
    :attr:`noticed`); at each deregistration, :attr:`finished_when_deregistered` notes what
    ``finished`` says then (whether the call in flight had finished).
    """

    def __init__(
        self, registry: FakeRegistry, address: str, obj: dict[str, Any], finished: Callable[[], bool]
    ) -> None:
        self.outcomes: list[kplug.Outcome] = []
        self.noticed = threading.Event()
        self.finished_when_deregistered: list[bool] = []
        self._registry, self._address, self._obj, self._finished = registry, address, obj, finished
        registry.answer = self._answer
        registry.answer_deregister = self._deregister

    def _answer(self, request: registry_pb2.HeartbeatRequest) -> registry_pb2.HeartbeatResponse:
        if request.draining and not self.noticed.is_set():
            try:
                with PluginClient(self._address) as client:
                    self.outcomes.append(client.reconcile(self._obj, timeout=5))
            finally:
                self.noticed.set()
        return self._registry.accept(request)

    def _deregister(self, request: registry_pb2.DeregisterRequest) -> registry_pb2.DeregisterResponse:
        self.finished_when_deregistered.append(self._finished())
        return self._registry.remove(request)
