"""The failure drills' machinery (``test_drills.py``): what a whole cluster is, the databases' tables each
DatabaseTable must be, and a phase: the load of :mod:`load` around one disruption, with its figures."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from install import APISERVICE, KPLUG_NS, KPLUG_SELECTOR, OPERATOR_SELECTOR, PLUGINS, PLUGINS_NS, Installed
from kubecluster import REPO, Cluster, wait_for
from load import NAMESPACE, Load, OperatorMetrics, audit_figures, metrics_delta
from test_install import plugins_at

LEASE = "kplug-operator-databasetables.myorg.org"
REPORT = Path(os.environ.get("KPLUG_DRILLS_REPORT") or REPO / "target" / "drills" / "report.json")
#: Where the operator sends its reconciles during the drills: through kube-apiserver (its installation), or
#: ``kplug`` straight to kplug's Service (the example README's "Straight to kplug").
OPERATOR_ROUTE = os.environ.get("KPLUG_DRILLS_OPERATOR_ROUTE", "kube-apiserver")
ROUTES = ("kube-apiserver", "kplug")
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
        apiservice = cluster.kubectl_json("get", "apiservice", APISERVICE)
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


def missing_writes(figures: dict[str, Any], changes: dict[str, int]) -> dict[str, list[str]]:
    """The writes the audit log must hold, by kind, the objects it lacks them for: every object of the phase (all
    created in it) got its finalizer patch, at least one status write and one Event, from the operator's user. An
    audit log that caught none of its writes (another user, another policy) lacks them all."""
    per_object = figures["audit"]["_per_object"]
    return {
        what: sorted(name for name in changes if per_object.get(name, {}).get(what, 0) < 1)
        for what in ("patch object", "status", "events")
    }


NO_MISSING = {"patch object": [], "status": [], "events": []}


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
            figures["operator_metrics"] = metrics_delta(before, after, self.metrics.last)
            figures["audit"] = audit_figures(events, tag, leaders)
            figures["excess_writes"] = excess_writes(figures, changes_per_object(load))
            figures["marks_s"] = {what: round(t - load.started, 2) for what, t in phase.marks.items()}
            figures["operator_route"] = OPERATOR_ROUTE
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
        # The timeline (every request) is for the pictures, not the log.
        shown = {k: v for k, v in figures.items() if k not in ("audit", "timeline")}
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
        if figures["operator_route"] == "kplug":
            # Straight to kplug, kube-apiserver sees none of the operator's delegations; its metrics count them all.
            failed = figures["audit"]["operator_delegations_by_code"]
            if not any(v for k, v in figures["operator_metrics"].items() if k.startswith("delegations") and "Success" in k):
                problems.append(f"operator straight to kplug: no successful delegation in its metrics {figures['operator_metrics']}")
        errors = {k: v for k, v in figures["operator_metrics"].items() if "result=error" in k or ("delegations" in k and "Success" not in k)}
        # The metrics of a replica that went before it was scraped are unknown: a drill that deletes one scrapes it first.
        uncounted = figures["operator_metrics"].get("pods_gone_uncounted")
        # The audit log has every replica's writes, to the last: none refused.
        refused = figures["audit"]["operator_writes_refused"]
        if failed or errors or uncounted or refused or figures["objects"]["seen_not_ready"]:
            problems.append(
                f"operator: delegations by code {figures['audit']['operator_delegations_by_code']}, metrics {errors}, "
                f"replicas gone unscraped {uncounted}, writes refused {refused}, objects {figures['objects']}"
            )
    assert not problems, f"{name}: " + "\n".join(problems)


def node_ready(cluster: Cluster) -> bool:
    node = cluster.kubectl_json("get", "node", cluster.env["KPLUG_CLUSTER_NODE_NAME"])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
