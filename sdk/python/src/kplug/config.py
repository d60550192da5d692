"""How a plugin is served: :class:`Config`, its command line and addresses.

Every flag falls back to an environment variable, so the same plugin runs
from a terminal (flags) and from a Kubernetes Deployment (env):

- ``--registry HOST:PORT`` / ``KPLUG_REGISTRY``: kplug's registry; default ``127.0.0.1:50051``.
  ``http://`` or a bare ``host:port`` is plain gRPC (kplug's standalone mode); ``https://`` is
  TLS (cluster mode) and needs ``--registry-ca-file``. A host name resolving to several
  addresses (kplug replicas behind a headless Service) gets heartbeats at each of them,
  resolved again every 30 s (see :mod:`kplug.heartbeat`).
- ``--listen HOST:PORT`` / ``KPLUG_LISTEN``: where to serve; default ``127.0.0.1:50052``; port 0 picks one.
- ``--advertise HOST[:PORT]`` / ``KPLUG_ADVERTISE``: where kplug dials; default the listen address
  with the bound port.
- ``--name NAME`` / ``KPLUG_NAME``: overrides the plugin class's ``name``.
- ``--heartbeat-interval DURATION`` / ``KPLUG_HEARTBEAT_INTERVAL``: asked of the registry, which decides.
- ``--drain-timeout DURATION`` / ``KPLUG_DRAIN_TIMEOUT``: how long in-flight calls may take to finish
  on shutdown, after telling kplug the instance is draining; default ``20s``, below the 30 s
  Kubernetes grants before SIGKILL.
- ``--label KEY=VALUE`` (repeatable) / ``KPLUG_LABELS`` (``k=v,k=v``): labels for the Plugin object.
- ``--max-workers N`` / ``KPLUG_MAX_WORKERS``: calls served at once; default 10.
- ``--log-level LEVEL`` / ``KPLUG_LOG_LEVEL``: default ``INFO``.
- ``--token-file PATH`` / ``KPLUG_TOKEN_FILE``: a Kubernetes ServiceAccount token, a projected
  token volume for the audience ``plugins.kplug.io`` (what kplug reviews heartbeat tokens for), sent as ``authorization: Bearer <token>`` with every heartbeat and the
  deregistration. Reread every time, as the kubelet rotates it; a missing or unreadable file is
  logged and the heartbeat goes out without a token, so kplug's refusal says what is wrong.
- ``--registry-ca-file PATH`` / ``KPLUG_REGISTRY_CA_FILE``: PEM of the CA that signed kplug's
  serving certificate (e.g. the ``kplug-ca`` ConfigMap), trusted for an ``https://`` registry; no
  other roots are, so ``https://`` without it is an error at start. The certificate is checked
  against the registry's host name, also when heartbeating to each of its addresses.
- ``--instance NAME`` / ``KPLUG_INSTANCE``: which instance of the plugin this process is; default
  ``$POD_NAME`` (the downward API), else empty: the address names the instance. Sent with every heartbeat and the
  deregistration, so kplug tells the pods of one plugin apart and spreads calls over them.
- ``--tls-cert-file PATH`` / ``KPLUG_TLS_CERT_FILE`` and ``--tls-key-file PATH`` /
  ``KPLUG_TLS_KEY_FILE``: serve TLS with this certificate chain and private key (PEM) instead of
  plain gRPC. Reloaded when the files change (e.g. a rotated Secret), for new connections.
- ``--client-ca-file PATH`` / ``KPLUG_CLIENT_CA_FILE``: with TLS, require every caller to present a
  client certificate signed by this CA (PEM; kplug's client CA), reloaded like the certificate.
  Serving TLS without it is an error at start unless ``--allow-unauthenticated-clients``.
- ``--allow-unauthenticated-clients`` / ``KPLUG_ALLOW_UNAUTHENTICATED_CLIENTS=true``: serve TLS
  without asking callers for certificates: anyone who reaches the port may call the plugin.
- ``--server-name NAME`` / ``KPLUG_SERVER_NAME``: the name kplug verifies in the serving
  certificate; default: the host of the advertised address.
- ``--issued-identity`` / ``KPLUG_ISSUED_IDENTITY=true``: serve TLS with the identity kplug issues
  (:mod:`kplug.identity`): a key made in memory, a certificate for ``NAME.plugins.kplug.io`` that
  kplug (with ``--plugin-signing-cert-file``) signs on the heartbeats and renews, and kplug's client
  CA from the same answers. Needs an ``https://`` registry and ``--token-file``; excludes
  ``--tls-cert-file``, ``--tls-key-file``, ``--client-ca-file``, ``--allow-unauthenticated-clients``
  and ``--server-name``. Needs the ``cryptography`` package (``pip install 'kplug[identity]'``).
- ``--canary-weight PERCENT`` / ``KPLUG_CANARY_WEIGHT``: run as a canary of the plugin's next version:
  kplug sends this percentage (1-99) of the plugin's objects, each always to the same side, to the
  canary instances, and withdraws a canary that fails or misses its deadline more often than the
  other instances; default: a stable instance.
- ``--shadow [PERCENT]`` / ``KPLUG_SHADOW``: run as a shadow of the plugin's next version: after
  another instance has answered, kplug sends this percentage (1-100; 100 when the flag has no value)
  of the plugin's reconciles to the shadow again with ``dry_run`` set and shows where the answers
  differ (``kubectl kplug shadow``); the shadow serves nothing else. Excludes ``--canary-weight``.
- ``--local-address-file PATH`` / ``KPLUG_LOCAL_ADDRESS_FILE``: serve without kplug, as
  ``kubectl kplug render`` runs a plugin: no heartbeats and plain gRPC (the registry and TLS
  settings are not used); once listening, the address (``127.0.0.1:PORT``) is written to PATH.

Durations are written as in the Rust SDK: ``500ms``, ``5s``, ``2m``, ``1h`` or
a bare number of seconds. The flags, environment variables and defaults
match the Rust SDK's, so operators configure plugins alike whatever their
language.

In cluster mode kplug accepts a heartbeat only with a token whose identity
may ``create`` ``plugins/heartbeat`` for the plugin's name. It refuses one
without a valid token as ``UNAUTHENTICATED`` and one without that permission
as ``PERMISSION_DENIED``; the SDK logs either ("kplug refused the heartbeat:
...") and retries at the heartbeat interval.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

#: Where kplug's registry listens when run locally.
DEFAULT_REGISTRY = "127.0.0.1:50051"
#: Where a plugin listens by default.
DEFAULT_LISTEN = "127.0.0.1:50052"

#: Listening on every interface; without --advertise, loopback is advertised.
_LOOPBACK_FOR_WILDCARD = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}
_DURATION = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(?P<unit>ms|s|m|h|)")
_DURATION_UNITS = {"ms": 0.001, "": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}
#: How long shutdown waits by default for in-flight calls.
DEFAULT_DRAIN_TIMEOUT = 20.0
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


@dataclass(frozen=True, slots=True)
class Config:
    """Settings for :func:`kplug.serve`; :func:`kplug.run` builds one from flags and env."""

    #: kplug's registry, ``host:port``, ``http://host:port`` or
    #: ``https://host:port`` (with :attr:`registry_ca_file`). ``None``
    #: serves without heartbeating, e.g. to test a plugin on its own.
    registry: str | None = DEFAULT_REGISTRY
    #: ``host:port`` to listen on. Port 0 picks a free port.
    listen: str = DEFAULT_LISTEN
    #: ``host[:port]`` kplug dials to reach the plugin, e.g. the plugin's
    #: Service name in Kubernetes. Without a port (or with port 0) the bound
    #: port is used; ``None`` means the listen address, with loopback for
    #: ``0.0.0.0`` or ``::``.
    advertise: str | None = None
    #: Overrides :attr:`Plugin.name`.
    name: str | None = None
    #: Heartbeat interval to ask the registry for, in seconds; ``None`` lets it choose.
    heartbeat_interval: float | None = None
    #: Labels for the Plugin object in kplug.
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Reconcile/Finalize calls served at once.
    max_workers: int = 10
    #: Seconds in-flight calls may take to finish on shutdown, once kplug knows the instance is draining.
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT
    #: File holding a Kubernetes ServiceAccount token, sent with every
    #: heartbeat and the deregistration; reread each time.
    token_file: str | None = None
    #: PEM file of the CA to trust for an ``https://`` registry; required for one.
    registry_ca_file: str | None = None
    #: Which instance of the plugin this process is, e.g. its pod's name.
    #: ``None``: ``$POD_NAME``, else empty (see :func:`default_instance`);
    #: ``""``: none, the address names the instance (as before instances).
    instance: str | None = None
    #: PEM certificate chain to serve TLS with; ``None`` serves plain gRPC.
    tls_cert_file: str | None = None
    #: PEM private key of :attr:`tls_cert_file`.
    tls_key_file: str | None = None
    #: PEM of the CA whose client certificates callers must present (mutual
    #: TLS); required with :attr:`tls_cert_file` unless
    #: :attr:`allow_unauthenticated_clients`.
    client_ca_file: str | None = None
    #: Serve TLS without verifying callers, i.e. without :attr:`client_ca_file`.
    allow_unauthenticated_clients: bool = False
    #: The name kplug verifies in the serving certificate; ``""``: the host of
    #: the advertised address.
    server_name: str = ""
    #: Serve TLS with the identity kplug issues on the heartbeats
    #: (:mod:`kplug.identity`) instead of certificate files; see
    #: :func:`check_issued_identity`.
    issued_identity: bool = False
    #: A canary's share of the plugin's objects, in percent (1-99); 0: a stable instance.
    canary_weight: int = 0
    #: A shadow's share of the plugin's reconciles, in percent (1-100); 0: not a shadow.
    shadow: int = 0
    #: Serve without kplug (``kubectl kplug render``): no heartbeats, plain
    #: gRPC, and the listening address written to this file once serving.
    local_address_file: str | None = None


def default_instance(environ: Mapping[str, str] | None = None) -> str:
    """The instance name when none is configured: ``$POD_NAME``, else ``""`` (the address names it).

    Not the host name: processes on one machine, or pods with ``hostNetwork``, share it and
    would take turns being one instance.
    """
    environ = os.environ if environ is None else environ
    return (environ.get("POD_NAME") or "").strip()


def check_serving_tls(
    tls_cert_file: str | None,
    tls_key_file: str | None,
    client_ca_file: str | None,
    allow_unauthenticated_clients: bool,
) -> None:
    """Raises :class:`ValueError` for serving TLS options that do not fit together.

    A certificate needs its key and the other way round; a client CA needs a
    certificate (callers are verified only over TLS); and a certificate
    without a client CA, which would let anyone who reaches the port call the
    plugin, needs ``allow_unauthenticated_clients``.
    """
    if bool(tls_cert_file) != bool(tls_key_file):
        raise ValueError(
            "--tls-cert-file (KPLUG_TLS_CERT_FILE) and --tls-key-file (KPLUG_TLS_KEY_FILE) go together: "
            "set both to serve TLS, or neither to serve plain gRPC"
        )
    if client_ca_file and not tls_cert_file:
        raise ValueError(
            "--client-ca-file (KPLUG_CLIENT_CA_FILE) verifies callers over TLS only: "
            "also set --tls-cert-file and --tls-key-file"
        )
    if tls_cert_file and not client_ca_file and not allow_unauthenticated_clients:
        raise ValueError(
            "serving TLS without --client-ca-file (KPLUG_CLIENT_CA_FILE) would accept calls from anyone "
            "who reaches the port: set it to the PEM of the CA that signs kplug's client certificate, "
            "or pass --allow-unauthenticated-clients (KPLUG_ALLOW_UNAUTHENTICATED_CLIENTS=true) to mean it"
        )
    if client_ca_file and allow_unauthenticated_clients:
        raise ValueError(
            "--allow-unauthenticated-clients contradicts --client-ca-file, which requires client "
            "certificates: drop one of them"
        )


def check_issued_identity(config: Config) -> None:
    """Raises :class:`ValueError` if :attr:`Config.issued_identity` does not fit the rest of ``config``.

    kplug signs a certificate only in cluster mode (an ``https://`` registry)
    and only for a heartbeat whose ServiceAccount token (``token_file``) may
    heartbeat as the plugin. The identity replaces the certificate files and
    the client CA, always verifies callers (kplug's client certificate) and
    is the name kplug verifies, so no ``server_name`` may be declared.
    """
    if not config.issued_identity:
        return
    flag = "--issued-identity (KPLUG_ISSUED_IDENTITY)"
    if not config.registry or not registry_uses_tls(config.registry):
        raise ValueError(f"{flag} asks kplug in cluster mode for a certificate: the registry must be https://")
    if not config.token_file:
        raise ValueError(f"{flag} is granted to the plugin's ServiceAccount: set --token-file (KPLUG_TOKEN_FILE)")
    if config.tls_cert_file or config.tls_key_file or config.client_ca_file:
        raise ValueError(f"{flag} replaces --tls-cert-file, --tls-key-file and --client-ca-file: drop them")
    if config.allow_unauthenticated_clients:
        raise ValueError(f"{flag} accepts only kplug's client certificate: drop --allow-unauthenticated-clients")
    if config.server_name:
        raise ValueError(f"{flag} certifies NAME.plugins.kplug.io, the name kplug verifies: drop --server-name")


def local(config: Config) -> Config:
    """``config`` as served with :attr:`Config.local_address_file`: without a registry or TLS."""
    return replace(
        config,
        registry=None,
        tls_cert_file=None,
        tls_key_file=None,
        client_ca_file=None,
        allow_unauthenticated_clients=False,
        server_name="",
        issued_identity=False,
    )


def parse_bool(text: str) -> bool:
    """Parses ``true``/``false`` (also ``1``/``0``, ``yes``/``no``, ``on``/``off``; empty is false)."""
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{text!r} is not a boolean: use true or false")


def split_host_port(address: str) -> tuple[str, int]:
    """Splits ``host:port`` (IPv6 hosts bracketed: ``[::1]:50052``) into the bare host and the port.

    The host may be empty (``:50052``), meaning every interface.
    """
    host, colon, port_text = address.rpartition(":")
    if not colon:
        raise ValueError(f"{address!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError as error:
            raise ValueError(f"{address!r}: {error}") from None
    elif ":" in host:
        raise ValueError(f"{address!r}: IPv6 addresses need brackets, e.g. [::1]:50052")
    if not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"{address!r}: port must be a number from 0 to 65535")
    return host, int(port_text)


def join_host_port(host: str, port: int) -> str:
    """The inverse of :func:`split_host_port`: brackets IPv6 hosts."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_wildcard(host: str) -> bool:
    """Whether listening on ``host`` means every interface."""
    return host in _LOOPBACK_FOR_WILDCARD


def bind_address(listen: str) -> str:
    """The address to bind for ``listen``; an empty host (``:50052``) binds every interface."""
    host, port = split_host_port(listen)
    return join_host_port(host or "::", port)


def advertised_address(listen: str, bound_port: int, advertise: str | None) -> str:
    """The ``host:port`` kplug should dial, given where the plugin listens and the port it got."""
    if advertise:
        if ":" not in advertise or (advertise.startswith("[") and advertise.endswith("]")):
            host, port = advertise.strip("[]"), 0
        else:
            host, port = split_host_port(advertise)
        if not host or is_wildcard(host):
            raise ValueError(f"advertise address {advertise!r} must name a host kplug can dial")
        return join_host_port(host, port or bound_port)
    host, _ = split_host_port(listen)
    return join_host_port(_LOOPBACK_FOR_WILDCARD.get(host, host), bound_port)


def registry_target(registry: str) -> str:
    """The gRPC target for the registry address ``registry``.

    Accepts ``host:port`` and ``http://host:port`` (plain HTTP/2),
    ``https://host:port`` (TLS, see :func:`registry_uses_tls`) and passes
    ``unix:`` targets through.
    """
    return _parse_registry(registry)[0]


def registry_uses_tls(registry: str) -> bool:
    """Whether the registry address ``registry`` is ``https://``; raises :class:`ValueError` if invalid."""
    return _parse_registry(registry)[1]


def check_registry(registry: str, registry_ca_file: str | None) -> None:
    """Raises :class:`ValueError` for a registry address the SDK cannot dial as configured."""
    if registry_uses_tls(registry) and not registry_ca_file:
        raise ValueError(
            f"registry {registry!r} uses TLS but no CA to verify kplug's certificate with was given: "
            "set --registry-ca-file (KPLUG_REGISTRY_CA_FILE) to the PEM of the CA that signed it, "
            "e.g. from the kplug-ca ConfigMap"
        )


def _parse_registry(registry: str) -> tuple[str, bool]:
    """The gRPC target for ``registry`` and whether it is TLS."""
    value = registry.strip()
    if value.startswith("unix:"):
        return value, False
    scheme, separator, rest = value.partition("://")
    tls = False
    if separator:
        if scheme not in ("http", "https"):
            raise ValueError(
                f"registry {registry!r}: unsupported scheme {scheme!r}; use http://, https:// or host:port"
            )
        tls = scheme == "https"
        value = rest.rstrip("/")
    host, port = split_host_port(value)
    if not host or port == 0:
        raise ValueError(f"registry {registry!r} needs a host and a non-zero port")
    return join_host_port(host, port), tls


def parse_label(text: str) -> tuple[str, str]:
    """Parses one ``key=value`` label."""
    key, equals, value = text.strip().partition("=")
    if not equals or not key:
        raise ValueError(f"label {text!r} is not key=value")
    return key, value


def parse_duration(text: str) -> float:
    """Parses ``1500ms``, ``5s``, ``2m``, ``1h`` or a bare number of seconds into seconds."""
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise ValueError(f"invalid duration {text!r}: expected e.g. 500ms, 5s, 2m, 1h or seconds")
    return float(match["number"]) * _DURATION_UNITS[match["unit"]]


def parse_labels(text: str) -> dict[str, str]:
    """Parses ``key=value,key=value`` (``KPLUG_LABELS``)."""
    return dict(parse_label(item) for item in text.split(",") if item.strip())


def add_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """Adds the SDK's flags to ``parser``, with defaults taken from ``environ``."""

    def env(name: str, default: str | None = None) -> str | None:
        return environ.get(name) or default

    group = parser.add_argument_group("kplug")
    group.add_argument(
        "--registry",
        default=env("KPLUG_REGISTRY", DEFAULT_REGISTRY),
        help="kplug's registry as host:port, http://host:port or https://host:port (TLS; needs "
        "--registry-ca-file); a host name with several addresses (kplug replicas) gets heartbeats at each "
        "(env KPLUG_REGISTRY; default: %(default)s)",
    )
    group.add_argument(
        "--listen",
        type=_address,
        default=env("KPLUG_LISTEN", DEFAULT_LISTEN),
        help="host:port to serve on; port 0 picks a free one (env KPLUG_LISTEN; default: %(default)s)",
    )
    group.add_argument(
        "--advertise",
        default=env("KPLUG_ADVERTISE"),
        metavar="HOST[:PORT]",
        help="where kplug reaches this plugin; without a port, the bound port "
        "(env KPLUG_ADVERTISE; default: the listen address)",
    )
    group.add_argument("--name", default=env("KPLUG_NAME"), help="the plugin's name in kplug (env KPLUG_NAME)")
    group.add_argument(
        "--heartbeat-interval",
        type=_positive_duration,
        default=env("KPLUG_HEARTBEAT_INTERVAL"),
        metavar="DURATION",
        help="heartbeat interval to ask for (env KPLUG_HEARTBEAT_INTERVAL; default: the registry's choice)",
    )
    group.add_argument(
        "--label",
        dest="labels",
        type=_label,
        action="append",
        metavar="KEY=VALUE",
        help="a label for the Plugin object; repeatable (env KPLUG_LABELS: key=value,key=value)",
    )
    group.add_argument(
        "--drain-timeout",
        type=_duration,
        default=env("KPLUG_DRAIN_TIMEOUT", "20s"),
        metavar="DURATION",
        help="on shutdown, how long in-flight calls may take to finish once kplug sends no new ones "
        "(env KPLUG_DRAIN_TIMEOUT; default: %(default)s)",
    )
    group.add_argument(
        "--max-workers",
        type=_positive_int,
        default=env("KPLUG_MAX_WORKERS", "10"),
        metavar="N",
        help="calls served at once (env KPLUG_MAX_WORKERS; default: %(default)s)",
    )
    group.add_argument(
        "--token-file",
        default=env("KPLUG_TOKEN_FILE"),
        metavar="PATH",
        help="Kubernetes ServiceAccount token sent with every heartbeat as 'authorization: Bearer', reread "
        "each time as it rotates; kplug in cluster mode requires it (env KPLUG_TOKEN_FILE)",
    )
    group.add_argument(
        "--registry-ca-file",
        default=env("KPLUG_REGISTRY_CA_FILE"),
        metavar="PATH",
        help="PEM of the CA that signed kplug's serving certificate, e.g. from the kplug-ca ConfigMap; "
        "required for an https:// registry (env KPLUG_REGISTRY_CA_FILE)",
    )
    group.add_argument(
        "--instance",
        default=env("KPLUG_INSTANCE", env("POD_NAME")),
        metavar="NAME",
        help="which instance of the plugin this process is, sent with every heartbeat; empty: the "
        "address names it (env KPLUG_INSTANCE; default: $POD_NAME, else empty)",
    )
    group.add_argument(
        "--tls-cert-file",
        default=env("KPLUG_TLS_CERT_FILE"),
        metavar="PATH",
        help="serve TLS with this PEM certificate chain, reloaded when it changes; needs --tls-key-file "
        "and --client-ca-file (env KPLUG_TLS_CERT_FILE; default: plain gRPC)",
    )
    group.add_argument(
        "--tls-key-file",
        default=env("KPLUG_TLS_KEY_FILE"),
        metavar="PATH",
        help="PEM private key of --tls-cert-file (env KPLUG_TLS_KEY_FILE)",
    )
    group.add_argument(
        "--client-ca-file",
        default=env("KPLUG_CLIENT_CA_FILE"),
        metavar="PATH",
        help="with TLS, accept only callers with a client certificate signed by this PEM CA (kplug's), "
        "reloaded when it changes (env KPLUG_CLIENT_CA_FILE)",
    )
    group.add_argument(
        "--allow-unauthenticated-clients",
        action="store_const",
        const="true",
        default=env("KPLUG_ALLOW_UNAUTHENTICATED_CLIENTS"),
        help="serve TLS without --client-ca-file: anyone who reaches the port may call the plugin "
        "(env KPLUG_ALLOW_UNAUTHENTICATED_CLIENTS=true)",
    )
    group.add_argument(
        "--server-name",
        default=env("KPLUG_SERVER_NAME", ""),
        metavar="NAME",
        help="the name kplug verifies in the serving certificate (env KPLUG_SERVER_NAME; "
        "default: the host of the advertised address)",
    )
    group.add_argument(
        "--issued-identity",
        action="store_const",
        const="true",
        default=env("KPLUG_ISSUED_IDENTITY"),
        help="serve TLS with a certificate for NAME.plugins.kplug.io that kplug signs on the heartbeats and "
        "renews, for a key made in memory, accepting only kplug's client certificate; needs an https:// "
        "registry and --token-file (env KPLUG_ISSUED_IDENTITY=true; default: off)",
    )
    group.add_argument(
        "--canary-weight",
        type=_canary_weight,
        default=env("KPLUG_CANARY_WEIGHT", "0"),
        metavar="PERCENT",
        help="run as a canary of the plugin's next version, taking this percentage (1-99) of the plugin's "
        "objects; kplug withdraws a canary that fails more often than the other instances "
        "(env KPLUG_CANARY_WEIGHT; default: a stable instance)",
    )
    group.add_argument(
        "--shadow",
        type=_shadow_percent,
        nargs="?",
        const=100,
        default=env("KPLUG_SHADOW", "0"),
        metavar="PERCENT",
        help="run as a shadow of the plugin's next version: kplug sends it dry-run copies of this percentage "
        "(1-100, 100 without a value) of the plugin's reconciles and shows where its answers differ "
        "(env KPLUG_SHADOW; default: not a shadow)",
    )
    group.add_argument(
        "--local-address-file",
        default=env("KPLUG_LOCAL_ADDRESS_FILE"),
        metavar="PATH",
        help="serve without kplug, as kubectl kplug render runs a plugin: no heartbeats, plain gRPC, and "
        "the listening address written to PATH (env KPLUG_LOCAL_ADDRESS_FILE)",
    )
    group.add_argument(
        "--log-level",
        type=str.upper,
        choices=_LOG_LEVELS,
        default=env("KPLUG_LOG_LEVEL", "INFO"),
        help="(env KPLUG_LOG_LEVEL; default: %(default)s)",
    )


def from_arguments(args: argparse.Namespace, environ: Mapping[str, str]) -> Config:
    """The :class:`Config` for arguments parsed by a parser set up with :func:`add_arguments`.

    Raises :class:`ValueError` for a bad registry address (including
    ``https://`` without ``--registry-ca-file``), ``KPLUG_LABELS``,
    ``KPLUG_ALLOW_UNAUTHENTICATED_CLIENTS``, ``KPLUG_ISSUED_IDENTITY`` or serving
    TLS options that do not fit together (:func:`check_serving_tls`,
    :func:`check_issued_identity`).
    """
    if not args.local_address_file:
        check_registry(args.registry, args.registry_ca_file)
    labels = dict(args.labels) if args.labels is not None else parse_labels(environ.get("KPLUG_LABELS", ""))
    try:
        allow_unauthenticated_clients = parse_bool(args.allow_unauthenticated_clients or "")
    except ValueError as error:
        raise ValueError(f"KPLUG_ALLOW_UNAUTHENTICATED_CLIENTS: {error}") from None
    try:
        issued_identity = parse_bool(args.issued_identity or "")
    except ValueError as error:
        raise ValueError(f"KPLUG_ISSUED_IDENTITY: {error}") from None
    config = Config(
        registry=args.registry,
        listen=args.listen,
        advertise=args.advertise,
        name=args.name,
        heartbeat_interval=args.heartbeat_interval,
        labels=labels,
        max_workers=args.max_workers,
        drain_timeout=args.drain_timeout,
        token_file=args.token_file,
        registry_ca_file=args.registry_ca_file,
        instance=args.instance,
        tls_cert_file=args.tls_cert_file,
        tls_key_file=args.tls_key_file,
        client_ca_file=args.client_ca_file,
        allow_unauthenticated_clients=allow_unauthenticated_clients,
        server_name=args.server_name,
        issued_identity=issued_identity,
        local_address_file=args.local_address_file,
        canary_weight=args.canary_weight,
        shadow=args.shadow,
    )
    if config.canary_weight and config.shadow:
        raise ValueError("--shadow and --canary-weight exclude each other: a shadow serves no caller")
    if config.local_address_file:
        return local(config)
    # First: its refusals name the flags that --issued-identity replaces.
    check_issued_identity(config)
    check_serving_tls(args.tls_cert_file, args.tls_key_file, args.client_ca_file, allow_unauthenticated_clients)
    return config


def _address(text: str) -> str:
    try:
        split_host_port(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _label(text: str) -> tuple[str, str]:
    try:
        return parse_label(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _positive_duration(text: str) -> float:
    value = _duration(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: must be more than zero")
    return value


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def _canary_weight(text: str) -> int:
    value = _integer(text)
    if not 0 <= value <= 99:
        raise argparse.ArgumentTypeError(f"{text!r} must be from 1 to 99 (0: a stable instance)")
    return value


def _shadow_percent(text: str) -> int:
    value = _integer(text)
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"{text!r} must be from 1 to 100 (0: not a shadow)")
    return value


def _positive_int(text: str) -> int:
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value
