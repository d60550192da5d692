"""The skip policy of every pytest run in this repository (``sdk/python``, ``examples``, ``hack/tests``).

Under CI (``CI`` set, as ``.ci/run`` runs), a test that cannot run fails: a skip, at collection or in the test,
is turned into a failure naming its reason, unless the test is on :data:`ALLOWED_SKIPS`. Elsewhere skips stay
skips, and ``-rfEs`` (pytest.ini) prints each one's reason at the end of the run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

#: Node IDs (or a prefix of them) that may be skipped under CI, each with why. Empty: every test runs in CI.
ALLOWED_SKIPS: dict[str, str] = {}


def _in_ci() -> bool:
    return bool(os.environ.get("CI"))


def _allowed(nodeid: str) -> bool:
    return any(nodeid == allowed or nodeid.startswith(f"{allowed}::") for allowed in ALLOWED_SKIPS)


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    # A skip's longrepr is (file, line, "Skipped: reason").
    longrepr = report.longrepr
    return longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)


def _fail_the_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail") and _in_ci() and not _allowed(report.nodeid):
        report.outcome = "failed"
        report.longrepr = (
            f"skipped under CI: {_reason(report)}\n"
            "A test that cannot run in CI fails there: install what it needs (hack/setup.sh), "
            "or allow the skip in conftest.py's ALLOWED_SKIPS with the reason."
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    _fail_the_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield
    _fail_the_skip(outcome.get_result())
