"""Steady load on the real cluster for the failure drills (test_drills.py),
and the figures it leaves.

A :class:`Load` runs, each in its own thread, until stopped:

- **discovery**: every 100 ms, ``GET /apis`` (which must list
  plugins.kplug.io) and ``GET /apis/plugins.kplug.io/v1alpha1``, the requests
  ``kubectl api-resources`` makes for kplug's group;
- **list**: every 100 ms, ``GET .../plugins``, as ``kubectl get plugins``
  (a list that lacks one of the DatabaseTable plugins is *incomplete*);
- **direct**: every 250 ms, one reconcile sent straight through
  kube-apiserver to ``plugins/NAME/reconcile`` (docs/src/concepts/reconcile.md),
  alternately to the MariaDB and the PostgreSQL plugin, each
  about one of four tables; it fails unless kplug answers 201 with
  ``status.success``;
- **objects**: every 500 ms, one DatabaseTable written in namespace
  ``drills``: the first ``pool`` calls create the phase's objects (half
  preferring MariaDB, half PostgreSQL), each later one adds a column to the
  next object in turn, a new generation for the operator to reconcile;
- **convergence**: every 250 ms, a list of the phase's DatabaseTables: a
  written generation has *converged* once the object shows ``Ready=True``
  for it (or a later one); ``Ready=False`` for the current generation is a
  failed reconcile the object shows.

Every request goes to kube-apiserver over HTTPS as the cluster's admin
(client certificate), like kubectl; kube-apiserver proxies kplug's group to
the ``kplug`` Service. Wall-clock times (``time.time()``) let figures line up
with kube-apiserver's audit log, which records who wrote what
(:func:`audit_figures`), and with the operator's metrics
(:class:`OperatorMetrics`).
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import requests
import urllib3
from install import PLUGINS
from kubecluster import Cluster, wait_for

GROUP_PATH = "/apis/plugins.kplug.io/v1alpha1"
NAMESPACE = "drills"
TABLES = f"/apis/myorg.org/v1alpha1/namespaces/{NAMESPACE}/databasetables"
OPERATOR_USER = "system:serviceaccount:plugins:database-table-operator"
# The plugin each half of the objects prefers, and where direct reconciles go.
IMPLEMENTATIONS = {"MariaDB": "database-table-mariadb-plugin", "PostgreSQL": "database-table-postgresql-plugin"}
DIRECT_TABLES = 4
REQUEST_TIMEOUT = 10.0

class Api:
    """HTTPS to kube-apiserver as the cluster's admin; one keep-alive connection, so one per thread."""

    def __init__(self, cluster: Cluster) -> None:
        pki = cluster.env["KPLUG_CLUSTER_PKI_DIR"]
        self.base = cluster.env["KPLUG_CLUSTER_API_URL"]
        self.session = requests.Session()
        # Not the environment's CA bundle or proxies: the cluster's CA, straight to it.
        self.session.trust_env = False
        self.session.cert = (f"{pki}/admin.crt", f"{pki}/admin.key")
        self.session.verify = cluster.env["KPLUG_CLUSTER_CA_CERT"]

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> requests.Response:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if body is not None else {}
        return self.session.request(method, self.base + path, data=data, headers=headers, timeout=REQUEST_TIMEOUT)


@dataclass
class Sample:
    """One request: when it started, what it was, whether it did what it should, how long it took."""

    t: float
    kind: str
    ok: bool
    latency: float
    detail: str = ""
    incomplete: bool = False
    #: For a reconcile kplug answered: the plugin instance that answered it (``status.plugin.instance``).
    answered_by: str = ""


def answer(response: requests.Response) -> str:
    """A short account of a failed answer: the code and the Status message."""
    try:
        message = response.json().get("message", "")
    except ValueError:
        message = response.text[:200]
    return f"{response.status_code} {message}".strip()


class Worker(threading.Thread):
    """Calls :meth:`step` every ``period`` seconds until stopped; a step that overruns delays the next, never doubles it."""

    def __init__(self, name: str, period: float) -> None:
        super().__init__(name=name, daemon=True)
        self.period = period
        self.stopping = threading.Event()
        self.crash: BaseException | None = None

    def step(self) -> None:
        raise NotImplementedError

    def run(self) -> None:
        due = time.monotonic()
        while not self.stopping.is_set():
            try:
                self.step()
            except Exception as error:  # a step records its own failures; this is a bug in the load itself
                self.crash = error
                raise
            due = max(due + self.period, time.monotonic())
            self.stopping.wait(due - time.monotonic())

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=REQUEST_TIMEOUT + 5)
        if self.crash is not None:
            raise AssertionError(f"the load's {self.name} worker failed: {self.crash!r}") from self.crash


