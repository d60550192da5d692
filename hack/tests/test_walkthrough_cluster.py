"""``hack/walkthrough.sh --cluster``: the DatabaseTable walkthrough with pods
on a real cluster of its own, which it brings up and takes down.

The check runs before the session's cluster is up (``without_cluster``). It
builds what is missing of the images first (minutes from nothing; about a
second when nothing changed) and takes about two minutes more. With
KPLUG_SKIP_IMAGES=1 (no buildah) it is skipped, as the images' tests are.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from kubecluster import REPO, Cluster, cluster_sh, leftovers

WALKTHROUGH = REPO / "hack" / "walkthrough.sh"
# Image builds from nothing, with the CPU shared, then the walkthrough.
TIMEOUT = int(os.environ.get("KPLUG_IMAGES_TIMEOUT", "3600")) + 600

skip_without_images = pytest.mark.skipif(os.environ.get("KPLUG_SKIP_IMAGES") == "1", reason="KPLUG_SKIP_IMAGES=1")


@skip_without_images
@pytest.mark.without_cluster
@pytest.mark.usefixtures("no_cluster")
@pytest.mark.timeout(TIMEOUT + 60)
def test_check_shows_the_table_in_mariadb_and_leaves_nothing(tmp_path: Path) -> None:
    work = tmp_path / "walkthrough"
    started = time.monotonic()
    result = subprocess.run(
        [str(WALKTHROUGH), "--cluster", "--check"],
        env={**os.environ, "KPLUG_WALKTHROUGH_DIR": str(work)},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    took = time.monotonic() - started
    assert result.returncode == 0, (
        f"hack/walkthrough.sh --cluster --check failed ({result.returncode}) after {took:.0f}s; "
        f"its files (diagnostics/) stay in {work}\n{result.stderr[-20000:]}"
    )
    # The table, as MariaDB shows it (kubectl exec into its pod), and the verdict.
    assert "CREATE TABLE `users`" in result.stdout, result.stdout
    assert "ENGINE=InnoDB" in result.stdout, result.stdout
    assert "status.implementation=MariaDB, columns id,name" in result.stderr
    assert "verified" in result.stderr
    # The READMEs' commands ran, with the passwords filled in.
    logs = work / ".install-logs"
    assert sorted(p.name for p in logs.iterdir()) == [
        "readme-md-s-installation.log",
        "the-databasetable-example-s-installation.log",
        "the-walkthrough-databases-installation.log",
    ]
    assert "PASSWORD@" not in (logs / "the-databasetable-example-s-installation.log").read_text()
    # Taken down: nothing of the cluster is left.
    assert not leftovers(), f"left after the walkthrough: {leftovers()}"


def test_refuses_while_a_cluster_is_up_and_leaves_it_alone(cluster: Cluster, tmp_path: Path) -> None:
    started = time.monotonic()
    result = subprocess.run(
        [str(WALKTHROUGH), "--cluster", "--check"],
        env={**os.environ, "KPLUG_WALKTHROUGH_DIR": str(tmp_path / "walkthrough")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0, result.stderr
    assert "a cluster is already up on this machine" in result.stderr
    assert time.monotonic() - started < 30, "the refusal came only after the slow steps"
    assert "taking the cluster down" not in result.stderr
    status = cluster_sh("status")
    assert status.returncode == 0, f"the session's cluster is no longer whole:\n{status.stderr}"
    cluster.kubectl("get", "nodes")
