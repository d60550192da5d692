"""What a person rotating kplug's plugin CA checks (docs/src/guides/certificates.md): which
CAs each kplug replica signs with and trusts, by its log, and what a plugin
instance serves and accepts, by a TLS handshake with it."""

from __future__ import annotations

import re
import socket
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import NameOID
from kubecluster import Cluster

# An HTTP/2 client's preface and an empty SETTINGS frame: a plugin that
# accepted the handshake answers with its own SETTINGS frame.
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
H2_SETTINGS = 4


def ca_name(certificate: Path) -> str:
    """The common name of the CA in ``certificate`` (PEM), as kplug's log names it."""
    cert = x509.load_pem_x509_certificate(certificate.read_bytes())
    (common_name,) = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(common_name.value)


def plugin_ca_line(signing: str, trusted: list[str]) -> re.Pattern[str]:
    """kplug's log line for a plugin CA that signs with ``signing`` and trusts ``trusted``, in that order."""
    return re.compile(re.escape(f"plugin_ca=signs with {signing}, trusts {' and '.join(trusted)}") + "$", re.MULTILINE)


def pods_logging(cluster: Cluster, namespace: str, pods: list[str], line: re.Pattern[str]) -> list[str]:
    """Those of ``pods`` whose container has logged ``line``."""
    return [pod for pod in pods if line.search(cluster.kubectl("-n", namespace, "logs", pod))]


def handshake(address: str, server_name: str, ca: Path, client: tuple[Path, Path]) -> str | None:
    """None when the plugin instance at ``address`` (host:port) proves to be ``server_name`` with a certificate of
    ``ca`` alone, accepts ``client`` (certificate, key) as its caller and then speaks HTTP/2; else what failed."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cafile=str(ca))
    context.load_cert_chain(str(client[0]), str(client[1]))
    context.set_alpn_protocols(["h2"])
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=5) as raw, context.wrap_socket(raw, server_hostname=server_name) as tls:
            # In TLS 1.3 the server judges the client's certificate after the client's handshake is done: its
            # verdict is the first thing read, an alert or its SETTINGS.
            tls.sendall(H2_PREFACE)
            header = tls.recv(9)
    except OSError as error:
        return f"{address}: {error}"
    if len(header) < 9 or header[3] != H2_SETTINGS:
        return f"{address}: no HTTP/2 SETTINGS frame, read {header!r}"
    return None
