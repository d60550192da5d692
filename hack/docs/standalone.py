"""``kplug-apiserver standalone`` as a child process on free ports, for the docs' generator and tests: what the
quick start runs, with its banner read and its kubeconfig at hand."""

from __future__ import annotations

import re
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

BANNER = re.compile(r"^kplug is serving plugins\.kplug\.io on (https://\S+) \(heartbeats: grpc://(\S+)\)$")
# The banner ends with the command it suggests.
BANNER_END = "  kubectl get plugins"


@dataclass
class Standalone:
    """A running standalone kplug: where it serves, the kubeconfig it wrote, and what it printed."""

    api: str
    grpc: str
    kubeconfig: Path
    banner: list[str]
    log: Path
    stdout: list[str] = field(default_factory=list)


@contextmanager
def standalone(apiserver: str, state: Path, timeout: float = 60) -> Iterator[Standalone]:
    """Starts ``apiserver standalone`` with its state in ``state``, yields once it printed its banner, stops it
    after. Its log goes to ``state/kplug.log``, its stdout (the banner, then the audit lines) is kept."""
    log = state / "kplug.log"
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [apiserver, "standalone", "--state-dir", str(state), "--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    printed: list[str] = []
    banner_seen = threading.Event()

    def read_stdout() -> None:
        # Read to the end, so that the audit lines that follow never fill the pipe.
        assert process.stdout is not None
        for line in process.stdout:
            printed.append(line.rstrip("\n"))
            if line.rstrip("\n") == BANNER_END:
                banner_seen.set()

    reader = threading.Thread(target=read_stdout, daemon=True)
    reader.start()
    try:
        if not banner_seen.wait(timeout):
            raise RuntimeError(
                f"{apiserver} standalone printed no banner within {timeout} s (exit code {process.poll()}); "
                f"its log:\n{log.read_text()[-3000:]}"
            )
        start = next(i for i, line in enumerate(printed) if BANNER.match(line))
        end = printed.index(BANNER_END)
        served = BANNER.match(printed[start])
        assert served is not None
        yield Standalone(
            api=served.group(1),
            grpc=served.group(2),
            kubeconfig=state / "kubeconfig",
            banner=printed[start : end + 1],
            log=log,
            stdout=printed,
        )
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)
        reader.join(5)
