"""The repository's skip policy (conftest.py at its root): under CI a skip fails the run, elsewhere it is a skip.

A planted skip, run by pytest in a folder of its own with the policy loaded as a plugin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from kubecluster import REPO

PLANTED = """
import pytest

def test_skipped_inside():
    pytest.skip("planted inside")

@pytest.mark.skipif(True, reason="planted by mark")
def test_skipped_by_mark():
    pass

@pytest.mark.xfail(reason="an expected failure is no skip")
def test_expected_to_fail():
    assert False
"""


def run_planted(tmp_path: Path, ci: bool) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_planted.py").write_text(PLANTED)
    env = {k: v for k, v in os.environ.items() if k != "CI"} | {"PYTHONPATH": str(REPO)}
    if ci:
        env["CI"] = "true"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "conftest", "-rfEs", "-p", "no:cacheprovider", "test_planted.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.without_cluster
def test_a_planted_skip_fails_under_ci(tmp_path: Path) -> None:
    done = run_planted(tmp_path, ci=True)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed, 1 xfailed, 1 error" in done.stdout, done.stdout
    assert "skipped under CI: Skipped: planted inside" in done.stdout, done.stdout
    assert "skipped under CI: Skipped: planted by mark" in done.stdout, done.stdout


@pytest.mark.without_cluster
def test_a_planted_skip_is_a_printed_skip_elsewhere(tmp_path: Path) -> None:
    done = run_planted(tmp_path, ci=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 skipped, 1 xfailed" in done.stdout, done.stdout
    assert "SKIPPED [1] test_planted.py:5: planted inside" in done.stdout, done.stdout
