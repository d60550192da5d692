"""Fixtures for the tests of the real cluster (``hack/cluster.sh``).

One cluster per machine: the session brings it up once, for every test that
asks for ``cluster``, and takes it down at the end. Tests marked
``without_cluster`` need the machine free of it (they try ``up`` failing);
they run first, before the cluster comes up. Tests marked
``adds_to_the_installation`` run last, so that every other test sees the
installation as README's steps leave it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from install import Installed, install
from kubecluster import Cluster, cluster_sh, leftovers


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "without_cluster: needs no cluster on the machine; runs before the cluster is up")
    config.addinivalue_line(
        "markers",
        "adds_to_the_installation: adds plugins or operators to the session's installation; runs after every other test",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def phase(item: pytest.Item) -> int:
        if item.get_closest_marker("without_cluster"):
            return 0
        return 2 if item.get_closest_marker("adds_to_the_installation") else 1

    items.sort(key=phase)


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The real cluster, up for the rest of the session."""
    assert not leftovers(), f"a cluster is already on this machine: {leftovers()} (hack/cluster.sh down)"
    up = cluster_sh("up")
    assert up.returncode == 0, f"hack/cluster.sh up failed:\n{up.stderr}"
    env = cluster_sh("env")
    assert env.returncode == 0, env.stderr
    running = Cluster.from_env_output(env.stdout)
    yield running
    # After every test (kplug, the plugins, the operator and the databases
    # included), no pod has tried to send a packet off the machine.
    dropped, rules = running.egress_drops()
    if request.session.testsfailed:
        print(f"\n=== the cluster's logs after {request.session.testsfailed} failed test(s) ===\n{running.logs_tail()}")
    down = cluster_sh("down")
    assert down.returncode == 0, f"hack/cluster.sh down failed:\n{down.stderr}"
    assert not leftovers(), f"left after down: {leftovers()}"
    assert dropped == 0, f"pods tried to send {dropped} packet(s) off the machine during the session:\n{rules}"


@pytest.fixture
def no_cluster() -> None:
    """The machine has no cluster now (a test that needs one absent says so)."""
    found = leftovers()
    assert not found, f"a cluster is on this machine: {found}"


@pytest.fixture(scope="session")
def installed(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """kplug installed by README's steps, and the DatabaseTable plugins and operator by theirs."""
    return install(cluster, tmp_path_factory.mktemp("install"))
