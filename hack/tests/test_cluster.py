"""The real cluster of ``hack/cluster.sh``: pods, Services through kube-proxy,
cluster DNS, ServiceAccount tokens, the downward API, and no packet off the
machine."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from kubecluster import CLUSTER_SH, Cluster, cluster_sh, nslookup_addresses, wait_for

NS = "cluster-test"

TOOLBOX = """
apiVersion: v1
kind: ServiceAccount
metadata: {{name: toolbox}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      serviceAccountName: toolbox
      containers:
      - name: toolbox
        image: {image}
        imagePullPolicy: Never
        # Serves its own /etc (hostname among it) on 8080.
        command: [/bin/busybox, httpd, -f, -p, "8080", -h, /etc]
        env:
        - name: POD_NAME
          valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}
        readinessProbe:
          tcpSocket: {{port: 8080}}
          periodSeconds: 1
        volumeMounts:
        - {{name: token, mountPath: /var/run/secrets/kplug}}
      volumes:
      - name: token
        projected:
          sources:
          - serviceAccountToken: {{audience: kplug-test, expirationSeconds: 3600, path: token}}
---
apiVersion: v1
kind: Service
metadata: {{name: {name}}}
spec:
  selector: {{app: {name}}}
  ports: [{{port: 80, targetPort: 8080}}]
---
apiVersion: v1
kind: Service
metadata: {{name: {name}-headless}}
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector: {{app: {name}}}
  ports: [{{port: 8080}}]
