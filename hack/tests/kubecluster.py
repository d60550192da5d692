"""The real cluster of ``hack/cluster.sh``, as tests use it.

:class:`Cluster` wraps the settings that ``hack/cluster.sh env`` prints and
runs kubectl against the cluster; :func:`leftovers` lists what a ``down``
should have removed and did not.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

REPO = Path(__file__).resolve().parents[2]
CLUSTER_SH = REPO / "hack" / "cluster.sh"
DEFAULT_DIR = Path(os.environ.get("KPLUG_CLUSTER_DIR", "/var/lib/kplug-cluster"))
BRIDGE = "kplug0"

T = TypeVar("T")


def cluster_sh(*args: str, env: Mapping[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Runs ``hack/cluster.sh ARGS`` and returns what it did (never raises on its exit code)."""
    return subprocess.run(
        [str(CLUSTER_SH), *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def wait_for(what: str, check: Callable[[], T | None], timeout: float = 60, interval: float = 0.25) -> T:
    """Polls ``check`` until it returns something other than None or False; fails with ``what`` on the deadline."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
        except (subprocess.CalledProcessError, ValueError, KeyError) as error:
            last_error = error
            result = None
        if result is not None and result is not False:
            return result
        time.sleep(interval)
    raise AssertionError(f"{what}: not after {timeout:.0f}s" + (f" (last error: {last_error})" if last_error else ""))


@dataclass
class Cluster:
    """A running cluster: its ``env`` (what ``hack/cluster.sh env`` prints) and kubectl on it."""

    env: dict[str, str]

    @classmethod
    def from_env_output(cls, text: str) -> Cluster:
        env: dict[str, str] = {}
        for line in text.splitlines():
            if "=" not in line or line.startswith(("#", "export ")):
                continue
            key, _, value = line.partition("=")
            words = shlex.split(value)
            env[key] = words[0] if words else ""
        return cls(env)

    @property
    def kubeconfig(self) -> str:
        return self.env["KUBECONFIG"]

    def kubectl(self, *args: str, input: str | None = None, timeout: float = 60) -> str:
        """Runs kubectl with the admin kubeconfig; raises CalledProcessError with its stderr on failure."""
        result = subprocess.run(
            ["kubectl", "--kubeconfig", self.kubeconfig, *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise subprocess.CalledProcessError(result.returncode, result.args, result.stdout, result.stderr)
        return result.stdout

    def kubectl_json(self, *args: str) -> dict:
        return json.loads(self.kubectl(*args, "-o", "json"))

    def apply(self, manifest: str, namespace: str | None = None) -> None:
        self.kubectl(*(["-n", namespace] if namespace else []), "apply", "-f", "-", input=manifest)

    def exec(self, namespace: str, pod: str, command: Sequence[str], timeout: float = 30) -> str:
        return self.kubectl("-n", namespace, "exec", pod, "--", *command, timeout=timeout)

    def ready_pods(self, namespace: str, selector: str) -> list[dict]:
        pods = self.kubectl_json("-n", namespace, "get", "pods", "-l", selector)["items"]
        return [
            pod
            for pod in pods
            if pod["metadata"].get("deletionTimestamp") is None
            and any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))
        ]

    def pod(self, namespace: str, name: str) -> dict:
        return self.kubectl_json("-n", namespace, "get", "pod", name)

    def container_id(self, namespace: str, pod: str, container: str) -> str:
        """The runtime's id of ``container`` in ``pod`` (without the ``containerd://`` prefix)."""
        statuses = self.pod(namespace, pod)["status"].get("containerStatuses", [])
        (found,) = [s for s in statuses if s["name"] == container]
        return found["containerID"].removeprefix("containerd://")

    def kill_container(self, container_id: str, sig: str = "SIGKILL") -> None:
        """Sends ``sig`` to a container's task straight through containerd, behind the kubelet's back."""
        subprocess.run(
            ["ctr", "--address", self.env["CONTAINERD_ADDRESS"], "-n", "k8s.io", "tasks", "kill", "-s", sig, container_id],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )

    @property
    def audit_log(self) -> Path:
        return Path(self.env["KPLUG_CLUSTER_AUDIT_LOG"])

    def audit_events(self, offset: int = 0) -> tuple[list[dict], int]:
        """kube-apiserver's audit events written from byte ``offset`` on, and the offset after the last whole line.

        The policy of hack/cluster.sh logs writes only (create, update, patch,
        delete, deletecollection), at level Metadata: who (``user``,
        ``userAgent``, ``sourceIPs``), what (``objectRef``) and the answer
        (``responseStatus.code``).
        """
        with self.audit_log.open("rb") as log:
            log.seek(offset)
            data = log.read()
        whole = data[: data.rfind(b"\n") + 1]
        return [json.loads(line) for line in whole.splitlines() if line.strip()], offset + len(whole)

    def audit_offset(self) -> int:
        """Where the audit log ends now: :meth:`audit_events` from here reads what comes after."""
        if not self.audit_log.exists():
            return 0
        with self.audit_log.open("rb") as log:
            size = log.seek(0, os.SEEK_END)
            start = max(0, size - 65536)
            log.seek(start)
            return start + log.read().rfind(b"\n") + 1

    def _kubelet_pid_file(self) -> Path:
        return Path(self.env["KPLUG_CLUSTER_DIR"]) / "pids" / "kubelet"

    def kubelet_pid(self) -> int | None:
        """The kubelet's PID as hack/cluster.sh records it, if that process is a running kubelet."""
        try:
            pid = int(self._kubelet_pid_file().read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _runs(pid, "kubelet") else None

    def stop_kubelet(self) -> None:
        """``hack/cluster.sh stop kubelet``: SIGTERM (its pods keep running), waiting until it has exited."""
        self._daemon("stop", "kubelet")

    def start_kubelet(self) -> int:
        """``hack/cluster.sh start kubelet``: the command line ``up`` used, output appended to its log; its PID."""
        self._daemon("start", "kubelet")
        pid = self.kubelet_pid()
        if pid is None:
            raise AssertionError("hack/cluster.sh start kubelet: no kubelet running afterwards")
        return pid

    def _daemon(self, action: str, name: str) -> None:
        done = cluster_sh(action, name, env=self.env, timeout=60)
        if done.returncode != 0:
            raise AssertionError(f"hack/cluster.sh {action} {name} failed:\n{done.stderr}")

    def resolve_in_pod(self, name: str, namespace: str = "default") -> set[str]:
        """The IPv4 addresses a new pod in ``namespace`` gets for ``name`` from the cluster DNS (busybox nslookup in
        a throwaway toolbox pod; busybox applies the search list to single labels only, so give a full name)."""
        result = subprocess.run(
            [
                "kubectl", "--kubeconfig", self.kubeconfig, "-n", namespace, "run", f"resolve-{os.getpid()}-{time.monotonic_ns()}",
                "--rm", "-i", "--quiet", "--restart=Never", f"--image={self.env['KPLUG_CLUSTER_TOOLBOX_IMAGE']}",
                "--image-pull-policy=Never", "--command", "--", "/bin/busybox", "nslookup", name,
            ],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        return nslookup_addresses(result.stdout)

    def egress_drops(self) -> tuple[int, str]:
        """How many packets pods tried to send off the machine (the counter of the DROP rule of hack/cluster.sh's
        egress chain), and the chain as iptables lists it."""
        chain = self.env["KPLUG_CLUSTER_EGRESS_CHAIN"]
        rules = subprocess.run(["iptables", "-w", "-L", chain, "-v", "-n", "-x"], capture_output=True, text=True, check=True).stdout
        drop = [line.split() for line in rules.splitlines() if " DROP " in f" {line} "]
        assert drop, f"no DROP rule in {chain}:\n{rules}"
        return int(drop[0][0]), rules

    def logs_tail(self, lines: int = 30) -> str:
        """The last lines of every daemon's log, for a failure message."""
        out = []
        for log in sorted(Path(self.env["KPLUG_CLUSTER_LOGS"]).glob("*.log")):
            if log.name == "audit.log":
                continue
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log} ---\n" + "\n".join(tail))
        return "\n".join(out)


def nslookup_addresses(output: str) -> set[str]:
    """The addresses busybox nslookup answered: it prints the server first ("Server: 10.96.0.10"), then "Address: IP"
    per answer."""
    _, _, answers = output.partition("Name:")
    return set(re.findall(r"Address:\s+([0-9.]+)", answers))


def _runs(pid: int, name: str) -> bool:
    """PID is a live process running the program ``name`` (hack/lib/common.sh's pid_is)."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False
    return Path(exe.removesuffix(" (deleted)")).name == name


def leftovers(cluster_dir: Path = DEFAULT_DIR) -> list[str]:
    """What of a cluster is still on this machine: empty after a complete ``down``."""
    found = []
    if cluster_dir.exists():
        found.append(f"state folder {cluster_dir}")
    if subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True, check=False).returncode == 0:
        found.append(f"bridge {BRIDGE}")
    for table in ("filter", "nat", "mangle"):
        saved = subprocess.run(["iptables-save", "-t", table], capture_output=True, text=True, check=True).stdout
        chains = [line.split()[0][1:] for line in saved.splitlines() if line.startswith((":KUBE-", ":KPLUG-"))]
        if chains:
            found.append(f"iptables {table} chains {chains}")
    mounts = subprocess.run(["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True, check=True).stdout
    ours = [m for m in mounts.splitlines() if m.startswith((f"{cluster_dir}/", "/run/netns/cni-", "/var/run/netns/cni-"))]
    if ours:
        found.append(f"mounts {ours[:5]}")
    netns = list(Path("/run/netns").glob("cni-*")) if Path("/run/netns").exists() else []
    if netns:
        found.append(f"network namespaces {netns}")
    cgroups = list(Path("/sys/fs/cgroup").glob("*/kubepods"))
    if cgroups:
        found.append(f"cgroups {cgroups}")
    if Path("/var/lib/cni").exists():
        found.append("/var/lib/cni")
    daemons = subprocess.run(
        [
            "pgrep",
            "-a",
            "-f",
            "(etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kubelet|kube-proxy|containerd"
            f"|containerd-shim-runc-v2|kplug-cluster-dns) .*{cluster_dir}",
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    if daemons:
        found.append(f"processes {daemons.splitlines()}")
    return found
