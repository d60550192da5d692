"""Throwaway CAs and certificates: for the TLS fake registry, plugins served with TLS and
kplug's client certificate."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    """A CA and a serving certificate it signed, as PEM."""

    ca: bytes
    cert: bytes
    key: bytes

    @property
    def tls(self) -> tuple[bytes, bytes]:
        return self.key, self.cert


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, as PEM."""

    cert: bytes
    key: bytes


class Ca:
    """A certificate authority that issues serving and client certificates."""

    def __init__(self, name: str = "kplug test CA") -> None:
        self._now = datetime.datetime.now(datetime.UTC)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        certificate = (
            self._builder(self._name, self._key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        #: The CA's certificate, PEM.
        self.pem = certificate.public_bytes(serialization.Encoding.PEM)

    def serving(self, dns: Iterable[str] = ("localhost",), ips: Iterable[str] = ("127.0.0.1",)) -> KeyPair:
        """A serving certificate for the ``dns`` names and ``ips``."""
        names: list[x509.GeneralName] = [x509.DNSName(name) for name in dns]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        return self._issue(
            "kplug.kplug-system.svc",
            ExtendedKeyUsageOID.SERVER_AUTH,
            x509.SubjectAlternativeName(names),
        )

    def client(self, common_name: str = "kplug") -> KeyPair:
        """A client certificate for ``common_name``."""
        return self._issue(common_name, ExtendedKeyUsageOID.CLIENT_AUTH, None)

    def sign_request(self, request: bytes) -> bytes:
        """A serving certificate (PEM) for the key and names of ``request``, a DER PKCS#10 request,
        as kplug's plugin CA signs one; the test's stand-in for kplug in unit tests."""
        csr = x509.load_der_x509_csr(request)
        names = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        public_key = csr.public_key()
        assert isinstance(public_key, ec.EllipticCurvePublicKey)
        certificate = (
            self._builder(csr.subject, public_key)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(names, critical=False)
            .sign(self._key, hashes.SHA256())
        )
        return certificate.public_bytes(serialization.Encoding.PEM)

    def _builder(self, subject: x509.Name, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._name)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._now - datetime.timedelta(minutes=5))
            .not_valid_after(self._now + datetime.timedelta(days=1))
        )

    def _issue(
        self, common_name: str, usage: x509.ObjectIdentifier, names: x509.SubjectAlternativeName | None
    ) -> KeyPair:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        builder = self._builder(subject, key.public_key()).add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if names is not None:
            builder = builder.add_extension(names, critical=False)
        certificate = builder.sign(self._key, hashes.SHA256())
        return KeyPair(
            cert=certificate.public_bytes(serialization.Encoding.PEM),
            key=key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            ),
        )


def make_pki(dns: Iterable[str] = ("localhost",), ips: Iterable[str] = ("127.0.0.1",)) -> Pki:
    """A fresh CA and a serving certificate for the ``dns`` names and ``ips`` (default ``localhost``
    and ``127.0.0.1``)."""
    ca = Ca()
    serving = ca.serving(dns, ips)
    return Pki(ca=ca.pem, cert=serving.cert, key=serving.key)
