"""The commands the book's pages show, run as the pages give them, against the standalone kplug of the quick
start and the hello plugin: their output must read as the pages show it. Commands that need a cluster are run by
``hack/tests`` (the install block, the deploy overlay, the certificate rotation); the pages whose commands no test
runs are listed in the book's "Develop kplug"."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from includes import assert_included
from prometheus import prometheus
from shell_steps import Step, differences, steps
from standalone import Standalone, standalone

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack" / "tests"))
from readme import shell_blocks, up_to_line  # noqa: E402

TARGET = REPO / "target" / "debug"
PAGES = REPO / "docs" / "src"


@dataclass
class Session:
    """The quick start's kplug with the hello plugin registered, and how to run a page's command against it."""

    kplug: Standalone
    work: Path

    def environment(self) -> dict[str, str]:
        return {
            **{k: v for k, v in os.environ.items() if not k.startswith("KPLUG_")},
            "KUBECONFIG": str(self.kplug.kubeconfig),
            # kubectl finds kubectl-kplug on the PATH; `python` is the suite's, which has the SDK.
            "PATH": f"{TARGET}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        }

    def run(self, step: Step) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", step.command],
            cwd=self.work,
            env=self.environment(),
            capture_output=True,
            text=True,
            timeout=120,
        )

    @contextmanager
    def serving(self, step: Step, plugin: str) -> Iterator[None]:
        """Runs a page's long-running plugin command with kplug's registry in ``KPLUG_REGISTRY`` (the page's
        default address is the quick start's port; the session's is free), until ``plugin`` is Ready; stops it
        after."""
        log_path = self.work / f"{plugin}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                ["bash", "-euo", "pipefail", "-c", f"exec {step.command}"],
                cwd=self.work,
                env={**self.environment(), "KPLUG_REGISTRY": f"http://{self.kplug.grpc}"},
                stdout=log,
                stderr=log,
            )
        try:
            try:
                wait_until_ready(self.kplug.kubeconfig, plugin, time.monotonic() + 60)
            except TimeoutError as error:
                raise AssertionError(f"{step.command}: {error}; it printed:\n{log_path.read_text()[-3000:]}") from error
            yield
        finally:
            process.terminate()
            process.wait(30)

    def check(self, step: Step) -> subprocess.CompletedProcess[str]:
        done = self.run(step)
        assert done.returncode == 0, f"{step.command}\nexited {done.returncode}:\n{done.stderr}"
        assert differences(step.shown, done.stdout) == [], f"{step.command}\nprinted:\n{done.stdout}"
        return done


def placeholders(banner: str) -> str:
    return re.sub(r"KUBECONFIG=\S+", "KUBECONFIG=PATH", re.sub(r":\d+\b", ":PORT", banner))


def wait_until_ready(kubeconfig: Path, plugin: str, deadline: float) -> None:
    """Until kplug lists ``plugin`` as Ready: it registers at its first heartbeat."""
    while True:
        done = subprocess.run(
            ["kubectl", "--kubeconfig", str(kubeconfig), "get", "plugin", plugin, "-o", "jsonpath={.status.conditions[0].status}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if done.stdout == "True":
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"plugin {plugin} not Ready: {done.stdout or done.stderr}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    state = tmp_path_factory.mktemp("kplug")
    work = tmp_path_factory.mktemp("work")
    # The pages' commands run from the repository root: their relative paths must resolve.
    for name in ("target", "examples"):
        (work / name).symlink_to(REPO / name)
    with standalone(str(TARGET / "kplug-apiserver"), state) as kplug:
        log = (state / "hello.log").open("wb")
        hello = subprocess.Popen(
            [str(TARGET / "hello-plugin"), "--registry", f"http://{kplug.grpc}", "--listen", "127.0.0.1:0"],
            stdout=log,
            stderr=log,
            env={k: v for k, v in os.environ.items() if not k.startswith("KPLUG_")},
        )
        try:
            wait_until_ready(kplug.kubeconfig, "hello", time.monotonic() + 60)
            yield Session(kplug, work)
        finally:
            hello.terminate()
            hello.wait(30)
            log.close()


def test_the_quick_start_reads_as_kplug_prints_it(session: Session) -> None:
    """README.md's quick start (the book's includes it): the two commands, the banner and the table."""
    run_kplug, hello_and_list, run_tests = shell_blocks(REPO / "README.md", "Quick start")
    # The session stands in for these two with the debug build, on free ports.
    assert run_kplug == "cargo run --release -p kplug-apiserver -- standalone\n"
    start_hello, list_plugins = steps(hello_and_list)
    assert start_hello.command == "cargo run --release -p kplug-example-hello"
    assert run_tests == "hack/test.sh\n"

    readme = (REPO / "README.md").read_text()
    shown_banner = readme.split("prints what to run next:\n\n```\n", 1)[1].split("```", 1)[0]
    # The README shows the default ports and state directory; the session has its own.
    assert placeholders("\n".join(session.kplug.banner)) == placeholders(shown_banner.rstrip("\n"))
    assert session.kplug.banner[-2] == f"  export KUBECONFIG={session.kplug.kubeconfig}"

    session.check(list_plugins)


def test_the_registry_page_commands_run(session: Session) -> None:
    (block,) = shell_blocks(PAGES / "concepts" / "registry.md", "The registry and liveness")[:1]
    commands = steps(block)
    watch = [step for step in commands if " -w " in f"{step.command} "]
    # A watch never ends: the apiserver's tests watch with kubectl -w (apiserver/tests/kubectl.rs).
    assert len(watch) == 1, commands
    for step in commands:
        if step in watch:
            continue
        done = session.check(step)
        if step.command.startswith("kubectl delete plugin hello"):
            assert done.stdout == 'plugin.plugins.kplug.io "hello" deleted\n', done.stdout
    # The deleted registration comes back with the plugin's next heartbeat, as the page says.
    wait_until_ready(session.kplug.kubeconfig, "hello", time.monotonic() + 60)


def test_a_reconcile_as_the_reconcile_page_sends_it(session: Session) -> None:
    block = shell_blocks(PAGES / "concepts" / "reconcile.md", "Reconcile and selection")[0]
    (write_request, reconcile) = steps(block)
    session.check(write_request)
    answer = json.loads(session.check(reconcile).stdout)
    assert answer["status"]["success"] is True, answer
    assert answer["status"]["plugin"]["name"] == "hello", answer
    assert answer["status"]["results"][0]["message"] == "hello, world", answer


def test_render_prints_what_the_page_shows(session: Session) -> None:
    """The render guide's hello part; its PostgreSQL part needs a database: kubectl-kplug/tests/render.rs runs it."""
    block = shell_blocks(PAGES / "guides" / "render.md", "Test a plugin locally")[0]
    build, write_greeting, rust, python, finalize = steps(up_to_line(block, "# The PostgreSQL plugin"))
    # Built already, with the suite's features.
    assert build.command == "cargo build -p kplug-example-hello -p kubectl-kplug"
    session.check(write_greeting)
    assert rust.shown, "the page shows the Rust plugin's answer"
    session.check(rust)
    # The Python plugin answers as the Rust one does.
    session.check(Step(python.command, rust.shown))
    finalized = json.loads(session.check(finalize).stdout)
    assert finalized["success"] is True and finalized["results"][0]["reason"] == "Goodbye", finalized


