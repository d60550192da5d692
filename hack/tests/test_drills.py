"""The failure drills of issue 16, on the real cluster, each under the steady
load of :mod:`load` and measured against a baseline of the same load with no
disruption, taken in the same run:

1. ``kubectl rollout restart deploy/kplug``: no discovery request fails, every object converges;
2. one kplug container SIGKILLed (through containerd, behind the kubelet's back):
   the same counts, and how long until the restarted kplug lists every plugin with every instance;
3. a plugin's two pods rolled by a change of their environment: no reconcile fails (instances drain, in-flight
   calls finish);
4. a plugin pod deleted: reconciles go to the other instance, the gone instance leaves ``status.instances``;
5. the operator's leader deleted: the standby takes the Lease over, and nothing is written twice;
6. the kubelet stopped for 60 s and started again: everything converges, no object is lost;
7. kplug's plugin CA rotated by the steps of the book's certificates guide (docs/src/guides/certificates.md) (the plugins rolled for certificates of the new CA): no
   reconcile fails, and at the end plugins serve and accept the new CA alone.

Beyond the install (kplug, both plugins and the operator, 2 replicas each),
the walkthrough's PostgreSQL and MariaDB run as pods, so DatabaseTables
become real tables; after each drill its objects are checked against the
tables in the databases. The baseline (the module's first phase) runs the
load alone for 60 object changes and measures what reconciling unchanged
objects again writes. Every phase starts from a whole cluster, runs until 4
changes are reconciled, disrupts, waits for the recovery (events, never a
fixed sleep, but for the kubelet's 60 s outage), runs on until 6 more are
reconciled, and requires every change reconciled within 30 s of the load's
stop. Each phase's figures are printed and written to
``target/drills/report.json`` (``KPLUG_DRILLS_REPORT`` names another file;
``python3 hack/tests/load.py REPORT`` renders it as BENCHMARKS.md's tables),
and each phase's requests are drawn from it, as SVG in ``plots/`` beside it,
by ``drill-plots`` (test-support/src/bin/), which draws the book's too;
BENCHMARKS.md, "Failure drills on the real cluster", has those of a run.
The drills take about 9 minutes on 2 cores, plus the cluster's and the
install's 2.5 when they run alone:

    flock /run/lock/kplug-cluster-dev.lock ~/.cache/kplug/venv/bin/pytest hack/tests/test_drills.py

The operator sends its reconciles through kube-apiserver, as installed. With
``KPLUG_DRILLS_OPERATOR_ROUTE=kplug`` it sends them straight to kplug's
Service for the drills (the example README's "Straight to kplug"); then
kube-apiserver's audit log must see none of them and the operator's
metrics count them. The suite runs the first; the second is run by hand.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from drills import (
    NO_EXCESS,
    NO_MISSING,
    OPERATOR_ROUTE,
    REPORT,
    ROUTES,
    Drills,
    Phase,
    assert_clean,
    changes_per_object,
    excess_writes,
    lease_holder,
    missing_writes,
    node_ready,
    objects_are_tables,
    plugin_pods,
    registry_whole,
    repeat_writes,
    settled_pods,
    whole,
)
from install import (
    DATABASE_IMAGES,
    DATABASE_PASSWORDS,
    KPLUG_NS,
    KPLUG_SELECTOR,
    PLUGINS,
    PLUGINS_NS,
    Installed,
    install_databases,
    operator_straight_to_kplug,
    operator_through_kube_apiserver,
    run_script,
)
from kubecluster import REPO, Cluster, wait_for
from load import NAMESPACE, OperatorMetrics
from plugin_tls import ca_name, handshake, plugin_ca_line, pods_logging
from readme import shell_blocks
from test_install import plugins_at

EXAMPLE_README = REPO / "examples" / "database-table" / "deploy" / "README.md"
CERTS_README = REPO / "docs" / "src" / "guides" / "certificates.md"
KUBELET_OUTAGE = 60.0
# Built with the workspace (hack/test.sh), as the cluster's other binaries are.
DRILL_PLOTS = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target") / "debug" / "drill-plots"


# --- fixtures ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def databases(installed: Installed) -> Installed:
    """The walkthrough's PostgreSQL and MariaDB (examples/database-table/deploy/databases/README.md, as
    hack/walkthrough.sh --cluster installs them), and the plugins' Secrets of the example's README with their
    passwords, as a user fills them in; the plugins restart to read them."""
    cluster = installed.cluster
    subprocess.run(
        [str(REPO / "hack" / "images.sh"), "load", *DATABASE_IMAGES],
        env={**os.environ, **cluster.env},
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    passwords = {name: secrets.token_hex(16) for name in DATABASE_PASSWORDS}
    install_databases(cluster, installed.work, passwords)
    by_host = {host: passwords[name] for name, host in DATABASE_PASSWORDS.items()}
    steps = shell_blocks(EXAMPLE_README, "Install")[0]
    made = re.findall(r"create secret generic (\S+) \\\n\s*--from-literal=(\w+)='([^']*)'", steps)
    assert {secret for secret, _, _ in made} == {"database-table-postgresql-db", "database-table-mariadb-db"}, made
    for secret, key, url in made:
        host = re.search(r"@([^:/]+)", url)
        assert host and host.group(1) in by_host, url
        manifest = cluster.kubectl(
            "-n", PLUGINS_NS, "create", "secret", "generic", secret,
            f"--from-literal={key}={url.replace('PASSWORD', by_host[host.group(1)])}", "--dry-run=client", "-o", "json",
        )  # fmt: skip
        cluster.apply(manifest)
    for plugin in PLUGINS:
        cluster.kubectl("-n", PLUGINS_NS, "rollout", "restart", f"deploy/{plugin}")
    for plugin in PLUGINS:
        cluster.kubectl("-n", PLUGINS_NS, "rollout", "status", f"deploy/{plugin}", "--timeout=3m", timeout=200)
    return installed


def running_images(cluster: Cluster) -> dict[str, str]:
    """The image each of kplug's and the example's containers runs (containerd's image id), for the report."""
    images = {}
    for namespace in (KPLUG_NS, PLUGINS_NS):
        for pod in cluster.kubectl_json("-n", namespace, "get", "pods")["items"]:
            for status in pod["status"].get("containerStatuses", []):
                images[status["image"]] = status["imageID"]
    return images


def operator_metrics(cluster: Cluster) -> OperatorMetrics:
    """The drills' namespace, and a scraper of the operator's metrics as operator-rbac.yaml's ClusterRole lets one in."""
    cluster.apply(f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NAMESPACE}\n")
    cluster.apply(
        f"""apiVersion: v1
kind: ServiceAccount
metadata: {{name: drill-scraper, namespace: {NAMESPACE}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: drill-scraper}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "kplug-operator:metrics-reader"}}
subjects: [{{kind: ServiceAccount, name: drill-scraper, namespace: {NAMESPACE}}}]
"""
    )
    secret = wait_for(
        "the scraper's token Secret",
        lambda: (cluster.kubectl_json("-n", NAMESPACE, "get", "serviceaccount", "drill-scraper").get("secrets") or [{}])[0].get("name"),
        30,
    )
    token = base64.b64decode(cluster.kubectl_json("-n", NAMESPACE, "get", "secret", secret)["data"]["token"]).decode()
    return OperatorMetrics(cluster, token)


def draw_timelines(report: Path) -> Path:
    """Each phase's requests over time with its marks, one SVG per phase, in ``plots/`` beside ``report``."""
    plots = report.parent / "plots"
    result = subprocess.run([str(DRILL_PLOTS), str(report), str(plots)], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, f"{DRILL_PLOTS} could not draw the timelines of {report}: {result.stderr}"
    return plots


@pytest.fixture(scope="module")
def drills(databases: Installed, request: pytest.FixtureRequest) -> Iterator[Drills]:
    cluster = databases.cluster
    assert OPERATOR_ROUTE in ROUTES, f"KPLUG_DRILLS_OPERATOR_ROUTE={OPERATOR_ROUTE}: expected one of {ROUTES}"
    if OPERATOR_ROUTE == "kplug":
        operator_straight_to_kplug(databases)
    metrics = operator_metrics(cluster)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False).stdout.strip()
    report: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "commit": commit,
        "operator_route": OPERATOR_ROUTE,
        "images": running_images(cluster),
        "phases": {},
    }
    capture = request.config.pluginmanager.getplugin("capturemanager")

    def show(text: str) -> None:
        if capture is not None:
            with capture.global_and_fixture_disabled():
                print(text)
        else:
            print(text)

    started = time.monotonic()
    yield Drills(databases, metrics, report, show)
    report["drills_took_s"] = round(time.monotonic() - started)
    REPORT.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    try:
        plots = draw_timelines(REPORT)
        show(f"\n=== the drills took {report['drills_took_s']} s; figures in {REPORT}, each phase's requests drawn in {plots}/ ===")
    finally:
        # The next tests find the cluster as installed.
        if OPERATOR_ROUTE == "kplug":
            operator_through_kube_apiserver(databases)
        whole(databases)


