"""The metrics reference from kplug's own registry: every family a running ``kplug-apiserver standalone`` registers
on ``/metrics``, with its type and help text. Families without a series yet still carry their ``# HELP`` and
``# TYPE`` lines, so the list does not depend on what the process has done."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

from standalone import standalone


def scrape(apiserver: str) -> str:
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


def metrics_page(apiserver: str) -> str:
    rows = "".join(
        f"| `{exposed_name(name, kind)}` | {kind} | {' '.join(help_text.split()).replace('|', chr(92) + '|')} |\n"
        for name, kind, help_text in families(scrape(apiserver))
    )
    return (
        "Every metric family kplug registers, as its `/metrics` (OpenMetrics text) declares it. Which labels each "
        "carries and what they mean: [Monitor kplug](../guides/monitoring.md). Cluster mode adds the families of "
        "delegated authentication (`kplug_auth_*`), which standalone kplug does not register.\n\n"
        "| metric | type | help |\n|---|---|---|\n" + rows
    )