def test_the_children_page_renders_the_website_s_children(session: Session) -> None:
    """The children page shows the website plugin's code and what render prints of it."""
    page = PAGES / "concepts" / "children.md"
    assert_included(page, REPO / "examples" / "website" / "plugin" / "src" / "site.rs", "children")
    build, render = steps(shell_blocks(page, "Plugins that manage Kubernetes objects")[0])
    # Built already, with the suite's features.
    assert build.command == "cargo build -p kplug-example-website-plugin -p kubectl-kplug"
    assert render.shown, "the page shows the children"
    session.check(render)


def reconciled_by(session: Session, reconcile: Step, plugin: str) -> None:
    """The page's reconcile, with the reconcile page's ``req.json``, answered by the page's plugin."""
    write_request = steps(shell_blocks(PAGES / "concepts" / "reconcile.md", "Reconcile and selection")[0])[0]
    session.check(write_request)
    assert reconcile.command == f"kubectl create --raw /apis/plugins.kplug.io/v1alpha1/plugins/{plugin}/reconcile -f req.json"
    answer = json.loads(session.check(reconcile).stdout)
    assert answer["status"]["success"] is True, answer
    assert answer["status"]["plugin"]["name"] == plugin, answer
    assert answer["status"]["results"][0]["message"] == "hello, world", answer
    assert answer["status"]["objectStatus"] == {"greeting": "hello, world"}, answer


