"""How the registry is dialed: its address, its addresses (one per kplug replica) and channels.

A registry named by host name is resolved by the SDK itself, not by gRPC:
behind a headless Service every kplug replica has an address of its own and
keeps its own registry in memory, so the plugin heartbeats to each of them
(gRPC would pick one). Over TLS the certificate is still checked against the
host name, not the address dialed (``grpc.ssl_target_name_override``).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

from kplug.config import join_host_port, registry_target, registry_uses_tls, split_host_port

#: Resolves ``(host, port)`` to the IP addresses to heartbeat to.
Resolve = Callable[[str, int], Sequence[str]]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """The registry as configured: ``host:port`` (or a ``unix:`` target) and whether it is TLS."""

    #: The gRPC target for the address as given.
    target: str
    #: The host to resolve and to verify kplug's certificate against;
    #: ``None`` for an IP address or ``unix:`` target, dialed as it is.
    host: str | None
    port: int
    tls: bool

    @classmethod
    def parse(cls, registry: str) -> Endpoint:
        """The endpoint for a ``--registry`` value; raises :class:`ValueError` if invalid."""
        target = registry_target(registry)
        tls = registry_uses_tls(registry)
        if target.startswith("unix:"):
            return cls(target, None, 0, tls)
        host, port = split_host_port(target)
        return cls(target, None if _is_ip(host) else host, port, tls)

    def targets(self, addresses: Sequence[str]) -> list[str]:
        """The gRPC targets for the resolved ``addresses`` of :attr:`host`."""
        return sorted({join_host_port(address, self.port) for address in addresses})


def resolve_addresses(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (A and AAAA records), sorted.

    Raises :class:`OSError` (:class:`socket.gaierror`) when it does not resolve.
    """
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def dial(target: str, credentials: grpc.ChannelCredentials | None, server_name: str | None) -> grpc.Channel:
    """A channel to ``target``; over TLS verifying the certificate for ``server_name`` if given.

    Every channel gets its own connection (a local subchannel pool), so
    dialing afresh after a failure really dials afresh.
    """
    options: list[tuple[str, str | int]] = [("grpc.use_local_subchannel_pool", 1)]
    if credentials is None:
        return grpc.insecure_channel(target, options=options)
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    return grpc.secure_channel(target, credentials, options=options)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