@pytest.fixture(scope="module")
def baseline(drills: Drills) -> dict[str, Any]:
    """The load alone, for 60 changes (about 30 s): what each drill is compared with."""
    with drills.phase("baseline", "base") as phase:
        phase.load.run_until_converged(60, "baseline")
    figures = phase.figures
    assert_clean("baseline", figures)
    assert figures["excess_writes"] == NO_EXCESS, figures["audit"]["_per_object"]
    changes = changes_per_object(phase.load)
    assert changes, "the baseline changed no object"
    assert missing_writes(figures, changes) == NO_MISSING, figures["audit"]["_per_object"]
    objects_are_tables(drills.cluster, [phase.load.tag])
    # What a resync (or a new leader) writes for objects that have not changed: the first repeat may flip the
    # plugins' Synced reason (Reconciled: the call changed the table; UpToDate: it did not), the second nothing.
    figures["repeat_reconciles"] = repeat_writes(drills, phase.load.tag)
    drills.record("baseline", figures)
    assert figures["repeat_reconciles"]["first"]["status"]["max"] <= 1, figures["repeat_reconciles"]
    assert figures["repeat_reconciles"]["second"]["status"]["total"] == 0, figures["repeat_reconciles"]
    return figures


# --- the drills ----------------------------------------------------------------------