class Timed(Worker):
    """A worker whose steps are requests, each kept as a :class:`Sample`."""

    def __init__(self, name: str, period: float, api: Api) -> None:
        super().__init__(name, period)
        self.api = api
        self.samples: list[Sample] = []

    def request(
        self,
        kind: str,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        check: Callable[[requests.Response], str | None] | None = None,
    ) -> requests.Response | None:
        """Sends one request; it failed if it raised, answered an error, or ``check`` says why it is wrong."""
        start = time.time()
        try:
            response = self.api.call(method, path, body, content_type)
        except requests.RequestException as error:
            self.samples.append(Sample(start, kind, False, time.time() - start, f"{type(error).__name__}: {error}"[:300]))
            return None
        latency = time.time() - start
        if response.status_code >= 300:
            self.samples.append(Sample(start, kind, False, latency, answer(response)))
            return response
        problem = check(response) if check else None
        self.samples.append(Sample(start, kind, problem is None, latency, problem or ""))
        return response


class Discovery(Timed):
    def __init__(self, api: Api) -> None:
        super().__init__("discovery", 0.1, api)

    def step(self) -> None:
        def lists_group(response: requests.Response) -> str | None:
            groups = [g["name"] for g in response.json().get("groups", [])]
            return None if "plugins.kplug.io" in groups else "/apis does not list plugins.kplug.io"

        self.request("GET /apis", "GET", "/apis", check=lists_group)
        self.request(f"GET {GROUP_PATH}", "GET", GROUP_PATH)


class ListPlugins(Timed):
    def __init__(self, api: Api) -> None:
        super().__init__("list", 0.1, api)

    def step(self) -> None:
        response = self.request("list plugins", "GET", f"{GROUP_PATH}/plugins")
        if response is not None and response.status_code == 200:
            listed = {item["metadata"]["name"] for item in response.json().get("items", [])}
            if not set(PLUGINS) <= listed:
                self.samples[-1].incomplete = True
                self.samples[-1].detail = f"lists {sorted(listed)}"


def table(name: str, columns: int, implementation: str | None = None, labels: dict[str, str] | None = None) -> dict:
    """A DatabaseTable named ``name`` (a plain SQL identifier, as both plugins need) with ``columns`` columns."""
    spec: dict[str, Any] = {
        "serverName": "drills",
        "columns": [{"name": "id", "type": "uint64"}] + [{"name": f"c{i}", "type": "string"} for i in range(1, columns)],
    }
    if implementation:
        spec["preferredImplementation"] = implementation
    metadata: dict[str, Any] = {"name": name, "namespace": NAMESPACE}
    if labels:
        metadata["labels"] = labels
    return {"apiVersion": "myorg.org/v1alpha1", "kind": "DatabaseTable", "metadata": metadata, "spec": spec}


class DirectReconciles(Timed):
    """Reconciles sent to each plugin by name, through kube-apiserver, as an operator in any language would."""

    def __init__(self, api: Api) -> None:
        super().__init__("direct", 0.25, api)
        self.sent = 0

    def step(self) -> None:
        plugin = PLUGINS[self.sent % len(PLUGINS)]
        name = f"direct{(self.sent // len(PLUGINS)) % DIRECT_TABLES}"
        self.sent += 1
        body = {"apiVersion": "plugins.kplug.io/v1alpha1", "kind": "Reconcile", "spec": {"object": table(name, 2)}}

        def succeeded(response: requests.Response) -> str | None:
            status = response.json().get("status", {})
            if status.get("success"):
                return None
            return f"success=false: {status.get('results')}"[:300]

        response = self.request(f"reconcile {plugin}", "POST", f"{GROUP_PATH}/plugins/{plugin}/reconcile", body, check=succeeded)
        if response is not None and response.status_code < 300:
            self.samples[-1].answered_by = response.json().get("status", {}).get("plugin", {}).get("instance", "")


@dataclass
class Change:
    """One write of a DatabaseTable and, once seen, when the operator had reconciled it."""

    name: str
    generation: int
    written: float
    converged: float | None = None