def test_the_rust_plugin_page_runs_and_answers(session: Session) -> None:
    page = PAGES / "guides" / "plugin-rust.md"
    assert_included(page, REPO / "sdk" / "rust" / "examples" / "hello.rs", "plugin")
    start, reconcile = steps(shell_blocks(page, "Write a plugin in Rust")[0])
    # Built by the suite (cargo build --all-targets): the binary that command runs.
    prefix = "cargo run -p kplug-sdk --example hello -- "
    assert start.command.startswith(prefix), start.command
    built = Step(f"{TARGET / 'examples' / 'hello'} {start.command.removeprefix(prefix)}", [])
    with session.serving(built, "hello-rust"):
        reconciled_by(session, reconcile, "hello-rust")


def test_the_python_plugin_page_runs_and_answers(session: Session) -> None:
    page = PAGES / "guides" / "plugin-python.md"
    source = REPO / "sdk" / "python" / "examples" / "hello.py"
    assert_included(page, source, "plugin")
    install, start, reconcile = steps(shell_blocks(page, "Write a plugin in Python")[0])
    # The suite's virtualenv is that install (hack/python-env.sh): the SDK must come from this tree.
    assert install.command == "pip install ./sdk/python"
    imported = session.run(Step("python -c 'import kplug; print(kplug.__file__)'", []))
    assert imported.stdout.startswith(str(REPO / "sdk" / "python")), imported
    # "Save it as hello.py".
    shutil.copy(source, session.work / "hello.py")
    assert shlex.split(start.command)[:2] == ["python", "hello.py"], start.command
    with session.serving(start, "hello-python"):
        reconciled_by(session, reconcile, "hello-python")


def promql(page: Path) -> dict[str, str]:
    """The page's PromQL block: each query by the comment above it."""
    block = page.read_text().split("```promql\n", 1)[1].split("```", 1)[0]
    lines = block.splitlines()
    return {comment.removeprefix("# "): query for comment, query in zip(lines[::2], lines[1::2], strict=True)}


def test_the_monitoring_guides_queries_answer_from_kplugs_metrics(session: Session, tmp_path: Path) -> None:
    """Prometheus scrapes the session's kplug while hello reconciles; each of the guide's queries is accepted, names
    only metrics kplug registers, and the first two answer for hello."""
    queries = promql(PAGES / "guides" / "monitoring.md")
    registered = set(re.findall(r"^\| `(\w+)`", (PAGES / "reference" / "metrics.md").read_text(), re.MULTILINE))
    for query in queries.values():
        named = {re.sub(r"_(bucket|sum|count)$", "", name) for name in re.findall(r"\b((?:kplug|apiserver)_\w+)", query)}
        assert named and named <= registered, f"{query}: {named - registered} not in the metrics reference"
    per_second, p99 = queries["Reconciles per second by plugin and outcome"], queries["p99 time of a plugin's calls"]
    reconcile = steps(shell_blocks(PAGES / "concepts" / "reconcile.md", "Reconcile and selection")[0])
    # hello's series exist from its first call on (the guide says why): before the first scrape here.
    for step in reconcile:
        session.check(step)
    with prometheus(session.kplug.kubeconfig, tmp_path) as server:
        for query in queries.values():
            answer = server.query(query)
            assert answer["status"] == "success", f"{query}: {answer}"
        # Reconciles between scrapes: the rate the first query shows is hello's.
        for step in reconcile:
            session.check(step)
        deadline = time.monotonic() + 30
        while not [s for s in server.samples(per_second) if s["metric"] == {"plugin": "hello", "outcome": "success"} and float(s["value"][1]) > 0]:
            assert time.monotonic() < deadline, f"{per_second}: {server.samples(per_second)}"
            time.sleep(0.5)
        latencies = [float(s["value"][1]) for s in server.samples(p99) if s["metric"] == {"plugin": "hello"}]
        assert len(latencies) == 1 and 0 < latencies[0] < 10, f"{p99}: {server.samples(p99)}"