@pytest.mark.timeout(600)
def test_kplug_rollout_restart_fails_no_discovery(drills: Drills, baseline: dict[str, Any]) -> None:
    cluster = drills.cluster
    with drills.phase("1 kplug rollout restart", "roll") as phase:
        old = {p["metadata"]["name"] for p in cluster.ready_pods(KPLUG_NS, KPLUG_SELECTOR)}
        phase.mark("rollout restart")
        cluster.kubectl("-n", KPLUG_NS, "rollout", "restart", "deploy/kplug")
        cluster.kubectl("-n", KPLUG_NS, "rollout", "status", "deploy/kplug", "--timeout=5m", timeout=320)
        phase.mark("rollout status done")
        pods = wait_for("the old kplug pods gone", lambda: settled_pods(cluster, KPLUG_NS, KPLUG_SELECTOR, 2), 120)
        assert not old & {p["metadata"]["name"] for p in pods}
        phase.mark("old pods gone")
        phase.figures["rollout_s"] = round(phase.since("rollout restart"), 1)
    assert_clean("kplug rollout restart", phase.figures, reconciles=False)
    objects_are_tables(cluster, [phase.load.tag])


@pytest.mark.timeout(600)
def test_kplug_container_killed(drills: Drills, baseline: dict[str, Any]) -> None:
    cluster, installed = drills.cluster, drills.installed
    with drills.phase("2 kplug container SIGKILL", "kill") as phase:
        victim = cluster.ready_pods(KPLUG_NS, KPLUG_SELECTOR)[0]
        name, ip = victim["metadata"]["name"], victim["status"]["podIP"]
        restarts = victim["status"]["containerStatuses"][0]["restartCount"]
        plugins = {plugin: {p["metadata"]["name"] for p in plugin_pods(cluster, plugin)} for plugin in PLUGINS}
        cluster.kill_container(cluster.container_id(KPLUG_NS, name, "kplug-apiserver"))
        phase.mark("SIGKILL")

        def restarted() -> bool:
            status = cluster.pod(KPLUG_NS, name)["status"]["containerStatuses"][0]
            return status["restartCount"] > restarts and "running" in status["state"]

        wait_for("the kubelet to restart the container", restarted, 60, interval=0.1)
        phase.mark("container running again")
        wait_for("the restarted kplug listing every plugin and instance", lambda: registry_whole(installed, ip, plugins), 60, interval=0.1)
        phase.mark("registry whole")
        wait_for("the restarted kplug Ready", lambda: name in {p["metadata"]["name"] for p in cluster.ready_pods(KPLUG_NS, KPLUG_SELECTOR)}, 120)
        phase.mark("pod Ready")
        phase.figures["registry_whole_after_kill_s"] = round(phase.marks["registry whole"] - phase.marks["SIGKILL"], 2)
        phase.figures["registry_whole_after_restart_s"] = round(phase.marks["registry whole"] - phase.marks["container running again"], 2)
        phase.figures["ready_after_kill_s"] = round(phase.marks["pod Ready"] - phase.marks["SIGKILL"], 2)
    figures = phase.figures
    # The registry is whole long before the replica takes requests again.
    assert figures["registry_whole_after_restart_s"] < 15, figures
    assert phase.marks["registry whole"] < phase.marks["pod Ready"]
    # A replica that is not warm never answers: no list lacks a plugin.
    assert not figures["list"].get("incomplete"), figures["list"]
    objects_are_tables(cluster, [phase.load.tag])


