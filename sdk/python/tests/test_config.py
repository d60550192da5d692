"""Flags, environment fallbacks and addresses."""

from __future__ import annotations

import argparse

import pytest

import kplug
from kplug.config import (
    add_arguments,
    advertised_address,
    from_arguments,
    parse_duration,
    registry_target,
    registry_uses_tls,
    split_host_port,
)


def parse(argv: list[str], environ: dict[str, str] | None = None) -> kplug.Config:
    environ = environ or {}
    parser = argparse.ArgumentParser()
    add_arguments(parser, environ)
    return from_arguments(parser.parse_args(argv), environ)


def test_defaults_match_config() -> None:
    assert parse([]) == kplug.Config()


def test_flags() -> None:
    config = parse(
        [
            "--registry=http://kplug.kplug-system.svc:50051",
            "--listen=0.0.0.0:0",
            "--advertise=hello.plugins.svc",
            "--name=other",
            "--heartbeat-interval=750ms",
            "--drain-timeout=3",
            "--label=team=storage",
            "--label=tier=gold",
            "--max-workers=4",
            "--token-file=/var/run/secrets/kplug/token",
            "--registry-ca-file=/var/run/kplug/ca/ca.crt",
            "--instance=hello-0",
            "--tls-cert-file=/var/run/kplug/serving/tls.crt",
            "--tls-key-file=/var/run/kplug/serving/tls.key",
            "--client-ca-file=/var/run/kplug/client-ca/ca.crt",
            "--server-name=hello.plugins.svc",
        ]
    )
    assert config == kplug.Config(
        registry="http://kplug.kplug-system.svc:50051",
        listen="0.0.0.0:0",
        advertise="hello.plugins.svc",
        name="other",
        heartbeat_interval=0.75,
        drain_timeout=3.0,
        labels={"team": "storage", "tier": "gold"},
        max_workers=4,
        token_file="/var/run/secrets/kplug/token",
        registry_ca_file="/var/run/kplug/ca/ca.crt",
        instance="hello-0",
        tls_cert_file="/var/run/kplug/serving/tls.crt",
        tls_key_file="/var/run/kplug/serving/tls.key",
        client_ca_file="/var/run/kplug/client-ca/ca.crt",
        server_name="hello.plugins.svc",
    )


def test_environment_fallbacks_and_flag_precedence() -> None:
    environ = {
        "KPLUG_REGISTRY": "https://10.0.0.1:8444",
        "KPLUG_LISTEN": "127.0.0.1:6000",
        "KPLUG_ADVERTISE": "me:6000",
        "KPLUG_NAME": "from-env",
        "KPLUG_HEARTBEAT_INTERVAL": "2s",
        "KPLUG_DRAIN_TIMEOUT": "1m",
        "KPLUG_LABELS": "a=1, b=2",
        "KPLUG_MAX_WORKERS": "3",
        "KPLUG_TOKEN_FILE": "/token",
        "KPLUG_REGISTRY_CA_FILE": "/ca.crt",
        "KPLUG_INSTANCE": "hello-1",
        "POD_NAME": "not-this",
        "KPLUG_TLS_CERT_FILE": "/tls.crt",
        "KPLUG_TLS_KEY_FILE": "/tls.key",
        "KPLUG_ALLOW_UNAUTHENTICATED_CLIENTS": "true",
        "KPLUG_SERVER_NAME": "hello.plugins.svc",
    }
    config = parse([], environ)
    assert config == kplug.Config(
        registry="https://10.0.0.1:8444",
        listen="127.0.0.1:6000",
        advertise="me:6000",
        name="from-env",
        heartbeat_interval=2.0,
        drain_timeout=60.0,
        labels={"a": "1", "b": "2"},
        max_workers=3,
        token_file="/token",
        registry_ca_file="/ca.crt",
        instance="hello-1",
        tls_cert_file="/tls.crt",
        tls_key_file="/tls.key",
        allow_unauthenticated_clients=True,
        server_name="hello.plugins.svc",
    )
    overridden = parse(["--name=from-flag", "--label=c=3", "--heartbeat-interval=1", "--token-file=/t2"], environ)
    assert (overridden.name, overridden.labels, overridden.heartbeat_interval) == ("from-flag", {"c": "3"}, 1.0)
    assert overridden.token_file == "/t2"


