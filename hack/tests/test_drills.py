"""The failure drills of issue 16, on the real cluster, each under the steady
load of :mod:`load` and measured against a baseline of the same load with no
disruption, taken in the same run:

1. ``kubectl rollout restart deploy/kplug``: no discovery request fails, every object converges;
2. one kplug container SIGKILLed (through containerd, behind the kubelet's back):
   the same counts, and how long until the restarted kplug lists every plugin with every instance;
3. a plugin's two pods rolled: no reconcile fails (instances drain, in-flight calls finish);
4. a plugin pod deleted: reconciles go to the other instance, the gone instance leaves ``status.instances``;
5. the operator's leader deleted: the standby takes the Lease over, and nothing is written twice;
6. the kubelet stopped for 60 s and started again: everything converges, no object is lost.

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
``python3 hack/tests/load.py REPORT`` renders it as BENCHMARKS.md's tables);
BENCHMARKS.md, "Failure drills on the real cluster", has those of a run.
The drills take about 7 minutes on 2 cores, plus the cluster's and the
install's 2.5 when they run alone:

    flock /run/lock/kplug-cluster-dev.lock ~/.cache/kplug/venv/bin/pytest hack/tests/test_drills.py
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from install import DATABASE_IMAGES, DATABASE_PASSWORDS, KPLUG_NS, KPLUG_SELECTOR, PLUGINS, PLUGINS_NS, Installed, install_databases
from kubecluster import REPO, Cluster, wait_for
from load import NAMESPACE, Load, OperatorMetrics, audit_figures, metrics_delta
from readme import shell_blocks
from test_install import plugins_at

OPERATOR = "database-table-operator"
OPERATOR_SELECTOR = f"app.kubernetes.io/name={OPERATOR}"
LEASE = "kplug-operator-databasetables.myorg.org"
EXAMPLE_README = REPO / "examples" / "database-table" / "deploy" / "README.md"
REPORT = Path(os.environ.get("KPLUG_DRILLS_REPORT") or REPO / "target" / "drills" / "report.json")
KUBELET_OUTAGE = 60.0
# Once the load stops, every change written must be reconciled within this.
SETTLE_TIMEOUT = 30.0


# --- the cluster as the drills need it -------------------------------------------


def plugin_pods(cluster: Cluster, plugin: str) -> list[dict]:
    return cluster.kubectl_json("-n", PLUGINS_NS, "get", "pods", "-l", f"app.kubernetes.io/name={plugin}")["items"]


def settled_pods(cluster: Cluster, namespace: str, selector: str, replicas: int) -> list[dict] | None:
    """The pods of ``selector`` when there are exactly ``replicas``, all Ready and none terminating."""
    pods = cluster.kubectl_json("-n", namespace, "get", "pods", "-l", selector)["items"]
    ready = cluster.ready_pods(namespace, selector)
    return ready if len(pods) == replicas and len(ready) == replicas else None


def registry_whole(installed: Installed, pod_ip: str, plugins: dict[str, set[str]]) -> bool:
    """The kplug replica at ``pod_ip`` lists each plugin with exactly its pods as instances, all ready."""
    listed = plugins_at(installed, pod_ip)
    for name, pods in plugins.items():
        instances = listed.get(name, {}).get("status", {}).get("instances", [])
        if {i["name"] for i in instances} != pods or not all(i["ready"] for i in instances):
            return False
    return True


def lease_holder(cluster: Cluster) -> str:
    return cluster.kubectl_json("-n", PLUGINS_NS, "get", "lease", LEASE)["spec"].get("holderIdentity", "")


def whole(installed: Installed, timeout: float = 180) -> dict[str, Any]:
    """Waits until everything runs as installed: 2 Ready kplug replicas, each listing both plugins with their 2 Ready
    pods as instances, the operator's 2 replicas with one holding the Lease, both databases, the APIService Available."""
    cluster = installed.cluster

    def check() -> dict[str, Any] | None:
        kplug = settled_pods(cluster, KPLUG_NS, KPLUG_SELECTOR, 2)
        operator = settled_pods(cluster, PLUGINS_NS, OPERATOR_SELECTOR, 2)
        if not kplug or not operator:
            return None
        plugins = {}
        for plugin in PLUGINS:
            pods = settled_pods(cluster, PLUGINS_NS, f"app.kubernetes.io/name={plugin}", 2)
            if not pods:
                return None
            plugins[plugin] = {p["metadata"]["name"] for p in pods}
        if not all(registry_whole(installed, pod["status"]["podIP"], plugins) for pod in kplug):
            return None
        holder = lease_holder(cluster)
        if holder not in {p["metadata"]["name"] for p in operator}:
            return None
        for database in ("postgres", "mariadb"):
            if not settled_pods(cluster, "db", f"app.kubernetes.io/name={database}", 1):
                return None
        apiservice = cluster.kubectl_json("get", "apiservice", "v1alpha1.plugins.kplug.io")
        if not any(c["type"] == "Available" and c["status"] == "True" for c in apiservice["status"].get("conditions", [])):
            return None
        return {"kplug": kplug, "operator": operator, "plugins": plugins, "leader": holder}

    return wait_for("kplug, the plugins, the operator and the databases whole", check, timeout, interval=0.5)


