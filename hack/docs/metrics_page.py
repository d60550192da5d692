"""The metrics references from the registries themselves: every family a running ``kplug-apiserver standalone``
and a running ``kplug-operator`` register on ``/metrics``, with their types and help texts. Families without a
series yet still carry their ``# HELP`` and ``# TYPE`` lines, so the lists do not depend on what the processes have
done."""

from __future__ import annotations

import re
import subprocess
import tempfile
import urllib.request
from pathlib import Path

from operator_process import operator_metrics_url
from standalone import standalone


def scrape_kplug(apiserver: str) -> str:
    """``/metrics`` of a fresh standalone kplug on free ports, read with the admin kubeconfig it writes."""
    with tempfile.TemporaryDirectory(prefix="kplug-reference-") as state, standalone(apiserver, Path(state)) as kplug:
        done = subprocess.run(
            ["kubectl", "--kubeconfig", str(kplug.kubeconfig), "get", "--raw", "/metrics"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            raise RuntimeError(f"kubectl get --raw /metrics: {done.stderr}")
        return done.stdout


def scrape_operator(operator: str) -> str:
    """``/metrics`` of a fresh ``kplug-operator`` on a private control plane."""
    with tempfile.TemporaryDirectory(prefix="kplug-reference-") as state, operator_metrics_url(operator, Path(state)) as url:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return answer.read().decode()


def families(exposition: str) -> list[tuple[str, str, str]]:
    """(name, type, help) of every family, in name order."""
    kinds: dict[str, str] = {}
    helps: dict[str, str] = {}
    for line in exposition.splitlines():
        if match := re.match(r"^# TYPE (\S+) (\S+)$", line):
            kinds[match.group(1)] = match.group(2)
        elif match := re.match(r"^# HELP (\S+) (.*)$", line):
            helps[match.group(1)] = match.group(2)
    return [(name, kinds[name], helps.get(name, "")) for name in sorted(kinds)]


def exposed_name(name: str, kind: str) -> str:
    """The name a query uses: OpenMetrics counters are exposed with ``_total``."""
    return f"{name}_total" if kind == "counter" and not name.endswith("_total") else name


def table(exposition: str) -> str:
    rows = "".join(
        f"| `{exposed_name(name, kind)}` | {kind} | {' '.join(help_text.split()).replace('|', chr(92) + '|')} |\n"
        for name, kind, help_text in families(exposition)
    )
    return "| metric | type | help |\n|---|---|---|\n" + rows


def metrics_page(apiserver: str) -> str:
    return (
        "Every metric family kplug registers, as its `/metrics` (OpenMetrics text) declares it. Which labels each "
        "carries and what they mean: [Monitor kplug](../guides/monitoring.md). Cluster mode adds the families of "
        "delegated authentication (`kplug_auth_*`), which standalone kplug does not register.\n\n" + table(scrape_kplug(apiserver))
    )


def operator_metrics_page(operator: str) -> str:
    return (
        "Every metric family `kplug-operator` (and an operator built on the library with its default registry) "
        "registers, as its `/metrics` (OpenMetrics text) declares it. Which labels each carries and what they mean: "
        "[Monitor kplug, Operator metrics](../guides/monitoring.md#operator-metrics).\n\n" + table(scrape_operator(operator))
    )
