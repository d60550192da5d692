"""The plugin's identity from kplug (``--issued-identity``): a key made in memory at start, which
never leaves the process, and the certificates kplug signs for it on the heartbeats.

Every heartbeat that is due for a certificate carries a signing request (PKCS#10, DER) for the
plugin's identity ``NAME.plugins.kplug.io``, the same ECDSA P-256 key each time; kplug signs it
once it has authorized the heartbeat for that name. The answer also brings the trust bundle: the
CAs whose client certificates (kplug's) the plugin accepts. Every heartbeat carries the SHA-256 of
the bundle held, so kplug sends a new bundle only when it changed. The next request goes out when
kplug's ``certificate_renew_after`` has passed, two thirds into the certificate's life.

gRPC asks :meth:`IssuedIdentity.fetch` for the configuration at every new TLS handshake: new
connections use the newest certificate and bundle, connections already open keep theirs, so a
renewal drops no call. The server starts only once the first certificate is held (see
:func:`kplug.serve`); until then the credentials hold a placeholder, a certificate the key signed
itself and trusted as the only client CA, which no caller can present.

kplug refuses a request it cannot sign by failing the heartbeat: ``INVALID_ARGUMENT``
("certificate request refused: ...") or ``FAILED_PRECONDITION`` (kplug has no plugin CA).

Needs the ``cryptography`` package: ``pip install 'kplug[identity]'``, or Debian's
``python3-cryptography``.
"""

from __future__ import annotations

import datetime
import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import grpc

from kplug.proto import registry_pb2

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric import ec

#: The DNS suffix of plugin identities (kplug's ``IDENTITY_SUFFIX``).
IDENTITY_SUFFIX = "plugins.kplug.io"
#: How long :func:`kplug.serve` waits for kplug to sign the first certificate.
FIRST_CERTIFICATE_TIMEOUT = 60.0
#: The heartbeat failures that are kplug's refusal of the certificate request.
REFUSALS = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)


def identity(name: str) -> str:
    """The identity kplug certifies for plugin ``name``, and verifies when it calls it."""
    return f"{name}.{IDENTITY_SUFFIX}"


class IdentityError(ValueError):
    """The key cannot be made, or what kplug sent cannot be used."""


@dataclass(frozen=True, slots=True)
class Held:
    """What the plugin holds from kplug."""

    #: PEM: the leaf certificate kplug signed, then any intermediates.
    chain: str
    #: PEM: the CAs whose client certificates callers must present.
    bundle: str
    #: SHA-256 of :attr:`bundle`, sent with every heartbeat.
    bundle_sha256: bytes
    #: When to ask for the next certificate, on the identity's clock.
    renew_at: float
    configuration: grpc.ServerCertificateConfiguration
    #: Counts what was taken, so :meth:`IssuedIdentity.fetch` tells what is new.
    version: int