class Objects(Timed):
    """Creates ``pool`` DatabaseTables labelled ``drill=TAG``, then adds a column to each in turn."""

    def __init__(self, api: Api, tag: str, pool: int) -> None:
        super().__init__("objects", 0.5, api)
        self.tag = tag
        self.pool = pool
        self.steps = 0
        self.columns: dict[str, int] = {}
        self.changes: list[Change] = []
        self.lock = threading.Lock()

    def step(self) -> None:
        index = self.steps % self.pool
        name = f"{self.tag}{index}"
        self.steps += 1
        if name not in self.columns:
            columns = 2
            body = table(name, columns, list(IMPLEMENTATIONS)[index % 2], {"drill": self.tag})
            response = self.request("create DatabaseTable", "POST", TABLES, body)
            if response is not None and response.status_code == 409:
                # An earlier create that timed out made it after all.
                self.columns[name] = columns
                return
        else:
            columns = self.columns[name] + 1
            patch = {"spec": {"columns": table(name, columns)["spec"]["columns"]}}
            response = self.request("update DatabaseTable", "PATCH", f"{TABLES}/{name}", patch, "application/merge-patch+json")
        if response is not None and response.status_code < 300:
            self.columns[name] = columns
            with self.lock:
                self.changes.append(Change(name, response.json()["metadata"]["generation"], self.samples[-1].t))


class Convergence(Worker):
    """Watches (by listing) the objects of :class:`Objects` reach ``Ready=True`` for each generation written."""

    def __init__(self, api: Api, objects: Objects) -> None:
        super().__init__("convergence", 0.25)
        self.api = api
        self.objects = objects
        self.not_ready: dict[tuple[str, int], str] = {}
        self.bound: dict[str, str] = {}
        self.last_error = ""
        self.polls = 0

    def step(self) -> None:
        try:
            response = self.api.call("GET", f"{TABLES}?labelSelector=drill%3D{self.objects.tag}")
        except requests.RequestException as error:
            self.last_error = repr(error)
            return
        if response.status_code != 200:
            self.last_error = answer(response)
            return
        now = time.time()
        self.polls += 1
        reconciled: dict[str, int] = {}
        for item in response.json()["items"]:
            name = item["metadata"]["name"]
            generation = item["metadata"]["generation"]
            status = item.get("status", {})
            if status.get("implementation"):
                self.bound[name] = status["implementation"]
            ready = [c for c in status.get("conditions", []) if c["type"] == "Ready"]
            if not ready:
                continue
            seen = ready[0].get("observedGeneration", status.get("observedGeneration", 0))
            if ready[0]["status"] == "True":
                reconciled[name] = seen
            elif seen == generation:
                self.not_ready.setdefault((name, generation), f"{ready[0].get('reason')}: {ready[0].get('message', '')}"[:300])
        with self.objects.lock:
            for change in self.objects.changes:
                if change.converged is None and reconciled.get(change.name, 0) >= change.generation:
                    change.converged = now

    def pending(self) -> list[Change]:
        with self.objects.lock:
            return [c for c in self.objects.changes if c.converged is None]


def latency_figures(latencies: list[float]) -> dict[str, float]:
    if not latencies:
        return {}
    ordered = sorted(latencies)
    return {
        "p50_ms": round(1000 * statistics.median(ordered), 1),
        "p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 1),
        "max_ms": round(1000 * ordered[-1], 1),
    }


def request_figures(samples: Iterable[Sample], start: float) -> dict[str, Any]:
    """Counts, failures (the first few, with when they came) and latencies of some requests."""
    samples = list(samples)
    failed = [s for s in samples if not s.ok]
    figures: dict[str, Any] = {
        "requests": len(samples),
        "failed": len(failed),
        **latency_figures([s.latency for s in samples if s.ok]),
    }
    if any(s.incomplete for s in samples):
        figures["incomplete"] = sum(1 for s in samples if s.incomplete)
        figures["first_incomplete"] = next(s.detail for s in samples if s.incomplete)
    if failed:
        figures["failures_between_s"] = [round(failed[0].t - start, 1), round(failed[-1].t - start, 1)]
        figures["failure_kinds"] = dict(Counter(f"{s.kind}: {s.detail[:120]}" for s in failed).most_common(5))
    return figures


def timeline(samples: Iterable[Sample], start: float) -> list[list[float]]:
    """Every request as ``[s into the phase, latency ms, ok 0/1]``: what the drills' pictures draw (drill-plots)."""
    return [[round(s.t - start, 3), round(1000 * s.latency, 1), int(s.ok)] for s in samples]


