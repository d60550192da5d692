"""Serving TLS, optionally verifying callers' client certificates (mutual TLS), from files
that are reloaded when they change.

gRPC asks :meth:`ServingCertificates.fetch` for the configuration at every
new TLS handshake; it answers "unchanged" unless one of the files changed
(size, modification time or inode, so a Secret volume's symlink swap counts)
and then reads them again. A rotation thus applies to the next connection
without a restart, while connections already open keep their session. Files
that cannot be read, or whose key does not fit the certificate, are logged
and the previous configuration stays in use.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import grpc

_log = logging.getLogger(__name__)

#: What identifies a version of a file: device, inode, size and modification time.
_Stamp = tuple[int, int, int, int]


class TlsFileError(ValueError):
    """The serving certificate, its key or the client CA cannot be used."""


@dataclass(frozen=True, slots=True)
class _Loaded:
    """One consistent read of the files."""

    stamps: tuple[_Stamp | None, ...]
    configuration: grpc.ServerCertificateConfiguration


class ServingCertificates:
    """The serving certificate chain ``cert_file`` with its key ``key_file`` and, for mutual TLS,
    the CA ``client_ca_file`` whose client certificates callers must present.

    Reads and checks the files at once; raises :class:`TlsFileError` if they
    cannot be used.
    """

    def __init__(self, cert_file: str, key_file: str, client_ca_file: str | None) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.client_ca_file = client_ca_file
        self._lock = threading.Lock()
        self._current = self._load()
        self._problem: tuple[tuple[_Stamp | None, ...], str] | None = None

    @property
    def verifies_clients(self) -> bool:
        """Whether callers must present a client certificate signed by the client CA."""
        return self.client_ca_file is not None

    def credentials(self) -> grpc.ServerCredentials:
        """Server credentials that pick up changed files at the next handshake."""
        # grpc takes None from the fetcher as "unchanged"; its type stubs say otherwise.
        fetch = cast(Callable[[], grpc.ServerCertificateConfiguration], self.fetch)
        return grpc.dynamic_ssl_server_credentials(
            self._current.configuration,
            fetch,
            require_client_authentication=self.verifies_clients,
        )

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """The configuration for a new handshake: ``None`` (keep the current one) unless the files changed."""
        with self._lock:
            if self._stamps() == self._current.stamps:
                return None
            try:
                loaded = self._load()
            except TlsFileError as error:
                self._warn_once(str(error))
                return None
            _log.info(
                "reloaded the serving certificate %s%s",
                self.cert_file,
                f" and the client CA {self.client_ca_file}" if self.client_ca_file else "",
            )
            self._current, self._problem = loaded, None
            return loaded.configuration

    def _warn_once(self, problem: str) -> None:
        key = (self._stamps(), problem)
        if key != self._problem:
            _log.warning("%s; keeping the previous serving certificate", problem)
            self._problem = key

    def _files(self) -> tuple[str, ...]:
        return (self.cert_file, self.key_file) + ((self.client_ca_file,) if self.client_ca_file else ())

    def _stamps(self) -> tuple[_Stamp | None, ...]:
        return tuple(_stamp(path) for path in self._files())

    def _load(self) -> _Loaded:
        """Reads the files; raises :class:`TlsFileError`, also when they change while being read."""
        before = self._stamps()
        cert = _read(self.cert_file, "serving certificate", b"-----BEGIN CERTIFICATE-----")
        key = _read(self.key_file, "serving key", b"PRIVATE KEY-----")
        client_ca = (
            _read(self.client_ca_file, "client CA", b"-----BEGIN CERTIFICATE-----") if self.client_ca_file else None
        )
        try:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self.cert_file, self.key_file)
            if self.client_ca_file:
                context.load_verify_locations(cafile=self.client_ca_file)
        except (ssl.SSLError, OSError) as error:
            raise TlsFileError(
                f"the serving certificate {self.cert_file}, its key {self.key_file}"
                + (f" or the client CA {self.client_ca_file}" if self.client_ca_file else "")
                + f" cannot be used: {error}"
            ) from None
        if self._stamps() != before:
            raise TlsFileError("the TLS files changed while being read")
        configuration = grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=client_ca)
        return _Loaded(before, configuration)


def _read(path: str, what: str, marker: bytes) -> bytes:
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as error:
        raise TlsFileError(f"cannot read the {what} file {path}: {error.strerror or error}") from None
    if marker not in data:
        raise TlsFileError(f"the {what} file {path} holds no PEM ({marker.decode().strip('-')})")
    return data


def _stamp(path: str) -> _Stamp | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
