"""Plugins that manage Kubernetes objects, on the real cluster: the website example (``examples/website``) installed
by the block of docs/src/guides/install-plugin.md's "Install an operator", with nothing but the output of ``kubectl
kplug create plugin`` and ``kubectl kplug create operator`` (the commands its ``deploy/`` files were printed by), so
with the operator's least-privilege RBAC as printed, no edit.

A Website becomes a ConfigMap of its pages, a Deployment of busybox httpd and a Service, each owned by the Website;
it is Ready only once the node runs the Deployment's pod, and then a pod fetches the page through the Service. An
edit of the pages rolls the pods (the plugin hashes the pages into the pod template) and the new page is served.
The operator's leader deleted while it applies the children of eight new Websites: the other replica takes over
and every child ends up its Website's, once. Deleting the Website removes its children before it goes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from install import PLUGINS_NS, Installed, run_script
from kubecluster import REPO, Cluster, wait_for
from readme import replace_in_line, shell_blocks

WEBSITE = REPO / "examples" / "website"
INSTALL_GUIDE = REPO / "docs" / "src" / "guides" / "install-plugin.md"
SITES_NS = "sites"
# The pages of examples/website/site.yaml.
HELLO_PAGE = "<h1>Hello from kplug</h1>"


def create_command(manifest: Path) -> str:
    """The ``kubectl kplug create`` command a shipped manifest was printed by (its first line says it)."""
    first = manifest.read_text().splitlines()[0]
    _, command = first.split(": kubectl kplug create ", 1)
    return f"kubectl kplug create {command}"


def fetch(cluster: Cluster, url: str) -> str:
    """What a new pod in the sites namespace gets from ``url`` (busybox wget in a throwaway toolbox pod)."""
    result = subprocess.run(
        [
            "kubectl", "--kubeconfig", cluster.kubeconfig, "-n", SITES_NS, "run", f"fetch-{os.getpid()}-{os.urandom(3).hex()}",
            "--rm", "-i", "--quiet", "--restart=Never", f"--image={cluster.env['KPLUG_CLUSTER_TOOLBOX_IMAGE']}",
            # Not wget's -T: Debian's static busybox 1.35 wget crashes with it.
            "--image-pull-policy=Never", "--command", "--", "/bin/busybox", "timeout", "10", "/bin/busybox", "wget", "-q", "-O", "-", url,
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    return result.stdout + result.stderr


def condition(website: dict, type_: str) -> str | None:
    found = [c for c in website.get("status", {}).get("conditions", []) if c["type"] == type_]
    return found[0]["status"] if found else None


def operator_log(cluster: Cluster) -> str:
    return cluster.kubectl("-n", PLUGINS_NS, "logs", "deployment/websites-operator", "--tail=40", timeout=30)


@pytest.mark.adds_to_the_installation
@pytest.mark.timeout(1200)
def test_a_website_is_served_by_the_children_its_plugin_returns_installed_by_the_create_commands(
    installed: Installed,
) -> None:
    cluster = installed.cluster
    block = shell_blocks(INSTALL_GUIDE, "Install an operator")[0]
    commands = [line.strip() for line in block.replace("\\\n", " ").splitlines()]
    creates = [" ".join(c.removesuffix("| kubectl apply -f -").split()) for c in commands if c.startswith("kubectl kplug create")]
    # The page's commands are those that printed examples/website/deploy/.
    plugin = create_command(WEBSITE / "deploy" / "plugin.yaml")
    operator = create_command(WEBSITE / "deploy" / "operator.yaml")
    assert creates == [plugin, operator], creates
    # This cluster's Kubernetes 1.20 serves PodDisruptionBudgets as policy/v1beta1 only.
    on_1_20 = replace_in_line(block, "--api websites.sites.example.com", "-n plugins", "-n plugins --pdb-v1beta1")
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target") / "debug"
    path = {"PATH": f"{target}:{os.environ['PATH']}"}
    toolbox = cluster.env["KPLUG_CLUSTER_TOOLBOX_IMAGE"]
    run_script(cluster, installed.work, f"{REPO}/hack/images.sh load website-plugin", "the website image's loading")
    install = f"""{on_1_20}