class Load:
    """The drills' steady load; :meth:`start`, the disruption, :meth:`stop`, :meth:`settle`, then :meth:`figures`."""

    def __init__(self, cluster: Cluster, tag: str, pool: int = 10) -> None:
        self.cluster = cluster
        self.tag = tag
        self.discovery = Discovery(Api(cluster))
        self.list = ListPlugins(Api(cluster))
        self.direct = DirectReconciles(Api(cluster))
        self.objects = Objects(Api(cluster), tag, pool)
        self.convergence = Convergence(Api(cluster), self.objects)
        self.traffic: list[Worker] = [self.discovery, self.list, self.direct, self.objects]
        self.started = 0.0
        self.stopped = 0.0
        self.settled = 0.0

    def start(self) -> None:
        self.started = time.time()
        for worker in [*self.traffic, self.convergence]:
            worker.start()

    def changes_converged(self) -> int:
        return sum(1 for c in self.objects.changes if c.converged is not None)

    def run_until_converged(self, more: int, what: str, timeout: float = 120) -> None:
        """Keeps the load on until ``more`` further changes have converged (an event of the load itself)."""
        target = self.changes_converged() + more
        wait_for(f"{what}: {more} more object changes reconciled", lambda: self.changes_converged() >= target, timeout)

    def stop(self) -> None:
        """Stops the traffic (the convergence watch goes on for :meth:`settle`)."""
        self.stopped = time.time()
        for worker in self.traffic:
            worker.stop()

    def settle(self, timeout: float) -> list[Change]:
        """Waits until every change written has converged; returns those that did not within ``timeout``."""
        deadline = time.monotonic() + timeout
        while self.convergence.pending() and time.monotonic() < deadline:
            if not self.convergence.is_alive():
                break
            time.sleep(0.1)
        self.settled = time.time()
        self.convergence.stop()
        return self.convergence.pending()

    def figures(self) -> dict[str, Any]:
        changes = self.objects.changes
        delays = [c.converged - c.written for c in changes if c.converged is not None]
        objects: dict[str, Any] = {
            "writes": len(changes),
            "write_failures": sum(1 for s in self.objects.samples if not s.ok),
            "converged": len(delays),
            "not_converged": [f"{c.name}@{c.generation}" for c in changes if c.converged is None][:10],
            "seen_not_ready": len(self.convergence.not_ready),
            "convergence_s": {
                "p50": round(statistics.median(delays), 2) if delays else None,
                "max": round(max(delays), 2) if delays else None,
            },
            "settled_after_stop_s": round(self.settled - self.stopped, 2),
        }
        if self.convergence.not_ready:
            objects["not_ready_reasons"] = dict(Counter(r.split(":")[0] for r in self.convergence.not_ready.values()))
            objects["first_not_ready"] = next(iter(self.convergence.not_ready.values()))
        if self.convergence.last_error:
            objects["last_poll_error"] = self.convergence.last_error
        objects["bound"] = dict(Counter(self.convergence.bound.values()))
        return {
            "duration_s": round(self.stopped - self.started, 1),
            "discovery": request_figures(self.discovery.samples, self.started),
            "list": request_figures(self.list.samples, self.started),
            "direct_reconciles": {
                **request_figures(self.direct.samples, self.started),
                "by_plugin": {
                    plugin: request_figures((s for s in self.direct.samples if s.kind == f"reconcile {plugin}"), self.started)["failed"]
                    for plugin in PLUGINS
                },
            },
            "objects": objects,
            "timeline": {
                "discovery": timeline(self.discovery.samples, self.started),
                "list": timeline(self.list.samples, self.started),
                "direct reconciles": timeline(self.direct.samples, self.started),
                "object writes": timeline(self.objects.samples, self.started),
            },
        }