def database_tables(cluster: Cluster) -> dict[str, dict[str, list[str]]]:
    """The tables in each database with their columns in order, asked of the database servers in their pods."""
    mariadb = cluster.kubectl(
        "-n", "db", "exec", "deploy/mariadb", "--", "mariadb", "--batch", "--skip-column-names", "tables", "-e",
        "SET SESSION group_concat_max_len = 65536; SELECT table_name, GROUP_CONCAT(column_name ORDER BY ordinal_position) "
        "FROM information_schema.columns WHERE table_schema = 'tables' GROUP BY table_name",
    )  # fmt: skip
    postgres = cluster.kubectl(
        "-n", "db", "exec", "deploy/postgres", "--", "psql", "-U", "tables", "tables", "-At", "-F", "\t", "-c",
        "SELECT table_name, string_agg(column_name::text, ',' ORDER BY ordinal_position) "
        "FROM information_schema.columns WHERE table_schema = current_schema() GROUP BY table_name",
    )  # fmt: skip

    def parse(text: str) -> dict[str, list[str]]:
        return {name: columns.split(",") for name, _, columns in (line.partition("\t") for line in text.splitlines() if line)}

    return {"MariaDB": parse(mariadb), "PostgreSQL": parse(postgres)}


def objects_are_tables(cluster: Cluster, tags: list[str] | None = None) -> dict[str, int]:
    """Every DatabaseTable in the drills' namespace (of ``tags``, else all) is a table in the database it is bound
    to, with the spec's columns; returns how many each database holds."""
    items = cluster.kubectl_json("-n", NAMESPACE, "get", "databasetables")["items"]
    if tags is not None:
        items = [i for i in items if i["metadata"].get("labels", {}).get("drill") in tags]
    tables = database_tables(cluster)
    wrong = []
    for item in items:
        name = item["metadata"]["name"]
        implementation = item.get("status", {}).get("implementation")
        want = [c["name"] for c in item["spec"]["columns"]]
        have = tables.get(implementation or "", {}).get(name)
        if have != want:
            wrong.append(f"{name} ({implementation}): {have} != {want}")
    assert not wrong, f"DatabaseTables that are not tables as they say: {wrong[:10]}"
    return {database: sum(1 for i in items if i.get("status", {}).get("implementation") == database) for database in tables}


# --- phases: the load, a disruption, the figures ---------------------------------


def excess_writes(figures: dict[str, Any], changes: dict[str, int], repeats: int = 0) -> dict[str, int]:
    """Writes beyond what one reconcile per change (and ``repeats`` reconciles of an unchanged object) make: more
    than one finalizer patch per object, more status writes than that, more Events than status writes."""
    per_object = figures["audit"]["_per_object"]
    return {
        "object_patches": sum(max(0, counts.get("patch object", 0) - 1) for counts in per_object.values()),
        "status_writes": sum(max(0, counts.get("status", 0) - changes.get(name, 0) - repeats) for name, counts in per_object.items()),
        "events": sum(max(0, counts.get("events", 0) - counts.get("status", 0)) for counts in per_object.values()),
    }


NO_EXCESS = {"object_patches": 0, "status_writes": 0, "events": 0}


def reconciles_done(metrics: OperatorMetrics) -> int:
    """Reconciles the operator's replicas have finished (writes included), whatever their result."""
    return int(sum(v for counters in metrics.scrape().values() for k, v in counters.items() if k.startswith("controller_runtime_reconcile_total")))