@pytest.mark.parametrize(
    ("argv", "environ"),
    [
        (["--heartbeat-interval=soon"], {}),
        (["--heartbeat-interval=0"], {}),
        ([], {"KPLUG_HEARTBEAT_INTERVAL": "-1s"}),
        (["--listen=nowhere"], {}),
        (["--label=novalue"], {}),
        (["--max-workers=0"], {}),
        (["--log-level=chatty"], {}),
    ],
)
def test_bad_values_are_usage_errors(
    argv: list[str], environ: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse(argv, environ)
    assert exit_info.value.code == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        (["--registry=ftp://kplug:21"], {}, "unsupported scheme"),
        (["--registry=https://kplug:8444"], {}, "--registry-ca-file"),
        ([], {"KPLUG_REGISTRY": "https://kplug:8444"}, "KPLUG_REGISTRY_CA_FILE"),
        ([], {"KPLUG_LABELS": "x"}, "not key=value"),
        (["--tls-cert-file=/tls.crt"], {}, "go together"),
        ([], {"KPLUG_TLS_KEY_FILE": "/tls.key"}, "go together"),
        (["--client-ca-file=/ca.crt"], {}, "over TLS only"),
        (["--tls-cert-file=/tls.crt", "--tls-key-file=/tls.key"], {}, "KPLUG_CLIENT_CA_FILE"),
        (
            ["--tls-cert-file=/c", "--tls-key-file=/k", "--client-ca-file=/ca", "--allow-unauthenticated-clients"],
            {},
            "contradicts",
        ),
        ([], {"KPLUG_ALLOW_UNAUTHENTICATED_CLIENTS": "maybe"}, "not a boolean"),
    ],
)
def test_bad_registry_or_labels_raise(argv: list[str], environ: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse(argv, environ)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5", 5.0), ("5s", 5.0), ("1.5s", 1.5), ("250ms", 0.25), (" 2m ", 120.0), ("1h", 3600.0), ("0", 0.0)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "s", "5x", "-1s", "five", "1e3", "1.2.3s", "inf"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="500ms"):
        parse_duration(text)


def test_host_port() -> None:
    assert split_host_port("127.0.0.1:50052") == ("127.0.0.1", 50052)
    assert split_host_port("[::1]:0") == ("::1", 0)
    assert split_host_port(":50052") == ("", 50052)
    for bad in ["localhost", "::1:50052", "host:port", "host:70000", "[nope]:1"]:
        with pytest.raises(ValueError):
            split_host_port(bad)


@pytest.mark.parametrize(
    ("listen", "advertise", "expected"),
    [
        ("127.0.0.1:0", None, "127.0.0.1:41000"),
        ("0.0.0.0:0", None, "127.0.0.1:41000"),
        ("[::]:0", None, "[::1]:41000"),
        (":0", None, "127.0.0.1:41000"),
        ("0.0.0.0:0", "hello.plugins.svc", "hello.plugins.svc:41000"),
        ("0.0.0.0:0", "hello.plugins.svc:0", "hello.plugins.svc:41000"),
        ("0.0.0.0:0", "hello.plugins.svc:80", "hello.plugins.svc:80"),
        ("0.0.0.0:0", "[fd00::1]", "[fd00::1]:41000"),
    ],
)
def test_advertised_address(listen: str, advertise: str | None, expected: str) -> None:
    assert advertised_address(listen, 41000, advertise) == expected


def test_advertise_must_name_a_host() -> None:
    with pytest.raises(ValueError, match="must name a host"):
        advertised_address("0.0.0.0:0", 41000, "0.0.0.0:80")


def test_registry_targets() -> None:
    assert registry_target("127.0.0.1:50051") == "127.0.0.1:50051"
    assert registry_target(" http://kplug.kplug-system.svc:50051/ ") == "kplug.kplug-system.svc:50051"
    assert registry_target("http://[::1]:50051") == "[::1]:50051"
    assert registry_target("unix:/run/kplug.sock") == "unix:/run/kplug.sock"
    assert registry_target("https://kplug.kplug-system.svc:8444") == "kplug.kplug-system.svc:8444"
    assert registry_uses_tls("https://kplug.kplug-system.svc:8444")
    assert not registry_uses_tls("http://kplug:50051")
    assert not registry_uses_tls("kplug:50051")
    for bad, why in [
        ("https://", "not host:port"),
        ("ftp://kplug:21", "scheme"),
        ("http://", "not host:port"),
        ("kplug:0", "non-zero port"),
        ("", "not host:port"),
    ]:
        with pytest.raises(ValueError, match=why):
            registry_target(bad)


def test_allowing_unauthenticated_clients() -> None:
    tls = ["--tls-cert-file=/tls.crt", "--tls-key-file=/tls.key"]
    assert parse([*tls, "--allow-unauthenticated-clients"]).allow_unauthenticated_clients
    for value, allowed in [("true", True), ("1", True), ("yes", True), ("false", False), ("0", False)]:
        environ = {"KPLUG_ALLOW_UNAUTHENTICATED_CLIENTS": value}
        if allowed:
            assert parse(tls, environ).allow_unauthenticated_clients
        else:
            assert not parse([], environ).allow_unauthenticated_clients


def test_serving_locally_drops_the_registry_and_tls() -> None:
    # kubectl kplug render sets KPLUG_LOCAL_ADDRESS_FILE in a shell whose
    # cluster settings (an https:// registry without its CA, certificates)
    # must not stop the plugin from serving locally.
    environ = {
        "KPLUG_LOCAL_ADDRESS_FILE": "/tmp/address",
        "KPLUG_REGISTRY": "https://kplug.kplug-system.svc:8444",
        "KPLUG_TLS_CERT_FILE": "/tls.crt",
        "KPLUG_ISSUED_IDENTITY": "true",
    }
    config = parse([], environ)
    assert config.local_address_file == "/tmp/address"
    assert config.registry is None
    assert config.tls_cert_file is None
    assert not config.issued_identity
    with pytest.raises(ValueError, match="registry-ca-file"):
        parse([], {**environ, "KPLUG_LOCAL_ADDRESS_FILE": ""})


def test_canary_weight() -> None:
    assert parse([]).canary_weight == 0
    assert parse(["--canary-weight", "10"]).canary_weight == 10
    assert parse([], {"KPLUG_CANARY_WEIGHT": "25"}).canary_weight == 25
    for bad in ("100", "-1", "ten"):
        with pytest.raises(SystemExit):
            parse(["--canary-weight", bad])


def test_shadow() -> None:
    assert parse([]).shadow == 0
    assert parse(["--shadow"]).shadow == 100
    assert parse(["--shadow", "25"]).shadow == 25
    assert parse(["--shadow=5"]).shadow == 5
    assert parse([], {"KPLUG_SHADOW": "40"}).shadow == 40
    for bad in ("101", "-1", "all"):
        with pytest.raises(SystemExit):
            parse(["--shadow", bad])
    with pytest.raises(ValueError, match="exclude each other"):
        parse(["--shadow", "--canary-weight", "10"])
