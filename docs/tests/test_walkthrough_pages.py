"""The pages whose commands need the walkthrough's objects (the DatabaseTable CRDs, ``users``, its two plugins and
the zero-code operator), run as the pages give them against ``hack/walkthrough.sh`` itself, which stays up for the
module: the walkthrough page's own, the monitoring guide's binding, the kubectl kplug guide, the binding and deletion
of the operator concept page, and the operator guide.
The tests run in this file's order on the same objects, each leaving what the next one starts from."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from includes import REPO, assert_included
from shell_steps import Step, steps

sys.path.insert(0, str(REPO / "hack" / "tests"))
from readme import shell_blocks  # noqa: E402

TARGET = REPO / "target" / "debug"
PAGES = REPO / "docs" / "src"
# The walkthrough's last line before it waits for Ctrl-C.
RUNNING = "Press Ctrl-C to stop everything."
# Its setup builds in debug first (a no-op after the suite's cargo test, which runs it too).
pytestmark = pytest.mark.timeout(900)


@dataclass
class Walkthrough:
    """A running ``hack/walkthrough.sh``: its directory, and how to run a page's command there."""

    dir: Path

    def environment(self) -> dict[str, str]:
        return {
            **{k: v for k, v in os.environ.items() if not k.startswith("KPLUG_")},
            # The page's `export KUBECONFIG=...`.
            "KUBECONFIG": str(self.dir / "admin.kubeconfig"),
            # `kubectl kplug` and `kplug-operator` are the suite's builds.
            "PATH": f"{TARGET}:{os.environ['PATH']}",
        }

    def check(self, command: str) -> str:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", command],
            cwd=REPO,
            env=self.environment(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"{command}\nexited {done.returncode}:\n{done.stderr}"
        return done.stdout

    def table(self) -> dict:
        return json.loads(self.check("kubectl get databasetable users -o json"))

    def users_exist(self) -> bool:
        return "databasetable.myorg.org/users" in self.check("kubectl get databasetables -o name").splitlines()

    def ready(self, generation: int) -> bool:
        conditions = self.table().get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" and c.get("observedGeneration") == generation for c in conditions)

    def stop(self, process: str) -> None:
        """Stops one of the processes the walkthrough started (``DIR/NAME.pid``), as SIGTERM does."""
        pid = int((self.dir / f"{process}.pid").read_text())
        os.kill(pid, signal.SIGTERM)
        wait_for(f"the walkthrough's {process} stopped", lambda: not Path(f"/proc/{pid}").exists(), 60, lambda: "")


def wait_for(what: str, condition: Callable[[], bool], timeout: float, explain: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s\n{explain()}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def walkthrough() -> Iterator[Walkthrough]:
    # Under /tmp and readable by all: PostgreSQL runs as nobody there (hack/walkthrough.sh's header).
    directory = Path(tempfile.mkdtemp(prefix="kplug-docs-walkthrough-", dir="/tmp"))
    directory.chmod(0o755)
    output = directory.parent / f"{directory.name}.out"
    with output.open("wb") as log:
        process = subprocess.Popen(
            [str(REPO / "hack" / "walkthrough.sh")],
            cwd=REPO,
            env={**os.environ, "KPLUG_WALKTHROUGH_DIR": str(directory), "KPLUG_WALKTHROUGH_PROFILE": "debug"},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(
            "hack/walkthrough.sh running",
            lambda: process.poll() is not None or RUNNING in output.read_text(errors="replace"),
            600,
            lambda: output.read_text(errors="replace")[-4000:],
        )
        assert process.poll() is None, f"hack/walkthrough.sh exited {process.returncode}:\n{output.read_text()[-4000:]}"
        yield Walkthrough(directory)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(120)
    # Kept when the walkthrough did not come up, for its logs (it never removes a directory it was given).
    shutil.rmtree(directory, ignore_errors=True)
    output.unlink()


def test_the_walkthrough_pages_commands(walkthrough: Walkthrough) -> None:
    page = PAGES / "getting-started" / "walkthrough.md"
    run, explore = shell_blocks(page, "The walkthrough in one command")[:2]
    assert run == "hack/walkthrough.sh\n", "the fixture runs it"
    export, *commands = steps(explore)
    assert export.command.startswith("export KUBECONFIG="), "the fixture's environment has it"
    listed, described, extension = (walkthrough.check(step.command) for step in commands)
    assert "databasetable.myorg.org/users" in listed and "plugin.plugins.kplug.io/database-table-mariadb-plugin" in listed, listed
    assert "Events:" in described and "Reconciled" in described, described
    assert yaml.safe_load(extension)["status"]["storageEngine"] == "InnoDB", extension


def test_the_monitoring_guides_binding_lets_its_scraper_read_metrics(walkthrough: Walkthrough) -> None:
    (bind,) = steps(shell_blocks(PAGES / "guides" / "monitoring.md", "Monitor kplug and its operators")[0])
    may = "kubectl auth can-i get /metrics --as system:serviceaccount:monitoring:prometheus || true"
    assert walkthrough.check(may) == "no\n"
    walkthrough.check(bind.command)
    assert walkthrough.check(may) == "yes\n"


def test_the_kubectl_kplug_guide_runs_in_the_walkthrough(walkthrough: Walkthrough) -> None:
    install, dry_run, reconcile, as_yaml, plugins, choice, create, create_operator, shadow, completion = steps(
        shell_blocks(PAGES / "guides" / "kubectl-kplug.md", "kubectl kplug")[0]
    )
    # The suite built kubectl-kplug (cargo build --workspace): its target/debug is on the PATH instead.
    assert install.command.startswith("cargo install --path kubectl-kplug "), install.command

    printed = walkthrough.check(dry_run.command)
    assert "databasetable.myorg.org/users reconciled (dry run: nothing was changed)" in printed, printed
    assert "Plugin:         database-table-mariadb-plugin" in printed, printed

    printed = walkthrough.check(reconcile.command)
    assert "databasetable.myorg.org/users reconciled\n" in printed, printed

    answer = yaml.safe_load(walkthrough.check(as_yaml.command))
    assert answer["kind"] == "Reconcile" and answer["status"]["success"] is True, answer
    assert answer["spec"]["object"]["metadata"]["namespace"] == "default", answer

    printed = walkthrough.check(plugins.command)
    assert "database-table-mariadb-plugin" in printed and "database-table-postgresql-plugin" in printed, printed

    printed = walkthrough.check(choice.command)
    assert "goes to:\n  database-table-mariadb-plugin (implementation MariaDB" in printed, printed

    kinds = [document["kind"] for document in yaml.safe_load_all(walkthrough.check(create.command)) if document]
    assert {"ServiceAccount", "ClusterRoleBinding", "Deployment"} <= set(kinds), kinds
    operator = [document for document in yaml.safe_load_all(walkthrough.check(create_operator.command)) if document]
    deployment = next(o for o in operator if o["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "--resource=databasetables.myorg.org", args

    printed = walkthrough.check(shadow.command)
    assert printed.startswith("Plugin:   database-table-mariadb-plugin\n"), printed

    # Sourced, bash completes kubectl-kplug.
    assert "kubectl-kplug" in walkthrough.check(f"{completion.command}\ncomplete -p kubectl-kplug"), completion


def test_a_binding_cleared_as_the_operator_concept_page_says_moves_the_object(walkthrough: Walkthrough) -> None:
    """users is bound to MariaDB; preferring PostgreSQL changes nothing (Sticky) until the page's two lines clear
    the binding and nudge it."""
    page = PAGES / "concepts" / "operator.md"
    clear, nudge = steps(shell_blocks(page, "Binding")[0])
    walkthrough.check("""kubectl patch databasetable users --type merge -p '{"spec":{"preferredImplementation":"PostgreSQL"}}'""")
    generation = walkthrough.table()["metadata"]["generation"]
    wait_for(f"users Ready at generation {generation}", lambda: walkthrough.ready(generation), 60, lambda: json.dumps(walkthrough.table()))
    assert walkthrough.table()["status"]["implementation"] == "MariaDB", "Sticky: still bound to MariaDB"

    walkthrough.check(clear.command)
    assert "implementation" not in walkthrough.table()["status"]
    walkthrough.check(nudge.command)
    wait_for(
        "users bound to PostgreSQL",
        lambda: walkthrough.table()["status"].get("implementation") == "PostgreSQL" and walkthrough.ready(generation),
        60,
        lambda: json.dumps(walkthrough.table()),
    )
    assert walkthrough.table()["status"]["plugin"]["name"] == "database-table-postgresql-plugin"


def test_a_finalizer_removed_by_hand_as_the_operator_concept_page_says(walkthrough: Walkthrough) -> None:
    """With its PostgreSQL plugin gone, deleted users waits, Ready=False saying why, until the page's patch."""
    (remove,) = steps(shell_blocks(PAGES / "concepts" / "operator.md", "Deletion")[0])
    walkthrough.stop("postgresql-plugin")
    walkthrough.check("kubectl delete databasetable users --wait=false")

    def waiting() -> bool:
        table = walkthrough.table()
        conditions = table.get("status", {}).get("conditions", [])
        return "deletionTimestamp" in table["metadata"] and any(
            c["type"] == "Ready" and c["status"] == "False" and c["reason"] == "PluginUnavailable" for c in conditions
        )

    wait_for("deleted users waiting for a PostgreSQL plugin", waiting, 60, lambda: json.dumps(walkthrough.table()))
    walkthrough.check(remove.command)
    wait_for("users gone", lambda: not walkthrough.users_exist(), 60, lambda: json.dumps(walkthrough.table()))


def test_the_zero_code_operator_as_the_operator_guide_starts_it(walkthrough: Walkthrough) -> None:
    """The guide's command line operates the walkthrough's DatabaseTables once the walkthrough's own operator is
    stopped: a new generation of ``users`` becomes Ready, under the guide's operator's default finalizer."""
    page = PAGES / "guides" / "operator.md"
    assert_included(page, REPO / "examples" / "database-table" / "operator" / "src" / "main.rs", "run")
    (start,) = steps(shell_blocks(page, "Zero code: `kplug-operator`")[0])
    assert start.command.startswith("kplug-operator "), start.command

    walkthrough.stop("operator")

    log_path = walkthrough.dir / "guide-operator.log"
    with log_path.open("wb") as log:
        operator = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", f"exec {start.command}"],
            cwd=REPO,
            # /metrics on a free port rather than the default :8443, which another test may hold.
            env={**walkthrough.environment(), "KPLUG_OPERATOR_METRICS_BIND_ADDRESS": "127.0.0.1:0"},
            stdout=log,
            stderr=log,
        )
    try:
        logged = lambda: log_path.read_text(errors="replace")  # noqa: E731
        wait_for("the guide's operator's controller started", lambda: "controller started" in logged(), 60, logged)
        # The deletion test above removed users.
        walkthrough.check("kubectl apply -f examples/database-table/users.yaml")
        walkthrough.check(
            "kubectl patch databasetable users --type merge -p "
            """'{"spec":{"columns":[{"name":"id","type":"uint64"},{"name":"name","type":"string"},"""
            """{"name":"nickname","type":"string"}]}}'"""
        )
        generation = walkthrough.table()["metadata"]["generation"]

        wait_for(
            f"users Ready at generation {generation}",
            lambda: walkthrough.ready(generation),
            60,
            lambda: json.dumps(walkthrough.table().get("status")) + "\n" + logged(),
        )
        # The walkthrough's operator uses --finalizer myorg.org/database-table; the guide's line keeps the default.
        assert "kplug.io/finalize" in walkthrough.table()["metadata"]["finalizers"]
        assert operator.poll() is None, logged()
    finally:
        operator.terminate()
        operator.wait(60)