def repeat_writes(drills: Drills, tag: str) -> dict[str, Any]:
    """What reconciling converged objects again writes, per object: each of the phase's objects nudged (the
    annotation README names) twice, one round after the other."""
    cluster = drills.cluster
    names = [i["metadata"]["name"] for i in cluster.kubectl_json("-n", NAMESPACE, "get", "databasetables", "-l", f"drill={tag}")["items"]]
    rounds = {}
    for round_ in ("first", "second"):
        offset = cluster.audit_offset()
        done = reconciles_done(drills.metrics)
        cluster.kubectl("-n", NAMESPACE, "annotate", "databasetables", "-l", f"drill={tag}", f"kplug.io/reconcile-requested-at={time.time()}", "--overwrite")
        wait_for(f"{len(names)} nudged reconciles", lambda: reconciles_done(drills.metrics) >= done + len(names), 60)
        per_object = audit_figures(cluster.audit_events(offset)[0], tag)["_per_object"]
        rounds[round_] = {
            what: {"objects": len(names), "total": sum(c.get(what, 0) for c in per_object.values()), "max": max((c.get(what, 0) for c in per_object.values()), default=0)}
            for what in ("status", "events")
        }
    return rounds


def changes_per_object(load: Load) -> dict[str, int]:
    counts: dict[str, int] = {}
    for change in load.objects.changes:
        counts[change.name] = counts.get(change.name, 0) + 1
    return counts


@dataclass
class Phase:
    name: str
    load: Load
    marks: dict[str, float] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    settle_timeout: float = 30

    def mark(self, what: str) -> float:
        """Notes when ``what`` happened (seconds into the phase in the report)."""
        now = time.time()
        self.marks[what] = now
        return now

    def since(self, what: str) -> float:
        return time.time() - self.marks[what]


@dataclass
class Drills:
    installed: Installed
    metrics: OperatorMetrics
    report: dict[str, Any]
    show: Callable[[str], None]
    #: Appended to each phase's tag, so that phases can run again on the same cluster.
    suffix: str = ""

    @property
    def cluster(self) -> Cluster:
        return self.installed.cluster

    def operator_ips(self) -> dict[str, str]:
        pods = self.cluster.kubectl_json("-n", PLUGINS_NS, "get", "pods", "-l", OPERATOR_SELECTOR)["items"]
        return {p["status"]["podIP"]: p["metadata"]["name"] for p in pods if p["status"].get("podIP")}

    @contextmanager
    def phase(self, name: str, tag: str, settle_timeout: float = SETTLE_TIMEOUT) -> Iterator[Phase]:
        """Runs the load around the body: from a whole cluster, warmed up (4 changes reconciled) before the body,
        and on until 6 more changes are reconciled after it; then waits for every change to converge and records
        the figures, the audit log's and the operator's metrics' included."""
        tag += self.suffix
        state = whole(self.installed)
        leaders = self.operator_ips()
        offset = self.cluster.audit_offset()
        before = self.metrics.scrape()
        load = Load(self.cluster, tag)
        phase = Phase(name, load, settle_timeout=settle_timeout)
        phase.figures["leader_before"] = state["leader"]
        load.start()
        error: BaseException | None = None
        try:
            load.run_until_converged(4, f"{name}: warm-up")
            phase.mark("load on")
            yield phase
            phase.mark("disruption over")
            load.run_until_converged(6, f"{name}: after the disruption")
        except BaseException as raised:
            error = raised
            raise
        finally:
            load.stop()
            not_converged = load.settle(phase.settle_timeout if error is None else 5)
            after = self.metrics.scrape()
            leaders.update(self.operator_ips())
            events, _ = self.cluster.audit_events(offset)
            figures = load.figures()
            figures["operator_metrics"] = metrics_delta(before, after)
            figures["audit"] = audit_figures(events, tag, leaders)
            figures["excess_writes"] = excess_writes(figures, changes_per_object(load))
            figures["marks_s"] = {what: round(t - load.started, 2) for what, t in phase.marks.items()}
            figures.update(phase.figures)
            if error is not None:
                figures["error"] = repr(error)[:500]
            phase.figures = figures
            self.record(name, figures)
            if error is None:
                assert not not_converged, f"{name}: changes not reconciled {phase.settle_timeout:.0f}s after the load stopped: {not_converged[:10]}"

    def record(self, name: str, figures: dict[str, Any]) -> None:
        self.report["phases"][name] = figures
        REPORT.parent.mkdir(parents=True, exist_ok=True)
        REPORT.write_text(json.dumps(self.report, indent=2, sort_keys=True) + "\n")
        shown = {k: v for k, v in figures.items() if k != "audit"}
        shown["audit"] = {k: v for k, v in figures["audit"].items() if not k.startswith("_")}
        self.show(f"\n=== drill figures: {name} ===\n{json.dumps(shown, indent=1, sort_keys=True)}")


