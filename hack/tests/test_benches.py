"""The in-cluster benches (``KPLUG_BENCH_IN_CLUSTER=1``) checking themselves on the session's cluster.

``cargo bench`` measures: BENCHMARKS.md, "In the cluster", is from such runs (release builds, thousands of calls,
minutes each). Run by ``cargo test`` instead, a bench checks itself (test-support's ``bench_mode``): every phase runs
at counts too small to measure anything, and every check a phase makes still fails the run. Here both in-cluster
benches run that way on the session's installation: ``in_cluster::prepare`` adds the hello plugin (by its README's
block) and the Widgets' operator to it, which is why this runs after every other test. With hack/test.sh's cargo
features (``KPLUG_CARGO_FEATURES``) cargo reuses the suite's build and compiles nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from install import Installed
from kubecluster import REPO

# The hello plugin's rollout, the operator's, both benches' phases; a wedged phase fails the bench sooner.
TIMEOUT = 900
# What the benches' check runs do (their ``Counts::of``): calls per route one at a time and in flight, objects.
LATENCY_CALLS, THROUGHPUT_CALLS, OBJECTS = 20, 128, 64
ROUTES = (
    "through kube-apiserver and a kplug pod",
    "straight to a kplug pod",
    "a ServiceAccount token to kplug's Service",
    "direct gRPC to a plugin pod",
)


@pytest.mark.adds_to_the_installation
@pytest.mark.timeout(TIMEOUT + 60)
def test_the_in_cluster_benches_run_every_phase(installed: Installed, tmp_path: Path) -> None:
    features = os.environ.get("KPLUG_CARGO_FEATURES")
    command = [
        "cargo", "test", "--workspace", "--locked", *(["--features", features] if features else []),
        "--bench", "cluster", "--bench", "convergence",
    ]  # fmt: skip
    result = subprocess.run(
        command,
        cwd=REPO,
        env={**os.environ, "KPLUG_BENCH_IN_CLUSTER": "1", "KPLUG_BENCH_INSTALLATION": str(installed.work)},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    (tmp_path / "reports.md").write_text(result.stdout)
    (tmp_path / "progress.log").write_text(result.stderr)
    assert result.returncode == 0, f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-8000:]}"
    reports = result.stdout

    # Every report, each saying its figures measure nothing: the routes', and the operator's through kube-apiserver
    # and straight to kplug (``--kplug-url``).
    assert "## In the cluster: reconcile through kube-apiserver, a kplug pod and a plugin pod" in reports, reports
    assert "## In the cluster: the operator as a pod, apply" in reports, reports
    assert "## In the cluster: the operator as a pod straight to kplug (`--kplug-url`)" in reports, reports
    assert reports.count("**A check run**") == 3, reports
    # Every route answered every call: one at a time, then 32 in flight.
    for route in ROUTES:
        for calls in (LATENCY_CALLS, THROUGHPUT_CALLS):
            assert re.search(rf"^\| {re.escape(route)} \| {calls} \|", reports, re.MULTILINE), f"{route}, {calls}:\n{reports}"
    # Every Widget given to the operator pod converged, by either route, and it logged no error.
    converged = rf"^\| \*\*through the operator: first create → all Ready\*\* \| {OBJECTS} \|"
    assert len(re.findall(converged, reports, re.MULTILINE)) == 2, reports
    clean = r"^The operator logged \d+ delegated reconciles .* and 0 errors\.$"
    assert len(re.findall(clean, reports, re.MULTILINE)) == 2, reports
    # Each reads the memory of the 2 kplug pods, the 2 plugin pods and the operator's.
    memory = re.findall(r"^\| (kplug|plugin|operator) `[^`]+` \| [\d.]+ \(", reports, re.MULTILINE)
    assert sorted(memory) == sorted(["kplug", "kplug", "plugin", "plugin", "operator"] * 3), reports
