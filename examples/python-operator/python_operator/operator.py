"""An operator that delegates every reconcile to a kplug plugin.

It watches one custom resource. For each object whose spec changed, or that
is being deleted, it reads the extension objects that ``spec.extensions``
names, makes ONE API call,
``POST /apis/plugins.kplug.io/v1alpha1/namespaces/NAMESPACE/reconciles``,
and writes the plugin's answer to the object's status, the extensions' status
and an Event. It knows nothing of what the resource means: the plugins do. It
needs nothing but the official ``kubernetes`` client, which is the point: any
operator, in any language, can delegate like this.

The functions at the top are pure (and unit-tested); ``Operator`` does the I/O.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ResourceNotFoundError

log = logging.getLogger("python_operator")

Object = dict[str, Any]
Key = tuple[str, str]  # (namespace, name)
Ref = tuple[str, str, str, str]  # (apiVersion, kind, namespace, name)

FINALIZER = "kplug.io/python-operator"
GROUP_VERSION = "/apis/plugins.kplug.io/v1alpha1"
# Status keys the operator owns: a plugin's objectStatus cannot overwrite them.
OWN_KEYS = ("implementation", "plugin", "selection", "observedGeneration", "conditions")
FIRST_RETRY, LAST_RETRY = 2.0, 60.0  # seconds: exponential backoff after failures
WATCH_SECONDS = 300  # the server ends each watch after this; it is then resumed
# run() wakes at least this often (seconds): Python runs signal handlers on the main thread
# only, and a SIGTERM the kernel hands to the watch thread would otherwise wait for the next
# event (cpython#85300).
SIGNAL_CHECK_INTERVAL = 0.25


@dataclass(frozen=True)
class Resource:
    """The custom resource served, e.g. databasetables.myorg.org/v1alpha1."""

    group: str
    version: str
    plural: str

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}"


class NotReady(Exception):
    """No plugin answered: the reason and message of the Ready=False condition."""

    def __init__(self, reason: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason, self.message, self.retry_after = reason, message, retry_after


# --- pure parts -------------------------------------------------------------------------


def now() -> str:
    """The current time as Kubernetes writes it (RFC 3339, seconds, UTC)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def key_of(obj: Object) -> Key:
    return obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def needs_reconcile(obj: Object) -> bool:
    """Whether an event about `obj` is work: its spec changed since the last
    reconcile, or it is being deleted and still holds our finalizer. Events
    caused by our own status writes have observedGeneration == generation."""
    meta = obj.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return FINALIZER in (meta.get("finalizers") or [])
    return meta.get("generation") != (obj.get("status") or {}).get("observedGeneration")


def extension_refs(obj: Object) -> list[Ref]:
    """``spec.extensions`` as (apiVersion, kind, namespace, name); the namespace
    defaults to the object's. A malformed entry is a ValueError that names it."""
    entries = (obj.get("spec") or {}).get("extensions") or []
    if not isinstance(entries, list):
        raise ValueError("spec.extensions is not a list")
    refs = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
            raise ValueError(f"spec.extensions[{i}] is not an object of strings")
        if missing := [f for f in ("apiVersion", "kind", "name") if not entry.get(f)]:
            raise ValueError(f"spec.extensions[{i}] has no {', '.join(missing)}")
        namespace = entry.get("namespace") or obj["metadata"].get("namespace", "")
        refs.append((entry["apiVersion"], entry["kind"], namespace, entry["name"]))
    return refs


def reconciles_path(obj: Object) -> str:
    """Where the Reconcile of ``obj`` is created: in the object's namespace, so that a RoleBinding there can grant it."""
    namespace = obj["metadata"].get("namespace")
    return f"{GROUP_VERSION}/namespaces/{namespace}/reconciles" if namespace else f"{GROUP_VERSION}/reconciles"


def ref_of(obj: Object) -> Ref:
    meta = obj["metadata"]
    return obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"]


def find_extension(extensions: list[Object], ref: Object) -> Object | None:
    """The extension object, among those sent, that a plugin's status `ref`
    names (a ref without a namespace means the extension's own)."""
    for ext in extensions:
        api_version, kind, namespace, name = ref_of(ext)
        if (ref.get("apiVersion"), ref.get("kind"), ref.get("namespace") or namespace, ref.get("name")) == (
            api_version, kind, namespace, name
        ):
            return ext
    return None