def audit_figures(events: list[dict], tag: str, leaders: dict[str, str] | None = None) -> dict[str, Any]:
    """What kube-apiserver's audit log says of one phase: the operator's delegations by answer, its writes per
    object of the phase (DatabaseTables labelled ``drill=TAG`` are named TAG0, TAG1, ...), and the direct reconciles.

    ``leaders`` names operator pods by IP, so that writes can be told apart by the replica that made them.
    """
    delegations: Counter[str] = Counter()
    direct: Counter[str] = Counter()
    per_object: dict[str, Counter[str]] = defaultdict(Counter)
    others: Counter[str] = Counter()
    writers: dict[str, Counter[str]] = defaultdict(Counter)
    refused: Counter[str] = Counter()
    first_write: dict[str, float] = {}
    last_write: dict[str, float] = {}
    for event in events:
        if event.get("stage") != "ResponseComplete":
            continue
        ref = event.get("objectRef", {})
        code = str(event.get("responseStatus", {}).get("code", "?"))
        user = event.get("user", {}).get("username", "")
        source = (event.get("sourceIPs") or ["?"])[0]
        who = (leaders or {}).get(source, source)
        if ref.get("apiGroup") == "plugins.kplug.io" and ref.get("resource") == "reconciles" and user == OPERATOR_USER:
            delegations[code] += 1
            writers[who]["delegations"] += 1
            continue
        if ref.get("apiGroup") == "plugins.kplug.io" and ref.get("subresource") == "reconcile" and user != OPERATOR_USER:
            direct[code] += 1
            continue
        if user != OPERATOR_USER or ref.get("namespace") != NAMESPACE:
            continue
        if event.get("verb") not in READS and not code.startswith("2"):
            # Every replica's, whether or not it can still be scraped (a deleted leader's last writes).
            refused[f"{event.get('verb')} {ref.get('resource')}{'/' + ref['subresource'] if ref.get('subresource') else ''} {code}"] += 1
        name = ref.get("name", "")
        if ref.get("resource") == "events":
            name = name.split(".")[0]
            what = "events"
        elif ref.get("resource") == "databasetables":
            what = "status" if ref.get("subresource") == "status" else f"{event['verb']} object"
        else:
            what = f"{ref.get('resource')}/{ref.get('subresource', '')}"
        if not (name.startswith(tag) and name[len(tag):].isdigit()):
            others[what] += 1
            continue
        per_object[name][what] += 1
        writers[who]["writes"] += 1
        stamp = _timestamp(event.get("stageTimestamp", ""))
        first_write.setdefault(who, stamp)
        last_write[who] = stamp
    kinds = sorted({k for counts in per_object.values() for k in counts})
    return {
        "operator_delegations_by_code": dict(delegations),
        "direct_reconciles_by_code": dict(direct),
        "operator_writes_per_object": {k: _spread([counts[k] for counts in per_object.values()]) for k in kinds},
        "operator_writes_to_other_objects": dict(others),
        "operator_writes_refused": dict(refused),
        "writers": {who: dict(counts) for who, counts in writers.items()},
        "write_window": {who: [first_write[who], last_write[who]] for who in first_write},
        "_per_object": {name: dict(counts) for name, counts in per_object.items()},
    }


#: Audit verbs that write nothing.
READS = ("get", "list", "watch")


def _spread(values: list[int]) -> dict[str, float]:
    return {"min": min(values), "mean": round(statistics.mean(values), 2), "max": max(values)} if values else {}


def _timestamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() if text else 0.0


class OperatorMetrics:
    """The operator replicas' Prometheus counters, read as a scraper bound to kplug-operator:metrics-reader."""

    def __init__(self, cluster: Cluster, token: str) -> None:
        self.cluster = cluster
        self.token = token
        self.session = requests.Session()
        self.session.trust_env = False
        # The metrics' certificate is self-signed (operator.yaml gives no --metrics-cert-dir).
        self.session.verify = False
        #: Each replica's counters at its latest scrape, kept after it is gone (see :func:`metrics_delta`).
        self.last: dict[str, dict[str, float]] = {}

    def scrape(self) -> dict[str, dict[str, float]]:
        """By operator pod: the counters the drills compare (reconciles by result, delegations by reason).

        Every running replica must answer (a failed scrape fails the caller, never drops the replica's
        errors); a pod being deleted is left out, and counted with what it said last."""
        pods = self.cluster.kubectl_json("-n", "plugins", "get", "pods", "-l", "app.kubernetes.io/name=database-table-operator")["items"]
        found = {}
        for pod in pods:
            ip = pod["status"].get("podIP")
            if pod["metadata"].get("deletionTimestamp"):
                continue
            name = pod["metadata"]["name"]
            assert ip, f"operator pod {name} has no IP to scrape: {pod['status']}"
            found[name] = parse_counters(self._get(name, f"https://{ip}:8443/metrics"))
        self.last.update(found)
        return found

    def _get(self, pod: str, url: str) -> str:
        error: Exception | None = None
        # A replica that is starting (probes pass before every listener is up) gets a few tries.
        for _ in range(5):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
                    response = self.session.get(url, headers={"Authorization": f"Bearer {self.token}"}, timeout=5)
                response.raise_for_status()
                return response.text
            except requests.RequestException as failed:
                error = failed
                time.sleep(1)
        raise AssertionError(f"operator pod {pod}: its metrics at {url} could not be read: {error!r}")