@pytest.mark.timeout(600)
@pytest.mark.parametrize("plugin", PLUGINS)
def test_plugin_rollout_fails_no_reconcile(drills: Drills, baseline: dict[str, Any], plugin: str) -> None:
    cluster, installed = drills.cluster, drills.installed
    tag = "plugp" if "postgresql" in plugin else "plugm"
    with drills.phase(f"3 plugin rolled by an env change ({plugin})", tag) as phase:
        old = {p["metadata"]["name"] for p in plugin_pods(cluster, plugin)}
        phase.mark("env changed")
        # A change of the pod template, as a new release's would be (the image tag cannot change here: the
        # images are imported, not pulled, and one is built per commit).
        cluster.kubectl("-n", PLUGINS_NS, "set", "env", f"deploy/{plugin}", f"DRILL_ROLLED_AT={time.time():.0f}")
        cluster.kubectl("-n", PLUGINS_NS, "rollout", "status", f"deploy/{plugin}", "--timeout=3m", timeout=200)
        pods = wait_for("the old plugin pods gone", lambda: settled_pods(cluster, PLUGINS_NS, f"app.kubernetes.io/name={plugin}", 2), 120)
        new = {p["metadata"]["name"] for p in pods}
        assert not old & new
        phase.mark("old pods gone")
        kplugs = [p["status"]["podIP"] for p in cluster.ready_pods(KPLUG_NS, KPLUG_SELECTOR)]
        wait_for("both kplug replicas listing the new instances only", lambda: all(registry_whole(installed, ip, {plugin: new}) for ip in kplugs), 60)
        phase.mark("instances replaced")
        phase.figures["rollout_s"] = round(phase.marks["old pods gone"] - phase.marks["env changed"], 1)
    assert_clean(f"plugin rollout ({plugin})", phase.figures)
    objects_are_tables(cluster, [phase.load.tag])