def assert_clean(name: str, figures: dict[str, Any], discovery: bool = True, reconciles: bool = True) -> None:
    """The goals every drill keeps unless it says otherwise: no request failed, no object showed a failed reconcile."""
    problems = []
    if discovery:
        for kind in ("discovery", "list"):
            if figures[kind]["failed"] or figures[kind].get("incomplete"):
                problems.append(f"{kind}: {figures[kind]}")
    if reconciles:
        if figures["direct_reconciles"]["failed"]:
            problems.append(f"direct reconciles: {figures['direct_reconciles']}")
        failed = {code: n for code, n in figures["audit"]["operator_delegations_by_code"].items() if code != "201"}
        errors = {k: v for k, v in figures["operator_metrics"].items() if "result=error" in k or ("delegations" in k and "Success" not in k)}
        if failed or errors or figures["objects"]["seen_not_ready"]:
            problems.append(f"operator: delegations by code {figures['audit']['operator_delegations_by_code']}, metrics {errors}, objects {figures['objects']}")
    assert not problems, f"{name}: " + "\n".join(problems)


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


@pytest.fixture(scope="module")
def drills(databases: Installed, request: pytest.FixtureRequest) -> Iterator[Drills]:
    cluster = databases.cluster
    metrics = operator_metrics(cluster)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False).stdout.strip()
    report: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "commit": commit,
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
    show(f"\n=== the drills took {report['drills_took_s']} s; figures in {REPORT} ===")
    # The next tests find the cluster as installed.
    whole(databases)


@pytest.fixture(scope="module")
def baseline(drills: Drills) -> dict[str, Any]:
    """The load alone, for 60 changes (about 30 s): what each drill is compared with."""
    with drills.phase("baseline", "base") as phase:
        phase.load.run_until_converged(60, "baseline")
    figures = phase.figures
    assert_clean("baseline", figures)
    assert figures["excess_writes"] == NO_EXCESS, figures["audit"]["_per_object"]
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
    with drills.phase(f"3 plugin rollout restart ({plugin})", tag) as phase:
        old = {p["metadata"]["name"] for p in plugin_pods(cluster, plugin)}
        phase.mark("rollout restart")
        cluster.kubectl("-n", PLUGINS_NS, "rollout", "restart", f"deploy/{plugin}")
        cluster.kubectl("-n", PLUGINS_NS, "rollout", "status", f"deploy/{plugin}", "--timeout=3m", timeout=200)
        pods = wait_for("the old plugin pods gone", lambda: settled_pods(cluster, PLUGINS_NS, f"app.kubernetes.io/name={plugin}", 2), 120)
        new = {p["metadata"]["name"] for p in pods}
        assert not old & new
        phase.mark("old pods gone")
        kplugs = [p["status"]["podIP"] for p in cluster.ready_pods(KPLUG_NS, KPLUG_SELECTOR)]
        wait_for("both kplug replicas listing the new instances only", lambda: all(registry_whole(installed, ip, {plugin: new}) for ip in kplugs), 60)
        phase.mark("instances replaced")
        phase.figures["rollout_s"] = round(phase.marks["old pods gone"] - phase.marks["rollout restart"], 1)
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
        wait_for("the deleted pod gone", lambda: victim not in {p["metadata"]["name"] for p in plugin_pods(cluster, plugin)}, 60)
        phase.mark("pod gone")
        phase.figures["instance_gone_after_s"] = round(phase.marks["instance gone"] - phase.marks["delete pod"], 2)
    assert_clean("plugin pod deleted", phase.figures)
    objects_are_tables(cluster, [phase.load.tag])


@pytest.mark.timeout(600)
def test_operator_leader_deleted(drills: Drills, baseline: dict[str, Any]) -> None:
    cluster = drills.cluster
    with drills.phase("5 operator leader deleted", "lead") as phase:
        leader = lease_holder(cluster)
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
    # Requests fail only while the node is NotReady: then its pods leave every Service's endpoints, kplug's
    # included, and kube-apiserver answers 503 for kplug's group (one node: nowhere else to go).
    marks = figures["marks_s"]
    for kind in ("discovery", "list", "direct_reconciles"):
        if figures[kind]["failed"]:
            first, last = figures[kind]["failures_between_s"]
            assert "node NotReady" in marks and marks["node NotReady"] - 2 <= first and last <= marks["all whole"], (kind, figures[kind], marks)


def node_ready(cluster: Cluster) -> bool:
    node = cluster.kubectl_json("get", "node", cluster.env["KPLUG_CLUSTER_NODE_NAME"])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