def reconcile_body(resource: Resource, obj: Object, extensions: list[Object], operation: str) -> Object:
    """The Reconcile to create. A bound object (status.implementation) requires
    that implementation, so that its data never silently moves to another."""
    spec: Object = {"operation": operation, "api": {"group": resource.group, "resource": resource.plural}}
    if preferred := (obj.get("spec") or {}).get("preferredImplementation"):
        spec["preferredImplementation"] = preferred
    if bound := (obj.get("status") or {}).get("implementation"):
        spec["requiredImplementation"] = bound
    spec.update(object=obj, extensions=extensions)
    return {"apiVersion": "plugins.kplug.io/v1alpha1", "kind": "Reconcile", "spec": spec}


def failure(answer: Object) -> tuple[str, str]:
    """Reason and message of a failed answer: its first result that is not Normal."""
    problem = next((r for r in answer.get("results") or [] if r.get("severity") != "Normal"), {})
    name = (answer.get("plugin") or {}).get("name", "the plugin")
    return problem.get("reason") or "ReconcileFailed", problem.get("message") or f"{name} reported a failure"


def finalizes(answer: Object) -> bool:
    """Whether the plugin that answered declares Finalize (or declares nothing,
    which means everything): only then does the object keep our finalizer."""
    capabilities = (answer.get("plugin") or {}).get("capabilities") or []
    return not capabilities or "Finalize" in capabilities


def results_text(answer: Object) -> str:
    """The plugin's results on one line, for Events and logs."""
    texts = [r.get("message") or r.get("reason", "") for r in answer.get("results") or []]
    return "; ".join(texts) or "no results"


def condition(type_: str, status: str, reason: str, message: str) -> Object:
    """A condition without its timestamp (merge_conditions sets it)."""
    return {"type": type_, "status": status, "reason": reason, "message": message}


def merge_conditions(old: list[Object] | None, new: list[Object], at: str) -> list[Object]:
    """`old` with the `new` conditions put in by type. lastTransitionTime is
    kept while a condition's status stays, so that it tells since when."""
    merged = {c.get("type"): c for c in old or []}
    for c in new:
        previous = merged.get(c["type"]) or {}
        kept = previous.get("status") == c["status"] and previous.get("lastTransitionTime")
        merged[c["type"]] = {**c, "lastTransitionTime": kept or at}
    return list(merged.values())


def status_patch(obj: Object, answer: Object, at: str) -> Object:
    """The merge patch for the object's status once a plugin answered: what it
    reported (objectStatus), which plugin it was and why, the conditions. Ready
    is the operator's; the plugin's own conditions (e.g. Synced) win over ours.
    The first success binds the object to the plugin's implementation."""
    status, plugin = obj.get("status") or {}, answer.get("plugin") or {}
    patch = {k: v for k, v in (answer.get("objectStatus") or {}).items() if k not in OWN_KEYS}
    if ok := bool(answer.get("success")):
        reason = "Reconciled"
        message = f"reconciled by {plugin.get('name')} ({plugin.get('implementation')} {plugin.get('version')})"
        patch["implementation"] = status.get("implementation") or plugin.get("implementation")
    else:
        reason, message = failure(answer)
    ours = {t: condition(t, str(ok), reason, message) for t in ("Ready", "Synced")}
    for c in answer.get("conditions") or []:
        if (type_ := c.get("type")) and type_ != "Ready":
            ours[type_] = condition(type_, c.get("status", "Unknown"), c.get("reason", ""), c.get("message", ""))
    served_by = {k: v for k, v in plugin.items() if k != "capabilities"}  # ours to read, not the object's
    patch.update(plugin=served_by, selection=answer.get("selection"), observedGeneration=obj["metadata"].get("generation"))
    patch["conditions"] = merge_conditions(status.get("conditions"), list(ours.values()), at)
    return patch


def failure_patch(obj: Object, error: NotReady, at: str) -> Object:
    """The merge patch for the status when no plugin answered: Ready=False, and why."""
    ready = condition("Ready", "False", error.reason, error.message)
    conditions = merge_conditions((obj.get("status") or {}).get("conditions"), [ready], at)
    return {"observedGeneration": obj["metadata"].get("generation"), "conditions": conditions}


def merged(target: Any, patch: Any) -> Any:
    """`patch` applied to `target` as a JSON merge patch (RFC 7386)."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merged(result.get(key), value)
    return result


def changes(current: Object | None, patch: Object) -> bool:
    """Whether a merge patch would change anything: an unchanged status is not rewritten."""
    return merged(current or {}, patch) != (current or {})


def delegation_error(error: ApiException) -> NotReady:
    """A refusal (a Kubernetes Status) as the Ready condition's reason and message."""
    try:
        status = json.loads(error.body or "{}")
    except (TypeError, ValueError):
        status = None
    status = status if isinstance(status, dict) else {}
    message = status.get("message") or f"HTTP {error.status} {error.reason}"
    reason = {503: "NoPluginReady", 403: "Forbidden"}.get(error.status or 0) or status.get("reason")
    try:
        retry_after: float | None = float((error.headers or {}).get("Retry-After"))
    except (TypeError, ValueError):
        retry_after = None
    return NotReady(reason or "DelegationFailed", message, retry_after)