@pytest.mark.timeout(600)
def test_plugin_pod_deleted(drills: Drills, baseline: dict[str, Any]) -> None:
    cluster, installed = drills.cluster, drills.installed
    plugin = "database-table-mariadb-plugin"
    with drills.phase("4 plugin pod deleted", "pod") as phase:
        victim = plugin_pods(cluster, plugin)[0]["metadata"]["name"]
        kplugs = [p["status"]["podIP"] for p in cluster.ready_pods(KPLUG_NS, KPLUG_SELECTOR)]
        phase.mark("delete pod")
        cluster.kubectl("-n", PLUGINS_NS, "delete", "pod", victim, "--wait=false")

        def gone_everywhere() -> bool:
            for ip in kplugs:
                instances = plugins_at(installed, ip)[plugin]["status"]["instances"]
                if victim in {i["name"] for i in instances}:
                    return False
            return True

        wait_for("the deleted instance gone from both kplug replicas", gone_everywhere, 60, interval=0.1)
        phase.mark("instance gone")
        # The node's part, not kplug's: the plugin stops within milliseconds of SIGTERM (its log says "stopped"),
        # the kubelet then took from 3 to 54 s to remove the pod on this node under the drills' load.
        wait_for("the deleted pod gone", lambda: victim not in {p["metadata"]["name"] for p in plugin_pods(cluster, plugin)}, 120)
        phase.mark("pod gone")
        phase.figures["instance_gone_after_s"] = round(phase.marks["instance gone"] - phase.marks["delete pod"], 2)
        phase.figures["pod_gone_after_s"] = round(phase.marks["pod gone"] - phase.marks["delete pod"], 2)
    # The direct reconciles of the plugin went to the other instance once the deleted one had left.
    after = [s.answered_by for s in phase.load.direct.samples if s.kind == f"reconcile {plugin}" and s.t > phase.marks["instance gone"]]
    phase.figures["answered_after_the_instance_left"] = {name: after.count(name) for name in sorted(set(after))}
    drills.record(phase.name, phase.figures)
    assert after and victim not in after and all(after), phase.figures["answered_after_the_instance_left"]
    assert_clean("plugin pod deleted", phase.figures)
    objects_are_tables(cluster, [phase.load.tag])


@pytest.mark.timeout(600)
def test_operator_leader_deleted(drills: Drills, baseline: dict[str, Any]) -> None:
    cluster = drills.cluster
    with drills.phase("5 operator leader deleted", "lead") as phase:
        leader = lease_holder(cluster)
        # Its counters up to now; what it does from here to its exit is in the audit log (assert_clean).
        drills.metrics.scrape()
        phase.mark("delete leader")
        cluster.kubectl("-n", PLUGINS_NS, "delete", "pod", leader, "--wait=false")
        new_leader = wait_for(
            "another operator replica holding the Lease", lambda: (h := lease_holder(cluster)) not in ("", leader) and h, 60, interval=0.1
        )
        phase.mark("lease taken over")
        phase.figures["leader_after"] = new_leader
        phase.figures["takeover_s"] = round(phase.marks["lease taken over"] - phase.marks["delete leader"], 2)
    figures = phase.figures
    # The new leader reconciles every object once as it starts, as a resync does: allowed what a repeat
    # reconcile writes in the baseline, and nothing more.
    repeats = baseline["repeat_reconciles"]["first"]["status"]["max"]
    figures["excess_writes_beyond_one_takeover_reconcile"] = excess_writes(figures, changes_per_object(phase.load), repeats)
    windows = figures["audit"]["write_window"]
    drills.record(phase.name, figures)
    assert new_leader != leader
    assert figures["excess_writes_beyond_one_takeover_reconcile"] == NO_EXCESS, figures["audit"]["_per_object"]
    # One writer at a time: the old leader wrote nothing after the new one started.
    assert leader in windows and new_leader in windows, windows
    assert windows[leader][1] <= windows[new_leader][0], windows
    assert_clean("operator leader deleted", figures)
    objects_are_tables(cluster, [phase.load.tag])