"""


# Two pods, one that turns Ready and one that never does (its probe's port is
# closed), behind two headless Services: one that publishes not-ready
# addresses, as kplug-registry does, and one that does not.
READINESS_PAIR = """
apiVersion: v1
kind: Pod
metadata: {{name: dns-ready, labels: {{dns-check: "yes"}}}}
spec:
  containers:
  - {{name: c, image: {image}, imagePullPolicy: Never, command: [/bin/busybox, httpd, -f, -p, "8080", -h, /etc],
     readinessProbe: {{tcpSocket: {{port: 8080}}, periodSeconds: 1}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: dns-not-ready, labels: {{dns-check: "yes"}}}}
spec:
  containers:
  - {{name: c, image: {image}, imagePullPolicy: Never, command: [/bin/busybox, httpd, -f, -p, "8080", -h, /etc],
     readinessProbe: {{tcpSocket: {{port: 9}}, periodSeconds: 1}}}}
---
apiVersion: v1
kind: Service
metadata: {{name: dns-all}}
spec: {{clusterIP: None, publishNotReadyAddresses: true, selector: {{dns-check: "yes"}}, ports: [{{port: 8080}}]}}
---
apiVersion: v1
kind: Service
metadata: {{name: dns-ready-only}}
spec: {{clusterIP: None, selector: {{dns-check: "yes"}}, ports: [{{port: 8080}}]}}
"""


@pytest.fixture(scope="module")
def toolbox(cluster: Cluster) -> list[str]:
    """Two Ready toolbox pods behind a ClusterIP and a headless Service; their names."""
    cluster.apply(f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n")
    cluster.apply(TOOLBOX.format(name="toolbox", replicas=2, image=cluster.env["KPLUG_CLUSTER_TOOLBOX_IMAGE"]), NS)
    pods = wait_for("2 Ready toolbox pods", lambda: (lambda p: p if len(p) == 2 else None)(cluster.ready_pods(NS, "app=toolbox")), 90)
    return [pod["metadata"]["name"] for pod in pods]


def http_get_from_pod(cluster: Cluster, pod: str, host: str, path: str) -> str:
    # busybox's wget crashes without glibc's files in the image; nc speaks HTTP/1.0 well enough.
    request = f"printf 'GET {path} HTTP/1.0\\r\\n\\r\\n' | busybox nc -w 3 {host} 80"
    return cluster.exec(NS, pod, ["/bin/busybox", "sh", "-c", request])


def test_the_node_is_ready_with_every_daemon_running(cluster: Cluster) -> None:
    node = cluster.kubectl_json("get", "node", cluster.env["KPLUG_CLUSTER_NODE_NAME"])
    assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.20.2"
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True"
    status = cluster_sh("status")
    assert status.returncode == 0, status.stderr


def test_a_second_up_is_refused_and_the_cluster_stays(cluster: Cluster) -> None:
    second = cluster_sh("up")
    assert second.returncode != 0
    assert "a cluster is already running" in second.stderr
    assert cluster_sh("status").returncode == 0, "the refused up stopped something"
    cluster.kubectl("get", "--raw", "/readyz")


def test_one_daemon_stops_and_starts_again_and_keeps_no_lock_of_its_caller(cluster: Cluster, tmp_path: Path) -> None:
    """``stop`` and ``start`` one daemon, the kubelet, while the caller holds
    a lock on a descriptor (as scripts sharing the one cluster do with
    flock): the restarted daemon must not hold it once the caller is gone."""
    assert "no daemon nope" in cluster_sh("stop", "nope").stderr
    stopped = cluster_sh("stop", "kubelet")
    assert stopped.returncode == 0, stopped.stderr
    status = cluster_sh("status")
    assert status.returncode != 0 and "kubelet not running" in status.stderr, status.stderr
    lock = tmp_path / "lock"
    started = subprocess.run(
        ["bash", "-c", 'exec 9>"$1"; flock 9; "$2" start kubelet', "bash", str(lock), str(CLUSTER_SH)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    pid = cluster.kubelet_pid()
    assert pid is not None, started.stderr
    held = [os.readlink(f) for f in Path(f"/proc/{pid}/fd").iterdir() if f.is_symlink()]
    assert str(lock) not in held, f"the kubelet holds its caller's lock: {held}"
    assert subprocess.run(["flock", "-n", str(lock), "true"], check=False).returncode == 0, "the lock is still held"
    again = cluster_sh("start", "kubelet")
    assert again.returncode != 0 and "already running" in again.stderr, again.stderr
    assert cluster_sh("status").returncode == 0
    node = cluster.env["KPLUG_CLUSTER_NODE_NAME"]
    wait_for(
        "the node Ready after the kubelet's restart",
        lambda: cluster.kubectl("get", "node", node, "-o", "jsonpath={.status.conditions[?(@.type=='Ready')].status}") == "True" or None,
    )


def test_services_reach_pods_from_the_host_and_from_pods(cluster: Cluster, toolbox: list[str]) -> None:
    cluster_ip = cluster.kubectl("-n", NS, "get", "service", "toolbox", "-o", "jsonpath={.spec.clusterIP}")
    assert ipaddress.ip_address(cluster_ip) in ipaddress.ip_network(cluster.env["KPLUG_CLUSTER_SERVICE_CIDR"])
    # From the host, through kube-proxy's rules: both pods answer in time.
    seen_from_host: set[str] = set()

    def both_answered_host() -> bool:
        reply = subprocess.run(["curl", "-sS", "-m", "3", f"http://{cluster_ip}/hostname"], capture_output=True, text=True, check=False)
        seen_from_host.add(reply.stdout.strip())
        return set(toolbox) <= seen_from_host

    wait_for(f"both pods answering the host through {cluster_ip} (seen {seen_from_host})", both_answered_host, 30, 0)
    # From a pod, to the Service that includes itself (hairpin) and by DNS name.
    seen_from_pod: set[str] = set()

    def both_answered_pod() -> bool:
        reply = http_get_from_pod(cluster, toolbox[0], f"toolbox.{NS}.svc.cluster.local", "/hostname")
        seen_from_pod.add(reply.strip().splitlines()[-1])
        return set(toolbox) <= seen_from_pod

    wait_for(f"both pods answering {toolbox[0]} through the Service (seen {seen_from_pod})", both_answered_pod, 60, 0)


def nslookup(cluster: Cluster, pod: str, name: str) -> tuple[int, str]:
    """busybox nslookup NAME in the pod, through its resolv.conf: (exit code, output).

    busybox tries every search domain and exits 1 if any had no answer, so
    the addresses it printed are what tells.
    """
    result = subprocess.run(
        ["kubectl", "--kubeconfig", cluster.kubeconfig, "-n", NS, "exec", pod, "--", "/bin/busybox", "nslookup", name],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return result.returncode, result.stdout + result.stderr


def test_pods_resolve_service_names_through_the_cluster_dns(cluster: Cluster, toolbox: list[str]) -> None:
    pod = toolbox[0]
    resolv = cluster.exec(NS, pod, ["/bin/busybox", "cat", "/etc/resolv.conf"])
    assert resolv.split("\n")[0:3] == [
        f"search {NS}.svc.cluster.local svc.cluster.local cluster.local",
        f"nameserver {cluster.env['KPLUG_CLUSTER_DNS_IP']}",
        "options ndots:5",
    ], f"a pod's resolv.conf names the cluster DNS alone:\n{resolv}"

    cluster_ip = cluster.kubectl("-n", NS, "get", "service", "toolbox", "-o", "jsonpath={.spec.clusterIP}")
    # busybox applies the search list to single labels only (glibc follows
    # ndots:5); kplug's own pods resolve partial names in the install tests.
    for name in ("toolbox", f"toolbox.{NS}.svc.cluster.local"):
        _, output = nslookup(cluster, pod, name)
        assert nslookup_addresses(output) == {cluster_ip}, f"{name}:\n{output}"
    _, output = nslookup(cluster, pod, "kubernetes.default.svc.cluster.local")
    assert nslookup_addresses(output) == {"10.96.0.1"}, output

    # Headless: one address per pod, in step with the pods.
    pod_ips = {p["status"]["podIP"] for p in cluster.ready_pods(NS, "app=toolbox")}
    _, output = nslookup(cluster, pod, f"toolbox-headless.{NS}.svc.cluster.local")
    assert nslookup_addresses(output) == pod_ips, output

    cluster.kubectl("-n", NS, "scale", "deployment", "toolbox", "--replicas=3")
    try:
        wait_for("3 Ready toolbox pods", lambda: len(cluster.ready_pods(NS, "app=toolbox")) == 3, 60)
        three = {p["status"]["podIP"] for p in cluster.ready_pods(NS, "app=toolbox")}
        wait_for(
            "the headless name answering with 3 addresses",
            lambda: nslookup_addresses(nslookup(cluster, pod, f"toolbox-headless.{NS}.svc.cluster.local")[1]) == three,
            30,
        )
    finally:
        cluster.kubectl("-n", NS, "scale", "deployment", "toolbox", "--replicas=2")
        wait_for("2 toolbox pods again", lambda: len(cluster.kubectl_json("-n", NS, "get", "pods", "-l", "app=toolbox")["items"]) == 2, 90)

    # Not-ready pods: answered where the Service publishes them, left out where it does not.
    cluster.apply(READINESS_PAIR.format(image=cluster.env["KPLUG_CLUSTER_TOOLBOX_IMAGE"]), NS)
    try:
        ready_ip = wait_for("dns-ready Ready", lambda: next((p["status"]["podIP"] for p in cluster.ready_pods(NS, "dns-check=yes")), None), 60)
        not_ready_ip = wait_for("dns-not-ready's address", lambda: cluster.pod(NS, "dns-not-ready")["status"].get("podIP"), 60)
        wait_for(
            "the publishing headless name answering with both pods",
            lambda: nslookup_addresses(nslookup(cluster, pod, f"dns-all.{NS}.svc.cluster.local")[1]) == {ready_ip, not_ready_ip},
            30,
        )
        _, output = nslookup(cluster, pod, f"dns-ready-only.{NS}.svc.cluster.local")
        assert nslookup_addresses(output) == {ready_ip}, output
        assert [p["metadata"]["name"] for p in cluster.ready_pods(NS, "dns-check=yes")] == ["dns-ready"]
    finally:
        cluster.kubectl("-n", NS, "delete", "pod/dns-ready", "pod/dns-not-ready", "service/dns-all", "service/dns-ready-only", "--wait=false")

    # Names that do not exist, and names outside the cluster domain: no answer.
    code, output = nslookup(cluster, pod, f"no-such-service.{NS}.svc.cluster.local")
    assert code != 0 and not nslookup_addresses(output), output
    code, output = nslookup(cluster, pod, "kplug.io")
    assert code != 0 and not nslookup_addresses(output), f"a name outside the cluster domain was answered:\n{output}"


def test_projected_tokens_and_the_downward_api(cluster: Cluster, toolbox: list[str]) -> None:
    pod = toolbox[0]
    assert cluster.exec(NS, pod, ["/bin/busybox", "sh", "-c", "echo $POD_NAME"]).strip() == pod
    token = cluster.exec(NS, pod, ["/bin/busybox", "cat", "/var/run/secrets/kplug/token"]).strip()
    review = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": token, "audiences": ["kplug-test"]},
    }
    answer = json.loads(cluster.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(review)))
    assert answer["status"].get("authenticated") is True, answer["status"]
    assert answer["status"]["user"]["username"] == f"system:serviceaccount:{NS}:toolbox"
    assert answer["status"]["audiences"] == ["kplug-test"]
    # A token for another audience is not accepted for this one.
    review["spec"]["audiences"] = ["kubernetes.default.svc.other"]
    answer = json.loads(cluster.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(review)))
    assert not answer["status"].get("authenticated"), answer["status"]


def test_logs_and_a_restarted_container(cluster: Cluster, toolbox: list[str]) -> None:
    pod = toolbox[1]
    cluster.exec(NS, pod, ["/bin/busybox", "sh", "-c", "echo marker-from-exec > /proc/1/fd/1"])
    wait_for("the line in kubectl logs", lambda: "marker-from-exec" in cluster.kubectl("-n", NS, "logs", pod), 10)
    # The container's process killed from outside (as the OOM killer would;
    # inside, PID 1 ignores signals it has no handler for): the kubelet
    # restarts it in place.
    status = cluster.kubectl_json("-n", NS, "get", "pod", pod)["status"]["containerStatuses"][0]
    container_id = status["containerID"].removeprefix("containerd://")
    subprocess.run(
        ["ctr", "--address", cluster.env["CONTAINERD_ADDRESS"], "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", container_id],
        check=True,
    )
    wait_for(
        "the container restarted and Ready",
        lambda: any(
            p["metadata"]["name"] == pod and p["status"]["containerStatuses"][0]["restartCount"] >= 1
            for p in cluster.ready_pods(NS, "app=toolbox")
        ),
        60,
    )


def test_an_image_pull_never_leaves_the_machine(cluster: Cluster) -> None:
    cluster.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: not-here}\n"
        "spec: {containers: [{name: c, image: kplug.invalid/not-here:1, imagePullPolicy: Always}]}\n",
        NS,
    )
    try:
        event = wait_for(
            "a failed pull Event",
            lambda: next(
                (
                    e["message"]
                    for e in cluster.kubectl_json("-n", NS, "get", "events", "--field-selector", "involvedObject.name=not-here")["items"]
                    if e["reason"] == "Failed"
                ),
                None,
            ),
            60,
        )
        assert "127.0.0.1:9" in event, f"the pull went somewhere other than the closed loopback port: {event}"
    finally:
        cluster.kubectl("-n", NS, "delete", "pod", "not-here", "--wait=false")


def daemon_pids(cluster: Cluster) -> dict[int, str]:
    pids = {}
    for pid_file in (Path(cluster.env["KPLUG_CLUSTER_DIR"]) / "pids").iterdir():
        pids[int(pid_file.read_text())] = pid_file.name
    return pids


def test_nothing_the_cluster_runs_sends_a_packet_off_the_machine(cluster: Cluster, toolbox: list[str]) -> None:
    """Runs last in this module (after the others made traffic)."""
    # The rule: pods' packets to any interface but their bridge are dropped;
    # its counter shows any attempt.
    # The session checks the counter again after every other test (conftest.py).
    chain = cluster.env["KPLUG_CLUSTER_EGRESS_CHAIN"]
    dropped, rules = cluster.egress_drops()
    assert dropped == 0, f"pods tried to send {dropped} packet(s) off the machine:\n{rules}"
    forward = subprocess.run(["iptables", "-w", "-S", "FORWARD"], capture_output=True, text=True, check=True).stdout
    assert f"-A FORWARD -i {cluster.env['KPLUG_CLUSTER_BRIDGE']} -j {chain}" in forward

    # The kubelet's cloud credential lookup is off.
    kubelet = next(pid for pid, name in daemon_pids(cluster).items() if name == "kubelet")
    environ = Path(f"/proc/{kubelet}/environ").read_bytes().split(b"\0")
    assert b"AWS_EC2_METADATA_DISABLED=true" in environ

    # No daemon holds a connection to anything but loopback, the pods and the Services.
    local = [ipaddress.ip_network(n) for n in ("127.0.0.0/8", "::1/128", cluster.env["KPLUG_CLUSTER_POD_CIDR"], cluster.env["KPLUG_CLUSTER_SERVICE_CIDR"])]
    sockets = subprocess.run(["ss", "-Htunap"], capture_output=True, text=True, check=True).stdout
    pids = daemon_pids(cluster)
    connected: set[str] = set()
    for line in sockets.splitlines():
        users = re.findall(r"pid=(\d+)", line)
        owners = [pids[int(p)] for p in users if int(p) in pids]
        if not owners:
            continue
        peer = line.split()[5]
        host = peer.rsplit(":", 1)[0].strip("[]")
        if host in ("*", "0.0.0.0", "::"):
            continue
        address = ipaddress.ip_address(host.removeprefix("::ffff:"))
        assert any(address in network for network in local), f"{owners} talks to {peer}: {line}"
        connected.update(owners)
    # The check above saw the daemons' connections: each of these holds one
    # at every moment (to etcd, to kube-apiserver), so a socket listing that
    # maps to no daemon (another ss format, pids not found) fails here.
    must_connect = {"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy"}
    assert must_connect <= connected, f"no connection seen for {sorted(must_connect - connected)} in:\n{sockets}"
