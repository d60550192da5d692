"""``kplug-operator`` as a child process on a private control plane (``hack/control-plane.sh``), for the docs'
generator: the smallest setting in which it starts and serves ``/metrics``. It operates the walkthrough's
DatabaseTables (their CRD alone); no kplug is needed for its metrics."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "examples" / "database-table" / "crds" / "databasetables.yaml"
# The operator's log line once /metrics listens: "serving metrics address=... url=http://...".
SERVING = re.compile(r"serving metrics .*url=(http://\S+)")


@contextmanager
def control_plane(state: Path) -> Iterator[Path]:
    """etcd and kube-apiserver with their files in ``state``; yields the admin kubeconfig."""
    script = REPO / "hack" / "control-plane.sh"
    started = subprocess.run([str(script), "start", str(state)], capture_output=True, text=True, timeout=300)
    if started.returncode != 0:
        raise RuntimeError(f"hack/control-plane.sh start: {started.stderr[-3000:]}")
    try:
        yield Path(started.stdout.strip())
    finally:
        subprocess.run([str(script), "stop", str(state)], capture_output=True, timeout=120)


@contextmanager
def operator_metrics_url(binary: str, state: Path, timeout: float = 60) -> Iterator[str]:
    """Starts ``binary`` for DatabaseTables on a fresh control plane in ``state``, with plain-HTTP ``/metrics`` on
    a free loopback port; yields that URL once it listens, stops everything after."""
    with control_plane(state) as kubeconfig:
        environment = {**{k: v for k, v in os.environ.items() if not k.startswith("KPLUG_")}, "KUBECONFIG": str(kubeconfig)}
        # The operator finds its resource by discovery at start, and exits if it is not served yet.
        for command in (["apply", "-f", str(CRD)], ["wait", "--for", "condition=Established", "--timeout", "60s", "-f", str(CRD)]):
            done = subprocess.run(["kubectl", *command], env=environment, capture_output=True, text=True, timeout=90)
            if done.returncode != 0:
                raise RuntimeError(f"kubectl {' '.join(command)}: {done.stderr}")
        log = state / "operator.log"
        with log.open("wb") as output:
            process = subprocess.Popen(
                [binary, "--resource", "databasetables.myorg.org", "--metrics-bind-address", "127.0.0.1:0", "--metrics-secure=false"],
                env={**environment, "NO_COLOR": "1"},
                stdout=output,
                stderr=output,
            )
        try:
            deadline = time.monotonic() + timeout
            while not (served := SERVING.search(log.read_text(errors="replace"))):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{binary} served no /metrics (exit code {process.poll()}); its log:\n{log.read_text()[-3000:]}")
                time.sleep(0.1)
            yield served.group(1)
        finally:
            process.terminate()
            process.wait(30)