# The cluster pulls no image: httpd comes from the toolbox image it has.
kubectl -n {PLUGINS_NS} set env deployment/website WEBSITE_IMAGE={toolbox}
kubectl -n {PLUGINS_NS} rollout status deployment/website --timeout=180s
kubectl create namespace {SITES_NS}
"""
    run_script(cluster, installed.work, install, "Install an operator's block", env=path)
    try:

        def served_by_the_rolled_pods() -> bool:
            """Ready, and its instances are the pods with the toolbox image, none of the first rollout's."""
            pods = cluster.kubectl_json("-n", PLUGINS_NS, "get", "pods", "-l", "app.kubernetes.io/name=website")["items"]
            rolled = {p["metadata"]["name"] for p in pods if "deletionTimestamp" not in p["metadata"]}
            registered = cluster.kubectl_json("get", "plugin", "website")
            instances = {i["name"] for i in registered.get("status", {}).get("instances", [])}
            return condition(registered, "Ready") == "True" and instances == rolled

        wait_for("plugin website served by its rolled pods only", served_by_the_rolled_pods, timeout=180)
        cluster.kubectl("-n", SITES_NS, "apply", "-f", str(WEBSITE / "site.yaml"))

        def website() -> dict:
            return cluster.kubectl_json("-n", SITES_NS, "get", "website", "hello")

        def ready() -> bool:
            return condition(website(), "Ready") == "True"

        try:
            wait_for("the Website Ready", ready, timeout=240)
        except AssertionError as error:
            raise AssertionError(f"{error}\nstatus: {website().get('status')}\noperator:\n{operator_log(cluster)}") from None
        uid = website()["metadata"]["uid"]
        for kind, name in [("configmap", "hello-pages"), ("deployment", "hello"), ("service", "hello")]:
            child = cluster.kubectl_json("-n", SITES_NS, "get", kind, name)
            owners = child["metadata"].get("ownerReferences", [])
            assert [(o["uid"], o.get("controller")) for o in owners] == [(uid, True)], f"{kind}/{name}: {owners}"
        deployment = cluster.kubectl_json("-n", SITES_NS, "get", "deployment", "hello")
        assert deployment["status"].get("availableReplicas") == 1, deployment["status"]
        children = website()["status"]["children"]
        assert all(c["ready"] and not c.get("error") for c in children), children

        url = f"http://hello.{SITES_NS}.svc.cluster.local/"
        wait_for("the page through the Service", lambda: HELLO_PAGE in fetch(cluster, url), timeout=60, interval=1)

        # An edit rolls the pods: the new page is served.
        changed = "<h1>Changed by an edit</h1>"
        cluster.kubectl("-n", SITES_NS, "patch", "website", "hello", "--type=merge", "-p", f'{{"spec":{{"pages":{{"index.html":"{changed}"}}}}}}')
        wait_for("the edited page through the Service", lambda: changed in fetch(cluster, url), timeout=240, interval=2)

        # The operator's leader deleted mid-apply: the other replica takes the Lease over and finishes, and every
        # child is its Website's, once: no orphan, no duplicate.
        lease = "kplug-operator-websites.sites.example.com"

        def holder() -> str:
            return cluster.kubectl("-n", PLUGINS_NS, "get", "lease", lease, "-o", "jsonpath={.spec.holderIdentity}")

        def websites() -> list[dict]:
            return cluster.kubectl_json("-n", SITES_NS, "get", "websites")["items"]

        leader = holder()
        sites = [f"site-{i}" for i in range(8)]
        cluster.apply(
            "".join(
                f"---\napiVersion: sites.example.com/v1alpha1\nkind: Website\nmetadata: {{name: {site}}}\n"
                f"spec: {{replicas: 0, pages: {{index.html: {site}}}}}\n"
                for site in sites
            ),
            namespace=SITES_NS,
        )
        wait_for(
            "the leader applying the sites' children",
            lambda: any(w["metadata"]["name"] in sites and w.get("status", {}).get("children") for w in websites()),
            timeout=60,
            interval=0.1,
        )
        cluster.kubectl("-n", PLUGINS_NS, "delete", "pod", leader, "--wait=false")
        wait_for("another replica holding the Lease", lambda: holder() not in ("", leader), timeout=60)

        def all_ready() -> bool:
            ready = [w for w in websites() if condition(w, "Ready") == "True"]
            return len(ready) == len(sites) + 1

        wait_for("every Website Ready after the takeover", all_ready, timeout=240)
        uids = {w["metadata"]["name"]: w["metadata"]["uid"] for w in websites()}
        for kind, name_of in [("configmaps", "{}-pages"), ("deployments", "{}"), ("services", "{}")]:
            children = cluster.kubectl_json("-n", SITES_NS, "get", kind, "-l", "plugins.kplug.io/parent-uid")["items"]
            names = sorted(child["metadata"]["name"] for child in children)
            assert names == sorted(name_of.format(site) for site in uids), f"{kind}: {names}"
            for child in children:
                owners = child["metadata"].get("ownerReferences", [])
                site = next(site for site in uids if name_of.format(site) == child["metadata"]["name"])
                assert [(o["uid"], o.get("controller")) for o in owners] == [(uids[site], True)], child["metadata"]

        # The Website goes only after its children.
        cluster.kubectl("-n", SITES_NS, "delete", "website", "hello", "--timeout=180s", timeout=200)
        left = cluster.kubectl("-n", SITES_NS, "get", "configmaps,deployments,services", "-o", "name")
        assert not [name for name in left.split() if "hello" in name], left
    finally:
        uninstall = f"""
kubectl delete namespace {SITES_NS} --ignore-not-found --timeout=120s
{operator} | kubectl delete -f -
{plugin} --pdb-v1beta1 | kubectl delete -f -
kubectl delete -f examples/website/crds/websites.yaml
"""
        run_script(cluster, installed.work, uninstall, "the website plugin and operator's removal", env=path)
