"""kplug and the DatabaseTable plugins installed on the real cluster the way
the READMEs tell users to (the book's install guide includes README.md's
block), from a copy of what a fresh clone holds.

Two steps differ, each for a reason the docs state: images are built by
``hack/images.sh`` (no Docker engine, no registry here) and loaded into the
node's containerd, and the kustomizations of kplug and of the example are
applied through their Kubernetes 1.20 overlays (docs/src/guides/deploy.md
and the example's README; the test cluster is 1.20).
Given database passwords, the plugins' Secrets get them in place of the
README's ``PASSWORD``, as a user fills them in.

``hack/walkthrough.sh --cluster`` runs this file (``main``) on a cluster it
brought up: first the walkthrough's databases (``install_databases``, the
block of examples/database-table/deploy/databases/README.md), then
``install`` with their passwords. The in-cluster benches run it with
``--example hello``: kplug, then the hello plugin by the block of
examples/hello-rust/deploy/README.md (``install_hello``); only the plugin
when kplug is installed from the same folder already.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kubecluster import REPO, Cluster, cluster_sh, wait_for
from readme import replace_in_line, replace_line, shell_blocks, up_to_line

APISERVICE = "v1alpha1.plugins.kplug.io"
KPLUG_NS = "kplug-system"
PLUGINS_NS = "plugins"
KPLUG_SELECTOR = "app.kubernetes.io/name=kplug"
PLUGINS = ("database-table-postgresql-plugin", "database-table-mariadb-plugin")
IMAGES = ("kplug-apiserver", "kplug-operator", *PLUGINS)
# The example's operator (operator.yaml).
OPERATOR = "database-table-operator"
OPERATOR_SELECTOR = f"app.kubernetes.io/name={OPERATOR}"
OPERATOR_DEPLOYMENT = f"deployment/{OPERATOR}"
# The example's Component that sends the operator's reconciles straight to kplug, from an overlay beside the clone.
DIRECT_COMPONENT = "../examples/database-table/deploy/components/direct-to-kplug"
EXAMPLE_README = REPO / "examples" / "database-table" / "deploy" / "README.md"
HELLO_README = REPO / "examples" / "hello-rust" / "deploy" / "README.md"
DEPLOY_GUIDE = REPO / "docs" / "src" / "guides" / "deploy.md"
# The in-cluster benches run the operator of their own resource beside it.
HELLO_IMAGES = ("kplug-apiserver", "kplug-operator", "hello-plugin")
DATABASES_NS = "db"
DATABASES_README = REPO / "examples" / "database-table" / "deploy" / "databases" / "README.md"
DATABASE_IMAGES = ("walkthrough-postgres", "walkthrough-mariadb")
# The environment variables databases/README.md's block takes the passwords
# from, and the host of the plugin Secret (example README) each goes into.
DATABASE_PASSWORDS = {"PG_PASSWORD": "postgres.db.svc", "MARIADB_PASSWORD": "mariadb.db.svc"}


@dataclass
class Installed:
    cluster: Cluster
    work: Path
    """The copy of the repository's files the READMEs' commands ran in."""

    @property
    def serving_ca(self) -> Path:
        return self.work / "certs" / "out" / "ca.crt"


def run_script(
    cluster: Cluster, work: Path, script: str, what: str, timeout: float = 600, env: Mapping[str, str] | None = None
) -> None:
    """Runs ``script`` with bash -euxo pipefail in ``work``; its output goes to work/.install-logs/."""
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    env = {
        **os.environ,
        **cluster.env,
        # The certs/ scripts run this binary (documented in certs/kplug-apiserver.sh),
        # built by hack/test.sh (or the one given), instead of a release build through cargo.
        "KPLUG_APISERVER": os.environ.get("KPLUG_APISERVER") or str(target / "debug" / "kplug-apiserver"),
        **(env or {}),
    }
    result = subprocess.run(
        ["bash", "-euxo", "pipefail", "-c", script],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    logs = work / ".install-logs"
    logs.mkdir(exist_ok=True)
    (logs / (re.sub(r"[^a-z0-9]+", "-", what.lower()).strip("-") + ".log")).write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        diagnosis = subprocess.run(
            ["kubectl", "--kubeconfig", cluster.kubeconfig, "get", "pods,apiservice", "-A", "-o", "wide"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        raise AssertionError(f"{what} failed ({result.returncode}):\n{result.stderr[-6000:]}\n{diagnosis}")


def fresh_clone_files(work: Path) -> None:
    """The tracked files the READMEs' commands use, as a fresh clone has them (no certs/out, no certs/plugins)."""
    tracked = subprocess.run(
        ["git", "ls-files", "certs", "deploy", "apiservice", "examples/database-table", "examples/hello-rust/deploy", "examples/website/crds"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in tracked:
        target = work / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)


def install(cluster: Cluster, work: Path, db_passwords: Mapping[str, str] | None = None) -> Installed:
    """kplug, the plugins and the operator; ``db_passwords`` by database host (``postgres.db.svc``) fill the plugins' Secrets."""
    installed = install_kplug(cluster, work, IMAGES)

    # examples/database-table/deploy/README.md, "Install", up to its watch.
    plugin_steps = shell_blocks(EXAMPLE_README, "Install")[0]
    plugin_steps = up_to_line(plugin_steps, "kubectl get plugins -w")
    (example_on_1_20,) = shell_blocks(EXAMPLE_README, "Kubernetes 1.20")
    plugin_steps = replace_line(plugin_steps, "kubectl apply -k examples/database-table/deploy/", example_on_1_20)
    for host, password in (db_passwords or {}).items():
        plugin_steps = replace_in_line(plugin_steps, f":PASSWORD@{host}:", "PASSWORD", password)
    run_script(cluster, work, plugin_steps, "the DatabaseTable example's installation")
    return installed


def kplug_audit_lines(cluster: Cluster, wanted: Callable[[dict], bool]) -> list[dict]:
    """kplug's audit lines (its pods' stdout, both replicas) that ``wanted`` accepts."""
    found = []
    for pod in cluster.ready_pods(KPLUG_NS, KPLUG_SELECTOR):
        for line in cluster.kubectl("-n", KPLUG_NS, "logs", pod["metadata"]["name"]).splitlines():
            if line.startswith("{") and '"objectRef"' in line and wanted(event := json.loads(line)):
                found.append(event)
    return found


def table_without_database(namespace: str, name: str) -> str:
    """A DatabaseTable of a server that exists nowhere: the plugin answers it with its failure."""
    return f"""apiVersion: myorg.org/v1alpha1
kind: DatabaseTable
metadata: {{name: {name}, namespace: {namespace}}}
spec: {{serverName: nowhere, preferredImplementation: PostgreSQL, columns: [{{name: id, type: uint64}}]}}
"""


def wait_plugin_answer(cluster: Cluster, namespace: str, name: str, what: str) -> dict:
    """The DatabaseTable once the operator has written a plugin's answer into its status."""
    return wait_for(
        what,
        lambda: (t := cluster.kubectl_json("-n", namespace, "get", "databasetable", name)).get("status", {}).get("plugin", {}).get("name") in PLUGINS and t,
        120,
    )


def delete_without_finalize(cluster: Cluster, namespace: str, name: str) -> None:
    """Deletes a DatabaseTable of :func:`table_without_database`, if it is there: with no database the plugin cannot
    drop the table, so the object goes without its Finalize."""
    if cluster.kubectl("-n", namespace, "get", "databasetable", name, "--ignore-not-found", "-o", "name"):
        cluster.kubectl("-n", namespace, "patch", "databasetable", name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
        cluster.kubectl("-n", namespace, "delete", "databasetable", name, "--ignore-not-found", "--wait=true")


def operator_straight_to_kplug(installed: Installed) -> None:
    """The example's operator sending its reconciles straight to kplug's Service, by the block of the example's
    README, "Straight to kplug", with the Kubernetes 1.20 Component listed after its own, as the README says."""
    steps = shell_blocks(EXAMPLE_README, "Straight to kplug")[0]
    steps = replace_in_line(steps, "components: [", DIRECT_COMPONENT, f"{DIRECT_COMPONENT}, ../deploy/components/kubernetes-1.20")
    run_script(installed.cluster, installed.work, steps, "the example operator straight to kplug")


def operator_through_kube_apiserver(installed: Installed) -> None:
    """The example's operator back to its installation: the 1.20 overlay of :func:`install` applied again."""
    (example_on_1_20,) = shell_blocks(EXAMPLE_README, "Kubernetes 1.20")
    steps = f"{example_on_1_20}kubectl -n {PLUGINS_NS} rollout status {OPERATOR_DEPLOYMENT} --timeout=3m\n"
    run_script(installed.cluster, installed.work, steps, "the example operator through kube-apiserver")


def install_kplug(cluster: Cluster, work: Path, images: tuple[str, ...]) -> Installed:
    """kplug by README.md's install block, with ``images`` loaded into the node's containerd in place of step 1."""
    fresh_clone_files(work)
    load_images = f"{REPO}/hack/images.sh load {' '.join(images)}"

    (kplug_steps,) = shell_blocks(REPO / "README.md", "Install")
    (on_1_20,) = shell_blocks(DEPLOY_GUIDE, "Kubernetes 1.20")
    kplug_steps = replace_line(kplug_steps, "docker build -f deploy/Dockerfile", load_images)
    kplug_steps = replace_line(kplug_steps, "kubectl apply -k deploy/", on_1_20)
    run_script(cluster, work, kplug_steps, "README.md's installation")
    return Installed(cluster, work)


def install_hello(cluster: Cluster, work: Path) -> Installed:
    """kplug (unless installed from ``work`` already), then the hello plugin by examples/hello-rust/deploy/README.md's block."""
    if kplug_installed_from(cluster, work):
        # As a user adds a plugin to the kplug they run: its images, then its block.
        run_script(cluster, work, f"{REPO}/hack/images.sh load {' '.join(HELLO_IMAGES)}", "the hello images' loading")
        installed = Installed(cluster, work)
    else:
        installed = install_kplug(cluster, work, HELLO_IMAGES)
    hello_steps = shell_blocks(HELLO_README, "Install")[0]
    run_script(cluster, work, hello_steps, "the hello plugin's installation")
    return installed


def kplug_installed_from(cluster: Cluster, work: Path) -> bool:
    """Whether kplug's APIService trusts the serving CA README.md's steps made in ``work``."""
    ca = work / "certs" / "out" / "ca.crt"
    found = cluster.kubectl("get", "apiservice", APISERVICE, "--ignore-not-found", "-o", "jsonpath={.spec.caBundle}")
    return bool(found) and ca.exists() and base64.b64decode(found) == ca.read_bytes()


def install_databases(cluster: Cluster, work: Path, passwords: Mapping[str, str]) -> None:
    """The walkthrough's throwaway databases, by the block of their README; ``passwords`` as in DATABASE_PASSWORDS."""
    fresh_clone_files(work)
    steps = shell_blocks(DATABASES_README, "Install")[0]
    run_script(cluster, work, steps, "the walkthrough databases' installation", env=passwords)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Installs kplug, the DatabaseTable plugins and operator (or the hello plugin) into the running "
        "hack/cluster.sh cluster by the READMEs' steps (the images must be built: hack/images.sh build).",
    )
    parser.add_argument("work", type=Path, help="an empty folder: the READMEs' commands run in a copy of the files there")
    parser.add_argument(
        "--databases",
        action="store_true",
        help="first the walkthrough's databases (examples/database-table/deploy/databases/README.md, images loaded), "
        f"with the passwords in the environment ({', '.join(DATABASE_PASSWORDS)}), which the plugins' Secrets then get",
    )
    parser.add_argument(
        "--example",
        choices=("database-table", "hello"),
        default="database-table",
        help="the plugins installed after kplug: the DatabaseTable example's, with its operator (the default), or the "
        f"hello plugin ({HELLO_README.relative_to(REPO)}; its images: {', '.join(HELLO_IMAGES)})",
    )
    args = parser.parse_args(argv)
    if args.databases and args.example != "database-table":
        parser.error("--databases goes with --example database-table")
    env = cluster_sh("env")
    if env.returncode != 0:
        print(f"install.py: no cluster: {env.stderr.strip()}", file=sys.stderr)
        return 1
    cluster = Cluster.from_env_output(env.stdout)
    args.work.mkdir(parents=True, exist_ok=True)
    db_passwords = None
    try:
        if args.databases:
            missing = [name for name in DATABASE_PASSWORDS if not os.environ.get(name)]
            if missing:
                print(f"install.py: --databases needs {', '.join(missing)} in the environment", file=sys.stderr)
                return 2
            passwords = {name: os.environ[name] for name in DATABASE_PASSWORDS}
            print(f"install.py: {DATABASES_README.relative_to(REPO)}, Install", file=sys.stderr)
            install_databases(cluster, args.work, passwords)
            db_passwords = {host: passwords[name] for name, host in DATABASE_PASSWORDS.items()}
        if args.example == "hello":
            print(f"install.py: README.md, Install; {HELLO_README.relative_to(REPO)}, Install", file=sys.stderr)
            install_hello(cluster, args.work)
        else:
            print(f"install.py: README.md, Install; {EXAMPLE_README.relative_to(REPO)}, Install", file=sys.stderr)
            install(cluster, args.work, db_passwords)
    except AssertionError as error:
        print(f"install.py: {error}", file=sys.stderr)
        return 1
    print(f"install.py: installed; the commands' output is in {args.work / '.install-logs'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