@pytest.mark.timeout(900)
def test_kubelet_stopped_for_a_minute(drills: Drills, baseline: dict[str, Any]) -> None:
    cluster = drills.cluster
    before = {i["metadata"]["name"] for i in cluster.kubectl_json("-n", NAMESPACE, "get", "databasetables")["items"]}
    with drills.phase("6 kubelet stopped 60 s", "node") as phase:
        cluster.stop_kubelet()
        stopped = phase.mark("kubelet stopped")
        try:
            # The outage itself is the scenario: 60 s, watching the node meanwhile.
            while time.time() < stopped + KUBELET_OUTAGE:
                if "node NotReady" not in phase.marks and node_ready(cluster) is False:
                    phase.mark("node NotReady")
                time.sleep(min(1.0, max(0.0, stopped + KUBELET_OUTAGE - time.time())))
        finally:
            cluster.start_kubelet()
        phase.mark("kubelet started")
        wait_for("the node Ready again", lambda: node_ready(cluster), 120)
        phase.mark("node Ready")
        whole(drills.installed, 300)
        phase.mark("all whole")
        phase.figures["whole_after_start_s"] = round(phase.marks["all whole"] - phase.marks["kubelet started"], 1)
    figures = phase.figures
    after = {i["metadata"]["name"] for i in cluster.kubectl_json("-n", NAMESPACE, "get", "databasetables")["items"]}
    assert before <= after, f"DatabaseTables lost: {sorted(before - after)}"
    figures["databases"] = objects_are_tables(cluster)
    drills.record(phase.name, figures)
    # The outage happened: the node controller marked the node NotReady while the kubelet was stopped (its
    # grace period, 40 s, is inside the 60 s outage). A stop_kubelet that stopped nothing fails here.
    marks = figures["marks_s"]
    assert "node NotReady" in marks, f"the node never went NotReady while the kubelet was stopped: {marks}"
    assert marks["kubelet stopped"] < marks["node NotReady"] < marks["kubelet started"], marks
    # Requests fail only while the node is NotReady: then its pods leave every Service's endpoints, kplug's
    # included, and kube-apiserver answers 503 for kplug's group (one node: nowhere else to go).
    for kind in ("discovery", "list", "direct_reconciles"):
        if figures[kind]["failed"]:
            first, last = figures[kind]["failures_between_s"]
            assert marks["node NotReady"] - 2 <= first and last <= marks["all whole"], (kind, figures[kind], marks)