def describe(error: Exception) -> str:
    """One line about an error (an ApiException's own text spans its headers and body)."""
    if isinstance(error, ApiException):
        return f"{error.status} {delegation_error(error)}"
    return f"{type(error).__name__}: {error}"


# --- I/O --------------------------------------------------------------------------------


def connect(kubeconfig: str | None) -> client.ApiClient:
    """In-cluster credentials in a pod, else a kubeconfig (the one given, else
    $KUBECONFIG, else ~/.kube/config)."""
    if kubeconfig is None:
        try:
            config.load_incluster_config()
            return client.ApiClient()
        except config.ConfigException:
            pass
    return config.new_client_from_config(config_file=kubeconfig)


class Operator:
    """Watches one namespaced custom resource and delegates its reconciles.

    A thread watches and feeds the inbox; run()'s thread reconciles one object
    at a time and keeps the timers for retries and the plugins' requeues."""

    def __init__(self, api: client.ApiClient, resource: Resource, namespace: str | None, manager: str) -> None:
        self.resource, self.namespace, self.manager = resource, namespace, manager
        self.custom = client.CustomObjectsApi(api)
        self.dynamic = DynamicClient(api)  # maps kinds to resources; makes the plain calls
        self.inbox: queue.SimpleQueue[tuple[Key, bool] | None] = queue.SimpleQueue()
        self.timers: dict[Key, float] = {}  # when to reconcile an object again (time.monotonic)
        self.failures: dict[Key, int] = {}  # consecutive failures, for the backoff
        self.stopping = False

    def stop(self) -> None:
        """Ends run() after the reconcile in progress; safe in a signal handler."""
        self.stopping = True
        self.inbox.put(None)

    def run(self) -> None:
        """Reconciles what the watch reports and what the timers say, until stop()."""
        threading.Thread(target=self._watch, name="watch", daemon=True).start()
        while not self.stopping:
            due = min(self.timers.values(), default=math.inf)
            try:
                item = self.inbox.get(timeout=min(SIGNAL_CHECK_INTERVAL, max(0.0, due - time.monotonic())))
            except queue.Empty:
                item = None
            if item is not None and not self.stopping:
                self._process(*item)
            for key in [k for k, t in self.timers.items() if t <= time.monotonic()]:
                if not self.stopping and self.timers.pop(key, None) is not None:
                    self._process(key, forced=True)

    def _watch(self) -> None:
        """Lists, then watches from the list's resourceVersion; relists after 410
        Gone. A list reconciles every object (a resync, e.g. after a restart); a
        watch event only when it is work (needs_reconcile)."""
        r, ns = self.resource, self.namespace
        lister, args = (
            (self.custom.list_namespaced_custom_object, (r.group, r.version, ns, r.plural))
            if ns
            else (self.custom.list_cluster_custom_object, (r.group, r.version, r.plural))
        )
        version, pause, announced = None, 1.0, False
        while not self.stopping:
            try:
                if version is None:
                    listing = lister(*args)
                    version = listing["metadata"]["resourceVersion"]
                    for obj in listing.get("items") or []:
                        self.inbox.put((key_of(obj), True))
                    if not announced:
                        log.info("watching %s", r)
                        announced = True
                stream = watch.Watch().stream(
                    lister, *args, resource_version=version, allow_watch_bookmarks=True,
                    timeout_seconds=WATCH_SECONDS, _request_timeout=WATCH_SECONDS + 30,
                )  # fmt: skip
                for event in stream:
                    version = event["object"]["metadata"]["resourceVersion"]
                    if event["type"] in ("ADDED", "MODIFIED") and needs_reconcile(event["object"]):
                        self.inbox.put((key_of(event["object"]), False))
                pause = 1.0
                continue  # the server ended the watch (timeout_seconds): resume it
            except ApiException as error:
                if error.status == 410:
                    log.info("the watch of %s expired; relisting", r)
                    version = None
                    continue
                log.warning("watching %s failed (%s); retrying in %.0fs", r, describe(error), pause)
            except (urllib3.exceptions.HTTPError, OSError) as error:
                log.info("the watch of %s broke (%s); resuming in %.0fs", r, error, pause)
            except Exception:
                log.exception("watching %s failed; relisting in %.0fs", r, pause)
                version = None
            time.sleep(pause)
            pause = min(pause * 2, 30.0)

    def _process(self, key: Key, forced: bool) -> None:
        """Reconciles the current state of one object, if it needs it or `forced`.
        No error escapes: it is logged, becomes a Ready=False condition where
        possible, and a retry with backoff."""
        r, where = self.resource, f"{self.resource.plural} {key[0]}/{key[1]}"
        try:
            obj = self.custom.get_namespaced_custom_object(r.group, r.version, key[0], r.plural, key[1])
        except Exception as error:
            if isinstance(error, ApiException) and error.status == 404:  # gone: nothing left to do
                self.timers.pop(key, None)
                self.failures.pop(key, None)
            else:
                log.warning("cannot read %s: %s", where, describe(error))
                self._schedule(key, False, None)
            return
        if not forced and not needs_reconcile(obj):
            return  # a stale event: the object was reconciled since
        ok, delay = False, None
        try:
            ok, delay = self.reconcile(obj)
        except NotReady as error:
            log.warning("%s not reconciled: %s", where, error)
            self._record_failure(obj, error)
            delay = error.retry_after
        except ApiException as error:
            if error.status == 409:  # changed meanwhile: look again soon (not a failure)
                log.info("%s changed meanwhile; reconciling again", where)
                self.timers[key] = time.monotonic() + 1
                return
            log.warning("%s not reconciled: %s", where, describe(error))
            self._record_failure(obj, NotReady("OperatorError", describe(error)))
        except Exception as error:
            log.exception("%s not reconciled", where)
            self._record_failure(obj, NotReady("OperatorError", describe(error)))
        self._schedule(key, ok, delay)

    def _schedule(self, key: Key, ok: bool, delay: float | None) -> None:
        """When to look at an object again: after `delay` (a plugin's requeue, a
        Retry-After); after a failure, no sooner than the backoff says."""
        if ok:
            self.failures.pop(key, None)
        else:
            n = self.failures[key] = self.failures.get(key, 0) + 1
            delay = max(delay or 0.0, min(FIRST_RETRY * 2 ** (n - 1), LAST_RETRY))
        if delay:
            self.timers[key] = time.monotonic() + delay
        else:
            self.timers.pop(key, None)

    def reconcile(self, obj: Object) -> tuple[bool, float | None]:
        """Delegates one object through kplug and records the answer. Returns
        whether the plugin succeeded and when to look again (None: on a change)."""
        meta, status = obj["metadata"], obj.get("status") or {}
        where = f"{self.resource.plural} {meta['namespace']}/{meta['name']}"
        deleting, ours = bool(meta.get("deletionTimestamp")), FINALIZER in (meta.get("finalizers") or [])
        if deleting and not ours:
            return True, None  # finalized already (another finalizer holds it)
        if deleting and not status.get("implementation"):
            self._set_finalizer(obj, present=False)
            log.info("%s deleted before any plugin reconciled it: finalizer removed", where)
            return True, None
        if not ours and not status.get("implementation"):
            # Before the first call, so that Finalize is never missed; kept only
            # while the plugin that answers declares Finalize (below).
            obj = self._set_finalizer(obj, present=True)
            ours = True
        try:
            refs = extension_refs(obj)
        except ValueError as error:
            raise NotReady("InvalidExtensionRef", str(error)) from error
        # While deleting, extensions may be gone already: Finalize without them.
        extensions = [e for ref in refs if (e := self._read_extension(ref, not deleting)) is not None]
        operation = "Finalize" if deleting else "Reconcile"
        try:
            body = reconcile_body(self.resource, obj, extensions, operation)
            answer = self._call("post", reconciles_path(obj), body, _request_timeout=60).get("status") or {}
        except ApiException as error:
            raise delegation_error(error) from error
        ok, plugin, text = bool(answer.get("success")), answer.get("plugin") or {}, results_text(answer)
        log.log(
            logging.INFO if ok else logging.WARNING, "%s %s (generation %s): plugin %s (%s %s, %s) %s: %s",
            operation, where, meta.get("generation"), plugin.get("name"), plugin.get("implementation"),
            plugin.get("version"), (answer.get("selection") or {}).get("reason"), "succeeded" if ok else "failed", text,
        )  # fmt: skip
        if deleting and ok:
            self._set_finalizer(obj, present=False)
            self._event(obj, "Normal", "Finalized", text)
            return True, None
        if not deleting and ours != finalizes(answer):
            obj = self._set_finalizer(obj, present=not ours)
        self._write_extension_statuses(extensions, answer)
        if self._write_status(obj, status_patch(obj, answer, now())):
            self._event(obj, "Normal" if ok else "Warning", "Reconciled" if ok else failure(answer)[0], text)
        return ok, answer.get("requeueAfterSeconds") or None

    def _call(self, method: str, path: str, body: Object | None = None, **params: Any) -> Object:
        """A plain API call with the client's credentials; the answer as a dict."""
        return json.loads(self.dynamic.request(method, path, body=body, serialize=False, **params).data)

    def _path(self, api_version: str, kind: str, namespace: str, name: str) -> str:
        """An object's URL path; discovery maps its kind to a resource (ResourceNotFoundError if none)."""
        api = self.dynamic.resources.get(api_version=api_version, kind=kind)
        return api.path(name=name, namespace=namespace if api.namespaced else None)

    def _read_extension(self, ref: Ref, required: bool) -> Object | None:
        """The extension object a reference names; None if it is gone and not `required`."""
        try:
            return self._call("get", self._path(*ref))
        except (ResourceNotFoundError, ApiException) as error:
            if isinstance(error, ApiException) and error.status != 404:
                raise
            if required:
                raise NotReady("ExtensionNotFound", f"extension {ref[1]} {ref[2]}/{ref[3]} not found") from error
            log.info("extension %s %s/%s is gone; finalizing without it", *ref[1:])
            return None

    def _write_extension_statuses(self, extensions: list[Object], answer: Object) -> None:
        """Each extension status the plugin reported, to that extension's status
        subresource: only for extensions it was sent, and only when it changes."""
        for entry in answer.get("extensionStatuses") or []:
            ext, status = find_extension(extensions, entry.get("ref") or {}), entry.get("status") or {}
            if ext is None:
                log.warning("ignored a status for %s, which was not sent to the plugin", entry.get("ref"))
            elif changes(ext.get("status"), status):
                try:
                    path, patch = self._path(*ref_of(ext)) + "/status", {"status": status}
                    merge = "application/merge-patch+json"
                    self._call("patch", path, patch, content_type=merge, field_manager=self.manager)
                except (ResourceNotFoundError, ApiException) as error:
                    log.warning("cannot write the status of %s: %s", "/".join(ref_of(ext)), describe(error))

    def _write_status(self, obj: Object, patch: Object) -> bool:
        """Merge-patches the status subresource; False (no write) when nothing changes."""
        if not changes(obj.get("status"), patch):
            return False
        r, (namespace, name) = self.resource, key_of(obj)
        self.custom.patch_namespaced_custom_object_status(
            r.group, r.version, namespace, r.plural, name, {"status": patch}, field_manager=self.manager
        )
        return True

    def _set_finalizer(self, obj: Object, present: bool) -> Object:
        """Adds or removes our finalizer. The resourceVersion makes the patch a
        compare-and-swap (409 if the object changed), so no other finalizer is lost."""
        r, (namespace, name), meta = self.resource, key_of(obj), obj["metadata"]
        finalizers = [f for f in meta.get("finalizers") or [] if f != FINALIZER] + [FINALIZER] * present
        patch = {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}}
        return self.custom.patch_namespaced_custom_object(
            r.group, r.version, namespace, r.plural, name, patch, field_manager=self.manager
        )

    def _record_failure(self, obj: Object, error: NotReady) -> None:
        """Ready=False with the reason, and a Warning Event when that is news. Best effort."""
        try:
            if self._write_status(obj, failure_patch(obj, error, now())):
                self._event(obj, "Warning", error.reason, error.message)
        except Exception as problem:
            log.warning("cannot record the failure on %s: %s", obj["metadata"]["name"], describe(problem))

    def _event(self, obj: Object, type_: str, reason: str, message: str) -> None:
        """Records a core/v1 Event on the object, for `kubectl describe`. Best effort."""
        meta, at = obj["metadata"], now()
        involved = {k: meta.get(k) for k in ("namespace", "name", "uid", "resourceVersion")}
        event = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": obj["apiVersion"], "kind": obj["kind"], **involved},
            "type": type_, "reason": reason, "message": message[:1024], "source": {"component": self.manager},
            "firstTimestamp": at, "lastTimestamp": at, "count": 1,
        }  # fmt: skip
        try:
            self._call("post", f"/api/v1/namespaces/{meta['namespace']}/events", event)
        except Exception as error:
            log.warning("cannot record an event on %s: %s", meta["name"], describe(error))
