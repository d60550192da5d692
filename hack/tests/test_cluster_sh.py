"""``hack/cluster.sh up`` where it cannot work: it fails at once, says which
and what to do, and leaves nothing behind."""

from __future__ import annotations

import fcntl
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest
from kubecluster import CLUSTER_SH, cluster_sh, leftovers

pytestmark = [pytest.mark.without_cluster, pytest.mark.usefixtures("no_cluster")]

# Refusals come from the preflight checks, before anything starts.
QUICK = 20


def refused_up(env: dict[str, str] | None = None, command: list[str] | None = None) -> str:
    """Runs a refused ``up``, checks it failed quickly and left nothing; returns its message."""
    started = time.monotonic()
    if command is None:
        result = cluster_sh("up", env=env)
    else:
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    took = time.monotonic() - started
    assert result.returncode != 0, f"up succeeded where it cannot work:\n{result.stderr}"
    assert result.stdout == "", "a refused up printed a kubeconfig path"
    assert took < QUICK, f"a refused up took {took:.1f}s"
    assert not leftovers(), f"a refused up left {leftovers()}"
    return result.stderr


def test_not_root_is_refused() -> None:
    message = refused_up(command=["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(CLUSTER_SH), "up"])
    assert "must run as root" in message


def test_a_second_up_while_one_starts_is_refused() -> None:
    # The lock an up holds while it starts, held here as that up would: two
    # ups started together cannot be made to race on demand.
    with open("/run/lock/kplug-cluster-up.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        message = refused_up()
    assert "another hack/cluster.sh up is starting a cluster" in message
    assert "wait for it" in message


@pytest.fixture
def taken_port() -> Iterator[int]:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 10257))
    listener.listen()
    yield 10257
    listener.close()


def test_a_port_in_use_is_named(taken_port: int) -> None:
    message = refused_up()
    assert f"port(s) {taken_port} already in use" in message
    assert "stop what listens there" in message


@pytest.fixture
def subnet_in_use() -> Iterator[str]:
    # An interface holding an address in the pods' /24, as another
    # network on the machine would.
    subprocess.run(["ip", "link", "add", "kplugtest0", "type", "bridge"], check=True)
    try:
        subprocess.run(["ip", "addr", "add", "10.244.0.77/24", "dev", "kplugtest0"], check=True)
        subprocess.run(["ip", "link", "set", "kplugtest0", "up"], check=True)
        yield "10.244.0.0/24"
    finally:
        subprocess.run(["ip", "link", "del", "kplugtest0"], check=True)


def test_the_pods_subnet_in_use_is_named(subnet_in_use: str) -> None:
    message = refused_up()
    assert f"subnet {subnet_in_use} is in use on this machine" in message
    assert "kplugtest0" in message, "the message names the interface that holds it"


def test_missing_cgroups_are_named() -> None:
    # In a mount namespace of its own, /sys/fs/cgroup is an empty tmpfs: the
    # cgroups are really missing there, and only there.
    script = f"mount -t tmpfs none /sys/fs/cgroup && exec {CLUSTER_SH} up"
    message = refused_up(command=["unshare", "--mount", "--propagation", "private", "sh", "-c", script])
    assert "cgroup controller 'cpu' is not mounted" in message


def test_down_after_a_failed_up_removes_everything() -> None:
    # The kubelet refuses an unknown flag and exits: up fails after the
    # bridge, iptables rules, containerd and the control plane exist.
    result = cluster_sh("up", env={"KPLUG_CLUSTER_KUBELET_EXTRA_ARGS": "--no-such-kubelet-flag"}, timeout=300)
    assert result.returncode != 0
    assert "kubelet exited while waiting for node kplug-node Ready" in result.stderr
    assert "unknown flag: --no-such-kubelet-flag" in result.stderr, "the kubelet's log is shown"
    assert "cleaning up" in result.stderr
    assert not leftovers(), f"left after a failed up: {leftovers()}"


def test_down_with_nothing_up_is_a_no_op() -> None:
    result = cluster_sh("down")
    assert result.returncode == 0, result.stderr
    assert not leftovers()


def test_env_with_nothing_up_says_so() -> None:
    result = cluster_sh("env")
    assert result.returncode != 0
    assert "no cluster is up" in result.stderr