@pytest.mark.timeout(900)
def test_plugin_ca_rotated(drills: Drills, baseline: dict[str, Any], tmp_path: Path) -> None:
    """The certificates guide's rotation, block by block, going on when its checks say so: every kplug replica logs the
    step's CAs, and every plugin instance, asked directly, accepts a client certificate of the new CA (step 1), serves
    one of the new CA (step 2, after the plugins' rollout) and refuses a client certificate of the old CA (step 3)."""
    cluster, work = drills.cluster, drills.installed.work
    trust_both, sign_with_new, roll_plugins, drop_old = shell_blocks(CERTS_README, "Rotating kplug's plugin CA")
    old = ca_name(work / "certs" / "plugins" / "ca.crt")
    kplugs = [p["metadata"]["name"] for p in cluster.ready_pods(KPLUG_NS, KPLUG_SELECTOR)]

    def probe_files(ca_dir: Path, name: str) -> tuple[Path, tuple[Path, Path]]:
        """The CA of ``ca_dir``, copied (step 3 moves the README's directories), and a client certificate of it as
        plugin-certs.sh makes kplug's: what the probes verify plugins with and call them as."""
        out = tmp_path / name
        out.mkdir()
        for file in ("ca.crt", "ca.key"):
            (out / file).write_bytes((ca_dir / file).read_bytes())
        run_script(cluster, work, f"certs/plugin-certs.sh --out-dir {out} client", f"a client certificate of the {name} CA")
        return out / "ca.crt", (out / "kplug-client.crt", out / "kplug-client.key")

    def kplug_logged(phase: Phase, signing: str, trusted: list[str], mark: str) -> None:
        line = plugin_ca_line(signing, trusted)
        wait_for(f"every kplug replica logging {line.pattern}", lambda: len(pods_logging(cluster, KPLUG_NS, kplugs, line)) == len(kplugs), 180)
        phase.mark(mark)

    def every_instance(phase: Phase, what: str, ca: Path, accepted: tuple[Path, Path], refused: tuple[Path, Path] | None = None) -> None:
        """Waits until each plugin's 2 pods, as its instances, verified against ``ca``, answer a caller with the
        ``accepted`` certificate and, the same moment, not one with the ``refused`` certificate: only the caller's
        certificate differs, so the plugin refused that certificate."""
        refusals: dict[str, str] = {}
        last = {"state": "no plugin instance asked yet"}

        def check() -> bool:
            for plugin in PLUGINS:
                pods = settled_pods(cluster, PLUGINS_NS, f"app.kubernetes.io/name={plugin}", 2)
                instances = cluster.kubectl_json("get", "plugin", plugin)["status"].get("instances", [])
                serving = [i for i in instances if pods and i["name"] in {p["metadata"]["name"] for p in pods}]
                if len(serving) != 2:
                    last["state"] = f"{plugin}: instances {[i['name'] for i in instances]}, settled pods {pods and [p['metadata']['name'] for p in pods]}"
                    return False
                for instance in serving:
                    failure = handshake(instance["address"], instance["serverName"], ca, accepted)
                    if failure is not None:
                        last["state"] = f"{instance['name']} refused the certificate it should accept: {failure}"
                        return False
                    if refused is not None:
                        failure = handshake(instance["address"], instance["serverName"], ca, refused)
                        if failure is None:
                            last["state"] = f"{instance['name']} answered the certificate it should refuse"
                            return False
                        refusals[plugin] = failure
            return True

        try:
            wait_for(what, check, 180, interval=1)
        except AssertionError as timeout:
            raise AssertionError(f"{timeout}; last seen: {last['state']}") from None
        phase.mark(what)
        if refusals:
            phase.figures["refusals"] = refusals

    with drills.phase("7 plugin CA rotated", "ca") as phase:
        run_script(cluster, work, trust_both, "rotation step 1: trust both CAs")
        phase.mark("step 1 applied")
        old_ca, old_client = probe_files(work / "certs" / "plugins", "old")
        new_ca, new_client = probe_files(work / "certs" / "plugins-new", "new")
        new = ca_name(new_ca)
        kplug_logged(phase, old, [old, new], "kplug replicas trust both")
        every_instance(phase, "plugins accept the new CA's client", old_ca, new_client)

        run_script(cluster, work, sign_with_new, "rotation step 2: sign with the new CA")
        phase.mark("step 2 applied")
        kplug_logged(phase, new, [old, new], "kplug replicas sign with the new CA")
        run_script(cluster, work, roll_plugins, "rotation step 2: the plugins rolled", timeout=400)
        phase.mark("plugins rolled")
        every_instance(phase, "plugins serve the new CA's certificates", new_ca, new_client)

        run_script(cluster, work, drop_old, "rotation step 3: drop the old CA")
        phase.mark("step 3 applied")
        kplug_logged(phase, new, [new], "kplug replicas trust the new CA only")
        every_instance(phase, "plugins accept the new CA's client and refuse the old one's", new_ca, new_client, old_client)
        phase.figures["rotation_s"] = round(phase.since("step 1 applied"), 1)
        phase.figures["cas"] = {"old": old, "new": new}
    assert_clean("plugin CA rotated", phase.figures)
    objects_are_tables(cluster, [phase.load.tag])
    # Where the README leaves them: the new CA's files in certs/plugins.
    assert ca_name(work / "certs" / "plugins" / "ca.crt") == new