class IssuedIdentity:
    """The key of plugin ``plugin``, its signing request, and what kplug answered.

    ``clock`` (seconds, monotonic) decides when a renewal is due; it is there
    for tests. Raises :class:`IdentityError` if the ``cryptography`` package
    is missing.
    """

    def __init__(self, plugin: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        try:
            from cryptography import x509
            from cryptography.hazmat.primitives import hashes, serialization
            from cryptography.hazmat.primitives.asymmetric import ec
            from cryptography.x509.oid import NameOID
        except ImportError as error:
            raise IdentityError(
                f"--issued-identity needs the cryptography package ({error}): "
                "pip install 'kplug[identity]', or apt-get install python3-cryptography"
            ) from None
        self.name = identity(plugin)
        self._clock = clock
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._key_pem = self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        # kplug reads only the DNS name; X.509 caps a common name at 64
        # characters, which a long plugin name's identity exceeds.
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, self.name)] if len(self.name) <= 64 else [])
        names = x509.SubjectAlternativeName([x509.DNSName(self.name)])
        #: The signing request (DER) sent whenever a certificate is due.
        self.request = (
            x509.CertificateSigningRequestBuilder()
            .subject_name(subject)
            .add_extension(names, critical=False)
            .sign(self._key, hashes.SHA256())
            .public_bytes(serialization.Encoding.DER)
        )
        self._placeholder = self._self_signed()
        self._changed = threading.Condition()
        self._held: Held | None = None
        self._refusal: str | None = None

    @property
    def held(self) -> Held | None:
        """What kplug sent last; ``None`` until it signed a certificate."""
        with self._changed:
            return self._held

    @property
    def refusal(self) -> str | None:
        """Why kplug refused the last request or what it sent could not be used; ``None`` if neither."""
        with self._changed:
            return self._refusal

    def stamp(self, request: registry_pb2.HeartbeatRequest) -> None:
        """Adds what ``request`` must carry now: the signing request when a certificate is due
        (none held, or its renewal time has come), and the digest of the bundle held."""
        with self._changed:
            held = self._held
        due = held is None or self._clock() >= held.renew_at
        request.certificate_request = self.request if due else b""
        request.trust_bundle_sha256 = held.bundle_sha256 if held else b""

    def take(self, reply: registry_pb2.HeartbeatResponse) -> bool:
        """Takes a new certificate or bundle from ``reply``; ``False`` when it brought neither.

        Raises :class:`IdentityError` when what kplug sent cannot be used;
        what was held stays in use.
        """
        if not reply.certificate_chain and not reply.trust_bundle:
            return False
        with self._changed:
            try:
                held = self._next(self._held, reply)
            except IdentityError as error:
                self._refusal = str(error)
                raise
            if held is None:
                return False
            self._held, self._refusal = held, None
            self._changed.notify_all()
            return True

    def refused(self, code: grpc.StatusCode, message: str) -> None:
        """Notes that kplug failed a heartbeat that carried the signing request with ``code``; one of
        :data:`REFUSALS` is its refusal of the request (or kplug has no plugin CA)."""
        if code not in REFUSALS:
            return
        with self._changed:
            self._refusal = f"kplug failed the heartbeat that asked for a certificate ({code.name}): {message}"
            self._changed.notify_all()

    def wait(self, timeout: float) -> bool:
        """Waits until a certificate is held; ``False`` if ``timeout`` seconds pass first or kplug refused."""
        with self._changed:
            self._changed.wait_for(lambda: self._held is not None or self._refusal is not None, timeout)
            return self._held is not None

    def credentials(self) -> grpc.ServerCredentials:
        """Server credentials that take the newest certificate and bundle at each new handshake,
        requiring a client certificate the bundle signed."""
        # grpc takes None from the fetcher as "unchanged"; its type stubs say otherwise.
        fetch = cast(Callable[[], grpc.ServerCertificateConfiguration], self._fetcher())
        return grpc.dynamic_ssl_server_credentials(self._placeholder, fetch, require_client_authentication=True)

    def _fetcher(self) -> Callable[[], grpc.ServerCertificateConfiguration | None]:
        served = 0

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            nonlocal served
            with self._changed:
                held = self._held
            if held is None or held.version == served:
                return None
            served = held.version
            return held.configuration

        return fetch

    def _next(self, current: Held | None, reply: registry_pb2.HeartbeatResponse) -> Held | None:
        """What to hold after ``reply``; ``None`` for nothing new."""
        if reply.certificate_chain:
            renew_after = reply.certificate_renew_after
            seconds = renew_after.seconds + renew_after.nanos / 1e9
            if not reply.HasField("certificate_renew_after") or seconds <= 0:
                raise IdentityError("kplug sent a certificate without certificate_renew_after")
            chain, renew_at = reply.certificate_chain, self._clock() + seconds
        elif current is not None:
            chain, renew_at = current.chain, current.renew_at
        else:
            return None  # a bundle, but nothing to serve with it yet
        if reply.trust_bundle:
            bundle = reply.trust_bundle
        elif current is not None:
            bundle = current.bundle
        else:
            raise IdentityError("kplug sent a certificate without its trust bundle")
        self._check(chain, bundle)
        configuration = grpc.ssl_server_certificate_configuration(
            [(self._key_pem, chain.encode())], root_certificates=bundle.encode()
        )
        return Held(
            chain=chain,
            bundle=bundle,
            bundle_sha256=hashlib.sha256(bundle.encode()).digest(),
            renew_at=renew_at,
            configuration=configuration,
            version=(current.version if current else 0) + 1,
        )

    def _check(self, chain: str, bundle: str) -> None:
        """Raises :class:`IdentityError` unless ``chain`` is PEM certificates, the first for this
        key, and ``bundle`` is PEM certificates."""
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization

        def certificates(pem: str, what: str) -> list[x509.Certificate]:
            try:
                found = x509.load_pem_x509_certificates(pem.encode())
            except ValueError as error:
                raise IdentityError(f"the {what} kplug sent does not load: {error}") from None
            return found

        leaf = certificates(chain, "certificate")[0]
        certificates(bundle, "trust bundle")
        spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        if leaf.public_key().public_bytes(*spki) != self._key.public_key().public_bytes(*spki):
            raise IdentityError(f"the certificate kplug sent is not for this instance's key ({self.name})")

    def _self_signed(self) -> grpc.ServerCertificateConfiguration:
        """The placeholder until kplug signs: the key's own certificate, also the only client CA,
        which no caller holds a certificate of."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.x509.oid import NameOID

        key: ec.EllipticCurvePrivateKey = self._key
        now = datetime.datetime.now(datetime.UTC)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kplug placeholder: no certificate yet")])
        certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(self.name)]), critical=False)
            .sign(key, hashes.SHA256())
            .public_bytes(serialization.Encoding.PEM)
        )
        return grpc.ssl_server_certificate_configuration([(self._key_pem, certificate)], root_certificates=certificate)