def parse_counters(text: str) -> dict[str, float]:
    """The samples of the counters the drills compare: reconcile results and delegation reasons."""
    wanted = ("controller_runtime_reconcile_total{", "kplug_operator_delegations_total{")
    counters = {}
    for line in text.splitlines():
        if line.startswith(wanted):
            key, _, value = line.rpartition(" ")
            counters[key] = float(value)
    return counters


def metrics_delta(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], last: dict[str, dict[str, float]]) -> dict[str, Any]:
    """What the counters grew by, summed over the pods seen both times (and all of a pod that is new).

    A pod gone since ``before`` counts with ``last``, what it said at its latest scrape: a drill that deletes a
    pod scrapes it first. One never scraped after ``before`` is listed in ``pods_gone_uncounted``."""
    total: Counter[str] = Counter()
    gone = sorted(set(before) - set(after))
    uncounted = [pod for pod in gone if last.get(pod, before[pod]) is before[pod]]
    for pod, counters in [*after.items(), *((pod, last[pod]) for pod in gone if pod in last)]:
        base = before.get(pod, {})
        for key, value in counters.items():
            grown = value - base.get(key, 0.0)
            if grown:
                total[_short(key)] += grown
    figures: dict[str, Any] = {key: int(value) for key, value in sorted(total.items())}
    if uncounted:
        figures["pods_gone_uncounted"] = uncounted
    return figures


def _short(key: str) -> str:
    """``controller_runtime_reconcile_total{controller="databasetable",result="error"}`` as ``reconcile result=error``."""
    name, _, labels = key.partition("{")
    pairs = [p for p in labels.rstrip("}").split(",") if p and not p.startswith("controller=")]
    short = {"controller_runtime_reconcile_total": "reconciles", "kplug_operator_delegations_total": "delegations"}[name]
    return " ".join([short, *(p.replace('"', "") for p in pairs)])


def markdown(report: dict[str, Any]) -> str:
    """The report of test_drills.py as BENCHMARKS.md's tables: the counts, then each drill's own times."""
    rows = [
        "| phase | s | discovery: requests / failed | list: requests / failed / incomplete | direct reconciles: sent / failed "
        "| object changes / converged; p50, max s to Ready | seen not Ready | operator delegations by code | settled after stop, s |",
        "|---|---:|---|---|---|---|---:|---|---:|",
    ]
    times = []
    # The baseline first, then the drills in their order.
    phases = sorted(report["phases"].items(), key=lambda item: (item[0] != "baseline", item[0]))
    for name, phase in phases:
        objects = phase["objects"]
        delegations = ", ".join(f"{code}: {n}" for code, n in sorted(phase["audit"]["operator_delegations_by_code"].items()))
        rows.append(
            f"| {name} | {phase['duration_s']:.0f} "
            f"| {phase['discovery']['requests']} / {phase['discovery']['failed']} "
            f"| {phase['list']['requests']} / {phase['list']['failed']} / {phase['list'].get('incomplete', 0)} "
            f"| {phase['direct_reconciles']['requests']} / {phase['direct_reconciles']['failed']} "
            f"| {objects['writes']} / {objects['converged']}; {objects['convergence_s']['p50']}, {objects['convergence_s']['max']} "
            f"| {objects['seen_not_ready']} | {delegations} | {objects['settled_after_stop_s']} |"
        )
        own = {k: v for k, v in phase.items() if k.endswith("_s") and k not in ("duration_s",) and not isinstance(v, dict)}
        marks = ", ".join(f"{what} {t:.1f}" for what, t in phase["marks_s"].items())
        times.append(f"- **{name}**: " + ", ".join(f"{k} {v}" for k, v in own.items()) + (f" (marks, s into the phase: {marks})" if marks else ""))
    latency = [
        "| phase | discovery p50 / p99 / max ms | list p50 / p99 / max ms | direct reconcile p50 / p99 / max ms |",
        "|---|---|---|---|",
    ]
    for name, phase in phases:
        cells = [" / ".join(str(phase[kind].get(q, "-")) for q in ("p50_ms", "p99_ms", "max_ms")) for kind in ("discovery", "list", "direct_reconciles")]
        latency.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n\n" + "\n".join(latency) + "\n\n" + "\n".join(times) + "\n"


if __name__ == "__main__":
    import sys

    print(markdown(json.loads(open(sys.argv[1]).read())))
